"""How results look to people: tables, verdict lines, progress; and JSON output.

The command modules decide nothing about presentation; the library decides
nothing else. ``--json`` documents come from :mod:`artifactd.reports`. No click
here: the pod-start commands print without importing it.
"""

from __future__ import annotations

import sys
from _collections_abc import Mapping  # collections.abc's own: importing it loads collections

from artifactd import __version__
from artifactd.cli import progress
from artifactd.jsontext import dumps

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

    from artifactd.build.demo import DemoResult
    from artifactd.build.gate import VerifyResult
    from artifactd.build.harvest import HarvestResult
    from artifactd.build.run import BuildResult
    from artifactd.build.shapes import Shapes
    from artifactd.fingerprint.declare import ToMatch
    from artifactd.fingerprint.diff import FactDiff, FingerprintDiff, Side
    from artifactd.lint import LintReport
    from artifactd.restore.install import RestoreResult
    from artifactd.restore.policy import RestoreOutcome
    from artifactd.restore.predict import Prediction
    from artifactd.restore.resolve import RestorePlan
    from artifactd.stores.artifacts import Artifact, CopyResult
    from artifactd.stores.mirrors import MirrorPlan
    from artifactd.trust.inspection import TrustReport
    from artifactd.trust.signatures import SignResult


#: What ``artifactd --version`` prints, click's message and the fast path's alike.
VERSION_LINE = f"artifactd, version {__version__}"
#: Byte counts for people: one owner, the progress display's.
human_bytes = progress.human_bytes


def echo(text: str = "", *, err: bool = False, nl: bool = True) -> None:
    """Write a line to stdout (or stderr) and flush: click.echo without importing click."""
    stream = sys.stderr if err else sys.stdout
    stream.write(text + "\n" if nl else text)
    stream.flush()


def emit_json(document: Mapping[str, Any]) -> None:
    """Print one JSON document (a report from :mod:`artifactd.reports`) on stdout."""
    echo(dumps(document, sort_keys=True))


def table(rows: Sequence[Sequence[str]]) -> str:
    """Format rows as left-aligned columns, two spaces apart, indented by two."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  " + "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip()
        for row in rows
    )


def event_printer(as_json: bool, *, lines: bool = False) -> Callable[[dict[str, Any]], None]:
    """Show library events: JSON lines on stderr with --json, progress on a terminal.

    On a terminal, :class:`~artifactd.cli.progress.Display` draws transfers as a
    bar (rate, time left) and running cells as a status line, with every other
    event a line above it. Progress events are for people: never in JSON, never
    in a log. With ``lines`` (the long-running commands: build, verify, merge,
    demo, images), every other event is a line on stderr when it is not a
    terminal too (a CI log), so a three-minute cell is seen starting, not a silence.
    """
    if not as_json and sys.stderr.isatty():
        return progress.Display(sys.stderr)

    def show(event: dict[str, Any]) -> None:
        if event.get("event") == "progress":
            return
        if as_json:
            echo(dumps(event, sort_keys=True), err=True)
        elif lines:
            detail = " ".join(f"{k}={v}" for k, v in event.items() if k not in ("stage", "event"))
            echo(f"[{event.get('stage')}] {event.get('event')} {detail}", err=True)

    return show


def fingerprint(raw: Mapping[str, Any], digest: str) -> None:
    """Print the hash, then every hashed field, then the informational ones."""
    # lazy: --version and --help load this module, not the fingerprint (tests/test_startup.py)
    from artifactd.fingerprint.key import flatten, hashed_view  # noqa: PLC0415

    echo(f"fingerprint {digest}")
    for key, value in flatten(hashed_view(raw)).items():
        echo(f"  {key:32} {value}")
    for key, value in flatten(raw["info"], "info.").items():
        echo(f"  {key:32} {value}  (not hashed)")


def harvest(result: HarvestResult) -> None:
    """Print per-family files and sizes, the artifact digest, its tag and the transfer."""
    rows = [("family", "files", "size", "layer", "skipped")]
    for fam in result.families:
        rows.append(
            (
                fam.family,
                str(fam.files),
                human_bytes(fam.bytes),
                human_bytes(fam.layer_size),
                str(fam.skipped),
            )
        )
    echo(f"harvested into {result.store}")
    echo(table(rows))
    if result.not_found:
        echo(f"  not found: {', '.join(result.not_found)}")
    echo(f"artifact {result.digest}")
    # What was published, as published: fp-<hash> (and the family tags), or a
    # fan-out cell's run-<id>-cell-<n> alone.
    head, families = (result.tags[0], len(result.tags) - 1) if result.tags else ("(none)", 0)
    echo(f"  tag {head}" + (f" (and {families} family tag(s))" if families else ""))
    echo(
        f"  uploaded {human_bytes(result.bytes_uploaded)}, "
        f"already present {human_bytes(result.bytes_skipped)}, {result.seconds:.2f} s"
    )


def build(result: BuildResult) -> None:
    """Print each cell's time, the lint summary, then the harvest."""
    for cell in result.cells:
        echo(f"cell {cell.id}: {cell.seconds:.1f} s")
    if result.lint is not None and result.lint.findings:
        echo(
            f"lint: {result.lint.errors} error(s), {result.lint.warnings} warning(s) tie these "
            "caches to the build machine; see them with --keep-roots DIR, then "
            "`artifactd lint DIR`"
        )
    harvest(result.harvest)


def verify(result: VerifyResult) -> None:
    """Print a per-cell, per-family table and the verdict."""
    families = sorted({f for c in result.cells for f in c.compiled})
    echo(f"verify {result.digest[:19]}... (fingerprint {result.fingerprint_hash[:16]}...)")
    echo(f"  {'cell':<28} {'checks':<10} " + " ".join(f"{f:>10}" for f in families))
    for cell in result.cells:
        ok = sum(1 for c in cell.checks if c.ok)
        checks = f"{ok}/{len(cell.checks)} ok" if cell.checks else "none"
        echo(
            f"  {cell.id:<28} {checks:<10} "
            + " ".join(f"{cell.compiled.get(f, 0):>10}" for f in families)
        )
    echo("  (per family: files written on the restored caches since the restore)")
    for line in result.failures:
        echo(f"  FAIL {line}")
    if result.passed:
        promoted = f"; tagged {result.promoted}" if result.promoted else ""
        echo(f"PASS: every check matches and nothing was compiled{promoted}")
    else:
        echo(f"FAIL: {len(result.failures)} problem(s); nothing promoted", err=True)


def traceback(error: BaseException) -> None:
    """Print an exception's traceback on stderr (``ARTIFACTD_TRACEBACK=1``)."""
    # lazy: fast path: LATER in artifactd/cli/fast.py, never loaded by a no-op restore
    import traceback as tb  # noqa: PLC0415

    tb.print_exception(error)


def restore(outcome: RestoreOutcome) -> None:
    """Print the plan table and a verdict line; a failure as one line (and hint) on stderr."""
    plan, failure = outcome.plan, outcome.failure
    _plan(plan, outcome.result, outcome.status == "dry_run")
    if outcome.prediction is not None:
        prediction(outcome.prediction)
    if failure is None:
        return
    message = failure.message
    if failure.kind != "miss":
        message = f"restore failed ({failure.kind}), nothing changed in {plan.target}: {message}"
    if outcome.exit_code:
        head = f"artifactd: error: {message}"
    else:
        # "as before": a target that held caches (say, verified under a key since
        # dropped) keeps them; the engine compiles what it lacks.
        head = f"artifactd: {message}; the engine will compile as before"
    echo(head + (f"\n  hint: {failure.hint}" if failure.hint else ""), err=True)


def _to_match(settle: ToMatch | None) -> None:
    """Print the flags that would declare the closest artifact's fields, and what none can."""
    if settle is None:
        return
    for flag in settle.declare:
        echo(f"    to match it, add {flag.flag} (declares {', '.join(flag.fields)})")
    if settle.undeclare:
        echo(f"    and leave {', '.join(settle.undeclare)} out of --workload")
    if settle.omit:
        echo(f"    and leave out {', '.join(settle.omit)}: the artifact was built without it")
    for field in settle.probed[:8]:
        echo(
            f"    probed here, no flag changes it: {field.path}: "
            f"artifact={field.a!r} here={field.b!r}"
        )
    if len(settle.probed) > 8:
        echo(f"    ... and {len(settle.probed) - 8} more probed field(s): `artifactd diff`")


def _plan_table(plan: RestorePlan) -> None:
    """Print a row per family looked for; those the artifact was built without on one line."""
    # lazy: render is imported by --version; a plan to show means resolve is loaded
    from artifactd.restore.resolve import ABSENT_FROM_ARTIFACT  # noqa: PLC0415

    absent = [f.family for f in plan.families if f.reason == ABSENT_FROM_ARTIFACT]
    rows = [("family", "verdict", "via", "files", "size", "where / why")]
    for f in plan.families:
        if f.verdict == "hit":
            where = ", ".join(f.dirs.values())
            rows.append(
                (f.family, "hit", f.source or "", str(f.files), human_bytes(f.unpacked), where)
            )
        elif f.family not in absent:
            rows.append((f.family, "miss", "-", "-", "-", f.reason or ""))
    if len(rows) > 1:
        echo(table(rows))
    if absent:
        echo(f"  not in the artifact (it was built without them): {', '.join(absent)}")


def _plan(plan: RestorePlan, result: RestoreResult | None, dry_run: bool) -> None:
    head = {"full": "full match", "partial": "partial match (by family scope)", "miss": "MISS"}
    echo(
        f"restore: {head[plan.match]} for fingerprint {plan.fingerprint_hash[:16]}... "
        f"from {plan.store}"
    )
    if plan.error:
        echo(f"  store: {plan.error}")
    for why in plan.unbound.values():
        echo(f"  passed over: {why}")
    _plan_table(plan)
    for f in plan.families:
        for d in f.deciding:
            echo(f"    {f.family}: {d.path}: artifact={d.a!r} local={d.b!r}")
    if plan.nearest is not None and plan.match != "full":
        echo(
            f"  closest of {plan.nearest.compared} artifact(s) read: {plan.nearest.tag} "
            f"({len(plan.nearest.differing)} field(s) differ)"
        )
        _to_match(plan.nearest.to_match)
    if dry_run:
        echo(f"dry run: would fetch {human_bytes(plan.bytes_to_fetch)}; nothing written")
    elif plan.noop:
        echo(f"already restored (marker matches); nothing to do. env file: {plan.env_file}")
    elif result is not None:
        echo(
            f"restored {len(result.restored)} families, {result.files} files, "
            f"{human_bytes(result.bytes)} in {result.seconds:.2f} s"
        )
        echo(f"env file: {plan.env_file}  (load: set -a; . {plan.env_file}; set +a)")
    elif not plan.hits and not plan.error:
        echo("nothing restored: the engine will compile as before")


def diff(a: Side, b: Side, result: FingerprintDiff, facts: Sequence[FactDiff]) -> None:
    """Print both hashes, the differing fields, per-family verdicts and differing facts."""
    echo(f"A {a.name}: {result.a_hash[:16]}...")
    echo(f"B {b.name}: {result.b_hash[:16]}...")
    if result.identical:
        echo("identical fingerprints: every family's cache is valid on B")
    else:
        rows = [("field", "A", "B")] + [(d.path, repr(d.a), repr(d.b)) for d in result.fields]
        echo(f"{len(result.fields)} field(s) differ:")
        echo(table(rows))
    rows = [("family", "verdict", "deciding fields")]
    for v in result.families:
        rows.append((v.family, v.verdict, ", ".join(d.path for d in v.deciding)))
    echo("per family (a cache built on A, used on B):")
    echo(table(rows))
    if facts:
        echo(f"{len(facts)} recorded cache fact(s) differ (e.g. vLLM hash factors):")
        echo(
            table(
                [("family", "fact", "A", "B")]
                + [(f.family, f"{f.component}:{f.path}", repr(f.a), repr(f.b)) for f in facts]
            )
        )


def inspect(art: Artifact, *, show_files: bool) -> None:
    """Print the artifact's digest, fingerprint, provenance, families (and files)."""
    cfg = art.config
    echo(f"artifact {art.digest} ({cfg.kind})")
    echo(f"  fingerprint {cfg.fingerprint_hash}")
    echo(
        f"  built by artifactd {cfg.provenance.builder} ({cfg.provenance.source}"
        + (f", matrix {cfg.provenance.matrix}" if cfg.provenance.matrix else "")
        + ")"
    )
    rows = [("family", "files", "size", "layer", "scope key")]
    for rec in cfg.layers:
        rows.append(
            (
                rec.family,
                str(len(rec.files)),
                human_bytes(rec.unpacked_size),
                human_bytes(rec.size),
                rec.scope_key[:16] + "...",
            )
        )
    echo(table(rows))
    for can in cfg.canaries:
        on = can.recorded_on
        echo(
            f"  canary of cell {can.cell}: {len(can.prompts)} prompt(s), {can.spec.tokens} "
            f"tokens, top-{can.spec.top_k} logprobs at {can.spec.precision} decimals; recorded "
            f"on {on.gpu or 'no GPU'}, driver {on.driver or '-'}, {on.engine or 'engine ?'}"
        )
        for p in can.prompts:
            echo(
                f"    {p.id}: {len(p.prompt_ids)} prompt ids -> {p.greedy_ids[:8]}"
                + ("..." if len(p.greedy_ids) > 8 else "")
                + f" logprobs {p.logprobs_sha256[:12]}"
            )
    if show_files:
        for rec in cfg.layers:
            for f in rec.files:
                echo(f"  {rec.family}: {f.path} {f.size} {f.sha256[:12]}")


def demo(result: DemoResult) -> None:
    """Print the three stages' times and compile counts, and the time saved per start."""
    echo(f"artifact {result.artifact} in {result.store}")
    echo(f"restored into {result.target}" + ("" if result.kept else " (removed: --keep keeps it)"))
    rows = [
        ("stage", "seconds", "compiled"),
        ("cold warm-up (fresh caches)", f"{result.cold_seconds:.1f}", str(result.cold_compiled)),
        ("artifactd restore (new process)", f"{result.restore_seconds:.2f}", "-"),
        (
            "warm-up on restored caches",
            f"{result.restored_seconds:.1f}",
            str(result.restored_compiled),
        ),
    ]
    echo(table(rows))
    saved = result.cold_seconds - result.restored_seconds - result.restore_seconds
    echo(f"restored/cold = {result.ratio:.2f}: {saved:.1f} s saved per start")
    if result.restore_command:
        echo(f"restore it yourself (DIR: a new directory): {result.restore_command}")


def lint(roots: Mapping[str, object], report: LintReport) -> None:
    """Print the number of roots and files, then each finding with its cost."""
    echo(f"lint: {len(roots)} cache root(s), {report.files_scanned} files scanned")
    for f in report.findings:
        echo(
            f"  {f.severity}: {f.family}/{f.component}/{f.file}: {f.kind} {f.value!r}\n"
            f"      {f.cost}"
        )
    for entry in report.unreadable:
        echo(f"  unreadable: {entry}")
    if not roots:
        echo(
            "  nothing to lint: no cache found (give a DIRECTORY, or set the cache variables "
            "`harvest` reads, such as TRITON_CACHE_DIR)"
        )
    elif not report.findings:
        echo("  clean: nothing ties these caches to this machine")
    else:
        echo(f"  {report.errors} error(s), {report.warnings} warning(s)")


def signing(result: SignResult | None) -> None:
    """Print what ``--sign-key`` signed and attested (nothing without it)."""
    if result is None:
        return
    added = sum(1 for s in result.signed if s.added)
    echo(
        f"signed {len(result.signed)} manifest(s) with key {result.key_id[:19]}... "
        f"({added} new, {len(result.signed) - added} already signed by it)"
        + (f"; {len(result.attestations)} provenance attestation(s)" if result.attestations else "")
    )


def trust(report: TrustReport) -> None:
    """Print an artifact's signatures and attestations, and the verdict when keys were given."""
    if not report.signatures:
        echo("  signatures: none")
    for sig in report.signatures:
        state = (
            f"verified by {sig.verified_by[:19]}..."
            if sig.verified_by
            else sig.problem or "not checked (pass --verify-key)"
        )
        echo(f"  signature {sig.layer[:19]}...: {state}")
    if not report.attestations:
        echo("  attestations: none")
    for att in report.attestations:
        summ = att["summary"]
        state = (
            f"signed by {att['signed_by'][:19]}..."
            if att["signed_by"]
            else att["problem"] or "not checked"
        )
        facts = [f"{k} {v}" for k in ("matrix", "cells") if (v := summ.get(k)) is not None]
        if "verify" in summ:
            facts.append("verify " + ("passed" if summ["verify"].get("passed") else "FAILED"))
        if "lint" in summ:
            facts.append(f"lint {summ['lint'].get('errors', 0)} error(s)")
        echo(f"  attestation {att['predicate_type']}: {state}" + "".join(f"; {f}" for f in facts))
    if report.keys:
        if report.verified_by:
            echo(f"  verified: signed by {report.verified_by}")
        else:
            echo(f"  NOT VERIFIED: {report.error}")


def copy(result: CopyResult) -> None:
    """Print how many manifests went where, their tags, and the transfer."""
    echo(f"copied {result.manifests} manifest(s) from {result.source} to {result.destination}")
    for tag in result.tags:
        echo(f"  {tag}")
    echo(
        f"  uploaded {human_bytes(result.bytes_uploaded)}, already present "
        f"{human_bytes(result.bytes_skipped)}"
        + (
            f"; {len(result.attached)} signature/attestation tag(s) carried"
            if result.attached
            else ""
        )
    )
    signing(result.signing)


def shapes(result: Shapes) -> None:
    """Print ``matrix shapes``: the figures as a table, the notes, the YAML to paste."""
    # lazy: fast path: LATER in artifactd/cli/fast.py, never loaded by a no-op restore
    from artifactd.build.matrix_edit import requests_yaml  # noqa: PLC0415

    def pct(fraction: float | None) -> str:
        return "-" if fraction is None else f"{100 * fraction:.1f}%"

    echo(
        f"{result.engine}: {result.requests_observed} request(s) observed in "
        f"{len(result.sources)} source(s); covering {result.coverage:g} of them"
    )
    rows = [["what", "value", "covers", "from"]]
    for b in result.prompt_buckets:
        upper = "+Inf" if b.upper is None else f"{b.upper:g}"
        rows.append([f"prompt ({b.lower:g}, {upper}]", f"{b.tokens} tokens", f"{b.count} req", ""])
    rows.append(["prompt buckets", "", pct(result.prompt_covered), result.metrics["prompt"]])
    rows.append(
        [
            "max_tokens",
            str(result.max_tokens),
            pct(result.max_tokens_covered),
            result.metrics["max_tokens"],
        ]
    )
    rows.append(
        [
            "concurrency",
            str(result.concurrency),
            f"{result.concurrency_samples} sample(s)",
            result.metrics.get("concurrency", "-"),
        ]
    )
    rows.append(
        [
            "cuda graph sizes",
            " ".join(str(s) for s in result.cuda_graph_sizes),
            pct(result.cuda_graph_covered),
            result.metrics.get("cuda_graph_sizes", "derived from concurrency"),
        ]
    )
    echo(table(rows))
    for note in result.notes:
        echo(f"  note: {note}")
    echo(f"\nengine flag: {result.cuda_graph_flag}")
    echo("serve.requests (prompt_tokens count words, about one token each):")
    echo("\n".join(requests_yaml(result.requests, "  ")))


def mirrors(plan: MirrorPlan) -> None:
    """Print the hosts a pull uses, in order, and why (``artifactd mirrors``)."""
    echo(f"{plan.host}/{plan.repo}: {plan.source}")
    if plan.blocked:
        echo("  blocked: registries.conf refuses every pull from this registry")
    for i, m in enumerate(plan.mirrors, 1):
        offers = (("content by digest", m.pull), ("tags if the origin fails", m.resolve))
        can = [words for words, on in offers if on]
        extra = []
        if m.ns:
            extra.append(f"?ns={m.ns}")
        if m.headers:
            extra.append("headers " + ", ".join(sorted({k for k, _ in m.headers})))
        if m.skip_verify:
            extra.append("TLS not verified")
        tail = f" [{'; '.join(extra)}]" if extra else ""
        echo(f"  {i}. {m.base} ({', '.join(can)}){tail}")
    last = f"{len(plan.mirrors) + 1}. {plan.host}/{plan.repo}"
    echo(f"  {last} (the registry: tags, signatures; content last)")
    for line in plan.why:
        echo(f"  why: {line}")


def prediction(result: Prediction) -> None:
    """``predict``: one line per cache entry, the factor groups under it, the coarse notes."""
    echo(f"predict: {result.source}: the engine {_OUTCOME[result.outcome]}")
    for e in result.entries:
        echo(f"  {e.family} {e.entry}: {e.line()}")
        for c in e.checks:
            extra = c.total - len(c.differences)
            more = f" (+{extra} more)" if extra > 0 else ""
            tail = f": {c.reason}" if c.status == "unknown" else more
            echo(f"    {c.group}: {c.status}{tail}")
    for note in result.notes:
        echo(f"  note: {note}")


def prediction_event(event: Mapping[str, Any]) -> None:
    """``restore --predict``: the prediction's lines on stderr the moment it is made."""
    outcome = _OUTCOME.get(str(event.get("outcome")), "unknown")
    echo(f"predict: {event.get('source')}: the engine {outcome}", err=True)
    lines = event.get("lines")
    for entry, line in lines.items() if isinstance(lines, Mapping) else ():
        echo(f"  vllm {entry}: {line}", err=True)


_OUTCOME = {"hit": "will hit", "miss": "will miss", "unknown": "may or may not hit (unknown)"}
