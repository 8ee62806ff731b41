"""Memory: whether a task can be placed at all, and a placement that fits when heuristics stall.

Placing tables within per-device memory is bin packing (NP-hard), so: quick bounds first, then
first-fit decreasing, then an exhaustive search with symmetry breaking for what FFD misses
(exact up to its node budget, which covers every task of a few dozen tables).
"""

from __future__ import annotations

from dreamshard.tasks import Task, format_bytes


class InfeasibleError(ValueError):
    """No placement within memory exists (or none was found within the search budget)."""


def _sizes(task: Task) -> list[int]:
    return [t.bytes(task.precision, task.optimizer) for t in task.tables]


def pack(task: Task, node_budget: int = 200_000) -> list[int] | None:
    """A placement within memory, or None when none exists / none was found in the budget."""
    sizes, cap, D = _sizes(task), task.max_memory_bytes, task.devices
    if not sizes:
        return []
    if max(sizes) > cap or sum(sizes) > D * cap:
        return None
    order = sorted(range(len(sizes)), key=lambda i: -sizes[i])
    free = [cap] * D
    placement = [-1] * len(sizes)
    for i in order:  # first-fit decreasing
        d = next((d for d in range(D) if free[d] >= sizes[i]), None)
        if d is None:
            break
        free[d] -= sizes[i]
        placement[i] = d
    else:
        return placement

    free = [cap] * D
    placement = [-1] * len(sizes)
    nodes = 0

    def dfs(k: int) -> bool:
        nonlocal nodes
        if k == len(order):
            return True
        nodes += 1
        if nodes > node_budget:
            return False
        i = order[k]
        if sum(sizes[j] for j in order[k:]) > sum(free):
            return False
        tried = set()
        for d in range(D):
            # devices with the same free memory are interchangeable: try one of them
            if free[d] >= sizes[i] and free[d] not in tried:
                tried.add(free[d])
                free[d] -= sizes[i]
                placement[i] = d
                if dfs(k + 1):
                    return True
                free[d] += sizes[i]
        return False

    return placement if dfs(0) else None


def feasible(task: Task) -> bool:
    return pack(task) is not None


def infeasible_error(task: Task) -> InfeasibleError:
    sizes = _sizes(task)
    total, have = sum(sizes), task.devices * task.max_memory_bytes
    msg = f"cannot place {len(sizes)} tables needing {format_bytes(total)} ({total} bytes) on {task.devices} devices with {format_bytes(have)} ({have} bytes) in all"
    big = max(range(len(sizes)), key=lambda i: sizes[i])
    if sizes[big] > task.max_memory_bytes:
        msg += f"; table {task.tables[big].name} alone needs {sizes[big]} bytes > {task.max_memory_bytes} per device"
    elif total <= have:
        msg += f"; no packing into {task.max_memory_bytes} bytes per device was found"
    return InfeasibleError(msg)
