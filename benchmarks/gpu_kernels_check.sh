#!/usr/bin/env bash
# One call on one H200 after a kernel change: the gpu tests, the mixed-shard benchmark and the
# single-table grid of docs/kernels.md (each against the kernel before the range-based backward),
# logs under $OUT. The runners' timing check (benchmarks/timing_check.py) is a separate call.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider 2>&1 | tail -3 | tee "$OUT/gpu_tests.log"
timeout 180 python3 benchmarks/kernels_gpu.py --out "$OUT" --baseline --quick --profile 50t-mixed > "$OUT/kernels_gpu.log" 2>&1
grep -E "before|speedup" "$OUT/kernels_gpu.log" | tail -12
timeout 240 python3 benchmarks/kernels_grid.py --out "$OUT" --baseline > "$OUT/kernels_grid.log" 2>&1
tail -6 "$OUT/kernels_grid.log"
