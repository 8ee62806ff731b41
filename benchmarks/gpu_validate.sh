#!/usr/bin/env bash
# One call on one H200: validate the shipped simulator calibration on held-out shards (tables from
# a pool of another seed) and 30 whole placements, measured with the Triton TBE; plus the gpu tests.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 400 python3 -m dreamshard.cli calibrate --validate dreamshard/data/calibrations/h200_triton.json --device cuda \
  --shards 200 --placements 30 --records "$OUT/val_records.jsonl" --report "$OUT/validation.json" 2>&1 | tail -40
timeout 150 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider 2>&1 | tail -3
