"""Family layers packed as production packs them (format 2) and unpacked as a restore does.

:func:`artifactd.format.archive.pack_family` writes format 2 only (members under
``<family>/``, then the family's tree document), so round-trip tests pack and
unpack through here: :func:`pack` gives the layer a fixed scope, :func:`record`
is the layer record a harvest would write for it, and :func:`unpack` extracts
it with that record and the family prefix, as ``restore`` does. Format 1 is
read only, from the committed artifact in ``tests/fixtures/format-v1``.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Callable
from pathlib import Path

import zstandard

from artifactd.families import Family, Located
from artifactd.format.archive import PackedLayer, pack_family
from artifactd.format.config import LayerRecord
from artifactd.format.oci import TREE_DOC
from artifactd.format.unpack import UnpackResult, unpack_layer

#: The fingerprint fields a test layer's scope key stands for.
SCOPE: dict[str, object] = {"round_trip": "test"}

Member = tuple[tarfile.TarInfo, bytes | None]


def scope_key(family: Family) -> str:
    """A fixed, well-formed scope key per family (tests compare layers, not keys)."""
    return hashlib.sha256(f"round-trip/{family.name}".encode()).hexdigest()


def pack(family: Family, located: list[Located], out: Path) -> PackedLayer:
    """Pack ``located`` into ``out`` in format 2, as harvest and merge do."""
    return pack_family(family, located, out, scope_key=scope_key(family), scope=SCOPE)


def record(layer: PackedLayer) -> LayerRecord:
    """The layer record a harvest writes for ``layer``: the package's one builder's."""
    return layer.record()


def unpack(
    layer: PackedLayer,
    staging: Path,
    *,
    relocate: Callable[[str, bytes], bytes] | None = None,
    keep_mtimes: bool = False,
) -> UnpackResult:
    """Verify and extract ``layer`` into ``staging`` as a restore does (format 2)."""
    rec = record(layer)
    with layer.path.open("rb") as blob:
        return unpack_layer(
            blob,
            digest=layer.digest,
            size=layer.size,
            entries=layer.files,
            staging=staging,
            components=frozenset(rec.components),
            relocate=relocate,
            keep_mtimes=keep_mtimes,
            record=rec,
            prefix=rec.family,
        )


def tar_members(path: Path) -> list[Member]:
    """Every member of a layer file, in order, with the data of regular files."""
    raw = zstandard.ZstdDecompressor().decompressobj().decompress(path.read_bytes())
    out: list[Member] = []
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
        for m in tar:
            f = tar.extractfile(m) if m.isreg() else None
            out.append((m, f.read() if f else None))
    return out


def family_members(layer: PackedLayer) -> list[Member]:
    """The members under the family directory, named without it.

    Checks the format-2 frame on the way: the family directory comes first,
    the tree document (byte for byte the layer's tree) last, and nothing lies
    outside the family directory.
    """
    family = layer.tree.family
    members = tar_members(layer.path)
    first, last = members[0], members[-1]
    assert first[0].name == family and first[0].isdir(), first[0].name
    assert last[0].name == f"{family}/{TREE_DOC}", last[0].name
    assert last[1] == layer.tree.canonical()
    inner = members[1:-1]
    for m, _ in inner:
        assert m.name.startswith(family + "/"), m.name
        m.name = m.name[len(family) + 1 :]
    return inner
