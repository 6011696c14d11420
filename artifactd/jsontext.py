"""JSON text in and out, as the ``json`` package writes and reads it, without importing it.

Why this module exists: ``import json`` compiles the package's regular
expressions, and so imports ``re`` and ``enum``: about 31 million instructions,
most of a bare Python start (36 million), at every pod start. The package's
own work is done by its C accelerator, ``_json``, which needs none of that:
``json.dumps`` with no indent calls ``_json.make_encoder`` with the encoder's
settings, and ``json.loads`` calls ``_json.make_scanner`` with the decoder's.
This module makes the same two calls with the same settings, so its output is
the ``json`` package's byte for byte (``tests/test_jsontext.py`` compares the
two on generated documents on every Python the suite runs). Where ``_json``
is missing (an interpreter built without it), the ``json`` package does the work.

What it serves: :func:`json_type` (a value's JSON type, for messages),
:func:`dumps` (``json.dumps`` with ``sort_keys``,
``ensure_ascii``, ``allow_nan``, the compact separators and ``indent`` as
arguments; no ``default``; an indented document is laid out here, as
``json``'s own Python encoder lays it out, around ``_json``'s text of each
string and number) and :func:`loads` (``json.loads`` of text or bytes:
the same values, and a :class:`ValueError` for what ``json`` refuses, with
its message where ``_json`` raises it; bytes in UTF-16 or UTF-32 are handed
to ``json``).
Nothing here imports more than ``_json``: :mod:`artifactd.cli.fast` names
this module among the first a pod start loads.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

try:
    import _json
except ImportError:  # pragma: no cover - an interpreter built without the accelerator
    _json = None  # type: ignore[assignment]

#: What ``json`` reads for ``NaN`` and the infinities (it accepts them; so does this).
_CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}
#: The whitespace JSON allows around a document (``json.decoder.WHITESPACE``).
_SPACE = " \t\n\r"
#: First bytes of bytes that ``json`` does not read as plain UTF-8: UTF-16 and UTF-32
#: (a NUL byte first or second), or a byte order mark (UTF-8's starts with 0xEF).
_OTHER_ENCODING = (b"\x00", b"\xef", b"\xfe", b"\xff")


def _unserializable(value: object) -> object:
    """``json.JSONEncoder.default``: refuse what JSON has no form for, as ``json`` does."""
    raise TypeError(f"Object of type {value.__class__.__name__} is not JSON serializable")


def dumps(
    value: Any,
    *,
    sort_keys: bool = False,
    compact: bool = False,
    ensure_ascii: bool = True,
    allow_nan: bool = True,
    indent: int | None = None,
) -> str:
    """Return ``json.dumps(value, ...)`` with these settings (``compact``: ``(",", ":")``).

    ``indent``: spaces per level, as ``json.dumps(indent=...)`` (its separators
    are then ``","`` and ``": "``, unless ``compact``).
    """
    if _json is None:  # pragma: no cover - see the module docstring
        import json  # noqa: PLC0415  # lazy: no accelerator, so json's own code

        separators = (",", ":") if compact else None
        return json.dumps(
            value,
            sort_keys=sort_keys,
            separators=separators,
            ensure_ascii=ensure_ascii,
            allow_nan=allow_nan,
            indent=indent,
        )
    if indent is not None:
        out: list[str] = []
        _Indented(indent, ":" if compact else ": ", sort_keys, ensure_ascii, allow_nan).encode(
            value, 0, out
        )
        return "".join(out)
    encode_string = _json.encode_basestring_ascii if ensure_ascii else _json.encode_basestring
    if isinstance(value, str):
        return str(encode_string(value))  # what json.JSONEncoder.encode does for a string
    encoder = _json.make_encoder(
        {},  # markers: circular references raise ValueError, as json's check_circular
        _unserializable,
        encode_string,
        None,  # indent
        ":" if compact else ": ",
        "," if compact else ", ",
        sort_keys,
        False,  # skipkeys
        allow_nan,
    )
    return "".join(encoder(value, 0))


class _Indented:
    """``json``'s Python encoder with an indent: containers laid out here, the rest by ``_json``."""

    def __init__(
        self, indent: int, colon: str, sort_keys: bool, ensure_ascii: bool, allow_nan: bool
    ) -> None:
        self.indent = " " * indent
        self.colon = colon
        self.sort_keys = sort_keys
        self.ensure_ascii = ensure_ascii
        self.allow_nan = allow_nan
        self.markers: set[int] = set()  # containers being written: a second visit is a cycle

    def scalar(self, value: Any) -> str:
        """Write a string, number, boolean or null as ``json`` does (TypeError for the rest)."""
        return dumps(value, ensure_ascii=self.ensure_ascii, allow_nan=self.allow_nan)

    def key(self, key: Any) -> str:
        """Write an object key: text, or a number, boolean or null as text (as ``json`` does)."""
        if isinstance(key, str):
            return self.scalar(key)
        if key is None or isinstance(key, (bool, int, float)):
            return self.scalar(self.scalar(key))
        raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")

    def encode(self, value: Any, level: int, out: list[str]) -> None:
        if isinstance(value, (list, tuple)):
            items: Any = value
            opening, closing = "[", "]"
        elif isinstance(value, dict):
            items = sorted(value.items()) if self.sort_keys else value.items()
            opening, closing = "{", "}"
        else:
            out.append(self.scalar(value))
            return
        if not value:
            out.append(opening + closing)
            return
        if id(value) in self.markers:
            raise ValueError("Circular reference detected")
        self.markers.add(id(value))
        inner = "\n" + self.indent * (level + 1)
        out.append(opening)
        for i, item in enumerate(items):
            out.append(inner if i == 0 else "," + inner)
            if opening == "{":
                out.append(self.key(item[0]) + self.colon)
            self.encode(item[1] if opening == "{" else item, level + 1, out)
        out.append("\n" + self.indent * level + closing)
        self.markers.discard(id(value))


class _Reading:
    """The settings ``_json.make_scanner`` reads: ``json.JSONDecoder()``'s defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = _CONSTANTS.__getitem__


# typeshed names json's decoder as the argument; any object with its settings will do
_SCANNER = _json.make_scanner(_Reading()) if _json is not None else None  # type: ignore[arg-type]


def loads(text: str | bytes) -> Any:
    """Return ``json.loads(text)``: the document's value; :class:`ValueError` when it is not JSON.

    Bytes are decoded as ``json`` decodes them: UTF-8 (a byte order mark
    skipped, surrogates let through); bytes in UTF-16 or UTF-32 go to ``json``.
    """
    if isinstance(text, bytes):
        if text[:1] in _OTHER_ENCODING or text[1:2] == b"\x00":
            import json  # noqa: PLC0415  # json detects the encoding (rare: never ours)

            return json.loads(text)
        text = text.decode("utf-8", "surrogatepass")
    elif text.startswith("\ufeff"):
        raise ValueError("Unexpected UTF-8 BOM (decode using utf-8-sig)")
    if _SCANNER is None:  # pragma: no cover - see the module docstring
        import json  # noqa: PLC0415  # lazy: no accelerator, so json's own code

        return json.loads(text)
    start = len(text) - len(text.lstrip(_SPACE))
    try:
        value, end = _SCANNER(text, start)
    except StopIteration as exc:  # where a value was due: json reports it so too
        raise ValueError(f"Expecting value: char {exc.value}") from None
    if end != len(text) and text[end:].lstrip(_SPACE):
        raise ValueError(f"Extra data: char {end}")
    return value


def json_type(value: Any) -> str:
    """Name ``value``'s JSON type, for messages: object, array, string, number, boolean, null."""
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    return "null" if value is None else "number"
