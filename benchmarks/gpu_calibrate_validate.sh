#!/usr/bin/env bash
# One call on one H200: measure 200 calibration shards (pool seed 0) and the held-out validation set
# (pool seed 1: 200 shards + 30 placements) on the same machine. Fitting and reporting are offline:
#   dreamshard calibrate --backend triton --device cuda --from-records ... --out ...
#   dreamshard calibrate --validate CAL --from-records VAL_RECORDS --report ...
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 250 python3 -m dreamshard.cli calibrate --backend triton --device cuda --shards 200 \
  --comm-model dreamshard/data/comm/h200_nccl.json --records "$OUT/calib_records.jsonl" --out "$OUT/h200_triton.json" 2>&1 | tail -3
timeout 300 python3 -m dreamshard.cli calibrate --validate "$OUT/h200_triton.json" --device cuda --shards 200 --placements 30 \
  --records "$OUT/val_records.jsonl" --report "$OUT/validation.json" 2>&1 | tail -12
