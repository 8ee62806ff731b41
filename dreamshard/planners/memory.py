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

    # Exhaustive search with an explicit stack (a recursion per table overflows Python's stack at
    # ~1,000 tables) and suffix sums (the remaining-size bound in O(1) per node, not O(n)).
    n = len(order)
    suffix = [0] * (n + 1)
    for k in range(n - 1, -1, -1):
        suffix[k] = suffix[k + 1] + sizes[order[k]]
    free = [cap] * D
    total_free = D * cap
    placement = [-1] * n
    nodes = 0
    stack: list[list] = []  # per placed table: [devices to try, next one, device it is on or -1]
    while len(stack) < n:
        k = len(stack)
        nodes += 1
        if nodes > node_budget:
            return None
        cands = []
        if suffix[k] <= total_free:
            i, tried = order[k], set()
            for d in range(D):
                # devices with the same free memory are interchangeable: try one of them
                if free[d] >= sizes[i] and free[d] not in tried:
                    tried.add(free[d])
                    cands.append(d)
        stack.append([cands, 0, -1])
        while stack:  # the next untried device of the deepest table, backtracking as needed
            frame = stack[-1]
            i = order[len(stack) - 1]
            if frame[2] >= 0:
                free[frame[2]] += sizes[i]
                total_free += sizes[i]
                frame[2] = -1
            if frame[1] < len(frame[0]):
                d = frame[0][frame[1]]
                frame[1] += 1
                free[d] -= sizes[i]
                total_free -= sizes[i]
                placement[i] = d
                frame[2] = d
                break
            stack.pop()
        else:
            return None
    return placement


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
