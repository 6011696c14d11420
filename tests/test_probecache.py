"""The probe cache: reused while a file keeps its identity, and never wrong when lost."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from artifactd.fingerprint import probecache
from artifactd.fingerprint.probe import record_digest
from artifactd.fingerprint.probecache import CACHE_FILE_NAME, ProbeCache, default_path
from artifactd.fingerprint.tools import COMPILER_NAMES, Version


class Counting:
    """A digest function that counts how often it really ran."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, path: Path) -> str | None:
        self.calls += 1
        return record_digest(path)


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files written by the test count as settled (else none would be cached for 2 s)."""
    monkeypatch.setattr(probecache, "SETTLE_NS", 0)


def _text_digest(path: Path) -> str:
    return hashlib.sha256(path.read_text(encoding="utf-8").encode()).hexdigest()


@pytest.mark.parametrize(
    "data",
    [
        b"torch/__init__.py,sha256=abc,12\n",
        b"a,b,1\r\nc,d,2\r\n",  # CRLF: the text has universal newlines
        b"lone\rcarriage\n",
        b"a\r\r\nb\n\r",  # a lone CR before a CRLF, and a CR at the end
        b"\r\n\r\n\r",
        "caf\u00e9/x.py,,\n".encode(),
        "caf\u00e9/x.py,,\r\n".encode(),
        b"\r",
    ],
)
def test_record_digest_is_the_digest_of_the_decoded_text(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "RECORD"
    path.write_bytes(data)
    assert record_digest(path) == _text_digest(path)


def test_record_digest_of_missing_or_empty_is_none(tmp_path: Path) -> None:
    assert record_digest(tmp_path / "absent") is None
    (tmp_path / "empty").write_bytes(b"")
    assert record_digest(tmp_path / "empty") is None


def test_second_probe_reads_the_digest_from_the_cache(tmp_path: Path, settled: None) -> None:
    record = tmp_path / "RECORD"
    record.write_text("a,b,1\n")
    cache_file = tmp_path / "cache" / CACHE_FILE_NAME
    digest = Counting()
    first = ProbeCache(cache_file)
    assert first.digest(record, digest) == _text_digest(record)
    first.save()
    assert cache_file.stat().st_mode & 0o777 == 0o600
    again = ProbeCache(cache_file)
    assert again.digest(record, digest) == _text_digest(record)
    assert digest.calls == 1


def test_a_changed_file_is_hashed_again(tmp_path: Path, settled: None) -> None:
    record = tmp_path / "RECORD"
    record.write_text("a,b,1\n")
    cache_file = tmp_path / CACHE_FILE_NAME
    cache = ProbeCache(cache_file)
    cache.digest(record, record_digest)
    cache.save()
    # Same size, rewritten in place, with a modification time set back to the old
    # one: only the change time (which no tool can set) tells.
    st = record.stat()
    record.write_text("x,y,2\n")
    os.utime(record, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert record.stat().st_size == st.st_size
    if record.stat().st_ctime_ns == st.st_ctime_ns:
        pytest.skip("the filesystem clock did not tick between the two writes")
    assert ProbeCache(cache_file).digest(record, record_digest) == _text_digest(record)
    # Replaced by a rename: a new inode.
    new = tmp_path / "RECORD.new"
    new.write_text("p,q,3\n")
    new.replace(record)
    assert ProbeCache(cache_file).digest(record, record_digest) == _text_digest(record)


def test_a_file_changed_just_now_is_not_cached(tmp_path: Path) -> None:
    """A rewrite within the same clock tick could keep the identity: wait until it settles."""
    record = tmp_path / "RECORD"
    record.write_text("a,b,1\n")
    cache_file = tmp_path / CACHE_FILE_NAME
    digest = Counting()
    cache = ProbeCache(cache_file)
    cache.digest(record, digest)
    cache.digest(record, digest)
    cache.save()
    assert digest.calls == 2
    assert not cache_file.exists()


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"\xff\xfe",
        b"[]",
        b'{"schema_version": 99, "entries": {}}',
        b'{"schema_version": 1, "entries": []}',
        b"[" * 100_000,
    ],
)
def test_a_corrupt_cache_reads_as_empty_and_is_replaced(
    tmp_path: Path, settled: None, content: bytes
) -> None:
    record = tmp_path / "RECORD"
    record.write_text("a,b,1\n")
    cache_file = tmp_path / CACHE_FILE_NAME
    cache_file.write_bytes(content)
    cache = ProbeCache(cache_file)
    assert cache.digest(record, record_digest) == _text_digest(record)
    cache.save()
    assert json.loads(cache_file.read_bytes())["schema_version"] == 1


def test_an_entry_of_the_wrong_shape_or_a_lying_identity_is_recomputed(
    tmp_path: Path, settled: None
) -> None:
    record = tmp_path / "RECORD"
    record.write_text("a,b,1\n")
    key = os.path.abspath(record)
    ident = probecache.identity(record.stat())
    cache_file = tmp_path / CACHE_FILE_NAME
    for entry in (
        {"stat": ident, "value": 42},
        {"stat": [*ident[:-1], ident[-1] + 1], "value": "f" * 64},
        {"value": "f" * 64},
        "f" * 64,
    ):
        doc = {"schema_version": 1, "entries": {key: entry}}
        cache_file.write_text(json.dumps(doc))
        assert ProbeCache(cache_file).digest(record, record_digest) == _text_digest(record)


def test_an_unwritable_cache_is_only_slower(tmp_path: Path, settled: None) -> None:
    record = tmp_path / "RECORD"
    record.write_text("a,b,1\n")
    blocker = tmp_path / "file"
    blocker.write_text("")
    cache = ProbeCache(blocker / "sub" / CACHE_FILE_NAME)  # its parent is a file
    assert cache.digest(record, record_digest) == _text_digest(record)
    cache.save()  # no error
    assert not (blocker / "sub").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="handing a file to another user needs root")
def test_a_cache_another_user_owns_is_not_trusted(tmp_path: Path, settled: None) -> None:
    record = tmp_path / "RECORD"
    record.write_text("a,b,1\n")
    cache_file = tmp_path / CACHE_FILE_NAME
    doc = {
        "schema_version": 1,
        "entries": {
            os.path.abspath(record): {"stat": probecache.identity(record.stat()), "value": "0" * 64}
        },
    }
    cache_file.write_text(json.dumps(doc))
    os.chown(cache_file, 65534, 65534)
    assert ProbeCache(cache_file).digest(record, record_digest) == _text_digest(record)


def test_the_least_recently_used_entries_go_first(
    tmp_path: Path, settled: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(probecache, "MAX_ENTRIES", 2)
    files = []
    for name in ("a", "b", "c"):
        files.append(tmp_path / name)
        files[-1].write_text(name)
    cache_file = tmp_path / CACHE_FILE_NAME
    first = ProbeCache(cache_file)
    for f in files:
        first.digest(f, record_digest)
    first.save()
    kept = json.loads(cache_file.read_text())["entries"]
    assert [Path(k).name for k in kept] == ["b", "c"]
    second = ProbeCache(cache_file)
    second.digest(files[1], record_digest)  # a hit: b is now the most recent
    second.digest(files[0], record_digest)  # a miss: a comes in, c goes
    second.save()
    kept = json.loads(cache_file.read_text())["entries"]
    assert [Path(k).name for k in kept] == ["b", "a"]


def _path(found: str | None) -> Path | None:
    return None if found is None else Path(found)


def test_default_path_order(tmp_path: Path) -> None:
    home = str(tmp_path / "home")
    assert (
        _path(default_path({"HOME": home})) == Path(home) / ".cache" / "artifactd" / CACHE_FILE_NAME
    )
    xdg = {"HOME": home, "XDG_CACHE_HOME": "/xdg"}
    assert _path(default_path(xdg)) == Path("/xdg/artifactd") / CACHE_FILE_NAME
    relative = {"HOME": home, "XDG_CACHE_HOME": "rel"}
    assert _path(default_path(relative)) == Path(home) / ".cache" / "artifactd" / CACHE_FILE_NAME
    own = {**xdg, "ARTIFACTD_CACHE_DIR": "/mine"}
    assert _path(default_path(own)) == Path("/mine") / CACHE_FILE_NAME
    assert default_path({}) is None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([b"a", b"\r", b"\n", b"\r\n", b",", "\u00e9".encode()])))
def test_record_digest_of_any_mix_of_line_endings_is_the_decoded_texts(
    tmp_path_factory: pytest.TempPathFactory, pieces: list[bytes]
) -> None:
    """CRLF-only text takes the one-pass way, any lone CR the other: both are the text's digest."""
    path = tmp_path_factory.mktemp("record") / "RECORD"
    path.write_bytes(b"".join(pieces))
    assert record_digest(path) == (_text_digest(path) if pieces else None)


# --------------------------------------------------------------------------
# A tool's --version, kept by the binary's identity
# --------------------------------------------------------------------------

VERSION_C = r"""
#include <stdio.h>
int main(void) { puts("Cuda compilation tools, release 13.0, V13.0.%s"); return 0; }
"""


def _compile(path: Path, patch: str) -> Path:
    """A real ELF executable at ``path`` that prints an nvcc-like --version (the C compiler's)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    src = path.with_suffix(".c")
    src.write_text(VERSION_C % patch)
    subprocess.run(["cc", "-o", str(path), str(src)], check=True)
    return path


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to make a binary")
def test_a_tools_version_is_kept_for_its_own_binary_and_asked_again_when_it_changes(
    tmp_path: Path, settled: None
) -> None:
    tool = _compile(tmp_path / "bin" / "nvcc", "88")
    cache_file = tmp_path / CACHE_FILE_NAME
    first = ProbeCache(cache_file)
    asked = Version(str(tool), first, ("nvcc",))
    assert asked.ran and "V13.0.88" in (asked.output() or "")
    first.save()
    warm = Version(str(tool), ProbeCache(cache_file), ("nvcc",))
    assert not warm.ran, "the same binary: answered from the cache"
    assert "V13.0.88" in (warm.output() or "")
    # Rebuilt (a new inode at the same path): asked again, and the new answer kept.
    new = _compile(tmp_path / "nvcc.new", "99")
    new.replace(tool)
    again = Version(str(tool), ProbeCache(cache_file), ("nvcc",))
    assert again.ran and "V13.0.99" in (again.output() or "")
    # Found through PATH and a symlink, as `cc` is: kept by the file it leads to.
    (tmp_path / "path").mkdir()
    (tmp_path / "path" / "cc").symlink_to(_compile(tmp_path / "x86_64-linux-gnu-gcc-12", "1"))
    old_path = os.environ["PATH"]
    os.environ["PATH"] = f"{tmp_path / 'path'}{os.pathsep}{old_path}"
    try:
        cache = ProbeCache(cache_file)
        cold = Version("cc", cache, COMPILER_NAMES)
        assert cold.ran and cold.output() == "Cuda compilation tools, release 13.0, V13.0.1\n"
        cache.save()
        assert not Version("cc", ProbeCache(cache_file), COMPILER_NAMES).ran
    finally:
        os.environ["PATH"] = old_path


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to make a binary")
def test_a_wrapper_or_a_script_is_asked_every_time(tmp_path: Path, settled: None) -> None:
    """A script or ccache as cc answers with another binary, whose identity is not kept."""
    cache_file = tmp_path / CACHE_FILE_NAME
    real = _compile(tmp_path / "cuda" / "nvcc", "88")
    script = tmp_path / "bin" / "nvcc"
    script.parent.mkdir(exist_ok=True)
    script.write_text(f'#!/bin/sh\nexec {real} "$@"\n')
    script.chmod(0o755)
    wrapper = _compile(tmp_path / "ccache", "88")  # an ELF, but not the compiler itself
    (tmp_path / "bin" / "cc").symlink_to(wrapper)
    for program, names in ((script, ("nvcc",)), (tmp_path / "bin" / "cc", COMPILER_NAMES)):
        for _ in range(2):
            cache = ProbeCache(cache_file)
            version = Version(str(program), cache, names)
            assert version.ran, program
            assert "V13.0.88" in (version.output() or "")
            cache.save()
    # A tool that fails is not kept either; a missing one answers None.
    failing = tmp_path / "ptxas"
    failing.write_bytes(real.read_bytes())
    failing.chmod(0o644)  # not executable: it cannot run
    for _ in range(2):
        cache = ProbeCache(cache_file)
        version = Version(str(failing), cache, ("ptxas",))
        assert version.ran and version.output() is None
        cache.save()
    assert Version(str(tmp_path / "absent"), ProbeCache(cache_file), ("nvcc",)).output() is None
