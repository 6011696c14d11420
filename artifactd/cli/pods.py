"""``exec`` and ``status``: the engine's side of a restore, in the pod.

What they do lives in :mod:`artifactd.pod.exec` and :mod:`artifactd.pod.status`.
``exec`` reuses the restore command's option declarations
(``COMMANDS["restore"]`` in :mod:`artifactd.cli.specs`), so every restore flag
and ``ARTIFACTD_*`` variable means the same with ``exec --restore``.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from artifactd import bounds as B  # noqa: N812
from artifactd import constants as C  # noqa: N812
from artifactd.cli import render
from artifactd.cli import specs as S  # noqa: N812
from artifactd.cli.group import cli
from artifactd.cli.options import options
from artifactd.cli.specs import Opt
from artifactd.errors import UsageError

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from artifactd.pod.canary import CanaryResult
    from artifactd.pod.readiness import Level, Prewarm, Readiness
    from artifactd.pod.status import FamilyStatus, TargetStatus


RESTORE_FIRST = Opt(
    "--restore",
    "restore",
    "Restore into TARGET first, with the restore options below, then run CMD.",
    C.ENV_EXEC_RESTORE,
    is_flag=True,
)
#: What ``exec`` itself reads, in its own words; the rest only matter with --restore.
_EXEC_HELP = {
    "target": "The cache volume a restore wrote (its --target).",
    "env_file": "The env file to load [TARGET/artifactd.env]; with --restore, where it is written.",
    "require": "Exit 10 instead of running CMD when there is no env file to load; with "
    "--restore, also fail on a miss or a failed restore (its exit code).",
    "as_json": "With --restore, the restore's report as JSON on stderr (stdout is CMD's); "
    "a missing env file as one JSON line on stderr.",
}
_RESTORE_SPECS = S.COMMANDS["restore"]
_OWN = tuple(s._replace(help=_EXEC_HELP[s.dest]) for s in _RESTORE_SPECS if s.dest in _EXEC_HELP)
_RESTORE_ONLY = tuple(
    s._replace(help=f"{s.help} (--restore only)")
    for s in _RESTORE_SPECS
    if s.dest not in _EXEC_HELP
)
EXEC_ENGINE_LOG = Opt(
    "--engine-log",
    "engine_log",
    "Also copy CMD's stdout and stderr, each line stamped with its time, into FILE "
    "(appended), for `status --engine-log FILE`: the start's phases and what the engine "
    "compiled.",
    C.ENV_ENGINE_LOG,
    metavar="FILE",
)
ON_CANARY_FAIL = Opt(
    "--on-canary-fail",
    "on_canary_fail",
    "cold: stay the engine's parent, replay the restored artifact's canary once "
    "--engine-url answers, and if it fails restart the engine once with the restored "
    "caches set aside (with --restore --node-store, the artifact is quarantined there too).",
    C.ENV_ON_CANARY_FAIL,
    metavar="cold",
)
EXEC_ENGINE_URL = Opt(
    "--engine-url",
    "engine_url",
    "With --on-canary-fail: the engine's base URL (its /health is polled, the canary sent).",
    C.ENV_ENGINE_URL,
    metavar="URL",
)
EXEC_OPTIONS = (
    *_OWN,
    EXEC_ENGINE_LOG,
    ON_CANARY_FAIL,
    EXEC_ENGINE_URL,
    RESTORE_FIRST,
    *_RESTORE_ONLY,
)


@cli.command("exec", context_settings={"allow_interspersed_args": False})
@options(EXEC_OPTIONS)
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="-- CMD [ARGS]...")
def exec_(
    command: tuple[str, ...],
    restore: bool,
    engine_log: str | None,
    on_canary_fail: str | None,
    engine_url: str | None,
    **opts: Any,
) -> None:
    """Run CMD with the restored caches' environment: the engine's entrypoint.

    Reads the KEY=VALUE lines a restore wrote (TARGET/artifactd.env), puts
    them over this environment and replaces this process with CMD: no shell,
    the same process id, so the container's signals reach CMD and its exit
    status is the container's. SIGPIPE and SIGXFSZ are reset to their
    defaults first (Python ignores them).

    \b
    In a pod whose init container ran `artifactd restore --target /cache`:
      artifactd exec --target /cache -- vllm serve Qwen/Qwen3-8B --port 8000
    Or restore and start in one container (every restore flag works here):
      artifactd exec --restore --target /cache --store registry.example.com/ml/caches \\
          -- python -m sglang.launch_server --model-path Qwen/Qwen3-8B

    No env file (the restore did not run or missed): CMD runs anyway on its
    own caches, after one warning line on stderr, unless --require (exit 10,
    CMD not run). A CMD that is not found exits 127, one not executable 126.

    --engine-log FILE keeps a stamped copy of CMD's output for `artifactd
    status --engine-log FILE` (a copier process forked first). Then exec
    stays CMD's parent, as tini does: signals passed on, CMD's exit status
    its own, and CMD's last lines reach the container's log and FILE before
    it ends. A FILE that is no regular file (a FIFO, a device, a symlink) or
    cannot be written is one warning, and CMD runs anyway.

    --on-canary-fail cold --engine-url URL keeps exec as the engine's parent
    (signals passed on): once URL/health answers, the restored artifact's
    canary is replayed; if it fails, the engine is stopped and started once
    more with the restored caches set aside, cold, rather than serve wrong
    answers.

    \b
    Environment variables: ARTIFACTD_TARGET, ARTIFACTD_ENV_FILE,
    ARTIFACTD_REQUIRE, ARTIFACTD_EXEC_RESTORE, ARTIFACTD_ENGINE_LOG,
    ARTIFACTD_ON_CANARY_FAIL, ARTIFACTD_ENGINE_URL, ARTIFACTD_JSON, and with
    --restore every variable `artifactd restore` reads.
    """
    from pathlib import Path

    from artifactd.pod.exec import exec_plan, exit_like, run, run_logged, tee_output

    if not command:
        raise UsageError(
            "no command to run",
            hint="put the engine's command line after --: artifactd exec --target DIR -- CMD",
        )
    if on_canary_fail not in (None, "cold"):
        raise UsageError(
            f"--on-canary-fail {on_canary_fail!r}: the one mode is cold",
            hint="--on-canary-fail cold restarts the engine once without the restored caches",
        )
    if on_canary_fail is not None and engine_url is None:
        raise UsageError(
            "--on-canary-fail needs the engine: no --engine-url",
            hint="add --engine-url http://127.0.0.1:PORT (the engine's port in the pod)",
        )
    if engine_url is not None:
        from artifactd.pod.readiness import check_engine_url

        check_engine_url(engine_url)
    if restore:
        _restore_first(opts, command)
    else:
        _refuse_restore_flags()
    plan = exec_plan(
        command, target=opts["target"], env_file=opts["env_file"], require=opts["require"]
    )
    if plan.warning is not None:
        if opts["as_json"]:
            line = {"stage": "exec", "event": "no_env_file", "env_file": str(plan.env_file)}
            render.echo(json.dumps({**line, "message": plan.warning}, sort_keys=True), err=True)
        else:
            render.echo(plan.warning, err=True)
    warn = functools.partial(render.echo, err=True)  # the log cannot be kept: CMD runs anyway
    tee = tee_output(Path(engine_log), plan.argv, warn) if engine_log is not None else None
    if on_canary_fail is not None and engine_url is not None:
        from artifactd.pod.coldstart import supervise

        status = supervise(
            plan,
            target=Path(opts["target"]),
            engine_url=engine_url,
            env_file=opts["env_file"],
            node_store=opts.get("node_store") if restore else None,
            on_event=render.event_printer(opts["as_json"]),
        )
        if tee is not None:
            tee.finish()  # the engine's last lines reach the log before this process ends
        exit_like(status)
    if tee is not None:
        exit_like(run_logged(plan, tee))
    run(plan)


def _restore_first(opts: dict[str, Any], command: Sequence[str]) -> None:
    """Run ``restore`` with exec's options; its output goes to stderr (stdout is CMD's).

    ``--predict`` reads CMD as the engine's command line (unless --engine-args says).
    """
    import shlex
    from contextlib import redirect_stdout

    from artifactd.cli import fast

    if not opts.get("engine_args_text"):
        opts = {**opts, "engine_args_text": shlex.join(command)}
    with redirect_stdout(sys.stderr):
        fast.restore(**{spec.dest: opts[spec.dest] for spec in _RESTORE_SPECS})


def _refuse_restore_flags() -> None:
    """Refuse a restore-only option typed without --restore (their variables are ignored)."""
    ctx = click.get_current_context()
    typed = [
        spec.flag
        for spec in _RESTORE_ONLY
        if ctx.get_parameter_source(spec.dest) is click.core.ParameterSource.COMMANDLINE
    ]
    if typed:
        raise UsageError(
            f"{', '.join(typed)} {'applies' if len(typed) == 1 else 'apply'} only to a restore",
            hint="add --restore to restore before running CMD, or drop them",
        )


ENGINE_LOG = Opt(
    "--engine-log",
    "engine_log",
    "The engine's log (- for stdin): what it says it loaded and compiled, and where.",
    C.ENV_ENGINE_LOG,
    metavar="FILE",
)
FAIL_ON_COMPILE = Opt(
    "--fail-on-compile",
    "fail_on_compile",
    "Exit 13 when a restored family compiled anyway (a miss stays 0).",
    C.ENV_FAIL_ON_COMPILE,
    is_flag=True,
)
SERVE = Opt(
    "--serve",
    "serve",
    "Serve the status as Prometheus metrics at HOST:PORT (or :PORT) for a scrape, "
    "computed afresh at each scrape; runs until stopped.",
    C.ENV_STATUS_SERVE,
    metavar="ADDR",
)
ENGINE_URL = Opt(
    "--engine-url",
    "engine_url",
    "The engine's base URL (e.g. http://127.0.0.1:8000): its /health is probed "
    "(answered in full within 2 s) for the readiness levels; a password in it is never shown.",
    C.ENV_ENGINE_URL,
    metavar="URL",
)
PREWARM = Opt(
    "--prewarm",
    "prewarm",
    "Send MATRIX's serve requests (its warm-up shapes) to --engine-url, then judge: "
    "prewarmed when every one answered and nothing compiled anyway.",
    C.ENV_PREWARM,
    metavar="MATRIX",
    kind="path",
)
PREWARM_CELL = Opt(
    "--prewarm-cell",
    "prewarm_cell",
    "The serve cell of MATRIX this pod runs (when it has several).",
    C.ENV_PREWARM_CELL,
    metavar="ID",
)
PREWARM_TIMEOUT = Opt(
    "--prewarm-timeout",
    "prewarm_timeout",
    "Seconds every warm-up request of --prewarm together may take [600] (each one at "
    "most 120 s, at most 1024 in flight); what is unanswered by then fails.",
    C.ENV_PREWARM_TIMEOUT,
    metavar="SECONDS",
    bound=B.PREWARM_TIMEOUT_S,
)
READY = Opt(
    "--ready",
    "ready",
    "Exit 0 only when LEVEL (serviceable, prewarmed or verified) is reached, else 15 "
    "(16 when the canary failed): a Kubernetes exec probe.",
    C.ENV_READY,
    metavar="LEVEL",
)
CANARY = Opt(
    "--canary",
    "canary",
    "Replay the restored artifact's canary on --engine-url (one short request): "
    "verified (or drift: same tokens, other logprobs) above prewarmed; other tokens, "
    "NaN, an empty output or an error: not ready, exit 16.",
    C.ENV_CANARY,
    is_flag=True,
)
STATUS_OPTIONS = (
    S.TARGET._replace(help="The cache volume a restore wrote (its --target)."),
    S.ENV_FILE._replace(help="Where that restore wrote its env file [TARGET/artifactd.env]."),
    ENGINE_LOG,
    FAIL_ON_COMPILE,
    S.METRICS_FILE._replace(
        help="Write the status as Prometheus metrics (node-exporter textfile)."
    ),
    SERVE,
    ENGINE_URL,
    PREWARM,
    PREWARM_CELL,
    PREWARM_TIMEOUT,
    READY,
    CANARY,
    S.NODE_STORE._replace(
        help="With --canary: the node store (oci:PATH) in which a failed canary's artifact "
        "is quarantined, so no pod on this node restores it again."
    ),
    S.JSON,
)


@cli.command()
@options(STATUS_OPTIONS)
def status(
    *,
    target: Any,
    env_file: Any,
    engine_log: str | None,
    fail_on_compile: bool,
    metrics_file: Any,
    serve: str | None,
    engine_url: str | None,
    prewarm: Any,
    prewarm_cell: str | None,
    prewarm_timeout: float | None,
    ready: str | None,
    canary: bool,
    node_store: str | None,
    as_json: bool,
) -> None:
    """Tell, per family, whether the engine used the restored caches or compiled anyway.

    Reads TARGET's restore marker (changes nothing) and, for each family the
    restore selected, counts the files written under its restored dirs since
    the restore (locks, temp and staging files left out): none is `used`,
    some is `compiled anyway`; a family the restore missed is `not restored`.
    --engine-log adds what the engine said: vLLM's hit and compile lines and
    the cache dir it chose (flagged, with the hash factors that differ, when
    it is not the one restored), Inductor's fx-graph cache hits and misses.

    \b
    After the engine started (a check, or a readiness probe that must not flap):
      artifactd status --target /cache --engine-log /var/log/engine.log
      artifactd status --target /cache --fail-on-compile --json

    --metrics-file writes artifactd_family_compiled_files{family} and
    artifactd_family_used{family} for node-exporter; --serve ADDR answers
    scrapes with them.

    The engine log also gives the start's phases with seconds (restore,
    weights, compile, cuda_graphs, ready, first_request: vLLM's, SGLang's
    and the tiny engine's lines; `exec --engine-log` stamps them).

    \b
    Readiness: serviceable (the engine answers, the restore's verdicts are
    known) and prewarmed (the matrix's warm-up shapes served, nothing
    compiled anyway):
      artifactd status --target /cache --engine-url http://127.0.0.1:8000 --ready serviceable
      artifactd status --target /cache --engine-url http://127.0.0.1:8000 \\
          --prewarm /etc/artifactd/matrix.yaml --ready prewarmed

    \b
    Correctness: verified (prewarmed, and the artifact's canary, recorded at
    build, replayed on the engine with the same tokens):
      artifactd status --target /cache --engine-url http://127.0.0.1:8000 \
          --prewarm /etc/artifactd/matrix.yaml --canary --ready verified

    Exit 0 whatever it finds (no marker, a restore in progress and a miss
    included), unless --fail-on-compile and a restored family compiled
    anyway: 13, --ready LEVEL not reached: 15, or the canary failed: 16.

    \b
    Environment variables: ARTIFACTD_TARGET, ARTIFACTD_ENV_FILE,
    ARTIFACTD_ENGINE_LOG, ARTIFACTD_FAIL_ON_COMPILE, ARTIFACTD_METRICS_FILE,
    ARTIFACTD_STATUS_SERVE, ARTIFACTD_ENGINE_URL, ARTIFACTD_PREWARM,
    ARTIFACTD_PREWARM_CELL, ARTIFACTD_PREWARM_TIMEOUT, ARTIFACTD_READY, ARTIFACTD_CANARY,
    ARTIFACTD_NODE_STORE, ARTIFACTD_JSON.
    """
    from artifactd.pod.status import status_report, target_status

    level = _ready_level(ready, engine_url, prewarm if not canary else True)
    if engine_url is not None:
        from artifactd.pod.readiness import check_engine_url

        check_engine_url(engine_url)
    if serve is not None and (prewarm is not None or ready is not None or canary):
        raise UsageError(
            "--serve answers scrapes; --prewarm, --canary and --ready are for one status run",
            hint="drop them from --serve (its metrics carry artifactd_ready{level} with "
            "--engine-url), or run them as a probe",
        )
    if serve is not None:
        _serve_metrics(serve, target, env_file, engine_log, engine_url)
        return
    sent, answered = _prewarm(prewarm, prewarm_cell, engine_url, prewarm_timeout)
    result = target_status(target, env_file=env_file, engine_log=engine_log)
    readiness = None
    if engine_url is not None:
        replayed, no_canary = _canary(
            canary,
            target=target,
            env_file=env_file,
            cell=prewarm_cell,
            engine_url=engine_url,
            answered=answered,
            as_json=as_json,
        )
        readiness = _decide(
            result,
            engine_url,
            sent=sent,
            answered=answered,
            canary=replayed,
            no_canary=no_canary,
            node_store=node_store,
        )
    if metrics_file is not None:
        from artifactd.pod.metrics import status_registry, write_textfile

        warning = write_textfile(
            metrics_file, status_registry(result.families, result.phases, readiness)
        )
        if warning is not None:  # an add-on: status keeps its exit code
            render.echo(warning, err=True)
    code = result.exit_code(fail_on_compile=fail_on_compile)
    if not code and readiness is not None:
        code = readiness.exit_code(level)
    if as_json:
        render.emit_json({**status_report(result, readiness), "exit_code": code})
    else:
        _render_status(result)
        if readiness is not None:
            _render_readiness(readiness)
    if readiness is not None:
        _readiness_exit(readiness, level, code)
    if code:
        names = ", ".join(result.compiled_anyway)
        render.echo(
            f"artifactd: error: compiled anyway: {names} (--fail-on-compile)\n"
            "  hint: the restored caches did not cover what the engine compiled; "
            "see the files and engine lines above",
            err=True,
        )
        sys.exit(code)


def _readiness_exit(readiness: Readiness, level: Level | None, code: int) -> None:
    """Warn of a canary's drift; exit with the readiness's code when it failed."""
    if readiness.warning is not None:
        render.echo(f"artifactd: warning: {readiness.warning}", err=True)
    if readiness.canary_failed:
        render.echo(
            f"artifactd: error: not ready: {readiness.why_not} (--canary)\n"
            "  hint: the restored kernels do not compute what the build's did: start the "
            "engine cold (exec --on-canary-fail cold) and rebuild the artifact",
            err=True,
        )
        sys.exit(code)
    if code == readiness.exit_code(level) and code:
        render.echo(
            f"artifactd: error: not {level}: {readiness.why_not} (--ready {level})\n"
            "  hint: the probe passes once the level is reached; see the readiness above",
            err=True,
        )
        sys.exit(code)


def _ready_level(ready: str | None, engine_url: str | None, prewarm: Any) -> Level | None:
    """Check --ready and --prewarm against --engine-url; return the level asked."""
    from artifactd.pod.readiness import LEVELS

    if ready is not None and ready not in LEVELS:
        raise UsageError(
            f"--ready {ready!r}: not a readiness level",
            hint="give --ready serviceable, --ready prewarmed or --ready verified",
        )
    if engine_url is None and (ready is not None or prewarm is not None):
        raise UsageError(
            "--ready, --prewarm and --canary need the engine: no --engine-url",
            hint="add --engine-url http://127.0.0.1:PORT (the engine's port in the pod)",
        )
    return ready if ready is None or ready in LEVELS else None


def _decide(
    result: TargetStatus,
    engine_url: str,
    *,
    sent: Prewarm | None,
    answered: tuple[bool, str] | None,
    canary: CanaryResult | None,
    no_canary: str | None,
    node_store: str | None,
) -> Readiness:
    """Decide the levels; a failed canary quarantines the artifact in ``node_store``."""
    from artifactd.pod.readiness import readiness as decide

    ready = decide(
        result, engine_url, sent=sent, answered=answered, canary=canary, no_canary=no_canary
    )
    if ready.canary_failed and node_store is not None:
        from artifactd.pod.canary import quarantine_failed

        ready = quarantine_failed(ready, Path(result.target), node_store, Path(result.env_file))
    return ready


def _canary(
    wanted: bool,
    *,
    target: Any,
    env_file: Any,
    cell: str | None,
    engine_url: str,
    answered: tuple[bool, str] | None,
    as_json: bool,
) -> tuple[CanaryResult | None, str | None]:
    """With --canary, replay the restored artifact's canary (an event says how it went)."""
    if not wanted:
        return None, "no canary was replayed: give --canary"
    if answered is not None and not answered[0]:
        return None, "the engine does not answer: no canary sent"
    from artifactd.pod.canary import replay_restored

    events = render.event_printer(as_json)
    return replay_restored(Path(target), engine_url, cell, env_file=env_file, on_event=events)


def _prewarm(
    matrix: Any, cell_id: str | None, engine_url: str | None, timeout_s: float | None
) -> tuple[Prewarm | None, tuple[bool, str] | None]:
    """Probe the engine and, with --prewarm, send the matrix's warm-up requests to it."""
    if engine_url is None:
        return None, None
    import time

    from artifactd.pod.readiness import (
        PREWARM_DEADLINE_S,
        PREWARM_REQUEST_TIMEOUT_S,
        Prewarm,
        prewarm_cell,
        probe_health,
    )

    overall = PREWARM_DEADLINE_S if timeout_s is None else timeout_s
    serve = prewarm_cell(matrix, engine_url, cell_id) if matrix is not None else None
    answered = probe_health(engine_url)
    if serve is None or not answered[0]:
        return None, answered
    from artifactd.build.cells import send_requests

    deadline = time.monotonic() + overall
    sent = send_requests(serve, PREWARM_REQUEST_TIMEOUT_S, deadline=deadline)
    cell = cell_id or "(the only serve cell)"
    return Prewarm(str(matrix), cell, sent.requests, sent.answered, sent.failures), answered


def _serve_metrics(
    addr: str, target: Any, env_file: Any, engine_log: str | None, engine_url: str | None
) -> None:
    """Answer every scrape with a fresh status of ``target``, until stopped."""
    import threading
    from contextlib import suppress

    from artifactd.pod.metrics import serving, status_registry
    from artifactd.pod.readiness import readiness
    from artifactd.pod.status import target_status

    def fresh() -> CollectorRegistry:
        result = target_status(target, env_file=env_file, engine_log=engine_log)
        ready = readiness(result, engine_url) if engine_url is not None else None
        return status_registry(result.families, result.phases, ready)

    with serving(addr, fresh) as (host, port):
        render.echo(f"serving status metrics for {target} at http://{host}:{port}/metrics")
        with suppress(KeyboardInterrupt):
            threading.Event().wait()  # the server answers from its threads until a signal


def _render_status(result: TargetStatus) -> None:
    """Print the verdict table, then the evidence behind each verdict."""
    echo = render.echo
    if result.restored_at is not None and result.fingerprint_hash is not None:
        from datetime import datetime, timezone

        when = datetime.fromtimestamp(result.restored_at, tz=timezone.utc).strftime(
            "%Y-%m-%d %H:%M:%S"
        )
        echo(
            f"status of {result.target}: restored {when} UTC, fingerprint "
            f"{result.fingerprint_hash[:16]}..."
        )
    else:
        echo(f"status of {result.target}: {result.state}: {result.detail}")
    shown = [f for f in result.families if f.verdict != "not restored" or f.engine is not None]
    if shown:
        rows = [("family", "verdict", "restored", "written", "engine log")]
        rows += [
            (f.family, f.verdict, str(f.files_restored), str(f.files_written), _engine_cell(f))
            for f in shown
        ]
        echo(render.table(rows))
    _render_not_restored([f for f in result.families if f not in shown])
    for fam in shown:
        _render_evidence(fam)
    _render_phases(result)
    if result.engine_log_error:
        echo(f"engine log: {result.engine_log_error}")
    if result.compiled_anyway:
        echo(f"compiled anyway: {', '.join(result.compiled_anyway)}")
    elif any(f.verdict == "used" for f in result.families):
        echo("every restored family was used: nothing compiled since the restore")


def _engine_cell(fam: FamilyStatus) -> str:
    engine = fam.engine
    if engine is None:
        return "-"
    return f"{engine.hits} hit(s), {engine.misses} compiled ({engine.source.split(' (')[0]})"


def _render_not_restored(families: Sequence[FamilyStatus]) -> None:
    by_why: dict[str, list[str]] = {}
    for fam in families:
        by_why.setdefault(fam.why, []).append(fam.family)
    for why, names in by_why.items():
        render.echo(f"  not restored: {', '.join(names)} ({why})")


def _render_evidence(fam: FamilyStatus) -> None:
    echo = render.echo
    if fam.written_examples:
        more = fam.files_written - len(fam.written_examples)
        echo(f"  {fam.family}: {fam.why}:")
        for path in fam.written_examples:
            echo(f"    {path}")
        if more > 0:
            echo(f"    ... and {more} more")
    elif fam.verdict == "compiled anyway":
        echo(f"  {fam.family}: {fam.why}")
    engine = fam.engine
    if engine is None:
        return
    if engine.cache_disabled:
        echo(f"  {fam.family}: the engine's compile cache is disabled (VLLM_DISABLE_COMPILE_CACHE)")
    for other in engine.other_dirs:
        echo(f"  {fam.family}: the engine used {other.path}")
        echo(f"    {other.why}")
        for factor in other.factors:
            echo(f"    {factor}")


def _render_phases(result: TargetStatus) -> None:
    if not result.phases:
        return
    rows = [("phase", "seconds", "source", "detail")]
    for p in result.phases:
        detail = p.outcome or (f"{p.shapes} shapes" if p.shapes is not None else "")
        seconds = "?" if p.seconds is None else f"{p.seconds:.2f}"
        rows.append((p.phase, seconds, p.source, detail))
    render.echo("engine start:")
    render.echo(render.table(rows))


def _render_readiness(ready: Readiness) -> None:
    render.echo(f"readiness: {ready.level} ({ready.engine})")
    if ready.prewarm is not None:
        sent = ready.prewarm
        render.echo(
            f"  prewarm: {sent.answered} of {sent.requests} warm-up request(s) answered "
            f"({sent.matrix}, cell {sent.cell})"
        )
    if ready.canary is not None:
        can = ready.canary
        render.echo(
            f"  canary: {can.outcome} ({can.mode} check, {can.match_rate:.2%} of tokens match, "
            f"{can.seconds:.3f} s)" + (f": {can.why}" if can.why else "")
        )
    if ready.why_not is not None:
        next_level = "verified" if ready.prewarmed else "prewarmed"
        render.echo(
            f"  not {next_level}: {ready.why_not}"
            if ready.serviceable
            else f"  not serviceable: {ready.why_not}"
        )
