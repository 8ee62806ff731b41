#!/usr/bin/env bash
# One call on one H200: measure the 200 calibration shards (pool seed 0) with the Triton TBE and fit
# the simulator; then the timing check on a dozen more shards. Refit offline from the records with
#   dreamshard calibrate --backend triton --device cuda --from-records calib_records.jsonl --comm-model ... --out ...
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 420 python3 -m dreamshard.cli calibrate --backend triton --device cuda --shards 200 \
  --comm-model dreamshard/data/comm/h200_nccl.json --records "$OUT/calib_records.jsonl" --out "$OUT/h200_triton.json" 2>&1 | tail -3
timeout 150 python3 benchmarks/timing_check.py --out "$OUT" --shards 12 2>&1 | tail -3
