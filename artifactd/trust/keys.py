"""Signing keys: ECDSA P-256 key pairs, as cosign uses them, read without ever showing them.

``artifactd keygen --out PREFIX`` writes ``PREFIX.key`` (the private key,
PKCS#8 PEM, encrypted when ``ARTIFACTD_KEY_PASSWORD`` is set) and
``PREFIX.pub`` (the public key, a PEM ``PUBLIC KEY`` block: DER
SubjectPublicKeyInfo, the format ``cosign generate-key-pair`` writes and
``cosign verify --key`` reads). cosign keeps its own private keys in an
encrypted format of its own, which artifactd does not read; to sign with one
key in both tools, import ours into cosign (``cosign import-key-pair --key``,
given the key decrypted: ``openssl pkcs8 -in PREFIX.key -out plain.key``).

A key is named by a *key spec*: a file path, or ``env://NAME`` for PEM held
in the environment variable ``NAME`` (a Kubernetes Secret exposed as an env
var). Nothing here puts key material in a message, a log line or a JSON
document: errors name the spec, never its content; keys are shown by their
key id, ``sha256:`` of the public key's DER bytes (:func:`key_id`).
"""

from __future__ import annotations

import binascii
import os
import sys

from artifactd.constants import ENV_KEY_PASSWORD, current_environ
from artifactd.errors import UsageError
from artifactd.fsutil import InputFileError, read_regular
from artifactd.hashing import digest_of
from artifactd.records import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

    from cryptography.hazmat.primitives.asymmetric.ec import (
        EllipticCurvePrivateKey,
        EllipticCurvePublicKey,
    )

#: The prefix of a key spec that names an environment variable.
ENV_SCHEME = "env://"
#: A key file larger than this is not a key (and is not read whole).
MAX_KEY_FILE = 64 << 10
_BEGIN = b"-----BEGIN PUBLIC KEY-----"
_END = b"-----END PUBLIC KEY-----"
#: What a PEM block's body may hold: base64 and whitespace (as ``bytes.split`` knows it).
_BASE64 = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
_BODY = _BASE64 | frozenset(b"= \t\n\r\x0b\x0c")


class KeyFileError(UsageError):
    """A key spec names no readable key of the right kind (exit 2)."""

    kind = "key"


# Records, not dataclasses or named tuples: a no-op restore under a policy imports
# this module, and importing ``dataclasses`` or ``typing`` costs it milliseconds.
class PublicKey(Record):
    """A public key that verifies signatures, named by its :func:`key_id_of`."""

    id: str
    spec: str
    key: EllipticCurvePublicKey

    def __repr__(self) -> str:
        return f"PublicKey({self.id}, from {self.spec})"


class PrivateKey(Record):
    """A private key that signs; its repr names the key id, never the key."""

    id: str
    spec: str
    key: EllipticCurvePrivateKey

    def __repr__(self) -> str:
        return f"PrivateKey({self.id}, from {self.spec})"

    def sign(self, data: bytes) -> bytes:
        """Return the ECDSA-SHA256 signature of ``data``, DER-encoded (as cosign writes it)."""
        # lazy: cryptography only to sign or check (see verification_key_ids)
        from cryptography.hazmat.primitives import hashes  # noqa: PLC0415
        from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415

        return self.key.sign(data, ec.ECDSA(hashes.SHA256()))

    def public(self) -> PublicKey:
        """Return the matching public key."""
        pub = self.key.public_key()
        return PublicKey(key_id_of(pub), self.spec, pub)


def key_id(der: bytes) -> str:
    """Return the key id of a public key given as DER SubjectPublicKeyInfo: ``sha256:<hex>``.

    The one definition of a key id: of a parsed key (:func:`key_id_of`) and of
    the PEM a no-op restore reads without the crypto library (:func:`key_ids_of_pem`).
    """
    return digest_of(der)


def key_id_of(key: EllipticCurvePublicKey) -> str:
    """Return the :func:`key_id` of a parsed public key."""
    # lazy: cryptography only to sign or check (see verification_key_ids)
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415

    return key_id(
        key.public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def key_ids_of_pem(pem: bytes) -> list[str]:
    """Return the key ids of the ``PUBLIC KEY`` blocks in ``pem``, without cryptography.

    The restore no-op path compares these with the ids its marker recorded, so
    a warm pod start does not load the crypto library; a full restore then
    parses the keys properly (:func:`load_public_keys`).
    """
    out = []
    for _, body in public_blocks(pem):
        try:
            der = _b64decode_strict(b"".join(body.split()))
        except ValueError:
            continue
        out.append(key_id(der))
    return out


def public_blocks(pem: bytes) -> list[tuple[bytes, bytes]]:
    """Return the ``PUBLIC KEY`` blocks in ``pem`` (the whole block, its body), in order.

    A block is the BEGIN line's marker, then at least one byte of base64 or
    whitespace, then the END marker; a BEGIN whose body holds anything else, or
    that has no END, is no block (the next BEGIN is tried).
    """
    blocks = []
    at = pem.find(_BEGIN)
    while at != -1:
        start = at + len(_BEGIN)
        stop = pem.find(b"-", start)
        body = pem[start:stop] if stop != -1 else b""
        if body and _BODY.issuperset(body) and pem.startswith(_END, stop):
            blocks.append((pem[at : stop + len(_END)], body))
            at = pem.find(_BEGIN, stop + len(_END))
        else:
            at = pem.find(_BEGIN, at + 1)
    return blocks


def _b64decode_strict(data: bytes) -> bytes:
    """``base64.b64decode(data, validate=True)``, without ``base64`` (which imports ``re``)."""
    if sys.version_info >= (3, 11):
        return binascii.a2b_base64(data, strict_mode=True)
    stripped = data.rstrip(b"=")  # pragma: no cover - Python 3.10's check, written out
    if len(data) - len(stripped) > 2 or not _BASE64.issuperset(stripped):
        raise binascii.Error("Non-base64 digit found")
    return binascii.a2b_base64(data)


def read_spec(spec: str, *, what: str, environ: Mapping[str, str] | None = None) -> bytes:
    """Return the bytes a key spec names: a file's, or an ``env://NAME`` variable's."""
    env = current_environ() if environ is None else environ
    if spec.startswith(ENV_SCHEME):
        name = spec[len(ENV_SCHEME) :]
        value = env.get(name)
        if not name or value is None:
            raise KeyFileError(
                f"{what} {spec}: the environment variable {name or '(none)'} is not set",
                hint="env://NAME reads the PEM held in $NAME",
            )
        return value.encode()
    try:
        # Followed: a Kubernetes Secret volume holds its keys as symlinks.
        return read_regular(spec, MAX_KEY_FILE, follow=True)
    except InputFileError as exc:
        unread = exc.reason in ("missing", "unreadable")
        raise KeyFileError(
            f"{what} {spec}: "
            + (f"cannot read it ({os.strerror(exc.errno or 0)})" if unread else exc.problem),
            hint="pass the path of a PEM key file (at most "
            f"{MAX_KEY_FILE >> 10} KiB), or env://NAME",
        ) from None


def load_private_key(
    spec: str, *, password: str | None = None, environ: Mapping[str, str] | None = None
) -> PrivateKey:
    """Load the ECDSA P-256 private key a spec names (PKCS#8 or SEC1 PEM, maybe encrypted).

    ``password`` defaults to ``ARTIFACTD_KEY_PASSWORD``. Errors say what is
    wrong with the key (wrong password, not P-256, not a private key), never
    what it holds.
    """
    # lazy: cryptography only to sign or check (see verification_key_ids)
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415

    env = current_environ() if environ is None else environ
    data = read_spec(spec, what="signing key", environ=env)
    secret = password if password is not None else env.get(ENV_KEY_PASSWORD)
    if b"ENCRYPTED SIGSTORE PRIVATE KEY" in data or b"ENCRYPTED COSIGN PRIVATE KEY" in data:
        raise KeyFileError(
            f"signing key {spec} is in cosign's own encrypted format",
            hint="sign with a key from `artifactd keygen` (PKCS#8 PEM); "
            "`cosign import-key-pair` makes that key usable by cosign too",
        )
    # PKCS#8 says "ENCRYPTED PRIVATE KEY", SEC1 "Proc-Type: 4,ENCRYPTED". A
    # password set for other keys is not an error for a plain one.
    encrypted = b"ENCRYPTED" in data
    if encrypted and not secret:
        raise KeyFileError(
            f"signing key {spec} is encrypted and no password was given",
            hint=f"set {ENV_KEY_PASSWORD}",
        )
    try:
        key = serialization.load_pem_private_key(
            data, password=secret.encode() if encrypted and secret else None
        )
    except TypeError:
        raise KeyFileError(
            f"signing key {spec} cannot be read: its encryption is not what its PEM header says"
        ) from None
    except ValueError:
        raise KeyFileError(
            f"signing key {spec} cannot be read: not a PEM private key, or the password is wrong",
            hint=f"check the file and {ENV_KEY_PASSWORD}",
        ) from None
    except Exception:  # the library raises several types for bad PEM
        raise KeyFileError(f"signing key {spec} is not a PEM private key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
        raise KeyFileError(
            f"signing key {spec} is not an ECDSA P-256 key",
            hint="`artifactd keygen` makes one; cosign uses the same type",
        )
    return PrivateKey(key_id_of(key.public_key()), spec, key)


def load_public_keys(
    specs: Sequence[str], *, environ: Mapping[str, str] | None = None
) -> list[PublicKey]:
    """Load every ``PUBLIC KEY`` block the specs name (a file may hold several).

    A spec that names a private key is refused: verification needs only the
    public half, and a private key has no business in an init container.
    """
    # lazy: cryptography only to sign or check (see verification_key_ids)
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415

    keys: dict[str, PublicKey] = {}
    for spec in specs:
        data = read_spec(spec, what="verification key", environ=environ)
        if b"PRIVATE KEY-----" in data:
            raise KeyFileError(
                f"verification key {spec} holds a private key",
                hint="pass the public key (PREFIX.pub); keep the private key out of pods",
            )
        blocks = public_blocks(data)
        if not blocks:
            raise KeyFileError(
                f"verification key {spec} holds no PEM PUBLIC KEY block",
                hint="pass PREFIX.pub from `artifactd keygen` or cosign.pub",
            )
        for block, _ in blocks:
            try:
                pub = serialization.load_pem_public_key(block)
            except Exception:  # several types for malformed DER
                raise KeyFileError(
                    f"verification key {spec} holds a malformed public key"
                ) from None
            if not isinstance(pub, ec.EllipticCurvePublicKey) or pub.curve.name != "secp256r1":
                raise KeyFileError(
                    f"verification key {spec} is not an ECDSA P-256 public key",
                    hint="artifactd and cosign key pairs are ECDSA P-256",
                )
            kid = key_id_of(pub)
            keys.setdefault(kid, PublicKey(kid, spec, pub))
    return list(keys.values())


def verification_key_ids(
    specs: Sequence[str], environ: Mapping[str, str] | None = None
) -> list[str]:
    """Return the key ids the specs name, reading PEM only (see :func:`key_ids_of_pem`)."""
    ids: list[str] = []
    for spec in specs:
        ids.extend(key_ids_of_pem(read_spec(spec, what="verification key", environ=environ)))
    return ids


class KeyPair(Record):
    """What :func:`generate` wrote."""

    private: str
    public: str
    key_id: str
    encrypted: bool


def generate(prefix: Path, *, password: str | None = None, force: bool = False) -> KeyPair:
    """Write a new ECDSA P-256 pair to ``PREFIX.key`` (mode 0600) and ``PREFIX.pub``.

    The private key is PKCS#8 PEM, encrypted with ``password`` when one is
    given (the best encryption the crypto library offers). Refuses to replace
    existing files unless ``force``; the private key file is created with mode
    0600 before any key byte is written to it.
    """
    # lazy: cryptography only to sign or check: a --verify-key no-op restore reads key ids from the
    # PEM without it (tests/test_startup.py)
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415

    key_path = prefix.parent / f"{prefix.name}.key"
    pub_path = prefix.parent / f"{prefix.name}.pub"
    if not force:
        for path in (key_path, pub_path):
            if os.path.lexists(path):  # a name too long is not there: writing it says why
                raise UsageError(
                    f"{path} exists", hint="choose another --out, or pass --force to replace it"
                )
    key = ec.generate_private_key(ec.SECP256R1())
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password.encode())
        if password
        else serialization.NoEncryption()
    )
    private_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    )
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    try:
        prefix.parent.mkdir(parents=True, exist_ok=True)
        _write_new(key_path, private_pem, 0o600)
        _write_new(pub_path, public_pem, 0o644)
    except OSError as exc:
        raise UsageError(f"cannot write the key pair at {prefix}: {exc.strerror or exc}") from None
    return KeyPair(str(key_path), str(pub_path), key_id_of(key.public_key()), bool(password))


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to a temp file created with ``mode``, then rename it over ``path``."""
    tmp = path.parent / f".{path.name}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)  # the umask may have narrowed it; never widened past mode
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
