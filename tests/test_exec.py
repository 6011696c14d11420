"""``artifactd exec``: the engine's entrypoint, with the restored caches' environment.

exec replaces itself with CMD (``os.execvpe``, no shell), so CMD keeps the
process id: its exit status and the signals sent to it are the container's.
With ``--engine-log`` or ``--on-canary-fail`` it stays CMD's parent instead,
passes signals on, reaps orphans, and exits as CMD did (with a log, once
CMD's last output is through).
These tests run the real entry point as a new process each time. The real
CPU demo warm-up also runs through exec in ``test_status.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from cachetrees import make_generic_tree
from conftest import PYTHON, clean_env, run_artifactd, run_artifactd_json

from artifactd.pod.exec import Forwarder
from artifactd.restore.envfile import render_env_file


def env_target(root: Path, env: dict[str, str]) -> Path:
    """A target holding only the env file a restore would write with ``env``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "artifactd.env").write_text(render_env_file(env))
    return root


def exec_(
    target: Path, *command: str, args: tuple[str, ...] = (), env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``artifactd exec --target TARGET ARGS -- COMMAND``."""
    return run_artifactd("exec", "--target", str(target), *args, "--", *command, env=env)


PRINT_ENV = "import json, os; print(json.dumps(dict(os.environ)))"


def test_env_file_is_overlaid_on_the_environment(tmp_path: Path) -> None:
    target = env_target(
        tmp_path / "t",
        {
            "TRITON_CACHE_DIR": str(tmp_path / "t" / "triton"),
            "TMPDIR": str(tmp_path / "t" / "tmp"),
            "ODD": "a value with 'quotes' and spaces",
        },
    )
    env = clean_env({"KEPT": "from the pod", "TMPDIR": "/pod-tmp"})
    proc = exec_(target, PYTHON, "-c", PRINT_ENV, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    child = json.loads(proc.stdout)
    assert child["TRITON_CACHE_DIR"] == str(tmp_path / "t" / "triton")
    assert child["TMPDIR"] == str(tmp_path / "t" / "tmp")  # the env file wins
    assert child["ODD"] == "a value with 'quotes' and spaces"
    assert child["KEPT"] == "from the pod"


def test_exit_status_passes_through(tmp_path: Path) -> None:
    target = env_target(tmp_path / "t", {})
    proc = exec_(target, PYTHON, "-c", "import sys; sys.exit(7)")
    assert proc.returncode == 7
    assert proc.stderr == ""


def test_it_is_the_same_process_and_dies_of_the_signal_it_gets(tmp_path: Path) -> None:
    target = env_target(tmp_path / "t", {})
    child = "import os, time; print(os.getpid(), flush=True); time.sleep(120)"
    proc = subprocess.Popen(
        [PYTHON, "-m", "artifactd", "exec", "--target", str(target), "--", PYTHON, "-c", child],
        stdout=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    try:
        assert proc.stdout is not None
        assert int(proc.stdout.readline()) == proc.pid  # exec'd: no wrapper process
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == -signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_sigpipe_and_sigxfsz_are_not_left_ignored(tmp_path: Path) -> None:
    """Python ignores SIGPIPE and SIGXFSZ; an ignored signal would survive the exec."""
    target = env_target(tmp_path / "t", {})
    proc = exec_(target, "cat", "/proc/self/status")
    assert proc.returncode == 0, proc.stderr
    [line] = [ln for ln in proc.stdout.splitlines() if ln.startswith("SigIgn:")]
    ignored = int(line.split()[1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1)), line
    assert not ignored & (1 << (signal.SIGXFSZ - 1)), line


def test_a_missing_env_file_warns_and_runs(tmp_path: Path) -> None:
    proc = exec_(tmp_path / "never-restored", PYTHON, "-c", "print('ran')")
    assert proc.returncode == 0
    assert proc.stdout == "ran\n"
    [warning] = proc.stderr.splitlines()
    assert warning.startswith("artifactd: warning: no env file at ")
    assert "without restored caches" in warning
    as_json = exec_(tmp_path / "never-restored", PYTHON, "-c", "print('ran')", args=("--json",))
    assert as_json.stdout == "ran\n"
    assert json.loads(as_json.stderr)["event"] == "no_env_file"


def test_require_refuses_to_run_without_an_env_file(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    command = (PYTHON, "-c", f"open({str(marker)!r}, 'w')")
    proc = exec_(tmp_path / "never-restored", *command, args=("--require",))
    assert proc.returncode == 10
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("artifactd: error: no restored caches to run")
    assert all(line.startswith("  hint:") for line in lines[1:])
    assert not marker.exists()
    # The variable works as the flag does.
    env = clean_env({"ARTIFACTD_REQUIRE": "1", "ARTIFACTD_TARGET": str(tmp_path / "none")})
    proc = run_artifactd("exec", "--", *command, env=env)
    assert proc.returncode == 10 and not marker.exists()


def test_env_file_option_and_target_variable(tmp_path: Path) -> None:
    elsewhere = tmp_path / "conf" / "caches.env"
    elsewhere.parent.mkdir()
    elsewhere.write_text(render_env_file({"FROM_FILE": "yes"}))
    env = clean_env({"ARTIFACTD_TARGET": str(tmp_path / "t"), "ARTIFACTD_ENV_FILE": str(elsewhere)})
    proc = run_artifactd("exec", "--", PYTHON, "-c", PRINT_ENV, env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["FROM_FILE"] == "yes"


def test_command_errors_are_one_line_with_shell_exit_codes(tmp_path: Path) -> None:
    target = env_target(tmp_path / "t", {})
    missing = exec_(target, "no-such-engine-binary")
    assert missing.returncode == 127
    assert missing.stderr.startswith("artifactd: error: cannot run no-such-engine-binary")
    script = tmp_path / "engine.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    not_exec = exec_(target, str(script))
    assert not_exec.returncode == 126
    assert "Traceback" not in missing.stderr + not_exec.stderr
    nothing = run_artifactd("exec", "--target", str(target))
    assert nothing.returncode == 2 and "no command to run" in nothing.stderr
    typed = exec_(target, "true", args=("--store", "oci:x"))
    assert typed.returncode == 2 and "--store applies only to a restore" in typed.stderr


def test_options_stop_at_the_command_without_a_separator(tmp_path: Path) -> None:
    target = env_target(tmp_path / "t", {"X": "1"})
    proc = run_artifactd(
        "exec", "--target", str(target), PYTHON, "-c", "import sys; print(sys.argv[1:])", "--json"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "['--json']\n"


@pytest.fixture
def generic_store(tmp_path: Path) -> str:
    """A local store holding one harvested generic cache."""
    tree = make_generic_tree(tmp_path / "gen")
    store = f"oci:{tmp_path / 'store'}"
    env = clean_env({"HOME": str(tmp_path), "ARTIFACTD_GENERIC_DIR": str(tree)})
    run_artifactd_json("harvest", "--store", store, "--family", "generic", env=env)
    return store


def test_restore_then_exec(tmp_path: Path, generic_store: str) -> None:
    target = tmp_path / "cache"
    show = "import os; print(os.environ['ARTIFACTD_GENERIC_DIR'])"
    args = ("--restore", "--store", generic_store, "--family", "generic")
    proc = exec_(target, PYTHON, "-c", show, args=args)
    assert proc.returncode == 0, proc.stderr
    # stdout is the engine's alone; the restore's table went to stderr.
    assert proc.stdout == f"{target / 'generic'}\n"
    assert "restored 1 families" in proc.stderr
    assert (target / ".artifactd" / "restored.json").exists()
    # Again: the restore is a no-op, still one process.
    again = exec_(target, PYTHON, "-c", show, args=(*args, "--json"))
    assert again.stdout == f"{target / 'generic'}\n"
    assert json.loads(again.stderr.strip().splitlines()[-1])["noop"] is True


def test_restore_variables_and_a_required_miss(tmp_path: Path, generic_store: str) -> None:
    target = tmp_path / "cache"
    ran = tmp_path / "ran"
    command = (PYTHON, "-c", f"open({str(ran)!r}, 'w')")
    env = clean_env(
        {
            "ARTIFACTD_EXEC_RESTORE": "1",
            "ARTIFACTD_STORE": generic_store,
            "ARTIFACTD_FAMILIES": "generic",
            "ARTIFACTD_SET": "gpu.arch=sm_70",  # no artifact for this fingerprint
            "ARTIFACTD_REQUIRE": "1",
        }
    )
    proc = run_artifactd("exec", "--target", str(target), "--", *command, env=env)
    assert proc.returncode == 6, proc.stderr
    assert not ran.exists()
    # Without --require the miss is fail-open: a warning, and the engine starts.
    del env["ARTIFACTD_REQUIRE"]
    proc = run_artifactd("exec", "--target", str(target), "--", *command, env=env)
    assert proc.returncode == 0, proc.stderr
    assert ran.exists()
    assert "artifactd: warning: no env file" in proc.stderr


def test_exec_is_listed_and_teaches_by_example() -> None:
    proc = run_artifactd("exec", "--help")
    assert proc.returncode == 0
    assert "artifactd exec --target /cache -- vllm serve" in proc.stdout
    assert "--restore" in proc.stdout and "ARTIFACTD_EXEC_RESTORE" in proc.stdout


# --------------------------------------------------------------------------
# --engine-log: exec stays the engine's parent
# --------------------------------------------------------------------------

#: An engine that writes a burst and ends at once, as a crash does: 20,000 lines,
#: then END, then ``_exit`` without a flush or a goodbye.
BURST = (
    "import os\n"
    "data = b''.join(b'line %06d ' % i + b'x' * 40 + b'\\n' for i in range(20000)) + b'END\\n'\n"
    "view = memoryview(data)\n"
    "while view:\n"
    "    view = view[os.write(1, view):]\n"
    "os._exit(3)\n"
)


def _pid_namespace() -> list[str]:
    """``unshare`` as a new PID namespace's first process, or skip where it may not be made."""
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", "echo $$"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0 or probe.stdout.strip() != "1":
        pytest.skip(f"cannot make a PID namespace here (unshare: {probe.stderr.strip()[:200]})")
    return ["unshare", "--pid", "--fork", "--mount-proc"]


def test_an_engine_log_keeps_a_crashing_engines_last_lines_as_a_containers_first_process(
    tmp_path: Path,
) -> None:
    """As a pod's main process (PID 1), exec used to lose what its copier had not passed on.

    When a PID namespace's first process exits, the kernel ends every other
    process in it. The copier was forked beside the engine, which exec'd into
    PID 1: the engine's last lines (here about 1,400 of them and END) never
    reached the container's log nor the engine log.
    """
    target = env_target(tmp_path / "t", {})
    log = tmp_path / "engine.log"
    argv = [PYTHON, "-m", "artifactd", "exec", "--target", str(target), "--engine-log", str(log)]
    proc = subprocess.run(
        [*_pid_namespace(), *argv, "--", PYTHON, "-c", BURST],
        capture_output=True,
        text=True,
        env=clean_env(),
        check=False,
    )
    assert proc.returncode == 3, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 20_001 and lines[-1] == "END", (len(lines), lines[-1:])
    logged = log.read_text().splitlines()
    assert len(logged) == 1 + 20_001 and logged[-1].endswith("| END"), logged[-1:]


#: The two ways exec stays the engine's parent, as options after ``exec --target T``
#: (the name is the test's id): one owner (``pod.exec.Forwarder`` and
#: ``wait_reaping``) does the signals and the reaping for both. The engine URL
#: is never asked: the targets here hold no canary.
PARENTS = {
    "engine-log": lambda tmp: ["--engine-log", str(tmp / "engine.log")],
    "on-canary-fail": lambda tmp: [
        "--on-canary-fail",
        "cold",
        "--engine-url",
        "http://127.0.0.1:9",
    ],
}


@pytest.mark.parametrize("parent", sorted(PARENTS))
def test_as_the_engines_parent_exec_passes_signals_on_and_ends_as_the_engine_did(
    tmp_path: Path, parent: str
) -> None:
    """SIGHUP and SIGUSR1 too: ``--on-canary-fail`` passed on SIGTERM and SIGINT only
    (a SIGHUP ended exec and left the engine running), and exited 128 + N
    where the engine died of signal N."""
    target = env_target(tmp_path / "t", {})
    argv = [PYTHON, "-m", "artifactd", "exec", "--target", str(target)]
    argv += [*PARENTS[parent](tmp_path), "--"]
    waits = (
        "import os, signal, sys\n"
        "def got(n, f):\n"
        "    print('got', n, os.getppid(), flush=True)\n"
        "    if n != signal.SIGUSR1:\n"
        "        sys.exit(0)\n"
        "for n in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):\n"
        "    signal.signal(n, got)\n"
        "signal.alarm(120)  # a signal not passed on fails the test; it never hangs\n"
        "print('ready', flush=True)\n"
        "while True:\n"
        "    signal.pause()\n"
    )
    for sent in (signal.SIGTERM, signal.SIGHUP):
        proc = subprocess.Popen(
            [*argv, PYTHON, "-c", waits],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=clean_env(),
        )
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline() == "ready\n"  # its handlers are in place
            proc.send_signal(signal.SIGUSR1)  # passed on; the engine goes on
            assert proc.stdout.readline() == f"got {int(signal.SIGUSR1)} {proc.pid}\n"
            proc.send_signal(sent)
            assert proc.stdout.read() == f"got {int(sent)} {proc.pid}\n"  # exec is its parent
            assert proc.wait(timeout=60) == 0
        finally:
            proc.kill()
            proc.wait()
    # An engine that dies of a signal: exec dies of it too, as with a plain exec.
    killed = subprocess.run(
        [*argv, PYTHON, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"],
        capture_output=True,
        env=clean_env(),
        check=False,
    )
    assert killed.returncode == -signal.SIGTERM, killed.stderr
    missing = subprocess.run(
        [*argv, "no-such-engine-binary"], capture_output=True, text=True, env=clean_env()
    )
    assert missing.returncode == 127
    assert "artifactd: error: cannot run no-such-engine-binary" in missing.stderr


#: An engine whose child leaves a grandchild behind: the grandchild is
#: orphaned, ends, and is a zombie until the namespace's first process reaps
#: it. Prints ``reaped`` once its /proc entry is gone, ``zombie`` if it
#: is still there after a minute.
ORPHAN = """\
import os, sys, time
r, w = os.pipe()
if os.fork() == 0:
    if os.fork() == 0:
        os.write(w, str(os.getpid()).encode())
        os._exit(0)
    os._exit(0)
os.close(w)
os.wait()
orphan = int(os.read(r, 64))
deadline = time.monotonic() + 60
while os.path.exists(f"/proc/{orphan}"):
    if time.monotonic() > deadline:
        print("zombie", flush=True)
        sys.exit(1)
    time.sleep(0.01)
print("reaped", flush=True)
"""


@pytest.mark.parametrize("parent", sorted(PARENTS))
def test_as_a_containers_first_process_exec_reaps_the_orphans_it_adopts(
    tmp_path: Path, parent: str
) -> None:
    """``--on-canary-fail`` waited for its engine only: every orphan stayed a zombie."""
    target = env_target(tmp_path / "t", {})
    argv = [PYTHON, "-m", "artifactd", "exec", "--target", str(target)]
    argv += [*PARENTS[parent](tmp_path), "--", PYTHON, "-c", ORPHAN]
    proc = subprocess.run(
        [*_pid_namespace(), *argv], capture_output=True, text=True, env=clean_env(), check=False
    )
    assert (proc.returncode, proc.stdout) == (0, "reaped\n"), proc.stderr


def test_as_a_containers_first_process_exec_exits_128_plus_the_engines_signal(
    tmp_path: Path,
) -> None:
    """A namespace's first process cannot die of a signal it does not handle: 128 + N."""
    target = env_target(tmp_path / "t", {})
    argv = [PYTHON, "-m", "artifactd", "exec", "--target", str(target)]
    argv += ["--engine-log", str(tmp_path / "engine.log"), "--"]
    engine = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    proc = subprocess.run(
        [*_pid_namespace(), *argv, PYTHON, "-c", engine],
        capture_output=True,
        env=clean_env(),
        check=False,
    )
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
    assert os.path.getsize(tmp_path / "engine.log") > 0


def test_the_forwarder_keeps_what_it_got_bounded_however_many_signals_come() -> None:
    """A pod's PID 1 runs for days: every signal it got was kept in a list, each held one too.

    Held while there is no engine, a signal is sent once however often it
    came (the kernel keeps one pending signal of a kind), and what was got is
    a set: both are bounded by the signals forwarded.
    """
    before = signal.getsignal(signal.SIGUSR1)
    with Forwarder() as forwarder:
        for _ in range(500):
            os.kill(os.getpid(), signal.SIGWINCH)
            os.kill(os.getpid(), signal.SIGUSR1)
        assert forwarder.got == {signal.SIGWINCH, signal.SIGUSR1}
        assert sorted(forwarder._held) == sorted([signal.SIGWINCH, signal.SIGUSR1])
        assert not forwarder.stopping()
        os.kill(os.getpid(), signal.SIGTERM)
        assert forwarder.stopping()
    assert signal.getsignal(signal.SIGUSR1) is before  # the handlers are this process's own again
