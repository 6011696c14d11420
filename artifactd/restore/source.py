"""What a restore reads from: the :class:`RestoreSource` protocol.

Three kinds of source serve a restore: a store (a registry, a local OCI
layout, a derived image's baked layout, the node store in front of a
registry: every :class:`~artifactd.stores.base.Store`, read through
:class:`StoreSource`), and a tree a container runtime unpacked
(:class:`~artifactd.restore.mounted.MountedTree`). Each answers three
questions, and nothing else:

* :meth:`~RestoreSource.current`: what a tag names now, by a cheap lookup
  (no config read), for the no-op check;
* :meth:`~RestoreSource.find`: the artifact a tag names, read and verified,
  with what its own content claims it is for;
* :meth:`~RestoreSource.stage_layer`: open one planned family's layer and
  extract it, verified, into staging.

(and, to explain a miss, :meth:`~RestoreSource.sample`: a few whole artifacts.)

Which tags are read, in which order, and whether what they name is bound to
the pod is decided once, in :mod:`artifactd.restore.resolve` ("the whole artifact's
tag, else each family's scope tag"); a source never decides it. This module
holds the types and the store adapter, whose heavy parts (reading an
artifact, unpacking) load only when used, so importing it costs a no-op
restore nothing.
"""

from __future__ import annotations

import os

from artifactd.errors import ArtifactdError, IntegrityError
from artifactd.format.oci import FULL_TAG_PREFIX
from artifactd.hashing import verifier_of
from artifactd.records import Record
from artifactd.stores.base import Store, progress_events

TYPE_CHECKING = False

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Protocol

    from artifactd.events import EventSink
    from artifactd.format.canary import Canary
    from artifactd.format.unpack import UnpackResult
    from artifactd.format.views import LayerView
    from artifactd.fsutil import StrPath
    from artifactd.hashing import Readable
    from artifactd.restore.resolve import FamilyPlan
    from artifactd.stores.artifacts import Artifact
    from artifactd.trust.policy import Basis


class Want(Record):
    """One tag the selection rule reads: the whole artifact's, or one family's scope tag."""

    tag: str
    #: The family whose scope tag this is; None for the whole artifact's ``fp-<hash>``.
    family: str | None
    #: What the pod resolved: the fingerprint hash (whole), or the family's scope key.
    key: str


class Current(Record):
    """What a tag names now, as a cheap lookup tells it."""

    digest: str
    #: The key its content claims, when the source knows it without reading a
    #: config (a mounted tree's document); None when only reading would tell.
    claimed: str | None = None


class Found(Record):
    """The artifact a tag names, read and verified: what resolving needs of it."""

    tag: str
    #: How plans and markers name it: the manifest digest (a tree: its document's).
    digest: str
    #: The config's kind: one cell's part of a fan-out build is never restored.
    kind: str
    #: The fingerprint hash its config claims; None where the source has none (a tree).
    fingerprint_hash: str | None
    #: Its layer records, by family.
    records: Mapping[str, LayerView]
    #: The artifact's format version.
    version: int
    #: The key that signed its manifest, when the restore verified signatures.
    signed_by: str | None = None
    #: The canaries its config carries (a build's serve cells recorded them).
    canaries: Sequence[Canary] = ()


if TYPE_CHECKING:

    class RestoreSource(Protocol):
        """Where a restore's artifacts come from (see the module's docstring)."""

        @property
        def ref(self) -> str:
            """How plans, markers and reports name this source."""

        def __enter__(self) -> RestoreSource: ...

        def __exit__(self, *exc: object) -> None: ...

        def current(self, want: Want) -> Current | None:
            """Return what ``want``'s tag names now (a cheap lookup); None when nothing."""

        def find(self, want: Want, *, trust: Basis) -> Found | None:
            """Read and verify what ``want``'s tag names; None when nothing.

            Under a :class:`~artifactd.trust.policy.TrustPolicy`, its signature is
            checked before its content is read (:class:`~artifactd.errors.TrustError`
            when no key signed it); under ``UNSAFE_NO_VERIFICATION``, it is not.
            """

        def stage_layer(
            self,
            plan: FamilyPlan,
            staging: StrPath,
            *,
            relocate: Callable[[str, bytes], bytes],
            keep_mtimes: bool,
            max_tar_bytes: int,
            on_event: EventSink,
        ) -> UnpackResult:
            """Verify and extract the layer ``plan`` hit into ``<staging>/<family>``."""

        def sample(self, limit: int) -> Sequence[tuple[str, Artifact]]:
            """Return up to ``limit`` whole artifacts (tag, artifact) to explain a miss, or none."""


class StoreSource:
    """A :class:`~artifactd.stores.base.Store` as a restore reads it: the restore's side of a store.

    The store knows nothing of restores; this adapter answers the protocol's
    questions with the store's blobs, manifests and tags alone. ``refused``
    (a node's quarantine, :func:`artifactd.stores.nodestore.refused_digests`)
    names manifests, and layers, it never offers: a tag naming one, or a
    manifest holding one of those layers, reads as nothing there.
    """

    def __init__(self, store: Store, *, refused: frozenset[str] = frozenset()) -> None:
        self.store = store
        self.refused = refused

    @property
    def ref(self) -> str:
        """The store's reference."""
        return self.store.ref

    def __enter__(self) -> StoreSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.store.close()

    def current(self, want: Want) -> Current | None:
        """Return what ``want``'s tag names now: one tag lookup, no config read."""
        digest = self.store.tag_digest(want.tag)
        return None if digest is None or digest in self.refused else Current(digest)

    def find(self, want: Want, *, trust: Basis) -> Found | None:
        """Read and verify the artifact ``want``'s tag names (signature first, under a policy).

        Read light (:mod:`artifactd.stores.reading`): pydantic loads only for
        a document the light reader leaves to it.
        """
        # lazy: fast path: LATER in artifactd/cli/fast.py, never loaded by a no-op restore
        from artifactd.stores.reading import read_documents  # noqa: PLC0415

        art = read_documents(self.store, want.tag, trust=trust, light_read=True)
        if art is None or art.digest in self.refused:
            return None
        if self.refused and any(rec.digest in self.refused for rec in art.config.layers):
            return None
        return Found(
            want.tag,
            art.digest,
            art.config.kind,
            art.config.fingerprint_hash,
            {rec.family: rec for rec in art.config.layers},
            art.config.schema_version,
            art.signed_by,
            art.config.canaries,
        )

    def sample(self, limit: int) -> Sequence[tuple[str, Artifact]]:
        """Return up to ``limit`` whole artifacts in tag order, skipping unreadable ones."""
        # lazy: fast path: LATER in artifactd/cli/fast.py, never loaded by a no-op restore
        from artifactd.stores.artifacts import read_artifact  # noqa: PLC0415

        out = []
        for tag in list(self.store.iter_tags(FULL_TAG_PREFIX))[:limit]:
            try:
                art = read_artifact(self.store, tag)
            except ArtifactdError:
                continue
            if art is not None:
                out.append((tag, art))
        return out

    def stage_layer(
        self,
        plan: FamilyPlan,
        staging: StrPath,
        *,
        relocate: Callable[[str, bytes], bytes],
        keep_mtimes: bool,
        max_tar_bytes: int,
        on_event: EventSink,
    ) -> UnpackResult:
        """Stream the planned layer from the store, verified, into ``staging``."""
        # lazy: fast path: LATER in artifactd/cli/fast.py, never loaded by a no-op restore
        from artifactd.format.unpack import (  # noqa: PLC0415
            unpack_layer,  # zstd and tarfile: only when there is work
        )

        layer = plan.layer
        if layer is None:  # pragma: no cover - hits always carry a layer
            raise IntegrityError(f"no record for {plan.family}")
        tries = 0

        def consume(blob: Readable) -> UnpackResult:
            # Rerun from the next source when a mirror fails: start from an empty staging dir.
            nonlocal tries
            tries += 1
            if tries > 1 and os.path.exists(staging):
                # lazy: only a rerun (a mirror failed mid-layer) empties staging
                from artifactd.restore.destination import remove_tree  # noqa: PLC0415

                remove_tree(staging)
            return unpack_layer(
                _Progress(blob, plan.family, layer.size, on_event),
                digest=layer.digest,
                size=layer.size,
                entries=layer.files,
                staging=staging,
                components=frozenset(layer.components),
                max_tar_bytes=max_tar_bytes,
                relocate=relocate,
                keep_mtimes=keep_mtimes,
                record=layer,
                prefix=plan.member_prefix,
            )

        return self.store.consume_blob(layer.digest, layer.size, consume)


class _Progress:
    """Count bytes read from a layer stream; report them as throttled ``progress`` events."""

    def __init__(self, source: Readable, family: str, total: int, on_event: EventSink) -> None:
        self._source = source
        # The source's digest check, named so the unpacker does not hash the bytes again.
        self.verifier = verifier_of(source)
        self._done = 0
        self._report = progress_events(on_event, stage="fetch", family=family, total=total)

    def read(self, n: int = -1, /) -> bytes:
        data = self._source.read(n)
        self._done += len(data)
        self._report(self._done)
        return data
