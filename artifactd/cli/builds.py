"""``harvest``, ``build``, ``demo`` and ``lint``: the CI image pipeline's side."""

from __future__ import annotations

from pathlib import Path

import click

from artifactd import bounds as B  # noqa: N812
from artifactd import constants as C  # noqa: N812
from artifactd.cli import render
from artifactd.cli.group import cli
from artifactd.cli.options import (
    cell_options,
    family_option,
    fingerprint_options,
    gpu_arch_option,
    image_digest_option,
    json_option,
    load_sign_key,
    number_option,
    positional_or_option,
    run_id_option,
    set_option,
    sign_key_option,
    store_option,
)
from artifactd.cli.specs import family_names
from artifactd.errors import LintError


@cli.command()
@store_option
@family_option
@fingerprint_options
@sign_key_option
@json_option
def harvest(
    *,
    store: str,
    insecure: bool,
    sign_key: str | None,
    families: tuple[str, ...],
    gpu_arch: str | None,
    image_digest: str | None,
    workload: tuple[str, ...],
    overrides: tuple[str, ...],
    as_json: bool,
) -> None:
    """Pack the caches a warm-up already wrote and publish them to the store.

    Caches are found where the libraries look: TRITON_CACHE_DIR,
    TORCHINDUCTOR_CACHE_DIR (+ the precompiled header under TMPDIR),
    ARTIFACTD_GENERIC_DIR, or their defaults. Run it right after your own
    warm-up, with the same environment.
    """
    from artifactd.build.harvest import harvest_here

    key = load_sign_key(sign_key)
    result = harvest_here(
        store,
        insecure=insecure,
        families=family_names(families),
        gpu_arch=gpu_arch,
        image_digest=image_digest,
        workload=workload,
        overrides=overrides,
        on_event=render.event_printer(as_json, lines=True),
        sign_key=key,
    )
    if as_json:
        from artifactd.reports import result_report

        render.emit_json(result_report(result))
    else:
        render.harvest(result)
        render.signing(result.signing)


@cli.command()
@click.argument("matrix", type=click.Path(path_type=Path))
@store_option
@gpu_arch_option("Override the matrix's declared target (sm_90a).")
@image_digest_option("Override the matrix's base image digest.")
@click.option(
    "--keep-roots",
    type=click.Path(path_type=Path),
    default=None,
    help="Build into this (empty) directory and keep it, instead of a temp dir.",
)
@set_option
@click.option(
    "--strict",
    is_flag=True,
    help="Fail (exit 11) when the hygiene lint finds anything (default: report warnings).",
)
@number_option(
    "--cell",
    bound=B.CELL_INDEX,
    envvar=C.JOB_COMPLETION_INDEX,
    metavar="I",
    help="Build only cell I and push it as a partial artifact for `merge` "
    "[JOB_COMPLETION_INDEX, as a Kubernetes Indexed Job sets it].",
)
@run_id_option(
    "The fan-out run the cell belongs to (the same for every cell and for `merge`): "
    "1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit."
)
@cell_options
@sign_key_option
@json_option
def build(
    *,
    matrix: Path,
    store: str,
    insecure: bool,
    sign_key: str | None,
    gpu_arch: str | None,
    image_digest: str | None,
    keep_roots: Path | None,
    overrides: tuple[str, ...],
    strict: bool,
    cell: int | None,
    run_id: str | None,
    gpus: str | None,
    jobs: int,
    as_json: bool,
) -> None:
    """Run a warm-up matrix's cells with fresh cache roots, merge them, harvest into the store.

    Each cell runs isolated (its own cache roots and temp dir), packed onto
    this node's GPUs: as many at once as fit, each with CUDA_VISIBLE_DEVICES
    set to its own devices, in index order. Their caches are then merged per
    family (a path two cells wrote with different bytes fails the build,
    naming both) and harvested as one artifact.

    \b
    Fan out over a CI matrix or a Kubernetes Indexed Job instead:
      artifactd matrix cells FILE --json               # the cells, for strategy.matrix
      artifactd build FILE --cell I --run-id ID ...    # on each worker: one cell
      artifactd merge FILE --run-id ID --store REF     # then: the whole artifact
    """
    from artifactd.build.run import build as do_build
    from artifactd.build.schedule import parse_gpus

    key = load_sign_key(sign_key)  # before the cells run: a bad key fails in a second
    result = do_build(
        matrix,
        store,
        insecure=insecure,
        gpu_arch=gpu_arch,
        image_digest=image_digest,
        roots=keep_roots,
        keep_roots=keep_roots is not None,
        on_event=render.event_printer(as_json, lines=True),
        overrides=overrides,
        strict_lint=strict,
        cell=cell,
        run_id=run_id,
        gpus=parse_gpus(gpus) if gpus is not None else None,
        jobs=jobs,
        sign_key=key,
    )
    if as_json:
        from artifactd.reports import result_report

        render.emit_json(result_report(result))
    else:
        render.build(result)
        render.signing(result.harvest.signing)


@cli.command()
@store_option
@click.option(
    "--matrix",
    type=click.Path(path_type=Path),
    default=Path("warmup_matrices/cpu-demo.yaml"),
    show_default=True,
)
@click.option(
    "--workdir",
    type=click.Path(path_type=Path),
    default=Path(".artifactd/demo"),
    show_default=True,
    help="Where restored caches go (removed at the end unless --keep).",
)
@click.option("--keep", is_flag=True, help="Keep the restored caches and the warm-up's logs.")
@json_option
def demo(
    *, store: str, insecure: bool, matrix: Path, workdir: Path, keep: bool, as_json: bool
) -> None:
    """Build the CPU demo matrix cold, restore it fresh, and time the warm start."""
    from artifactd.build.demo import run_demo

    if not as_json:
        click.echo(f"building {matrix} cold (fresh caches; about a minute on 2 cores)...", err=True)
    result = run_demo(
        matrix,
        store,
        workdir=workdir,
        on_event=render.event_printer(as_json, lines=True),
        environ=C.current_environ(),
        insecure=insecure,
        keep=keep,
    )
    if as_json:
        from artifactd.reports import demo_report

        render.emit_json(demo_report(result))
    else:
        render.demo(result)


@cli.command()
@click.argument("directory", required=False, type=click.Path(path_type=Path))
@click.option(
    "--target",
    type=click.Path(path_type=Path),
    metavar="DIR",
    help="A restore target or build-roots directory (the same as DIRECTORY).",
)
@family_option
@click.option("--strict", is_flag=True, help="Exit 11 on any finding (without it: on errors only).")
@json_option
def lint(
    *,
    directory: Path | None,
    target: Path | None,
    families: tuple[str, ...],
    strict: bool,
    as_json: bool,
) -> None:
    """Find what will make a harvested cache miss elsewhere, before it ships.

    Scans each family's cache for this machine's absolute paths (outside the
    files artifactd rewrites), user and host names in paths, and volatile values
    in vLLM's hash factors (IPs, ports, Ray bundle indices). Each finding names
    the file, the value and what it will cost.

    DIRECTORY is a build-roots or restore-target directory (each family in its
    subdirectory); without it, caches are found as `harvest` finds them.

    Exits 11 when a finding is an error (a miss or a failure on a pod laid
    out differently); warnings (informational, or harmful only where
    followed) fail only with --strict.
    """
    from artifactd.lint import lint_caches

    directory = positional_or_option(directory, target, flag="--target", name="the directory")
    roots, report = lint_caches(directory, family_names(families))
    if as_json:
        from artifactd.reports import lint_report

        render.emit_json(lint_report(roots, report))
    else:
        render.lint(roots, report)
    if not report.fails(strict=strict):
        return
    if report.errors:
        raise LintError(
            f"{report.errors} error(s): these caches will miss or fail on a pod laid out "
            "differently",
            hint="fix them (each names its cost); warnings alone fail only with --strict",
        )
    raise LintError(
        f"--strict: {len(report.findings)} finding(s) tie these caches to this machine",
        hint="fix them (each names its cost), or run without --strict",
    )
