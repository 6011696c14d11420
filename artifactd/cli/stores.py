"""``inspect``, ``ls`` and ``copy``: what a store holds, and moving it."""

from __future__ import annotations

import os

import click

from artifactd import constants as C  # noqa: N812
from artifactd.cli import render
from artifactd.cli.app import cli
from artifactd.cli.options import insecure_option, json_option


@cli.command()
@click.argument("ref")
@click.option("--files", "show_files", is_flag=True, help="List every file.")
@insecure_option
@json_option
def inspect(*, ref: str, show_files: bool, insecure: bool, as_json: bool) -> None:
    """Show what an artifact holds: fingerprint, families, files, provenance.

    REF is oci:DIR:TAG, HOST[:PORT]/REPO:TAG, or either with @sha256:DIGEST
    (see `artifactd ls`).
    """
    from artifactd.artifacts import open_artifact

    art = open_artifact(ref, insecure=insecure)
    if as_json:
        from artifactd.reports import inspect_report

        render.emit_json(inspect_report(art))
    else:
        render.inspect(art, show_files=show_files)


@cli.command(name="ls")
@click.argument("store", required=False, default=None)
@insecure_option
@json_option
def ls_cmd(*, store: str | None, insecure: bool, as_json: bool) -> None:
    """List the tags in a store (default: ARTIFACTD_STORE or oci:.artifactd/store)."""
    from artifactd.stores import list_tags

    ref = store or os.environ.get(C.ENV_STORE, C.DEFAULT_STORE)
    tags = list_tags(ref, insecure=insecure)
    if as_json:
        from artifactd.reports import tags_report

        render.emit_json(tags_report(ref, tags))
        return
    for tag in tags:
        click.echo(tag)


@cli.command()
@click.argument("source")
@click.argument("destination")
@click.option(
    "--tag",
    "tags",
    multiple=True,
    metavar="TAG",
    help="Copy only these tags (repeatable). Default: every artifactd artifact.",
)
@insecure_option
@json_option
def copy(
    *, source: str, destination: str, tags: tuple[str, ...], insecure: bool, as_json: bool
) -> None:
    """Copy artifacts between stores (local layout <-> registry, registry -> registry).

    Blobs the destination already has are not transferred; every blob is
    verified against its digest on the way; a tag is written only after all of
    its manifest's blobs are in place.
    """
    from artifactd.artifacts import copy_between

    result = copy_between(source, destination, list(tags) or None, insecure=insecure)
    if as_json:
        from artifactd.reports import result_report

        render.emit_json(result_report(result))
    else:
        render.copy(result)
