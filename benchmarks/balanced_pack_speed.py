"""Time of the fallback packing (`packing.balanced_pack`) against the plain packing (`pack`) on the
2,000 random tasks of tests/test_properties_large.py (up to 2,500 tables on up to 1,024 devices).

    python benchmarks/balanced_pack_speed.py
"""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from test_properties_large import TASKS, random_tasks  # noqa: E402

from dreamshard.packing import balanced_pack, over_bounds, pack  # noqa: E402
from dreamshard.planners.heuristics import lookup_load  # noqa: E402

total_pack = total_balanced = 0.0
worst = (0.0, 0, 0)
for task in random_tasks(TASKS, 0):
    sizes = task.sizes()
    if over_bounds(sizes, task.max_memory_bytes, task.devices):
        continue
    a = time.perf_counter()
    pack(sizes, task.max_memory_bytes, task.devices)
    b = time.perf_counter()
    balanced_pack(sizes, task.max_memory_bytes, task.devices, [lookup_load(t) for t in task.tables])
    c = time.perf_counter()
    total_pack, total_balanced = total_pack + b - a, total_balanced + c - b
    worst = max(worst, (c - b, len(sizes), task.devices))
print(f"pack: {total_pack:.1f} s in all; balanced_pack: {total_balanced:.1f} s in all, "
      f"slowest {worst[0]:.2f} s ({worst[1]} tables on {worst[2]} devices)")
