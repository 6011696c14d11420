"""No input can hang a command, fill its memory or get it blamed on the wrong side.

Every file artifactd is given (a key, an env file, the files and documents of
a mounted artifact, a layout store's blobs and index) is opened without
blocking, as a regular file only, and read up to a limit
(:func:`artifactd.fsutil.open_regular`). Here each of them is a real FIFO
(``os.mkfifo``), a device or a socket, too large, or unreadable, and the
real command runs in a subprocess with a timeout of a few seconds: it must
answer in time with its documented exit code, no traceback, and leave the
target as it was. The numeric options an init container reads are held to
their ranges, a target the env file cannot carry is refused before
anything is created, and a harvest publishes no document a restore would
refuse as too large.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import socket
import stat
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zstandard
from conftest import PEAK_PRELUDE, PYTHON, clean_env, peak_kib, run_artifactd
from crashes import leftovers, snapshot
from hostile import publish

import artifactd.format.config
import artifactd.stores.artifacts
import artifactd.stores.reading
from artifactd.build.harvest import harvest
from artifactd.errors import BuildError
from artifactd.fingerprint.model import Fingerprint
from artifactd.format.config import MAX_TREE_DOC
from artifactd.format.oci import TREE_DOC
from artifactd.stores import open_store
from artifactd.stores.artifacts import read_artifact
from artifactd.stores.base import Store
from artifactd.stores.layout import LayoutStore
from artifactd.stores.reading import MAX_CONFIG_BYTES

#: Seconds any of these commands may take: each must answer at once, never wait.
QUICK = 30
#: Peak memory (KiB) a restore that refuses an oversized document may reach: the
#: interpreter and the restore modules, nothing of the document.
SMALL_PEAK_KIB = 200 << 10


def _reads_unreadable_files() -> bool:
    """Whether this process reads a mode-000 file anyway (root, or CAP_DAC_OVERRIDE)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "f")
        path.write_bytes(b"x")
        path.chmod(0)
        try:
            path.read_bytes()
        except PermissionError:
            return False
        return True


#: Root reads a mode-000 file anyway: the unreadable cases need another user.
READS_ANYTHING = _reads_unreadable_files()
#: Or root without the capabilities that let it read anything: ``setpriv``
#: (util-linux) drops them from the bounding set before it runs the command.
NO_DAC = [
    "setpriv",
    "--bounding-set",
    "-dac_override,-dac_read_search",
    "--inh-caps",
    "-dac_override,-dac_read_search",
]


def _setpriv_denies_reads() -> bool:
    """Whether a command run under :data:`NO_DAC` is refused a mode-000 file."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "f")
        path.write_bytes(b"x")
        path.chmod(0)
        try:
            proc = subprocess.run(
                [*NO_DAC, "cat", str(path)], capture_output=True, timeout=10, check=False
            )
        except OSError:
            return False
        return proc.returncode != 0


#: How the unreadable cases run here: as they are, under setpriv, or not at all.
UNREADABLE_WRAPPER: list[str] | None = (
    [] if not READS_ANYTHING else NO_DAC if _setpriv_denies_reads() else None
)


def _ok(proc: subprocess.CompletedProcess[str]) -> None:
    """Nothing a user sees is a crash: no traceback, no internal error."""
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "internal error" not in proc.stderr and "this is a bug" not in proc.stderr, proc.stderr


def _report(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return doc


def _restore(
    target: Path, *args: str, env: dict[str, str] | None = None, prelude: str = ""
) -> subprocess.CompletedProcess[str]:
    """``artifactd restore --target TARGET --gpu-arch sm_90a ARGS``, bounded in time."""
    return run_artifactd(
        "restore",
        "--target",
        str(target),
        "--gpu-arch",
        "sm_90a",
        *args,
        env=clean_env(env),
        timeout=QUICK,
        prelude=prelude,
    )


@pytest.fixture
def world(tmp_path: Path, caches: dict[str, str], local_fp: Fingerprint) -> Iterator[World]:
    """A harvested store, and a target a first restore from it filled."""
    store = open_store(f"oci:{tmp_path / 'store'}", create=True)
    result = harvest(store, local_fp, environ=caches)
    w = World(tmp_path, store, result.digest)
    proc = _restore(w.target, "--store", store.ref, "--require")
    assert proc.returncode == 0, proc.stderr
    yield w


class World:
    """The paths a test works with."""

    def __init__(self, tmp: Path, store: Store, digest: str) -> None:
        self.tmp = tmp
        self.store = store
        self.digest = digest
        self.target = tmp / "target"

    def merged(self) -> Path:
        """The artifact's layers unpacked into one tree, as a container runtime merges them."""
        dest = self.tmp / "mnt"
        art = read_artifact(self.store, self.digest)
        assert art is not None
        dest.mkdir()
        for desc in art.manifest.layers:
            with self.store.open_blob(desc.digest, desc.size) as blob:
                tar = zstandard.ZstdDecompressor().decompressobj().decompress(blob.read())
            with tarfile.open(fileobj=io.BytesIO(tar)) as t:
                t.extractall(dest)  # noqa: S202 - our own layers, just packed by this test
        return dest

    def blob(self, digest: str) -> Path:
        """The file of a blob in the store."""
        assert isinstance(self.store, LayoutStore)
        return self.store.root / "blobs" / "sha256" / digest.split(":", 1)[1]


def _first_file(tree: Path, family: str = "generic") -> Path:
    doc = json.loads((tree / family / TREE_DOC).read_text())
    entry = next(e for e in doc["files"] if e["link"] is None)
    return tree / family / str(entry["path"])


# --------------------------------------------------------------------------
# Key files
# --------------------------------------------------------------------------


def _key_input(tmp_path: Path, kind: str) -> str:
    if kind == "fifo":
        os.mkfifo(tmp_path / "key.pub")
        return str(tmp_path / "key.pub")
    if kind == "directory":
        (tmp_path / "key.pub").mkdir()
        return str(tmp_path / "key.pub")
    return "/dev/zero"


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_verify_key_that_is_no_file_is_refused_at_once(world: World, kind: str, how: str) -> None:
    key = _key_input(world.tmp, kind)
    before = snapshot(world.target)
    args = ["--verify-key", key] if how == "flag" else []
    env = {"ARTIFACTD_VERIFY_KEY": key} if how == "env" else None
    t0 = time.monotonic()
    proc = _restore(world.target, "--store", world.store.ref, "--require", *args, env=env)
    assert time.monotonic() - t0 < QUICK
    assert proc.returncode == 2, proc.stderr
    assert "not a regular file" in proc.stderr, proc.stderr
    _ok(proc)
    assert snapshot(world.target) == before


def test_a_fifo_as_sign_key_is_refused_at_once(tmp_path: Path, caches: dict[str, str]) -> None:
    os.mkfifo(tmp_path / "cosign.key")
    proc = run_artifactd(
        "harvest",
        "--store",
        f"oci:{tmp_path / 'store'}",
        "--gpu-arch",
        "sm_90a",
        "--sign-key",
        str(tmp_path / "cosign.key"),
        env=clean_env(caches),
        timeout=QUICK,
    )
    assert proc.returncode == 2, proc.stderr
    assert "is a FIFO, not a regular file" in proc.stderr
    _ok(proc)


# --------------------------------------------------------------------------
# Mounted trees (--from-dir)
# --------------------------------------------------------------------------

#: Swap the first listed file of ``generic`` for SWAP's kind after the scan saw
#: a regular file there, and before it is copied.
SWAP_PRELUDE = """
import os, socket
import artifactd.format.unpack as u

_scan = u._scan_family_dir

def scan(source, components):
    found = _scan(source, components)
    if source.name == "generic":
        rel = next(r for r, (kind, _) in sorted(found.items()) if kind == "file")
        path = source.joinpath(*rel.parts)
        path.unlink()
        if SWAP == "fifo":
            os.mkfifo(path)
        else:
            here = os.getcwd()
            os.chdir(path.parent)  # a socket's path is limited to 108 bytes
            socket.socket(socket.AF_UNIX).bind(path.name)
            os.chdir(here)
    return found

u._scan_family_dir = scan
"""


@pytest.mark.parametrize("swap", ["fifo", "socket"])
def test_a_file_swapped_for_a_fifo_or_socket_after_the_scan_is_refused(
    world: World, swap: str
) -> None:
    tree = world.merged()
    before = snapshot(world.target)
    prelude = f"SWAP = {swap!r}\n{SWAP_PRELUDE}"
    t0 = time.monotonic()
    proc = _restore(world.target, "--from-dir", str(tree), "--require", "--json", prelude=prelude)
    assert time.monotonic() - t0 < QUICK
    _ok(proc)
    doc = _report(proc)
    assert proc.returncode == 5, proc.stderr
    assert doc["failure"]["kind"] == "hostile", doc["failure"]
    assert "not a regular file" in doc["failure"]["message"]
    assert snapshot(world.target) == before
    assert leftovers(world.target) == []


def _special(path: Path, kind: str) -> None:
    """Put a FIFO, a socket or a character device at ``path`` (where a file is listed)."""
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        here = os.getcwd()
        os.chdir(path.parent)
        try:
            socket.socket(socket.AF_UNIX).bind(path.name)
        finally:
            os.chdir(here)
    else:
        try:
            os.mknod(path, stat.S_IFCHR | 0o644, os.makedev(1, 5))  # /dev/zero's numbers
        except PermissionError:
            pytest.skip("this user may not create device nodes")


@pytest.mark.parametrize("kind", ["fifo", "socket", "device"])
@pytest.mark.parametrize("where", ["file", "document"])
def test_a_special_file_in_a_tree_is_hostile(world: World, kind: str, where: str) -> None:
    tree = world.merged()
    _special(_first_file(tree) if where == "file" else tree / "generic" / TREE_DOC, kind)
    before = snapshot(world.target)
    proc = _restore(world.target, "--from-dir", str(tree), "--require", "--json")
    _ok(proc)
    assert proc.returncode == 5, proc.stderr
    assert _report(proc)["failure"]["kind"] == "hostile"
    assert snapshot(world.target) == before


@pytest.mark.skipif(
    UNREADABLE_WRAPPER is None,
    reason="this user reads mode-000 files and setpriv cannot drop that: sockets stand in",
)
@pytest.mark.parametrize("where", ["file", "document", "directory"])
def test_an_unreadable_source_is_the_source_s_fault(world: World, where: str) -> None:
    tree = world.merged()
    path = {
        "file": _first_file(tree),
        "document": tree / "generic" / TREE_DOC,
        "directory": _first_file(tree).parent,
    }[where]
    path.chmod(0)
    before = snapshot(world.target)
    assert UNREADABLE_WRAPPER is not None
    try:
        proc = subprocess.run(
            [*UNREADABLE_WRAPPER, PYTHON, "-m", "artifactd", "restore", "--target",
             str(world.target), "--gpu-arch", "sm_90a", "--from-dir", str(tree),
             "--require", "--json"],
            capture_output=True, text=True, env=clean_env(), timeout=QUICK, check=False,
        )  # fmt: skip
    finally:
        path.chmod(0o755)
    _ok(proc)
    failure = _report(proc)["failure"]
    assert proc.returncode == 3, proc.stderr
    assert failure["kind"] == "unreachable", failure
    assert "not writable" not in failure["message"] and str(tree) in failure["message"]
    assert snapshot(world.target) == before


def test_a_swapped_source_file_is_not_blamed_on_the_target(world: World) -> None:
    """Root can read a mode-000 file, but not open a socket: no "target is not writable"."""
    tree = world.merged()
    proc = _restore(
        world.target, "--from-dir", str(tree), "--json", prelude=f"SWAP = 'socket'\n{SWAP_PRELUDE}"
    )
    _ok(proc)
    failure = _report(proc)["failure"]
    assert proc.returncode == 0  # without --require a failed restore lets the pod start
    assert failure["kind"] != "target" and "target" not in failure["message"], failure
    assert str(tree) in failure["message"]


def _padded_entries(files: list[dict[str, Any]], size: int) -> list[dict[str, Any]]:
    """At least ``size`` bytes of file entries: ``files`` repeated under new paths."""
    per = len(json.dumps(files[0], separators=(",", ":"))) + 1
    out = []
    for i in range(size // per + 1):
        e = dict(files[i % len(files)])
        e["path"] = f"{e['path']}.{i}"
        out.append(e)
    return out


def test_an_oversized_tree_document_is_refused_before_it_is_read(world: World) -> None:
    tree = world.merged()
    doc_path = tree / "generic" / TREE_DOC
    doc = json.loads(doc_path.read_text())
    doc["files"] = _padded_entries(doc["files"], MAX_TREE_DOC)
    doc_path.write_text(json.dumps(doc, separators=(",", ":")))
    assert doc_path.stat().st_size > MAX_TREE_DOC
    before = snapshot(world.target)
    t0 = time.monotonic()
    proc = _restore(
        world.target, "--from-dir", str(tree), "--require", "--json", prelude=PEAK_PRELUDE
    )
    seconds = time.monotonic() - t0
    _ok(proc)
    assert proc.returncode == 5, proc.stderr
    assert _report(proc)["failure"]["kind"] == "corrupt"
    assert "larger than" in _report(proc)["failure"]["message"]
    assert peak_kib(proc) < SMALL_PEAK_KIB, "the document was read"
    assert seconds < QUICK
    assert snapshot(world.target) == before


def test_an_oversized_config_is_refused_before_it_is_read(
    world: World, local_fp: Fingerprint
) -> None:
    art = read_artifact(world.store, world.digest)
    assert art is not None
    config = json.loads(art.config.model_dump_json())
    config["layers"][0]["files"] = _padded_entries(config["layers"][0]["files"], MAX_CONFIG_BYTES)
    data = json.dumps(config, separators=(",", ":")).encode()
    assert len(data) > MAX_CONFIG_BYTES
    publish(world.store, local_fp, world.tmp / "scratch", [], config=data, descriptors=[])
    before = snapshot(world.target)
    proc = _restore(
        world.target, "--store", world.store.ref, "--require", "--json", prelude=PEAK_PRELUDE
    )
    _ok(proc)
    assert proc.returncode == 5, proc.stderr
    assert _report(proc)["failure"]["kind"] == "corrupt"
    assert "implausibly large" in _report(proc)["failure"]["message"]
    assert peak_kib(proc) < SMALL_PEAK_KIB, "the config was read"
    assert snapshot(world.target) == before


# --------------------------------------------------------------------------
# Layout stores
# --------------------------------------------------------------------------


@pytest.mark.parametrize("what", ["layer blob", "index.json"])
def test_a_fifo_in_a_layout_store_is_refused_at_once(world: World, what: str) -> None:
    # A second target: the first one's marker would make this a no-op.
    target = world.tmp / "fresh"
    if what == "layer blob":
        art = read_artifact(world.store, world.digest)
        assert art is not None
        path = world.blob(art.manifest.layers[0].digest)
    else:
        assert isinstance(world.store, LayoutStore)
        path = world.store.root / "index.json"
    path.unlink()
    os.mkfifo(path)
    proc = _restore(target, "--store", world.store.ref, "--require", "--json")
    _ok(proc)
    failure = _report(proc)["failure"]
    assert (proc.returncode, failure["kind"]) == (
        (5, "corrupt") if what == "layer blob" else (3, "unreachable")
    ), failure
    assert "FIFO" in failure["message"]
    assert not target.exists() or snapshot(target).keys() <= {".artifactd"}


# --------------------------------------------------------------------------
# exec's env file
# --------------------------------------------------------------------------


def _exec(target: Path, env_file: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return run_artifactd(
        "exec",
        "--target",
        str(target),
        "--env-file",
        str(env_file),
        *flags,
        "--",
        "sh",
        "-c",
        "echo CMD-RAN",
        timeout=QUICK,
    )


@pytest.mark.parametrize(
    ("content", "line"),
    [
        (b"# artifactd\nTRITON_CACHE_DIR=/cache/triton\nBAD=a\x00b\n", 3),
        (b"A=1\n=/cache/triton\n", 2),
        (b"A='unclosed\n", 1),
    ],
    ids=["nul-byte", "empty-key", "unbalanced-quote"],
)
def test_a_malformed_env_file_is_a_config_error_naming_the_line(
    tmp_path: Path, content: bytes, line: int
) -> None:
    env_file = tmp_path / "artifactd.env"
    env_file.write_bytes(content)
    proc = _exec(tmp_path, env_file)
    _ok(proc)
    assert proc.returncode == 2, proc.stderr
    assert f"line {line}" in proc.stderr
    assert "CMD-RAN" not in proc.stdout
    assert "/cache/triton" not in proc.stderr  # the error names the line, not what it holds


@pytest.mark.parametrize("require", [False, True])
def test_an_env_file_that_is_a_fifo_does_not_hang_exec(tmp_path: Path, require: bool) -> None:
    env_file = tmp_path / "artifactd.env"
    os.mkfifo(env_file)
    proc = _exec(tmp_path, env_file, *(["--require"] if require else []))
    _ok(proc)
    assert "is a FIFO, not a regular file" in proc.stderr
    if require:
        assert proc.returncode == 10 and "CMD-RAN" not in proc.stdout
    else:  # no restored caches to load: CMD runs on its own, after the warning
        assert proc.returncode == 0 and "CMD-RAN" in proc.stdout


def test_an_env_file_that_is_a_fifo_does_not_hang_a_warm_restore(world: World) -> None:
    """The no-op check reads the env file too: a FIFO there is not what the marker says."""
    env_file = world.target / "artifactd.env"
    env_file.unlink()
    os.mkfifo(env_file)
    proc = _restore(world.target, "--store", world.store.ref, "--require", "--json")
    _ok(proc)
    assert proc.returncode == 0, proc.stderr
    assert _report(proc)["status"] == "restored"  # not a no-op: the env file is rewritten
    assert env_file.is_file() and not env_file.is_symlink()


# --------------------------------------------------------------------------
# Options and paths
# --------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["-1", "-5M", "inf", "nan", "1e400"])
@pytest.mark.parametrize("how", ["flag", "env", "exec"])
def test_max_bytes_out_of_range_is_a_usage_error(tmp_path: Path, value: str, how: str) -> None:
    target = tmp_path / "target"
    if how == "exec":
        proc = run_artifactd(
            "exec",
            "--restore",
            "--target",
            str(target),
            "--store",
            f"oci:{tmp_path / 'none'}",
            "--max-bytes",
            value,
            "--",
            "true",
            timeout=QUICK,
        )
    else:
        args = ["--max-bytes", value] if how == "flag" else []
        env = {"ARTIFACTD_MAX_BYTES": value} if how == "env" else None
        proc = _restore(target, "--store", f"oci:{tmp_path / 'none'}", *args, env=env)
    _ok(proc)
    assert proc.returncode == 2, proc.stderr
    assert "--max-bytes" in proc.stderr and "not a size" in proc.stderr
    assert not target.exists()


@pytest.fixture
def locked_target(world: World) -> Iterator[Path]:
    """A fresh target whose lock another restore holds for the whole test."""
    target = world.tmp / "locked"
    (target / ".artifactd").mkdir(parents=True)
    with (target / ".artifactd" / "lock").open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        yield target


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "-inf"])
@pytest.mark.parametrize("how", ["flag", "env", "exec"])
def test_lock_timeout_out_of_range_is_a_usage_error(
    world: World, locked_target: Path, value: str, how: str
) -> None:
    """NaN never compares past a deadline: a restore waited on a held lock forever."""
    if how == "exec":
        proc = run_artifactd(
            "exec",
            "--restore",
            "--target",
            str(locked_target),
            "--store",
            world.store.ref,
            "--gpu-arch",
            "sm_90a",
            f"--lock-timeout={value}",
            "--",
            "true",
            timeout=QUICK,
        )
    else:
        args = [f"--lock-timeout={value}"] if how == "flag" else []
        env = {"ARTIFACTD_LOCK_TIMEOUT": value} if how == "env" else None
        proc = _restore(locked_target, "--store", world.store.ref, *args, env=env)
    _ok(proc)
    assert proc.returncode == 2, proc.stderr
    assert "--lock-timeout" in proc.stderr and "not a number of seconds from 0" in proc.stderr


def test_a_target_with_a_newline_is_refused_before_anything_is_created(world: World) -> None:
    parent = world.tmp / "vols"
    parent.mkdir()
    proc = _restore(parent / "a\nb", "--store", world.store.ref, "--require")
    _ok(proc)
    assert proc.returncode == 2, proc.stderr
    assert "newline" in proc.stderr
    assert list(parent.iterdir()) == [], "a restore refused late leaves its staging behind"


def test_a_consumer_user_with_a_newline_is_refused_before_anything_is_created(
    world: World,
) -> None:
    target = world.tmp / "t2"
    proc = _restore(target, "--store", world.store.ref, "--consumer-user", "a\nb")
    _ok(proc)
    assert proc.returncode == 2, proc.stderr
    assert not target.exists()


# --------------------------------------------------------------------------
# Publishing: nothing a restore would refuse
# --------------------------------------------------------------------------


@pytest.mark.parametrize("limit", ["config", "tree document"])
def test_a_harvest_refuses_documents_a_restore_would_not_read(
    tmp_path: Path,
    caches: dict[str, str],
    local_fp: Fingerprint,
    monkeypatch: pytest.MonkeyPatch,
    limit: str,
) -> None:
    """The limits are lowered to this small cache's size: as if it held 200,000 files."""
    if limit == "config":
        monkeypatch.setattr(artifactd.stores.reading, "MAX_CONFIG_BYTES", 2000)
    else:
        monkeypatch.setattr(artifactd.format.config, "MAX_TREE_DOC", 1000)
    store = open_store(f"oci:{tmp_path / 'store'}", create=True)
    with pytest.raises(BuildError, match="config would" if limit == "config" else "its tree doc"):
        harvest(store, local_fp, environ=caches)
    assert store.list_tags() == []
    assert isinstance(store, LayoutStore)
    layers = list((store.root / "blobs" / "sha256").iterdir())
    assert layers == [], "refused before anything was uploaded"
