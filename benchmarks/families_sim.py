"""How the simulator's per-shard terms behave on each table family, by shape bucket (CPU, seconds).

    python benchmarks/families_sim.py [--out DIR] [--calibration FILE] [--records FILE]

For each family (dreamshard/families.py; the held-out one marked) every table of its pool (seed 11,
the GPU campaign's validation pool) is priced alone by the simulator, and grouped by shape bucket
(dim, hits per touched row, pooling: families.table_buckets). Per bucket it reports:
  - tables, the median simulated compute (fwd + bwd) per table and per million lookups;
  - which terms carry the backward (share of the simulated bwd per term: a bucket priced by a term
    the calibration shards barely exercised is one to measure first);
  - coverage: the share of the bucket's tables whose dim, pooling factor and hits per touched row
    each lie inside the range (min..max) of the tables of the shards the calibration was fitted on.
    Outside it, the simulator extrapolates its linear model to shapes it never saw measured.
No measurement here: this says where the model is *untested*, the GPU campaign
(benchmarks/gpu_families.py) says where it is *wrong*. The same campaign runs on CPU with FBGEMM:
`python benchmarks/gpu_families.py --device cpu --kernel fbgemm --calibration dreamshard/data/calibrations/cpu_fbgemm.json --batch-size 2048 --out DIR`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from dreamshard.costs.calibrate import load_records  # noqa: E402
from dreamshard.costs.sim import TERMS, SimBackend  # noqa: E402
from dreamshard.families import FAMILIES, HELD_OUT_FAMILY, hits_per_row, synth_family, table_buckets  # noqa: E402
from dreamshard.files import atomic_write  # noqa: E402
from dreamshard.tasks import Workload  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DEFAULT_RECORDS = os.path.join(ROOT, "benchmarks", "results", "h200_calib_records.jsonl")


def analyse(calibration: str | None, records_path: str, pool_seed: int = 11) -> dict:
    sim = SimBackend(calibration)
    workload = Workload(sim.calibration.batch_size)
    records = load_records(records_path)
    seen = {t.name: t for r in records for t in r.tables if t.pooling_factor > 0}.values()
    shape = lambda ts: np.column_stack([[t.dim for t in ts], [t.pooling_factor for t in ts], hits_per_row(list(ts), workload.batch_size)])  # noqa: E731
    seen_shape = shape(list(seen))
    lo, hi = seen_shape.min(axis=0), seen_shape.max(axis=0)
    bwd_coef = np.array([sim.calibration.bwd.get(t, 0.0) for t in TERMS])
    out = {"calibration": sim.calibration.label, "calibration_records": os.path.relpath(records_path, ROOT), "batch_size": workload.batch_size,
           "calibrated_range": {"dim": [lo[0], hi[0]], "pooling": [lo[1], hi[1]], "hits_per_row": [lo[2], hi[2]]},
           "held_out_family": HELD_OUT_FAMILY, "families": {}}
    for name in FAMILIES:
        tables = synth_family(name, seed=pool_seed)
        comp = sim.shard_compute([[t] for t in tables], workload)
        P = sim.table_terms(tables, workload)
        share = P * bwd_coef  # simulated bwd per term (launch/active are per shard: left out)
        lookups = np.array([t.pooling_factor for t in tables]) * workload.batch_size
        mine = shape(tables)
        inside = np.all((mine >= lo) & (mine <= hi), axis=1) | (lookups == 0)
        groups: dict[tuple[str, str], list[int]] = defaultdict(list)
        for i, b in enumerate(table_buckets(tables, workload.batch_size)):
            for axis in ("dim", "hits", "pooling"):
                groups[(axis, b[axis])].append(i)
        rows = []
        for (axis, key), idx in sorted(groups.items(), key=lambda kv: (kv[0][0], _lower_edge(kv[0][1]))):
            idx = np.array(idx)
            live = idx[lookups[idx] > 0]
            bwd_share = share[idx].sum(axis=0) / max(share[idx].sum(), 1e-12)
            top = [f"{TERMS[j]} {bwd_share[j]:.0%}" for j in np.argsort(-bwd_share)[:3] if bwd_share[j] > 0.05]
            rows.append({"axis": axis, "bucket": key, "tables": int(len(idx)), "median_sim_ms": float(np.median(comp[idx].sum(1))),
                         "sim_ms_per_M_lookups": float(np.median(comp[live].sum(1) / lookups[live] * 1e6)) if len(live) else None,
                         "bwd_terms": top, "inside_calibrated_range": float(inside[idx].mean())})
        out["families"][name] = {"tables": len(tables), "held_out": name == HELD_OUT_FAMILY, "inside_calibrated_range": float(inside.mean()),
                                 "median_sim_ms": float(np.median(comp.sum(1))), "buckets": rows}
    return out


def _lower_edge(label: str) -> float:
    """'dim 32–128' → 32, 'dim >256' → 256.5: buckets in numeric order."""
    x = label.split(" ", 1)[1]
    return float(x[1:]) + 0.5 if x.startswith(">") else float(x.split("–")[0])


def markdown(result: dict) -> str:
    md = [f"Simulator ({result['calibration']}, B = {result['batch_size']:,}) on every family's tables alone; coverage = share of tables whose "
          f"dim, pooling and hits per touched row each lie inside the range of the tables of {result['calibration_records']} "
          f"(dim {result['calibrated_range']['dim'][0]:g}–{result['calibrated_range']['dim'][1]:g}). Buckets are (lo, hi]. Held-out family: `{result['held_out_family']}`.", "",
          "| family | tables | median sim ms | inside calibrated range |", "|---|---:|---:|---:|"]
    for name, f in result["families"].items():
        md.append(f"| {name}{' (held out)' if f['held_out'] else ''} | {f['tables']} | {f['median_sim_ms']:.3f} | {f['inside_calibrated_range']:.0%} |")
    for name, f in result["families"].items():
        md += ["", f"**{name}**{' (held out)' if f['held_out'] else ''}", "",
               "| bucket | tables | median sim ms | sim ms per 10^6 lookups | backward carried by | inside calibrated range |", "|---|---:|---:|---:|---|---:|"]
        for b in f["buckets"]:
            per = "" if b["sim_ms_per_M_lookups"] is None else f"{b['sim_ms_per_M_lookups']:.3f}"
            md.append(f"| {b['bucket']} | {b['tables']} | {b['median_sim_ms']:.3f} | {per} | {', '.join(b['bwd_terms'])} | {b['inside_calibrated_range']:.0%} |")
    return "\n".join(md)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="directory for families_sim.json and families_sim.md")
    ap.add_argument("--calibration", help="[default: the shipped H200 calibration]")
    ap.add_argument("--records", default=DEFAULT_RECORDS, help="the records that calibration was fitted on")
    args = ap.parse_args()
    result = analyse(args.calibration, args.records)
    text = markdown(result)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        atomic_write(os.path.join(args.out, "families_sim.json"), json.dumps(result, indent=1))
        atomic_write(os.path.join(args.out, "families_sim.md"), text + "\n")


if __name__ == "__main__":
    main()
