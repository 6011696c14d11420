"""The README's demo: build the CPU matrix cold, restore it fresh, and time a warm start.

1. ``build`` runs the matrix with fresh cache roots (the cold start) and
   publishes the artifact to the store;
2. ``artifactd restore`` runs in a new process into a new directory, as an
   init container would;
3. the same warm-up runs again with only the restored caches (the env file's
   variables, a new temp dir, nothing left over from the build).
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from artifactd.build.matrix import Matrix, expand, load_matrix
from artifactd.build.published import pod_environ, pod_flags
from artifactd.build.run import BuildResult, build, cell_environ, run_cell
from artifactd.errors import BuildError
from artifactd.events import EventSink, discard
from artifactd.restore.envfile import parse_env_file  # re-exported: used from here
from artifactd.stores import Store, opened


@dataclass
class DemoResult:
    """Timings of the three stages, and what each compiled."""

    store: str
    artifact: str
    target: str
    cold_seconds: float
    cold_compiled: int
    restore_seconds: float
    restored_seconds: float
    restored_compiled: int
    restore_report: dict[str, Any]
    build: BuildResult
    #: The restore this demo ran, as a user types it on this machine (the
    #: matrix's declared target, workload and keyed variables: ``pod_flags``).
    restore_command: str = ""
    #: Whether ``target`` (and the warm-up's logs) were kept (``--keep``).
    kept: bool = True

    @property
    def ratio(self) -> float:
        """Restored warm-up time over cold warm-up time."""
        return self.restored_seconds / self.cold_seconds if self.cold_seconds else 0.0


def restored_environ(env_file: Path, base: Mapping[str, str], empty: Path) -> dict[str, str]:
    """Return the environment of a fresh process that sees only the restored caches.

    Every cache the restore did not write points under ``empty`` (a dir of the
    caller's, removed with its work: it stays empty when nothing compiles).
    """
    empty.mkdir(parents=True, exist_ok=True)
    clean = cell_environ(Path(tempfile.mkdtemp(prefix="empty-", dir=empty)), [], {}, base)
    clean.update(parse_env_file(env_file))
    return clean


def run_demo(
    matrix_path: Path,
    store: Store | str,
    *,
    workdir: Path,
    on_event: EventSink = discard,
    environ: Mapping[str, str],
    insecure: bool = False,
    keep: bool = False,
) -> DemoResult:
    """Run build, restore and a restored warm-up; return their timings.

    ``store`` is a store or its reference (created when missing). What the run
    writes under ``workdir`` (the restored caches, about 150 MB, and the
    warm-up's logs) is removed at the end unless ``keep``; the store stays.
    """
    with opened(store, create=True, insecure=insecure) as st:
        result = _run_demo(
            matrix_path, st, workdir=workdir, on_event=on_event, environ=environ, insecure=insecure
        )
    if not keep:
        for path in (Path(result.target), workdir / "restored-logs", workdir / "empty"):
            shutil.rmtree(path, ignore_errors=True)
        result.kept = False
    return result


def _run_demo(
    matrix_path: Path,
    store: Store,
    *,
    workdir: Path,
    on_event: EventSink,
    environ: Mapping[str, str],
    insecure: bool,
) -> DemoResult:
    matrix = load_matrix(matrix_path)
    built = build(matrix_path, store, on_event=on_event, environ=environ)
    cold = sum(c.seconds for c in built.cells)
    cold_compiled = sum(int((c.report or {}).get("compiled", 0)) for c in built.cells)

    workdir.mkdir(parents=True, exist_ok=True)
    target = Path(tempfile.mkdtemp(prefix="restored-", dir=workdir))
    argv = [
        sys.executable,
        "-m",
        "artifactd",
        "restore",
        "--store",
        store.ref,
        "--target",
        str(target),
        "--json",
        "--require",
    ]
    argv += pod_flags(matrix)
    if insecure:
        argv.append("--insecure")
    on_event({"stage": "restore", "event": "start", "target": str(target)})
    t0 = time.monotonic()
    pod_env = {**environ, **pod_environ(matrix)}
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, env=pod_env)
    restore_s = round(time.monotonic() - t0, 3)
    if proc.returncode != 0:
        raise BuildError(f"restore failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    report = json.loads(proc.stdout.strip().splitlines()[-1])

    env = restored_environ(target / "artifactd.env", environ, workdir / "empty")
    restored_s = 0.0
    restored_compiled = 0
    for cell in expand(matrix, matrix_path):
        on_event({"stage": "verify", "event": "start", "cell": cell.id})
        # The one launcher the build ran the cells with: no process of a cell outlives it.
        run = run_cell(cell, env, matrix.timeout_s, workdir / "restored-logs" / f"{cell.id}.log")
        restored_s += run.seconds
        restored_compiled += int((run.report or {}).get("compiled", 0))
    return DemoResult(
        store=store.ref,
        artifact=built.harvest.digest,
        target=str(target),
        cold_seconds=round(cold, 3),
        cold_compiled=cold_compiled,
        restore_seconds=restore_s,
        restored_seconds=round(restored_s, 3),
        restored_compiled=restored_compiled,
        restore_report=report,
        build=built,
        restore_command=restore_command(store.ref, matrix, insecure=insecure),
    )


def restore_command(store: str, matrix: Matrix, *, insecure: bool = False) -> str:
    """Return the ``artifactd restore`` line that finds this matrix's artifact, for a shell.

    The flags are the ones a pod asks with (:func:`pod_flags`), and the keyed
    variables of the matrix's ``env:`` come first, as assignments.
    """
    assignments = [f"{k}={shlex.quote(v)}" for k, v in sorted(pod_environ(matrix).items())]
    argv = ["artifactd", "restore", "--store", store, "--target", "DIR", *pod_flags(matrix)]
    return " ".join([*assignments, shlex.join(argv + (["--insecure"] if insecure else []))])
