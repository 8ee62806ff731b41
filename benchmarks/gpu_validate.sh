#!/usr/bin/env bash
# One call on one H200: validate the shipped simulator calibration on held-out shards (tables from
# pools of other seeds: 1, the default, and 2) and 30 whole placements each, measured with the Triton TBE.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
for seed in 1 2; do
  timeout 280 python3 -m dreamshard.cli calibrate --validate dreamshard/data/calibrations/h200_triton.json --device cuda \
    --shards 200 --placements 30 --seed $seed --records "$OUT/val_records_seed$seed.jsonl" --report "$OUT/validation_seed$seed.json" 2>&1 | tail -30
done
