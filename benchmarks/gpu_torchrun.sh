#!/usr/bin/env bash
# `dreamshard measure` under torchrun with NCCL: two "nodes" of one GPU each on one 2-GPU host
# (CUDA_VISIBLE_DEVICES gives each node its own GPU), beside the one-command launch of the same
# plan and the sequential runner's compute of it (the referee: each device's shard alone on one
# GPU); the reports under OUT. Usage: PYTHONPATH=. bash benchmarks/gpu_torchrun.sh OUT
set -euo pipefail
out=${1:?OUT}
mkdir -p "$out"
python3 - "$out/plan.json" <<'PY'
import sys
from dreamshard.plan import Plan, save_plans
from dreamshard.tables import NUM_BINS, TableSpec
from dreamshard.tasks import Task, Workload
bins = tuple([1.0 / NUM_BINS] * NUM_BINS)
tables = [TableSpec(f"t{i}", 200_000 + 50_000 * i, 64, 8.0, bins, seed=i) for i in range(8)]
save_plans([Plan.table_wise(Task(tables, 2, 10**10, Workload(16_384)), [0, 1, 1, 0, 0, 1, 1, 0], "hand")], sys.argv[1])
PY
args=(measure "$out/plan.json" --backend triton --runner distributed --json)
# the first measurement on a fresh machine is thrown away: there the one-command launch, run first,
# read the backward at 1.9–3.2× what the referee, torchrun and itself read a minute later (2 × H200;
# 3× on 2 × H100), results/gpu_torchrun/README.md
python3 -m dreamshard.cli "${args[@]}" --out "$out/cold.json" > /dev/null
python3 -m dreamshard.cli "${args[@]}" --out "$out/one_command.json" > /dev/null
python3 -m dreamshard.cli measure "$out/plan.json" --backend triton --runner sequential --json --out "$out/sequential.json" > /dev/null
port=29511
for n in 0 1; do
  CUDA_VISIBLE_DEVICES=$n torchrun --nnodes 2 --nproc-per-node 1 --node-rank $n --master-addr 127.0.0.1 --master-port $port \
    -m dreamshard.cli "${args[@]}" --out "$out/torchrun.json" > "$out/node$n.log" 2>&1 &
done
wait
python3 - "$out" <<'PY'
import json, sys
for name in ("cold", "sequential", "one_command", "torchrun"):
    r = json.load(open(f"{sys.argv[1]}/{name}.json"))
    print(f"{name:12s} step {r['overall_ms']:.4f} ms; per device fwd comp, bwd comp:",
          [(round(d["fwd_comp_ms"], 4), round(d["bwd_comp_ms"], 4)) for d in r["devices"]])
PY
