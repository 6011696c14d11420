"""Read the restore's documents without pydantic, by the models' own rules.

Every pod start reads three documents: the OCI manifest, the artifact config
and the local fingerprint. Importing pydantic and building its models costs
several times a bare interpreter start, so a restore reads them here first:
:mod:`artifactd.format.shapes` holds the rules of the pydantic models
(:class:`~artifactd.format.config.ArtifactConfig`,
:class:`~artifactd.format.imagemanifest.ImageManifest`,
:class:`~artifactd.fingerprint.model.Fingerprint`) as data, generated from their
pydantic-core schemas by ``scripts/gen_shapes.py``, and :func:`read` runs them.

The models stay the one owner of the format. This reader is held to one
promise (``tests/test_light.py`` checks it on real documents and on every
hostile variant of them the test makes): **what it accepts, pydantic accepts,
with the same values** (:func:`to_json` equals the model's
``model_dump(mode="json")``). It is stricter where pydantic would convert: a
number written as a string, a whole float for an integer, an integer past 64
bits, an unpaired surrogate, a field given by its name where the model reads an
alias. Anything it does not accept (``None``), a caller hands to pydantic,
which accepts it with its conversions or raises the error a user sees. So a
document is read exactly as before, and only the documents artifactd writes
take the fast way.

A model checked after validation (the canaries' prompt records) is written
``pydantic`` in the shapes: an artifact carrying canaries is read by pydantic.

A config's list of file entries (one per file: tens of thousands) is read a
field at a time when it is long (:func:`_columns`): each field's rule runs
once over the list in the interpreter's own loops, and anything those checks
do not plainly accept goes back to the entry-by-entry check, which decides.
An 18,000-file list: 31 ms instead of 50.
"""

from __future__ import annotations

import math
import operator

from artifactd import __version__
from artifactd.fingerprint.key import Document, count_is_informational
from artifactd.format.shapes import SHAPES
from artifactd.format.views import without_empty_canaries
from artifactd.jsontext import loads

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any, ClassVar

    #: A compiled rule: returns the value read, or raises :class:`_RefusedError`.
    Check = Callable[[Any], Any]

__all__ = ["Doc", "fingerprint_of", "read", "to_json", "validate"]

#: Before-validators by the name the shapes give them: the models run the same functions.
HOOKS: Mapping[str, Callable[[Any], Any]] = {"count_is_informational": count_is_informational}
#: Model serializers by the name the shapes give them: the models run the same functions.
DUMPS: Mapping[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "without_empty_canaries": without_empty_canaries
}
#: Integers past 64 bits are pydantic's to read (it takes any size; a document never holds one).
_INT_LIMIT = 1 << 63
#: Integers a float field takes without rounding (past this, pydantic decides).
_FLOAT_INT_LIMIT = 1 << 53


class _RefusedError(Exception):
    """The light reader does not accept this value: pydantic decides."""


class Doc:
    """A document, or part of one, the light reader accepted: the model's fields as attributes.

    Read-only, like the frozen models. Each model gets a subclass of its name
    (``type(doc).__name__``), so messages and ``repr`` read as pydantic's do.
    """

    shape: ClassVar[str] = ""

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only")

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items())
        return f"{type(self).__name__}({fields})"

    def json_document(self) -> dict[str, Any]:
        """Return the model's ``model_dump(mode="json")``: what reports print (:func:`to_json`)."""
        out: dict[str, Any] = to_json(self)
        return out

    def model_copy(self, *, update: Mapping[str, Any]) -> Doc:
        """Return a copy with the fields in ``update`` replaced, unchecked (as pydantic's)."""
        copy = object.__new__(type(self))
        vars(copy).update(vars(self), **update)
        return copy


_MISSING = object()


def _text_ok(value: str) -> bool:
    """Whether ``value`` is text pydantic reads as given: no unpaired surrogate."""
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _plain(value: Any) -> Any:
    """Check a JSON value an ``Any`` field holds; return it unchanged."""
    stack = [value]
    while stack:
        v = stack.pop()
        kind = type(v)
        if kind is str:
            if not _text_ok(v):
                raise _RefusedError
        elif kind is dict:
            for k in v:
                if not _text_ok(k):
                    raise _RefusedError
            stack.extend(v.values())
        elif kind is list:
            stack.extend(v)
        elif kind is int:
            if not -_INT_LIMIT <= v < _INT_LIMIT:
                raise _RefusedError
        elif kind is float:
            if not math.isfinite(v):
                raise _RefusedError
        elif v is not None and kind is not bool:
            raise _RefusedError
    return value


#: The characters of a character class :func:`_fixed_form` reads: ASCII letters and digits.
_PLAIN = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
#: The characters of the plain text before it.
_LITERAL = _PLAIN | frozenset(":_/@-")


def _fixed_form(pattern: str) -> tuple[str, int, bytes] | None:
    """Read ``pattern`` as ``^<prefix>[<class>]{<n>}$``: ``(prefix, n, the class's characters)``.

    The patterns the shapes hold (a digest, ``^[0-9a-f]{64}$``, with or without
    ``sha256:`` before it) are of this form, and are matched without :mod:`re`
    (:func:`_matcher`). The prefix is plain text (letters, digits and ``:_/@-``),
    the class plain characters and ranges (ASCII letters and digits: no escape,
    no negation, so never a newline); anything else is None, for :mod:`re`. The
    class's characters come as ASCII bytes, for ``bytes.translate`` to delete.
    """
    if not (pattern.startswith("^") and pattern.endswith("}$")):
        return None
    prefix, _, rest = pattern[1:-2].partition("[")
    members, _, count = rest.partition("]{")
    if not (set(prefix) <= _LITERAL and count.isascii() and count.isdigit() and members):
        return None
    chars: list[str] = []
    i = 0
    while i < len(members):
        if members[i + 1 : i + 2] == "-":  # a range, "a-f" (a trailing "-" is no range: None)
            first, last, i = members[i], members[i + 2 : i + 3], i + 3
        else:
            first = last = members[i]
            i += 1
        if not (first in _PLAIN and last in _PLAIN and first <= last):
            return None
        chars += map(chr, range(ord(first), ord(last) + 1))
    return prefix, int(count), "".join(chars).encode("ascii")


def _matcher(pattern: str) -> Callable[[str], bool]:
    """Return whether a string matches ``pattern`` as pydantic matches it: the whole string."""
    fixed = _fixed_form(pattern)
    if fixed is None:
        import re  # noqa: PLC0415  # lazy: the shapes hold no other pattern (see _fixed_form)

        search = re.compile(pattern).search
        # Python's `$` also matches before a final newline; pydantic's regex does not.
        return lambda v: not v.endswith("\n") and search(v) is not None
    prefix, n, members = fixed
    start = len(prefix)
    size = start + n

    def matches(v: str) -> bool:
        return (
            len(v) == size
            and v.startswith(prefix)
            and v.isascii()
            and not v[start:].encode("ascii").translate(None, members)
        )

    return matches


def _str_check(spec: Mapping[str, Any]) -> Check:
    matches = _matcher(spec["pattern"]) if "pattern" in spec else None
    lo = spec.get("min_length")
    hi = spec.get("max_length")

    def check(v: Any) -> Any:
        if type(v) is not str or not (v.isascii() or _text_ok(v)):
            raise _RefusedError
        if (lo is not None and len(v) < lo) or (hi is not None and len(v) > hi):
            raise _RefusedError
        if matches is not None and not matches(v):
            raise _RefusedError
        return v

    return check


def _int_range(spec: Mapping[str, Any]) -> tuple[float, float]:
    """Return the least and the most an integer field takes (past 64 bits: pydantic's)."""
    lo, hi = spec.get("ge"), spec.get("le")
    low = -_INT_LIMIT if lo is None else max(-_INT_LIMIT, lo)
    return low, _INT_LIMIT - 1 if hi is None else min(_INT_LIMIT - 1, hi)


def _number_check(spec: Mapping[str, Any]) -> Check:
    lo = spec.get("ge")
    hi = spec.get("le")
    is_float = spec["t"] == "float"
    if not is_float:
        # An integer's check, the common case (every file entry's size and mode).
        low, high = _int_range(spec)

        def check_int(v: Any) -> Any:
            if type(v) is not int or not low <= v <= high:
                raise _RefusedError
            return v

        return check_int

    def check(v: Any) -> Any:
        kind = type(v)
        if kind is int:
            if not -_INT_LIMIT <= v < _INT_LIMIT or (is_float and abs(v) > _FLOAT_INT_LIMIT):
                raise _RefusedError
            if is_float:
                v = float(v)
        elif kind is not float or not is_float or not math.isfinite(v):
            raise _RefusedError
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise _RefusedError
        return v

    return check


def _bool_check(v: Any) -> Any:
    if type(v) is not bool:
        raise _RefusedError
    return v


def _literal_check(values: list[Any]) -> Check:
    def check(v: Any) -> Any:
        for expected in values:
            if type(v) is type(expected) and v == expected:
                return v
        raise _RefusedError

    return check


def _optional_check(inner: Check) -> Check:
    def check(v: Any) -> Any:
        return None if v is None else inner(v)

    return check


def _list_check(spec: Mapping[str, Any], make: type) -> Check:
    lo = spec.get("min_length")
    hi = spec.get("max_length")
    of = spec["of"]
    model = of["name"] if of["t"] == "model" else None
    inner = [] if model else [_compile(of)]

    def check(v: Any) -> Any:
        if type(v) is not list:
            raise _RefusedError
        if (lo is not None and len(v) < lo) or (hi is not None and len(v) > hi):
            raise _RefusedError
        if not inner:  # a model's check, found on first use (see _model_check), then called
            inner.append(_MODELS.get(model) or _compile_model(model))  # type: ignore[arg-type]
        out = _columns(model, v) if model and len(v) >= COLUMNS_FROM else None
        if out is None:
            each = inner[0]  # directly: a config's list of file entries has one per file
            out = [each(x) for x in v]
        return out if make is list else make(out)

    return check


def _dict_check(keys: Check, inner: Check) -> Check:
    def check(v: Any) -> Any:
        if type(v) is not dict:
            raise _RefusedError
        return {keys(k): inner(x) for k, x in v.items()}

    return check


def _union_check(members: list[Mapping[str, Any]]) -> Check:
    by_kind = {m["t"]: _compile(m) for m in members}
    kinds = {bool: "bool", int: "int", float: "float", str: "str"}

    def check(v: Any) -> Any:
        # pydantic's smart union takes the member of the value's own type first.
        member = by_kind.get(kinds.get(type(v), ""))
        if member is None:
            raise _RefusedError
        return member(v)

    return check


def _refuse(v: Any) -> Any:
    raise _RefusedError


_MODELS: dict[str, Check] = {}
#: Each compiled model's class of documents.
_CLASSES: dict[str, type[Doc]] = {}
#: A list of at least this many documents of one flat model is read a field at a time.
COLUMNS_FROM = 64
_SCALARS: Mapping[str, type] = {"str": str, "int": int, "bool": bool}


def _columns(name: str, values: list[Any]) -> list[Doc] | None:
    """Read ``values``, documents of the model ``name``, a field at a time; None: each decides.

    An artifact's config holds one file entry per file: tens of thousands of
    small documents of one flat model (every field a string, an integer, a
    boolean or an optional one). Checked one by one, each costs a call per
    field; here each field's rule runs once over the whole list in the
    interpreter's own loops (``map``, ``set``, ``min``, ``max``). It only ever
    accepts: every entry a dict holding every field (as artifactd writes
    them), every value of the field's type, ASCII strings, integers in range,
    patterns matched. Anything else, or a model that is not flat, returns
    None and each entry is checked by :func:`_compile_model`'s check, which
    accepts or refuses it. The values are the entries' own (these types are
    never converted), so a document reads the same either way.
    """
    shape = SHAPES[name]
    fields = shape["fields"]
    if shape["before"] or shape["extra"] != "forbid" or any(k != a for k, a, _, _ in fields):
        return None
    # Every entry a dict of as many keys as the model has fields, each of them there.
    if set(map(type, values)) != {dict} or set(map(len, values)) != {len(fields)}:
        return None
    for key, _, spec, _ in fields:
        try:
            column = list(map(operator.itemgetter(key), values))
        except KeyError:
            return None
        optional = spec["t"] == "opt"
        present = [v for v in column if v is not None] if optional else column
        if not _column_ok(spec["of"] if optional else spec, present):
            return None
    # Each document holds a copy of its entry: the same keys and values, in the entry's order.
    cls = _CLASSES[name]
    new, set_dict = object.__new__, object.__setattr__
    out = []
    for entry in map(dict, values):
        doc = new(cls)
        set_dict(doc, "__dict__", entry)
        out.append(doc)
    return out


def _column_ok(spec: Mapping[str, Any], column: list[Any]) -> bool:
    """Whether every value of ``column`` passes ``spec``'s scalar rule, ASCII text only."""
    kind = _SCALARS.get(spec["t"])
    if kind is None or not column:
        return kind is not None
    if set(map(type, column)) != {kind}:
        return False
    if kind is int:
        low, high = _int_range(spec)
        return bool(low <= min(column) and max(column) <= high)
    return kind is bool or _text_column_ok(spec, column)


def _text_column_ok(spec: Mapping[str, Any], column: list[str]) -> bool:
    """:func:`_column_ok` of a column of strings."""
    if not all(map(str.isascii, column)):
        return False  # each entry decides (an unpaired surrogate is pydantic's)
    lo, hi = spec.get("min_length"), spec.get("max_length")
    if (lo is not None and min(map(len, column)) < lo) or (
        hi is not None and max(map(len, column)) > hi
    ):
        return False
    if "pattern" not in spec:
        return True
    fixed = _fixed_form(spec["pattern"])
    if fixed is None:
        return all(map(_matcher(spec["pattern"]), column))
    return _fixed_column_ok(*fixed, column)


def _fixed_column_ok(prefix: str, n: int, members: bytes, column: list[str]) -> bool:
    """Whether every value of ``column`` (ASCII) matches a pattern of :func:`_fixed_form`.

    Every value a prefix and ``n`` characters of one class (a digest): their
    lengths and prefixes, then the rests joined and checked at once (a tenth
    of the time of a check per value).
    """
    start = len(prefix)
    if set(map(len, column)) != {start + n}:
        return False
    if start and set(map(operator.itemgetter(slice(start)), column)) != {prefix}:
        return False
    rest = "".join(map(operator.itemgetter(slice(start, None)), column) if start else column)
    return not rest.encode("ascii").translate(None, members)


def _model_check(name: str) -> Check:
    found: list[Check] = []

    def check(v: Any) -> Any:
        # Compiled on first use: models refer to each other (and to themselves) by name.
        if not found:
            found.append(_MODELS.get(name) or _compile_model(name))
        return found[0](v)

    return check


def _default(spec_check: Check, default: Any) -> Callable[[], Any]:
    if default == "$version":
        return lambda: __version__
    if isinstance(default, list | dict):
        return lambda: spec_check(_copied(default))
    return lambda: default


def _copied(value: Any) -> Any:
    """Return a deep copy of the JSON value ``value`` (``copy.deepcopy`` of a shape's default)."""
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copied(v) for v in value]
    return value


def _compile_model(name: str) -> Check:
    shape = SHAPES[name]
    cls: type[Doc] = type(name, (Doc,), {"shape": name, "__module__": __name__})
    _CLASSES[name] = cls
    before = HOOKS[shape["before"]] if shape["before"] else None
    forbid = shape["extra"] == "forbid"
    fields: list[tuple[str, str, Check, Callable[[], Any] | None]] = []
    renamed: list[str] = []
    for key, attr, spec, default in shape["fields"]:
        check = _compile(spec)
        fields.append(
            (key, attr, check, None if default == "$required" else _default(check, default))
        )
        if key != attr:
            renamed.append(attr)
    allowed = frozenset(f[0] for f in fields)
    new = object.__new__
    set_dict = object.__setattr__

    def check_model(v: Any) -> Any:
        if before is not None:
            try:
                v = before(v)
            except Exception:
                raise _RefusedError from None
        if type(v) is not dict:
            raise _RefusedError
        if forbid and not v.keys() <= allowed:
            raise _RefusedError
        if renamed and any(attr in v for attr in renamed):
            raise _RefusedError  # a field given by name where the model reads its alias
        values: dict[str, Any] = {}
        for key, attr, check, default in fields:
            x = v.get(key, _MISSING)
            if x is not _MISSING:
                values[attr] = check(x)
            elif default is None:
                raise _RefusedError
            else:
                values[attr] = default()
        doc: Doc = new(cls)
        set_dict(doc, "__dict__", values)
        return doc

    _MODELS[name] = check_model
    return check_model


def _compile(spec: Mapping[str, Any]) -> Check:  # noqa: PLR0911 - one case per type
    t = spec["t"]
    if t == "str":
        return _str_check(spec)
    if t in ("int", "float"):
        return _number_check(spec)
    if t == "bool":
        return _bool_check
    if t == "any":
        return _plain
    if t == "lit":
        return _literal_check(list(spec["values"]))
    if t == "opt":
        return _optional_check(_compile(spec["of"]))
    if t in ("list", "tuple"):
        return _list_check(spec, list if t == "list" else tuple)
    if t == "dict":
        return _dict_check(_compile(spec["keys"]), _compile(spec["of"]))
    if t == "union":
        return _union_check(list(spec["of"]))
    if t == "model":
        return _model_check(spec["name"])
    return _refuse  # "pydantic": the whole document goes to pydantic


def validate(root: str, value: Any) -> Doc | None:
    """Return ``value`` (parsed JSON) read as the model ``root``, or None: pydantic decides."""
    check = _MODELS.get(root) or _compile_model(root)
    try:
        doc: Doc = check(value)
    except (_RefusedError, RecursionError):
        return None
    return doc


def read(root: str, data: bytes | str) -> Doc | None:
    """Parse and read ``data`` as the model ``root``, or None: pydantic decides (and explains)."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        value = loads(text)
    except (ValueError, RecursionError):
        return None
    return validate(root, value)


def to_json(value: Any) -> Any:
    """Return the model's ``model_dump(mode="json")`` of ``value`` (a Doc, or what it holds)."""
    if isinstance(value, Doc):
        doc = {k: to_json(v) for k, v in value.__dict__.items()}
        dump = SHAPES[value.shape]["dump"]
        return DUMPS[dump](doc) if dump else doc
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    return value


def fingerprint_of(raw: Any) -> Document | None:
    """Return the fingerprint ``raw`` (a probe, maybe overridden) is, or None: pydantic decides.

    The light reader's answer to :func:`artifactd.fingerprint.model.from_raw`.
    """
    doc = validate("Fingerprint", raw)
    return None if doc is None else Document(to_json(doc))
