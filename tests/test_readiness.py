"""``artifactd status --ready``: the two readiness levels, serviceable and prewarmed.

The fast tests probe real HTTP servers (``python -m http.server`` answering
``GET /health`` from a file, or nothing listening) and real restores. The slow
test is the whole path with the tiny engine (``tests/engines/tiny_engine.py``,
real torch.compile): a cache is built for shapes A and restored; the engine
starts under ``artifactd exec --engine-log``; ``status --ready`` goes from
serviceable to prewarmed once ``--prewarm`` served A from the restored cache
with nothing compiled, and a matrix with a shape B the cache lacks keeps it at
serviceable (compiled anyway).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cachetrees import make_generic_tree
from conftest import PYTHON, clean_env, run_artifactd, run_artifactd_json

from artifactd.build.cells import send_requests
from artifactd.pod.readiness import NOT_READY_EXIT, prewarm_cell, probe_health

ENGINE = Path(__file__).resolve().parent / "engines" / "tiny_engine.py"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def status(target: Path, *args: str, code: int = 0) -> dict[str, Any]:
    proc = run_artifactd("status", "--target", str(target), *args, "--json")
    assert proc.returncode == code, proc.stdout + proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    assert doc["exit_code"] == code
    return doc


@pytest.fixture
def health_server(tmp_path: Path) -> Iterator[str]:
    """A real HTTP server whose ``GET /health`` answers 200 (a file named health)."""
    root = tmp_path / "www"
    root.mkdir()
    (root / "health").write_text("ok\n")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while not probe_health(url, timeout=1)[0]:
            assert time.monotonic() < deadline, "http.server did not start"
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def restored(tmp_path: Path) -> Path:
    """A target a real restore wrote (one generic cache)."""
    tree = make_generic_tree(tmp_path / "gen")
    store = f"oci:{tmp_path / 'store'}"
    env = clean_env({"HOME": str(tmp_path), "ARTIFACTD_GENERIC_DIR": str(tree)})
    run_artifactd_json("harvest", "--store", store, "--family", "generic", env=env)
    target = tmp_path / "cache"
    run_artifactd_json("restore", "--store", store, "--target", str(target), "--family", "generic")
    return target


def test_an_engine_that_answers_on_a_restored_target_is_serviceable(
    restored: Path, health_server: str
) -> None:
    doc = status(restored, "--engine-url", health_server, "--ready", "serviceable")
    ready = doc["readiness"]
    assert ready["level"] == "serviceable"
    assert ready["serviceable"] is True and ready["prewarmed"] is False
    assert "HTTP 200" in ready["engine"]
    # Nothing was sent: prewarmed is not claimed, and the probe for it says why.
    assert "--prewarm" in ready["why_not"]
    failed = status(restored, "--engine-url", health_server, "--ready", "prewarmed", code=15)
    assert failed["readiness"]["level"] == "serviceable"


def test_no_engine_is_not_serviceable_and_the_probe_fails(restored: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    doc = status(restored, "--engine-url", url, "--ready", "serviceable", code=NOT_READY_EXIT)
    assert doc["readiness"]["level"] == "not ready"
    assert "no answer" in doc["readiness"]["why_not"]
    text = run_artifactd(
        "status", "--target", str(restored), "--engine-url", url, "--ready", "serviceable"
    )
    assert text.returncode == NOT_READY_EXIT
    assert "artifactd: error: not serviceable" in text.stderr
    assert "Traceback" not in text.stderr


def test_a_restore_in_progress_is_not_serviceable(restored: Path, health_server: str) -> None:
    journal = restored / ".artifactd" / "journal.json"
    journal.write_text("{}")
    try:
        doc = status(
            restored, "--engine-url", health_server, "--ready", "serviceable", code=NOT_READY_EXIT
        )
    finally:
        journal.unlink()
    assert doc["state"] == "restore in progress"
    assert "verdicts are not known" in doc["readiness"]["why_not"]


def test_a_missed_restore_is_serviceable_fail_open(tmp_path: Path, health_server: str) -> None:
    doc = status(tmp_path / "empty", "--engine-url", health_server, "--ready", "serviceable")
    assert doc["state"] == "no marker"
    assert doc["readiness"]["serviceable"] is True


def test_readiness_metrics(restored: Path, health_server: str, tmp_path: Path) -> None:
    metrics = tmp_path / "m.prom"
    status(restored, "--engine-url", health_server, "--metrics-file", str(metrics))
    text = metrics.read_text()
    assert 'artifactd_ready{level="serviceable"} 1.0' in text
    assert 'artifactd_ready{level="prewarmed"} 0.0' in text
    # The restore phase comes from the marker this restore wrote.
    assert 'artifactd_engine_phase_seconds{phase="restore"}' in text


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--ready", "warm"), "not a readiness level"),
        (("--ready", "serviceable"), "no --engine-url"),
        (("--prewarm", "m.yaml"), "no --engine-url"),
        (
            ("--engine-url", "http://127.0.0.1:1", "--ready", "serviceable", "--serve", ":0"),
            "--serve answers scrapes",
        ),
    ],
)
def test_usage_errors(tmp_path: Path, args: tuple[str, ...], expected: str) -> None:
    proc = run_artifactd("status", "--target", str(tmp_path), *args)
    assert proc.returncode == 2
    assert expected in proc.stderr and "hint:" in proc.stderr


def test_prewarm_refuses_a_matrix_without_serve_cells(
    restored: Path, health_server: str, tmp_path: Path
) -> None:
    matrix = tmp_path / "m.yaml"
    matrix.write_text("name: one-shot\ncommand: 'true'\n")
    proc = run_artifactd(
        "status", "--target", str(restored), "--engine-url", health_server, "--prewarm", str(matrix)
    )
    assert proc.returncode == 2, proc.stderr
    assert "no serve cell" in proc.stderr


# --------------------------------------------------------------------------
# The tiny engine, end to end
# --------------------------------------------------------------------------


def tiny_matrix(path: Path, port: int, prompt_tokens: list[int]) -> Path:
    """A one-cell serve matrix for the tiny engine, sending ``prompt_tokens``."""
    path.write_text(
        f"""\
name: tiny-ready
families: [inductor]
workload:
  model: tiny-llm
  engine: {json.dumps(str(ENGINE))}
serve:
  command: "{{{{ python }}}} {{{{ engine }}}} --port {{{{ port }}}}"
  port: {port}
  requests:
    - prompt_tokens: {json.dumps(prompt_tokens)}
      max_tokens: 2
"""
    )
    return path


def wait_health(url: str, proc: subprocess.Popen[bytes], limit: float = 120) -> None:
    deadline = time.monotonic() + limit
    while True:
        assert proc.poll() is None, "the engine exited"
        if probe_health(url, timeout=1)[0]:
            return
        assert time.monotonic() < deadline, "the engine was not ready in time"
        time.sleep(0.1)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def settled_phases(
    target: Path, log: Path, done: Callable[[dict[str, Any]], bool], limit: float = 15
) -> dict[str, Any]:
    """The phases ``status --engine-log`` reports once ``done`` holds.

    The engine's lines reach the log through exec's copier, a few milliseconds
    after the engine printed them: a status run right after a request may not
    see that request's lines yet.
    """
    deadline = time.monotonic() + limit
    while True:
        doc = status(target, "--engine-log", str(log))
        phases = {p["phase"]: p for p in doc["phases"]}
        if done(phases) or time.monotonic() > deadline:
            return phases
        time.sleep(0.2)


@pytest.mark.torch
@pytest.mark.slow
def test_tiny_engine_goes_serviceable_then_prewarmed_and_a_new_shape_keeps_it_serviceable(
    tmp_path: Path,
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    shapes_a = tiny_matrix(tmp_path / "a.yaml", port, [4, 8])
    shapes_b = tiny_matrix(tmp_path / "b.yaml", port, [4, 8, 6])
    build_cache = tmp_path / "build-inductor"
    (tmp_path / "tmp").mkdir()
    base = {"HOME": str(tmp_path / "home"), "TMPDIR": str(tmp_path / "tmp")}

    # The build: the engine serves shapes A on a fresh cache; the harvest packs it.
    build_env = clean_env({**base, "TORCHINDUCTOR_CACHE_DIR": str(build_cache)})
    engine = [PYTHON, str(ENGINE), "--port", str(port)]
    cold = subprocess.Popen(engine, env=build_env, stderr=subprocess.DEVNULL)
    try:
        wait_health(url, cold)

        sent = send_requests(prewarm_cell(shapes_a, url, None))
        assert (sent.requests, sent.answered, sent.failures) == (2, 2, [])
    finally:
        stop(cold)
    store = f"oci:{tmp_path / 'store'}"
    run_artifactd_json(
        "harvest", "--store", store, "--family", "inductor", "--gpu-arch", "sm_90a", env=build_env
    )
    target = tmp_path / "cache"
    run_artifactd_json(
        "restore",
        "--store",
        store,
        "--target",
        str(target),
        "--gpu-arch",
        "sm_90a",
        "--family",
        "inductor",
        env=clean_env(base),
    )

    # The pod: the exec wrapper starts the engine on the restored cache and logs its output.
    log = target / "engine.log"
    pod = subprocess.Popen(
        [
            PYTHON,
            "-m",
            "artifactd",
            "exec",
            "--target",
            str(target),
            "--engine-log",
            str(log),
            "--",
            *engine,
        ],
        env=clean_env(base),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_health(url, pod)
        serviceable = status(target, "--engine-url", url, "--ready", "serviceable")
        assert serviceable["readiness"]["level"] == "serviceable"
        status(target, "--engine-url", url, "--ready", "prewarmed", code=NOT_READY_EXIT)

        warm = status(
            target,
            "--engine-url",
            url,
            "--engine-log",
            str(log),
            "--prewarm",
            str(shapes_a),
            "--ready",
            "prewarmed",
        )
        ready = warm["readiness"]
        assert ready["level"] == "prewarmed", ready
        assert ready["prewarm"]["requests"] == ready["prewarm"]["answered"] == 2
        assert [f["verdict"] for f in warm["families"]] == ["used"]
        phases = settled_phases(target, log, lambda p: "first_request" in p)
        assert set(phases) == {"restore", "weights", "compile", "ready", "first_request"}
        assert phases["compile"]["outcome"] == "hit"
        assert phases["weights"]["source"] == "tiny engine"
        assert all(p["seconds"] is not None and p["seconds"] >= 0 for p in phases.values())
        # The exec wrapper's clock: the start is the engine's, so ready covers the weights.
        assert phases["ready"]["seconds"] >= phases["weights"]["seconds"]

        # Shape B (6 words) was never built: served, it compiles into the restored dir.
        anyway = status(
            target,
            "--engine-url",
            url,
            "--engine-log",
            str(log),
            "--prewarm",
            str(shapes_b),
            "--ready",
            "prewarmed",
            code=NOT_READY_EXIT,
        )
        assert anyway["readiness"]["level"] == "serviceable"
        assert anyway["compiled_anyway"] == ["inductor"]
        assert "compiled anyway: inductor" in anyway["readiness"]["why_not"]
        compiled = settled_phases(target, log, lambda p: p["compile"]["outcome"] == "compiled")
        assert compiled["compile"]["seconds"] > phases["compile"]["seconds"]
    finally:
        stop(pod)
    out, err = pod.communicate(timeout=30)
    # The engine's output still reached the container's streams, and the log holds it stamped.
    assert b"tiny-engine: ready" in err and b'"tiny_engine"' in out
    lines = log.read_text().splitlines()
    assert lines[0].startswith("artifactd-exec ") and "artifactd-exec: started" in lines[0]
    assert any(line.endswith("tiny-engine: ready") for line in lines)
    assert any('{"tiny_engine"' in line for line in lines)  # the last line, at exit
    assert os.path.getsize(log) > 0
