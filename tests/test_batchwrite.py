"""The extractor's two writers of small files: the C batch writer and the Python loop.

``artifactd/format/_batchwrite.c`` creates a batch of files with the GIL released
once and stops before the first file that does not go well; the Python loop of
``_Extractor._write_batch`` (the reference) then does that file and the rest. So
every batch, good or bad, must end the same with either writer: the same files,
bytes, modes and times, and the same exception (type and message). The C module's
own contract (how far it got, nothing left of a file it could not finish) is held
directly, since the final outcome alone would also hold for a C writer that did
nothing. The hostile-layer corpus runs with both writers too
(``tests/test_restore_hostile.py``).
"""

from __future__ import annotations

import errno
import hashlib
import importlib
import os
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, built_natively, tmpfs

from artifactd import hashing
from artifactd.errors import IntegrityError, UnsafeArtifactError
from artifactd.format import unpack
from artifactd.format.config import FileEntry

#: One file of a batch: its name under the root, its bytes, mode, whether the
#: writer checks its sha256, and the sha256 its entry claims (None: the true one).
Spec = tuple[str, "bytes | memoryview", int, bool, "str | None"]
Outcome = tuple[str | None, dict[str, tuple[Any, ...]]]

MTIME = 1_600_000_000


def _native() -> Callable[[list[Any], int], int]:
    writer = unpack._write_natively
    if writer is None:
        pytest.skip("the C batch writer is not built here")
    return writer


def _entry(name: str, data: bytes | memoryview, mode: int, sha: str | None, mtime: int) -> Any:
    # Built unchecked: the scenes give it sha256s that the record reader refuses.
    return FileEntry.model_construct(
        path=f"c/{name}",
        size=len(data),
        sha256=sha or hashlib.sha256(data).hexdigest(),
        mode=mode,
        mtime=mtime,
    )


def _batch(root: Path, specs: list[Spec], mtime: int = MTIME) -> list[Any]:
    return [
        (f"{root}/{name}", data, _entry(name, data, mode, sha, mtime), check)
        for name, data, mode, check, sha in specs
    ]


def _tree(root: Path, times: bool = True) -> dict[str, tuple[Any, ...]]:
    """Every entry under ``root``: type, mode, mtime (or None) and bytes (links not followed)."""
    out: dict[str, tuple[Any, ...]] = {}
    for path in sorted(root.rglob("*")):
        st = os.lstat(path)
        rel = path.relative_to(root).as_posix()
        if stat.S_ISLNK(st.st_mode):
            out[rel] = ("link", os.readlink(path))
        elif stat.S_ISREG(st.st_mode):
            mtime = int(st.st_mtime) if times else None
            out[rel] = ("file", stat.S_IMODE(st.st_mode), mtime, path.read_bytes())
        else:
            out[rel] = ("dir", stat.S_IMODE(st.st_mode))
    return out


def _write(
    monkeypatch: pytest.MonkeyPatch,
    writer: str,
    root: Path,
    specs: list[Spec],
    *,
    umask: int = 0o022,
    keep_mtimes: bool = False,
    mtime: int = MTIME,
) -> Outcome:
    """Write ``specs`` under ``root`` as one batch with ``writer``; the error and the tree.

    ``c``: the C writer checks the sha256s (a layer of bulk data); ``c-small``: the
    Python side checks them with CPython's own sha256 and the C writer only writes.
    """
    native = _native()
    monkeypatch.setattr(unpack, "_write_natively", None if writer == "python" else native)
    extractor = unpack._Extractor(
        root, [], None, keep_mtimes, components=frozenset({"c"}), tree=None
    )
    extractor.bulk = writer == "c"
    extractor.sha256 = hashing.sha256_for(hashing.BULK + 1 if extractor.bulk else 0)
    extractor.umask = umask
    old = os.umask(umask)
    error = None
    try:
        extractor._write_batch(_batch(root, specs, mtime))
    except Exception as exc:  # the outcome compared: type and message
        error = f"{type(exc).__name__}: {exc}".replace(str(root), "<root>")
    finally:
        os.umask(old)
        extractor.abort()
    return error, _tree(root, times=keep_mtimes)


Scene = Callable[[Path], list[Spec]]


def _noise(seed: bytes, n: int) -> bytes:
    """The same ``n`` bytes for the same seed: both writers get the same batch."""
    return hashlib.shake_256(seed).digest(n)


def _files(n: int = 6) -> list[Spec]:
    """Files of 0 B to 1 MiB, both modes, some views of one buffer (as the tar reader gives)."""
    view = memoryview(_noise(b"shared", 300_000))
    files: list[Spec] = [
        ("f0", b"", 0o644, True, None),
        ("f1", b"x", 0o755, True, None),
        ("f2", view[:4096], 0o644, True, None),
        ("f3", view[4096:74_096], 0o755, True, None),
        ("f4", _noise(b"big", 1 << 20), 0o644, True, None),
        ("f5", view[74_096:], 0o644, True, None),
    ]
    return files[:n]


def _replace(specs: list[Spec], i: int, **change: Any) -> list[Spec]:
    name, data, mode, check, sha = specs[i]
    fields = {"name": name, "data": data, "mode": mode, "check": check, "sha": sha, **change}
    specs[i] = (fields["name"], fields["data"], fields["mode"], fields["check"], fields["sha"])
    return specs


def _dir_in_place(root: Path) -> list[Spec]:
    (root / "f2").mkdir()
    return _files()


def _file_in_place(root: Path) -> list[Spec]:
    (root / "f2").write_bytes(b"the previous file\n")
    os.utime(root / "f2", (1, 1))  # its time, too, the same in both targets
    return _files()


def _link_in_place(root: Path) -> list[Spec]:
    (root.parent / "outside").write_bytes(b"not artifactd's\n")
    (root / "f2").symlink_to("../outside")
    return _files()


def _dangling_link_in_place(root: Path) -> list[Spec]:
    (root / "f2").symlink_to("../nowhere")
    return _files()


SCENES: dict[str, Scene] = {
    "all_good": lambda root: _files(),
    "one_file": lambda root: _files(2)[1:],
    "sha_mismatch": lambda root: _replace(_files(), 3, sha="0" * 64),
    "sha_not_hex": lambda root: _replace(_files(), 3, sha="Z" * 64),
    "sha_short": lambda root: _replace(_files(), 3, sha="ab"),
    "sha_uppercase": lambda root: _replace(
        _files(), 3, sha=hashlib.sha256(_files()[3][1]).hexdigest().upper()
    ),
    "unchecked_bytes_written_as_given": lambda root: _replace(
        _files(), 3, check=False, sha="0" * 64
    ),
    "directory_in_place": _dir_in_place,
    "file_in_place": _file_in_place,
    "symlink_in_place": _link_in_place,
    "dangling_symlink_in_place": _dangling_link_in_place,
    "parent_missing": lambda root: _replace(_files(), 2, name="no/such/dir/f2"),
    "name_too_long": lambda root: _replace(_files(), 2, name="n" * 300),
    "embedded_nul": lambda root: _replace(_files(), 2, name="f\x002"),
}


@pytest.fixture
def two_roots(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """Two targets, each with a parent of its own (links aim at ``../outside``)."""
    roots = (tmp_path / "c" / "root", tmp_path / "python" / "root")
    for root in roots:
        root.mkdir(parents=True)
    yield roots


@pytest.mark.parametrize("native", ["c", "c-small"])
@pytest.mark.parametrize("umask", [0o022, 0o077], ids=["umask022", "umask077"])
@pytest.mark.parametrize("keep_mtimes", [False, True], ids=["now", "mtimes"])
@pytest.mark.parametrize("scene", SCENES.values(), ids=SCENES.keys())
def test_both_writers_end_every_batch_the_same(  # noqa: PLR0917 - parametrized by pytest
    scene: Scene,
    keep_mtimes: bool,
    umask: int,
    native: str,
    two_roots: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    outcomes = [
        _write(monkeypatch, writer, root, scene(root), umask=umask, keep_mtimes=keep_mtimes)
        for writer, root in zip((native, "python"), two_roots, strict=True)
    ]
    (c_error, c_tree), (py_error, py_tree) = outcomes
    assert c_error == py_error
    assert c_tree == py_tree


def test_the_outcomes_compared_are_the_rules_not_just_equal(
    two_roots: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scenes do fail the way the extractor must: the comparison above is not vacuous."""
    c_root = two_roots[0]
    error, tree = _write(monkeypatch, "c", c_root, SCENES["all_good"](c_root), umask=0o077)
    assert error is None
    assert [tree[f"f{i}"][1] for i in range(6)] == [0o644, 0o755, 0o644, 0o755, 0o644, 0o644]
    expected = {name: bytes(data) for name, data, *_ in _files()}
    assert {k: v[3] for k, v in tree.items()} == expected
    root = two_roots[1] / "m"
    root.mkdir()
    error, tree = _write(monkeypatch, "c", root, SCENES["sha_mismatch"](root))
    assert error == f"{IntegrityError.__name__}: c/f3: content does not match its sha256"
    assert sorted(tree) == ["f0", "f1", "f2"]
    root = two_roots[1] / "s" / "root"
    root.mkdir(parents=True)
    error, tree = _write(monkeypatch, "c", root, _link_in_place(root))
    assert error is not None and error.startswith(UnsafeArtifactError.__name__), error
    assert (root.parent / "outside").read_bytes() == b"not artifactd's\n"


def test_mtimes_are_set_only_when_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for keep in (False, True):
        root = tmp_path / str(keep)
        root.mkdir()
        error, tree = _write(monkeypatch, "c", root, _files(), keep_mtimes=keep)
        assert error is None
        assert ({v[2] for v in tree.values()} == {MTIME}) is keep, tree.keys()


def test_an_mtime_out_of_range_is_the_python_loops_error(
    two_roots: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    outcomes = [
        _write(monkeypatch, w, root, _files(), keep_mtimes=True, mtime=1 << 70)
        for w, root in zip(("c", "python"), two_roots, strict=True)
    ]
    # The first file is made before its time fails to set: its time is the clock's, not compared.
    (c_error, c_tree), (py_error, py_tree) = (
        (error, {k: (*v[:2], *v[3:]) for k, v in tree.items()}) for error, tree in outcomes
    )
    assert (c_error, c_tree) == (py_error, py_tree)
    assert c_error is not None and c_error.startswith("OverflowError"), c_error
    assert sorted(c_tree) == ["f0"]


# --------------------------------------------------------------------------
# The C module's own contract
# --------------------------------------------------------------------------


def _items(root: Path, specs: list[Spec]) -> list[Any]:
    items = []
    for name, data, mode, check, sha in specs:
        digest = (sha or hashlib.sha256(data).hexdigest()) if check else None
        items.append((f"{root}/{name}", data, mode, digest, None))
    return items


def test_the_c_writer_alone_creates_a_whole_batch(tmp_path: Path) -> None:
    native = _native()
    specs = _files()
    assert native(_items(tmp_path, specs), 0o022) == len(specs)
    for name, data, mode, *_ in specs:
        assert (tmp_path / name).read_bytes() == bytes(data)
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == mode
    assert native([], 0o022) == 0


@pytest.mark.parametrize(
    ("scene", "stop"),
    [("sha_mismatch", 3), ("file_in_place", 2), ("parent_missing", 2), ("embedded_nul", 2)],
)
def test_the_c_writer_stops_before_the_first_file_that_fails(
    scene: str, stop: int, tmp_path: Path
) -> None:
    native = _native()
    specs = SCENES[scene](tmp_path)
    before = _tree(tmp_path)
    assert native(_items(tmp_path, specs), 0o022) == stop
    created = {k for k in _tree(tmp_path) if k not in before}
    assert created == {specs[i][0] for i in range(stop)}


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "mnt", "1m") as mnt:
        yield mnt


def test_the_c_writer_leaves_nothing_of_a_file_the_disk_could_not_hold(small_disk: Path) -> None:
    native = _native()
    data = os.urandom(400 << 10)
    specs: list[Spec] = [(f"f{i}", data, 0o644, True, None) for i in range(4)]
    done = native(_items(small_disk, specs), 0o022)
    assert 0 < done < 4
    assert sorted(p.name for p in small_disk.iterdir()) == [f"f{i}" for i in range(done)]


@pytest.mark.parametrize("writer", ["c", "python"])
def test_a_full_disk_is_the_python_loops_enospc(
    writer: str, small_disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = os.urandom(400 << 10)
    specs: list[Spec] = [(f"f{i}", data, 0o644, True, None) for i in range(4)]
    error, tree = _write(monkeypatch, writer, small_disk, specs)
    assert error is not None and error.startswith(f"OSError: [Errno {errno.ENOSPC}]"), error
    full = [k for k, v in tree.items() if v[3] == data]
    assert full and len(full) < 4
    assert all(v[3] == data[: len(v[3])] for v in tree.values())
    for p in small_disk.iterdir():
        p.unlink()


def test_the_c_writer_is_built_where_a_compiler_and_python_headers_are() -> None:
    """Where ``pip install`` could build it, it was built and is the writer in use."""
    if not built_natively():
        pytest.skip("no C compiler or no Python headers: the pure wheel is expected")
    assert unpack._write_natively is not None
    assert unpack._write_natively.__module__ == "artifactd.format._batchwrite"


def test_the_c_writer_is_built_from_this_source() -> None:
    """A module compiled from an older edit of ``_batchwrite.c`` would test the wrong code."""
    _native()
    built = importlib.import_module("artifactd.format._batchwrite")  # optional: not imported above
    source = REPO / "artifactd" / "format" / "_batchwrite.c"
    assert built.source_sha256 == hashlib.sha256(source.read_bytes()).hexdigest(), (
        "the batch writer was built from another version of its source: "
        "rebuild it (pip install -e . or python setup.py build_ext --inplace)"
    )


def test_the_c_writer_loads_libcrypto_only_to_check_a_sha256(tmp_path: Path) -> None:
    """A small layer's batches come with no sha256 to check: no OpenSSL is loaded for them."""
    _native()
    code = (
        "import sys\n"
        "from artifactd.format._batchwrite import write_batch\n"
        "def crypto():\n"
        "    with open('/proc/self/maps') as f:\n"
        "        return 'libcrypto' in f.read()\n"
        f"root = {str(tmp_path)!r}\n"
        "print(write_batch([(root + '/a', b'a', 0o644, None, None)], 0o022), crypto())\n"
        "sha = 'ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb'\n"
        "print(write_batch([(root + '/b', b'a', 0o644, sha, None)], 0o022), crypto())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-S", "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "False", "1", "True"]
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes() == b"a"
