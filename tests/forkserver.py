"""CLI runs forked from a Python that has already imported artifactd.

Most of the suite's CPU time is ``python -m artifactd`` runs (about 900 in
``pytest -m "not slow"``), and most of each run is the interpreter starting
and importing artifactd, pydantic, requests and zstandard: about 0.2 of the
0.25 CPU-seconds of a small restore. :class:`ForkServer` starts one server per
pytest process that imports all of that once; each run is then a fork of it
that becomes what ``python -m artifactd ARGS`` is: ``artifactd/__main__.py``
run as ``__main__``, with the run's own argv, environment (``os.environ``
replaced, so the CLI's own children inherit it), working directory (also
``sys.path[0]``, as ``-m`` puts it), umask and stdio (pipes the client reads
to their end, as ``subprocess.run`` does), ending as the interpreter ends
(non-daemon threads joined, atexit handlers run, stdio flushed) with its own
exit status, but without freeing every object: in a fork that would copy
every page the server's imports left.

What a fork cannot be is a new interpreter. :func:`needs_new_interpreter`
says which runs start one instead: an environment that changes how Python or
the dynamic loader starts (``PYTHON*``, ``LD_*``, the locale), or a prelude
(code that patches modules before the CLI imports them; here they are
imported already). ``ARTIFACTD_TEST_FORK=0`` starts a new interpreter for
every run. The tests of the start itself (tests/test_startup.py,
test_fastpath.py, test_suite_speed.py) start their own interpreters.

Each request is two forks deep: the server forks a waiter, which forks the run
and reports the run's pid, then its exit status (``-N`` for a signal, as
:mod:`subprocess` has it). The server stays single-threaded, so every fork is
safe, and it exits when the pytest process that started it closes its stdin.

Run as ``python tests/forkserver.py SOCKET`` (by :class:`ForkServer`).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import io
import json
import locale
import os
import pkgutil
import runpy
import select
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

#: Variables that change how the interpreter or the loader starts: a run whose
#: value differs from the server's gets a new interpreter.
START_PREFIXES = ("PYTHON", "LD_", "LC_")
START_NAMES = frozenset({"LANG", "LANGUAGE"})
#: Set to 0 to start a new interpreter for every CLI run.
ENV_FORK = "ARTIFACTD_TEST_FORK"
#: Third-party modules a CLI run may import, preloaded with artifactd's own.
PRELOAD = ("click", "pydantic", "requests", "zstandard", "jinja2", "yaml", "prometheus_client")
_HEADER = struct.Struct("!I")


def start_vars(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` that act on the interpreter's or the loader's start."""
    return {k: v for k, v in env.items() if k.startswith(START_PREFIXES) or k in START_NAMES}


def needs_new_interpreter(env: Mapping[str, str], server_env: Mapping[str, str]) -> bool:
    """Whether a run with ``env`` must start a new interpreter rather than fork the server's."""
    return start_vars(env) != start_vars(server_env)


class ForkServer:
    """The client side: starts the server and runs CLI invocations through it."""

    def __init__(self, python: str, env: Mapping[str, str], cwd: Path) -> None:
        self.env = dict(env)
        self._dir = Path(tempfile.mkdtemp(prefix="afork-"))  # short: AF_UNIX paths are <108 bytes
        self.socket_path = self._dir / "s"
        self._proc = subprocess.Popen(
            [python, __file__, str(self.socket_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=self.env,
            cwd=cwd,
        )
        assert self._proc.stdout is not None
        ready = self._proc.stdout.readline()
        if ready != b"ready\n":
            self._proc.kill()
            raise RuntimeError(f"the CLI fork server did not start: {ready!r}")

    def close(self) -> None:
        """Stop the server (closing its stdin ends it) and remove its socket."""
        assert self._proc.stdin is not None
        self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        self.socket_path.unlink(missing_ok=True)
        self._dir.rmdir()

    def run(
        self, args: Sequence[str], *, env: Mapping[str, str], cwd: Path | None, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        """Run ``python -m artifactd ARGS`` as a fork of the server; like ``subprocess.run``.

        Raises :class:`subprocess.TimeoutExpired` (after killing the run) past ``timeout``.
        """
        mask = os.umask(0)
        os.umask(mask)
        request = json.dumps(
            {
                "argv": list(args),
                "env": dict(env),
                "cwd": str(cwd) if cwd is not None else os.getcwd(),
                "umask": mask,
            }
        ).encode()
        cmd = ["python", "-m", "artifactd", *args]
        deadline = time.monotonic() + timeout
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            with (
                open(os.devnull, "rb") as stdin,
                socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock,
            ):
                sock.connect(str(self.socket_path))
                message = _HEADER.pack(len(request)) + request
                sent = socket.send_fds(sock, [message], [stdin.fileno(), out_w, err_w])
                sock.sendall(message[sent:])
                os.close(out_w)
                os.close(err_w)
                out_w = err_w = -1
                reader = sock.makefile("rb")
                pid_line = _line(sock, reader, deadline)
                if pid_line is None:  # the server did not even fork the run in time
                    raise subprocess.TimeoutExpired(cmd, timeout)
                pid = int(pid_line)
                # As subprocess.run: read both streams to their end (every writer,
                # the run's own children too, closed them), then take the status.
                output = _read_to_end({out_r: bytearray(), err_r: bytearray()}, deadline)
                status = _line(sock, reader, deadline) if output is not None else None
                if output is None or status is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                    raise subprocess.TimeoutExpired(cmd, timeout)
                return subprocess.CompletedProcess(
                    cmd, int(status), _text(output[out_r]), _text(output[err_r])
                )
        finally:
            for fd in (out_r, err_r, out_w, err_w):
                if fd >= 0:
                    os.close(fd)


def _line(sock: socket.socket, reader: io.BufferedReader, deadline: float) -> bytes | None:
    """The server's next line (a pid, then a status); None when ``deadline`` passes first."""
    sock.settimeout(max(deadline - time.monotonic(), 0.001))
    try:
        line = reader.readline()
    except TimeoutError:
        return None
    if not line:
        raise RuntimeError("the CLI fork server closed the connection (is it alive?)")
    return line


def _read_to_end(buffers: dict[int, bytearray], deadline: float) -> dict[int, bytearray] | None:
    """Read every pipe in ``buffers`` to its end; None when ``deadline`` passes first."""
    with selectors.DefaultSelector() as sel:
        for fd in buffers:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, 1 << 16)
                if chunk:
                    buffers[key.fd] += chunk
                else:
                    sel.unregister(key.fd)
    return buffers


def _text(data: bytes | bytearray) -> str:
    """What ``subprocess.run(text=True)`` would have decoded from ``data``.

    Bytes the encoding cannot decode (a file name that is not UTF-8, printed
    as it is) come back as U+FFFD, where ``subprocess.run`` would raise: a test
    of such names reads the rest of the output.
    """
    return io.TextIOWrapper(
        io.BytesIO(data), encoding=locale.getpreferredencoding(False), errors="replace"
    ).read()


# --------------------------------------------------------------------------
# The server (this file run as a script)
# --------------------------------------------------------------------------


def _preload() -> None:
    # lazy: only the server preloads artifactd; conftest imports this module for the client
    import artifactd  # noqa: PLC0415

    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    for mod in pkgutil.walk_packages(artifactd.__path__, "artifactd."):
        if mod.name != "artifactd.__main__":  # each run executes it afresh, as -m does
            importlib.import_module(mod.name)
    if "torch" in sys.modules:  # a run of the CLI must import it itself, or not at all
        raise RuntimeError("preloading artifactd imported torch")


def _serve(path: str) -> tuple[dict[str, Any], list[int]]:
    """Accept requests until stdin closes; return (request, fds) only in a run's process."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        readable, _, _ = select.select([listener, sys.stdin], [], [], 1.0)
        _reap()
        if sys.stdin in readable and not os.read(sys.stdin.fileno(), 1):
            os._exit(0)  # the pytest process is gone or done
        if listener not in readable:
            continue
        conn, _ = listener.accept()
        if os.fork() == 0:  # the waiter
            listener.close()
            return _wait_for_run(conn)
        conn.close()


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _wait_for_run(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """Receive one request, fork the run; in the waiter, report its pid and exit status."""
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    (size,) = _HEADER.unpack(data[: _HEADER.size])
    data = data[_HEADER.size :]
    while len(data) < size:
        chunk = conn.recv(1 << 16)
        if not chunk:
            os._exit(1)
        data += chunk
    pid = os.fork()
    if pid == 0:  # the run
        conn.close()
        return json.loads(data), fds
    try:
        conn.sendall(f"{pid}\n".encode())
        _, status = os.waitpid(pid, 0)
        conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
    except OSError:  # the client timed out, killed the run and left
        pass
    os._exit(0)


def _become_the_cli(request: dict[str, Any], fds: list[int]) -> NoReturn:
    """Turn this fork into ``python -m artifactd ARGS`` as the request describes it; exit."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    sys.path[0] = os.getcwd()
    sys.argv = ["-m", *request["argv"]]
    try:
        runpy.run_module("artifactd", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except KeyboardInterrupt:
        code = -signal.SIGINT
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    _finish()
    if code < 0:  # as Python ends on an uncaught Ctrl-C: killed by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code & 0xFF)


def _exit_code(code: object) -> int:
    """The exit status ``raise SystemExit(code)`` gives, as the interpreter maps it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF  # as the OS truncates exit(code)
    print(code, file=sys.stderr)
    return 1


def _finish() -> None:
    """What the interpreter does at exit before it frees every object: joins, atexit, flush.

    The freeing is skipped (``os._exit``): in a fork it would write to, and so
    copy, every page the server's imports left, several times a run's own cost.
    """
    threading._shutdown()  # type: ignore[attr-defined]  # joins non-daemon threads
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()


def main() -> None:
    """Preload, serve; in each run's process, become the CLI and exit with its status."""
    _preload()
    request, fds = _serve(sys.argv[1])
    _become_the_cli(request, fds)


if __name__ == "__main__":
    main()
