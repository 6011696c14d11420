"""Restore under failure: a crash at every step of the install, kill -9 anywhere, concurrency.

Two artifacts, OLD and NEW, differ in both families restored (``triton`` and
``generic``: two directory swaps). The invariants, whatever happens:

* each family dir holds OLD's or NEW's tree as a whole, never a blend;
* no no-op check trusts the marker while a journal exists;
* once repaired, the marker names exactly what is on disk: OLD when the
  failure came before the marker was written (the commit point), NEW after;
* an exception before the commit leaves the target byte-identical;
* the next restore, of either version, succeeds and leaves that version,
  its marker, its env file and no staging/trash/journal behind.

Helpers live in ``tests/crashes.py`` (the fault benchmark uses them too).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from conftest import clean_env
from crashes import (
    COMMITTED_STEPS,
    FAMILIES,
    SYMBOLIC_STEPS,
    InjectedError,
    KillRecord,
    Pair,
    Version,
    build_versions,
    check_installed,
    concurrent_restores,
    family_dirs,
    family_states,
    kill_loop,
    leftovers,
    marker_version,
    overall,
    raising_hook,
    restore_version,
    run_killed_at,
    snapshot,
)

from artifactd.fingerprint.model import Fingerprint
from artifactd.restore import destination
from artifactd.restore.destination import STATE_DIR, CacheVolume
from artifactd.restore.policy import RestoreRequest, run_restore
from artifactd.restore.resolve import noop_plan
from artifactd.restore.source import StoreSource

#: The random-kill suite's size (the benchmark runs ~300 MB and 20 iterations).
KILL_FILES = 3000
KILL_BYTES = 40 << 20
KILL_ITERATIONS = 3


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, local_fp: Fingerprint) -> Pair:
    """OLD and NEW published in one store (small trees)."""
    return build_versions(tmp_path_factory.mktemp("versions"), local_fp)


def test_versions_differ_in_every_family_and_install_has_every_step(pair: Pair) -> None:
    for fam in FAMILIES:
        assert pair.old.layers[fam] != pair.new.layers[fam]
        assert pair.old.trees[fam] != pair.new.trees[fam]
    swaps = [s for s in pair.steps if s.startswith("swap:")]
    assert sorted(swaps) == sorted(
        f"swap:{{target}}/{fam}" for fam in FAMILIES
    )  # one swap per family dir
    assert pair.steps == ["before-journal", "journal", *swaps, *SYMBOLIC_STEPS[4:]]


# --------------------------------------------------------------------------
# What each crash point must leave
# --------------------------------------------------------------------------


def _expected_states(pair: Pair, target: Path, step: str) -> dict[str, str]:
    """Per family, the tree a crash at ``step`` (before any repair) leaves in place."""
    real = [s.replace("{target}", str(target.absolute())) for s in pair.steps]
    upto = real[: real.index(pair.step(step, target)) + 1]
    swapped = {s.removeprefix("swap:") for s in upto if s.startswith("swap:")}
    dirs = family_dirs(target)
    return {
        fam: "new" if all(str(d) in swapped for d in comps.values()) else "old"
        for fam, comps in dirs.items()
    }


def _check_untrusted_while_journal(pair: Pair, target: Path) -> None:
    """Before repair: no no-op check trusts a marker while a journal exists."""
    vol = CacheVolume(target)
    states = family_states(target, pair)
    if vol.journal_path.exists():
        assert vol.installed() is None
        for v in pair.versions():
            assert noop_plan(StoreSource(pair.store), v.fp.hash, v.fp.flatten(), vol) is None, (
                v.name
            )
    else:
        # No journal: whatever installed() trusts must be what is there.
        marker = vol.installed()
        if marker is not None:
            named = marker_version(marker, pair)
            assert named is not None
            assert set(states.values()) == {named.name}


def _filtered(snap: dict[str, bytes | str]) -> dict[str, bytes | str]:
    """A snapshot without the staging dir of a restore in progress."""
    return {k: v for k, v in snap.items() if not k.startswith(f"{STATE_DIR}/staging-")}


def _restore_after_crash(
    pair: Pair,
    target: Path,
    version: Version,
    *,
    committed: bool,
    before: dict[str, bytes | str],
    journal: bool,
) -> None:
    """Run the next restore of ``version``; check the repaired state it saw, and the end state.

    The repaired state is observed from inside the next restore (its
    ``before-journal`` hook runs under the lock, after recovery and before
    it changes anything); when that restore is a no-op, it is the end state.
    """
    repaired = pair.new if committed else pair.old
    seen: dict[str, object] = {}

    def observe(step: str) -> None:
        if step != "before-journal":
            return
        vol = CacheVolume(target)
        seen["states"] = family_states(target, pair)
        seen["marker"] = marker_version(vol.installed(), pair)
        seen["journal"] = vol.journal_path.exists()
        seen["snapshot"] = _filtered(snapshot(target))

    events: list[dict[str, object]] = []
    res = restore_version(pair, version, target, step_hook=observe, on_event=events.append)
    recovered = [e["outcome"] for e in events if e.get("event") == "recovered"]
    if journal:
        assert recovered == ["completed" if committed else "rolled back"]
    else:
        assert recovered == []
    # A restore of what the repair put back has nothing to do.
    assert res.noop == (version is repaired)
    if not res.noop:
        assert seen["states"] == dict.fromkeys(FAMILIES, repaired.name)
        assert seen["marker"] is repaired, "after repair the marker must name what is there"
        assert seen["journal"] is False
        if not committed:
            assert seen["snapshot"] == before, "rollback must restore OLD byte for byte"
    elif not committed:
        assert snapshot(target) == before
    assert check_installed(target, pair, version) == []


# --------------------------------------------------------------------------
# 1a. An exception at each step boundary (in process)
# --------------------------------------------------------------------------


@pytest.fixture(params=["exchange", "fallback"])
def swap_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """RENAME_EXCHANGE, or the two-rename fallback of filesystems without it."""
    if request.param == "fallback":
        monkeypatch.setattr(destination, "_exchange", lambda a, b: False)
    return str(request.param)


@pytest.mark.parametrize("step", SYMBOLIC_STEPS)
@pytest.mark.parametrize("then", ["old", "new"])
def test_exception_at_step(
    tmp_path: Path, pair: Pair, step: str, then: str, swap_mode: str
) -> None:
    del swap_mode
    target = tmp_path / "target"
    restore_version(pair, pair.old, target)
    before = snapshot(target)
    with pytest.raises(InjectedError):
        restore_version(pair, pair.new, target, step_hook=raising_hook(pair.step(step, target)))
    committed = step in COMMITTED_STEPS
    states = family_states(target, pair)
    assert overall(states) in ("old", "new"), states
    journal = CacheVolume(target).journal_path.exists()
    if committed:
        # The marker is on disk: the install stands, with or without its journal.
        assert states == dict.fromkeys(FAMILIES, "new")
        assert marker_version(CacheVolume(target).read_marker(), pair) is pair.new
        assert journal == (step != "journal-removed")
    else:
        # Rolled back in process: the target is exactly as it was, marker and env file too.
        assert snapshot(target) == before
        assert not journal
        assert leftovers(target) == []
    _check_untrusted_while_journal(pair, target)
    version = pair.old if then == "old" else pair.new
    _restore_after_crash(pair, target, version, committed=committed, before=before, journal=journal)


@pytest.mark.parametrize("step", [s for s in SYMBOLIC_STEPS if s not in COMMITTED_STEPS])
def test_policy_entry_point_reports_a_failure_before_the_commit_and_changes_nothing(
    tmp_path: Path, pair: Pair, step: str
) -> None:
    """run_restore (the init container's job): failed, exit 0, target byte-identical."""
    target = tmp_path / "target"
    restore_version(pair, pair.old, target)
    before = snapshot(target)
    out = run_restore(
        RestoreRequest(pair.store_ref, target),
        pair.new.raw,
        step_hook=raising_hook(pair.step(step, target)),
    )
    assert out.status == "failed"
    assert out.failure is not None
    assert out.failure.kind == "internal"
    assert out.exit_code == 0
    assert snapshot(target) == before
    again = run_restore(RestoreRequest(pair.store_ref, target), pair.new.raw)
    assert again.status == "restored"
    assert check_installed(target, pair, pair.new) == []


# --------------------------------------------------------------------------
# 1b. SIGKILL at each step boundary (a subprocess kills itself)
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("step", "mode", "follow"),
    [pytest.param(s, "exchange", ("old", "new"), id=s) for s in SYMBOLIC_STEPS]
    + [
        pytest.param(s, "fallback", ("new",), id=f"fallback-{s}")
        for s in ("swap:first", "swap:last", "env-staged", "marker")
    ],
)
def test_sigkill_at_step(
    tmp_path: Path, pair: Pair, step: str, mode: str, follow: tuple[str, ...]
) -> None:
    # The same crash at the same path, once per follow-up restore (OLD, NEW).
    for then in (pair.old if name == "old" else pair.new for name in follow):
        target = tmp_path / "target"
        if target.exists():
            shutil.rmtree(target)
        restore_version(pair, pair.old, target)
        before = snapshot(target)
        run_killed_at(pair, pair.new, target, pair.step(step, target), mode=mode, env=clean_env())
        states = family_states(target, pair)
        assert states == _expected_states(pair, target, step), states
        vol = CacheVolume(target)
        journal = vol.journal_path.exists()
        assert journal == (step not in ("before-journal", "journal-removed"))
        _check_untrusted_while_journal(pair, target)
        if step == "before-journal":
            assert vol.installed() is not None  # the old install still stands and says so
        committed = step in COMMITTED_STEPS
        _restore_after_crash(
            pair, target, then, committed=committed, before=before, journal=journal
        )


def test_recover_alone_repairs_and_is_idempotent(tmp_path: Path, pair: Pair) -> None:
    """recover() under the lock, without a restore: the marker describes what is there."""
    for step, version in (("swap:first", pair.old), ("env", pair.new)):
        target = tmp_path / step.replace(":", "-")
        restore_version(pair, pair.old, target)
        run_killed_at(pair, pair.new, target, pair.step(step, target), env=clean_env())
        vol = CacheVolume(target)
        assert vol.installed() is None
        with vol.locked():
            first = vol.recover()
            second = vol.recover()
        assert first == ("completed" if version is pair.new else "rolled back")
        assert second is None
        assert check_installed(target, pair, version) == []


@pytest.mark.parametrize("nth", [1, 2])
def test_sigkill_between_the_fallbacks_two_renames(tmp_path: Path, pair: Pair, nth: int) -> None:
    """Without RENAME_EXCHANGE a swap is two renames; a kill between them leaves no dir.

    That is the fallback's one window where a family is neither tree; the
    journal covers it: the repair puts the old tree back.
    """
    target = tmp_path / "target"
    restore_version(pair, pair.old, target)
    before = snapshot(target)
    run_killed_at(pair, pair.new, target, mode=f"mid-rename:{nth}", env=clean_env())
    states = family_states(target, pair)
    assert sorted(states.values()) == sorted(
        ["missing"] + ["new"] * (nth - 1) + ["old"] * (2 - nth)
    )
    _check_untrusted_while_journal(pair, target)
    _restore_after_crash(pair, target, pair.old, committed=False, before=before, journal=True)


@pytest.mark.parametrize("nth", [1, 2])
def test_repair_killed_midway_is_repaired_again(tmp_path: Path, pair: Pair, nth: int) -> None:
    """A kill during the repair itself (after its Nth undo): the next repair finishes the job."""
    target = tmp_path / "target"
    restore_version(pair, pair.old, target)
    before = snapshot(target)
    run_killed_at(pair, pair.new, target, pair.step("env-staged", target), env=clean_env())
    assert family_states(target, pair) == dict.fromkeys(FAMILIES, "new")
    run_killed_at(pair, pair.new, target, mode=f"recover-undo:{nth}", env=clean_env())
    states = family_states(target, pair)
    assert sorted(states.values()) == sorted(["old"] * nth + ["new"] * (2 - nth))
    _check_untrusted_while_journal(pair, target)
    _restore_after_crash(pair, target, pair.old, committed=False, before=before, journal=True)


def test_an_env_file_that_is_a_directory_fails_before_changing_anything(
    tmp_path: Path, pair: Pair
) -> None:
    """An env file that cannot be written must fail the restore before the first swap.

    Otherwise the install commits, the rename of the env file fails after the
    marker, and a restore reported as failed has replaced the caches.
    """
    target = tmp_path / "target"
    restore_version(pair, pair.old, target)
    before = snapshot(target)
    env_dir = tmp_path / "env-is-a-dir"
    env_dir.mkdir()
    out = run_restore(RestoreRequest(pair.store_ref, target, env_file=env_dir), pair.new.raw)
    assert out.status == "failed"
    assert out.failure is not None
    assert out.failure.kind == "target"
    assert family_states(target, pair) == dict.fromkeys(FAMILIES, "old")
    assert leftovers(target) == []
    assert snapshot(target) == before


def test_a_committed_journal_whose_env_file_cannot_be_written_does_not_wedge_the_target(
    tmp_path: Path, pair: Pair
) -> None:
    """Repair of a committed install rewrites the env file the journal names; when that
    path cannot take a file any more, later restores (with their own env file) must
    still work instead of failing in repair forever."""
    target = tmp_path / "target"
    restore_version(pair, pair.old, target)
    old_env = tmp_path / "envs" / "a.env"
    run_killed_at(
        pair, pair.new, target, pair.step("marker", target), env_file=old_env, env=clean_env()
    )
    assert CacheVolume(target).journal_path.exists()
    old_env.unlink(missing_ok=True)
    old_env.mkdir(parents=True)  # the journal's env file is now a directory
    for _ in range(2):
        out = run_restore(RestoreRequest(pair.store_ref, target), pair.new.raw)
        assert out.status in ("restored", "noop"), out.failure
        assert check_installed(target, pair, pair.new) == []


# --------------------------------------------------------------------------
# 2. kill -9 of the CLI at random points of a large restore
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def big_pair(tmp_path_factory: pytest.TempPathFactory, local_fp: Fingerprint) -> Pair:
    """OLD and NEW with a generic tree of KILL_FILES random files, KILL_BYTES in all."""
    return build_versions(
        tmp_path_factory.mktemp("big-versions"), local_fp, big=(KILL_FILES, KILL_BYTES)
    )


@pytest.mark.killloop
def test_kill9_at_random_points(tmp_path: Path, big_pair: Pair) -> None:
    seed = int.from_bytes(os.urandom(4), "big")
    duration, records = kill_loop(
        big_pair,
        tmp_path / "target",
        iterations=KILL_ITERATIONS,
        cwd=tmp_path,
        seed=seed,
        env=clean_env(),
    )
    assert duration > 0
    assert len(records) == KILL_ITERATIONS

    def row(r: KillRecord) -> str:
        return (
            f"#{r.iteration} delay {r.delay_s}s/{duration:.2f}s exit {r.exit_code} "
            f"found {r.found} {r.families} journal {r.journal} -> {r.next_status} "
            f"final {r.final} leftovers {r.leftovers} problems {r.problems}"
        )

    table = "\n".join(row(r) for r in records)
    print(f"seed {seed}\n{table}")  # shown with -rA: where the kills landed
    for r in records:
        assert r.found in ("old", "new", "mixed"), f"seed {seed}\n{table}"
        assert r.next_ok, f"seed {seed}\n{table}"
        assert r.final == "new", f"seed {seed}\n{table}"
        assert r.leftovers == [], f"seed {seed}\n{table}"
        assert r.ok, f"seed {seed}\n{table}"


# --------------------------------------------------------------------------
# 3. Concurrent restores into one target
# --------------------------------------------------------------------------


def test_eight_concurrent_restores_install_once(tmp_path: Path, pair: Pair) -> None:
    target = tmp_path / "target"
    runs = concurrent_restores(pair, [pair.new] * 8, target, cwd=tmp_path, env=clean_env())
    detail = [(r.exit_code, r.status, r.stderr[-500:]) for r in runs]
    assert all(r.exit_code == 0 for r in runs), detail
    assert all(r.doc is not None and r.doc["failure"] is None for r in runs), detail
    statuses = sorted(r.status or "?" for r in runs)
    assert statuses == ["noop"] * 7 + ["restored"], detail
    assert check_installed(target, pair, pair.new) == []


def test_two_artifacts_restored_concurrently(tmp_path: Path, pair: Pair) -> None:
    target = tmp_path / "target"
    for round_ in range(3):
        runs = concurrent_restores(
            pair, [pair.old, pair.new], target, cwd=tmp_path, env=clean_env()
        )
        detail = [(r.version, r.exit_code, r.status, r.stderr[-500:]) for r in runs]
        assert all(r.exit_code == 0 for r in runs), detail
        assert all(r.status in ("restored", "noop") for r in runs), detail
        if round_ == 0:  # an empty target: nothing to no-op on
            assert [r.status for r in runs] == ["restored", "restored"], detail
        states = family_states(target, pair)
        final = overall(states)
        assert final in ("old", "new"), states
        marker = marker_version(CacheVolume(target).installed(), pair)
        assert marker is not None
        assert marker.name == final
        assert check_installed(target, pair, marker) == []
        installed = [r.version for r in runs if r.status == "restored"]
        assert installed, detail  # the two differ: at least one had to install
        if len(installed) == 1:
            # A no-op is only right while its own version is installed: the other
            # one, which did install, must then have gone last.
            assert final == installed[0], detail
