"""What a serve from the node store's unpacked tree costs the filesystem, per file.

Real parts: a generic tree published to a local layout, a node store filled
by a real restore, and :func:`~artifactd.stores.nodetree.serve` of its tree
into a new staging directory on the same disk. The ``os`` functions the serve
calls are wrapped to count what it asks of the kernel: the warm path is one
``lstat`` (the check that sees a pod's write through a shared inode) and one
``link`` per file, one ``mkdir`` per directory, and nothing else per file (no
open, no chmod, no utime: a link carries the sealed mode and mtime).
"""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from artifactd.families import get_family
from artifactd.fingerprint.model import Fingerprint
from artifactd.restore.policy import RestoreRequest, run_restore
from artifactd.stores import nodetree, open_store
from artifactd.stores.artifacts import read_artifact
from artifactd.stores.layout import LayoutStore
from artifactd.stores.nodestore import TREES_DIR

FILES = 60
DIRS = 15  # 4 files a directory, as a Triton cache has


@pytest.fixture
def warm(tmp_path: Path, local_fp: Fingerprint) -> tuple[Path, Any]:
    """A node store whose generic layer is unpacked, and that layer's record."""
    # lazy: the harvest is this fixture's alone
    from artifactd.build.harvest import harvest  # noqa: PLC0415

    gen = tmp_path / "gen"
    for i in range(FILES):
        d = gen / f"{i // 4:052x}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"k{i}.cubin").write_bytes(os.urandom(64 + i))
    (gen / "deep" / "er" / "est").mkdir(parents=True)  # empty directories travel too
    environ = {
        "ARTIFACTD_GENERIC_DIR": str(gen),
        "HOME": str(tmp_path / "home"),
        "TMPDIR": str(tmp_path / "no-tmp"),
    }
    with open_store(f"oci:{tmp_path / 'origin'}", create=True) as store:
        harvest(store, local_fp, families=["generic"], environ=environ)
    request = RestoreRequest(
        store=f"oci:{tmp_path / 'origin'}",
        node_store=f"oci:{tmp_path / 'node'}",
        target=tmp_path / "first",
        families=["generic"],
        require=True,
    )
    outcome = run_restore(request, json.loads(local_fp.model_dump_json()))
    assert outcome.status == "restored", outcome.failure
    node = tmp_path / "node"
    with LayoutStore(node) as st:
        art = read_artifact(st, next(t for t in st.list_tags() if t.startswith("fp-")))
    assert art is not None
    return node, next(r for r in art.config.layers if r.family == "generic")


def _serve(node: Path, record: Any, staging: Path) -> nodetree.Served:
    """Serve ``record``'s warm tree from the node store ``node`` into ``staging`` (generic)."""
    tree = Path(nodetree.tree_path(node, record.digest))
    return nodetree.serve(
        tree,
        nodetree.read_stamp(tree, record),
        record,
        staging,
        shares=get_family("generic").shares_inode,
        relocate=lambda _member, data: data,
        keep_mtimes=False,
    )


def _counting(monkeypatch: pytest.MonkeyPatch, names: tuple[str, ...]) -> Counter[tuple[str, str]]:
    """Wrap ``os.<name>`` for each name; count calls by (name, where the first path lies)."""
    calls: Counter[tuple[str, str]] = Counter()

    def wrap(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            first = os.fspath(args[0]) if args and isinstance(args[0], str | Path) else ""
            where = "tree" if TREES_DIR in first else "other"
            calls[(name, where)] += 1
            return real(*args, **kwargs)

        return counted

    for name in names:
        monkeypatch.setattr(os, name, wrap(name, getattr(os, name)))
    return calls


def test_a_warm_serve_asks_one_lstat_and_one_link_per_file_and_nothing_more(
    warm: tuple[Path, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node, record = warm
    tree = Path(nodetree.tree_path(node, record.digest))
    stamp = nodetree.read_stamp(tree, record)
    staging = tmp_path / "staging"
    family = get_family("generic")
    calls = _counting(
        monkeypatch, ("lstat", "stat", "link", "mkdir", "open", "chmod", "utime", "scandir")
    )
    served = nodetree.serve(
        tree,
        stamp,
        record,
        staging,
        shares=family.shares_inode,
        relocate=lambda _member, data: data,
        keep_mtimes=False,
    )
    monkeypatch.undo()
    if served.reflinked:
        pytest.skip("this filesystem reflinks: each file is the pod's own copy, not a link")
    assert served.files == FILES and served.linked == FILES and served.copied == 0
    assert calls[("lstat", "tree")] == FILES  # the check: one per file
    assert calls[("link", "tree")] == FILES
    # Every directory once (the component, the 15 key dirs, deep/er/est), the staging itself.
    assert len(stamp.dirs) == DIRS + 3
    assert calls[("mkdir", "other")] == 1 + len(record.components) + len(stamp.dirs)
    # Nothing else per file: at most the one reflink probe opens the tree.
    assert calls[("open", "tree")] <= 1
    assert calls[("stat", "tree")] == calls[("scandir", "tree")] == 0
    assert calls[("chmod", "other")] == calls[("utime", "other")] == 0
    assert sum(n for (name, _), n in calls.items()) <= 2 * FILES + 2 * (DIRS + 3) + 8
    # And what it made is the tree: the pod's files are the node store's inodes, sealed.
    k7 = staging / "cache" / f"{1:052x}" / "k7.cubin"
    assert k7.stat().st_ino == (tree / "cache" / f"{1:052x}" / "k7.cubin").stat().st_ino
    assert k7.stat().st_mode & 0o777 == 0o444
    assert (staging / "cache" / "deep" / "er" / "est").is_dir()


def test_a_restore_from_a_warm_node_store_makes_no_tree_document(
    warm: tuple[Path, Any], tmp_path: Path, local_fp: Fingerprint, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only an extraction compares a layer's tree document: a warm serve never makes one."""
    from artifactd.format import unpack, views  # noqa: PLC0415 - the module whose name is patched

    made: list[str] = []
    real = views.tree_document

    def counted(record: Any) -> bytes:
        made.append(record.family)
        return real(record)

    monkeypatch.setattr(unpack, "tree_document", counted)
    request = RestoreRequest(
        store=f"oci:{tmp_path / 'origin'}",
        node_store=f"oci:{warm[0]}",
        target=tmp_path / "second",
        families=["generic"],
        require=True,
    )
    outcome = run_restore(request, json.loads(local_fp.model_dump_json()))
    assert outcome.status == "restored", outcome.failure
    assert made == []
    # A cold node store extracts the layer, and holds it to its tree document.
    request = request._replace(node_store=f"oci:{tmp_path / 'cold'}", target=tmp_path / "third")
    outcome = run_restore(request, json.loads(local_fp.model_dump_json()))
    assert outcome.status == "restored", outcome.failure
    assert made and set(made) == {"generic"}


def _tamper(path: Path, how: str) -> None:
    """Change one tree file in one way, keeping everything else the serve checks."""
    st = path.stat()
    if how == "writable":
        path.chmod(0o644)
    elif how == "setuid":  # the same permission bits, plus a setuid bit
        path.chmod(0o4444)
    elif how == "executable":
        path.chmod(0o555)
    elif how == "size":
        path.chmod(0o644)
        with path.open("ab") as f:
            f.write(b"x")
        path.chmod(0o444)
    elif how == "mtime":
        pass  # only the utime below, one second off
    elif how == "symlink":  # a link to a file of the same bytes, mode and mtime
        twin = path.with_name("twin")
        twin.write_bytes(path.read_bytes())
        twin.chmod(0o444)
        os.utime(twin, ns=(st.st_atime_ns, st.st_mtime_ns))
        path.chmod(0o644)
        path.unlink()
        path.symlink_to("twin")
        return
    elif how == "directory":
        path.chmod(0o644)
        path.unlink()
        path.mkdir()
    shift = 1_000_000_000 if how == "mtime" else 0
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + shift), follow_symlinks=False)


@pytest.mark.parametrize(
    "how", ["writable", "setuid", "executable", "size", "mtime", "symlink", "directory"]
)
def test_a_tree_file_changed_in_any_way_the_serve_checks_makes_the_tree_stale(
    warm: tuple[Path, Any], tmp_path: Path, how: str
) -> None:
    """The serve's one ``st_mode`` comparison holds every part of the check it replaced."""
    node, record = warm
    victim = Path(nodetree.tree_path(node, record.digest)) / "cache" / f"{3:052x}" / "k13.cubin"
    assert victim.stat().st_mode & 0o7777 == 0o444  # sealed: what the check expects
    _tamper(victim, how)
    with pytest.raises(nodetree.Stale, match=r"k13\.cubin"):
        _serve(node, record, tmp_path / "staging")


def test_a_large_record_is_served_by_two_threads_alike(
    warm: tuple[Path, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past PARALLEL_FROM files, two threads serve halves; the staging is the same either way."""
    node, record = warm
    threads: list[str] = []
    real = nodetree._Putter.__call__

    def recorded(self: Any, entries: list[Any]) -> list[int]:
        threads.append(threading.current_thread().name)
        return real(self, entries)

    monkeypatch.setattr(nodetree._Putter, "__call__", recorded)
    one = _serve(node, record, tmp_path / "one")
    assert threads == [threading.current_thread().name]
    monkeypatch.setattr(nodetree, "PARALLEL_FROM", 4)
    threads.clear()
    two = _serve(node, record, tmp_path / "two")
    assert len(threads) == 2 and len(set(threads)) == 2  # this thread and a serve thread
    assert two == one and two.files == FILES

    def listing(root: Path) -> list[tuple[str, int]]:  # files by inode, directories by name
        return sorted(
            (str(p.relative_to(root)), 0 if p.is_dir() else p.stat().st_ino)
            for p in root.rglob("*")
        )

    assert listing(tmp_path / "one") == listing(tmp_path / "two")  # the same inodes, linked


def test_a_stale_file_in_either_half_stops_the_serve_once_both_threads_end(
    warm: tuple[Path, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node, record = warm
    tree = Path(nodetree.tree_path(node, record.digest))
    mtime_ns = nodetree.read_stamp(tree, record).mtime_ns
    monkeypatch.setattr(nodetree, "PARALLEL_FROM", 4)
    before = threading.active_count()
    for victim in (record.files[1], record.files[-1]):  # in this thread's half, in the other's
        path = tree / victim.path
        os.utime(path, ns=(0, 0))  # its mtime moved: a write through a shared inode would
        with pytest.raises(nodetree.Stale, match="changed since the tree was made"):
            _serve(node, record, tmp_path / f"staging-{victim.path.replace('/', '-')}")
        assert threading.active_count() == before  # the serve thread has ended
        os.utime(path, ns=(mtime_ns, mtime_ns))
