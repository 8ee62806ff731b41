"""Compile the Triton TBE's kernels of a git revision and of the working tree for sm_90, on the CPU
(no GPU needed: Triton's own compiler and bundled ptxas), and report which variants' PTX differ.

    python benchmarks/triton_ptx_diff.py [--rev HEAD]      # needs `pip install triton==3.6.0`

A refactor that leaves every variant's PTX identical cannot change the kernels' speed, so it needs
no new GPU measurement. Variants: the forward (fp16/fp32, power-of-two dims only and all classes),
and for every dim class the backward (fp16 SGD, fp32 Adagrad, fp16 Adagrad with the scan
reduction) and the fix-up (SGD, Adagrad).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile

# a fresh compile cache: a cached kernel must never stand in for the one being compared
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton_ptx_diff_")

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

PATH = "dreamshard/costs/kernels/triton_tbe.py"
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ptx(fn, sig: dict, const: dict) -> str:
    """The kernel's PTX without debug sections, line info or labels (they name files and lines)."""
    cc = triton.compile(ASTSource(fn=fn, signature={**sig, **{c: "constexpr" for c in const}}, constexprs=const), target=GPUTarget("cuda", 90, 64))
    code = cc.asm["ptx"].split(".section")[0]
    return "\n".join(line for line in code.splitlines() if not line.strip().startswith(("//", ".file", ".loc")) and "L__tmp" not in line)


def variants():
    for dt, vec in (("fp16", 8), ("fp32", 4)):
        sig = {"indices_ptr": "*i64", "offsets_ptr": "*i64", "w_ptr": f"*{dt}", "out_ptr": f"*{dt}", "meta_ptr": "*i64", "prog_table_ptr": "*i32",
               "pfirst_ptr": "*i64", "T": "i32", "B": "i32", "sumD": "i32"}
        for classes in ((1 << 7) - 1, ((1 << 7) - 1) * ((1 << 9) + 1), (1 << 18) - 1):
            yield "_fwd_kernel", sig, {"CLASSES": classes, "LANES": 1024, "UNROLL": 4, "VEC": vec}
    for c in range(14):
        for dt, adagrad in (("fp16", False), ("fp32", True), ("fp16", True)):
            if not adagrad and c % 7 > 4:  # SGD cuts dims into blocks of at most 256 columns
                continue
            sig = {"keys_ptr": "*i32", "segs_ptr": "*i32", "grad_ptr": f"*{dt}", "w_ptr": f"*{dt}", "state_ptr": "*fp32",
                   "slot_first_ptr": "*fp32", "slot_last_ptr": "*fp32", "flags_ptr": "*i8", "meta_ptr": "*i64", "prog_table_ptr": "*i32",
                   "dyn_ptr": "*i64", "pid_base": "i32", "T": "i32", "B": "i32", "sumD": "i32", "lr": "fp32", "eps": "fp32"}
            yield "_bwd_kernel", sig, {"CLASSES": 1 << c, "LANES": 1024, "PMAX": 32, "ADAGRAD": adagrad, "VEC": 8 if dt == "fp16" else 4}
        for adagrad in (False, True):
            sig = {"keys_ptr": "*i32", "w_ptr": "*fp16", "state_ptr": "*fp32", "slot_first_ptr": "*fp32", "slot_last_ptr": "*fp32", "flags_ptr": "*i8",
                   "first": "i32", "meta_ptr": "*i64", "prog_table_ptr": "*i32", "dyn_ptr": "*i64", "T": "i32", "nprog": "i32", "lr": "fp32", "eps": "fp32"}
            yield "_fix_kernel", sig, {"CLASSES": 1 << c, "QLANES": 2048, "ADAGRAD": adagrad}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default="HEAD", help="git revision to compare the working tree with")
    args = ap.parse_args()
    sys.path.insert(0, ROOT)
    old_src = subprocess.run(["git", "show", f"{args.rev}:{PATH}"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    with tempfile.TemporaryDirectory() as tmp:
        old_path = os.path.join(tmp, "old_triton_tbe.py")
        with open(old_path, "w") as f:
            f.write(old_src)
        old, new = load(old_path, "old_triton_tbe"), load(os.path.join(ROOT, PATH), "new_triton_tbe")
        differ = []
        n = 0
        for name, sig, const in variants():
            n += 1
            if ptx(getattr(old, name), sig, const) != ptx(getattr(new, name), sig, const):
                differ.append(f"{name} {const}")
    for d in differ:
        print("differs:", d)
    print(f"{n - len(differ)} of {n} variants compile to identical PTX ({args.rev} vs working tree)")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
