"""Serve cells: warm an inference engine up by serving it real requests.

A ``serve`` cell (see :mod:`artifactd.build.matrix`) compiles what a real engine
compiles, the way it compiles it, by running it. Its lifecycle:

1. **start**: the engine's argv runs with the cell's environment (the fresh
   cache roots the builder made) through the cells' one launcher
   (:func:`artifactd.build.launch.start`: a session and process group of its
   own), its stdout and stderr going to the cell's log; the whole group is
   what gets signalled later, since engines fork workers (tokenisers,
   tensor-parallel ranks, compile pools) that write caches too;
2. **ready**: ``ready_url`` is polled (short timeouts, backoff up to 0.5 s)
   until it answers 200. An engine that exits first is a crash, reported at
   once with its exit status and the last lines of its log; one that is not
   ready after ``ready_timeout_s`` is stopped and reported the same way;
3. **requests**: each request group sends one OpenAI-compatible request per
   prompt length (``/v1/completions`` or ``/v1/chat/completions``, greedy,
   ``concurrency`` in flight, the group ``repeat`` times), so every shape the
   engine will compile in production is compiled now. Any answer but 200, or
   no answer, fails the cell;
4. **stop**: SIGTERM to the process group, ``shutdown_grace_s`` for it to
   exit, then SIGKILL to whatever is left of the group
   (:func:`artifactd.build.launch.stop`, as for a command cell).

Harvest must wait for the exit, of the whole group and not only the engine's
main process: caches are written by whichever process compiled (worker
processes and compile pools included), often after the answer that needed
them has gone out, and some only at shutdown (exit hooks that save an index
or a Mega-Cache); an entry is complete only once its last file is renamed
into place (Triton writes a kernel's group ``.json`` after its binaries). A
harvest racing a live writer could pack a half-written tree, or miss the
index that makes the rest usable. So :func:`run_serve` returns only once no
live process of the group is left, and it reports whether SIGKILL was needed
(a killed engine may have lost what it meant to write at exit). A process
that leaves the group (its own ``setsid``) is beyond its reach.

The result's ``checks`` hold a digest of the answers (in request order, not
completion order): greedy decoding on the same caches should answer the same.
This module is a library: it never prints and never exits; failures are
:class:`~artifactd.errors.BuildError` with a hint.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from artifactd import bounds as B  # noqa: N812
from artifactd.boundedhttp import ExchangeError, exchange, redact_url
from artifactd.build import launch
from artifactd.build.matrix import Cell, ServeCell, ServeRequests
from artifactd.errors import BuildError, UsageError
from artifactd.events import EventSink, discard
from artifactd.format.canary import Canary
from artifactd.pod.canary import CanaryAnswerError, CanaryResult, record, replay

#: Lines of the engine's log quoted in an error.
LOG_TAIL_LINES = 20
#: Bytes of an error answer's body quoted in an error.
BODY_HEAD_BYTES = 300
#: One readiness probe may take this long before it counts as "not yet".
PROBE_TIMEOUT_S = 2.0
#: Readiness polling starts this fast and backs off to at most the second value.
POLL_FIRST_S, POLL_MAX_S = 0.05, 0.5
#: Default wait for one answer: the first request of a shape may compile for minutes.
REQUEST_TIMEOUT_S = 1800.0
#: Most requests in flight at once, each on a thread of its own: a group's
#: ``concurrency`` above it is sent this many at a time (vLLM's largest default
#: ``max_num_seqs`` is 1024). The serve schema's upper bound for ``concurrency``
#: (one owner: :mod:`artifactd.bounds`).
MAX_CONCURRENCY = int(B.CONCURRENCY.hi)
#: Largest answer read from the engine, in bytes (a completion's JSON).
MAX_ANSWER_BYTES = 16 << 20
#: Failure lines kept from one ``send_requests`` (the rest are counted).
MAX_FAILURE_LINES = 20


@dataclass(frozen=True)
class ServeResult:
    """A served warm-up: stage timings, what was sent, and how the engine ended.

    ``killed``: SIGTERM was not enough and the group got SIGKILL after the
    grace period. ``returncode``: the engine's exit status (negative: the
    signal that ended it); a status other than 0 after SIGTERM is reported,
    not treated as a failure. ``checks``: ``responses_sha256``, see
    :func:`responses_digest`.
    """

    ready_s: float
    requests_s: float
    shutdown_s: float
    requests_sent: int
    killed: bool
    returncode: int
    checks: dict[str, str] = field(default_factory=dict)
    #: The canary recorded (the cell's ``serve.canary``), or None.
    canary: Canary | None = None
    #: The replay of ``replay_canary``'s canary (verify), or None.
    canary_replay: CanaryResult | None = None


@dataclass(frozen=True)
class _Request:
    group: int
    length: int  # index into the group's prompt_tokens
    repeat: int
    words: int
    url: str
    body: dict[str, Any]
    chat: bool


def prompt_text(words: int) -> str:
    """Return the deterministic prompt of ``words`` words: ``"w0 w1 ..."``."""
    return " ".join(f"w{i}" for i in range(words))


def _opener() -> urllib.request.OpenerDirector:
    # The engine is ours and local: a proxy from the environment must not see it.
    return urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _check_url(cell: Cell, what: str, url: str) -> None:
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme not in ("http", "https"):
        raise BuildError(
            f"cell {cell.id}: serve.{what} {url!r} is not an http(s) URL",
            hint="fix the URL template in the matrix",
        )


def _log_tail(log_path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with log_path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode(errors="replace")
    except OSError:
        return "(no log)"
    tail = text.strip().splitlines()[-lines:]
    return "\n".join("  | " + line for line in tail) if tail else "  | (empty log)"


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with status {returncode}"


def _wait_ready(
    cell: Cell, serve: ServeCell, proc: subprocess.Popen[bytes], log_path: Path
) -> None:
    """Poll ``ready_url`` until 200; raise BuildError if the engine exits or time runs out."""
    opener = _opener()
    start = time.monotonic()
    deadline = start + serve.ready_timeout_s
    delay = POLL_FIRST_S
    last = "no answer yet"
    while True:
        if proc.poll() is not None:
            raise BuildError(
                f"cell {cell.id}: the engine {_describe_exit(proc.returncode)} "
                f"after {time.monotonic() - start:.1f} s, before it was ready; "
                f"last lines of its log:\n{_log_tail(log_path)}",
                hint=f"full output in {log_path}",
            )
        left = deadline - time.monotonic()
        if left <= 0:
            raise BuildError(
                f"cell {cell.id}: the engine was not ready after {serve.ready_timeout_s:g} s "
                f"({serve.ready_url}: {last}); last lines of its log:\n{_log_tail(log_path)}",
                hint=f"full output in {log_path}; raise serve.ready_timeout_s in the matrix "
                "if the engine is only slow to load",
            )
        try:
            with opener.open(serve.ready_url, timeout=min(PROBE_TIMEOUT_S, left)) as resp:
                if resp.status == 200:
                    return
                last = f"HTTP {resp.status}"
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}"
            exc.close()
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", exc)
            last = f"{type(reason).__name__}: {reason}"
        # Sleeping in wait() notices an exit at once instead of after the delay.
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, min(delay, deadline - time.monotonic())))
        delay = min(delay * 2, POLL_MAX_S)


def _plan(serve: ServeCell, g: int) -> Iterator[_Request]:
    """Group ``g``'s requests: every prompt length, ``repeat`` times (repeat-major), lazily."""
    group = serve.requests[g]
    chat = group.kind == "chat"
    base = serve.base_url.rstrip("/")
    url = f"{base}/v1/chat/completions" if chat else f"{base}/v1/completions"
    for r in range(group.repeat):
        for i, words in enumerate(group.prompt_tokens):
            yield _Request(g, i, r, words, url, _body(serve, group, words, chat), chat)


def _body(serve: ServeCell, group: ServeRequests, words: int, chat: bool) -> dict[str, Any]:
    prompt = prompt_text(words)
    body: dict[str, Any] = {"model": serve.model}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    body.update(max_tokens=group.max_tokens, temperature=0)
    return body


class _RequestError(Exception):
    def __init__(self, request: _Request, what: str) -> None:
        super().__init__(what)
        self.request = request
        self.what = what


def _send(req: _Request, timeout: float, deadline: float | None = None) -> str:
    """POST one request; return the answer's text or raise _RequestError.

    The whole exchange within ``timeout`` and ``deadline``
    (:func:`artifactd.boundedhttp.exchange`), the answer at most
    :data:`MAX_ANSWER_BYTES`.
    """
    data = json.dumps(req.body).encode()
    try:
        answer = exchange(
            req.url,
            method="POST",
            body=data,
            headers={"Content-Type": "application/json"},
            timeout_s=timeout,
            deadline=deadline,
            max_bytes=MAX_ANSWER_BYTES,
        )
    except ExchangeError as exc:
        raise _RequestError(req, f"no answer ({exc.why})") from None
    except UsageError as exc:
        raise _RequestError(req, exc.message) from None
    status, raw = answer.status, answer.body
    head = raw[:BODY_HEAD_BYTES].decode(errors="replace").strip()
    if status != 200:
        raise _RequestError(req, f"HTTP {status}: {head}")
    try:
        choice = json.loads(raw)["choices"][0]
        text = choice["message"]["content"] if req.chat else choice["text"]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise _RequestError(req, f"not an OpenAI-shaped answer: {head}") from exc
    if not isinstance(text, str):
        raise _RequestError(req, f"the answer's text is not a string: {head}")
    return text


def _send_all(
    cell: Cell,
    serve: ServeCell,
    proc: subprocess.Popen[bytes],
    log_path: Path,
    timeout: float,
) -> dict[tuple[int, int, int], str]:
    """Send every group's requests; return the texts keyed by (group, length, repeat)."""
    texts: dict[tuple[int, int, int], str] = {}
    for g, group in enumerate(serve.requests):
        workers = min(group.concurrency, MAX_CONCURRENCY)
        pool = ThreadPoolExecutor(workers, thread_name_prefix=f"serve-{cell.id}")
        try:
            futures = {pool.submit(_send, req, timeout): req for req in _plan(serve, g)}
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            for fut in (f for f in futures if f in done):  # the first failure in plan order
                exc = fut.exception()
                if isinstance(exc, _RequestError):
                    raise _request_error(cell, proc, log_path, exc)
                if exc is not None:
                    raise _request_error(
                        cell, proc, log_path, _RequestError(futures[fut], repr(exc))
                    ) from exc
            texts.update({(r.group, r.length, r.repeat): f.result() for f, r in futures.items()})
        finally:
            # On a failure, requests still in flight end when the engine is stopped:
            # do not wait for them here.
            pool.shutdown(wait=False, cancel_futures=True)
    return texts


@dataclass(frozen=True)
class Sent:
    """What :func:`send_requests` sent: how many requests, how many answered, the failures.

    ``failures`` holds the first :data:`MAX_FAILURE_LINES` lines; ``requests -
    answered`` is how many failed (or were not sent before the deadline).
    """

    requests: int
    answered: int
    failures: list[str]


def send_requests(
    serve: ServeCell, timeout: float = REQUEST_TIMEOUT_S, *, deadline: float | None = None
) -> Sent:
    """Send every request group of ``serve`` to its ``base_url``, as a serve cell does.

    Each group's requests go ``concurrency`` at a time (at most
    :data:`MAX_CONCURRENCY` threads), the groups one after the other; each
    request's whole exchange within ``timeout``, and all of them within
    ``deadline`` (a :func:`time.monotonic` instant): what is not sent by then
    is counted as failed, unsent. The engine is someone else's
    (``status --prewarm``), so nothing here stops it or raises.
    """
    requests = sum(g.repeat * len(g.prompt_tokens) for g in serve.requests)
    answered = 0
    failed = 0
    failures: list[str] = []

    def record(fut: Future[str], req: _Request) -> None:
        nonlocal answered, failed
        exc = fut.exception()
        if exc is None:
            answered += 1
            return
        failed += 1
        if len(failures) < MAX_FAILURE_LINES:
            what = exc.what if isinstance(exc, _RequestError) else repr(exc)
            failures.append(
                f"request group {req.group}, prompt of {req.words} words, repeat {req.repeat}: "
                f"POST {_shown(req.url)}: {what}"
            )

    for g, group in enumerate(serve.requests):
        if deadline is not None and time.monotonic() >= deadline:
            break
        workers = min(group.concurrency, MAX_CONCURRENCY)
        with ThreadPoolExecutor(workers, thread_name_prefix="prewarm") as pool:
            pending: dict[Future[str], _Request] = {}
            for req in _plan(serve, g):
                if deadline is not None and time.monotonic() >= deadline:
                    break
                while len(pending) >= workers:
                    done, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for fut in done:
                        record(fut, pending.pop(fut))
                pending[pool.submit(_send, req, timeout, deadline)] = req
            wait(pending)
            for fut, req in pending.items():  # in the order they were sent
                record(fut, req)
    if failed > MAX_FAILURE_LINES:
        failures.append(f"... and {failed - MAX_FAILURE_LINES} more failed request(s)")
    unsent = requests - answered - failed
    if unsent:
        failures.append(f"{unsent} request(s) not sent: the deadline passed first")
    return Sent(requests, answered, failures)


def _shown(url: str) -> str:
    return redact_url(url)


def _request_error(
    cell: Cell, proc: subprocess.Popen[bytes], log_path: Path, exc: _RequestError
) -> BuildError:
    req = exc.request
    where = (
        f"request group {req.group} ({'chat' if req.chat else 'completions'}), "
        f"prompt of {req.words} words, repeat {req.repeat}"
    )
    status = proc.poll()
    died = f"; the engine {_describe_exit(status)}" if status is not None else ""
    return BuildError(
        f"cell {cell.id}: {where}: POST {_shown(req.url)} failed: {exc.what}{died}; "
        f"last lines of its log:\n{_log_tail(log_path)}",
        hint=f"full output in {log_path}; check serve.model, serve.base_url and the "
        "request groups against what the engine serves",
    )


def responses_digest(texts: Mapping[tuple[int, int, int], str]) -> str:
    """SHA-256 over the answers in (group, length, repeat) order, each length-prefixed."""
    digest = hashlib.sha256()
    for key in sorted(texts):
        data = texts[key].encode()
        digest.update(f"{key[0]}:{key[1]}:{key[2]}:{len(data)}\n".encode())
        digest.update(data)
    return digest.hexdigest()


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def run_serve(
    cell: Cell,
    env: Mapping[str, str],
    log_path: Path,
    *,
    on_event: EventSink = discard,
    request_timeout_s: float = REQUEST_TIMEOUT_S,
    replay_canary: Canary | None = None,
) -> ServeResult:
    """Start ``cell``'s engine, wait until ready, send its requests, stop it.

    After the requests, the cell's canary (``serve.canary``) is recorded
    (:func:`artifactd.pod.canary.record`: one more request), or, with
    ``replay_canary`` (``verify``), that canary is replayed instead and the
    verdict returned; a canary that cannot be recorded fails the cell.

    The engine runs with ``env`` (as given: nothing of this process's
    environment is added) and writes its output to ``log_path``. Returns once
    the engine and every process of its group have exited. Raises
    :class:`BuildError` when the engine cannot start, exits or is not ready in
    time, or a request fails; the engine is stopped first in every case.
    Events (``stage: "serve"``): ``start``, ``ready``, ``requests`` and
    ``stopped``, each with ``elapsed_ms``, the time the step it ends took.
    """
    serve = cell.serve
    if serve is None:
        raise BuildError(
            f"cell {cell.id} is not a serve cell", hint="run a command cell with run_cell"
        )
    if not serve.argv:
        raise BuildError(f"cell {cell.id}: serve.command rendered to nothing")
    _check_url(cell, "ready_url", serve.ready_url)
    _check_url(cell, "base_url", serve.base_url)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        with log_path.open("wb") as log:
            proc = launch.start(serve.argv, env, stdout=log)
    except OSError as exc:
        raise BuildError(
            f"cell {cell.id}: cannot start {serve.argv[0]!r}: {exc.strerror or exc}",
            hint="check serve.command in the matrix",
        ) from exc
    on_event(
        {
            "stage": "serve",
            "event": "start",
            "cell": cell.id,
            "pid": proc.pid,
            "port": serve.port,
            "elapsed_ms": _ms(time.monotonic() - t0),
        }
    )
    try:
        t_ready = time.monotonic()
        _wait_ready(cell, serve, proc, log_path)
        ready_s = time.monotonic() - t_ready
        on_event({"stage": "serve", "event": "ready", "cell": cell.id, "elapsed_ms": _ms(ready_s)})
        t_requests = time.monotonic()
        texts = _send_all(cell, serve, proc, log_path, request_timeout_s)
        requests_s = time.monotonic() - t_requests
        on_event(
            {
                "stage": "serve",
                "event": "requests",
                "cell": cell.id,
                "requests": len(texts),
                "elapsed_ms": _ms(requests_s),
            }
        )
        canary, replayed = _canary(cell, serve, replay_canary, on_event)
    except BaseException:
        launch.stop(proc, serve.shutdown_grace_s)
        raise
    t_stop = time.monotonic()
    killed, returncode = launch.stop(proc, serve.shutdown_grace_s)
    shutdown_s = time.monotonic() - t_stop
    on_event(
        {
            "stage": "serve",
            "event": "stopped",
            "cell": cell.id,
            "killed": killed,
            "returncode": returncode,
            "elapsed_ms": _ms(shutdown_s),
        }
    )
    return ServeResult(
        ready_s=round(ready_s, 3),
        requests_s=round(requests_s, 3),
        shutdown_s=round(shutdown_s, 3),
        requests_sent=len(texts),
        killed=killed,
        returncode=returncode,
        checks={"responses_sha256": responses_digest(texts)},
        canary=canary,
        canary_replay=replayed,
    )


def _canary(
    cell: Cell, serve: ServeCell, replay_canary: Canary | None, on_event: EventSink
) -> tuple[Canary | None, CanaryResult | None]:
    """Record the cell's canary, or replay ``replay_canary``; a failed record is a BuildError."""
    if replay_canary is not None:
        result = replay(replay_canary, serve.base_url)
        on_event(
            {
                "stage": "serve",
                "event": "canary",
                "cell": cell.id,
                "outcome": result.outcome,
                "mode": result.mode,
                "elapsed_ms": _ms(result.seconds),
            }
        )
        return None, result
    if serve.canary is None:
        return None, None
    started = time.monotonic()
    try:
        canary = record(serve.base_url, serve.model, serve.canary, cell.id)
    except CanaryAnswerError as exc:
        raise BuildError(
            f"cell {cell.id}: the canary could not be recorded: {exc}",
            hint="the engine must answer /v1/completions with `logprobs` and "
            "`return_token_ids` (vLLM's names); or drop serve.canary from the matrix",
        ) from None
    on_event(
        {
            "stage": "serve",
            "event": "canary",
            "cell": cell.id,
            "outcome": "recorded",
            "elapsed_ms": _ms(time.monotonic() - started),
        }
    )
    return canary, None
