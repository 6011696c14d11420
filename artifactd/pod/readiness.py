"""A pod's readiness levels: ``serviceable``, ``prewarmed``, ``verified`` (``status --ready``).

* **serviceable**: the engine answers (``GET <engine-url>/health`` is 200
  within :data:`PROBE_TIMEOUT_S`) and the restore's verdicts are known (no
  restore is installing). A pod whose restore missed is serviceable: a miss is
  the fail-open policy, the engine compiles as before.
* **prewarmed**: serviceable, and every warm-up shape of the matrix was served
  with nothing compiled anyway: ``status --prewarm MATRIX`` sends the
  matrix's serve requests itself (:func:`artifactd.build.cells.send_requests`,
  the requests a build's serve cell sends) to the engine, every one must
  answer 200, and then every family the restore selected must be ``used``
  (:func:`artifactd.pod.verdict.judge`, the one rule: a family restored and
  written to since, or missed, is not).
* **verified**: prewarmed, and the artifact's canary replayed on the engine
  (``status --canary``: :func:`artifactd.pod.canary.replay`, one short request)
  gave the tokens the build recorded: ``verified`` (exact, or the tolerance
  check on another GPU, driver or engine version) or ``drift`` (same tokens,
  other logprobs: reached, with a warning). Other tokens, NaN, an empty output
  or an error fail the canary: the pod is not ready whatever level was asked,
  and ``status`` exits :data:`CANARY_FAILED_EXIT`.

Why status sends the shapes itself rather than reading what the engine
served: an engine's access log says that a request was answered, not its
prompt length or batch, so it cannot show that *every* warm-up shape was
served; and traffic that has not arrived yet proves nothing. Sending the
matrix's own requests, then reading the verdict, is what a readiness gate can
guarantee: when it passes, no shape of the matrix will compile on a user's
request. The requests cost one warm-up pass per probe: run it as a
``startupProbe`` (it stops once passed), or a readiness probe with a period
longer than the pass (deploy/k8s).

Exit codes (:meth:`Readiness.exit_code`): ``status --ready LEVEL`` exits 0
when LEVEL is reached, :data:`NOT_READY_EXIT` when not, and
:data:`CANARY_FAILED_EXIT` whenever the canary failed: a Kubernetes exec
probe reads exactly that.

The engine is someone else's and may misbehave: every exchange with it is
bounded as a whole (:func:`artifactd.boundedhttp.exchange`: connect, status
line, headers and body under one deadline, the body capped), the health
probe within :data:`PROBE_TIMEOUT_S`, each warm-up request within
:data:`PREWARM_REQUEST_TIMEOUT_S` and all of them within ``--prewarm-timeout``
(default :data:`PREWARM_DEADLINE_S`), at most
:data:`~artifactd.build.cells.MAX_CONCURRENCY` in flight. The engine URL is
checked before anything is sent (:func:`check_engine_url`, exit 2) and is
shown without its password everywhere (text, ``--json``, errors).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from artifactd.boundedhttp import ExchangeError, exchange, parse_url
from artifactd.errors import UsageError

if TYPE_CHECKING:
    from artifactd.build.matrix import ServeCell
    from artifactd.pod.canary import CanaryResult
    from artifactd.pod.status import TargetStatus

#: ``status --ready LEVEL``: the level was not reached.
NOT_READY_EXIT = 15
#: ``status --canary``: the canary failed (other tokens, NaN, empty output, an error).
CANARY_FAILED_EXIT = 16
#: One health probe may take this long: a probe must answer fast, and so must the engine.
PROBE_TIMEOUT_S = 2.0
#: One warm-up request may take this long, whole. A restored shape answers in
#: seconds; one that compiles anyway fails the level however long it takes.
PREWARM_REQUEST_TIMEOUT_S = 120.0
#: Every warm-up request together may take this long by default (``--prewarm-timeout``).
PREWARM_DEADLINE_S = 600.0
#: Largest answer read from ``/health``.
HEALTH_MAX_BYTES = 64 << 10

Level = Literal["serviceable", "prewarmed", "verified"]
LEVELS: tuple[Level, ...] = ("serviceable", "prewarmed", "verified")


@dataclass(frozen=True)
class Prewarm:
    """What ``--prewarm`` sent: the matrix, its cell, the requests and those that failed.

    ``requests - answered`` failed; ``failures`` says why for the first few
    (:class:`artifactd.build.cells.Sent`).
    """

    matrix: str
    cell: str
    requests: int
    answered: int
    failures: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Readiness:
    """The levels a pod reached, and why not the next one.

    ``engine`` says what the health probe got; ``why_not`` is None when
    verified, else why the pod is not (the first reason found). ``canary``
    is the canary's replay (``status --canary``), ``warning`` a drift's.
    """

    serviceable: bool
    prewarmed: bool
    engine_url: str | None
    engine: str
    prewarm: Prewarm | None
    why_not: str | None
    canary: CanaryResult | None = None
    warning: str | None = None
    #: The artifact a failed canary quarantined in the node store (``--node-store``).
    quarantined: str | None = None

    @property
    def canary_failed(self) -> bool:
        """Whether a replayed canary failed: the pod must not serve."""
        return self.canary is not None and not self.canary.ready

    @property
    def verified(self) -> bool:
        """Prewarmed, and the canary replayed as ``verified`` or ``drift``."""
        return self.prewarmed and self.canary is not None and self.canary.ready

    @property
    def level(self) -> str:
        """The highest level reached, or ``not ready`` (always, when the canary failed)."""
        if self.canary_failed:
            return "not ready"
        if self.verified:
            return "verified"
        if self.prewarmed:
            return "prewarmed"
        return "serviceable" if self.serviceable else "not ready"

    def reached(self, level: Level) -> bool:
        """Whether ``level`` is reached."""
        if self.canary_failed:
            return False
        if level == "verified":
            return self.verified
        return self.prewarmed if level == "prewarmed" else self.serviceable

    def exit_code(self, level: Level | None) -> int:
        """0, or the exit code of what failed.

        :data:`CANARY_FAILED_EXIT` when the canary failed, else
        :data:`NOT_READY_EXIT` when ``level`` is asked and not reached.
        """
        if self.canary_failed:
            return CANARY_FAILED_EXIT
        return NOT_READY_EXIT if level is not None and not self.reached(level) else 0


def check_engine_url(engine_url: str) -> str:
    """Return ``engine_url`` as shown (no password); raise :class:`UsageError` if malformed."""
    return parse_url(engine_url, "--engine-url").shown


def probe_health(engine_url: str, timeout: float = PROBE_TIMEOUT_S) -> tuple[bool, str]:
    """GET ``<engine_url>/health``; return whether it answered 200, and what it got.

    The whole exchange within ``timeout``; the URL is shown without its password.
    """
    endpoint = parse_url(engine_url.rstrip("/") + "/health", "--engine-url")
    started = time.monotonic()
    try:
        answer = exchange(endpoint, timeout_s=timeout, max_bytes=HEALTH_MAX_BYTES)
    except ExchangeError as exc:
        return False, f"GET {endpoint.shown}: no answer ({exc.why})"
    took = time.monotonic() - started
    return answer.status == 200, f"GET {endpoint.shown}: HTTP {answer.status} in {took:.3f} s"


def prewarm_cell(matrix_path: Path, engine_url: str, cell_id: str | None) -> ServeCell:
    """Return the matrix's serve cell (``cell_id``, or its only one) aimed at ``engine_url``.

    Raises :class:`UsageError` when the matrix has no serve cell, several
    and no ``cell_id``, or not that one; the matrix's own errors are its
    :class:`~artifactd.errors.ConfigError`.
    """
    # lazy: a climb against the stage order, named in tests/test_layout.py's STAGE_EXCEPTIONS
    # (status --matrix only)
    from artifactd.build.matrix import expand, load_matrix  # noqa: PLC0415

    matrix = load_matrix(matrix_path)
    cells = [c for c in expand(matrix, matrix_path) if c.serve is not None]
    if not cells:
        raise UsageError(
            f"--prewarm {matrix_path}: the matrix has no serve cell, so no warm-up requests",
            hint="give the matrix the engine is built from (one with `serve:`)",
        )
    ids = ", ".join(c.id for c in cells[:10]) + (" ..." if len(cells) > 10 else "")
    if cell_id is None:
        if len(cells) > 1:
            raise UsageError(
                f"--prewarm {matrix_path}: {len(cells)} serve cells; which one is this pod?",
                hint=f"add --prewarm-cell ID, one of: {ids}",
            )
        chosen = cells[0]
    else:
        found = [c for c in cells if c.id == cell_id]
        if not found:
            raise UsageError(
                f"--prewarm-cell {cell_id}: no such serve cell in {matrix_path}",
                hint=f"one of: {ids}",
            )
        chosen = found[0]
    assert chosen.serve is not None  # noqa: S101 - filtered above
    return chosen.serve.model_copy(update={"base_url": engine_url.rstrip("/")})


def readiness(
    status: TargetStatus,
    engine_url: str | None,
    *,
    sent: Prewarm | None = None,
    answered: tuple[bool, str] | None = None,
    canary: CanaryResult | None = None,
    no_canary: str | None = None,
) -> Readiness:
    """Decide the levels from a status taken *after* the warm-up requests (if any) were sent.

    ``answered`` is the health probe's result (:func:`probe_health`), ``sent`` what
    ``--prewarm`` sent, ``canary`` the canary's replay (or ``no_canary``: why none ran).
    """
    if engine_url is None:
        ok, engine = False, "not probed: no --engine-url"
    elif answered is None:
        ok, engine = probe_health(engine_url)
    else:
        ok, engine = answered
    why: str | None = None
    if not ok:
        why = f"the engine does not answer ({engine})"
    elif status.state == "restore in progress":
        why = f"the restore's verdicts are not known yet: {status.detail}"
    serviceable = why is None
    if why is None:
        why = _not_prewarmed(status, sent)
    prewarmed = serviceable and why is None
    warning = None
    if canary is not None and not canary.ready:
        why = f"the canary failed: {canary.why}"
    elif canary is not None and canary.outcome == "drift":
        warning = f"canary drift: {canary.why}"
    elif why is None and canary is None:
        why = no_canary or "no canary was replayed: give --canary"
    shown = None if engine_url is None else check_engine_url(engine_url)
    return Readiness(serviceable, prewarmed, shown, engine, sent, why, canary, warning)


def _not_prewarmed(status: TargetStatus, sent: Prewarm | None) -> str | None:
    if sent is None:
        return "no warm-up shapes were sent: give --prewarm MATRIX to send the matrix's requests"
    if sent.answered < sent.requests:
        first = sent.failures[0] if sent.failures else "no answer"
        return (
            f"{sent.requests - sent.answered} of {sent.requests} warm-up request(s) failed: {first}"
        )
    if status.state != "restored":
        return f"no trusted restore ({status.state}): the shapes were served from no restored cache"
    if status.compiled_anyway:
        return f"compiled anyway: {', '.join(status.compiled_anyway)}"
    unused = [f.family for f in status.families if not f.used]
    if unused:
        return f"not restored: {', '.join(unused)} (what the engine compiled for them is unseen)"
    return None


__all__ = [
    "CANARY_FAILED_EXIT",
    "LEVELS",
    "NOT_READY_EXIT",
    "PREWARM_DEADLINE_S",
    "PREWARM_REQUEST_TIMEOUT_S",
    "Level",
    "Prewarm",
    "Readiness",
    "check_engine_url",
    "prewarm_cell",
    "probe_health",
    "readiness",
]
