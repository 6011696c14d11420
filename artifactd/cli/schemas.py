"""``schema``: write the JSON Schemas of artifactd's documents."""

from __future__ import annotations

from pathlib import Path

import click

from artifactd.cli import render
from artifactd.cli.group import cli
from artifactd.cli.options import json_option


@cli.command()
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=Path("registry-schema"),
    show_default=True,
    help="Directory to write the JSON Schemas into.",
)
@json_option
def schema(*, out: Path, as_json: bool) -> None:
    """Write the JSON Schemas of artifactd's documents (artifact config, fingerprint...)."""
    from artifactd.schemas import write_schemas

    written = write_schemas(out)
    if as_json:
        from artifactd.reports import schemas_report

        render.emit_json(schemas_report(out, written))
        return
    for path in written:
        click.echo(str(path))
