#!/usr/bin/env bash
# One call on one H200 after a kernel change: the gpu tests, the mixed-shard benchmark and the
# single-table grid of docs/kernels.md (each against the v4 kernel), logs under $OUT. The runners'
# timing check (benchmarks/timing_check.py) is a separate call.
#   bash benchmarks/gpu_kernels_check.sh          # the campaign of docs/kernels.md
#   bash benchmarks/gpu_kernels_check.sh quick    # tests, then a short look: grid without torch/v4, tuning sweep on hot entries
#   bash benchmarks/gpu_kernels_check.sh grid     # no tests: the single-table grid alone (about 7 min)
#   bash benchmarks/gpu_kernels_check.sh sweep    # no tests: the backward's tuning variants (device time) on mixed shards and grid entries
#   bash benchmarks/gpu_kernels_check.sh paths    # the kernel tests, then the backward's paths (as shipped / sorted / product)
#                                                 # on the grid's tables of <= 8,192 rows and on mixed shards
#   bash benchmarks/gpu_kernels_check.sh state    # today's kernel as it stands (no torch timings, no v4 on the grid):
#                                                 # every gpu test, the grid with a cold, a warm and two hot entries
#                                                 # profiled per kernel, the mixed shards against v4, the backward's
#                                                 # variants (kernels_gpu.BWD_VARIANTS) on seven entries and three shards; all in $OUT/state.tgz
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
if [ "${1:-}" = state ]; then
  W=$(mktemp -d)  # the device tool returns at most 8 files: everything goes back as one archive
  timeout 270 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider 2>&1 | tail -15 | tee "$W/gpu_tests.log"
  timeout 190 python3 benchmarks/kernels_grid.py --out "$W" --quick --no-torch --profile 5,6,24,26 --sweep 2,5,6,13,24,26,43 > "$W/kernels_grid.log" 2>&1
  grep -E "^sweep" "$W/kernels_grid.log"; tail -8 "$W/kernels_grid.log"
  timeout 150 python3 benchmarks/kernels_gpu.py --out "$W" --baseline --quick --sweep --sweep-bwd "10t-mixed,50t-mixed,25t-dim>=32" > "$W/kernels_gpu.log" 2>&1
  grep -E "speedup|bwd" "$W/kernels_gpu.log" | tail -20
  tar czf "$OUT/state.tgz" -C "$W" .
  exit 0
fi
if [ "${1:-}" = paths ]; then
  timeout 200 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_kernels_gpu.py 2>&1 | tail -15 | tee "$OUT/gpu_tests.log"
  small=0,2,3,28,29,30,31,32,33,34,35,36,37,38,39,40,41,42
  timeout 250 python3 benchmarks/kernels_grid.py --out "$OUT" --quick --no-torch --sweep $small --only $small --profile 31,35 > "$OUT/kernels_grid.log" 2>&1
  grep -E "sweep|median|slower|rror" "$OUT/kernels_grid.log" | tail -30
  timeout 120 python3 benchmarks/kernels_gpu.py --out "$OUT" --quick --shards 10,50,d32-25 --sweep \
    --sweep-bwd "10t-mixed,50t-mixed,25t-dim>=32" > "$OUT/kernels_gpu.log" 2>&1
  grep -E "sweep|bwd|rror" "$OUT/kernels_gpu.log" | tail -20
  exit 0
fi
if [ "${1:-}" = sweep ]; then  # the backward's tuning variants (kernels_gpu.BWD_VARIANTS), device time
  timeout 200 python3 benchmarks/kernels_gpu.py --out "$OUT" --quick --shards 10,50,d32-25 --sweep \
    --sweep-bwd "10t-mixed,50t-mixed,25t-dim>=32" > "$OUT/kernels_gpu.log" 2>&1
  grep -E "sweep|bwd" "$OUT/kernels_gpu.log" | tail -40
  timeout 180 python3 benchmarks/kernels_grid.py --out "$OUT" --quick --no-torch --sweep 0,2,5,15,31 --only 0,2,3,5,6,9,15,28,31,44 > "$OUT/kernels_grid.log" 2>&1
  grep -E "sweep|device|median" "$OUT/kernels_grid.log" | tail -30
  exit 0
fi
if [ "${1:-}" = grid ]; then  # the single-table grid alone, with the torch path and v4
  timeout 560 python3 benchmarks/kernels_grid.py --out "$OUT" --baseline > "$OUT/kernels_grid.log" 2>&1
  tail -10 "$OUT/kernels_grid.log"
  exit 0
fi
timeout 200 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider 2>&1 | tail -15 | tee "$OUT/gpu_tests.log"
if [ "${1:-}" = quick ]; then
  timeout 100 python3 benchmarks/kernels_gpu.py --out "$OUT" --quick --shards 10,50,d32-25 --profile 50t-mixed > "$OUT/kernels_gpu.log" 2>&1
  grep -E "speedup|bwd" "$OUT/kernels_gpu.log" | tail -8
  timeout 230 python3 benchmarks/kernels_grid.py --out "$OUT" --quick --no-torch --sweep 0,2,3,5,31 --profile 2 > "$OUT/kernels_grid.log" 2>&1
  tail -8 "$OUT/kernels_grid.log"
  exit 0
fi
timeout 150 python3 benchmarks/kernels_gpu.py --out "$OUT" --baseline --quick --profile 50t-mixed --sweep \
  --sweep-bwd "10t-mixed,25t-mixed,50t-mixed,10t-dim>=32,25t-dim>=32,25t-dim>=32-uniform" > "$OUT/kernels_gpu.log" 2>&1
grep -E "before|speedup|sweep" "$OUT/kernels_gpu.log" | tail -30
timeout 240 python3 benchmarks/kernels_grid.py --out "$OUT" --baseline > "$OUT/kernels_grid.log" 2>&1
tail -6 "$OUT/kernels_grid.log"
