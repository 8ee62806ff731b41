#!/usr/bin/env bash
# One call on one H200 after a kernel or timing change: the gpu tests, the timing check (GPU work,
# not host time), and the kernel benchmark of docs/kernels.md.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider 2>&1 | tail -4
timeout 150 python3 benchmarks/timing_check.py --out "$OUT" --shards 8 2>&1 | tail -10
timeout 230 python3 benchmarks/kernels_gpu.py --out "$OUT" --profile 10t-mixed,50t-mixed 2>&1 | tail -14
