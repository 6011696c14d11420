"""``exec --on-canary-fail cold``: check the restored kernels; if wrong, start the engine cold.

Plain ``exec`` replaces itself with the engine. With ``--on-canary-fail cold``
(and ``--engine-url``) it stays as the engine's parent instead, for one check:

1. the engine starts with the restored caches' environment
   (:func:`artifactd.pod.exec.exec_plan`), SIGTERM and SIGINT passed on to it;
2. once ``GET <engine-url>/health`` answers 200 (within ``ready_timeout_s``),
   the restored artifact's canary is replayed (:func:`artifactd.pod.canary.replay`,
   one short request);
3. ``verified`` or ``drift``: the engine goes on serving; this process waits
   for it and exits with its status;
4. ``failed`` (other tokens, NaN, an empty output, an error): the artifact is
   quarantined in the node store when one is given
   (:func:`artifactd.pod.canary.quarantine_restored`), the engine is stopped
   (SIGTERM, a grace period, SIGKILL), every restored directory is set aside
   under ``<target>/.artifactd/aside-<time>/`` (an empty one in its place),
   and the engine is started once more, cold: it compiles as if nothing had
   been restored, rather than serve wrong answers. There is no second check
   and no second restart.

No canary to replay (none restored, a partial restore) is one event, and the
engine runs as with plain ``exec``. Events (``stage: "exec"``) say what
happened; the library never prints.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

from artifactd.events import EventSink, discard
from artifactd.pod.canary import quarantine_restored, replay, restored_canary
from artifactd.pod.exec import ExecPlan
from artifactd.pod.readiness import probe_health
from artifactd.restore.destination import CacheVolume

#: After SIGTERM to the engine whose canary failed, before SIGKILL (seconds).
STOP_GRACE_S = 30.0
#: Health polling: the first interval and the longest.
POLL_FIRST_S, POLL_MAX_S = 0.05, 1.0


def _exit_status(returncode: int) -> int:
    """Return a child's status as a shell reports it: 128 + N for a death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


@contextlib.contextmanager
def _forwarding(
    current: Callable[[], subprocess.Popen[bytes] | None], signalled: list[int]
) -> Iterator[None]:
    """Pass SIGTERM and SIGINT on to the engine running now (and note them in ``signalled``)."""

    def forward(signum: int, frame: FrameType | None) -> None:
        del frame
        signalled.append(signum)
        proc = current()
        if proc is not None and proc.poll() is None:
            proc.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for number, handler in old.items():
            signal.signal(number, handler)


def _wait_healthy(engine_url: str, proc: subprocess.Popen[bytes], deadline: float) -> bool:
    """Poll the engine's health until 200; False when it exits or the deadline passes."""
    delay = POLL_FIRST_S
    while proc.poll() is None and time.monotonic() < deadline:
        if probe_health(engine_url)[0]:
            return True
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, min(delay, deadline - time.monotonic())))
        delay = min(delay * 2, POLL_MAX_S)
    return False


def _stop(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def set_aside(target: Path, env_file: Path | None = None) -> list[str]:
    """Move every restored directory of ``target`` aside (an empty one in its place).

    Under ``<target>/.artifactd/aside-<time>/<family>/<component>``, a rename
    on the same filesystem; returns the directories moved. The marker stays:
    ``status`` then sees what the cold engine writes as compiled anyway.
    """
    volume = CacheVolume(target, env_file=env_file)
    marker = volume.read_marker()
    if marker is None:
        return []
    aside = volume.state / f"aside-{time.time_ns()}"
    moved = []
    for family, record in sorted(marker["families"].items()):
        for component, path in sorted(record["dirs"].items()):
            if not os.path.isdir(path) or os.path.islink(path):
                continue
            dest = aside / family / component
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.rename(path, dest)
            os.mkdir(path)
            moved.append(path)
    return moved


def supervise(
    plan: ExecPlan,
    *,
    target: Path,
    engine_url: str,
    env_file: Path | None = None,
    cell: str | None = None,
    node_store: str | None = None,
    ready_timeout_s: float = 600.0,
    on_event: EventSink = discard,
) -> int:
    """Run the engine, replay the canary once it is up, restart it cold once if it fails.

    Returns the exit status of the engine that ran last (see the module doc).
    Raises :class:`OSError` when the command cannot be started.
    """
    canary, _, why = restored_canary(target, cell, env_file=env_file)
    running: list[subprocess.Popen[bytes]] = []
    signalled: list[int] = []

    def start() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(plan.argv, env=plan.env)
        running.append(proc)
        return proc

    with _forwarding(lambda: running[-1] if running else None, signalled):
        proc = start()
        if canary is None:
            on_event({"stage": "exec", "event": "no_canary", "why": why})
            return _exit_status(proc.wait())
        if not _wait_healthy(engine_url, proc, time.monotonic() + ready_timeout_s):
            on_event({"stage": "exec", "event": "canary_skipped", "why": "the engine is not up"})
            return _exit_status(proc.wait())
        result = replay(canary, engine_url)
        on_event(
            {
                "stage": "exec",
                "event": "canary",
                "outcome": result.outcome,
                "mode": result.mode,
                "why": result.why,
            }
        )
        if result.ready:
            return _exit_status(proc.wait())
        quarantined = None
        if node_store is not None:
            quarantined = quarantine_restored(
                target, node_store, f"canary failed: {result.why}", env_file=env_file
            )
        _stop(proc, STOP_GRACE_S)
        if signalled:  # the pod is being stopped: no restart
            return _exit_status(proc.wait())
        moved = set_aside(target, env_file)
        on_event(
            {
                "stage": "exec",
                "event": "cold_restart",
                "why": result.why,
                "set_aside": moved,
                "quarantined": quarantined,
            }
        )
        return _exit_status(start().wait())


__all__ = ["set_aside", "supervise"]
