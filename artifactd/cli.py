"""The ``artifactd`` command line: parse, call one library function, render.

No decisions live here. Every command has ``--json``; errors become one line
on stderr (plus a hint) and a documented exit code:

====  =====================================================
code  meaning
====  =====================================================
0     success; also any restore failure without ``--require``
1     unexpected error (a bug)
2     bad usage, bad matrix or fingerprint file
3     store unreachable or unreadable
4     artifact, tag or blob not found
5     integrity: digest mismatch, hostile or schema-invalid artifact
6     restore miss with ``--require``
7     a warm-up cell failed or there was nothing to harvest
8     the local environment could not be probed
9     not enough space on the restore target
10    restore target not writable, or its lock not taken in time
====  =====================================================

Set ``ARTIFACTD_TRACEBACK=1`` to see Python tracebacks.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

from artifactd import __version__
from artifactd import constants as C  # noqa: N812
from artifactd.errors import ArtifactdError, ConfigError, UsageError

F = TypeVar("F", bound=Callable[..., Any])


# --------------------------------------------------------------------------
# Rendering helpers
# --------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value) if f.repr
        }
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def emit_json(value: Any) -> None:
    """Print one JSON document on stdout."""
    click.echo(json.dumps(_jsonable(value), sort_keys=True))


def human_bytes(n: float) -> str:
    """Format a byte count for people."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  " + "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip()
        for row in rows
    )


def _event_printer(as_json: bool) -> Callable[[dict[str, Any]], None]:
    """Show library events: JSON lines on stderr with --json, progress on a terminal.

    Progress events are for people: they appear only on a TTY and never in JSON.
    """
    tty = sys.stderr.isatty()

    def show(event: dict[str, Any]) -> None:
        progress = event.get("event") == "progress"
        if as_json:
            if not progress:
                click.echo(json.dumps(event, sort_keys=True), err=True)
            return
        if not tty:
            return
        if progress:
            done, total = event.get("bytes", 0), event.get("total", 0)
            pct = f" {100 * done / total:3.0f}%" if total else ""
            click.echo(
                f"\r[{event.get('stage')}] {event.get('family', '')} "
                f"{human_bytes(done)} / {human_bytes(total)}{pct}   ",
                err=True,
                nl=False,
            )
            return
        detail = " ".join(f"{k}={v}" for k, v in event.items() if k not in ("stage", "event"))
        click.echo(f"\r[{event.get('stage')}] {event.get('event')} {detail}", err=True)

    return show


# --------------------------------------------------------------------------
# Shared options
# --------------------------------------------------------------------------


def json_option(f: F) -> F:
    """Add ``--json``."""
    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        envvar=C.ENV_JSON,
        help="Print one JSON document instead of text.",
    )(f)


def store_option(f: F) -> F:
    """Add ``--store`` and ``--insecure``."""
    f = insecure_option(f)
    return click.option(
        "--store",
        envvar=C.ENV_STORE,
        default=C.DEFAULT_STORE,
        show_default=True,
        help="Store: oci:PATH (local OCI layout directory) or HOST[:PORT]/REPO (registry).",
    )(f)


def family_option(f: F) -> F:
    """Add ``--family`` (repeatable or comma-separated; ``ARTIFACTD_FAMILIES``)."""
    return click.option(
        "--family",
        "families",
        multiple=True,
        envvar=C.ENV_FAMILIES,
        metavar="NAME",
        help="Only these families (repeatable or comma-separated). Default: all.",
    )(f)


def insecure_option(f: F) -> F:
    """Add ``--insecure``."""
    return click.option(
        "--insecure",
        is_flag=True,
        envvar=C.ENV_INSECURE,
        help="Allow plain HTTP to a registry off loopback (loopback registries always use it).",
    )(f)


def fingerprint_options(f: F) -> F:
    """Add the options that shape the probed fingerprint."""
    f = click.option(
        "--gpu-arch",
        envvar=C.ENV_GPU_ARCH,
        metavar="ARCH",
        help="Declared GPU target (sm_90a) for machines without that GPU.",
    )(f)
    f = click.option(
        "--image-digest",
        envvar=C.ENV_IMAGE_DIGEST,
        metavar="DIGEST",
        help="Digest of the runtime image the caches are for.",
    )(f)
    f = set_option(f)
    return click.option(
        "--workload",
        multiple=True,
        metavar="KEY=VALUE",
        envvar=C.ENV_WORKLOAD,
        help="Workload field (model, revision, dtype, tp...). Repeatable or comma-separated.",
    )(f)


def set_option(f: F) -> F:
    """Add ``--set PATH=VALUE`` (fingerprint overrides)."""
    return click.option(
        "--set",
        "overrides",
        multiple=True,
        metavar="PATH=VALUE",
        envvar=C.ENV_SET,
        help="Override a fingerprint field, dotted as in the JSON Schema "
        "(gpu.arch=sm_100a, driver.version=575.51). Repeatable.",
    )(f)


def _probe_raw(
    gpu_arch: str | None,
    image_digest: str | None,
    workload: Sequence[str],
    overrides: Sequence[str],
) -> dict[str, Any]:
    from artifactd.probing import apply_overrides, parse_pairs, probe_raw

    raw = probe_raw(
        gpu_arch=gpu_arch,
        image_digest=image_digest,
        workload=parse_pairs(workload, what="--workload"),
    )
    if not overrides:
        return raw
    from artifactd.fingerprint import from_raw

    # Validate and re-dump: "8" becomes 8 where the schema wants a number, so the
    # hash is the one the typed model computes.
    return from_raw(apply_overrides(raw, overrides)).model_dump(mode="json")


def _probe(
    gpu_arch: str | None,
    image_digest: str | None,
    workload: Sequence[str],
    overrides: Sequence[str] = (),
) -> Any:
    from artifactd.fingerprint import from_raw

    return from_raw(_probe_raw(gpu_arch, image_digest, workload, overrides))


def _families(values: Sequence[str]) -> list[str] | None:
    names = [n for v in values for n in v.split(",") if n.strip()]
    return names or None


# --------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="artifactd")
def cli() -> None:
    """Fingerprinted compile caches for LLM inference pods.

    \b
    Build once, restore everywhere:
      artifactd build warmup_matrices/cpu-demo.yaml     # CI: warm up, harvest, push
      artifactd restore --target /cache                 # init container: install warm caches
      artifactd diff local oci:.artifactd/store:TAG     # operator: why did this pod recompile?

    The default store is a local OCI layout directory (oci:.artifactd/store);
    set ARTIFACTD_STORE or pass --store. Run `artifactd demo` for a timed round trip.
    """


@cli.command()
@fingerprint_options
@json_option
@click.option("--hash", "hash_only", is_flag=True, help="Print only the fingerprint hash.")
def fingerprint(
    *,
    gpu_arch: str | None,
    image_digest: str | None,
    workload: tuple[str, ...],
    overrides: tuple[str, ...],
    as_json: bool,
    hash_only: bool,
) -> None:
    """Print this environment's compatibility fingerprint.

    Probes without importing torch: GPU and driver through NVML when present,
    library versions and content hashes from package metadata, Python ABI,
    platform, CPU ISA, compilers. Informational fields (hostname, time) are
    shown but never hashed.
    """
    from artifactd.probing import flatten, hashed_view, raw_hash

    # Plain data, no model: the probe's document has the Fingerprint schema's exact
    # shape (a test holds the two together), and printing it needs no validation.
    raw = _probe_raw(gpu_arch, image_digest, workload, overrides)
    digest = raw_hash(raw)
    if hash_only:
        click.echo(digest)
    elif as_json:
        emit_json({"hash": digest, "fingerprint": raw})
    else:
        click.echo(f"fingerprint {digest}")
        for key, value in flatten(hashed_view(raw)).items():
            click.echo(f"  {key:32} {value}")
        for key, value in flatten(raw["info"], "info.").items():
            click.echo(f"  {key:32} {value}  (not hashed)")


@cli.command()
@store_option
@family_option
@fingerprint_options
@json_option
def harvest(
    *,
    store: str,
    insecure: bool,
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
    from artifactd.harvest import harvest as do_harvest
    from artifactd.stores import open_store

    fp = _probe(gpu_arch, image_digest, workload, overrides)
    with open_store(store, create=True, insecure=insecure) as st:
        result = do_harvest(st, fp, families=_families(families), on_event=_event_printer(as_json))
    if as_json:
        emit_json(result)
        return
    _render_harvest(result)


def _render_harvest(result: Any) -> None:
    rows = [("family", "files", "size", "layer", "skipped")]
    for fam in result.families:
        rows.append(
            (
                fam.family,
                str(fam.files),
                human_bytes(fam.bytes),
                human_bytes(fam.layer_size),
                str(fam.skipped),
            )
        )
    click.echo(f"harvested into {result.store}")
    click.echo(_table(rows))
    if result.not_found:
        click.echo(f"  not found: {', '.join(result.not_found)}")
    click.echo(f"artifact {result.digest}")
    click.echo(f"  tag fp-{result.fingerprint_hash}")
    click.echo(
        f"  uploaded {human_bytes(result.bytes_uploaded)}, "
        f"already present {human_bytes(result.bytes_skipped)}, {result.seconds:.2f} s"
    )


@cli.command()
@click.argument("matrix", type=click.Path(path_type=Path))
@store_option
@click.option(
    "--gpu-arch",
    envvar=C.ENV_GPU_ARCH,
    metavar="ARCH",
    help="Override the matrix's declared target (sm_90a).",
)
@click.option(
    "--image-digest",
    envvar=C.ENV_IMAGE_DIGEST,
    metavar="DIGEST",
    help="Override the matrix's base image digest.",
)
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
    help="Fail when the hygiene lint finds anything (default: report warnings).",
)
@json_option
def build(
    *,
    matrix: Path,
    store: str,
    insecure: bool,
    gpu_arch: str | None,
    image_digest: str | None,
    keep_roots: Path | None,
    overrides: tuple[str, ...],
    strict: bool,
    as_json: bool,
) -> None:
    """Run a warm-up matrix with fresh cache roots, then harvest into the store."""
    from artifactd.build import build as do_build
    from artifactd.stores import open_store

    with open_store(store, create=True, insecure=insecure) as st:
        result = do_build(
            matrix,
            st,
            gpu_arch=gpu_arch,
            image_digest=image_digest,
            roots=keep_roots,
            keep_roots=keep_roots is not None,
            on_event=_event_printer(as_json),
            overrides=overrides,
            strict_lint=strict,
        )
    if as_json:
        emit_json(result)
        return
    for cell in result.cells:
        click.echo(f"cell {cell.id}: {cell.seconds:.1f} s")
    if result.lint is not None and result.lint.findings:
        click.echo(
            f"lint: {result.lint.errors} error(s), {result.lint.warnings} warning(s) tie these "
            "caches to the build machine; see them with --keep-roots DIR, then "
            "`artifactd lint DIR`"
        )
    _render_harvest(result.harvest)


@cli.command()
@store_option
@click.option(
    "--target",
    envvar=C.ENV_TARGET,
    type=click.Path(path_type=Path),
    required=True,
    help="Cache volume to restore into; each family gets a subdirectory.",
)
@family_option
@fingerprint_options
@click.option(
    "--env-file",
    envvar=C.ENV_ENV_FILE,
    type=click.Path(path_type=Path),
    help="Where to write KEY=VALUE lines for the engine [TARGET/artifactd.env].",
)
@click.option(
    "--consumer-user",
    envvar=C.ENV_CONSUMER_USER,
    metavar="USER",
    help="User the engine runs as (names Inductor's header dir). Default: this user.",
)
@click.option(
    "--require",
    is_flag=True,
    envvar=C.ENV_REQUIRE,
    help="Fail (exit 6 on a miss, or the failure's code) instead of exiting 0.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    envvar=C.ENV_DRY_RUN,
    help="Print the plan (per-family verdicts, bytes, dirs) and change nothing.",
)
@click.option(
    "--max-bytes",
    envvar=C.ENV_MAX_BYTES,
    metavar="SIZE",
    help="Refuse to unpack more than SIZE (bytes, or 500M, 20G) into TARGET.",
)
@click.option(
    "--lock-timeout",
    envvar=C.ENV_LOCK_TIMEOUT,
    type=float,
    metavar="SECONDS",
    help="How long to wait for another restore into TARGET to finish [600].",
)
@json_option
def restore(
    *,
    store: str,
    insecure: bool,
    target: Path,
    families: tuple[str, ...],
    gpu_arch: str | None,
    image_digest: str | None,
    workload: tuple[str, ...],
    overrides: tuple[str, ...],
    env_file: Path | None,
    consumer_user: str | None,
    require: bool,
    dry_run: bool,
    max_bytes: str | None,
    lock_timeout: float | None,
    as_json: bool,
) -> None:
    """Install the caches that match this machine into TARGET (the init container's job).

    Looks up the artifact tagged with the local fingerprint; failing that, each
    family's own scope tag (so a model or TP change still restores kernels).
    Before downloading, every layer's file list is checked against the format's
    rules and the restore's size against TARGET's free space. Layers are then
    verified while they stream, staged next to TARGET and installed in one
    transaction: every family or none.

    A miss, an unreachable store, a corrupt or hostile artifact, a full disk
    or an unwritable target prints the error, leaves TARGET as it was and
    exits 0 (the engine compiles as before), unless --require.

    \b
    Every flag also reads an environment variable (for Kubernetes):
      ARTIFACTD_STORE, ARTIFACTD_TARGET, ARTIFACTD_FAMILIES, ARTIFACTD_WORKLOAD,
      ARTIFACTD_SET, ARTIFACTD_GPU_ARCH, ARTIFACTD_IMAGE_DIGEST, ARTIFACTD_ENV_FILE,
      ARTIFACTD_CONSUMER_USER, ARTIFACTD_REQUIRE, ARTIFACTD_DRY_RUN, ARTIFACTD_JSON,
      ARTIFACTD_INSECURE, ARTIFACTD_MAX_BYTES, ARTIFACTD_LOCK_TIMEOUT.
    """
    from artifactd.restore import RestoreRequest, run_restore

    request = RestoreRequest(
        store=store,
        target=target,
        families=_families(families),
        consumer_user=consumer_user,
        env_file=env_file,
        require=require,
        dry_run=dry_run,
        insecure=insecure,
        max_bytes=_parse_size(max_bytes) if max_bytes else None,
        lock_timeout=lock_timeout,
    )
    # Probe into plain data: a no-op restore (warm volume, marker matches)
    # answers without building a single pydantic model.
    raw = _probe_raw(gpu_arch, image_digest, workload, overrides)
    outcome = run_restore(request, raw, on_event=_event_printer(as_json))
    _render_restore(outcome, as_json=as_json)
    if outcome.exit_code:
        sys.exit(outcome.exit_code)


_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _parse_size(text: str) -> int:
    value = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = value[-1:] if value[-1:] in _SIZE_UNITS else ""
    number = value[: len(value) - len(unit)]
    try:
        return int(float(number) * _SIZE_UNITS[unit])
    except ValueError:
        raise UsageError(
            f"--max-bytes {text!r} is not a size", hint="use bytes or a unit: 500M, 20G"
        ) from None


def _render_restore(outcome: Any, *, as_json: bool) -> None:
    """Print a restore outcome: one JSON document, or the plan table and a verdict line."""
    plan, result, failure = outcome.plan, outcome.result, outcome.failure
    if failure is not None and failure.kind == "internal" and _flag(C.ENV_TRACEBACK):
        import traceback

        traceback.print_exception(failure.error)
    if as_json:
        doc: dict[str, Any] = {
            "stage": "restore",
            "status": outcome.status,
            "cache_hit": outcome.cache_hit,
            "match": plan.match,
            "dry_run": outcome.status == "dry_run",
            "noop": plan.noop,
            "plan": _jsonable(plan),
            "bytes_to_fetch": plan.bytes_to_fetch,
            "error": failure.message if failure else plan.error,
            "failure": None
            if failure is None
            else {
                "kind": failure.kind,
                "message": failure.message,
                "hint": failure.hint,
                "exit_code": failure.exit_code,
            },
            "exit_code": outcome.exit_code,
        }
        if result is not None:
            doc.update(
                restored=result.restored,
                files=result.files,
                bytes=result.bytes,
                elapsed_ms=round(result.seconds * 1000, 1),
                recovered=result.recovered,
            )
        emit_json(doc)
        return
    _render_plan(plan, result, outcome.status == "dry_run")
    if failure is None:
        return
    message = failure.message
    if failure.kind != "miss":
        message = f"restore failed ({failure.kind}), nothing changed in {plan.target}: {message}"
    if outcome.exit_code:
        head = f"artifactd: error: {message}"
    else:
        head = f"artifactd: {message}; the engine will compile as before"
    click.echo(head + (f"\n  hint: {failure.hint}" if failure.hint else ""), err=True)


def _flag(name: str) -> bool:
    """Read a boolean environment variable strictly: 1/true/yes/on, else off."""
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _render_plan(plan: Any, result: Any, dry_run: bool) -> None:
    head = {"full": "full match", "partial": "partial match (by family scope)", "miss": "MISS"}
    click.echo(
        f"restore: {head[plan.match]} for fingerprint {plan.fingerprint_hash[:16]}... "
        f"from {plan.store}"
    )
    if plan.error:
        click.echo(f"  store: {plan.error}")
    rows = [("family", "verdict", "via", "files", "size", "where / why")]
    for f in plan.families:
        if f.verdict == "hit":
            rows.append(
                (
                    f.family,
                    "hit",
                    f.source or "",
                    str(f.files),
                    human_bytes(f.unpacked),
                    ", ".join(f.dirs.values()),
                )
            )
        else:
            rows.append((f.family, "miss", "-", "-", "-", f.reason or ""))
    click.echo(_table(rows))
    for f in plan.families:
        for d in f.deciding:
            click.echo(f"    {f.family}: {d.path}: artifact={d.a!r} local={d.b!r}")
    if plan.nearest is not None and plan.match != "full":
        click.echo(
            f"  nearest artifact: {plan.nearest.tag} "
            f"({len(plan.nearest.differing)} field(s) differ)"
        )
    if dry_run:
        click.echo(f"dry run: would fetch {human_bytes(plan.bytes_to_fetch)}; nothing written")
    elif plan.noop:
        click.echo(f"already restored (marker matches); nothing to do. env file: {plan.env_file}")
    elif result is not None:
        click.echo(
            f"restored {len(result.restored)} families, {result.files} files, "
            f"{human_bytes(result.bytes)} in {result.seconds:.2f} s"
        )
        click.echo(f"env file: {plan.env_file}  (load: set -a; . {plan.env_file}; set +a)")
    elif not plan.hits and not plan.error:
        click.echo("nothing restored: the engine will compile as before")


def _load_side(
    spec: str,
    gpu_arch: str | None,
    workload: Sequence[str],
    *,
    insecure: bool,
    overrides: Sequence[str] = (),
) -> tuple[str, Any, dict[str, Any]]:
    """Turn a diff operand (local, a fingerprint file, an artifact ref) into a fingerprint.

    Also returns the per-family facts an artifact recorded (empty otherwise).
    """
    from artifactd.artifacts import read_artifact
    from artifactd.fingerprint import Fingerprint
    from artifactd.manifest import ArtifactManifest
    from artifactd.stores import open_store, parse_artifact_ref

    if spec == "local":
        return "local", _probe(gpu_arch, None, workload, overrides), {}
    path = Path(spec)
    if path.is_file():
        data = path.read_bytes()
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ConfigError(
                f"{spec} is not JSON: {exc}",
                hint="save one with `artifactd fingerprint --json > FILE`",
            ) from None
        if isinstance(doc, dict) and "fingerprint" in doc and "layers" in doc:
            config = ArtifactManifest.from_json(data, source=spec)
            return spec, config.fingerprint, {r.family: r.facts for r in config.layers}
        if isinstance(doc, dict) and "fingerprint" in doc and "hash" in doc:
            fp = Fingerprint.from_json(json.dumps(doc["fingerprint"]), source=spec)
            return spec, fp, {}
        return spec, Fingerprint.from_json(data, source=spec), {}
    ref = parse_artifact_ref(spec)
    if ref.reference is None:
        raise UsageError(
            f"cannot read {spec!r} as a fingerprint",
            hint="use `local`, a JSON file from `artifactd fingerprint --json`, "
            "or an artifact reference such as oci:DIR:TAG",
        )
    with open_store(ref.store, insecure=insecure) as st:
        art = read_artifact(st, ref.reference)
    if art is None:
        raise UsageError(f"{spec}: no such artifact")
    return spec, art.config.fingerprint, {r.family: r.facts for r in art.config.layers}


@cli.command()
@click.argument("a")
@click.argument("b")
@click.option(
    "--gpu-arch",
    envvar=C.ENV_GPU_ARCH,
    metavar="ARCH",
    help="Declared GPU target for the `local` side.",
)
@click.option(
    "--workload", multiple=True, metavar="KEY=VALUE", help="Workload fields for the `local` side."
)
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
    from artifactd.diff import diff as do_diff
    from artifactd.diff import facts_diff

    # --set shapes one `local` side: B when both are local ("what if here were...").
    set_b = b == "local"
    name_a, fa, facts_a = _load_side(
        a, gpu_arch, workload, insecure=insecure, overrides=() if set_b else overrides
    )
    name_b, fb, facts_b = _load_side(
        b, gpu_arch, workload, insecure=insecure, overrides=overrides if set_b else ()
    )
    result = do_diff(fa, fb, _families(families))
    facts = facts_diff(facts_a, facts_b)
    if as_json:
        emit_json(
            {
                "a": name_a,
                "b": name_b,
                "identical": result.identical,
                "a_hash": result.a_hash,
                "b_hash": result.b_hash,
                "fields": result.fields,
                "informational": result.informational,
                "families": result.families,
                "facts": facts,
            }
        )
        return
    click.echo(f"A {name_a}: {result.a_hash[:16]}...")
    click.echo(f"B {name_b}: {result.b_hash[:16]}...")
    if result.identical:
        click.echo("identical fingerprints: every family's cache is valid on B")
    else:
        rows = [("field", "A", "B")] + [(d.path, repr(d.a), repr(d.b)) for d in result.fields]
        click.echo(f"{len(result.fields)} field(s) differ:")
        click.echo(_table(rows))
    rows = [("family", "verdict", "deciding fields")]
    for v in result.families:
        rows.append((v.family, v.verdict, ", ".join(d.path for d in v.deciding)))
    click.echo("per family (a cache built on A, used on B):")
    click.echo(_table(rows))
    if facts:
        click.echo(f"{len(facts)} recorded cache fact(s) differ (e.g. vLLM hash factors):")
        click.echo(
            _table(
                [("family", "fact", "A", "B")]
                + [(f.family, f"{f.component}:{f.path}", repr(f.a), repr(f.b)) for f in facts]
            )
        )


@cli.command()
@click.argument("ref")
@click.option("--files", "show_files", is_flag=True, help="List every file.")
@insecure_option
@json_option
def inspect(*, ref: str, show_files: bool, insecure: bool, as_json: bool) -> None:
    """Show what an artifact holds: fingerprint, families, files, provenance.

    REF is oci:DIR:TAG, HOST[:PORT]/REPO:TAG, or either with @sha256:DIGEST
    (see `artifactd ls`).
    """
    from artifactd.artifacts import read_artifact
    from artifactd.stores import open_store, parse_artifact_ref

    parsed = parse_artifact_ref(ref)
    if parsed.reference is None:
        raise UsageError(
            f"{ref!r} names a store, not an artifact",
            hint="add :TAG or @sha256:DIGEST; `artifactd ls` lists tags",
        )
    with open_store(parsed.store, insecure=insecure) as st:
        art = read_artifact(st, parsed.reference)
    if art is None:
        from artifactd.errors import NotFoundError

        raise NotFoundError(f"{parsed.store} has no artifact {parsed.reference}")
    if as_json:
        emit_json(
            {
                "digest": art.digest,
                "manifest": art.manifest.model_dump(by_alias=True, exclude_none=True, mode="json"),
                "config": art.config,
            }
        )
        return
    cfg = art.config
    click.echo(f"artifact {art.digest} ({cfg.kind})")
    click.echo(f"  fingerprint {cfg.fingerprint_hash}")
    click.echo(
        f"  built by artifactd {cfg.provenance.builder} ({cfg.provenance.source}"
        + (f", matrix {cfg.provenance.matrix}" if cfg.provenance.matrix else "")
        + ")"
    )
    rows = [("family", "files", "size", "layer", "scope key")]
    for rec in cfg.layers:
        rows.append(
            (
                rec.family,
                str(len(rec.files)),
                human_bytes(rec.unpacked_size),
                human_bytes(rec.size),
                rec.scope_key[:16] + "...",
            )
        )
    click.echo(_table(rows))
    if show_files:
        for rec in cfg.layers:
            for f in rec.files:
                click.echo(f"  {rec.family}: {f.path} {f.size} {f.sha256[:12]}")


@cli.command(name="ls")
@click.argument("store", required=False, default=None)
@insecure_option
@json_option
def ls_cmd(*, store: str | None, insecure: bool, as_json: bool) -> None:
    """List the tags in a store (default: ARTIFACTD_STORE or oci:.artifactd/store)."""
    from artifactd.stores import open_store

    ref = store or os.environ.get(C.ENV_STORE, C.DEFAULT_STORE)
    with open_store(ref, insecure=insecure) as st:
        tags = st.list_tags()
    if as_json:
        emit_json({"store": ref, "tags": tags})
        return
    for tag in tags:
        click.echo(tag)


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
    help="Where restored caches go.",
)
@json_option
def demo(*, store: str, insecure: bool, matrix: Path, workdir: Path, as_json: bool) -> None:
    """Build the CPU demo matrix cold, restore it fresh, and time the warm start."""
    from artifactd.demo import run_demo
    from artifactd.stores import open_store

    printer = _event_printer(as_json)
    if not as_json:
        click.echo(f"building {matrix} cold (fresh caches; about a minute on 2 cores)...", err=True)
    with open_store(store, create=True, insecure=insecure) as st:
        result = run_demo(
            matrix, st, workdir=workdir, on_event=printer, environ=os.environ, insecure=insecure
        )
    if as_json:
        emit_json(
            {
                "store": result.store,
                "artifact": result.artifact,
                "target": result.target,
                "cold_seconds": result.cold_seconds,
                "cold_compiled": result.cold_compiled,
                "restore_seconds": result.restore_seconds,
                "restored_seconds": result.restored_seconds,
                "restored_compiled": result.restored_compiled,
                "ratio": round(result.ratio, 3),
            }
        )
        return
    click.echo(f"artifact {result.artifact} in {result.store}")
    click.echo(f"restored into {result.target}")
    click.echo(
        _table(
            [
                ("stage", "seconds", "compiled"),
                (
                    "cold warm-up (fresh caches)",
                    f"{result.cold_seconds:.1f}",
                    str(result.cold_compiled),
                ),
                ("artifactd restore (new process)", f"{result.restore_seconds:.2f}", "-"),
                (
                    "warm-up on restored caches",
                    f"{result.restored_seconds:.1f}",
                    str(result.restored_compiled),
                ),
            ]
        )
    )
    saved = result.cold_seconds - result.restored_seconds - result.restore_seconds
    click.echo(f"restored/cold = {result.ratio:.2f}: {saved:.1f} s saved per start")


@cli.command()
@click.argument("directory", required=False, type=click.Path(path_type=Path))
@family_option
@click.option("--strict", is_flag=True, help="Exit 1 when there is any finding.")
@json_option
def lint(*, directory: Path | None, families: tuple[str, ...], strict: bool, as_json: bool) -> None:
    """Find what will make a harvested cache miss elsewhere, before it ships.

    Scans each family's cache for this machine's absolute paths (outside the
    files artifactd rewrites), user and host names in paths, and volatile values
    in vLLM's hash factors (IPs, ports, Ray bundle indices). Each finding names
    the file, the value and what it will cost.

    DIRECTORY is a build-roots or restore-target directory (each family in its
    subdirectory); without it, caches are found as `harvest` finds them.
    """
    from artifactd.constants import current_environ
    from artifactd.families import select_families
    from artifactd.lint import Hazards, root_key
    from artifactd.lint import lint as do_lint

    environ = current_environ()
    roots: dict[str, Path] = {}
    for fam in select_families(_families(families)):
        if directory is not None:
            for comp, path in fam.restore_dirs(directory).items():
                if path.is_dir():
                    roots[root_key(fam.name, comp)] = path
        else:
            for loc in fam.locate(environ):
                roots[root_key(fam.name, loc.component.name)] = loc.path
    extra = [directory] if directory is not None else list(roots.values())
    report = do_lint(roots, hazards=Hazards.from_environ(environ, extra_paths=extra))
    if as_json:
        emit_json(
            {
                "roots": {k: str(v) for k, v in roots.items()},
                "findings": report.findings,
                "files_scanned": report.files_scanned,
                "errors": report.errors,
                "warnings": report.warnings,
                "unreadable": report.unreadable,
            }
        )
    else:
        click.echo(f"lint: {len(roots)} cache root(s), {report.files_scanned} files scanned")
        for f in report.findings:
            click.echo(
                f"  {f.severity}: {f.family}/{f.component}/{f.file}: {f.kind} "
                f"{f.value!r}\n      {f.cost}"
            )
        if not report.findings:
            click.echo("  clean: nothing ties these caches to this machine")
    code = report.exit_code(strict)
    if code:
        sys.exit(code)


@cli.command()
@click.argument("source")
@click.argument("destination")
@click.option(
    "--tag",
    "tags",
    multiple=True,
    metavar="TAG",
    help="Copy only these tags (repeatable). Default: every artifactd artifact.",
)
@insecure_option
@json_option
def copy(
    *, source: str, destination: str, tags: tuple[str, ...], insecure: bool, as_json: bool
) -> None:
    """Copy artifacts between stores (local layout <-> registry, registry -> registry).

    Blobs the destination already has are not transferred; every blob is
    verified against its digest on the way; a tag is written only after all of
    its manifest's blobs are in place.
    """
    import tempfile

    from artifactd.artifacts import copy_artifacts
    from artifactd.stores import open_store

    with (
        open_store(source, insecure=insecure) as src,
        open_store(destination, create=True, insecure=insecure) as dst,
        tempfile.TemporaryDirectory(prefix="artifactd-copy-") as tmp,
    ):
        result = copy_artifacts(src, dst, list(tags) or None, Path(tmp))
    if as_json:
        emit_json(result)
        return
    click.echo(
        f"copied {result.manifests} manifest(s) from {result.source} to {result.destination}"
    )
    for tag in result.tags:
        click.echo(f"  {tag}")
    click.echo(
        f"  uploaded {human_bytes(result.bytes_uploaded)}, already present "
        f"{human_bytes(result.bytes_skipped)}"
    )


@cli.command()
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=Path("registry-schema"),
    show_default=True,
    help="Directory to write the JSON Schemas into.",
)
def schema(*, out: Path) -> None:
    """Write the JSON Schemas of artifactd's documents (artifact config, fingerprint...)."""
    from artifactd.schema import write_schemas

    for path in write_schemas(out):
        click.echo(str(path))


# --------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> None:
    """Run the CLI, mapping artifactd errors to one line and an exit code."""
    try:
        cli.main(
            args=list(argv) if argv is not None else None,
            prog_name="artifactd",
            standalone_mode=False,
        )
    except ArtifactdError as exc:
        if _flag(C.ENV_TRACEBACK):
            raise
        click.echo(f"artifactd: error: {exc.diagnostics()}", err=True)
        sys.exit(exc.exit_code)
    except OSError as exc:
        if _flag(C.ENV_TRACEBACK):
            raise
        click.echo(f"artifactd: error: {exc.strerror or exc}: {exc.filename or ''}", err=True)
        sys.exit(1)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except Exception as exc:
        if _flag(C.ENV_TRACEBACK):
            raise
        click.echo(
            f"artifactd: internal error: {type(exc).__name__}: {str(exc)[:200]}\n"
            "  hint: this is a bug; set ARTIFACTD_TRACEBACK=1 and report the traceback",
            err=True,
        )
        sys.exit(1)
    sys.exit(0)
