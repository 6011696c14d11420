"""``artifactd.jsontext`` writes and reads JSON exactly as the ``json`` package does.

The module calls ``json``'s own C accelerator with ``json``'s settings, so the
promise is byte-for-byte equality: every generated document, under every
setting a caller uses, gives ``json.dumps``'s text, and every text gives
``json.loads``'s value (compared through ``repr``, so ``-0.0`` and ``1.0``
against ``1`` count). Refusals match too: what ``json`` refuses raises
``ValueError`` (or the same ``TypeError`` for a value JSON has no form for).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from artifactd import jsontext

REPO = Path(__file__).resolve().parent.parent

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text()
)
_DOCS = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30,
)


def _same(call: Any, reference: Any) -> tuple[tuple[str, str], tuple[str, str]]:
    """Run both; return (kind, text) of each: the result's repr, or the exception's type."""
    out = []
    for fn in (call, reference):
        try:
            out.append(("ok", repr(fn())))
        except (ValueError, TypeError, RecursionError) as exc:
            base = "ValueError" if isinstance(exc, ValueError) else type(exc).__name__
            out.append(("error", base))
    return out[0], out[1]


_KEYS = st.text() | st.integers(-5, 5) | st.floats(allow_nan=True) | st.booleans() | st.none()
#: Documents whose objects may have keys json writes as text (numbers, booleans, null).
_ANY_KEYS = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(_KEYS, inner, max_size=5),
    max_leaves=30,
)


@settings(max_examples=600, deadline=None)
@given(
    _DOCS | _ANY_KEYS,
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.sampled_from([None, None, 0, 2, 4]),
)
def test_dumps_is_json_dumps(  # noqa: PLR0917 - hypothesis passes what it draws by position
    doc: Any, sort_keys: bool, compact: bool, ensure_ascii: bool, allow_nan: bool, indent: int
) -> None:
    mine, theirs = _same(
        lambda: jsontext.dumps(
            doc,
            sort_keys=sort_keys,
            compact=compact,
            ensure_ascii=ensure_ascii,
            allow_nan=allow_nan,
            indent=indent,
        ),
        lambda: json.dumps(
            doc,
            sort_keys=sort_keys,
            separators=(",", ":") if compact else None,
            ensure_ascii=ensure_ascii,
            allow_nan=allow_nan,
            indent=indent,
        ),
    )
    assert mine == theirs


@settings(max_examples=400, deadline=None)
@given(_DOCS, st.sampled_from(["", " ", "\n", " \t\r\n"]), st.sampled_from(["", " ", "\n\n"]))
def test_loads_reads_what_json_reads(doc: Any, before: str, after: str) -> None:
    text = before + json.dumps(doc, ensure_ascii=False) + after
    mine, theirs = _same(lambda: jsontext.loads(text), lambda: json.loads(text))
    assert mine == theirs
    mine, theirs = _same(
        lambda: jsontext.loads(text.encode("utf-8", "surrogatepass")),
        lambda: json.loads(text.encode("utf-8", "surrogatepass")),
    )
    assert mine == theirs


@settings(max_examples=600, deadline=None)
@given(st.text(alphabet='{}[]",:0123456789.eE+-tfnrulasNIiy \t\n\\/\ufeff', max_size=30))
def test_loads_refuses_what_json_refuses(text: str) -> None:
    mine, theirs = _same(lambda: jsontext.loads(text), lambda: json.loads(text))
    assert mine == theirs


@pytest.mark.parametrize(
    "data",
    [
        b'\xef\xbb\xbf{"a": 1}',  # a UTF-8 byte order mark: json skips it
        '{"a": "\u00e9"}'.encode("utf-16"),
        '{"a": 1}'.encode("utf-32-le"),
        b"\x001",
        b'"\xed\xa0\x80"',  # an encoded surrogate: json lets it through
        b'"\xff"',
    ],
)
def test_loads_decodes_bytes_as_json_does(data: bytes) -> None:
    mine, theirs = _same(lambda: jsontext.loads(data), lambda: json.loads(data))
    assert mine == theirs


def test_errors_say_where() -> None:
    # Where json's accelerator reports it: char 3 before Python 3.13, char 2 (the trailing
    # comma itself) from 3.13 on. The message names the place json's own does.
    with pytest.raises(ValueError) as theirs:
        json.loads("[1,]")
    where = str(theirs.value).rpartition("(")[2].rstrip(")")
    assert where.startswith("char "), theirs.value
    with pytest.raises(ValueError, match=where):
        jsontext.loads("[1,]")
    with pytest.raises(ValueError, match="Extra data: char 7"):
        jsontext.loads('{"a":1} x')
    circular: list[Any] = []
    circular.append(circular)
    with pytest.raises(ValueError, match=r"[Cc]ircular"):
        jsontext.dumps(circular)
    with pytest.raises(ValueError, match=r"[Cc]ircular"):
        jsontext.dumps({"a": [circular]}, indent=2)
    with pytest.raises(TypeError, match="not JSON serializable"):
        jsontext.dumps({"a": {1, 2}})
    with pytest.raises(ValueError, match="Out of range"):
        jsontext.dumps(math.nan, allow_nan=False)


def test_it_loads_neither_json_nor_re() -> None:
    # -S: no site-packages, whose editable-install finder would load re itself
    code = (
        "import sys; from artifactd import jsontext; "
        "jsontext.loads(jsontext.dumps({'a': [1.5, None, 'x']}, sort_keys=True)); "
        "jsontext.dumps({'a': [1.5, None, 'x']}, sort_keys=True, indent=2); "
        "print(' '.join(m for m in ('json', 're', 'typing') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=REPO
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""
