"""DeepGEMM, TileLang, CuTe DSL / FA4 and CUDA driver JIT families on trees in real layouts."""

from __future__ import annotations

import ast
import json
import os
import pwd
import sys
from pathlib import Path, PurePosixPath

import layers
import pytest
from cachetrees import (
    make_cudajit_tree,
    make_cutedsl_tree,
    make_deepgemm_tree,
    make_fa4_tree,
    make_tilelang_tree,
    tilelang_manifest,
)

import artifactd.families as pkg
from artifactd.errors import UsageError
from artifactd.families import FAMILIES, select_families
from artifactd.families.base import ROOT_PLACEHOLDER, Family, Located, sanitize_user
from artifactd.families.cudajit import CudaJitFamily
from artifactd.families.cutedsl import CuteDSLFamily
from artifactd.families.deepgemm import PARTIAL_REASON, DeepGEMMFamily
from artifactd.families.layouts import DEEPGEMM_NO_CUBIN_REASON
from artifactd.families.tilelang import TileLangFamily
from artifactd.families.tree import walk_component
from artifactd.fingerprint.model import Fingerprint, LibraryInfo
from artifactd.format.archive import PackedLayer

DEEPGEMM = DeepGEMMFamily()
TILELANG = TileLangFamily()
CUTEDSL = CuteDSLFamily()
CUDAJIT = CudaJitFamily()
MINE: tuple[Family, ...] = (DEEPGEMM, TILELANG, CUTEDSL, CUDAJIT)


def pack(fam: Family, located: list[Located], tmp_path: Path) -> PackedLayer:
    return layers.pack(fam, located, tmp_path / f"{fam.name}.tar.zst")


def packed(layer: PackedLayer) -> set[str]:
    return {f.path for f in layer.files}


def skipped(layer: PackedLayer) -> dict[str, str]:
    return {s.path: s.reason for s in layer.skipped}


def roundtrip(fam: Family, located: list[Located], layer: PackedLayer, staging: Path) -> None:
    """Unpack the layer and check every packed file came back byte for byte."""
    result = layers.unpack(layer, staging)
    assert result.files == len(layer.files)
    roots = {loc.component.name: loc.path for loc in located}
    for entry in layer.files:
        comp, _, rel = entry.path.partition("/")
        assert (staging / entry.path).read_bytes() == (roots[comp] / rel).read_bytes()


# --------------------------------------------------------------------------
# locate: env var and default
# --------------------------------------------------------------------------


def test_locate_by_env_and_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home, tmp = tmp_path / "home", tmp_path / "tmpdir"
    base = {"HOME": str(home), "TMPDIR": str(tmp), "USER": "alice"}
    assert all(fam.locate(base) == [] for fam in MINE)  # nothing there yet

    defaults = {
        DEEPGEMM: home / ".deep_gemm",
        TILELANG: home / ".tilelang" / "cache",
        CUTEDSL: tmp / "alice" / "cutlass_python_cache",
        CUDAJIT: home / ".nv" / "ComputeCache",
    }
    for path in defaults.values():
        path.mkdir(parents=True)
    fa4_default = tmp / sanitize_user(None) / "flash_attention_cute_dsl_cache"
    fa4_default.mkdir(parents=True)
    for fam, path in defaults.items():
        found = fam.locate(base)
        assert found[0].path == path, fam.name
        assert found[0].component is fam.components[0]
    assert [(loc.component.name, loc.path) for loc in CUTEDSL.locate(base)] == [
        ("cache", defaults[CUTEDSL]),
        ("fa4", fa4_default),
    ]

    env_dirs = {
        "DG_JIT_CACHE_DIR": tmp_path / "dg",
        "TILELANG_CACHE_DIR": tmp_path / "tl",
        "CUTE_DSL_CACHE_DIR": tmp_path / "cute",
        "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": tmp_path / "fa4",
        "CUDA_CACHE_PATH": tmp_path / "nv",
    }
    for path in env_dirs.values():
        path.mkdir()
    environ = {**base, **{k: str(v) for k, v in env_dirs.items()}}
    assert DEEPGEMM.locate(environ)[0].path == env_dirs["DG_JIT_CACHE_DIR"]
    assert TILELANG.locate(environ)[0].path == env_dirs["TILELANG_CACHE_DIR"]
    assert CUDAJIT.locate(environ)[0].path == env_dirs["CUDA_CACHE_PATH"]
    assert [loc.path for loc in CUTEDSL.locate(environ)] == [
        env_dirs["CUTE_DSL_CACHE_DIR"],
        env_dirs["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"],
    ]
    # A configured dir that does not exist is not found, even with the default present.
    missing = {**base, "DG_JIT_CACHE_DIR": str(tmp_path / "absent")}
    assert DEEPGEMM.locate(missing) == []
    # CuTe DSL falls back to $USERNAME for its per-user default.
    alt = {"TMPDIR": str(tmp), "USERNAME": "bob"}
    (tmp / "bob" / "cutlass_python_cache").mkdir(parents=True)
    assert CUTEDSL.locate(alt)[0].path == tmp / "bob" / "cutlass_python_cache"
    # Neither set: the uid's login name, never $LOGNAME (which getpass.getuser() reads first).
    login = tmp / pwd.getpwuid(os.getuid()).pw_name / "cutlass_python_cache"
    login.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("LOGNAME", "not-the-login")
    logname = {"TMPDIR": str(tmp), "LOGNAME": "not-the-login"}
    (tmp / "not-the-login" / "cutlass_python_cache").mkdir(parents=True)
    assert CUTEDSL.locate(logname)[0].path == login


def test_restore_locations_and_env(tmp_path: Path) -> None:
    target = tmp_path / "t"
    assert DEEPGEMM.restore_env(target) == {"DG_JIT_CACHE_DIR": str(target / "deepgemm")}
    assert TILELANG.restore_env(target) == {"TILELANG_CACHE_DIR": str(target / "tilelang")}
    assert CUDAJIT.restore_env(target) == {"CUDA_CACHE_PATH": str(target / "cuda-jit")}
    # CuTe DSL hashes a set CUTE_DSL_CACHE_DIR into its keys: restore where its
    # default lookup finds the files, under TMPDIR, and leave the variable unset.
    dirs = CUTEDSL.restore_dirs(target, user="carol")
    assert dirs == {
        "cache": target / "tmp" / "carol" / "cutlass_python_cache",
        "fa4": target / "fa4",
    }
    env = CUTEDSL.restore_env(target, user="carol")
    assert env == {
        "TMPDIR": str(target / "tmp"),
        "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": str(target / "fa4"),
        "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "1",
    }
    assert "CUTE_DSL_CACHE_DIR" not in env
    # What CuTe DSL itself would look up under the restored env is the restored dir.
    restored = {**env, "USER": "carol"}
    dirs["cache"].mkdir(parents=True)
    assert CUTEDSL.locate(restored)[0].path == dirs["cache"]


# --------------------------------------------------------------------------
# harvest-level packing: exclusions, invalid entries, round trip
# --------------------------------------------------------------------------


def test_deepgemm_pack_skips_staging_and_partial_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = make_deepgemm_tree(tmp_path / "dg")
    site = tmp_path / "site-packages"
    (site / "deep_gemm").mkdir(parents=True)
    (site / "deep_gemm" / "__init__.py").write_text("")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "nowhere"), str(site)])
    located = DEEPGEMM.locate({"DG_JIT_CACHE_DIR": str(root)})
    layer = pack(DEEPGEMM, located, tmp_path)

    good = "cache/cache/kernel.sm90_fp8_gemm_1d2d.0123456789abcdef"
    ptx = "cache/cache/kernel.sm90_bf16_gemm.fedcba9876543210"
    dj = "cache/cache/sm90_fp8_gemm_1d2d.00c0ffee00c0ffee"
    assert packed(layer) == {
        f"{good}/kernel.cu",
        f"{good}/kernel.cubin",
        f"{ptx}/kernel.cu",
        f"{ptx}/kernel.cubin",
        f"{ptx}/kernel.ptx",
        *(f"{dj}/{n}" for n in ("kernel.cu", "kernel.cubin", "meta.json", ".committed")),
    }
    assert skipped(layer) == {
        "cache/cache/kernel.sm90_fp8_gemm_1d1d.00000000deadbeef": PARTIAL_REASON,
        "cache/cache/sm90_bf16_gemm.00000000000000aa": PARTIAL_REASON,
        "cache/cache/sm90_bf16_gemm.00000000000000bb": DEEPGEMM_NO_CUBIN_REASON,
        "cache/tmp": "excluded by family",
        "cache/locks": "excluded by family",
    }
    # The include flag's site-packages is pinned; found without importing DeepGEMM.
    assert layer.pinned == [str(site)]
    roundtrip(DEEPGEMM, located, layer, tmp_path / "staging")


def test_deepgemm_entry_missing_either_file_is_invalid(tmp_path: Path) -> None:
    root = tmp_path / "dg"
    for entry, files in {
        "kernel.a.1": ["kernel.cubin"],
        "kernel.b.2": [],
        "kernel.c.3": [],
    }.items():
        (root / "cache" / entry).mkdir(parents=True)
        for name in files:
            (root / "cache" / entry / name).write_bytes(b"x")
    (root / "cache" / "kernel.c.3" / "kernel.cu").write_bytes(b"x")
    (root / "cache" / "kernel.c.3" / "kernel.cubin").write_bytes(b"x")
    bad = DEEPGEMM.invalid_entries("cache", root)
    assert bad == {
        PurePosixPath("cache/kernel.a.1"): PARTIAL_REASON,
        PurePosixPath("cache/kernel.b.2"): PARTIAL_REASON,
    }
    # Only the top-level tmp/ is staging; a dir called tmp deeper down is data.
    assert DEEPGEMM.excluded("cache", PurePosixPath("tmp"), True)
    assert not DEEPGEMM.excluded("cache", PurePosixPath("cache/x/tmp"), True)
    assert DEEPGEMM.invalid_entries("cache", tmp_path / "absent") == {}


def test_deepgemm_locates_deep_jit_roots(tmp_path: Path) -> None:
    # sgl-deep-gemm 0.2.x (deep_jit, include/deep_jit/cache/disk.hpp): DG_JIT_CACHE_DIR, else
    # DJ_JIT_CACHE_DIR, is a colon list whose first root is the writable one; unset: ~/.dj.
    home = tmp_path / "home"
    (home / ".deep_gemm").mkdir(parents=True)
    assert [loc.path for loc in DEEPGEMM.locate({"HOME": str(home)})] == [home / ".deep_gemm"]
    (home / ".dj").mkdir()
    assert [loc.path for loc in DEEPGEMM.locate({"HOME": str(home)})] == [home / ".dj"]
    first, second = tmp_path / "rw", tmp_path / "ro"
    first.mkdir()
    second.mkdir()
    env = {"HOME": str(home), "DJ_JIT_CACHE_DIR": f"{first}:{second}"}
    assert [loc.path for loc in DEEPGEMM.locate(env)] == [first]
    env["DG_JIT_CACHE_DIR"] = f"{second}:{first}"
    assert [loc.path for loc in DEEPGEMM.locate(env)] == [second]
    env["DG_JIT_CACHE_DIR"] = str(tmp_path / "absent")
    assert DEEPGEMM.locate(env) == []
    # A hit touches .committed: a load rewrite, never "compiled anyway".
    assert ".committed" in DEEPGEMM.load_rewrites


def test_deepgemm_pins_nothing_without_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    assert DEEPGEMM.pinned_paths("cache", tmp_path) == []


def test_tilelang_pack_verifies_manifests(tmp_path: Path) -> None:
    root = make_tilelang_tree(tmp_path / "tl")
    located = TILELANG.locate({"TILELANG_CACHE_DIR": str(root)})
    layer = pack(TILELANG, located, tmp_path)

    ns = "cache/0.1.15/linux-x86_64"
    kernels = f"{ns}/kernels"
    reasons = skipped(layer)
    assert reasons.pop(f"{kernels}/{'c' * 64}").startswith("partial TileLang entry: no manifest")
    assert reasons.pop(f"{kernels}/{'d' * 64}") == (
        "corrupt TileLang entry: kernel_lib.so does not match manifest.json"
    )
    assert reasons.pop(f"{kernels}/{'e' * 64}") == (
        "corrupt TileLang entry: manifest.json is not readable"
    )
    assert reasons.pop(f"cache/0.1.15/cuda-binaries/{'2' * 64}").startswith(
        "corrupt TileLang binary entry: kernel.cubin"
    )
    assert reasons == {
        f"{ns}/.staging": "excluded by family",
        "cache/0.1.15/.staging": "excluded by family",
    }
    names = packed(layer)
    for key, lib in (("a", "kernel_lib.so"), ("b", "executable.so")):
        for name in ("device_kernel.cu", "host_kernel.cu", lib, "params.json", "manifest.json"):
            assert f"{kernels}/{key * 64}/{name}" in names
    assert f"cache/0.1.15/cuda-binaries/{'1' * 64}/kernel.cubin" in names
    # The 0.1.13 layout has no manifest by design and ships.
    assert f"cache/0.1.13/linux-x86_64/kernels/{'9' * 64}/params.pkl" in names
    assert not [n for n in names if ".staging" in n or ".tmp" in n]
    assert layer.pinned == []
    roundtrip(TILELANG, located, layer, tmp_path / "staging")


def test_tilelang_manifest_edge_cases(tmp_path: Path) -> None:
    root = tmp_path / "tl"
    kernels = root / "0.1.15" / "linux-x86_64" / "kernels"

    def entry(key: str) -> Path:
        d = kernels / key
        d.mkdir(parents=True)
        (d / "params.json").write_text("[]")
        (d / "kernel_lib.so").write_bytes(b"\x7fELF")
        return d

    tilelang_manifest(entry("listed-file-gone"))
    (kernels / "listed-file-gone" / "kernel_lib.so").unlink()
    no_params = entry("no-params")
    (no_params / "params.json").unlink()
    tilelang_manifest(no_params)
    grown = entry("unlisted-extra")
    tilelang_manifest(grown)
    (grown / "kernel.cubin").write_bytes(b"added after publication")  # allowed
    bad = {str(k.name): v for k, v in TILELANG.invalid_entries("cache", root).items()}
    assert bad == {
        "listed-file-gone": (
            "partial TileLang entry: kernel_lib.so (listed in manifest.json) is missing"
        ),
        "no-params": "partial TileLang entry: manifest.json does not list params.json",
    }
    assert TILELANG.excluded("cache", PurePosixPath("0.1.15/x/.kernel_lib.12_ab3f.tmp.so"), False)
    assert TILELANG.excluded("cache", PurePosixPath("tmp"), True)
    assert not TILELANG.excluded("cache", PurePosixPath("0.1.15/x/kernels/k/kernel_lib.so"), False)


def test_cutedsl_pack_checks_crc_and_fa4_objects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cute = make_cutedsl_tree(tmp_path / "cute")
    fa4 = make_fa4_tree(tmp_path / "fa4")
    site = tmp_path / "site-packages"
    (site / "nvidia_cutlass_dsl").mkdir(parents=True)
    monkeypatch.setattr(sys, "path", [str(site)])
    environ = {"CUTE_DSL_CACHE_DIR": str(cute), "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": str(fa4)}
    located = CUTEDSL.locate(environ)
    layer = pack(CUTEDSL, located, tmp_path)

    objs = f"fa4/{'c' * 64}/fwd"
    assert packed(layer) == {
        f"cache/cute_dsl_{'1' * 64}.mlir",
        f"cache/cute_dsl_{'2' * 64}.mlir",
        f"{objs}/{'1' * 64}.o",
        f"{objs}/{'2' * 64}.o",
    }
    assert skipped(layer) == {
        f"cache/cute_dsl_{'3' * 64}.mlir": (
            "corrupt CuTe DSL cache file: CRC32 mismatch (discarded at load)"
        ),
        "cache/tmp.pid_77_0f0e0d0c-0000-1111-2222-333344445555": "excluded by family",
        f"{objs}/{'1' * 64}.lock": "excluded by family",
        f"{objs}/{'2' * 64}.lock": "excluded by family",
        f"{objs}/.{'3' * 64}.0123456789abcdef.tmp.o": "excluded by family",
        f"{objs}/{'4' * 64}.o": "empty FA4 object: fails to load and is recompiled",
    }
    assert layer.pinned == [str(site)]
    roundtrip(CUTEDSL, located, layer, tmp_path / "staging")


def test_cudajit_ships_the_opaque_tree(tmp_path: Path) -> None:
    root = make_cudajit_tree(tmp_path / "nv")
    (root / "tmp.pid_1_x").mkdir()
    located = CUDAJIT.locate({"CUDA_CACHE_PATH": str(root)})
    layer = pack(CUDAJIT, located, tmp_path)
    assert packed(layer) == {"cache/index", "cache/a/3/9c2f41d07e5b8a16"}
    assert skipped(layer) == {"cache/tmp.pid_1_x": "excluded by family"}
    roundtrip(CUDAJIT, located, layer, tmp_path / "staging")


def test_packing_is_reproducible(tmp_path: Path) -> None:
    root = make_deepgemm_tree(tmp_path / "dg")
    located = DEEPGEMM.locate({"DG_JIT_CACHE_DIR": str(root)})
    first = layers.pack(DEEPGEMM, located, tmp_path / "one.tar.zst")
    second = layers.pack(DEEPGEMM, located, tmp_path / "two.tar.zst")
    assert first.digest == second.digest


# --------------------------------------------------------------------------
# scope keys
# --------------------------------------------------------------------------


def _key(fp: Fingerprint, fam: Family) -> str:
    return fp.scope_key(fam.name, fam.scope, fam.scope_revision)


def _keys(fp: Fingerprint) -> dict[str, str]:
    return {fam.name: _key(fp, fam) for fam in MINE}


def _changed(a: Fingerprint, b: Fingerprint) -> set[str]:
    ka, kb = _keys(a), _keys(b)
    return {name for name in ka if ka[name] != kb[name]}


def test_scope_keys(local_fp: Fingerprint) -> None:
    fp = local_fp.model_copy(
        update={
            "gpu": local_fp.gpu.model_copy(
                update={"sm_count": 132, "name": "NVIDIA H100 80GB HBM3"}
            ),
            "driver": local_fp.driver.model_copy(update={"version": "580.65.06"}),
        }
    )

    def variant(section: str, **fields: object) -> Fingerprint:
        return fp.model_copy(update={section: getattr(fp, section).model_copy(update=fields)})

    assert _changed(fp, fp.model_copy(update={"workload": {"model": "other", "tp": "8"}})) == set()
    assert _changed(fp, variant("gpu", sm_count=114)) == {"deepgemm"}
    assert _changed(fp, variant("driver", version="590.10.01")) == {"cuda-jit"}
    assert _changed(fp, variant("gpu", name="NVIDIA H100 PCIe")) == {"cuda-jit"}
    assert _changed(fp, variant("gpu", arch="sm_100a", capability="10.0")) == {
        "deepgemm",
        "tilelang",
        "cutedsl",
        "cuda-jit",
    }
    assert _changed(fp, variant("cuda", nvcc="12.9.86")) == {"deepgemm", "tilelang"}
    assert _changed(fp, variant("paths", site_packages="/elsewhere/site-packages")) == {
        "deepgemm",
        "cutedsl",
    }
    assert _changed(fp, variant("python", version="3.13")) == {"cutedsl"}
    assert _changed(fp, variant("platform", glibc="glibc 2.28")) == {"tilelang"}
    # A library's own version moves only its family.
    for dist, fam in (("deep_gemm", "deepgemm"), ("tilelang", "tilelang")):
        libs = {**fp.libraries, dist: LibraryInfo(version="9.9.9")}
        assert _changed(fp, fp.model_copy(update={"libraries": libs})) == {fam}
    libs = {**fp.libraries, "nvidia-cutlass-dsl": LibraryInfo(version="4.8.0")}
    assert _changed(fp, fp.model_copy(update={"libraries": libs})) == {"cutedsl"}


# --------------------------------------------------------------------------
# The base every family shares
# --------------------------------------------------------------------------


def test_family_is_abstract() -> None:
    with pytest.raises(TypeError, match="abstract"):
        Family()  # type: ignore[abstract]


def test_select_families_none_is_all_and_empty_is_none() -> None:
    assert [f.name for f in select_families(None)] == sorted(FAMILIES)
    assert select_families([]) == []
    assert [f.name for f in select_families([" triton", "triton", ""])] == ["triton"]
    with pytest.raises(UsageError):
        select_families(["nope"])


def test_families_import_only_the_shared_modules() -> None:
    """A family module imports the base and the shared layouts, never another family.

    ``vllmkey`` (vLLM's cache-key recipe) is shared too: it imports no family
    (the vLLM family calls it at harvest, the restore stage at prediction).
    """
    shared = {"base", "layouts", "ninja", "ninjarecords", "tree", "vllmkey"}
    families_dir = Path(pkg.__file__).parent
    for module in sorted(families_dir.glob("*.py")):
        if module.stem in shared | {"__init__"}:
            continue
        tree = ast.parse(module.read_text())
        if not any(
            isinstance(node, ast.ClassDef)
            and any(getattr(b, "id", "").endswith("Family") for b in node.bases)
            for node in tree.body
        ):
            continue  # not a family
        imported = {
            node.module.rsplit(".", 1)[-1]
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.startswith("artifactd.families.")
        }
        assert imported <= shared, (module.name, imported - shared)
        assert "base" in imported, module.name
    recipe = ast.parse((families_dir / "vllmkey.py").read_text())
    assert not [
        n.module
        for n in ast.walk(recipe)
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("artifactd.families")
    ], "vllmkey is shared by importing no family"


@pytest.mark.parametrize("name", ["triton", "inductor", "sglang", "vllm"])
def test_group_files_move_with_the_root_in_every_family_that_hosts_them(name: str) -> None:
    fam = FAMILIES[name]
    rel = PurePosixPath("triton/0/AAAA/__grp__add.json")
    assert fam.path_bearing("cache", rel)
    assert not fam.path_bearing("cache", rel.with_name("add.json"))
    doc = {"child_paths": {"add.cubin": "/build/c/AAAA/add.cubin", "x": "/elsewhere/x"}}
    stored = json.loads(fam.normalize(json.dumps(doc).encode(), ("/build/c",)))
    assert stored["child_paths"] == {
        "add.cubin": f"{ROOT_PLACEHOLDER}/AAAA/add.cubin",
        "x": "/elsewhere/x",
    }
    moved = json.loads(fam.relocate(json.dumps(stored).encode(), "/pod/c"))
    assert moved["child_paths"] == {"add.cubin": "/pod/c/AAAA/add.cubin", "x": "/elsewhere/x"}


def test_packing_and_lint_walk_the_same_tree(tmp_path: Path) -> None:
    """What pack_family ships is exactly what the shared walk yields as not skipped."""
    root = make_deepgemm_tree(tmp_path / "dg")
    (root / "cache" / "stray.lock").write_text("held")
    layer = pack(DEEPGEMM, [Located(DEEPGEMM.components[0], root)], tmp_path)
    walked = list(walk_component(DEEPGEMM, "cache", root))
    shipped = {f"cache/{e.rel.as_posix()}" for e in walked if e.skip is None and e.is_file}
    assert shipped == packed(layer)
    assert {f"cache/{e.rel.as_posix()}": e.skip for e in walked if e.skip} == skipped(layer)
    assert skipped(layer)  # the partial entry, tmp/ and the lock are all left out
