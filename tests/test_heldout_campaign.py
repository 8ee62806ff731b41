"""The held-out planner campaign's logic, end to end on the CPU (benchmarks/heldout.py): plans made
here, measured (torch kernel, small tables), resumed, and the report's tables."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def text_of(path: Path) -> str:
    """A gzipped plan file's text (the campaign keeps its plans as plans.jsonl.gz)."""
    return gzip.decompress(path.read_bytes()).decode()


def run(*args: str) -> str:
    return subprocess.run([sys.executable, "benchmarks/heldout.py", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def test_plans_measured_and_reported(tmp_path):
    run("plan", "--quick", "--out", str(tmp_path))
    measure = ("measure", "--out", str(tmp_path), "--plans", str(tmp_path / "plans.jsonl.gz"), "--cpu", "--quick")
    run(*measure)
    rows = (tmp_path / "measured.csv").read_text().splitlines()
    # every distinct plan measured once; a plan two planners made names both
    assert len(rows) - 1 == len(text_of(tmp_path / "plans.jsonl.gz").splitlines())
    # a second call measures nothing again
    run(*measure)
    assert (tmp_path / "measured.csv").read_text().splitlines() == rows
    # a planner added later: its plans the same as another's are not measured again (a plan is its
    # task and its shards' hash; the planners that made it are a note)
    run("plan", "--quick", "--out", str(tmp_path), "--again", "dreamshard (no annealing)")
    run(*measure)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from heldout import load_plans, note, plan_hash

    plans = {(note(p, "family"), note(p, "setting"), note(p, "task"), plan_hash(p)) for p in load_plans(tmp_path / "plans.jsonl.gz")}
    with open(tmp_path / "measured.csv") as fh:
        measured = [tuple(line.split(",")[i] for i in (0, 1, 2, 4)) for line in fh.read().splitlines()[1:]]
    assert len(measured) == len(set(measured)) and plans <= set(measured)
    text = run("report", str(tmp_path), "--write")
    assert "| dreamshard (no annealing) |" in text
    assert (tmp_path / "report.md").read_text() in text
    assert "## mixed (held out), 60 tables / 4 devices / 24 GB: 1 tasks" in text
    for label in ("| dreamshard |", "| dreamshard --no-split |", "| neuroshard |", "| lookup |", "| size_lookup |"):
        assert label in text
    assert "| dreamshard | " in text.split("The cost net's per-plan error")[1]
    assert "## DreamShard's search: the candidate chosen" in text
    assert "| mixed | " in text.split("## Each price against the GPU, by family and plan kind")[1]
    by_kind = text.split("## Each price against the GPU, by plan kind")[1].split("##")[0]
    counts = [int(line.split("|")[2]) for line in by_kind.splitlines() if line.startswith("| ") and not line.startswith("| plan kind")]
    assert sum(counts) == len(measured)  # every measured plan once, by its kind
    by_split = text.split("## Each price against the GPU, by the tables a plan cuts into columns")[1].split("##")[0]
    counts = [int(line.split("|")[2]) for line in by_split.splitlines() if line.startswith("| ") and not line.startswith("| tables cut")]
    assert sum(counts) == sum(kind in ("table-wise", "columns") for kind in (line.split(",")[5] for line in (tmp_path / "measured.csv").read_text().splitlines()[1:]))
    assert "| 0 | " in by_split  # the table-wise plans: no table cut


def test_some_planners_measured_alone(tmp_path):
    """`measure --planners`: only those planners' plans are measured, and OUT holds them for `report OUT`."""
    run("plan", "--quick", "--out", str(tmp_path / "all"))
    before = text_of(tmp_path / "all" / "plans.jsonl.gz")
    run("plan", "--quick", "--out", str(tmp_path / "all"), "--again", "dreamshard")  # its plans again; `dreamshard --no-split`'s keep their names
    assert before.count('"planner dreamshard --no-split"') == text_of(tmp_path / "all" / "plans.jsonl.gz").count('"planner dreamshard --no-split"') == 1
    out = tmp_path / "some"
    run("measure", "--out", str(out), "--plans", str(tmp_path / "all" / "plans.jsonl.gz"), "--cpu", "--quick", "--planners", "dreamshard,lookup,size_lookup")
    plans = text_of(out / "plans.jsonl.gz").splitlines()
    assert 1 <= len(plans) < len(text_of(tmp_path / "all" / "plans.jsonl.gz").splitlines())
    assert len((out / "measured.csv").read_text().splitlines()) - 1 == len(plans)
    text = run("report", str(out))
    assert "| dreamshard |" in text and "| lookup |" in text and "| random |" not in text
    for labels, msg in (("nope", "unknown planner label 'nope'"), ("dreamshard", "add lookup, size_lookup")):
        bad = subprocess.run([sys.executable, "benchmarks/heldout.py", "measure", "--out", str(out), "--planners", labels], cwd=ROOT, capture_output=True, text=True)
        assert bad.returncode != 0 and msg in bad.stderr


def test_development_tasks_with_another_model(tmp_path):
    """`--dev`: the training families' tasks (never a held-out family), reported as development;
    `--model LABEL=PATH`: one more dreamshard planner, on every step under the same label."""
    model = ("--model", "dreamshard (again)=dreamshard/data/models/dreamshard_h100.pt")
    run("plan", "--quick", "--dev", "--out", str(tmp_path), "--again", "dreamshard,dreamshard (seed 1),lookup,size_lookup,dreamshard (again)", *model)
    plans = text_of(tmp_path / "plans.jsonl.gz")
    assert '"family dlrm"' in plans and "mixed" not in plans and '"planner dreamshard (again)"' in plans
    run("measure", "--out", str(tmp_path), "--plans", str(tmp_path / "plans.jsonl.gz"), "--cpu", "--quick", *model)
    text = run("report", str(tmp_path), *model)
    assert "## dlrm (development), 60 tables / 4 devices / 24 GB: 1 tasks" in text
    assert "| dreamshard (again) |" in text and "| dreamshard |" in text
    # what `--verify` keeps among the shipped model's variants (its seeds here; another model is not one)
    assert "| the fastest measured of the 2 `dreamshard` variants' plans | 1 |" in text
    bad = subprocess.run([sys.executable, "benchmarks/heldout.py", "report", str(tmp_path), "--model", "lookup=x.pt"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode != 0 and "give LABEL=PATH with a new label" in bad.stderr


def test_calibration_tasks_come_from_the_calibration_pools(tmp_path):
    """`--calib`: tasks of the training families' calibration pools (seed 10), whose plans'
    devices gpu_search_shards.py measures to fit; never with --dev."""
    run("plan", "--quick", "--calib", "--out", str(tmp_path), "--again", "lookup")
    plans = text_of(tmp_path / "plans.jsonl.gz")
    assert '"pool": "dlrm/10"' in plans and "mixed" not in plans
    bad = subprocess.run([sys.executable, "benchmarks/heldout.py", "plan", "--quick", "--calib", "--dev", "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode != 0 and "--dev and --calib: give one" in bad.stderr


def test_plans_for_another_gpu(tmp_path, monkeypatch):
    """`plan --gpu h200`: the plans carry their GPU; `--again` refuses a file of another GPU's plans,
    and `measure` one whose GPU is not this machine's (here, no GPU at all)."""
    run("plan", "--quick", "--gpu", "h200", "--out", str(tmp_path))
    assert text_of(tmp_path / "plans.jsonl.gz").count('"gpu h200"') == len(text_of(tmp_path / "plans.jsonl.gz").splitlines())
    again = subprocess.run([sys.executable, "benchmarks/heldout.py", "plan", "--quick", "--out", str(tmp_path), "--again", "dreamshard"], cwd=ROOT,
                           capture_output=True, text=True)
    assert again.returncode != 0 and "holds plans for the H200, not the H100: give --gpu h200" in again.stderr
    measure = subprocess.run([sys.executable, "benchmarks/heldout.py", "measure", "--out", str(tmp_path / "m"), "--plans", str(tmp_path / "plans.jsonl.gz")],
                             cwd=ROOT, capture_output=True, text=True)
    assert measure.returncode != 0 and "holds plans for the H200; this machine's GPU is none" in measure.stderr
    # `--sim`: the H200 simulator's prices in the measured column, and the report says so
    run("measure", "--out", str(tmp_path / "s"), "--plans", str(tmp_path / "plans.jsonl.gz"), "--sim")
    (tmp_path / "s" / "plans.jsonl.gz").write_bytes((tmp_path / "plans.jsonl.gz").read_bytes())
    simulated = run("report", str(tmp_path / "s"))
    assert simulated.startswith("Priced by the simulator, not measured (simulated (H200 calibration") and "Measured on" not in simulated
    rows = (tmp_path / "s" / "measured.csv").read_text().splitlines()
    assert len(rows) - 1 == len(text_of(tmp_path / "plans.jsonl.gz").splitlines())
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import heldout

    sim = heldout.SimBackend(heldout.CALIBRATIONS["h200"])
    first = heldout.load_plans(tmp_path / "plans.jsonl.gz")[0]
    assert float(rows[1].split(",")[6]) == round(sim.evaluate_plan(first).overall_ms, 5)
    run("measure", "--out", str(tmp_path), "--plans", str(tmp_path / "plans.jsonl.gz"), "--cpu", "--quick")
    assert "Simulator: simulated (H200 calibration" in run("report", str(tmp_path))  # the H200's calibration prices the simulated column
    # and the report's cost net prices their row splits with the H200's NCCL model, as `plan` did,
    # not with this machine's default GPU's
    first, second = heldout.load_plans(tmp_path / "plans.jsonl.gz")[:2]
    comms = []
    real = heldout.get_planner
    monkeypatch.setattr(heldout, "get_planner", lambda name, **kw: comms.append(kw.get("comm_model")) or real(name, **kw))
    prices, _ = heldout.scorers("h200")
    assert heldout.ordering({("f", "s", "0"): {"a": (1.0, 1.0, 1.0, first), "b": (1.02, 1.02, 1.01, second)}}, prices, "")
    assert comms and {str(c) for c in comms} == {str(heldout.default_model_path("cuda", 4, "h200"))} != {str(heldout.default_model_path("cuda", 4, "h100"))}


def test_probes_of_the_cost_net_plan_on_request(tmp_path):
    """The two probes of the shipped cost net (its ReLU heads halved, left out) are not in a plain
    `plan`; named with --again they plan beside the others, with a net whose heads are scaled."""
    run("plan", "--quick", "--out", str(tmp_path))
    assert "(linear part)" not in text_of(tmp_path / "plans.jsonl.gz")
    run("plan", "--quick", "--out", str(tmp_path), "--again", "dreamshard (heads x0.5),dreamshard (linear part)")
    text = text_of(tmp_path / "plans.jsonl.gz")
    assert '"planner dreamshard (linear part)"' in text and '"planner dreamshard (heads x0.5)"' in text
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from dev_tasks import heads_scaled

    from dreamshard import shipped

    full, half, none = (heads_scaled(shipped.model_path("dreamshard"), k).cost_net for k in (1.0, 0.5, 0.0))
    assert all(float(h[2].weight.abs().sum()) == 0 for h in none.heads)
    assert all(torch.allclose(2 * h[2].weight, f[2].weight) for h, f in zip(half.heads, full.heads))


def test_the_probe_on_the_simulators_weights_prices_as_the_simulator():
    """`dev_tasks.sim_weighted`: the shipped net's linear part refit to a simulator, its ReLU heads
    left out, prices plans of the training families about as that simulator does (its search then
    runs on the simulator's prices), where the shipped net's own weights are further off."""
    import numpy as np

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from dev_tasks import heads_scaled, net_ms, sim_weighted

    from dreamshard import shipped
    from dreamshard.costs.sim import SimBackend
    from dreamshard.families import synth_family
    from dreamshard.planners import get_planner
    from dreamshard.tasks import Workload, sample_tasks

    path = shipped.model_path("dreamshard", "h100")
    sim = SimBackend("h100_triton.json")
    probe = get_planner("dreamshard", model=sim_weighted(path, "h100_triton.json", plans=200))
    linear = get_planner("dreamshard", model=heads_scaled(path, 0.0))
    task = sample_tasks(synth_family("dlrm", 300, 5), 1, (40, 40), 4, 16 * 10**9, seed=1, workload=Workload(65_536))[0]
    plans = [get_planner(h).plan(task) for h in ("lookup", "size_lookup", "random", "dim")]
    off = {name: [net_ms(planner, plan) / sim.evaluate_plan(plan).overall_ms - 1 for plan in plans] for name, planner in (("probe", probe), ("linear", linear))}
    assert max(abs(e) for e in off["probe"]) < 0.04, off
    assert np.mean(np.abs(off["probe"])) < np.mean(np.abs(off["linear"])), off


def test_measured_on_several_gpus_at_once(tmp_path):
    """`measure --gpus N`: a child per GPU measures every N-th task whole, and their lines are
    merged into OUT/measured.csv, each plan once, as one call on one GPU would write them."""
    run("plan", "--quick", "--out", str(tmp_path))
    run("measure", "--out", str(tmp_path / "two"), "--plans", str(tmp_path / "plans.jsonl.gz"), "--cpu", "--quick", "--gpus", "2")
    merged = (tmp_path / "two" / "measured.csv").read_text().splitlines()
    assert len(merged) - 1 == len(text_of(tmp_path / "plans.jsonl.gz").splitlines())
    parts = [(tmp_path / "two" / f"gpu{i}" / "measured.csv").read_text().splitlines() for i in range(2)]
    assert parts[0][0] == parts[1][0] == merged[0] and sorted(parts[0][1:] + parts[1][1:]) == sorted(merged[1:])
    # the one task of --quick lies whole on the first GPU; the second had none
    assert len(parts[1]) == 1
    assert '"measured_this_call": ' + str(len(merged) - 1) in (tmp_path / "two" / "summary.json").read_text().replace("\n", "")


def test_verify_price_replays_the_choice_among_the_variants(tmp_path):
    """benchmarks/verify_price.py: each task's four `--verify` variants, the pick of each price looked
    up among the measured plans; the fastest measured is never behind any other pick. `--schedules`:
    the fastest of each schedule's first K, never slower with more; the penalty schedule's labels
    are `--verify`'s variants in order."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from heldout import PLANNERS
    from verify_price import PENALTY_LABELS, variant_key

    from dreamshard.planners.dreamshard import verify_variant

    assert [variant_key(PLANNERS[lb][1]) for lb in PENALTY_LABELS] == [variant_key(verify_variant(k)) for k in range(4)]
    variants = "dreamshard,dreamshard (annealing also from the lookup plans),dreamshard (seed 1),dreamshard (annealing also from the lookup plans seed 1)"
    run("plan", "--quick", "--dev", "--out", str(tmp_path), "--again", f"{variants},dreamshard (cut penalty 0.75%),lookup,size_lookup")
    run("measure", "--out", str(tmp_path), "--plans", str(tmp_path / "plans.jsonl.gz"), "--cpu", "--quick")
    out = subprocess.run([sys.executable, "benchmarks/verify_price.py", "--plans", str(tmp_path / "plans.jsonl.gz"), "--measured", str(tmp_path / "measured.csv")],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.startswith("1 tasks with every variant and heuristic measured (0 left out")
    rows = {line.split(" | ")[0][2:]: float(line.split(" | ")[2].rstrip("% |")) for line in out.splitlines() if line.startswith("| the ")}
    assert set(rows) == {"the default (variant 0)", "the fastest measured (--verify on the GPU)", "the cost net's cheapest",
                         "the simulator's cheapest (h200_triton_search_shards.json)", "the simulator's cheapest (h200_triton_large_shards.json)"}
    assert rows["the fastest measured (--verify on the GPU)"] == min(rows.values())
    out = subprocess.run([sys.executable, "benchmarks/verify_price.py", "--plans", str(tmp_path / "plans.jsonl.gz"), "--measured", str(tmp_path / "measured.csv"),
                          "--schedules"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.startswith("1 tasks with every plan of both schedules and both heuristics measured (0 left out)")
    table = [line for line in out.splitlines() if line.startswith("| the ")]
    assert len(table) == 2
    for line in table:
        fastest = [float(c.rstrip("%")) for c in line.strip("| ").split(" | ")[1:5]]
        assert len(fastest) == 4 and all(b <= a for a, b in zip(fastest, fastest[1:]))
