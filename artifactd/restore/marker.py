"""The restore marker, and how restore's state documents are read and written.

``<target>/.artifactd/restored.json`` (:class:`RestoreMarker`) says what is
installed: written last, after every directory is in place, and the commit
point of a restore. Its companion, the journal of an install in progress,
lives in :mod:`artifactd.restore.journal` (only an install or a repair needs it).

The marker (:class:`RestoreMarker`) and the journal are typed dictionaries,
read back through :func:`load`, which checks every field against its
annotation, and written by :func:`dump`. A restore reads and writes them
without importing pydantic or even :mod:`dataclasses` (the init container's
fast path). Their JSON Schemas are generated from these classes
(``registry-schema/``).
"""

from __future__ import annotations

import json
import sys
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypedDict, TypeVar, get_args, get_origin, is_typeddict

SCHEMA_VERSION = 1

#: Pydantic reads this when it generates the JSON Schema: unknown keys are refused.
STRICT = {"extra": "forbid"}


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


class MarkerFormatError(ValueError):
    """A state document does not have the shape its class declares."""


T = TypeVar("T")


def load(cls: type[T], data: bytes) -> T:
    """Parse ``data`` as JSON and build ``cls`` from it, checking every field's type.

    Raises :class:`MarkerFormatError` on invalid JSON, missing or unknown keys,
    and values of the wrong type (``bool`` is not accepted for ``int``).
    """
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MarkerFormatError(f"not JSON: {exc}") from None
    return _build(cls, doc, cls.__name__)


def dump(obj: Mapping[str, Any]) -> bytes:
    """Serialise a state document (stable key order, so equal documents are equal bytes)."""
    return json.dumps(obj, indent=2, sort_keys=True).encode()


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    # Evaluating string annotations is the slow part of a load: once per class.
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))
    return hints


def _keys(cls: type) -> tuple[set[str], set[str]]:
    """(every key, the keys that may be left out) of a typed dict."""
    return set(cls.__required_keys__) | set(cls.__optional_keys__), set(cls.__optional_keys__)  # type: ignore[attr-defined]


def _build(cls: type[T], doc: Any, where: str) -> T:
    if not isinstance(doc, dict):
        raise MarkerFormatError(f"{where}: expected an object")
    hints = _hints(cls)
    names, optional = _keys(cls)
    unknown = set(doc) - names
    if unknown:
        raise MarkerFormatError(f"{where}: unknown keys {sorted(unknown)}")
    values = {}
    for name in hints:
        if name not in names:
            continue  # a class variable
        if name not in doc:
            if name not in optional:
                raise MarkerFormatError(f"{where}: missing {name}")
            continue
        values[name] = _check(hints[name], doc[name], f"{where}.{name}")
    return cls(**values)


def _is_document(tp: Any) -> bool:
    return isinstance(tp, type) and is_typeddict(tp)


def _check(tp: Any, value: Any, where: str) -> Any:  # noqa: PLR0911, PLR0912 - one branch per type form
    origin = get_origin(tp)
    if _is_document(tp):
        return _build(tp, value, where)
    if origin is Literal:
        if value not in get_args(tp) or isinstance(value, bool):
            raise MarkerFormatError(f"{where}: {value!r} is not one of {get_args(tp)}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise MarkerFormatError(f"{where}: expected a list")
        (item,) = get_args(tp)
        return [_check(item, v, f"{where}[]") for v in value]
    if origin is dict:
        if not isinstance(value, dict):
            raise MarkerFormatError(f"{where}: expected an object")
        _, item = get_args(tp)
        return {k: _check(item, v, f"{where}.{k}") for k, v in value.items()}
    if origin in (typing.Union, types.UnionType):
        for option in get_args(tp):
            try:
                return _check(option, value, where)
            except MarkerFormatError:
                continue
        raise MarkerFormatError(f"{where}: {value!r} does not match {tp}")
    if tp is type(None):
        if value is not None:
            raise MarkerFormatError(f"{where}: expected null")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise MarkerFormatError(f"{where}: expected a number")
        return float(value)
    if tp in (int, str, bool):
        if isinstance(value, bool) is not (tp is bool) or not isinstance(value, tp):
            raise MarkerFormatError(f"{where}: expected {tp.__name__}")
        return value
    raise MarkerFormatError(f"{where}: unsupported type {tp}")  # pragma: no cover
