"""``image``: runtime images that carry their compile caches."""

from __future__ import annotations

from pathlib import Path

import click

from artifactd.cli import render
from artifactd.cli.group import cli
from artifactd.cli.options import insecure_option, json_option, verify_key_option


@cli.group()
def image() -> None:
    """Runtime images that carry their compile caches, and the init-container image.

    `image append` writes a runtime image straight in the registry, no engine;
    `image build` builds a runtime or init image with a container engine.
    """


#: What --verify-key means where an artifact is baked into an image.
BAKE_VERIFY_HELP = (
    "Bake only an artifact signed by one of these public keys (repeatable); checked before "
    "anything is written, exit 14 otherwise. Pods verify again at restore (the baked store "
    "carries the signatures); without a key the artifact is baked unverified."
)


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
@verify_key_option(BAKE_VERIFY_HELP)
@insecure_option
@json_option
def append(
    *,
    base: str,
    artifact: str,
    to: str,
    compression: str,
    verify_keys: tuple[str, ...],
    insecure: bool,
    as_json: bool,
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
    from artifactd.trust.policy import verification

    result = append_image(
        base,
        artifact,
        to,
        trust=verification(verify_keys),
        compression="zstd" if compression == "zstd" else "gzip",
        insecure=insecure,
        on_event=render.event_printer(as_json, lines=True),
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


@image.command(name="build")
@click.option(
    "--kind",
    type=click.Choice(["runtime", "init"]),
    required=True,
    help="runtime: BASE plus the artifact's caches; init: artifactd alone, running restore.",
)
@click.option(
    "--base",
    required=True,
    metavar="REF",
    help="runtime: the runtime image, HOST/REPO:TAG (resolved to its digest) or "
    "HOST/REPO@sha256:...; init: a Python image with python3 -m venv (any reference "
    "the engine resolves).",
)
@click.option(
    "--artifact",
    metavar="REF",
    help="runtime only: the artifact to bake in, STORE:TAG or STORE@sha256:... (any store).",
)
@click.option(
    "--tag",
    "tags",
    multiple=True,
    metavar="NAME",
    help="Name the image (repeatable). Default: artifactd-runtime:<hash12> or "
    "artifactd-init:<version>.",
)
@click.option("--push", metavar="REF", help="Also tag the image HOST/REPO:TAG and push it there.")
@click.option(
    "--source",
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    help="init only: the artifactd checkout to `pip wheel` (default: the one running, if any).",
)
@click.option(
    "--wheels",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    metavar="DIR",
    help="init only: prebuilt wheels of artifactd and its dependencies, instead of --source.",
)
@click.option(
    "--docker-host",
    metavar="URL",
    help="The Docker Engine API to build with (dockerd, or `podman system service`). "
    "Default: as the docker CLI finds it: DOCKER_HOST (with DOCKER_TLS_VERIFY and "
    "DOCKER_CERT_PATH for TLS), else unix:///var/run/docker.sock.",
)
@verify_key_option(BAKE_VERIFY_HELP)
@insecure_option
@json_option
def build(
    *,
    kind: str,
    base: str,
    artifact: str | None,
    tags: tuple[str, ...],
    push: str | None,
    source: Path | None,
    wheels: Path | None,
    docker_host: str | None,
    verify_keys: tuple[str, ...],
    insecure: bool,
    as_json: bool,
) -> None:
    """Build a runtime or init-container image through a container engine.

    Renders dockerfiles/<kind>.Dockerfile.j2, prepares its build context and
    builds it through the Docker Engine API (dockerd or podman's service); needs
    the docker SDK: pip install 'artifactd[docker]'.

    \b
    runtime: BASE, by digest, plus ARTIFACT as a store at
    /opt/prebuilt-cache/<hash>/, with the labels and environment that
    `image append` writes (which needs no engine):
      artifactd image build --kind runtime --base registry:5000/ml/vllm:0.8 \\
          --artifact registry:5000/ml/caches:fp-<hash> --push registry:5000/ml/vllm:0.8-warm

    \b
    init: artifactd's core (no torch) in a venv on a Python base, running
    `artifactd restore` as uid 65532. The wheels come from this checkout (pip
    wheel, for this machine's Python: the base's python3 must be the same
    version) or from --wheels; the engine's build itself needs no network:
      artifactd image build --kind init --base python:3.11-slim-bookworm \\
          --push registry:5000/ml/artifactd-init:0.1.0

    The engine pulls the base and pushes with its own credentials (`docker
    login`, the Docker config); artifactd reads the artifact with its own.
    The build log streams as events (--json: JSON lines on stderr); a failed
    build exits 7 with the engine's message and the log's last lines; an
    unreachable engine exits 3.
    """
    from artifactd.images.build import build_image
    from artifactd.trust.policy import verification

    result = build_image(
        kind,
        base=base,
        artifact=artifact,
        tags=tags,
        push=push,
        source=source,
        wheels=wheels,
        host=docker_host,
        insecure=insecure,
        trust=verification(verify_keys) if kind == "runtime" else None,
        on_event=render.event_printer(as_json, lines=True),
    )
    if as_json:
        from artifactd.reports import result_report

        render.emit_json(result_report(result))
        return
    render.echo(f"built {result.kind} image {result.image_id[:19]}... from {result.base_ref}")
    render.echo(f"  tags {', '.join(result.tags)}")
    render.echo(f"  size {render.human_bytes(result.size)}, {result.seconds:.1f} s")
    if result.fingerprint_hash:
        render.echo(
            f"  fingerprint {result.fingerprint_hash}, artifact {result.artifact}, "
            f"families {', '.join(result.families)}"
        )
    if result.version:
        render.echo(f"  artifactd {result.version}")
    if result.pushed:
        render.echo(f"  pushed {result.pushed} ({result.digest})")
