"""Restore reliability, measured: every fault case and crash loop in one table.

Each case starts from a target that already holds a good restore, then:

  hostile   restores each artifact of tests/hostile.py (traversal, links,
            devices, modes, bombs, lying records, corrupt stores...), in
            process, without and with --require
  crash     SIGKILLs a restore at each step boundary of the install (and
            between the two renames of the fallback swap), repairs, restores
            again; runs eight restores of one artifact at once
  kill -9   kills a CLI restore of a large artifact (default ~300 MiB in
            ~5000 files) after a random delay, again and again
  registry  puts tests/faultproxy.py between the CLI and a real registry:
            5xx burst, 5xx forever, connection cut mid-blob, dripping blob
            and manifest, wrong bytes, dead registry
  disk      fills a tmpfs target (at the preflight, mid-extraction, at the
            marker write), remounts it read-only, holds the target's lock

Columns: the outcome (failure kind; restored; old/new: what a crashed target
holds once repaired, or for kill -9 what the kill left), the exit code (with
--require; every failure also ran without it and had to exit 0), the bytes of
new or changed files where the case's restore may not write (for a refusal or
a rollback: anywhere outside <target>/.artifactd/staging-* and the store; for
a restore that installs: anywhere outside the target), whether the previous
restore is still byte-identical ('-' where the case replaces it by design),
and whether the case ended as required. A kill -9 counts as old-or-new when
the target held one version whole, or both families whole but disagreeing
(killed between two swaps) under a journal that keeps the marker untrusted
until the repair rolls back to old. Exits 1 when a case did not end as
required.

Usage: python bench/faults.py [--quick] [--kill-iterations 20] [--kill-mb 300]
                              [--kill-files 5000] [--seed N] [--only SECTIONS] [--keep]
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from cachetrees import make_generic_tree, make_triton_tree  # noqa: E402
from crashes import (  # noqa: E402
    COMMITTED_STEPS,
    SYMBOLIC_STEPS,
    KillRecord,
    Pair,
    build_versions,
    check_installed,
    cli_env,
    concurrent_restores,
    family_states,
    kill_loop,
    leftovers,
    make_trees,
    overall,
    restore_version,
    run_killed_at,
)
from crashes import snapshot as target_snapshot  # noqa: E402
from diskfaults import fill, free_bytes, mount_tmpfs, unmount  # noqa: E402
from faultproxy import FaultProxy  # noqa: E402
from hostile import CASES, EXIT, PWN, Case  # noqa: E402
from registry_server import RegistryServer, free_port, start_registry  # noqa: E402

from artifactd.build.harvest import harvest  # noqa: E402
from artifactd.fingerprint.model import Fingerprint  # noqa: E402
from artifactd.fingerprint.probe import probe_fingerprint  # noqa: E402
from artifactd.restore.destination import LOCK_NAME, MARKER_NAME, STATE_DIR, CacheVolume  # noqa: E402
from artifactd.restore.policy import RestoreOutcome, RestoreRequest, run_restore  # noqa: E402
from artifactd.stores import open_store  # noqa: E402
from artifactd.stores.transport import ATTEMPTS  # noqa: E402

#: Every faulted CLI restore must end within this many seconds.
BOUND = 30.0
#: Transport constants patched in the CLI subprocess (as tests/test_restore_faults.py
#: does): short timeouts and backoff, the shipped retry count.
FAST = {"TIMEOUT": (2.0, 5.0), "BACKOFF_S": 0.01}
#: For the drip: a high minimum rate after a short grace, so only that deadline ends it.
DRIP = {"TIMEOUT": (2.0, 1.5), "BACKOFF_S": 0.01, "MIN_RATE": 1_000_000}
SECTIONS = ("hostile", "crash", "kill", "registry", "disk")


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# Rows
# --------------------------------------------------------------------------


@dataclass
class Row:
    """One line of the table."""

    section: str
    case: str
    outcome: str = "?"
    exit: str = "-"
    #: Bytes of new or changed files where the case may not write (None: not measured).
    outside: int | None = None
    #: The previous restore byte-identical (None: replaced by design).
    intact: bool | None = None
    problems: list[str] = field(default_factory=list)
    skipped: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems and not (self.outside or 0)


@dataclass
class Ran:
    """One restore's result, from the CLI's --json or from run_restore."""

    require: bool
    status: str
    kind: str | None
    message: str
    exit: int
    stderr: str = ""
    elapsed: float = 0.0


def ran_of(out: RestoreOutcome, require: bool, elapsed: float = 0.0) -> Ran:
    f = out.failure
    return Ran(
        require,
        out.status,
        f.kind if f else None,
        f.message if f else "",
        out.exit_code,
        "",
        elapsed,
    )


def refusal_problems(runs: list[Ran], kind: str, message: str | None = None) -> list[str]:
    """What is wrong with ``runs`` as refusals of ``kind`` (exit 0, or its code with --require)."""
    problems = []
    for r in runs:
        tag = "--require" if r.require else "plain"
        want = EXIT[kind] if r.require else 0
        if r.status != "failed" or r.kind != kind:
            problems.append(f"{tag}: {r.status}/{r.kind}, wanted failed/{kind}: {r.message[:120]}")
        elif message and not re.search(message, r.message):
            problems.append(f"{tag}: message {r.message[:120]!r} lacks /{message}/")
        if r.exit != want:
            problems.append(f"{tag}: exit {r.exit}, wanted {want}")
        if "Traceback" in r.stderr:
            problems.append(f"{tag}: traceback on stderr")
        if r.elapsed > BOUND:
            problems.append(f"{tag}: took {r.elapsed:.1f} s (bound {BOUND:.0f} s)")
    return problems


def outcome_of(runs: list[Ran]) -> tuple[str, str]:
    """(outcome, exit) of the last run (the --require one)."""
    last = runs[-1]
    return (last.kind if last.status == "failed" else last.status) or "?", str(last.exit)


# --------------------------------------------------------------------------
# Snapshots: bytes written where nothing may be written
# --------------------------------------------------------------------------

Snap = dict[str, tuple[str, int, int, str]]


def snap(root: Path, skip: Iterable[Path] = ()) -> Snap:
    """Every entry under ``root`` but ``skip`` and staging dirs: kind, mode, size, sha256."""
    skipped = {Path(p) for p in skip}
    out: Snap = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = [
            n
            for n in dirnames
            if here / n not in skipped and not (here.name == STATE_DIR and n.startswith("staging-"))
        ]
        for name in dirnames + filenames:
            path = here / name
            if path in skipped:
                continue
            st = path.lstat()
            rel = str(path.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                link = os.readlink(path)
                out[rel] = ("link", 0, len(link), link)
            elif stat.S_ISREG(st.st_mode):
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                out[rel] = ("file", stat.S_IMODE(st.st_mode), st.st_size, digest)
            else:
                out[rel] = ("dir" if stat.S_ISDIR(st.st_mode) else "other", st.st_mode, 0, "")
    return out


def written(before: Snap, after: Snap) -> tuple[int, list[str]]:
    """(bytes of new or changed files, every new/changed/removed path)."""
    new_or_changed = [k for k in after if before.get(k) != after[k]]
    gone = [k for k in before if k not in after]
    nbytes = sum(after[k][2] for k in new_or_changed if after[k][0] in ("file", "link"))
    return nbytes, sorted(new_or_changed + gone)


class Watch:
    """Snapshots of some roots, taken now and compared later."""

    def __init__(self, roots: dict[Path, Iterable[Path]]) -> None:
        self.roots = {root: list(skip) for root, skip in roots.items()}
        self.before = {root: snap(root, skip) for root, skip in self.roots.items()}

    def delta(self) -> tuple[int, list[str]]:
        total, paths = 0, []
        for root, skip in self.roots.items():
            nbytes, changed = written(self.before[root], snap(root, skip))
            total += nbytes
            paths += [str(root / p) for p in changed]
        return total, paths


def measure(row: Row, watch: Watch) -> None:
    """Put the bytes written outside into ``row``; name the first paths as a problem."""
    nbytes, paths = watch.delta()
    row.outside = nbytes
    if paths:
        row.problems.append(f"{len(paths)} paths changed outside staging: {paths[:3]}")


# --------------------------------------------------------------------------
# Hostile artifacts
# --------------------------------------------------------------------------


def with_workload(fp: Fingerprint, model: str) -> Fingerprint:
    return fp.model_copy(update={"workload": {"model": model}})


def hostile_rows(work: Path, fp: Fingerprint, cwd: Path) -> list[Row]:
    good = with_workload(fp, "good")
    store_dir = work / "good-store"
    store = open_store(f"oci:{store_dir}", create=True)
    harvest(store, good, environ=make_trees(work / "good-src", "old"))
    evil = with_workload(fp, "evil")
    rows = []
    for i, case in enumerate(CASES):
        row = Row("hostile", case.name)
        try:
            tmp = work / f"h{i:02d}"
            hostile_case(row, case, tmp, good_store=store_dir, good=good, evil=evil, cwd=cwd)
        except Exception as exc:
            row.problems.append(f"bench error: {type(exc).__name__}: {exc}")
        shutil.rmtree(work / f"h{i:02d}", ignore_errors=True)
        rows.append(row)
    progress(f"hostile: {len(rows)} cases")
    return rows


def hostile_case(
    row: Row,
    case: Case,
    tmp: Path,
    *,
    good_store: Path,
    good: Fingerprint,
    evil: Fingerprint,
    cwd: Path,
) -> None:
    """tests/test_restore_hostile.py's world: a good restore, then the evil one, twice."""
    store_dir, scratch = tmp / "store", tmp / "scratch"
    shutil.copytree(good_store, store_dir)
    (tmp / "vol").mkdir()
    (tmp / "vol" / "neighbour.txt").write_text("not artifactd's\n")
    target = tmp / "vol" / "target"
    ref = f"oci:{store_dir}"
    first = run_restore(RestoreRequest(store=ref, target=target), good.model_dump(mode="json"))
    if first.status != "restored":
        raise RuntimeError(f"good restore: {first.status} {first.failure}")
    case.build(open_store(ref), evil, scratch)
    pwn_before = os.path.lexists(f"/tmp/{PWN}")
    watch = Watch({tmp: [store_dir, scratch], cwd: []})
    target_before = snap(target)
    runs = []
    for require in (False, True):
        request = RestoreRequest(
            store=ref, target=target, require=require, max_bytes=case.max_bytes
        )
        t0 = time.monotonic()
        out = run_restore(request, evil.model_dump(mode="json"))
        runs.append(ran_of(out, require, time.monotonic() - t0))
    row.outcome, row.exit = outcome_of(runs)
    row.problems += refusal_problems(runs, case.expect_kind, case.message)
    measure(row, watch)
    for esc in case.escapes:
        path = Path(esc if esc.startswith("/") else tmp / esc)
        if os.path.lexists(path) and not (str(path) == f"/tmp/{PWN}" and pwn_before):
            row.outside = (row.outside or 0) + path.lstat().st_size
            row.problems.append(f"escaped to {path}")
    row.intact = snap(target) == target_before and not leftovers(target)


# --------------------------------------------------------------------------
# Crashes at step boundaries, concurrency
# --------------------------------------------------------------------------


def crash_rows(work: Path, fp: Fingerprint, cwd: Path) -> list[Row]:
    pair = build_versions(work / "versions", fp)
    crashes = [(s, "exchange") for s in SYMBOLIC_STEPS] + [
        ("", "mid-rename:1"),
        ("", "mid-rename:2"),
    ]
    rows = []
    for i, (step, mode) in enumerate(crashes):
        name = f"SIGKILL at {step}" if step else f"SIGKILL between renames of swap {mode[-1]}"
        row = Row("crash", name)
        try:
            crash_case(row, pair, step, mode, tmp=work / f"c{i:02d}", cwd=cwd)
        except Exception as exc:
            row.problems.append(f"bench error: {type(exc).__name__}: {exc}")
        rows.append(row)
    row = Row("crash", "8 concurrent restores of one artifact")
    try:
        concurrent_case(row, pair, work / "concurrent", cwd)
    except Exception as exc:
        row.problems.append(f"bench error: {type(exc).__name__}: {exc}")
    rows.append(row)
    progress(f"crash: {len(rows)} cases")
    return rows


def crash_case(row: Row, pair: Pair, step: str, mode: str, *, tmp: Path, cwd: Path) -> None:
    """OLD installed, NEW killed at ``step``; the repair, then the next restore of NEW."""
    target = tmp / "target"
    restore_version(pair, pair.old, target)
    before = target_snapshot(target)
    committed = step in COMMITTED_STEPS
    # A rollback must leave the target as it was; a committed install may change it.
    watch = Watch({tmp: [] if not committed else [target], cwd: []})
    real_step = pair.step(step, target) if step else ""
    code = run_killed_at(pair, pair.new, target, real_step, mode=mode, env=cli_env())
    row.exit = str(code)
    killed = family_states(target, pair)
    vol = CacheVolume(target)
    journal = vol.journal_path.exists()
    if journal and vol.installed() is not None:
        row.problems.append("installed() trusted a marker while a journal exists")
    allowed = {"old", "new", "missing"} if mode.startswith("mid-rename") else {"old", "new"}
    if not set(killed.values()) <= allowed:
        row.problems.append(f"after the kill: {killed}")
    with vol.locked():
        vol.recover()
    want = pair.new if committed else pair.old
    repaired = overall(family_states(target, pair))
    was = "missing" if "missing" in killed.values() else overall(killed)
    row.outcome = repaired if was == repaired else f"{repaired} (was {was})"
    row.problems += [f"repaired: {p}" for p in check_installed(target, pair, want)]
    if not committed:
        row.intact = target_snapshot(target) == before
        if not row.intact:
            row.problems.append("rollback is not byte-identical")
    measure(row, watch)
    nxt = run_restore(RestoreRequest(pair.store_ref, target), pair.new.raw)
    if nxt.status not in ("restored", "noop"):
        row.problems.append(f"next restore: {nxt.status} {nxt.failure}")
    row.problems += [f"next: {p}" for p in check_installed(target, pair, pair.new)]


def concurrent_case(row: Row, pair: Pair, tmp: Path, cwd: Path) -> None:
    target = tmp / "target"
    tmp.mkdir(parents=True)
    watch = Watch({tmp: [target], cwd: []})
    runs = concurrent_restores(pair, [pair.new] * 8, target, cwd=cwd, env=cli_env())
    statuses = sorted(r.status or "?" for r in runs)
    row.outcome = f"{statuses.count('restored')} restored, {statuses.count('noop')} noop"
    row.exit = ",".join(sorted({str(r.exit_code) for r in runs}))
    if statuses != ["noop"] * 7 + ["restored"] or any(r.exit_code for r in runs):
        row.problems.append(f"statuses {statuses}, exits {[r.exit_code for r in runs]}")
    row.problems += check_installed(target, pair, pair.new)
    measure(row, watch)


# --------------------------------------------------------------------------
# kill -9 at random points of a large restore
# --------------------------------------------------------------------------


def old_or_new(r: KillRecord) -> bool:
    """Each family whole, the marker trusted only for what is there (mid-swap: journal)."""
    return r.found in ("old", "new") or (r.found == "mixed" and r.journal and r.trusted is None)


def kill_rows(
    work: Path, fp: Fingerprint, cwd: Path, *, iterations: int, files: int, nbytes: int, seed: int
) -> tuple[list[Row], float]:
    t0 = time.monotonic()
    pair = build_versions(work / "versions", fp, big=(files, nbytes))
    built = time.monotonic() - t0
    progress(f"kill -9: versions of {files} files, {nbytes >> 20} MiB built in {built:.0f} s")
    target = work / "target"
    watch = Watch({work: [target, work / "versions"], cwd: []})
    rows: list[Row] = []

    def log(r: KillRecord) -> None:
        row = Row("kill -9", f"kill -9 #{r.iteration:02d} after {r.delay_s:.2f} s")
        row.outcome = r.found + (" (journal)" if r.journal else "")
        row.exit = str(r.exit_code)
        row.problems += r.problems
        if not old_or_new(r):
            row.problems.append(f"found {r.found} {r.families}")
        if not r.next_ok or r.final != "new" or r.leftovers:
            row.problems.append(f"next: {r.next_status}, final {r.final}, leftovers {r.leftovers}")
        measure(row, watch)
        rows.append(row)
        progress(f"  {row.case}: {row.outcome}, next {r.next_status}")

    duration, records = kill_loop(
        pair, target, iterations=iterations, cwd=cwd, seed=seed, env=cli_env(), log=log
    )
    if len(records) != len(rows):
        raise RuntimeError(f"{len(records)} kill records, {len(rows)} rows")
    for row in rows:
        row.case += f" of {duration:.2f}"
    return rows, duration


# --------------------------------------------------------------------------
# Registry faults
# --------------------------------------------------------------------------


@dataclass
class Scene:
    """A case's registry repo, the proxy in front of it and the trees it publishes."""

    tmp: Path
    server: RegistryServer
    proxy: FaultProxy
    repo: str
    environ: dict[str, str]
    fp: Fingerprint
    cwd: Path

    @property
    def ref(self) -> str:
        return self.proxy.ref(self.repo)

    def publish(self) -> dict[str, str]:
        """Harvest the trees straight into the registry; the layer digests."""
        with open_store(self.server.ref(self.repo)) as st:
            res = harvest(st, self.fp, environ=self.environ)
        return {f.family: f.layer_digest or "" for f in res.families}

    def good_restore(self, target: Path) -> dict[str, str]:
        """v1 restored through the proxy, then v2 (generic changed) published: v2's layers."""
        self.publish()
        done = run_restore(
            RestoreRequest(store=self.ref, target=target, require=True),
            self.fp.model_dump(mode="json"),
        )
        if done.status != "restored":
            raise RuntimeError(f"good restore: {done.status} {done.failure}")
        generic = Path(self.environ["ARTIFACTD_GENERIC_DIR"])
        (generic / "new.cubin").write_bytes(os.urandom(8 << 10))
        return self.publish()

    def watch(self, *extra_skip: Path) -> Watch:
        build = Path(self.environ["ARTIFACTD_GENERIC_DIR"]).parent
        return Watch({self.tmp: [build, *extra_skip], self.cwd: []})

    def cli(
        self,
        target: Path,
        *extra: str,
        require: bool,
        patch: dict[str, Any] | None = None,
        store: str | None = None,
    ) -> Ran:
        """``artifactd restore --json`` in a subprocess, registry constants patched."""
        prelude = "import artifactd.stores.transport as _t\n"
        prelude += "".join(f"_t.{k} = {v!r}\n" for k, v in (patch or FAST).items())
        prelude += "from artifactd.cli import main\nmain()\n"
        args = ["restore", "--store", store or self.ref, "--target", str(target)]
        args += ["--gpu-arch", "sm_90a", "--json", *extra] + (["--require"] if require else [])
        return run_cli([sys.executable, "-c", prelude, *args], require, self.cwd)


def run_cli(argv: list[str], require: bool, cwd: Path) -> Ran:
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            cwd=cwd,
            env=cli_env(),
            timeout=BOUND + 5,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return Ran(require, "timeout", None, "killed", -1, "", time.monotonic() - t0)
    elapsed = time.monotonic() - t0
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        return Ran(
            require, "no-json", None, proc.stderr[-300:], proc.returncode, proc.stderr, elapsed
        )
    f = doc.get("failure") or {}
    if f and f.get("exit_code") != EXIT.get(f.get("kind", "")):
        proc.stderr += f"\nfailure.exit_code {f.get('exit_code')} is not the documented one"
    return Ran(
        require,
        doc.get("status", "?"),
        f.get("kind"),
        f.get("message", ""),
        proc.returncode,
        proc.stderr,
        elapsed,
    )


def untouched(row: Row, target: Path, before: Snap) -> None:
    left = leftovers(target)
    row.intact = snap(target) == before and not left
    if not row.intact:
        row.problems.append(f"previous restore changed (leftovers {left})")


def refused(
    sc: Scene, row: Row, target: Path, kind: str, *extra: str, patch: dict[str, Any] | None = None
) -> list[Ran]:
    """Run the CLI without and with --require; both must be refusals of ``kind``."""
    runs = [sc.cli(target, *extra, require=r, patch=patch) for r in (False, True)]
    row.outcome, row.exit = outcome_of(runs)
    row.problems += refusal_problems(runs, kind)
    return runs


def case_5xx_burst(sc: Scene, row: Row) -> None:
    target = sc.tmp / "target"
    v2 = sc.good_restore(target)
    watch = sc.watch(target)
    sc.proxy.reset_log()
    sc.proxy.fail_next(ATTEMPTS - 1)
    run = sc.cli(target, require=True)
    row.outcome, row.exit = outcome_of([run])
    if (run.status, run.exit) != ("restored", 0):
        row.problems.append(f"{run.status} exit {run.exit}: {run.message[:120]}")
    if sc.proxy.count(fault="5xx") != ATTEMPTS - 1:
        row.problems.append(f"{sc.proxy.count(fault='5xx')} answers were 5xx")
    if {r.blob_digest for r in sc.proxy.blob_gets(v2.values())} != set(v2.values()):
        row.problems.append("not every v2 layer was fetched")
    if not (target / "generic" / "new.cubin").is_file() or leftovers(target):
        row.problems.append("v2 not installed cleanly")
    measure(row, watch)


def failing(
    kind: str, arm: Callable[[Scene, dict[str, str]], None], **kw: Any
) -> Callable[[Scene, Row], None]:
    """Good restore, ``arm`` the fault; both CLI runs refused as ``kind``, target untouched."""

    def run(sc: Scene, row: Row) -> None:
        target = sc.tmp / "target"
        v2 = sc.good_restore(target)
        before = snap(target)
        watch = sc.watch()
        sc.proxy.reset_log()
        arm(sc, v2)
        refused(sc, row, target, kind, **kw)
        untouched(row, target, before)
        measure(row, watch)

    return run


def case_never_listened(sc: Scene, row: Row) -> None:
    empty = sc.tmp / "empty"
    watch = sc.watch()
    nowhere = f"127.0.0.1:{free_port()}/{sc.repo}"
    runs = [sc.cli(empty, require=r, store=nowhere) for r in (False, True)]
    row.outcome, row.exit = outcome_of(runs)
    row.problems += refusal_problems(runs, "unreachable")
    if (empty / STATE_DIR / MARKER_NAME).exists() or (empty / "artifactd.env").exists():
        row.problems.append("a marker or env file was written")
    measure(row, watch)


REGISTRY_CASES: list[tuple[str, Callable[[Scene, Row], None]]] = [
    (f"5xx burst ({ATTEMPTS - 1} x 503) recovered", case_5xx_burst),
    ("5xx forever", failing("unreachable", lambda sc, v2: sc.proxy.fail_always(503))),
    (
        "connection cut mid-blob (after 100 KiB)",
        failing(
            "unreachable", lambda sc, v2: sc.proxy.cut_blobs(100 << 10, digests=[v2["generic"]])
        ),
    ),
    (
        "drip: blob at 5 B/s",
        failing(
            "unreachable",
            lambda sc, v2: sc.proxy.drip_blobs(1, 0.2, digests=[v2["generic"]]),
            patch=DRIP,
        ),
    ),
    (
        "drip: manifest at 5 B/s",
        failing(
            "unreachable",
            lambda sc, v2: sc.proxy.drip_blobs(1, 0.2, path="/manifests/"),
            patch=DRIP,
        ),
    ),
    (
        "wrong bytes for a digest",
        failing(
            "corrupt",
            lambda sc, v2: sc.proxy.corrupt_blobs(digests=[v2["generic"]], offsets=[200 << 10]),
        ),
    ),
    ("registry dead (proxy closed)", failing("unreachable", lambda sc, v2: sc.proxy.close())),
    ("registry never listened, empty target", case_never_listened),
]


def run_scenes(
    section: str,
    cases: list[tuple[str, Callable[[Scene, Row], None]]],
    work: Path,
    *,
    fp: Fingerprint,
    cwd: Path,
    server: RegistryServer,
) -> list[Row]:
    rows = []
    for i, (name, fn) in enumerate(cases):
        row = Row(section, name)
        tmp = work / f"{section[0]}{i:02d}"
        build = tmp / "build"
        make_triton_tree(build / "triton")
        make_generic_tree(build / "generic")
        (build / "generic" / "big.bin").write_bytes(os.urandom(256 << 10))
        environ = {
            "TRITON_CACHE_DIR": str(build / "triton"),
            "ARTIFACTD_GENERIC_DIR": str(build / "generic"),
            "TMPDIR": str(build / "tmp-empty"),
            "TORCHINDUCTOR_CACHE_DIR": str(build / "no-inductor"),
            "HOME": str(build / "home"),
        }
        with FaultProxy(server.host) as proxy:
            sc = Scene(tmp, server, proxy, f"bench/{section}-{i:02d}", environ, fp, cwd)
            try:
                fn(sc, row)
            except Skip as why:
                row.skipped = str(why)
            except Exception as exc:
                row.problems.append(f"bench error: {type(exc).__name__}: {exc}")
        rows.append(row)
        progress(f"{section}: {name}: {row.outcome} {'ok' if row.ok else row.problems}")
    return rows


# --------------------------------------------------------------------------
# Full disk, read-only target, lock held
# --------------------------------------------------------------------------


class Skip(Exception):  # noqa: N818 - a reason, not an error
    """This case cannot run here (the message says why)."""


@contextmanager
def mounted(path: Path, size: str) -> Iterator[Path]:
    why = mount_tmpfs(path, size)
    if why is not None:
        raise Skip(why)
    try:
        yield path
    finally:
        unmount(path)


def case_full_preflight(sc: Scene, row: Row) -> None:
    with mounted(sc.tmp / "mnt", "8m") as mnt:
        target, filler = mnt / "target", mnt / "filler"
        v2 = sc.good_restore(target)
        before = snap(target)
        fill(filler, leave=512 << 10)  # less than the files plus the 1 MiB margin
        watch = sc.watch(filler)
        sc.proxy.reset_log()
        runs = refused(sc, row, target, "no_space")
        if not re.search(r"needs .* MiB .* free", runs[-1].message):
            row.problems.append(f"not refused by the preflight: {runs[-1].message[:120]}")
        if sc.proxy.blob_gets(v2.values()):
            row.problems.append("a layer was downloaded before the refusal")
        untouched(row, target, before)
        measure(row, watch)


def case_full_mid_extraction(sc: Scene, row: Row) -> None:
    with mounted(sc.tmp / "mnt", "24m") as mnt:
        target, filler = mnt / "target", mnt / "filler"
        v2 = sc.good_restore(target)
        before = snap(target)
        watch = sc.watch(filler)
        lock = threading.Lock()
        fills: list[int] = []

        def fill_disk(digest: str) -> None:
            # In the proxy, before a layer is forwarded: the preflight has passed.
            with lock:
                if digest in v2.values() and not filler.exists():
                    fill(filler, leave=64 << 10)
                    fills.append(free_bytes(mnt))

        sc.proxy.on_blob_get = fill_disk
        runs = []
        for require in (False, True):
            runs.append(sc.cli(target, require=require))
            filler.unlink(missing_ok=True)
        row.outcome, row.exit = outcome_of(runs)
        row.problems += refusal_problems(runs, "no_space", "no space left")
        if len(fills) != 2:
            row.problems.append(f"the disk was filled {len(fills)} times, not 2")
        untouched(row, target, before)
        measure(row, watch)


def case_full_at_marker(sc: Scene, row: Row) -> None:
    with mounted(sc.tmp / "mnt", "24m") as mnt:
        target, filler = mnt / "target", mnt / "filler"
        sc.good_restore(target)
        before = snap(target)
        watch = sc.watch(filler)
        steps: list[str] = []

        def hook(step: str) -> None:
            steps.append(step)
            if step == "env-staged":
                fill(filler)  # all of it: the marker's write gets ENOSPC

        runs = []
        for require in (False, True):
            steps.clear()
            t0 = time.monotonic()
            out = run_restore(
                RestoreRequest(store=sc.ref, target=target, require=require),
                sc.fp.model_dump(mode="json"),
                step_hook=hook,
            )
            runs.append(ran_of(out, require, time.monotonic() - t0))
            filler.unlink(missing_ok=True)
            if "env-staged" not in steps or "marker" in steps:
                row.problems.append(f"steps {steps}")
        row.outcome, row.exit = outcome_of(runs)
        row.problems += refusal_problems(runs, "no_space", "no space left")
        untouched(row, target, before)
        measure(row, watch)


def case_read_only(sc: Scene, row: Row) -> None:
    with mounted(sc.tmp / "mnt", "32m") as mnt:
        target = mnt / "target"
        v2 = sc.good_restore(target)
        before = snap(target)
        watch = sc.watch()
        sc.proxy.reset_log()
        ro = subprocess.run(
            ["mount", "-o", "remount,ro", str(mnt)], capture_output=True, text=True, check=False
        )
        if ro.returncode != 0:
            raise Skip(f"remount read-only not permitted: {ro.stderr.strip()}")
        refused(sc, row, target, "target")
        if sc.proxy.blob_gets(v2.values()):
            row.problems.append("a layer was downloaded before the refusal")
        untouched(row, target, before)
        measure(row, watch)


def case_lock_held(sc: Scene, row: Row) -> None:
    target = sc.tmp / "target"
    v2 = sc.good_restore(target)
    before = snap(target)
    watch = sc.watch()
    sc.proxy.reset_log()
    with (target / STATE_DIR / LOCK_NAME).open("a") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        runs = refused(sc, row, target, "target", "--lock-timeout", "1")
    if "lock" not in runs[-1].message:
        row.problems.append(f"message {runs[-1].message[:120]!r} does not name the lock")
    if sc.proxy.blob_gets(v2.values()):
        row.problems.append("a layer was downloaded while the lock was held")
    untouched(row, target, before)
    measure(row, watch)


DISK_CASES: list[tuple[str, Callable[[Scene, Row], None]]] = [
    ("disk full at the preflight (tmpfs 8m)", case_full_preflight),
    ("disk full mid-extraction (tmpfs 24m)", case_full_mid_extraction),
    ("disk full at the marker write", case_full_at_marker),
    ("read-only target (tmpfs remounted ro)", case_read_only),
    ("lock held by another process", case_lock_held),
]


# --------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------


def yes_no(v: bool | None) -> str:
    return "-" if v is None else ("yes" if v else "NO")


def print_table(rows: list[Row]) -> None:
    width = max(len(r.case) for r in rows) + 2
    head = (
        f"{'section':9} {'case':{width}} {'outcome':18} {'exit':>5} {'outside':>8} "
        f"{'intact':>6}  required"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        if r.skipped:
            verdict = f"skipped: {r.skipped}"
        elif r.ok:
            verdict = "ok"
        else:
            verdict = "FAIL: " + "; ".join(r.problems)[:300]
        outside = "-" if r.outside is None else str(r.outside)
        outcome = "skipped" if r.skipped else r.outcome
        print(
            f"{r.section:9} {r.case:{width}} {outcome:18} {r.exit:>5} {outside:>8} "
            f"{yes_no(r.intact):>6}  {verdict}"
        )


def summary(rows: list[Row]) -> str:
    ran = [r for r in rows if not r.skipped]
    good = sum(r.ok for r in ran)
    outside = sum(r.outside or 0 for r in ran)
    judged = [r for r in ran if r.intact is not None]
    kills = [r for r in ran if r.section == "kill -9"]
    whole = sum(not any(p.startswith("found") for p in r.problems) for r in kills)
    nxt = sum(not any(p.startswith("next") for p in r.problems) for r in kills)
    line = (
        f"faults: {len(ran)} cases, {good} refused/ended as required, {outside} bytes outside "
        f"staging, {sum(bool(r.intact) for r in judged)}/{len(judged)} previous caches intact"
    )
    if kills:
        line += f", kill -9: {whole}/{len(kills)} old-or-new, next restore ok {nxt}/{len(kills)}"
    skipped = [r for r in rows if r.skipped]
    if skipped:
        line += f" ({len(skipped)} skipped: {skipped[0].skipped})"
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small kill -9 artifact, 3 kills")
    parser.add_argument("--kill-iterations", type=int, default=None, help="default 20 (quick: 3)")
    parser.add_argument("--kill-mb", type=int, default=None, help="MiB, default 300 (quick: 8)")
    parser.add_argument("--kill-files", type=int, default=None, help="default 5000 (quick: 300)")
    parser.add_argument("--seed", type=int, default=None, help="kill delays (default: random)")
    parser.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    parser.add_argument("--keep", action="store_true", help="keep the work dir")
    args = parser.parse_args()
    iterations = args.kill_iterations or (3 if args.quick else 20)
    kill_mb = args.kill_mb or (8 if args.quick else 300)
    kill_files = args.kill_files or (300 if args.quick else 5000)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "big")
    only = set(args.only.split(","))
    if only - set(SECTIONS):
        parser.error(f"--only: unknown {sorted(only - set(SECTIONS))}; known {SECTIONS}")

    start = time.monotonic()
    fp = probe_fingerprint(gpu_arch="sm_90a", use_nvml=False)
    work = Path(tempfile.mkdtemp(prefix="artifactd-faults-"))
    cwd = work / "cwd"  # every restore runs here: a stray relative write shows up
    cwd.mkdir()
    home = Path.cwd()
    os.chdir(cwd)
    server = start_registry(work / "registry-server")
    rows: list[Row] = []
    took: dict[str, float] = {}
    duration = 0.0
    try:
        for section in SECTIONS:
            if section not in only:
                continue
            t0 = time.monotonic()
            sub = work / section
            sub.mkdir()
            if section == "hostile":
                rows += hostile_rows(sub, fp, cwd)
            elif section == "crash":
                rows += crash_rows(sub, fp, cwd)
            elif section == "kill":
                kill, duration = kill_rows(
                    sub,
                    fp,
                    cwd,
                    iterations=iterations,
                    files=kill_files,
                    nbytes=kill_mb << 20,
                    seed=seed,
                )
                rows += kill
            elif section == "registry":
                rows += run_scenes("registry", REGISTRY_CASES, sub, fp=fp, cwd=cwd, server=server)
            else:
                rows += run_scenes("disk", DISK_CASES, sub, fp=fp, cwd=cwd, server=server)
            took[section] = time.monotonic() - t0
            shutil.rmtree(sub, ignore_errors=True)
    finally:
        server.stop()
        os.chdir(home)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    print_table(rows)
    if "kill" in only:
        print(
            f"kill -9: {iterations} kills of a restore of {kill_files} files, {kill_mb} MiB "
            f"(uninterrupted: {duration:.2f} s), seed {seed}"
        )
    print(summary(rows))
    parts = ", ".join(f"{k} {v:.0f}" for k, v in took.items())
    print(f"elapsed: {time.monotonic() - start:.1f} s ({parts})")
    if any(not r.ok for r in rows if not r.skipped):
        sys.exit(1)


if __name__ == "__main__":
    main()
