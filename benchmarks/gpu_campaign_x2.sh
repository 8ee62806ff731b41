#!/usr/bin/env bash
# One call on a 2×H200 machine (run from the repo root; $OUT comes back):
#   1. NCCL all-to-all calibration + distributed runner end to end (benchmarks/gpu_comm.py)
#   2. simulator calibration: 200 designed shards measured with the Triton TBE on GPU 0
# The fit is redone offline from $OUT/calib_records.jsonl if needed (calibrate --from-records).
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,memory.total --format=csv
timeout 230 python3 benchmarks/gpu_comm.py --out "$OUT" --budget-s 200 2>&1 | tee "$OUT/gpu_comm.log" | tail -40
comm=$(ls "$OUT"/comm_*_nccl.json 2>/dev/null | head -1)
timeout 300 python3 -m dreamshard.cli calibrate --backend triton --device cuda --shards 200 --out "$OUT/h200_triton.json" \
  ${comm:+--comm-model "$comm"} --records "$OUT/calib_records.jsonl" 2>&1 | tail -8
ls -la "$OUT"
