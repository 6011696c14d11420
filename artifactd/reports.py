"""The JSON documents the command line prints with ``--json``.

Each command's ``--json`` output is one of the reports below, built here from
the library's typed results so that scripts (a CI stage, an init-container
wrapper, a readiness probe) read one stable shape that tests can reach without
the command line. Every document carries ``schema_version``: a change that
removes, renames or retypes a key raises :data:`REPORT_SCHEMA_VERSION`; adding a
key does not.

Rendering rules, shared by every report: dataclasses become objects of their
``repr`` fields, named tuples objects of their fields but those they name in
``json_hidden``, pydantic models their JSON dump, paths strings, tuples lists.
Keys are printed sorted. ``restore --json`` is a pod start: a value is known
to be a dataclass by its class's ``__dataclass_fields__``, so a report of named
tuples never loads :mod:`dataclasses` (with :mod:`inspect`, milliseconds).
"""

from __future__ import annotations

import os
from _collections_abc import Mapping  # collections.abc's own: importing it loads collections

TYPE_CHECKING = False

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path
    from typing import Any

    from artifactd.build.demo import DemoResult
    from artifactd.build.shapes import Shapes
    from artifactd.fingerprint.diff import FactDiff, FingerprintDiff, Side
    from artifactd.format.views import LayerView
    from artifactd.lint import LintReport
    from artifactd.restore.policy import RestoreOutcome
    from artifactd.restore.predict import Prediction
    from artifactd.restore.resolve import RestorePlan
    from artifactd.stores.artifacts import Artifact
    from artifactd.trust.inspection import TrustReport

#: Version of every ``--json`` document (the ``schema_version`` key).
REPORT_SCHEMA_VERSION = 1
#: The most files a ``restore --json`` report lists per layer; the rest are counted
#: (``files_omitted``). A Triton or vLLM cache of tens of thousands of files made a
#: report of megabytes that cost a restore from the node store a tenth of its time.
REPORT_MAX_FILES = 1000


#: Values that are JSON already: returned as they are, before any other test (a restore's
#: report holds thousands of them, and each test of the kinds below is an attribute lookup).
_PLAIN_JSON = frozenset({str, int, float, bool, type(None)})


def jsonable(value: Any) -> Any:  # noqa: PLR0911 - one return per kind of value
    """Turn library results (dataclasses, named tuples, models, paths) into plain JSON data."""
    if type(value) in _PLAIN_JSON:
        return value
    if hasattr(type(value), "__dataclass_fields__"):
        import dataclasses  # noqa: PLC0415  # loaded already: ``value`` is a dataclass

        return {
            f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value) if f.repr
        }
    if hasattr(value, "_asdict"):  # named tuples, and records that read like one
        hidden = getattr(value, "json_hidden", ())
        return {k: jsonable(v) for k, v in value._asdict().items() if k not in hidden}
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if hasattr(value, "json_document"):  # a document the light reader read (artifactd.format.light)
        return value.json_document()
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


def versioned(body: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``body`` as plain data with ``schema_version`` added."""
    return {"schema_version": REPORT_SCHEMA_VERSION, **jsonable(dict(body))}


def result_report(result: Any) -> dict[str, Any]:
    """Return the document of a command that prints a library result as it is.

    ``harvest`` (:class:`~artifactd.build.harvest.HarvestResult`), ``build``
    (:class:`~artifactd.build.run.BuildResult`) and ``copy``
    (:class:`~artifactd.stores.artifacts.CopyResult`): their fields, plus ``schema_version``.
    """
    return {"schema_version": REPORT_SCHEMA_VERSION, **jsonable(result)}


def fingerprint_report(raw: Mapping[str, Any], digest: str) -> dict[str, Any]:
    """``fingerprint --json``: ``hash`` and the probed ``fingerprint`` document."""
    return versioned({"hash": digest, "fingerprint": raw})


def restore_report(outcome: RestoreOutcome) -> dict[str, Any]:
    """``restore --json``: the status, the plan, the failure class and the exit code.

    ``restored``, ``files``, ``bytes``, ``elapsed_ms``, ``recovered``, ``phases``
    (seconds per phase) and ``bytes_fetched`` are present only when an install
    ran; ``node_store`` (what the node store held and fetched) only with one;
    ``prediction`` (:func:`predict_report`) only with ``--predict``.
    """
    plan, result, failure = outcome.plan, outcome.result, outcome.failure
    doc: dict[str, Any] = {
        "stage": "restore",
        "status": outcome.status,
        "cache_hit": outcome.cache_hit,
        "match": plan.match,
        "dry_run": outcome.status == "dry_run",
        "noop": plan.noop,
        "plan": _plan_document(plan),
        "bytes_to_fetch": plan.bytes_to_fetch,
        "error": failure.message if failure else plan.error,
        "failure": None
        if failure is None
        else {
            "kind": failure.kind,
            "message": failure.message,
            "hint": failure.hint,
            "exit_code": failure.exit_code,
            # Why a manifest was not trusted: unsigned, wrong_digest, unknown_key, malformed.
            **({"reason": r} if (r := getattr(failure.error, "reason", None)) else {}),
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
            phases=dict(result.phases),
            bytes_fetched=result.bytes_fetched,
        )
    if outcome.node is not None:
        doc["node_store"] = outcome.node
    if outcome.prediction is not None:
        doc["prediction"] = predict_report(outcome.prediction)
    return versioned(doc)


def _plan_document(plan: RestorePlan) -> dict[str, Any]:
    """Render a restore plan as :func:`jsonable` does, each layer's files capped."""
    doc: dict[str, Any] = jsonable(plan._replace(families=()))
    doc["families"] = [
        {**jsonable(fp._replace(layer=None)), "layer": layer_document(fp.layer)}
        for fp in plan.families
    ]
    return doc


def layer_document(layer: LayerView | None) -> dict[str, Any] | None:
    """Render a layer record as :func:`jsonable` does, with at most :data:`REPORT_MAX_FILES` files.

    A longer record lists its first files and counts the rest under
    ``files_omitted``. Either reader's record (a model or a light document:
    both copy with ``model_copy``) renders the same.
    """
    if layer is None:
        return None
    files = layer.files
    if len(files) <= REPORT_MAX_FILES:
        return jsonable(layer)  # type: ignore[no-any-return]
    head = layer.model_copy(update={"files": list(files[:REPORT_MAX_FILES])})  # type: ignore[attr-defined]
    doc: dict[str, Any] = jsonable(head)
    doc["files_omitted"] = len(files) - REPORT_MAX_FILES
    return doc


def diff_report(
    a: Side, b: Side, result: FingerprintDiff, facts: Sequence[FactDiff]
) -> dict[str, Any]:
    """``diff --json``: both sides' names and hashes, differing fields, verdicts, facts."""
    return versioned(
        {
            "a": a.name,
            "b": b.name,
            "identical": result.identical,
            "a_hash": result.a_hash,
            "b_hash": result.b_hash,
            "fields": result.fields,
            "informational": result.informational,
            "families": result.families,
            "facts": list(facts),
        }
    )


def inspect_report(art: Artifact, trust: TrustReport | None = None) -> dict[str, Any]:
    """``inspect --json``: the manifest digest, the manifest, the artifact config and ``trust``.

    ``trust``: the signatures and attestations (``verified_by`` and ``error``
    only mean something when ``keys`` were given).
    """
    doc: dict[str, Any] = {
        "digest": art.digest,
        "manifest": art.manifest.model_dump(by_alias=True, exclude_none=True, mode="json"),
        "config": art.config,
    }
    if trust is not None:
        doc["trust"] = jsonable(trust)
    return versioned(doc)


def tags_report(store: str, tags: Sequence[str]) -> dict[str, Any]:
    """``ls --json``: the store and its tags."""
    return versioned({"store": store, "tags": list(tags)})


def demo_report(result: DemoResult) -> dict[str, Any]:
    """``demo --json``: the timings of the three stages and what each compiled."""
    return versioned(
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
            "restore_command": result.restore_command,
            "kept": result.kept,
        }
    )


def lint_report(roots: Mapping[str, Path], report: LintReport) -> dict[str, Any]:
    """``lint --json``: the roots scanned, every finding and the counts."""
    return versioned(
        {
            "roots": {k: str(v) for k, v in roots.items()},
            "findings": report.findings,
            "files_scanned": report.files_scanned,
            "errors": report.errors,
            "warnings": report.warnings,
            "unreadable": report.unreadable,
        }
    )


def schemas_report(out: Path, written: Sequence[Path]) -> dict[str, Any]:
    """Return ``schema --json``: the directory and the JSON Schema files written into it."""
    return versioned({"out": str(out), "written": [str(p) for p in written]})


def shapes_report(result: Shapes, written: Path | None = None) -> dict[str, Any]:
    """``matrix shapes --json``: every figure, the metric it came from, the requests, notes.

    ``prompt_buckets`` are ``{lower, upper, count, tokens}`` (``upper`` null for
    the +Inf bucket); the ``*_covered`` keys are fractions of the observed
    requests (or steps); ``written`` is the matrix ``--write`` rewrote, or null.
    """
    return versioned({**jsonable(result), "written": str(written) if written else None})


def predict_report(result: Prediction) -> dict[str, Any]:
    """``predict --json``: the pod's ``outcome`` and, per entry, its outcome, line and checks."""
    return versioned(
        {
            "source": result.source,
            "outcome": result.outcome,
            "entries": [
                {
                    "family": e.family,
                    "entry": e.entry,
                    "outcome": e.outcome,
                    "recipe": e.recipe,
                    "line": e.line(),
                    "reason": e.reason,
                    "checks": [
                        {
                            "group": c.group,
                            "status": c.status,
                            "reason": c.reason,
                            "total": c.total,
                            "differences": [
                                {
                                    "key": d.key,
                                    "recorded": d.recorded,
                                    "pod": d.pod,
                                    "category": d.category,
                                }
                                for d in c.differences
                            ],
                        }
                        for c in e.checks
                    ],
                }
                for e in result.entries
            ],
            "notes": list(result.notes),
        }
    )
