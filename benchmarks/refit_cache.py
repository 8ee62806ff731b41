"""The recipe of `h200_triton_cache.json`: the `h200_triton_product_path.json` calibration with its
forward re-fitted against the H200's L2 (CPU, seconds, from committed H200 records).

terms.cache_hits counts the repeated row gathers that miss a 60 MiB L2 (the H200's, as torch
reports it) as cold bytes. The forward's coefficients are re-fitted on the calibration records of
the six training families (pool seed 10; the held-out `mixed` never); the backward's are kept from
`h200_triton_product_path.json`, whose kernel's product-path choice those records were measured with.

    PYTHONPATH=. python benchmarks/refit_cache.py
    dreamshard calibrate --validate dreamshard/data/calibrations/h200_triton_cache.json \
        --from-records benchmarks/results/gpu_families_pp/val_records.jsonl
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from dreamshard.costs.calibrate import fit, load_records  # noqa: E402
from dreamshard.costs.sim import Calibration  # noqa: E402

RECORDS = "benchmarks/results/gpu_families_pp/calib_records.jsonl"
BEFORE = "dreamshard/data/calibrations/h200_triton_product_path.json"
OUT = "dreamshard/data/calibrations/h200_triton_cache.json"
H200_L2 = 60 * 2**20  # torch.cuda.get_device_properties(0).L2_cache_size on an H200

if __name__ == "__main__":
    before = Calibration.load(BEFORE)
    cal = fit(load_records(RECORDS), "triton", before.comm, H200_L2, backward_of=before)
    cal.save(OUT)
    print(f"{OUT}: forward MAPE {cal.fit['fwd_mape']:.2f}% (before: {before.fit['fwd_mape']:.2f}%), total {cal.fit['total_mape']:.2f}% "
          f"(before: {before.fit['total_mape']:.2f}%) on the {cal.fit['shards']} calibration shards")
    print("forward ms per unit:", {k: f"{v:.3g}" for k, v in cal.fwd.items()})
