"""The `torchrec` planner: TorchRec 1.8's EmbeddingShardingPlanner on the CPU, its plans converted
to our shards (table-wise and column-wise), its own estimate beside them, its refusals typed."""

import builtins
import subprocess
import sys

import pytest

pytest.importorskip("torchrec", reason="TorchRec 1.8 is not importable here (the planner needs it)")

from dreamshard.costs.sim import SimBackend  # noqa: E402
from dreamshard.packing import InfeasibleError, pack  # noqa: E402
from dreamshard.planners import PLANNERS, get_planner  # noqa: E402
from dreamshard.planners.torchrec import SOURCE, NotExpressibleError, TorchRecPlanner, TorchRecUnavailable  # noqa: E402
from dreamshard.synth import PoolConfig, synth_pool  # noqa: E402
from dreamshard.tables import NUM_BINS, TableSpec  # noqa: E402
from dreamshard.tasks import Task, Workload, sample_tasks  # noqa: E402
from dreamshard.validation import InputError, OptionError  # noqa: E402

BINS = tuple([1.0 / NUM_BINS] * NUM_BINS)


def table(name, rows, dim, pf):
    return TableSpec(name, rows, dim, pf, BINS)


MIXED = [table("a", 100_000, 128, 20.0), table("b", 50_000, 64, 5.0), table("c", 1_000, 32, 1.0), table("d", 200_000, 256, 30.0)]


@pytest.fixture(scope="module")
def pool_tasks():
    """Small DLRM-like tasks from the synthetic pool, roomy enough for TorchRec's reservation."""
    tables = synth_pool(PoolConfig(tables=60, seed=5))
    return sample_tasks(tables, 6, (5, 20), 4, 20 * 10**9, seed=3)


def test_registered_and_listed():
    assert PLANNERS["torchrec"] is TorchRecPlanner and TorchRecPlanner.kind == "search"
    assert set(TorchRecPlanner.options()) >= {"sharding_types", "reservation"}
    r = subprocess.run([sys.executable, "-m", "dreamshard.cli", "planners"], capture_output=True, text=True)
    assert r.returncode == 0 and "torchrec" in r.stdout


def test_registry_does_not_import_torchrec():
    code = "import sys, dreamshard.planners as p; assert 'torchrec' in p.PLANNERS; print('torchrec' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr


@pytest.mark.parametrize("workload", [Workload(), Workload(precision="fp32"), Workload(optimizer="rowwise_adagrad"), Workload(batch_size=4096, precision="fp32", optimizer="rowwise_adagrad")])
def test_small_tasks_plan_table_wise_within_memory(pool_tasks, workload):
    planner = get_planner("torchrec")
    sim = SimBackend()
    for base in pool_tasks:
        task = Task(base.tables, base.devices, base.max_memory_bytes, workload)
        plan = planner.plan(task)
        plan.check()
        assert plan.is_table_wise and plan.planner == "torchrec" and len(plan.placement) == len(task.tables)
        p = plan.predicted
        assert p["source"] == SOURCE and p["sharding_types"] == {"table_wise": len(task.tables)}
        assert p["overall_ms"] > 0 and p["overall_ms"] == max(d["total_ms"] for d in p["devices"]) and len(p["devices"]) == task.devices
        assert len(p["storage_bytes"]) == task.devices and p["reserved_bytes"] > 0
        if workload.optimizer == "sgd":  # TorchRec's storage estimate counts at least the weights we count, plus its buffers
            assert all(theirs >= ours for theirs, ours in zip(p["storage_bytes"], plan.device_bytes()) if ours)
        assert any(n.startswith("TorchRec planned in ") for n in plan.notes)
        assert sim.evaluate_plan(plan).overall_ms > 0


def test_batch_size_is_per_rank():
    """TorchRec's batch_size is the local batch: the global one divided by the ranks."""
    planner = get_planner("torchrec")
    task = Task(MIXED, 4, 10**9, Workload(batch_size=8192))
    assert planner.planner(task)._batch_size == 2048


def test_column_wise_converts_to_column_shards():
    task = Task(MIXED, 4, 10**9)
    for types in ("column_wise", "table_wise,column_wise", "table_column_wise"):
        plan = TorchRecPlanner(sharding_types=types).plan(task)
        plan.check()  # every table's shards tile its columns, each device within memory
        assert sum(plan.predicted["sharding_types"].values()) == len(task.tables)
        for name, n in plan.split_tables().items():  # TorchRec's column shards, each on its own rank
            i = [t.name for t in task.tables].index(name)
            mine = [s for s in plan.shards if s.table == i]
            assert len(mine) == n and mine[0].start == 0 and mine[-1].stop == task.tables[i].dim
    # forced column-wise, TorchRec cuts the 256-wide, busiest table across ranks
    assert TorchRecPlanner(sharding_types="column_wise").plan(task).split_tables() == {"d": 2}


def test_row_wise_choices_are_plans():
    """TorchRec's row_wise shards become our row shards: its blocks of ceil(rows / ranks) rows,
    block r on rank r, a valid plan; "all" gives a plan of ours or, for a type we lack, the error."""
    task = Task(MIXED, 4, 10**9)
    plan = TorchRecPlanner(sharding_types="row_wise").plan(task)
    plan.check()
    assert plan.has_row_shards() and plan.predicted["sharding_types"] == {"row_wise": len(MIXED)}
    for i, t in enumerate(task.tables):
        mine = sorted((s for s in plan.shards if s.table == i), key=lambda s: s.row_start)
        b = -(-t.rows // 4)
        assert [(s.device, *s.row_range(t)) for s in mine] == [(r, r * b, min((r + 1) * b, t.rows)) for r in range(len(mine))]
    assert issubclass(NotExpressibleError, InputError) and not issubclass(NotExpressibleError, InfeasibleError)
    try:  # "all": whatever TorchRec chooses is either a plan of ours or this error
        TorchRecPlanner(sharding_types="all").plan(Task(MIXED, 4, 10**9)).check()
    except NotExpressibleError as e:
        assert "not expressible" in str(e) and "\n" not in str(e)
    from dreamshard.torchrec_io import shards_from_torchrec

    with pytest.raises(NotExpressibleError, match=r"^torchrec chose data_parallel for table a: not expressible \(our plans have table-wise, column, row and grid shards\)$"):
        shards_from_torchrec("data_parallel", "a", 0, [(0, 0, 10, 0, 8)], "torchrec chose")


def test_tight_task_torchrec_reserves_memory_ours_place():
    """Two equal tables on two devices with 30% headroom each: every other planner places one table
    a device; TorchRec holds back 15% of HBM and its input buffers, and finds no table-wise plan."""
    tables = [table("x", 1_000_000, 64, 10.0), table("y", 1_000_000, 64, 10.0)]
    size = Task(tables, 2, 1).sizes()[0]
    task = Task(tables, 2, int(size * 1.3))
    assert pack(task.sizes(), task.max_memory_bytes, task.devices) is not None
    for name in ("lookup", "size", "dreamshard"):
        get_planner(name).plan(task).check()
    with pytest.raises(InfeasibleError) as e:
        get_planner("torchrec").plan(task)
    msg = str(e.value)
    assert msg.startswith("TorchRec found no table-wise plan for 2 tables on 2 devices") and "it reserves" in msg and "\n" not in msg
    # without its 15% margin, TorchRec's own buffers still do not fit next to the table at 5% headroom
    with pytest.raises(InfeasibleError, match="reserves 0 bytes"):
        TorchRecPlanner(reservation=0.0).plan(Task(tables, 2, int(size * 1.05)))


def test_hopeless_task_gets_the_common_infeasible_error():
    tables = [table("x", 1_000_000, 64, 10.0)]
    with pytest.raises(InfeasibleError, match=r"^cannot place 1 tables needing"):
        get_planner("torchrec").plan(Task(tables, 2, 1))


@pytest.mark.parametrize("kwargs, needle", [
    ({"sharding_types": "diagonal"}, "sharding type 'diagonal'"),
    ({"sharding_types": ""}, "sharding_types"),
    ({"reservation": 1.5}, "reservation"),
    ({"timeout_s": 0}, "timeout_s"),
])
def test_bad_options(kwargs, needle):
    with pytest.raises(OptionError, match=needle):
        TorchRecPlanner(**kwargs)


def test_without_torchrec_construction_is_one_line_error(monkeypatch):
    """As on the GPU machines: the registry lists it, building it says why it cannot run."""
    real = builtins.__import__

    def no_torchrec(name, *args, **kwargs):
        if name == "torchrec" or name.startswith("torchrec."):
            raise ModuleNotFoundError("No module named 'torchrec'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torchrec)
    with pytest.raises(TorchRecUnavailable) as e:
        get_planner("torchrec")
    assert "needs torchrec" in str(e.value) and "No module named 'torchrec'" in str(e.value) and "\n" not in str(e.value)
    assert isinstance(e.value, OptionError)  # the CLI's one line on stderr and exit status 2


def test_torchrecs_own_failure_on_a_task_is_one_line_and_compare_goes_on(monkeypatch):
    """TorchRec raising something other than its PlannerError (1,518 tables on 690 ranks: "Invalid
    device string: 'cuda:-93'") is this peer having no plan for the task: a NoPlanError of one line,
    which `compare` records in the planner's row instead of stopping."""
    from dreamshard.report import evaluate
    from dreamshard.validation import NoPlanError

    class Broken:
        def plan(self, module, sharders):
            raise RuntimeError("Invalid device string: 'cuda:-93'\n(deep inside TorchRec)")

    planner = TorchRecPlanner()
    monkeypatch.setattr(planner, "planner", lambda task: Broken())
    task = Task(MIXED, 2, 10**12)
    with pytest.raises(NoPlanError) as e:
        planner.plan(task)
    assert str(e.value) == "TorchRec failed to plan 4 tables on 2 devices (RuntimeError: Invalid device string: 'cuda:-93' (deep inside TorchRec))"
    results = evaluate({"torchrec": planner, "size": get_planner("size")}, [task], SimBackend())
    assert [r.error for r in results.rows if r.planner == "torchrec"] == [str(e.value)]
    assert all(r.ok for r in results.rows if r.planner == "size")


def test_torchrec_on_690_devices_is_one_line(tmp_path):
    """The issue's case through the CLI: TorchRec's rank arithmetic fails past its limits."""
    from click.testing import CliRunner

    from dreamshard.cli import cli
    from dreamshard.synth import write_pool

    write_pool(synth_pool(PoolConfig(tables=1518, seed=0)), tmp_path / "pool", PoolConfig(tables=1518, seed=0))
    r = CliRunner().invoke(cli, ["plan", str(tmp_path / "pool" / "tables.csv"), "--devices", "690", "--max-memory", "80GB", "--planner", "torchrec",
                                 "--out", str(tmp_path / "p.json")])
    assert r.exit_code == 2 and len(r.stderr.splitlines()) == 1 and r.stderr.startswith("error: TorchRec failed to plan 1518 tables on 690 devices"), r.stderr
    assert not (tmp_path / "p.json").exists()
