"""The CLI fork server (tests/forkserver.py) runs what a new interpreter runs.

Most CLI runs in this suite are forks of one pre-imported Python. These tests
hold a forked run to a new interpreter's on the same command lines, and check
what the fork must carry over (environment, working directory, umask, stdio,
exit status, a timeout) and when a run gets a new interpreter instead.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import PYTHON, REPO, clean_env, fork_server, run_artifactd
from forkserver import ForkServer, needs_new_interpreter


@pytest.fixture
def server() -> ForkServer:
    """The session's fork server (the suite may run with ARTIFACTD_TEST_FORK=0)."""
    found = fork_server()
    if found is None:
        pytest.skip("ARTIFACTD_TEST_FORK=0: every run starts a new interpreter")
    return found


def new_interpreter(
    args: list[str], env: dict[str, str], cwd: Path
) -> subprocess.CompletedProcess[str]:
    """``python -m artifactd ARGS`` in a new interpreter, as runs were before the server."""
    return subprocess.run(
        [PYTHON, "-m", "artifactd", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["restore", "--help"],
        ["fingerprint", "--hash", "--gpu-arch", "sm_90a"],
        ["restore", "--target", "{tmp}/pod", "--store", "oci:{tmp}/none", "--gpu-arch", "sm_90a"],
        ["ls", "oci:{tmp}/none", "--json"],
        ["restore", "--no-such-flag"],
        ["no-such-command"],
    ],
    ids=["help", "restore-help", "fingerprint", "miss", "ls-missing", "bad-flag", "bad-command"],
)
def test_a_forked_run_prints_and_exits_as_a_new_interpreter_does(
    server: ForkServer, tmp_path: Path, args: list[str]
) -> None:
    argv = [a.format(tmp=tmp_path) for a in args]
    env = clean_env()
    forked = server.run(argv, env=env, cwd=tmp_path, timeout=120)
    fresh = new_interpreter(argv, env, tmp_path)
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        fresh.returncode,
        fresh.stdout,
        fresh.stderr,
    )
    assert "Traceback" not in forked.stderr


def test_the_run_has_its_own_environment_cwd_umask_and_stdin(
    server: ForkServer, tmp_path: Path
) -> None:
    # `exec` replaces the forked run with a shell: what the shell sees is what
    # the CLI's own children inherit.
    script = 'printf "%s|%s|%s|" "$FORK_PROBE" "$(pwd)" "$(umask)"; cat; echo "|${HOME:-unset}"'
    env = clean_env({"FORK_PROBE": "one"})
    env.pop("HOME", None)
    old = os.umask(0o027)
    try:
        proc = server.run(
            ["exec", "--target", str(tmp_path), "--", "sh", "-c", script],
            env=env,
            cwd=tmp_path,
            timeout=60,
        )
    finally:
        os.umask(old)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"one|{tmp_path}|0027||unset\n"


def test_exit_status_and_a_signal_come_back_as_subprocess_reports_them(
    server: ForkServer, tmp_path: Path
) -> None:
    code = server.run(
        ["exec", "--target", str(tmp_path), "--", "sh", "-c", "exit 7"],
        env=clean_env(),
        cwd=tmp_path,
        timeout=60,
    )
    assert code.returncode == 7
    killed = server.run(
        ["exec", "--target", str(tmp_path), "--", "sh", "-c", "kill -TERM $$"],
        env=clean_env(),
        cwd=tmp_path,
        timeout=60,
    )
    assert killed.returncode == -15


def test_output_is_read_to_its_end_as_subprocess_run_reads_it(
    server: ForkServer, tmp_path: Path
) -> None:
    # The shell exits first; its child writes later, into the same stdout. A
    # new interpreter's run returns only when every writer closed the pipe:
    # so must a forked one (exec --engine-log's copier is such a child).
    argv = [
        "exec",
        "--target",
        str(tmp_path),
        "--",
        "sh",
        "-c",
        "(sleep 0.5; echo late) & echo early",
    ]
    forked = server.run(argv, env=clean_env(), cwd=tmp_path, timeout=60)
    fresh = new_interpreter(argv, clean_env(), tmp_path)
    assert forked.stdout == fresh.stdout == "early\nlate\n"


def test_a_run_past_its_timeout_is_killed(server: ForkServer, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    with pytest.raises(subprocess.TimeoutExpired):
        server.run(
            ["exec", "--target", str(tmp_path), "--", "sh", "-c", f"echo $$ > {pidfile}; sleep 60"],
            env=clean_env(),
            cwd=tmp_path,
            timeout=2,
        )
    # exec replaced the run with the shell: the pid it wrote is the run's.
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_interpreter_and_loader_settings_get_a_new_interpreter(server: ForkServer) -> None:
    base = dict(server.env)
    assert not needs_new_interpreter(base | {"FORK_PROBE": "x", "HOME": "/nowhere"}, base)
    for name, value in (
        ("PYTHONPATH", str(REPO / "tests")),
        ("PYTHONHASHSEED", "1"),
        ("LD_PRELOAD", "libfault.so"),
        ("LC_ALL", "C"),
        ("LANG", "C"),
    ):
        assert needs_new_interpreter(base | {name: value}, base), name
    dropped = {k: v for k, v in base.items() if k != "PYTHONPYCACHEPREFIX"}
    assert needs_new_interpreter(dropped, base)


def test_run_artifactd_sends_a_pythonpath_run_to_a_new_interpreter(tmp_path: Path) -> None:
    # A module on PYTHONPATH shadows a standard one only in a new interpreter:
    # this run can see it only if run_artifactd did not fork.
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\nsys.stderr.write('NEW-INTERPRETER\\n')\n"
    )
    proc = run_artifactd("--help", env=clean_env({"PYTHONPATH": str(tmp_path)}))
    assert proc.returncode == 0
    assert proc.stderr.startswith("NEW-INTERPRETER")
    forked = run_artifactd("--help")
    assert "NEW-INTERPRETER" not in forked.stderr
