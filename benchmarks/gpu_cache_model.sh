#!/usr/bin/env bash
# A model re-trained after the simulator's forward learned the L2 (2026-11-25: terms.cache_hits,
# calibration h200_triton_cache.json, benchmarks/refit_cache.py), measured on one H200.
#   OUT=... bash benchmarks/gpu_cache_model.sh train     # call 1: the shipped recipe (docs/costs.md) re-run:
#       its simulator prior priced by the new default calibration, its kernel features counting the
#       device's L2 (CostBackend.cache_bytes); then its plans on the `heavy` tasks of
#       gpu_families_shipped/heavy and, with the shipped model's, on the 48 held-out `mixed` tasks
#   OUT=... bash benchmarks/gpu_cache_model.sh FAMILY MODEL.pt [PLANNER ...]   # later calls: MODEL's plans (and
#       those planners', e.g. size dim lookup size_lookup "dreamshard (shipped)") on FAMILY's tasks of
#       gpu_families_shipped (mixed: gpu_heldout_planners_pp's)
# Results: benchmarks/results/gpu_cache_model/; one planner per plans.csv, so summaries are --merge's (CPU).
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
R=benchmarks/results
tasks_of() {  # the plans.csv whose tasks a family is measured on (the heuristics' rows there are comparable)
  case "$1" in
    mixed) echo $R/gpu_heldout_planners_pp/plans.csv ;;
    hot) echo $R/gpu_product_rounds/hot/plans.csv ;;
    *) echo $R/gpu_families_shipped/$1/plans.csv ;;
  esac
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/log.txt"
python3 -c "import torch; print('L2 bytes', torch.cuda.get_device_properties(0).L2_cache_size)" >> "$OUT/log.txt" 2>&1
if [ "${1:-}" = train ]; then
  # RESUME=DIR (a cut run's model_gpu.pt.ckpt and train_gpu.jsonl): go on where the call's limit cut it
  resume=()
  if [ -n "${RESUME:-}" ]; then mkdir -p "$OUT/train" && cp "$RESUME/model_gpu.pt.ckpt" "$RESUME/train_gpu.jsonl" "$OUT/train/" && resume=(--resume); fi
  timeout 300 python3 benchmarks/gpu_shipped_model.py --out "$OUT/train" --prior-plans 8000 --kernel-features --comm model \
    --models gpu --test-tasks 0 "${resume[@]}" >> "$OUT/log.txt" 2>&1
  mv "$OUT/train/model_gpu.pt" "$OUT/train/train_gpu.jsonl" "$OUT/" && rm -r "$OUT/train"
  python3 -c "import torch; print('kernel features', torch.load('$OUT/model_gpu.pt', weights_only=False).get('kernel_features', {}).get('cache_bytes'))" >> "$OUT/log.txt" 2>&1
  M="dreamshard (model_gpu.pt)"
  python3 benchmarks/gpu_heldout_planners.py --out "$OUT/heavy" --model "$OUT/model_gpu.pt" --only "$M" --families heavy --total-s 100 \
    --tasks-from "$(tasks_of heavy)" > "$OUT/heavy.log" 2>&1
  timeout 170 python3 benchmarks/gpu_heldout_planners.py --out "$OUT/mixed" --model "$OUT/model_gpu.pt" --only "$M" --only "dreamshard (shipped)" \
    --total-s 150 --tasks-from "$(tasks_of mixed)" > "$OUT/mixed.log" 2>&1
  rm -f "$OUT"/*/summary.json  # partial rows: the summaries are --merge's with the heuristics' rows
  tail -n 2 "$OUT/log.txt" "$OUT/heavy.log" "$OUT/mixed.log"
  exit 0
fi
family=${1:?train, or FAMILY MODEL.pt [PLANNER ...]}
model=${2:?the model file}
shift 2
only=(--only "dreamshard ($(basename "$model"))")
for p in "$@"; do only+=(--only "$p"); done
timeout $(( ${TOTAL_S:-520} + 55 )) python3 benchmarks/gpu_heldout_planners.py --out "$OUT/$family" --model "$model" "${only[@]}" --families "$family" \
  --total-s "${TOTAL_S:-520}" --tasks-from "$(tasks_of "$family")" > "$OUT/$family.log" 2>&1
echo "rc=$?" >> "$OUT/$family.log"
rm -f "$OUT/$family/summary.json"
tail -n 3 "$OUT/$family.log"
