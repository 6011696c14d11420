"""CuTe DSL's file cache (nvidia-cutlass-dsl) and FlashAttention-4's object cache.

Two components:

* ``cache``: CuTe DSL's ``cute_dsl_<module hash>.mlir`` files (MLIR bytecode
  followed by a CRC32 of it in native byte order), in ``CUTE_DSL_CACHE_DIR``,
  default ``<TMPDIR or tempfile.gettempdir()>/<$USER or $USERNAME or pw_name>/
  cutlass_python_cache``. Written through ``tmp.pid_<pid>_<uuid>/`` and an
  atomic rename (``base_dsl/cache_helpers.py``, NVIDIA/cutlass). A file whose
  CRC32 does not match is discarded at load (a warning and a recompile): not
  shipped.
* ``fa4``: FlashAttention-4's AOT objects (``flash_attn/cute/cache_utils.py``,
  Dao-AILab/flash-attention, which vLLM vendors), in
  ``FLASH_ATTENTION_CUTE_DSL_CACHE_DIR``, default
  ``<tempfile.gettempdir()>/<getpass.getuser()>/flash_attention_cute_dsl_cache``,
  used only with ``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1`` (the restore env
  sets both). Layout ``<source fingerprint>/[<name>/]<sha256(pickle(key))>.o``,
  ``<hash>.lock`` files and ``.<hash>.<hex>.tmp.o`` temp files (both left out).
  The fingerprint hashes FA4's own sources, the Python minor version and the
  cutlass and tvm_ffi versions; no path enters it, so it relocates freely. An
  empty ``.o`` fails to load and is deleted: not shipped.

The CuTe DSL key hazard (``BaseDSL.get_module_hash`` in ``base_dsl/dsl.py``):
the key is the module bytecode, the compile options and ``str()`` of EVERY
non-None attribute of the DSL's environment manager, which include the
literal ``CUTE_DSL_CACHE_DIR`` value when it is set, the dump dir
(``CUTE_DSL_DUMP_DIR``, default the process's CURRENT DIRECTORY), the absolute
path of ``libcute_dsl_runtime.so`` (``CUTE_DSL_LIBS`` or found next to the
package) and the target arch (``CUTE_DSL_ARCH`` or the detected GPU). So:

* an entry written with ``CUTE_DSL_CACHE_DIR=/a`` is only found by a process
  with exactly ``CUTE_DSL_CACHE_DIR=/a``; one written with it unset only by a
  process with it unset. The restore therefore installs the cache where the
  DSL's DEFAULT lookup finds it, ``<target>/tmp/<user>/cutlass_python_cache``,
  and points ``TMPDIR`` at ``<target>/tmp`` (as the Inductor PCH does), leaving
  ``CUTE_DSL_CACHE_DIR`` unset: warm up with it unset too, or nothing hits.
* warm-up and pods must start in the same working directory (or set the same
  ``CUTE_DSL_DUMP_DIR``); the fingerprint cannot see this.
* the site-packages path is in the scope and pinned.

Scope: the arch, the DSL release (``libraries.nvidia-cutlass-dsl``; its code
ships in ``nvidia-cutlass-dsl-libs-*`` dists pinned by it), the Python minor
version (FA4 keys on it), the machine, and the site-packages path.
"""

from __future__ import annotations

import os
import re
import sys
import zlib
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from artifactd.constants import (
    CUTE_DSL_CACHE_DIR,
    FLASH_ATTENTION_CUTE_DSL_CACHE_DIR,
    FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED,
    TMPDIR,
    USER,
    USERNAME,
)
from artifactd.families.base import Component, Family, Located, gettempdir, sanitize_user

CACHE_DIRNAME = "cutlass_python_cache"
FA4_DIRNAME = "flash_attention_cute_dsl_cache"
#: The import package whose directory holds the DSL and its runtime library.
DSL_PACKAGE = "nvidia_cutlass_dsl"


def dsl_user(environ: Mapping[str, str]) -> str | None:
    """Return the user name in CuTe DSL's default cache path: $USER, $USERNAME, else the login.

    The login is the password database's name for the uid, as the DSL's
    ``get_current_user`` reads it; never ``getpass.getuser()``, which tries
    ``$LOGNAME`` first. None when the uid has no entry: the DSL then falls
    back to ``<tmp>/cutlass_python_cache``.
    """
    named = environ.get(USER) or environ.get(USERNAME)
    if named:
        return named
    try:
        import pwd
    except ImportError:  # not POSIX: the DSL's own lookup raises, then falls back
        return None
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return None


def dsl_cache_dir(environ: Mapping[str, str]) -> Path:
    """Return the dir CuTe DSL caches in for ``environ`` (``get_default_generated_ir_path``)."""
    configured = environ.get(CUTE_DSL_CACHE_DIR)
    if configured:
        return Path(configured)
    tmp = gettempdir(environ)
    user = dsl_user(environ)
    return tmp / user / CACHE_DIRNAME if user else tmp / CACHE_DIRNAME


def crc_ok(path: str) -> bool:
    """Whether a cache file ends with the CRC32 of what precedes it, as the DSL checks."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return False
    if len(data) < 4:
        return False
    return zlib.crc32(data[:-4]) == int.from_bytes(data[-4:], sys.byteorder)


class CuteDSLFamily(Family):
    """CuTe DSL compiled modules and FlashAttention-4 objects."""

    name = "cutedsl"
    description = "CuTe DSL file cache (CUTE_DSL_CACHE_DIR) and FA4 objects"
    scope = (
        "gpu.arch",
        "libraries.nvidia-cutlass-dsl",
        "platform.machine",
        "python.version",
        "paths.site_packages",
    )
    components = (
        Component("cache", "tmp/{user}/" + CACHE_DIRNAME, {TMPDIR: "{target}/tmp"}),
        Component(
            "fa4",
            "fa4",
            {
                FLASH_ATTENTION_CUTE_DSL_CACHE_DIR: "{dir}",
                FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED: "1",
            },
        ),
    )
    library = "CuTe DSL"
    written_since_restore = (
        "A new `cute_dsl_<hash>.mlir` (the DSL writes through `tmp.pid_*` dirs, left out, "
        "and renames) or a new FA4 `.o` object (its `.lock` and `.<hash>.<hex>.tmp.o` "
        "files are left out). A `.mlir` file the DSL discarded for a bad CRC32 and wrote "
        "again counts."
    )
    exclude_patterns = (
        *Family.exclude_patterns,
        re.compile(r"^\..+\.tmp\.o$"),  # FA4's export temp files
    )

    def locate(self, environ: Mapping[str, str]) -> list[Located]:
        """Find each dir as its library does (env var, else the per-user temp default)."""
        found: list[Located] = []
        tmp = gettempdir(environ)
        cache = dsl_cache_dir(environ)
        if cache.is_dir():
            found.append(Located(self.components[0], cache))
        fa4_configured = environ.get(FLASH_ATTENTION_CUTE_DSL_CACHE_DIR)
        fa4 = Path(fa4_configured) if fa4_configured else tmp / sanitize_user(None) / FA4_DIRNAME
        if fa4.is_dir():
            found.append(Located(self.components[1], fa4))
        return found

    def invalid_entries(self, component: str, root: Path) -> dict[PurePosixPath, str]:
        """CuTe DSL files failing their CRC32; empty FA4 objects."""
        bad: dict[PurePosixPath, str] = {}
        if component == "cache":
            try:
                names = sorted(os.listdir(root))
            except OSError:
                return bad
            for name in names:
                path = os.path.join(root, name)
                if name.endswith(".mlir") and os.path.isfile(path) and not crc_ok(path):
                    bad[PurePosixPath(name)] = (
                        "corrupt CuTe DSL cache file: CRC32 mismatch (discarded at load)"
                    )
            return bad
        for dirpath, _dirs, files in os.walk(root):
            for name in sorted(files):
                path = os.path.join(dirpath, name)
                if name.endswith(".o") and not name.startswith(".") and _empty(path):
                    rel = PurePosixPath(Path(path).relative_to(root).as_posix())
                    bad[rel] = "empty FA4 object: fails to load and is recompiled"
        return bad

    def pinned_paths(self, component: str, root: Path) -> list[str]:
        """Return the site-packages dir holding the DSL: its runtime library path is in keys."""
        del root
        if component != "cache":
            return []
        for entry in sys.path:
            base = entry or "."
            if os.path.isdir(os.path.join(base, DSL_PACKAGE)):
                return [os.path.abspath(base)]
        return []


def _empty(path: str) -> bool:
    try:
        return os.path.getsize(path) == 0
    except OSError:
        return False
