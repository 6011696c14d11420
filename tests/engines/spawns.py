"""Count the processes a producer starts: the evidence that a warm start compiled nothing.

A JIT library compiles by starting a compiler (nvcc, the host C++ compiler,
ninja). :func:`record` installs a Python audit hook (PEP 578) that keeps every
process start the interpreter makes: ``subprocess.Popen``, ``os.posix_spawn``,
``os.exec*``, ``os.system``, ``os.spawn*``, ``os.fork``. Installed before the
library is imported, it sees every start that goes through Python, which is
how TileLang (``tilelang.contrib.nvcc``, its host-library link) and SGLang's
JIT (``nvcc --version``, ``c++ --version``, ninja) start theirs. A process
started from native code without Python would not be seen: the tests pair this
count with the files written since the restore.
"""

from __future__ import annotations

import os
import sys
from typing import Any

#: Audit events that start (or fork) a process.
SPAWN_EVENTS = frozenset(
    {
        "subprocess.Popen",
        "os.posix_spawn",
        "os.exec",
        "os.system",
        "os.spawn",
        "os.fork",
        "os.forkpty",
    }
)


def _argv(event: str, args: tuple[Any, ...]) -> list[str]:
    """The started program's argv, as far as the event says."""
    if event == "os.system":
        return [str(args[0])]
    if event in ("os.fork", "os.forkpty"):
        return [event]
    argv = args[1] if len(args) > 1 else args[:1]
    if isinstance(argv, (str, bytes, os.PathLike)):
        return [os.fsdecode(argv)]
    return [os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else str(a) for a in argv]


def record() -> list[list[str]]:
    """Start recording; return the list each process start is appended to (its argv)."""
    started: list[list[str]] = []

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event in SPAWN_EVENTS:
            started.append(_argv(event, args))

    sys.addaudithook(hook)
    return started
