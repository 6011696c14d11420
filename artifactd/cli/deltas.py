"""``contribute`` and ``absorb``: what pods compiled anyway, flowing back through a gate."""

from __future__ import annotations

from pathlib import Path

import click

from artifactd import bounds as B  # noqa: N812
from artifactd.cli import render
from artifactd.cli.group import cli
from artifactd.cli.options import (
    gpu_arch_option,
    image_digest_option,
    insecure_option,
    json_option,
    load_sign_key,
    number_option,
    set_option,
    sign_key_option,
    store_option,
    verify_key_option,
)


@cli.command()
@click.option(
    "--target",
    type=click.Path(path_type=Path),
    required=True,
    help="The restore target whose engine ran (holds .artifactd/restored.json).",
)
@click.option(
    "--store",
    "store",
    required=True,
    metavar="REF",
    help="The delta store: oci:PATH or HOST[:PORT]/REPO, one the pods may only write.",
)
@click.option(
    "--base-store",
    metavar="REF",
    help="Where to read the artifact the pod restored [default: the restore marker's store].",
)
@number_option(
    "--max-bytes",
    bound=B.SIZE,
    metavar="SIZE",
    default=B.DELTA_MAX_BYTES,
    show_default=True,
    help="Publish nothing when the files written since the restore take more.",
)
@sign_key_option
@insecure_option
@json_option
def contribute(
    *,
    target: Path,
    store: str,
    base_store: str | None,
    max_bytes: int,
    sign_key: str | None,
    insecure: bool,
    as_json: bool,
) -> None:
    """Publish what the engine compiled since the restore as a quarantined delta.

    Per restored family, the files `artifactd status` counts as written since
    the restore (the same verdict: locks, temp dirs and load rewrites left
    out) are packed as the family's layer and published as one `kind: delta`
    artifact tagged delta-<sha256>, content-addressed: pods that compiled the
    same bytes publish one delta. No restore ever installs a delta; `artifactd
    absorb` reads them. Nothing compiled: nothing published, exit 0; so
    does more than --max-bytes (sized before anything is copied). A file
    that cannot be read is left out with a warning; a temp dir (TMPDIR) too
    small for the copy exits 9, nothing published.
    """
    from artifactd.pod.contribute import contribute as do_contribute

    key = load_sign_key(sign_key)
    result = do_contribute(
        target, store, base_store=base_store, sign_key=key, max_bytes=max_bytes, insecure=insecure
    )
    for skipped in result.skipped:
        render.echo(f"artifactd: warning: left out, unreadable: {skipped}", err=True)
    if as_json:
        from artifactd.reports import result_report

        render.emit_json(result_report(result))
        return
    render.echo(result.reason)
    if result.tag is not None and result.published:
        render.echo(f"delta {result.store}:{result.tag} ({result.digest}) extends {result.extends}")
        for fam in result.families:
            render.echo(f"  {fam.family}: {fam.files} file(s), {render.human_bytes(fam.bytes)}")


@cli.command()
@click.argument("matrix", type=click.Path(path_type=Path))
@store_option
@click.option(
    "--deltas",
    "deltas_ref",
    required=True,
    metavar="REF",
    help="The delta store the pods contribute to (may be the same as --store).",
)
@verify_key_option(
    "Accept only deltas signed by one of these public keys (repeatable); "
    "an unsigned delta, or one signed by another key, is refused."
)
@number_option(
    "--max-bytes",
    bound=B.SIZE,
    metavar="SIZE",
    default=B.DELTA_MAX_BYTES,
    show_default=True,
    help="Refuse a delta whose files take more.",
)
@gpu_arch_option("Override the matrix's declared target (sm_90a).")
@image_digest_option("Override the matrix's base image digest.")
@set_option
@sign_key_option
@json_option
def absorb(
    *,
    matrix: Path,
    store: str,
    insecure: bool,
    deltas_ref: str,
    verify_keys: tuple[str, ...],
    max_bytes: int,
    gpu_arch: str | None,
    image_digest: str | None,
    overrides: tuple[str, ...],
    sign_key: str | None,
    as_json: bool,
) -> None:
    """Judge every contributed delta and publish the promoted artifact plus the accepted ones.

    Each delta is hostile input: under --verify-key it must be signed by one
    of the keys; it must be built for the fingerprint MATRIX publishes on
    this machine, change no file the promoted artifact (fp-<hash> in --store)
    holds, pass the restore's unpack checks and merge by the family's rules.
    Each is reported accepted or refused, with the reason. The candidate is
    published in --store under the candidate-<hash> tag printed, for
    `artifactd verify MATRIX --candidate TAG` to gate. --sign-key signs the
    candidate (CI's key), so that `verify --candidate --verify-key` gates
    only what absorb published.
    """
    from artifactd.build.absorb import absorb as do_absorb
    from artifactd.stores import open_store
    from artifactd.trust.policy import verification

    key = load_sign_key(sign_key)  # before any delta is read: a bad key fails at once
    trust = verification(verify_keys)
    with (
        open_store(store, insecure=insecure) as st,
        open_store(deltas_ref, insecure=insecure) as dst,
    ):
        result = do_absorb(
            matrix,
            st,
            dst,
            trust=trust,
            max_bytes=max_bytes,
            gpu_arch=gpu_arch,
            image_digest=image_digest,
            overrides=overrides,
            sign_key=key,
        )
    if as_json:
        from artifactd.reports import result_report

        render.emit_json(result_report(result))
        return
    rows = [["DELTA", "VERDICT", "FILES", "REASON"]]
    rows += [
        [d.tag[:22], "accepted" if d.accepted else "refused", str(d.files), d.reason]
        for d in result.deltas
    ]
    render.echo(render.table(rows) if result.deltas else "no deltas in " + result.deltas_store)
    if result.candidate is None:
        render.echo("nothing accepted: no candidate published")
        return
    added = sum(len(paths) for paths in result.contributed.values())
    render.echo(
        f"candidate {result.store}:{result.candidate} ({result.digest}): extends "
        f"{result.extends[:19]}... with {added} contributed file(s)"
    )
    render.signing(result.signing)
