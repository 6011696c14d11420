"""What the producer tests (``tests/test_producer_*.py``) check after a restore, shared.

* :func:`restored_at`: when the restore finished, as ``artifactd status`` reads it;
* :func:`written_since`: every file written under a restored dir after that,
  nothing left out (the family's own exclusions are ``status``'s business);
* :func:`fake_toolkit`: a CUDA toolkit dir whose ``bin/nvcc --version`` names a
  release (it compiles nothing): a pod image with another nvcc.
"""

from __future__ import annotations

import json
from pathlib import Path

NVCC_VERSION = """#!/bin/sh
echo 'nvcc: NVIDIA (R) Cuda compiler driver'
echo 'Cuda compilation tools, release {release}, V{version}'
"""


def restored_at(target: Path) -> float:
    """When the restore into ``target`` finished (its marker), as ``status`` reads it."""
    marker = target / ".artifactd" / "restored.json"
    return max(float(json.loads(marker.read_text())["restored_at"]), marker.stat().st_mtime)


def written_since(root: Path, since: float) -> list[str]:
    """Every file under ``root`` written after ``since`` (nothing left out)."""
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and p.stat().st_mtime > since
    )


def fake_toolkit(root: Path, version: str) -> Path:
    """A CUDA toolkit dir whose ``bin/nvcc --version`` says ``version`` (e.g. ``12.8.93``)."""
    nvcc = root / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text(NVCC_VERSION.format(release=version.rsplit(".", 1)[0], version=version))
    nvcc.chmod(0o755)
    return root
