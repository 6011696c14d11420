"""``matrix cells``, ``merge`` and ``verify``: a build fanned out over nodes, and its gate."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from artifactd.cli import render
from artifactd.cli.group import cli
from artifactd.cli.options import (
    cell_options,
    gpu_arch_option,
    image_digest_option,
    json_option,
    load_sign_key,
    option,
    run_id_option,
    set_option,
    sign_key_option,
    store_option,
    verify_key_option,
)
from artifactd.cli.specs import SIGN_KEY

if TYPE_CHECKING:
    from artifactd.build.candidate import CandidateVerified


@cli.group()
def matrix() -> None:
    """Warm-up matrices: their cells, for a CI matrix or a Kubernetes Indexed Job."""


@matrix.command()
@click.argument("file", type=click.Path(path_type=Path))
@json_option
def cells(*, file: Path, as_json: bool) -> None:
    """List FILE's cells: index, id, GPUs needed, axis values.

    \b
    --json gives {"include": [{"index": 0, "id": ..., "gpus": 1, AXIS: VALUE...}]}:
    .include is a GitHub Actions strategy.matrix.include as it is:
      cells=$(artifactd matrix cells FILE --json | jq -c .include)
      strategy: {matrix: {include: ${{ fromJSON(needs.plan.outputs.cells) }}}}
    A Kubernetes Indexed Job takes completions = the count.
    """
    from artifactd.build.matrix import expand, load_matrix
    from artifactd.build.published import check_key

    loaded = load_matrix(file)
    check_key(loaded, file)  # a plan job fails before any worker starts
    expanded = expand(loaded, file)
    if as_json:
        from artifactd.reports import versioned

        render.emit_json(
            versioned(
                {
                    "matrix": loaded.name,
                    "count": len(expanded),
                    "include": [
                        {"index": c.index, "id": c.id, "gpus": c.gpus, **c.values} for c in expanded
                    ],
                }
            )
        )
        return
    render.echo(f"{loaded.name}: {len(expanded)} cell(s)")
    for c in expanded:
        mode = "serve" if c.serve is not None else "command"
        values = ", ".join(f"{k}={v}" for k, v in c.values.items())
        render.echo(f"  {c.index:>3}  {c.id:<32} gpus={c.gpus}  {mode}  {values}")


@cli.command()
@click.argument("file", type=click.Path(path_type=Path))
@store_option
@run_id_option(
    "The fan-out run: as every cell's build had it (letters, digits, '.', '_', '-').",
    required=True,
)
@sign_key_option
@json_option
def merge(
    *, file: Path, store: str, insecure: bool, run_id: str, sign_key: str | None, as_json: bool
) -> None:
    """Compose a fan-out run's cell artifacts into the whole artifact of the fingerprint.

    Reads run-<ID>-cell-<I> for every cell of FILE (a missing cell fails, exit
    7), checks they were built for one fingerprint, and merges them family by
    family: a layer only one cell has (or every cell has the same) is reused
    in the registry, never downloaded or uploaded; others are verified,
    unpacked, merged (a path two cells wrote with different bytes fails,
    naming both) and packed again. Publishes fp-<hash> and the family tags,
    like `build`. Merging again writes the same digests and uploads nothing.
    """
    from artifactd.build.merge import merge as do_merge
    from artifactd.stores import open_store

    key = load_sign_key(sign_key)
    with open_store(store, insecure=insecure) as st:
        on_event = render.event_printer(as_json, lines=True)
        result = do_merge(file, st, run_id, on_event=on_event, sign_key=key)
    if as_json:
        from artifactd.reports import result_report

        render.emit_json(result_report(result))
        return
    render.echo(f"merged {len(result.cells)} cell(s) of run {run_id} into {result.digest}")
    for fam in result.families:
        moved = (
            f", {render.human_bytes(fam.bytes_downloaded)} downloaded"
            if fam.how == "repacked"
            else ""
        )
        render.echo(
            f"  {fam.family:<11} {fam.how:<8} {fam.files} file(s) "
            f"from {len(fam.cells)} cell(s){moved}"
        )
    render.echo(
        f"uploaded {render.human_bytes(result.bytes_uploaded)}, already there "
        f"{render.human_bytes(result.bytes_skipped)}; tags: {', '.join(result.tags)}"
    )
    render.signing(result.signing)


@cli.command()
@click.argument("file", type=click.Path(path_type=Path))
@store_option
@gpu_arch_option("Override the matrix's declared target (sm_90a).")
@image_digest_option("Override the matrix's base image digest.")
@set_option
@cell_options
@click.option(
    "--promote",
    metavar="TAG",
    help="Tag the artifact TAG in the store, only if the gate passes.",
)
@click.option(
    "--candidate",
    metavar="TAG",
    help="Gate the candidate `absorb` published: only contributed entries a cell re-compiled "
    "are kept; what passes becomes the fingerprint's artifact with --promote.",
)
@click.option(
    "--keep-roots",
    type=click.Path(path_type=Path),
    help="Keep each cell's restored roots and log under this directory.",
)
@verify_key_option(
    "Gate only an artifact signed by one of these public keys (repeatable): with "
    "--candidate, the candidate (`absorb --sign-key`) and the promoted artifact it extends. "
    "Unsigned or signed by another key: refused before any cell runs, exit 14."
)
@option(
    SIGN_KEY._replace(
        help="Attest the artifact's provenance again, with this gate's verdict in it, "
        "signed with this private key (a PEM file, or env://NAME)."
    )
)
@json_option
def verify(
    *,
    file: Path,
    store: str,
    insecure: bool,
    gpu_arch: str | None,
    image_digest: str | None,
    overrides: tuple[str, ...],
    gpus: str | None,
    jobs: int,
    promote: str | None,
    candidate: str | None,
    keep_roots: Path | None,
    verify_keys: tuple[str, ...],
    sign_key: str | None,
    as_json: bool,
) -> None:
    """Gate a build: restore the artifact, re-run every cell on it, compare.

    For each cell of FILE: restore this machine's artifact into fresh roots,
    run the cell there, compare the checks it prints with those the build
    recorded (strings exactly, numbers within the matrix's check_tolerance),
    and judge per family whether it used the restored caches, exactly as
    `artifactd status` judges those roots (files written since the restore;
    lock files and a library's load rewrites excluded).
    Exits 0 only if every check matches and nothing was compiled, else 12
    with a per-cell, per-family table. --promote TAG tags the artifact only
    then, so a CI job can gate on it. --sign-key attests the artifact's
    provenance again with the gate's verdict in it (sha256-<hex>.att).

    With --candidate, what is promoted is rebuilt from the promoted artifact
    plus exactly the contributed entries a cell re-compiled; a candidate
    changed after `absorb` (a file added, changed or removed) is refused,
    exit 12, before any cell runs.
    """
    from artifactd.build.candidate import CandidateVerified, verify_candidate
    from artifactd.build.gate import GateSetup, VerifyResult
    from artifactd.build.gate import verify as do_verify
    from artifactd.build.schedule import parse_gpus
    from artifactd.stores import open_store
    from artifactd.trust.policy import verification

    key = load_sign_key(sign_key)
    setup = GateSetup(
        verification(verify_keys),
        gpu_arch=gpu_arch,
        image_digest=image_digest,
        overrides=overrides,
        on_event=render.event_printer(as_json, lines=True),
    )
    devices = parse_gpus(gpus) if gpus is not None else None
    result: VerifyResult | CandidateVerified
    with open_store(store, insecure=insecure) as st:
        if candidate is None:
            result = do_verify(
                file,
                st,
                setup,
                gpus=devices,
                jobs=jobs,
                promote=promote,
                keep_roots=keep_roots,
                sign_key=key,
            )
        else:
            result = verify_candidate(
                file,
                st,
                candidate,
                setup,
                gpus=devices,
                jobs=jobs,
                promote=promote,
                sign_key=key,
                keep_roots=keep_roots,
            )
    gate = result.gate if isinstance(result, CandidateVerified) else result
    if as_json:
        from artifactd.reports import result_report

        render.emit_json(result_report(result))
    else:
        render.verify(gate)
        if isinstance(result, CandidateVerified):
            _render_candidate(result)
    if not gate.passed:
        from artifactd.errors import VerifyError

        sys.exit(VerifyError.exit_code)


def _render_candidate(result: CandidateVerified) -> None:
    """Print the lines ``verify --candidate`` adds under the gate's table."""
    if result.signed_by is not None:
        render.echo(f"candidate signed by {result.signed_by[:19]}...")
    for name, paths in sorted(result.vouched.items()):
        render.echo(f"vouched {name}: {len(paths)} contributed file(s) re-compiled by a cell")
    for name, paths in sorted(result.dropped.items()):
        render.echo(f"dropped {name}: {', '.join(paths)} (no cell re-compiled them)")
