"""The toolchains a fingerprint names: ``nvcc``, Triton's ``ptxas`` and the C compiler.

The ``nvcc`` asked is the one the JIT libraries run (:func:`nvcc_path`), not
merely the first on ``PATH``. Each answers ``--version``; :class:`Tool` starts
one now and reads it later, so several run side by side while the probe does
the rest, without the :mod:`subprocess` module (it costs part of every pod start).
"""

from __future__ import annotations

import os
import select
import time

from artifactd.constants import CUDA_HOME, CUDA_PATH, PATH, current_environ

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from artifactd.fingerprint.probecache import ProbeCache

#: Seconds a ``tool --version`` may take before it counts as failed.
TOOL_TIMEOUT_S = 10.0
#: Where the JIT libraries look for the CUDA toolkit when nothing names one.
DEFAULT_CUDA_HOME = "/usr/local/cuda"
#: The probe cache's kind for a tool's ``--version`` output (:class:`Version`).
VERSION_KIND = "version"


def nvcc_path(environ: Mapping[str, str] | None = None) -> str:
    """Return the ``nvcc`` the JIT libraries run, found the way they find it.

    tvm-ffi, TileLang 0.1.x, SGLang 0.5.23's JIT (``toolchain.cuda_home``),
    FlashInfer and DeepGEMM (through torch's ``cpp_extension.CUDA_HOME``) all
    take ``$CUDA_HOME``, else ``$CUDA_PATH`` (an empty value is unset), else the
    toolkit of the ``nvcc`` on ``PATH``, else ``/usr/local/cuda``; SGLang and
    DeepGEMM run ``<that>/bin/nvcc --version`` at every start and key their
    caches on it. A pod image whose ``CUDA_HOME`` names another toolkit than
    its ``PATH`` compiles with the former, so the fingerprint's ``cuda.nvcc``
    asks the same binary. The one owner of that rule: the probe, and any family
    or tool that needs the JIT's nvcc, call this.
    """
    environ = current_environ() if environ is None else environ
    home = environ.get(CUDA_HOME) or environ.get(CUDA_PATH)
    if home:
        return os.path.join(home, "bin", "nvcc")
    found = _on_path("nvcc", environ.get(PATH, os.defpath))
    return found or os.path.join(DEFAULT_CUDA_HOME, "bin", "nvcc")


def compiler_identity(
    program: str, version_output: str | None, path: str | None = None
) -> str | None:
    """Return the first line of the C compiler's ``--version``, its leading name resolved.

    GCC starts it with the name it was invoked by: ``cc`` and ``gcc``, one binary
    through symlinks, must not be two keys (nor miss a pod spelling ``$CC`` otherwise).
    """
    line = version_output.splitlines()[0].strip() if version_output else None
    first, _, rest = (line or "").partition(" ")
    if line is None or first != os.path.basename(program):
        return line
    found = program if "/" in program else _on_path(program, path)
    return f"{os.path.basename(os.path.realpath(found)) if found else first} {rest}".strip()


def _on_path(program: str, path: str | None) -> str | None:
    """Return where ``program`` is on ``path`` (default ``$PATH``), as a shell finds it."""
    for entry in (current_environ().get(PATH, "") if path is None else path).split(os.pathsep):
        candidate = os.path.join(entry or ".", program)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


class Tool:
    """A ``tool --version`` started now and read later, so several run side by side.

    Spawned from the calling thread with ``posix_spawn``: a thread per tool
    would cost more to start than the tool takes to answer, and the
    :mod:`subprocess` module alone (with ``locale``, ``signal`` and
    ``selectors``) costs about 3.5 ms of every pod start. stdin and stderr are
    ``/dev/null``; stdout is read through a pipe until the tool closes it or
    the deadline passes (then the tool is killed).
    """

    def __init__(self, argv: list[str]) -> None:
        self._deadline = time.monotonic() + TOOL_TIMEOUT_S
        self._pid: int | None = None
        read, write = os.pipe()
        devnull = (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)
        try:
            self._pid = os.posix_spawnp(
                argv[0],
                argv,
                current_environ(),
                file_actions=[
                    devnull,
                    (os.POSIX_SPAWN_DUP2, write, 1),
                    (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
                    (os.POSIX_SPAWN_CLOSE, read),
                    (os.POSIX_SPAWN_CLOSE, write),
                ],
            )
        except OSError:
            os.close(read)
            read = -1
        os.close(write)
        self._read = read

    def output(self) -> str | None:
        """Wait for the tool; its stdout when it exits 0, else None (missing, failed, too slow)."""
        if self._pid is None:
            return None

        chunks: list[bytes] = []
        try:
            while True:
                left = self._deadline - time.monotonic()
                if left <= 0 or not select.select([self._read], [], [], left)[0]:
                    os.kill(self._pid, 9)  # SIGKILL, without importing signal
                    os.waitpid(self._pid, 0)
                    return None
                chunk = os.read(self._read, 65536)
                if not chunk:
                    break
                chunks.append(chunk)
        finally:
            os.close(self._read)
        _, status = os.waitpid(self._pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            return None
        return b"".join(chunks).decode("utf-8", "replace")


#: The names the C compiler's own binary has (``gcc``, ``x86_64-linux-gnu-gcc-12``,
#: ``clang-16``, ``cc``): one of them is a ``-``-separated part of its file name.
COMPILER_NAMES = ("gcc", "clang", "cc")


class Version:
    """``program --version``: from the probe cache while the binary is the same file, else run.

    The ``--version`` text of ``nvcc``, ``ptxas`` and a C compiler's driver
    is built into their binaries, so the probe cache
    (:mod:`artifactd.fingerprint.probecache`) keeps it by the identity of the
    file run (the one ``PATH`` finds, symlinks followed), as it keeps a
    ``RECORD``'s digest: a warm pod start spawns none of them. Kept only when
    that file is the tool itself: an ELF executable with one of ``names`` as
    a ``-``-separated part of its name. A script (``exec
    /usr/local/cuda-13.0/bin/nvcc "$@"``) or a wrapper named otherwise
    (``ccache``, ``sccache``, ``distcc`` as ``cc``) answers with another
    binary's text, whose identity the cache would not see: it runs every
    time, as does a program that cannot be found or read. A binary replaced,
    rebuilt or touched is a new identity and runs again; a failed or too
    slow run is never kept.
    """

    def __init__(self, program: str, cache: ProbeCache, names: tuple[str, ...]) -> None:
        self._cache = cache
        found = program if "/" in program else _on_path(program, None)
        self._binary = found if found is not None and _is_own_binary(found, names) else None
        self._kept: str | None = None
        self._seen: os.stat_result | None = None
        if self._binary is not None:
            self._kept, self._seen = cache.lookup(self._binary, kind=VERSION_KIND)
        self._tool = Tool([program, "--version"]) if self._kept is None else None

    @property
    def ran(self) -> bool:
        """Whether the tool was started (the cache did not keep its answer)."""
        return self._tool is not None

    def output(self) -> str | None:
        """Return the tool's stdout when it exited 0, else None (kept in the cache if it ran)."""
        if self._tool is None:
            return self._kept
        out = self._tool.output()
        if self._binary is not None and self._seen is not None:
            self._cache.remember(self._binary, self._seen, out, kind=VERSION_KIND)
        return out


def _is_own_binary(path: str, names: tuple[str, ...]) -> bool:
    """Whether ``path`` (symlinks followed) is an ELF file with one of ``names`` in its name."""
    real = os.path.realpath(path)
    if not any(part in names for part in os.path.basename(real).split("-")):
        return False
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return os.read(fd, 4) == b"\x7fELF"
    except OSError:
        return False
    finally:
        os.close(fd)


def run_version(argv: list[str]) -> str | None:
    """Run ``tool --version``; None when the tool is missing or fails."""
    return Tool(argv).output()


def cuda_release(text: str | None) -> str | None:
    """Extract ``13.0.88`` from nvcc's or ptxas's ``--version`` text.

    The first ``release <digits and dots>, V<digits and dots>`` in the text
    (``Cuda compilation tools, release 13.0, V13.0.88``) gives what follows
    the ``V``; digits are decimal digits, as Unicode counts them.
    """
    if not text:
        return None
    at = text.find("release ")
    while at != -1:
        end = _number_end(text, at + len("release "))
        if end > at + len("release ") and text.startswith(", V", end):
            start = end + len(", V")
            stop = _number_end(text, start)
            if stop > start:
                return text[start:stop]
        at = text.find("release ", at + 1)
    return None


def _number_end(text: str, start: int) -> int:
    """Where the run of digits and dots from ``start`` ends."""
    end = start
    while end < len(text) and (text[end] == "." or text[end].isdecimal()):
        end += 1
    return end
