"""The restore marker as typed dictionaries: for type checkers and its JSON Schema.

``<target>/.artifactd/restored.json`` is read and written by
:mod:`artifactd.restore.marker`, which checks it against its shape, stated there as
data (a no-op restore imports no ``typing``). The typed dictionaries here are
the same document for mypy, for the code that builds a marker (an install) and
for ``registry-schema/`` (pydantic reads them); ``tests/test_marker.py`` holds
the shapes and these classes to the same fields, types and optional keys.
"""

from __future__ import annotations

from typing import Literal, TypedDict

from artifactd.restore.marker import STRICT


class _FamilyMarkerOptional(TypedDict, total=False):
    #: The key id that verified the family's manifest (restores with --verify-key).
    signed_by: str


class FamilyMarker(_FamilyMarkerOptional):
    """Marker record of one installed family."""

    artifact: str
    tag: str
    source: Literal["full", "family"]
    layer: str
    scope_key: str
    dirs: dict[str, str]
    files: int
    bytes: int


class _RestoreMarkerOptional(TypedDict, total=False):
    #: Seconds the restore took to verify and fetch (the engine start's ``restore``
    #: phase, :mod:`artifactd.pod.phases`); absent from markers older than it.
    restore_seconds: float


class RestoreMarker(_RestoreMarkerOptional):
    """``<target>/.artifactd/restored.json``: what is installed, written after every swap."""

    schema_version: Literal[1]
    fingerprint_hash: str
    store: str
    match: Literal["full", "partial"]
    selected: list[str]
    missed: list[str]
    families: dict[str, FamilyMarker]
    restored_at: float
    env: dict[str, str]


# A typed dict's body holds only keys; pydantic reads its config from here.
FamilyMarker.__pydantic_config__ = STRICT  # type: ignore[attr-defined]
RestoreMarker.__pydantic_config__ = STRICT  # type: ignore[attr-defined]
