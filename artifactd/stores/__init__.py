"""Open a store from a reference string.

Store references (documented in the README):

* ``oci:PATH``: a local OCI image layout directory (skopeo's spelling).
  The embedded default is ``oci:.artifactd/store``.
* ``HOST[:PORT]/REPO``: an OCI registry repository (the registry backend).

Artifact references add a tag or digest: ``oci:PATH:TAG``, ``oci:PATH@sha256:...``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from artifactd.errors import UsageError
from artifactd.stores.base import ManifestRef, Store
from artifactd.stores.layout import LayoutStore

__all__ = ["ArtifactRef", "ManifestRef", "Store", "open_store", "parse_artifact_ref"]


def open_store(ref: str, *, create: bool = False) -> Store:
    """Open the store named by ``ref``; ``create`` makes a missing local layout."""
    ref = ref.strip()
    if ref.startswith("oci:"):
        path = ref[4:]
        if not path:
            raise UsageError("empty path in store reference 'oci:'", hint="use oci:PATH")
        return LayoutStore(Path(path), ref=ref, create=create)
    raise UsageError(
        f"unsupported store reference {ref!r}",
        hint="use oci:PATH for a local OCI layout directory (e.g. oci:.artifactd/store)",
    )


@dataclass(frozen=True)
class ArtifactRef:
    """A store plus a tag or digest inside it."""

    store: str
    reference: str | None


def parse_artifact_ref(text: str) -> ArtifactRef:
    """Split ``oci:PATH:TAG`` / ``oci:PATH@sha256:..`` into store and reference."""
    if "@sha256:" in text:
        store, _, digest = text.rpartition("@")
        return ArtifactRef(store, digest)
    if text.startswith("oci:"):
        body = text[4:]
        path, sep, tag = body.rpartition(":")
        if sep and tag and "/" not in tag:
            return ArtifactRef("oci:" + path, tag)
        return ArtifactRef(text, None)
    return ArtifactRef(text, None)
