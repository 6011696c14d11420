"""The restore completion marker: ``<target>/.artifactd/restored.json``.

Written last, after every directory is in place; a restore whose marker already
records the planned manifests does nothing. These models define (and document,
through the JSON Schema) what is written; :mod:`artifactd.restore` reads the
file as plain JSON so that a no-op restore never imports pydantic.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class FamilyMarker(BaseModel):
    """Marker record of one installed family."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)
    artifact: str
    tag: str
    source: Literal["full", "family"]
    layer: str
    scope_key: str
    dirs: dict[str, str]
    files: int
    bytes: int


class RestoreMarker(BaseModel):
    """``<target>/.artifactd/restored.json``: written last, after every rename."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)
    schema_version: Literal[1] = 1
    fingerprint_hash: str
    store: str
    match: Literal["full", "partial"]
    selected: list[str]
    missed: list[str]
    families: dict[str, FamilyMarker]
    restored_at: float
    env: dict[str, str]
