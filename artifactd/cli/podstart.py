"""What ``fingerprint`` and ``restore`` do once parsed (no click here).

Both run at every pod start, so both the click commands and the fast parser
(:mod:`artifactd.cli.fast`) call these, and these import the library lazily.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from artifactd import constants as C  # noqa: N812
from artifactd.cli import render
from artifactd.cli.specs import env_flag, family_names, parse_seconds, parse_size

if TYPE_CHECKING:
    from artifactd.restore.policy import RestoreOutcome


def fingerprint(
    *,
    gpu_arch: str | None,
    image_digest: str | None,
    workload: Sequence[str],
    overrides: Sequence[str],
    as_json: bool,
    hash_only: bool,
) -> None:
    """Probe this machine and print its fingerprint (the hash, the fields, or JSON)."""
    from artifactd.fingerprint.key import raw_hash
    from artifactd.fingerprint.probe import probe_request

    # Plain data, no model: the probe's document has the Fingerprint schema's exact
    # shape (a test holds the two together), and printing it needs no validation.
    raw = probe_request(
        gpu_arch=gpu_arch, image_digest=image_digest, workload=workload, overrides=overrides
    )
    digest = raw_hash(raw)
    if hash_only:
        render.echo(digest)
    elif as_json:
        from artifactd.reports import fingerprint_report

        render.emit_json(fingerprint_report(raw, digest))
    else:
        render.fingerprint(raw, digest)


def restore(
    *,
    store: str | None,
    node_store: str | None,
    from_dir: Path | None,
    insecure: bool,
    target: Path,
    families: Sequence[str],
    gpu_arch: str | None,
    image_digest: str | None,
    workload: Sequence[str],
    overrides: Sequence[str],
    software_from: str | None,
    verify_keys: Sequence[str],
    env_file: Path | None,
    consumer_user: str | None,
    require: bool,
    dry_run: bool,
    max_bytes: str | None,
    lock_timeout: float | None,
    metrics_file: Path | None,
    as_json: bool,
) -> None:
    """Restore the matching caches into ``target``; exit with the outcome's code."""
    from artifactd.fingerprint.probe import start_request

    size_limit = parse_size(max_bytes) if max_bytes else None
    timeout = None if lock_timeout is None else parse_seconds(lock_timeout)
    # The probe's subprocesses and NVML run while the restore modules import.
    pending = start_request(
        gpu_arch=gpu_arch, image_digest=image_digest, workload=workload, overrides=overrides
    )
    from artifactd.restore.policy import RestoreRequest, run_restore

    request = RestoreRequest(
        store=store,
        from_dir=from_dir,
        node_store=node_store,
        software_from=software_from,
        target=target,
        families=family_names(families),
        consumer_user=consumer_user,
        env_file=env_file,
        require=require,
        dry_run=dry_run,
        insecure=insecure,
        max_bytes=size_limit,
        lock_timeout=timeout,
        verify_keys=tuple(verify_keys),
    )
    # Plain data again: a no-op restore (warm volume, marker matches) answers
    # without building a single pydantic model.
    outcome = run_restore(request, pending.result(), on_event=render.event_printer(as_json))
    failure = outcome.failure
    if failure is not None and failure.kind == "internal" and env_flag(C.ENV_TRACEBACK):
        render.traceback(failure.error)
    if metrics_file is not None:
        _write_metrics(metrics_file, outcome)
    if as_json:
        from artifactd.reports import restore_report

        render.emit_json(restore_report(outcome))
    else:
        render.restore(outcome)
    if outcome.exit_code:
        sys.exit(outcome.exit_code)


def _write_metrics(path: Path, outcome: RestoreOutcome) -> None:
    """Write the restore's metrics; a failure to is reported, never fatal to the restore."""
    from artifactd.errors import ArtifactdError
    from artifactd.pod.metrics import restore_registry, write_textfile

    try:
        write_textfile(path, restore_registry(outcome))
    except ArtifactdError as exc:
        render.echo(f"artifactd: warning: {exc.message}", err=True)
