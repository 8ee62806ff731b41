"""Several GPU commands at once on one machine, each on its own GPU: one call of a multi-GPU machine
runs what would take one call per command on a single GPU (training runs of different seeds or
recipes, say).

    PYTHONPATH=. python3 benchmarks/on_gpus.py --out OUT "CMD 1" "CMD 2" ...   # command i on GPU i

Each command runs in a shell with `CUDA_VISIBLE_DEVICES=i` and the machine's cores split evenly
(`OMP_NUM_THREADS`), its output in OUT/gpu<i>.log. The call waits for all of them and ends with
the first failing status, after printing each command's status and wall time; `--tar NAME` packs
OUT (the logs and whatever the commands wrote there, but `--skip`'s files) into OUT/NAME, one file to
bring back.
Timings of different commands are of different GPUs: compare within one command.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder for the logs (the commands may write there too)")
    ap.add_argument("--tar", metavar="NAME", help="pack OUT into OUT/NAME (.tgz) at the end")
    ap.add_argument("--skip", default="*.ckpt", metavar="GLOB", help="files left out of the tar  [*.ckpt: training checkpoints, too large to bring back]")
    ap.add_argument("--gpus", type=int, help="the machine's GPUs  [torch's count]")
    ap.add_argument("commands", nargs="+", help="one shell command per GPU, in GPU order")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpus = args.gpus or gpu_count()
    if len(args.commands) > gpus:
        raise SystemExit(f"{len(args.commands)} commands for {gpus} GPUs: one command per GPU")
    threads = max(1, (os.cpu_count() or 1) // len(args.commands))
    t0 = time.monotonic()
    running = []
    for i, cmd in enumerate(args.commands):
        env = os.environ | {"CUDA_VISIBLE_DEVICES": str(i), "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
        log = open(out / f"gpu{i}.log", "w")
        running.append((cmd, subprocess.Popen(cmd, shell=True, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    status = 0
    for i, (cmd, proc, log) in enumerate(running):
        rc = proc.wait()
        log.close()
        print(f"gpu {i}: rc {rc} after {time.monotonic() - t0:.0f} s: {cmd}", flush=True)
        status = status or rc
    if args.tar:
        with tarfile.open(out / args.tar, "w:gz") as tar:
            for p in sorted(out.rglob("*")):
                if p.is_file() and p.name != args.tar and not p.match(args.skip):
                    tar.add(p, arcname=str(p.relative_to(out)))
    sys.exit(status)


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


if __name__ == "__main__":
    main()
