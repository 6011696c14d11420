"""Explain why two fingerprints differ and which cache families that invalidates.

A diff compares two *sides*. A side is read from an operand the way an
operator names it: ``local`` (probe this machine), a JSON file (the output of
``artifactd fingerprint --json``, a bare fingerprint, or an artifact config),
or an artifact reference (``oci:DIR:TAG``, ``HOST/REPO:TAG``, ``...@sha256:...``).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from artifactd.errors import ConfigError, UsageError
from artifactd.families import Family, select_families
from artifactd.fingerprint.model import Fingerprint, flatten, from_raw
from artifactd.fingerprint.probe import probe_request
from artifactd.format.config import ArtifactConfig
from artifactd.fsutil import InputFileError, read_regular
from artifactd.stores import open_store, parse_artifact_ref
from artifactd.stores.artifacts import MAX_CONFIG_BYTES, read_artifact
from artifactd.stores.credentials import check_unbound_pair


@dataclass(frozen=True)
class FieldDiff:
    """One dotted field whose value differs between side A and side B."""

    path: str
    a: Any
    b: Any


@dataclass(frozen=True)
class FamilyVerdict:
    """Whether a cache built on side A would be valid on side B, and why not."""

    family: str
    verdict: Literal["hit", "miss"]
    deciding: list[FieldDiff] = field(default_factory=list)


@dataclass(frozen=True)
class FingerprintDiff:
    """Field-by-field comparison of two fingerprints."""

    a_hash: str
    b_hash: str
    fields: list[FieldDiff]
    informational: list[FieldDiff]
    families: list[FamilyVerdict]

    @property
    def identical(self) -> bool:
        """Whether the hashed parts are equal."""
        return self.a_hash == self.b_hash


def differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[FieldDiff]:
    """Return the dotted fields whose values differ between two flattened documents."""
    return [
        FieldDiff(path=k, a=a.get(k), b=b.get(k))
        for k in sorted(set(a) | set(b))
        if a.get(k) != b.get(k)
    ]


def family_verdict(family: Family, a: Fingerprint, b: Fingerprint) -> FamilyVerdict:
    """Compare the scope of one family on both sides."""
    if a.scope_key(family.name, family.scope, family.scope_revision) == b.scope_key(
        family.name, family.scope, family.scope_revision
    ):
        return FamilyVerdict(family.name, "hit")
    deciding = differences(a.select(family.scope), b.select(family.scope))
    return FamilyVerdict(family.name, "miss", deciding)


def diff(a: Fingerprint, b: Fingerprint, families: Sequence[str] | None = None) -> FingerprintDiff:
    """Return every differing field and a per-family hit/miss verdict."""
    return FingerprintDiff(
        a_hash=a.hash,
        b_hash=b.hash,
        fields=differences(a.flatten(), b.flatten()),
        informational=differences(
            flatten(a.info.model_dump(mode="json"), "info."),
            flatten(b.info.model_dump(mode="json"), "info."),
        ),
        families=[family_verdict(f, a, b) for f in select_families(families)],
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
# Sides: what an operand names
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


def load_side(
    spec: str,
    *,
    gpu_arch: str | None = None,
    workload: Sequence[str] = (),
    overrides: Sequence[str] = (),
    insecure: bool = False,
) -> Side:
    """Read one diff operand: ``local``, a JSON file, or an artifact reference.

    ``gpu_arch``, ``workload`` and ``overrides`` (``PATH=VALUE``) shape the
    ``local`` side only. A file is sniffed by its keys: an artifact config has
    ``fingerprint`` and ``layers``, ``fingerprint --json`` output ``fingerprint``
    and ``hash``; anything else is read as a bare fingerprint.
    """
    if spec == "local":
        raw = probe_request(gpu_arch=gpu_arch, workload=workload, overrides=overrides)
        return Side("local", from_raw(raw))
    if names_file(spec):
        try:
            data = read_regular(spec, MAX_CONFIG_BYTES, follow=True)
        except InputFileError as exc:
            raise ConfigError(
                f"{spec} {exc.problem}",
                hint="give a readable JSON file from `artifactd fingerprint --json`, "
                "or an artifact reference such as oci:DIR:TAG",
            ) from None
        return _side_from_file(spec, data)
    return _side_from_store(spec, insecure=insecure)


def names_file(spec: str) -> bool:
    """Whether a diff operand names a regular file (a path that cannot be looked up does not)."""
    try:
        return stat.S_ISREG(os.stat(spec).st_mode)
    except (OSError, ValueError):  # too long a name, a search permission, a NUL byte
        return False


def load_sides(
    a: str,
    b: str,
    *,
    gpu_arch: str | None = None,
    workload: Sequence[str] = (),
    overrides: Sequence[str] = (),
    insecure: bool = False,
) -> tuple[Side, Side]:
    """Read both operands; ``overrides`` shape B when B is ``local``, else A.

    ``diff local local --set driver.version=X`` thus asks what a driver
    upgrade here would invalidate: a cache built as things are (A), used after
    the change (B).
    """
    check_unbound_pair(s for s in (a, b) if s != "local" and not names_file(s))
    on_b = b == "local"
    side_a = load_side(
        a,
        gpu_arch=gpu_arch,
        workload=workload,
        overrides=() if on_b else overrides,
        insecure=insecure,
    )
    side_b = load_side(
        b,
        gpu_arch=gpu_arch,
        workload=workload,
        overrides=overrides if on_b else (),
        insecure=insecure,
    )
    return side_a, side_b


def _side_from_file(spec: str, data: bytes) -> Side:
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"{spec} is not JSON: {exc}",
            hint="save one with `artifactd fingerprint --json > FILE`",
        ) from None
    if isinstance(doc, dict) and "fingerprint" in doc and "layers" in doc:
        config = ArtifactConfig.from_json(data, source=spec)
        return Side(spec, config.fingerprint, {r.family: r.facts for r in config.layers})
    if isinstance(doc, dict) and "fingerprint" in doc and "hash" in doc:
        return Side(spec, Fingerprint.from_json(json.dumps(doc["fingerprint"]), source=spec))
    return Side(spec, Fingerprint.from_json(data, source=spec))


def _side_from_store(spec: str, *, insecure: bool) -> Side:
    ref = parse_artifact_ref(spec)
    if ref.reference is None:
        raise UsageError(
            f"cannot read {spec!r} as a fingerprint",
            hint="use `local`, a JSON file from `artifactd fingerprint --json`, "
            "or an artifact reference such as oci:DIR:TAG",
        )
    with open_store(ref.store, insecure=insecure) as st:
        art = read_artifact(st, ref.reference)
    if art is None:
        raise UsageError(f"{spec}: no such artifact")
    return Side(spec, art.config.fingerprint, {r.family: r.facts for r in art.config.layers})


@dataclass(frozen=True)
class Explanation:
    """Two sides read, their field-by-field diff and the recorded facts that differ."""

    a: Side
    b: Side
    result: FingerprintDiff
    facts: list[FactDiff]


def explain(
    a: str,
    b: str,
    *,
    gpu_arch: str | None = None,
    workload: Sequence[str] = (),
    overrides: Sequence[str] = (),
    families: Sequence[str] | None = None,
    insecure: bool = False,
) -> Explanation:
    """Read operands ``a`` and ``b`` (:func:`load_sides`) and explain what differs.

    What ``artifactd diff`` does: a cache built on A is judged for use on B,
    for ``families`` (None: all).
    """
    side_a, side_b = load_sides(
        a, b, gpu_arch=gpu_arch, workload=workload, overrides=overrides, insecure=insecure
    )
    return Explanation(
        side_a,
        side_b,
        diff(side_a.fingerprint, side_b.fingerprint, families),
        facts_diff(side_a.facts, side_b.facts),
    )
