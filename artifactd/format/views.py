"""What a restore reads of an artifact, as types both readers satisfy.

A restore reads the artifact's documents with the light reader
(:mod:`artifactd.format.light`) and falls back to the pydantic models for what
it does not accept, so the code after the read sees either. These protocols
name the fields that code may use: a pydantic model satisfies them as it is,
and ``tests/test_light.py`` checks that every light document has each of them
with the model's value. Anything else (a model's methods, ``model_dump``) is
off limits past the read, so a type checker keeps both paths alike. The
protocols exist for type checkers only (under ``if TYPE_CHECKING:``): a
restore that installs imports this module, and ``typing`` stays unloaded.
"""

from __future__ import annotations

import _thread

from artifactd.hashing import canonical_json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any, Protocol

    from artifactd.format.canary import Canary

    class FileView(Protocol):
        """One file of a layer record (:class:`~artifactd.format.config.FileEntry`)."""

        @property
        def path(self) -> str: ...
        @property
        def size(self) -> int: ...
        @property
        def sha256(self) -> str: ...
        @property
        def mode(self) -> int: ...
        @property
        def mtime(self) -> int | None: ...
        @property
        def link(self) -> str | None: ...
        @property
        def rewrite(self) -> bool: ...

    class LayerView(Protocol):
        """One family's layer record (:class:`~artifactd.format.config.LayerRecord`)."""

        @property
        def family(self) -> str: ...
        @property
        def scope_key(self) -> str: ...
        @property
        def scope(self) -> Mapping[str, Any]: ...
        @property
        def components(self) -> Sequence[str]: ...
        @property
        def files(self) -> Sequence[FileView]: ...
        @property
        def pinned_paths(self) -> Sequence[str]: ...
        @property
        def facts(self) -> Mapping[str, Any]: ...
        @property
        def digest(self) -> str: ...
        @property
        def size(self) -> int: ...
        @property
        def diff_id(self) -> str: ...
        @property
        def unpacked_size(self) -> int: ...

    class FingerprintView(Protocol):
        """A fingerprint as resolving uses it (:class:`artifactd.fingerprint.model.Fingerprint`)."""

        @property
        def hash(self) -> str: ...
        def flatten(self) -> dict[str, Any]: ...
        def select(self, dimensions: Sequence[str]) -> dict[str, Any]: ...
        def document(self) -> dict[str, Any]: ...

    class DescriptorView(Protocol):
        """An OCI descriptor as read (:class:`~artifactd.format.imagemanifest.Descriptor`)."""

        @property
        def digest(self) -> str: ...
        @property
        def size(self) -> int: ...

    class ManifestView(Protocol):
        """An OCI manifest as read (:class:`~artifactd.format.imagemanifest.ImageManifest`)."""

        @property
        def artifact_type(self) -> str | None: ...
        @property
        def config(self) -> DescriptorView: ...
        @property
        def layers(self) -> Sequence[DescriptorView]: ...

    class ConfigView(Protocol):
        """An artifact config as read (:class:`~artifactd.format.config.ArtifactConfig`)."""

        @property
        def kind(self) -> str: ...
        @property
        def schema_version(self) -> int: ...
        @property
        def fingerprint_hash(self) -> str: ...
        @property
        def layers(self) -> Sequence[LayerView]: ...
        @property
        def canaries(self) -> Sequence[Canary]: ...


#: The fields of :class:`FileView` and :class:`LayerView` (the test holds both readers to them).
FILE_FIELDS = ("path", "size", "sha256", "mode", "mtime", "link", "rewrite")
_FILE_KEYS = frozenset(FILE_FIELDS)
LAYER_FIELDS = (
    "family",
    "scope_key",
    "scope",
    "components",
    "files",
    "pinned_paths",
    "facts",
    "digest",
    "size",
    "diff_id",
    "unpacked_size",
)


#: The last few records' tree documents, by identity: a restore asks twice per
#: layer (its tar bound, then the comparison with the layer's own copy), and an
#: 18,000-file document takes about 70 ms to make. Bounded: the documents of one
#: config together are smaller than the config, which a restore reads whole.
_RECENT: dict[int, tuple[LayerView, bytes]] = {}
_RECENT_MAX = 4
_RECENT_LOCK = _thread.allocate_lock()


def _file_fields(entry: FileView) -> Mapping[str, Any]:
    """Return a file entry's fields by name: its own ``__dict__`` when that holds exactly them.

    Both readers keep an entry's fields there (a light document's is a copy of
    the config's entry, a frozen model's its validated values), so the
    tree document of tens of thousands of entries needs no new dict per entry.
    """
    fields: Mapping[str, Any] | None = getattr(entry, "__dict__", None)
    if fields is not None and fields.keys() == _FILE_KEYS:
        return fields
    return {f: getattr(entry, f) for f in FILE_FIELDS}


def tree_document(record: LayerView) -> bytes:
    """Return the tree document a format-2 layer of ``record`` carries, as its canonical bytes.

    The bytes of :meth:`FamilyTree.canonical <artifactd.format.config.FamilyTree.canonical>`
    for ``record.tree()``, made from the record's fields alone so a restore
    need not build the model (``tests/test_light.py`` holds the two equal).
    Records are read-only, so the same record gives the same bytes: the last
    few are kept.
    """
    with _RECENT_LOCK:
        hit = _RECENT.get(id(record))
    if hit is not None and hit[0] is record:
        return hit[1]
    doc = canonical_json(
        {
            "schema_version": 2,
            "family": record.family,
            "scope_key": record.scope_key,
            "scope": record.scope,
            "components": list(record.components),
            "files": [_file_fields(e) for e in record.files],
            "unpacked_size": record.unpacked_size,
        }
    )
    with _RECENT_LOCK:
        while len(_RECENT) >= _RECENT_MAX:
            del _RECENT[next(iter(_RECENT))]
        _RECENT[id(record)] = (record, doc)
    return doc


def without_empty_canaries(doc: dict[str, Any]) -> dict[str, Any]:
    """Leave an empty ``canaries`` out of an artifact config's JSON (both readers' dump).

    An artifact with no canary keeps the bytes (and the config digest) it had
    before canaries existed, and stays readable by older releases.
    """
    if not doc.get("canaries"):
        doc.pop("canaries", None)
    return doc
