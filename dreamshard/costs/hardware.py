"""What a measurement ran on: a one-line hardware description and the software versions.

Every cost report and comm model carries both, so a number is never separated from the machine
and the stack that produced it.
"""

from __future__ import annotations

import os
import platform
from functools import lru_cache


def cpu_model() -> str:
    """The CPU's marketing name (Linux: /proc/cpuinfo), else whatever `platform` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_cores() -> int:
    """Cores this process may run on (the affinity mask, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def describe_hardware(device_type: str = "cpu", devices: int | None = None) -> str:
    """One line: "NVIDIA H200" / "2 × NVIDIA H200" on CUDA, "CPU: <model>, N cores" on CPU."""
    if device_type == "cuda":
        import torch

        if not torch.cuda.is_available():
            return "CUDA (no device visible)"
        name = torch.cuda.get_device_name(0)
        n = devices if devices is not None else 1
        return name if n == 1 else f"{n} × {name}"
    return f"CPU: {cpu_model()}, {cpu_cores()} cores"


def gpu_slug(name: str | None = None) -> str | None:
    """A GPU's model in lower case, as files name it (``NVIDIA H100 80GB HBM3`` → ``h100``): of
    `name`, or of the visible CUDA GPU (None without CUDA)."""
    import re

    if name is None:
        import torch

        if not torch.cuda.is_available():
            return None
        name = torch.cuda.get_device_name(0)
    m = re.search(r"\b([A-Z]\d{2,4})\b", name)
    return (m.group(1) if m else re.sub(r"\W+", "_", name)).lower()


def cache_bytes(device) -> float:
    """The L2 size of a CUDA device (H200: 60 MiB), 0 for any other: the cache the simulator prices
    repeated row gathers against (costs/terms.py `cache_hits`)."""
    import torch

    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return 0.0
    return float(torch.cuda.get_device_properties(device).L2_cache_size)


@lru_cache(maxsize=1)
def software_versions() -> dict[str, str]:
    """torch, CUDA, triton and fbgemm_gpu (where importable) and python."""
    import torch

    versions = {"python": platform.python_version(), "torch": torch.__version__}
    if torch.version.cuda:
        versions["cuda"] = str(torch.version.cuda)
    try:
        import triton

        versions["triton"] = triton.__version__
    except Exception:  # noqa: BLE001 - absent or broken: simply not listed
        pass
    try:
        from importlib.metadata import PackageNotFoundError, version

        for dist in ("fbgemm-gpu", "fbgemm-gpu-cpu"):
            try:
                versions["fbgemm_gpu"] = f"{version(dist)} ({dist})"
                break
            except PackageNotFoundError:
                continue
    except Exception:  # noqa: BLE001
        pass
    return versions
