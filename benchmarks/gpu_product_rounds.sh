#!/usr/bin/env bash
# One call on one H200 after the backward's product path went to rounds (docs/kernels.md "Hot
# tables as a matrix product"): the kernel's gpu tests, then the `hot` family's plans measured
# again (every heuristic's and the shipped model's, on the tasks of
# benchmarks/results/gpu_families_planners_pp2), to set beside their measurements before the change.
#   OUT=... bash benchmarks/gpu_product_rounds.sh          # call 1 (benchmarks/results/gpu_product_rounds/)
#   OUT=... bash benchmarks/gpu_product_rounds.sh model    # call 2: a model re-trained on this kernel (the shipped
#       recipe, docs/costs.md), measured on call 1's `hot` tasks and the 48 held-out `mixed` tasks
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
R=benchmarks/results
if [ "${1:-}" = model ]; then
  # at most 8 files come back from a call: the model, its training log and the plans, nothing else
  timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_gpu.py -k "rounds or deterministic or never_waits" 2>&1 | tail -3 > "$OUT/train.log"
  timeout 300 python3 benchmarks/gpu_shipped_model.py --out "$OUT/train" --prior-plans 8000 --kernel-features --comm model \
    --models gpu --test-tasks 0 --total-s 280 >> "$OUT/train.log" 2>&1
  mv "$OUT/train/model_gpu.pt" "$OUT/train/train_gpu.jsonl" "$OUT/" && rm -r "$OUT/train"
  tail -2 "$OUT/train.log"
  M="dreamshard (model_gpu.pt)"
  python3 benchmarks/gpu_heldout_planners.py --out "$OUT/mixed" --model "$OUT/model_gpu.pt" --only "$M" --total-s 130 \
    --tasks-from $R/gpu_heldout_planners_pp/plans.csv > "$OUT/mixed.log" 2>&1
  python3 benchmarks/gpu_heldout_planners.py --out "$OUT/hot" --model "$OUT/model_gpu.pt" --only "$M" --families hot --total-s 80 \
    --tasks-from $R/gpu_product_rounds/hot/plans.csv > "$OUT/hot.log" 2>&1
  rm -f "$OUT/mixed/summary.json" "$OUT/hot/summary.json"  # one planner alone: --merge with the heuristics' rows summarises
  tail -n 1 "$OUT/mixed.log" "$OUT/hot.log"
  exit 0
fi
timeout 150 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_kernels_gpu.py 2>&1 | tail -15 | tee "$OUT/gpu_tests.log"
python3 benchmarks/gpu_heldout_planners.py --out "$OUT/hot" --families hot --total-s 370 \
  --tasks-from benchmarks/results/gpu_families_planners_pp2/plans.csv \
  --only size --only dim --only lookup --only size_lookup --only "dreamshard (shipped)" > "$OUT/hot.log" 2>&1
tail -5 "$OUT/hot.log"
