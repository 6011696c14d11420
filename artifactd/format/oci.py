"""OCI media types, annotations and the tag scheme (no pydantic: the no-op restore path imports it).

The format is documented for other clients in ``registry-schema/FORMAT.md``.
"""

from __future__ import annotations

import time

from artifactd.errors import IntegrityError, UsageError

ARTIFACT_TYPE = "application/vnd.artifactd.cache.v1"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
#: Docker's image index (a "manifest list"), which registries and engines still serve.
DOCKER_LIST_MEDIA_TYPE = "application/vnd.docker.distribution.manifest.list.v2+json"
# An image-config media type (not a custom one) so `skopeo inspect` accepts it.
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar+zstd"

ANN_TITLE = "org.opencontainers.image.title"
ANN_CREATED = "org.opencontainers.image.created"
ANN_REF_NAME = "org.opencontainers.image.ref.name"
ANN_FAMILY = "io.artifactd.family"
ANN_SCOPE_KEY = "io.artifactd.scope-key"
ANN_FINGERPRINT = "io.artifactd.fingerprint"
ANN_KIND = "io.artifactd.kind"
ANN_FILES = "io.artifactd.files"

#: A content digest as OCI spells it; the models validate with the same pattern.
DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"
#: A format-2 family directory's description of itself, beside its components
#: (:class:`artifactd.format.config.FamilyTree`).
TREE_DOC = ".artifactd-layer.json"
_HEX = frozenset("0123456789abcdef")
_TAG_FIRST = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
_TAG_REST = _TAG_FIRST | frozenset(".-")


def is_digest(text: str) -> bool:
    """Whether ``text`` is a sha256 content digest: :data:`DIGEST_PATTERN`, nothing after it.

    Written out rather than matched (``re`` is off a pod start's first modules);
    unlike the pattern under :func:`re.match`, a final newline is refused.
    """
    return len(text) == 71 and text.startswith("sha256:") and _HEX.issuperset(text[7:])


def is_tag(text: str) -> bool:
    """Whether OCI allows ``text`` as a tag: ``[A-Za-z0-9_][A-Za-z0-9._-]{0,127}``, all of it."""
    return 0 < len(text) <= 128 and text[0] in _TAG_FIRST and _TAG_REST.issuperset(text)


FULL_TAG_PREFIX = "fp-"
#: Tags of contributed deltas (``artifactd contribute``) start with this.
DELTA_TAG_PREFIX = "delta-"
#: Tags of absorbed candidates (``artifactd absorb``) start with this.
CANDIDATE_TAG_PREFIX = "candidate-"
#: A registry keeps a manifest whose tag was re-pointed, untagged and invisible
#: to the tag listing; publishing first tags it ``superseded-<time>-<hex>``
#: (:func:`superseded_tag`) so that ``prune`` finds it and deletes it after the
#: grace. The time is when the tag moved, UTC, to the second.
SUPERSEDED_TAG_PREFIX = "superseded-"
SUPERSEDED_TIME_FORMAT = "%Y%m%dT%H%M%SZ"


def full_tag(fingerprint_hash: str) -> str:
    """Tag of the whole artifact built for a fingerprint."""
    return f"{FULL_TAG_PREFIX}{fingerprint_hash}"


def family_tag(family: str, scope_key: str) -> str:
    """Tag of the single-family artifact for one scope key."""
    return f"{family}-{scope_key}"


def superseded_tag(digest: str, when: float) -> str:
    """Tag that records ``digest`` lost its tags at ``when`` (seconds since the epoch)."""
    stamp = time.strftime(SUPERSEDED_TIME_FORMAT, time.gmtime(when))
    return f"{SUPERSEDED_TAG_PREFIX}{stamp}-{check_digest(digest).split(':', 1)[1]}"


def parse_superseded_tag(tag: str) -> tuple[str, str] | None:
    """Return (time as stamped, digest) of a :func:`superseded_tag`; None for any other tag.

    The time is :data:`SUPERSEDED_TIME_FORMAT` text, parsed by the reader that
    needs it (a prune), so the no-op restore path loads no calendar code.
    """
    stamp, dash, hex_part = tag.removeprefix(SUPERSEDED_TAG_PREFIX).partition("-")
    shaped = (
        tag.startswith(SUPERSEDED_TAG_PREFIX)
        and dash
        and len(stamp) == 16
        and stamp[8] == "T"
        and stamp[15] == "Z"
        and (stamp[:8] + stamp[9:15]).isascii()
        and (stamp[:8] + stamp[9:15]).isdigit()
        and is_digest("sha256:" + hex_part)
    )
    return (stamp, f"sha256:{hex_part}") if shaped else None


def check_digest(digest: str) -> str:
    """Return ``digest`` if it is a well-formed sha256 digest, else raise."""
    if not is_digest(digest):
        raise IntegrityError(f"malformed digest {digest!r}")
    return digest


def check_tag(tag: str) -> str:
    """Return ``tag`` if OCI allows it, else raise :class:`UsageError`."""
    if not is_tag(tag):
        raise UsageError(f"not a valid OCI tag: {tag!r}")
    return tag
