"""Unpacked artifacts: restore from a tree a container runtime made (``restore --from-dir``).

Kubernetes can mount an OCI image read-only into a pod (``volumes[].image``),
pulled and kept on the node by the container runtime. An artifact in format 2
is such an image: its layers, merged as a runtime merges them, give one
directory per family, each holding its components and its tree document
(:class:`~artifactd.format.config.FamilyTree` at ``<family>/.artifactd-layer.json``)::

    /mnt/artifact/triton/.artifactd-layer.json
    /mnt/artifact/triton/cache/<key>/add.cubin
    /mnt/artifact/inductor/.artifactd-layer.json
    /mnt/artifact/inductor/cache/...
    /mnt/artifact/inductor/pch/...

:func:`open_dir` takes what ``--from-dir`` names and finds the artifact in it:
such a tree (:class:`MountedTree`), or an OCI layout (the store a derived
image bakes at ``/opt/prebuilt-cache/<hash>/``, or its parent, or a whole
image's root holding ``opt/prebuilt-cache/<hash>/``), which is restored like
any store. A tree is trusted no more than a registry: each family's document
is held to the layer rules before anything is copied, and every file is
checked against it while it is copied (:func:`artifactd.format.unpack.stage_tree`).

A tree is a :class:`~artifactd.restore.source.RestoreSource` like any store, resolved
by the same rule (:mod:`artifactd.restore.resolve`): it has no ``fp-<hash>`` tag, so
each family resolves by its scope tag, which names the family's directory. A
family hits when its document's scope key is the local one
(:func:`artifactd.restore.resolve.unbound`, as for a store's family tag); another
scope key is a miss that names it, and fails ``--require`` as corrupt.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from artifactd.constants import DEFAULT_PREBUILT
from artifactd.errors import (
    IntegrityError,
    NotFoundError,
    TrustError,
    UnsafeArtifactError,
)
from artifactd.families import FAMILIES
from artifactd.format import config
from artifactd.format.config import FamilyTree
from artifactd.format.oci import TREE_DOC
from artifactd.format.unpack import source_error, stage_tree
from artifactd.fsutil import read_regular
from artifactd.hashing import digest_of
from artifactd.restore.source import Current, Found

if TYPE_CHECKING:
    from collections.abc import Callable

    from artifactd.events import EventSink
    from artifactd.format.unpack import UnpackResult
    from artifactd.fsutil import StrPath
    from artifactd.restore.resolve import FamilyPlan
    from artifactd.restore.source import Want
    from artifactd.stores.artifacts import Artifact
    from artifactd.trust.policy import Basis

#: The prefix of a tree's store reference in plans, markers and reports.
DIR_PREFIX = "dir:"


class MountedTree:
    """A format-2 artifact as a runtime unpacked it: ``<root>/<family>/`` per family.

    Read-only: it reads each family's tree document when opened and copies
    files only through :meth:`stage_layer`. Usable as a context manager, like a store.
    """

    def __init__(self, root: Path, docs: Mapping[str, tuple[FamilyTree, str]]) -> None:
        self.root = root
        #: family -> (its tree document, sha256 digest of the document's bytes)
        self.docs = dict(docs)

    @property
    def ref(self) -> str:
        """How plans, markers and reports name this source."""
        return f"{DIR_PREFIX}{self.root}"

    def __enter__(self) -> MountedTree:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    # The restore source (artifactd.restore.source). A tree has no ``fp-<hash>`` tag: it
    # holds one directory per family, which is what that family's scope tag
    # names, whatever scope its document claims (resolve checks the claim).

    def current(self, want: Want) -> Current | None:
        """Return the digest of ``want``'s family document, if any (never a whole artifact)."""
        found = self.docs.get(want.family) if want.family is not None else None
        return None if found is None else Current(found[1], found[0].scope_key)

    def find(self, want: Want, *, trust: Basis) -> Found | None:
        """Read ``want``'s family directory: a layer record named by its document's digest.

        A tree carries no signature: under a policy with keys it raises :class:`TrustError`.
        """
        # lazy: fast path: LATER in artifactd/cli/fast.py; plan_restore has loaded it already
        from artifactd.trust.policy import UnsafeNoVerification  # noqa: PLC0415

        if not isinstance(trust, UnsafeNoVerification):
            raise TrustError(
                f"{self.ref} is a mounted tree: it carries no signature to verify",
                reason="unsigned",
                hint="with --verify-key, restore from a store (a registry, an OCI layout, or a "
                "derived image's /opt/prebuilt-cache, which keep signatures); an image volume "
                "is verified, if at all, by the cluster's admission policy when kubelet pulls it",
            )
        found = self.docs.get(want.family) if want.family is not None else None
        if found is None:
            return None
        doc, digest = found
        return Found(want.tag, digest, "family", None, {doc.family: doc.record(digest)}, 2)

    def sample(self, limit: int) -> Sequence[tuple[str, Artifact]]:
        """Return nothing: a tree holds one artifact's families, no whole artifacts to compare."""
        return ()

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
        """Verify and copy one planned family into ``staging`` (see :func:`stage_tree`)."""
        if plan.layer is None:  # pragma: no cover - hits always carry a layer
            raise IntegrityError(f"no record for {plan.family}")
        return stage_tree(
            self.root / plan.family,
            plan.layer,
            staging,
            relocate=relocate,
            keep_mtimes=keep_mtimes,
        )


def open_dir(path: Path, fingerprint_hash: str) -> str | MountedTree:
    """Find the artifact in ``path``: an OCI layout's store reference, or a :class:`MountedTree`.

    In order: ``path`` is an OCI layout; ``path/<hash>`` is one (a derived
    image's ``/opt/prebuilt-cache``); ``path/opt/prebuilt-cache/<hash>`` is one
    (a derived image's whole tree); ``path`` holds family directories with
    tree documents (an artifact mounted as an image volume). Raises
    :class:`NotFoundError` when it is none of these.
    """
    prebuilt = DEFAULT_PREBUILT.strip("/")
    for layout in (path, path / fingerprint_hash, path / prebuilt / fingerprint_hash):
        try:
            if (layout / "oci-layout").is_file():
                return f"oci:{layout}"
        except OSError as exc:
            raise source_error(exc, path) from None
    docs: dict[str, tuple[FamilyTree, str]] = {}
    for name in FAMILIES:
        try:
            if (path / name).is_symlink():
                # Followed, it would make files outside the tree look like the family's.
                raise UnsafeArtifactError(f"{path / name} is a symlink, not the family's directory")
            doc_path = path / name / TREE_DOC
            # A link is not the family's document (never followed); anything else
            # that is there is opened, and refused unless it is a regular file.
            if os.path.lexists(doc_path) and not doc_path.is_symlink():
                docs[name] = _read_doc(doc_path, name)
        except OSError as exc:
            raise source_error(exc, path) from None
    if not docs:
        raise NotFoundError(
            f"{path} holds no artifact for fingerprint {fingerprint_hash[:12]}...: no OCI layout "
            f"(there, at <hash>/ or at {prebuilt}/<hash>/) and no family directory with {TREE_DOC}",
            hint="mount the artifact (format 2) or the derived image there, or pass --store",
        )
    return MountedTree(path.absolute(), docs)


def _read_doc(path: Path, family: str) -> tuple[FamilyTree, str]:
    data = read_regular(path, config.MAX_TREE_DOC)
    doc = FamilyTree.from_json(data, source=str(path))
    if doc.family != family:
        raise IntegrityError(f"{path} describes family {doc.family!r}, not {family!r}")
    return doc, digest_of(data)
