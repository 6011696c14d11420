"""``exec --on-canary-fail cold``: check the restored kernels; if wrong, start the engine cold.

Plain ``exec`` replaces itself with the engine. With ``--on-canary-fail cold``
(and ``--engine-url``) it stays as the engine's parent instead, for one check:

1. the engine starts with the restored caches' environment
   (:func:`artifactd.pod.exec.exec_plan`) as this process's child; as with
   ``--engine-log`` (:func:`artifactd.pod.exec.run_logged`, the same owner),
   every signal a container runtime, ``kubectl`` or a terminal sends is
   passed on to it (:class:`artifactd.pod.exec.Forwarder`), and every child
   that ends is reaped, the orphans a container's first process adopts
   included (:func:`artifactd.pod.exec.wait_reaping`);
2. once ``GET <engine-url>/health`` answers 200 (within ``ready_timeout_s``),
   the restored artifact's canary is replayed (:func:`artifactd.pod.canary.replay`,
   one short request);
3. ``verified`` or ``drift``: the engine goes on serving; this process waits
   for it and ends as it did (:func:`artifactd.pod.exec.exit_like`);
4. ``failed`` (other tokens, NaN, an empty output, an error): the artifact is
   quarantined in the node store when one is given
   (:func:`artifactd.pod.canary.quarantine_restored`), the engine is stopped
   (SIGTERM, a grace period, SIGKILL), every restored directory is set aside
   under ``<target>/.artifactd/aside-<time>/`` (an empty one in its place),
   and the engine is started once more, cold: it compiles as if nothing had
   been restored, rather than serve wrong answers. There is no second check
   and no second restart, and none at all once a signal asked the pod to
   stop (:attr:`artifactd.pod.exec.Forwarder.STOPPING`).

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
from pathlib import Path

from artifactd.events import EventSink, discard
from artifactd.pod.canary import quarantine_restored, replay, restored_canary
from artifactd.pod.exec import ExecPlan, Forwarder, start, wait_reaping
from artifactd.pod.readiness import probe_health
from artifactd.restore.destination import CacheVolume

#: After SIGTERM to the engine whose canary failed, before SIGKILL (seconds).
STOP_GRACE_S = 30.0
#: Health polling: the first interval and the longest.
POLL_FIRST_S, POLL_MAX_S = 0.05, 1.0


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

    Returns the status of the engine that ran last as :mod:`subprocess` gives
    it (-N for a death by signal N: :func:`artifactd.pod.exec.exit_like` ends
    this process the same way). Raises :class:`artifactd.pod.exec.ExecError`
    when the command cannot be started.
    """
    canary, _, why = restored_canary(target, cell, env_file=env_file)
    with Forwarder() as forwarder:

        def run(proc: subprocess.Popen[bytes]) -> int:
            """Wait for the engine to end, reaping every other child meanwhile.

            An engine that ended while its health was polled is reaped already:
            its status is the one ``Popen`` kept (waiting again would wait for
            the other children, the engine log's copier among them, and never
            see it).
            """
            if proc.returncode is None:
                proc.returncode = wait_reaping(proc.pid)
            forwarder.child(None)
            return proc.returncode

        proc = start(plan)
        forwarder.child(proc.pid)
        if canary is None:
            on_event({"stage": "exec", "event": "no_canary", "why": why})
            return run(proc)
        if not _wait_healthy(engine_url, proc, time.monotonic() + ready_timeout_s):
            on_event({"stage": "exec", "event": "canary_skipped", "why": "the engine is not up"})
            return run(proc)
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
            return run(proc)
        quarantined = None
        if node_store is not None:
            quarantined = quarantine_restored(
                target, node_store, f"canary failed: {result.why}", env_file=env_file
            )
        _stop(proc, STOP_GRACE_S)
        forwarder.child(None)  # no engine until the cold one: a signal now is held for it
        if forwarder.stopping():  # the pod is being stopped: no restart
            return proc.wait()
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
        cold = start(plan)
        forwarder.child(cold.pid)
        return run(cold)


__all__ = ["set_aside", "supervise"]
