"""`torchrec`: TorchRec 1.8's `EmbeddingShardingPlanner` as a peer planner, run on the CPU.

The task becomes what TorchRec plans: an `EmbeddingBagCollection` built on the "meta" device (so a
table of 10^8 rows costs no memory) with one `EmbeddingBagConfig` per table (its rows, dim, name,
one feature, the workload's precision as `data_type`), a `Topology` of D "cuda" ranks whose HBM is
the task's memory cap (for a task with a topology, topology.py: its GPUs per host as
`local_world_size` and its intra- and inter-host bandwidths, `Topology.to_torchrec`), the workload's batch size *per rank* (TorchRec's `batch_size` is the local
batch: its estimators multiply by the world size for the global one), and per table a
`ParameterConstraints` with its pooling factor, the `fused` kernel and the sharding types allowed.
With `rowwise_adagrad` the weights carry TorchRec's `RowWiseAdagrad` optimizer class, so its storage
estimate counts the optimizer state.

TorchRec's own search (grid and greedy proposers, greedy-perf partitioner, its analytic perf model)
then places the tables under its storage reservation: by default `HeuristicalStorageReservation`
(15% of HBM, plus buffers for the input KJTs and dense tensors). That reservation is why TorchRec
finds no table-wise plan on some tight tasks our planners place: such a task raises
`InfeasibleError` with TorchRec's reason in one line.

Its plan is converted to our shards (`torchrec_io.shards_from_torchrec`, the one conversion
behind `torchrec_io.plan_from_torchrec` too): table_wise → one full-width shard on its rank; column_wise and
table_column_wise → one column shard per TorchRec shard (its column offset and width); row_wise and
table_row_wise → one row shard per TorchRec shard of some rows (its row offset and count: TorchRec's
blocks of ceil(rows / ranks), `torchrec_io.row_wise_cuts`), priced by our backends as any row
shard (its measured lookups, the reduce-scatter); grid_shard → the same per column block (our
grid: column ranges, each split by rows). Data-parallel shards have no form in our plans: they
raise `NotExpressibleError`. TorchRec's own estimate (per rank, the sum of its shards' perf, in ms; the
plan's cost is the slowest rank, as its `NoopPerfModel` rates plans) and its storage estimate go in
`plan.predicted`; its planning time in the plan's notes.

With host memory (`Task.host_memory_bytes`) and tables that need it, the constraints also allow
`fused_uvm_caching` and `fused_uvm` and the topology gets the host memory as `ddr_cap`: TorchRec
then chooses each table's kernel and cache load factor, which become our tiers (docs/tiers.md); the
tier stage the other planners run in is skipped (`chooses_tiers`).

TorchRec is imported lazily, inside the planner: it is slow to import and absent on the GPU
machines, where constructing this planner raises `TorchRecUnavailable` (one line) while the
registry still lists it.
"""

from __future__ import annotations

import re
import time

from dreamshard.packing import InfeasibleError, over_bounds
from dreamshard.plan import Plan, Shard
from dreamshard.planners.base import Planner, register
from dreamshard.planners.heuristics import task_infeasible
from dreamshard.tasks import Task
from dreamshard.torchrec_io import ALL_TYPES, EXPRESSIBLE, NOT_EXPRESSIBLE_WHY, NotExpressibleError, TorchRecUnavailable, import_torchrec, shards_from_torchrec  # noqa: F401  (re-exported)
from dreamshard.torchrec_io import quiet as _quiet
from dreamshard.torchrec_io import tier_from_torchrec
from dreamshard.validation import NoPlanError, OptionError, one_line

SOURCE = "TorchRec 1.8 planner estimate"


def _import_torchrec():
    """TorchRec's classes the planner uses; TorchRecUnavailable (one line) where it cannot be imported."""
    import_torchrec("planner torchrec")
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
    from torchrec.distributed.planner.types import PlannerError
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.optim import RowWiseAdagrad
    from torchrec.types import DataType

    return dict(
        Sharder=EmbeddingBagCollectionSharder, EmbeddingShardingPlanner=EmbeddingShardingPlanner, ParameterConstraints=ParameterConstraints,
        Topology=Topology, FixedPercentageStorageReservation=FixedPercentageStorageReservation, PlannerError=PlannerError,
        EmbeddingBagConfig=EmbeddingBagConfig, EmbeddingBagCollection=EmbeddingBagCollection, RowWiseAdagrad=RowWiseAdagrad, DataType=DataType,
    )


def parse_sharding_types(text: str) -> tuple[str, ...] | None:
    """'table_wise' (default), 'all' (None: whatever TorchRec's sharder allows) or a comma list."""
    if not isinstance(text, str) or not text.strip():
        raise OptionError(f"planner torchrec: sharding_types {text!r:.40}: use table_wise, all, or a comma list of {', '.join(ALL_TYPES)}")
    if text.strip() == "all":
        return None
    types = tuple(t.strip() for t in text.split(","))
    for t in types:
        if t not in ALL_TYPES:
            raise OptionError(f"planner torchrec: sharding type {t!r:.40} is not one of {', '.join(ALL_TYPES)} (or all)")
    return types


@register
class TorchRecPlanner(Planner):
    name = "torchrec"
    kind = "search"
    description = "TorchRec 1.8's EmbeddingShardingPlanner on the CPU: its search, cost model and memory reservation"
    # with host memory, TorchRec chooses each table's kernel (fused, fused_uvm_caching, fused_uvm) and cache itself
    chooses_tiers = True

    def __init__(self, sharding_types: str = "table_wise", reservation: float | None = None, timeout_s: int | None = None):
        """`sharding_types`: table_wise, all, or a comma list of TorchRec's types. `reservation`:
        None keeps TorchRec's default reservation (HeuristicalStorageReservation: 15% of HBM plus
        input and dense buffers); a fraction in [0, 1) reserves only that share of HBM
        (FixedPercentageStorageReservation). `timeout_s`: TorchRec's own search time limit."""
        self.types = parse_sharding_types(sharding_types)
        self.sharding_types = sharding_types
        if reservation is not None and not (isinstance(reservation, (int, float)) and 0 <= reservation < 1):
            raise OptionError(f"planner torchrec: reservation {reservation!r:.40} must be None or a fraction in [0, 1)")
        if timeout_s is not None and not (isinstance(timeout_s, int) and timeout_s > 0):
            raise OptionError(f"planner torchrec: timeout_s {timeout_s!r:.40} must be None or a positive integer")
        self.reservation, self.timeout_s = reservation, timeout_s
        self.tr = _import_torchrec()

    # -- TorchRec's view of a task -----------------------------------------------------------

    def module(self, task: Task):
        import torch

        tr = self.tr
        dtype = tr["DataType"].FP16 if task.workload.precision == "fp16" else tr["DataType"].FP32
        configs = [tr["EmbeddingBagConfig"](num_embeddings=t.rows, embedding_dim=t.dim, name=t.name, feature_names=[f"f{i}"], data_type=dtype)
                   for i, t in enumerate(task.tables)]
        ebc = tr["EmbeddingBagCollection"](tables=configs, device=torch.device("meta"))
        if task.workload.optimizer == "rowwise_adagrad":  # what apply_optimizer_in_backward marks: TorchRec's storage counts the state
            for p in ebc.parameters():
                p._optimizer_classes = [tr["RowWiseAdagrad"]]
        return ebc

    @staticmethod
    def uses_host(task: Task) -> bool:
        """TorchRec may put tables in host memory (fused_uvm_caching) when the task offers host
        memory and the tables do not fit in HBM (where they fit, every table stays `fused`, as
        without host memory)."""
        return bool(task.host_memory_bytes) and sum(task.sizes()) > task.devices * task.max_memory_bytes * 0.85

    def planner(self, task: Task):
        tr = self.tr
        D = task.devices
        # host memory allowed where the tables need it: TorchRec then chooses per table between HBM,
        # host memory behind a cache (its default load factor, 0.2) and host memory read directly
        kernels = ["fused", "fused_uvm_caching", "fused_uvm"] if self.uses_host(task) else ["fused"]
        constraints = {
            t.name: tr["ParameterConstraints"](sharding_types=list(self.types) if self.types else None, compute_kernels=kernels,
                                               pooling_factors=[float(t.pooling_factor)])
            for t in task.tables
        }
        with _quiet():
            host = {"ddr_cap": task.host_memory_bytes} if task.host_memory_bytes else {}
            if task.topology is not None:  # its hosts, GPUs per host and links, as TorchRec's cost model reads them
                topology = task.topology.to_torchrec(hbm_cap=task.max_memory_bytes, **host)
            else:
                topology = tr["Topology"](world_size=D, compute_device="cuda", hbm_cap=task.max_memory_bytes, **host)
        reservation = tr["FixedPercentageStorageReservation"](float(self.reservation)) if self.reservation is not None else None
        with _quiet():
            return tr["EmbeddingShardingPlanner"](
                topology=topology,
                batch_size=max(1, task.workload.batch_size // D),  # per rank, as TorchRec's batch_size is
                constraints=constraints,
                storage_reservation=reservation,
                stats=[],
                debug=False,
                timeout_seconds=self.timeout_s,
            )

    # -- planning ------------------------------------------------------------------------------

    def run(self, task: Task):
        """TorchRec's best plan for the task: (its sharding options, its planner, seconds taken).
        Raises InfeasibleError when TorchRec finds none."""
        with _quiet():
            t0 = time.perf_counter()
            module = self.module(task)
            # TorchRec failing on a task (e.g. "Invalid device string: 'cuda:-93'" on 690 ranks) is
            # this peer having no plan for it: one line, not a traceback of TorchRec's internals
            try:
                planner = self.planner(task)
            except Exception as e:  # noqa: BLE001 - see above
                raise self._failed(task, e) from None
            try:
                planner.plan(module, [self.tr["Sharder"]()])
            except self.tr["PlannerError"] as e:
                raise InfeasibleError(self._reason(task, planner, e)) from None
            except Exception as e:  # noqa: BLE001 - see above
                raise self._failed(task, e) from None
            seconds = time.perf_counter() - t0
        return planner._best_plan, planner, seconds

    @staticmethod
    def _failed(task: Task, error: Exception) -> NoPlanError:
        return NoPlanError(one_line(f"TorchRec failed to plan {len(task.tables)} tables on {task.devices} devices ({type(error).__name__}: {one_line(error)[:300]})"))

    @staticmethod
    def reserved(planner, cap: int) -> tuple[int, str]:
        """Bytes per device TorchRec's storage reservation held back on this task, and of what."""
        r = planner._storage_reservation
        pct = int(getattr(r, "_percentage", 0.0) * cap)
        dense = int(getattr(getattr(r, "_dense_storage", None), "hbm", 0) or 0)
        kjt = int(getattr(getattr(r, "_kjt_storage", None), "hbm", 0) or 0)
        top = getattr(r, "_last_reserved_topology", None)
        if top is not None:
            total = cap - int(top.devices[0].storage.hbm)
        else:  # it raised before keeping the topology: the heuristic reservation went negative
            total = pct + dense + kjt
        parts = f"{getattr(r, '_percentage', 0.0):.0%} of HBM"
        if total > pct:
            parts += f", {kjt:,} for input KJTs" + (f", {dense:,} for dense tensors" if dense else "")
        return total, parts

    def _reason(self, task: Task, planner, error) -> str:
        lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
        need = next((m.group(1) for ln in lines if ln.startswith("Global storage requirement") for m in [re.search(r"hbm = ([0-9.]+ GB)", ln)] if m), None)
        first = lines[0].split(". ")[0].rstrip(".") if lines else type(error).__name__
        reserved, parts = self.reserved(planner, task.max_memory_bytes)
        what = "table-wise plan" if self.types == ("table_wise",) else "plan"
        msg = (f"TorchRec found no {what} for {len(task.tables)} tables on {task.devices} devices of {task.max_memory_bytes:,} bytes "
               f"after {planner._num_proposals} proposal{'' if planner._num_proposals == 1 else 's'}: {first}; it reserves {reserved:,} bytes per device ({parts})")
        if need:
            msg += f"; its shards need {need} of HBM in all"
        return one_line(msg)

    def plan(self, task: Task) -> Plan:
        sizes = task.sizes()
        if not self.uses_host(task):
            if self.types == ("table_wise",) and over_bounds(sizes, task.max_memory_bytes, task.devices):
                raise task_infeasible(task)  # no table-wise plan can exist: say so as every planner does
            if sum(sizes) > task.devices * task.max_memory_bytes:
                raise task_infeasible(task)
        options, planner, seconds = self.run(task)
        index = {t.name: i for i, t in enumerate(task.tables)}
        shards: list[Shard] = []
        D = task.devices
        perf = [[0.0, 0.0, 0.0, 0.0] for _ in range(D)]  # fwd compute, bwd compute, comms, total (ms)
        hbm = [0] * D
        chosen: dict[str, int] = {}
        for so in options:
            kind = str(so.sharding_type)
            chosen[kind] = chosen.get(kind, 0) + 1
            tier = tier_from_torchrec(so.compute_kernel, so.cache_load_factor, f"torchrec chose for table {so.name}")
            shards += shards_from_torchrec(kind, so.name, index[so.name], [(s.rank, s.offset[0], s.size[0], s.offset[1], s.size[1]) for s in so.shards], "torchrec chose", tier)
            for s in so.shards:
                p = s.perf
                row = perf[s.rank]
                row[0] += p.fwd_compute
                row[1] += p.bwd_compute
                row[2] += p.fwd_comms + p.bwd_comms
                row[3] += p.total
                hbm[s.rank] += int(s.storage.hbm)
        reserved, _ = self.reserved(planner, task.max_memory_bytes)
        predicted = {
            "source": SOURCE,
            "overall_ms": max(r[3] for r in perf),
            "devices": [{"fwd_comp_ms": r[0], "bwd_comp_ms": r[1], "comm_ms": r[2], "total_ms": r[3]} for r in perf],
            "storage_bytes": hbm,  # TorchRec's HBM estimate per rank: weights, optimizer state, input/output buffers
            "reserved_bytes": int(reserved),  # per rank, held back by its storage reservation
            "sharding_types": chosen,
            "planning_ms": seconds * 1000,
        }
        notes = [f"TorchRec planned in {seconds * 1000:.0f} ms ({planner._num_proposals} proposal{'' if planner._num_proposals == 1 else 's'}; "
                 f"reserved {reserved:,} of {task.max_memory_bytes:,} bytes per device)"]
        plan = Plan(task, shards, self.name, predicted, notes)
        used = plan.device_bytes()
        over = max(range(D), key=lambda d: used[d])
        if used[over] > task.max_memory_bytes:  # its storage model is not ours (e.g. fp16 row-wise Adagrad state): never hand back a plan over memory
            raise InfeasibleError(f"TorchRec's plan puts {used[over]:,} bytes on device {over} by our count, over its max_memory_bytes {task.max_memory_bytes:,} (TorchRec counted {hbm[over]:,})")
        plan.check("torchrec plan")
        return plan
