"""An engine's start, phase by phase, from its own log (``status --engine-log``).

Once the compile caches hit, another stage becomes the longest of a pod's
start (often CUDA-graph capture); a single "ready after N s" cannot say which.
This module reads the lines the engines print as they start and reports:

========================  =================================================================
``restore``               the restore's verify and fetch, from the marker's
                          ``restore_seconds`` (:mod:`artifactd.restore.install`)
``weights``               engine process start to weights loaded (without the exec
                          wrapper's clock: the load time the line reports, if it does)
``compile``               torch.compile / graph compile, with its outcome: ``hit`` or
                          ``compiled`` (the vLLM evidence of :mod:`artifactd.pod.enginelogs`)
``cuda_graphs``           CUDA-graph capture, with the number of shapes captured
``ready``                 engine process start to ready (the whole start)
``first_request``         ready to the first successful completion request
========================  =================================================================

Each phase is a duration in seconds. Where a line reports its own duration
(vLLM's "took ... seconds", SGLang's "elapsed=") that figure is the phase's;
otherwise the phase is the difference of two line times.

**Line times.** ``artifactd exec --engine-log FILE`` writes every line the
engine prints prefixed with the wall-clock time it was read
(``artifactd-exec <epoch> | <line>``, :func:`stamp_line`) and a first line
when it starts the engine: the precise clock. Without it, the engines' own
timestamps are read (vLLM's ``INFO MM-DD HH:MM:SS``, whole seconds and no
year, taken as UTC of the year of the first stamped line or of now; SGLang's
``[YYYY-MM-DD HH:MM:SS``), the first stamped line standing for the process
start, and a line without a time (uvicorn's) taking the time of the last line
that had one. The copied log trails the engine by the copier's few
milliseconds: a status run just after a request may not see its lines yet
(the verdict, from the files, does not depend on them).

**The lines read** (quoted from the sources that print them):

vLLM (vllm-project/vllm, V1 engine, read at the 0.10 / 0.11 releases):

* ``vllm/v1/worker/gpu_model_runner.py``, ``load_model``:
  ``Model loading took %.4f GiB and %.6f seconds`` (earlier
  ``Model loading took %.4f GiB memory and %.6f seconds``);
* ``vllm/compilation/monitor.py``, ``end_monitoring_torch_compile``:
  ``torch.compile takes %.2f s in total``;
* ``vllm/v1/worker/gpu_model_runner.py``, ``capture_model``:
  ``Graph capturing finished in %.0f secs, took %.2f GiB``, after tqdm bars
  ``Capturing CUDA graphs (<mode>, <runtime mode>): 100%|...| N/N`` whose
  totals are the shapes captured;
* uvicorn (the API server): ``Application startup complete.`` (ready) and
  its access lines ``"POST /v1/completions HTTP/1.1" 200 OK`` (a request).

SGLang (sgl-project/sglang, 0.5.x, ``python/sglang/srt/``):

* ``model_executor/model_runner.py``, ``load_model``:
  ``Load weight end. elapsed=%.2f s, type=...`` (``elapsed=`` since 0.5; older
  lines without it are timed by their stamp);
* ``model_executor/cuda_graph_runner.py``: ``Capture cuda graph bs [1, 2, ...]``
  (the shapes) and ``model_runner.py``, ``init_device_graphs``:
  ``Capture cuda graph end. Time elapsed: %.2f s. ...``;
* ``entrypoints/http_server.py``, ``_wait_and_warmup``:
  ``The server is fired up and ready to roll!``; its uvicorn access lines carry
  SGLang's ``[date time]`` prefix (``"POST /generate HTTP/1.1" 200 OK``).
  SGLang's torch.compile (``--enable-torch-compile``) runs inside the graph
  capture and prints no line of its own: no ``compile`` phase for SGLang.

The tiny test engine (``tests/engines/tiny_engine.py``) prints
``tiny-engine: model built in %.2f s``, ``tiny-engine: ready``,
``tiny-engine: torch.compile %.3f s: fx graph cache %d hit(s), %d miss(es)``
(once per request that ran Dynamo; it compiles lazily, on requests) and
``"POST /v1/completions HTTP/1.1" 200`` access lines.
"""

from __future__ import annotations

import calendar
import math
import re
import time
from dataclasses import dataclass, field
from typing import Literal

#: The phases, in the order of a start.
PHASES = ("restore", "weights", "compile", "cuda_graphs", "ready", "first_request")
Phase = Literal["restore", "weights", "compile", "cuda_graphs", "ready", "first_request"]

#: What ``artifactd exec --engine-log`` puts before each line it copies.
STAMP_PREFIX = "artifactd-exec "
#: The engine log's bounds, one owner for its writer and its reader. ``exec``
#: writes a longer line in pieces of this many bytes, and ``status`` reads the
#: first :data:`MAX_READ_LINE` bytes of a longer line (a piece and its stamp).
MAX_LINE_BYTES = 65536
MAX_READ_LINE = MAX_LINE_BYTES + 64
#: ``exec`` stops writing the log at this size; ``status`` reads no more of a log
#: than its size when opened, and at most this (plus one line): the start's
#: phases are in its first lines, and a log still growing is never chased.
MAX_LOG_BYTES = 64 << 20
MAX_READ_BYTES = MAX_LOG_BYTES + MAX_READ_LINE
#: A time or duration read from a log is believed up to this many seconds (a
#: stamp: until the year 2286; a phase: 115 days); a larger one is ignored.
MAX_SECONDS = 1e10
#: A count read from a log (shapes, hits) has at most this many digits.
MAX_COUNT_DIGITS = 9
#: Distinct CUDA-graph bars counted (one per mode and rank); more are not.
MAX_BARS = 64
_STAMPED = re.compile(r"artifactd-exec (?P<t>\d+(?:\.\d+)?) \| ?(?P<rest>.*)$", re.DOTALL)

_VLLM_TIME = re.compile(
    r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<mo>\d\d)-(?P<d>\d\d) "
    r"(?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:\.\d+)? \["
)
_SGLANG_TIME = re.compile(
    r"^\[(?P<y>\d{4})-(?P<mo>\d\d)-(?P<d>\d\d) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)"
    r"(?:\.\d+)?(?: [^\]]*)?\]"
)

_WEIGHTS = (
    ("vLLM", re.compile(r"Model loading took [0-9.]+ GiB(?: memory)? and (?P<s>[0-9.]+) s")),
    ("SGLang", re.compile(r"Load weight end\.(?: elapsed=(?P<s>[0-9.]+) s)?")),
    ("tiny engine", re.compile(r"tiny-engine: model built in (?P<s>[0-9.]+) s")),
)
_COMPILE_VLLM = re.compile(r"torch\.compile takes (?P<s>[0-9.]+) s in total")
_COMPILE_TINY = re.compile(
    r"tiny-engine: torch\.compile (?P<s>[0-9.]+) s: fx graph cache (?P<hits>\d+) hit\(s\), "
    r"(?P<misses>\d+) miss\(es\)"
)
_GRAPHS_VLLM = re.compile(r"Graph capturing finished in (?P<s>[0-9.]+) secs?")
#: vLLM's finished bar, ``Capturing CUDA graphs (<what>): 100%|...| N/N``, read by
#: :func:`_finished_bar` in time linear in the line (a regex with a lazy ``.*?``
#: between them took seconds on one hostile line).
_BAR_HEAD = "Capturing CUDA graphs ("
_BAR_DONE = re.compile(r"\):\s*100%")
_BAR_COUNT = re.compile(r"\|\s*(\d+)/(\d+)\b")
_GRAPHS_SGLANG = re.compile(r"Capture cuda graph end\. Time elapsed: (?P<s>[0-9.]+) s")
_GRAPHS_SGLANG_BS = re.compile(r"Capture cuda graph bs \[(?P<bs>[0-9, ]*)\]")
#: An engine's own "ready" line; uvicorn's (vLLM's only one) stands in when there is none.
_READY = (
    ("SGLang", re.compile(r"The server is fired up and ready to roll!")),
    ("tiny engine", re.compile(r"tiny-engine: ready$")),
)
_UVICORN_READY = re.compile(r"Application startup complete\.")
_REQUEST = re.compile(
    r"\"POST /(?:v1/completions|v1/chat/completions|generate)(?:\?[^ \"]*)? HTTP/[0-9.]+\" 200\b"
)

#: Every line a phase is read from holds one of these: one search skips the rest of a log.
_ANY = re.compile(
    r"Model loading took|Load weight end|model built in|torch\.compile|Capturing CUDA graphs"
    r"|Capture cuda graph|Graph capturing finished|Application startup complete|fired up"
    r"|tiny-engine: ready|\"POST /"
)

#: Evidence kept per phase.
MAX_LINE = 300


@dataclass(frozen=True)
class PhaseTime:
    """One phase of an engine's start.

    ``seconds`` is its duration (None when the log does not say); ``source``
    what said it (``vLLM``, ``SGLang``, ``tiny engine``, ``restore marker``);
    ``outcome`` for ``compile`` (``hit`` or ``compiled``, None when unknown),
    ``shapes`` for ``cuda_graphs``; ``line`` the line it was read from.
    """

    phase: Phase
    seconds: float | None
    source: str
    outcome: str | None = None
    shapes: int | None = None
    line: str = ""


@dataclass
class PhaseClock:
    """What one read of a log found about the start; :meth:`phases` turns it into phases."""

    #: The engine process start (the exec wrapper's line, else the first stamped line).
    started: float | None = None
    exact_start: bool = False
    last_time: float | None = None
    year: int | None = None
    #: (source, seconds reported or None, time of the line, line) per event.
    weights: tuple[str, float | None, float | None, str] | None = None
    ready: tuple[str, float | None, str] | None = None
    engine_ready: bool = False
    vllm_seen: bool = False
    first_request: tuple[float | None, str] | None = None
    compile_s: float | None = None
    compile_source: str = ""
    compile_line: str = ""
    tiny_hits: int = 0
    tiny_misses: int = 0
    graphs_s: float | None = None
    graphs_source: str = ""
    graphs_line: str = ""
    vllm_shapes: int = 0
    sglang_shapes: int | None = None
    _seen_bars: set[str] = field(default_factory=set)

    def feed(self, line: str) -> str:
        """Take one log line (ANSI colours stripped); return it without the exec wrapper's stamp."""
        stamp: float | None = None
        if line.startswith(STAMP_PREFIX) and (m := _STAMPED.match(line)) is not None:
            stamp, line = log_seconds(m.group("t")), m.group("rest")
            if stamp is not None and line.startswith("artifactd-exec: started "):
                self.started, self.exact_start = stamp, True
        if "\r" in line:  # tqdm redraws a bar with carriage returns
            for segment in line.split("\r"):
                self._segment(segment.strip(), stamp)
        else:
            self._segment(line, stamp)
        return line

    def _segment(self, line: str, stamp: float | None) -> None:
        if not line:
            return
        when = stamp if stamp is not None else self._own_time(line)
        if when is not None:
            self.last_time = when
            if self.started is None:
                self.started = when
        else:
            when = self.last_time
        self._event(line, when)

    def _own_time(self, line: str) -> float | None:
        m = _SGLANG_TIME.match(line)
        if m is not None:
            self.year = int(m.group("y"))
            return _utc(self.year, m)
        m = _VLLM_TIME.search(line)
        if m is not None:
            if self.year is None:
                self.year = time.gmtime().tm_year
            return _utc(self.year, m)
        return None

    def _event(self, line: str, when: float | None) -> None:  # noqa: PLR0911, PLR0912 - one kind per line
        if not self.vllm_seen and _VLLM_TIME.search(line):
            self.vllm_seen = True
        if _ANY.search(line) is None:
            return
        short = line[:MAX_LINE]
        if self.weights is None:
            for source, pattern in _WEIGHTS:
                if (m := pattern.search(line)) is not None:
                    said = m.group("s")
                    self.weights = (source, log_seconds(said) if said else None, when, short)
                    return
        if not self.engine_ready:
            for source, pattern in _READY:
                if pattern.search(line):
                    # SGLang is ready after uvicorn is, and after its own warm-up request.
                    self.ready, self.engine_ready, self.first_request = (
                        (source, when, short),
                        True,
                        None,
                    )
                    return
            if self.ready is None and _UVICORN_READY.search(line):
                self.ready = ("vLLM" if self.vllm_seen else "uvicorn", when, short)
                return
        if self.first_request is None and self.ready is not None and _REQUEST.search(line):
            self.first_request = (when, short)
            return
        if (m := _COMPILE_VLLM.search(line)) is not None:
            self._compiled(log_seconds(m.group("s")))
            self.compile_source, self.compile_line = "vLLM", short
            return
        if (m := _COMPILE_TINY.search(line)) is not None:
            self._compiled(log_seconds(m.group("s")))
            self.tiny_hits += log_count(m.group("hits")) or 0
            self.tiny_misses += log_count(m.group("misses")) or 0
            self.compile_source = "tiny engine"
            self.compile_line = self.compile_line or short
            return
        if (bar := _finished_bar(line)) is not None:
            key, n = bar[0][:MAX_LINE], bar[1]  # one count per bar (a redraw repeats its end)
            if key not in self._seen_bars and len(self._seen_bars) < MAX_BARS:
                self._seen_bars.add(key)
                self.vllm_shapes += n
            return
        if (m := _GRAPHS_SGLANG_BS.search(line)) is not None:
            self.sglang_shapes = len([b for b in m.group("bs").split(",") if b.strip()])
            return
        for source, pattern in (("vLLM", _GRAPHS_VLLM), ("SGLang", _GRAPHS_SGLANG)):
            if (m := pattern.search(line)) is not None:
                said = log_seconds(m.group("s"))
                if said is not None:  # every rank captures; the slowest one is the phase
                    self.graphs_s = max(self.graphs_s or 0.0, said)
                    self.graphs_source, self.graphs_line = source, short
                return

    def _compiled(self, said: float | None) -> None:
        if said is not None:
            self.compile_s = min((self.compile_s or 0.0) + said, MAX_SECONDS)

    def phases(self, *, compile_outcome: str | None = None) -> list[PhaseTime]:
        """Return the engine's phases found (in :data:`PHASES` order, ``restore`` excluded).

        ``compile_outcome`` is the engine evidence's verdict on its compiles
        (``hit`` or ``compiled``); the tiny engine's own counters decide its own.
        """
        out: list[PhaseTime] = []
        if self.weights is not None:
            source, said, when, line = self.weights
            seconds = _since(self.started, when) if self.exact_start or said is None else said
            out.append(PhaseTime("weights", _round(seconds), source, line=line))
        if self.compile_s is not None:
            outcome = compile_outcome
            if self.compile_source == "tiny engine":
                outcome = "compiled" if self.tiny_misses else "hit"
            out.append(
                PhaseTime(
                    "compile",
                    _round(self.compile_s),
                    self.compile_source,
                    outcome,
                    None,
                    self.compile_line,
                )
            )
        if self.graphs_s is not None:
            shapes = (
                self.vllm_shapes or None if self.graphs_source == "vLLM" else self.sglang_shapes
            )
            out.append(
                PhaseTime(
                    "cuda_graphs",
                    _round(self.graphs_s),
                    self.graphs_source,
                    None,
                    shapes,
                    self.graphs_line,
                )
            )
        if self.ready is not None:
            source, when, line = self.ready
            out.append(PhaseTime("ready", _round(_since(self.started, when)), source, line=line))
            if self.first_request is not None:
                at, first = self.first_request
                out.append(PhaseTime("first_request", _round(_since(when, at)), source, line=first))
        return out


def _finished_bar(line: str) -> tuple[str, int] | None:
    """Return (what, N) of vLLM's finished bar ``Capturing CUDA graphs (what): 100%|..| N/N``.

    Each head is tried once, each ``)`` and each ``|`` looked at once: linear in the line.
    """
    start = 0
    while (head := line.find(_BAR_HEAD, start)) >= 0:
        close = line.find(")", head + len(_BAR_HEAD))
        if close < 0:
            return None
        done = _BAR_DONE.match(line, close)
        if done is None:  # every head before this ")" ends at it too
            start = close + 1
            continue
        for m in _BAR_COUNT.finditer(line, done.end()):
            if m.group(1) == m.group(2):
                n = log_count(m.group(1))
                return None if n is None else (line[head + len(_BAR_HEAD) : close], n)
        return None
    return None


def log_seconds(text: str) -> float | None:
    """Return a time or duration read from a log, or None unless finite in 0..:data:`MAX_SECONDS`.

    ``[0-9.]+`` also matches ``1.2.3`` and 400-digit numbers: a log is input.
    """
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and 0 <= value <= MAX_SECONDS else None


def log_count(text: str) -> int | None:
    """Return a count read from a log (digits), or None when it has too many digits."""
    return int(text) if text.isdigit() and len(text) <= MAX_COUNT_DIGITS else None


def _utc(year: int, m: re.Match[str]) -> float | None:
    try:
        fields = (year, *(int(m.group(k)) for k in ("mo", "d", "h", "mi", "s")), 0, 0, 0)
        return float(calendar.timegm(fields))
    except (ValueError, OverflowError):
        return None


def _since(start: float | None, end: float | None) -> float | None:
    if start is None or end is None:
        return None
    return max(0.0, end - start)


def _round(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)


def stamp_line(line: bytes, when: float | None = None) -> bytes:
    """Return ``line`` (one line, its newline included) as ``exec --engine-log`` writes it."""
    at = time.time() if when is None else when
    return f"{STAMP_PREFIX}{at:.3f} | ".encode() + line


def restore_phase(restore_seconds: float | None) -> PhaseTime | None:
    """Return the ``restore`` phase from the marker's ``restore_seconds`` (None: not recorded)."""
    if restore_seconds is None:
        return None
    return PhaseTime("restore", round(restore_seconds, 3), "restore marker")


__all__ = [
    "PHASES",
    "STAMP_PREFIX",
    "Phase",
    "PhaseClock",
    "PhaseTime",
    "log_count",
    "log_seconds",
    "restore_phase",
    "stamp_line",
]
