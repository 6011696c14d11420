"""JSON Schemas of every document artifactd writes, generated from the models.

``registry-schema/*.schema.json`` is produced by :func:`write_schemas`
(``artifactd schema --out registry-schema``); a test fails when the committed
files are stale.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import TypeAdapter

from artifactd.fingerprint import Fingerprint
from artifactd.journal import RestoreJournal
from artifactd.manifest import ArtifactConfig
from artifactd.marker import RestoreMarker
from artifactd.matrix import Matrix

SCHEMA_BASE = "https://artifactd.dev/schema/"

#: Pydantic models, and the plain dataclasses of the restore state documents.
DOCUMENTS: dict[str, type] = {
    "artifact-config": ArtifactConfig,
    "fingerprint": Fingerprint,
    "restore-journal": RestoreJournal,
    "restore-marker": RestoreMarker,
    "warmup-matrix": Matrix,
}


def render_schemas() -> dict[str, str]:
    """Return ``{file name: JSON text}`` for every document schema."""
    out = {}
    for name, model in DOCUMENTS.items():
        schema = TypeAdapter(model).json_schema()
        schema = {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": f"{SCHEMA_BASE}{name}.v1.json",
            **schema,
        }
        out[f"{name}.schema.json"] = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    return out


def write_schemas(directory: Path) -> list[Path]:
    """Write every schema into ``directory``; return the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render_schemas().items():
        path = directory / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
