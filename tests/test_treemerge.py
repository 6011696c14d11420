"""Merging the cache trees of isolated warm-up cells, per family (artifactd.build.treemerge).

Every test builds real trees on disk (the libraries' layouts from cachetrees)
and merges them into a fresh destination.
"""

from __future__ import annotations

import ast
import json
import os
import pprint
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

import pytest
from cachetrees import (
    FLASHINFER_T0,
    VLLM_CLEAN_HASH,
    make_flashinfer_tree,
    make_triton_tree,
    make_vllm_tree,
    ninja_log,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from artifactd.build.treemerge import FamilyMerge, merge_family
from artifactd.errors import BuildError
from artifactd.families import FAMILIES
from artifactd.families.base import ROOT_PLACEHOLDER
from artifactd.families.ninjarecords import ninja_relocation_problem
from artifactd.families.vllm import merge_handles

GENERIC = FAMILIES["generic"]
TRITON = FAMILIES["triton"]
VLLM = FAMILIES["vllm"]
FLASHINFER = FAMILIES["flashinfer"]


def write(root: Path, files: Mapping[str, bytes]) -> Path:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    root.mkdir(parents=True, exist_ok=True)
    return root


def tree(root: Path) -> dict[str, bytes | str]:
    """Every file (its bytes) and symlink (``-> target``) under ``root``, by relative path."""
    out: dict[str, bytes | str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                out[rel] = "-> " + os.readlink(path)
            elif path.is_file():
                out[rel] = path.read_bytes()
    return out


def merge_cache(
    family_name: str, cells: Mapping[str, Path], dest: Path, component: str = "cache"
) -> FamilyMerge:
    return merge_family(
        FAMILIES[family_name],
        [(cell, {component: root}) for cell, root in cells.items()],
        {component: dest},
    )


# --------------------------------------------------------------------------
# Union, duplicates, conflicts
# --------------------------------------------------------------------------


def test_disjoint_trees_merge_into_their_union(tmp_path: Path) -> None:
    a = write(tmp_path / "a", {"x/k1.cubin": b"one", "top.so": b"\x7fELF1"})
    b = write(tmp_path / "b", {"x/k2.cubin": b"two", "y/z/k3.cubin": b"three"})
    (a / "top.so").chmod(0o755)
    result = merge_cache("generic", {"a": a, "b": b}, tmp_path / "dest")
    assert result.ok
    assert tree(tmp_path / "dest") == {
        "x/k1.cubin": b"one",
        "x/k2.cubin": b"two",
        "top.so": b"\x7fELF1",
        "y/z/k3.cubin": b"three",
    }
    assert result.files_written == 4
    assert result.bytes_written == 3 + 3 + 5 + 5
    assert result.duplicates == 0
    assert stat.S_IMODE((tmp_path / "dest" / "top.so").stat().st_mode) == 0o755


def test_identical_duplicates_are_kept_once(tmp_path: Path) -> None:
    same = {"k/shared.cubin": b"same bytes", "k/own.cubin": b"a"}
    a = write(tmp_path / "a", same)
    b = write(tmp_path / "b", {"k/shared.cubin": b"same bytes", "k/other.cubin": b"b"})
    result = merge_cache("generic", {"a": a, "b": b}, tmp_path / "dest")
    assert result.ok
    assert result.duplicates == 1
    assert result.files_written == 3
    assert tree(tmp_path / "dest")["k/shared.cubin"] == b"same bytes"


def test_differing_bytes_are_one_conflict_naming_both_cells(tmp_path: Path) -> None:
    a = write(tmp_path / "a", {"k/kernel.cubin": b"from a", "k/a.cubin": b"a"})
    b = write(tmp_path / "b", {"k/kernel.cubin": b"from b", "k/b.cubin": b"b"})
    result = merge_cache("generic", {"cell-a": a, "cell-b": b}, tmp_path / "dest")
    assert not result.ok
    [conflict] = result.conflicts
    assert (conflict.family, conflict.component, conflict.path) == (
        "generic",
        "cache",
        "k/kernel.cubin",
    )
    assert (conflict.first, conflict.other) == ("cell-a", "cell-b")
    assert "cell-a" in conflict.describe()
    assert "cell-b" in conflict.describe()
    merged = tree(tmp_path / "dest")
    assert merged["k/kernel.cubin"] == b"from a"  # the first cell's entry stays
    assert merged["k/b.cubin"] == b"b"  # the rest still merges


def test_file_against_directory_and_link_against_file_conflict(tmp_path: Path) -> None:
    a = write(tmp_path / "a", {"entry": b"a file", "k/x.cubin": b"x"})
    b = write(tmp_path / "b", {"entry/inside.cubin": b"under a dir", "k/y.cubin": b"y"})
    (b / "k" / "x.cubin").symlink_to("y.cubin")
    result = merge_cache("generic", {"a": a, "b": b}, tmp_path / "dest")
    reasons = {c.path: c.reason for c in result.conflicts}
    assert set(reasons) == {"entry", "k/x.cubin"}
    assert "directory" in reasons["entry"]
    assert "symlink" in reasons["k/x.cubin"]
    merged = tree(tmp_path / "dest")
    assert merged["entry"] == b"a file"
    assert "entry/inside.cubin" not in merged  # nothing is written under the other's dir
    assert merged["k/x.cubin"] == b"x"


def test_missing_components_and_dirs_are_passed_over(tmp_path: Path) -> None:
    a = write(tmp_path / "a", {"k.cubin": b"k"})
    result = merge_family(
        GENERIC,
        [("a", {"cache": a}), ("b", {}), ("c", {"cache": tmp_path / "absent"})],
        {"cache": tmp_path / "dest"},
    )
    assert result.ok
    assert tree(tmp_path / "dest") == {"k.cubin": b"k"}


# --------------------------------------------------------------------------
# Path-bearing files: Triton group files, vLLM handles
# --------------------------------------------------------------------------


def test_triton_cells_merge_with_group_files_relocated(tmp_path: Path) -> None:
    a = make_triton_tree(tmp_path / "a" / "triton", ("add", "shared"))
    b = make_triton_tree(tmp_path / "b" / "triton", ("mul", "shared"))
    dest = tmp_path / "dest" / "triton"
    result = merge_cache("triton", {"a": a, "b": b}, dest)
    assert result.ok, [c.describe() for c in result.conflicts]
    merged = tree(dest)
    groups = {rel: data for rel, data in merged.items() if "__grp__" in rel}
    assert {PurePosixPath(r).name for r in groups} == {
        "__grp__add.json",
        "__grp__mul.json",
        "__grp__shared.json",
    }
    for data in groups.values():
        assert isinstance(data, bytes)
        children = json.loads(data)["child_paths"]
        assert len(children) == 3
        for child in children.values():
            assert child.startswith(str(dest) + "/")
            assert Path(child).is_file()
        assert str(tmp_path / "a") not in data.decode()
        assert str(tmp_path / "b") not in data.decode()
    # the shared kernel (three children and its group file) is kept once
    assert result.duplicates == 4
    shared = [r for r in merged if PurePosixPath(r).stem == "shared"]
    assert len(shared) == 3
    # Triton's tmp.pid_* staging dir is excluded, as the packer excludes it
    assert not any(r.startswith("tmp.pid_") for r in merged)
    assert {s.path for s in result.skipped} == {"tmp.pid_123_abc"}


def test_triton_group_files_from_other_roots_that_differ_conflict(tmp_path: Path) -> None:
    a = make_triton_tree(tmp_path / "a", ("add",))
    b = make_triton_tree(tmp_path / "b", ("add",))
    grp = b / ("A" * 52) / "__grp__add.json"
    doc = json.loads(grp.read_text())
    doc["child_paths"]["extra.cubin"] = str(b / "elsewhere.cubin")
    grp.write_text(json.dumps(doc))
    result = merge_cache("triton", {"a": a, "b": b}, tmp_path / "dest")
    assert [c.path for c in result.conflicts] == [f"{'A' * 52}/__grp__add.json"]


def _handles_path(root: Path, rank: str = "rank_0_0") -> Path:
    return root / "torch_compile_cache" / VLLM_CLEAN_HASH / rank / "backbone"


def _write_handles(d: Path, ranges: list[tuple[int, int, int]]) -> dict[object, object]:
    handles: dict[object, object] = {}
    for lo, hi, i in ranges:
        key = f"artifact_compile_range_{lo}_{hi}_subgraph_{i}"
        (d / key).write_bytes(b"PK\x03\x04" + key.encode() * 20)
        handles[((lo, hi), f"{i:02x}" * 32, "inductor_standalone")] = (key, str(d / key))
    (d / "vllm_compile_cache.py").write_text(pprint.PrettyPrinter(indent=4).pformat(handles))
    return handles


def _vllm_sources(root: Path) -> dict[str, Path]:
    return {"cache": root, "deep_gemm": root / "deep_gemm"}


def _vllm_dest(dest: Path) -> dict[str, Path]:
    return {"cache": dest / "vllm", "deep_gemm": dest / "vllm" / "deep_gemm"}


def test_vllm_handle_files_of_one_hash_dir_merge_entry_by_entry(tmp_path: Path) -> None:
    a = make_vllm_tree(tmp_path / "a" / "vllm")
    b = make_vllm_tree(tmp_path / "b" / "vllm")
    d_b = _handles_path(b)
    for p in d_b.glob("artifact_compile_range_*"):
        p.unlink()
    _write_handles(d_b, [(16385, 32768, 2), (32769, 65536, 3)])
    dest = tmp_path / "dest"
    result = merge_family(
        VLLM, [("a", _vllm_sources(a)), ("b", _vllm_sources(b))], _vllm_dest(dest)
    )
    assert result.ok, [c.describe() for c in result.conflicts]
    merged_dir = _handles_path(dest / "vllm")
    doc = ast.literal_eval((merged_dir / "vllm_compile_cache.py").read_text())
    assert isinstance(doc, dict)
    assert sorted(k[0] for k in doc) == [(1, 8192), (8193, 16384), (16385, 32768), (32769, 65536)]
    for name, path in doc.values():
        assert path == str(merged_dir / name)  # relocated to the merged tree
        assert Path(path).is_file()
    # the file is re-emitted as vLLM writes it
    assert (merged_dir / "vllm_compile_cache.py").read_text() == pprint.PrettyPrinter(
        indent=4
    ).pformat(doc)
    rel = merged_dir.relative_to(dest / "vllm") / "vllm_compile_cache.py"
    [resolved] = result.resolved
    assert (resolved.family, resolved.component, resolved.path) == ("vllm", "cache", rel.as_posix())
    assert resolved.cells == ("a", "b")
    merged = tree(dest / "vllm")
    # what vLLM's packer leaves out is not merged either
    assert not any(r.startswith("modelinfos") for r in merged)
    assert not any(r.endswith(".tmp") or "/locks/" in r for r in merged)
    assert not any(r.startswith("deep_gemm/tmp") for r in merged)
    assert "deep_gemm/cache/kernel.sm90_fp8_gemm_1d2d.0123456789abcdef/kernel.cubin" in merged
    assert not any("00000000deadbeef" in r for r in merged)  # partial DeepGEMM entry
    # the other rank and hash dir were identical in both cells: kept once
    assert result.duplicates > 0
    other = _handles_path(dest / "vllm", "rank_1_0") / "vllm_compile_cache.py"
    assert str(dest / "vllm") in other.read_text()


def test_vllm_handle_key_with_two_values_conflicts(tmp_path: Path) -> None:
    a = make_vllm_tree(tmp_path / "a" / "vllm")
    b = make_vllm_tree(tmp_path / "b" / "vllm")
    d_b = _handles_path(b)
    handles = ast.literal_eval((d_b / "vllm_compile_cache.py").read_text())
    key = next(iter(handles))
    handles[key] = ("artifact_other", str(d_b / "artifact_other"))
    (d_b / "artifact_other").write_bytes(b"PK other")
    (d_b / "vllm_compile_cache.py").write_text(pprint.PrettyPrinter(indent=4).pformat(handles))
    result = merge_family(
        VLLM, [("a", _vllm_sources(a)), ("b", _vllm_sources(b))], _vllm_dest(tmp_path / "d")
    )
    [conflict] = result.conflicts
    assert conflict.path.endswith(f"{VLLM_CLEAN_HASH}/rank_0_0/backbone/vllm_compile_cache.py")
    assert (conflict.first, conflict.other) == ("a", "b")
    assert not result.resolved


def test_vllm_differing_hash_factors_conflict(tmp_path: Path) -> None:
    a = make_vllm_tree(tmp_path / "a" / "vllm")
    b = make_vllm_tree(tmp_path / "b" / "vllm")
    factors = _handles_path(b) / "cache_key_factors.json"
    doc = json.loads(factors.read_text())
    doc["env"]["VLLM_FUSED_MOE_CHUNK_SIZE"] = 65536
    factors.write_text(json.dumps(doc, indent=2, sort_keys=True))
    result = merge_family(
        VLLM, [("a", _vllm_sources(a)), ("b", _vllm_sources(b))], _vllm_dest(tmp_path / "d")
    )
    assert [c.path.rsplit("/", 1)[-1] for c in result.conflicts] == ["cache_key_factors.json"]
    assert VLLM.merge_file("cache", PurePosixPath("x/cache_key_factors.json"), b"{}", b"[]") is None


def test_vllm_merge_handles_rule() -> None:
    fmt = pprint.PrettyPrinter(indent=4).pformat
    ours = {((1, 2), "k1", "s"): ("a1", f"{ROOT_PLACEHOLDER}/a1")}
    theirs = {((3, 4), "k2", "s"): ("a2", f"{ROOT_PLACEHOLDER}/a2")}
    merged = merge_handles(fmt(ours).encode(), fmt(theirs).encode())
    assert merged is not None
    assert ast.literal_eval(merged.decode()) == {**ours, **theirs}
    assert merged.decode() == fmt({**ours, **theirs})
    same_key = {((1, 2), "k1", "s"): ("other", f"{ROOT_PLACEHOLDER}/other")}
    assert merge_handles(fmt(ours).encode(), fmt(same_key).encode()) is None
    assert merge_handles(fmt(ours).encode(), b"__import__('os').system('false')") is None
    assert merge_handles(fmt(ours).encode(), b"[1, 2]") is None
    # only the handle file of the cache component merges
    rel = PurePosixPath("torch_compile_cache/h/rank_0_0/backbone/vllm_compile_cache.py")
    assert VLLM.merge_file("cache", rel, fmt(ours).encode(), fmt(theirs).encode()) == merged
    assert VLLM.merge_file("deep_gemm", rel, fmt(ours).encode(), fmt(theirs).encode()) is None
    assert GENERIC.merge_file("cache", rel, b"a", b"b") is None


def test_three_cells_resolve_one_handle_file(tmp_path: Path) -> None:
    cells: dict[str, Path] = {}
    for i, name in enumerate(("c1", "c2", "c3")):
        root = tmp_path / name / "vllm"
        d = _handles_path(root)
        d.mkdir(parents=True)
        _write_handles(d, [(i * 10 + 1, i * 10 + 10, i)])
        cells[name] = root
    dest = tmp_path / "dest" / "vllm"
    result = merge_cache("vllm", cells, dest)
    assert result.ok
    [resolved] = result.resolved
    assert resolved.cells == ("c1", "c2", "c3")
    doc = ast.literal_eval((_handles_path(dest) / "vllm_compile_cache.py").read_text())
    assert len(doc) == 3


# --------------------------------------------------------------------------
# mtimes, symlinks, exclusions
# --------------------------------------------------------------------------


def test_keep_mtimes_family_keeps_source_mtimes(tmp_path: Path) -> None:
    a = make_flashinfer_tree(tmp_path / "a")
    b = tmp_path / "b" / ".cache" / "flashinfer"
    extra = write(b, {"0.6.18/90a/autotune/other_ws4.json": b'{"tactics": []}'})
    (extra / "0.6.18/90a/autotune/other_ws4.json").touch()
    os.utime(extra / "0.6.18/90a/autotune/other_ws4.json", (1_600_000_123, 1_600_000_123))
    dest = tmp_path / "dest" / ".cache" / "flashinfer"
    result = merge_cache("flashinfer", {"a": a, "b": b}, dest)
    assert result.ok
    merged = tree(dest)
    assert "0.6.18/90a/autotune/other_ws4.json" in merged
    checked = 0
    for rel in merged:
        src = a / rel if (a / rel).exists() else b / rel
        if (dest / rel).is_symlink():
            continue
        assert (dest / rel).stat().st_mtime_ns == src.stat().st_mtime_ns, rel
        checked += 1
    assert checked > 10
    so = next(r for r in merged if r.endswith("norm/norm.so"))
    assert (dest / so).stat().st_mode & 0o111
    # directory mtimes survive the writes into them
    ops = "0.6.18/90a/cached_ops/norm"
    assert (dest / ops).stat().st_mtime_ns == (a / ops).stat().st_mtime_ns
    # ninja's records moved with the tree: they name the merged root, hashes and all
    assert ninja_relocation_problem(dest / ops, (str(dest),)) is None
    assert str(a).encode() not in (dest / ops / ".ninja_deps").read_bytes()
    # the packer's exclusions and invalid entries stay out
    assert not any("/cached_ops/tmp" in r or r.endswith((".lock", ".tmp")) for r in merged)
    assert not any(r.endswith("flashinfer_jit.log") for r in merged)
    assert not any("/cached_ops/rope" in r for r in merged)  # no .so: ninja rebuilds it
    # the absolute link into the cubin dir leaves the root: not merged, as not packed
    reasons = {s.path: s.reason for s in result.skipped}
    link = "0.6.18/90a/generated/flashinfer/trtllm/batched_gemm/trtllmGen_bmm_export"
    assert reasons[link].startswith("symlink leaves root")


def test_symlinks_within_a_component_are_recreated(tmp_path: Path) -> None:
    a = write(tmp_path / "a", {"sub/k.cubin": b"k", "locks/x": b"", "k.lock": b""})
    (a / "sub" / "alias.cubin").symlink_to("k.cubin")
    (a / "top").symlink_to("sub")
    (a / "escape").symlink_to("../outside")
    (a / "absolute").symlink_to("/etc/passwd")
    b = write(tmp_path / "b", {"sub/m.cubin": b"m"})
    (b / "sub" / "alias.cubin").symlink_to("k.cubin")  # same link: a duplicate
    dest = tmp_path / "dest"
    result = merge_cache("generic", {"a": a, "b": b}, dest)
    assert result.ok
    assert tree(dest) == {
        "sub/k.cubin": b"k",
        "sub/m.cubin": b"m",
        "sub/alias.cubin": "-> k.cubin",
        "top": "-> sub",
    }
    assert result.links_written == 2
    assert result.duplicates == 1
    assert {s.path for s in result.skipped} == {"locks", "k.lock", "escape", "absolute"}


def test_links_with_other_targets_conflict(tmp_path: Path) -> None:
    a = write(tmp_path / "a", {"x.cubin": b"x", "y.cubin": b"y"})
    b = write(tmp_path / "b", {})
    (a / "l").symlink_to("x.cubin")
    (b / "l").symlink_to("y.cubin")
    result = merge_cache("generic", {"a": a, "b": b}, tmp_path / "dest")
    [conflict] = result.conflicts
    assert conflict.path == "l"
    assert os.readlink(tmp_path / "dest" / "l") == "x.cubin"


# --------------------------------------------------------------------------
# What the merge refuses
# --------------------------------------------------------------------------


def test_destination_overlapping_a_source_is_refused(tmp_path: Path) -> None:
    a = write(tmp_path / "a", {"k.cubin": b"k"})
    with pytest.raises(BuildError, match="overlaps"):
        merge_cache("generic", {"a": a}, a / "merged")
    with pytest.raises(BuildError, match="overlaps"):
        merge_cache("generic", {"a": a}, tmp_path)
    assert not (a / "merged").exists()


def test_destination_already_holding_a_path_is_refused(tmp_path: Path) -> None:
    a = write(tmp_path / "a", {"d/k.cubin": b"k"})
    outside = write(tmp_path / "outside", {})
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "d").symlink_to(outside)
    with pytest.raises(BuildError, match="already holds"):
        merge_cache("generic", {"a": a}, dest)
    assert tree(outside) == {}


def test_component_without_destination_is_refused(tmp_path: Path) -> None:
    a = write(tmp_path / "a", {"k.cubin": b"k"})
    with pytest.raises(BuildError, match="no merge destination"):
        merge_family(GENERIC, [("a", {"cache": a})], {})


# --------------------------------------------------------------------------
# Property: a union of disjoint trees; a tree merged with itself
# --------------------------------------------------------------------------

_paths = st.builds(
    lambda dirs, name: "/".join([*dirs, name]),
    st.lists(st.sampled_from(["d1", "d2", "d3"]), max_size=3),
    st.sampled_from(["f1.cubin", "f2.so", "f3.ptx", "f4"]),
)
_trees = st.dictionaries(_paths, st.binary(max_size=64), max_size=16)


@settings(max_examples=40, deadline=None)
@given(files=_trees, data=st.data())
def test_merging_disjoint_trees_gives_their_union(
    files: dict[str, bytes], data: st.DataObject
) -> None:
    n = data.draw(st.integers(min_value=1, max_value=4), label="cells")
    owner = {rel: data.draw(st.integers(0, n - 1), label=rel) for rel in sorted(files)}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        cells = {
            f"cell{i}": write(base / f"cell{i}", {r: d for r, d in files.items() if owner[r] == i})
            for i in range(n)
        }
        result = merge_cache("generic", cells, base / "dest")
        assert result.ok
        assert result.duplicates == 0
        assert result.files_written == len(files)
        assert result.bytes_written == sum(len(d) for d in files.values())
        assert tree(base / "dest") == files


@settings(max_examples=40, deadline=None)
@given(files=_trees)
def test_merging_a_tree_with_itself_gives_the_tree(files: dict[str, bytes]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        root = write(base / "cell", files)
        result = merge_family(
            GENERIC, [("a", {"cache": root}), ("b", {"cache": root})], {"cache": base / "dest"}
        )
        assert result.ok
        assert result.duplicates == len(files)
        assert tree(base / "dest") == files


def test_inductor_keyed_paths_keep_the_first_copy_whatever_their_bytes(tmp_path: Path) -> None:
    """Two cells compiled one kernel (one key path) into other bytes: no conflict, first kept.

    Measured with the CPU demo at two batch sizes: shared kernel ``.so`` paths
    and the precompiled header differ in bytes (build ids). Mega-Cache files
    are not keyed: they still conflict.
    """
    fam = FAMILIES["inductor"]
    sources = []
    for cell, body in (("a", b"\x7fELF-one"), ("b", b"\x7fELF-two")):
        cache = tmp_path / cell / "cache" / "c2" / "c2kernel"
        cache.mkdir(parents=True)
        (cache / "c2kernel.so").write_bytes(body)
        mega = tmp_path / cell / "mega"
        mega.mkdir()
        (mega / "blob.bin").write_bytes(body)
        sources.append((cell, {"cache": tmp_path / cell / "cache", "megacache": mega}))
    dest = {"cache": tmp_path / "out" / "cache", "megacache": tmp_path / "out" / "mega"}
    result = merge_family(fam, sources, dest)
    assert (dest["cache"] / "c2" / "c2kernel" / "c2kernel.so").read_bytes() == b"\x7fELF-one"
    assert [(c.component, c.path) for c in result.conflicts] == [("megacache", "blob.bin")]


def test_two_cells_that_built_one_flashinfer_op_merge_into_one_copy(tmp_path: Path) -> None:
    """Each cell builds under its own root, and nvcc embeds the generated source's path.

    Measured with flashinfer 0.7.2: the same op built under two roots gives
    ``.cuda.o`` and ``.so`` files differing in that path only. Either serves;
    the merge keeps the first cell's whole op dir, its ninja records included,
    moved to the merged root.
    """
    a = make_flashinfer_tree(tmp_path / "a")
    b = make_flashinfer_tree(tmp_path / "b")
    ops = "0.6.18/90a/cached_ops/norm"
    for cell in (a, b):  # the objects name their own root, as nvcc's do
        for obj in (cell / ops).glob("*.o"):
            mtime = obj.stat().st_mtime_ns
            obj.write_bytes(obj.read_bytes() + str(cell).encode())
            os.utime(obj, ns=(mtime, mtime))
    dest = tmp_path / "dest" / ".cache" / "flashinfer"
    result = merge_cache("flashinfer", {"a": a, "b": b}, dest)
    assert result.ok, result.conflicts
    obj = dest / ops / "csrc_norm.cuda.o"
    assert obj.read_bytes() == (a / ops / "csrc_norm.cuda.o").read_bytes()
    assert ninja_relocation_problem(dest / ops, (str(dest),)) is None


def test_two_cells_that_built_one_flashinfer_op_with_other_flags_conflict(tmp_path: Path) -> None:
    a = make_flashinfer_tree(tmp_path / "a")
    b = make_flashinfer_tree(tmp_path / "b")
    op = b / "0.6.18/90a/cached_ops/norm"
    text = (op / "build.ninja").read_text().replace("--threads=1", "--threads=4")
    (op / "build.ninja").write_text(text)
    # b built it so: its log holds the hashes of these commands
    outputs = [*sorted(op.glob("*.o")), op / "norm.so"]
    (op / ".ninja_log").write_text(ninja_log(text, outputs, FLASHINFER_T0))
    result = merge_cache("flashinfer", {"a": a, "b": b}, tmp_path / "dest")
    assert [c.path for c in result.conflicts] == ["0.6.18/90a/cached_ops/norm/build.ninja"]
