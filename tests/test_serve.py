"""Serve cells against a real engine: real HTTP, real torch.compile, real signals.

The engine is ``tests/engines/tiny_engine.py``: an HTTP server around a
``torch.compile``'d model (``dynamic=False``: one graph per prompt length plus
one decode graph). Each cell comes from a matrix YAML written here, loaded and
expanded as ``artifactd build`` does, and is run by :func:`run_serve` with
Inductor's cache (and ``TMPDIR``) under the test's temporary directory.
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import PYTHON, clean_env, run_artifactd

from artifactd.build.cells import ServeResult, prompt_text, responses_digest, run_serve
from artifactd.build.matrix import Cell, expand, load_matrix
from artifactd.errors import BuildError
from artifactd.events import Event

ENGINE = Path(__file__).resolve().parent / "engines" / "tiny_engine.py"
MODEL = "tiny-llm"

#: Two completions lengths sent twice, two at a time, and one chat length that
#: reuses a shape: 5 requests, 3 graphs (prefill 4, prefill 8, decode).
REQUESTS = """\
  - kind: completions
    prompt_tokens: [4, 8]
    max_tokens: 4
    concurrency: 2
    repeat: 2
  - kind: chat
    prompt_tokens: [8]
    max_tokens: 3
"""
REQUESTS_SENT = 5
GRAPHS = 3


def free_port() -> int:
    """A loopback port nothing listens on now (within the matrix's port range)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if 1024 <= port <= 65000:
            return port


def serve_cell(
    tmp_path: Path,
    *,
    flags: str = "",
    requests: str = REQUESTS,
    ready_timeout_s: float = 120,
    grace_s: float = 10,
    extra: str = "",
    name: str = "serve.yaml",
) -> Cell:
    """Write a one-cell serve matrix for the tiny engine, load it and expand it."""
    text = f"""\
name: tiny-serve
families: [inductor]
workload:
  model: {MODEL}
  engine: {json.dumps(str(ENGINE))}
serve:
  command: >-
    {{{{ python }}}} {{{{ engine }}}} --port {{{{ port }}}} --model {{{{ model }}}} {flags}
  port: {free_port()}
  ready_timeout_s: {ready_timeout_s}
  shutdown_grace_s: {grace_s}
  requests:
{requests}{extra}"""
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    cells = expand(load_matrix(path), path)
    assert len(cells) == 1
    cell = cells[0]
    assert cell.serve is not None
    assert cell.serve.argv[:2] == [PYTHON, str(ENGINE)]
    return cell


def engine_env(root: Path) -> dict[str, str]:
    """The environment a build gives a cell: Inductor's cache and TMPDIR under ``root``."""
    (root / "tmp").mkdir(parents=True, exist_ok=True)
    return clean_env(
        {"TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"), "TMPDIR": str(root / "tmp")}
    )


def engine_pids(port: int) -> list[int]:
    """Live processes running the tiny engine on ``port`` (zombies have no cmdline)."""
    needle = f"--port\0{port}\0".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if str(ENGINE).encode() in cmdline and needle in cmdline:
            found.append(int(entry.name))
    return found


def engine_report(log: Path) -> dict[str, int]:
    """The engine's exit line: Inductor's compiled / cache-hit counts and requests served."""
    for line in reversed(log.read_text(errors="replace").splitlines()):
        if line.startswith('{"tiny_engine"'):
            report: dict[str, int] = json.loads(line)["tiny_engine"]
            return report
    raise AssertionError(f"no exit line in {log}:\n{log.read_text(errors='replace')}")


def port_of(cell: Cell) -> int:
    assert cell.serve is not None
    return cell.serve.port


# --------------------------------------------------------------------------
# A cold run, then a warm run on the same caches (module-scoped: compiles once)
# --------------------------------------------------------------------------


@dataclass
class Run:
    cell: Cell
    result: ServeResult
    log: Path
    events: list[Event]
    seconds: float
    cache_files: list[str]


@dataclass
class TwoRuns:
    root: Path
    cold: Run
    warm: Run


def _run(tmp: Path, root: Path, label: str) -> Run:
    cell = serve_cell(tmp, name=f"{label}.yaml")
    events: list[Event] = []
    log = tmp / f"{label}.log"
    t0 = time.monotonic()
    result = run_serve(cell, engine_env(root), log, on_event=events.append)
    seconds = time.monotonic() - t0
    inductor = root / "inductor"
    files = sorted(str(p.relative_to(inductor)) for p in inductor.rglob("*") if p.is_file())
    return Run(cell, result, log, events, seconds, files)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoRuns]:
    tmp = tmp_path_factory.mktemp("serve")
    root = tmp / "roots"
    cold = _run(tmp, root, "cold")
    warm = _run(tmp, root, "warm")
    yield TwoRuns(root, cold, warm)


@pytest.mark.slow
@pytest.mark.torch
def test_cold_run_answers_every_request_and_fills_the_cache(two_runs: TwoRuns) -> None:
    run = two_runs.cold
    res = run.result
    assert res.requests_sent == REQUESTS_SENT
    assert not res.killed
    assert res.returncode == 0
    assert set(res.checks) == {"responses_sha256"}
    assert len(res.checks["responses_sha256"]) == 64
    assert res.ready_s > 0 and res.requests_s > 0 and res.shutdown_s >= 0
    # The engine answered them all with 200 and said so at exit (after SIGTERM).
    report = engine_report(run.log)
    assert report["requests"] == REQUESTS_SENT
    text = run.log.read_text()
    assert text.count('"POST /v1/completions HTTP/1.1" 200') == 4
    assert text.count('"POST /v1/chat/completions HTTP/1.1" 200') == 1
    assert "SIGTERM: shutting down" in text
    # It compiled one graph per new shape, and Inductor wrote them where it was told.
    assert report["compiled"] == GRAPHS
    assert report["cache_hits"] == 0
    assert any(f.startswith("fxgraph/") for f in run.cache_files), run.cache_files
    assert sum(f.endswith(".so") for f in run.cache_files) >= GRAPHS
    # Events: the four steps, in order, each timed.
    assert [e["event"] for e in run.events] == ["start", "ready", "requests", "stopped"]
    assert all(e["stage"] == "serve" and e["cell"] == run.cell.id for e in run.events)
    assert all(e["elapsed_ms"] >= 0 for e in run.events)
    assert engine_pids(port_of(run.cell)) == []


@pytest.mark.slow
@pytest.mark.torch
def test_warm_run_compiles_nothing_and_answers_the_same(two_runs: TwoRuns) -> None:
    cold, warm = two_runs.cold, two_runs.warm
    assert warm.result.requests_sent == REQUESTS_SENT
    assert warm.result.checks == cold.result.checks
    cold_report, warm_report = engine_report(cold.log), engine_report(warm.log)
    assert cold_report["compiled"] > 0
    assert warm_report["compiled"] == 0
    assert warm_report["cache_hits"] == cold_report["compiled"]
    assert warm.result.requests_s < cold.result.requests_s
    assert not warm.result.killed
    assert engine_pids(port_of(warm.cell)) == []


# --------------------------------------------------------------------------
# Failures: each stops the engine (its whole group) before it is reported
# --------------------------------------------------------------------------


@pytest.mark.slow  # the inner loop's slowest: waits out deadlines or runs many processes
@pytest.mark.torch
def test_not_ready_in_time_fails_with_the_log_tail(tmp_path: Path) -> None:
    cell = serve_cell(tmp_path, flags="--never-ready", ready_timeout_s=3, grace_s=5)
    log = tmp_path / "never.log"
    t0 = time.monotonic()
    with pytest.raises(BuildError) as info:
        run_serve(cell, engine_env(tmp_path / "roots"), log)
    elapsed = time.monotonic() - t0
    message = str(info.value)
    assert "not ready after 3 s" in message
    assert "tiny-engine: listening on" in message  # the log tail
    assert info.value.hint is not None and str(log) in info.value.hint
    assert 3 <= elapsed < 3 + 5 + 2
    assert engine_pids(port_of(cell)) == []


def test_crash_before_ready_fails_fast_with_status_and_log(tmp_path: Path) -> None:
    cell = serve_cell(tmp_path, flags="--crash-after-start", ready_timeout_s=120)
    t0 = time.monotonic()
    with pytest.raises(BuildError) as info:
        run_serve(cell, engine_env(tmp_path / "roots"), tmp_path / "crash.log")
    elapsed = time.monotonic() - t0
    message = str(info.value)
    assert "exited with status 3" in message
    assert "before it was ready" in message
    assert "simulated failure while loading the model" in message
    assert elapsed < 30  # the crash, not the 120 s timeout, ended it
    assert engine_pids(port_of(cell)) == []


@pytest.mark.slow  # the inner loop's slowest: waits out deadlines or runs many processes
@pytest.mark.torch
def test_engine_ignoring_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    cell = serve_cell(tmp_path, flags="--ignore-sigterm", requests="    []\n", grace_s=1)
    events: list[Event] = []
    result = run_serve(
        cell, engine_env(tmp_path / "roots"), tmp_path / "kill.log", on_event=events.append
    )
    assert result.killed
    assert result.returncode == -9
    assert result.requests_sent == 0
    assert 1 <= result.shutdown_s < 5
    assert events[-1]["event"] == "stopped" and events[-1]["killed"] is True
    assert engine_pids(port_of(cell)) == []
    assert "SIGTERM: shutting down" not in (tmp_path / "kill.log").read_text()


@pytest.mark.torch
@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("  model: not-served\n", ["HTTP 404", "The model `not-served` does not exist"]),
        (
            '  base_url: "http://127.0.0.1:{{ port }}/nope"\n',
            ["HTTP 404", "no route /nope/v1/completions"],
        ),
        (
            '  base_url: "http://127.0.0.1:DEAD_PORT"\n',
            ["no answer (ConnectionRefusedError"],
        ),
    ],
    ids=["unknown-model", "bad-base-url-path", "nothing-at-base-url"],
)
def test_a_failed_request_fails_the_cell(tmp_path: Path, extra: str, expected: list[str]) -> None:
    # A port bound and never listening refuses every connection, and while it is held no
    # other socket gets it (a port picked free at collection could be the engine's by now).
    with socket.socket() as dead:
        dead.bind(("127.0.0.1", 0))
        cell = serve_cell(tmp_path, extra=extra.replace("DEAD_PORT", str(dead.getsockname()[1])))
        log = tmp_path / "bad.log"
        with pytest.raises(BuildError) as info:
            run_serve(cell, engine_env(tmp_path / "roots"), log)
    message = str(info.value)
    for part in expected:
        assert part in message
    # Two requests are in flight at once: either may be the one reported.
    assert re.search(r"request group 0 \(completions\), prompt of [48] words", message)
    assert "tiny-engine: ready" in message  # the log tail
    assert engine_pids(port_of(cell)) == []
    # Refused before anything ran: nothing compiled, and the engine was stopped cleanly.
    assert engine_report(log)["compiled"] == 0


def test_an_engine_that_cannot_start_fails_the_cell(tmp_path: Path) -> None:
    cell = serve_cell(tmp_path)
    assert cell.serve is not None
    missing = cell.model_copy(
        update={"serve": cell.serve.model_copy(update={"argv": [str(tmp_path / "no-engine")]})}
    )
    with pytest.raises(BuildError, match="cannot start"):
        run_serve(missing, engine_env(tmp_path / "roots"), tmp_path / "missing.log")


def test_a_command_cell_is_not_served(tmp_path: Path) -> None:
    path = tmp_path / "cmd.yaml"
    path.write_text("name: cmd\ncommand: 'true'\n", encoding="utf-8")
    cell = expand(load_matrix(path), path)[0]
    with pytest.raises(BuildError, match="not a serve cell"):
        run_serve(cell, engine_env(tmp_path / "roots"), tmp_path / "cmd.log")


# --------------------------------------------------------------------------
# The digest and the prompts, without an engine
# --------------------------------------------------------------------------


def test_digest_follows_request_order_not_completion_order() -> None:
    texts: dict[tuple[int, int, int], str] = {(0, 1, 0): "b", (0, 0, 0): "a", (1, 0, 0): "c"}
    reordered = dict(reversed(list(texts.items())))
    assert responses_digest(texts) == responses_digest(reordered)
    assert responses_digest(texts) != responses_digest({**texts, (0, 0, 0): "a "})
    # Length-prefixed: moving text between answers changes the digest.
    assert responses_digest({(0, 0, 0): "ab", (0, 1, 0): ""}) != responses_digest(
        {(0, 0, 0): "a", (0, 1, 0): "b"}
    )


def test_prompts_have_the_asked_number_of_words() -> None:
    assert prompt_text(3) == "w0 w1 w2"
    assert prompt_text(0) == ""
    assert len(prompt_text(128).split()) == 128


@pytest.mark.slow
@pytest.mark.torch
def test_a_serve_matrix_builds_restores_and_passes_the_gate(tmp_path: Path) -> None:
    """`artifactd build` of a serve cell, then `verify`: the re-served engine compiles nothing.

    The whole path with the real engine: the builder starts it with fresh
    roots, sends the requests, stops it, harvests the Inductor cache it
    flushed and records the responses' digest; verify restores the artifact
    into fresh roots, serves again, and finds the same digest and no file
    compiled anyway.
    """
    cell = serve_cell(tmp_path, extra="gpus: 0\n")
    matrix = tmp_path / "serve.yaml"
    env = clean_env({"HOME": str(tmp_path / "home")})
    store = f"oci:{tmp_path / 'store'}"
    built = run_artifactd("build", str(matrix), "--store", store, "--json", env=env, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    doc = json.loads(built.stdout)
    (result,) = doc["cells"]
    assert result["id"] == cell.id and result["serve"]["requests"] > 0
    assert set(result["checks"]) == {"responses_sha256"}
    assert [f["family"] for f in doc["harvest"]["families"]] == ["inductor"]
    events = [json.loads(x) for x in built.stderr.splitlines() if x.startswith("{")]
    assert ("serve", "ready") in {(e.get("stage"), e.get("event")) for e in events}
    gate = run_artifactd("verify", str(matrix), "--store", store, "--json", env=env, timeout=600)
    assert gate.returncode == 0, gate.stdout + gate.stderr[-3000:]
    verdict = json.loads(gate.stdout)
    assert verdict["passed"]
    (checked,) = verdict["cells"]
    assert [c["ok"] for c in checked["checks"]] == [True]
    assert checked["compiled"] == {"inductor": 0}
