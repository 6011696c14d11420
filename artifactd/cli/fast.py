"""The pod-start fast path: ``fingerprint`` and ``restore``, parsed and run without click.

Why this module exists: an init container runs ``artifactd restore`` at every
pod start, and readiness probes and scripts run ``artifactd fingerprint``;
importing click, pydantic or the registry client costs about as much as
starting Python itself. So the ordinary command lines of those two commands
are parsed here, from the declarations click also reads
(:mod:`artifactd.cli.specs`), and run here; click parses everything else.
``bench/coldstart.py --only startup`` times every form below against a bare
``python -c pass`` (target: within 2.5 x).

What it serves: ``--version`` (:data:`~artifactd.cli.render.VERSION_LINE`, as
click prints it), ``fingerprint`` (``--hash``, ``--json``, ``--workload``,
``--gpu-arch``, ``--image-digest``) and ``restore`` with any of its options
given as ``--name VALUE``, ``--name=VALUE`` or an ``ARTIFACTD_*`` variable. A
restore whose target already holds what resolving would pick (the no-op: a
restarted pod, a warm volume) answers here with nothing but the modules named
below, including the forms the docs and the manifests use: ``--env-file``,
``--gpu-arch``, ``--workload``, ``--node-store`` (a local layout),
``--verify-key`` (key ids read from the PEM, no crypto library). The parser's
rules are click's: long options as ``--name VALUE`` or ``--name=VALUE``; a flag
takes no value; the command line wins over the environment, which wins over
the default; an empty variable counts as unset; the variable of a repeatable
option holds several values separated by whitespace; a flag's variable is a
boolean in click's spelling. Anything else (``--help``, a positional argument,
an unknown or malformed option, a value that does not convert, a missing
required option) returns None, and the caller hands the command line to click.

What it may import, anywhere in this module and in each module of
:data:`LIGHT` (``tests/test_fastpath.py`` reads their code and holds every
import, at module level and inside functions, to these lists):

* the standard library modules of :data:`STDLIB`: ``__future__``,
  ``_collections_abc`` (what ``collections.abc`` re-exports, loaded with
  ``os``), ``_json`` (the ``json`` package's C half), ``_sha2`` (Python 3.12
  and later) or ``_sha256`` (earlier; CPython's own SHA-256, see
  :mod:`artifactd.hashing`), ``abc``, ``atexit``, ``base64``, ``binascii``, ``collections``,
  ``contextlib``, ``errno``, ``fcntl``, ``functools``, ``hashlib``, ``importlib``, ``json``, ``os``,
  ``pathlib``, ``pwd``, ``re``, ``select``, ``shlex``, ``stat``, ``sys``,
  ``sysconfig``, ``threading``, ``time``, ``types``, ``typing``;
* on a host with an NVIDIA driver, :data:`GPU`: ``ctypes``, ``pynvml`` (NVML
  and libcuda);
* the artifactd modules of :data:`LIGHT`, which import at module level only
  what these lists allow: ``artifactd``, ``artifactd.bounds``, ``artifactd.cli``,
  ``artifactd.cli.main``, ``artifactd.cli.progress``, ``artifactd.cli.render``,
  ``artifactd.cli.specs``,
  ``artifactd.constants``, ``artifactd.errors``, ``artifactd.events``,
  ``artifactd.jsontext``, ``artifactd.records``,
  ``artifactd.families``, ``artifactd.fingerprint``,
  ``artifactd.fingerprint.key``, ``artifactd.fingerprint.probe``,
  ``artifactd.fingerprint.probecache``, ``artifactd.fingerprint.tools``,
  ``artifactd.format``,
  ``artifactd.format.oci``, ``artifactd.fsutil``, ``artifactd.hashing``,
  ``artifactd.reports``, ``artifactd.restore``,
  ``artifactd.restore.destination``, ``artifactd.restore.envfile``,
  ``artifactd.restore.marker``,
  ``artifactd.restore.nodefill``, ``artifactd.restore.policy``,
  ``artifactd.restore.resolve``, ``artifactd.restore.source``,
  ``artifactd.stores``, ``artifactd.stores.base``, ``artifactd.stores.layout``,
  ``artifactd.stores.nodestore``, ``artifactd.trust``, ``artifactd.trust.keys``;
* at module level, the modules of :data:`LIGHT` and this one import only
  standard library modules of :data:`FLOOR`: ``__future__``,
  ``_collections_abc``, ``_json``, ``_sha2`` or ``_sha256``, ``abc``,
  ``atexit``, ``binascii``, ``errno``, ``fcntl``, ``os``, ``pwd``,
  ``select``, ``stat``, ``sys``, ``time``, ``types``; the rest of
  :data:`STDLIB` only inside a function. Importing ``typing``, ``re``,
  ``json``, ``pathlib``, ``contextlib``, ``functools``, ``collections``,
  ``enum`` or ``threading`` costs from 4 to 43 million instructions each (a
  bare Python start is 36 million), so these modules name their types under
  ``if TYPE_CHECKING:`` (a module constant ``TYPE_CHECKING = False``: type
  checkers read the name, and ``typing`` stays unloaded), build their records
  on :class:`artifactd.records.Record`, read and write JSON with
  :mod:`artifactd.jsontext`, and hold paths as text
  (:func:`artifactd.fsutil.as_path` makes a ``Path`` for the rest of the
  library);
* inside a function only, :data:`LATER`: what a pod start needs when it is not
  a no-op (installing, planning a miss, a registry, signatures, a report of
  dataclasses, ``--metrics-file``; click, for every other command line):
  ``artifactd.build.matrix_edit`` (rendering ``matrix shapes``),
  ``artifactd.cli.app``, ``artifactd.families.base``,
  ``artifactd.fingerprint.declare``, ``artifactd.fingerprint.diff``,
  ``artifactd.fingerprint.model``,
  ``artifactd.format.imagemanifest``, ``artifactd.format.light``,
  ``artifactd.format.shapes``, ``artifactd.format.views`` (reading the
  artifact's documents without pydantic), ``artifactd.format.unpack``,
  ``artifactd.pod``, ``artifactd.pod.metrics``, ``artifactd.restore.install``,
  ``artifactd.restore.journal``, ``artifactd.restore.mounted``,
  ``artifactd.restore.predict`` (``restore --predict``),
  ``artifactd.stores.artifacts``, ``artifactd.stores.listing`` (a layout's
  tag count, checked when it is listed), ``artifactd.stores.mirrors`` (a
  registry's mirror configuration), ``artifactd.stores.nodetree`` (a restore
  from the node store's unpacked layers), ``artifactd.stores.reading``,
  ``artifactd.stores.reference``,
  ``artifactd.stores.registry``, ``artifactd.trust.policy``,
  ``artifactd.trust.signatures``, ``artifactd.workers`` (threads, for a restore
  that syncs its files one by one), ``click``, ``cryptography``, ``dataclasses``,
  ``shutil``, ``tempfile``, ``traceback``. ``tests/test_startup.py`` runs every
  no-op form and ``fingerprint --hash`` for real and checks that none of these
  is loaded.

A restore that installs goes on past the no-op, and its modules are held to a
second rule: each module of :data:`INSTALLING` imports at module level only
the modules of :data:`FLOOR`, those of :data:`INSTALL_FLOOR` (``_collections``,
``_thread``, ``hashlib``, ``io``, ``itertools``, ``math``, ``operator``,
``zlib``: each loads one small C module, ``hashlib`` OpenSSL, which the
extraction hashes with) and artifactd modules of :data:`LIGHT` or
:data:`INSTALLING`, so a restore's fixed cost (``bench/coldstart.py``:
within 3 x a bare start) is not spent on modules it never uses. Their
functions may import anything: harvesting, merging and linting are not on a
pod's path, and ``tests/test_startup.py`` runs restores that install and
checks that none of the costly modules above is loaded. The modules:
``artifactd.families.base``, ``artifactd.families.layouts``, every family
module (``artifactd.families.cudajit``, ``artifactd.families.cutedsl``,
``artifactd.families.deepgemm``, ``artifactd.families.flashinfer``,
``artifactd.families.generic``, ``artifactd.families.inductor``,
``artifactd.families.sglang``, ``artifactd.families.tilelang``,
``artifactd.families.triton``, ``artifactd.families.vllm``: a plan names
every family's directories), ``artifactd.format.light``,
``artifactd.format.shapes``, ``artifactd.format.unpack``,
``artifactd.format.views``, ``artifactd.format.zstd``,
``artifactd.restore.install``, ``artifactd.restore.installed``,
``artifactd.restore.journal``, ``artifactd.stores.nodetree`` (a restore
through the node store), ``artifactd.stores.reading``,
``artifactd.trust.policy``, ``artifactd.workers``.

These function-local imports are the only ones the fast path keeps, and this
paragraph is their one explanation: each keeps a module off the path a no-op
walks. Importing the probe and the restore policy inside :func:`fingerprint`
and :func:`restore` lets the probe's subprocesses run while the restore's
modules load. Run as the program (``python -m artifactd``, the ``artifactd``
script), :func:`artifactd.cli.main.main` then ends the process without the
interpreter's teardown of these modules (a few milliseconds).
"""

from __future__ import annotations

import sys

from artifactd import constants as C  # noqa: N812
from artifactd.cli import render
from artifactd.cli.specs import (
    COMMANDS,
    FALSE,
    TRUE,
    Opt,
    env_flag,
    family_names,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any

    from artifactd.events import EventSink
    from artifactd.fsutil import StrPath
    from artifactd.restore.policy import RestoreOutcome
    from artifactd.restore.predict import PredictOptions

#: Standard library modules the fast path may import, anywhere (top-level names).
STDLIB = frozenset(
    {
        "__future__",
        "_collections_abc",
        "_json",
        "_sha2",
        "_sha256",
        "abc",
        "atexit",
        "base64",
        "binascii",
        "collections",
        "contextlib",
        "errno",
        "fcntl",
        "functools",
        "hashlib",
        "importlib",
        "json",
        "os",
        "pathlib",
        "pwd",
        "re",
        "select",
        "shlex",
        "stat",
        "sys",
        "sysconfig",
        "threading",
        "time",
        "types",
        "typing",
    }
)
#: The standard library modules LIGHT (and this module) may import at module level: each costs
#: next to nothing. STDLIB says what their functions may import besides.
FLOOR = frozenset(
    {
        "__future__",
        "_collections_abc",
        "_json",
        "_sha2",
        "_sha256",
        "abc",
        "atexit",
        "binascii",
        "errno",
        "fcntl",
        "os",
        "pwd",
        "select",
        "stat",
        "sys",
        "time",
        "types",
    }
)
#: What the probe loads on a host with an NVIDIA driver, and only there.
GPU = frozenset({"ctypes", "pynvml"})
#: The artifactd modules of the fast path: light, as the module docstring says.
LIGHT = frozenset(
    {
        "artifactd",
        "artifactd.bounds",
        "artifactd.cli",
        "artifactd.cli.main",
        "artifactd.cli.progress",
        "artifactd.cli.render",
        "artifactd.cli.specs",
        "artifactd.constants",
        "artifactd.errors",
        "artifactd.events",
        "artifactd.families",
        "artifactd.fingerprint",
        "artifactd.fingerprint.key",
        "artifactd.fingerprint.probe",
        "artifactd.fingerprint.probecache",
        "artifactd.fingerprint.tools",
        "artifactd.format",
        "artifactd.format.oci",
        "artifactd.fsutil",
        "artifactd.hashing",
        "artifactd.jsontext",
        "artifactd.records",
        "artifactd.reports",
        "artifactd.restore",
        "artifactd.restore.destination",
        "artifactd.restore.envfile",
        "artifactd.restore.marker",
        "artifactd.restore.nodefill",
        "artifactd.restore.policy",
        "artifactd.restore.resolve",
        "artifactd.restore.source",
        "artifactd.stores",
        "artifactd.stores.base",
        "artifactd.stores.layout",
        "artifactd.stores.nodestore",
        "artifactd.trust",
        "artifactd.trust.keys",
    }
)
#: What functions of the fast path may import beyond those, for work a no-op never does.
LATER = frozenset(
    {
        "artifactd.build.matrix_edit",
        "artifactd.cli.app",
        "artifactd.families.base",
        "artifactd.fingerprint.declare",
        "artifactd.fingerprint.diff",
        "artifactd.fingerprint.model",
        "artifactd.format.imagemanifest",
        "artifactd.format.light",
        "artifactd.format.shapes",
        "artifactd.format.unpack",
        "artifactd.format.views",
        "artifactd.pod",
        "artifactd.pod.metrics",
        "artifactd.restore.install",
        "artifactd.restore.journal",
        "artifactd.restore.mounted",
        "artifactd.restore.predict",
        "artifactd.stores.artifacts",
        "artifactd.stores.listing",
        "artifactd.stores.reference",
        "artifactd.stores.mirrors",
        "artifactd.stores.nodetree",
        "artifactd.stores.reading",
        "artifactd.stores.registry",
        "artifactd.trust.policy",
        "artifactd.trust.signatures",
        "artifactd.workers",
        "click",
        "cryptography",
        "dataclasses",
        "shutil",
        "tempfile",
        "traceback",
    }
)

#: The artifactd modules a restore that installs loads beyond LIGHT: held to INSTALL_FLOOR at
#: module level (the module docstring says why).
INSTALLING = frozenset(
    {
        "artifactd.families.base",
        "artifactd.families.cudajit",
        "artifactd.families.cutedsl",
        "artifactd.families.deepgemm",
        "artifactd.families.flashinfer",
        "artifactd.families.generic",
        "artifactd.families.inductor",
        "artifactd.families.layouts",
        "artifactd.families.sglang",
        "artifactd.families.tilelang",
        "artifactd.families.triton",
        "artifactd.families.vllm",
        "artifactd.format.light",
        "artifactd.format.shapes",
        "artifactd.format.unpack",
        "artifactd.format.views",
        "artifactd.format.zstd",
        "artifactd.restore.install",
        "artifactd.restore.installed",
        "artifactd.restore.journal",
        "artifactd.stores.nodetree",
        "artifactd.stores.reading",
        "artifactd.trust.policy",
        "artifactd.workers",
    }
)
#: The standard library modules INSTALLING may import at module level beyond FLOOR.
INSTALL_FLOOR = frozenset(
    {"_collections", "_thread", "hashlib", "io", "itertools", "math", "operator", "zlib"}
)


def parse(
    args: Sequence[str], environ: Mapping[str, str] | None = None
) -> Callable[[], None] | None:
    """Return a call that runs ``args``, or None when click must parse them."""
    if list(args) == ["--version"]:
        return lambda: render.echo(render.VERSION_LINE)
    if not args or args[0] not in COMMANDS:
        return None
    values = parse_options(args[0], args[1:], C.current_environ() if environ is None else environ)
    if values is None:
        return None
    run: Callable[..., None] = fingerprint if args[0] == "fingerprint" else restore
    return lambda: run(**values)


def parse_options(
    command: str, args: Sequence[str], environ: Mapping[str, str]
) -> dict[str, Any] | None:
    """Return the keyword arguments click would pass to ``command``, or None if unsure."""
    specs = COMMANDS[command]
    given = _given(specs, args)
    if given is None:
        return None
    out: dict[str, Any] = {}
    for spec in specs:
        raw = given.get(spec.dest)
        if raw is None:
            raw = _from_environ(spec, environ)
        if raw is None:
            if spec.required:
                return None
            out[spec.dest] = False if spec.is_flag else () if spec.multiple else spec.default
            continue
        converted = [_convert(spec, v) for v in raw]
        if any(v is None for v in converted):
            return None
        out[spec.dest] = tuple(converted) if spec.multiple else converted[-1]
    return out


def _given(specs: Sequence[Opt], args: Sequence[str]) -> dict[str, list[str]] | None:
    """Collect each option's values from the command line, or None if any is odd."""
    by_flag = {spec.flag: spec for spec in specs}
    given: dict[str, list[str]] = {}
    i = 0
    while i < len(args):
        flag, eq, value = args[i].partition("=")
        spec = by_flag.get(flag)
        if spec is None or (spec.is_flag and eq) or (eq and not value):
            return None
        if spec.is_flag:
            value = "1"
        elif not eq:
            i += 1
            if i == len(args) or args[i].startswith("-"):
                return None
            value = args[i]
        given.setdefault(spec.dest, []).append(value)
        i += 1
    return given


def _from_environ(spec: Opt, environ: Mapping[str, str]) -> list[str] | None:
    text = environ.get(spec.envvar) if spec.envvar else None
    if not text:
        return None
    if spec.is_flag:
        return [text]
    return text.split() if spec.multiple else [text]


def _convert(spec: Opt, text: str) -> Any:
    """Return the value as click converts it, or None when click would refuse it."""
    if spec.is_flag:
        word = text.strip().lower()
        return True if word in TRUE else False if word in FALSE else None
    if spec.kind == "path":
        return text  # a path as text: a no-op restore loads no pathlib (click gives a Path)
    if spec.bound is not None:
        return spec.bound.read(text)  # None: click refuses it, stating the range
    return text


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
    node_link: str,
    from_dir: StrPath | None,
    insecure: bool,
    mirrors: Sequence[str],
    hosts_dir: StrPath | None,
    registries_conf: StrPath | None,
    target: StrPath,
    families: Sequence[str],
    gpu_arch: str | None,
    image_digest: str | None,
    workload: Sequence[str],
    overrides: Sequence[str],
    software_from: str | None,
    verify_keys: Sequence[str],
    env_file: StrPath | None,
    consumer_user: str | None,
    require: bool,
    dry_run: bool,
    max_bytes: int | None,
    lock_timeout: float | None,
    metrics_file: StrPath | None,
    as_json: bool,
    predict: bool = False,
    require_hit: bool = False,
    **pod: Any,
) -> None:
    """Restore the matching caches into ``target``; exit with the outcome's code.

    ``pod``: what ``--predict`` (or ``--require-hit``, which implies it) is
    given of the pod (:func:`artifactd.restore.predict.pod_inputs`).
    """
    from artifactd.fingerprint.probe import start_request

    # The probe's subprocesses and NVML run while the restore modules import.
    pending = start_request(
        gpu_arch=gpu_arch, image_digest=image_digest, workload=workload, overrides=overrides
    )
    from artifactd.restore.policy import RestoreRequest, run_restore

    request = RestoreRequest(
        store=store,
        from_dir=from_dir,
        node_store=node_store,
        node_link=node_link,
        software_from=software_from,
        target=target,
        families=family_names(families),
        consumer_user=consumer_user,
        env_file=env_file,
        require=require,
        dry_run=dry_run,
        insecure=insecure,
        mirrors=tuple(mirrors),
        hosts_dir=hosts_dir,
        registries_conf=registries_conf,
        max_bytes=max_bytes,
        lock_timeout=lock_timeout,
        verify_keys=tuple(verify_keys),
        predict=_predict_options(pod, require_hit) if predict or require_hit else None,
    )
    # Plain data again: a no-op restore (warm volume, marker matches) answers
    # without building a single pydantic model. One that installs builds a few
    # (reading the artifact, reporting it), without pydantic's plugin scan.
    events = render.event_printer(as_json)
    if request.predict is not None and not as_json:
        events = _printing_predictions(events)
    with C.pydantic_plugins_off():
        outcome = run_restore(request, pending.result(), on_event=events)
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


def _predict_options(pod: Mapping[str, Any], require_hit: bool) -> PredictOptions:
    """``restore --predict``'s inputs, read as ``predict`` reads them (one reader)."""
    from artifactd.fsutil import as_path
    from artifactd.restore.predict import PredictOptions, pod_inputs

    paths = {spec.dest for spec in COMMANDS["restore"] if spec.kind == "path"}
    pod = {k: as_path(v) if k in paths and v is not None else v for k, v in pod.items()}
    return PredictOptions(pod_inputs(environ=C.current_environ(), **pod), require_hit=require_hit)


def _printing_predictions(events: EventSink) -> EventSink:
    """Print the prediction the moment it is made (before any download), then pass events on."""

    def show(event: dict[str, Any]) -> None:
        if event.get("stage") == "predict" and event.get("event") == "predicted":
            render.prediction_event(event)
        events(event)

    return show


def _write_metrics(path: StrPath, outcome: RestoreOutcome) -> None:
    """Write the restore's metrics; a failure to is reported, never fatal to the restore."""
    from artifactd.fsutil import as_path
    from artifactd.pod.metrics import restore_registry, write_textfile

    warning = write_textfile(as_path(path), restore_registry(outcome))
    if warning is not None:
        render.echo(warning, err=True)
