"""Format 2: artifacts that mount as image volumes, restore from the tree, and format 1 still reads.

A format-2 layer puts every member under ``<family>/`` and ends with the
family's tree document, so the layers of one artifact, merged as a container
runtime merges them, give one self-describing directory per family. Here the
merge is done three ways: by Python's tarfile (in-process), by ``umoci unpack``
over what ``skopeo copy`` pulled from a real registry (an independent runtime
tool chain; umoci 0.4 reads gzip layers only, so skopeo recompresses on the
way, which changes no byte of the tree), and the restore from each tree is
checked against a restore of the same artifact from the registry.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zstandard
from conftest import clean_env, run_artifactd
from registry_server import RegistryServer

from artifactd.build.harvest import harvest
from artifactd.errors import IntegrityError, SchemaError, UnsafeArtifactError
from artifactd.fingerprint.model import Fingerprint
from artifactd.format.config import ArtifactConfig, FamilyTree
from artifactd.format.oci import TREE_DOC
from artifactd.format.unpack import check_layer, unpack_layer
from artifactd.restore.destination import CacheVolume
from artifactd.restore.mounted import MountedTree, open_dir
from artifactd.restore.policy import RestoreRequest, run_restore
from artifactd.restore.resolve import noop_plan
from artifactd.stores import open_store
from artifactd.stores.artifacts import read_artifact
from artifactd.stores.base import Store

FIXTURE_V1 = Path(__file__).parent / "fixtures" / "format-v1" / "store"
SKOPEO = shutil.which("skopeo")
UMOCI = shutil.which("umoci")


def _tree_digest(root: Path) -> dict[str, str]:
    """Every file and link under ``root``: relative path -> sha256 (or '-> target')."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames) + [d for d in dirnames if Path(dirpath, d).is_symlink()]:
            path = Path(dirpath, name)
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = "-> " + os.readlink(path)
            else:
                out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def _caches_of(target: Path) -> dict[str, str]:
    """The restored cache files of ``target``, without artifactd's own state and env file."""
    tree = _tree_digest(target)
    return {k: v for k, v in tree.items() if not k.startswith(".artifactd/") and "/" in k}


def _layer_tar(store: Store, digest: str, size: int) -> bytes:
    with store.open_blob(digest, size) as blob:
        return zstandard.ZstdDecompressor().decompressobj().decompress(blob.read())


def _runtime_merge(store: Store, reference: str, dest: Path) -> ArtifactConfig:
    """Unpack every layer of an artifact into ``dest``, in order, as a container runtime does."""
    art = read_artifact(store, reference)
    assert art is not None
    dest.mkdir(parents=True, exist_ok=True)
    for desc in art.manifest.layers:
        with tarfile.open(fileobj=io.BytesIO(_layer_tar(store, desc.digest, desc.size))) as tar:
            # The "tar" filter where this Python has filters (3.10.12+): a runtime keeps
            # modes and times, and without one 3.12+ warns that 3.14 changes the default.
            if hasattr(tarfile, "tar_filter"):
                tar.extractall(dest, filter="tar")
            else:
                tar.extractall(dest)  # noqa: S202 - our own layers, just packed by this test
    return art.config


@pytest.fixture
def built(tmp_path: Path, caches: dict[str, str], local_fp: Fingerprint) -> tuple[Store, str]:
    """A triton + generic artifact (both families own a component named ``cache``)."""
    store = open_store(f"oci:{tmp_path / 'store'}", create=True)
    result = harvest(store, local_fp, environ=caches)
    return store, result.digest


def _restore(fp: Fingerprint, target: Path, **request: Any) -> Any:
    raw = json.loads(fp.model_dump_json())
    return run_restore(RestoreRequest(target=target, **{"store": None, **request}), raw)


# --------------------------------------------------------------------------
# The layer format
# --------------------------------------------------------------------------


def test_layers_merge_into_one_directory_per_family(
    built: tuple[Store, str], tmp_path: Path
) -> None:
    store, digest = built
    art = read_artifact(store, digest)
    assert art is not None
    assert art.config.schema_version == 2
    for rec in art.config.layers:
        with tarfile.open(fileobj=io.BytesIO(_layer_tar(store, rec.digest, rec.size))) as tar:
            members = tar.getmembers()
        assert members[0].name == rec.family and members[0].isdir()
        assert all(m.name == rec.family or m.name.startswith(rec.family + "/") for m in members)
        # The tree document comes last: it lists every file, known only once all are packed.
        assert members[-1].name == f"{rec.family}/{TREE_DOC}"
    merged = tmp_path / "merged"
    config = _runtime_merge(store, digest, merged)
    assert sorted(p.name for p in merged.iterdir()) == ["generic", "triton"]
    for rec in config.layers:
        doc = FamilyTree.from_json((merged / rec.family / TREE_DOC).read_bytes(), source="t")
        assert doc == rec.tree()
        for entry in rec.files:
            path = merged / rec.family / entry.path
            if entry.link is None:
                assert hashlib.sha256(path.read_bytes()).hexdigest() == entry.sha256


def test_format_1_artifacts_still_restore(tmp_path: Path) -> None:
    """The committed store was written by the format-1 packer: restore reads it unchanged."""
    shutil.copytree(FIXTURE_V1, tmp_path / "store")
    store = open_store(f"oci:{tmp_path / 'store'}")
    tag = next(t for t in store.iter_tags("fp-"))
    art = read_artifact(store, tag)
    assert art is not None
    assert art.config.schema_version == 1
    target = tmp_path / "target"
    outcome = _restore(art.config.fingerprint, target, store=f"oci:{tmp_path / 'store'}")
    assert outcome.status == "restored", outcome.failure
    # Its config's fingerprint, read today, reads its gpu.count as info.gpu_count, which
    # no hash holds: the old full tag is not this hash; each family's scope tag hits.
    assert art.config.fingerprint.info.gpu_count == 0
    assert {f.family for f in outcome.plan.hits} == {rec.family for rec in art.config.layers}
    generic = art.config.layer("generic")
    assert generic is not None
    for entry in generic.files:
        path = target / "generic" / entry.path.split("/", 1)[1]
        if entry.link is not None:
            assert os.readlink(path) == entry.link == "axpy.sm_90a.cubin"
        else:
            assert hashlib.sha256(path.read_bytes()).hexdigest() == entry.sha256
    groups = list((target / "triton").glob("*/__grp__*.json"))
    assert groups
    for group in groups:  # relocated to the new root on the way in
        for child in json.loads(group.read_text())["child_paths"].values():
            assert child.startswith(str(target / "triton") + "/")


# --------------------------------------------------------------------------
# Restore from a tree
# --------------------------------------------------------------------------


def test_restore_from_a_merged_tree_equals_restore_from_the_store(
    built: tuple[Store, str], tmp_path: Path, local_fp: Fingerprint
) -> None:
    store, digest = built
    merged = tmp_path / "mnt"
    _runtime_merge(store, digest, merged)
    from_store, from_tree = tmp_path / "a", tmp_path / "b"
    assert _restore(local_fp, from_store, store=store.ref).status == "restored"
    outcome = _restore(local_fp, from_tree, from_dir=merged)
    assert outcome.status == "restored", outcome.failure
    assert outcome.plan.store == f"dir:{merged}"
    a, b = _caches_of(from_store), _caches_of(from_tree)
    assert a and a.keys() == b.keys()
    # Files equal byte for byte, except Triton's group files: each names its own root.
    assert {k for k in a if a[k] != b[k]} == {k for k in a if "__grp__" in k}
    for group in from_tree.glob("triton/*/__grp__*.json"):
        for child in json.loads(group.read_text())["child_paths"].values():
            assert child.startswith(str(from_tree / "triton") + "/")
    # Again: a no-op, with the tree unchanged.
    assert _restore(local_fp, from_tree, from_dir=merged).status == "noop"
    tree = open_dir(merged, local_fp.hash)
    assert isinstance(tree, MountedTree)
    assert noop_plan(tree, local_fp.hash, local_fp.flatten(), CacheVolume(from_tree)) is not None


def test_a_tree_for_another_scope_is_a_miss_that_says_why(
    built: tuple[Store, str], tmp_path: Path, local_fp: Fingerprint
) -> None:
    store, digest = built
    merged = tmp_path / "mnt"
    _runtime_merge(store, digest, merged)
    other = local_fp.model_copy(update={"gpu": local_fp.gpu.model_copy(update={"arch": "sm_80"})})
    outcome = _restore(other, tmp_path / "t", from_dir=merged, families=["triton"])
    assert outcome.status == "miss"
    (plan,) = outcome.plan.families
    assert plan.verdict == "miss"
    assert "gpu.arch" in (plan.reason or "")
    assert not (tmp_path / "t" / "triton").exists()


@pytest.mark.parametrize("layout", ["itself", "parent", "image-root"])
def test_from_dir_finds_a_baked_store(
    layout: str, built: tuple[Store, str], tmp_path: Path, local_fp: Fingerprint
) -> None:
    store, _ = built
    src = Path(store.ref.removeprefix("oci:"))
    base = {
        "itself": "",
        "parent": local_fp.hash,
        "image-root": f"opt/prebuilt-cache/{local_fp.hash}",
    }
    where = tmp_path / "image" / base[layout]
    shutil.copytree(src, where)
    outcome = _restore(
        local_fp, tmp_path / "t", from_dir=tmp_path / "image" if layout != "itself" else where
    )
    assert outcome.status == "restored", outcome.failure
    assert outcome.plan.store == f"oci:{where}"


def test_from_dir_without_an_artifact_is_a_clean_failure(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    proc = run_artifactd(
        "restore", "--from-dir", str(tmp_path / "empty"), "--target", str(tmp_path / "t")
    )
    assert proc.returncode == 0, proc.stderr
    assert "holds no artifact" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_artifactd(
        "restore",
        "--from-dir",
        str(tmp_path / "empty"),
        "--target",
        str(tmp_path / "t"),
        "--require",
    )
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    both = run_artifactd(
        "restore", "--from-dir", str(tmp_path), "--store", "oci:x", "--target", str(tmp_path / "t")
    )
    assert both.returncode == 2 and "two sources" in both.stderr


def _doc(merged: Path, family: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((merged / family / TREE_DOC).read_text())
    return data


def _write_doc(merged: Path, family: str, doc: dict[str, Any]) -> None:
    (merged / family / TREE_DOC).write_text(json.dumps(doc))


def _first_file(merged: Path, family: str) -> Path:
    entry = next(e for e in _doc(merged, family)["files"] if e["link"] is None)
    return merged / family / str(entry["path"])


def _extra_file(m: Path) -> None:
    (m / "generic" / "cache" / "planted.so").write_bytes(b"\x7fELF")


def _changed_bytes(m: Path) -> None:
    path = _first_file(m, "generic")
    data = path.read_bytes()
    path.write_bytes(bytes([data[0] ^ 1]) + data[1:])


def _file_becomes_link(m: Path) -> None:
    path = _first_file(m, "generic")
    path.unlink()
    path.symlink_to("/etc/passwd")


def _dir_becomes_link(m: Path) -> None:
    outside = m.parent / "outside"
    shutil.copytree(m / "generic" / "cache" / "sub", outside)
    shutil.rmtree(m / "generic" / "cache" / "sub")
    (m / "generic" / "cache" / "sub").symlink_to(outside)


def _fifo(m: Path) -> None:
    os.mkfifo(m / "generic" / "cache" / "pipe")


def _missing_file(m: Path) -> None:
    _first_file(m, "generic").unlink()


def _doc_of_another_family(m: Path) -> None:
    _write_doc(m, "generic", {**_doc(m, "generic"), "family": "triton"})


def _doc_not_json(m: Path) -> None:
    (m / "generic" / TREE_DOC).write_bytes(b"\xff{not json")


def _doc_lists_a_traversal(m: Path) -> None:
    doc = _doc(m, "generic")
    doc["files"][0]["path"] = "cache/../../escape"
    _write_doc(m, "generic", doc)


def _doc_is_a_link(m: Path) -> None:
    (m / "generic" / TREE_DOC).rename(m / "real-doc.json")
    (m / "generic" / TREE_DOC).symlink_to(m / "real-doc.json")


def _family_dir_is_a_link(m: Path) -> None:
    (m / "generic").rename(m.parent / "elsewhere")
    (m / "generic").symlink_to(m.parent / "elsewhere")


def _stray_entry_in_family_dir(m: Path) -> None:
    (m / "generic" / "evil").mkdir()


TAMPERING: dict[str, tuple[Callable[[Path], None], str]] = {
    "extra file": (_extra_file, "hostile"),
    "changed bytes": (_changed_bytes, "corrupt"),
    "file becomes a link out": (_file_becomes_link, "corrupt"),
    "dir becomes a link out": (_dir_becomes_link, "hostile"),
    "fifo": (_fifo, "hostile"),
    "missing file": (_missing_file, "corrupt"),
    "doc of another family": (_doc_of_another_family, "corrupt"),
    "doc not json": (_doc_not_json, "schema"),
    "doc lists a traversal": (_doc_lists_a_traversal, "hostile"),
    "stray entry in family dir": (_stray_entry_in_family_dir, "hostile"),
    "family dir is a link": (_family_dir_is_a_link, "hostile"),
}


@pytest.mark.parametrize("case", sorted(TAMPERING))
def test_a_tampered_tree_is_refused_and_changes_nothing(
    case: str, built: tuple[Store, str], tmp_path: Path, local_fp: Fingerprint
) -> None:
    store, digest = built
    target = tmp_path / "target"
    assert _restore(local_fp, target, store=store.ref).status == "restored"
    before = _tree_digest(target)
    merged = tmp_path / "mnt"
    _runtime_merge(store, digest, merged)
    tamper, kind = TAMPERING[case]
    tamper(merged)
    outcome = _restore(local_fp, target, from_dir=merged, require=True)
    assert outcome.status == "failed", outcome
    assert outcome.failure is not None
    assert outcome.failure.kind == kind, outcome.failure.message
    assert outcome.exit_code != 0
    assert _tree_digest(target) == before
    assert not list(target.glob(".artifactd/staging*")), "staging left behind"
    lenient = _restore(local_fp, target, from_dir=merged)
    assert lenient.exit_code == 0 and lenient.status == "failed"
    assert _tree_digest(target) == before


def test_a_doc_that_is_a_link_is_not_followed(
    built: tuple[Store, str], tmp_path: Path, local_fp: Fingerprint
) -> None:
    store, digest = built
    merged = tmp_path / "mnt"
    _runtime_merge(store, digest, merged)
    _doc_is_a_link(merged)
    tree = open_dir(merged, local_fp.hash)
    assert isinstance(tree, MountedTree)
    assert set(tree.docs) == {"triton"}  # generic's document is a link: not read


# --------------------------------------------------------------------------
# Hostile format-2 layers (consistent: the digest is of the bytes served)
# --------------------------------------------------------------------------


def _members(tar_bytes: bytes) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    out = []
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        for m in tar.getmembers():
            f = tar.extractfile(m) if m.isreg() else None
            out.append((m, f.read() if f is not None else None))
    return out


def _retar(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return zstandard.ZstdCompressor().compress(buf.getvalue())


def _outside_prefix(ms: list[tuple[tarfile.TarInfo, bytes | None]]) -> None:
    info, data = ms[-2]
    moved = tarfile.TarInfo("cache/" + info.name.split("/")[-1])
    moved.mode, moved.size = info.mode, info.size
    ms.insert(1, (moved, data))


def _doc_differs(ms: list[tuple[tarfile.TarInfo, bytes | None]]) -> None:
    info, data = ms[-1]
    assert data is not None
    doc = json.loads(data)
    doc["files"] = doc["files"][:-1]
    ms[-1] = (info, json.dumps(doc).encode())


def _doc_missing(ms: list[tuple[tarfile.TarInfo, bytes | None]]) -> None:
    ms.pop()


def _doc_twice(ms: list[tuple[tarfile.TarInfo, bytes | None]]) -> None:
    ms.append(ms[-1])


def _family_dir_is_a_file(ms: list[tuple[tarfile.TarInfo, bytes | None]]) -> None:
    info = tarfile.TarInfo(ms[0][0].name)
    info.mode = 0o644
    ms[0] = (info, b"")


def _doc_mode_0755(ms: list[tuple[tarfile.TarInfo, bytes | None]]) -> None:
    ms[-1][0].mode = 0o755


LAYER_ATTACKS: dict[
    str, tuple[Callable[[list[tuple[tarfile.TarInfo, bytes | None]]], None], type[Exception]]
] = {
    "member outside the family dir": (_outside_prefix, UnsafeArtifactError),
    "tree document differs from the record": (_doc_differs, IntegrityError),
    "tree document missing": (_doc_missing, IntegrityError),
    "tree document twice": (_doc_twice, UnsafeArtifactError),
    "family dir is a file": (_family_dir_is_a_file, UnsafeArtifactError),
    "tree document mode 0755": (_doc_mode_0755, UnsafeArtifactError),
}


@pytest.mark.parametrize("case", sorted(LAYER_ATTACKS))
def test_a_hostile_format_2_layer_is_refused(
    case: str, built: tuple[Store, str], tmp_path: Path
) -> None:
    store, digest = built
    art = read_artifact(store, digest)
    assert art is not None
    rec = art.config.layer("generic")
    assert rec is not None
    members = _members(_layer_tar(store, rec.digest, rec.size))
    attack, error = LAYER_ATTACKS[case]
    attack(members)
    blob = _retar(members)
    components = frozenset(rec.components)
    bound = check_layer(rec, components, prefix="generic")
    staging = tmp_path / "staging"
    with pytest.raises(error):
        unpack_layer(
            io.BytesIO(blob),
            digest="sha256:" + hashlib.sha256(blob).hexdigest(),
            size=len(blob),
            entries=rec.files,
            staging=staging,
            components=components,
            max_tar_bytes=bound,
            record=rec,
            prefix="generic",
        )
    # Nothing was written outside staging (the caller then discards it).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["build", "staging", "store"]


def test_the_honest_layer_unpacks_with_the_same_harness(
    built: tuple[Store, str], tmp_path: Path
) -> None:
    """The attack harness itself, untouched: proves the refusals above are the attacks'."""
    store, digest = built
    art = read_artifact(store, digest)
    assert art is not None
    rec = art.config.layer("generic")
    assert rec is not None
    blob = _retar(_members(_layer_tar(store, rec.digest, rec.size)))
    res = unpack_layer(
        io.BytesIO(blob),
        digest="sha256:" + hashlib.sha256(blob).hexdigest(),
        size=len(blob),
        entries=rec.files,
        staging=tmp_path / "staging",
        components=frozenset(rec.components),
        record=rec,
        prefix="generic",
    )
    assert res.files == len(rec.files)
    with pytest.raises(SchemaError):
        FamilyTree.from_json(b"{}", source="x")


# --------------------------------------------------------------------------
# Independent tools: pulled with skopeo from a real registry, unpacked by umoci
# --------------------------------------------------------------------------


def _tool(path: str | None, *args: str) -> None:
    assert path is not None, "skopeo/umoci missing: run scripts/setup.sh"
    proc = subprocess.run([path, *args], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr


def test_an_artifact_unpacked_by_umoci_restores_from_dir(
    tmp_path: Path, registry: RegistryServer, repo: str, caches: dict[str, str]
) -> None:
    env = clean_env({**caches, "HOME": str(tmp_path / "home")})
    store = registry.ref(repo)
    harvested = run_artifactd("harvest", "--store", store, "--json", env=env)
    assert harvested.returncode == 0, harvested.stderr
    tag = "fp-" + json.loads(harvested.stdout)["fingerprint_hash"]
    layout = tmp_path / "pulled"
    _tool(
        SKOPEO,
        "copy",
        "--src-tls-verify=false",
        "--dest-compress-format",
        "gzip",
        "--dest-compress",
        f"docker://{registry.ref(repo)}:{tag}",
        f"oci:{layout}:a",
    )
    bundle = tmp_path / "bundle"
    _tool(UMOCI, "unpack", "--rootless", "--image", f"{layout}:a", str(bundle))
    rootfs = bundle / "rootfs"
    assert sorted(p.name for p in rootfs.iterdir()) == ["generic", "triton"]
    from_tree = run_artifactd(
        "restore",
        "--from-dir",
        str(rootfs),
        "--target",
        str(tmp_path / "b"),
        "--require",
        "--json",
        env=env,
    )
    assert from_tree.returncode == 0, from_tree.stderr
    assert json.loads(from_tree.stdout)["status"] == "restored"
    from_registry = run_artifactd(
        "restore", "--store", store, "--target", str(tmp_path / "a"), "--require", env=env
    )
    assert from_registry.returncode == 0, from_registry.stderr
    a, b = _caches_of(tmp_path / "a"), _caches_of(tmp_path / "b")
    assert a.keys() == b.keys() and len(a) > 5
    assert {k for k in a if a[k] != b[k]} <= {k for k in a if "__grp__" in k}
