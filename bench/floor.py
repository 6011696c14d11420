"""The floor of a restore that installs, in instructions: what the standard library alone costs.

A restore's fixed cost is held against a bare ``python -c pass``
(``bench/coldstart.py``, ``bench/instructions.py``). Part of it no artifactd
code can remove: the modules of the standard library a restore needs. This
counts, under valgrind's callgrind in the plain environment of
``bench/plainenv.py``, a bare start, then scripts that only import:

  no-op floor      the modules a no-op restore's code may import at its top
                   (``artifactd.cli.fast.FLOOR``, and ``sysconfig``, which the
                   probe reads the ABI from)
  extract floor    that, plus what extracting a small layer needs:
                   ``itertools``, ``operator`` and ``zlib`` (the tar headers'
                   checksums), and ``zstandard``'s C extension loaded on its
                   own, without its package's ``__init__`` (which imports
                   ``platform``, ``typing`` and ``re``), as
                   ``artifactd/format/zstd.py`` loads it; threads are
                   ``_thread``'s, already loaded
  bulk floor       that, plus OpenSSL's ``_hashlib``, which a layer of more
                   than ``hashing.BULK`` bytes is hashed with

and the no-op restore itself. The floor of a restore that installs is the
extract floor plus the no-op's own work (the no-op less its floor): printed
as a ratio to the bare start, before any code that reads a config, plans,
extracts or commits (and again with OpenSSL, for bulk data). Needs
``valgrind`` on PATH.

Usage: python bench/floor.py
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from coldstart import bytecode_env, small_store  # noqa: E402
from instructions import instructions  # noqa: E402
from plainenv import command, plain_python  # noqa: E402

from artifactd.cli.fast import FLOOR  # noqa: E402
from artifactd.constants import ENV_CACHE_DIR  # noqa: E402

#: What extracting a small layer needs beyond the no-op's floor (zstandard's extension apart).
EXTRACT = ("itertools", "operator", "zlib")
#: What a layer of bulk data adds: OpenSSL's sha256.
BULK = ("_hashlib",)


def zstd_alone() -> str:
    """Python that loads zstandard's C extension without running its package's ``__init__``."""
    import zstandard  # noqa: PLC0415  # only to find the extension's file

    folder = Path(zstandard.__file__).parent
    [ext] = [p for p in folder.iterdir() if p.name.startswith("backend_c.")]
    return (
        "import _imp\n"
        "from _frozen_importlib import ModuleSpec\n"
        "from _frozen_importlib_external import ExtensionFileLoader\n"
        f"_loader = ExtensionFileLoader('zstandard.backend_c', {str(ext)!r})\n"
        f"_imp.create_dynamic(ModuleSpec('zstandard.backend_c', _loader, origin={str(ext)!r}))\n"
    )


def importing(modules: list[str], extra: str = "") -> str:
    """A script that imports ``modules`` (those this Python has), then runs ``extra``."""
    lines = [f"try:\n    import {name}\nexcept ImportError:\n    pass" for name in sorted(modules)]
    return "\n".join([*lines, extra])


def main() -> None:
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not on PATH (apt-get install valgrind)")
    work = Path(tempfile.mkdtemp(prefix="artifactd-floor-"))
    try:
        py = plain_python(work)
        base = dict(os.environ) | {ENV_CACHE_DIR: str(work / "probe-cache")}
        store, target = small_store(py, work, base)
        env = bytecode_env(base, work / "pycache")
        noop_floor = importing([*FLOOR, "sysconfig"])
        extract_floor = importing([*FLOOR, "sysconfig", *EXTRACT], zstd_alone())
        bulk_floor = importing([*FLOOR, "sysconfig", *EXTRACT, *BULK], zstd_alone())
        scripts = {
            "no-op floor": noop_floor,
            "extract floor": extract_floor,
            "bulk floor": bulk_floor,
        }
        paths = {}
        for name, text in scripts.items():
            paths[name] = work / f"{name.replace(' ', '-')}.py"
            paths[name].write_text(text)
        restore = [*command(py), "restore", "--json", "--store", store, "--target", str(target)]
        commands = {
            "python -c pass": [py, "-c", "pass"],
            **{name: [py, str(path)] for name, path in paths.items()},
            "no-op restore": [*restore, "--gpu-arch", "sm_90a"],
        }
        for argv in commands.values():  # once uncounted: the bytecode cache fills
            instructions(argv, env)
        counts = {name: instructions(argv, env) for name, argv in commands.items()}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    bare = counts["python -c pass"]
    own = counts["no-op restore"] - counts["no-op floor"]
    counts["installing floor (extract floor + no-op's own)"] = counts["extract floor"] + own
    counts["the same, bulk data (bulk floor + no-op's own)"] = counts["bulk floor"] + own
    print(f"{'':48} {'M instr':>8} {'x bare':>7}")
    for name, n in counts.items():
        print(f"{name:48} {n / 1e6:8.1f} {n / bare:7.2f}")


if __name__ == "__main__":
    main()
