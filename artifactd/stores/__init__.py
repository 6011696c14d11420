"""Open a store from a reference string.

Store references (documented in docs/guide/using.md):

* ``oci:PATH``: a local OCI image layout directory (skopeo's spelling).
  The embedded default is ``oci:.artifactd/store``.
* ``HOST[:PORT]/REPO``: an OCI registry repository (the registry backend).

Artifact references add a tag or digest: ``oci:PATH:TAG``, ``oci:PATH@sha256:...``.

Modules:

* :mod:`~artifactd.stores.base`: the store interface, where artifacts live.
* :mod:`~artifactd.stores.layout`: a local OCI image layout directory (the default store).
* :mod:`~artifactd.stores.reference`: registry references, parsed and checked.
* :mod:`~artifactd.stores.credentials`: registry credentials from ``ARTIFACTD_REGISTRY_*``
  or the Docker config, each bound to its host.
* :mod:`~artifactd.stores.transport`: HTTP to a registry: authentication, deadlines, retries.
* :mod:`~artifactd.stores.listing`: the one bounded reader of a registry's tag list.
* :mod:`~artifactd.stores.mirrors`: which mirrors a reference is pulled through, and why
  (``--mirror``, containerd's ``hosts.toml``, ``registries.conf``).
* :mod:`~artifactd.stores.pull`: the one pull transport: tags at the origin, content by
  digest from each mirror, verified, then the origin.
* :mod:`~artifactd.stores.registry`: an OCI registry repository as a store.
* :mod:`~artifactd.stores.reading`: the one reader of an artifact's manifest and config,
  verified (light for a restore, the models for every other command).
* :mod:`~artifactd.stores.artifacts`: publish, read and copy artifacts over any store.
* :mod:`~artifactd.stores.retention`: which artifacts ``prune`` keeps and deletes, and ``du``.
* :mod:`~artifactd.stores.nodestore`: the node-local tier: its lock, usage records and gc.
* :mod:`~artifactd.stores.nodetree`: the node store's unpacked layers, checked and served to
  pods by reflink, hard link or copy.
"""

from __future__ import annotations

import os

from artifactd.constants import DEFAULT_PREBUILT, DEFAULT_STORE, ENV_PREBUILT, current_environ
from artifactd.errors import UsageError
from artifactd.fsutil import path_text
from artifactd.records import Record
from artifactd.stores.base import ManifestRef, Store
from artifactd.stores.layout import LayoutStore

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from types import TracebackType

    from artifactd.stores.mirrors import MirrorSettings

__all__ = [
    "ArtifactRef",
    "ManifestRef",
    "Store",
    "default_store",
    "list_tags",
    "open_store",
    "opened",
    "parse_artifact_ref",
]


def open_store(
    ref: str,
    *,
    create: bool = False,
    insecure: bool = False,
    mirrors: MirrorSettings | None = None,
    pins: Mapping[str, str] | None = None,
) -> Store:
    """Open the store named by ``ref``.

    ``create`` makes a missing local layout; ``insecure`` allows plain HTTP to a
    registry that is not on a loopback address. A registry's pulls go through
    the mirrors ``mirrors`` configures (default: the ``ARTIFACTD_*`` variables,
    else containerd's and the containers' files; :mod:`~artifactd.stores.mirrors`);
    ``pins`` maps a tag to the digest used when the registry cannot resolve it.
    """
    ref = ref.strip()
    if ref.startswith("oci:"):
        path = ref[4:]
        if not path:
            raise UsageError("empty path in store reference 'oci:'", hint="use oci:PATH")
        return LayoutStore(path, ref=ref, create=create)
    # lazy: fast path: LATER in artifactd/cli/fast.py, never loaded by a no-op restore
    from artifactd.stores.reference import RegistryRef, looks_like_registry, parse_registry_ref  # noqa: PLC0415

    if looks_like_registry(ref):
        from artifactd.stores.registry import RegistryStore  # noqa: PLC0415  # requests: only when used

        parsed = parse_registry_ref(ref)
        if parsed.reference is not None:
            raise UsageError(
                f"{ref!r} names an artifact, not a store",
                hint=f"drop the tag or digest: {parsed.store}",
            )
        return RegistryStore(
            RegistryRef(parsed.host, parsed.repo), insecure=insecure, mirrors=mirrors, pins=pins
        )
    raise UsageError(
        f"unsupported store reference {ref!r}",
        hint="use oci:PATH for a local OCI layout directory (e.g. oci:.artifactd/store), "
        "or HOST[:PORT]/REPO for a registry",
    )


class ArtifactRef(Record):
    """A store plus a tag or digest inside it."""

    store: str
    reference: str | None


def parse_artifact_ref(text: str) -> ArtifactRef:
    """Split ``oci:PATH:TAG``, ``HOST/REPO:TAG`` or ``...@sha256:..`` into store and reference."""
    # lazy: fast path: LATER in artifactd/cli/fast.py, never loaded by a no-op restore
    from artifactd.stores.reference import looks_like_registry, parse_registry_ref  # noqa: PLC0415

    if not text.startswith("oci:") and looks_like_registry(text):
        parsed = parse_registry_ref(text)
        return ArtifactRef(parsed.store, parsed.reference)
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


def parse_manifest_ref(text: str) -> tuple[str, str]:
    """Return ``(store, tag or digest)`` of a reference that must name a manifest.

    Raises :class:`UsageError` when ``text`` names a store alone.
    """
    parsed = parse_artifact_ref(text)
    if parsed.reference is None:
        raise UsageError(
            f"{text!r} names a store, not an artifact",
            hint="add :TAG or @sha256:DIGEST; `artifactd ls` lists tags",
        )
    return parsed.store, parsed.reference


def opened(store: Store | str, *, create: bool = False, insecure: bool = False) -> _Opened:
    """Give ``store`` itself, or the store a reference names, open for a ``with`` block.

    Library entry points take either, so a command passes the reference it was
    given and a caller that already holds a store passes that (it stays open).
    """
    return _Opened(store, create=create, insecure=insecure)


class _Opened:
    """The block of :func:`opened` (a class: ``contextlib`` is off a pod start's path)."""

    def __init__(self, store: Store | str, *, create: bool, insecure: bool) -> None:
        self._given = store
        self._create = create
        self._insecure = insecure
        self._opened: Store | None = None

    def __enter__(self) -> Store:
        if not isinstance(self._given, str):
            return self._given
        self._opened = open_store(self._given, create=self._create, insecure=self._insecure)
        return self._opened.__enter__()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._opened is not None:
            self._opened.__exit__(kind, error, trace)


def list_tags(ref: str, *, insecure: bool = False) -> list[str]:
    """Return every tag in the store ``ref`` names (``artifactd ls``)."""
    with open_store(ref, insecure=insecure) as st:
        return st.list_tags()


def default_store(fingerprint_hash: str, environ: Mapping[str, str] | None = None) -> str:
    """Return the store a restore without ``--store`` uses.

    A store baked into this runtime image (``$ARTIFACTD_PREBUILT/<hash>/``,
    default ``/opt/prebuilt-cache/<hash>/``, as ``image append`` and
    ``image build`` write it): the one for exactly this fingerprint when it is
    there, else the only one there is (its family tags may still match when,
    say, only the workload differs). No network is needed either way. Else
    the local default, ``oci:.artifactd/store``.
    """
    env = current_environ() if environ is None else environ
    prebuilt = path_text(env.get(ENV_PREBUILT) or DEFAULT_PREBUILT)
    baked = os.path.join(prebuilt, fingerprint_hash)
    if os.path.isfile(os.path.join(baked, "oci-layout")):
        return f"oci:{baked}"
    try:
        names = os.listdir(prebuilt)
    except OSError:
        names = []
    stores = [os.path.join(prebuilt, n) for n in names]
    stores = [d for d in stores if os.path.isfile(os.path.join(d, "oci-layout"))]
    if len(stores) == 1:
        return f"oci:{stores[0]}"
    return DEFAULT_STORE
