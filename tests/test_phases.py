"""The engine's start, phase by phase (``status --engine-log``, ``exec --engine-log``).

The vLLM and SGLang logs are ``tests/fixtures/enginelogs/``: the lines in the
engines' own formats, release and source file of each named in its
``SOURCE.txt``. The tiny engine's phases, end to end through the exec wrapper,
are in ``tests/test_readiness.py`` (slow); here the exec wrapper's copier runs
a shell command.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import PYTHON, run_artifactd

from artifactd.pod.enginelogs import scan
from artifactd.pod.phases import MAX_LOG_BYTES, PhaseTime, stamp_line

LOGS = Path(__file__).resolve().parent / "fixtures" / "enginelogs"


def phases_of(lines: list[str]) -> dict[str, PhaseTime]:
    return {p.phase: p for p in scan(lines).phases()}


def fixture_phases(name: str) -> dict[str, PhaseTime]:
    return phases_of((LOGS / name).read_text().splitlines())


def test_vllm_log_gives_every_phase() -> None:
    phases = fixture_phases("vllm-0.11-warm.log")
    assert list(phases) == ["weights", "compile", "cuda_graphs", "ready", "first_request"]
    # "Model loading took ... and 15.134829 seconds": the load as vLLM timed it.
    assert phases["weights"].seconds == 15.135
    # "torch.compile takes 6.71 s in total", and the graphs loaded from the cache: a hit.
    assert (phases["compile"].seconds, phases["compile"].outcome) == (6.71, "hit")
    # Two capture bars, 67 and 35 shapes; "Graph capturing finished in 16 secs".
    assert (phases["cuda_graphs"].seconds, phases["cuda_graphs"].shapes) == (16.0, 102)
    # The first stamped line (09:14:02) to uvicorn's untimed "Application startup
    # complete." (timed by the line before it, 09:15:01).
    assert phases["ready"].seconds == 59.0
    # The health check is not a request; the completion after the 09:15:07 line is.
    assert phases["first_request"].seconds == 6.0
    assert all(p.source == "vLLM" for p in phases.values())


def test_sglang_log_gives_its_phases_and_waits_for_its_own_ready_line() -> None:
    phases = fixture_phases("sglang-0.5-warm.log")
    # SGLang prints no torch.compile line of its own: no compile phase.
    assert list(phases) == ["weights", "cuda_graphs", "ready", "first_request"]
    assert phases["weights"].seconds == 10.12  # "Load weight end. elapsed=10.12 s"
    assert (phases["cuda_graphs"].seconds, phases["cuda_graphs"].shapes) == (5.84, 8)
    # Ready is "fired up" (09:20:27), not uvicorn's startup (09:20:25), from 09:20:01.
    assert phases["ready"].seconds == 26.0
    assert phases["ready"].source == "SGLang"
    # SGLang's own warm-up POST /generate came before ready; the first request is 09:20:41.
    assert phases["first_request"].seconds == 14.0


def test_a_vllm_compile_miss_is_compiled() -> None:
    lines = [
        "INFO 11-20 09:14:38 [backends.py:190] Compiling a graph for dynamic shape takes 21.37 s",
        "INFO 11-20 09:14:41 [monitor.py:34] torch.compile takes 27.02 s in total",
    ]
    compile_ = phases_of(lines)["compile"]
    assert (compile_.seconds, compile_.outcome) == (27.02, "compiled")


def test_the_exec_wrappers_stamps_time_every_phase_from_the_process_start() -> None:
    start = 1_800_000_000.0
    lines = [
        stamp_line(b"artifactd-exec: started vllm serve m (pid 7)\n", start),
        stamp_line(
            b"INFO 11-20 09:14:33 [gpu_model_runner.py:2653] Model loading took "
            b"15.2683 GiB and 15.134829 seconds\n",
            start + 40.5,
        ),
        stamp_line(b"INFO:     Application startup complete.\n", start + 70.25),
        stamp_line(
            b'INFO:     10.0.3.7:51234 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n',
            start + 71.0,
        ),
    ]
    phases = phases_of([line.decode() for line in lines])
    # The process start is the wrapper's: weights include the imports before vLLM's timer.
    assert phases["weights"].seconds == 40.5
    assert phases["ready"].seconds == 70.25
    assert phases["first_request"].seconds == 0.75
    # The stamp is taken off before the compile evidence is read.
    assert scan([line.decode() for line in lines]).lines == 4


def test_a_log_without_times_gives_the_durations_its_lines_report() -> None:
    phases = phases_of(
        ["Load weight end. type=Qwen3ForCausalLM", "Capture cuda graph end. Time elapsed: 3.5 s."]
    )
    assert phases["weights"].seconds is None
    assert phases["cuda_graphs"].seconds == 3.5
    assert "ready" not in phases


def status_json(*args: str) -> dict[str, Any]:
    proc = run_artifactd("status", *args, "--json")
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def test_status_reports_phases_as_json_text_and_metrics(tmp_path: Path) -> None:
    log = LOGS / "vllm-0.11-warm.log"
    metrics = tmp_path / "status.prom"
    doc = status_json(
        "--target", str(tmp_path), "--engine-log", str(log), "--metrics-file", str(metrics)
    )
    phases = {p["phase"]: p for p in doc["phases"]}
    assert phases["cuda_graphs"] == {
        "phase": "cuda_graphs",
        "seconds": 16.0,
        "source": "vLLM",
        "outcome": None,
        "shapes": 102,
        "line": phases["cuda_graphs"]["line"],
    }
    assert "Graph capturing finished in 16 secs" in phases["cuda_graphs"]["line"]
    text = metrics.read_text()
    assert 'artifactd_engine_phase_seconds{phase="cuda_graphs"} 16.0' in text
    assert 'artifactd_engine_phase_seconds{phase="compile"} 6.71' in text
    assert "artifactd_engine_cuda_graph_shapes 102.0" in text
    shown = run_artifactd("status", "--target", str(tmp_path), "--engine-log", str(log))
    assert shown.returncode == 0
    assert "engine start:" in shown.stdout and "102 shapes" in shown.stdout


def test_exec_engine_log_copies_both_streams_stamped(tmp_path: Path) -> None:
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "artifactd.env").write_text("")
    log = tmp_path / "logs" / "engine.log"
    script = (
        "import sys; print('out line'); print('err line', file=sys.stderr); print('tail', end='')"
    )
    proc = run_artifactd(
        "exec",
        "--target",
        str(tmp_path / "cache"),
        "--engine-log",
        str(log),
        "--",
        PYTHON,
        "-c",
        script,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "out line\ntail"
    assert proc.stderr == "err line\n"
    lines = log.read_text().splitlines()
    assert lines[0].startswith("artifactd-exec ") and "artifactd-exec: started " in lines[0]
    rest = sorted(line.split(" | ", 1)[1] for line in lines[1:])
    assert rest == ["err line", "out line", "tail"]
    stamps = [float(line.split()[1]) for line in lines]
    assert stamps == sorted(stamps)


def test_exec_is_the_engines_parent_and_keeps_its_exit_status_with_an_engine_log(
    tmp_path: Path,
) -> None:
    (tmp_path / "artifactd.env").write_text("")
    log = tmp_path / "engine.log"
    proc = subprocess.run(
        [
            PYTHON,
            "-m",
            "artifactd",
            "exec",
            "--target",
            str(tmp_path),
            "--engine-log",
            str(log),
            "--",
            PYTHON,
            "-c",
            "import os, sys; print(os.getppid()); sys.exit(7)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 7
    # The started line names exec's own process, which the engine runs under.
    assert "(pid " + proc.stdout.strip() + ")" in log.read_text()


def test_an_engine_log_that_cannot_be_opened_is_a_warning(tmp_path: Path) -> None:
    (tmp_path / "artifactd.env").write_text("")
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = run_artifactd(
        "exec",
        "--target",
        str(tmp_path),
        "--engine-log",
        str(blocker / "engine.log"),
        "--",
        PYTHON,
        "-c",
        "print('ran')",
    )
    assert proc.returncode == 0
    assert proc.stdout == "ran\n"
    assert "warning: cannot open the engine log" in proc.stderr


@pytest.mark.parametrize("name", ["vllm-0.11-warm.log", "sglang-0.5-warm.log"])
def test_fixture_sources_are_named(name: str) -> None:
    assert name in (LOGS / "SOURCE.txt").read_text()


def test_a_full_engine_log_stops_growing_and_the_engine_still_speaks(tmp_path: Path) -> None:
    """At its size limit the log gets one last line; the engine's output still passes."""
    (tmp_path / "artifactd.env").write_text("")
    log = tmp_path / "engine.log"
    with log.open("wb") as f:
        f.truncate(MAX_LOG_BYTES - 200)  # sparse: room for the start line, not for much more
    script = "for i in range(2000): print('line', i)"
    proc = run_artifactd(
        "exec", "--target", str(tmp_path), "--engine-log", str(log), "--", PYTHON, "-c", script
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "line 1999"
    size = log.stat().st_size
    assert MAX_LOG_BYTES - 200 < size <= MAX_LOG_BYTES + 200, size
    with log.open("rb") as f:
        f.seek(MAX_LOG_BYTES - 200)
        tail = f.read().decode()
    assert "artifactd-exec: started" in tail
    assert tail.rstrip("\n").endswith("the log is full (67108864 bytes): no more lines"), tail
