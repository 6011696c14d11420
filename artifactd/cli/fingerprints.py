"""``fingerprint`` and ``diff``: what this machine is, and why two differ."""

from __future__ import annotations

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
    as_json: bool,
) -> None:
    """Explain why two fingerprints differ, and which cache families that invalidates.

    A and B are each `local`, a fingerprint JSON file, an artifact config, or an
    artifact reference (oci:DIR:TAG, HOST/REPO:TAG, ...@sha256:...). --set changes
    the `local` side (B when both are local: `diff local local --set driver.version=X`
    asks what a driver upgrade would invalidate). A cache built on A
    is judged for use on B.
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
