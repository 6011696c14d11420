"""``image``: runtime images that carry their compile caches."""

from __future__ import annotations

import click

from artifactd.cli import render
from artifactd.cli.app import cli
from artifactd.cli.options import insecure_option, json_option


@cli.group()
def image() -> None:
    """Runtime images that carry their compile caches (see `image append --help`)."""


@image.command()
@click.option("--base", required=True, metavar="REF", help="The runtime image: HOST/REPO:TAG.")
@click.option(
    "--artifact",
    required=True,
    metavar="REF",
    help="The artifact to bake in: STORE:TAG or STORE@sha256:... (any store).",
)
@click.option(
    "--to",
    "to",
    required=True,
    metavar="REF",
    help="The image to write: HOST/REPO:TAG, in the base's registry.",
)
@click.option(
    "--compression",
    type=click.Choice(["gzip", "zstd"]),
    default="gzip",
    show_default=True,
    help="Of the new layer: gzip every runtime reads; zstd for OCI bases only.",
)
@insecure_option
@json_option
def append(
    *, base: str, artifact: str, to: str, compression: str, insecure: bool, as_json: bool
) -> None:
    """Write TO: BASE plus one layer holding ARTIFACT at /opt/prebuilt-cache/<hash>/.

    No container engine: straight in the registry. The base's layers are
    mounted into TO's repository, never downloaded or uploaded; only the new
    layer and the new config are sent. The baked directory is a store:
    `artifactd restore --store oci:/opt/prebuilt-cache/<hash>` restores from it
    inside the image, and the image's environment says where it is
    (ARTIFACTD_PREBUILT). Appending the same artifact again uploads nothing.
    """
    from artifactd.images.append import append_image

    result = append_image(
        base,
        artifact,
        to,
        compression="zstd" if compression == "zstd" else "gzip",
        insecure=insecure,
        on_event=render.event_printer(as_json),
    )
    if as_json:
        from artifactd.reports import result_report

        render.emit_json(result_report(result))
        return
    render.echo(f"appended {result.artifact[:19]}... to {base}")
    render.echo(f"  wrote {result.target} ({result.digest})")
    render.echo(f"  fingerprint {result.fingerprint_hash}, platforms {', '.join(result.platforms)}")
    render.echo(
        f"  new layer {render.human_bytes(result.layer_size)}; uploaded "
        f"{render.human_bytes(result.bytes_uploaded)}, base layers reused "
        f"{render.human_bytes(result.bytes_reused)}"
    )
