"""zstandard's compressor and decompressor, loaded without the package's ``__init__``.

Why this module exists: ``import zstandard`` runs the package's ``__init__``,
which picks a backend and, to do so, imports ``platform`` (which loads ``re``,
``enum``, ``functools`` and ``collections``) and, before Python 3.12, ``typing``
(for ``ByteString``): about 11 ms here, more than a bare interpreter start, at
every restore that installs. The backend it picks on CPython is one extension
module, ``zstandard.backend_c``, which needs none of that; loading it by its
file costs under 1 ms. So this module finds that file where the package is
installed and loads it, as ``zstandard.backend_c``, which is the name the
package would give it (a later ``import zstandard`` finds it loaded and uses it).

It falls back to ``import zstandard`` wherever the package would choose
otherwise or the file is not where this expects it: the package already
imported, ``PYTHON_ZSTANDARD_IMPORT_POLICY`` set (the package's own switch
between its backends), no ``backend_c`` extension for this interpreter (PyPy's
cffi backend). Either way the names below are the package's own classes.
``tests/test_zstd.py`` checks that this Python takes the direct path, and that
the package is not imported.

What it serves: :data:`ZstdCompressor`, :data:`ZstdDecompressor` and
:data:`ZstdError`, the three names artifactd uses.
"""

from __future__ import annotations

import sys

from artifactd.constants import PYTHON_ZSTANDARD_IMPORT_POLICY, current_environ

TYPE_CHECKING = False
if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec
    from types import ModuleType

__all__ = ["ZstdCompressor", "ZstdDecompressor", "ZstdError", "backend_module"]

#: The package, and its C backend's module name (what the package's ``__init__`` imports).
_PACKAGE = "zstandard"
_BACKEND = "zstandard.backend_c"


def _backend_spec() -> ModuleSpec | None:
    """Where ``zstandard.backend_c`` is, found as ``import zstandard.backend_c`` would find it."""
    try:
        # The import system's own finder, which importlib.machinery re-exports: loaded at
        # every start (importlib itself, with warnings, is not).
        from _frozen_importlib_external import (  # noqa: PLC0415
            ExtensionFileLoader,
            PathFinder,
        )
    except ImportError:  # pragma: no cover - not CPython: its package decides
        return None
    package = PathFinder.find_spec(_PACKAGE)
    where = package.submodule_search_locations if package is not None else None
    spec = PathFinder.find_spec(_BACKEND, list(where)) if where else None
    return spec if spec is not None and isinstance(spec.loader, ExtensionFileLoader) else None


def _load_backend() -> ModuleType | None:
    """Load ``zstandard.backend_c`` by its file, or return None where the package must decide."""
    loaded = sys.modules.get(_BACKEND)
    if loaded is not None:
        return loaded
    if _PACKAGE in sys.modules or current_environ().get(PYTHON_ZSTANDARD_IMPORT_POLICY):
        return None
    spec = _backend_spec()
    if spec is None or spec.loader is None:
        return None
    try:
        module = spec.loader.create_module(spec)
        if module is None:  # pragma: no cover - an extension loader always makes the module
            return None
        module.__spec__ = spec
        module.__loader__ = spec.loader
        spec.loader.exec_module(module)
    except ImportError:  # built for another interpreter: the package says so in its own words
        return None
    sys.modules[_BACKEND] = module
    return module


def backend_module() -> ModuleType:
    """Return the module the names come from: the C backend, or the package where it decided."""
    backend = _load_backend()
    if backend is not None:
        return backend
    import zstandard  # noqa: PLC0415  # the package decides (see the module docstring)

    return zstandard


if TYPE_CHECKING:
    from zstandard import ZstdCompressor, ZstdDecompressor, ZstdError
else:
    _module = backend_module()
    ZstdCompressor = _module.ZstdCompressor
    ZstdDecompressor = _module.ZstdDecompressor
    ZstdError = _module.ZstdError
