"""Build: run a warm-up matrix with fresh cache roots, then harvest what it compiled.

Every family gets a fresh, empty root through the env vars the library reads
(the same layout a restore produces: ``<roots>/triton``, ``<roots>/inductor``,
``<roots>/tmp`` for Inductor's precompiled header), so the artifact holds what
this matrix compiled and nothing a previous run left behind. Cells run one
after another into the same roots; each is a subprocess whose stages are timed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from artifactd import __version__
from artifactd.constants import (
    CACHE_ENV_VARS,
    TEMP,
    TMP,
    TMPDIR,
    TORCHINDUCTOR_CACHE_DIR,
    TRITON_HOME,
    current_environ,
)
from artifactd.errors import BuildError, LintError
from artifactd.events import EventSink, discard
from artifactd.families import select_families
from artifactd.fingerprint import probe
from artifactd.harvest import HarvestResult, harvest
from artifactd.lint import Hazards, LintReport, lint, roots_for_lint
from artifactd.manifest import Provenance
from artifactd.matrix import Cell, Matrix, expand, load_matrix
from artifactd.stores import Store, opened

#: Variables cleared before a cell runs, so no cache of the caller leaks in.
_INHERITED_CACHE_VARS = (*CACHE_ENV_VARS, TORCHINDUCTOR_CACHE_DIR, TRITON_HOME, TEMP, TMP)


@dataclass
class CellResult:
    """One cell's run."""

    id: str
    argv: list[str]
    seconds: float
    returncode: int
    report: dict[str, Any] | None
    log: str


@dataclass
class BuildResult:
    """A finished build: the cells and the harvest."""

    matrix: str
    cells: list[CellResult]
    harvest: HarvestResult
    roots: str
    seconds: float
    timings: dict[str, float] = field(default_factory=dict)
    lint: LintReport | None = None


def cell_environ(
    roots: Path, families: Sequence[str], extra: Mapping[str, str], base: Mapping[str, str]
) -> dict[str, str]:
    """Return the environment a cell runs with: fresh roots for every family.

    ``families`` empty means every family, as in a matrix without ``families``.
    """
    env = {k: v for k, v in base.items() if k not in _INHERITED_CACHE_VARS}
    for fam in select_families(families or None):
        env.update(fam.restore_env(roots))
    env.update(extra)
    Path(env.get(TMPDIR, roots / "tmp")).mkdir(parents=True, exist_ok=True)
    return env


def _last_json(text: str) -> dict[str, Any] | None:
    for raw in reversed(text.strip().splitlines()):
        line = raw.strip()
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError:
                return None
            return doc if isinstance(doc, dict) else None
    return None


def run_cell(cell: Cell, env: Mapping[str, str], timeout: float, log_dir: Path) -> CellResult:
    """Run one cell as a subprocess; its output goes to a log file."""
    log = log_dir / f"cell-{cell.id}.log"
    start = time.monotonic()
    try:
        with log.open("w") as out:
            proc = subprocess.run(
                cell.argv,
                env=dict(env),
                stdout=subprocess.PIPE,
                stderr=out,
                timeout=timeout,
                check=False,
                text=True,
            )
            out.write(proc.stdout)
    except FileNotFoundError as exc:
        raise BuildError(f"cell {cell.id}: cannot run {cell.argv[0]!r}: {exc.strerror}") from exc
    except subprocess.TimeoutExpired as exc:
        raise BuildError(
            f"cell {cell.id} ran past its timeout of {timeout:.0f} s",
            hint=f"see {log}; raise timeout_s in the matrix",
        ) from exc
    seconds = round(time.monotonic() - start, 3)
    result = CellResult(
        cell.id, cell.argv, seconds, proc.returncode, _last_json(proc.stdout), str(log)
    )
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-5:]
        raise BuildError(
            f"cell {cell.id} exited with status {proc.returncode}: " + " | ".join(tail),
            hint=f"full output in {log}",
        )
    return result


def build(
    matrix_path: Path,
    store: Store | str,
    *,
    insecure: bool = False,
    gpu_arch: str | None = None,
    image_digest: str | None = None,
    roots: Path | None = None,
    keep_roots: bool = False,
    on_event: EventSink = discard,
    environ: Mapping[str, str] | None = None,
    overrides: Sequence[str] = (),
    strict_lint: bool = False,
) -> BuildResult:
    """Run every cell of the matrix, then harvest into ``store`` (a store, or its reference).

    ``overrides`` (``--set PATH=VALUE``) adjust the probed fingerprint, e.g. to
    build on one machine for another target.
    """
    start = time.monotonic()
    matrix: Matrix = load_matrix(matrix_path)
    cells = expand(matrix, matrix_path)
    owned = roots is None
    if roots is None:
        roots = Path(tempfile.mkdtemp(prefix=f"artifactd-build-{matrix.name}-"))
    if roots.exists() and any(roots.iterdir()):
        raise BuildError(
            f"cache roots dir {roots} is not empty",
            hint="a build needs fresh roots; pass an empty or new directory",
        )
    roots.mkdir(parents=True, exist_ok=True)
    base = current_environ() if environ is None else environ
    env = cell_environ(roots, matrix.families, matrix.env, base)
    timings: dict[str, float] = {}
    results: list[CellResult] = []
    failed = True
    try:
        for cell in cells:
            on_event({"stage": "warmup", "event": "start", "cell": cell.id})
            res = run_cell(cell, env, matrix.timeout_s, roots)
            timings[f"cell:{cell.id}"] = res.seconds
            results.append(res)
            on_event(
                {
                    "stage": "warmup",
                    "event": "done",
                    "cell": cell.id,
                    "elapsed_ms": round(res.seconds * 1000, 1),
                }
            )
        t0 = time.monotonic()
        report = lint_roots(matrix.families, env, roots)
        timings["lint"] = round(time.monotonic() - t0, 3)
        on_event(
            {
                "stage": "lint",
                "event": "done",
                "errors": report.errors,
                "warnings": report.warnings,
                "files": report.files_scanned,
            }
        )
        if strict_lint and report.findings:
            first = report.findings[0]
            raise LintError(
                f"lint found {len(report.findings)} hazard(s), e.g. {first.family}/"
                f"{first.component}/{first.file}: {first.kind} {first.value!r}",
                hint=f"run `artifactd lint {roots}` for all of them (kept for you), "
                "or build without --strict",
            )
        t0 = time.monotonic()
        fingerprint = probe(
            gpu_arch=gpu_arch or matrix.target.gpu_arch,
            image_digest=image_digest or matrix.base_image,
            workload=matrix.workload,
            environ=env,
            overrides=overrides,
        )
        timings["probe"] = round(time.monotonic() - t0, 3)
        provenance = Provenance(
            builder=__version__,
            source="build",
            matrix=matrix.name,
            base_image=matrix.base_image,
            cells=[c.id for c in cells],
            timings=timings,
        )
        with opened(store, create=True, insecure=insecure) as st:
            harvested = harvest(
                st,
                fingerprint,
                families=matrix.families or None,
                environ=env,
                provenance=provenance,
                on_event=on_event,
            )
        timings["harvest"] = harvested.seconds
        on_event(
            {
                "stage": "harvest",
                "event": "done",
                "digest": harvested.digest,
                "elapsed_ms": round(harvested.seconds * 1000, 1),
            }
        )
        failed = False
    finally:
        # A failed build keeps its roots: the cell logs there explain the failure.
        if owned and not keep_roots and not failed:
            shutil.rmtree(roots, ignore_errors=True)
    return BuildResult(
        matrix=matrix.name,
        cells=results,
        harvest=harvested,
        roots=str(roots),
        seconds=round(time.monotonic() - start, 3),
        timings=timings,
        lint=report,
    )


def lint_roots(families: Sequence[str], environ: Mapping[str, str], roots: Path) -> LintReport:
    """Lint what the cells wrote, as the harvest will find it (``families`` empty: all).

    The caches are located through the cells' ``environ`` rather than by the
    restore layout under ``roots``: that is how the harvest finds them, so a
    component the harvest would not pack (vLLM's ``deep_gemm/`` when the
    ``deepgemm`` family owns ``DG_JIT_CACHE_DIR``) is not linted either.
    """
    located = roots_for_lint(None, families or None, environ)
    return lint(located, hazards=Hazards.from_environ(environ, extra_paths=[roots]))
