"""What a node store holds, published as node-feature-discovery labels for cache-aware scheduling.

node-feature-discovery's worker reads local feature files from its
``features.d/`` directory (on the host,
``/etc/kubernetes/node-feature-discovery/features.d/``): one ``name=value``
a line, ``#`` starting a comment; a name with a ``prefix/`` becomes a node
label as written. :func:`write_features` writes such a file for a node
store: one label ``artifactd.io/<tag>=true`` per artifact the store holds,
so a Deployment can prefer (``preferredDuringSchedulingIgnoredDuringExecution``)
the nodes that already hold its artifact.

The labels are bounded (``max_labels``, the most recently used artifacts
first: a node's labels are few and every one is sent to the API server) and
valid Kubernetes label keys: a DNS-1123 subdomain prefix of at most 253
characters, then a name of at most 63 characters that starts and ends with
an alphanumeric and holds only alphanumerics, ``-``, ``_`` and ``.``. An
artifact's tag is an OCI tag (up to 128 characters, may start with ``_``):
:func:`label_name` maps it to such a name. ``fp-<64 hex>`` becomes
``fp-<first 16 hex>`` (:func:`fingerprint_label` is what a pod's affinity
names); any other tag is kept when it is already a valid name, else cut
and suffixed with 12 hex of its SHA-256, so two tags never share a label by
truncation. Signatures and attestations are not artifacts: no label.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from pathlib import Path

from artifactd.errors import NotFoundError, TargetError, UsageError
from artifactd.fsutil import atomic_write
from artifactd.stores.layout import LayoutStore

#: The label prefix (a DNS-1123 subdomain) of every label artifactd publishes.
LABEL_PREFIX = "artifactd.io"
#: How many hex digits of a fingerprint hash its label keeps (64 bits: no two
#: artifacts of one fleet share it).
FP_LABEL_HEX = 16
#: How many labels a node gets by default.
DEFAULT_MAX_LABELS = 16
#: The value of every label (a valid label value).
LABEL_VALUE = "true"
#: Kubernetes' limits on a label key's name part and prefix.
MAX_NAME = 63
MAX_PREFIX = 253
#: How many hex digits of a tag's SHA-256 a cut name ends with.
SUFFIX_HEX = 12

_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_FP_TAG = re.compile(r"fp-([0-9a-f]{64})")


def valid_label_key(key: str) -> bool:
    """Whether ``key`` is a valid Kubernetes label key (``[prefix/]name``, the rules above)."""
    prefix, slash, name = key.rpartition("/")
    if slash and not (len(prefix) <= MAX_PREFIX and _SUBDOMAIN.fullmatch(prefix)):
        return False
    return len(name) <= MAX_NAME and _NAME.fullmatch(name) is not None


def _check_prefix(prefix: str) -> None:
    if not (len(prefix) <= MAX_PREFIX and _SUBDOMAIN.fullmatch(prefix)):
        raise UsageError(
            f"label prefix {prefix!r} is not a DNS-1123 subdomain",
            hint="lower-case alphanumerics, '-' and '.', e.g. artifactd.io",
        )


def label_name(tag: str) -> str:
    """Return the label name (the part after the prefix) for an artifact's tag."""
    fp = _FP_TAG.fullmatch(tag)
    if fp:
        return f"fp-{fp.group(1)[:FP_LABEL_HEX]}"
    if len(tag) <= MAX_NAME and _NAME.fullmatch(tag):
        return tag
    suffix = hashlib.sha256(tag.encode()).hexdigest()[:SUFFIX_HEX]
    # Only the edges can be invalid in an OCI tag's characters: cut, then strip them.
    head = re.sub(r"[^-A-Za-z0-9_.]", "", tag)[: MAX_NAME - SUFFIX_HEX - 1]
    head = head.lstrip("-_.").rstrip("-_.")
    return f"{head}-{suffix}" if head else f"tag-{suffix}"


def fingerprint_label(fp_hash: str, prefix: str = LABEL_PREFIX) -> str:
    """Return the label key a node holding the artifact ``fp-<fp_hash>`` gets."""
    return f"{prefix}/{label_name(f'fp-{fp_hash}')}"


def node_labels(
    node: LayoutStore, *, max_labels: int = DEFAULT_MAX_LABELS, prefix: str = LABEL_PREFIX
) -> list[str]:
    """Return the label keys for the artifacts ``node`` holds, most recently used first.

    At most ``max_labels`` (0 gives none); ties in last use go by tag. Raises
    :class:`UsageError` for a negative bound or an invalid prefix.
    """
    # lazy: artifactd.cli.nodes imports this module for its option defaults, at
    # every click start (tests/test_startup.py holds what --help loads)
    from artifactd.stores.nodestore import read_usage, refused_digests  # noqa: PLC0415
    from artifactd.trust.signatures import parse_attached_tag  # noqa: PLC0415

    if max_labels < 0:
        raise UsageError(f"--max-labels must be 0 or more, not {max_labels}")
    _check_prefix(prefix)
    usage = read_usage(node.root)
    # One read of index.json for every tag (a lookup per tag read it once per tag).
    # A quarantined artifact (its canary failed here) is not advertised: no pod is steered to it.
    refused = refused_digests(node.root)
    tags = {
        t: d
        for t, d in node.tag_digests().items()
        if parse_attached_tag(t) is None and d not in refused
    }
    order = sorted(tags, key=lambda t: (-usage.get(tags[t], 0.0), t))
    keys: dict[str, None] = {}  # insertion-ordered, with a set's membership test
    for tag in order:
        if len(keys) >= max_labels:
            break
        keys.setdefault(f"{prefix}/{label_name(tag)}")
    return list(keys)


def features_text(keys: Sequence[str], source: str) -> str:
    """Return a local features file listing ``keys`` (each ``=true``), ``source`` in a comment."""
    lines = [f"# artifactd: the artifacts {source} holds (artifactd node-features)"]
    lines += [f"{key}={LABEL_VALUE}" for key in keys]
    return "\n".join(lines) + "\n"


def write_features(
    root: Path,
    path: Path,
    *,
    max_labels: int = DEFAULT_MAX_LABELS,
    prefix: str = LABEL_PREFIX,
) -> list[str]:
    """Write the labels of the node store at ``root`` to the features file ``path``; return them.

    A node store not made yet (a node before its first prefetch) holds
    nothing: the file then lists no label, so a node's stale labels go. NFD
    rereads the file at each of its intervals, so it is replaced in one
    rename, never seen half-written. Raises :class:`TargetError` when it
    cannot be written, and :class:`StoreError` when the node store cannot be read.
    """
    keys: list[str] = []
    try:  # one that cannot be read is a StoreError: its labels are not cleared
        node: LayoutStore | None = LayoutStore(root)
    except NotFoundError:
        node = None
    if node is not None:
        keys = node_labels(node, max_labels=max_labels, prefix=prefix)
    else:
        _check_prefix(prefix)
    try:
        # The store's path is a comment: a name that is not UTF-8 is shown escaped.
        text = features_text(keys, f"oci:{root}")
        atomic_write(path, text.encode("utf-8", "backslashreplace"))
    except OSError as exc:
        raise TargetError(
            f"cannot write the node features to {path}: {exc.strerror or exc}",
            hint="point --out at NFD's features.d directory (a hostPath), writable here",
        ) from None
    return keys
