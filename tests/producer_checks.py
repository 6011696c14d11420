"""What the producer tests (``tests/test_producer_*.py``) check after a restore, shared.

* :func:`restored_at`: when the restore finished, as ``artifactd status`` reads it;
* :func:`written_since`: every file written under a restored dir after that,
  nothing left out (the family's own exclusions are ``status``'s business);
* :func:`beyond_lookups`: the processes a run started, less the shared-library
  lookups (``ldconfig -p``, which ``ctypes.util.find_library`` runs when a
  library loads a CUDA or system library by name: it reads the linker's cache and
  compiles nothing); what is left is what a restore must have made unneeded;
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


#: The program names of a shared-library lookup (:func:`beyond_lookups`).
LOOKUPS = frozenset({"ldconfig", "ldconfig.real"})


def beyond_lookups(started: list[list[str]]) -> list[list[str]]:
    """``started`` without ``ldconfig -p`` (a library lookup, whichever package runs it)."""
    return [argv for argv in started if not (Path(argv[0]).name in LOOKUPS and argv[1:] == ["-p"])]


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
