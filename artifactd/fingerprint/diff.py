"""Compare two fingerprints: which fields differ and which cache families that invalidates.

A diff compares two *sides* (:class:`Side`: a fingerprint and the facts an
artifact recorded). This module is the pure comparison; reading a side from
an operand (``local``, a JSON file, an artifact in a store) is
:mod:`artifactd.restore.explain`'s, a stage above the stores it reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from artifactd.families import Family, select_families
from artifactd.fingerprint.model import Fingerprint, flatten


@dataclass(frozen=True)
class FieldDiff:
    """One dotted field whose value differs between side A and side B."""

    path: str
    a: Any
    b: Any


#: Whether a family's scope keys agree: ``hit`` (a cache built on one side is
#: valid on the other) or ``miss``. A restore's plan says the same of the local
#: fingerprint and an artifact. The *pod's* verdict (was the restored cache
#: used?) is another idea: :data:`artifactd.pod.verdict.Verdict`.
ScopeMatch = Literal["hit", "miss"]


@dataclass(frozen=True)
class FamilyMatch:
    """Whether a cache built on side A would be valid on side B, and why not.

    ``verdict`` keeps the name of the ``diff --json`` key users read.
    """

    family: str
    verdict: ScopeMatch
    deciding: list[FieldDiff] = field(default_factory=list)


@dataclass(frozen=True)
class FingerprintDiff:
    """Field-by-field comparison of two fingerprints."""

    a_hash: str
    b_hash: str
    fields: list[FieldDiff]
    informational: list[FieldDiff]
    families: list[FamilyMatch]

    @property
    def identical(self) -> bool:
        """Whether the hashed parts are equal."""
        return self.a_hash == self.b_hash


def differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[FieldDiff]:
    """Return the dotted fields whose values differ between two flattened documents.

    An empty mapping is a leaf when flattened (``workload: {}``) while the
    other side's fields sit below it (``workload.model``): that pair is one
    difference, shown by the fields below, not a row of its own.
    """
    keys = sorted(set(a) | set(b))
    return [
        FieldDiff(path=k, a=a.get(k), b=b.get(k))
        for k in keys
        if a.get(k) != b.get(k) and not _empty_above(k, a.get(k), b.get(k), keys)
    ]


def _empty_above(key: str, a: Any, b: Any, keys: Sequence[str]) -> bool:
    """Whether ``key`` is an empty mapping on one side, absent on the other with fields below."""
    if not ((a == {} and b is None) or (b == {} and a is None)):
        return False
    return any(k.startswith(key + ".") for k in keys)


def family_match(family: Family, a: Fingerprint, b: Fingerprint) -> FamilyMatch:
    """Compare the scope of one family on both sides."""
    if a.scope_key(family.name, family.scope, family.scope_revision) == b.scope_key(
        family.name, family.scope, family.scope_revision
    ):
        return FamilyMatch(family.name, "hit")
    deciding = differences(a.select(family.scope), b.select(family.scope))
    return FamilyMatch(family.name, "miss", deciding)


def diff(a: Fingerprint, b: Fingerprint, families: Sequence[str] | None = None) -> FingerprintDiff:
    """Return every differing field and whether each family's scope keys match."""
    return FingerprintDiff(
        a_hash=a.hash,
        b_hash=b.hash,
        fields=differences(a.flatten(), b.flatten()),
        informational=differences(
            flatten(a.info.model_dump(mode="json"), "info."),
            flatten(b.info.model_dump(mode="json"), "info."),
        ),
        families=[family_match(f, a, b) for f in select_families(families)],
    )


@dataclass(frozen=True)
class FactDiff:
    """One differing value among the facts two artifacts recorded for a family."""

    family: str
    component: str
    path: str
    a: Any
    b: Any


def facts_diff(
    a: Mapping[str, Mapping[str, Any]], b: Mapping[str, Mapping[str, Any]]
) -> list[FactDiff]:
    """Compare per-family facts (``{family: {component: data}}``) present on both sides.

    This is where volatile values hide: vLLM hashes every ``VLLM_*`` variable
    and its whole config into its cache dir name, so two artifacts whose
    fingerprints agree can still disagree on a pod IP or a port here.
    """
    out: list[FactDiff] = []
    for family in sorted(set(a) & set(b)):
        for component in sorted(set(a[family]) & set(b[family])):
            fa = flatten(a[family][component])
            fb = flatten(b[family][component])
            out.extend(
                FactDiff(family, component, key, fa.get(key), fb.get(key))
                for key in sorted(set(fa) | set(fb))
                if fa.get(key) != fb.get(key)
            )
    return out


# --------------------------------------------------------------------------
# Sides: the two operands, read (reading them is restore.explain's)
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Side:
    """One operand of a diff, read: its name, fingerprint and recorded facts.

    ``facts`` are the per-family facts an artifact recorded
    (``{family: {component: data}}``); empty for ``local`` and fingerprint files.
    """

    name: str
    fingerprint: Fingerprint
    facts: dict[str, dict[str, Any]] = field(default_factory=dict)
