"""Which shipped model a learned planner uses without `--model`: the one rule.

The package ships a learned planner's model as `dreamshard/data/models/<planner>_<gpu>.pt`,
`<gpu>` the GPU whose measurements trained it as `costs.hardware.gpu_slug` names it (h100,
h200). A planner given no model uses the file of the GPU visible here, else of
`comm.DEFAULT_GPU` (the GPU the shipped models were trained on: planning on a CPU plans for
it); where none is shipped for that GPU, the file of another (`comm.DEFAULT_GPU`'s first, then
by name), and its label says so, as `comm.describe_choice` does for the comm models:
"shipped H200 model", or "shipped H100 model, trained on H100; planning for H200".
`benchmarks/gpu_train_shipped.py` trains the files, one call on one GPU.

Listing what is shipped (`available`, `describe_default`) reads the folder only: the registry and
`--help` use it without importing torch. `choose` asks torch which GPU is visible.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dreamshard.costs.comm import DEFAULT_GPU

MODELS_DIR = Path(__file__).resolve().parent / "data" / "models"  # read at every call: tests point it elsewhere


def shipped(planner: str) -> dict[str, Path]:
    """GPU → the file shipped for `planner` (`<planner>_<gpu>.pt`), for every GPU shipped."""
    prefix = f"{planner}_"
    return {p.stem[len(prefix):]: p for p in sorted(MODELS_DIR.glob(f"{prefix}*.pt")) if p.stem[len(prefix):].isalnum()}


def available(planner: str) -> bool:
    """Whether some model is shipped for `planner` (no torch: the folder alone)."""
    return bool(shipped(planner))


def target_gpu() -> str:
    """The GPU a plan made here is for: the one visible, else `comm.DEFAULT_GPU`."""
    from dreamshard.costs.comm import local_gpu

    return local_gpu() or DEFAULT_GPU


@dataclass(frozen=True)
class Choice:
    """The shipped model a planner uses: its file, the GPU that trained it, the GPU planned for."""

    planner: str
    path: Path
    gpu: str  # trained on
    target: str  # planning for

    @property
    def label(self) -> str:
        """"shipped H200 model"; with another GPU's file, "shipped H100 model, trained on H100; planning for H200"."""
        g = self.gpu.upper()
        return f"shipped {g} model" if self.gpu == self.target else f"shipped {g} model, trained on {g}; planning for {self.target.upper()}"

    @property
    def note(self) -> str:
        """What a plan's notes say of it: its label where the model is another GPU's, else ""."""
        return "" if self.gpu == self.target else self.label


def choose(planner: str, gpu: str | None = None) -> Choice | None:
    """The shipped model `planner` uses when planning for `gpu` (default: `target_gpu()`): that
    GPU's file, else `comm.DEFAULT_GPU`'s, else the first by name; None where none is shipped."""
    files = shipped(planner)
    if not files:
        return None
    target = gpu or target_gpu()
    pick = target if target in files else min(files, key=lambda g: (g != DEFAULT_GPU, g))
    return Choice(planner, files[pick], pick, target)


def model_path(planner: str, gpu: str | None = None) -> Path | None:
    """The file of `choose` (None where none is shipped)."""
    choice = choose(planner, gpu)
    return choice.path if choice else None


def label(planner: str, gpu: str | None = None) -> str:
    """The label of `choose` ("" where none is shipped): what a plan says its model is."""
    choice = choose(planner, gpu)
    return choice.label if choice else ""


def describe_default(planner: str) -> str:
    """For help texts, without asking torch which GPU is here: "the shipped H200 model", "the
    shipped model of this GPU (H100 or H200; else H200's)", or "" where none is shipped."""
    gpus = sorted(shipped(planner))
    if not gpus:
        return ""
    if len(gpus) == 1:
        return f"the shipped {gpus[0].upper()} model"
    fallback = DEFAULT_GPU if DEFAULT_GPU in gpus else gpus[0]
    return f"the shipped model of this GPU ({', '.join(g.upper() for g in gpus[:-1])} or {gpus[-1].upper()}; else {fallback.upper()}'s)"
