"""Restore end to end over a local OCI layout store, on synthetic trees in real layouts."""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import shutil
import tarfile
import threading
from pathlib import Path
from typing import Any

import pytest
import zstandard
from cachetrees import make_generic_tree

from artifactd.build.harvest import harvest
from artifactd.errors import IntegrityError, UnsafeArtifactError
from artifactd.families import FAMILIES, Located
from artifactd.fingerprint.model import Fingerprint
from artifactd.format.archive import pack_family
from artifactd.format.config import ArtifactConfig, LayerRecord, Provenance, RootFS
from artifactd.restore.destination import (
    JOURNAL_NAME,
    LOCK_NAME,
    MARKER_NAME,
    STATE_DIR,
    CacheVolume,
)
from artifactd.restore.install import restore
from artifactd.restore.journal import JournalEntry, RestoreJournal
from artifactd.restore.marker import dump
from artifactd.restore.policy import RestoreRequest, run_restore
from artifactd.restore.resolve import noop_plan, plan_restore
from artifactd.restore.source import StoreSource
from artifactd.stores import open_store
from artifactd.stores.artifacts import publish
from artifactd.stores.layout import LayoutStore
from artifactd.trust.policy import UNSAFE_NO_VERIFICATION


@pytest.fixture
def store(tmp_path: Path) -> LayoutStore:
    st = open_store(f"oci:{tmp_path / 'store'}", create=True)
    assert isinstance(st, LayoutStore)
    return st


def _with_workload(fp: Fingerprint, **workload: str) -> Fingerprint:
    return fp.model_copy(update={"workload": workload})


def test_full_restore_installs_rewrites_and_marks(
    tmp_path: Path, caches: dict[str, str], store: LayoutStore, local_fp: Fingerprint
) -> None:
    fp = _with_workload(local_fp, model="m1")
    result = harvest(store, fp, environ=caches)
    assert {f.family for f in result.families} == {"triton", "generic"}
    assert "inductor" in result.not_found

    target = tmp_path / "target"
    plan = plan_restore(StoreSource(store), fp, target, trust=UNSAFE_NO_VERIFICATION)
    assert plan.match == "full"
    assert {f.family for f in plan.hits} == {"triton", "generic"}
    assert not target.exists()  # planning writes nothing

    done = restore(plan, StoreSource(store))
    assert sorted(done.restored) == ["generic", "triton"]
    # Group files now point at the restored root, and every child exists there.
    groups = list((target / "triton").glob("*/__grp__*.json"))
    assert len(groups) == 2
    for g in groups:
        children = json.loads(g.read_text())["child_paths"]
        for path in children.values():
            assert path.startswith(str(target / "triton") + "/")
            assert Path(path).is_file()
    # Interrupted writes were not shipped.
    assert not list((target / "triton").glob("tmp.pid_*"))
    assert (target / "generic" / "sub" / "kernel.so").stat().st_mode & 0o777 == 0o755
    env = (target / "artifactd.env").read_text()
    assert f"TRITON_CACHE_DIR={target / 'triton'}" in env
    assert f"ARTIFACTD_GENERIC_DIR={target / 'generic'}" in env
    marker = json.loads((target / STATE_DIR / MARKER_NAME).read_text())
    assert marker["fingerprint_hash"] == fp.hash
    assert set(marker["families"]) == {"triton", "generic"}
    assert sorted(p.name for p in (target / STATE_DIR).iterdir() if p.name != "lock") == [
        MARKER_NAME
    ]


def test_second_restore_is_a_noop(
    tmp_path: Path, caches: dict[str, str], store: LayoutStore, local_fp: Fingerprint
) -> None:
    harvest(store, local_fp, environ=caches)
    target = tmp_path / "target"
    restore(
        plan_restore(StoreSource(store), local_fp, target, trust=UNSAFE_NO_VERIFICATION),
        StoreSource(store),
    )
    before = (target / STATE_DIR / MARKER_NAME).stat().st_mtime_ns
    again = noop_plan(StoreSource(store), local_fp.hash, local_fp.flatten(), CacheVolume(target))
    assert again is not None
    assert restore(again, StoreSource(store)).noop
    assert (target / STATE_DIR / MARKER_NAME).stat().st_mtime_ns == before
    # Deleting a restored dir invalidates the no-op.

    shutil.rmtree(target / "generic")
    assert (
        noop_plan(StoreSource(store), local_fp.hash, local_fp.flatten(), CacheVolume(target))
        is None
    )


def test_restore_replaces_an_old_cache_atomically(
    tmp_path: Path, caches: dict[str, str], store: LayoutStore, local_fp: Fingerprint
) -> None:
    harvest(store, local_fp, environ=caches)
    target = tmp_path / "target"
    (target / "triton" / "stale").mkdir(parents=True)
    (target / "triton" / "stale" / "old.cubin").write_bytes(b"old")
    restore(
        plan_restore(StoreSource(store), local_fp, target, trust=UNSAFE_NO_VERIFICATION),
        StoreSource(store),
    )
    assert not (target / "triton" / "stale").exists()
    assert len(list((target / "triton").glob("*/__grp__*.json"))) == 2
    leftovers = sorted(p.name for p in (target / STATE_DIR).iterdir() if p.name != "lock")
    assert leftovers == [MARKER_NAME]


def test_corrupt_layer_never_replaces_a_good_cache(
    tmp_path: Path, caches: dict[str, str], store: LayoutStore, local_fp: Fingerprint
) -> None:
    good_fp = _with_workload(local_fp, model="good")
    harvest(store, good_fp, environ=caches)
    target = tmp_path / "target"
    restore(
        plan_restore(StoreSource(store), good_fp, target, trust=UNSAFE_NO_VERIFICATION),
        StoreSource(store),
    )
    snapshot = {p: p.read_bytes() for p in target.rglob("*") if p.is_file()}

    # A second artifact whose triton layer is corrupted on disk.
    # A complete new Triton entry (with its group file), so the layer really changes.
    entry = Path(caches["TRITON_CACHE_DIR"]) / ("Z" * 52)
    entry.mkdir()
    (entry / "newk.cubin").write_bytes(b"new kernel")
    (entry / "__grp__newk.json").write_text(
        json.dumps({"child_paths": {"newk.cubin": str(entry / "newk.cubin")}})
    )
    bad_fp = _with_workload(local_fp, model="bad")
    res = harvest(store, bad_fp, environ=caches)
    layer = next(f for f in res.families if f.family == "triton")
    assert layer.layer_digest is not None
    blob = store.root / "blobs" / "sha256" / layer.layer_digest.split(":")[1]
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))

    plan = plan_restore(StoreSource(store), bad_fp, target, trust=UNSAFE_NO_VERIFICATION)
    with pytest.raises(IntegrityError):
        restore(plan, StoreSource(store))
    after = {p: p.read_bytes() for p in target.rglob("*") if p.is_file()}
    assert after == snapshot
    assert sorted(p.name for p in (target / STATE_DIR).iterdir() if p.name != "lock") == [
        MARKER_NAME
    ]


def test_partial_restore_by_family_scope(
    tmp_path: Path, caches: dict[str, str], store: LayoutStore, local_fp: Fingerprint
) -> None:
    harvest(store, _with_workload(local_fp, model="llama", tp="8"), environ=caches)
    other = _with_workload(local_fp, model="qwen", tp="2")
    plan = plan_restore(
        StoreSource(store), other, tmp_path / "target", trust=UNSAFE_NO_VERIFICATION
    )
    assert plan.match == "partial"
    assert {(f.family, f.source) for f in plan.hits} == {
        ("triton", "family"),
        ("generic", "family"),
    }
    assert plan.nearest is not None
    assert {d.path for d in plan.nearest.differing} == {"workload.model", "workload.tp"}
    assert plan.nearest.compared == len(list(store.iter_tags("fp-"))) == 1
    restore(plan, StoreSource(store))
    assert len(list((tmp_path / "target" / "triton").glob("*/__grp__*.json"))) == 2


def test_miss_names_deciding_fields(
    tmp_path: Path, caches: dict[str, str], store: LayoutStore, local_fp: Fingerprint
) -> None:
    harvest(store, local_fp, environ=caches)
    blackwell = local_fp.model_copy(
        update={"gpu": local_fp.gpu.model_copy(update={"arch": "sm_100a", "capability": "10.0"})}
    )
    plan = plan_restore(
        StoreSource(store), blackwell, tmp_path / "target", trust=UNSAFE_NO_VERIFICATION
    )
    assert plan.match == "miss"
    assert not plan.hits
    triton = next(f for f in plan.families if f.family == "triton")
    assert {d.path for d in triton.deciding} == {"gpu.arch"}
    assert triton.reason and "gpu.arch" in triton.reason
    assert not (tmp_path / "target").exists()


def test_unreachable_store_is_a_clean_miss(tmp_path: Path, local_fp: Fingerprint) -> None:
    plan = plan_restore(
        None,
        local_fp,
        tmp_path / "t",
        store_ref="oci:/nope",
        store_error="no such store",
        trust=UNSAFE_NO_VERIFICATION,
    )
    assert plan.match == "miss"
    assert all(f.verdict == "miss" for f in plan.families)
    assert plan.error == "no such store"


def test_hostile_artifact_writes_nothing_outside_staging(
    tmp_path: Path, store: LayoutStore, local_fp: Fingerprint
) -> None:
    """A layer whose tar escapes via '..' is refused; the target and its parent stay clean."""
    src = make_generic_tree(tmp_path / "src")
    fam = FAMILIES["generic"]
    key = local_fp.scope_key(fam.name, fam.scope)
    packed = pack_family(
        fam,
        [Located(fam.components[0], src)],
        tmp_path / "g.tar.zst",
        scope_key=key,
        scope=local_fp.select(fam.scope),
    )
    # Same manifest entries, but the blob carries an escaping member (format 2:
    # inside the family directory, so the escape itself is what is refused).
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo("generic/cache/../../../escaped.txt")
        payload = b"pwned"
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    evil = tmp_path / "evil.tar.zst"
    evil.write_bytes(zstandard.ZstdCompressor().compress(raw.getvalue()))

    packed.path = evil
    packed.digest = "sha256:" + hashlib.sha256(evil.read_bytes()).hexdigest()
    packed.size = evil.stat().st_size

    rec = LayerRecord(
        family="generic",
        scope_key=key,
        scope=local_fp.select(fam.scope),
        components=["cache"],
        files=packed.files,
        digest=packed.digest,
        size=packed.size,
        diff_id=packed.diff_id,
        unpacked_size=packed.unpacked_size,
    )
    art = ArtifactConfig(
        architecture="amd64",
        rootfs=RootFS(diff_ids=[rec.diff_id]),
        fingerprint=local_fp,
        fingerprint_hash=local_fp.hash,
        layers=[rec],
        provenance=Provenance(builder="test"),
    )
    publish(store, art, {"generic": packed}, tmp_path)
    target = tmp_path / "deep" / "target"
    plan = plan_restore(
        StoreSource(store), local_fp, target, families=["generic"], trust=UNSAFE_NO_VERIFICATION
    )
    assert plan.match == "full"
    with pytest.raises(UnsafeArtifactError):
        restore(plan, StoreSource(store))
    assert not (tmp_path / "deep" / "escaped.txt").exists()
    assert not (tmp_path / "escaped.txt").exists()
    assert not (target / "generic").exists()
    assert [p.name for p in (target / STATE_DIR).iterdir() if p.name != "lock"] == []
    assert not os.path.exists(target / "artifactd.env")


def test_concurrent_restores_into_one_target_serialize(
    tmp_path: Path, caches: dict[str, str], store: LayoutStore, local_fp: Fingerprint
) -> None:
    """Two init containers sharing a node-local volume: one installs, the other no-ops."""
    harvest(store, local_fp, environ=caches)
    target = tmp_path / "target"
    # Leftovers of a restore that crashed mid-way are cleaned under the lock.
    (target / STATE_DIR / "staging-deadbeef" / "triton").mkdir(parents=True)
    plans = [
        plan_restore(StoreSource(store), local_fp, target, trust=UNSAFE_NO_VERIFICATION)
        for _ in range(2)
    ]
    results: list[Any] = []
    threads = [
        threading.Thread(target=lambda p=p: results.append(restore(p, StoreSource(store))))
        for p in plans
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.noop for r in results) == [False, True]
    assert len(list((target / "triton").glob("*/__grp__*.json"))) == 2
    assert sorted(p.name for p in (target / STATE_DIR).iterdir()) == ["lock", MARKER_NAME]


def test_a_forged_journal_is_discarded_not_followed(
    tmp_path: Path, caches: dict[str, str], store: LayoutStore, local_fp: Fingerprint
) -> None:
    """The volume is shared with the engine: a journal naming paths outside it is not acted on."""
    harvest(store, local_fp, environ=caches)
    target = tmp_path / "target"
    restore(
        plan_restore(StoreSource(store), local_fp, target, trust=UNSAFE_NO_VERIFICATION),
        StoreSource(store),
    )
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("precious")
    state = target / STATE_DIR
    marker = (state / MARKER_NAME).read_bytes()
    forged = RestoreJournal(
        run_id="x",
        staging=str(state / "staging-x"),
        entries=[
            JournalEntry(
                family="generic",
                dest=str(victim),
                staged=str(state / "staging-x" / "g"),
                new_inode=list(map(int, [victim.stat().st_dev, victim.stat().st_ino])),
                had_old=False,
            )
        ],
        marker_sha256=hashlib.sha256(marker).hexdigest(),
        env_file=str(tmp_path / "outside.txt"),
        env_text="pwned\n",
    )
    (state / JOURNAL_NAME).write_bytes(dump(forged))
    volume = CacheVolume(target)
    assert volume.installed() is None  # never trusted while a journal exists
    with volume.locked():
        assert volume.recover() == "discarded"
    assert not (tmp_path / "outside.txt").exists()
    assert (victim / "keep").read_text() == "precious"
    assert not (state / JOURNAL_NAME).exists()
    assert not (state / MARKER_NAME).exists()  # distrusted: the next restore installs afresh
    done = restore(
        plan_restore(StoreSource(store), local_fp, target, trust=UNSAFE_NO_VERIFICATION),
        StoreSource(store),
    )
    assert not done.noop and sorted(done.restored) == ["generic", "triton"]
    assert CacheVolume(target).installed() is not None


def test_a_noop_removes_what_a_restore_killed_after_its_commit_left(
    tmp_path: Path, caches: dict[str, str], store: LayoutStore, local_fp: Fingerprint
) -> None:
    """Killed between the journal's removal and staging's: the old trees stay in staging.

    The next restore is a no-op (the marker is true); it must still remove them,
    without waiting for the lock when another restore holds it.
    """
    harvest(store, local_fp, environ=caches)
    target = tmp_path / "target"
    request = RestoreRequest(store=store.ref, target=target)
    raw = local_fp.model_dump(mode="json")
    assert run_restore(request, raw).status == "restored"
    left = target / STATE_DIR / "staging-0123456789ab"
    (left / "triton").mkdir(parents=True)
    (left / "triton" / "old.cubin").write_bytes(b"old tree")

    with (target / STATE_DIR / LOCK_NAME).open("a") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        assert run_restore(request, raw).status == "noop"
        assert left.is_dir()  # a restore is running: not ours to touch, and no waiting
    assert run_restore(request, raw).status == "noop"
    assert not left.exists()
    assert CacheVolume(target).installed() is not None


def test_a_noop_stands_when_removing_leftovers_fails(
    tmp_path: Path,
    caches: dict[str, str],
    store: LayoutStore,
    local_fp: Fingerprint,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Tidying is best effort: the caches in place are intact, so the no-op stands."""
    harvest(store, local_fp, environ=caches)
    target = tmp_path / "target"
    request = RestoreRequest(store=store.ref, target=target)
    raw = local_fp.model_dump(mode="json")
    assert run_restore(request, raw).status == "restored"
    left = target / STATE_DIR / "staging-0123456789ab"
    left.mkdir()

    def broken(self: CacheVolume) -> str | None:  # a fault planted in our own code
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(CacheVolume, "recover", broken)
    out = run_restore(request, raw)
    assert (out.status, out.exit_code, out.failure) == ("noop", 0, None)
    assert left.is_dir()
