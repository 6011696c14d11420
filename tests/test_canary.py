"""The canary: recorded at build, replayed by ``verify`` and by ``status --canary`` before ready.

The slow tests are the whole path with the tiny engine
(``tests/engines/tiny_engine.py``, real torch.compile on the CPU): ``artifactd
build`` records the canary through ``/v1/completions`` into the artifact's
signed config, ``inspect`` shows it, ``restore`` writes it beside the marker,
the engine starts under ``artifactd exec``, and ``status --canary`` replays it.
Poisoning is done the real way: a restored Inductor cache entry (the wrapper
module of the decode graph, which holds its C++ kernel) is edited on disk, so
the engine compiles and runs a kernel that computes something else: a shifted
log-softmax (same tokens, other logprobs: drift), no tanh (other tokens), the
log of a negative sum (NaN).

The fast tests hold the bounds: a hostile ``canary.json`` (a FIFO, too large,
not JSON, another artifact's) is a reason, never a hang; an engine that never
answers the canary request is a failure within the canary's deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cachetrees import make_generic_tree
from conftest import PYTHON, clean_env, run_artifactd, run_artifactd_json

from artifactd.bounds import MAX_CANARY_BYTES
from artifactd.build.harvest import harvest
from artifactd.format.canary import Canary, CanaryPrompt, CanarySpec, RecordedOn
from artifactd.pod.canary import Observed, compare, logprobs_digest, observe, restored_canary
from artifactd.pod.readiness import CANARY_FAILED_EXIT, NOT_READY_EXIT, probe_health
from artifactd.restore.envfile import parse_env_file
from artifactd.stores import open_store
from artifactd.stores.artifacts import read_artifact

ENGINE = Path(__file__).resolve().parent / "engines" / "tiny_engine.py"
#: A generous ceiling on what must not hang.
BOUND = 60.0


def free_port() -> int:
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if 1024 <= port <= 65000:
            return port


# --------------------------------------------------------------------------
# The rules (pure): one owner, every outcome
# --------------------------------------------------------------------------

HERE = RecordedOn(gpu="NVIDIA H100 80GB HBM3", driver="550.54.15", engine="vllm 0.11.0")


def recorded(greedy: list[int], digest: str = "a" * 64) -> Canary:
    prompt = CanaryPrompt(
        id="p0", text="x", prompt_ids=[1, 2], greedy_ids=greedy, logprobs_sha256=digest
    )
    spec = CanarySpec(prompts=["x"])
    return Canary(cell="0-cell", model="m", spec=spec, prompts=[prompt], recorded_on=HERE)


def test_compare_gives_every_outcome_and_names_the_first_differing_token() -> None:
    can = recorded([5, 6, 7, 8])
    same = Observed([1, 2], [5, 6, 7, 8], "a" * 64)
    assert compare(can, [same], HERE).outcome == "verified"
    drift = compare(can, [Observed([1, 2], [5, 6, 7, 8], "b" * 64)], HERE)
    assert (drift.outcome, drift.prompt, drift.ready) == ("drift", "p0", True)
    other = compare(can, [Observed([1, 2], [5, 6, 9, 8], "a" * 64)], HERE)
    assert (other.outcome, other.prompt, other.token, other.expected, other.got) == (
        "failed",
        "p0",
        2,
        7,
        9,
    )
    assert "prompt p0: token 2 is 9, the recording has 7" in (other.why or "")
    nan = compare(can, [Observed([1, 2], [5, 6, 7, 8], None, nan=True)], HERE)
    assert nan.outcome == "failed" and "NaN" in (nan.why or "")
    empty = compare(can, [Observed([1, 2], [], "a" * 64)], HERE)
    assert empty.outcome == "failed" and "empty output" in (empty.why or "")
    error = compare(can, [Observed(error="HTTP 500: boom")], HERE)
    assert error.outcome == "failed" and "HTTP 500" in (error.why or "")


def test_another_gpu_driver_or_engine_gets_the_tolerance_check_and_says_so() -> None:
    can = recorded([5, 6, 7, 8, 9, 10, 11, 12, 13, 14])
    elsewhere = HERE.model_copy(update={"gpu": "NVIDIA H200"})
    # 9 of 10 tokens, another logprob digest: at the 0.9 default, verified (tolerance).
    close = compare(
        can, [Observed([1, 2], [5, 6, 7, 8, 9, 10, 11, 12, 13, 0], "b" * 64)], elsewhere
    )
    assert (close.outcome, close.mode, close.match_rate) == ("verified", "tolerance", 0.9)
    assert "tolerance check" in (close.why or "") and "NVIDIA H200" in (close.why or "")
    far = compare(can, [Observed([1, 2], [5, 6, 7, 8, 0, 0, 0, 0, 0, 0], "a" * 64)], elsewhere)
    assert (far.outcome, far.mode) == ("failed", "tolerance")
    nan = compare(can, [Observed([1, 2], list(range(5, 15)), None, nan=True)], elsewhere)
    assert nan.outcome == "failed"


def test_the_logprob_digest_rounds_and_refuses_nan() -> None:
    a = [{"token_id:1": -0.123449, "token_id:2": -2.0}]
    b = [{"token_id:2": -2.00001, "token_id:1": -0.12341}]
    assert logprobs_digest(a, 3) == logprobs_digest(b, 3)
    assert logprobs_digest(a, 5) != logprobs_digest(b, 5)
    assert logprobs_digest([{"token_id:1": float("nan")}], 3) is None
    assert logprobs_digest([{"token_id:1": -0.0}], 2) == logprobs_digest([{"token_id:1": 0.0}], 2)


# --------------------------------------------------------------------------
# Bounded: a hostile engine, a hostile canary document
# --------------------------------------------------------------------------


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A real listening socket that accepts and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(sock.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        sock.close()


def test_an_engine_that_never_answers_fails_the_canary_within_its_deadline(
    silent_server: str,
) -> None:
    started = time.monotonic()
    seen = observe(silent_server, "m", CanarySpec(count=2, deadline_s=1))
    assert time.monotonic() - started < BOUND
    assert [s.error is not None for s in seen] == [True, True]
    assert "no answer" in (seen[0].error or "")
    result = compare(recorded([1]).model_copy(update={"prompts": []}), seen, HERE)
    assert result.outcome == "failed"


@pytest.fixture
def restored(tmp_path: Path) -> tuple[Path, str]:
    """A target a real restore of a whole artifact wrote (one generic cache), and the artifact."""
    tree = make_generic_tree(tmp_path / "gen")
    store = f"oci:{tmp_path / 'store'}"
    env = clean_env({"HOME": str(tmp_path), "ARTIFACTD_GENERIC_DIR": str(tree)})
    run_artifactd_json("harvest", "--store", store, "--family", "generic", env=env)
    target = tmp_path / "cache"
    run_artifactd_json("restore", "--store", store, "--target", str(target), "--family", "generic")
    marker = json.loads((target / ".artifactd" / "restored.json").read_text())
    assert marker["match"] == "full"
    return target, marker["families"]["generic"]["artifact"]


@pytest.fixture
def health_server(tmp_path: Path) -> Iterator[str]:
    root = tmp_path / "www"
    root.mkdir()
    (root / "health").write_text("ok\n")
    port = free_port()
    proc = subprocess.Popen(
        [PYTHON, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
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


def status_canary(target: Path, url: str, *args: str, code: int = 0) -> dict[str, Any]:
    proc = run_artifactd(
        "status", "--target", str(target), "--engine-url", url, "--canary", *args, "--json"
    )
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def test_an_artifact_without_a_canary_is_not_verified_and_says_why(
    restored: tuple[Path, str], health_server: str
) -> None:
    target, _ = restored
    assert not (target / ".artifactd" / "canary.json").exists()
    doc = status_canary(target, health_server, "--ready", "verified", code=NOT_READY_EXIT)
    ready = doc["readiness"]
    assert ready["verified"] is False and ready["canary"] is None
    assert "--prewarm" in ready["why_not"]  # the level below comes first
    doc = status_canary(target, health_server)
    assert doc["readiness"]["level"] == "serviceable"


@pytest.mark.parametrize("kind", ["fifo", "too_large", "garbage", "other_artifact", "directory"])
def test_a_hostile_canary_document_is_a_reason_never_a_hang(
    restored: tuple[Path, str], kind: str
) -> None:

    target, artifact = restored
    path = target / ".artifactd" / "canary.json"
    good = {
        "schema_version": 1,
        "artifact": artifact,
        "canaries": [json.loads(recorded([1, 2]).model_dump_json())],
    }
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "too_large":
        path.write_bytes(b" " * (MAX_CANARY_BYTES + 1))
    elif kind == "garbage":
        path.write_text('{"schema_version": 1, "artifact": ')
    elif kind == "other_artifact":
        path.write_text(json.dumps({**good, "artifact": "sha256:" + "0" * 64}))
    else:
        path.mkdir()
    started = time.monotonic()
    canary, digest, why = restored_canary(target)
    assert time.monotonic() - started < BOUND
    assert canary is None and digest == artifact and why
    expected = {
        "fifo": "not a regular file",
        "too_large": "larger than",
        "garbage": "not an artifactd canary document",
        "other_artifact": "another artifact's",
        "directory": "not a regular file",
    }[kind]
    assert expected in why
    # The same document, for the artifact restored, is read.
    if kind == "other_artifact":
        path.write_text(json.dumps(good))
        canary, _, why = restored_canary(target)
        assert canary is not None and why is None


@pytest.mark.parametrize("engine_log", [False, True], ids=["plain", "engine-log"])
def test_on_canary_fail_an_engine_that_ends_before_its_health_answers_keeps_its_status(
    restored: tuple[Path, str], tmp_path: Path, engine_log: bool
) -> None:
    """The supervisor polls the engine's health; an engine that ends meanwhile is reaped there.

    Its status must be the one kept then: waiting for it again reaped the other
    children instead, and returned 0 when there were none (exit 3 lost) or
    waited forever for the engine log's copier, which ends only once this
    process lets go of the pipes.
    """
    target, artifact = restored
    doc = {"schema_version": 1, "artifact": artifact, "canaries": [recorded([1, 2]).model_dump()]}
    (target / ".artifactd" / "canary.json").write_text(json.dumps(doc))
    argv = [PYTHON, "-m", "artifactd", "exec", "--target", str(target), "--json"]
    argv += ["--on-canary-fail", "cold", "--engine-url", f"http://127.0.0.1:{free_port()}"]
    if engine_log:
        argv += ["--engine-log", str(tmp_path / "engine.log")]
    proc = subprocess.run(
        [*argv, "--", PYTHON, "-c", "import sys; sys.exit(3)"],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=300,  # the bug this holds was a wait without end: fail, never hang
        check=False,
    )
    assert proc.returncode == 3, proc.stderr
    events = [json.loads(x) for x in proc.stderr.splitlines() if x.startswith("{")]
    assert [e["event"] for e in events if e.get("stage") == "exec"] == ["canary_skipped"]


# --------------------------------------------------------------------------
# The tiny engine, end to end
# --------------------------------------------------------------------------

#: The decode graph's log-softmax kernel: ``log(sum(exp(x - max)))``.
LOG_SUM = "auto tmp1 = std::log(tmp0);"
#: Three ways to poison it: every logprob shifted (argmax unchanged: drift); the
#: decode state without its tanh (other tokens); the log of a negative sum (NaN).
POISONS = {
    "drift": (LOG_SUM, "auto tmp1 = std::log(tmp0) + 0.01f;"),
    "tokens": ("auto tmp1 = tmp0.tanh();", "auto tmp1 = tmp0;"),
    "nan": (LOG_SUM, "auto tmp1 = std::log(-tmp0);"),
}


def poison(root: Path, how: str) -> Path:
    """Edit the cached decode graph's wrapper module (its C++ kernel) under ``root``."""
    old, new = POISONS[how]
    changed = []
    for path in root.rglob("*.py"):
        text = path.read_text(errors="replace")
        if "cpp_fused__log_softmax_argmax" in text and old in text:
            path.write_text(text.replace(old, new, 1))
            changed.append(path)
    assert len(changed) == 1, f"expected one decode wrapper under {root}, found {changed}"
    return changed[0]


def matrix(path: Path, port: int) -> Path:
    path.write_text(
        f"""\
name: tiny-canary
families: [inductor]
gpus: 0
workload:
  model: tiny-llm
  engine: {json.dumps(str(ENGINE))}
serve:
  command: "{{{{ python }}}} {{{{ engine }}}} --port {{{{ port }}}}"
  port: {port}
  requests:
    - prompt_tokens: [4]
      max_tokens: 2
  canary:
    count: 1
    tokens: 8
    top_k: 5
    deadline_s: 300
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


@contextlib.contextmanager
def pod(target: Path, port: int, env: dict[str, str], *flags: str) -> Iterator[str]:
    """The engine (with ``flags``) under ``artifactd exec`` on ``target``'s restored caches."""
    argv = [PYTHON, "-m", "artifactd", "exec", "--target", str(target), "--", PYTHON]
    proc = subprocess.Popen(
        [*argv, str(ENGINE), "--port", str(port), *flags],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_health(url, proc)
        yield url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def restore(
    store: str, target: Path, env: dict[str, str], *extra: str, full: bool = True
) -> dict[str, Any]:
    """Restore as the pod would: with the matrix's workload, so the whole artifact matches."""
    workload = [
        "--workload",
        "model=tiny-llm",
        "--workload",
        f"engine={ENGINE}",
        "--family",
        "inductor",
    ]
    doc = run_artifactd_json(
        "restore", "--store", store, "--target", str(target), *workload, *extra, env=env
    )
    if full:
        assert doc["match"] == "full", doc["plan"]["families"]
    return doc


@pytest.mark.slow
@pytest.mark.torch
def test_a_canary_is_recorded_at_build_verified_in_the_pod_and_catches_poisoned_kernels(
    tmp_path: Path,
) -> None:
    port = free_port()
    m = matrix(tmp_path / "m.yaml", port)
    (tmp_path / "tmp").mkdir()
    env = clean_env({"HOME": str(tmp_path / "home"), "TMPDIR": str(tmp_path / "tmp")})
    store = f"oci:{tmp_path / 'store'}"

    # The build records the canary in the artifact's config; inspect shows it.
    built = run_artifactd("build", str(m), "--store", store, "--json", env=env, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    ref = f"{store}:fp-{json.loads(built.stdout)['harvest']['fingerprint_hash']}"
    events = [json.loads(x) for x in built.stderr.splitlines() if x.startswith("{")]
    assert {"stage": "serve", "event": "canary", "outcome": "recorded"}.items() <= next(
        e for e in events if e.get("event") == "canary"
    ).items()
    shown = run_artifactd_json("inspect", ref, env=env)
    (can,) = shown["config"]["canaries"]
    assert can["model"] == "tiny-llm" and can["spec"]["tokens"] == 8
    (prompt,) = can["prompts"]
    assert prompt["id"] == "p0" and len(prompt["greedy_ids"]) == 8
    assert prompt["prompt_ids"] and re.fullmatch(r"[0-9a-f]{64}", prompt["logprobs_sha256"])
    assert can["recorded_on"]["engine"] == "tiny-engine 1.0"
    text = run_artifactd("inspect", ref, env=env)
    assert "canary" in text.stdout and "p0" in text.stdout

    # The pod: a clean restore replays exactly: verified, above prewarmed.
    target = tmp_path / "clean"
    restore(store, target, env)
    assert (target / ".artifactd" / "canary.json").is_file()
    metrics = tmp_path / "m.prom"
    with pod(target, port, env) as url:
        doc = status_canary(
            target,
            url,
            "--prewarm",
            str(m),
            "--ready",
            "verified",
            "--metrics-file",
            str(metrics),
        )
    ready = doc["readiness"]
    assert ready["level"] == "verified", ready
    assert ready["canary"]["outcome"] == "verified" and ready["canary"]["mode"] == "exact"
    assert ready["why_not"] is None and ready["warning"] is None
    prom = metrics.read_text()
    assert 'artifactd_ready{level="verified"} 1.0' in prom
    assert 'artifactd_canary{mode="exact",outcome="verified"} 1.0' in prom

    # Another engine version than the recording's: only the tolerance check applies, and
    # the output says so.
    with pod(target, port, env, "--engine-version", "tiny-engine 2.0") as url:
        doc = status_canary(target, url, "--prewarm", str(m), "--ready", "verified")
    replayed = doc["readiness"]["canary"]
    assert (replayed["outcome"], replayed["mode"], replayed["match_rate"]) == (
        "verified",
        "tolerance",
        1.0,
    )
    assert "tolerance check" in replayed["why"] and "tiny-engine 2.0" in replayed["mode_why"]

    # Same tokens, other logprobs: drift. Ready, with a warning, a metric and an event.
    drifted = tmp_path / "drift"
    restore(store, drifted, env)
    poison(drifted, "drift")
    with pod(drifted, port, env) as url:
        proc = run_artifactd(
            "status",
            "--target",
            str(drifted),
            "--engine-url",
            url,
            "--canary",
            "--metrics-file",
            str(metrics),
            "--json",
        )
    assert proc.returncode == 0, proc.stderr
    ready = json.loads(proc.stdout)["readiness"]
    assert ready["canary"]["outcome"] == "drift" and ready["level"] != "not ready"
    assert "same tokens, other logprobs" in ready["warning"]
    assert "artifactd: warning: canary drift" in proc.stderr
    event = next(json.loads(x) for x in proc.stderr.splitlines() if '"stage": "canary"' in x)
    assert event["event"] == "drift" and event["prompt"] == "p0"
    assert 'artifactd_canary{mode="exact",outcome="drift"} 1.0' in metrics.read_text()

    # Other tokens, and NaN: not ready, exit 16, naming the prompt (and the token).
    # The pods restore through a node store: the failed canary quarantines the artifact there.
    node = f"oci:{tmp_path / 'node'}"
    for how, expected in [("tokens", r"prompt p0: token 0 is \d+, the recording has \d+"),
                          ("nan", "prompt p0: NaN in the engine's logprobs")]:  # fmt: skip
        bad = tmp_path / how
        restore(store, bad, env, "--node-store", node)
        poison(bad, how)
        with pod(bad, port, env) as url:
            doc = status_canary(
                bad, url, "--ready", "serviceable", "--node-store", node, code=CANARY_FAILED_EXIT
            )
        ready = doc["readiness"]
        assert ready["level"] == "not ready" and ready["canary"]["outcome"] == "failed"
        assert re.search(expected, ready["why_not"]), ready["why_not"]
        assert ready["quarantined"] == doc_artifact(bad)
        # The next restore on this node does not use it.
        again = tmp_path / f"{how}-again"
        doc = restore(store, again, env, "--node-store", node, full=False)
        assert doc["match"] == "miss" and not (again / "inductor").exists()
        run_artifactd_json("quarantine", "rm", "--node-store", node, ready["quarantined"], env=env)

    # exec --on-canary-fail cold: the poisoned engine is stopped and started once more,
    # cold, with the restored caches set aside; the cold engine gives the recorded tokens.
    cold = tmp_path / "cold"
    restore(store, cold, env)
    poison(cold, "tokens")
    log = tmp_path / "exec-events"
    url = f"http://127.0.0.1:{port}"
    exec_argv = [PYTHON, "-m", "artifactd", "exec", "--target", str(cold), "--json"]
    cold_mode = ["--on-canary-fail", "cold", "--engine-url", url]
    with log.open("wb") as err:
        parent = subprocess.Popen(
            [*exec_argv, *cold_mode, "--", PYTHON, str(ENGINE), "--port", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while b"cold_restart" not in log.read_bytes():
            assert parent.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "no cold restart"
            time.sleep(0.2)
        wait_health(url, parent)
        doc = status_canary(cold, url)
        assert doc["readiness"]["canary"]["outcome"] == "verified", doc["readiness"]
    finally:
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(timeout=60) == 0
    lines = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
    first = next(e for e in lines if e.get("event") == "canary")
    assert first["outcome"] == "failed" and "prompt p0: token 0" in first["why"]
    restart = next(e for e in lines if e.get("event") == "cold_restart")
    assert str(cold / "inductor") in restart["set_aside"]
    assert list((cold / ".artifactd").glob("aside-*/inductor/*"))


def doc_artifact(target: Path) -> str:
    marker = json.loads((target / ".artifactd" / "restored.json").read_text())
    (digest,) = {f["artifact"] for f in marker["families"].values()}
    return str(digest)


@pytest.mark.slow
@pytest.mark.torch
def test_verify_fails_a_poisoned_candidate_naming_the_prompt_and_token(tmp_path: Path) -> None:

    port = free_port()
    m = matrix(tmp_path / "m.yaml", port)
    (tmp_path / "tmp").mkdir()
    env = clean_env({"HOME": str(tmp_path / "home"), "TMPDIR": str(tmp_path / "tmp")})
    store = f"oci:{tmp_path / 'store'}"
    built = run_artifactd("build", str(m), "--store", store, "--json", env=env, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    fp_tag = "fp-" + json.loads(built.stdout)["harvest"]["fingerprint_hash"]
    gate = run_artifactd("verify", str(m), "--store", store, "--json", env=env, timeout=600)
    assert gate.returncode == 0, gate.stdout + gate.stderr[-3000:]
    (cell,) = json.loads(gate.stdout)["cells"]
    assert cell["canary"]["outcome"] == "verified" and cell["canary"]["mode"] == "exact"

    # The candidate: the same signed-for canary, over caches whose decode kernel is poisoned.
    tree = tmp_path / "poisoned"
    restore(store, tree, env)
    poison(tree, "tokens")
    caches = parse_env_file(tree / "artifactd.env")
    with open_store(store) as st:
        art = read_artifact(st, fp_tag)
        assert art is not None and art.config.canaries
        harvest(
            st,
            art.config.fingerprint,
            families=["inductor"],
            environ=caches,
            provenance=art.config.provenance,
            canaries=art.config.canaries,
        )
    gate = run_artifactd("verify", str(m), "--store", store, "--json", env=env, timeout=600)
    assert gate.returncode == 12, gate.stdout + gate.stderr[-3000:]
    verdict = json.loads(gate.stdout)
    assert not verdict["passed"]
    line = next(f for f in verdict["failures"] if "canary" in f)
    assert re.search(r"canary failed: prompt p0: token \d+ is \d+, the recording has \d+", line)


# --------------------------------------------------------------------------
# Quarantine on the node (fast: an engine whose canary request errors fails it)
# --------------------------------------------------------------------------


def test_a_failed_canary_quarantines_the_artifact_on_the_node_store(
    tmp_path: Path, health_server: str
) -> None:
    """An engine that answers /health but errors on the canary request: not ready, quarantined.

    The artifact (a generic cache, its config carrying a canary) is restored
    through a node store, as a pod's init container does; ``status --canary
    --node-store`` fails (``http.server`` answers the POST with 501) and
    quarantines it: ``quarantine ls`` lists it, ``node-features`` stops
    advertising it, the next restore from the node store does not use it, and
    ``quarantine rm`` releases it.
    """

    tree = make_generic_tree(tmp_path / "gen")
    store = f"oci:{tmp_path / 'store'}"
    node = f"oci:{tmp_path / 'node'}"
    env = clean_env({"HOME": str(tmp_path), "ARTIFACTD_GENERIC_DIR": str(tree)})
    made = run_artifactd_json("harvest", "--store", store, "--family", "generic", env=env)
    with open_store(store) as st:
        art = read_artifact(st, f"fp-{made['fingerprint_hash']}")
        assert art is not None
        harvest(
            st,
            art.config.fingerprint,
            families=["generic"],
            environ={"ARTIFACTD_GENERIC_DIR": str(tree)},
            canaries=[recorded([1, 2])],
        )

    def restore_from_node(target: Path) -> dict[str, Any]:
        return run_artifactd_json(
            "restore", "--store", store, "--node-store", node, "--target", str(target),
            "--family", "generic", env=env,
        )  # fmt: skip

    target = tmp_path / "pod1"
    assert restore_from_node(target)["match"] == "full"
    assert (target / ".artifactd" / "canary.json").is_file()
    marker = json.loads((target / ".artifactd" / "restored.json").read_text())
    digest = marker["families"]["generic"]["artifact"]
    features = tmp_path / "features"
    run_artifactd_json("node-features", "--store", node, "--out", str(features), env=env)
    assert "/fp-" in features.read_text()

    metrics = tmp_path / "m.prom"
    args = ("--node-store", node, "--metrics-file", str(metrics))
    doc = status_canary(target, health_server, *args, code=CANARY_FAILED_EXIT)
    ready = doc["readiness"]
    assert ready["level"] == "not ready" and ready["canary"]["outcome"] == "failed"
    assert "HTTP 501" in ready["why_not"] and ready["quarantined"] == digest
    prom = metrics.read_text()
    assert f'artifactd_quarantined{{artifact="{digest}"}} 1.0' in prom
    # Recorded on an H100 with vLLM: here only the tolerance check applies, and it fails.
    assert ready["canary"]["mode"] == "tolerance"
    assert 'artifactd_canary{mode="tolerance",outcome="failed"} 1.0' in prom

    listed = run_artifactd_json("quarantine", "ls", "--node-store", node, env=env)
    (entry,) = listed["quarantined"]
    assert entry["digest"] == digest and "canary failed" in entry["why"]
    run_artifactd_json("node-features", "--store", node, "--out", str(features), env=env)
    assert "/fp-" not in features.read_text()
    # The next pod on this node does not get it, however its tags name it.
    again = restore_from_node(tmp_path / "pod2")
    assert again["match"] != "full" and not (tmp_path / "pod2" / "generic").exists()
    assert all(f["verdict"] == "miss" for f in again["plan"]["families"])

    run_artifactd_json("quarantine", "rm", "--node-store", node, digest, env=env)
    assert (
        run_artifactd_json("quarantine", "ls", "--node-store", node, env=env)["quarantined"] == []
    )
    assert restore_from_node(tmp_path / "pod3")["match"] == "full"
    gone = run_artifactd("quarantine", "rm", "--node-store", node, digest, env=env)
    assert gone.returncode == 2 and "not quarantined" in gone.stderr
