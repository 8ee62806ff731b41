"""Why `dreamshard --config paper` (the reference code's settings) trails the best heuristic: both
configurations trained on the same tasks with the same budget, their table-wise plans and their
training's end state side by side.

    .venv/bin/python benchmarks/paper_config.py                      # CPU, ~3 min: DLRM-80 (8) of `bench paper`
    .venv/bin/python benchmarks/paper_config.py --setting "DLRM-40 (4)"

Trains each configuration on the setting's 50 train tasks of `dreamshard bench paper` (seed 0)
against the simulator with 100 measured plans, plans its 10 test tasks table-wise, and prints the
mean simulated step beside `lookup` and `size_lookup`, with the last iteration's policy entropy
(ln D is a uniform policy) and the cost net's error on the plans it had not yet seen.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dreamshard import bench  # noqa: E402
from dreamshard.costs.sim import SimBackend  # noqa: E402
from dreamshard.planners import PLANNERS, get_planner  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--setting", default="DLRM-80 (8)")
    ap.add_argument("--budget", type=int, default=100)
    args = ap.parse_args()
    setting = next(s for s in bench.settings(("paper",), 50, 3, 10) if s.name == args.setting)
    train, test, _ = bench.tasks_of(setting, 0, {})
    sim = SimBackend()
    mean = lambda planner: float(np.mean([sim.evaluate_plan(planner.plan(t)).overall_ms for t in test]))  # noqa: E731
    print(f"{setting.name}: {len(train)} train, {len(test)} test tasks; {sim.name}")
    print(f"lookup {mean(get_planner('lookup')):.3f} ms, size_lookup {mean(get_planner('size_lookup')):.3f} ms")
    cls = PLANNERS["dreamshard"]
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("paper", "default"):
            model, log = Path(tmp, f"{name}.pt"), Path(tmp, f"{name}.jsonl")
            cls.fit(train, sim, model, cls.config(name, budget=args.budget, seed=0), progress=False, log=log)
            last = json.loads(log.read_text().splitlines()[-1])
            print(f"--config {name}: table-wise {mean(get_planner('dreamshard', model=model, split=False)):.3f} ms; "
                  f"policy entropy {last['rl/entropy']:.2f} (uniform: {math.log(setting.devices):.2f}); "
                  f"cost net on fresh plans: device {last['cost/mape_device']:.1%}, plan {last['cost/mape_overall']:.1%}", flush=True)


if __name__ == "__main__":
    main()
