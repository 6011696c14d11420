"""Crash injection for restore: two versions of an artifact, whole-tree checks, kills.

Shared by ``tests/test_restore_crash.py`` and the fault benchmark
(``bench/faults.py``), so nothing here depends on pytest. The pieces:

* :func:`build_versions` publishes two artifacts, OLD and NEW, whose
  ``triton`` and ``generic`` layers differ, into a local OCI layout store, and
  records what each looks like once restored (a manifest per family dir);
* :func:`tree_manifest` / :func:`family_states` tell, fast, whether each
  family dir of a target holds OLD or NEW as a whole, or neither;
* :func:`raising_hook`, :func:`run_killed_at` inject a failure at a step
  boundary of the install (an exception in process, or SIGKILL of a
  subprocess);
* :func:`kill_loop` kills a CLI restore after a random delay, again and
  again, and returns one :class:`KillRecord` per iteration;
* :func:`concurrent_restores` starts several CLI restores at once.

:func:`make_trees` imports ``cachetrees`` (this directory): a script outside
``tests/`` puts it on ``sys.path`` first.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cachetrees import harvest_environ, make_generic_tree, make_triton_tree

from artifactd.build.harvest import harvest
from artifactd.constants import CACHE_ENV_VARS
from artifactd.events import EventSink, discard
from artifactd.families import get_family
from artifactd.fingerprint.model import Fingerprint
from artifactd.restore.destination import (
    ENV_TMP_PREFIX,
    JOURNAL_NAME,
    STATE_DIR,
    CacheVolume,
    no_hook,
)
from artifactd.restore.envfile import render_env_file
from artifactd.restore.install import RestoreResult, restore
from artifactd.restore.markertypes import RestoreMarker
from artifactd.restore.policy import RestoreRequest, run_restore
from artifactd.restore.resolve import noop_plan, plan_restore
from artifactd.restore.source import StoreSource
from artifactd.stores import open_store
from artifactd.stores.layout import LayoutStore
from artifactd.trust.policy import UNSAFE_NO_VERIFICATION

if TYPE_CHECKING:
    from artifactd.restore.destination import StepHook

PYTHON = sys.executable
FAMILIES = ("triton", "generic")
#: What a target's own path becomes in a manifest (Triton group files embed it).
PLACEHOLDER = b"@@TARGET@@"
#: The step boundaries of an install, with the swaps named by position.
SYMBOLIC_STEPS = (
    "before-journal",
    "journal",
    "swap:first",
    "swap:last",
    "env-staged",
    "marker",
    "env",
    "journal-removed",
)
#: Steps at or after the commit point (the marker is durably written).
COMMITTED_STEPS = frozenset({"marker", "env", "journal-removed"})

#: relative path -> (kind, size, sha256 or link target), kind in file:<mode>/dir/link.
Manifest = dict[str, tuple[str, int, str]]


# --------------------------------------------------------------------------
# Trees
# --------------------------------------------------------------------------


def make_big_tree(root: Path, files: int = 3000, total_bytes: int = 40 << 20) -> Path:
    """``files`` files of random bytes (zstd cannot shrink them) adding up to ``total_bytes``.

    Spread over sub-directories of at most 100 files, sizes varying around the
    mean (some empty-ish, some several times larger).
    """
    rng = random.Random(os.urandom(8))  # noqa: S311 - sizes, not secrets
    weights = [rng.uniform(0.1, 2.0) for _ in range(files)]
    scale = total_bytes / sum(weights)
    sizes = [int(w * scale) for w in weights]
    sizes[-1] += total_bytes - sum(sizes)
    for i, size in enumerate(sizes):
        d = root / f"d{i // 100:04d}"
        if i % 100 == 0:
            d.mkdir(parents=True, exist_ok=True)
        (d / f"k{i:06d}.cubin").write_bytes(os.urandom(size))
    return root


def make_trees(src: Path, version: str, *, big: tuple[int, int] | None = None) -> dict[str, str]:
    """Write one version's Triton and generic caches under ``src``; return the harvest environ.

    The two versions differ in every family: another Triton kernel and
    different bytes in a kept file, other random cubins in the generic tree.
    """
    kernels = ("add", "softmax") if version == "old" else ("add", "softmax", "gelu")
    triton = make_triton_tree(src / "triton", kernels)
    # Same name, other content: a changed kernel.
    for cubin in triton.glob("*/add.cubin"):
        cubin.write_bytes(f"add-cubin-{version}".encode() * 64)
    generic = make_generic_tree(src / "generic")
    (generic / "sub" / f"only-{version}.ptx").write_text(f"// {version}\n" * 20)
    (generic / "version.txt").write_text(version)
    if big is not None:
        make_big_tree(generic / "big", files=big[0], total_bytes=big[1])
    return harvest_environ(src)


def tree_manifest(root: Path, target: Path) -> Manifest:
    """Every entry under ``root``: kind (files with their mode), size and sha256.

    The target's own path is replaced by a placeholder first, so trees restored
    into different targets compare equal.
    """
    out: Manifest = {}
    needle = str(target).encode()
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        for name in dirnames + filenames:
            p = base / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                link = os.readlink(p).replace(str(target), PLACEHOLDER.decode())
                out[rel] = ("link", 0, link)
            elif p.is_dir():
                out[rel] = ("dir", 0, "")
            else:
                data = p.read_bytes().replace(needle, PLACEHOLDER)
                mode = p.lstat().st_mode & 0o7777
                out[rel] = (f"file:{mode:o}", len(data), hashlib.sha256(data).hexdigest())
    return out


# --------------------------------------------------------------------------
# Two versions
# --------------------------------------------------------------------------


@dataclass
class Version:
    """One published artifact and what it looks like restored."""

    name: str
    fp: Fingerprint
    workload: dict[str, str]
    digest: str
    layers: dict[str, str]
    #: family -> component -> manifest of the restored dir.
    trees: dict[str, dict[str, Manifest]] = field(default_factory=dict)

    @property
    def raw(self) -> dict[str, Any]:
        """The fingerprint as the plain probe document ``run_restore`` takes."""
        return self.fp.model_dump(mode="json")


@dataclass
class Pair:
    """OLD and NEW in one store, with the install's step sequence."""

    store: LayoutStore
    old: Version
    new: Version
    #: Step names of an install of NEW over OLD, the target's path as ``{target}``.
    steps: list[str] = field(default_factory=list)

    @property
    def store_ref(self) -> str:
        """The store's reference (``oci:DIR``), for the CLI."""
        return self.store.ref

    def versions(self) -> tuple[Version, Version]:
        """(OLD, NEW)."""
        return self.old, self.new

    def by_hash(self, fingerprint_hash: str) -> Version | None:
        """The version whose fingerprint hash this is."""
        return next((v for v in self.versions() if v.fp.hash == fingerprint_hash), None)

    def step(self, symbolic: str, target: Path) -> str:
        """The real step name of ``symbolic`` (``swap:first``...) for an install into ``target``."""
        real = [s.replace("{target}", str(target.absolute())) for s in self.steps]
        swaps = [s for s in real if s.startswith("swap:")]
        if symbolic == "swap:first":
            return swaps[0]
        if symbolic == "swap:last":
            return swaps[-1]
        assert symbolic in real, (symbolic, real)
        return symbolic


def build_versions(work: Path, base: Fingerprint, *, big: tuple[int, int] | None = None) -> Pair:
    """Publish OLD (``model=old``) and NEW (``model=new``) into ``oci:<work>/store``.

    OLD is restored into a reference target to record its manifests, then NEW
    over it with a recording hook, to record NEW's and learn the install's steps.
    ``big`` = (files, bytes) adds a random tree under the generic family.
    """
    store = open_store(f"oci:{work / 'store'}", create=True)
    assert isinstance(store, LayoutStore)
    made: dict[str, Version] = {}
    for name in ("old", "new"):
        workload = {"model": name}
        fp = base.model_copy(update={"workload": workload})
        res = harvest(store, fp, environ=make_trees(work / f"src-{name}", name, big=big))
        layers = {f.family: f.layer_digest or "" for f in res.families}
        if set(layers) != set(FAMILIES):
            raise AssertionError(f"harvested {sorted(layers)}, wanted {sorted(FAMILIES)}")
        made[name] = Version(name, fp, workload, res.digest, layers)
    pair = Pair(store, made["old"], made["new"])
    if any(pair.old.layers[f] == pair.new.layers[f] for f in FAMILIES):
        raise AssertionError("OLD and NEW share a layer: the versions do not differ")
    # OLD into an empty reference target, then NEW over it, recording every step boundary.
    ref = work / "ref"
    restore_version(pair, pair.old, ref)
    pair.old.trees = family_trees(ref)
    seen: list[str] = []
    restore_version(pair, pair.new, ref, step_hook=seen.append)
    pair.new.trees = family_trees(ref)
    pair.steps = [s.replace(str(ref.absolute()), "{target}") for s in seen]
    return pair


def family_dirs(target: Path) -> dict[str, dict[str, Path]]:
    """family -> component -> the dir a restore into ``target`` installs."""
    return {f: dict(get_family(f).restore_dirs(target.absolute())) for f in FAMILIES}


def family_trees(target: Path) -> dict[str, dict[str, Manifest]]:
    """Manifests of every family dir of ``target`` (a missing dir: an empty manifest)."""
    return {
        fam: {
            c: tree_manifest(d, target.absolute()) if d.is_dir() else {} for c, d in comps.items()
        }
        for fam, comps in family_dirs(target).items()
    }


def family_states(target: Path, pair: Pair) -> dict[str, str]:
    """family -> ``old``, ``new``, ``missing`` (no dir) or ``torn`` (neither as a whole)."""
    out = {}
    trees = family_trees(target)
    for fam, comps in trees.items():
        if all(not m and not family_dirs(target)[fam][c].exists() for c, m in comps.items()):
            out[fam] = "missing"
        elif comps == pair.old.trees[fam]:
            out[fam] = "old"
        elif comps == pair.new.trees[fam]:
            out[fam] = "new"
        else:
            out[fam] = "torn"
    return out


def overall(states: Mapping[str, str]) -> str:
    """``old``/``new`` when every family agrees, ``mixed`` when each is whole but they
    disagree, else ``torn`` (some family is neither version as a whole)."""
    values = set(states.values())
    if len(values) == 1 and values <= {"old", "new"}:
        return values.pop()
    if values <= {"old", "new"}:
        return "mixed"
    return "torn"


def leftovers(target: Path) -> list[str]:
    """Whatever an install leaves only while running: staging/trash dirs, journal, temp files."""
    state = target / STATE_DIR
    found = []
    if state.is_dir():
        found += sorted(
            p.name
            for p in state.iterdir()
            if p.name.startswith(("staging-", "trash-", ".tmp-")) or p.name == JOURNAL_NAME
        )
    found += sorted(p.name for p in target.glob(ENV_TMP_PREFIX + "*"))
    return found


def snapshot(target: Path) -> dict[str, bytes | str]:
    """Every file's bytes and every dir/link under ``target`` (the lock file left out)."""
    out: dict[str, bytes | str] = {}
    for dirpath, dirnames, filenames in os.walk(target):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(target))
            if rel == f"{STATE_DIR}/lock":
                continue
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_dir():
                out[rel] = f"dir:{p.stat().st_mode & 0o7777:o}"
            else:
                out[rel] = p.read_bytes()
    return out


def marker_version(marker: RestoreMarker | None, pair: Pair) -> Version | None:
    """The version a marker names, when it names exactly one version's artifact and layers."""
    if marker is None:
        return None
    v = pair.by_hash(marker["fingerprint_hash"])
    if v is None or set(marker["families"]) != set(FAMILIES):
        return None
    for fam, fm in marker["families"].items():
        if fm["artifact"] != v.digest or fm["layer"] != v.layers[fam]:
            return None
    return v


def check_installed(
    target: Path, pair: Pair, version: Version, states: Mapping[str, str] | None = None
) -> list[str]:
    """Problems with ``target`` as a completed restore of ``version`` (empty: none).

    Content of every family, the marker (trusted by ``installed()``) naming
    it, the env file as the marker records, no leftovers.
    """
    problems = []
    states = family_states(target, pair) if states is None else states
    if set(states.values()) != {version.name}:
        problems.append(f"content {states}, wanted all {version.name}")
    vol = CacheVolume(target)
    marker = vol.installed()
    named = marker_version(marker, pair)
    if named is not version:
        problems.append(
            f"marker names {named.name if named else None} (installed() gave "
            f"{'a marker' if marker else 'None'}), wanted {version.name}"
        )
    if marker is not None:
        env = vol.env_file.read_text(encoding="utf-8")
        if env != render_env_file(marker["env"]):
            problems.append("env file differs from the marker's env")
        for fam, comps in family_dirs(target).items():
            for d in comps.values():
                if str(d) not in marker["families"][fam]["dirs"].values():
                    problems.append(f"marker does not record {d}")
    left = leftovers(target)
    if left:
        problems.append(f"leftovers {left}")
    return problems


# --------------------------------------------------------------------------
# Restoring, in process and as the CLI
# --------------------------------------------------------------------------


def restore_version(
    pair: Pair,
    version: Version,
    target: Path,
    *,
    step_hook: StepHook = no_hook,
    on_event: EventSink = discard,
) -> RestoreResult:
    """Plan and restore ``version`` into ``target`` in this process (the mechanism)."""
    plan = plan_restore(StoreSource(pair.store), version.fp, target, trust=UNSAFE_NO_VERIFICATION)
    if plan.match != "full":
        raise AssertionError(f"{version.name}: expected a full match, got {plan.match}")
    return restore(
        plan, StoreSource(pair.store), CacheVolume(target, step_hook=step_hook), on_event=on_event
    )


class InjectedError(Exception):
    """Raised by :func:`raising_hook` at its step."""


def raising_hook(step: str) -> StepHook:
    """A step hook that raises :class:`InjectedError` at ``step``."""

    def hook(name: str) -> None:
        if name == step:
            raise InjectedError(name)

    return hook


_KILL_SCRIPT = """\
import json, os, signal, sys
from pathlib import Path
import artifactd.restore.destination as D
from artifactd.fingerprint.model import from_raw
from artifactd.restore.resolve import plan_restore
from artifactd.restore.install import restore
from artifactd.restore.source import StoreSource
from artifactd.stores import open_store
from artifactd.trust.policy import UNSAFE_NO_VERIFICATION

store_ref, target, fp_json, step, mode, env_file = sys.argv[1:7]
env_file = Path(env_file) if env_file else None
def die():
    os.kill(os.getpid(), signal.SIGKILL)
def hook(name):
    if name == step:
        die()
if mode != "exchange":  # the two-rename fallback of filesystems without RENAME_EXCHANGE
    D._exchange = lambda a, b: False
if mode.startswith("mid-rename:"):  # die between the fallback's two renames of swap N
    nth, seen, real = int(mode.split(":")[1]), [], os.rename
    def rename(a, b):
        real(a, b)
        if str(b).endswith(".old"):
            seen.append(b)
            if len(seen) == nth:
                die()
    os.rename = rename
if mode.startswith("recover-undo:"):  # die in recovery, after its Nth undo
    nth, seen, real_undo = int(mode.split(":")[1]), [], D._undo
    def undo(entry):
        real_undo(entry)
        seen.append(entry)
        if len(seen) == nth:
            die()
    D._undo = undo
    vol = D.CacheVolume(Path(target))
    with vol.locked():
        vol.recover()
    sys.exit(17)
store = StoreSource(open_store(store_ref))
plan = plan_restore(
    store, from_raw(json.loads(fp_json)), Path(target), trust=UNSAFE_NO_VERIFICATION,
    env_file=env_file,
)
restore(plan, store, D.CacheVolume(Path(target), env_file=env_file, step_hook=hook))
sys.exit(17)  # the step never came
"""


def run_killed_at(
    pair: Pair,
    version: Version,
    target: Path,
    step: str = "",
    *,
    mode: str = "exchange",
    env_file: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> int:
    """Restore ``version`` in a subprocess that SIGKILLs itself; return its exit code (-9).

    ``step``: die at that step boundary of the install. ``mode``: ``exchange``
    (the default swap), ``fallback`` (as on a filesystem without
    RENAME_EXCHANGE), ``mid-rename:N`` (fallback, die between the two renames
    of the Nth swap), ``recover-undo:N`` (no restore: run the repair of an
    earlier crash and die after its Nth undo). ``env_file``: the restore's
    ``--env-file`` (default ``<target>/artifactd.env``). Raises AssertionError when the
    process was not killed (the crash point never came).
    """
    proc = subprocess.run(
        [
            PYTHON,
            "-c",
            _KILL_SCRIPT,
            pair.store_ref,
            str(target),
            json.dumps(version.raw),
            step,
            mode,
            str(env_file or ""),
        ],
        capture_output=True,
        text=True,
        env=dict(env if env is not None else cli_env()),
        timeout=120,
        check=False,
    )
    if proc.returncode != -signal.SIGKILL:
        raise AssertionError(
            f"killed at {step!r} ({mode}) exited {proc.returncode}: {proc.stderr[-2000:]}"
        )
    return proc.returncode


def cli_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's env without cache variables or ``ARTIFACTD_*`` (as conftest.clean_env)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in CACHE_ENV_VARS
        and k not in ("TORCHINDUCTOR_CACHE_DIR", "TMPDIR")
        and not k.startswith("ARTIFACTD_")
    }
    env.update(extra or {})
    return env


def cli_args(pair: Pair, version: Version, target: Path, *extra: str) -> list[str]:
    """``python -m artifactd restore`` for ``version`` (its workload) into ``target``, --json."""
    workload = ",".join(f"{k}={v}" for k, v in version.workload.items())
    return [
        PYTHON,
        "-m",
        "artifactd",
        "restore",
        "--store",
        pair.store_ref,
        "--target",
        str(target),
        "--gpu-arch",
        "sm_90a",
        "--workload",
        workload,
        "--json",
        *extra,
    ]


def run_cli(
    pair: Pair, version: Version, target: Path, *, cwd: Path, env: Mapping[str, str] | None = None
) -> tuple[int, dict[str, Any] | None, str]:
    """Run the CLI restore of ``version`` to the end: (exit code, JSON doc or None, stderr)."""
    proc = subprocess.run(
        cli_args(pair, version, target),
        capture_output=True,
        text=True,
        cwd=cwd,
        env=dict(env if env is not None else cli_env()),
        timeout=300,
        check=False,
    )
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        doc = None
    return proc.returncode, doc, proc.stderr


# --------------------------------------------------------------------------
# kill -9 at random points
# --------------------------------------------------------------------------


@dataclass
class KillRecord:
    """One iteration of :func:`kill_loop`."""

    iteration: int
    delay_s: float
    #: The killed process's exit code: -9, or its own code when it finished first.
    exit_code: int | None
    #: State right after the kill: old, new, mixed (each family whole), torn.
    found: str
    families: dict[str, str]
    journal: bool
    #: installed() while a journal exists (must be None); the version it named otherwise.
    trusted: str | None
    next_status: str
    next_ok: bool
    final: str
    leftovers: list[str]
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every invariant held in this iteration."""
        return not self.problems


def timed_cli_restore(
    pair: Pair, version: Version, target: Path, *, cwd: Path, env: Mapping[str, str] | None = None
) -> float:
    """Seconds one uninterrupted CLI restore of ``version`` into ``target`` takes."""
    t0 = time.monotonic()
    code, doc, err = run_cli(pair, version, target, cwd=cwd, env=env)
    took = time.monotonic() - t0
    if code != 0 or doc is None or doc.get("status") != "restored":
        raise AssertionError(f"timed restore: exit {code}, {doc}, {err[-2000:]}")
    return took


def kill_loop(
    pair: Pair,
    target: Path,
    *,
    iterations: int,
    cwd: Path,
    seed: int | None = None,
    env: Mapping[str, str] | None = None,
    duration_s: float | None = None,
    window: tuple[float, float] = (0.0, 1.0),
    log: Callable[[KillRecord], None] | None = None,
) -> tuple[float, list[KillRecord]]:
    """Restore OLD, start a CLI restore of NEW, SIGKILL it after a random delay; repeat.

    The delay is uniform within one uninterrupted run's duration (measured
    first unless ``duration_s`` is given), or within the part of it that
    ``window`` names as fractions (``(0.8, 1.0)``: the end, where the install
    is). After each kill the target is classified, the no-op check must not
    trust the marker while a journal exists, and the next restore of NEW (in
    process, policy entry point) must succeed and leave NEW, its marker, its
    env file and no leftovers. Returns
    (duration, records); ``record.problems`` lists any broken invariant.
    """
    rng = random.Random(seed)  # noqa: S311 - delays, not secrets
    if duration_s is None:
        restore_version(pair, pair.old, target)
        duration_s = timed_cli_restore(pair, pair.new, target, cwd=cwd, env=env)
    records = []
    for i in range(iterations):
        restore_version(pair, pair.old, target)
        problems = [
            f"before: {p}"
            for p in check_installed(target, pair, pair.old, dict.fromkeys(FAMILIES, "old"))
        ]
        delay = rng.uniform(window[0] * duration_s, window[1] * duration_s)
        proc = subprocess.Popen(
            cli_args(pair, pair.new, target),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=cwd,
            env=dict(env if env is not None else cli_env()),
        )
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        code = proc.wait(timeout=60)
        states = family_states(target, pair)
        found = overall(states)
        if found == "torn":
            problems.append(f"torn after the kill: {states}")
        vol = CacheVolume(target)
        journal = vol.journal_path.exists()
        marker = vol.installed()
        trusted = None
        if marker is not None:
            named = marker_version(marker, pair)
            trusted = named.name if named else "unknown"
        if journal and marker is not None:
            problems.append("installed() trusted a marker while a journal exists")
        for v in pair.versions():
            if (
                journal
                and noop_plan(StoreSource(pair.store), v.fp.hash, v.fp.flatten(), vol) is not None
            ):
                problems.append(f"noop_plan({v.name}) trusted a marker while a journal exists")
        if marker is not None and (trusted is None or {found} != {trusted}):
            problems.append(f"installed() names {trusted} but the content is {found}")
        out = run_restore(RestoreRequest(pair.store_ref, target), pair.new.raw)
        next_ok = out.status in ("restored", "noop") and out.exit_code == 0
        if not next_ok:
            problems.append(f"next restore: {out.status} {out.failure}")
        final_states = family_states(target, pair)
        problems += [f"after: {p}" for p in check_installed(target, pair, pair.new, final_states)]
        rec = KillRecord(
            iteration=i,
            delay_s=round(delay, 3),
            exit_code=code,
            found=found,
            families=states,
            journal=journal,
            trusted=trusted,
            next_status=out.status,
            next_ok=next_ok,
            final=overall(final_states),
            leftovers=leftovers(target),
            problems=problems,
        )
        records.append(rec)
        if log is not None:
            log(rec)
    return duration_s, records


# --------------------------------------------------------------------------
# Concurrent restores
# --------------------------------------------------------------------------


@dataclass
class CliRun:
    """One CLI restore of a concurrent batch."""

    version: str
    exit_code: int
    doc: dict[str, Any] | None
    stderr: str

    @property
    def status(self) -> str | None:
        """The ``status`` of its --json document."""
        return self.doc.get("status") if self.doc else None


def concurrent_restores(
    pair: Pair,
    versions: Sequence[Version],
    target: Path,
    *,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
) -> list[CliRun]:
    """Start one CLI restore per entry of ``versions`` into ``target`` at once; wait for all."""
    env_d = dict(env if env is not None else cli_env())
    procs = [
        (
            v,
            subprocess.Popen(
                cli_args(pair, v, target),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=cwd,
                env=env_d,
            ),
        )
        for v in versions
    ]
    runs = []
    for v, p in procs:
        out, err = p.communicate(timeout=timeout)
        try:
            doc = json.loads(out)
        except ValueError:
            doc = None
        runs.append(CliRun(v.name, p.returncode, doc, err))
    return runs
