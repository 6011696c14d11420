"""registry-schema/ is generated from the models: fail when it is stale, and use it."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from artifactd.families import scope_table
from artifactd.fingerprint.probe import probe_fingerprint
from artifactd.schemas import render_schemas

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "registry-schema"


@pytest.mark.parametrize("name", sorted(render_schemas()))
def test_committed_schema_is_current(name: str) -> None:
    committed = SCHEMA_DIR / name
    assert committed.is_file(), f"{committed} is missing: run `artifactd schema`"
    assert committed.read_text() == render_schemas()[name], (
        f"{committed} is stale: run `artifactd schema --out registry-schema` and commit"
    )


def test_no_unknown_schema_files() -> None:
    on_disk = {p.name for p in SCHEMA_DIR.glob("*.schema.json")}
    assert on_disk == set(render_schemas())


def test_probed_fingerprint_validates_against_the_committed_schema() -> None:
    schema = json.loads((SCHEMA_DIR / "fingerprint.schema.json").read_text())
    doc = probe_fingerprint(gpu_arch="sm_90a", use_nvml=False).model_dump(mode="json")
    jsonschema.validate(doc, schema)
    doc["gpu"]["unexpected"] = 1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, schema)


def test_the_docs_scope_table_is_the_codes() -> None:
    page = (SCHEMA_DIR.parent / "docs" / "reference" / "fingerprint.md").read_text()
    assert scope_table() in page, "the docs' scope table is stale: paste scope_table()"
