"""Cell processes: one launcher for command and serve cells, and one way to stop them.

Every warm-up cell runs through :func:`start`: a one-shot command
(:func:`artifactd.build.run.run_cell`) and an engine
(:func:`artifactd.build.cells.run_serve`) alike run in a session and process
group of their own, since what a cell starts forks (compile pools,
tokenisers, tensor-parallel ranks, a shell's background job) and those
children write caches and hold GPU memory too. :func:`stop` ends a cell the
same way whatever the reason (it finished, ran past its timeout, failed, or
the build was interrupted): SIGTERM to the whole group, a grace period for
it to exit, then SIGKILL to whatever is left, and it returns only once no
live process of the group is left (or :data:`KILL_WAIT_S` more passed, for
a process stuck in the kernel). So a cell that times out leaves no orphan
holding GPU memory for the next cell packed onto that device, and no writer
races the harvest of its cache roots. A process that leaves the group (its
own ``setsid``) is beyond reach.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

#: After SIGKILL, how long to wait for the group to be gone before giving up.
KILL_WAIT_S = 10.0
#: A command cell's grace after SIGTERM (at its timeout, or for what it left running).
COMMAND_GRACE_S = 10.0


def start(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    stdout: IO[bytes],
    stderr: IO[bytes] | int = subprocess.STDOUT,
) -> subprocess.Popen[bytes]:
    """Start a cell's ``argv`` with exactly ``env``, in a new session and process group.

    stdin is ``/dev/null``; ``stdout`` and ``stderr`` are files (``stderr``
    defaults to ``stdout``'s). Raises ``OSError`` when it cannot start (the
    caller names the cell).
    """
    return subprocess.Popen(
        list(argv),
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        start_new_session=True,
    )


def wait(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for the cell's own process; False when it is still running."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return True


def group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process is left in process group ``pgid``."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) >= 3 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _wait_group(proc: subprocess.Popen[bytes], deadline: float) -> bool:
    """Wait until the cell's process and every process of its group are gone; False at deadline."""
    while True:
        left = deadline - time.monotonic()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, min(left, 0.1)))
        if proc.returncode is not None and not group_alive(proc.pid):
            return True
        if left <= 0:
            return False
        if proc.returncode is not None:
            time.sleep(min(0.05, max(0.0, left)))


def stop(proc: subprocess.Popen[bytes], grace_s: float) -> tuple[bool, int]:
    """SIGTERM the cell's group, wait ``grace_s``, SIGKILL what is left; (killed, status).

    ``killed``: SIGTERM was not enough. ``status``: the cell's own exit status
    (negative: the signal that ended it). A group with nothing left running is
    not signalled at all.
    """
    if proc.poll() is not None and not group_alive(proc.pid):
        return False, proc.returncode
    killed = False
    _signal_group(proc.pid, signal.SIGTERM)
    if not _wait_group(proc, time.monotonic() + grace_s):
        killed = True
        _signal_group(proc.pid, signal.SIGKILL)
        _wait_group(proc, time.monotonic() + KILL_WAIT_S)
    if proc.returncode is None:  # unkillable (D state): reap what can be reaped
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=KILL_WAIT_S)
    return killed, proc.returncode if proc.returncode is not None else -signal.SIGKILL


__all__ = ["COMMAND_GRACE_S", "KILL_WAIT_S", "group_alive", "start", "stop", "wait"]
