"""Property tests for canonical JSON and the digest helpers every key and blob check uses."""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from artifactd.errors import IntegrityError
from artifactd.hashing import (
    CHUNK,
    SMALL,
    SMALL_SHA256_MODULE,
    BlobMismatchError,
    DigestReader,
    Hasher,
    HashingReader,
    HashingWriter,
    canonical_hash,
    canonical_json,
    copy_hashed,
    digest_of,
    sha256_hex,
    verifier_of,
)

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


@settings(max_examples=50)
@given(st.lists(st.binary(max_size=300), max_size=8))
def test_a_running_hash_equals_the_one_shot_digest(parts: list[bytes]) -> None:
    whole = b"".join(parts)
    hasher = Hasher()
    for part in parts:
        hasher.update(part)
    assert hasher.digest == digest_of(whole) == "sha256:" + hashlib.sha256(whole).hexdigest()
    assert hasher.hex == sha256_hex(whole) and hasher.size == len(whole)
    assert hasher.matches(digest_of(whole), len(whole))
    assert not hasher.matches(digest_of(whole), len(whole) + 1)
    assert not hasher.matches(digest_of(whole + b"x"), len(whole))


class _Trickle:
    """A source that gives at most ``step`` bytes per read and counts what it gave."""

    def __init__(self, data: bytes, step: int) -> None:
        self._data = io.BytesIO(data)
        self._step = step
        self.given = 0

    def read(self, n: int = -1, /) -> bytes:
        out = self._data.read(min(n, self._step) if n > 0 else self._step)
        self.given += len(out)
        return out


def test_copy_hashed_copies_every_byte_and_reports_progress() -> None:
    data = bytes(range(256)) * 4000  # 1,024,000 bytes
    out = io.BytesIO()
    seen: list[int] = []
    copied = copy_hashed(_Trickle(data, 100_000), out, progress=seen.append)
    assert out.getvalue() == data
    assert copied.matches(digest_of(data), len(data))
    assert seen == [*range(100_000, len(data), 100_000), len(data)]


def test_copy_hashed_stops_past_its_limit() -> None:
    """A source longer than it claims costs at most one chunk more, never all of it."""
    source = _Trickle(bytes(10 * CHUNK), CHUNK)
    copied = copy_hashed(source, None, limit=CHUNK + 1)
    assert copied.size > CHUNK + 1
    assert source.given == copied.size <= 2 * CHUNK + 1
    exact = copy_hashed(_Trickle(b"abc", 1), None, limit=3)
    assert exact.size == 3 and exact.digest == digest_of(b"abc")


def test_hashing_reader_and_writer_see_what_passes_through() -> None:
    data = b"layer bytes " * 1000
    reader = HashingReader(io.BytesIO(data))
    buf = bytearray(7)
    assert reader.readinto(buf) == 7 and bytes(buf) == data[:7]
    reader.drain()
    assert reader.hasher.matches(digest_of(data), len(data))
    sink = io.BytesIO()
    writer = HashingWriter(sink)
    writer.write(data[:5])
    writer.write(data[5:])
    writer.flush()
    assert sink.getvalue() == data and writer.hasher.digest == digest_of(data)


def test_digest_reader_gives_the_verdict_at_the_end_and_refuses_a_long_blob_at_once() -> None:
    data = b"blob bytes " * 1000
    good = DigestReader(io.BytesIO(data), digest_of(data), len(data))
    assert verifier_of(good) is good and good.checks(digest_of(data), len(data))
    assert good.read(7) == data[:7] and not good.verified
    good.drain()
    assert good.verified and good.read_bytes == len(data) and good.read(1) == b""
    wrong = data[:-1] + b"X"
    with pytest.raises(BlobMismatchError, match="digest mismatch") as caught:
        DigestReader(io.BytesIO(wrong), digest_of(data), len(data)).drain()
    assert caught.value.reason == "digest" and isinstance(caught.value, IntegrityError)
    short = DigestReader(io.BytesIO(data[:-1]), digest_of(data), len(data))
    with pytest.raises(
        BlobMismatchError, match=rf"expected {len(data)} bytes, got {len(data) - 1}"
    ):
        short.drain()
    assert not short.verified
    # A longer blob is refused by the read that passes its size, not at its end.
    long = DigestReader(io.BytesIO(data + bytes(10 * CHUNK)), digest_of(data), len(data))
    with pytest.raises(BlobMismatchError, match="more than the") as caught:
        long.read(len(data) + 1)
    assert caught.value.reason == "long" and long.read_bytes == len(data) + 1
    assert verifier_of(io.BytesIO(data)) is None


@pytest.mark.parametrize("size", [0, 1, 1000, SMALL - 1, SMALL, SMALL + 1, 3 * SMALL])
def test_sha256_hex_is_sha256_on_both_sides_of_the_small_cutoff(size: int) -> None:
    """Small inputs skip OpenSSL (CPython's own sha256), large ones use hashlib: same digest."""
    data = os.urandom(size)
    assert sha256_hex(data) == hashlib.sha256(data).hexdigest()


def test_small_inputs_hash_with_the_builtin_module_of_this_python() -> None:
    """The private module has a name per Python (``_sha256``, then ``_sha2`` from 3.12).

    Had the wrong one been named, the import would fall back to hashlib: the digest
    stays right and only the pod start gets slower, so check the module itself, and
    that importing the digests of a fingerprint loads no OpenSSL.
    """
    assert SMALL_SHA256_MODULE in sys.stdlib_module_names
    child = (
        "import sys\n"
        "from artifactd.hashing import canonical_hash\n"
        "canonical_hash({'a': 1})\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, check=True
    ).stdout.split()
    assert SMALL_SHA256_MODULE in out
    assert "_hashlib" not in out
