"""Properties of the layer format's checks, on random records, tars and bytes.

The invariant: reading a config, checking a record and unpacking a layer end
in success or in an :class:`ArtifactdError` subclass, never in another
exception; an unpack writes under its staging dir only (the dirs above it
stay exactly as they were, and so does the absolute place escaping members
aim at); and a successful unpack staged exactly what the record lists.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import stat
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import zstandard
from hostile import Member, config_doc, d, entries_of, f, layer, tar_bytes
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from artifactd.errors import ArtifactdError
from artifactd.fingerprint.model import Fingerprint
from artifactd.format.config import ArtifactConfig, FileEntry, LayerRecord
from artifactd.format.unpack import (
    EXTRA_DIRS,
    MAX_PATH_BYTES,
    MAX_REWRITE_BYTES,
    _checked_entries,
    _plain_entries,
    check_layer,
    tar_bound,
    unpack_layer,
)
from artifactd.hashing import canonical_json

COMPONENTS = frozenset({"cache", "jit"})
#: The layer unpacked below declares "cache" only (every declared one must be there).
LAYER = frozenset({"cache"})
SETTINGS = settings(
    deadline=None,
    database=None,
    derandomize=True,  # the same examples on every run: no flaky discoveries in CI
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# Where absolute names and links aim (made for this module's tests): it must stay empty.
_ABS = Path(tempfile.gettempdir()) / f"artifactd-prop-abs-{os.getpid()}-{os.urandom(4).hex()}"


@pytest.fixture(scope="module", autouse=True)
def _abs_dir() -> Iterator[Path]:
    _ABS.mkdir()
    yield _ABS
    shutil.rmtree(_ABS, ignore_errors=True)


# --------------------------------------------------------------------------
# (a) configs and records
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def valid_doc(local_fp: Fingerprint) -> dict[str, Any]:
    members = [d("cache"), f("cache/a", b"x" * 10), f("cache/sub/b.so", b"\x7fELF", 0o755)]
    doc = config_doc(local_fp, [layer(members)])
    ArtifactConfig.from_json(canonical_json(doc))  # the base document is valid
    return doc


@SETTINGS
@given(data=st.binary(max_size=512))
def test_config_from_random_bytes(data: bytes) -> None:
    with contextlib.suppress(ArtifactdError):
        ArtifactConfig.from_json(data)


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k != "fingerprint":  # the fingerprint has its own tests
                out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


@settings(SETTINGS, max_examples=150)
@given(data=st.data())
def test_mutated_config_parses_or_is_refused(valid_doc: dict[str, Any], data: Any) -> None:
    """Random values at random places: a model that check_layer judges, or an ArtifactdError."""
    doc = json.loads(json.dumps(valid_doc))
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(_paths(doc)[1:]))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = data.draw(JSON)
    try:
        model = ArtifactConfig.from_json(json.dumps(doc).encode())
    except ArtifactdError:
        return
    for rec in model.layers:
        with contextlib.suppress(ArtifactdError):
            check_layer(rec, COMPONENTS)


PART = st.sampled_from(["cache", "jit", "evil", "a", "b", "sub", "..", ".", "", "n" * 256])
PATH = st.lists(PART, min_size=1, max_size=5).map("/".join) | st.builds(
    lambda p: "/" + p, st.lists(PART, min_size=1, max_size=3).map("/".join)
)
MODE = st.sampled_from([0o644, 0o755, 0o777, 0o600, 0o700, 0o664, 0])
ENTRY = st.builds(
    FileEntry,
    path=PATH
    | st.lists(PART.filter(lambda p: p not in ("..", "")), min_size=1, max_size=4).map(
        lambda ps: "cache/" + "/".join(ps)
    ),
    size=st.sampled_from([0, 1, 100, MAX_REWRITE_BYTES, MAX_REWRITE_BYTES + 1, 10**13]),
    sha256=st.just("0" * 64),
    mode=MODE,
    link=st.none() | PATH,
    rewrite=st.booleans(),
)


def _link_ok(path: PurePosixPath, target: str) -> bool:
    """Independent of the library: does a link at ``path`` (relative to its component) stay in?"""
    if target.startswith("/") or not target:
        return False
    depth = len(path.parts) - 1
    for part in target.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return False
        elif part not in ("", "."):
            depth += 1
    return True


def _bound_by_the_rule(entries: list[FileEntry], components: list[str]) -> int:
    """The most tar bytes of ``entries``, by the rule, walking every parent of every file."""

    def round_up(n: int) -> int:
        return -(-n // 512) * 512

    def headers(name: str, link: str = "") -> int:  # a ustar header and a PAX header
        return 3 * 512 + 2 * round_up(len(name.encode()) + len(link.encode()) + 256)

    dirs = set(components)
    for e in entries:
        dirs.update(str(p) for p in PurePosixPath(e.path).parents if str(p) != ".")
    bound = 2 * 10240 + EXTRA_DIRS * headers("x" * MAX_PATH_BYTES)
    bound += sum(round_up(e.size) + headers(e.path, e.link or "") for e in entries)
    return bound + sum(headers(d) for d in dirs)


@settings(SETTINGS, max_examples=300)
@example(  # a record path that names no path at all (GNU tar's "./" as a file entry)
    entries=[FileEntry(path=".", size=0, sha256="0" * 64, mode=0o644)],
    components=["cache"],
    size=0,
    lie=0,
)
@given(
    entries=st.lists(ENTRY, max_size=6),
    components=st.lists(st.sampled_from(["cache", "jit", "evil"]), max_size=3),
    size=st.integers(0, 1 << 20),
    lie=st.integers(-2, 2),
)
def test_check_layer_accepts_only_what_the_rules_allow(
    entries: list[FileEntry], components: list[str], size: int, lie: int
) -> None:
    total = sum(e.size for e in entries)
    rec = LayerRecord(
        family="generic",
        scope_key="0" * 64,
        scope={},
        components=components,
        files=entries,
        digest="sha256:" + "0" * 64,
        size=size,
        diff_id="sha256:" + "0" * 64,
        unpacked_size=max(0, total + lie),
    )
    try:
        bound = check_layer(rec, COMPONENTS)
    except ArtifactdError:
        return
    # Accepted: every rule holds, checked here without the library's helpers.
    assert components and set(components) <= COMPONENTS
    assert len(set(components)) == len(components)
    assert rec.unpacked_size == total
    assert bound >= total
    # The bound is the rule's, with every directory above every file counted once.
    assert bound == _bound_by_the_rule(entries, components)
    assert tar_bound(entries, frozenset(components)) == bound
    seen: set[PurePosixPath] = set()
    for e in entries:
        assert not e.path.startswith("/")
        raw_parts = e.path.split("/")
        assert ".." not in raw_parts
        p = PurePosixPath(e.path)
        assert p.parts[0] in components and len(p.parts) >= 2
        assert all(len(part.encode()) <= 255 for part in p.parts)
        assert p not in seen
        seen.add(p)
        if e.link is not None:
            assert e.mode == 0o777 and e.size == 0
            assert _link_ok(PurePosixPath(*p.parts[1:]), e.link)
        else:
            assert e.mode in (0o644, 0o755)
        if e.rewrite:
            assert e.size <= MAX_REWRITE_BYTES
    for p in seen:  # nothing lies under a listed file or link
        assert not any(parent in seen for parent in p.parents)


# --------------------------------------------------------------------------
# (b) unpacking random members and random bytes
# --------------------------------------------------------------------------

#: Parts of a record's paths: plain ones, and one edge each (dots, empty, long,
#: not ASCII, NUL, backslash, DEL, a space).
SAFE_PART = st.sampled_from(["a", "k.so", ".hidden", "..x", "x..", "a b", "~", "n" * 255])
EDGE_PART = st.sampled_from(
    [".", "..", "", "caf\u00e9", "n" * 256, "a\\b", "a\x00b", "\x7f", "x" * 1000, "evil"]
)


def _entry(
    path: str, mode: int = 0o644, link: str | None = None, rewrite: bool = False
) -> FileEntry:
    size = len(path) if link is None else 0
    return FileEntry(path=path, size=size, sha256="0" * 64, mode=mode, link=link, rewrite=rewrite)


SAFE_ENTRY = st.builds(
    lambda comp, parts, rewrite: _entry("/".join([comp, *parts]), rewrite=rewrite),
    st.sampled_from(["cache", "jit"]),
    st.lists(SAFE_PART, min_size=1, max_size=4),
    st.booleans(),
)
EDGE_ENTRY = st.one_of(
    st.builds(  # one edge part anywhere in an otherwise plain path
        lambda comp, parts, edge, at: _entry("/".join([comp, *parts[:at], edge, *parts[at:]])),
        st.sampled_from(["cache", "jit"]),
        st.lists(SAFE_PART, max_size=3),
        EDGE_PART,
        st.integers(0, 3),
    ),
    st.builds(lambda: _entry("evil/a")),  # outside the components
    st.builds(lambda: _entry("cache")),  # a component replaced by a file
    st.builds(lambda: _entry("cache/a", mode=0o600)),
    st.builds(lambda: _entry("cache/l", mode=0o777, link="a")),
    st.builds(  # a file marked for rewriting, over the size a rewrite reads
        lambda rewrite: _entry("cache/g", rewrite=rewrite).model_copy(
            update={"size": MAX_REWRITE_BYTES + 1}
        ),
        st.booleans(),
    ),
    st.builds(lambda: _entry("cache/" + "/".join(["p" * 200] * 6))),  # over MAX_PATH_BYTES
)


@settings(SETTINGS, max_examples=500)
@given(
    entries=st.lists(SAFE_ENTRY, max_size=4),
    odd=st.lists(st.one_of(SAFE_ENTRY, EDGE_ENTRY), min_size=1, max_size=2),
)
def test_the_plain_way_of_checking_a_record_agrees_with_each_entry_checked(
    entries: list[FileEntry], odd: list[FileEntry]
) -> None:
    """What ``check_layer`` accepts a field at a time, each entry checked accepts, alike."""
    entries = entries + odd
    plain = _plain_entries(entries, COMPONENTS)
    try:
        each = _checked_entries(entries, COMPONENTS)
    except ArtifactdError:
        assert plain is None  # the plain way never passes what an entry's own check refuses
        return
    if plain is not None:
        assert plain == each


def test_a_record_as_artifactd_writes_it_takes_the_plain_way() -> None:
    entries = [
        FileEntry(path=f"cache/{i // 4:052x}/k{i}.cubin", size=i, sha256="0" * 64, mode=0o644)
        for i in range(400)
    ]
    plain = _plain_entries(entries, COMPONENTS)
    assert plain is not None and plain == _checked_entries(entries, COMPONENTS)
    assert len(plain[1]) == 100 + 1  # 100 key directories and the component


NAME_PART = st.sampled_from(["a", "b", "sub", "..", ".", "", "cache", "x" * 300])
SAFE_NAME = st.lists(st.sampled_from(["a", "b", "sub", "k.so"]), min_size=1, max_size=3).map(
    lambda ps: "cache/" + "/".join(ps)
)
WILD_NAME = st.lists(NAME_PART, min_size=1, max_size=4).map(
    lambda ps: "cache/" + "/".join(ps)
) | st.lists(NAME_PART, min_size=1, max_size=3).map("/".join)
#: Names at the edges of the rules, drawn as often as composed ones.
EDGE_NAME = st.sampled_from(
    [
        *(".", "./", "cache", "cache/", "cache/.", "cache//a", "jit/a", "evil/a", "/cache/a"),
        *(f"{_ABS}/pwn", "cache/" + "y" * 255, "cache/" + "z" * 256, "cache/" + "d/" * 509 + "f"),
    ]
)
NAME = st.one_of(SAFE_NAME, SAFE_NAME, EDGE_NAME, WILD_NAME)
LINK_TARGET = st.sampled_from(
    ["a", "sub", "sub/a", ".", "..", "../..", "../../../../..", "y/y/../..", "", str(_ABS), "/etc"]
)
KIND = st.sampled_from(["file"] * 6 + ["dir"] * 3 + ["symlink"] * 3 + ["hardlink", "chr", "fifo"])
TAR_MODE = st.sampled_from([None, None, None, 0o644, 0o755, 0o777, 0o4755, 0o2755, 0o1755, 0o600])


TAME_KIND = st.sampled_from(["file"] * 3 + ["dir", "symlink"])
TAME_MODE = st.sampled_from([None, 0o644, 0o755])
TAME_LINK = st.sampled_from(["a", "sub", "sub/a", "../a", "k.so"])


@st.composite
def members(draw: Any) -> list[Member]:
    """Members of a tar: half the time tame (mostly restorable), else anything goes."""
    tame = draw(st.booleans())
    out = [Member("cache", "dir")] if tame or draw(st.booleans()) else []
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(TAME_KIND if tame else KIND)
        name = draw(SAFE_NAME if tame else NAME)
        link = draw(TAME_LINK if tame else LINK_TARGET) if kind in ("symlink", "hardlink") else ""
        data = draw(st.binary(max_size=64)) if kind == "file" else b""
        out.append(Member(name, kind, data, draw(TAME_MODE if tame else TAR_MODE), link))
    return out


def _entries(draw: Any, ms: list[Member]) -> list[FileEntry]:
    """The record: consistent with the tar, or lying a little, or made up."""
    how = draw(st.sampled_from(["consistent"] * 4 + ["drop", "retype", "random"]))
    docs = entries_of("generic", ms)
    if how == "drop" and docs:
        docs.pop(draw(st.integers(0, len(docs) - 1)))
    elif how == "retype" and docs:
        i = draw(st.integers(0, len(docs) - 1))
        docs[i] = {**docs[i], "link": "a" if docs[i]["link"] is None else None, "mode": 0o644}
    elif how == "random":
        made_up: list[FileEntry] = draw(st.lists(ENTRY, max_size=4))
        return made_up
    out = []
    for doc in docs:
        rewrite = draw(st.integers(0, 7)) == 0
        try:
            out.append(FileEntry(**{**doc, "rewrite": rewrite}))
        except ValueError:  # pydantic refuses it: a record that cannot exist
            continue
    return out


def _relocate(member: str, data: bytes) -> bytes:
    return data.decode("utf-8").replace("@ROOT@", "/restored").encode()


class Sandbox:
    """base/up1/up2/parent/staging: the dirs above staging must stay as they are."""

    def __init__(self) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="artifactd-prop-"))
        self.parent = self.base / "up1" / "up2" / "parent"
        self.parent.mkdir(parents=True)
        self.staging = self.parent / "staging"

    def assert_contained(self) -> None:
        for above, child in (
            (self.base, "up1"),
            (self.base / "up1", "up2"),
            (self.base / "up1" / "up2", "parent"),
        ):
            assert os.listdir(above) == [child]
        assert os.listdir(self.parent) in ([], ["staging"])
        assert os.listdir(_ABS) == []
        assert not os.path.lexists("/etc/pwn")

    def close(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)


def _assert_staged_exactly(staging: Path, entries: list[FileEntry]) -> None:
    """A successful unpack staged every listed file and link, as listed, and nothing else."""
    by_path = {e.path: e for e in entries}
    found = set()
    for dirpath, dirnames, filenames in os.walk(staging):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(staging).as_posix()
            st_ = os.lstat(path)
            if stat.S_ISDIR(st_.st_mode):
                assert stat.S_IMODE(st_.st_mode) == 0o755
                assert rel not in by_path
                continue
            found.add(rel)
            e = by_path[rel]
            if stat.S_ISLNK(st_.st_mode):
                assert os.readlink(path) == e.link
                comp = os.path.realpath(staging / rel.split("/", 1)[0])
                real = os.path.realpath(path)
                assert real == comp or real.startswith(comp + os.sep)
            else:
                assert stat.S_ISREG(st_.st_mode)
                assert e.link is None
                assert stat.S_IMODE(st_.st_mode) == e.mode
                data = path.read_bytes()
                if not e.rewrite:
                    assert hashlib.sha256(data).hexdigest() == e.sha256
    assert found == set(by_path)


def _unpack(blob: bytes, entries: list[FileEntry], digest: str | None = None) -> None:
    box = Sandbox()
    try:
        digest = digest or "sha256:" + hashlib.sha256(blob).hexdigest()
        try:
            unpack_layer(
                io.BytesIO(blob),
                digest=digest,
                size=len(blob),
                entries=entries,
                staging=box.staging / "generic",
                components=LAYER,
                relocate=_relocate,
            )
        except ArtifactdError:
            box.assert_contained()
            return
        box.assert_contained()
        _assert_staged_exactly(box.staging / "generic", entries)
    finally:
        box.close()


@settings(SETTINGS, max_examples=250)
@given(data=st.data(), ms=members(), fmt=st.sampled_from([tarfile.PAX_FORMAT, tarfile.GNU_FORMAT]))
def test_unpack_random_members(data: Any, ms: list[Member], fmt: int, batch_writer: str) -> None:
    entries = _entries(data.draw, ms)
    try:
        raw = tar_bytes(ms, fmt)
    except (ValueError, UnicodeError):  # tarfile cannot write it (a name too long for GNU)
        return
    blob = zstandard.ZstdCompressor(level=1).compress(raw)
    how = data.draw(st.sampled_from(["as is"] * 6 + ["flip", "cut", "digest"]))
    digest = None
    if how == "flip" and blob:
        i = data.draw(st.integers(0, len(blob) - 1))
        blob = blob[:i] + bytes([blob[i] ^ data.draw(st.integers(1, 255))]) + blob[i + 1 :]
    elif how == "cut":
        blob = blob[: data.draw(st.integers(0, len(blob)))]
    elif how == "digest":
        digest = "sha256:" + "1" * 64
    _unpack(blob, entries, digest)


@settings(SETTINGS, max_examples=100)
@given(blob=st.binary(max_size=2048), entries=st.lists(ENTRY, max_size=3), frame=st.booleans())
def test_unpack_random_bytes(blob: bytes, entries: list[FileEntry], frame: bool) -> None:
    """Random bytes, raw or as a valid zstd frame of random (non-tar) data."""
    if frame:
        blob = zstandard.ZstdCompressor().compress(blob)
    _unpack(blob, entries)


def test_the_generators_reach_success() -> None:
    """The member strategy's consistent, safe corner unpacks (so the properties see successes)."""
    ms = [
        Member("cache", "dir"),
        Member("cache/sub", "dir"),
        Member("cache/sub/a", "file", b"payload"),
        Member("cache/k.so", "file", b"\x7fELF", 0o755),
        Member("cache/l", "symlink", link="sub/a"),
    ]
    entries = [FileEntry(**doc) for doc in entries_of("generic", ms)]
    blob = zstandard.ZstdCompressor().compress(tar_bytes(ms))
    box = Sandbox()
    try:
        res = unpack_layer(
            io.BytesIO(blob),
            digest="sha256:" + hashlib.sha256(blob).hexdigest(),
            size=len(blob),
            entries=entries,
            staging=box.staging / "generic",
            components=LAYER,
        )
        assert (res.files, res.bytes) == (3, len(b"payload") + 4)
        _assert_staged_exactly(box.staging / "generic", entries)
        box.assert_contained()
    finally:
        box.close()
