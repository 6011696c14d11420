"""Build: run a warm-up matrix's cells in isolation, merge what they compiled, harvest it.

Every cell gets fresh, empty roots of its own through the env vars the
libraries read (the layout a restore produces: ``<cell>/triton``,
``<cell>/inductor``, ``<cell>/tmp`` for Inductor's precompiled header, its own
temp dir), so the artifact holds what this matrix compiled and nothing a
previous run or another cell left behind. Cells are packed onto the node's
GPUs (:mod:`artifactd.build.schedule`), each with its own ``CUDA_VISIBLE_DEVICES``;
a cell runs a one-shot command or serves an engine (:mod:`artifactd.build.cells`).
Afterwards their trees are merged per family (:mod:`artifactd.build.treemerge`): a
path two cells wrote with different bytes fails the build, naming both,
unless the family has a rule for it. Then the merged tree is linted, the
fingerprint probed and the caches harvested.

``cell`` runs one cell of the matrix (a CI matrix job, a Kubernetes Indexed
Job's pod) and publishes it as a partial artifact tagged
``run-<run id>-cell-<index>``, which :mod:`artifactd.build.merge` composes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from artifactd import __version__
from artifactd.build import launch
from artifactd.build.cells import run_serve
from artifactd.build.harvest import HarvestResult, harvest
from artifactd.build.matrix import Cell, Matrix, expand, load_matrix
from artifactd.build.published import check_key, pod_environ, published_fingerprint
from artifactd.build.schedule import node_devices, run_packed
from artifactd.build.treemerge import merge_family
from artifactd.constants import (
    CACHE_ENV_VARS,
    CUDA_VISIBLE_DEVICES,
    TEMP,
    TMP,
    TMPDIR,
    TORCHINDUCTOR_CACHE_DIR,
    TRITON_HOME,
    current_environ,
)
from artifactd.errors import BuildError, LintError, UsageError
from artifactd.events import EventSink, discard
from artifactd.families import select_families
from artifactd.fingerprint.key import check_overrides
from artifactd.format.config import Provenance
from artifactd.lint import Hazards, LintReport, lint, roots_for_lint
from artifactd.stores import Store, opened
from artifactd.stores.artifacts import read_artifact
from artifactd.trust.provenance import statement
from artifactd.trust.signatures import attest, store_identity

if TYPE_CHECKING:
    from artifactd.format.canary import Canary
    from artifactd.pod.canary import CanaryResult
    from artifactd.trust.keys import PrivateKey

#: A fan-out run id: a letter or digit, then up to 63 of letters, digits, ``.``, ``_``, ``-``.
RUN_ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
_RUN_ID = re.compile(RUN_ID_PATTERN)
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
    index: int = 0
    devices: list[str] = field(default_factory=list)
    #: What the cell printed as ``{"checks": {...}}``: what ``verify`` compares.
    checks: dict[str, Any] = field(default_factory=dict)
    #: A serve cell's timings: ready, requests, shutdown (seconds).
    serve: dict[str, Any] | None = None
    #: The log's last lines: the report keeps them when the roots (and the log) are gone.
    log_tail: list[str] = field(default_factory=list)
    #: A serve cell's canary, recorded for the artifact's config (not in ``--json``).
    canary: Canary | None = field(default=None, repr=False)
    #: ``verify``: the replay of the recorded canary (not in ``--json``: verify reports it).
    canary_replay: CanaryResult | None = field(default=None, repr=False)


#: Lines of a cell's log its result keeps.
LOG_TAIL_LINES = 20


def log_tail(log: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
    """Return the last ``lines`` lines of a cell's log (none when it cannot be read)."""
    try:
        return log.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


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
    #: One cell's build (``--cell``): its index and the fan-out run it belongs to.
    cell: int | None = None
    run_id: str | None = None


def cell_tag(run_id: str, index: int) -> str:
    """Return the tag of one cell's partial artifact: ``run-<run id>-cell-<index>``."""
    return f"run-{run_id}-cell-{index}"


def check_run_id(run_id: str) -> str:
    """Refuse a run id that is not :data:`RUN_ID_PATTERN` or holds ``..``.

    It becomes part of a tag (``run-<ID>-cell-<I>``) and of the provenance,
    so it is one plain token: nothing that reads as a path (``/``, ``..``) or
    an option (a leading ``-``), no newline.
    """
    if not _RUN_ID.fullmatch(run_id) or ".." in run_id:
        raise UsageError(
            f"--run-id {run_id!r}: use 1 to 64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit, without '..'",
            hint="e.g. the CI run's number: --run-id $GITHUB_RUN_ID",
        )
    return run_id


def cell_environ(
    roots: Path, families: Sequence[str], extra: Mapping[str, str], base: Mapping[str, str]
) -> dict[str, str]:
    """Return the environment a cell runs with: fresh roots for every family.

    ``families`` empty means every family, as in a matrix without ``families``.
    """
    env = {k: v for k, v in base.items() if k not in _INHERITED_CACHE_VARS}
    env[TMPDIR] = str(roots / "tmp")  # a temp dir of its own (Inductor's is this one too)
    for fam in select_families(families or None):
        env.update(fam.restore_env(roots))
    env.update(extra)
    Path(env[TMPDIR]).mkdir(parents=True, exist_ok=True)
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


def _checks_of(report: dict[str, Any] | None, cell: Cell) -> dict[str, Any]:
    """Return the ``checks`` member a cell printed: names to numbers or strings."""
    checks = (report or {}).get("checks") or {}
    if not isinstance(checks, dict) or not all(
        isinstance(k, str) and isinstance(v, (str, int, float, bool)) for k, v in checks.items()
    ):
        raise BuildError(
            f"cell {cell.id} printed checks that are not a map of names to numbers or strings",
            hint='print one JSON line such as {"checks": {"tokens": "ab12...", "logit_sum": 1.5}}',
        )
    return dict(checks)


def run_cell(cell: Cell, env: Mapping[str, str], timeout: float, log: Path) -> CellResult:
    """Run one command cell through the cells' launcher; its output goes to ``log``.

    The command runs in a process group of its own (:mod:`artifactd.build.launch`)
    and the whole group is stopped when the cell ends: past ``timeout`` seconds
    (then the cell fails), and also when the command exits, for whatever it
    left running in the background, so no process of a cell outlives it. Its
    stdout is kept beside the log while it runs (the report is its last JSON
    line), then appended to the log.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    stdout_path = log.with_name(log.name + ".stdout")
    start = time.monotonic()
    with log.open("wb") as err, stdout_path.open("w+b") as out:
        try:
            proc = launch.start(cell.argv, env, stdout=out, stderr=err)
        except OSError as exc:
            raise BuildError(
                f"cell {cell.id}: cannot run {cell.argv[0]!r}: {exc.strerror or exc}",
                hint="check the command in the matrix",
            ) from exc
        try:
            finished = launch.wait(proc, timeout)
        finally:
            launch.stop(proc, launch.COMMAND_GRACE_S)
        seconds = round(time.monotonic() - start, 3)
        report = _last_json(_tail_text(out))
        out.seek(0)
        shutil.copyfileobj(out, err)
    stdout_path.unlink(missing_ok=True)
    if not finished:
        raise BuildError(
            f"cell {cell.id} ran past its timeout of {timeout:g} s; "
            "it was stopped with every process it started",
            hint=f"see {log}; raise timeout_s in the matrix",
        )
    if proc.returncode != 0:
        tail = log_tail(log, 5)
        raise BuildError(
            f"cell {cell.id} exited with status {proc.returncode}: " + " | ".join(tail),
            hint=f"full output in {log}",
        )
    return CellResult(
        cell.id,
        cell.argv,
        seconds,
        proc.returncode,
        report,
        str(log),
        index=cell.index,
        checks=_checks_of(report, cell),
        log_tail=log_tail(log),
    )


#: Bytes at the end of a command cell's stdout searched for its JSON report.
REPORT_TAIL_BYTES = 1 << 20


def _tail_text(out: IO[bytes]) -> str:
    """Return the last :data:`REPORT_TAIL_BYTES` of a cell's stdout file, as text."""
    out.seek(0, os.SEEK_END)
    out.seek(max(0, out.tell() - REPORT_TAIL_BYTES))
    return out.read().decode("utf-8", errors="replace")


def run_serve_cell(
    cell: Cell,
    env: Mapping[str, str],
    log: Path,
    on_event: EventSink,
    replay_canary: Canary | None = None,
) -> CellResult:
    """Run one serve cell: the engine, its readiness, the requests, its canary, its shutdown.

    With ``replay_canary`` (``verify``) that canary is replayed instead of one recorded.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    res = run_serve(cell, env, log, on_event=on_event, replay_canary=replay_canary)
    assert cell.serve is not None  # noqa: S101 - a serve cell
    return CellResult(
        cell.id,
        cell.serve.argv,
        round(time.monotonic() - start, 3),
        0,
        None,
        str(log),
        index=cell.index,
        checks=dict(res.checks),
        serve={
            "ready_s": res.ready_s,
            "requests_s": res.requests_s,
            "shutdown_s": res.shutdown_s,
            "requests": res.requests_sent,
            "killed": res.killed,
        },
        log_tail=log_tail(log),
        canary=res.canary,
        canary_replay=res.canary_replay,
    )


def select_cells(cells: list[Cell], cell: int | None, run_id: str | None) -> list[Cell]:
    """Every cell, or the one ``--cell`` names (which needs a ``--run-id``)."""
    if cell is None:
        if run_id is not None:
            raise UsageError(
                "--run-id names a fan-out run: it goes with --cell (or JOB_COMPLETION_INDEX)",
                hint="without --cell, build runs every cell here and publishes the whole artifact",
            )
        return cells
    if run_id is None:
        raise UsageError(
            "--cell needs --run-id: the cells of one fan-out run are merged by it",
            hint="e.g. --run-id $GITHUB_RUN_ID, the same for every cell and for `merge`",
        )
    check_run_id(run_id)
    if not 0 <= cell < len(cells):
        raise UsageError(
            f"--cell {cell}: the matrix has {len(cells)} cell(s), 0 to {len(cells) - 1}",
            hint="`artifactd matrix cells FILE` lists them",
        )
    return [cells[cell]]


def build(  # noqa: PLR0915 - one straight run of stages, each timed
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
    cell: int | None = None,
    run_id: str | None = None,
    gpus: Sequence[str] | None = None,
    jobs: int = 1,
    sign_key: PrivateKey | None = None,
) -> BuildResult:
    """Run the matrix's cells (or the one ``cell``), merge, then harvest into ``store``.

    ``store`` is a store or its reference. ``overrides`` (``--set PATH=VALUE``)
    adjust the probed fingerprint, e.g. to build on one machine for another
    target. ``gpus`` are the node's devices (default :func:`node_devices`);
    ``jobs`` bounds the CPU-only cells running at once. With ``cell`` (and
    ``run_id``), one cell is built and published as a partial artifact. With
    ``sign_key``, every manifest published is signed and the whole artifact
    gets its build provenance (:mod:`artifactd.trust.provenance`) as an attestation.
    """
    start = time.monotonic()
    started_at = time.time()
    check_overrides(overrides)  # a bad --set fails now, not after the cells ran
    matrix: Matrix = load_matrix(matrix_path)
    check_key(matrix, matrix_path)  # before any cell runs, as the --set check above
    selected = select_cells(expand(matrix, matrix_path), cell, run_id)
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
    devices = list(gpus) if gpus is not None else node_devices(base)
    timings: dict[str, float] = {}
    failed = True

    def run_one(c: Cell, taken: tuple[str, ...]) -> CellResult:
        croot = roots / "cells" / c.id
        env = cell_environ(croot, matrix.families, matrix.env, base)
        env[CUDA_VISIBLE_DEVICES] = ",".join(taken)
        log = croot / "cell.log"
        if c.serve is not None:
            res = run_serve_cell(c, env, log, on_event)
        else:
            res = run_cell(c, env, matrix.timeout_s, log)
        res.devices = list(taken)
        return res

    try:
        results = run_packed(selected, devices, run_one, jobs=jobs, on_event=on_event)
        for res in results:
            timings[f"cell:{res.id}"] = res.seconds
        t0 = time.monotonic()
        env = _merged_environ(matrix, selected, roots, base)
        timings["merge"] = round(time.monotonic() - t0, 3)
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
        fingerprint = published_fingerprint(
            matrix, gpu_arch=gpu_arch, image_digest=image_digest, overrides=overrides, environ=base
        )
        timings["probe"] = round(time.monotonic() - t0, 3)
        on_event(
            {
                "stage": "probe",
                "event": "done",
                "fingerprint": fingerprint.hash,
                # What pods must set for their probe to find this artifact.
                "pod_env": pod_environ(matrix),
            }
        )
        provenance = Provenance(
            builder=__version__,
            source="build",
            matrix=matrix.name,
            base_image=matrix.base_image,
            cells=[c.id for c in selected],
            timings={k: v for k, v in timings.items() if k.startswith("cell:")},
            run_id=run_id,
            checks={r.id: r.checks for r in results if r.checks},
        )
        with opened(store, create=True, insecure=insecure) as st:
            harvested = harvest(
                st,
                fingerprint,
                families=matrix.families or None,
                environ=env,
                provenance=provenance,
                on_event=on_event,
                cell_tag=cell_tag(run_id, selected[0].index)
                if cell is not None and run_id
                else None,
                sign_key=sign_key,
                canaries=[r.canary for r in results if r.canary is not None],
            )
            if sign_key is not None and harvested.signing is not None:
                _attest_build(
                    st,
                    harvested,
                    sign_key,
                    matrix_path=matrix_path,
                    results=results,
                    report=report,
                    started_at=started_at,
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
        cell=cell,
        run_id=run_id,
    )


def _merged_environ(
    matrix: Matrix, cells: Sequence[Cell], roots: Path, base: Mapping[str, str]
) -> dict[str, str]:
    """Merge the cells' trees per family; return the environ the harvest finds them through.

    One cell: its own roots, as they are. Several: ``<roots>/merged``, in the
    same layout; a conflict (one path, different bytes, no family rule) fails
    the build and names both cells.
    """
    cell_roots = [roots / "cells" / c.id for c in cells]
    if len(cells) == 1:
        return cell_environ(cell_roots[0], matrix.families, matrix.env, base)

    merged = roots / "merged"
    env = cell_environ(merged, matrix.families, matrix.env, base)
    conflicts = []
    for fam in select_families(matrix.families or None):
        sources = [
            (c.id, {k: Path(v) for k, v in fam.restore_dirs(r).items()})
            for c, r in zip(cells, cell_roots, strict=True)
        ]
        dest = {k: Path(v) for k, v in fam.restore_dirs(merged).items()}
        conflicts.extend(merge_family(fam, sources, dest).conflicts)
    if conflicts:
        first = conflicts[0]
        raise BuildError(
            f"{len(conflicts)} conflict(s) merging the cells' caches, e.g. {first.describe()}",
            hint="two cells wrote one path with different bytes: split them into separate "
            "matrices, or make the family's rule cover it",
        )
    return env


def _attest_build(
    store: Store,
    harvested: HarvestResult,
    key: PrivateKey,
    *,
    matrix_path: Path,
    results: Sequence[CellResult],
    report: LintReport,
    started_at: float,
) -> None:
    """Attach the build's provenance to the artifact it published (signed with ``key``)."""
    art = read_artifact(store, harvested.digest)
    if art is None:  # pragma: no cover - published a moment ago
        return
    cells = [
        {
            "id": r.id,
            "seconds": r.seconds,
            "returncode": r.returncode,
            "devices": r.devices,
            "checks": r.checks,
            **({"serve": r.serve} if r.serve else {}),
        }
        for r in results
    ]
    lint = {
        "errors": report.errors,
        "warnings": report.warnings,
        "files_scanned": report.files_scanned,
    }
    doc = statement(
        store_identity(store),
        harvested.digest,
        art.config,
        matrix=matrix_path,
        cells=cells,
        lint=lint,
        started=started_at,
        finished=time.time(),
    )
    assert harvested.signing is not None  # noqa: S101 - the caller checked
    harvested.signing.attestations.append(attest(store, harvested.digest, doc, key))


def lint_roots(families: Sequence[str], environ: Mapping[str, str], roots: Path) -> LintReport:
    """Lint what the cells wrote, as the harvest will find it (``families`` empty: all).

    The caches are located through the cells' ``environ`` rather than by the
    restore layout under ``roots``: that is how the harvest finds them, so a
    component the harvest would not pack (vLLM's ``deep_gemm/`` when the
    ``deepgemm`` family owns ``DG_JIT_CACHE_DIR``) is not linted either.
    """
    located = roots_for_lint(None, families or None, environ)
    return lint(located, hazards=Hazards.from_environ(environ, extra_paths=[roots]))
