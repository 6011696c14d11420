from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
from cachetrees import harvest_environ

from artifactd.build.harvest import HarvestResult, harvest
from artifactd.errors import IntegrityError, NotFoundError, UsageError
from artifactd.families import FAMILIES
from artifactd.families.base import Family
from artifactd.fingerprint.model import Fingerprint
from artifactd.fingerprint.probe import probe_fingerprint
from artifactd.format.oci import ANN_REF_NAME, MANIFEST_MEDIA_TYPE, family_tag, full_tag
from artifactd.format.unpack import unpack_layer
from artifactd.stores import layout as layout_module
from artifactd.stores import open_store
from artifactd.stores.artifacts import read_artifact
from artifactd.stores.layout import LayoutStore

KEY = "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo"


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def blob_dir(store: LayoutStore) -> Path:
    return store.root / "blobs" / "sha256"


def blob_file(store: LayoutStore, digest: str) -> Path:
    return blob_dir(store) / digest.split(":", 1)[1]


def flip_byte(path: Path, index: int) -> None:
    data = bytearray(path.read_bytes())
    data[index % len(data)] ^= 0x01
    os.chmod(path, 0o644)
    path.write_bytes(bytes(data))


def manifest_bytes(n: int) -> bytes:
    return json.dumps(
        {"schemaVersion": 2, "mediaType": MANIFEST_MEDIA_TYPE, "n": n}, sort_keys=True
    ).encode()


# --------------------------------------------------------------------------
# LayoutStore basics
# --------------------------------------------------------------------------


def test_create_writes_layout_files(tmp_path: Path) -> None:
    root = tmp_path / "a" / "store"
    store = LayoutStore(root, create=True)
    assert store.ref == f"oci:{root}"
    assert json.loads((root / "oci-layout").read_bytes()) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads((root / "index.json").read_bytes())
    assert index["schemaVersion"] == 2
    assert index["manifests"] == []
    assert (root / "blobs" / "sha256").is_dir()
    assert store.list_tags() == []
    # Re-creating an existing layout keeps its index.
    digest = store.put_manifest(manifest_bytes(1), MANIFEST_MEDIA_TYPE, ["keep"])
    again = LayoutStore(root, create=True)
    assert again.list_tags() == ["keep"]
    ref = again.get_manifest("keep")
    assert ref is not None
    assert ref.digest == digest


def test_open_store_prefix_and_create(tmp_path: Path) -> None:
    store = open_store(f"oci:{tmp_path / 's'}", create=True)
    assert isinstance(store, LayoutStore)
    assert (tmp_path / "s" / "oci-layout").is_file()
    assert open_store(f"oci:{tmp_path / 's'}").list_tags() == []
    with pytest.raises(UsageError):
        open_store("oci:")
    with pytest.raises(UsageError):
        open_store("ftp://example/x")


@pytest.mark.parametrize("existing", [True, False])
def test_opening_a_non_layout_dir_fails_with_hint(tmp_path: Path, existing: bool) -> None:
    root = tmp_path / "plain"
    if existing:
        root.mkdir()
        (root / "something").write_text("x")
    with pytest.raises(NotFoundError) as info:
        LayoutStore(root)
    assert info.value.hint
    assert "oci-layout" in str(info.value)
    with pytest.raises(NotFoundError) as info2:
        open_store(f"oci:{root}")
    assert info2.value.hint
    assert not (root / "oci-layout").exists()
    assert not (root / "index.json").exists()


def test_put_blob_round_trip_and_dedup(tmp_path: Path) -> None:
    store = LayoutStore(tmp_path / "s", create=True)
    src = tmp_path / "blob.bin"
    data = os.urandom(3 * (1 << 20) + 17)
    src.write_bytes(data)
    digest = sha(data)
    assert not store.has_blob(digest)
    assert store.put_blob(src, digest, len(data)) == len(data)
    assert store.has_blob(digest)
    assert blob_file(store, digest).read_bytes() == data
    assert store.put_blob(src, digest, len(data)) == 0
    with store.open_blob(digest, len(data)) as f:
        assert f.read() == data
    assert sorted(p.name for p in blob_dir(store).iterdir()) == [digest.split(":")[1]]


@pytest.mark.parametrize("what", ["digest", "size", "both"])
def test_put_blob_rejects_mismatch_and_leaves_nothing(tmp_path: Path, what: str) -> None:
    store = LayoutStore(tmp_path / "s", create=True)
    src = tmp_path / "blob.bin"
    data = b"real content"
    src.write_bytes(data)
    digest = sha(b"other content") if what in ("digest", "both") else sha(data)
    size = len(data) + (1 if what in ("size", "both") else 0)
    with pytest.raises(IntegrityError):
        store.put_blob(src, digest, size)
    assert not store.has_blob(digest)
    assert list(blob_dir(store).iterdir()) == []
    assert not any(p.name.startswith(".tmp-") for p in store.root.rglob("*"))


def test_malformed_digests_are_rejected(tmp_path: Path) -> None:
    store = LayoutStore(tmp_path / "s", create=True)
    src = tmp_path / "blob.bin"
    src.write_bytes(b"x")
    for bad in ("sha256:../../etc/passwd", "md5:abc", "sha256:" + "A" * 64, ""):
        with pytest.raises(IntegrityError):
            store.put_blob(src, bad, 1)
        with pytest.raises(IntegrityError):
            store.has_blob(bad)
    assert list(blob_dir(store).iterdir()) == []


def test_open_missing_blob_raises_not_found(tmp_path: Path) -> None:
    store = LayoutStore(tmp_path / "s", create=True)
    missing = sha(b"never stored")
    with pytest.raises(NotFoundError, match="no blob"), store.open_blob(missing, 12):
        pass
    assert not store.has_blob(missing)


def test_put_blob_bytes(tmp_path: Path) -> None:
    store = LayoutStore(tmp_path / "s", create=True)
    digest = store.put_blob_bytes(b'{"a": 1}')
    assert digest == sha(b'{"a": 1}')
    assert store.has_blob(digest)
    assert store.put_blob_bytes(b'{"a": 1}') == digest
    assert blob_file(store, digest).read_bytes() == b'{"a": 1}'


# --------------------------------------------------------------------------
# manifests and tags
# --------------------------------------------------------------------------


def test_put_manifest_tags_and_retag(tmp_path: Path) -> None:
    store = LayoutStore(tmp_path / "s", create=True)
    one, two = manifest_bytes(1), manifest_bytes(2)
    d1 = store.put_manifest(one, MANIFEST_MEDIA_TYPE, ["b", "a"])
    assert d1 == sha(one)
    assert store.list_tags() == ["a", "b"]
    ref = store.get_manifest("a")
    assert ref is not None
    assert (ref.data, ref.digest, ref.media_type) == (one, d1, MANIFEST_MEDIA_TYPE)
    by_digest = store.get_manifest(d1)
    assert by_digest is not None
    assert by_digest.data == one
    assert store.get_manifest("nope") is None
    assert store.get_manifest(sha(b"absent")) is None

    d2 = store.put_manifest(two, MANIFEST_MEDIA_TYPE, ["b"])
    assert store.list_tags() == ["a", "b"]
    b = store.get_manifest("b")
    a = store.get_manifest("a")
    assert b is not None
    assert a is not None
    assert b.digest == d2
    assert a.digest == d1
    index = json.loads((store.root / "index.json").read_bytes())
    refs = [(m.get("annotations") or {}).get(ANN_REF_NAME) for m in index["manifests"]]
    assert sorted(map(str, refs)) == ["a", "b"]
    # Retagging b back: still one descriptor per tag.
    store.put_manifest(one, MANIFEST_MEDIA_TYPE, ["b"])
    b = store.get_manifest("b")
    assert b is not None
    assert b.digest == d1
    index = json.loads((store.root / "index.json").read_bytes())
    assert len(index["manifests"]) == 2
    assert list(store.iter_tags("a")) == ["a"]


def test_the_index_is_parsed_once_per_version_and_any_rewrite_is_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lookups reuse the last read while index.json is the same file; a change is read again."""
    parsed: list[int] = []
    real_loads = layout_module.loads  # type: ignore[attr-defined]

    def counting_loads(data: bytes) -> object:
        parsed.append(len(data))
        return real_loads(data)

    monkeypatch.setattr(layout_module, "loads", counting_loads)
    writer = LayoutStore(tmp_path / "s", create=True)
    d1 = writer.put_manifest(manifest_bytes(1), MANIFEST_MEDIA_TYPE, ["a"])
    reader = LayoutStore(tmp_path / "s")
    parsed.clear()
    looked_up = [reader.tag_digest("a"), reader.tag_digest("b"), reader.tag_digest("a")]
    assert looked_up == [d1, None, d1]
    assert len(parsed) == 1, "three lookups, one parse"
    # Another writer (another process, in life) replaces the file by rename: seen at once.
    d2 = writer.put_manifest(manifest_bytes(2), MANIFEST_MEDIA_TYPE, ["b"])
    assert reader.tag_digest("b") == d2
    # A tool that rewrites index.json in place (same inode, new bytes) is seen too.
    index = tmp_path / "s" / "index.json"
    inode = index.stat().st_ino
    doc = json.loads(index.read_bytes())
    doc["manifests"] = [m for m in doc["manifests"] if m["digest"] != d2]
    with open(index, "r+b") as f:
        f.truncate(0)
        f.write(json.dumps(doc).encode())
    assert index.stat().st_ino == inode
    assert reader.tag_digest("b") is None
    # Gone altogether: an empty index, not the last one read.
    index.unlink()
    assert reader.tag_digest("a") is None


def test_invalid_tag_is_rejected_before_writing(tmp_path: Path) -> None:
    store = LayoutStore(tmp_path / "s", create=True)
    with pytest.raises(UsageError):
        store.put_manifest(manifest_bytes(1), MANIFEST_MEDIA_TYPE, ["bad tag/with:stuff"])
    assert store.list_tags() == []
    assert list(blob_dir(store).iterdir()) == []


def test_untagged_manifest_is_indexed_once(tmp_path: Path) -> None:
    store = LayoutStore(tmp_path / "s", create=True)
    d = store.put_manifest(manifest_bytes(1), MANIFEST_MEDIA_TYPE, [])
    store.put_manifest(manifest_bytes(1), MANIFEST_MEDIA_TYPE, [])
    index = json.loads((store.root / "index.json").read_bytes())
    assert [m["digest"] for m in index["manifests"]] == [d]
    assert store.list_tags() == []


def test_concurrent_put_manifest_loses_no_tag(tmp_path: Path) -> None:
    root = tmp_path / "s"
    LayoutStore(root, create=True)
    threads = 8
    rounds = 5
    barrier = threading.Barrier(threads)
    digests: dict[str, str] = {}
    errors: list[BaseException] = []

    def work(i: int) -> None:
        store = LayoutStore(root)  # each thread its own handle, as separate harvests would
        try:
            for r in range(rounds):
                barrier.wait()
                tag = f"t{i}-r{r}"
                digests[tag] = store.put_manifest(
                    manifest_bytes(i * 100 + r), MANIFEST_MEDIA_TYPE, [tag]
                )
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert errors == []
    store = LayoutStore(root)
    expected = sorted(f"t{i}-r{r}" for i in range(threads) for r in range(rounds))
    assert store.list_tags() == expected
    for tag, digest in digests.items():
        ref = store.get_manifest(tag)
        assert ref is not None
        assert ref.digest == digest
    assert not any(p.name.startswith(".tmp-") for p in root.rglob("*"))


def test_concurrent_create_does_not_clobber_tags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A creator that found no index.json is held just before writing it; meanwhile another
    # creates the layout and tags into it. The held creator must not overwrite that tag.
    root = tmp_path / "s"
    real_write_index = LayoutStore._write_index
    paused = threading.Event()
    resume = threading.Event()
    early_done = threading.Event()
    errors: list[BaseException] = []

    def write_index(self: LayoutStore, index: dict[str, object]) -> None:
        if threading.current_thread().name == "late-creator":
            paused.set()
            resume.wait(10)
        real_write_index(self, index)

    def early() -> None:
        try:
            store = LayoutStore(root, create=True)
            store.put_manifest(manifest_bytes(1), MANIFEST_MEDIA_TYPE, ["early"])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            early_done.set()

    monkeypatch.setattr(LayoutStore, "_write_index", write_index)
    late = threading.Thread(
        target=LayoutStore, args=(root,), kwargs={"create": True}, name="late-creator"
    )
    other = threading.Thread(target=early, name="early-creator")
    late.start()
    try:
        assert paused.wait(10)  # the late creator is about to write index.json
        other.start()
        # A store that writes the index under its lock makes the early creator wait here.
        early_done.wait(0.3)
    finally:
        resume.set()
        late.join(10)
        if other.is_alive() or other.ident is not None:
            other.join(10)
    assert not late.is_alive()
    assert not other.is_alive()
    assert errors == []
    assert LayoutStore(root).list_tags() == ["early"]


# --------------------------------------------------------------------------
# harvest, publish, read_artifact
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fingerprint() -> Fingerprint:
    return probe_fingerprint(gpu_arch="sm_90a", use_nvml=False)


@dataclass
class Caches:
    generic: Path
    triton: Path
    environ: dict[str, str]


def make_caches(base: Path) -> Caches:
    gen = base / "generic"
    (gen / "bin").mkdir(parents=True)
    (gen / "a.cubin").write_bytes(b"\x00cubin-a")
    (gen / "bin" / "tool.so").write_bytes(b"\x7fELF")
    os.chmod(gen / "bin" / "tool.so", 0o755)  # noqa: S103 - an executable on purpose
    (gen / "locks").mkdir()
    (gen / "locks" / "held").write_bytes(b"")
    tri = base / "triton"
    (tri / KEY).mkdir(parents=True)
    (tri / KEY / "k.cubin").write_bytes(b"\x00triton-cubin")
    (tri / KEY / "k.json").write_bytes(b'{"name": "k"}')
    group = {"child_paths": {"k.cubin": f"{tri}/{KEY}/k.cubin", "k.json": f"{tri}/{KEY}/k.json"}}
    (tri / KEY / "__grp__k.json").write_text(json.dumps(group))
    return Caches(gen, tri, harvest_environ(base))


@pytest.fixture
def caches(tmp_path: Path) -> Caches:
    return make_caches(tmp_path / "caches")


@pytest.fixture
def harvested(
    tmp_path: Path, caches: Caches, fingerprint: Fingerprint
) -> tuple[LayoutStore, HarvestResult]:
    store = LayoutStore(tmp_path / "store", create=True)
    return store, harvest(store, fingerprint, environ=caches.environ)


def test_harvest_tags(
    harvested: tuple[LayoutStore, HarvestResult], fingerprint: Fingerprint
) -> None:
    store, result = harvested
    expected = {full_tag(fingerprint.hash)}
    for name in ("generic", "triton"):
        fam = FAMILIES[name]
        expected.add(family_tag(name, fingerprint.scope_key(name, fam.scope, fam.scope_revision)))
    assert set(store.list_tags()) == expected
    assert set(result.tags) == expected
    assert result.tags[0] == f"fp-{fingerprint.hash}"
    assert result.fingerprint_hash == fingerprint.hash
    assert "inductor" in result.not_found
    assert not {"triton", "generic"} & set(result.not_found)
    assert {f.family for f in result.families} == {"generic", "triton"}
    ref = store.get_manifest(result.tags[0])
    assert ref is not None
    assert ref.digest == result.digest
    assert result.bytes_uploaded > 0
    generic = next(f for f in result.families if f.family == "generic")
    assert generic.files == 2
    assert generic.skipped == 1  # locks/


def test_second_harvest_uploads_nothing(
    harvested: tuple[LayoutStore, HarvestResult], caches: Caches, fingerprint: Fingerprint
) -> None:
    store, first = harvested
    blobs_before = sorted(p.name for p in blob_dir(store).iterdir())
    second = harvest(store, fingerprint, environ=caches.environ)
    assert second.bytes_uploaded == 0
    assert second.bytes_skipped == first.bytes_uploaded
    assert second.digest == first.digest
    assert sorted(second.tags) == sorted(first.tags)
    assert sorted(p.name for p in blob_dir(store).iterdir()) == blobs_before


def test_harvest_of_a_moved_copy_is_identical(
    harvested: tuple[LayoutStore, HarvestResult], tmp_path: Path, fingerprint: Fingerprint
) -> None:
    store, first = harvested
    moved = make_caches(tmp_path / "elsewhere" / "other")
    for n, path in enumerate(sorted((tmp_path / "elsewhere").rglob("*"))):
        os.utime(path, (2_000_000 + n, 2_000_000 + n))
    second = harvest(store, fingerprint, environ=moved.environ)
    assert second.bytes_uploaded == 0
    assert second.digest == first.digest


def test_read_artifact_returns_config(
    harvested: tuple[LayoutStore, HarvestResult], fingerprint: Fingerprint
) -> None:
    store, result = harvested
    art = read_artifact(store, full_tag(fingerprint.hash))
    assert art is not None
    assert art.digest == result.digest
    assert art.config.kind == "full"
    assert art.config.fingerprint_hash == fingerprint.hash
    assert {rec.family for rec in art.config.layers} == {"generic", "triton"}
    assert [d.digest for d in art.manifest.layers] == [rec.digest for rec in art.config.layers]
    generic = art.config.layer("generic")
    assert generic is not None
    assert {f.path for f in generic.files} == {"cache/a.cubin", "cache/bin/tool.so"}
    assert {s.path for s in generic.skipped} == {"cache/locks"}
    by_digest = read_artifact(store, result.digest)
    assert by_digest is not None
    assert by_digest.config == art.config
    assert read_artifact(store, "fp-" + "0" * 64) is None

    for fam_tag in result.tags[1:]:
        fam_art = read_artifact(store, fam_tag)
        assert fam_art is not None
        assert fam_art.config.kind == "family"
        assert len(fam_art.config.layers) == 1
        assert fam_tag.startswith(fam_art.config.layers[0].family + "-")
        assert result.publish is not None
        family = fam_art.config.layers[0].family
        assert fam_art.digest == result.publish.family_digests[family]


def _relocated(family: Family, member: str, data: bytes) -> bytes:
    del member
    return family.relocate(data, "/restored")


def test_stored_layers_unpack_and_relocate(
    harvested: tuple[LayoutStore, HarvestResult], caches: Caches, tmp_path: Path
) -> None:
    store, result = harvested
    art = read_artifact(store, result.digest)
    assert art is not None
    for rec in art.config.layers:
        fam = FAMILIES[rec.family]
        staging = tmp_path / "stage" / rec.family
        with store.open_blob(rec.digest, rec.size) as blob:
            res = unpack_layer(
                blob,
                digest=rec.digest,
                size=rec.size,
                entries=rec.files,
                staging=staging,
                components=frozenset(rec.components),
                relocate=functools.partial(_relocated, fam),
                record=rec,
                prefix=art.config.member_prefix(rec.family),
            )
        assert res.files == len(rec.files)
    assert (tmp_path / "stage/generic/cache/bin/tool.so").read_bytes() == b"\x7fELF"
    group = json.loads((tmp_path / f"stage/triton/cache/{KEY}/__grp__k.json").read_bytes())
    assert group["child_paths"]["k.cubin"] == f"/restored/{KEY}/k.cubin"


def _config_digest(store: LayoutStore, reference: str) -> str:
    ref = store.get_manifest(reference)
    assert ref is not None
    return str(json.loads(ref.data)["config"]["digest"])


@pytest.mark.parametrize("index", [0, 37, -2])
def test_corrupt_config_blob_is_detected(
    harvested: tuple[LayoutStore, HarvestResult], index: int
) -> None:
    store, result = harvested
    tag = result.tags[0]
    flip_byte(blob_file(store, _config_digest(store, tag)), index)
    with pytest.raises(IntegrityError):
        read_artifact(store, tag)


def test_tampered_but_valid_config_blob_is_detected(
    harvested: tuple[LayoutStore, HarvestResult],
) -> None:
    store, result = harvested
    path = blob_file(store, _config_digest(store, result.tags[0]))
    doc = json.loads(path.read_bytes())
    builder = doc["provenance"]["builder"]
    doc["provenance"]["builder"] = builder[:-1] + ("x" if builder[-1] != "x" else "y")
    path.write_bytes(json.dumps(doc, separators=(",", ":"), sort_keys=True).encode())
    with pytest.raises(IntegrityError, match="does not match"):
        read_artifact(store, result.tags[0])


def test_truncated_config_blob_is_detected(harvested: tuple[LayoutStore, HarvestResult]) -> None:
    store, result = harvested
    path = blob_file(store, _config_digest(store, result.tags[0]))
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(IntegrityError):
        read_artifact(store, result.tags[0])


def test_missing_config_blob_is_reported(harvested: tuple[LayoutStore, HarvestResult]) -> None:
    store, result = harvested
    blob_file(store, _config_digest(store, result.tags[0])).unlink()
    with pytest.raises((NotFoundError, IntegrityError)):
        read_artifact(store, result.tags[0])


@pytest.mark.parametrize("index", [0, 50, -3])
def test_corrupt_manifest_blob_is_detected_by_tag(
    harvested: tuple[LayoutStore, HarvestResult], index: int
) -> None:
    store, result = harvested
    flip_byte(blob_file(store, result.digest), index)
    with pytest.raises(IntegrityError, match="corrupt"):
        read_artifact(store, result.tags[0])


def test_corrupt_manifest_blob_is_detected_by_digest(
    harvested: tuple[LayoutStore, HarvestResult],
) -> None:
    store, result = harvested
    flip_byte(blob_file(store, result.digest), 0)  # '{' -> 'z': no longer JSON
    with pytest.raises(IntegrityError):
        read_artifact(store, result.digest)


def test_corrupt_manifest_by_digest_valid_json(
    harvested: tuple[LayoutStore, HarvestResult],
) -> None:
    store, result = harvested
    path = blob_file(store, result.digest)
    doc = json.loads(path.read_bytes())
    doc["annotations"]["io.artifactd.kind"] = "tampered"
    path.write_bytes(json.dumps(doc).encode())
    with pytest.raises(IntegrityError, match="corrupt"):
        read_artifact(store, result.digest)


def test_tag_pointing_at_missing_manifest_blob(
    harvested: tuple[LayoutStore, HarvestResult],
) -> None:
    store, result = harvested
    blob_file(store, result.digest).unlink()
    with pytest.raises(IntegrityError, match="missing"):
        read_artifact(store, result.tags[0])


# --------------------------------------------------------------------------
# interop with the real skopeo
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def skopeo() -> str:
    path = shutil.which("skopeo")
    if path is None:
        pytest.fail(
            "skopeo is not on PATH: the OCI-layout interop tests need the real binary "
            "(apt-get install skopeo)"
        )
    return path


def run_skopeo(skopeo: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    proc = subprocess.run([skopeo, "--insecure-policy", *args], capture_output=True, timeout=60)
    assert proc.returncode == 0, (
        f"skopeo {' '.join(args)} failed ({proc.returncode}): {proc.stderr.decode()}"
    )
    return proc


def test_skopeo_inspect(
    skopeo: str, harvested: tuple[LayoutStore, HarvestResult], fingerprint: Fingerprint
) -> None:
    store, result = harvested
    art = read_artifact(store, result.tags[0])
    assert art is not None
    for tag in result.tags:
        info = json.loads(run_skopeo(skopeo, "inspect", f"oci:{store.root}:{tag}").stdout)
        ref = read_artifact(store, tag)
        assert ref is not None
        assert info["Digest"] == ref.digest
        assert info["Layers"] == [d.digest for d in ref.manifest.layers]
        assert info["Os"] == "linux"
    full = json.loads(run_skopeo(skopeo, "inspect", f"oci:{store.root}:{result.tags[0]}").stdout)
    assert set(full["Layers"]) == {rec.digest for rec in art.config.layers}
    assert len(full["Layers"]) == 2


def test_skopeo_raw_manifest_digest(
    skopeo: str, harvested: tuple[LayoutStore, HarvestResult]
) -> None:
    store, result = harvested
    raw = run_skopeo(skopeo, "inspect", "--raw", f"oci:{store.root}:{result.tags[0]}").stdout
    assert sha(raw) == result.digest
    assert json.loads(raw)["artifactType"] == "application/vnd.artifactd.cache.v1"
    config = run_skopeo(
        skopeo, "inspect", "--config", "--raw", f"oci:{store.root}:{result.tags[0]}"
    ).stdout
    assert sha(config) == _config_digest(store, result.tags[0])


def test_skopeo_copy_then_artifactd_reads_it(
    skopeo: str,
    harvested: tuple[LayoutStore, HarvestResult],
    tmp_path: Path,
    caches: Caches,
    fingerprint: Fingerprint,
) -> None:
    store, result = harvested
    tag = result.tags[0]
    dest = tmp_path / "copies" / "store2"
    dest.parent.mkdir(parents=True)
    run_skopeo(skopeo, "copy", f"oci:{store.root}:{tag}", f"oci:{dest}:{tag}")

    copied = open_store(f"oci:{dest}")
    assert isinstance(copied, LayoutStore)
    assert copied.list_tags() == [tag]
    art = read_artifact(copied, tag)
    original = read_artifact(store, tag)
    assert art is not None
    assert original is not None
    assert art.digest == result.digest
    assert art.config == original.config
    for rec in art.config.layers:
        assert copied.has_blob(rec.digest)
        assert (
            blob_file(copied, rec.digest).read_bytes() == blob_file(store, rec.digest).read_bytes()
        )

    # And back: artifactd harvests into the skopeo-written layout without re-uploading layers.
    again = harvest(copied, fingerprint, environ=caches.environ)
    assert again.digest == result.digest
    assert tag in copied.list_tags()
    assert set(copied.list_tags()) == set(result.tags)
    layer_bytes = sum(rec.size for rec in art.config.layers)
    assert again.bytes_skipped >= layer_bytes
