"""A node store that links instead of copying, and what a pod can and cannot change through it.

Real parts: a local OCI layout as the origin, a node store on this disk, the
restore library as the init container calls it, and an "engine" that is a
real child process doing what engines do to their cache files (open one for
writing, truncate it, rename a new file over it), as root and as another uid.
A tmpfs (a second filesystem) stands for a target the node store cannot link
into. Nothing here is mocked.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cachetrees import make_triton_tree
from conftest import clean_env, run_artifactd, tmpfs
from diskfaults import unmount

from artifactd.families import FAMILIES
from artifactd.fingerprint.model import Fingerprint
from artifactd.restore.policy import RestoreOutcome, RestoreRequest, run_restore
from artifactd.stores import open_store
from artifactd.stores.layout import LayoutStore
from artifactd.stores.nodestore import TREES_DIR, clear_leftovers, gc
from artifactd.stores.nodetree import STAMP_NAME, OtherRecord, Stale, read_stamp, tree_path

ENGINE = """
import os, sys
how, path = sys.argv[1], sys.argv[2]
if how == "write":  # opens the restored file for writing, in place
    os.chmod(path, 0o644)  # what a root engine (or the file's owner) can do first
    with open(path, "r+b") as f:
        f.write(b"ENGINE WAS HERE")
elif how == "truncate":
    os.truncate(path, 0)
elif how == "append":
    with open(path, "ab") as f:
        f.write(b"more")
elif how == "chmod":
    os.chmod(path, 0o666)
elif how == "rename":  # a new file renamed over the restored one, as caches write entries
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(b"a new entry")
    os.replace(tmp, path)
else:
    raise SystemExit(f"unknown {how}")
"""

#: The same changes, by a shell engine: open for writing, truncate, append, chmod.
SHELL_ENGINE = {
    "write": 'printf X 1<> "$1"',
    "truncate": ': > "$1"',
    "append": 'printf more >> "$1"',
    "chmod": 'chmod 666 "$1"',
}


def _as_nobody() -> None:
    """Run the child as uid and gid 65534 (nobody), not the node store's owner."""
    os.setgid(65534)
    os.setuid(65534)


def _engine(how: str, path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", ENGINE, how, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def origin(tmp_path: Path, local_fp: Fingerprint) -> tuple[str, Path, dict[str, Any]]:
    """An artifact with a generic tree and a Triton cache, published to a local layout."""
    # lazy: the harvest is this fixture's alone
    from artifactd.build.harvest import harvest  # noqa: PLC0415

    gen = tmp_path / "gen"
    (gen / "sub").mkdir(parents=True)
    for i in range(12):
        (gen / "sub" / f"k{i}.cubin").write_bytes(os.urandom(2048 + i))
    (gen / "kernel.so").write_bytes(b"\x7fELF" + os.urandom(4096))
    (gen / "kernel.so").chmod(0o755)
    (gen / "empty").mkdir()
    triton = make_triton_tree(tmp_path / "triton")
    environ = {
        "ARTIFACTD_GENERIC_DIR": str(gen),
        "TRITON_CACHE_DIR": str(triton),
        "HOME": str(tmp_path / "home"),
        "TMPDIR": str(tmp_path / "no-tmp"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "no-inductor"),
    }
    store = open_store(f"oci:{tmp_path / 'origin'}", create=True)
    with store:
        harvest(store, local_fp, families=["generic", "triton"], environ=environ)
    return f"oci:{tmp_path / 'origin'}", gen, json.loads(local_fp.model_dump_json())


def _restore(
    origin: tuple[str, Path, dict[str, Any]], node: Path, target: Path, **extra: Any
) -> tuple[RestoreOutcome, list[dict[str, Any]]]:
    store, _, raw = origin
    events: list[dict[str, Any]] = []
    request = RestoreRequest(
        store=store,
        node_store=f"oci:{node}",
        target=target,
        families=["generic", "triton"],
        require=True,
        **extra,
    )
    outcome = run_restore(request, raw, on_event=events.append)
    assert outcome.status == "restored", outcome.failure
    return outcome, events


def _record(node: Path, family: str) -> Any:
    """``family``'s layer record in the node store's whole artifact."""
    # lazy: only the tests of trees and stamps read an artifact's records
    from artifactd.stores.artifacts import read_artifact  # noqa: PLC0415

    with LayoutStore(node) as st:
        art = read_artifact(st, next(t for t in st.list_tags() if t.startswith("fp-")))
    assert art is not None
    return next(r for r in art.config.layers if r.family == family)


def _served(events: list[dict[str, Any]], family: str) -> dict[str, Any]:
    found = [e for e in events if e.get("event") == "served" and e.get("family") == family]
    assert len(found) == 1, events
    return found[0]


def _stale(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("event") == "tree_stale"]


# --------------------------------------------------------------------------
# Linking, and the family's rule
# --------------------------------------------------------------------------


def test_a_warm_node_store_links_what_the_family_never_writes_and_copies_the_rest(
    origin: tuple[str, Path, dict[str, Any]], tmp_path: Path
) -> None:
    node = tmp_path / "node"
    _restore(origin, node, tmp_path / "a")
    _, events = _restore(origin, node, tmp_path / "b")
    generic = _served(events, "generic")
    assert generic["linked"] == 13 and generic["copied"] == 0  # 12 cubins and kernel.so
    cubin = tmp_path / "b" / "generic" / "sub" / "k3.cubin"
    assert cubin.read_bytes() == (origin[1] / "sub" / "k3.cubin").read_bytes()
    # The pod's file is the node store's own inode, read-only; the executable stays executable.
    assert cubin.stat().st_nlink >= 3 and cubin.stat().st_mode & 0o777 == 0o444
    assert (tmp_path / "b" / "generic" / "kernel.so").stat().st_mode & 0o777 == 0o555
    assert (tmp_path / "b" / "generic" / "empty").is_dir()  # an empty directory travels too
    # Triton: a group file holds the pod's own paths (rewritten per target): always a copy.
    triton = _served(events, "triton")
    assert triton["copied"] == 2 and triton["linked"] == 6
    group = next((tmp_path / "b" / "triton").rglob("__grp__add.json"))
    assert group.stat().st_nlink == 1
    assert str(tmp_path / "b" / "triton") in group.read_text()
    assert str(tmp_path / "a") not in group.read_text()


def test_on_a_busy_disk_a_restore_syncs_its_own_files_never_the_whole_disk(
    origin: tuple[str, Path, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another pod's gigabytes of dirty pages: no syncfs waits on them, and all is still durable.

    The node store's trees and the pod's staging are fsynced file by file
    (``fsutil.make_durable``); the background flusher stays off. The page
    cache's state is the one thing stood in for: this machine's disk is quiet.
    """
    # lazy: the install's own names for the flusher's check, patched like fsutil's
    from artifactd import fsutil  # noqa: PLC0415
    from artifactd.restore import install  # noqa: PLC0415

    ways: list[str] = []
    real_fsync_tree = fsutil.fsync_tree

    def fsync_tree(root: str) -> None:
        ways.append("fsync")
        real_fsync_tree(root)

    def no_syncfs(path: str) -> None:
        ways.append(f"syncfs {path}")

    busy = 1 << 40  # a terabyte dirty: far more than any restore here writes
    for module in (fsutil, install):
        monkeypatch.setattr(module, "dirty_bytes", lambda: busy)
        monkeypatch.setattr(module, "sync_filesystem", no_syncfs)
    monkeypatch.setattr(fsutil, "fsync_tree", fsync_tree)
    node = tmp_path / "node"
    _restore(origin, node, tmp_path / "a")
    # Two layers' trees made in the node store, then the pod's staging: each on its own.
    assert ways == ["fsync"] * 3, ways
    cubin = tmp_path / "a" / "generic" / "sub" / "k3.cubin"
    assert cubin.read_bytes() == (origin[1] / "sub" / "k3.cubin").read_bytes()
    assert (tmp_path / "a" / ".artifactd" / "restored.json").is_file()


def test_every_family_states_which_files_it_writes_in_place() -> None:
    for name, family in FAMILIES.items():
        assert "written_in_place" in type(family).__dict__, f"{name} does not say"
    flashinfer, triton, vllm = FAMILIES["flashinfer"], FAMILIES["triton"], FAMILIES["vllm"]
    assert not flashinfer.shares_inode("cache", "0.7/90/cached_ops/norm/.ninja_log")
    assert not flashinfer.shares_inode("cache", "0.7/90/cached_ops/norm/build.ninja")
    assert flashinfer.shares_inode("cache", "0.7/90/cached_ops/norm/norm.so")
    assert not vllm.shares_inode("cache", "torch_compile_cache/x/vllm_compile_cache.py")
    assert triton.shares_inode("cache", "AAAA/add.cubin")
    assert not triton.shares_inode("cache", "AAAA/__grp__add.json", rewrite=True)
    assert not FAMILIES["cuda-jit"].shares_inode("cache", "index")
    # The CPU demo's precompiled header: a link, not a 156 MB copy.
    assert FAMILIES["inductor"].shares_inode("pch", "precompiled_headers/c10.h.gch")


# --------------------------------------------------------------------------
# What a pod cannot change
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "how",
    [
        "write",
        "truncate",
        pytest.param("append", marks=pytest.mark.slow),
        pytest.param("chmod", marks=pytest.mark.slow),
        "rename",
    ],
)
def test_an_engine_cannot_change_what_the_node_store_serves_the_next_pod(
    origin: tuple[str, Path, dict[str, Any]], tmp_path: Path, how: str
) -> None:
    node = tmp_path / "node"
    _restore(origin, node, tmp_path / "a")
    rel = Path("generic", "sub", "k5.cubin")
    good = (origin[1] / "sub" / "k5.cubin").read_bytes()
    assert (tmp_path / "a" / rel).stat().st_nlink >= 2, "the first pod's file is not a link"
    # The engine (a real process, root as many are) changes its restored file.
    proc = _engine(how, tmp_path / "a" / rel)
    assert proc.returncode == 0, proc.stderr
    changed = (tmp_path / "a" / rel).read_bytes() != good or how == "chmod"
    assert changed
    _, events = _restore(origin, node, tmp_path / "b")
    # The next pod gets the verified bytes, and the node store's tree is whole again.
    assert (tmp_path / "b" / rel).read_bytes() == good
    assert _sha(Path(tree_path(node, _layer(node, "generic"))) / "cache" / "sub" / "k5.cubin") == (
        hashlib.sha256(good).hexdigest()
    )
    if how == "rename":
        # A rename over changes the pod's directory only: nothing to heal.
        assert _stale(events) == []
        assert _served(events, "generic")["linked"] == 13
    else:
        # A write through the shared inode is seen (mtime, size or mode) and healed:
        # the tree is made again from the verified blob, with new inodes.
        assert [e["family"] for e in _stale(events)] == ["generic"]
        assert (tmp_path / "b" / rel).stat().st_ino != (tmp_path / "a" / rel).stat().st_ino
    _, again = _restore(origin, node, tmp_path / "c")
    assert _stale(again) == [] and (tmp_path / "c" / rel).read_bytes() == good


@pytest.mark.slow
def test_an_engine_running_as_another_user_cannot_write_or_chmod_a_linked_file(
    origin: tuple[str, Path, dict[str, Any]], tmp_path: Path
) -> None:
    if os.geteuid() != 0:
        pytest.skip("dropping to another uid needs root")
    # pytest's own temp dirs are private to root: this one the other user can walk.
    shared = Path(tempfile.mkdtemp(prefix="artifactd-nodelink-"))
    try:
        shared.chmod(0o755)
        node = shared / "node"
        _restore(origin, node, shared / "a")
        path = shared / "a" / "generic" / "sub" / "k1.cubin"
        assert path.stat().st_nlink >= 2
        # The engine is a shell here: this uid may not run the test's own Python.
        for how, script in {"read": 'cat "$1" > /dev/null', **SHELL_ENGINE}.items():
            proc = subprocess.run(
                ["/bin/sh", "-c", script, "engine", str(path)],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
                preexec_fn=_as_nobody,
            )
            if how == "read":  # it reaches the file: the refusals are the file's own
                assert proc.returncode == 0, proc.stderr
                continue
            assert proc.returncode != 0, (how, proc.stderr)
            assert "denied" in proc.stderr or "not permitted" in proc.stderr, (how, proc.stderr)
        assert path.read_bytes() == (origin[1] / "sub" / "k1.cubin").read_bytes()
        _, events = _restore(origin, node, shared / "b")
        assert _stale(events) == []
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_copy_linking_never_gives_a_pod_the_node_stores_inode(
    origin: tuple[str, Path, dict[str, Any]], tmp_path: Path
) -> None:
    node = tmp_path / "node"
    _restore(origin, node, tmp_path / "a")
    _, events = _restore(origin, node, tmp_path / "b", node_link="copy")
    assert _served(events, "generic")["linked"] == 0
    path = tmp_path / "b" / "generic" / "sub" / "k2.cubin"
    assert path.stat().st_nlink == 1 and path.stat().st_mode & 0o777 == 0o644
    # The pod's own copy: writing it changes nothing the node store serves.
    assert _engine("write", path).returncode == 0
    _, again = _restore(origin, node, tmp_path / "c")
    assert _stale(again) == []


# --------------------------------------------------------------------------
# Another filesystem, a damaged tree, the stamp, gc
# --------------------------------------------------------------------------


@pytest.fixture
def other_fs(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs: a filesystem the node store cannot hard link into (EXDEV)."""
    with tmpfs(tmp_path / "other", "16m") as mount:
        yield mount


def test_a_target_on_another_filesystem_gets_copies(
    origin: tuple[str, Path, dict[str, Any]], tmp_path: Path, other_fs: Path
) -> None:
    node = tmp_path / "node"
    _restore(origin, node, tmp_path / "a")
    _, events = _restore(origin, node, other_fs / "b")
    served = _served(events, "generic")
    assert served["linked"] == 0 and served["copied"] == 13
    path = other_fs / "b" / "generic" / "sub" / "k4.cubin"
    assert path.read_bytes() == (origin[1] / "sub" / "k4.cubin").read_bytes()
    assert path.stat().st_mode & 0o777 == 0o644


@pytest.fixture
def reflink_fs(tmp_path: Path) -> Iterator[Path]:
    """An XFS with reflinks on a loop device: a filesystem where FICLONE works."""
    mkfs = shutil.which("mkfs.xfs")
    if mkfs is None:
        pytest.skip("no mkfs.xfs (xfsprogs) on this machine: no reflink filesystem to make")
    image, mount = tmp_path / "xfs.img", tmp_path / "xfs"
    with image.open("wb") as f:
        f.truncate(320 << 20)  # sparse; XFS wants 300 MB at least
    made = subprocess.run([mkfs, "-q", "-m", "reflink=1", str(image)], capture_output=True)
    mount.mkdir()
    mounted = (
        made.returncode == 0
        and (
            subprocess.run(["mount", "-o", "loop", str(image), str(mount)], capture_output=True)
        ).returncode
        == 0
    )
    if not mounted:
        pytest.skip("a loop-mounted XFS is not permitted here (needs root and a loop device)")
    try:
        yield mount
    finally:
        unmount(mount)


@pytest.mark.slow
def test_where_the_filesystem_reflinks_every_file_is_the_pods_own(
    origin: tuple[str, Path, dict[str, Any]], reflink_fs: Path
) -> None:
    node = reflink_fs / "node"
    _restore(origin, node, reflink_fs / "a")
    _, events = _restore(origin, node, reflink_fs / "b")
    served = _served(events, "generic")
    assert served["reflinked"] == 13 and served["linked"] == 0, served
    path = reflink_fs / "b" / "generic" / "sub" / "k6.cubin"
    good = (origin[1] / "sub" / "k6.cubin").read_bytes()
    assert path.read_bytes() == good
    assert path.stat().st_nlink == 1 and path.stat().st_mode & 0o777 == 0o644
    # The pod's own copy-on-write copy: a write in place leaves the node store as it was.
    assert _engine("write", path).returncode == 0 and path.read_bytes() != good
    _, again = _restore(origin, node, reflink_fs / "c")
    assert (
        _stale(again) == []
        and (reflink_fs / "c" / "generic" / "sub" / "k6.cubin").read_bytes() == good
    )


@pytest.mark.parametrize(
    "damage",
    [
        "delete",
        pytest.param("stamp", marks=pytest.mark.slow),
        pytest.param("dirs", marks=pytest.mark.slow),
    ],
)
def test_a_damaged_tree_is_made_again_before_it_serves(
    origin: tuple[str, Path, dict[str, Any]], tmp_path: Path, damage: str
) -> None:
    node = tmp_path / "node"
    _restore(origin, node, tmp_path / "a")
    tree = Path(tree_path(node, _layer(node, "generic")))
    if damage == "delete":
        (tree / "cache" / "sub" / "k7.cubin").unlink()
    elif damage == "stamp":
        (tree / STAMP_NAME).write_text("{not json")
    else:  # a stamp naming a directory outside the tree
        doc = json.loads((tree / STAMP_NAME).read_text())
        doc["dirs"].append("cache/../../../escaped")
        (tree / STAMP_NAME).write_text(json.dumps(doc))
    _, events = _restore(origin, node, tmp_path / "b")
    assert [e["family"] for e in _stale(events)] == ["generic"]
    assert _served(events, "generic")["linked"] == 13
    assert not (tmp_path / "escaped").exists()
    assert (tmp_path / "b" / "generic" / "sub" / "k7.cubin").read_bytes() == (
        origin[1] / "sub" / "k7.cubin"
    ).read_bytes()


def test_a_stamp_is_held_to_the_format_rules(
    origin: tuple[str, Path, dict[str, Any]], tmp_path: Path
) -> None:
    node = tmp_path / "node"
    _restore(origin, node, tmp_path / "a")
    record = _record(node, "generic")
    tree = Path(tree_path(node, record.digest))
    good = json.loads((tree / STAMP_NAME).read_text())
    assert read_stamp(tree, record).layer == record.digest
    for bad in (
        {**good, "dirs": ["/etc"]},
        {**good, "dirs": ["cache/./x"]},
        {**good, "dirs": ["elsewhere/x"]},
        {**good, "blob": [1, 2]},
        {**good, "mtime_ns": "soon"},
        {**good, "layer": "sha256:" + "0" * 64},
    ):
        (tree / STAMP_NAME).write_text(json.dumps(bad))
        with pytest.raises(Stale):
            read_stamp(tree, record)
    os.unlink(tree / STAMP_NAME)
    os.mkfifo(tree / STAMP_NAME)  # never waited on
    with pytest.raises(Stale):
        read_stamp(tree, record)


def test_gc_takes_a_layers_tree_with_its_blob_and_a_fill_clears_dead_scratch(
    origin: tuple[str, Path, dict[str, Any]], tmp_path: Path
) -> None:
    node = tmp_path / "node"
    _restore(origin, node, tmp_path / "a")
    trees = node / TREES_DIR
    assert len(os.listdir(trees)) == 2
    (trees / ".tmp-killed").mkdir()
    (trees / ".tmp-killed" / "half").write_bytes(b"x")
    st = LayoutStore(node)
    assert ".tmp-killed" in clear_leftovers(st)
    gc(st, max_bytes=0)
    assert os.listdir(trees) == []


def _layer(node: Path, family: str) -> str:
    """The digest of ``family``'s layer in the node store's whole artifact."""
    digest: str = _record(node, family).digest
    return digest


def test_an_unknown_node_link_is_a_usage_error(tmp_path: Path) -> None:
    env = clean_env({"HOME": str(tmp_path), "ARTIFACTD_NODE_LINK": "hardlink"})
    proc = run_artifactd(
        "restore", "--node-store", f"oci:{tmp_path / 'node'}", "--target", str(tmp_path / "t"),
        env=env,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "--node-link 'hardlink'" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "t").exists()


def _retag_with(store_path: Path, change: Callable[[dict[str, Any]], None]) -> str:
    """Publish, under the artifact's own tag, a config ``change``-d from it; return its digest."""
    st = LayoutStore(store_path)
    with st:
        tag = next(t for t in st.list_tags() if t.startswith("fp-"))
        got = st.get_manifest(tag)
        assert got is not None
        manifest = json.loads(got.data)
        config = json.loads(
            st.read_blob(
                manifest["config"]["digest"], manifest["config"]["size"], max_size=1 << 24, what="c"
            )
        )
        change(config)
        data = json.dumps(config, sort_keys=True).encode()
        manifest["config"] = {**manifest["config"], "digest": st.put_blob_bytes(data)}
        manifest["config"]["size"] = len(data)
        return st.put_manifest(json.dumps(manifest).encode(), got.media_type, [tag])


def test_a_warm_tree_serves_only_the_record_it_was_made_for(
    origin: tuple[str, Path, dict[str, Any]], tmp_path: Path
) -> None:
    """Another config naming the same layer with other file digests gets nothing from the tree.

    A registry restore holds the layer's own tree document to the record and
    refuses such a config; the warm node store checks files against the tree,
    not their bytes, so the stamp names the record the tree was made for
    (``record_identity``): this config is served nothing from the tree, which
    stays for the pods of its own record, and the extractor refuses it from
    the blob.
    """
    node = tmp_path / "node"
    _restore(origin, node, tmp_path / "a")  # fills the node store: a tree of each layer
    made_for = json.loads((tmp_path / "a" / ".artifactd" / "restored.json").read_text())

    def other_digest(config: dict[str, Any]) -> None:
        layer = next(x for x in config["layers"] if x["family"] == "generic")
        layer["files"][0]["sha256"] = "0" * 64  # the same layer, said to hold other bytes

    other = _retag_with(node, other_digest)  # a node store serves the tags it holds
    tree = next((node / TREES_DIR).iterdir())
    stamps = {t.name: (t / STAMP_NAME).read_bytes() for t in (node / TREES_DIR).iterdir()}
    # Restored all the same: from the origin, which still tags the first config.
    _, events = _restore(origin, node, tmp_path / "b")
    kept = [e for e in events if e.get("event") == "tree_kept"]
    assert kept and all("another record" in e["why"] for e in kept), events
    assert not _stale(events)  # the tree is sound: it is neither retired nor made again
    refused = [e for e in events if "differs from the artifact config" in str(e.get("error"))]
    assert refused, events  # the extractor, from the blob, refused the record
    assert tree.is_dir()
    assert {t.name: (t / STAMP_NAME).read_bytes() for t in (node / TREES_DIR).iterdir()} == stamps
    # What the pod got is the first config's: never the layer's files under the other's record.
    got = json.loads((tmp_path / "b" / ".artifactd" / "restored.json").read_text())
    assert got["families"]["generic"]["artifact"] == made_for["families"]["generic"]["artifact"]
    assert got["families"]["generic"]["artifact"] != other


def test_a_stamp_names_its_record_and_an_older_stamp_is_stale(
    origin: tuple[str, Path, dict[str, Any]], tmp_path: Path
) -> None:
    node = tmp_path / "node"
    _restore(origin, node, tmp_path / "a")
    record = _record(node, "generic")
    tree = Path(tree_path(node, record.digest))
    assert read_stamp(tree, record).layer == record.digest
    for update in (
        {"scope_key": "f" * 64},
        {"files": record.files[1:]},
        {"files": [record.files[0].model_copy(update={"rewrite": True}), *record.files[1:]]},
        {"files": [record.files[0].model_copy(update={"sha256": "1" * 64}), *record.files[1:]]},
    ):
        with pytest.raises(OtherRecord, match="another record"):
            read_stamp(tree, record.model_copy(update=update))
    good = json.loads((tree / STAMP_NAME).read_text())
    (tree / STAMP_NAME).write_text(json.dumps({k: v for k, v in good.items() if k != "record"}))
    with pytest.raises(Stale, match="did not name the record") as caught:
        read_stamp(tree, record)  # made by an artifactd before stamps named their record
    assert not isinstance(caught.value, OtherRecord)  # made again, not kept
