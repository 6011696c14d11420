"""Property tests for canonical JSON: the pure core every fingerprint and scope key hashes."""

from __future__ import annotations

import json
import random
from typing import Any

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from artifactd.hashing import canonical_hash, canonical_json, sha256_hex

# Keys and string values without whitespace, so any whitespace byte in the output
# could only come from the serialiser's own formatting.
_NO_SPACE = st.characters(exclude_categories=("Cs", "Zs", "Zl", "Zp", "Cc"))
_keys = st.text(alphabet=_NO_SPACE, max_size=8)
_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=_NO_SPACE, max_size=12)
)
# JSON-shaped data: str keys only and lists (never tuples), so Python inequality
# implies a different JSON document.
json_values = st.recursive(
    _scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_keys, children, max_size=4),
    max_leaves=12,
)
json_objects = st.dictionaries(_keys, json_values, max_size=6)


def _reordered(value: Any, rng: random.Random) -> Any:
    """Return an equal value whose dicts (at every depth) were built in another order."""
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: _reordered(v, rng) for k, v in items}
    if isinstance(value, list):
        return [_reordered(v, rng) for v in value]
    return value


@settings(max_examples=100, deadline=None)
@given(json_objects, st.randoms(use_true_random=False))
def test_canonical_json_ignores_insertion_order(value: dict[str, Any], rng: random.Random) -> None:
    shuffled = _reordered(value, rng)
    assert shuffled == value
    assert canonical_json(shuffled) == canonical_json(value)
    assert canonical_hash(shuffled) == canonical_hash(value)


def test_nested_insertion_order_explicit() -> None:
    a = {"gpu": {"arch": "sm_90a", "count": 8}, "libs": [{"b": 1, "a": 2}], "z": None}
    b = {"z": None, "libs": [{"a": 2, "b": 1}], "gpu": {"count": 8, "arch": "sm_90a"}}
    assert list(a) != list(b)
    assert canonical_json(a) == canonical_json(b)
    expected = b'{"gpu":{"arch":"sm_90a","count":8},"libs":[{"a":2,"b":1}],"z":null}'
    assert canonical_json(a) == expected


@settings(max_examples=100, deadline=None)
@given(json_objects, json_objects)
def test_different_values_give_different_bytes_and_hashes(
    a: dict[str, Any], b: dict[str, Any]
) -> None:
    # (1 == 1.0 == True in Python but not in JSON, so only inequality is checked.)
    assume(a != b)
    assert canonical_json(a) != canonical_json(b)
    assert canonical_hash(a) != canonical_hash(b)


@settings(max_examples=100, deadline=None)
@given(json_objects, _keys, json_values)
def test_changing_one_nested_leaf_changes_the_hash(
    base: dict[str, Any], key: str, leaf: Any
) -> None:
    before = {"outer": {"inner": base}}
    after = {"outer": {"inner": {**base, key: leaf}}}
    assume(before != after)
    assert canonical_hash(before) != canonical_hash(after)


def _assert_sorted_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    assert keys == sorted(keys)
    return dict(pairs)


@settings(max_examples=100, deadline=None)
@given(json_objects)
def test_output_is_compact_sorted_utf8_and_round_trips(value: dict[str, Any]) -> None:
    out = canonical_json(value)
    assert isinstance(out, bytes)
    # Strings were generated without whitespace, so none may appear at all.
    assert not any(ch in out for ch in b" \t\r\n")
    text = out.decode("utf-8")
    # Every object, at every depth, has its keys in sorted order.
    parsed = json.loads(text, object_pairs_hook=_assert_sorted_keys)
    assert parsed == value
    assert canonical_hash(value) == sha256_hex(out)


def test_non_ascii_is_kept_as_utf8_not_escaped() -> None:
    assert canonical_json({"name": "é"}) == '{"name":"é"}'.encode()


def test_hash_is_lowercase_sha256_hex() -> None:
    digest = canonical_hash({"a": 1})
    assert len(digest) == 64
    assert digest == digest.lower()
    int(digest, 16)
