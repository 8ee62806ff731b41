"""Compile the Triton TBE's kernels of a git revision and of the working tree for sm_90, on the CPU
(no GPU needed: Triton's own compiler and bundled ptxas), and report which variants' PTX differ.

    python benchmarks/triton_ptx_diff.py [--rev HEAD] [--regs]    # needs `pip install triton==3.6.0`

A refactor that leaves every variant's PTX identical cannot change the kernels' speed, so it needs
no new GPU measurement. Variants: the forward (fp16/fp32, power-of-two dims only and all classes),
the key-building launch (with and without packing), the longest-bag launch, the product path's
counting, product and update launches, and the tile kernel of the backward for every tile class (fp16 SGD, fp32
row-wise Adagrad, fp16 row-wise Adagrad; level 0 and the levels above, with the tile lengths
of the default tunables). Pointer arguments are
compiled as 16-byte aligned (``tt.divisibility`` 16), as the JIT does for the tensors the real
launches pass; without it Triton picks scalar loads and several times the registers, so counts taken
that way overstate what the GPU runs. ``--regs`` prints each working-tree variant's registers and
spill (``cuobjdump -res-usage``), its SASS instructions and, for level-0 tiles, the
warp-instructions per lookup. A kernel or signature absent from the revision counts as differing.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
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
CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compile_(fn, sig: dict, const: dict, num_warps: int):
    names = fn.arg_names
    # 16-byte aligned pointers, as the JIT specialises the tensors of the real launches
    attrs = {(names.index(k),): [["tt.divisibility", 16]] for k, v in sig.items() if v.startswith("*")}
    src = ASTSource(fn=fn, signature={**sig, **{c: "constexpr" for c in const}}, constexprs=const, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 64), options={"num_warps": num_warps})


def ptx(cc) -> str:
    """The kernel's PTX without debug sections, line info or labels (they name files and lines)."""
    code = cc.asm["ptx"].split(".section")[0]
    return "\n".join(line for line in code.splitlines() if not line.strip().startswith(("//", ".file", ".loc")) and "L__tmp" not in line)


def regs(cc, warps: int, lookups: int | None) -> str:
    """Registers, spill and shared memory per thread, and the SASS instructions per thread (the
    kernels have no loops but short searches, so about what each thread issues); for a level-0 tile
    also the warp-instructions per lookup (instructions x warps / P): its cost, the tiles being bound
    by instruction issue (docs/kernels.md)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cc.asm["cubin"])
        f.flush()
        out = subprocess.run([CUOBJDUMP, "-res-usage", f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([CUOBJDUMP, "-sass", f.name], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+)", out)
    n = sum(1 for line in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", line))
    res = f"REG {m.group(1)} STACK {m.group(2)} SHARED {m.group(3)}" if m else out.strip()[-200:]
    return res + f" INSTR {n}" + (f" ({n * warps / lookups:.1f} warp-instructions per lookup)" if lookups else "")


def variants():
    for dt, vec in (("fp16", 8), ("fp32", 4)):
        sig = {"indices_ptr": "*i64", "offsets_ptr": "*i64", "w_ptr": f"*{dt}", "out_ptr": f"*{dt}", "meta_ptr": "*i64", "prog_table_ptr": "*i32",
               "pfirst_ptr": "*i64", "T": "i32", "B": "i32", "sumD": "i32"}
        for classes in ((1 << 7) - 1, ((1 << 7) - 1) * ((1 << 9) + 1), (1 << 18) - 1):
            yield "_fwd_kernel", sig, {"CLASSES": classes, "LANES": 1024, "UNROLL": 4, "VEC": vec}, 4
    sig = {"indices_ptr": "*i64", "offsets_ptr": "*i64", "row_start_ptr": "*i64", "bstart_ptr": "*i64", "keys_ptr": "*i32", "segid_ptr": "*i32",
           "tdyn_ptr": "*i64", "N": "i32", "B": "i32", "NBLK": "i32", "NBAGS": "i32", "T": "i32"}
    for pack in (False, True):
        yield "_keys_kernel", sig, {"BLOCK": 1024, "PACK": pack}, 4
    sig = {"indices_ptr": "*i64", "offsets_ptr": "*i64", "bstart_ptr": "*i64", "dmeta_ptr": "*i64", "counts_ptr": "*fp16",
           "ND": "i32", "NBLK": "i32", "NBAGS": "i32", "B": "i32", "BP": "i32"}
    yield "_count_kernel", sig, {"BLOCK": 1024, "MATCH": True}, 4
    yield "_maxlen_kernel", {"offsets_ptr": "*i64", "cand_ptr": "*i32", "out_ptr": "*i64", "B": "i32"}, {"BLOCK": 1024}, 4
    for dt, adagrad in (("fp16", False), ("fp32", True), ("fp16", True)):
        for bd in (16, 32, 64, 128):
            sig = {"counts_ptr": "*fp16", "grad_ptr": f"*{dt}", "part_ptr": "*fp32", "dmeta_ptr": "*i64", "pid_base": "i32", "d_lo": "i32",
                   "d_hi": "i32", "ND": "i32", "BP": "i32", "B": "i32", "sumD": "i32"}
            yield "_dense_kernel", sig, {"BR": 64, "BD": bd, "BK": 64}, (8 if bd > 64 else 4)
        for w in (4, 16, 128, 1024):
            sig = {"part_ptr": "*fp32", "w_ptr": f"*{dt}", "state_ptr": "*fp32", "dmeta_ptr": "*i64", "pid_base": "i32", "d_lo": "i32",
                   "d_hi": "i32", "ND": "i32", "lr": "fp32", "eps": "fp32"}
            yield "_dense_update", sig, {"RB": max(1, 2048 // w), "W": w, "ADAGRAD": adagrad}, 4
    for c in range(14):
        tw = 16 << (c % 7)
        for dt, adagrad in (("fp16", False), ("fp32", True), ("fp16", True)):
            if not adagrad and tw > 256:  # SGD cuts dims into blocks of at most 256 columns
                continue
            lanes0 = 4096 // (2 if dt == "fp32" else 1)
            pmax = 32 if tw <= 32 else 64  # the default tunables' tiles (TritonTBE: BWD_NARROW_*)
            p0, p1 = min(max(lanes0 // tw, 16), pmax), min(max(2048 // tw, 16), pmax)
            w = 1 if tw <= 32 else 4 if tw <= 256 else 8
            sig = {"keys_ptr": "*i16", "segs_ptr": "*i32", "grad_ptr": f"*{dt}", "vals_ptr": "*fp32", "ekeys_ptr": "*i16", "eflags_ptr": "*i8",
                   "w_ptr": f"*{dt}", "state_ptr": "*fp32", "meta_ptr": "*i64", "segt_ptr": "*i64", "pid_base": "i32", "seg_lo": "i32",
                   "seg_hi": "i32", "T": "i32", "NSEG": "i32", "B": "i32", "sumD": "i32", "lr": "fp32", "eps": "fp32"}
            # int32 offsets; a masked class over dims that are multiples of 4 (the least a dim may be)
            # and gradient columns at multiples of 8, as on a single table of a dim that is a multiple of 8
            for level0, p in ((True, p0), (False, p1)):
                yield "_tile_kernel", sig, {"CLS": c, "LEVEL0": level0, "P": p, "ADAGRAD": adagrad, "VEC": 8 if dt == "fp16" else 4,
                                            "I32": True, "MV": 4 if c >= 7 else 8, "GA": 8}, w


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default="HEAD", help="git revision to compare the working tree with")
    ap.add_argument("--regs", action="store_true", help="print the registers of every working-tree variant")
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
        for name, sig, const, warps in variants():
            n += 1
            cc = compile_(getattr(new, name), sig, const, warps)
            if args.regs:
                lookups = const["P"] if name == "_tile_kernel" and const["LEVEL0"] else None
                print(f"{name} {const} warps={warps}: {regs(cc, warps, lookups)}", flush=True)
            try:
                same = ptx(compile_(getattr(old, name), sig, const, warps)) == ptx(cc)
            except Exception as e:  # absent in the revision, or another signature
                same = False
                const = {**const, "old": type(e).__name__}
            if not same:
                differ.append(f"{name} {const}")
    for d in differ:
        print("differs:", d)
    print(f"{n - len(differ)} of {n} variants compile to identical PTX ({args.rev} vs working tree)")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
