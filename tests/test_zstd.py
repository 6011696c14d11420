"""``artifactd.format.zstd`` loads zstandard's C backend without running the package's ``__init__``.

The package's ``__init__`` imports ``platform`` and, before Python 3.12,
``typing``: more than a bare interpreter start, at every restore that
installs. These tests run a fresh interpreter and check that the classes come
from the C backend while the package itself stays unimported, that a later
``import zstandard`` shares the loaded backend, and that the package's own
switch (``PYTHON_ZSTANDARD_IMPORT_POLICY``) hands the choice back to it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import zstandard

from artifactd.format import zstd

REPO = Path(__file__).resolve().parent.parent

PROBE = (
    "import sys\n"
    "from artifactd.format import zstd\n"
    "print(zstd.ZstdDecompressor.__module__, 'zstandard' in sys.modules, "
    "'platform' in sys.modules, 'typing' in sys.modules)\n"
    "import zstandard\n"
    "print(zstandard.ZstdDecompressor is zstd.ZstdDecompressor, zstandard.backend)\n"
)


def _probe(env: dict[str, str]) -> list[list[str]]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [line.split() for line in proc.stdout.splitlines()]


def test_the_c_backend_loads_without_the_package() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHON_ZSTANDARD_IMPORT_POLICY"}
    first, later = _probe(env)
    # Not 'zstandard' nor what its __init__ imports; typing may come with site's own .pth
    # files in a development install, so only platform and the package are held here.
    assert first[:3] == ["zstandard.backend_c", "False", "False"]
    # The package, imported afterwards, finds the backend loaded and uses it.
    assert later == ["True", "cext"]


def test_the_packages_own_switch_hands_it_the_choice() -> None:
    env = dict(os.environ, PYTHON_ZSTANDARD_IMPORT_POLICY="cext")
    first, later = _probe(env)
    assert first[:2] == ["zstandard.backend_c", "True"]  # the package decided, and was imported
    assert later == ["True", "cext"]


def test_the_names_are_the_packages_own_and_round_trip() -> None:
    assert zstd.ZstdCompressor is zstandard.ZstdCompressor
    assert zstd.ZstdDecompressor is zstandard.ZstdDecompressor
    assert zstd.ZstdError is zstandard.ZstdError
    data = b"kernel " * 1000
    packed = zstd.ZstdCompressor(level=6).compress(data)
    assert zstd.ZstdDecompressor().decompress(packed) == data
