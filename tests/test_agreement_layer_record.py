"""Agreement: every producer of a layer record writes the same record for the same files.

Four places make a :class:`~artifactd.format.config.LayerRecord`: a harvest
(a build's cell), a merge repacking the cells' layers, a pod contributing
what it compiled anyway (a delta), and a restore from a mounted tree, which
reads the record from the family's tree document. They are run here on one
family's cache (the same files, the same fingerprint) and their records are
compared: the three that pack agree field for field (the layer is
reproducible, so its digest too), and the mounted tree's record is the same
tree with the document's own digest. And the rule has one owner: a
structural test fails when a module of the package builds a ``LayerRecord``
anywhere but in :func:`artifactd.format.config.layer_record`.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from cachetrees import make_generic_tree

import artifactd
from artifactd.build.harvest import harvest
from artifactd.build.matrix import Cell
from artifactd.build.merge import _repack
from artifactd.events import discard
from artifactd.fingerprint.model import Fingerprint
from artifactd.format.config import FamilyTree, LayerRecord
from artifactd.pod.contribute import _pack
from artifactd.stores import open_store
from artifactd.stores.artifacts import read_artifact

PACKAGE = Path(artifactd.__file__).resolve().parent
FAMILY = "generic"
#: The fields a record has from its tree document (:meth:`LayerRecord.tree`).
TREE_FIELDS = ("family", "scope_key", "scope", "components", "files", "unpacked_size")


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def _records(tmp_path: Path, fp: Fingerprint) -> dict[str, LayerRecord]:
    tree = make_generic_tree(tmp_path / "cache")
    with open_store(f"oci:{tmp_path / 'store'}", create=True) as store:
        result = harvest(store, fp, families=[FAMILY], environ={"ARTIFACTD_GENERIC_DIR": str(tree)})
        art = read_artifact(store, result.digest)
        assert art is not None
        harvested = art.config.layer(FAMILY)
        assert harvested is not None
        cell = Cell(index=0, id="c0", values={})
        merged, _, _ = _repack(store, FAMILY, [(cell, harvested)], tmp_path / "merge", discard)
    marker: Any = {
        "fingerprint_hash": fp.hash,
        "families": {FAMILY: {"scope_key": harvested.scope_key}},
    }
    delta, packed = _pack(
        art.config,
        result.digest,
        marker=marker,
        staged={FAMILY: ({"cache": tree}, 2, 0)},
        work=_mkdir(tmp_path / "contribute"),
        sign_key=None,
    )
    (contributed,) = delta.layers
    doc = packed[FAMILY].tree
    mounted = FamilyTree.from_json(doc.canonical(), source="test").record("sha256:" + "0" * 64)
    return {
        "harvest": harvested,
        "merge": merged,
        "contribute": contributed,
        "mounted": mounted,
    }


def test_every_producer_writes_the_same_record(tmp_path: Path, local_fp: Fingerprint) -> None:
    records = _records(tmp_path, local_fp)
    packed = {name: records[name].model_dump(mode="json") for name in ("merge", "contribute")}
    assert packed == {name: records["harvest"].model_dump(mode="json") for name in packed}
    assert records["harvest"].files and records["harvest"].size > 0
    mounted = records["mounted"]
    for field in TREE_FIELDS:
        assert getattr(mounted, field) == getattr(records["harvest"], field), field
    assert mounted.tree() == records["harvest"].tree()
    assert (mounted.digest, mounted.diff_id, mounted.size) == ("sha256:" + "0" * 64,) * 2 + (0,)


def _builders(path: Path) -> list[str]:
    """The functions (or module) of a module that call ``LayerRecord(...)``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for func in ast.walk(tree):
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(func):
            if isinstance(node, ast.Call):
                name = node.func
                called = name.id if isinstance(name, ast.Name) else getattr(name, "attr", "")
                if called == "LayerRecord":
                    found.append(func.name)
    return found


def test_one_function_builds_a_layer_record() -> None:
    builders = {
        f"{path.relative_to(PACKAGE)}:{name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for name in _builders(path)
    }
    assert builders == {"format/config.py:layer_record"}, (
        "a LayerRecord is built by artifactd.format.config.layer_record alone (a packed "
        f"layer: PackedLayer.record); also built in {sorted(builders)}"
    )
