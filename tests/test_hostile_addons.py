"""Observability add-ons never block or fail what they observe, and touch only regular files.

The engine log (``exec --engine-log``), the metrics textfile (``restore``,
``status`` and ``gc --metrics-file``) and what ``status --engine-log`` reads
(the compile evidence and the start's phases) are add-ons. One rule holds for
each of them: a FIFO, a device (``/dev/full``), a directory or a symlink at
the path, a full disk or an unwritable path is one warning, the command runs
as it would have without the add-on (the engine starts; its exit status is
the container's), and nothing but a regular file is ever written, replaced
or followed. And a log is read bounded: up to its size when opened and a cap,
each line cut at a cap, constant work per line, so a log still growing, one
256 MiB line or 100,000 distinct cache dirs cost seconds and little memory.

Each case is a real file, a real FIFO, a real device node, a real full tmpfs,
and the real command in a subprocess with a generous time ceiling (it proves
"does not hang", not a speed).
"""

from __future__ import annotations

import io
import json
import os
import shlex
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cachetrees import make_vllm_tree
from conftest import (
    PEAK_PRELUDE,
    PYTHON,
    clean_env,
    peak_kib,
    run_artifactd,
    run_artifactd_json,
    tmpfs,
)
from diskfaults import fill
from hypothesis import given
from hypothesis import strategies as st

from artifactd.fsutil import read_lines
from artifactd.pod.enginelogs import MAX_DIRS
from artifactd.pod.phases import MAX_READ_LINE
from artifactd.stores.layout import LayoutStore

#: Seconds a command may take here: each answers at once, or in a few seconds of reading.
QUICK = 60
#: The engine's own exit status, which must reach the container through the wrapper.
ENGINE_EXIT = 7
#: Peak memory (KiB) of a ``status`` that reads a log: the interpreter and its
#: modules, a chunk and a line (33 MiB here); a 256 MiB line read whole took 4.8 GiB.
SMALL_PEAK_KIB = 100 << 10
#: The kinds of hostile path every add-on output is tried with.
NOT_REGULAR = ["fifo", "fifo-with-reader", "device", "symlink", "directory"]


def _ok(proc: subprocess.CompletedProcess[str]) -> None:
    """Nothing a user sees is a crash: no traceback, no internal error."""
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "internal error" not in proc.stderr, proc.stderr[-3000:]


def _json(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    def no_constant(name: str) -> None:
        raise AssertionError(f"{name} in a JSON report")

    doc: dict[str, Any] = json.loads(
        proc.stdout.strip().splitlines()[-1], parse_constant=no_constant
    )
    return doc


# --------------------------------------------------------------------------
# Hostile output paths, shared by every add-on
# --------------------------------------------------------------------------


class Hostile:
    """A path that is no regular file, made real, and what must still be there after."""

    def __init__(self, tmp: Path, kind: str) -> None:
        self.kind = kind
        self.path = tmp / f"addon-{kind}"
        self.precious = tmp / "precious.txt"
        self.precious.write_text("not yours\n")
        self._reader: int | None = None
        if kind in ("fifo", "fifo-with-reader"):
            os.mkfifo(self.path)
            if kind == "fifo-with-reader":  # someone reads it: a non-blocking open succeeds
                self._reader = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        elif kind == "device":  # /dev/full's own node, made here so no test touches /dev
            try:
                os.mknod(self.path, stat.S_IFCHR | 0o666, os.makedev(1, 7))
            except PermissionError:
                pytest.skip("making a device node needs root (CAP_MKNOD)")
        elif kind == "symlink":
            self.path.symlink_to(self.precious)
        elif kind == "directory":
            self.path.mkdir()
        self.mode = os.lstat(self.path).st_mode

    def close(self) -> None:
        if self._reader is not None:
            os.close(self._reader)
            self._reader = None

    def assert_untouched(self) -> None:
        """The path is what it was (never replaced), and what a symlink names is unchanged."""
        st = os.lstat(self.path)
        assert stat.S_IFMT(st.st_mode) == stat.S_IFMT(self.mode), self.kind
        assert self.precious.read_text() == "not yours\n", "the symlink was followed"
        if self.kind == "directory":
            assert list(self.path.iterdir()) == []


@pytest.fixture(params=NOT_REGULAR)
def hostile(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Hostile]:
    made = Hostile(tmp_path, request.param)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A real tmpfs, filled to ENOSPC; skipped where mounting is not permitted."""
    with tmpfs(tmp_path / "full", "1m") as mount:
        fill(mount / "filler")
        yield mount


def _engine(tmp_path: Path, log: Path) -> subprocess.CompletedProcess[str]:
    """``exec --engine-log LOG`` an engine that leaves a marker, prints and exits 7."""
    (tmp_path / "artifactd.env").write_text("")
    marker = tmp_path / "engine-ran"
    script = (
        f"echo engine-ran > {shlex.quote(str(marker))}; echo engine-out; echo engine-err >&2; "
        f"exit {ENGINE_EXIT}"
    )
    proc = run_artifactd(
        "exec", "--target", str(tmp_path), "--engine-log", str(log), "--", "sh", "-c", script,
        timeout=QUICK,
    )  # fmt: skip
    _ok(proc)
    assert proc.returncode == ENGINE_EXIT, proc.stderr
    assert marker.read_text() == "engine-ran\n", "the engine did not run"
    assert proc.stdout == "engine-out\n"
    assert "engine-err" in proc.stderr
    return proc


def _warned_once(proc: subprocess.CompletedProcess[str], path: Path, what: str) -> None:
    warnings = [line for line in proc.stderr.splitlines() if "warning:" in line]
    assert len(warnings) == 1, proc.stderr
    assert what in warnings[0] and str(path) in warnings[0], warnings


def test_an_engine_log_that_is_no_regular_file_is_a_warning_and_the_engine_runs(
    tmp_path: Path, hostile: Hostile
) -> None:
    """A FIFO hung open(), /dev/full was exit 1 with no engine, a symlink was appended to."""
    proc = _engine(tmp_path, hostile.path)
    _warned_once(proc, hostile.path, "engine log")
    assert "runs without it" in proc.stderr
    hostile.assert_untouched()


def test_dev_full_as_the_engine_log_is_a_warning_and_the_engine_runs(tmp_path: Path) -> None:
    proc = _engine(tmp_path, Path("/dev/full"))
    _warned_once(proc, Path("/dev/full"), "engine log")


def test_an_engine_log_on_a_full_disk_is_a_warning_and_the_engine_runs(
    tmp_path: Path, full_disk: Path
) -> None:
    log = full_disk / "engine.log"
    proc = _engine(tmp_path, log)
    _warned_once(proc, log, "cannot write the engine log")
    assert "No space left on device" in proc.stderr


def _metrics_writers(tmp_path: Path, path: Path) -> dict[str, subprocess.CompletedProcess[str]]:
    """Every command with ``--metrics-file``, run with ``path``: restore (a miss), status, gc."""
    node = LayoutStore(tmp_path / "node", create=True)
    missing = f"oci:{tmp_path / 'no-store'}"
    target = str(tmp_path / "target")
    metrics = ("--metrics-file", str(path))
    return {
        "restore": run_artifactd(
            "restore",
            "--target",
            target,
            "--store",
            missing,
            "--gpu-arch",
            "sm_90a",
            *metrics,
            "--json",
            timeout=QUICK,
        ),
        "status": run_artifactd("status", "--target", target, *metrics, "--json", timeout=QUICK),
        "gc": run_artifactd(
            "gc",
            "--store",
            f"oci:{node.root}",
            "--max-bytes",
            "1G",
            "--apply",
            *metrics,
            "--json",
            timeout=QUICK,
        ),
    }


def _metrics_refused(runs: dict[str, subprocess.CompletedProcess[str]], path: Path) -> None:
    for command, proc in runs.items():
        _ok(proc)
        assert proc.returncode == 0, (command, proc.stderr)  # a restore miss is exit 0 too
        _json(proc)  # the command's own report, whole
        _warned_once(proc, path, "metrics")


def test_a_metrics_file_that_is_no_regular_file_is_left_alone_and_warned_about(
    tmp_path: Path, hostile: Hostile
) -> None:
    """A directory was exit 10 for status and gc; a FIFO, a device, a symlink were replaced."""
    _metrics_refused(_metrics_writers(tmp_path, hostile.path), hostile.path)
    hostile.assert_untouched()


def test_a_metrics_file_on_a_full_disk_is_a_warning(tmp_path: Path, full_disk: Path) -> None:
    path = full_disk / "artifactd.prom"
    _metrics_refused(_metrics_writers(tmp_path, path), path)
    assert not path.exists()
    assert [p.name for p in full_disk.iterdir()] == ["filler"], "a temp file was left"


# --------------------------------------------------------------------------
# Reading an engine log: bounded bytes, lines, work per line
# --------------------------------------------------------------------------


def _vllm(message: str) -> str:
    return f"(EngineCore_DP0 pid=3021) INFO 09-23 18:12:27 [backends.py:539] {message}\n"


HIT = _vllm("Directly load the compiled graph(s) for shape 1 from the cache, took 0.648 s")
MISS = _vllm("Compiling a graph for shape 1 takes 20.50 s")


def _fd_of(pid: int, path: Path) -> int | None:
    """The descriptor ``pid`` holds ``path`` open on, or None."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == os.path.realpath(path):
                return int(fd)
        except OSError:
            continue
    return None


def _read_position(pid: int, fd: int) -> int | None:
    try:
        info = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
    except OSError:
        return None
    return int(next(line.split()[1] for line in info.splitlines() if line.startswith("pos:")))


def test_a_log_still_growing_is_read_up_to_its_size_when_opened(tmp_path: Path) -> None:
    """An engine writing as fast as status reads kept status reading for ever.

    The log holds hits; whenever status's read position comes within 1 MiB of
    the end, 1 MiB of misses is appended (up to 16 MiB): status must end and
    count the hits alone.
    """
    log = tmp_path / "engine.log"
    log.write_text(HIT * 30_000)
    hits = 30_000
    argv = [PYTHON, "-m", "artifactd", "status", "--target", str(tmp_path / "t"), "--json"]
    proc = subprocess.Popen(
        [*argv, "--engine-log", str(log)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    block = (MISS * ((1 << 20) // len(MISS))).encode()
    appended = 0
    deadline = time.monotonic() + QUICK
    try:
        fd = None
        with log.open("ab") as out:
            while proc.poll() is None and appended < 16 << 20 and time.monotonic() < deadline:
                fd = fd if fd is not None else _fd_of(proc.pid, log)
                pos = None if fd is None else _read_position(proc.pid, fd)
                if pos is not None and log.stat().st_size - pos < 1 << 20:
                    out.write(block)
                    out.flush()
                    appended += len(block)
                else:
                    time.sleep(0.005)  # polling the reader's position, not waiting for time
        stdout, stderr = proc.communicate(timeout=QUICK)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr
    doc = json.loads(stdout)
    vllm = next(f for f in doc["families"] if f["family"] == "vllm")["engine"]
    assert (vllm["hits"], vllm["misses"]) == (hits, 0), f"appended {appended} bytes were read"


def _status_peak(target: Path, log: Path) -> subprocess.CompletedProcess[str]:
    return run_artifactd(
        "status", "--target", str(target), "--engine-log", str(log), "--json",
        prelude=PEAK_PRELUDE, timeout=QUICK,
    )  # fmt: skip


def test_a_256_mib_line_is_read_in_bounded_memory_and_time(tmp_path: Path) -> None:
    """One 256 MiB line took 193 s and 554 MiB: now its first MAX_READ_LINE bytes are read."""
    log = tmp_path / "engine.log"
    with log.open("wb") as f:
        f.write(HIT.encode())
        f.write(b"Using cache directory: /x")
        f.truncate(f.tell() + (256 << 20))  # sparse: a quarter GiB of one line, no disk
        f.seek(0, os.SEEK_END)
        f.write(b" for vLLM's torch.compile\n")
    started = time.monotonic()
    proc = _status_peak(tmp_path / "t", log)
    _ok(proc)
    assert proc.returncode == 0, proc.stderr
    doc = _json(proc)
    assert doc["engine_log_error"] is None
    vllm = next(f for f in doc["families"] if f["family"] == "vllm")["engine"]
    assert vllm["hits"] == 1, vllm  # the lines before it are read as ever
    assert peak_kib(proc) < SMALL_PEAK_KIB, "the line was held whole"
    assert time.monotonic() - started < QUICK


def _vllm_target(tmp_path: Path) -> Path:
    """A vLLM cache harvested and restored into ``tmp_path/cache`` (status has a marker)."""
    build = make_vllm_tree(tmp_path / "build" / "vllm")
    store, target = f"oci:{tmp_path / 'store'}", tmp_path / "cache"
    env = clean_env({"VLLM_CACHE_ROOT": str(build), "HOME": str(tmp_path)})
    harvest = ("harvest", "--store", store, "--family", "vllm", "--gpu-arch", "sm_90a")
    run_artifactd_json(*harvest, env=env)
    restore = ("restore", "--store", store, "--target", str(target), "--gpu-arch", "sm_90a")
    assert run_artifactd_json(*restore)["restored"] == ["vllm"]
    return target


def test_100000_distinct_cache_dirs_finish_fast_and_are_capped(tmp_path: Path) -> None:
    """100,000 dirs took over 5 minutes: a list scanned per line, the factors re-read per dir."""
    target = _vllm_target(tmp_path)
    root = target / "vllm" / "torch_compile_cache"
    log = tmp_path / "engine.log"
    with log.open("w") as f:
        for i in range(100_000):
            f.write(
                _vllm(f"Using cache directory: {root}/h{i:06d}/rank_0_0 for vLLM's torch.compile")
            )
        f.write(MISS)
    started = time.monotonic()
    proc = _status_peak(target, log)
    _ok(proc)
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - started < QUICK
    vllm = next(f for f in _json(proc)["families"] if f["family"] == "vllm")
    assert vllm["verdict"] == "compiled anyway"  # the line after them is still read

    engine = vllm["engine"]
    assert len(engine["cache_dirs"]) == MAX_DIRS
    assert engine["cache_dirs"][0] == f"{root}/h000000/rank_0_0"  # the first ones, in order
    assert len(engine["other_dirs"]) == MAX_DIRS
    assert peak_kib(proc) < SMALL_PEAK_KIB


def test_a_factors_file_that_is_a_fifo_does_not_hang_status(tmp_path: Path) -> None:
    """status names the differing hash factors from vLLM's file: a FIFO there hung it."""
    target = _vllm_target(tmp_path)
    new = target / "vllm" / "torch_compile_cache" / "0f8b20bdea" / "rank_0_0" / "backbone"
    new.mkdir(parents=True)
    os.mkfifo(new / "cache_key_factors.json")
    log = tmp_path / "engine.log"
    log.write_text(_vllm(f"Using cache directory: {new} for vLLM's torch.compile") + MISS)
    proc = run_artifactd(
        "status", "--target", str(target), "--engine-log", str(log), "--json", timeout=QUICK
    )
    _ok(proc)
    assert proc.returncode == 0, proc.stderr
    engine = next(f for f in _json(proc)["families"] if f["family"] == "vllm")["engine"]
    [other] = engine["other_dirs"]
    assert other["path"] == str(new) and other["factors"] == []


#: Lines that cost a regex with a lazy ``.+?`` seconds each (every head tried to the
#: end of the line), or crashed the reader: 30,000 brackets, a 6,000-digit count, a
#: duration of ``1.2.3``, a stamp and a duration past a float.
HOSTILE_LINES = [
    *(
        head * (60_000 // len(head))
        for head in (
            "Using cache directory: ",
            "Directly load the compiled graph(s) for ",
            "Compiling a graph for ",
            "Cannot load aot compilation from path ",
            "Compiling model again due to a load failure from ",
            "Capturing CUDA graphs (x): 100%|",
            "Capturing CUDA graphs (",
        )
        for _ in range(8)
    ),
    '{"inductor": ' + "[" * 30_000 + "}",
    "{'fxgraph_cache_hit': " + "9" * 6_000 + "}",
    "Capturing CUDA graphs (mixed): 100%|####| " + "9" * 6_000 + "/" + "9" * 6_000 + " [00:05]",
    "Model loading took 1.0 GiB and 1.2.3 seconds",
    "artifactd-exec " + "9" * 400 + " | Application startup complete.",
    "Graph capturing finished in " + "9" * 400 + " secs",
    "torch.compile takes " + "9" * 400 + " s in total",
]


def test_hostile_lines_cost_linear_time_and_never_crash_the_reader(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text(HIT + "".join(line + "\n" for line in HOSTILE_LINES) + MISS)
    started = time.monotonic()
    proc = run_artifactd(
        "status", "--target", str(tmp_path / "t"), "--engine-log", str(log), "--json",
        timeout=QUICK,
    )  # fmt: skip
    _ok(proc)
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - started < QUICK
    doc = _json(proc)  # no Infinity, no NaN
    assert doc["engine_log_error"] is None
    vllm = next(f for f in doc["families"] if f["family"] == "vllm")["engine"]
    assert (vllm["hits"], vllm["misses"]) == (1, 1), vllm  # the lines around them still count
    assert all(p["seconds"] is None or p["seconds"] < 1e10 for p in doc["phases"]), doc["phases"]


# --------------------------------------------------------------------------
# The bounded line reader itself
# --------------------------------------------------------------------------


@given(
    st.lists(st.binary(max_size=40).filter(lambda b: b"\n" not in b), max_size=30),
    st.integers(1, 16),
    st.integers(1, 50),
    st.booleans(),
)
def test_read_lines_yields_each_line_cut_at_the_cap(
    lines: list[bytes], cap: int, chunk: int, trailing_newline: bool
) -> None:
    data = b"\n".join(lines) + (b"\n" if trailing_newline else b"")
    got = list(read_lines(io.BytesIO(data), max_bytes=len(data), max_line=cap, chunk=chunk))
    want = data.split(b"\n")
    if want[-1] == b"":
        want.pop()  # a final newline ends the last line; it does not start one
    assert got == [line[:cap] for line in want]


def test_read_lines_stops_at_its_budget_whatever_follows() -> None:
    data = b"a\nbb\nccc\n" + b"x" * 1000
    assert list(read_lines(io.BytesIO(data), max_bytes=6, max_line=8)) == [b"a", b"bb", b"c"]
    assert MAX_READ_LINE > 65536  # a piece exec writes, and its stamp, are read whole
