"""``fingerprint`` and ``diff``: what this machine is, and why two differ."""

from __future__ import annotations

import sys
from typing import Any

import click

from artifactd.cli import fast, render
from artifactd.cli import specs as S  # noqa: N812
from artifactd.cli.group import cli
from artifactd.cli.options import (
    family_option,
    gpu_arch_option,
    insecure_option,
    json_option,
    options,
    set_option,
    workload_option,
)
from artifactd.cli.specs import family_names

#: ``diff``'s exit code when the sides differ, as diff(1)'s.
DIFFERENT = 1


@cli.command()
@options(S.COMMANDS["fingerprint"])
def fingerprint(**options: Any) -> None:
    """Print this environment's compatibility fingerprint.

    Probes without importing torch: GPU and driver through NVML when present,
    library versions and content hashes from package metadata, Python ABI,
    platform, CPU ISA, compilers. Informational fields (hostname, time) are
    shown but never hashed.
    """
    fast.fingerprint(**options)


@cli.command()
@click.argument("a")
@click.argument("b")
@gpu_arch_option("Declared GPU target for the `local` side.")
@workload_option("Workload fields for the `local` side.", envvar=False)
@family_option
@set_option
@insecure_option
@click.option(
    "--exit-zero",
    is_flag=True,
    help="Exit 0 when the sides differ too (for reports); errors still exit non-zero.",
)
@json_option
def diff(
    *,
    a: str,
    b: str,
    insecure: bool,
    gpu_arch: str | None,
    workload: tuple[str, ...],
    overrides: tuple[str, ...],
    families: tuple[str, ...],
    exit_zero: bool,
    as_json: bool,
) -> None:
    """Explain why two fingerprints differ, and which cache families that invalidates.

    A and B are each `local`, a fingerprint JSON file, an artifact config, or an
    artifact reference (oci:DIR:TAG, HOST/REPO:TAG, ...@sha256:...). --set changes
    the `local` side (B when both are local: `diff local local --set driver.version=X`
    asks what a driver upgrade would invalidate). A cache built on A
    is judged for use on B.

    Exits as diff(1) does: 0 when the hashed fields and the recorded cache facts
    are the same (informational fields such as the host name may differ), 1
    when they differ (unless --exit-zero), 2 or more on an error.
    """
    from artifactd.restore.explain import explain

    ex = explain(
        a,
        b,
        gpu_arch=gpu_arch,
        workload=workload,
        overrides=overrides,
        families=family_names(families),
        insecure=insecure,
    )
    if as_json:
        from artifactd.reports import diff_report

        render.emit_json(diff_report(ex.a, ex.b, ex.result, ex.facts))
    else:
        render.diff(ex.a, ex.b, ex.result, ex.facts)
    if not exit_zero and not (ex.result.identical and not ex.facts):
        sys.exit(DIFFERENT)
