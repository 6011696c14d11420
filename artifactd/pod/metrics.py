"""Prometheus metrics: what restores did and whether their caches were used.

Built with the ``prometheus-client`` package and written as a node-exporter
textfile (``--metrics-file``: atomically, so a scrape never reads half a
file) by ``restore`` and ``status``; ``status --serve ADDR`` serves them for
a scrape with the package's own HTTP server (:func:`serving`: it negotiates
the OpenMetrics format and gzip as Prometheus asks). One pod's numbers,
labelled by family and source; the JSON events stay the timestamped log.
deploy/monitoring/ holds the alerting and recording rules and the Grafana
dashboard built on them (tests/test_monitoring.py checks they name only
these). The names:

=====================================================  =========================================
``artifactd_restore_duration_seconds{phase}``          seconds per phase of the last restore:
                                                       ``lookup`` (probe to plan, a node store
                                                       fill included), ``verify`` (records,
                                                       space, target), ``fetch`` (download,
                                                       verified and extracted as it streams),
                                                       ``install`` (the transaction)
``artifactd_restore_fetched_bytes_total{source}``      compressed bytes read: ``registry``,
                                                       ``node`` (the node store), ``local``
                                                       (a layout or baked store), ``dir``
``artifactd_restore_family_hits_total{family}``        1 per family restored (or already there)
``artifactd_restore_family_misses_total{family}``      1 per family selected and not restored
``artifactd_restore_status{status}``                   1 for the last restore's status
``artifactd_restore_failures_total{kind}``             1 when it failed, by its error's kind
                                                       (``untrusted``: no key verified it)
``artifactd_mirror_failures_total{mirror,reason}``    times a mirror could not serve (the run's:
                                                       :mod:`artifactd.stores.pull`): ``not_found``,
                                                       ``server_error``, ``unreachable``,
                                                       ``timeout``, ``short_read``, ``digest``
                                                       (a wrong digest: dropped for the run)
``artifactd_family_compiled_files{family}``            files written since the restore (status;
                                                       what counts: :mod:`artifactd.pod.verdict`)
``artifactd_family_used{family}``                      1 when the family's verdict is ``used``
``artifactd_engine_phase_seconds{phase}``              seconds per phase of the engine's start
                                                       (status; :mod:`artifactd.pod.phases`:
                                                       ``restore``, ``weights``, ``compile``,
                                                       ``cuda_graphs``, ``ready``,
                                                       ``first_request``), those found
``artifactd_engine_cuda_graph_shapes``                 CUDA-graph shapes captured, when said
``artifactd_ready{level}``                             1 when the pod reached ``serviceable`` /
                                                       ``prewarmed`` / ``verified`` (status
                                                       with ``--engine-url``; see
                                                       :mod:`artifactd.pod.readiness`)
``artifactd_engine_hit_predicted{family,outcome}``    cache entries by the predicted outcome
                                                       of the engine's own key (``predict``:
                                                       ``hit``, ``miss``, ``unknown``)
``artifactd_canary{outcome,mode}``                     1 for the canary's outcome (``verified``,
                                                       ``drift``, ``failed``; ``exact`` or
                                                       ``tolerance``): status ``--canary``
``artifactd_quarantined{artifact}``                    1 for the artifact a failed canary
                                                       quarantined in the node store
``artifactd_node_store_bytes``                         bytes of every blob in the node store
``artifactd_node_store_evictions_total``               artifacts gc evicted, every run (the
                                                       store keeps the count)
``artifactd_node_store_high_water_bytes``              gc's ``--max-bytes`` (when given)
``artifactd_node_store_free_ratio``                    free fraction of its disk after gc
``artifactd_node_store_min_free_ratio``                gc's ``--min-free``, as a fraction
=====================================================  =========================================
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    disable_created_metrics,
    generate_latest,
    start_http_server,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.exposition import ALLOWUTF8
from prometheus_client.registry import Collector

from artifactd.errors import UsageError
from artifactd.fsutil import InputFileError, replace_regular
from artifactd.stores.pull import HEALTH

if TYPE_CHECKING:
    from artifactd.pod.phases import PhaseTime
    from artifactd.pod.readiness import Readiness
    from artifactd.pod.verdict import FamilyVerdict
    from artifactd.restore.policy import RestoreOutcome
    from artifactd.restore.predict import Prediction

NAMESPACE = "artifactd"
# One pod's counters in a textfile: their *_created timestamps would only be noise.
disable_created_metrics()  # type: ignore[no-untyped-call]


def _source(store: str) -> str:
    """Return the ``source`` label of a store reference."""
    if store.startswith("dir:"):
        return "dir"
    if store.startswith("oci:"):
        return "local"
    return "registry"


def restore_registry(outcome: RestoreOutcome) -> CollectorRegistry:
    """Return the metrics of one restore (see the module doc for the names)."""
    reg = CollectorRegistry()
    duration = Gauge(
        "restore_duration_seconds",
        "Seconds per phase of the last restore",
        ["phase"],
        namespace=NAMESPACE,
        registry=reg,
    )
    fetched = Counter(
        "restore_fetched_bytes",
        "Compressed bytes a restore read, by source",
        ["source"],
        namespace=NAMESPACE,
        registry=reg,
    )
    hits = Counter(
        "restore_family_hits",
        "Families restored (or already in place)",
        ["family"],
        namespace=NAMESPACE,
        registry=reg,
    )
    misses = Counter(
        "restore_family_misses",
        "Families selected and not restored",
        ["family"],
        namespace=NAMESPACE,
        registry=reg,
    )
    status = Gauge(
        "restore_status",
        "1 for the last restore's status",
        ["status"],
        namespace=NAMESPACE,
        registry=reg,
    )
    status.labels(outcome.status).set(1)
    failures = Counter(
        "restore_failures",
        "1 for a failed restore, by the kind of its error",
        ["kind"],
        namespace=NAMESPACE,
        registry=reg,
    )
    if outcome.failure is not None:
        failures.labels(outcome.failure.kind).inc()
    mirror_failures = Counter(
        "mirror_failures",
        "Times a mirror could not serve what was asked, by mirror and reason",
        ["mirror", "reason"],
        namespace=NAMESPACE,
        registry=reg,
    )
    for (mirror, reason), count in sorted(HEALTH.failures().items()):
        mirror_failures.labels(mirror, reason).inc(count)
    result = outcome.result
    for phase in ("lookup", "verify", "fetch", "install"):
        duration.labels(phase).set(result.phases.get(phase, 0.0) if result else 0.0)
    source = "node" if outcome.node is not None else _source(outcome.plan.store)
    fetched.labels(source).inc(result.bytes_fetched if result else 0)
    if outcome.node is not None:
        fetched.labels("registry").inc(outcome.node.bytes_fetched)
    hit = outcome.status in ("restored", "noop")
    for fp in outcome.plan.families:
        if fp.verdict == "hit" and hit:
            hits.labels(fp.family).inc()
        else:
            misses.labels(fp.family).inc()
    return reg


def status_registry(
    families: Iterable[FamilyVerdict],
    phases: Iterable[PhaseTime] = (),
    ready: Readiness | None = None,
) -> CollectorRegistry:
    """Return ``status``'s metrics from its verdicts (:mod:`artifactd.pod.verdict` decides them).

    With the engine's start ``phases`` and the pod's readiness when known.
    """
    reg = CollectorRegistry()
    compiled = Gauge(
        "family_compiled_files",
        "Files written since the restore (compiled anyway)",
        ["family"],
        namespace=NAMESPACE,
        registry=reg,
    )
    used = Gauge(
        "family_used",
        "1 when the family's restored cache was used",
        ["family"],
        namespace=NAMESPACE,
        registry=reg,
    )
    for fam in families:
        compiled.labels(fam.family).set(fam.files_written)
        used.labels(fam.family).set(1 if fam.used else 0)
    _engine_metrics(reg, phases, ready)
    return reg


def _engine_metrics(
    reg: CollectorRegistry, phases: Iterable[PhaseTime], ready: Readiness | None
) -> None:
    timed = [p for p in phases if p.seconds is not None]
    if timed:
        seconds = Gauge(
            "engine_phase_seconds",
            "Seconds per phase of the engine's start",
            ["phase"],
            namespace=NAMESPACE,
            registry=reg,
        )
        for phase in timed:
            seconds.labels(phase.phase).set(phase.seconds or 0.0)
    shapes = [p.shapes for p in phases if p.shapes is not None]
    if shapes:
        Gauge(
            "engine_cuda_graph_shapes",
            "CUDA-graph shapes the engine captured",
            namespace=NAMESPACE,
            registry=reg,
        ).set(shapes[0])
    if ready is not None:
        level = Gauge(
            "ready",
            "1 when the pod reached the readiness level",
            ["level"],
            namespace=NAMESPACE,
            registry=reg,
        )
        level.labels("serviceable").set(1 if ready.serviceable else 0)
        level.labels("prewarmed").set(1 if ready.prewarmed else 0)
        level.labels("verified").set(1 if ready.verified else 0)
        if ready.canary is not None:
            outcome = Gauge(
                "canary",
                "1 for the outcome of the canary's replay (verified, drift, failed)",
                ["outcome", "mode"],
                namespace=NAMESPACE,
                registry=reg,
            )
            for name in ("verified", "drift", "failed"):
                hit = 1 if ready.canary.outcome == name else 0
                outcome.labels(name, ready.canary.mode).set(hit)
        if ready.quarantined is not None:
            Gauge(
                "quarantined",
                "1 for an artifact this status quarantined in the node store (its canary failed)",
                ["artifact"],
                namespace=NAMESPACE,
                registry=reg,
            ).labels(ready.quarantined).set(1)


def node_store_registry(
    size: int,
    evictions: int = 0,
    *,
    high_water_bytes: int | None = None,
    free_ratio: float | None = None,
    min_free_ratio: float | None = None,
) -> CollectorRegistry:
    """Return the node store's metrics after a gc (see the module doc for the names).

    ``evictions`` is the store's running total (:attr:`GcResult.evictions_total`);
    the targets are exported only when gc was given them.
    """
    reg = CollectorRegistry()
    Gauge(
        "node_store_bytes",
        "Bytes of every blob in the node store",
        namespace=NAMESPACE,
        registry=reg,
    ).set(size)
    Counter(
        "node_store_evictions",
        "Artifacts gc evicted from the node store",
        namespace=NAMESPACE,
        registry=reg,
    ).inc(evictions)
    gauges = (
        (
            "node_store_high_water_bytes",
            "The node store's size target (gc --max-bytes)",
            high_water_bytes,
        ),
        (
            "node_store_free_ratio",
            "Free fraction of the node store's filesystem after gc",
            free_ratio,
        ),
        ("node_store_min_free_ratio", "The free fraction gc keeps (gc --min-free)", min_free_ratio),
    )
    for name, doc, value in gauges:
        if value is not None:
            Gauge(name, doc, namespace=NAMESPACE, registry=reg).set(value)
    return reg


def write_textfile(path: Path, registry: CollectorRegistry) -> str | None:
    """Write ``registry`` for node-exporter's textfile collector, atomically.

    The metrics file is an add-on, under the rule of every add-on: it never
    fails the command that writes it (``restore``, ``status``, ``gc``), and it
    writes only a regular file (:func:`artifactd.fsutil.replace_regular`: a
    symlink, a FIFO, a device or a directory at ``path`` is left as it was).
    Returns one warning line when the file cannot be written, else None; the
    caller prints it and keeps its own outcome and exit code.
    """
    data = generate_latest(registry, ALLOWUTF8)  # what prometheus-client writes to a textfile
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_regular(path, data)
    except InputFileError as exc:
        return f"artifactd: warning: the metrics file {exc}: not written"
    except OSError as exc:
        return (
            f"artifactd: warning: cannot write metrics to {path}: {exc.strerror or exc} "
            "(point --metrics-file at node-exporter's textfile directory, writable here)"
        )
    return None


class _Fresh(Collector):
    """A collector that builds its registry afresh at each scrape."""

    def __init__(self, make: Callable[[], CollectorRegistry]) -> None:
        self._make = make

    def collect(self) -> Iterator[Metric]:
        """Yield the metrics of a registry made now."""
        yield from self._make().collect()


@contextmanager
def serving(addr: str, make: Callable[[], CollectorRegistry]) -> Iterator[tuple[str, int]]:
    """Serve ``make()``'s metrics at ``addr`` (``HOST:PORT`` or ``:PORT``), made at each scrape.

    prometheus-client's server answers from its own threads while the context
    is open; the context gives the host and port it listens on (the port
    picked for port 0) and shuts the server down on leaving. Raises :class:`UsageError`
    when ``addr`` is malformed or cannot be listened on.
    """
    host, port = parse_address(addr)
    registry = CollectorRegistry(auto_describe=False)  # describe would run a scrape
    registry.register(_Fresh(make))
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise UsageError(
            f"--serve {addr}: cannot listen: {exc.strerror or exc}",
            hint="pick a free port, or an address of this host",
        ) from None
    try:
        yield host, int(server.server_port)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def parse_address(addr: str) -> tuple[str, int]:
    """Parse ``HOST:PORT`` or ``:PORT`` (all interfaces) into (host, port)."""
    host, _, port = addr.rpartition(":")
    if not port.isdigit() or int(port) > 65535:
        raise UsageError(f"--serve {addr!r}: give HOST:PORT or :PORT", hint="e.g. --serve :9400")
    return host or "0.0.0.0", int(port)  # noqa: S104 - a scrape target listens on the pod


def predict_registry(result: Prediction) -> CollectorRegistry:
    """``predict``'s metric: ``artifactd_engine_hit_predicted{family,outcome}`` = entries."""
    reg = CollectorRegistry()
    predicted = Gauge(
        "engine_hit_predicted",
        "Cache entries by the predicted outcome of the engine's own key (hit, miss, unknown)",
        ["family", "outcome"],
        namespace=NAMESPACE,
        registry=reg,
    )
    for outcome in ("hit", "miss", "unknown"):
        predicted.labels("vllm", outcome).set(0)
    for e in result.entries:
        predicted.labels(e.family, e.outcome).inc()
    return reg
