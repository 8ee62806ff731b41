"""Simulator speed: one placement of 1,000 tables on 64 devices, on one CPU core (target ≤ 1 ms).

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python benchmarks/sim_speed.py
Prints the median time of: a single placement from scratch (terms included), a single placement
reusing the tables' terms (what a search does), and the per-placement time of a batch of 256.
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import platform  # noqa: E402
import time  # noqa: E402
from statistics import median  # noqa: E402

import numpy as np  # noqa: E402

from dreamshard.costs.sim import SimBackend  # noqa: E402
from dreamshard.synth import PoolConfig, synth_pool  # noqa: E402
from dreamshard.tasks import Workload  # noqa: E402


def bench(fn, repeat=200):
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return median(times) * 1e3


def main() -> None:
    tables = synth_pool(PoolConfig(tables=1000, seed=0))
    sim = SimBackend()
    rng = np.random.default_rng(0)
    one = rng.integers(0, 64, size=(1, 1000))
    many = rng.integers(0, 64, size=(256, 1000))
    terms = sim.table_terms(tables, Workload(65536))
    cold = bench(lambda: sim.costs_batch(tables, one, 64, Workload(65536)))
    warm = bench(lambda: sim.costs_batch(tables, one, 64, Workload(65536), terms=terms))
    batch = bench(lambda: sim.costs_batch(tables, many, 64, Workload(65536), terms=terms), repeat=20) / 256
    print(f"CPU: {platform.processor() or platform.machine()}, 1 thread; simulator: {sim.name}")
    print(f"1000 tables on 64 devices, one placement, from scratch: {cold:.3f} ms (target <= 1 ms)")
    print(f"1000 tables on 64 devices, one placement, terms reused: {warm:.3f} ms")
    print(f"1000 tables on 64 devices, batch of 256, per placement: {batch:.3f} ms")


if __name__ == "__main__":
    main()
