"""The state documents' shapes, as data, are their typed dictionaries' fields and types.

:mod:`artifactd.restore.marker` checks the marker and the journal against
shapes written as data (a no-op restore imports no ``typing``), while type
checkers, the code that builds a marker and the JSON Schemas read the typed
dictionaries. Here each shape is derived from its class (field names in
order, each type, which keys may be left out) and must equal the data; and
:func:`load` is run on documents each changed in one way, to show the checks
bite.
"""

from __future__ import annotations

import json
import types
import typing
from typing import Any, Literal, get_args, get_origin, is_typeddict

import pytest

from artifactd.restore import journal, markertypes
from artifactd.restore.marker import FAMILY_MARKER, RESTORE_MARKER, MarkerFormatError, load


def _form(tp: Any) -> Any:  # noqa: PLR0911 - one branch per type form
    """The shape's spelling of a type annotation."""
    origin = get_origin(tp)
    if isinstance(tp, type) and is_typeddict(tp):
        return ("doc", _shape(tp))
    if origin is Literal:
        return ("literal", get_args(tp))
    if origin is list:
        return ("list", _form(get_args(tp)[0]))
    if origin is dict:
        return ("dict", _form(get_args(tp)[1]))
    if origin in (typing.Union, types.UnionType):
        return ("union", tuple(_form(t) for t in get_args(tp)))
    if tp is type(None):
        return "null"
    return {int: "int", str: "str", bool: "bool", float: "float"}[tp]


def _shape(cls: Any) -> Any:
    hints = typing.get_type_hints(cls)
    optional = cls.__optional_keys__
    return (cls.__name__, {name: (_form(tp), name not in optional) for name, tp in hints.items()})


@pytest.mark.parametrize(
    ("shape", "cls"),
    [
        (FAMILY_MARKER, markertypes.FamilyMarker),
        (RESTORE_MARKER, markertypes.RestoreMarker),
        (journal.JOURNAL_ENTRY, journal.JournalEntry),
        (journal.RESTORE_JOURNAL, journal.RestoreJournal),
    ],
)
def test_each_shape_is_its_typed_dict(shape: Any, cls: Any) -> None:
    assert shape == _shape(cls)
    assert list(shape[1].items()) == list(_shape(cls)[1].items())  # the same order too


_FAMILY = {
    "artifact": "sha256:" + "a" * 64,
    "tag": "fp-x",
    "source": "full",
    "layer": "sha256:" + "b" * 64,
    "scope_key": "k",
    "dirs": {"triton": "/cache/triton"},
    "files": 3,
    "bytes": 10,
}
_MARKER = {
    "schema_version": 1,
    "fingerprint_hash": "h",
    "store": "oci:/s",
    "match": "full",
    "selected": ["triton"],
    "missed": [],
    "families": {"triton": _FAMILY},
    "restored_at": 5,
    "env": {"TRITON_CACHE_DIR": "/cache/triton"},
}


def test_a_sound_marker_loads_with_its_numbers_read_as_declared() -> None:
    doc = load(RESTORE_MARKER, json.dumps(_MARKER).encode())
    assert doc == {**_MARKER, "restored_at": 5.0}
    assert isinstance(doc["restored_at"], float)
    assert (
        load(RESTORE_MARKER, json.dumps({**_MARKER, "restore_seconds": 1}).encode())[
            "restore_seconds"
        ]
        == 1.0
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"schema_version": 2}, "schema_version: 2 is not one of"),
        ({"schema_version": True}, "schema_version: True is not one of"),
        ({"selected": "triton"}, "selected: expected a list"),
        ({"restored_at": True}, "restored_at: expected a number"),
        ({"env": {"A": 1}}, "env.A: expected str"),
        ({"extra": 1}, "unknown keys ['extra']"),
        ({"families": {"triton": {**_FAMILY, "files": True}}}, "triton.files: expected int"),
        ({"families": {"triton": {**_FAMILY, "source": "x"}}}, "source: 'x' is not one of"),
        ({"families": {"triton": {**_FAMILY, "signed_by": 3}}}, "signed_by: expected str"),
    ],
)
def test_each_wrong_field_is_refused(change: dict[str, Any], message: str) -> None:
    with pytest.raises(MarkerFormatError) as err:
        load(RESTORE_MARKER, json.dumps({**_MARKER, **change}).encode())
    assert message in str(err.value)


def test_missing_keys_and_non_documents_are_refused() -> None:
    for key in ("store", "families"):
        doc = {k: v for k, v in _MARKER.items() if k != key}
        with pytest.raises(MarkerFormatError, match=f"missing {key}"):
            load(RESTORE_MARKER, json.dumps(doc).encode())
    for data in (b"[]", b"not json", b"\xff"):
        with pytest.raises(MarkerFormatError):
            load(RESTORE_MARKER, data)
