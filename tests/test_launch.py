"""The cells' one launcher: no process a cell started outlives the cell.

Real matrices, real ``artifactd build`` runs, real shells: a command cell
whose shell leaves a ``sleep`` running in the background (a compile pool, a
worker that a GPU builder would keep holding device memory with). Whether
the cell ran past its timeout or finished, that grandchild must be gone
when ``build`` returns; the test waits for it with a bounded poll.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import signal
import time
from pathlib import Path

from conftest import REPO, run_artifactd

#: A generous ceiling for a killed process to be gone: proves "not left running".
GONE_WITHIN_S = 30.0


def _matrix(tmp: Path, script: str, timeout_s: float) -> Path:
    path = tmp / "m.yaml"
    command = "sh -c " + json.dumps(script)
    path.write_text(
        "schema_version: 1\nname: orphans\ntarget: {gpu_arch: sm_90a}\nfamilies: [generic]\n"
        f"gpus: 0\ntimeout_s: {timeout_s}\ncommand: {json.dumps(command)}\n",
        encoding="utf-8",
    )
    return path


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, or no process at all, is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] not in ("Z", "X")


def _gone(pid: int) -> bool:
    """Wait (bounded) until ``pid`` is no longer a live process; False if it still is."""
    deadline = time.monotonic() + GONE_WITHIN_S
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _orphan(pidfile: Path) -> int:
    pid = int(pidfile.read_text().strip())
    assert pid > 1
    return pid


def _kill(pid: int) -> None:
    """Clean up after a failing run: the orphan must not outlive the test either."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def test_a_command_cell_past_its_timeout_is_stopped_with_every_process_it_started(
    tmp_path: Path,
) -> None:
    pidfile = tmp_path / "grandchild.pid"
    m = _matrix(tmp_path, f"sleep 1000 & echo $! > {pidfile}; sleep 1000", timeout_s=1)
    proc = run_artifactd("build", str(m), "--store", f"oci:{tmp_path / 'store'}", timeout=120)
    pid = _orphan(pidfile)
    try:
        assert proc.returncode == 7, proc.stderr
        assert "ran past its timeout of 1 s" in proc.stderr
        assert "Traceback" not in proc.stderr
        assert _gone(pid), f"the cell's background process {pid} outlived it"
    finally:
        _kill(pid)


def test_what_a_finished_command_cell_left_running_is_stopped_before_the_harvest(
    tmp_path: Path,
) -> None:
    pidfile = tmp_path / "grandchild.pid"
    script = (
        f"sleep 1000 & echo $! > {pidfile}; "
        'mkdir -p "$ARTIFACTD_GENERIC_DIR" && printf ELF > "$ARTIFACTD_GENERIC_DIR/k.cubin"'
    )
    m = _matrix(tmp_path, script, timeout_s=60)
    proc = run_artifactd(
        "build", str(m), "--store", f"oci:{tmp_path / 'store'}", "--json", timeout=120
    )
    pid = _orphan(pidfile)
    try:
        assert proc.returncode == 0, proc.stderr
        # Its stdout held the background job's copy of the pipe: nothing waited for it.
        assert json.loads(proc.stdout.strip().splitlines()[-1])["cells"][0]["seconds"] < 30
        assert _gone(pid), f"the cell's background process {pid} outlived it"
    finally:
        _kill(pid)


def test_every_cell_process_is_started_by_the_one_launcher() -> None:
    """Only artifactd/build/launch.py starts processes in a session of their own, or Popens."""
    starters = []
    for path in sorted((REPO / "artifactd").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.keyword) and node.arg == "start_new_session":
                starters.append(f"{path.relative_to(REPO)}: start_new_session")
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "Popen":
                starters.append(f"{path.relative_to(REPO)}: Popen")
    rel = "artifactd/build/launch.py"
    # Not a cell: `exec --engine-log` and `exec --on-canary-fail cold` run the pod's
    # engine as their own child, in the pod's session, passing signals on to it (the
    # engine is the workload), through one starter (pod.exec.start).
    engine = "artifactd/pod/exec.py: Popen"
    # Not a cell either: `predict` asks the engine's own Python for vLLM's factors,
    # one bounded child (its answer capped, killed at its deadline).
    factors = "artifactd/restore/engineside.py: Popen"
    assert sorted(set(starters)) == [
        f"{rel}: Popen",
        f"{rel}: start_new_session",
        engine,
        factors,
    ], starters
