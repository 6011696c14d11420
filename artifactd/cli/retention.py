"""``prune`` and ``du``: registry retention, and what a store holds."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from artifactd import bounds as B  # noqa: N812
from artifactd.cli import render
from artifactd.cli.group import cli
from artifactd.cli.options import json_option, number_option, store_option, verify_key_option
from artifactd.stores.retention import DEFAULT_GRACE_S, DEFAULT_KEEP_LAST

if TYPE_CHECKING:
    from artifactd.stores.retention import DuReport, PrunePlan


@cli.command()
@store_option
@number_option(
    "--keep-last",
    bound=B.KEEP_LAST,
    default=DEFAULT_KEEP_LAST,
    show_default=True,
    metavar="N",
    help="Keep the N newest artifacts of each family, N whole artifacts and N fan-out runs.",
)
@number_option(
    "--older-than",
    "older_than",
    bound=B.OLDER_THAN_DAYS,
    default=None,
    metavar="DAYS",
    help="Delete only artifacts older than DAYS (0: every artifact is old enough).",
)
@click.option(
    "--keep-tag",
    "keep_tags",
    multiple=True,
    metavar="PATTERN",
    help="Keep what tags matching this shell pattern name (repeatable), e.g. 'release-*'.",
)
@number_option(
    "--grace",
    bound=B.GRACE_S,
    default=DEFAULT_GRACE_S,
    show_default=True,
    metavar="SECONDS",
    help="Never delete an artifact pushed less than SECONDS ago (a push racing the prune).",
)
@verify_key_option(
    "Rank the artifacts these public keys verify (repeatable) ahead of the rest in "
    "--keep-last: what no key signed never pushes out what one did."
)
@click.option("--apply", "do_apply", is_flag=True, help="Delete. Without it: a dry run.")
@json_option
def prune(
    *,
    store: str,
    insecure: bool,
    keep_last: int,
    older_than: float | None,
    keep_tags: tuple[str, ...],
    grace: float,
    verify_keys: tuple[str, ...],
    do_apply: bool,
    as_json: bool,
) -> None:
    """Delete old artifacts from a store: a dry run unless --apply.

    Kept: what a --keep-tag pattern or a promoted tag (any tag outside
    fp-/<family>-<scope>/run-*-cell-*) names, with the family artifacts that
    carry its layers; the --keep-last newest of each family (with
    --verify-key, the signed ones first; a creation time more than 5 minutes
    ahead is an unknown age and ranks last); anything pushed within --grace
    seconds; with --older-than, anything younger. Deltas and unpromoted
    candidates are kept for --older-than DAYS (default 7), then deleted.
    Fan-out cells count by run and go or stay a run at a time. A manifest
    whose tags were re-pointed (tagged superseded-*) goes after --grace.
    Signatures and attestations go with their artifact. Age is the creation
    time artifactd stamps on each manifest, never the registry's. On a registry,
    manifests are deleted through its API (deletes must be enabled) and its
    own garbage collection frees the blobs afterwards; on oci:DIR,
    unreferenced blobs are removed too.
    """
    from artifactd.stores import open_store
    from artifactd.stores.retention import Rules, apply, plan
    from artifactd.trust.policy import verification

    rules = Rules(keep_last, older_than, grace, keep_tags, trust=verification(verify_keys))
    with open_store(store, insecure=insecure) as st:
        pruned = plan(st, rules)
        if do_apply:
            pruned = apply(st, pruned, on_event=render.event_printer(as_json))
    if as_json:
        from artifactd.reports import result_report

        render.emit_json(result_report(pruned))
    else:
        _show_prune(pruned)


def _show_prune(pruned: PrunePlan) -> None:
    """Print the plan as a table (one row per tag), then what was or would be done."""
    rows = [["TAG", "KIND", "FAMILY", "AGE", "BYTES", "DECISION", "REASON"]]
    for d in pruned.decisions:
        for tag in d.tags:
            rows.append(
                [
                    tag,
                    d.kind,
                    d.family or "-",
                    _age(d.age_s),
                    render.human_bytes(d.bytes),
                    d.decision,
                    d.reason,
                ]
            )
    if len(rows) > 1:
        render.echo(render.table(rows))
    n = sum(1 for d in pruned.decisions if d.decision == "delete")
    freed = render.human_bytes(pruned.bytes_freed)
    if pruned.dry_run:
        render.echo(
            f"dry run: would delete {n} manifest(s), {len(pruned.delete_tags)} tag(s), "
            f"{freed} only they use; add --apply to delete"
        )
        return
    render.echo(f"deleted {len(pruned.deleted)} manifest(s) from {pruned.store}")
    if pruned.skipped:
        render.echo(f"left {len(pruned.skipped)} that a new tag names since the plan")
    if pruned.gc_hints:
        render.echo(
            f"the registry frees their {freed} at its next garbage collection, run on its "
            "host with the registry stopped or read-only (CONFIG: its config file):"
        )
        for hint in pruned.gc_hints:
            render.echo(f"  {hint}")
    else:
        render.echo(
            f"removed {pruned.blobs_removed} unreferenced blob(s), "
            f"{render.human_bytes(pruned.bytes_removed)}"
        )


def _age(seconds: float | None) -> str:
    """Show an age in the largest whole unit."""
    if seconds is None:
        return "?"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{max(seconds, 0):.0f}s"


@cli.command()
@store_option
@json_option
def du(*, store: str, insecure: bool, as_json: bool) -> None:
    """Show the bytes a store holds per family and per fingerprint.

    Every blob a tag reaches counts once in the total; a blob two
    fingerprints share counts for each. On oci:DIR, blobs no tag reaches
    are shown apart (a prune --apply removes them).
    """
    from artifactd.stores import open_store
    from artifactd.stores.retention import usage

    with open_store(store, insecure=insecure) as st:
        report = usage(st)
    if as_json:
        from artifactd.reports import result_report

        render.emit_json(result_report(report))
    else:
        _show_du(report)


def _show_du(report: DuReport) -> None:
    """Print the per-family and per-fingerprint tables and the totals."""
    rows = [["FAMILY", "BYTES", "LAYERS"]]
    rows += [
        [name, render.human_bytes(u.bytes), str(u.blobs)] for name, u in report.families.items()
    ]
    render.echo(render.table(rows))
    rows = [["FINGERPRINT", "BYTES", "BLOBS", "TAGS"]]
    rows += [
        [fp[:16], render.human_bytes(u.bytes), str(u.blobs), str(len(u.tags))]
        for fp, u in report.fingerprints.items()
    ]
    render.echo(render.table(rows))
    line = f"total {render.human_bytes(report.total_bytes)} ({report.total_bytes} bytes)"
    if report.other_bytes:
        line += f", of which {render.human_bytes(report.other_bytes)} signatures and others"
    if report.unreferenced_bytes is not None:
        line += f"; {render.human_bytes(report.unreferenced_bytes)} unreferenced"
    if report.superseded_bytes:
        line += (
            f"; {render.human_bytes(report.superseded_bytes)} only in superseded manifests "
            "(re-pointed tags: prune deletes them after the grace)"
        )
    render.echo(f"{report.store}: {line}")
