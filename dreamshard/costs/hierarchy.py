"""The step's collectives on a machine of several hosts (topology.py), in two levels
(docs/topology.md).

Inside a host the GPUs are joined by NVLink, whose collectives the fitted comm models price
(costs/comm.py: `alltoall_ms`, `collective_ms`, each a fit to real NCCL collectives on one host);
between hosts every GPU has its own network port (a rail: GPU g of every host on one switch), of
the topology's bandwidth and latency per GPU. A collective over all D = H × G devices is priced
as its part inside each host, by the fitted model of G devices, plus its part that leaves the host:

  - **all-to-all** (the pooled outputs of whole tables and column shards). Device d sends a chunk
    c_d = B/D · dimsum_d · elt to every other device. Its G − 1 chunks to its own host's GPUs are the
    fitted model's all-to-all over that host (`comm.chunks_traffic`, `comm.alltoall_ms` with the
    host as the exchange: its coupling waits for the host's busiest GPU). Its D − G chunks to other
    hosts leave by its port: send = c_d · (D − G), recv = Σ of the chunks of every GPU of the other
    hosts; the port moves max(send, recv) (full duplex), coupled to the busiest port of the job
    with the fitted model's coupling (in NCCL's all-to-all every pair exchanges at once, so a GPU
    still waits for its chunk from the busiest one), at the inter-host bandwidth, plus one
    inter-host latency per remote host (NCCL's PXN sends one aggregated message per remote host
    on each rail). The two parts add: an upper bound on NCCL's overlap of them, and the order a
    two-level (hierarchical) all-to-all runs them in.
  - **reduce-scatter / all-gather** of a row-wise table spread over hosts (TorchRec's row_wise):
    the fitted collective over the G GPUs of each host of the whole buffer, then a ring over the H
    hosts on each rail of the host's 1/G share: (N/G) · (H − 1)/H bytes through each port, plus
    H − 1 latencies (the ring's steps).
  - **table-row-wise** (a row-wise table whose row shards all lie in one host; TorchRec's
    table_row_wise): the fitted reduce-scatter (all-gather backward) over that host's G GPUs of
    its [B, dim] partial outputs, then only the reduced outputs cross hosts, inside the
    all-to-all: each GPU of the host sends its B/G samples' share to the H − 1 GPUs of its rail,
    (B/D) · dim · elt to each, and every other GPU receives its B/D samples.

One host (H = 1) is priced by the one-host code path itself (`comm.alltoall_bytes_array`,
`comm.alltoall_ms`, `comm.rowwise_ms` over D devices), so its prices are exactly the ones without
a topology. This module is arithmetic on a comm model's parameters and a topology (no backend):
the simulator, the sequential runner and the planners' scorer all price through it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from dreamshard.costs.comm import alltoall_bytes_array, alltoall_ms, chunks_traffic, collective_ms, relayout_ms, rowwise_ms
from dreamshard.rowshard import RowShardSpec
from dreamshard.tables import TableSpec
from dreamshard.topology import Topology


def _ms_per_byte(topo: Topology) -> float:
    return 1.0 / (topo.inter_host_GBps * 1e6)


def inter_host_ms(topo: Topology, send, recv, coupling: float = 0.0):
    """[..., D] ms of the parts of an all-to-all that leave each GPU's host through its port:
    max(send, recv) bytes, coupled to the busiest port (`coupling`, as `comm.alltoall_ms`), at the
    inter-host bandwidth, plus one latency per remote host; 0 for a GPU that moves nothing."""
    send, recv = np.asarray(send, dtype=np.float64), np.asarray(recv, dtype=np.float64)
    load = np.maximum(send, recv)
    if coupling and load.ndim:
        load = (1.0 - coupling) * load + coupling * load.max(axis=-1, keepdims=True)
    t = topo.inter_host_latency_us * 1e-3 * (topo.hosts - 1) + load * _ms_per_byte(topo)
    return np.where(np.maximum(send, recv) > 0, t, 0.0)


def alltoall_topo_ms(intra: dict, dim_sums, batch_size: int, elt: int, topo: Topology, extra_send=None, extra_recv=None) -> tuple[np.ndarray, np.ndarray]:
    """(forward ms[..., D], backward ms[..., D]) of the all-to-all of devices holding `dim_sums`
    [..., D] columns of it, on `topo` (D = topo.devices), with `intra` the fitted model of one
    host's G GPUs (module docstring). `extra_send` / `extra_recv` [..., D]: forward bytes that
    also cross hosts in it (the table-row-wise tables' reduced outputs, `twrw_traffic`)."""
    dim_sums = np.asarray(dim_sums, dtype=np.float64)
    if topo.hosts == 1:  # the one-host price, by its own code path
        send, recv = alltoall_bytes_array(dim_sums, batch_size, elt)
        return np.asarray(alltoall_ms(intra, send, recv)), np.asarray(alltoall_ms(intra, recv, send))
    H, G, D = topo.hosts, topo.gpus_per_host, topo.devices
    lead = dim_sums.shape[:-1]
    chunk = (batch_size / D) * dim_sums * elt  # bytes device d sends every other device
    per_host = chunk.reshape(*lead, H, G)
    s_in, r_in = chunks_traffic(per_host)  # inside each host: the host is the exchange
    fwd_in = np.asarray(alltoall_ms(intra, s_in, r_in)).reshape(*lead, D)
    bwd_in = np.asarray(alltoall_ms(intra, r_in, s_in)).reshape(*lead, D)
    s_x = chunk * (D - G)
    host_sum = np.repeat(per_host.sum(axis=-1), G, axis=-1)
    r_x = chunk.sum(axis=-1, keepdims=True) - host_sum
    if extra_send is not None:
        s_x = s_x + extra_send
        r_x = r_x + extra_recv
    k = float(intra.get("coupling", 0.0))
    return fwd_in + inter_host_ms(topo, s_x, r_x, k), bwd_in + inter_host_ms(topo, r_x, s_x, k)


def ring_inter_ms(topo: Topology, host_share_bytes):
    """ms of a ring over the H hosts on each rail of `host_share_bytes` per GPU (N/G of an N-byte
    buffer): (H − 1)/H of it through each port, H − 1 latencies. 0 where nothing moves."""
    n = np.asarray(host_share_bytes, dtype=np.float64)
    H = topo.hosts
    t = topo.inter_host_latency_us * 1e-3 * (H - 1) + n * (H - 1) / H * _ms_per_byte(topo)
    return np.where((n > 0) & (H > 1), t, 0.0)


def rowwise_topo_ms(intra: dict, rowwise_dim, batch_size: int, elt: int, topo: Topology):
    """(forward reduce-scatter ms, backward all-gather ms) of the row-wise tables spread over hosts
    (one [B, rowwise_dim] buffer over all devices; every device takes the same time): one host by
    `comm.rowwise_ms` over its D devices, several by the fitted collective inside each host plus
    a ring over the hosts (module docstring). Numbers or arrays of `rowwise_dim`."""
    if topo.hosts == 1:
        return rowwise_ms(intra, rowwise_dim, batch_size, elt, topo.devices)
    n = batch_size * np.asarray(rowwise_dim, dtype=np.float64) * elt
    G = topo.gpus_per_host
    across = ring_inter_ms(topo, n / G)
    return collective_ms(intra, "reduce_scatter", n, G) + across, collective_ms(intra, "all_gather", n, G) + across


def twrw_ms(intra: dict, twrw_dims, batch_size: int, elt: int, topo: Topology) -> tuple[np.ndarray, np.ndarray]:
    """(forward reduce-scatter ms[..., D], backward all-gather ms[..., D]) of the table-row-wise
    tables: each host's [B, Σ dim of its own] buffer over its G GPUs (`twrw_dims` [..., H]); every
    GPU of a host takes its host's time."""
    n = batch_size * np.asarray(twrw_dims, dtype=np.float64) * elt
    G = topo.gpus_per_host
    rs = np.repeat(np.asarray(collective_ms(intra, "reduce_scatter", n, G)), G, axis=-1)
    ag = np.repeat(np.asarray(collective_ms(intra, "all_gather", n, G)), G, axis=-1)
    return rs, ag


def twrw_traffic(twrw_dims, batch_size: int, elt: int, topo: Topology) -> tuple[np.ndarray, np.ndarray]:
    """(send[..., D], recv[..., D]) forward bytes of the table-row-wise tables' reduced outputs
    through each GPU's port (module docstring): a GPU of host h sends (B/D) · dim_h · elt to each
    of the H − 1 GPUs of its rail, and receives its B/D samples of every other host's."""
    dims = np.asarray(twrw_dims, dtype=np.float64)  # [..., H]
    H, G, D = topo.hosts, topo.gpus_per_host, topo.devices
    per = (batch_size / D) * elt
    send = np.repeat(dims * per * (H - 1), G, axis=-1)
    recv = np.repeat((dims.sum(axis=-1, keepdims=True) - dims) * per, G, axis=-1)
    return send, recv


def row_layout(tables: Sequence[TableSpec], placements: np.ndarray, topo: Topology) -> tuple[np.ndarray, np.ndarray]:
    """For N placements [N, T] of `tables` (row shards among them: `RowShardSpec`, grouped by
    their parent table): (the dim of the row-wise tables spread over more than one host [N],
    each host's dim of the row-wise tables wholly inside it [N, H], the table-row-wise ones)."""
    placements = np.asarray(placements, dtype=np.int64)
    N = placements.shape[0]
    groups: dict[str, list[int]] = {}
    dims: dict[str, int] = {}
    for i, t in enumerate(tables):
        if isinstance(t, RowShardSpec):
            groups.setdefault(t.parent.name, []).append(i)
            dims[t.parent.name] = t.parent.dim
    spread = np.zeros(N)
    inside = np.zeros((N, topo.hosts))
    for name, cols in groups.items():
        hosts = placements[:, cols] // topo.gpus_per_host
        one = (hosts == hosts[:, :1]).all(axis=1)
        spread += np.where(one, 0.0, dims[name])
        np.add.at(inside, (np.arange(N)[one], hosts[one, 0]), dims[name])
    return spread, inside


def topology_comm_ms(intra: dict, tables: Sequence[TableSpec], placements: np.ndarray, dim_sums: np.ndarray, row_cols: np.ndarray,
                     workload, topo: Topology) -> tuple[np.ndarray, np.ndarray]:
    """(forward comm ms[N, D], backward comm ms[N, D]) of N placements on a topology of several
    hosts: the all-to-all of `dim_sums` [N, D] (whole tables and column shards) with the
    table-row-wise outputs crossing hosts in it, the row-wise tables' collectives (spread over
    hosts: `rowwise_topo_ms`; inside one: `twrw_ms`), and the copies of each device with row
    shards (`comm.relayout_ms`, on their columns `row_cols` [N, D])."""
    B, elt = workload.batch_size, workload.elt_bytes
    spread, inside = row_layout(tables, placements, topo)
    extra_send, extra_recv = twrw_traffic(inside, B, elt, topo)
    fwd, bwd = alltoall_topo_ms(intra, dim_sums, B, elt, topo, extra_send, extra_recv)
    rs, ag = rowwise_topo_ms(intra, spread, B, elt, topo)
    trs, tag = twrw_ms(intra, inside, B, elt, topo)
    fwd = fwd + np.asarray(rs)[:, None] + trs
    bwd = bwd + np.asarray(ag)[:, None] + tag
    if row_cols.any():
        copy_f, copy_b = relayout_ms(intra, dim_sums, row_cols, B, elt)
        fwd, bwd = fwd + copy_f, bwd + copy_b
    return fwd, bwd
