"""The cache families artifactd knows, by name."""

from __future__ import annotations

from collections.abc import Iterable

from artifactd.errors import UsageError
from artifactd.families.base import Component, Family, Located
from artifactd.families.cudajit import CudaJitFamily
from artifactd.families.cutedsl import CuteDSLFamily
from artifactd.families.deepgemm import DeepGEMMFamily
from artifactd.families.flashinfer import FlashInferFamily
from artifactd.families.generic import GenericFamily
from artifactd.families.inductor import InductorFamily
from artifactd.families.sglang import SGLangFamily
from artifactd.families.tilelang import TileLangFamily
from artifactd.families.triton import TritonFamily
from artifactd.families.vllm import VLLMFamily

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        TritonFamily(),
        InductorFamily(),
        GenericFamily(),
        DeepGEMMFamily(),
        TileLangFamily(),
        CuteDSLFamily(),
        CudaJitFamily(),
        FlashInferFamily(),
        VLLMFamily(),
        SGLangFamily(),
    )
}

__all__ = ["FAMILIES", "Component", "Family", "Located", "get_family", "select_families"]


def get_family(name: str) -> Family:
    """Return the family called ``name`` or raise :class:`UsageError`."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise UsageError(
            f"unknown cache family {name!r}",
            hint=f"known families: {', '.join(sorted(FAMILIES))}",
        ) from None


def select_families(names: Iterable[str] | None) -> list[Family]:
    """Return the named families (all when ``names`` is empty or None), in a stable order."""
    wanted = [n.strip() for n in (names or ()) if n.strip()]
    if not wanted:
        return [FAMILIES[n] for n in sorted(FAMILIES)]
    return [get_family(n) for n in sorted(set(wanted))]


def scope_table() -> str:
    """Return the family x dimension table (markdown) that the README documents.

    A test keeps the README's copy equal to this, so the documented scopes are
    the ones the code hashes.
    """
    rows = ["| family | restored to (env) | fingerprint scope |", "| --- | --- | --- |"]
    for name in sorted(FAMILIES):
        fam = FAMILIES[name]
        env = ", ".join(sorted({k for c in fam.components for k in c.env}))
        scope = ", ".join(f"`{d}`" for d in fam.scope)
        rows.append(f"| `{name}` | {env} | {scope} |")
    return "\n".join(rows) + "\n"
