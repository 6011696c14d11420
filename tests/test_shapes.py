"""``matrix shapes``: serve requests from an engine's traffic metrics.

The expositions are ``tests/fixtures/metrics/*.prom`` (the engines' real metric
families with synthetic counts, see the README there) and the tiny engine's
own ``/metrics``. Coverage is checked against the raw bucket lines of the
files, read here with a regex, not with the parser the module uses.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import PYTHON, clean_env, run_artifactd

from artifactd.build.matrix import ServeRequests, load_matrix
from artifactd.build.matrix_edit import replace_requests
from artifactd.build.scrape import MAX_EXPOSITION_BYTES
from artifactd.build.shapes import Shapes, shapes_from_metrics
from artifactd.errors import ConfigError, StoreError, UsageError
from artifactd.reports import REPORT_SCHEMA_VERSION

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "metrics"
A = FIXTURES / "vllm-replica-a.prom"
B = FIXTURES / "vllm-replica-b.prom"
EARLY = FIXTURES / "vllm-early-v1.prom"
SGLANG = FIXTURES / "sglang.prom"
ENGINE = Path(__file__).resolve().parent / "engines" / "tiny_engine.py"


# --------------------------------------------------------------------------
# The independent reading: raw bucket lines, summed over files and series
# --------------------------------------------------------------------------


def raw_cumulative(paths: Sequence[Path], name: str) -> dict[float, float]:
    """{le: cumulative count} of histogram ``name``, summed over every series of every file."""
    line = re.compile(rf"^{re.escape(name)}_bucket\{{(?P<labels>[^}}]*)\}} (?P<value>\S+)$")
    out: dict[float, float] = {}
    for path in paths:
        for text in path.read_text().splitlines():
            match = line.match(text)
            if match:
                le = re.search(r'le="([^"]+)"', match["labels"])
                assert le is not None
                bound = math.inf if le[1] == "+Inf" else float(le[1])
                out[bound] = out.get(bound, 0.0) + float(match["value"])
    assert out, f"no {name} in {paths}"
    return out


def raw_gauge(paths: Sequence[Path], name: str) -> list[float]:
    line = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$")
    return [float(m[1]) for p in paths for t in p.read_text().splitlines() if (m := line.match(t))]


def interval_counts(cum: dict[float, float]) -> dict[tuple[float, float], float]:
    """{(lower, upper): count}, the first bucket starting at 0."""
    out, lower, below = {}, 0.0, 0.0
    for bound in sorted(cum):
        out[(lower, bound)] = cum[bound] - below
        lower, below = bound, cum[bound]
    return out


def chosen_intervals(result: Shapes) -> list[tuple[float, float]]:
    return [(b.lower, math.inf if b.upper is None else b.upper) for b in result.prompt_buckets]


def reaches(part: float, total: float, q: float) -> bool:
    return Fraction(part) >= Fraction(repr(q)) * Fraction(total)


VLLM_NAMES = {
    "prompt": "vllm:request_prompt_tokens",
    "generation": "vllm:request_generation_tokens",
    "steps": "vllm:iteration_tokens_total",
    "running": "vllm:num_requests_running",
}
SGLANG_NAMES = {
    "prompt": "sglang:prompt_tokens_histogram",
    "generation": "sglang:generation_tokens_histogram",
    "running": "sglang:num_running_reqs",
}


@pytest.mark.parametrize("coverage", [0.5, 0.9, 0.99, 1.0])
@pytest.mark.parametrize(
    ("paths", "names"),
    [([A], VLLM_NAMES), ([A, B], VLLM_NAMES), ([SGLANG], SGLANG_NAMES)],
    ids=["vllm-one", "vllm-two-replicas", "sglang"],
)
def test_shapes_cover_the_asked_fraction(
    paths: list[Path], names: dict[str, str], coverage: float
) -> None:
    result = shapes_from_metrics([str(p) for p in paths], coverage=coverage)
    counts = interval_counts(raw_cumulative(paths, names["prompt"]))
    total = sum(counts.values())
    assert result.requests_observed == total
    chosen = chosen_intervals(result)
    held = sum(counts[c] for c in chosen)  # KeyError: a bucket the files do not have
    assert reaches(held, total, coverage), (held, total, coverage)
    assert held / total == pytest.approx(result.prompt_covered)
    # The smallest set: without its least populated bucket, the rest fall short.
    assert not reaches(held - min(counts[c] for c in chosen), total, coverage)
    # One prompt length per chosen bucket, inside it.
    lengths = result.requests[0].prompt_tokens
    assert len(lengths) == len(chosen)
    for (lower, upper), tokens in zip(chosen, lengths, strict=True):
        assert lower < tokens <= upper

    generation = raw_cumulative(paths, names["generation"])
    assert reaches(generation[result.max_tokens], generation[math.inf], coverage)
    assert all(r.max_tokens == result.max_tokens for r in result.requests)

    running = sorted(raw_gauge(paths, names["running"]))
    rank = math.ceil(Fraction(repr(coverage)) * len(running))
    assert result.concurrency == math.ceil(running[rank - 1])
    assert max(r.concurrency for r in result.requests) == result.concurrency

    if "steps" in names:
        steps = raw_cumulative(paths, names["steps"])
        top = max(result.cuda_graph_sizes)
        assert reaches(steps[top], steps[math.inf], coverage)
        used = {b for b, n in interval_counts(steps).items() if n > 0 and b[1] <= top}
        assert {int(u) for _, u in used} == set(result.cuda_graph_sizes)
        assert result.cuda_graph_from == "step_tokens"
    else:
        assert result.cuda_graph_from == "concurrency"
        assert max(result.cuda_graph_sizes) >= result.concurrency
        assert f"--cuda-graph-bs {' '.join(map(str, result.cuda_graph_sizes))}" == (
            result.cuda_graph_flag
        )


def test_replicas_are_summed_bucket_by_bucket() -> None:
    both = shapes_from_metrics([str(A), str(B)], coverage=1.0)
    one_a = interval_counts(raw_cumulative([A], VLLM_NAMES["prompt"]))
    one_b = interval_counts(raw_cumulative([B], VLLM_NAMES["prompt"]))
    for bucket in both.prompt_buckets:
        key = (bucket.lower, math.inf if bucket.upper is None else bucket.upper)
        assert bucket.count == one_a[key] + one_b[key]
    assert both.requests_observed == sum(one_a.values()) + sum(one_b.values())
    assert both.concurrency_samples == 2


def test_replicas_with_different_buckets_merge_at_the_bounds_they_share() -> None:
    """vLLM sizes its token buckets from --max-model-len: two replicas may differ."""
    result = shapes_from_metrics([str(EARLY), str(A)], coverage=0.99)
    shared = set(raw_cumulative([EARLY], VLLM_NAMES["prompt"])) & set(
        raw_cumulative([A], VLLM_NAMES["prompt"])
    )
    for lower, upper in chosen_intervals(result):
        assert upper in shared
        assert lower == 0 or lower in shared
    assert any("bounds they share" in n for n in result.notes)
    steps = set(raw_cumulative([EARLY], VLLM_NAMES["steps"])) & set(
        raw_cumulative([A], VLLM_NAMES["steps"])
    )
    assert set(result.cuda_graph_sizes) <= steps


def test_the_cli_prints_the_table_and_the_yaml_and_a_versioned_json(tmp_path: Path) -> None:
    proc = run_artifactd("matrix", "shapes", "--from-metrics", str(A), "--from-metrics", str(B))
    assert proc.returncode == 0, proc.stderr
    assert "bucket granularity" in proc.stdout
    assert "cudagraph_capture_sizes" in proc.stdout
    snippet = proc.stdout[proc.stdout.index("  requests:") :]
    lines = [line[2:] for line in snippet.splitlines()]
    parsed = yaml.safe_load("\n".join(lines))["requests"]
    expected = shapes_from_metrics([str(A), str(B)], coverage=0.99).requests
    assert [ServeRequests.model_validate(r) for r in parsed] == expected

    proc = run_artifactd(
        "matrix", "shapes", "--from-metrics", str(SGLANG), "--coverage", "0.9", "--json"
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["schema_version"] == REPORT_SCHEMA_VERSION
    assert doc["engine"] == "sglang"
    assert doc["metrics"]["prompt"] == "sglang:prompt_tokens_histogram"
    assert doc["written"] is None
    assert doc["requests"][0]["prompt_tokens"] == [b["tokens"] for b in doc["prompt_buckets"]]


# --------------------------------------------------------------------------
# Refusals: usage, missing metrics, hostile input
# --------------------------------------------------------------------------


def one_error(proc: subprocess.CompletedProcess[str], code: int, text: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert text in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("coverage", ["0", "1.5", "-0.1"])
def test_coverage_outside_zero_one_is_a_usage_error(coverage: str) -> None:
    proc = run_artifactd("matrix", "shapes", "--from-metrics", str(A), "--coverage", coverage)
    one_error(proc, 2, "--coverage")
    with pytest.raises(UsageError):
        shapes_from_metrics([str(A)], coverage=float(coverage))


def test_sglang_without_its_token_histograms_says_which_flag(tmp_path: Path) -> None:
    scrape = tmp_path / "sglang-default.prom"
    kept = [
        line
        for line in SGLANG.read_text().splitlines(keepends=True)
        if "tokens_histogram" not in line
    ]
    scrape.write_text("".join(kept))
    proc = run_artifactd("matrix", "shapes", "--from-metrics", str(scrape))
    one_error(proc, 2, "sglang:prompt_tokens_histogram")
    assert "--collect-tokens-histogram" in proc.stderr


def test_an_engine_that_served_nothing_is_refused(tmp_path: Path) -> None:
    scrape = tmp_path / "idle.prom"
    scrape.write_text(re.sub(r"(_bucket\{[^}]*\}|_count\{[^}]*\}) \S+", r"\1 0.0", A.read_text()))
    with pytest.raises(ConfigError, match="counts no requests"):
        shapes_from_metrics([str(scrape)])


def test_no_engine_metrics_and_both_engines_are_refused(tmp_path: Path) -> None:
    other = tmp_path / "node.prom"
    other.write_text("# TYPE node_load1 gauge\nnode_load1 0.5\n")
    proc = run_artifactd("matrix", "shapes", "--from-metrics", str(other))
    one_error(proc, 2, "no vLLM or SGLang metrics")
    with pytest.raises(ConfigError, match="both vLLM and SGLang"):
        shapes_from_metrics([str(A), str(SGLANG)])
    # --engine picks one, and reads only its families.
    assert shapes_from_metrics([str(A), str(SGLANG)], engine="sglang").engine == "sglang"


HOSTILE_TEXT = {
    "not_exposition": ("{{{ not metrics\n", "not a Prometheus text exposition"),
    "bad_le": (
        'vllm:request_prompt_tokens_bucket{le="ten"} 1\n'
        'vllm:request_prompt_tokens_bucket{le="+Inf"} 1\n',
        "le='ten' is not a number",
    ),
    "no_inf": ('vllm:request_prompt_tokens_bucket{le="10.0"} 1\n', 'no le="+Inf" bucket'),
    "decreasing": (
        'vllm:request_prompt_tokens_bucket{le="10.0"} 5\n'
        'vllm:request_prompt_tokens_bucket{le="+Inf"} 2\n',
        "counts decrease",
    ),
    "negative": (
        'vllm:request_prompt_tokens_bucket{le="10.0"} -1\n'
        'vllm:request_prompt_tokens_bucket{le="+Inf"} 2\n',
        "counts -1.0",
    ),
    "nan": (
        'vllm:request_prompt_tokens_bucket{le="10.0"} NaN\n'
        'vllm:request_prompt_tokens_bucket{le="+Inf"} 2\n',
        "counts nan",
    ),
    "twice": (
        'vllm:request_prompt_tokens_bucket{le="10.0"} 1\n'
        'vllm:request_prompt_tokens_bucket{le="10"} 1\n'
        'vllm:request_prompt_tokens_bucket{le="+Inf"} 2\n',
        "twice",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_TEXT))
def test_malformed_expositions_are_refused_naming_the_source(tmp_path: Path, case: str) -> None:
    text, message = HOSTILE_TEXT[case]
    path = tmp_path / f"{case}.prom"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        shapes_from_metrics([str(path)])
    assert message in str(err.value)
    assert str(path) in str(err.value)
    assert err.value.hint


def test_huge_binary_and_special_files_are_refused_before_parsing(tmp_path: Path) -> None:
    huge = tmp_path / "huge.prom"
    with huge.open("wb") as f:
        f.truncate(MAX_EXPOSITION_BYTES + 1)  # sparse: no disk, and refused by its size
    t0 = time.monotonic()
    proc = run_artifactd("matrix", "shapes", "--from-metrics", str(huge))
    one_error(proc, 2, f"over {MAX_EXPOSITION_BYTES} bytes")
    binary = tmp_path / "binary.prom"
    binary.write_bytes(A.read_bytes()[:100] + b"\0\x01\x02")
    one_error(run_artifactd("matrix", "shapes", "--from-metrics", str(binary)), 2, "binary")
    latin = tmp_path / "latin1.prom"
    latin.write_bytes(b"# HELP x caf\xe9\n")
    one_error(run_artifactd("matrix", "shapes", "--from-metrics", str(latin)), 2, "not UTF-8")
    fifo = tmp_path / "fifo.prom"
    os.mkfifo(fifo)  # nothing ever writes it: reading must not wait
    one_error(run_artifactd("matrix", "shapes", "--from-metrics", str(fifo)), 2, "FIFO")
    missing = tmp_path / "missing.prom"
    one_error(run_artifactd("matrix", "shapes", "--from-metrics", str(missing)), 2, "missing")
    assert time.monotonic() - t0 < 60


@contextmanager
def tcp_server(behaviour: str) -> Iterator[str]:
    """A loopback HTTP-ish server: 'silent' accepts and never answers, 'trickle' sends
    headers then a byte a second forever, 'flood' sends an endless body fast."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    stop = threading.Event()
    conns: list[socket.socket] = []

    def serve() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            conns.append(conn)
            if behaviour == "silent":
                continue
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n")
            try:
                while not stop.is_set():
                    if behaviour == "trickle":
                        conn.sendall(b"#")
                        stop.wait(1)
                    else:
                        conn.sendall(b"# " + b"x" * 65536 + b"\n")
            except OSError:
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/metrics"
    finally:
        stop.set()
        thread.join(5)
        for conn in conns:
            conn.close()
        sock.close()


@pytest.mark.parametrize("behaviour", ["silent", "trickle"])
def test_a_url_that_hangs_or_trickles_times_out(behaviour: str) -> None:
    with tcp_server(behaviour) as url:
        t0 = time.monotonic()
        proc = run_artifactd("matrix", "shapes", "--from-metrics", url, "--timeout", "1.5")
        took = time.monotonic() - t0
    one_error(proc, 3, f"{url} did not answer within 1.5 s")
    assert took < 20  # interpreter start-up plus the 1.5 s, never the trickle's forever


def test_a_url_that_floods_is_cut_at_the_cap() -> None:
    with tcp_server("flood") as url, pytest.raises(ConfigError, match="sent over"):
        shapes_from_metrics([url], timeout_s=30)


def test_an_unreachable_url_is_exit_3() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed when the block ends: nothing listens
    proc = run_artifactd("matrix", "shapes", "--from-metrics", f"http://127.0.0.1:{port}/metrics")
    one_error(proc, 3, "unreachable")
    with pytest.raises(StoreError):
        shapes_from_metrics([f"http://127.0.0.1:{port}/metrics"])


# --------------------------------------------------------------------------
# --write: the requests block replaced, every other byte kept
# --------------------------------------------------------------------------


def split_around_requests(text: str, end_marker: str) -> tuple[str, str]:
    """Return the text before ``  requests:`` and from ``end_marker`` on (found here)."""
    start = text.index("\n  requests:\n") + 1
    end = text.index(end_marker, start)
    return text[:start], text[end:]


@pytest.mark.parametrize(
    ("name", "end_marker"),
    [
        ("vllm-h100.yaml", "# The builder sets every cache directory"),
        ("sglang-h20.yaml", "# The builder sets every cache directory"),
    ],
)
def test_write_replaces_only_the_requests_block(tmp_path: Path, name: str, end_marker: str) -> None:
    path = tmp_path / name
    shutil.copyfile(ROOT / "warmup_matrices" / name, path)
    path.chmod(0o640)
    old = path.read_text()
    before = load_matrix(path)
    proc = run_artifactd(
        "matrix", "shapes", "--from-metrics", str(A), "--from-metrics", str(B), "--write", str(path)
    )
    assert proc.returncode == 0, proc.stderr
    new = path.read_text()
    old_head, old_tail = split_around_requests(old, end_marker)
    assert new.startswith(old_head)
    assert new.endswith(old_tail)
    assert new != old
    after = load_matrix(path)
    expected = shapes_from_metrics([str(A), str(B)], coverage=0.99).requests
    assert after.serve is not None and before.serve is not None
    assert after.serve.requests == expected
    assert after.model_dump(exclude={"serve"}) == before.model_dump(exclude={"serve"})
    assert after.serve.model_dump(exclude={"requests"}) == before.serve.model_dump(
        exclude={"requests"}
    )
    assert "# from traffic: artifactd matrix shapes --coverage 0.99" in new
    assert path.stat().st_mode & 0o777 == 0o640
    # Again, with the same traffic: the same file.
    comment = "from traffic: " + new.split("# from traffic: ")[1].split("\n")[0]
    replace_requests(path, expected, comment=comment)
    assert path.read_text() == new


def test_write_keeps_crlf_and_a_block_at_the_end_of_the_file(tmp_path: Path) -> None:
    text = (
        "name: t\r\n# the engine\r\nserve:\r\n  command: run {{ port }}\r\n"
        "  requests: [{prompt_tokens: [1]}]  # inline\r\n"
    )
    path = tmp_path / "m.yaml"
    path.write_bytes(text.encode())
    reqs = [ServeRequests(prompt_tokens=[5, 50], max_tokens=7, concurrency=2, repeat=2)]
    new = replace_requests(path, reqs)
    assert path.read_bytes() == new.encode()
    head = "name: t\r\n# the engine\r\nserve:\r\n  command: run {{ port }}\r\n"
    assert new.startswith(head)
    assert "\n" not in new.replace("\r\n", "")
    assert new.endswith("\r\n")
    matrix = load_matrix(path)
    assert matrix.serve is not None and matrix.serve.requests == reqs


REFUSED = {
    "command matrix": ("name: t\ncommand: echo hi\n", "no top-level `serve:`"),
    "no requests key": ("name: t\nserve:\n  command: run\n", "no `requests:` key"),
    "two requests keys": (
        "name: t\nserve:\n  command: run\n  requests: []\n  requests:\n    - {max_tokens: 3}\n",
        "2 `requests:` key",
    ),
    "inline serve": ("name: t\nserve: {command: run}\n", "serve is written inline"),
    "two serve keys": (
        "name: t\nserve:\n  command: a\nserve:\n  command: b\n  requests: []\n",
        "has `serve:` on lines 2, 4",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_write_refuses_what_it_cannot_locate_and_writes_nothing(tmp_path: Path, case: str) -> None:
    text, message = REFUSED[case]
    path = tmp_path / "m.yaml"
    path.write_text(text)
    if case != "two serve keys":  # duplicate keys: the YAML loader would take the last
        load_matrix(path)
    proc = run_artifactd("matrix", "shapes", "--from-metrics", str(A), "--write", str(path))
    one_error(proc, 2, message)
    assert path.read_text() == text


# --------------------------------------------------------------------------
# End to end: the tiny engine's own /metrics
# --------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    data = json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    request = urllib.request.Request(url, data=data, headers=headers)  # noqa: S310 - loopback
    with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310 - loopback
        doc: dict[str, Any] = json.loads(response.read())
        return doc


@pytest.mark.torch
@pytest.mark.slow
def test_tiny_engine_metrics_give_buckets_that_cover_the_lengths_sent(tmp_path: Path) -> None:
    """Real HTTP, real torch.compile (one graph per prompt length: slow on 2 cores)."""
    port = free_port()
    (tmp_path / "tmp").mkdir()
    env = clean_env(
        {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "TMPDIR": str(tmp_path / "tmp")}
    )
    log = (tmp_path / "engine.log").open("w")
    engine = subprocess.Popen(
        [PYTHON, str(ENGINE), "--port", str(port), "--max-model-len", "1000"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    sent = {3: 4, 7: 4, 30: 6, 120: 6, 400: 2}  # words (one token each) -> max_tokens
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2) as r:  # noqa: S310
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "engine.log").read_text()
            time.sleep(0.2)
        for words, max_tokens in sent.items():
            prompt = " ".join(f"w{i}" for i in range(words))
            answer = post(
                f"{base}/v1/completions",
                {"model": "tiny-llm", "prompt": prompt, "max_tokens": max_tokens},
            )
            assert answer["usage"]["prompt_tokens"] == words
        proc = run_artifactd(
            "matrix", "shapes", "--from-metrics", f"{base}/metrics", "--coverage", "1", "--json"
        )
    finally:
        engine.terminate()
        engine.wait(30)
        log.close()
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["engine"] == "vllm"
    assert doc["requests_observed"] == len(sent)
    assert doc["prompt_covered"] == 1
    buckets = [(b["lower"], b["upper"]) for b in doc["prompt_buckets"]]
    for words in sent:
        assert any(lo < words <= up for lo, up in buckets), (words, buckets)
    assert doc["max_tokens"] >= max(sent.values())
    # Steps: one prefill of each length and one step per decoded token.
    assert doc["cuda_graph_from"] == "step_tokens"
    assert max(doc["cuda_graph_sizes"]) >= max(sent)
    assert doc["concurrency"] == 1  # scraped when idle: the gauge reads 0 (floored to 1)
