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
forked first reads two pipes that become the engine's stdout and stderr,
writes every byte through to where they pointed, and appends the stamped
lines to FILE. Then artifactd does not replace itself: it starts CMD as its
child (:func:`run_logged`) and stays its parent, as ``tini`` does. It passes
on every signal a container runtime, ``kubectl`` or a terminal sends
(:data:`FORWARDED`), reaps the processes a container's first process (PID 1)
adopts, and when CMD exits, waits up to :data:`DRAIN_S` for the copier to
pass on CMD's last bytes before it exits with CMD's status (dying of CMD's
signal where it can, else 128 + N, as a shell reports it). The copier could
not be the parent's sibling: in a pod, when the container's first process
exits, the kernel ends every other process of the container at once, and
a crash's last lines (its traceback) were lost with the copier.

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

import contextlib
import errno
import os
import select
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, NamedTuple, NoReturn

from artifactd.constants import current_environ
from artifactd.errors import ArtifactdError, TargetError, UsageError
from artifactd.fsutil import open_append
from artifactd.pod.phases import MAX_LINE_BYTES, MAX_LOG_BYTES, stamp_line
from artifactd.restore.destination import CacheVolume
from artifactd.restore.envfile import parse_env_file

if TYPE_CHECKING:
    import subprocess

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


#: A signal's disposition, as ``signal.signal`` takes and returns it.
_Handler = Callable[[int, FrameType | None], object] | int | None


def _reset_signals() -> dict[int, _Handler]:
    """Give CMD the default dispositions Python replaced with "ignore"; return the old ones."""
    old: dict[int, _Handler] = {}
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
            signal.signal(number, handler)
        raise _start_error(command, exc) from None


def _start_error(command: str, exc: OSError) -> ExecError:
    """Return the error of a CMD that cannot be started: not found (127), else 126."""
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return ExecError(
            f"cannot run {command}: not found",
            hint="give an absolute path, or check PATH (the env file can change it)",
            exit_code=EXIT_NOT_FOUND,
        )
    return ExecError(f"cannot run {command}: {exc.strerror or exc}", exit_code=EXIT_NOT_EXECUTABLE)


#: Signals passed on to CMD while artifactd stays its parent (``--engine-log``):
#: what a container runtime or ``kubectl`` sends, and ``kill`` by hand. SIGKILL
#: and SIGSTOP cannot be caught; job control (SIGTSTP, SIGTTIN, SIGTTOU) stays
#: the terminal's.
FORWARDED = tuple(
    getattr(signal, name)
    for name in (
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGTERM",
        "SIGUSR1",
        "SIGUSR2",
        "SIGWINCH",
        "SIGALRM",
        "SIGCONT",
    )
    if hasattr(signal, name)
)
#: Signals a terminal sends to its whole foreground process group, CMD included:
#: not passed on again while artifactd is in that group (CMD would get two).
_FROM_TERMINAL = frozenset(getattr(signal, n) for n in ("SIGINT", "SIGQUIT") if hasattr(signal, n))
#: Once CMD has exited, how long the copier may go on passing on output, in
#: seconds: what CMD wrote last, and what its workers (holding the pipes) still write.
DRAIN_S = 5.0
#: Signals whose default action ends a process without a core dump: artifactd
#: dies of one of these when CMD did, and exits with 128 + N for any other.
_ENDING = frozenset(
    getattr(signal, name)
    for name in (
        "SIGHUP",
        "SIGINT",
        "SIGTERM",
        "SIGKILL",
        "SIGPIPE",
        "SIGUSR1",
        "SIGUSR2",
        "SIGALRM",
    )
    if hasattr(signal, name)
)


class Tee:
    """An engine log being kept (:func:`tee_output`): the copier, and fds 1 and 2 as they were."""

    def __init__(self, copier: int, saved: tuple[int, int]) -> None:
        #: The copier's process id.
        self.copier = copier
        self._saved: tuple[int, int] | None = saved

    def detach(self) -> None:
        """Point this process's stdout and stderr back where they pointed (CMD keeps the pipes).

        Once no process but CMD (and what it starts) holds the pipes, the
        copier sees their end when CMD's output ends. Does nothing the second time.
        """
        if self._saved is None:
            return
        _flush()
        for fd, target in zip(self._saved, (1, 2), strict=True):
            os.dup2(fd, target)
            os.close(fd)
        self._saved = None

    def finish(self, grace_s: float = DRAIN_S) -> bool:
        """Detach, then wait up to ``grace_s`` for the copier to end; return whether it did."""
        self.detach()
        return _wait_exit(self.copier, grace_s)


def tee_output(log_path: Path, argv: Sequence[str], warn: Callable[[str], object]) -> Tee | None:
    """Copy this process's stdout and stderr, from now on, into ``log_path`` too.

    Call it just before :func:`run_logged`. Appends a stamped
    ``artifactd-exec: started ...`` line (the engine's start; the pid is this
    process's, CMD's parent), forks the copier and points fds 1 and 2 at its
    pipes. Returns the :class:`Tee`; or None, after calling ``warn`` with one
    line, when the log cannot be kept (nothing is changed then, and CMD is to
    be run as without it):
    ``log_path`` is not a regular file (a FIFO, a device, a directory, a
    symlink: refused without blocking and never followed,
    :func:`artifactd.fsutil.open_append`), cannot be created, or its first
    line cannot be written (a full disk); or there are no pipes or process to
    copy with. The log stops growing at :data:`MAX_LOG_BYTES`, saying so in
    one last line.
    """
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_fd = open_append(log_path)
    except OSError as exc:
        why = getattr(exc, "problem", None) or exc.strerror or str(exc)
        warn(f"artifactd: warning: cannot open the engine log {log_path} ({why}); {_without(argv)}")
        return None
    try:
        # One line, whatever CMD's arguments hold: a newline in one must not
        # make a line of its own (a stamped line that CMD never wrote).
        shown = " ".join(argv)[:500].replace("\r", "\\r").replace("\n", "\\n")
        started = f"artifactd-exec: started {shown} (pid {os.getpid()})\n"
        room = MAX_LOG_BYTES - os.fstat(log_fd).st_size
        if room > 0:
            line = stamp_line(started.encode())
            _write_all(log_fd, line)
            room -= len(line)
        sys.stdout.flush()
        sys.stderr.flush()
        saved = _dup_out()  # where fds 1 and 2 point now, for CMD's parent to point back at
        try:
            pipes, copier = _fork_copier(log_fd, room)
        except OSError:
            for fd in saved:
                os.close(fd)
            raise
    except OSError as exc:
        why = exc.strerror or str(exc)
        warn(
            f"artifactd: warning: cannot write the engine log {log_path} ({why}); {_without(argv)}"
        )
        return None
    finally:
        os.close(log_fd)
    for fd, target in zip(pipes, (1, 2), strict=True):
        os.dup2(fd, target)
        os.close(fd)
    return Tee(copier, saved)


class Forwarder:
    """Pass every signal in :data:`FORWARDED` this process gets on to its child CMD.

    The one owner of what a parent that stays CMD's parent does with signals
    (:func:`run_logged`, and ``exec --on-canary-fail``'s supervisor): a
    context manager that installs the handlers and puts the old ones back.
    A signal got before CMD is there (:meth:`child` not yet called, or called
    with None between two engines) is held and sent once it is; held twice,
    it is sent once, as the kernel keeps one pending signal of a kind. SIGINT
    and SIGQUIT are not sent again while this process is in its terminal's
    foreground group: the terminal sent them to CMD too. :attr:`got` is the
    set of signals got, passed on or not. Both stay bounded by
    :data:`FORWARDED` however long the engine runs and however many come.
    """

    #: The signals that ask the pod to stop (a supervisor starts no engine after one).
    STOPPING = frozenset(
        getattr(signal, n) for n in ("SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM") if hasattr(signal, n)
    )

    def __init__(self) -> None:
        self.got: set[int] = set()
        self._pid: int | None = None
        self._held: list[int] = []
        self._old: dict[int, _Handler] = {}

    def __enter__(self) -> Forwarder:
        self._old = {number: signal.signal(number, self._forward) for number in FORWARDED}
        return self

    def __exit__(self, *exc: object) -> None:
        for number, handler in self._old.items():
            signal.signal(number, handler)
        self._old = {}

    def child(self, pid: int | None) -> None:
        """Pass signals on to ``pid`` from now on (None: hold them); send what was held."""
        self._pid = pid
        if pid is None:
            return
        held, self._held = self._held, []
        for signum in held:
            self._send(signum)

    def stopping(self) -> bool:
        """Whether a signal that asks to stop (:attr:`STOPPING`) came."""
        return not self.STOPPING.isdisjoint(self.got)

    def _forward(self, signum: int, frame: FrameType | None) -> None:
        del frame
        self.got.add(signum)
        if signum in _FROM_TERMINAL and _in_foreground():
            return  # the terminal sent it to CMD too
        if self._pid is None:
            if signum not in self._held:
                self._held.append(signum)
        else:
            self._send(signum)

    def _send(self, signum: int) -> None:
        if self._pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._pid, signum)


def run_logged(plan: ExecPlan, tee: Tee) -> int:
    """Run the plan's command as this process's child while ``tee`` logs it; return its status.

    The status is as :mod:`subprocess` gives it: the exit code, or -N for a
    death by signal N (:func:`exit_like` turns it into this process's end).
    Every signal in :data:`FORWARDED` this process gets is passed on to CMD
    (:class:`Forwarder`); every child that ends meanwhile is reaped
    (:func:`wait_reaping`). Once CMD has exited, waits up to :data:`DRAIN_S`
    for the copier to pass on the last of its output. Raises
    :class:`ExecError` as :func:`run` does when CMD cannot be started.
    """
    with Forwarder() as forwarder:
        try:
            proc = start(plan)
        except ExecError:
            tee.finish()  # nothing writes to the copier's pipes now: it ends at once
            raise
        forwarder.child(proc.pid)
        tee.detach()
        proc.returncode = status = wait_reaping(proc.pid)
        forwarder.child(None)
    tee.finish()
    return status


def start(plan: ExecPlan) -> subprocess.Popen[bytes]:
    """Start the plan's command as this process's child (no shell); raise :class:`ExecError`.

    ``SIGPIPE`` and ``SIGXFSZ`` are CMD's defaults again, as with :func:`run`.
    """
    # lazy: only a parent that stays CMD's parent starts it as a child
    import subprocess  # noqa: PLC0415

    try:
        # restore_signals (the default): SIGPIPE and SIGXFSZ are CMD's defaults again
        return subprocess.Popen(plan.argv, env=plan.env)  # no shell, on purpose
    except OSError as exc:
        raise _start_error(plan.argv[0], exc) from None


def exit_like(status: int) -> NoReturn:
    """End this process as CMD ended: its exit code, or death by its signal.

    ``status`` is as :func:`run_logged` returns it. A signal whose default
    action ends a process without a core dump is raised on this process
    again; when that does not end it (a container's first process ignores
    signals it has no handler for) or for any other signal, the exit code is
    128 + N, as a shell and a container runtime report it.
    """
    _flush()
    if status >= 0:
        sys.exit(status)
    number = -status
    if number in _ENDING:
        with contextlib.suppress(OSError, ValueError):
            signal.signal(number, signal.SIG_DFL)
            os.kill(os.getpid(), number)
    sys.exit(128 + number)


def _flush() -> None:
    """Flush Python's stdout and stderr; a reader gone (EPIPE) is no reason to fail the engine."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()


def _in_foreground() -> bool:
    """Whether this process is in its terminal's foreground group (a container has no terminal)."""
    try:
        return os.tcgetpgrp(0) == os.getpgrp()
    except OSError:
        return False


def wait_reaping(pid: int) -> int:
    """Reap children until ``pid`` ends; return its status (-N: killed by signal N).

    A container's first process (PID 1) adopts the orphans of every process in
    it: reaping whichever child ends keeps them from staying zombies.
    """
    while True:
        try:
            reaped, status = os.waitpid(-1, 0)
        except ChildProcessError:  # pragma: no cover - pid is this process's child
            return 0
        if reaped == pid:
            return os.waitstatus_to_exitcode(status)
        # the copier (ended early), or an orphan this process adopted as a container's PID 1


def _wait_exit(pid: int, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for child ``pid`` to end, and reap it; whether it did."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    except (AttributeError, OSError):  # no pidfd (Linux before 5.3): look every 10 ms
        fd = None
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    return True
            except ChildProcessError:  # reaped already (it ended while CMD ran)
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if fd is not None:
                select.select([fd], [], [], left)
            else:
                time.sleep(min(0.01, left))
    finally:
        if fd is not None:
            os.close(fd)


def _dup_out() -> tuple[int, int]:
    """Return copies of fds 1 and 2 (``OSError``, with nothing left open, when there are none)."""
    out = os.dup(1)
    try:
        return out, os.dup(2)
    except OSError:
        os.close(out)
        raise


def _without(argv: Sequence[str]) -> str:
    return f"{argv[0]} runs without it"


def _fork_copier(log_fd: int, room: int) -> tuple[tuple[int, int], int]:
    """Fork the copier; return the write ends of its stdout and stderr pipes, and its pid.

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
    return (out_w, err_w), pid


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
