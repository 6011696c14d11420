"""A tiny but real inference engine for the serve-cell tests.

It behaves like the engines a serve cell starts (vLLM, SGLang), at toy scale:

* an HTTP server (``ThreadingHTTPServer``) binds ``--port`` at once and answers
  ``GET /health`` with 503 while the model loads, 200 once it is ready;
* the model is a ``torch.compile``'d module (an embedding, two Linear layers,
  greedy argmax over a 97-word vocabulary) compiled with ``dynamic=False``:
  every new prompt length compiles a new prefill graph (one decode graph serves
  every step; both are made on the first request), and Inductor writes what
  it compiles under ``TORCHINDUCTOR_CACHE_DIR`` from the environment it was
  given;
* ``POST /v1/completions`` and ``POST /v1/chat/completions`` take
  OpenAI-shaped bodies, tokenise by splitting on whitespace (each word hashed
  into the vocabulary with CRC-32, so runs agree), decode greedily for
  ``max_tokens`` steps and answer OpenAI-shaped JSON with ``usage``; a request
  for another ``model`` is refused with 404, as vLLM does;
* ``logprobs`` (top-k, keyed ``token_id:N``), ``return_token_ids`` and
  ``seed``, with vLLM's names, and a list of prompts in one request (one
  choice each): what artifactd's canary sends; the logprobs come out of the
  compiled graph, so a poisoned cache entry shows in them; ``GET /version``
  answers ``{"version": ...}`` (``--engine-version``);
* ``GET /metrics`` is a Prometheus exposition (prometheus_client) with vLLM's
  names, kinds, HELP texts and buckets: ``vllm:request_prompt_tokens``,
  ``vllm:request_generation_tokens`` and ``vllm:request_params_max_tokens``
  (1-2-5 buckets up to ``--max-model-len``), ``vllm:iteration_tokens_total``
  (tokens per model step: the prompt for a prefill, 1 per decode step) and
  the gauge ``vllm:num_requests_running`` (requests in flight), labelled
  ``model_name`` and ``engine``, updated on every request;
* its log lines mark the phases of its start, as the real engines' do
  (:mod:`artifactd.pod.phases` reads them): ``model built in S s`` (weights),
  ``ready``, and per request that ran Dynamo ``torch.compile S s: fx graph
  cache H hit(s), M miss(es)`` (the request's time; the model compiles
  lazily, on requests), then the access line of each request;
* SIGTERM (or SIGINT) shuts the server down cleanly and exits 0, printing one
  JSON line last: ``{"tiny_engine": {"compiled": N, "cache_hits": M, ...}}``
  from Inductor's FX graph cache counters, so a test can see that a run on a
  warm cache compiled nothing. Exit hooks run, then ``os._exit`` skips the
  interpreter's slow module teardown. SIGTERM while the model loads ends the
  load at once (exit 0, nothing compiled).

Flags for failure tests: ``--startup-delay S`` (stay unready S more seconds),
``--crash-after-start`` (print an error and exit 3 before ready),
``--never-ready`` (health stays 503), ``--ignore-sigterm`` (only SIGKILL ends it).

Usage: python tiny_engine.py --port PORT [--model NAME] [flags]
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import signal
import sys
import threading
import time
import zlib
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, NamedTuple

from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest

if TYPE_CHECKING:
    import torch

    Prefill = Callable[[torch.Tensor], torch.Tensor]
    Decode = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]

VOCAB = 97
DIM = 32
#: Distinct prompt lengths Dynamo may compile before it falls back to eager.
MAX_GRAPHS = 64
CRASH_STATUS = 3


def log(message: str) -> None:
    """Write one line to stderr (the runner's log), in one write.

    Not ``print``: it writes the text and its newline in two calls to the
    unbuffered stderr, and the request threads' lines and the exit line on
    stdout (the same log file) could land between them, gluing the exit line
    to the end of another line where the tests could not find it.
    """
    sys.stderr.write(f"tiny-engine: {message}\n")
    sys.stderr.flush()


def token_ids(text: str) -> list[int]:
    """Tokenise: one token per whitespace-separated word, hashed into the vocabulary."""
    return [zlib.crc32(word.encode()) % VOCAB for word in text.split()]


class Generated(NamedTuple):
    """One completion: its text, the prompt's token ids, the generated ids, top-k logprobs."""

    text: str
    prompt_ids: list[int]
    ids: list[int]
    top: list[dict[str, float]]


class Model:
    """The compiled model: a prefill graph per prompt length, one decode graph.

    The weights are made at load (seeded: every run has the same model); the
    compiled functions on the first request, so that an engine which never
    serves one does not pay for importing Dynamo.
    """

    def __init__(self) -> None:
        # lazy: torch only once the engine loads its model: a crash before that needs no torch
        # (tests/test_serve.py)
        import torch  # noqa: PLC0415

        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(VOCAB, DIM)
        self.mix = torch.nn.Linear(DIM, DIM)
        self.out = torch.nn.Linear(DIM, VOCAB)
        self._compiled: tuple[Prefill, Decode] | None = None
        self.lock = threading.Lock()

    def compiled(self) -> tuple[Prefill, Decode]:
        """The ``torch.compile``'d prefill and decode (``dynamic=False``), made once."""
        if self._compiled is None:
            # lazy: torch, as above
            import torch  # noqa: PLC0415
            import torch._dynamo.config  # noqa: PLC0415

            torch._dynamo.config.recompile_limit = MAX_GRAPHS
            self._compiled = (
                torch.compile(self.prefill_eager, dynamic=False),
                torch.compile(self.decode_eager, dynamic=False),
            )
        return self._compiled

    def prefill_eager(self, ids: torch.Tensor) -> torch.Tensor:
        """Fold a prompt of ``L`` tokens into a state vector (position-weighted mean)."""
        # lazy: torch, as above
        import torch  # noqa: PLC0415

        h = torch.tanh(self.mix(self.emb(ids)))
        length = ids.shape[0]
        w = torch.arange(1, length + 1, dtype=h.dtype) / length
        return (h * w[:, None]).sum(0) / w.sum()

    def decode_eager(
        self, state: torch.Tensor, token: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One greedy step: the next token (argmax), the new state and the logprobs.

        The logprobs come out of the compiled graph, so a kernel of the cache
        that computes something else shows in them (and, past a point, in the token).
        """
        # lazy: torch, as above
        import torch  # noqa: PLC0415

        s = torch.tanh(self.mix(state + self.emb(token)[0]))
        logprobs = torch.log_softmax(self.out(s), -1)
        return logprobs.argmax(-1, keepdim=True), s, logprobs

    def generate(
        self,
        prompt: str,
        max_tokens: int,
        on_step: Callable[[int], None] = lambda n: None,
        top_k: int = 0,
    ) -> Generated:
        """Return the completion: its text, the prompt's ids, the generated ids, top-k logprobs.

        ``on_step`` is told the tokens of each model step (the prompt, then 1 per decode).
        """
        ids = token_ids(prompt)
        if not ids:
            raise ValueError("the prompt is empty")
        # lazy: torch, as above
        import torch  # noqa: PLC0415

        out: list[int] = []
        top: list[dict[str, float]] = []
        with self.lock, torch.no_grad():  # one request at a time, like a batch-1 scheduler
            before, started = counters(), time.monotonic()
            prefill, decode = self.compiled()
            tokens = torch.tensor(ids, dtype=torch.long)
            state = prefill(tokens)
            on_step(len(ids))
            token = tokens[-1:]
            for _ in range(max_tokens):
                token, state, logprobs = decode(state, token)
                on_step(1)
                out.append(int(token.item()))
                if top_k:
                    values, indices = torch.topk(logprobs, top_k)
                    top.append(
                        {
                            f"token_id:{int(i)}": float(v)
                            for v, i in zip(values.tolist(), indices.tolist(), strict=True)
                        }
                    )
            after = counters()
        hits = after["cache_hits"] - before["cache_hits"]
        misses = after["compiled"] - before["compiled"]
        if hits or misses:  # Dynamo compiled (or loaded) a graph in this request
            log(
                f"torch.compile {time.monotonic() - started:.3f} s: "
                f"fx graph cache {hits} hit(s), {misses} miss(es)"
            )
        return Generated(" ".join(f"t{t}" for t in out), ids, out, top)


def buckets_1_2_5(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50... up to ``max_value``: vLLM's token-count buckets."""
    out: list[int] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return out
            out.append(m * scale)
        scale *= 10


#: vLLM's tokens-per-step buckets (fixed since mid-2025).
STEP_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]


class Metrics:
    """The engine's /metrics: vLLM's traffic histograms and running gauge, in a registry."""

    def __init__(self, model_name: str, max_model_len: int) -> None:
        self.registry = CollectorRegistry()
        names = ["model_name", "engine"]
        labels = {"model_name": model_name, "engine": "0"}
        tokens = buckets_1_2_5(max_model_len)

        def histogram(name: str, doc: str, buckets: list[int]) -> Any:
            made = Histogram(name, doc, names, buckets=buckets, registry=self.registry)
            return made.labels(**labels)

        self.prompt = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens
        )
        self.generation = histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", tokens
        )
        self.max_tokens = histogram(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            tokens,
        )
        self.step = histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            STEP_BUCKETS,
        )
        self.running = Gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            names,
            registry=self.registry,
        ).labels(**labels)

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format."""
        return bytes(generate_latest(self.registry))


class State:
    """What the request handlers share."""

    def __init__(
        self, model_name: str, max_model_len: int = 2048, version: str = "tiny-engine 1.0"
    ) -> None:
        self.model_name = model_name
        self.version = version
        self.model: Model | None = None
        self.ready = False
        self.requests = 0
        self.count_lock = threading.Lock()
        self.metrics = Metrics(model_name, max_model_len)


class ApiError(Exception):
    """An OpenAI-shaped error answer."""

    def __init__(self, status: int, message: str, kind: str) -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def _int_field(body: dict[str, Any], name: str, default: int, low: int) -> int:
    value = body.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ApiError(400, f"`{name}` must be an integer of at least {low}", "BadRequestError")
    return value


def completion(  # noqa: PLR0912 - one check per field of the body, as the engines make them
    state: State, body: dict[str, Any], chat: bool
) -> dict[str, Any]:
    """Answer one /v1/completions or /v1/chat/completions body.

    ``prompt`` may be a list of strings (one choice each, as OpenAI's API);
    ``logprobs`` (an integer k, completions) returns the top-k logprobs of
    each generated token, keyed ``token_id:N``; ``return_token_ids`` adds
    ``prompt_token_ids`` and ``token_ids`` to each choice; ``seed`` is
    accepted (greedy decoding does not sample): vLLM's names for all three.
    """
    if body.get("model") != state.model_name:
        raise ApiError(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages
        ):
            raise ApiError(400, "`messages` must be a list of {role, content}", "BadRequestError")
        prompts = [" ".join(m["content"] for m in messages)]
    else:
        raw_prompt = body.get("prompt")
        if isinstance(raw_prompt, str):
            prompts = [raw_prompt]
        elif (
            isinstance(raw_prompt, list)
            and 0 < len(raw_prompt) <= 64
            and all(isinstance(p, str) for p in raw_prompt)
        ):
            prompts = list(raw_prompt)
        else:
            raise ApiError(400, "`prompt` must be a string or a list of them", "BadRequestError")
    max_tokens = _int_field(body, "max_tokens", 16, 1)
    top_k = 0 if body.get("logprobs") is None or chat else _int_field(body, "logprobs", 0, 0)
    if top_k > 20:
        raise ApiError(400, "`logprobs` must be at most 20", "BadRequestError")
    if body.get("seed") is not None:
        _int_field(body, "seed", 0, 0)
    ids_wanted = body.get("return_token_ids") is True
    if body.get("temperature", 0) not in (0, 0.0):
        raise ApiError(400, "only greedy decoding (temperature 0) is served", "BadRequestError")
    assert state.model is not None
    metrics = state.metrics
    choices: list[dict[str, Any]] = []
    prompt_tokens = 0
    for index, prompt in enumerate(prompts):
        metrics.running.inc()
        try:
            made = state.model.generate(prompt, max_tokens, metrics.step.observe, top_k)
        except ValueError as exc:
            raise ApiError(400, str(exc), "BadRequestError") from exc
        finally:
            metrics.running.dec()
        prompt_tokens += len(made.prompt_ids)
        metrics.prompt.observe(len(made.prompt_ids))
        metrics.generation.observe(max_tokens)  # greedy to the end: every request runs to its limit
        metrics.max_tokens.observe(max_tokens)
        choice: dict[str, Any] = {"index": index, "finish_reason": "length"}
        if chat:
            choice["message"] = {"role": "assistant", "content": made.text}
        else:
            logprobs = None
            if top_k:
                logprobs = {
                    "tokens": [f"token_id:{t}" for t in made.ids],
                    "token_logprobs": [
                        top.get(f"token_id:{t}") for t, top in zip(made.ids, made.top, strict=True)
                    ],
                    "top_logprobs": made.top,
                    "text_offset": [],
                }
            choice.update(text=made.text, logprobs=logprobs)
            if ids_wanted:
                choice.update(prompt_token_ids=made.prompt_ids, token_ids=made.ids)
        choices.append(choice)
    with state.count_lock:
        state.requests += 1
        number = state.requests
    completion_tokens = max_tokens * len(prompts)
    return {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{number}",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": state.model_name,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def make_handler(state: State) -> type[BaseHTTPRequestHandler]:
    """Return the request handler class bound to ``state``."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, status: int, doc: dict[str, Any]) -> None:
            data = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, exc: ApiError) -> None:
            self._send(
                exc.status,
                {"error": {"message": exc.message, "type": exc.kind, "code": exc.status}},
            )

        def do_GET(self) -> None:
            if self.path == "/health":
                if state.ready:
                    self._send(200, {"status": "ok"})
                else:
                    self._send(503, {"status": "loading"})
            elif self.path == "/metrics":
                data = state.metrics.exposition()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            elif self.path == "/version":
                self._send(200, {"version": state.version})
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": state.model_name}]})
            else:
                self._error(ApiError(404, f"no route {self.path}", "NotFoundError"))

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            routes = {"/v1/completions": False, "/v1/chat/completions": True}
            try:
                if self.path not in routes:
                    raise ApiError(404, f"no route {self.path}", "NotFoundError")
                if not state.ready:
                    raise ApiError(503, "the model is still loading", "ServiceUnavailableError")
                try:
                    body = json.loads(raw)
                except ValueError as exc:
                    raise ApiError(400, f"body is not JSON: {exc}", "BadRequestError") from exc
                if not isinstance(body, dict):
                    raise ApiError(400, "body must be a JSON object", "BadRequestError")
                self._send(200, completion(state, body, routes[self.path]))
            except ApiError as exc:
                self._error(exc)

        def log_message(self, format: str, *args: Any) -> None:
            log(f"{self.address_string()} {format % args}")

    return Handler


def counters() -> dict[str, int]:
    """Inductor's FX graph cache counters (zeros when nothing was ever compiled)."""
    if "torch._dynamo.utils" not in sys.modules:
        return {"compiled": 0, "cache_hits": 0, "bypassed": 0}
    # lazy: torch, as above
    from torch._dynamo.utils import counters as dynamo_counters  # noqa: PLC0415

    c = dynamo_counters["inductor"]
    return {
        "compiled": int(c["fxgraph_cache_miss"]),
        "cache_hits": int(c["fxgraph_cache_hit"]),
        "bypassed": int(c["fxgraph_cache_bypass"]),
    }


class Stopped(BaseException):
    """SIGTERM while the model loads: abandon the load (even mid-import) and exit."""


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGTERM; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--model", default="tiny-llm", help="the served model name")
    parser.add_argument("--max-model-len", type=int, default=2048, help="sizes /metrics buckets")
    parser.add_argument("--startup-delay", type=float, default=0.0)
    parser.add_argument("--crash-after-start", action="store_true")
    parser.add_argument("--ignore-sigterm", action="store_true")
    parser.add_argument("--never-ready", action="store_true")
    parser.add_argument("--engine-version", default="tiny-engine 1.0", help="GET /version says it")
    args = parser.parse_args(argv)

    stop = threading.Event()
    loading = [True]
    received: list[str] = []

    def on_signal(signum: int, frame: object) -> None:
        received.append(signal.Signals(signum).name)
        stop.set()
        if loading[0]:
            raise Stopped

    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    state = State(args.model, args.max_model_len, args.engine_version)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(state))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.1,), name="http", daemon=True).start()
    log(f"listening on http://{args.host}:{args.port} (model {args.model}), loading")
    try:
        if args.crash_after_start:
            log("error: simulated failure while loading the model; exiting with status 3")
            return CRASH_STATUS
        t0 = time.monotonic()
        state.model = Model()
        log(f"model built in {time.monotonic() - t0:.2f} s")
        loading[0] = False
    except Stopped:
        log("stopped while loading the model")
    if args.startup_delay > 0:
        stop.wait(args.startup_delay)
    if args.never_ready:
        log("--never-ready: /health stays 503")
    elif not stop.is_set():
        state.ready = True
        log("ready")
    while not stop.wait(0.5):  # wake up now and then so signal handlers run
        pass
    log(f"{received[0] if received else 'stop'}: shutting down")
    server.shutdown()
    server.server_close()
    report = {**counters(), "requests": state.requests}
    print(json.dumps({"tiny_engine": report}), flush=True)
    return 0


def exit_now(status: int) -> None:
    """Run the exit hooks (where caches may still be saved), flush, and end the process.

    ``os._exit`` skips only the interpreter's module teardown, which with Dynamo
    loaded takes over a second and writes nothing.
    """
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    exit_now(main())
