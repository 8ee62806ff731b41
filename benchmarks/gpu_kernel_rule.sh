#!/usr/bin/env bash
# DreamShard's product-path features as the kernel chooses (nets.KernelFeatures.product_rule "kernel"),
# measured on one H200 (sequential runner, Triton TBE, B = 65,536, fp16, SGD; all-to-all from h200_nccl.json).
#   OUT=... bash benchmarks/gpu_kernel_rule.sh variant [FAMILIES]   # call 1 (~8 min): the shipped model's
#       weights with the kernel's rule (benchmarks/kernel_rule_prepare.py) against the shipped model, both
#       in the same call, on the tasks where their plans differ (benchmarks/results/gpu_kernel_rule/changed.csv);
#       default families mixed,hot,dlrm,dlrm2022,onehot
#   OUT=... bash benchmarks/gpu_kernel_rule.sh train      # the shipped recipe re-run with the kernel's rule
#       (as every model fitted since): OUT/model_gpu.pt; RESUME=DIR goes on from a cut run's files
# Measure a trained model's plans with benchmarks/gpu_cache_model.sh FAMILY MODEL [PLANNER ...].
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
R=benchmarks/results/gpu_kernel_rule
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/log.txt"
case "${1:?variant or train}" in
  variant)
    timeout 575 python3 benchmarks/gpu_heldout_planners.py --out "$OUT" --model $R/dreamshard_h200_kernel.pt \
      --only "dreamshard (shipped)" --only "dreamshard (dreamshard_h200_kernel.pt)" --families "${2:-mixed,hot,dlrm,dlrm2022,onehot}" \
      --tasks-from $R/changed.csv --total-s "${TOTAL_S:-520}" >> "$OUT/log.txt" 2>&1 ;;
  train)
    resume=()
    if [ -n "${RESUME:-}" ]; then cp "$RESUME/model_gpu.pt.ckpt" "$RESUME/train_gpu.jsonl" "$OUT/" && resume=(--resume); fi
    timeout 570 python3 benchmarks/gpu_shipped_model.py --out "$OUT" --prior-plans 8000 --kernel-features --comm model \
      --models gpu --test-tasks 0 "${resume[@]}" >> "$OUT/log.txt" 2>&1
    python3 -c "import torch; print('kernel features', {k: v for k, v in torch.load('$OUT/model_gpu.pt', weights_only=False)['kernel_features'].items() if k != 'scale'})" >> "$OUT/log.txt" 2>&1 ;;
  *) echo "variant or train, not $1" >&2; exit 2 ;;
esac
echo "rc=$?" >> "$OUT/log.txt"
tail -n 4 "$OUT/log.txt"
