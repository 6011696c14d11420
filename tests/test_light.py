"""The light reader accepts only what pydantic accepts, and reads it the same.

A restore reads its documents (the manifest, the artifact config, the local
fingerprint) with :mod:`artifactd.format.light` and hands anything it does not
accept to the pydantic models, which stay the one owner of the format. The
promise, checked here on real documents (a harvest's, the format-1 fixture's, a
probe's) and on every hostile variant this file makes of them: a document the
light reader accepts, pydantic accepts, and the two read the same values (the
light document's JSON is the model's ``model_dump(mode="json")``, every field a
restore uses is equal, the tree document's bytes are equal).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, clean_env, run_artifactd
from pydantic import BaseModel, ValidationError

from artifactd import reports
from artifactd.build.harvest import harvest
from artifactd.fingerprint.key import Document
from artifactd.fingerprint.model import Fingerprint, from_raw
from artifactd.fingerprint.probe import probe_raw
from artifactd.format import light
from artifactd.format.config import ArtifactConfig
from artifactd.format.imagemanifest import ImageManifest
from artifactd.format.views import FILE_FIELDS, LAYER_FIELDS, tree_document
from artifactd.stores import open_store
from artifactd.stores.reading import read_documents

MODELS: dict[str, type[BaseModel]] = {
    "ImageManifest": ImageManifest,
    "ArtifactConfig": ArtifactConfig,
    "Fingerprint": Fingerprint,
}
FORMAT_V1 = REPO / "tests" / "fixtures" / "format-v1" / "store"

#: What each JSON value of a document is replaced with, one at a time: types
#: pydantic converts (strings of numbers, whole floats, booleans), values out of
#: any range, text pydantic refuses, empty and wrong containers.
HOSTILE_VALUES: list[Any] = [
    "1",
    "true",
    1,
    1.0,
    1.5,
    -1,
    0,
    2**63,
    2**70,
    True,
    None,
    "",
    "x" * 300,
    "\ud800",
    "a\n",
    "sha256:" + "0" * 64 + "\n",
    [],
    {},
    ["x"],
    {"count": 1},
    0o7777,
]


def test_the_shapes_are_the_models() -> None:
    """artifactd/format/shapes.py is what scripts/gen_shapes.py reads out of the models now."""
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_shapes.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


@pytest.fixture
def documents(tmp_path: Path, caches: dict[str, str], local_fp: Fingerprint) -> dict[str, bytes]:
    """A harvest's manifest and config, the format-1 fixture's, and a probe's fingerprint."""
    store = open_store(f"oci:{tmp_path / 'store'}", create=True)
    result = harvest(store, local_fp, environ=caches)
    out: dict[str, bytes] = {}
    old = open_store(f"oci:{FORMAT_V1}")
    v1 = next(t for t in old.list_tags() if t.startswith("fp-"))
    for name, st, ref in (("harvest", store, result.digest), ("v1", old, v1)):
        got = st.get_manifest(ref)
        assert got is not None
        manifest = ImageManifest.from_bytes(got.data)
        out[f"{name}-manifest"] = got.data
        out[f"{name}-config"] = st.read_blob(
            manifest.config.digest, manifest.config.size, max_size=1 << 26, what="config"
        )
    out["probe"] = json.dumps(probe_raw()).encode()
    return out


def _root(name: str) -> str:
    if name.endswith("manifest"):
        return "ImageManifest"
    return "Fingerprint" if name == "probe" else "ArtifactConfig"


def _pydantic(root: str, data: bytes) -> BaseModel | None:
    try:
        return MODELS[root].model_validate_json(data)
    except ValidationError:
        return None


def _same(root: str, data: bytes) -> bool:
    """Hold the promise for one document; return whether the light reader accepted it."""
    doc = light.read(root, data)
    if doc is None:
        return False
    model = _pydantic(root, data)
    assert model is not None, f"light accepted what pydantic refuses: {data[:300]!r}"
    assert light.to_json(doc) == model.model_dump(mode="json"), data[:300]
    if root == "ArtifactConfig":
        assert isinstance(model, ArtifactConfig)
        layers: list[Any] = doc.layers  # type: ignore[attr-defined]  # a light ArtifactConfig
        for mine, theirs in zip(layers, model.layers, strict=True):
            for field in LAYER_FIELDS:
                if field != "files":
                    assert getattr(mine, field) == getattr(theirs, field), field
            for a, b in zip(mine.files, theirs.files, strict=True):
                assert all(getattr(a, f) == getattr(b, f) for f in FILE_FIELDS)
            assert tree_document(mine) == theirs.tree().canonical()
            assert tree_document(theirs) == theirs.tree().canonical()
    return True


@pytest.fixture(params=["entry by entry", "a field at a time"])
def reading(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways a list of documents is read: each entry checked, or each field (_columns)."""
    if request.param == "a field at a time":
        monkeypatch.setattr(light, "COLUMNS_FROM", 1)  # every list of models tries it first
    else:
        monkeypatch.setattr(light, "COLUMNS_FROM", 1 << 62)
    return str(request.param)


def test_real_documents_are_read_light_and_alike(documents: dict[str, bytes], reading: str) -> None:
    for name, data in documents.items():
        assert _same(_root(name), data), f"{name}: the light reader left a real document"


def _paths(value: Any, here: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield here
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*here, k))
    elif isinstance(value, list):
        for i, v in enumerate(value[:2]):  # the first two of a list stand for the rest
            yield from _paths(v, (*here, i))


def _variants(doc: dict[str, Any]) -> Iterator[Any]:
    """Every document made from ``doc`` by one hostile change."""
    for path in _paths(doc):
        if not path:
            continue
        parent_path, last = path[:-1], path[-1]
        for value in HOSTILE_VALUES:
            copy = json.loads(json.dumps(doc))
            parent = copy
            for p in parent_path:
                parent = parent[p]
            parent[last] = value
            yield copy
        copy = json.loads(json.dumps(doc))
        parent = copy
        for p in parent_path:
            parent = parent[p]
        if isinstance(parent, dict):
            del parent[last]  # a field left out
            yield copy
            parent["unknown_field"] = 1  # and one nobody knows
            yield copy
            if last == "mediaType":
                parent["media_type"] = parent.pop("unknown_field")  # a name given for an alias
                yield copy


@pytest.mark.slow
def test_no_hostile_variant_is_read_differently(documents: dict[str, bytes], reading: str) -> None:
    accepted = refused = both_refused = 0
    for name, data in documents.items():
        root = _root(name)
        for variant in _variants(json.loads(data)):
            text = json.dumps(variant, ensure_ascii=False).encode("utf-8", "surrogatepass")
            if _same(root, text):
                accepted += 1
            elif _pydantic(root, text) is None:
                both_refused += 1
            else:
                refused += 1  # pydantic converts it: the light reader leaves it to pydantic
    # The variants reach all three outcomes, so the check above had something to check.
    assert accepted > 100 and both_refused > 100 and refused > 10, (accepted, both_refused, refused)


def test_a_document_from_before_the_gpu_count_moved_reads_alike() -> None:
    raw = probe_raw()
    raw["gpu"] = {**raw["gpu"], "count": 8}
    raw["info"] = {k: v for k, v in raw["info"].items() if k != "gpu_count"}
    data = json.dumps(raw).encode()
    assert _same("Fingerprint", data)
    doc = light.read("Fingerprint", data)
    assert light.to_json(doc)["info"]["gpu_count"] == 8


def test_the_light_fingerprint_answers_as_the_model() -> None:
    raw = probe_raw()
    raw["workload"] = {"model": "m", "tp": "2"}
    mine = light.fingerprint_of(raw)
    theirs = from_raw(raw)
    assert isinstance(mine, Document)
    assert mine.hash == theirs.hash
    assert mine.flatten() == theirs.flatten()
    dims = ["gpu.arch", "libraries.torch", "workload", "absent.field"]
    assert mine.select(dims) == theirs.select(dims)
    assert mine.document() == theirs.document()
    # A value the model converts (a count given as text) is the model's to read.
    raw["gpu"] = {**raw["gpu"], "sm_count": "132"}
    assert light.fingerprint_of(raw) is None
    assert from_raw(raw).gpu.sm_count == 132


def test_a_restore_reads_light_and_every_command_reads_the_models(
    tmp_path: Path, caches: dict[str, str], local_fp: Fingerprint
) -> None:
    store = open_store(f"oci:{tmp_path / 'store'}", create=True)
    result = harvest(store, local_fp, environ=caches)
    light_docs = read_documents(store, result.digest, light_read=True)
    model_docs = read_documents(store, result.digest)
    assert light_docs is not None and model_docs is not None
    assert isinstance(light_docs.config, light.Doc)
    assert isinstance(model_docs.config, ArtifactConfig)
    assert light.to_json(light_docs.config) == model_docs.config.model_dump(mode="json")
    # The restore's --json prints the same plan either way (a light layer record included).
    target = tmp_path / "t"
    proc = run_artifactd(
        "restore",
        "--json",
        "--store",
        store.ref,
        "--target",
        str(target),
        "--gpu-arch",
        "sm_90a",
        env=clean_env(),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    plan = json.loads(proc.stdout.strip().splitlines()[-1])["plan"]
    layers = {f["family"]: f["layer"] for f in plan["families"] if f["layer"]}
    assert layers
    for rec in model_docs.config.layers:
        assert layers[rec.family] == rec.model_dump(mode="json")


def test_a_long_layer_is_reported_capped_and_alike_by_both_readers(
    documents: dict[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``restore --json`` lists at most REPORT_MAX_FILES files a layer: the rest are counted."""
    monkeypatch.setattr(reports, "REPORT_MAX_FILES", 2)
    data = documents["harvest-config"]
    model = ArtifactConfig.model_validate_json(data)
    doc = light.read("ArtifactConfig", data)
    assert doc is not None
    long = next(layer for layer in model.layers if len(layer.files) > 2)
    mine = next(layer for layer in doc.layers if layer.family == long.family)  # type: ignore[attr-defined]
    full = long.model_dump(mode="json")
    for record in (long, mine):
        got = reports.layer_document(record)
        assert got is not None
        assert got["files"] == full["files"][:2]
        assert got["files_omitted"] == len(full["files"]) - 2
        assert {k: v for k, v in got.items() if k not in ("files", "files_omitted")} == {
            k: v for k, v in full.items() if k != "files"
        }
    # What the record holds is untouched: the copy is the report's.
    assert len(mine.files) == len(long.files) == len(full["files"])
    monkeypatch.setattr(reports, "REPORT_MAX_FILES", len(full["files"]))
    assert reports.layer_document(mine) == reports.layer_document(long) == full


#: One change to one file entry, each a value or a key the entry-by-entry check decides on.
ENTRY_CHANGES: list[tuple[str, Any]] = [
    ("size", -1),
    ("size", True),
    ("size", 1.0),
    ("size", 2**63),
    ("mode", 512),
    ("mode", "420"),
    ("sha256", "A" * 64),
    ("sha256", "0" * 64 + "\n"),
    ("sha256", "0" * 63),
    # The digest column is checked by its lengths, then its joined text, once:
    ("sha256", "0" * 63 + "\n"),  # the right length, a newline last
    ("sha256", "0" * 63 + "g"),
    ("sha256", ""),
    ("path", "caf\u00e9/x"),  # not ASCII: each entry decides (and accepts)
    ("path", "\ud800"),
    ("path", 7),
    ("link", 5),
    ("mtime", "1"),
    ("mtime", 2**70),
    ("rewrite", 1),
    ("rewrite", None),
    ("unknown_field", 1),
    ("size", KeyError),  # left out
]


@pytest.mark.parametrize(("field", "value"), ENTRY_CHANGES)
@pytest.mark.parametrize("where", [0, 40, -1])
def test_a_long_list_of_file_entries_reads_alike_whatever_entry_changes(
    documents: dict[str, bytes], field: str, value: Any, where: int
) -> None:
    """A config of many files is read a field at a time; one entry anywhere changes the answer.

    The hostile variants change the first two entries of a list; here the list
    is longer than COLUMNS_FROM and the change is at its start, middle or end.
    """
    doc = json.loads(documents["harvest-config"])
    layer = max(doc["layers"], key=lambda layer: len(layer["files"]))
    template = layer["files"][0]
    layer["files"] = [
        {**template, "path": f"{template['path']}-{i}"} for i in range(light.COLUMNS_FROM + 20)
    ]
    layer["unpacked_size"] = template["size"] * len(layer["files"])
    plain = json.dumps(doc).encode()
    read = light.read("ArtifactConfig", plain)
    assert read is not None and _same("ArtifactConfig", plain)
    files = next(x for x in read.layers if x.family == layer["family"]).files  # type: ignore[attr-defined]
    assert light._columns("FileEntry", layer["files"]) is not None  # the fast way took it
    assert [f.path for f in files] == [e["path"] for e in layer["files"]]
    entry = layer["files"][where]
    if value is KeyError:
        del entry[field]
    else:
        entry[field] = value
    assert light._columns("FileEntry", layer["files"]) is None  # each entry decides
    text = json.dumps(doc, ensure_ascii=False).encode("utf-8", "surrogatepass")
    if not _same("ArtifactConfig", text):  # refused: pydantic decides, alike or converting
        assert light.read("ArtifactConfig", text) is None
