"""CPU demo warm-up: real compilers, no GPU.

* torch.compile (Inductor CPU kernels) of a few small modules;
* Triton AOT compilation of a few kernels to real sm_90a cubins (ptxas ships
  in the triton wheel, so no GPU or driver is needed);
* nvcc -cubin -arch=sm_90a of one CUDA kernel into ARTIFACTD_GENERIC_DIR
  (keyed by source hash; a present cubin is a hit only if the note ptxas
  wrote into it says this release compiled this kernel for this arch).

Caches go wherever the libraries' env vars point (TORCHINDUCTOR_CACHE_DIR,
TRITON_CACHE_DIR, TMPDIR for Inductor's precompiled header). The last line on
stdout is one JSON object: per part, how many things were compiled and how
many were cache hits, with seconds; the tests and the demo read it. Each hit
is what the compiler reported or recorded (Inductor's fxgraph counters,
Triton's compilation listener, ptxas's note in the cubin), never a path
merely being there.

Usage: python warmup.py [--parts inductor,triton,nvcc] [--arch 90]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def run_inductor(
    *,
    save_megacache: bool = False,
    load_megacache: bool = False,
    batch: int = 8,
    device: str = "cpu",
) -> dict[str, Any]:
    """torch.compile three small graphs; hits and misses are Inductor's fxgraph counters.

    ``device`` is where the graphs run: ``cpu`` here (C++ kernels), ``cuda``
    in the GPU acceptance (Triton kernels; ``warmup_matrices/gpu-acceptance``).

    ``checks.inductor_sum`` sums every output: what ``artifactd verify`` compares
    between the build and a run on the restored caches. ``CPU_DEMO_PERTURB``
    (a number added to the input) makes it diverge on purpose, for the tests.
    """
    t0 = time.perf_counter()
    import torch
    import torch.nn.functional as F  # noqa: N812
    from torch._dynamo.utils import counters

    class Block(torch.nn.Module):
        def __init__(self, d: int = 64) -> None:
            super().__init__()
            self.up = torch.nn.Linear(d, 4 * d)
            self.down = torch.nn.Linear(4 * d, d)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.down(F.gelu(self.up(x)))

    def norm_act(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.silu(F.layer_norm(x, (x.shape[-1],), w, b))

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        s = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
        return torch.softmax(s, dim=-1) @ v

    loaded = 0
    if load_megacache:
        from artifactd import megacache

        loaded = megacache.load().files
    torch.manual_seed(0)
    x = torch.randn(batch, 64) + float(os.environ.get("CPU_DEMO_PERTURB", "0"))
    q = torch.randn(2, 16, 32)
    # Drawn on the CPU whatever the device, so the inputs are the same everywhere.
    x, q = x.to(device), q.to(device)
    w, b = torch.ones(64, device=device), torch.zeros(64, device=device)
    jobs = [
        (torch.compile(Block().eval().to(device), dynamic=False), (x,)),
        (torch.compile(norm_act, dynamic=False), (x, w, b)),
        (torch.compile(attention, dynamic=False), (q, q, q)),
    ]
    total = 0.0
    with torch.no_grad():
        for fn, args in jobs:
            total += float(fn(*args).double().sum())
    c = counters["inductor"]
    hits, misses = int(c["fxgraph_cache_hit"]), int(c["fxgraph_cache_miss"])
    saved = None
    if save_megacache:
        from artifactd import megacache

        path = megacache.save()
        saved = str(path) if path else None
    return {
        "graphs": len(jobs),
        "compiled": misses,
        "hits": hits,
        "megacache_saved": saved,
        "megacache_loaded": loaded,
        "seconds": round(time.perf_counter() - t0, 3),
        "sum": total,
    }


def run_triton(arch: int) -> dict[str, Any]:
    """Compile three Triton kernels ahead of time; hits are what its listener reports."""
    t0 = time.perf_counter()
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    @triton.jit
    def add(x, y, out, n, BLOCK: tl.constexpr):  # noqa: N803
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)

    @triton.jit
    def softmax(out, inp, stride, n_cols, BLOCK: tl.constexpr):  # noqa: N803
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        m = cols < n_cols
        v = tl.load(inp + row * stride + cols, mask=m, other=-float("inf"))
        e = tl.exp(v - tl.max(v, axis=0))
        tl.store(out + row * stride + cols, e / tl.sum(e, axis=0), mask=m)

    @triton.jit
    def matmul(a, b, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):  # noqa: N803, PLR0917
        rm = tl.program_id(0) * BM + tl.arange(0, BM)
        rn = tl.program_id(1) * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, K, BK):
            ta = tl.load(a + rm[:, None] * K + (k + rk)[None, :])
            tb = tl.load(b + (k + rk)[:, None] * N + rn[None, :])
            acc += tl.dot(ta, tb)
        tl.store(c + rm[:, None] * N + rn[None, :], acc.to(tl.float16))

    ptr32 = "*fp32"
    kernels = [
        (
            add,
            {"x": ptr32, "y": ptr32, "out": ptr32, "n": "i32", "BLOCK": "constexpr"},
            {"BLOCK": 1024},
            {},
        ),
        (
            softmax,
            {"out": ptr32, "inp": ptr32, "stride": "i32", "n_cols": "i32", "BLOCK": "constexpr"},
            {"BLOCK": 1024},
            {"num_warps": 8},
        ),
        (
            matmul,
            {
                "a": "*fp16",
                "b": "*fp16",
                "c": "*fp16",
                "M": "i32",
                "N": "i32",
                "K": "i32",
                "BM": "constexpr",
                "BN": "constexpr",
                "BK": "constexpr",
            },
            {"BM": 64, "BN": 64, "BK": 32},
            {"num_warps": 4, "num_stages": 3},
        ),
    ]
    seen: list[bool] = []

    def listener(**kw: Any) -> None:
        seen.append(bool(kw["cache_hit"]))

    triton.knobs.compilation.listener = listener
    target = GPUTarget("cuda", arch, 32)
    cubins = 0
    for fn, sig, consts, opts in kernels:
        compiled = triton.compile(
            ASTSource(fn=fn, signature=sig, constexprs=consts), target=target, options=opts
        )
        cubins += bool(compiled.asm.get("cubin"))
    hits = sum(seen)
    return {
        "kernels": len(kernels),
        "compiled": len(seen) - hits,
        "hits": hits,
        "cubins": cubins,
        "seconds": round(time.perf_counter() - t0, 3),
    }


def cubin_record(path: Path) -> dict[str, Any] | None:
    """Read what ptxas wrote into a cubin about its own run, or None if it is not a cubin.

    A CUDA ELF (64-bit, little-endian, machine EM_CUDA = 190) carries a
    ``.note.nv.tkinfo`` note in which ptxas records its name, its release line
    and its arguments (``-arch sm_90a -m 64``), and a ``.text.<kernel>``
    section per kernel it compiled.
    """
    import struct

    try:
        data = path.read_bytes()
        if data[:4] != b"\x7fELF" or data[4] != 2 or struct.unpack_from("<H", data, 18)[0] != 190:
            return None
        shoff = struct.unpack_from("<Q", data, 0x28)[0]
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
        sections = [
            struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)
        ]
        names_at, names_size = sections[shstrndx][4], sections[shstrndx][5]
        names = data[names_at : names_at + names_size]

        def cstr(buf: bytes, at: int) -> str:
            return buf[at : buf.index(b"\0", at)].decode()

        record: dict[str, Any] = {"kernels": []}
        for name_at, _type, _flags, _addr, offset, size in sections:
            name = cstr(names, name_at)
            if name.startswith(".text."):
                record["kernels"].append(name[len(".text.") :])
            elif name == ".note.nv.tkinfo":
                note = data[offset : offset + size]
                namesz, descsz = struct.unpack_from("<II", note)
                desc = note[12 + (namesz + 3) // 4 * 4 :][:descsz]
                # Four offsets into the string table that follows them at byte 24.
                tool, release, _build, argv = struct.unpack_from("<IIII", desc, 8)
                table = desc[24:]
                record.update(
                    tool=cstr(table, tool),
                    release=cstr(table, release),
                    args=cstr(table, argv).split(),
                )
    except (OSError, struct.error, IndexError, ValueError, UnicodeDecodeError):
        return None
    return record if "tool" in record else None


def nvcc_release() -> str:
    """Return the ``Vx.y.z`` release of the nvcc on PATH, as ptxas records it in its note."""
    import re

    out = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, check=True).stdout
    found = re.search(r"release [\d.]+, (V[\d.]+)", out)
    if found is None:
        sys.exit(f"cannot read nvcc's release from: {out!r}")
    return found.group(1)


def run_nvcc(arch: int) -> dict[str, Any]:
    """Compile axpy.cu to an sm_XXa cubin unless ptxas's record in the present one says it did.

    nvcc keeps no cache of its own, so a hit is not "the file exists": the
    cubin must say, in the note ptxas wrote while compiling it, that ptxas of
    this toolkit release built this kernel for this arch. Anything else
    (missing, truncated, another arch or release) is compiled again.
    """
    t0 = time.perf_counter()
    out_dir = os.environ.get("ARTIFACTD_GENERIC_DIR")
    if not out_dir:
        return {"skipped": "ARTIFACTD_GENERIC_DIR is not set"}
    if shutil.which("nvcc") is None:
        return {"skipped": "nvcc is not on PATH"}
    src = HERE / "axpy.cu"
    key = hashlib.sha256(src.read_bytes() + f"sm_{arch}a".encode()).hexdigest()[:16]
    cubin = Path(out_dir) / f"axpy-{key}.sm_{arch}a.cubin"
    release = nvcc_release()

    def built_here(record: dict[str, Any] | None) -> bool:
        return (
            record is not None
            and record["tool"] == "ptxas"
            and record["release"].endswith(release)
            and f"sm_{arch}a" in record["args"]
            and "axpy" in record["kernels"]
        )

    if built_here(cubin_record(cubin)):
        seconds = round(time.perf_counter() - t0, 3)
        return {"kernels": 1, "compiled": 0, "hits": 1, "seconds": seconds}
    cubin.parent.mkdir(parents=True, exist_ok=True)
    tmp = cubin.with_suffix(".tmp")
    subprocess.run(["nvcc", "-cubin", f"-arch=sm_{arch}a", "-o", str(tmp), str(src)], check=True)
    if not built_here(cubin_record(tmp)):
        sys.exit(f"nvcc wrote {tmp} without ptxas's record of an sm_{arch}a axpy: cannot tell hits")
    tmp.replace(cubin)
    return {"kernels": 1, "compiled": 1, "hits": 0, "seconds": round(time.perf_counter() - t0, 3)}


def main() -> None:
    """Run the parts asked for and print the report as the last line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="inductor,triton,nvcc")
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--batch", type=int, default=8, help="rows of the Inductor inputs")
    parser.add_argument(
        "--save-megacache",
        action="store_true",
        help="save torch's Mega-Cache into ARTIFACTD_MEGACACHE_DIR at the end",
    )
    parser.add_argument(
        "--load-megacache",
        action="store_true",
        help="load ARTIFACTD_MEGACACHE_DIR before compiling",
    )
    args = parser.parse_args()
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    t0 = time.perf_counter()
    report: dict[str, Any] = {}
    for part in parts:
        if part == "inductor":
            report["inductor"] = run_inductor(
                save_megacache=args.save_megacache,
                load_megacache=args.load_megacache,
                batch=args.batch,
            )
        elif part == "triton":
            report["triton"] = run_triton(args.arch)
        elif part == "nvcc":
            report["nvcc"] = run_nvcc(args.arch)
        else:
            sys.exit(f"unknown part {part!r}")
    report["seconds"] = round(time.perf_counter() - t0, 3)
    report["compiled"] = sum(
        int(v.get("compiled", 0)) for v in report.values() if isinstance(v, dict)
    )
    if "inductor" in report:
        report["checks"] = {"inductor_sum": report["inductor"]["sum"]}
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
