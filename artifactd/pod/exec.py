"""``artifactd exec``: start the engine with the restored caches' environment.

A restore writes ``<target>/artifactd.env``: the ``KEY=VALUE`` lines that
point each library at its restored directory. Something has to put them into
the engine's environment; ``artifactd exec --target DIR -- CMD ARGS...`` is
that something: it reads the env file (as :func:`artifactd.restore.envfile.parse_env_file`
reads it), overlays it on its own environment and replaces itself with CMD
(``os.execvpe``, no shell). CMD keeps artifactd's process id, so signals sent
to the container's main process and CMD's exit status pass through untouched.

Failure policy (docs/reference/exit-codes.md): a missing or unreadable env file means the
restore did not run or missed, and CMD runs anyway on its own caches, with one
warning line on stderr; with ``require`` it is a :class:`TargetError` (exit 10)
and CMD does not run.

With ``--engine-log FILE`` (:func:`tee_output`), the engine's standard
output and error also go, line by line and stamped with the time each was
read, into FILE for ``status --engine-log FILE`` (the start's phases,
:mod:`artifactd.pod.phases`, and the compile evidence): a copier process
forked before the exec reads two pipes that become the engine's stdout and
stderr, writes every byte through to where they pointed, and appends the
stamped lines to FILE. The engine keeps the process id; the copier ignores
SIGINT and SIGTERM and ends when the last writer of the pipes (the engine
and its workers) is gone, so the engine's last lines are kept; except where
the engine is a container's first process (PID 1, as in a pod): when it
exits, the kernel ends every other process of the container, the copier
with it, and what the copier had not yet passed on is lost (a known gap:
making the copier the parent that forwards signals would close it).

The log is an add-on, and the rule of every add-on holds
(:func:`artifactd.fsutil.open_append`): it never blocks or fails the engine,
and it writes only a regular file, bounded. A FILE that is a FIFO (never
waited on), a device such as ``/dev/full``, a directory or a symlink (never
followed), that cannot be created, or whose first line cannot be written (a
full disk) is one warning, and the engine runs untouched with its own exit
status; a write that fails later (the disk fills) loses log lines, never the
engine's output.

Before the exec, the signals the Python runtime set to "ignore" at start-up
(``SIGPIPE``, ``SIGXFSZ``) are reset to their defaults, as ``subprocess``
does for its children: an ignored signal survives ``exec``, and an engine
that gets EPIPE instead of dying of SIGPIPE behaves differently in a pipe.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple, NoReturn

from artifactd.constants import current_environ
from artifactd.errors import ArtifactdError, TargetError, UsageError
from artifactd.fsutil import open_append
from artifactd.pod.phases import MAX_LINE_BYTES, MAX_LOG_BYTES, stamp_line
from artifactd.restore.destination import CacheVolume
from artifactd.restore.envfile import parse_env_file

#: Exit codes of a CMD that cannot be started, as POSIX shells use them.
EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126
# ``--engine-log``: a line longer than MAX_LINE_BYTES is logged in pieces; the log
# stops growing at MAX_LOG_BYTES (the engine's output still passes through). The
# start's phases are in its first lines; a volume is not a sink. Both bounds are
# the log's owner's (:mod:`artifactd.pod.phases`), which ``status`` reads by.


class ExecError(ArtifactdError):
    """CMD cannot be started: not found (exit 127) or not executable (exit 126)."""

    exit_code = EXIT_NOT_FOUND
    kind = "exec"

    def __init__(self, message: str, *, hint: str | None = None, exit_code: int) -> None:
        super().__init__(message, hint=hint)
        self.exit_code = exit_code


class ExecPlan(NamedTuple):
    """What :func:`exec_plan` decided: the command, its environment and what was read.

    ``overlay`` is what the env file set (empty when it was not read);
    ``warning`` is the one line to print when CMD runs without restored caches.
    """

    argv: list[str]
    env: dict[str, str]
    env_file: Path
    overlay: dict[str, str]
    warning: str | None


def env_file_path(target: Path, env_file: Path | None = None) -> Path:
    """Return the env file a restore into ``target`` writes (``--env-file``, else the default)."""
    return CacheVolume(target, env_file=env_file).env_file


def exec_plan(
    argv: Sequence[str],
    *,
    target: Path,
    env_file: Path | None = None,
    require: bool = False,
    environ: Mapping[str, str] | None = None,
) -> ExecPlan:
    """Read the env file and overlay it on ``environ`` (default: this process's).

    Raises :class:`UsageError` without a command, and :class:`TargetError`
    (exit 10) when ``require`` is set and the env file cannot be read.
    """
    if not argv:
        raise UsageError(
            "no command to run",
            hint="put the engine's command line after --: artifactd exec --target DIR -- CMD",
        )
    path = env_file_path(target, env_file)
    env = dict(current_environ() if environ is None else environ)
    try:
        overlay = parse_env_file(path)
    except (OSError, UnicodeError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        if require:
            raise TargetError(
                f"no restored caches to run {argv[0]} with: cannot read the env file {path} "
                f"({why})",
                hint="run `artifactd restore --target DIR` first (an init container), "
                "add --restore, or drop --require to run without restored caches",
            ) from None
        return ExecPlan(
            list(argv),
            env,
            path,
            {},
            f"artifactd: warning: no env file at {path} ({why}); running {argv[0]} "
            "without restored caches: it compiles as before",
        )
    env.update(overlay)
    return ExecPlan(list(argv), env, path, overlay, None)


def _reset_signals() -> dict[int, object]:
    """Give CMD the default dispositions Python replaced with "ignore"; return the old ones."""
    old: dict[int, object] = {}
    for name in ("SIGPIPE", "SIGXFSZ", "SIGXFZ"):
        number = getattr(signal, name, None)
        if number is not None:
            old[number] = signal.signal(number, signal.SIG_DFL)
    return old


def run(plan: ExecPlan) -> NoReturn:
    """Replace this process with the plan's command (no shell); never returns.

    Raises :class:`ExecError` when it cannot be started (exit 127 when it is
    not found, 126 when it is not executable), before anything was replaced.
    """
    command = plan.argv[0]
    sys.stdout.flush()
    sys.stderr.flush()
    old = _reset_signals()
    try:
        os.execvpe(command, plan.argv, plan.env)  # noqa: S606 - no shell, on purpose
    except OSError as exc:
        for number, handler in old.items():  # artifactd goes on: its own settings again
            signal.signal(number, handler)  # type: ignore[arg-type]
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise ExecError(
                f"cannot run {command}: not found",
                hint="give an absolute path, or check PATH (the env file can change it)",
                exit_code=EXIT_NOT_FOUND,
            ) from None
        raise ExecError(
            f"cannot run {command}: {exc.strerror or exc}", exit_code=EXIT_NOT_EXECUTABLE
        ) from None


def tee_output(log_path: Path, argv: Sequence[str]) -> str | None:
    """Copy this process's stdout and stderr, from now on, into ``log_path`` too.

    Call it just before :func:`run`. Appends a stamped
    ``artifactd-exec: started ...`` line (the engine's process start), forks
    the copier and points fds 1 and 2 at its pipes. Returns a warning line
    when the log cannot be kept (nothing is changed then): ``log_path`` is not
    a regular file (a FIFO, a device, a directory, a symlink: refused without
    blocking and never followed, :func:`artifactd.fsutil.open_append`), cannot
    be created, or its first line cannot be written (a full disk); or there are
    no pipes or process to copy with. The log stops growing at
    :data:`MAX_LOG_BYTES`, saying so in one last line.
    """
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_fd = open_append(log_path)
    except OSError as exc:
        why = getattr(exc, "problem", None) or exc.strerror or str(exc)
        return (
            f"artifactd: warning: cannot open the engine log {log_path} ({why}); {_without(argv)}"
        )
    try:
        started = f"artifactd-exec: started {' '.join(argv)[:500]} (pid {os.getpid()})\n"
        room = MAX_LOG_BYTES - os.fstat(log_fd).st_size
        if room > 0:
            line = stamp_line(started.encode())
            _write_all(log_fd, line)
            room -= len(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pipes = _fork_copier(log_fd, room)
    except OSError as exc:
        return (
            f"artifactd: warning: cannot write the engine log {log_path} "
            f"({exc.strerror or exc}); {_without(argv)}"
        )
    finally:
        os.close(log_fd)
    for fd, target in zip(pipes, (1, 2), strict=True):
        os.dup2(fd, target)
        os.close(fd)
    return None


def _without(argv: Sequence[str]) -> str:
    return f"{argv[0]} runs without it"


def _fork_copier(log_fd: int, room: int) -> tuple[int, int]:
    """Fork the copier; return the write ends of its stdout and stderr pipes.

    Nothing is left open when a pipe or the fork fails (``OSError``).
    """
    fds: list[int] = []
    try:
        out_r, out_w = os.pipe()
        fds += (out_r, out_w)
        err_r, err_w = os.pipe()
        fds += (err_r, err_w)
        pid = os.fork()
    except OSError:
        for fd in fds:
            os.close(fd)
        raise
    if pid == 0:  # the copier
        os.close(out_w)
        os.close(err_w)
        _copy({out_r: 1, err_r: 2}, log_fd, room)
    os.close(out_r)
    os.close(err_r)
    return out_w, err_w


def _copy(pipes: dict[int, int], log_fd: int, room: int) -> NoReturn:
    """Run the copier: pass each pipe's bytes through, log them stamped, until all end."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        _pump(pipes, log_fd, room)
    finally:  # whatever happens, the copier never returns into artifactd's command line
        os._exit(0)


def _pump(pipes: dict[int, int], log_fd: int, room: int) -> None:
    partial = dict.fromkeys(pipes, b"")
    open_fds = set(pipes)
    while open_fds:
        try:
            ready, _, _ = select.select(list(open_fds), [], [])
        except InterruptedError:
            continue
        for fd in ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                open_fds.discard(fd)
                lines = [partial[fd] + b"\n"] if partial[fd] else []
            else:
                _write(pipes[fd], chunk)
                *lines, partial[fd] = (partial[fd] + chunk).split(b"\n")
                if len(partial[fd]) > MAX_LINE_BYTES:  # a line without end is cut, not hoarded
                    lines.append(partial[fd])
                    partial[fd] = b""
                lines = [line + b"\n" for line in lines]
            if room <= 0 or not lines:
                continue
            now = time.time()
            data = b"".join(stamp_line(line, now) for line in lines)
            if len(data) < room:
                room -= len(data)
            else:  # the last line it writes says so
                note = f"artifactd-exec: the log is full ({MAX_LOG_BYTES} bytes): no more lines\n"
                data, room = stamp_line(note.encode(), now), 0
            _write(log_fd, data)


def _write(fd: int, data: bytes) -> None:
    """Write all of ``data``; a reader gone (EPIPE) or a full disk loses it, not the engine."""
    try:
        _write_all(fd, data)
    except OSError:
        return


def _write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` (``os.write`` may write part); raises ``OSError``."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except InterruptedError:
            continue
