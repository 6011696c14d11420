"""The restore marker, and how restore's state documents are read and written.

``<target>/.artifactd/restored.json`` says what is installed: written last,
after every directory is in place, and the commit point of a restore. Its
companion, the journal of an install in progress, lives in
:mod:`artifactd.restore.journal` (only an install or a repair needs it).

Both are JSON objects read back through :func:`load`, which checks every field
against the document's shape, and written by :func:`dump`. A shape is data
(:data:`RESTORE_MARKER`, :data:`FAMILY_MARKER`, the journal's in its module):
each field's type and whether it may be left out. A no-op restore reads the
marker at every pod start, so this module imports neither pydantic nor
``typing``; the typed dictionaries type checkers and the JSON Schemas
(``registry-schema/``) read are :mod:`artifactd.restore.markertypes`' and
the journal's, and ``tests/test_marker.py`` holds each shape to its class.

A type is one of ``"str"``, ``"int"``, ``"float"``, ``"bool"``, ``"null"``,
or a tuple: ``("literal", values)``, ``("list", type)``, ``("dict", type)``
(string keys), ``("doc", shape)``, ``("union", types)``. ``bool`` is no
``int`` (nor a number), and an ``int`` is read as a ``float`` where one is due.
"""

from __future__ import annotations

from artifactd.jsontext import dumps, loads

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, TypeAlias

    Form: TypeAlias = "str | tuple[Any, ...]"
    #: (the document's name, for messages; each field: (its type, required)).
    Shape: TypeAlias = "tuple[str, dict[str, tuple[Form, bool]]]"

SCHEMA_VERSION = 1

#: Pydantic reads this when it generates the JSON Schema: unknown keys are refused.
STRICT = {"extra": "forbid"}

FAMILY_MARKER: Shape = (
    "FamilyMarker",
    {
        # The key id that verified the family's manifest (restores with --verify-key).
        "signed_by": ("str", False),
        "artifact": ("str", True),
        "tag": ("str", True),
        "source": (("literal", ("full", "family")), True),
        "layer": ("str", True),
        "scope_key": ("str", True),
        "dirs": (("dict", "str"), True),
        "files": ("int", True),
        "bytes": ("int", True),
    },
)
#: ``<target>/.artifactd/restored.json``: what is installed, written after every swap.
RESTORE_MARKER: Shape = (
    "RestoreMarker",
    {
        # Seconds the restore took to verify and fetch; absent from older markers.
        "restore_seconds": ("float", False),
        "schema_version": (("literal", (1,)), True),
        "fingerprint_hash": ("str", True),
        "store": ("str", True),
        "match": (("literal", ("full", "partial")), True),
        "selected": (("list", "str"), True),
        "missed": (("list", "str"), True),
        "families": (("dict", ("doc", FAMILY_MARKER)), True),
        "restored_at": ("float", True),
        "env": (("dict", "str"), True),
    },
)


class MarkerFormatError(ValueError):
    """A state document does not have the shape its class declares."""


def load(shape: Shape, data: bytes) -> Any:
    """Parse ``data`` as JSON and check it against ``shape``; return the document.

    Raises :class:`MarkerFormatError` on invalid JSON, missing or unknown keys,
    and values of the wrong type (``bool`` is not accepted for ``int``).
    """
    try:
        doc = loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MarkerFormatError(f"not JSON: {exc}") from None
    return _build(shape, doc, shape[0])


def dump(obj: Mapping[str, Any]) -> bytes:
    """Serialise a state document (stable key order, so equal documents are equal bytes).

    Indented, as always written (``json.dumps(obj, indent=2, sort_keys=True)``).
    """
    return dumps(obj, indent=2, sort_keys=True).encode()


def _build(shape: Shape, doc: Any, where: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise MarkerFormatError(f"{where}: expected an object")
    fields = shape[1]
    unknown = set(doc) - set(fields)
    if unknown:
        raise MarkerFormatError(f"{where}: unknown keys {sorted(unknown)}")
    values = {}
    for name, (form, required) in fields.items():
        if name not in doc:
            if required:
                raise MarkerFormatError(f"{where}: missing {name}")
            continue
        values[name] = _check(form, doc[name], f"{where}.{name}")
    return values


_SCALARS = {"int": int, "str": str, "bool": bool}


def _check(form: Form, value: Any, where: str) -> Any:  # noqa: PLR0911, PLR0912 - a branch per form
    if isinstance(form, str):
        if form == "float":
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise MarkerFormatError(f"{where}: expected a number")
            return float(value)
        if form == "null":
            if value is not None:
                raise MarkerFormatError(f"{where}: expected null")
            return value
        tp = _SCALARS[form]
        if isinstance(value, bool) is not (tp is bool) or not isinstance(value, tp):
            raise MarkerFormatError(f"{where}: expected {form}")
        return value
    kind, arg = form
    if kind == "doc":
        return _build(arg, value, where)
    if kind == "literal":
        if value not in arg or isinstance(value, bool):
            raise MarkerFormatError(f"{where}: {value!r} is not one of {arg}")
        return value
    if kind == "list":
        if not isinstance(value, list):
            raise MarkerFormatError(f"{where}: expected a list")
        return [_check(arg, v, f"{where}[]") for v in value]
    if kind == "dict":
        if not isinstance(value, dict):
            raise MarkerFormatError(f"{where}: expected an object")
        return {k: _check(arg, v, f"{where}.{k}") for k, v in value.items()}
    for option in arg:  # a union: the first type that takes the value
        try:
            return _check(option, value, where)
        except MarkerFormatError:
            continue
    raise MarkerFormatError(f"{where}: {value!r} does not match {arg}")
