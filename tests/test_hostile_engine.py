"""Hostile engines and metrics endpoints: every exchange bounded, no password shown.

Issue 28, items 5 and 7 (the engine-facing part). The servers are real
loopback sockets answering from a thread, each answer crafted: a status line
or headers dripped a byte at a time, a ``/health`` that answers while
completions never do, metrics with values no engine would expose. The
commands run as users run them (``python -m artifactd``), and each test
asserts a generous ceiling on the time (it proves "does not hang", not a
speed), the documented exit code, that no password in a URL reaches stdout
or stderr, and that no traceback does.
"""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import clean_env, run_artifactd, tmpfs

from artifactd.boundedhttp import redact_url
from artifactd.build.cells import MAX_CONCURRENCY, MAX_FAILURE_LINES, send_requests
from artifactd.build.matrix import ServeCell, ServeRequests
from artifactd.build.shapes import MAX_GRAPH_SIZE, MAX_TOKENS, derived_graph_sizes
from artifactd.pod.readiness import NOT_READY_EXIT

SECRET = "s3cr3t-Pa55"
#: Generous: an interpreter start plus the deadline under test, on a loaded two-core VM.
CEILING_S = 45.0
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "metrics"


# --------------------------------------------------------------------------
# A loopback server with crafted answers
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """One request the server read: its method, path and headers (lower-case names)."""

    method: str
    path: str
    headers: dict[str, str]


@dataclass(frozen=True)
class Drip:
    """Send ``head`` a byte at a time, then header lines a byte at a time, until stopped."""

    head: bytes
    every_s: float = 0.3


HOLD = None  # read the request, never answer


@dataclass
class Crafted:
    """A TCP server on 127.0.0.1 answering each request as ``route`` says.

    ``route(seen)`` returns the bytes to send (then the connection is
    closed), a :class:`Drip`, or :data:`HOLD`. Requests are read in the accept
    loop (the clients here send theirs at once), so a thousand held
    connections cost no thread; a drip gets a thread of its own.
    """

    route: Callable[[Seen], bytes | Drip | None]
    seen: list[Seen] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    conns: list[socket.socket] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(2048)
        self.port = int(self.sock.getsockname()[1])
        self.threads = [threading.Thread(target=self._serve, daemon=True)]

    def url(self, path: str = "", userinfo: str = "") -> str:
        at = f"{userinfo}@" if userinfo else ""
        return f"http://{at}127.0.0.1:{self.port}{path}"

    def _read(self, conn: socket.socket) -> Seen | None:
        conn.settimeout(10)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk or len(data) > 1 << 20:
                return None
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        want = int(headers.get("content-length", "0"))
        while len(body) < want:
            chunk = conn.recv(65536)
            if not chunk:
                break
            body += chunk
        return Seen(method, path, headers)

    def _drip(self, conn: socket.socket, drip: Drip) -> None:
        payload = iter(drip.head + b"X-Drip: 1\r\n" * 100_000)
        try:
            for byte in payload:
                if self.stop.wait(drip.every_s):
                    return
                conn.sendall(bytes([byte]))
        except OSError:
            return

    def _serve(self) -> None:
        self.sock.settimeout(0.1)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.conns.append(conn)
            try:
                seen = self._read(conn)
            except (OSError, ValueError):
                continue
            if seen is None:
                continue
            self.seen.append(seen)
            answer = self.route(seen)
            if isinstance(answer, Drip):
                thread = threading.Thread(target=self._drip, args=(conn, answer), daemon=True)
                self.threads.append(thread)
                thread.start()
            elif answer is not None:
                try:
                    conn.sendall(answer)
                    conn.shutdown(socket.SHUT_WR)
                except OSError:
                    pass

    def __enter__(self) -> Crafted:
        self.threads[0].start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(10)
        for conn in self.conns:
            conn.close()
        self.sock.close()

    def posts(self) -> int:
        return sum(1 for s in self.seen if s.method == "POST")


def http_answer(body: bytes, status: str = "200 OK", kind: str = "text/plain") -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"Connection: close\r\n\r\n" + body


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def timed(
    *args: str, timeout: float = 90, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    proc = run_artifactd(*args, timeout=timeout, env=clean_env(env))
    return proc, time.monotonic() - start


def clean(proc: subprocess.CompletedProcess[str], code: int) -> None:
    """The exit code, no traceback, and no password anywhere in the output."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == code, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in out, out[-3000:]
    assert SECRET not in out, out[-3000:]


# --------------------------------------------------------------------------
# One deadline over the whole exchange
# --------------------------------------------------------------------------

DRIPS = {
    "status_line": Drip(b"HTTP/1.1 200 OK\r\n"),
    "headers": Drip(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"),
}


@pytest.mark.parametrize("where", sorted(DRIPS))
def test_a_metrics_url_that_drips_its_answer_is_cut_off_at_the_timeout(where: str) -> None:
    with Crafted(lambda seen: DRIPS[where]) as server:
        url = server.url("/metrics", f"scraper:{SECRET}")
        proc, took = timed("matrix", "shapes", "--from-metrics", url, "--timeout", "2")
    clean(proc, 3)
    assert "did not answer within 2 s" in proc.stderr, proc.stderr
    assert redact_url(url) in proc.stderr  # named, without its password
    assert took < CEILING_S, took
    # Its bytes did arrive: a per-read timeout (2 s, a byte every 0.3 s) never fires.
    assert server.seen and server.seen[0].headers["authorization"] == basic("scraper", SECRET)


def test_an_engine_whose_health_drips_is_not_serviceable_within_the_probe_time(
    tmp_path: Path,
) -> None:
    with Crafted(lambda seen: Drip(b"HTTP/1.1 200 OK\r\n")) as server:
        url = server.url()
        proc, took = timed(
            "status", "--target", str(tmp_path), "--engine-url", url, "--ready", "serviceable"
        )
    clean(proc, NOT_READY_EXIT)
    assert "did not answer within 2 s" in proc.stdout + proc.stderr
    assert took < CEILING_S, took


# --------------------------------------------------------------------------
# status --prewarm: an engine that answers /health and never a completion
# --------------------------------------------------------------------------


def health_only(seen: Seen) -> bytes | None:
    if seen.method == "GET" and seen.path == "/health":
        return http_answer(b"ok\n")
    return HOLD


def prewarm_matrix(path: Path, concurrency: int, repeat: int) -> Path:
    path.write_text(
        f"""\
name: hostile-engine
serve:
  command: "true"
  requests:
    - prompt_tokens: [1, 2]
      max_tokens: 1
      concurrency: {concurrency}
      repeat: {repeat}
"""
    )
    return path


# Waits out its deadlines (seconds of wall time): the full suite's, not the inner loop's.
@pytest.mark.slow
def test_prewarm_against_an_engine_that_never_completes_ends_at_its_deadline(
    tmp_path: Path,
) -> None:
    matrix = prewarm_matrix(tmp_path / "m.yaml", concurrency=64, repeat=100)
    with Crafted(health_only) as server:
        url = server.url(userinfo=f"probe:{SECRET}")
        target = str(tmp_path / "cache")
        args: tuple[str, ...] = ("status", "--target", target, "--engine-url", url)
        args += ("--prewarm", str(matrix), "--ready", "prewarmed")
        proc, took = timed(*args, "--prewarm-timeout", "3", "--json")
        text, _ = timed(*args, env={"ARTIFACTD_PREWARM_TIMEOUT": "3"})
        posts = server.posts()
        auth = {s.headers.get("authorization") for s in server.seen}
    clean(proc, NOT_READY_EXIT)
    clean(text, NOT_READY_EXIT)
    assert took < CEILING_S, took
    ready = json.loads(proc.stdout)["readiness"]
    assert ready["serviceable"] is True and ready["prewarmed"] is False
    assert ready["engine_url"] == f"http://***@127.0.0.1:{server.port}"
    sent = ready["prewarm"]
    assert (sent["requests"], sent["answered"]) == (200, 0)
    assert "200 of 200 warm-up request(s) failed" in ready["why_not"]
    assert "did not answer within" in ready["why_not"]
    assert len(sent["failures"]) <= MAX_FAILURE_LINES + 2
    # Never more in flight than the group's concurrency (each run held 64 at most).
    assert 0 < posts <= 2 * 64, posts
    # The credentials went to the engine they were given for, as Basic.
    assert auth == {basic("probe", SECRET)}


# Waits out its deadlines (seconds of wall time): the full suite's, not the inner loop's.
@pytest.mark.slow
def test_send_requests_caps_its_threads_and_stops_at_the_deadline() -> None:
    """Defence in depth under the serve schema: a million in flight, a hundred million sent."""
    # A group no schema would pass (model_construct skips validation): the sender's own caps.
    group = ServeRequests.model_construct(
        kind="completions", prompt_tokens=[1], max_tokens=1, concurrency=10**6, repeat=10**8
    )
    with Crafted(health_only) as server:
        cell = _serve_cell(server.url(), group)
        before = threading.active_count()
        start = time.monotonic()
        sent = send_requests(cell, 60, deadline=time.monotonic() + 4)
        took = time.monotonic() - start
        posts = server.posts()
    assert took < CEILING_S, took
    assert threading.active_count() <= before + 1  # the pool's threads are gone
    assert (sent.requests, sent.answered) == (10**8, 0)
    assert 0 < posts <= MAX_CONCURRENCY, posts
    assert len(sent.failures) <= MAX_FAILURE_LINES + 2
    assert "not sent: the deadline passed first" in sent.failures[-1]


def test_a_completion_that_drips_is_cut_at_the_per_request_timeout() -> None:
    def drip_posts(seen: Seen) -> bytes | Drip | None:
        return Drip(b"HTTP/1.1 200 OK\r\n") if seen.method == "POST" else health_only(seen)

    group = ServeRequests(prompt_tokens=[1, 2], max_tokens=1, concurrency=2)
    with Crafted(drip_posts) as server:
        start = time.monotonic()
        sent = send_requests(_serve_cell(server.url(userinfo=f"u:{SECRET}"), group), 1.5)
        took = time.monotonic() - start
    assert took < CEILING_S, took
    assert (sent.requests, sent.answered) == (2, 0)
    assert all("did not answer within 1.5 s" in line for line in sent.failures), sent.failures
    assert not any(SECRET in line for line in sent.failures)


def _serve_cell(url: str, group: ServeRequests) -> Any:
    return ServeCell.model_construct(
        argv=["true"],
        ready_url=f"{url}/health",
        base_url=url,
        model="m",
        port=18000,
        ready_timeout_s=1.0,
        requests=[group],
        shutdown_grace_s=0.0,
    )


# --------------------------------------------------------------------------
# Malformed and secret-bearing URLs
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://[::1",
        f"http://probe:{SECRET}@[::1",
        f"http://probe:{SECRET}@127.0.0.1:99999",
        f"http://probe:{SECRET}@127.0.0.1:port",
        "ftp://127.0.0.1/",
        "http://127.0.0.1/a b",
    ],
)
def test_a_malformed_engine_url_is_a_usage_error(tmp_path: Path, url: str) -> None:
    proc, took = timed("status", "--target", str(tmp_path), "--engine-url", url)
    clean(proc, 2)
    assert "--engine-url" in proc.stderr and "hint:" in proc.stderr, proc.stderr
    metrics, _ = timed("matrix", "shapes", "--from-metrics", url)
    if url.startswith("http"):
        clean(metrics, 2)
        assert "--from-metrics" in metrics.stderr, metrics.stderr
    assert took < CEILING_S


def test_a_password_in_a_metrics_url_is_never_shown(tmp_path: Path) -> None:
    """Sent as Basic to its host; absent from errors, text and --json alike."""
    exposition = (FIXTURES / "vllm-replica-a.prom").read_bytes()

    def route(seen: Seen) -> bytes:
        if seen.headers.get("authorization") != basic("scraper", SECRET):
            return http_answer(b"who are you\n", "401 Unauthorized")
        if seen.path == "/broken":
            return http_answer(b"oops\n", "500 Internal Server Error")
        return http_answer(exposition)

    with Crafted(route) as server:
        good = server.url("/metrics", f"scraper:{SECRET}")
        ok, _ = timed("matrix", "shapes", "--from-metrics", good, "--json")
        ok_text, _ = timed("matrix", "shapes", "--from-metrics", good)
        broken, _ = timed(
            "matrix", "shapes", "--from-metrics", server.url("/broken", f"scraper:{SECRET}")
        )
        wrong, _ = timed(
            "matrix", "shapes", "--from-metrics", server.url("/metrics", "scraper:nope")
        )
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://scraper:{SECRET}@127.0.0.1:{sock.getsockname()[1]}/metrics"
    refused, _ = timed("matrix", "shapes", "--from-metrics", closed)
    clean(ok, 0)
    clean(ok_text, 0)
    assert json.loads(ok.stdout)["sources"] == [f"http://***@127.0.0.1:{server.port}/metrics"]
    clean(broken, 3)
    assert "answered HTTP 500" in broken.stderr
    assert wrong.returncode == 3 and "answered HTTP 401" in wrong.stderr
    clean(refused, 3)
    assert "unreachable" in refused.stderr


# --------------------------------------------------------------------------
# matrix shapes: values no engine would expose
# --------------------------------------------------------------------------


def exposition(running: str = "12.0", bound: str = "500.0", count: str = "1000") -> bytes:
    lines = [f'vllm:num_requests_running{{engine="0"}} {running}']
    for name in ("vllm:request_prompt_tokens", "vllm:request_generation_tokens"):
        lines += [
            f'{name}_bucket{{le="100.0"}} 10',
            f'{name}_bucket{{le="{bound}"}} {count}',
            f'{name}_bucket{{le="+Inf"}} {count}',
        ]
    return ("\n".join(lines) + "\n").encode()


HOSTILE_VALUES = {
    "running_1e12": {"running": "1e12"},
    "bound_1e300": {"bound": "1e300"},
    "running_and_bound_at_float_max": {"running": "1.7e308", "bound": "1.7e308"},
}


@pytest.mark.parametrize("case", sorted(HOSTILE_VALUES))
def test_hostile_metric_values_are_clamped_to_the_serve_schema_range(
    tmp_path: Path, case: str
) -> None:
    body = exposition(**HOSTILE_VALUES[case])
    with Crafted(lambda seen: http_answer(body)) as server:
        url = server.url("/metrics", f"scraper:{SECRET}")
        proc, took = timed("matrix", "shapes", "--from-metrics", url, "--json", timeout=60)
    clean(proc, 0)
    assert took < CEILING_S, took
    doc = json.loads(proc.stdout)
    for group in doc["requests"]:
        assert all(1 <= n <= MAX_TOKENS for n in group["prompt_tokens"]), group
        assert 1 <= group["max_tokens"] <= MAX_TOKENS, group
        assert 1 <= group["concurrency"] <= MAX_CONCURRENCY, group
        assert 1 <= group.get("repeat", 1) <= MAX_CONCURRENCY, group
    assert all(1 <= s <= MAX_GRAPH_SIZE for s in doc["cuda_graph_sizes"])
    assert len(doc["cuda_graph_sizes"]) <= len(derived_graph_sizes(MAX_CONCURRENCY))
    assert any("clamped" in note for note in doc["notes"]), doc["notes"]
    assert len(proc.stdout) < 64 << 10  # no 301-digit numbers, no million sizes


def test_a_bucket_count_past_two_to_the_53_is_refused(tmp_path: Path) -> None:
    scrape = tmp_path / "count.prom"
    scrape.write_bytes(exposition(count="1e300"))
    proc, _ = timed("matrix", "shapes", "--from-metrics", str(scrape))
    clean(proc, 2)
    assert "counts 1e+300" in proc.stderr and str(scrape) in proc.stderr


def test_derived_graph_sizes_are_computed_not_walked() -> None:
    start = time.monotonic()
    sizes = derived_graph_sizes(10**12)
    assert time.monotonic() - start < 5
    assert sizes[-1] == MAX_CONCURRENCY
    assert derived_graph_sizes(1) == [1]
    assert derived_graph_sizes(3) == [1, 2, 4]
    assert derived_graph_sizes(9) == [1, 2, 4, 8, 16]
    assert derived_graph_sizes(48) == [1, 2, 4, 8, 16, 24, 32, 40, 48]


# --------------------------------------------------------------------------
# --write into a directory that cannot be written
# --------------------------------------------------------------------------


@pytest.fixture
def read_only_matrix(tmp_path: Path) -> Iterator[Path]:
    """A serve matrix on a tmpfs remounted read-only (chmod would not stop root)."""
    with tmpfs(tmp_path / "ro", "1m") as mount:
        matrix = mount / "m.yaml"
        prewarm_matrix(matrix, concurrency=1, repeat=1)
        ro = subprocess.run(
            ["mount", "-o", "remount,ro", str(mount)], capture_output=True, text=True, check=False
        )
        if ro.returncode:
            pytest.skip(f"remounting the tmpfs read-only is not permitted: {ro.stderr.strip()}")
        yield matrix


def test_write_into_a_read_only_dir_is_exit_10_and_the_matrix_unchanged(
    read_only_matrix: Path,
) -> None:
    before = read_only_matrix.read_bytes()
    scrape = FIXTURES / "vllm-replica-a.prom"
    proc, took = timed(
        "matrix", "shapes", "--from-metrics", str(scrape), "--write", str(read_only_matrix)
    )
    clean(proc, 10)
    assert f"cannot write {read_only_matrix}" in proc.stderr, proc.stderr
    assert "Read-only file system" in proc.stderr and "hint:" in proc.stderr
    assert read_only_matrix.read_bytes() == before
    assert took < CEILING_S
