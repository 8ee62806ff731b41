#!/usr/bin/env bash
# One call on one H200 after a change of the backward's path choice only (no kernel code changed,
# so no tests): the single-table grid without the torch path and v4 (the targets), the paths (as
# shipped / sorted / product) on the grid's tables of <= 8,192 rows, and the mixed shards with v4
# and the paths. Logs and results under $OUT.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
small=0,2,3,28,29,30,31,32,33,34,35,36,37,38,39,40,41,42
timeout 300 python3 benchmarks/kernels_grid.py --out "$OUT" --quick --no-torch --sweep $small > "$OUT/kernels_grid.log" 2>&1
grep -E "sweep \[|device time" "$OUT/kernels_grid.log" | tail -30
timeout 150 python3 benchmarks/kernels_gpu.py --out "$OUT" --baseline --quick --sweep \
  --sweep-bwd "10t-mixed,25t-mixed,50t-mixed,10t-dim>=32,25t-dim>=32,25t-dim>=32-uniform" > "$OUT/kernels_gpu.log" 2>&1
grep -E "before|sweep" "$OUT/kernels_gpu.log" | tail -30
