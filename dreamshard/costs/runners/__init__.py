"""Runners: real cost measurement of a placement (docs/costs.md, docs/comm.md).

- ``distributed``: one process per device, real all-to-alls (gloo on CPU, NCCL on CUDA);
- ``sequential``: one device measures every shard's compute in turn; comm from a ``CommModel``.

    from dreamshard.costs.runners import measure_distributed, measure_sequential
    report = measure_distributed(plan, "fbgemm", batch_size=1024)            # -> CostReport
    report = measure_sequential(plan, "torch", batch_size=1024, comm_model=None)
"""

from dreamshard.costs.runners.distributed import DistributedRunner, measure_distributed
from dreamshard.costs.runners.sequential import SequentialRunner, measure_sequential

RUNNERS = ("distributed", "sequential")


def default_device(kernel: str) -> str:
    """The device a kernel measures on by default: triton → cuda; fbgemm and torch → cuda where
    one is visible (and, for fbgemm, the CUDA build is installed), else cpu."""
    import torch

    if kernel == "triton":
        return "cuda"
    if not torch.cuda.is_available():
        return "cpu"
    if kernel == "fbgemm":
        from dreamshard.costs.kernels import unavailable_reason

        return "cuda" if unavailable_reason("fbgemm", "cuda") is None else "cpu"
    return "cuda"


__all__ = ["RUNNERS", "DistributedRunner", "SequentialRunner", "default_device", "measure_distributed", "measure_sequential"]
