"""The cache families artifactd knows, by name.

:data:`FAMILIES` maps each name to its :class:`Family`. The names are known
without importing anything; a family's module (and :mod:`the base
<artifactd.families.base>`) is imported the first time the family is read, so
a command that needs only names (a no-op restore checks which families it
selected) never loads the code that harvests them.

Modules:

* :mod:`~artifactd.families.base`: the :class:`Family` base: what every family
  declares, and the machinery they share.
* :mod:`~artifactd.families.triton`: Triton's kernel cache.
* :mod:`~artifactd.families.inductor`: torch.compile / Inductor's cache and its PCH.
* :mod:`~artifactd.families.generic`: loose compiled binaries (``.cubin``, ``.so``...).
* :mod:`~artifactd.families.deepgemm`: DeepGEMM's JIT kernel cache.
* :mod:`~artifactd.families.tilelang`: TileLang's kernel cache.
* :mod:`~artifactd.families.cutedsl`: CuTe DSL's and FlashAttention-4's caches.
* :mod:`~artifactd.families.cudajit`: the CUDA driver's PTX JIT cache (``cuda-jit``).
* :mod:`~artifactd.families.flashinfer`: FlashInfer's JIT workspace.
* :mod:`~artifactd.families.vllm`: vLLM's caches under ``VLLM_CACHE_ROOT``.
* :mod:`~artifactd.families.vllmkey`: vLLM's cache key recomputed from its recorded factors.
* :mod:`~artifactd.families.sglang`: SGLang's kernel caches.
* :mod:`~artifactd.families.layouts`: cache trees more than one family ships, and their rules.
* :mod:`~artifactd.families.tree`: the one walk of a component root, to pack it and to lint it.
* :mod:`~artifactd.families.ninja`: ``build.ninja`` files: what ninja would rebuild, which
  paths its build lines pin.
* :mod:`~artifactd.families.ninjarecords`: what ninja recorded beside them, moved to another root.
"""

from __future__ import annotations

import sys
from _collections_abc import Mapping  # collections.abc's own: importing it loads collections

from artifactd.errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from artifactd.families.base import Component, Family, Located

#: Every family's name, module and class, in the order :data:`FAMILIES` lists them.
_DEFINED_IN: dict[str, tuple[str, str]] = {
    "triton": ("triton", "TritonFamily"),
    "inductor": ("inductor", "InductorFamily"),
    "generic": ("generic", "GenericFamily"),
    "deepgemm": ("deepgemm", "DeepGEMMFamily"),
    "tilelang": ("tilelang", "TileLangFamily"),
    "cutedsl": ("cutedsl", "CuteDSLFamily"),
    "cuda-jit": ("cudajit", "CudaJitFamily"),
    "flashinfer": ("flashinfer", "FlashInferFamily"),
    "vllm": ("vllm", "VLLMFamily"),
    "sglang": ("sglang", "SGLangFamily"),
}


class _Registry(Mapping[str, "Family"]):
    """A read-only mapping of names to families that imports each family on first read."""

    def __init__(self, defined_in: Mapping[str, tuple[str, str]]) -> None:
        self._defined_in = defined_in
        self._loaded: dict[str, Family] = {}

    def __getitem__(self, name: str) -> Family:
        family = self._loaded.get(name)
        if family is None:
            module, cls = self._defined_in[name]
            name_of_module = f"artifactd.families.{module}"
            __import__(name_of_module)  # importlib.import_module, without loading importlib
            new = getattr(sys.modules[name_of_module], cls)()
            # Restore's fetch threads may race here: the first instance stored wins.
            family = self._loaded.setdefault(name, new)
        return family

    def __iter__(self) -> Iterator[str]:
        return iter(self._defined_in)

    def __len__(self) -> int:
        return len(self._defined_in)

    def __contains__(self, name: object) -> bool:
        return name in self._defined_in


FAMILIES: Mapping[str, Family] = _Registry(_DEFINED_IN)
_BASE_NAMES = frozenset({"Component", "Family", "Located"})

__all__ = [
    "FAMILIES",
    "Component",
    "Family",
    "Located",
    "get_family",
    "select_families",
    "select_names",
]


def __getattr__(name: str) -> object:
    if name in _BASE_NAMES:
        # lazy: the base classes load with the first family read: a no-op restore needs neither.
        from artifactd.families import base  # noqa: PLC0415

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _unknown(name: str) -> UsageError:
    return UsageError(
        f"unknown cache family {name!r}",
        hint=f"known families: {', '.join(sorted(FAMILIES))}",
    )


def get_family(name: str) -> Family:
    """Return the family called ``name`` or raise :class:`UsageError`."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise _unknown(name) from None


def select_names(names: Iterable[str] | None) -> list[str]:
    """Return the names :func:`select_families` selects, importing no family.

    Every name when ``names`` is None; an empty ``names`` selects none. Blank
    names are ignored; an unknown one raises :class:`UsageError`.
    """
    if names is None:
        return sorted(FAMILIES)
    wanted = sorted({n.strip() for n in names if n.strip()})
    for name in wanted:
        if name not in FAMILIES:
            raise _unknown(name)
    return wanted


def select_families(names: Iterable[str] | None) -> list[Family]:
    """Return the named families in a stable order: every family when ``names`` is None.

    An empty ``names`` selects none: a caller whose empty list means "all"
    (a matrix without ``families``) says so by passing None. Blank names are
    ignored; an unknown one raises :class:`UsageError`.
    """
    return [FAMILIES[n] for n in select_names(names)]


def scope_table() -> str:
    """Return the family x dimension table (markdown) that docs/reference/fingerprint.md documents.

    A test keeps that copy equal to this, so the documented scopes are
    the ones the code hashes.
    """
    rows = ["| family | restored to (env) | fingerprint scope |", "| --- | --- | --- |"]
    for name in sorted(FAMILIES):
        fam = FAMILIES[name]
        env = ", ".join(sorted({k for c in fam.components for k in c.env}))
        scope = ", ".join(f"`{d}`" for d in fam.scope)
        rows.append(f"| `{name}` | {env} | {scope} |")
    return "\n".join(rows) + "\n"
