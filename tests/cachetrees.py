"""Synthetic cache trees in the real layouts of each library (sources named per tree).

Where the library runs on this machine (torch CPU, Triton AOT, nvcc), the
end-to-end tests produce caches with the real library instead.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def make_triton_tree(root: Path, kernels: tuple[str, ...] = ("add", "softmax")) -> Path:
    """A Triton cache in the real layout: <key dir>/{name.cubin,name.json,__grp__name.json}."""
    for i, name in enumerate(kernels):
        d = root / f"{'ABCDEFGHIJKLMNOP'[i] * 52}"
        d.mkdir(parents=True)
        children = {}
        for ext in ("cubin", "json", "ptx"):
            p = d / f"{name}.{ext}"
            p.write_bytes(f"{name}-{ext}-payload".encode() * 50)
            children[f"{name}.{ext}"] = str(p)
        (d / f"__grp__{name}.json").write_text(json.dumps({"child_paths": children}))
    (root / "tmp.pid_123_abc").mkdir()
    (root / "tmp.pid_123_abc" / "partial.cubin").write_bytes(b"half")
    return root


def make_generic_tree(root: Path) -> Path:
    """A loose cubin tree as nvcc would leave it."""
    (root / "sub").mkdir(parents=True)
    (root / "axpy.sm_90a.cubin").write_bytes(b"\x7fELF" + os.urandom(256))
    (root / "sub" / "kernel.so").write_bytes(b"\x7fELF" + os.urandom(128))
    (root / "sub" / "kernel.so").chmod(0o755)
    return root
