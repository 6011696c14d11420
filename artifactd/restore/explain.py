"""Explain a miss: read two diff operands and say what differs and which families it invalidates.

``artifactd diff A B`` reads each operand the way an operator names it:
``local`` (probe this machine), a JSON file (the output of ``artifactd
fingerprint --json``, a bare fingerprint, or an artifact config), or an
artifact reference (``oci:DIR:TAG``, ``HOST/REPO:TAG``, ``...@sha256:...``),
then compares them with :mod:`artifactd.fingerprint.diff`, the pure comparison.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass

from artifactd.errors import ConfigError, UsageError
from artifactd.fingerprint.diff import FactDiff, FingerprintDiff, Side, diff, facts_diff
from artifactd.fingerprint.model import Fingerprint, from_raw
from artifactd.fingerprint.probe import probe_request
from artifactd.format.config import ArtifactConfig
from artifactd.fsutil import InputFileError, read_regular
from artifactd.stores import open_store, parse_artifact_ref
from artifactd.stores.artifacts import read_artifact
from artifactd.stores.credentials import check_unbound_pair
from artifactd.stores.reading import MAX_CONFIG_BYTES


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
