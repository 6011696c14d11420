"""Serve shapes from traffic: a matrix's ``serve.requests`` from an engine's ``/metrics``.

The warm-up should compile what production traffic needs: the prompt lengths,
generation lengths and batch sizes pods actually see. Engines already count
them in Prometheus histograms; this module reads one or more expositions (a
file, or an ``http(s)://`` URL of a ``/metrics`` endpoint; one per replica or
per scrape), sums them, and picks, for a coverage fraction ``q`` in (0, 1]:

* the prompt-length buckets: the fewest histogram buckets holding at least
  ``q`` of the requests (the most populated first), each sent as its upper
  bound, the longest prompt it can hold;
* ``max_tokens``: the upper bound of the bucket where the generation-length
  histogram reaches ``q`` (the ``max_tokens`` parameter's histogram when the
  engine has no generation one);
* ``concurrency``: the ``q`` quantile (nearest rank) of the running-requests
  gauge over every value given. A gauge is one instant per scrape, so pass
  several scrapes taken under load, or one per replica: each value (each
  series of each source) is one sample;
* CUDA-graph batch sizes: the upper bounds of every non-empty bucket of the
  tokens-per-step histogram up to the bucket where it reaches ``q``; a step
  pads up to the next captured size, so every step at or under the last one
  runs a graph. Without that histogram they are derived from the concurrency
  (1, 2, 4, then every 8 up to it).

Every answer is at the histograms' bucket granularity: a bucket's requests
are only known to lie between its bounds. Replicas are merged by summing the
cumulative counts at the bucket bounds every series shares (vLLM derives its
token buckets from ``--max-model-len``, so replicas may differ; the merge is
then coarser, and says so).

The metric families read, per engine, and where they are defined:

* vLLM (V1 engine, ``vllm/v1/metrics/loggers.py``, ``PrometheusStatLogger``;
  labels ``model_name`` and ``engine``): ``vllm:request_prompt_tokens`` and
  ``vllm:request_generation_tokens`` (1-2-5 buckets up to max-model-len),
  ``vllm:request_params_max_tokens`` (same buckets), ``vllm:iteration_tokens_total``
  (tokens per engine step) and the gauge ``vllm:num_requests_running``. The
  step histogram's buckets were the CUDA-graph capture sizes only in the first
  V1 releases (early 2025, ``build_cudagraph_buckets``); since mid-2025
  (v0.9/v0.10 and on to the v0.13 series) they are fixed: 1, 8, 16, ... 16384.
  The sizes printed are therefore those bucket bounds, not the capture sizes
  the engine ran with.
* SGLang (``python/sglang/srt/metrics/collector.py``, 0.4.x and 0.5.x):
  ``sglang:prompt_tokens_histogram`` and ``sglang:generation_tokens_histogram``
  exist only when the server runs with ``--collect-tokens-histogram`` (buckets
  from ``--prompt-tokens-buckets``/``--generation-tokens-buckets``, default
  100 ... 1100000); ``sglang:num_running_reqs`` is a gauge. SGLang has no
  batch-size or tokens-per-step histogram (``sglang:cuda_graph_passes_total``
  counts passes, not sizes), so its CUDA-graph sizes come from the concurrency.

Inputs are untrusted: :mod:`artifactd.build.scrape` reads them, bounded in
size and time; malformed text is refused naming the source
(:class:`~artifactd.errors.ConfigError`, exit 2), a URL by
:func:`~artifactd.build.scrape.shown` (no password). Every value read is
bounded before it becomes a request: a bucket count over
:data:`MAX_COUNT` is refused; a token length over :data:`MAX_TOKENS`, a
concurrency over :data:`~artifactd.build.cells.MAX_CONCURRENCY` and a CUDA-graph
size over :data:`MAX_GRAPH_SIZE` are clamped to it, with a note.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Literal

from prometheus_client.parser import text_string_to_metric_families

from artifactd import bounds as B  # noqa: N812
from artifactd.boundedhttp import parse_url
from artifactd.build.cells import MAX_CONCURRENCY
from artifactd.build.matrix import ServeRequests
from artifactd.build.scrape import FETCH_TIMEOUT_S, is_url, read_source, shown
from artifactd.errors import ConfigError, UsageError

#: Most sources one run reads (each is parsed, then only its few series are kept).
MAX_SOURCES = 64
#: Largest bucket count read (2**53: beyond it a float no longer counts by ones;
#: no engine's counter gets there). A bigger one is refused.
MAX_COUNT = float(2**53)
#: Largest prompt length or max_tokens written into a request, in tokens: a
#: bucket bound past it (``le="1e300"``) is sent as this, with a note. The serve
#: schema's upper bound for ``prompt_tokens`` and ``max_tokens`` (one owner:
#: :mod:`artifactd.bounds`).
MAX_TOKENS = int(min(B.PROMPT_WORDS.hi, B.MAX_TOKENS.hi))
#: Largest CUDA-graph batch size printed (vLLM's step buckets end at 16384).
MAX_GRAPH_SIZE = 1 << 16

Engine = Literal["vllm", "sglang"]
ENGINES: tuple[Engine, ...] = ("vllm", "sglang")


@dataclass(frozen=True)
class EngineMetrics:
    """The metric families one engine exposes that say what its traffic looks like."""

    prompt: str
    generation: str
    max_tokens: str | None
    step_tokens: str | None
    running: str
    graph_flag: str
    #: What to tell a user whose exposition lacks the prompt histogram.
    enable_hint: str


METRICS: dict[Engine, EngineMetrics] = {
    "vllm": EngineMetrics(
        prompt="vllm:request_prompt_tokens",
        generation="vllm:request_generation_tokens",
        max_tokens="vllm:request_params_max_tokens",
        step_tokens="vllm:iteration_tokens_total",
        running="vllm:num_requests_running",
        graph_flag="--compilation-config '{\"cudagraph_capture_sizes\": [%s]}'",
        enable_hint="vLLM's OpenAI server exposes them at /metrics unless "
        "--disable-log-stats is given",
    ),
    "sglang": EngineMetrics(
        prompt="sglang:prompt_tokens_histogram",
        generation="sglang:generation_tokens_histogram",
        max_tokens=None,
        step_tokens=None,
        running="sglang:num_running_reqs",
        graph_flag="--cuda-graph-bs %s",
        enable_hint="start SGLang with --enable-metrics --collect-tokens-histogram",
    ),
}


@dataclass(frozen=True)
class Histogram:
    """A histogram merged over series and sources: cumulative counts at ascending bounds.

    The last bound is ``inf`` (Prometheus' ``+Inf`` bucket).
    """

    name: str
    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]
    series: int
    #: True when the series had different bounds and only the shared ones were kept.
    coarsened: bool = False

    @property
    def total(self) -> float:
        """How many observations the histogram holds."""
        return self.cumulative[-1]

    def buckets(self) -> list[tuple[float, float, float]]:
        """Each bucket as (lower bound, upper bound, count); the first starts at 0."""
        out = []
        lower, below = 0.0, 0.0
        for bound, cum in zip(self.bounds, self.cumulative, strict=True):
            out.append((lower, bound, cum - below))
            lower, below = bound, cum
        return out


@dataclass(frozen=True)
class Traffic:
    """What the expositions say about one engine's traffic, merged over every source."""

    engine: Engine
    sources: tuple[str, ...]
    prompt: Histogram
    generation: Histogram | None
    max_tokens: Histogram | None
    step_tokens: Histogram | None
    running: tuple[float, ...]


@dataclass(frozen=True)
class Bucket:
    """A histogram bucket, ``(lower, upper]``; ``upper`` is None for the ``+Inf`` one."""

    lower: float
    upper: float | None
    count: int
    #: The length sent for this bucket: its upper bound (the longest it can hold).
    tokens: int


@dataclass(frozen=True)
class Shapes:
    """The shapes that cover ``coverage`` of the observed traffic, and the requests to send."""

    engine: Engine
    sources: list[str]
    coverage: float
    #: The metric family each figure came from ("prompt" -> "vllm:request_prompt_tokens"...).
    metrics: dict[str, str]
    requests_observed: int
    prompt_buckets: list[Bucket]
    #: Fraction of the requests whose prompt falls in ``prompt_buckets``.
    prompt_covered: float
    max_tokens: int
    max_tokens_covered: float
    concurrency: int
    concurrency_samples: int
    cuda_graph_sizes: list[int]
    #: "step_tokens" (from the tokens-per-step histogram) or "concurrency" (derived).
    cuda_graph_from: str
    #: Fraction of engine steps at or under the largest size (None when derived).
    cuda_graph_covered: float | None
    cuda_graph_flag: str
    requests: list[ServeRequests]
    notes: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------


Sample = tuple[str, dict[str, str], float]


def parse_exposition(text: str, source: str) -> list[Sample]:
    """Return every sample of a Prometheus text exposition as (name, labels, value).

    Families' ``# TYPE`` lines are not relied on: an untyped scrape reads the same.
    """
    try:
        return [
            (s.name, dict(s.labels), float(s.value))
            for family in text_string_to_metric_families(text)
            for s in family.samples
        ]
    except Exception as exc:  # the parser raises ValueError, IndexError, KeyError...
        raise ConfigError(
            # repr, cut: the parser quotes the input, which may hold control characters
            f"metrics source {source} is not a Prometheus text exposition: {str(exc)[:200]!r}",
            hint="give the text of an engine's /metrics endpoint",
        ) from None


def _bound(text: str, source: str, name: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if math.isnan(value) or value < 0:
        raise ConfigError(
            f"metrics source {source}: {name}: bucket bound le={text!r} is not a number >= 0",
            hint="a histogram's buckets are counted at numeric upper bounds and +Inf",
        )
    return value


def _series_of(samples: Sequence[Sample], name: str, source: str) -> list[dict[float, float]]:
    """Each series of histogram ``name`` as {upper bound: cumulative count}, checked."""
    series: dict[tuple[tuple[str, str], ...], dict[float, float]] = {}
    for sample_name, labels, value in samples:
        if sample_name != f"{name}_bucket":
            continue
        if "le" not in labels:
            raise ConfigError(
                f"metrics source {source}: {sample_name} has no le label",
                hint="a histogram bucket names its upper bound in le",
            )
        bound = _bound(labels["le"], source, name)
        if not (0 <= value <= MAX_COUNT):  # NaN fails it too
            raise ConfigError(
                f"metrics source {source}: {name}{{le={labels['le']!r}}} counts {value}",
                hint="a bucket's count is a finite number in [0, 2**53]",
            )
        key = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
        one = series.setdefault(key, {})
        if bound in one:
            raise ConfigError(
                f"metrics source {source}: {name} has bucket le={labels['le']!r} twice",
                hint="each series holds each bucket once",
            )
        one[bound] = value
    for one in series.values():
        if math.inf not in one:
            raise ConfigError(
                f'metrics source {source}: {name} has no le="+Inf" bucket',
                hint="every Prometheus histogram ends with the +Inf bucket (all observations)",
            )
        counts = [one[b] for b in sorted(one)]
        if any(later < earlier for earlier, later in itertools.pairwise(counts)):
            raise ConfigError(
                f"metrics source {source}: {name}'s bucket counts decrease",
                hint="buckets are cumulative: each counts at least what the one below it does",
            )
    return list(series.values())


def merge_histogram(name: str, series: Sequence[dict[float, float]]) -> Histogram | None:
    """Sum series (of one or several sources) at the bounds they all share; None if none."""
    if not series:
        return None
    shared = set(series[0]).intersection(*series[1:])
    every = set(series[0]).union(*series[1:])
    bounds = tuple(sorted(shared))
    cumulative = tuple(sum(s[b] for s in series) for b in bounds)
    return Histogram(name, bounds, cumulative, len(series), coarsened=shared != every)


def _gauge(samples: Sequence[Sample], name: str) -> list[float]:
    return [v for n, _, v in samples if n == name and math.isfinite(v) and v >= 0]


@dataclass
class _Read:
    """What one source holds that matters here: kept instead of its samples (bounded memory)."""

    engines: set[Engine]
    series: dict[str, list[dict[float, float]]]
    gauges: dict[str, list[float]]


def _read_one(source: str, timeout_s: float) -> _Read:
    name = shown(source)
    samples = parse_exposition(read_source(source, timeout_s=timeout_s), name)
    engines = {e for e in ENGINES if any(n.startswith(f"{e}:") for n, _, _ in samples)}
    histograms = {
        name
        for m in METRICS.values()
        for name in (m.prompt, m.generation, m.max_tokens, m.step_tokens)
        if name is not None
    }
    return _Read(
        engines,
        {h: _series_of(samples, h, name) for h in histograms},
        {m.running: _gauge(samples, m.running) for m in METRICS.values()},
    )


def detect_engine(found: set[Engine], sources: Sequence[str]) -> Engine:
    """Return the one engine whose metric families were found (``vllm:`` or ``sglang:``)."""
    if len(found) == 1:
        return next(iter(found))
    where = ", ".join(sources)
    if not found:
        raise ConfigError(
            f"no vLLM or SGLang metrics in {where}",
            hint="give the /metrics of a vLLM or SGLang server (or --engine to say which)",
        )
    raise ConfigError(
        f"both vLLM and SGLang metrics in {where}",
        hint="pass the sources of one engine at a time, or --engine vllm|sglang",
    )


def load_traffic(
    sources: Sequence[str],
    *,
    engine: Engine | Literal["auto"] = "auto",
    timeout_s: float = FETCH_TIMEOUT_S,
) -> Traffic:
    """Read every source, pick the engine, merge its histograms and gauges over the sources."""
    if not sources:
        raise UsageError("no metrics source given", hint="--from-metrics FILE|URL (repeatable)")
    if len(sources) > MAX_SOURCES:
        raise UsageError(
            f"{len(sources)} metrics sources, over the limit of {MAX_SOURCES}",
            hint="a few scrapes per replica are enough",
        )
    urls = [s for s in sources if is_url(s)]
    if urls:
        for url in urls:  # every URL checked before any is fetched
            parse_url(url, "--from-metrics")
    names_shown = [shown(s) for s in sources]
    reads = [_read_one(src, timeout_s) for src in sources]
    chosen: Engine = (
        detect_engine(set().union(*(r.engines for r in reads)), names_shown)
        if engine == "auto"
        else engine
    )
    names = METRICS[chosen]

    def histogram(name: str | None) -> Histogram | None:
        if name is None:
            return None
        return merge_histogram(name, [one for r in reads for one in r.series[name]])

    prompt = histogram(names.prompt)
    if prompt is None:
        raise ConfigError(
            f"no {names.prompt} histogram in {', '.join(names_shown)}",
            hint=names.enable_hint,
        )
    return Traffic(
        engine=chosen,
        sources=tuple(names_shown),
        prompt=prompt,
        generation=histogram(names.generation),
        max_tokens=histogram(names.max_tokens),
        step_tokens=histogram(names.step_tokens),
        running=tuple(v for r in reads for v in r.gauges[names.running]),
    )


# --------------------------------------------------------------------------
# Choosing the shapes
# --------------------------------------------------------------------------


def check_coverage(coverage: float) -> Fraction:
    """Return ``coverage`` as an exact fraction; refuse one outside (0, 1]."""
    if not (0 < coverage <= 1):
        raise UsageError(
            f"--coverage {coverage} is not in (0, 1]",
            hint="the fraction of observed traffic to cover, e.g. 0.99",
        )
    # repr is the shortest text that reads back as the float: 0.99 is 99/100 exactly,
    # so 99 requests of 100 cover 0.99 (the float product 0.99 * 100 is above 99).
    return Fraction(repr(coverage))


def _reaches(part: float, total: float, q: Fraction) -> bool:
    return Fraction(part) >= q * Fraction(total)


def cover_buckets(hist: Histogram, q: Fraction) -> list[tuple[float, float, float]]:
    """Return the fewest buckets holding at least ``q`` of the observations, in bound order.

    The most populated first (ties: the shorter bucket), which is the smallest set.
    """
    nonempty = [b for b in hist.buckets() if b[2] > 0]
    chosen: list[tuple[float, float, float]] = []
    held = 0.0
    for bucket in sorted(nonempty, key=lambda b: (-b[2], b[1])):
        if _reaches(held, hist.total, q):
            break
        chosen.append(bucket)
        held += bucket[2]
    return sorted(chosen, key=lambda b: b[1])


def quantile_bound(hist: Histogram, q: Fraction) -> float:
    """Return the upper bound of the first bucket where the cumulative count reaches ``q``."""
    for bound, cum in zip(hist.bounds, hist.cumulative, strict=True):
        if _reaches(cum, hist.total, q):
            return bound
    return math.inf


def _largest_finite(hist: Histogram) -> float:
    finite = [b for b in hist.bounds if math.isfinite(b)]
    return finite[-1] if finite else 1.0


def nearest_rank(values: Sequence[float], q: Fraction) -> float:
    """Return the ``q`` quantile of ``values`` by nearest rank."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def derived_graph_sizes(concurrency: int) -> list[int]:
    """Batch sizes 1, 2, 4, then every 8, up to the first that holds ``concurrency``.

    ``concurrency`` is taken in [1, :data:`MAX_CONCURRENCY`] (at most 131 sizes).
    """
    top = max(1, min(concurrency, MAX_CONCURRENCY))
    if top <= 8:
        return [s for s in (1, 2, 4, 8) if s < top] + [next(s for s in (1, 2, 4, 8) if s >= top)]
    return [1, 2, 4, *range(8, -(-top // 8) * 8 + 1, 8)]


def _int_up(value: float) -> int:
    return max(1, math.ceil(value))


def _clamped(value: float, limit: int, what: str, notes: list[str]) -> int:
    """``value`` rounded up to an integer in [1, ``limit``]; a note when it was over."""
    if value > limit:
        note = f"{what}: {value:g} is over {limit}; clamped to {limit}"
        if note not in notes:
            notes.append(note)
        return limit
    return _int_up(value)


def _cumulative_at(hist: Histogram, bound: float) -> float:
    return next(c for b, c in zip(hist.bounds, hist.cumulative, strict=True) if b == bound)


def _prompt_buckets(prompt: Histogram, q: Fraction, notes: list[str]) -> list[Bucket]:
    buckets = []
    for lower, upper, count in cover_buckets(prompt, q):
        if math.isfinite(upper):
            tokens = _clamped(math.floor(upper), MAX_TOKENS, f"{prompt.name} bound", notes)
        else:
            tokens = _clamped(math.floor(lower) + 1, MAX_TOKENS, f"{prompt.name} bound", notes)
            notes.append(
                f"{round(count)} request(s) had prompts over {lower:g} tokens (the last bucket "
                f"bound); sent as {tokens}: raise it to your longest prompt by hand"
            )
        finite = upper if math.isfinite(upper) else None
        buckets.append(Bucket(lower, finite, round(count), tokens))
    return buckets


def _max_tokens(traffic: Traffic, q: Fraction, notes: list[str]) -> tuple[Histogram, int, float]:
    """Return the histogram read, max_tokens and the fraction of requests it covers."""
    names = METRICS[traffic.engine]
    lengths = traffic.generation
    if lengths is None or lengths.total <= 0:
        lengths = traffic.max_tokens
        if lengths is None or lengths.total <= 0:
            raise ConfigError(
                f"no {names.generation} histogram with observations in "
                f"{', '.join(traffic.sources)}",
                hint=names.enable_hint,
            )
        notes.append(f"no generation lengths: max_tokens from {lengths.name} (what clients asked)")
    bound = quantile_bound(lengths, q)
    if not math.isfinite(bound):
        bound = _largest_finite(lengths)
        notes.append(f"{lengths.name}: the quantile lies past the last bucket bound; capped there")
    tokens = _clamped(bound, MAX_TOKENS, f"{lengths.name} bound", notes)
    return lengths, tokens, _cumulative_at(lengths, bound) / lengths.total


def _concurrency(traffic: Traffic, q: Fraction, notes: list[str]) -> int:
    running = METRICS[traffic.engine].running
    if len(traffic.running) < 2:
        notes.append(
            f"{running} is a gauge (one instant per scrape): pass several scrapes taken "
            "under load, or one per replica, for a concurrency that means something"
        )
    if not traffic.running:
        notes.append(f"no {running} samples: concurrency 1")
        return 1
    return _clamped(nearest_rank(traffic.running, q), MAX_CONCURRENCY, running, notes)


def _graph_sizes(
    steps: Histogram | None, concurrency: int, q: Fraction, notes: list[str]
) -> tuple[list[int], float | None]:
    """Return the CUDA-graph sizes and the fraction of steps they hold (None when derived)."""
    if steps is None or steps.total <= 0:
        notes.append("CUDA-graph sizes derived from the concurrency (no tokens-per-step histogram)")
        return derived_graph_sizes(concurrency), None
    top = quantile_bound(steps, q)
    if not math.isfinite(top):
        top = _largest_finite(steps)
        notes.append(f"{steps.name}: steps past the last bucket bound run without a graph")
    used = {
        _clamped(upper, MAX_GRAPH_SIZE, steps.name, notes)
        for _, upper, count in steps.buckets()
        if count > 0 and upper <= top
    }
    used.add(_clamped(top, MAX_GRAPH_SIZE, steps.name, notes))
    return sorted(used), _cumulative_at(steps, top) / steps.total


def choose_shapes(traffic: Traffic, coverage: float) -> Shapes:
    """Return the prompt buckets, max_tokens, concurrency and graph sizes covering ``coverage``."""
    q = check_coverage(coverage)
    names = METRICS[traffic.engine]
    prompt = traffic.prompt
    if prompt.total <= 0:
        raise ConfigError(
            f"{prompt.name} counts no requests in {', '.join(traffic.sources)}",
            hint="scrape the engine after it has served traffic",
        )
    notes = [
        "figures are at the histograms' bucket granularity: a bucket's requests lie "
        "somewhere between its bounds, and each is sent at its upper bound"
    ]
    for hist in (prompt, traffic.generation, traffic.max_tokens, traffic.step_tokens):
        if hist is not None and hist.coarsened:
            notes.append(
                f"{hist.name}: the sources' buckets differ; merged at the {len(hist.bounds)} "
                "bounds they share"
            )
    buckets = _prompt_buckets(prompt, q, notes)
    lengths, max_tokens, max_covered = _max_tokens(traffic, q, notes)
    concurrency = _concurrency(traffic, q, notes)
    sizes, graph_covered = _graph_sizes(traffic.step_tokens, concurrency, q, notes)
    metrics = {"prompt": prompt.name, "max_tokens": lengths.name}
    if traffic.running:
        metrics["concurrency"] = names.running
    if graph_covered is not None and traffic.step_tokens is not None:
        metrics["cuda_graph_sizes"] = traffic.step_tokens.name

    requests = [
        ServeRequests(
            kind="completions",
            prompt_tokens=sorted({b.tokens for b in buckets}),
            max_tokens=max_tokens,
            concurrency=1,
        )
    ]
    if concurrency > 1:
        # Decode batches of up to `concurrency`, shrinking as answers finish, on
        # the most common prompt length.
        typical = max(buckets, key=lambda b: (b.count, -b.tokens)).tokens
        requests.append(
            ServeRequests(
                kind="completions",
                prompt_tokens=[typical],
                max_tokens=max_tokens,
                concurrency=concurrency,
                repeat=concurrency,
            )
        )
    separator = ", " if traffic.engine == "vllm" else " "
    return Shapes(
        engine=traffic.engine,
        sources=list(traffic.sources),
        coverage=coverage,
        metrics=metrics,
        requests_observed=round(prompt.total),
        prompt_buckets=buckets,
        prompt_covered=sum(b.count for b in buckets) / prompt.total,
        max_tokens=max_tokens,
        max_tokens_covered=max_covered,
        concurrency=concurrency,
        concurrency_samples=len(traffic.running),
        cuda_graph_sizes=sizes,
        cuda_graph_from="concurrency" if graph_covered is None else "step_tokens",
        cuda_graph_covered=graph_covered,
        cuda_graph_flag=names.graph_flag % separator.join(str(s) for s in sizes),
        requests=requests,
        notes=notes,
    )


def shapes_from_metrics(
    sources: Sequence[str],
    *,
    coverage: float = 0.99,
    engine: Engine | Literal["auto"] = "auto",
    timeout_s: float = FETCH_TIMEOUT_S,
) -> Shapes:
    """Read the sources and choose the shapes: :func:`load_traffic` then :func:`choose_shapes`."""
    check_coverage(coverage)  # before any URL is fetched
    return choose_shapes(load_traffic(sources, engine=engine, timeout_s=timeout_s), coverage)
