"""The machine a task is planned for: hosts × GPUs per host, each GPU's memory, and the two links
between GPUs — inside a host (NVLink) and between hosts (the network) — each a bandwidth and a
latency per GPU (docs/topology.md).

A task of D devices without a topology is one host of D GPUs: every price is the one-host price
of the fitted comm models (costs/comm.py), exactly as before topologies existed. With several
hosts the collectives are priced in two levels (costs/comm.py, `hierarchical_alltoall_ms` and
`hierarchical_collective_ms`): the part inside each host from the fitted model of that many GPUs,
the part that leaves the host from this topology's inter-host bandwidth and latency.

Bandwidths are GB/s (1e9 bytes) *per GPU and per direction*: what one GPU can send while it
receives as much. Presets (`PRESETS`) are public specifications, not measurements:

  - NVIDIA DGX H100 / DGX H200 datasheets (nvidia.com, "DGX H100" and "DGX H200" datasheets,
    2023/2024): 8 × H100 SXM5 80 GB HBM3 / 8 × H200 SXM 141 GB HBM3e; NVLink 4 at 900 GB/s
    bidirectional per GPU (18 links × 50 GB/s), so 450 GB/s per direction; 8 single-port NVIDIA
    ConnectX-7 400 Gb/s InfiniBand NDR / Ethernet adapters for the compute fabric, one per GPU
    (rail-optimised): 400 Gb/s = 50 GB/s per GPU per direction.
  - NVIDIA DGX A100 datasheet (2020): 8 × A100 SXM4 80 GB; NVLink 3 at 600 GB/s bidirectional
    (300 GB/s per direction); 8 × ConnectX-6 200 Gb/s HDR InfiniBand (25 GB/s per GPU).
  - Latencies are round figures, not datasheet numbers: ~2 µs for an NVLink hop (NCCL's own
    small-message latency is in the fitted comm models, which price the inside of a host) and
    ~5 µs per message between hosts over InfiniBand NDR (an RDMA write's ~1–2 µs on the wire plus
    NCCL's proxy and protocol). They matter only for small messages; a user's file sets its own.

A topology is read from a preset name (`h100-sxm`, optionally `h100-sxm:4` for 4 hosts), a
user's JSON (or YAML, where PyYAML is installed) file, or TorchRec's `Topology`
(`from_torchrec`), and written into task and plan files under the key "topology" (`to_json`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dreamshard.validation import MAX_DEVICES, MAX_MEMORY_BYTES, InputError, OptionError, TaskError, load_json_document, one_line, parse_float, parse_int, parse_str, require_dict

MAX_BANDWIDTH_GBPS = 1e6  # per GPU: past any interconnect (NVLink 5: 900 GB/s per direction)
MAX_LATENCY_US = 1e6  # one second: a typo, not a network
KEYS = ("hosts", "gpus_per_host", "hbm_bytes", "intra_host_GBps", "inter_host_GBps", "intra_host_latency_us", "inter_host_latency_us", "name")


@dataclass(frozen=True)
class Topology:
    """hosts × gpus_per_host GPUs; device d is GPU d % gpus_per_host of host d // gpus_per_host
    (the ranks of torchrun and TorchRec: a host's GPUs are consecutive ranks)."""

    hosts: int = 1
    gpus_per_host: int = 1
    hbm_bytes: int | None = None  # each GPU's memory; None: not given (the task's cap is what planners obey)
    intra_host_GBps: float = 450.0  # per GPU per direction, inside a host (NVLink 4)
    inter_host_GBps: float = 50.0  # per GPU per direction, leaving the host (a 400 Gb/s NIC per GPU)
    intra_host_latency_us: float = 2.0
    inter_host_latency_us: float = 5.0
    name: str = "custom"

    @property
    def devices(self) -> int:
        return self.hosts * self.gpus_per_host

    @property
    def multi_host(self) -> bool:
        return self.hosts > 1

    def host_of(self, device: int) -> int:
        return device // self.gpus_per_host

    def host_devices(self, host: int) -> range:
        return range(host * self.gpus_per_host, (host + 1) * self.gpus_per_host)

    def describe(self) -> str:
        hbm = f", {self.hbm_bytes / 1e9:.3g} GB each" if self.hbm_bytes else ""
        return (f"{self.hosts} host{'s' if self.hosts != 1 else ''} × {self.gpus_per_host} GPUs ({self.name}{hbm}; "
                f"{self.intra_host_GBps:g} GB/s inside a host, {self.inter_host_GBps:g} GB/s per GPU between hosts)")

    def with_hosts(self, hosts: int) -> "Topology":
        return replace(self, hosts=hosts).validate("topology", OptionError)

    def validate(self, where: str = "topology", error: type[InputError] = TaskError) -> "Topology":
        """Raise `error` (one line naming `where` and the key) unless every field is in range and
        the device count is within MAX_DEVICES. Returns the topology."""
        parse_int(self.hosts, where, "key 'hosts'", 1, MAX_DEVICES, error, text=False)
        parse_int(self.gpus_per_host, where, "key 'gpus_per_host'", 1, MAX_DEVICES, error, text=False)
        if self.devices > MAX_DEVICES:
            raise error(f"{where}: {self.hosts} hosts × {self.gpus_per_host} GPUs = {self.devices:,} devices, over the limit of {MAX_DEVICES:,}")
        if self.hbm_bytes is not None:
            parse_int(self.hbm_bytes, where, "key 'hbm_bytes'", 1, MAX_MEMORY_BYTES, error, text=False)
        for key in ("intra_host_GBps", "inter_host_GBps"):
            if parse_float(getattr(self, key), where, f"key {key!r}", 0.0, MAX_BANDWIDTH_GBPS, error, text=False) <= 0:
                raise error(f"{where}, key {key!r}: must be > 0")
        for key in ("intra_host_latency_us", "inter_host_latency_us"):
            parse_float(getattr(self, key), where, f"key {key!r}", 0.0, MAX_LATENCY_US, error, text=False)
        parse_str(self.name, where, "key 'name'", error)
        return self

    def to_json(self) -> dict:
        d = {k: getattr(self, k) for k in KEYS}
        if d["hbm_bytes"] is None:
            d.pop("hbm_bytes")
        return d

    @staticmethod
    def from_json(d: Any, where: str = "topology", error: type[InputError] = TaskError) -> "Topology":
        """From a task's, plan's or topology file's object: 'hosts' and 'gpus_per_host' required,
        the rest defaulting to one DGX H100's links; an unknown key is refused (a misspelt
        bandwidth silently defaulted would price every plan with the wrong network)."""
        require_dict(d, where, "a topology", error)
        unknown = sorted(set(d) - set(KEYS))
        if unknown:
            raise error(f"{where}: unknown key {unknown[0]!r:.40}; a topology has {', '.join(KEYS)}")
        for key in ("hosts", "gpus_per_host"):
            if key not in d:
                raise error(f"{where}: missing key {key!r}")
        values = {k: d[k] for k in KEYS if k in d}
        for key in ("hosts", "gpus_per_host", "hbm_bytes"):
            if values.get(key) is not None:
                values[key] = parse_int(values[key], where, f"key {key!r}", 1, None, error, text=False)
        return Topology(**values).validate(where, error)

    # -- TorchRec ----------------------------------------------------------------------------

    def to_torchrec(self, hbm_cap: int | None = None, compute_device: str = "cuda", ddr_cap: int | None = None):
        """TorchRec's `Topology` of this machine: world_size, local_world_size, hbm_cap (`hbm_cap`,
        else this topology's HBM) and the two bandwidths in TorchRec's unit, bytes per ms."""
        from torchrec.distributed.planner import Topology as TRTopology

        from dreamshard.torchrec_quiet import quiet

        cap = hbm_cap if hbm_cap is not None else self.hbm_bytes
        with quiet():  # TorchRec warns of every Topology not built by its factory
            return TRTopology(world_size=self.devices, compute_device=compute_device, hbm_cap=cap, local_world_size=self.gpus_per_host,
                              intra_host_bw=self.intra_host_GBps * 1e6, inter_host_bw=self.inter_host_GBps * 1e6, **({"ddr_cap": ddr_cap} if ddr_cap else {}))


def several_hosts(topology: Topology | None) -> Topology | None:
    """`topology` where it spans several hosts (priced in two levels, costs/hierarchy.py), else
    None: a task without one, or of one host, is priced as one host."""
    return topology if topology is not None and topology.multi_host else None


def one_host(devices: int) -> Topology:
    """What a task without a topology is: one host of `devices` GPUs (`--devices D`)."""
    return Topology(hosts=1, gpus_per_host=devices, name="one host")


def from_torchrec(topology: Any, where: str = "TorchRec Topology") -> Topology:
    """Our topology of a TorchRec `Topology`: its world_size, local_world_size (its GPUs per host),
    the first device's HBM and intra_host_bw / inter_host_bw (bytes per ms → GB/s)."""
    try:
        world, local = int(topology.world_size), int(topology.local_world_size)
        devices = topology.devices
        hbm = int(devices[0].storage.hbm) if devices else None
        intra, inter = float(topology.intra_host_bw), float(topology.inter_host_bw)
    except (AttributeError, TypeError, ValueError, IndexError) as e:
        raise InputError(f"{where}: not a TorchRec Topology ({one_line(e)})") from None
    if local < 1 or world % local:
        raise InputError(f"{where}: world_size {world} is not a whole number of hosts of local_world_size {local}")
    return Topology(hosts=world // local, gpus_per_host=local, hbm_bytes=hbm or None, intra_host_GBps=intra / 1e6, inter_host_GBps=inter / 1e6,
                    name="from TorchRec").validate(where, InputError)


# Public specifications (module docstring): one host of each; `--topology NAME:H` takes H of them.
PRESETS: dict[str, Topology] = {
    "h100-sxm": Topology(1, 8, 80_000_000_000, 450.0, 50.0, 2.0, 5.0, "DGX H100: 8 × H100 SXM 80 GB, NVLink 4, 8 × ConnectX-7 400 Gb/s"),
    "h200-sxm": Topology(1, 8, 141_000_000_000, 450.0, 50.0, 2.0, 5.0, "DGX H200: 8 × H200 SXM 141 GB, NVLink 4, 8 × ConnectX-7 400 Gb/s"),
    "a100-sxm": Topology(1, 8, 80_000_000_000, 300.0, 25.0, 2.0, 5.0, "DGX A100: 8 × A100 SXM 80 GB, NVLink 3, 8 × ConnectX-6 200 Gb/s"),
}


def parse_topology(text: str, hosts: int | None = None, error: type[InputError] = OptionError) -> Topology:
    """`--topology` (and `--hosts`): a preset name (`h100-sxm`), a preset and host count
    (`h100-sxm:4`), or a JSON / YAML file of one topology object. `hosts` overrides the count."""
    text = str(text).strip()
    name, _, count = text.partition(":")
    if name in PRESETS:
        topo = PRESETS[name]
        if count:
            topo = replace(topo, hosts=parse_int(count, f"--topology {text!r:.40}", "host count", 1, MAX_DEVICES, error))
    elif Path(text).is_file():
        topo = load_topology(text, error)
    else:
        raise error(f"--topology {text!r:.60}: neither a preset ({', '.join(PRESETS)}, optionally NAME:HOSTS) nor a topology file")
    if hosts is not None:
        topo = replace(topo, hosts=hosts)
    return topo.validate(f"--topology {text!r:.60}", error)


def load_topology(path: str | Path, error: type[InputError] = OptionError) -> Topology:
    """A topology file: one JSON object (or YAML mapping, .yaml / .yml, where PyYAML is installed)
    with the keys of `Topology.to_json`."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise error(f"{path}: cannot read ({one_line(getattr(e, 'strerror', None) or e)})") from None
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise error(f"{path}: reading YAML needs PyYAML (pip install pyyaml); or write the topology as JSON") from None
        try:
            d = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise error(f"{path}: invalid YAML ({one_line(e)[:200]})") from None
    else:
        d = load_json_document(text, str(path), error)
    return Topology.from_json(d, str(path), error)
