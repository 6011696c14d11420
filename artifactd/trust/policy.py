"""Verification policy: whether a digest may be installed, re-signed or shown as trusted.

:class:`TrustPolicy` is the verifier: :meth:`TrustPolicy.check` returns the id
of the key that signed the digest, or raises :class:`TrustError` saying why
not (no signature, signed for another digest, no key of the policy verifies,
an unreadable signature). There is no "warn" mode: without a policy nothing is
checked, and with one nothing unverified passes.

It reads signatures with :mod:`artifactd.trust.signatures` and never writes one.
Opening a store by reference to inspect or sign an artifact is the store
stage's (:func:`artifactd.stores.artifacts.inspect_ref`,
:func:`artifactd.stores.artifacts.sign_ref`, which signs only what
:func:`vouch` lets through): this stage is handed a store, never opens one.
"""

from __future__ import annotations

from artifactd.errors import TrustError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from artifactd.stores import Store
    from artifactd.trust.keys import PublicKey


# --------------------------------------------------------------------------
# Verifying
# --------------------------------------------------------------------------


class TrustPolicy:
    """Verify before install: every manifest must be signed by one of ``keys``.

    A plain immutable class, not a dataclass: a restore imports this module to
    plan, and :mod:`dataclasses` would cost it a tenth of its start-up.
    """

    __slots__ = ("keys",)
    keys: tuple[PublicKey, ...]

    def __init__(self, keys: tuple[PublicKey, ...]) -> None:
        object.__setattr__(self, "keys", tuple(keys))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"a TrustPolicy is immutable: cannot set {name!r}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TrustPolicy) and other.keys == self.keys

    def __hash__(self) -> int:
        return hash(self.keys)

    def __repr__(self) -> str:
        return f"TrustPolicy(keys={self.keys!r})"

    @classmethod
    def from_specs(cls, specs: Sequence[str]) -> TrustPolicy | None:
        """Load the keys the specs name; None (no policy) when there are none."""
        if not specs:
            return None
        # lazy: a restore without keys plans through this module and never reads a key
        from artifactd.trust.keys import load_public_keys  # noqa: PLC0415

        return cls(tuple(load_public_keys(specs)))

    @property
    def key_ids(self) -> list[str]:
        """The ids of the policy's keys."""
        return [k.id for k in self.keys]

    def check(self, store: Store, digest: str, *, what: str | None = None) -> str:
        """Return the id of a key that signed exactly ``digest`` in ``store``, or raise.

        Raises :class:`TrustError` (``reason``: ``unsigned``, ``wrong_digest``,
        ``unknown_key``, ``malformed``); reads the signature manifest and its
        payload blobs only (a few KiB), never a layer of the artifact.
        """
        # lazy: only a policy with keys reads signatures; a restore without one plans
        # through this module (UNSAFE_NO_VERIFICATION) and never loads them
        from artifactd.trust.signatures import (  # noqa: PLC0415
            _verifies,
            attached_tag,
            read_signatures,
        )

        name = what or f"{store.ref}@{digest}"
        sigs = read_signatures(store, digest)
        if not sigs:
            raise TrustError(
                f"{name} is not signed: {store.ref} has no {attached_tag(digest, 'sig')}",
                reason="unsigned",
                hint="sign it at publish time (--sign-key), or restore from a store that keeps "
                "signatures (`artifactd copy` carries them)",
            )
        others: list[str] = []
        problems: list[str] = []
        for sig in sigs:
            if sig.names is None or sig.signature is None:
                problems.append(sig.problem or "unreadable")
                continue
            if sig.names != digest:
                others.append(sig.names)
                continue
            for key in self.keys:
                if _verifies(key, sig.signature, sig.payload):
                    return key.id
            problems.append("no key verifies it")
        if any(p == "no key verifies it" for p in problems):
            ids = ", ".join(k.id[:19] for k in self.keys)
            raise TrustError(
                f"{name}: its signature does not verify with any of the {len(self.keys)} "
                f"key(s) given ({ids}...): signed by another key, or the signature was altered",
                reason="unknown_key",
                hint="pass the publisher's public key (--verify-key, repeatable for rotation)",
            )
        if others:
            raise TrustError(
                f"{name}: the signature under {attached_tag(digest, 'sig')} is for another "
                f"digest ({others[0]}), not {digest}",
                reason="wrong_digest",
                hint="someone copied a signature onto this artifact; do not trust its tag",
            )
        raise TrustError(
            f"{name}: its signature cannot be read ({problems[0]})", reason="malformed"
        )


class UnsafeNoVerification:
    """The explicit choice to act on what a store holds without verifying it first.

    Two acts rest on a store's content, and each takes a :data:`Basis`: a
    :class:`TrustPolicy` the content must verify under first, or
    :data:`UNSAFE_NO_VERIFICATION`, named so that a call site reads as unsafe
    (after sigstore-python's ``UnsafeNoOp`` policy). Neither defaults to it.

    * Re-signing (:func:`vouch`, ``copy --sign-key``, ``sign``): signing says
      "this key vouches for these bytes", and re-signing a store's content
      unchecked launders it (an artifact anyone pushed to staging would leave a
      promotion with the production signature).
      :func:`artifactd.stores.artifacts.sign_ref` requires a basis, and
      :func:`artifactd.stores.artifacts.copy_between` refuses to sign without one.
    * Restoring (:func:`artifactd.restore.resolve.plan_restore`, and the
      ``verify`` gate's restores): installing what a tag names. A restore with
      no ``--verify-key`` configured installs unverified, and
      :func:`verification` is the one place that says so.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNSAFE_NO_VERIFICATION"

    def check(self, store: Store, digest: str, *, what: str | None = None) -> None:
        """Check nothing and return None: no key verified ``digest`` (the opt-out's check)."""
        del store, digest, what


#: Act without verifying: sign (``--sign-unverified``: the signer vouches by
#: other means), or restore with no ``--verify-key`` configured.
UNSAFE_NO_VERIFICATION = UnsafeNoVerification()
#: What a re-signing or a restore rests on: a policy the content verifies
#: under, or the explicit opt-out.
Basis = TrustPolicy | UnsafeNoVerification


def verification(specs: Sequence[str]) -> Basis:
    """Return what a restore installs under: the keys ``specs`` name, else the unsafe opt-out.

    The one place that decides that a restore with no key configured
    (``--verify-key``, ``ARTIFACTD_VERIFY_KEY``) verifies nothing: every
    restore's caller (``restore``, ``verify``) builds its basis here. Raises
    :class:`~artifactd.errors.ConfigError` for a key that cannot be loaded.
    """
    policy = TrustPolicy.from_specs(specs)
    return UNSAFE_NO_VERIFICATION if policy is None else policy


def checked_basis(trust: object, what: str) -> Basis:
    """Return ``trust`` if it is a :data:`Basis`; raise :class:`TypeError` if not.

    For the run-time callers mypy does not see: ``None`` (the old spelling of
    "verify nothing") is refused, not read as :data:`UNSAFE_NO_VERIFICATION`.
    """
    if isinstance(trust, TrustPolicy | UnsafeNoVerification):
        return trust
    raise TypeError(
        f"{what} needs trust=TrustPolicy(...) or trust=UNSAFE_NO_VERIFICATION, not {trust!r}"
    )


def vouch(store: Store, digests: Iterable[str], basis: Basis) -> dict[str, str | None]:
    """Check every one of ``digests`` in ``store`` under ``basis``, all before any is signed.

    Returns each digest with the id of the key that verified it (None under
    :data:`UNSAFE_NO_VERIFICATION`, which checks nothing). Raises the first
    :class:`TrustError`: the caller then signs nothing at all, not even the
    digests that did verify.
    """
    seen: dict[str, str | None] = {}
    for digest in digests:
        if digest and digest not in seen:
            seen[digest] = _vouched(store, digest, basis)
    return seen


def _vouched(store: Store, digest: str, basis: Basis) -> str | None:
    if not isinstance(basis, TrustPolicy):
        return None
    try:
        return basis.check(store, digest)
    except TrustError as exc:
        raise TrustError(
            f"{exc.message} (refused before anything was written or signed)",
            reason=exc.reason,
            hint="re-sign only what the publisher's key verifies: find out who pushed it, "
            "or pass the key that signed it (--verify-key)",
        ) from None
