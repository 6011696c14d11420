"""What ``inspect`` shows of an artifact's signatures and attestations.

:func:`examine` reads them and, given keys, checks them with the one verifier,
:meth:`artifactd.trust.policy.TrustPolicy.check`. Apart from the policy so
that a restore, which plans through :mod:`artifactd.trust.policy`, never loads
what only ``inspect`` shows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from artifactd.errors import TrustError
from artifactd.trust.policy import TrustPolicy
from artifactd.trust.provenance import summary

if TYPE_CHECKING:
    from artifactd.stores import Store
    from artifactd.trust.keys import PublicKey


@dataclass
class SignatureInfo:
    """One signature as ``inspect`` shows it."""

    layer: str
    names: str | None
    #: The key id that verified it (only with keys given).
    verified_by: str | None
    problem: str | None


@dataclass
class TrustReport:
    """Signatures and attestations of one manifest, checked against keys when given."""

    digest: str
    keys: list[str]
    signatures: list[SignatureInfo]
    attestations: list[dict[str, Any]]
    #: With keys: the key that verified the signature, else None.
    verified_by: str | None = None
    #: With keys: why verification failed (a :class:`TrustError`'s message and reason).
    error: str | None = None
    reason: str | None = None


def examine(store: Store, digest: str, keys: Sequence[PublicKey] = ()) -> TrustReport:
    """Read ``digest``'s signatures and attestations; check them against ``keys`` if any."""
    # lazy: inspecting signatures is inspect's work, never a plain restore's
    from artifactd.trust.signatures import (  # noqa: PLC0415
        Attestation,
        SignatureLayer,
        _verifies,
        read_attestations,
        read_signatures,
    )

    infos = []
    try:
        sigs = read_signatures(store, digest)
    except TrustError as exc:  # unreadable: shown as such, never a crash of inspect
        sigs = [SignatureLayer("", b"", None, None, exc.message)]
    for sig in sigs:
        by = None
        if sig.names == digest and sig.signature is not None:
            by = next((k.id for k in keys if _verifies(k, sig.signature, sig.payload)), None)
        problem = sig.problem
        if problem is None and sig.names != digest:
            problem = f"signs another digest ({sig.names})"
        elif problem is None and keys and by is None:
            problem = "no given key verifies it"
        infos.append(SignatureInfo(sig.layer, sig.names, by, problem))
    try:
        found = read_attestations(store, digest, keys)
    except TrustError as exc:
        found = [Attestation("", "", None, problem=exc.message)]
    atts = [
        {
            "layer": a.layer,
            "predicate_type": a.predicate_type,
            "signed_by": a.signed_by,
            "problem": a.problem,
            "summary": summary(a.predicate),
        }
        for a in found
    ]
    report = TrustReport(digest, [k.id for k in keys], infos, atts)
    if keys:
        try:
            report.verified_by = TrustPolicy(tuple(keys)).check(store, digest)
        except TrustError as exc:
            report.error, report.reason = exc.message, exc.reason
    return report
