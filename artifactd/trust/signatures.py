"""Signatures and attestations in cosign's tag layout; verification that fails closed.

A restored cache is code (Inductor's ``.so`` files are loaded into the engine,
cubins run on the GPU), so whoever can write to a store could run code in
every pod. Digests catch corruption, not a malicious publisher; signatures do.
artifactd signs and verifies the way cosign does with a key, so each tool
reads the other's work (the exact bytes: ``registry-schema/FORMAT.md``):

* **Signature**: for a manifest ``sha256:<hex>``, a manifest tagged
  ``sha256-<hex>.sig`` in the same repository. Each of its layers is one
  signature: the blob is cosign's *simple signing* payload, which names the
  signed manifest digest (:func:`signing_payload`), and the layer annotation
  ``dev.cosignproject.cosign/signature`` holds the base64 ECDSA-P256-SHA256
  signature (DER) over the payload's bytes. More signers add more layers.
* **Attestation**: ``sha256-<hex>.att``, each layer a DSSE envelope whose
  payload is an in-toto Statement about that digest (the build provenance:
  :mod:`artifactd.trust.provenance`), signed over DSSE's pre-authentication encoding.

The verifier is :mod:`artifactd.trust.policy`.
"""

from __future__ import annotations

import base64
import json
import re
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from artifactd.errors import ArtifactdError, IntegrityError, NotFoundError, TrustError
from artifactd.format.imagemanifest import Descriptor, ImageManifest
from artifactd.format.oci import CONFIG_MEDIA_TYPE, MANIFEST_MEDIA_TYPE, is_digest
from artifactd.fsutil import utf8_argument
from artifactd.hashing import canonical_json, digest_of

if TYPE_CHECKING:
    from artifactd.format.imagemanifest import Descriptor, ImageManifest
    from artifactd.stores import Store
    from artifactd.trust.keys import PrivateKey, PublicKey

#: The layer media type of a signature (the simple signing payload).
SIMPLESIGNING_MEDIA_TYPE = "application/vnd.dev.cosign.simplesigning.v1+json"
#: The layer media type of an attestation (a DSSE envelope).
DSSE_MEDIA_TYPE = "application/vnd.dsse.envelope.v1+json"
#: The layer annotation that holds the base64 signature (empty on attestations).
ANN_SIGNATURE = "dev.cosignproject.cosign/signature"
#: The layer annotation naming an attestation's predicate type.
ANN_PREDICATE_TYPE = "predicateType"
#: ``critical.type`` of a simple signing payload.
SIGNATURE_TYPE = "cosign container image signature"
#: DSSE ``payloadType`` of an in-toto Statement.
IN_TOTO_PAYLOAD_TYPE = "application/vnd.in-toto+json"

#: What an attached artifact holds: a signature (``.sig``) or an attestation (``.att``).
AttachedKind = Literal["sig", "att"]
_ATTACHED = re.compile(r"^sha256-([0-9a-f]{64})\.(sig|att)$")
#: Limits on what is read from a store before it is verified.
MAX_LAYERS = 64
MAX_PAYLOAD = 64 << 10
MAX_ENVELOPE = 4 << 20
MAX_ENVELOPE_SIGNATURES = 8


def attached_tag(digest: str, kind: AttachedKind) -> str:
    """Return cosign's tag for ``digest``'s signature or attestation: ``sha256-<hex>.sig``."""
    if not is_digest(digest):
        raise IntegrityError(f"malformed digest {digest!r}")
    return f"{digest.replace(':', '-')}.{kind}"


def parse_attached_tag(tag: str) -> tuple[str, AttachedKind] | None:
    """Return ``(subject digest, kind)`` for a ``sha256-<hex>.sig|.att`` tag, else None."""
    match = _ATTACHED.match(tag)
    if match is None:
        return None
    kind: AttachedKind = "sig" if match.group(2) == "sig" else "att"
    return f"sha256:{match.group(1)}", kind


def signing_payload(digest: str, reference: str) -> bytes:
    """Return cosign's simple signing payload for ``digest``, byte for byte as cosign writes it.

    ``{"critical":{"identity":{"docker-reference":REF},"image":{"docker-manifest-digest":
    DIGEST},"type":"cosign container image signature"},"optional":null}``: Go's
    encoding of cosign's structs (fields in this order, no spaces). Verifiers
    parse it, so the order is a courtesy to byte-level diffing, not a rule.
    A ``reference`` that is not UTF-8 text (a layout under a path that is not)
    cannot be named: :class:`~artifactd.errors.UsageError`, before anything is signed.
    """
    utf8_argument(reference, "the store a signature names")
    doc = {
        "critical": {
            "identity": {"docker-reference": reference},
            "image": {"docker-manifest-digest": digest},
            "type": SIGNATURE_TYPE,
        },
        "optional": None,
    }
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def pae(payload_type: str, body: bytes) -> bytes:
    """DSSE's pre-authentication encoding, the bytes a DSSE signature covers."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(body), body)


def store_identity(store: Store) -> str:
    """Return the ``docker-reference`` a signature in ``store`` names: its repository or path."""
    return store.ref.removeprefix("oci:")


# --------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class SignatureLayer:
    """One signature read from a ``.sig`` manifest (not yet verified)."""

    layer: str
    payload: bytes
    signature: bytes | None
    #: The digest the payload names, or None when the payload is unreadable.
    names: str | None
    problem: str | None = None


@dataclass(frozen=True)
class Attestation:
    """One attestation read from a ``.att`` manifest."""

    layer: str
    predicate_type: str
    statement: dict[str, Any] | None
    #: The key that signed it, when a policy verified it.
    signed_by: str | None = None
    problem: str | None = None

    @property
    def predicate(self) -> dict[str, Any]:
        """The statement's predicate (empty when unreadable)."""
        pred = (self.statement or {}).get("predicate")
        return pred if isinstance(pred, dict) else {}


def _read_manifest(
    store: Store, tag: str, *, limit: int | None = MAX_LAYERS
) -> tuple[ImageManifest, str] | None:
    """Read an attached manifest; None when there is none, TrustError when it is not one."""
    ref = store.get_manifest(tag)
    if ref is None:
        return None
    try:
        manifest = ImageManifest.from_bytes(ref.data, source=f"{store.ref}:{tag}")
    except ArtifactdError as exc:
        raise TrustError(
            f"{store.ref}:{tag} cannot be read as a signature manifest: {exc.message}",
            reason="malformed",
        ) from None
    if limit is not None and len(manifest.layers) > limit:
        raise TrustError(
            f"{store.ref}:{tag} carries {len(manifest.layers)} layers (at most {MAX_LAYERS})",
            reason="malformed",
        )
    return manifest, ref.digest


def _read_layer(store: Store, desc: Descriptor, limit: int) -> bytes:
    return store.read_blob(desc.digest, desc.size, max_size=limit, what="signature layer")


def read_signatures(store: Store, digest: str) -> list[SignatureLayer]:
    """Return the signatures ``store`` holds for ``digest`` (unverified; [] when unsigned)."""
    found = _read_manifest(store, attached_tag(digest, "sig"))
    if found is None:
        return []
    out = []
    for desc in found[0].layers:
        if desc.media_type != SIMPLESIGNING_MEDIA_TYPE:
            continue
        out.append(_signature_layer(store, desc))
    return out


#: What makes an attached layer unreadable. A store that stops answering is
#: not among them: that is an unreachable store, not a bad signature.
_UNREADABLE = (IntegrityError, NotFoundError)


def _signature_layer(store: Store, desc: Descriptor) -> SignatureLayer:
    try:
        payload = _read_layer(store, desc, MAX_PAYLOAD)
    except _UNREADABLE as exc:
        return SignatureLayer(desc.digest, b"", None, None, f"payload unreadable: {exc.message}")
    sig_text = (desc.annotations or {}).get(ANN_SIGNATURE, "")
    try:
        signature: bytes | None = base64.b64decode(sig_text, validate=True) if sig_text else None
    except ValueError:
        signature = None
    try:
        doc = json.loads(payload)
        critical = doc["critical"]
        names = critical["image"]["docker-manifest-digest"]
        kind = critical["type"]
    except (ValueError, TypeError, KeyError):
        names = kind = None
    if not isinstance(names, str) or kind != SIGNATURE_TYPE:
        return SignatureLayer(desc.digest, payload, signature, None, "not a simple signing payload")
    problem = None if signature else "no signature annotation"
    return SignatureLayer(desc.digest, payload, signature, names, problem)


def _verifies(key: PublicKey, signature: bytes, data: bytes) -> bool:
    # lazy: a real restore loads this module to list signatures; cryptography only to check or make
    # one
    from cryptography.exceptions import InvalidSignature  # noqa: PLC0415
    from cryptography.hazmat.primitives import hashes  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415

    try:
        key.key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError):
        return False
    return True


def read_attestations(
    store: Store, digest: str, keys: Sequence[PublicKey] = ()
) -> list[Attestation]:
    """Return the attestations ``store`` holds for ``digest``, each verified against ``keys``.

    An attestation counts as signed (``signed_by``) only when its envelope is
    an in-toto Statement whose subject names ``digest`` and one of ``keys``
    verifies a DSSE signature over it.
    """
    found = _read_manifest(store, attached_tag(digest, "att"))
    if found is None:
        return []
    out = []
    for desc in found[0].layers:
        if desc.media_type != DSSE_MEDIA_TYPE:
            continue
        ptype = (desc.annotations or {}).get(ANN_PREDICATE_TYPE, "")
        try:
            envelope = json.loads(_read_layer(store, desc, MAX_ENVELOPE))
            body = base64.b64decode(envelope["payload"], validate=True)
            payload_type = envelope["payloadType"]
            # A few signatures per envelope at most: each costs a verify per key.
            sigs = [
                base64.b64decode(s["sig"], validate=True)
                for s in envelope["signatures"][:MAX_ENVELOPE_SIGNATURES]
            ]
            statement = json.loads(body)
        except (*_UNREADABLE, ValueError, TypeError, KeyError) as exc:
            why = exc.message if isinstance(exc, ArtifactdError) else "not a DSSE envelope"
            out.append(Attestation(desc.digest, ptype, None, problem=why))
            continue
        if payload_type != IN_TOTO_PAYLOAD_TYPE or not isinstance(statement, dict):
            out.append(Attestation(desc.digest, ptype, None, problem="not an in-toto Statement"))
            continue
        subjects = statement.get("subject")
        subjects = subjects if isinstance(subjects, list) else []
        about = any(
            isinstance(s, dict)
            and isinstance(s.get("digest"), dict)
            and f"sha256:{s['digest'].get('sha256')}" == digest
            for s in subjects
        )
        signed_by = None
        problem = None if about else "its subject is another digest"
        if about:
            signed = pae(payload_type, body)
            signed_by = next((k.id for k in keys for s in sigs if _verifies(k, s, signed)), None)
            if keys and signed_by is None:
                problem = "no given key verifies it"
        out.append(
            Attestation(
                desc.digest,
                str(statement.get("predicateType", ptype)),
                statement,
                signed_by,
                problem,
            )
        )
    return out


# --------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------


def _put_bytes(store: Store, data: bytes, tmp: Path) -> None:
    digest = digest_of(data)
    if store.has_blob(digest):
        return
    path = tmp / digest.replace(":", "-")
    path.write_bytes(data)
    store.put_blob(path, digest, len(data))


def _image_config(layers: Sequence[Descriptor]) -> bytes:
    """Return the config of an attached manifest: an empty image whose diff_ids are its layers."""
    doc = {
        "architecture": "",
        "config": {},
        "created": "0001-01-01T00:00:00Z",
        "history": [{"created": "0001-01-01T00:00:00Z"}],
        "os": "",
        "rootfs": {"type": "layers", "diff_ids": [d.digest for d in layers]},
    }
    return canonical_json(doc)


def _write_attached(
    store: Store, digest: str, kind: AttachedKind, layers: list[Descriptor], blobs: dict[str, bytes]
) -> str:
    """Upload ``blobs`` and write the attached manifest with ``layers``; return its digest."""
    config = _image_config(layers)
    with tempfile.TemporaryDirectory(prefix="artifactd-sign-") as tmp:
        for data in [*blobs.values(), config]:
            _put_bytes(store, data, Path(tmp))
    manifest = ImageManifest(
        config=Descriptor(media_type=CONFIG_MEDIA_TYPE, digest=digest_of(config), size=len(config)),
        layers=layers,
    )
    tag = attached_tag(digest, kind)
    return store.put_manifest(manifest.to_bytes(), MANIFEST_MEDIA_TYPE, [tag])


def _existing_layers(store: Store, digest: str, kind: AttachedKind) -> list[Descriptor]:
    """Return the layers already attached, at most the newest :data:`MAX_LAYERS` - 1.

    Room is kept for one more: a manifest re-attested at every verify would
    otherwise grow past what readers accept. The oldest go first.
    """
    try:
        found = _read_manifest(store, attached_tag(digest, kind), limit=None)
    except TrustError:
        return []  # unreadable: replaced by a readable one
    return list(found[0].layers)[-(MAX_LAYERS - 1) :] if found else []


@dataclass
class Signed:
    """What signing one manifest did."""

    digest: str
    tag: str
    key_id: str
    #: False when the key had signed this digest already (nothing written).
    added: bool


def sign(store: Store, digest: str, key: PrivateKey, *, reference: str | None = None) -> Signed:
    """Sign ``digest`` in ``store`` with ``key``, adding to any signatures already there.

    Idempotent per key: when a signature by this key over this digest is
    there already, nothing is written (ECDSA signatures differ every time, so
    signing again would only add layers).
    """
    tag = attached_tag(digest, "sig")
    public = key.public()
    try:
        existing = read_signatures(store, digest)
    except TrustError:
        existing = []  # an unreadable .sig verifies nothing: replaced by a readable one
    for sig in existing:
        if sig.names == digest and sig.signature and _verifies(public, sig.signature, sig.payload):
            return Signed(digest, tag, public.id, added=False)
    payload = signing_payload(digest, reference or store_identity(store))
    layer = Descriptor(
        media_type=SIMPLESIGNING_MEDIA_TYPE,
        digest=digest_of(payload),
        size=len(payload),
        annotations={ANN_SIGNATURE: base64.b64encode(key.sign(payload)).decode()},
    )
    layers = _existing_layers(store, digest, "sig")
    _write_attached(store, digest, "sig", [*layers, layer], {layer.digest: payload})
    return Signed(digest, tag, public.id, added=True)


def attest(store: Store, digest: str, statement: dict[str, Any], key: PrivateKey) -> str:
    """Attach ``statement`` (an in-toto Statement about ``digest``) signed with ``key``.

    The envelope goes into ``sha256-<hex>.att`` after any attestations already
    there; returns the envelope's layer digest.
    """
    body = canonical_json(statement)
    envelope = {
        "payload": base64.b64encode(body).decode(),
        "payloadType": IN_TOTO_PAYLOAD_TYPE,
        "signatures": [
            {
                "keyid": "",
                "sig": base64.b64encode(key.sign(pae(IN_TOTO_PAYLOAD_TYPE, body))).decode(),
            }
        ],
    }
    data = canonical_json(envelope)
    layer = Descriptor(
        media_type=DSSE_MEDIA_TYPE,
        digest=digest_of(data),
        size=len(data),
        annotations={ANN_SIGNATURE: "", ANN_PREDICATE_TYPE: str(statement["predicateType"])},
    )
    layers = _existing_layers(store, digest, "att")
    _write_attached(store, digest, "att", [*layers, layer], {layer.digest: data})
    return layer.digest


@dataclass
class SignResult:
    """What :func:`sign_all` did, for reports."""

    key_id: str
    signed: list[Signed] = field(default_factory=list)
    attestations: list[str] = field(default_factory=list)


def sign_all(store: Store, digests: Iterable[str], key: PrivateKey) -> SignResult:
    """Sign each of ``digests`` (once each, in order) in ``store``."""
    result = SignResult(key_id=key.public().id)
    seen: set[str] = set()
    for digest in digests:
        if digest and digest not in seen:
            seen.add(digest)
            result.signed.append(sign(store, digest, key))
    return result


# --------------------------------------------------------------------------
# Carrying
# --------------------------------------------------------------------------


def copy_attached(src: Store, dst: Store, digest: str, tmp_dir: Path) -> list[str]:
    """Copy ``digest``'s ``.sig`` and ``.att`` manifests (and their blobs) from ``src`` to ``dst``.

    Where ``dst`` has none, the manifest is copied byte for byte; where it has
    its own (signed there by another key), the layers of both are kept, the
    destination's first. Signatures stay valid either way: they cover the
    subject digest, which a copy keeps. Returns the tags written or already equal.
    """
    copied = []
    kinds: tuple[AttachedKind, ...] = ("sig", "att")
    for kind in kinds:
        tag = attached_tag(digest, kind)
        try:
            found = _read_manifest(src, tag)
        except TrustError:
            continue  # unreadable: it would not verify anywhere
        if found is None:
            continue
        manifest, src_digest = found
        layers = list(manifest.layers)
        for desc in [manifest.config, *layers]:
            if not dst.has_blob(desc.digest):
                src.copy_blob(dst, desc.digest, desc.size, tmp_dir)
        here = dst.tag_digest(tag)
        if here == src_digest:
            copied.append(tag)
            continue
        ref = src.get_manifest(src_digest)
        theirs = _existing_layers(dst, digest, kind) if here is not None else []
        if not theirs and ref is not None:
            dst.put_manifest(ref.data, ref.media_type or MANIFEST_MEDIA_TYPE, [tag])
        else:
            known = {(d.digest, tuple(sorted((d.annotations or {}).items()))) for d in theirs}
            extra = [
                d
                for d in layers
                if (d.digest, tuple(sorted((d.annotations or {}).items()))) not in known
            ]
            _write_attached(dst, digest, kind, [*theirs, *extra][-MAX_LAYERS:], {})
        copied.append(tag)
    return copied
