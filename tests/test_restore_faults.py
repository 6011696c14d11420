"""Restore under network, disk and target faults: bounded, fail-open, target untouched.

Network faults come from :mod:`faultproxy` in front of the real registry
(5xx bursts and outages, a connection cut mid-blob, a dripping transfer,
flipped bytes, a dead registry). Disk faults use a size-limited tmpfs as the
target (full at the preflight, full mid-extraction, full at the marker write)
and a tmpfs remounted read-only; the lock case holds the target's flock.

Every case runs the real CLI (``python -m artifactd restore --json``) as a
subprocess, except where a step hook is needed (in-process ``run_restore``),
and asserts: the restore ends within :data:`BOUND` seconds, exits 0 without
``--require`` with the failure's kind reported, exits with the documented code
with ``--require``, and leaves a previous good restore byte-identical (content,
marker, env file) with no staging dir, journal or temp file left behind.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from email.utils import formatdate
from pathlib import Path
from typing import Any

import pytest
from cachetrees import build_caches
from conftest import clean_env, tmpfs
from diskfaults import fill, free_bytes
from faultproxy import FaultProxy
from registry_server import RegistryServer, free_port

from artifactd.build.harvest import HarvestResult, harvest
from artifactd.fingerprint.model import Fingerprint
from artifactd.restore.destination import JOURNAL_NAME, LOCK_NAME, MARKER_NAME, STATE_DIR
from artifactd.restore.policy import RestoreRequest, run_restore
from artifactd.stores import open_store, transport
from artifactd.stores.transport import ATTEMPTS

#: Every restore must end within this many seconds, whatever the fault.
BOUND = 30.0

# The CLI runs in a subprocess, so module constants are patched there, by a
# prelude run before artifactd's entry point: short (connect, read) timeouts
# instead of artifactd.stores.transport.TIMEOUT = (5, 60) and a short retry
# backoff instead of BACKOFF_S, so that the faults' retries and timeouts take
# a fraction of the real time. The retry count (ATTEMPTS) stays as shipped.
FAST = {"TIMEOUT": (2.0, 5.0), "BACKOFF_S": 0.01}
# For the dripping transfer: the minimum-transfer-rate deadline (MIN_RATE
# bytes/s on average, after a grace of TIMEOUT[1] seconds) set high, and the
# grace low. The drip sends a byte every 0.2 s, well inside the read timeout,
# so only an overall deadline can end the transfer.
DRIP = {"TIMEOUT": (2.0, 1.5), "BACKOFF_S": 0.01, "MIN_RATE": 1_000_000}

EXIT_UNREACHABLE = 3
EXIT_CORRUPT = 5
EXIT_NO_SPACE = 9
EXIT_TARGET = 10


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


@pytest.fixture
def trees(tmp_path: Path) -> dict[str, str]:
    """Triton and generic caches; generic holds a 256 KiB incompressible file."""
    environ = build_caches(tmp_path / "build")
    (Path(environ["ARTIFACTD_GENERIC_DIR"]) / "big.bin").write_bytes(os.urandom(256 << 10))
    return environ


@pytest.fixture
def repo(request: pytest.FixtureRequest) -> str:
    """A repository of its own per test (conftest's can end in "-" when truncated)."""
    name = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:50].strip("-")
    return f"t/faults-{name}"


@pytest.fixture
def proxy(registry: RegistryServer) -> Iterator[FaultProxy]:
    with FaultProxy(registry.host) as px:
        yield px


@dataclass
class Scene:
    """What every case uses: a registry repo, the proxy in front of it, trees to publish."""

    tmp: Path
    registry: RegistryServer
    proxy: FaultProxy
    repo: str
    trees: dict[str, str]
    fp: Fingerprint

    @property
    def ref(self) -> str:
        """The repo through the proxy."""
        return self.proxy.ref(self.repo)


@pytest.fixture
def scene(
    *,
    tmp_path: Path,
    registry: RegistryServer,
    proxy: FaultProxy,
    repo: str,
    trees: dict[str, str],
    local_fp: Fingerprint,
) -> Scene:
    return Scene(tmp_path, registry, proxy, repo, trees, local_fp)


def _publish(registry: RegistryServer, repo: str, trees: dict[str, str], fp: Fingerprint) -> Any:
    """Harvest ``trees`` straight into the registry (not through the proxy)."""
    with open_store(registry.ref(repo)) as st:
        result: HarvestResult = harvest(st, fp, environ=trees)
    return result


def _layers(result: Any) -> dict[str, str]:
    return {f.family: f.layer_digest for f in result.families}


def _raw(fp: Fingerprint) -> dict[str, Any]:
    raw: dict[str, Any] = fp.model_dump(mode="json")
    return raw


def _snapshot(root: Path) -> dict[str, tuple[object, ...]]:
    """Every path under ``root`` (but the lock file) with its type, mode and content hash."""
    out: dict[str, tuple[object, ...]] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if rel == f"{STATE_DIR}/{LOCK_NAME}":
            continue
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            out[rel] = ("link", os.readlink(path))
        elif stat.S_ISDIR(st.st_mode):
            out[rel] = ("dir", stat.S_IMODE(st.st_mode))
        else:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            out[rel] = ("file", stat.S_IMODE(st.st_mode), digest)
    return out


def _good_restore(sc: Scene, target: Path) -> tuple[dict[str, tuple[object, ...]], dict[str, str]]:
    """Publish v1 and restore it through the proxy; then publish v2 (generic changed).

    Returns the snapshot of the good v1 restore and v2's layer digests: the
    next restore through the proxy must fetch v2 (no no-op).
    """
    registry, repo, trees, fp = sc.registry, sc.repo, sc.trees, sc.fp
    _publish(registry, repo, trees, fp)
    done = run_restore(RestoreRequest(store=sc.ref, target=target, require=True), _raw(fp))
    assert done.status == "restored", done.failure
    assert (target / STATE_DIR / MARKER_NAME).is_file()
    assert (target / "artifactd.env").is_file()
    before = _snapshot(target)
    (Path(trees["ARTIFACTD_GENERIC_DIR"]) / "new.cubin").write_bytes(os.urandom(8 << 10))
    v2 = _layers(_publish(registry, repo, trees, fp))
    return before, v2


def _assert_untouched(target: Path, before: dict[str, tuple[object, ...]]) -> None:
    state = target / STATE_DIR
    leftovers = sorted(
        p.name
        for p in state.iterdir()
        if p.name.startswith(("staging-", "trash-", ".tmp-")) or p.name == JOURNAL_NAME
    )
    assert leftovers == [], f"left behind in {state}: {leftovers}"
    assert not list(target.glob(".tmp-artifactd-env-*"))
    assert _snapshot(target) == before, "the previous good restore changed"


def _cli(
    store_ref: str,
    target: Path,
    *extra: str,
    require: bool,
    cwd: Path,
    patch: dict[str, object] | None = None,
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], float]:
    """Run ``artifactd restore --json`` with module constants patched; bounded by BOUND."""
    prelude = "import artifactd.stores.transport as _t\n"
    for name, value in (FAST if patch is None else patch).items():
        prelude += f"_t.{name} = {value!r}\n"
    prelude += "from artifactd.cli import main\nmain()\n"
    args = ["restore", "--store", store_ref, "--target", str(target), "--gpu-arch", "sm_90a"]
    args += ["--json", *extra] + (["--require"] if require else [])
    start = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", prelude, *args],
            capture_output=True,
            text=True,
            cwd=cwd,
            env=clean_env(),
            timeout=BOUND + 5,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"restore did not end within {BOUND + 5:.0f} s (killed); stderr tail: "
            f"{_text(exc.stderr)[-800:]}"
        )
    elapsed = time.monotonic() - start
    assert elapsed < BOUND, f"restore took {elapsed:.1f} s"
    assert "Traceback" not in proc.stderr, proc.stderr
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        pytest.fail(f"stdout is not one JSON document: {proc.stdout!r}\nstderr: {proc.stderr}")
    return proc, doc, elapsed


def _text(out: str | bytes | None) -> str:
    return out.decode(errors="replace") if isinstance(out, bytes) else out or ""


def _assert_failed(
    store_ref: str,
    target: Path,
    *extra: str,
    kind: str,
    code: int,
    cwd: Path,
    patch: dict[str, object] | None = None,
) -> list[dict[str, Any]]:
    """Fail open without --require (exit 0, kind reported), exit ``code`` with it."""
    docs = []
    for require in (False, True):
        proc, doc, _ = _cli(store_ref, target, *extra, require=require, cwd=cwd, patch=patch)
        assert doc["status"] == "failed", doc
        assert doc["failure"] is not None, doc
        assert doc["failure"]["kind"] == kind, doc["failure"]
        assert doc["failure"]["exit_code"] == code, doc["failure"]
        assert proc.returncode == (code if require else 0), (proc.returncode, proc.stderr)
        assert doc["exit_code"] == proc.returncode
        assert doc["cache_hit"] is False
        docs.append(doc)
    return docs


# --------------------------------------------------------------------------
# Network faults (through the proxy)
# --------------------------------------------------------------------------


def test_5xx_burst_shorter_than_the_retry_budget_is_retried_and_restores(scene: Scene) -> None:
    target = scene.tmp / "target"
    ref = scene.ref
    before, v2 = _good_restore(scene, target)
    scene.proxy.reset_log()
    # One request is answered 503 ATTEMPTS-1 times; its last attempt passes.
    scene.proxy.fail_next(ATTEMPTS - 1)
    proc, doc, _ = _cli(ref, target, require=True, cwd=scene.tmp)
    assert proc.returncode == 0, proc.stderr
    assert doc["status"] == "restored", doc
    assert doc["failure"] is None
    # The retries happened: the burst was answered, then the same request went through.
    faulted = scene.proxy.records(fault="5xx")
    assert len(faulted) == ATTEMPTS - 1
    assert len({(r.method, r.path) for r in faulted}) == 1
    after = scene.proxy.log[len(faulted)]
    assert (after.method, after.path, after.status) == (faulted[0].method, faulted[0].path, 200)
    assert {r.blob_digest for r in scene.proxy.blob_gets(v2.values())} == set(v2.values())
    # v2 is installed, cleanly.
    assert (target / "generic" / "new.cubin").is_file()
    assert _snapshot(target) != before
    state = sorted(p.name for p in (target / STATE_DIR).iterdir())
    assert state == [LOCK_NAME, MARKER_NAME]


@pytest.mark.slow  # the inner loop's slowest: waits out deadlines or runs many processes
def test_5xx_forever_fails_open_as_unreachable(scene: Scene) -> None:
    target = scene.tmp / "target"
    ref = scene.ref
    before, _ = _good_restore(scene, target)
    scene.proxy.reset_log()
    scene.proxy.fail_always(503)
    docs = _assert_failed(ref, target, kind="unreachable", code=EXIT_UNREACHABLE, cwd=scene.tmp)
    assert "503" in docs[1]["failure"]["message"]
    # Each run retried: ATTEMPTS attempts at least, all answered 503, nothing forwarded.
    assert scene.proxy.count(fault="5xx") >= 2 * ATTEMPTS
    assert scene.proxy.count() == scene.proxy.count(fault="5xx")
    _assert_untouched(target, before)


def _waits(proxy: FaultProxy) -> list[float]:
    """Seconds between each faulted request and the attempt after it (the same request)."""
    log = proxy.log
    out = []
    for i, rec in enumerate(log[:-1]):
        if rec.fault == "5xx":
            nxt = log[i + 1]
            assert (nxt.method, nxt.path) == (rec.method, rec.path), (rec, nxt)
            out.append(nxt.at - rec.at)
    return out


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_seconds_is_waited_before_the_retry(scene: Scene, status: int) -> None:
    """A 429/503 answer's Retry-After: 1 holds the next attempt back 1 s (the backoff is 0.01)."""
    _publish(scene.registry, scene.repo, scene.trees, scene.fp)
    scene.proxy.fail_next(1, status, retry_after="1")
    proc, doc, _ = _cli(scene.ref, scene.tmp / "target", require=True, cwd=scene.tmp)
    assert proc.returncode == 0, proc.stderr
    assert doc["status"] == "restored", doc
    (wait,) = _waits(scene.proxy)
    assert wait >= 1.0, f"retried {wait:.2f} s after a Retry-After of 1 s"


@pytest.mark.slow  # the inner loop's slowest: waits out deadlines or runs many processes
def test_retry_after_http_date_is_waited_before_the_retry(scene: Scene) -> None:
    _publish(scene.registry, scene.repo, scene.trees, scene.fp)
    # HTTP dates have whole seconds: 3 s after the answer is at least 2 s after it. The date
    # is taken when the proxy answers: taken here, a slow CLI start (a loaded machine)
    # would eat into the wait the assertion expects.
    scene.proxy.fail_next(1, 503, retry_after=lambda: formatdate(time.time() + 3, usegmt=True))
    proc, doc, _ = _cli(scene.ref, scene.tmp / "target", require=True, cwd=scene.tmp)
    assert proc.returncode == 0, proc.stderr
    assert doc["status"] == "restored", doc
    (wait,) = _waits(scene.proxy)
    assert wait >= 1.5, f"retried {wait:.2f} s after a Retry-After date 2-3 s ahead"


@pytest.mark.slow  # the inner loop's slowest: waits out deadlines or runs many processes
def test_retry_after_longer_than_the_cap_waits_the_cap(scene: Scene) -> None:
    """Retry-After: 3600 waits MAX_RETRY_AFTER_S (patched to 0.5 s here), then retries."""
    _publish(scene.registry, scene.repo, scene.trees, scene.fp)
    scene.proxy.fail_next(ATTEMPTS - 1, 429, retry_after="3600")
    patch = {**FAST, "MAX_RETRY_AFTER_S": 0.5}
    proc, doc, elapsed = _cli(
        scene.ref, scene.tmp / "target", require=True, cwd=scene.tmp, patch=patch
    )
    assert proc.returncode == 0, proc.stderr
    assert doc["status"] == "restored", doc
    waits = _waits(scene.proxy)
    assert len(waits) == ATTEMPTS - 1
    assert all(0.5 <= w < 3.0 for w in waits), waits
    assert elapsed < BOUND


def test_retry_after_cap_is_documented_and_garbage_is_ignored() -> None:
    assert transport.retry_after("7") == 7.0
    assert transport.retry_after("86400") == transport.MAX_RETRY_AFTER_S
    assert transport.retry_after("soon") is None  # the backoff alone applies
    assert transport.retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past
    page = (Path(__file__).parent.parent / "docs" / "reference" / "bounds.md").read_text()
    assert "Retry-After" in page
    assert f"{transport.MAX_RETRY_AFTER_S:g} s" in page


def test_connection_cut_mid_blob_fails_open_as_unreachable(scene: Scene) -> None:
    target = scene.tmp / "target"
    ref = scene.ref
    before, v2 = _good_restore(scene, target)
    scene.proxy.reset_log()
    scene.proxy.cut_blobs(after=100 << 10, digests=[v2["generic"]])  # the blob is > 256 KiB
    _assert_failed(ref, target, kind="unreachable", code=EXIT_UNREACHABLE, cwd=scene.tmp)
    cuts = scene.proxy.records(fault="cut")
    assert len(cuts) >= 2 and all(r.sent == 100 << 10 for r in cuts)
    _assert_untouched(target, before)


@pytest.mark.slow  # the inner loop's slowest: waits out deadlines or runs many processes
def test_dripping_blob_is_aborted_by_the_minimum_rate_deadline(scene: Scene) -> None:
    """A transfer that never stalls long enough for the read timeout must still end.

    One byte every 0.2 s of a 256 KiB blob would take 15 hours: only the
    library's minimum-rate deadline (MIN_RATE, patched high, with its grace
    TIMEOUT[1] patched to 1.5 s) ends it, as a StoreError (kind unreachable).
    """
    target = scene.tmp / "target"
    ref = scene.ref
    before, v2 = _good_restore(scene, target)
    scene.proxy.reset_log()
    scene.proxy.drip_blobs(chunk=1, every=0.2, digests=[v2["generic"]])
    kind, code = "unreachable", EXIT_UNREACHABLE
    _assert_failed(ref, target, kind=kind, code=code, cwd=scene.tmp, patch=DRIP)
    drips = scene.proxy.records(fault="drip")
    assert len(drips) >= 2 and all(r.sent < 1024 for r in drips)
    _assert_untouched(target, before)


@pytest.mark.slow  # the inner loop's slowest: waits out deadlines or runs many processes
def test_dripping_manifest_is_bounded_too(scene: Scene) -> None:
    """The deadline must cover every body, not only blobs: a manifest can drip too.

    The ~1.2 KB manifest at 5 B/s would take about four minutes (an endless
    body: forever); with the same patched MIN_RATE and grace as above, the
    restore must give up within BOUND, as unreachable.
    """
    target = scene.tmp / "target"
    ref = scene.ref
    before, v2 = _good_restore(scene, target)
    scene.proxy.reset_log()
    scene.proxy.drip_blobs(chunk=1, every=0.2, path=r"/manifests/")
    kind, code = "unreachable", EXIT_UNREACHABLE
    _assert_failed(ref, target, kind=kind, code=code, cwd=scene.tmp, patch=DRIP)
    assert scene.proxy.count(fault="drip") >= 2
    assert scene.proxy.blob_gets(v2.values()) == []
    _assert_untouched(target, before)


def test_wrong_bytes_for_a_digest_fail_open_as_corrupt(scene: Scene) -> None:
    target = scene.tmp / "target"
    ref = scene.ref
    before, v2 = _good_restore(scene, target)
    scene.proxy.reset_log()
    # Flip one byte near the end (inside the incompressible file's zstd block,
    # so decompression may succeed and only the digest check can catch it) and
    # one in the middle of the body on the next run.
    scene.proxy.corrupt_blobs(digests=[v2["generic"]], offsets=[200 << 10])
    _assert_failed(ref, target, kind="corrupt", code=EXIT_CORRUPT, cwd=scene.tmp)
    scene.proxy.corrupt_blobs(digests=[v2["generic"]])
    proc, doc, _ = _cli(ref, target, require=True, cwd=scene.tmp)
    assert (proc.returncode, doc["failure"]["kind"]) == (EXIT_CORRUPT, "corrupt"), doc["failure"]
    corrupted = scene.proxy.records(fault="corrupt")
    assert len(corrupted) == 3 and all(r.sent > 256 << 10 for r in corrupted)
    _assert_untouched(target, before)


@pytest.mark.slow  # the inner loop's slowest: waits out deadlines or runs many processes
def test_dead_registry_fails_open_as_unreachable(scene: Scene) -> None:
    target = scene.tmp / "target"
    ref = scene.ref
    before, _ = _good_restore(scene, target)
    scene.proxy.close()  # nothing listens on the proxy's port any more
    _assert_failed(ref, target, kind="unreachable", code=EXIT_UNREACHABLE, cwd=scene.tmp)
    _assert_untouched(target, before)
    # A port nobody ever listened on, and an empty target: the same verdict.
    empty = scene.tmp / "empty"
    _assert_failed(
        f"127.0.0.1:{free_port()}/{scene.repo}",
        empty,
        kind="unreachable",
        code=EXIT_UNREACHABLE,
        cwd=scene.tmp,
    )
    assert not (empty / STATE_DIR / MARKER_NAME).exists()
    assert not (empty / "artifactd.env").exists()


# --------------------------------------------------------------------------
# Full disk (tmpfs targets)
# --------------------------------------------------------------------------


def test_full_disk_caught_by_the_preflight_downloads_nothing(scene: Scene) -> None:
    layers = _layers(_publish(scene.registry, scene.repo, scene.trees, scene.fp))
    with tmpfs(scene.tmp / "mnt", "8m") as mnt:
        # Leave less than the layers need (their files plus the 1 MiB margin).
        fill(mnt / "filler", leave=512 << 10)
        target = mnt / "target"
        docs = _assert_failed(scene.ref, target, kind="no_space", code=EXIT_NO_SPACE, cwd=scene.tmp)
        message = docs[1]["failure"]["message"]
        assert "needs" in message and "free" in message, message
        assert "MiB" in message and "generic" in message and "triton" in message, message
        # Nothing downloaded: no layer blob was asked for.
        assert scene.proxy.blob_gets(layers.values()) == []
        state = target / STATE_DIR
        assert sorted(p.name for p in state.iterdir()) in ([], [LOCK_NAME])
        assert sorted(p.name for p in target.iterdir()) == [STATE_DIR]
        assert sorted(p.name for p in mnt.iterdir()) == ["filler", "target"]


def test_disk_full_mid_extraction_keeps_the_previous_cache(scene: Scene) -> None:
    """The preflight passes; the disk fills (another writer) when the download starts."""
    with tmpfs(scene.tmp / "mnt", "24m") as mnt:
        target = mnt / "target"
        ref = scene.ref
        before, v2 = _good_restore(scene, target)
        filler = mnt / "filler"
        lock = threading.Lock()
        fills: list[int] = []

        def fill_disk(digest: str) -> None:
            # Runs in the proxy before the first layer download is forwarded:
            # the preflight has passed; leave 64 KiB, less than the 256 KiB file.
            with lock:
                if digest in v2.values() and not filler.exists():
                    fill(filler, leave=64 << 10)
                    fills.append(free_bytes(mnt))

        scene.proxy.on_blob_get = fill_disk
        for require in (False, True):
            proc, doc, _ = _cli(ref, target, require=require, cwd=scene.tmp)
            assert doc["failure"] is not None and doc["failure"]["kind"] == "no_space", doc
            assert proc.returncode == (EXIT_NO_SPACE if require else 0), proc.stderr
            # Hit during extraction (ENOSPC), not refused by the preflight.
            assert "no space left" in doc["failure"]["message"], doc["failure"]
            assert fills and fills[-1] <= 64 << 10
            _assert_untouched(target, before)
            filler.unlink()
        assert len(fills) == 2
        assert len(scene.proxy.blob_gets([v2["generic"]])) == 2


def test_enospc_at_the_marker_write_rolls_the_install_back(scene: Scene) -> None:
    with tmpfs(scene.tmp / "mnt", "24m") as mnt:
        target = mnt / "target"
        ref = scene.ref
        before, _ = _good_restore(scene, target)
        filler = mnt / "filler"
        steps: list[str] = []

        def hook(step: str) -> None:
            steps.append(step)
            if step == "env-staged":
                fill(filler)  # completely: the marker's write gets ENOSPC

        for require in (False, True):
            steps.clear()
            start = time.monotonic()
            out = run_restore(
                RestoreRequest(store=ref, target=target, require=require),
                _raw(scene.fp),
                step_hook=hook,
            )
            assert time.monotonic() - start < BOUND
            assert "env-staged" in steps and "marker" not in steps, steps
            assert out.status == "failed"
            assert out.failure is not None and out.failure.kind == "no_space", out.failure
            assert out.exit_code == (EXIT_NO_SPACE if require else 0)
            assert out.failure.exit_code == EXIT_NO_SPACE
            assert "no space left" in out.failure.message, out.failure.message
            _assert_untouched(target, before)
            filler.unlink()


# --------------------------------------------------------------------------
# Unwritable or busy target
# --------------------------------------------------------------------------


def test_read_only_target_fails_open_as_target(scene: Scene) -> None:
    with tmpfs(scene.tmp / "mnt", "32m") as mnt:
        target = mnt / "target"
        ref = scene.ref
        before, v2 = _good_restore(scene, target)
        scene.proxy.reset_log()
        ro = subprocess.run(
            ["mount", "-o", "remount,ro", str(mnt)], capture_output=True, text=True, check=False
        )
        if ro.returncode != 0:
            pytest.skip(f"remounting the tmpfs read-only is not permitted: {ro.stderr.strip()}")
        docs = _assert_failed(ref, target, kind="target", code=EXIT_TARGET, cwd=scene.tmp)
        assert "not writable" in docs[1]["failure"]["message"], docs[1]["failure"]
        assert scene.proxy.blob_gets(v2.values()) == []  # refused before any download
        _assert_untouched(target, before)


@pytest.mark.slow  # the inner loop's slowest: waits out deadlines or runs many processes
def test_lock_held_by_another_process_fails_open_as_target(scene: Scene) -> None:
    target = scene.tmp / "target"
    ref = scene.ref
    before, v2 = _good_restore(scene, target)
    scene.proxy.reset_log()
    # Our own open file description: the CLI subprocess cannot take the flock.
    with (target / STATE_DIR / LOCK_NAME).open("a") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        docs = _assert_failed(
            ref, target, "--lock-timeout", "1", kind="target", code=EXIT_TARGET, cwd=scene.tmp
        )
    message = docs[1]["failure"]["message"]
    assert "another restore" in message and "lock" in message, message
    assert scene.proxy.blob_gets(v2.values()) == []
    _assert_untouched(target, before)
