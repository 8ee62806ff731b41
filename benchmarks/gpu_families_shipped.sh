#!/usr/bin/env bash
# One call on one H200 per training family (issue 10's planner target): the shipped model and the four
# heuristics, measured in the same call on 16 unseen tasks per setting of the family's pool of seed
# 11 (gpu_heldout_planners.py; every planner of a task on the same machine in the same run).
#   OUT=... bash benchmarks/gpu_families_shipped.sh wide      # then heavy, dlrm, dlrm2022, onehot
# Results: benchmarks/results/gpu_families_shipped/FAMILY/; one summary over all of them (CPU):
#   python benchmarks/gpu_heldout_planners.py --out benchmarks/results/gpu_families_shipped/merged \
#     --merge benchmarks/results/gpu_families_shipped/*/plans.csv
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
family=${1:?which family: wide, heavy, dlrm, dlrm2022 or onehot}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/log.txt"
# the time box leaves ~60 s of the call's 600 for start-up; a cut run keeps its whole tasks
timeout 580 python3 benchmarks/gpu_heldout_planners.py --out "$OUT" --families "$family" --tasks 16 --total-s 510 \
  --only "dreamshard (shipped)" --only size --only dim --only lookup --only size_lookup >> "$OUT/log.txt" 2>&1
echo "rc=$?" >> "$OUT/log.txt"
grep -E 'task|time box|rc=' "$OUT/log.txt" | tail -4
