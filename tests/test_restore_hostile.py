"""Hostile and broken artifacts never change a target that already holds good caches.

Every case of :mod:`hostile` is published under the fingerprint ``model=evil``
into a store that also holds a real harvested generic+triton artifact
(``model=good``). The target first receives the good restore; then the hostile
one must fail with the expected kind and a message naming the problem, exit 0
(or the documented code with ``--require``), write nothing outside
``<target>/.artifactd/staging-*`` (a full snapshot of ``tmp_path``, store and
builder scratch aside, is unchanged: bytes, modes and link targets), leave the
previous caches, marker and env file as they were, and leave no staging,
trash or journal behind.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cachetrees import harvest_environ, make_generic_tree, make_triton_tree
from conftest import BATCH_WRITERS, run_artifactd
from hostile import CASE_NAMES, CASES, EXIT, PWN, Case, blob_path, get_case, honest

from artifactd.build.harvest import harvest
from artifactd.fingerprint.model import Fingerprint
from artifactd.restore.destination import MARKER_NAME, STATE_DIR
from artifactd.restore.policy import RestoreOutcome, RestoreRequest, run_restore
from artifactd.stores import Store, open_store


def _with_workload(fp: Fingerprint, model: str) -> Fingerprint:
    return fp.model_copy(update={"workload": {"model": model}})


def _caches_env(root: Path) -> dict[str, str]:
    return harvest_environ(root)


@pytest.fixture(scope="module")
def good_store(tmp_path_factory: pytest.TempPathFactory, local_fp: Fingerprint) -> Path:
    """A layout store holding a real harvested generic+triton artifact (``model=good``)."""
    root = tmp_path_factory.mktemp("good")
    make_triton_tree(root / "build" / "triton")
    make_generic_tree(root / "build" / "generic")
    store = open_store(f"oci:{root / 'store'}", create=True)
    res = harvest(store, _with_workload(local_fp, "good"), environ=_caches_env(root / "build"))
    assert {f.family for f in res.families} == {"triton", "generic"}
    return root / "store"


Snapshot = dict[str, tuple[Any, ...]]


def snapshot(root: Path, skip: set[Path]) -> Snapshot:
    """Every entry under ``root`` (links not followed): type, mode, bytes or link target."""
    out: Snapshot = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = [n for n in dirnames if here / n not in skip]
        for name in dirnames + filenames:
            path = here / name
            if path in skip:
                continue
            st = os.lstat(path)
            rel = str(path.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(path))
            elif stat.S_ISREG(st.st_mode):
                out[rel] = ("file", st.st_mode, path.read_bytes())
            else:
                out[rel] = ("other", st.st_mode)
    return out


@dataclass
class World:
    """tmp_path with a store and a target that holds a good restore."""

    tmp: Path
    store_dir: Path
    scratch: Path
    target: Path
    evil: Fingerprint

    @property
    def ref(self) -> str:
        return f"oci:{self.store_dir}"

    @property
    def evil_raw(self) -> dict[str, Any]:
        return self.evil.model_dump(mode="json")

    def store(self) -> Store:
        return open_store(self.ref)

    @property
    def state(self) -> Path:
        return self.target / STATE_DIR

    def take(self) -> tuple[Snapshot, bytes]:
        skip = {self.store_dir, self.scratch, self.state}
        return snapshot(self.tmp, skip), (self.state / MARKER_NAME).read_bytes()

    def assert_unchanged(self, before: tuple[Snapshot, bytes], escapes: tuple[str, ...]) -> None:
        files, marker = before
        after = snapshot(self.tmp, {self.store_dir, self.scratch, self.state})
        new = sorted(set(after) - set(files))
        gone = sorted(set(files) - set(after))
        changed = sorted(k for k in files.keys() & after.keys() if files[k] != after[k])
        assert (new, gone, changed) == ([], [], []), "the target or its neighbours changed"
        assert (self.state / MARKER_NAME).read_bytes() == marker
        # No staging, trash, journal or temp file left: only the lock and the marker.
        assert sorted(os.listdir(self.state)) == ["lock", MARKER_NAME]
        for esc in escapes:
            assert not os.path.lexists(esc if esc.startswith("/") else self.tmp / esc), esc


@pytest.fixture
def world(tmp_path: Path, good_store: Path, local_fp: Fingerprint) -> World:
    store_dir = tmp_path / "store"
    shutil.copytree(good_store, store_dir)
    (tmp_path / "vol").mkdir()
    (tmp_path / "vol" / "neighbour.txt").write_text("not artifactd's\n")
    (tmp_path / "cwd").mkdir()
    target = tmp_path / "vol" / "target"
    good = _with_workload(local_fp, "good").model_dump(mode="json")
    out = run_restore(RestoreRequest(store=f"oci:{store_dir}", target=target), good)
    assert out.status == "restored", out.failure
    assert sorted(out.result.restored if out.result else []) == ["generic", "triton"]
    assert len(list((target / "triton").glob("*/__grp__*.json"))) == 2
    assert (target / "generic" / "sub" / "kernel.so").is_file()
    return World(
        tmp_path, store_dir, tmp_path / "scratch", target, _with_workload(local_fp, "evil")
    )


@pytest.fixture(autouse=True)
def _no_pwn_in_tmp() -> Iterator[None]:
    """The absolute escapes aim at /tmp/PWN: it must not exist before or after."""
    assert not os.path.lexists(f"/tmp/{PWN}")
    yield
    assert not os.path.lexists(f"/tmp/{PWN}")


def _restore(world: World, case: Case, *, require: bool) -> RestoreOutcome:
    request = RestoreRequest(
        store=world.ref, target=world.target, require=require, max_bytes=case.max_bytes
    )
    return run_restore(request, world.evil_raw)


def _assert_failed(out: RestoreOutcome, case: Case, *, require: bool) -> None:
    assert out.status == "failed"
    assert out.failure is not None
    assert out.failure.kind == case.expect_kind, out.failure.message
    assert re.search(case.message, out.failure.message), out.failure.message
    assert out.exit_code == (EXIT[case.expect_kind] if require else 0)
    assert out.failure.exit_code == EXIT[case.expect_kind]
    assert not out.cache_hit


# --------------------------------------------------------------------------
# Every case, in process, with and without --require
# --------------------------------------------------------------------------


def test_control_artifact_restores(world: World) -> None:
    """The builder's honest artifact restores: every hostile failure is the payload's."""
    honest(world.store(), world.evil, world.scratch)
    out = run_restore(RestoreRequest(store=world.ref, target=world.target), world.evil_raw)
    assert out.status == "restored", out.failure
    assert (world.target / "generic" / "a").read_bytes() == b"A" * 100
    assert (world.target / "generic" / "sub" / "k.so").stat().st_mode & 0o777 == 0o755
    assert not (world.target / "generic" / "axpy.sm_90a.cubin").exists()
    assert len(list((world.target / "triton").glob("*/__grp__*.json"))) == 2


def _with_writers() -> Iterator[Any]:
    """Every case; those refused while streaming once per writer (the C one and Python's)."""
    for c, name in zip(CASES, CASE_NAMES, strict=True):
        if c.stage == "stream":
            for writer in BATCH_WRITERS:
                yield pytest.param(c, writer, id=f"{name}-{writer}")
        else:
            yield pytest.param(c, "any", id=name)


@pytest.mark.parametrize(("case", "batch_writer"), list(_with_writers()), indirect=["batch_writer"])
def test_hostile_artifact_changes_nothing(case: Case, world: World, batch_writer: str) -> None:
    before = world.take()
    case.build(world.store(), world.evil, world.scratch)
    for require in (False, True):
        out = _restore(world, case, require=require)
        _assert_failed(out, case, require=require)
        world.assert_unchanged(before, case.escapes)


@pytest.mark.parametrize("case", [c for c in CASES if c.stage != "stream"], ids=lambda c: c.name)
def test_refused_before_any_layer_is_downloaded(
    case: Case, tmp_path: Path, local_fp: Fingerprint
) -> None:
    """With every layer blob gone from the store the outcome is the same: nothing was fetched."""
    store = open_store(f"oci:{tmp_path / 'store'}", create=True)
    evil = _with_workload(local_fp, "evil")
    built = case.build(store, evil, tmp_path / "scratch")
    assert built.layer_digests
    for digest in built.layer_digests:
        blob_path(store, digest).unlink(missing_ok=True)
    target = tmp_path / "target"
    request = RestoreRequest(
        store=f"oci:{tmp_path / 'store'}", target=target, require=True, max_bytes=case.max_bytes
    )
    out = run_restore(request, evil.model_dump(mode="json"))
    _assert_failed(out, case, require=True)
    assert not list(target.glob(f"{STATE_DIR}/staging-*"))
    assert not (target / "generic").exists()


# --------------------------------------------------------------------------
# A representative subset through the real CLI, both exit-code policies
# --------------------------------------------------------------------------

CLI_CASES = [
    "traversal_lying",
    "symlink_escape_write_lying",
    "symlink_chain_escape",
    "char_device",
    "bomb_after_end_of_archive",
    "schema_version_999",
    "claims_10tb_file",
    "tag_missing_layer",
]


def _cli(world: World, *args: str) -> subprocess.CompletedProcess[str]:
    return run_artifactd(
        "restore",
        "--store",
        world.ref,
        "--target",
        str(world.target),
        "--gpu-arch",
        "sm_90a",
        "--workload",
        "model=evil",
        *args,
        cwd=world.tmp / "cwd",
    )


@pytest.mark.parametrize("name", CLI_CASES)
def test_hostile_artifact_cli_exit_codes(name: str, world: World) -> None:
    """Without --require: exit 0 and one error line; with --require --json: the code and kind."""
    case = get_case(name)
    before = world.take()
    case.build(world.store(), world.evil, world.scratch)
    extra = ["--max-bytes", str(case.max_bytes)] if case.max_bytes else []
    proc = _cli(world, *extra)
    assert proc.returncode == 0, proc.stderr
    assert f"restore failed ({case.expect_kind}), nothing changed" in proc.stderr
    assert re.search(case.message, proc.stderr), proc.stderr
    assert "Traceback" not in proc.stderr
    world.assert_unchanged(before, case.escapes)

    proc = _cli(world, "--json", "--require", *extra)
    assert proc.returncode == EXIT[case.expect_kind], proc.stderr
    doc = json.loads(proc.stdout)
    assert (doc["status"], doc["cache_hit"], doc["exit_code"]) == (
        "failed",
        False,
        EXIT[case.expect_kind],
    )
    assert doc["failure"]["kind"] == case.expect_kind
    assert doc["failure"]["exit_code"] == EXIT[case.expect_kind]
    assert re.search(case.message, doc["failure"]["message"]), doc["failure"]
    assert "Traceback" not in proc.stderr
    world.assert_unchanged(before, case.escapes)


def test_cli_fingerprint_is_the_one_the_cases_publish_under(world: World) -> None:
    """The CLI's ``--gpu-arch sm_90a --workload model=evil`` resolves the evil tag (a hit)."""
    honest(world.store(), world.evil, world.scratch)
    proc = _cli(world, "--json", "--require")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert (doc["status"], doc["match"]) == ("restored", "full")


# --------------------------------------------------------------------------
# The same cases from a registry
# --------------------------------------------------------------------------

REGISTRY_CASES = [
    "traversal",
    "symlink_escape_write_lying",
    "symlink_chain_escape",
    "setuid_file",
    "bomb_lying_sizes",
    "rewrite_non_utf8",
    "schema_version_999",
    "manifest_layer_other_digest",
    "claims_10tb_file",
]


@pytest.mark.parametrize("name", REGISTRY_CASES)
def test_hostile_artifact_from_registry(name: str, world: World, registry: Any, repo: str) -> None:
    case = get_case(name)
    assert not case.layout_only
    ref = registry.ref(repo)
    before = world.take()
    with open_store(ref) as store:
        case.build(store, world.evil, world.scratch)
    out = run_restore(
        RestoreRequest(store=ref, target=world.target, require=True, max_bytes=case.max_bytes),
        world.evil_raw,
    )
    _assert_failed(out, case, require=True)
    world.assert_unchanged(before, case.escapes)


# --------------------------------------------------------------------------
# The target side: an unwritable env file location, a full filesystem
# --------------------------------------------------------------------------


def _mount_tmpfs(path: Path, options: str) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root/CAP_SYS_ADMIN): {proc.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


@pytest.fixture
def ro_dir(tmp_path: Path) -> Iterator[Path]:
    """A read-only tmpfs (chmod 0555 would not stop root)."""
    yield from _mount_tmpfs(tmp_path / "ro", "size=1m,ro")


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs."""
    yield from _mount_tmpfs(tmp_path / "small", "size=8m")


def test_unwritable_env_file_fails_before_anything_is_swapped(world: World, ro_dir: Path) -> None:
    honest(world.store(), world.evil, world.scratch)
    before = world.take()
    steps: list[str] = []
    request = RestoreRequest(
        store=world.ref, target=world.target, env_file=ro_dir / "artifactd.env", require=True
    )
    out = run_restore(request, world.evil_raw, step_hook=steps.append)
    assert out.status == "failed"
    assert out.failure is not None
    assert out.failure.kind == "target"
    assert out.exit_code == 10
    assert str(ro_dir) in out.failure.message
    assert steps == []  # no journal written, no directory swapped
    world.assert_unchanged(before, ())
    assert os.listdir(ro_dir) == []
    # The CLI says the same, with the same code.
    proc = _cli(world, "--json", "--require", "--env-file", str(ro_dir / "artifactd.env"))
    assert proc.returncode == 10, proc.stderr
    assert json.loads(proc.stdout)["failure"]["kind"] == "target"
    world.assert_unchanged(before, ())


def test_layer_larger_than_free_space_is_refused_by_the_preflight(
    tmp_path: Path, small_fs: Path, local_fp: Fingerprint
) -> None:
    """An honest 20 MB layer, an 8 MiB filesystem: no_space before any download, exit 9."""
    big = tmp_path / "big"
    (big / "generic").mkdir(parents=True)
    (big / "generic" / "weights.cubin").write_bytes(os.urandom(20 << 20))
    evil = _with_workload(local_fp, "evil")
    store = open_store(f"oci:{tmp_path / 'store'}", create=True)
    harvest(store, evil, families=["generic"], environ=_caches_env(big))
    # What an earlier restore (or the engine) left on the volume.
    target = small_fs / "target"
    (target / "generic").mkdir(parents=True)
    (target / "generic" / "old.cubin").write_bytes(b"old kernel")
    (target / "artifactd.env").write_text("ARTIFACTD_GENERIC_DIR=/somewhere\n")
    before = snapshot(small_fs, {target / STATE_DIR})
    world = World(tmp_path, tmp_path / "store", tmp_path / "scratch", target, evil)
    (tmp_path / "cwd").mkdir()
    for require, code in ((False, 0), (True, 9)):
        proc = _cli(world, "--json", *(["--require"] if require else []))
        assert proc.returncode == code, proc.stderr
        doc = json.loads(proc.stdout)
        assert doc["failure"]["kind"] == "no_space"
        message = doc["failure"]["message"]
        m = re.search(r"needs ([\d.]+) MiB on .* and ([\d.]+) MiB are free", message)
        assert m, message
        need, free = float(m[1]), float(m[2])
        assert need > 20
        assert free <= 8
        assert snapshot(small_fs, {target / STATE_DIR}) == before
        assert sorted(os.listdir(target / STATE_DIR)) == ["lock"]
