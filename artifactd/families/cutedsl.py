"""CuTe DSL's file cache (nvidia-cutlass-dsl) and FlashAttention-4's object cache.

Two components:

* ``cache``: CuTe DSL's ``cute_dsl_<module hash>.mlir`` files, in
  ``CUTE_DSL_CACHE_DIR``, default ``<$TMPDIR or tempfile.gettempdir()>/<$USER
  or $USERNAME or the uid's login>/cutlass_python_cache`` (never ``$LOGNAME``);
  the DSL creates that dir when it is imported. A file is the module after
  lowering (host code in the LLVM dialect with the kernel's cubin embedded)
  as MLIR bytecode, followed by a CRC32 of it in native byte order; it is
  byte-for-byte the same on every compile of one module. Written through
  ``tmp.pid_<pid>_<uuid>/`` and an atomic rename. A file whose CRC32 fails is
  discarded at load (a warning, a recompile, the file written again): not
  shipped. With ``CUTE_DSL_ENABLE_PYIR=1`` the DSL also keeps parse facts in
  ``pyir_class_facts/<digest>.v1.facts`` (keyed by the source text, written
  through ``*.tmp``, left out): shipped, so a pod does not write them again.
  Only a call of a ``@cute.jit`` function reads or writes this cache;
  ``cute.compile`` never does (``CompileCallable._compile`` passes
  ``no_cache=True``), so engines that compile ahead with it (FA4) leave it
  empty.
* ``fa4``: FlashAttention-4's AOT objects (``flash_attn/cute/cache_utils.py``,
  Dao-AILab/flash-attention, which vLLM vendors), in
  ``FLASH_ATTENTION_CUTE_DSL_CACHE_DIR``, default
  ``<tempfile.gettempdir()>/<getpass.getuser()>/flash_attention_cute_dsl_cache``,
  used only with ``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1`` (the restore env
  sets both). Layout ``<source fingerprint>/[<name>/]<sha256(pickle(key))>.o``,
  ``<hash>.lock`` files and ``.<hash>.<hex>.tmp.o`` temp files (both left out).
  The fingerprint hashes FA4's own sources, the Python minor version and the
  cutlass and tvm_ffi versions; no path enters it, so it relocates freely. An
  empty ``.o`` fails to load and is deleted: not shipped. Read from source,
  not run here.

Release 4.8.1 (the wheels nvidia-cutlass-dsl, -libs-base, -libs-core and
-libs-cu12), files read: ``base_dsl/cache_helpers.py`` (the dir, the file
format), ``base_dsl/compile_backend.py`` (``_resolve_compile_cache``,
``_finalize_cache``: the file lookup and write), ``base_dsl/dsl.py``
(``get_module_hash``), ``base_dsl/env_manager.py`` (``cache_key_str``,
``detect_gpu_arch``, ``get_prefix_dsl_libs``), ``base_dsl/compiler.py``
(``CompileCallable``), ``base_dsl/pyir_class_facts.py``. The Python package
``cutlass`` lies in ``<site>/nvidia_cutlass_dsl/dsl_packages/`` (a ``.pth``
file puts it on the path), the runtime library in
``<site>/nvidia_cutlass_dsl/cu12/lib/libcute_dsl_runtime.so``.

The key (``BaseDSL.get_module_hash``): sha256 of the traced module's
bytecode, of the environment manager's ``cache_key_str()`` and of the compile
options. The bytecode holds the source locations of the ``@cute.jit``
function: the ABSOLUTE path of its Python file and its line numbers (the same
kernel run from another path, or after an edit above it, is another key;
measured). ``cache_key_str()`` holds only the settings declared
``affects_compile``: the target arch, the absolute path of
``libcute_dsl_runtime.so`` (``CUTE_DSL_LIBS`` or found next to the
package), and ``CUTE_DSL_DEBUG``, ``_LINEINFO``, ``_COMPILER_OPT``,
``_ENABLE_PYIR``, ``_ENABLE_ASSERTIONS`` and the like. Not in it (measured):
``CUTE_DSL_CACHE_DIR``, the dump dir and the working directory (an earlier
reading of the source, before this split, found the first two there), nor
the DSL's own version (``get_version`` hashes nothing). So:

* the restore installs the cache where the DSL's default lookup finds it,
  ``<target>/tmp/<user>/cutlass_python_cache``, and points ``TMPDIR`` at
  ``<target>/tmp`` (as the Inductor PCH does); ``--consumer-user`` names the
  pod's ``$USER``;
* the arch is ``CUTE_DSL_ARCH`` (the DSL's cross-compiling override: no device
  needed, the driver is loaded only to launch) or the detected GPU's
  (``sm_90a`` on an H100 or H200; ``sm_100a`` when none is found): the scope's
  ``gpu.arch``. A warm-up that sets ``CUTE_DSL_ARCH`` must name the arch the
  pod detects (``sm_90a``, not ``sm_90``);
* the kernels' source files and the DSL must lie at the same paths in
  warm-up and pod: the site-packages path is in the scope, and the dir that
  holds the DSL is pinned;
* the DSL version is in the scope (``libraries.nvidia-cutlass-dsl``; its code
  ships in the ``nvidia-cutlass-dsl-libs-*`` dists it pins), since the DSL's
  key does not hold it.

Proven on the producer (``tests/test_producer_cutedsl.py``, no GPU:
``CUTE_DSL_ARCH=sm_90a``): the DSL's own JIT writes the cache, the harvest
packs it, the restore installs it for another user and temp dir, and the DSL
run again there logs a hit and writes nothing (``status``: used); a pod whose
``gpu.arch`` differs misses the family with that field named.

Scope: the arch, the DSL release, the Python minor version (FA4 keys on it),
the machine, and the site-packages path.
"""

from __future__ import annotations

import os
import sys
import zlib

from artifactd.constants import (
    CUTE_DSL_CACHE_DIR,
    FLASH_ATTENTION_CUTE_DSL_CACHE_DIR,
    FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED,
    TMPDIR,
    USER,
    USERNAME,
)
from artifactd.families.base import Component, Family, Located, gettempdir, sanitize_user

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path, PurePosixPath

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
        # lazy: pwd is POSIX-only; elsewhere the DSL falls back on its own
        import pwd  # noqa: PLC0415
    except ImportError:  # not POSIX: the DSL's own lookup raises, then falls back
        return None
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return None


def dsl_cache_dir(environ: Mapping[str, str]) -> Path:
    """Return the dir CuTe DSL caches in for ``environ`` (``get_default_generated_ir_path``)."""
    from pathlib import Path  # noqa: PLC0415  # lazy: only a harvest locates caches

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
    #: Entries are written to a temp file and renamed into place: none in place.
    written_in_place = ()
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
        r"^\..+\.tmp\.o$",  # FA4's export temp files
    )

    def locate(self, environ: Mapping[str, str]) -> list[Located]:
        """Find each dir as its library does (env var, else the per-user temp default)."""
        from pathlib import Path  # noqa: PLC0415  # lazy: only a harvest locates caches

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
        from pathlib import Path, PurePosixPath  # noqa: PLC0415  # lazy: a harvest's and a lint's

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
