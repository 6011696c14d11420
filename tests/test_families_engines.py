"""FlashInfer, vLLM and SGLang families: locate, pack/unpack round trips, hooks, scopes."""

from __future__ import annotations

import ast
import json
import shutil
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import layers
import pytest
from cachetrees import (
    ENGINE_CUDA,
    ENGINE_SITE,
    FLASHINFER_T0,
    FLASHINFER_VERSION,
    VLLM_AUTOTUNE_TABLES,
    VLLM_CLEAN_HASH,
    VLLM_VOLATILE_HASH,
    make_flashinfer_tree,
    make_sglang_tree,
    make_vllm_tree,
)

import artifactd.families.flashinfer as fi
import artifactd.families.sglang as sg
import artifactd.families.vllm as vl
from artifactd import jsontext
from artifactd.build.harvest import harvest
from artifactd.families import FAMILIES, get_family
from artifactd.families.base import ROOT_PLACEHOLDER, Family, Located
from artifactd.families.flashinfer import FlashInferFamily
from artifactd.families.ninja import NinjaFile
from artifactd.families.ninjarecords import command_hash, ninja_commands
from artifactd.families.sglang import SGLangFamily
from artifactd.families.vllm import (
    WHY_IPV4,
    WHY_IPV6,
    WHY_PORT,
    WHY_RAY,
    WHY_TMP,
    VLLMFamily,
    read_factors,
    volatile_factors,
)
from artifactd.fingerprint.model import Fingerprint, LibraryInfo
from artifactd.fingerprint.probe import TRACKED_LIBRARIES
from artifactd.format.archive import PackedLayer
from artifactd.restore.destination import CacheVolume
from artifactd.restore.install import restore
from artifactd.restore.resolve import noop_plan, plan_restore
from artifactd.restore.source import StoreSource
from artifactd.stores import open_store
from artifactd.trust.policy import UNSAFE_NO_VERIFICATION

FLASHINFER = FlashInferFamily()
VLLM = VLLMFamily()
SGLANG = SGLangFamily()
WS = f"{FLASHINFER_VERSION}/90a"
OPS = f"{WS}/cached_ops"


def round_trip(
    family: Family, located: list[Located], tmp_path: Path
) -> tuple[PackedLayer, dict[str, Path]]:
    """Pack, then unpack into ``tmp_path/staging`` relocating to the staged component dirs."""
    layer = layers.pack(family, located, tmp_path / "layer.tar.zst")
    staging = tmp_path / "staging"
    dirs = {loc.component.name: staging / loc.component.name for loc in located}

    def relocate(member: str, data: bytes) -> bytes:
        return family.relocate(data, str(dirs[member.split("/", 1)[0]]))

    layers.unpack(layer, staging, relocate=relocate, keep_mtimes=family.keep_mtimes)
    return layer, dirs


def skipped(layer: PackedLayer) -> dict[str, str]:
    return {s.path: s.reason for s in layer.skipped}


def shipped(layer: PackedLayer) -> set[str]:
    return {f.path for f in layer.files}


# --------------------------------------------------------------------------
# FlashInfer
# --------------------------------------------------------------------------


def test_flashinfer_locates_workspace_base_then_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert FLASHINFER.locate({"HOME": str(home)}) == []
    default = make_flashinfer_tree(home)
    assert [loc.path for loc in FLASHINFER.locate({"HOME": str(home)})] == [default]
    base = tmp_path / "ws"
    custom = make_flashinfer_tree(base)
    env = {"HOME": str(home), "FLASHINFER_WORKSPACE_BASE": str(base)}
    assert [loc.path for loc in FLASHINFER.locate(env)] == [custom]
    assert custom == base / ".cache" / "flashinfer"


def test_flashinfer_restore_env_names_the_home_like_base(tmp_path: Path) -> None:
    target = tmp_path / "target"
    env = FLASHINFER.restore_env(target)
    assert env == {"FLASHINFER_WORKSPACE_BASE": f"{target}/flashinfer-home"}
    restored = FLASHINFER.restore_dirs(target)["cache"]
    assert restored == target / "flashinfer-home" / ".cache" / "flashinfer"
    # FlashInfer, given that env, finds exactly the restored dir.
    assert FLASHINFER.locate(env) == []
    restored.mkdir(parents=True)
    assert [loc.path for loc in FLASHINFER.locate(env)] == [restored]


def test_flashinfer_round_trip_keeps_mtimes_and_skips_what_ninja_rebuilds(tmp_path: Path) -> None:
    root = make_flashinfer_tree(tmp_path / "home")
    layer, dirs = round_trip(
        FLASHINFER, FLASHINFER.locate({"HOME": str(tmp_path / "home")}), tmp_path
    )
    out = dirs["cache"]
    skip = skipped(layer)
    assert "ninja would rebuild" in skip[f"cache/{OPS}/rope"]
    assert "rope.so" in skip[f"cache/{OPS}/rope"]
    assert ".ninja_log" in skip[f"cache/{OPS}/sampling"]
    assert skip[f"cache/{OPS}/tmp"] == "excluded by family"
    assert skip[f"cache/{WS}/flashinfer_jit.log"] == "excluded by family"
    locks = [p for p in skip if p.endswith((".lock", ".tmp"))]
    assert len(locks) == 2  # the cubin download's lock and temp file
    link = f"cache/{WS}/generated/flashinfer/trtllm/batched_gemm/trtllmGen_bmm_export"
    assert skip[link].startswith("symlink leaves root")  # FlashInfer recreates it
    assert not (out / OPS / "rope").exists()
    assert not (out / OPS / "tmp").exists()

    files = shipped(layer)
    for name in ("build.ninja", "norm.so", ".ninja_log", ".ninja_deps", "csrc_norm.cuda.o"):
        assert f"cache/{OPS}/norm/{name}" in files
    assert any(p.startswith("cache/cubins/") and p.endswith(".cubin") for p in files)
    assert f"cache/{WS}/autotune/pcie_ipc_all_reduce_ws8.json" in files
    # Every shipped file keeps its mtime: ninja sees outputs newer than inputs.
    for entry in layer.files:
        rel = entry.path.split("/", 1)[1]
        assert entry.mtime == int((root / rel).stat().st_mtime)
        assert int((out / rel).stat().st_mtime) == entry.mtime, rel
    norm = out / OPS / "norm"
    assert (norm / "build.ninja").stat().st_mtime == FLASHINFER_T0
    # What ninja recorded names the restored root, with the hashes of its commands there.
    _assert_records_moved(norm, root)
    assert (norm / "norm.so").stat().st_mtime == FLASHINFER_T0 + 20
    assert (norm / "csrc_norm.cuda.o").stat().st_mtime < (norm / "norm.so").stat().st_mtime


def _assert_records_moved(op: Path, root: Path) -> None:
    """The op dir's ninja records name ``op`` (restored), never ``root`` (harvested)."""
    commands = ninja_commands((op / "build.ninja").read_text())
    assert str(root) not in (op / "build.ninja").read_text()
    log = (op / ".ninja_log").read_text().splitlines()
    assert log[0] == "# ninja log v7" and len(log) == 4
    for line in log[1:]:
        output, digest = line.split("\t")[3:]
        assert output.startswith(f"{op}/")
        assert int(digest, 16) == command_hash(commands[output], 7)
    deps = (op / ".ninja_deps").read_bytes()
    assert str(op).encode() in deps and str(root).encode() not in deps


def test_flashinfer_pins_the_paths_its_ninja_files_name_outside_its_root(tmp_path: Path) -> None:
    root = make_flashinfer_tree(tmp_path / "home")
    layer = layers.pack(
        FLASHINFER, FLASHINFER.locate({"HOME": str(tmp_path / "home")}), tmp_path / "l"
    )
    pinned = FLASHINFER.pinned_paths("cache", root)
    assert layer.pinned == sorted(pinned)  # the layer record sorts across components
    # Outputs and generated sources lie under the root, which moves: not pinned.
    assert not [p for p in pinned if p == str(root) or p.startswith(f"{root}/")]
    data = f"{ENGINE_SITE}/flashinfer/data"
    for path in (
        ENGINE_CUDA,
        f"{ENGINE_CUDA}/include",
        f"{ENGINE_CUDA}/bin/nvcc",
        f"{ENGINE_CUDA}/lib64/stubs",
        f"{data}/include",
        f"{data}/csrc",
        f"{data}/cccl/cub",
        f"{ENGINE_SITE}/tvm_ffi/include",
        "/usr/include/python3.12",
    ):
        assert path in pinned, path
    assert pinned == sorted(pinned)


def test_ninja_reader_joins_continuations_and_unescapes_paths() -> None:
    text = (
        "root = /opt/x\n"
        "flags = -I$root/include $\n"
        "    -isystem /usr/local/cuda/include -L${root}/lib\n"
        "rule cc\n"
        "  command = cc $flags $in -o $out\n"
        "  deps = gcc\n"
        "build /b$ dir/a.o | /b$ dir/a.o.d: cc /src$:x/a.c | hdr.h || order\n"
    )
    ninja = NinjaFile(text)
    assert (
        ninja.variables["flags"] == "-I/opt/x/include -isystem /usr/local/cuda/include -L/opt/x/lib"
    )
    assert ninja.builds == [(["/b dir/a.o", "/b dir/a.o.d"], ["/src:x/a.c", "hdr.h", "order"])]
    assert ninja.uses_deps_log
    assert {"/opt/x/include", "/usr/local/cuda/include", "/opt/x/lib", "/src:x"} <= (
        ninja.absolute_paths()
    )


# --------------------------------------------------------------------------
# vLLM
# --------------------------------------------------------------------------


def test_vllm_locates_env_xdg_then_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    default = make_vllm_tree(home / ".cache" / "vllm")
    found = VLLM.locate({"HOME": str(home)})
    assert [(loc.component.name, loc.path) for loc in found] == [
        ("cache", default),
        ("deep_gemm", default / "deep_gemm"),
        ("flashinfer_autotune", default / "flashinfer_autotune_cache"),
    ]
    xdg = make_vllm_tree(tmp_path / "xdg" / "vllm")
    assert VLLM.locate({"HOME": str(home), "XDG_CACHE_HOME": str(tmp_path / "xdg")})[0].path == xdg
    custom = make_vllm_tree(home / "custom")
    env = {
        "HOME": str(home),
        "XDG_CACHE_HOME": str(tmp_path / "xdg"),
        "VLLM_CACHE_ROOT": "~/custom",
    }
    assert VLLM.locate(env)[0].path == custom
    # DG_JIT_CACHE_DIR set: DeepGEMM's dir belongs to the deepgemm family.
    env["DG_JIT_CACHE_DIR"] = str(custom / "deep_gemm")
    assert [loc.component.name for loc in VLLM.locate(env)] == ["cache", "flashinfer_autotune"]
    env["DG_JIT_CACHE_DIR"] = ""  # vLLM treats empty as unset
    # VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR set: the tables are elsewhere, in another layout.
    env["VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"] = str(tmp_path / "tune")
    assert [loc.component.name for loc in VLLM.locate(env)] == ["cache", "deep_gemm"]
    env["VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"] = ""
    assert len(VLLM.locate(env)) == 3


def test_vllm_restore_layout_nests_deep_gemm_under_the_root(tmp_path: Path) -> None:
    target = tmp_path / "t"
    assert VLLM.restore_env(target) == {"VLLM_CACHE_ROOT": str(target / "vllm")}
    dirs = VLLM.restore_dirs(target)
    assert dirs == {
        "cache": target / "vllm",
        "deep_gemm": target / "vllm" / "deep_gemm",
        # vLLM 0.33's default: $VLLM_CACHE_ROOT/flashinfer_autotune_cache, no variable set.
        "flashinfer_autotune": target / "vllm" / "flashinfer_autotune_cache",
    }


def test_vllm_ships_flashinfer_autotune_tables_and_startup_plans(tmp_path: Path) -> None:
    root = make_vllm_tree(tmp_path / "vllm")
    layer, dirs = round_trip(VLLM, VLLM.locate({"VLLM_CACHE_ROOT": str(root)}), tmp_path)
    files = shipped(layer)
    skip = skipped(layer)
    tables = f"flashinfer_autotune/{VLLM_AUTOTUNE_TABLES.split('/', 1)[1]}"
    assert {f"{tables}/autotune_configs_dp0_rank{r}.json" for r in (0, 1)} <= files
    assert not [p for p in files if p.startswith("cache/flashinfer_autotune_cache")]
    assert skip["cache/flashinfer_autotune_cache"] == "excluded by family"  # its own component
    assert skip[f"{tables}/.autotune_configs_dp0_rank1.json.k3j9x2.tmp"] == "excluded by family"
    broken = (
        f"flashinfer_autotune/{FLASHINFER_VERSION}/90/{'0b' * 32}/autotune_configs_dp0_rank0.json"
    )
    assert "not a JSON object" in skip[broken]
    assert "cache/startup_plan/startup_plan_3f1e2d4c5b6a7980.json" in files
    # The build node's P2P topology is not a cache: wrong on other hardware.
    assert skip["cache/gpu_p2p_access_cache_for_0,1.json"] == "excluded by family"
    restored = dirs["flashinfer_autotune"] / VLLM_AUTOTUNE_TABLES.split("/", 1)[1]
    assert json.loads((restored / "autotune_configs_dp0_rank1.json").read_text())["configs"] == {}


def test_vllm_round_trip_relocates_handles_and_group_files(tmp_path: Path) -> None:
    # A blank in the root: pprint splits the handle strings there, text replacement would miss.
    root = make_vllm_tree(tmp_path / "vllm root")
    layer, dirs = round_trip(VLLM, VLLM.locate({"VLLM_CACHE_ROOT": str(root)}), tmp_path)
    out = dirs["cache"]
    files = shipped(layer)
    assert not [p for p in files if p.startswith(("cache/modelinfos", "cache/deep_gemm"))]
    skip = skipped(layer)
    assert skip["cache/modelinfos"] == "excluded by family"
    assert skip["cache/deep_gemm"] == "excluded by family"  # shipped as its own component
    assert (
        "Corrupted JIT cache" in skip["deep_gemm/cache/kernel.sm90_fp8_gemm_1d1d.00000000deadbeef"]
    )
    assert skip["deep_gemm/tmp"] == "excluded by family"
    tcc = "cache/torch_compile_cache"
    assert skip[f"{tcc}/{VLLM_VOLATILE_HASH}/rank_0_0/.4242.139872.tmp"] == "excluded by family"
    assert any(p.endswith("inductor_cache/locks") for p in skip)
    assert (dirs["deep_gemm"] / "cache" / "kernel.sm90_fp8_gemm_1d2d.0123456789abcdef").is_dir()

    rewritten = {f.path for f in layer.files if f.rewrite}
    assert len([p for p in rewritten if p.endswith("vllm_compile_cache.py")]) == 4
    assert len([p for p in rewritten if "__grp__" in p]) == 1
    handles_files = list(out.glob("torch_compile_cache/*/rank_*/backbone/vllm_compile_cache.py"))
    assert len(handles_files) == 4
    for f in handles_files:
        handles = ast.literal_eval(f.read_text())
        for key, path in handles.values():
            assert path == str(f.parent / key)
            assert Path(path).is_file()
        assert ROOT_PLACEHOLDER not in f.read_text()
    (group,) = out.glob(
        "torch_compile_cache/torch_aot_compile/*/inductor_cache/triton/0/*/__grp__*"
    )
    for child in json.loads(group.read_text())["child_paths"].values():
        assert child.startswith(str(out) + "/")
        assert Path(child).is_file()


@pytest.mark.parametrize("name", ["triton", "vllm"])
def test_a_group_file_is_parsed_once_when_relocated(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restore rewrites every Triton group file on its extracting thread: one parse each.

    (A Triton cache has one group file per kernel; the vLLM family used to parse
    each three times.) Other path-bearing files still take the text rewrite.
    """
    family = get_family(name)
    group = json.dumps(
        {"child_paths": {"k.cubin": f"{ROOT_PLACEHOLDER}/ab/k.cubin", "k.json": "/elsewhere/k"}}
    ).encode()
    parses: list[object] = []
    loads = jsontext.loads

    def counting(data: Any) -> Any:
        parses.append(data)
        return loads(data)

    monkeypatch.setattr(jsontext, "loads", counting)  # what a restore parses JSON with
    out = json.loads(family.relocate(group, "/cache/root"))
    assert len(parses) == 1
    assert out["child_paths"] == {"k.cubin": "/cache/root/ab/k.cubin", "k.json": "/elsewhere/k"}
    text = f"path = {ROOT_PLACEHOLDER}/x\n".encode()
    assert family.relocate(text, "/cache/root/") == b"path = /cache/root/x\n"


def test_vllm_read_factors_one_per_hash_dir(tmp_path: Path) -> None:
    root = make_vllm_tree(tmp_path / "vllm")
    factors = read_factors(root)
    assert set(factors) == {VLLM_VOLATILE_HASH, VLLM_CLEAN_HASH}  # not torch_aot_compile
    assert set(factors[VLLM_CLEAN_HASH]) == {
        "env",
        "config",
        "config_hash",
        "compiler",
        "compiler_hash",
        "code",
        "code_hash",
    }
    assert factors[VLLM_VOLATILE_HASH]["env"]["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.244.3.17"
    assert VLLM.facts("cache", root) == {"cache_key_factors": factors}
    assert VLLM.facts("deep_gemm", root / "deep_gemm") == {}
    assert read_factors(tmp_path / "nowhere") == {}
    broken = root / "torch_compile_cache" / "0000000000" / "rank_0_0" / "backbone"
    broken.mkdir(parents=True)
    (broken / "cache_key_factors.json").write_text("{not json")
    assert "0000000000" not in read_factors(root)


def test_vllm_volatile_factors_flag_ips_ports_ray_and_tmp(tmp_path: Path) -> None:
    factors = read_factors(make_vllm_tree(tmp_path / "vllm"))
    found = volatile_factors(factors[VLLM_VOLATILE_HASH])
    assert {(f.key, f.why) for f in found} == {
        ("env.VLLM_NIXL_SIDE_CHANNEL_HOST", WHY_IPV4),
        ("env.VLLM_NIXL_SIDE_CHANNEL_PORT", WHY_PORT),
        ("env.VLLM_RAY_BUNDLE_INDICES", WHY_RAY),
        ("config.data_parallel_master_ip", WHY_IPV6),
        ("config.kv_transfer_config.kv_port", WHY_PORT),
        ("code[1].path", WHY_TMP),
    }
    values = {f.key: f.value for f in found}
    assert values["env.VLLM_NIXL_SIDE_CHANNEL_PORT"] == 5600
    assert values["env.VLLM_RAY_BUNDLE_INDICES"] == "3,4"
    assert volatile_factors(factors[VLLM_CLEAN_HASH]) == []


@pytest.mark.parametrize(
    ("factors", "expected"),
    [
        ({"VLLM_SUPPORT_LEVEL": 8080, "VLLM_EXPORT_DIR": "/data/x"}, []),
        ({"VLLM_PORT": True, "VLLM_DP_MASTER_PORT": 0, "VLLM_RPC_PORT": None}, []),
        ({"sig": "std::vector<int>", "t": "12:30:45", "v": "2.14.1", "h": "127.0.0.1"}, []),
        ({"p": "/var/tmp/x", "q": "/data/tmpfs", "r": "/tmpdir", "s": "/data//tmp/x"}, []),
        ({"VLLM_RAY_BUNDLE_INDICES": ""}, []),
        ({"VLLM_RAY_BUNDLE_INDICES": 0}, [("VLLM_RAY_BUNDLE_INDICES", 0, WHY_RAY)]),
        ({"RAY_BUNDLE_INDEX": 0}, [("RAY_BUNDLE_INDEX", 0, WHY_RAY)]),
        ({"VLLM_PORT": 99999, "VLLM_RPC_PORT": 65536}, []),
        ({"VLLM_PORT": 65535}, [("VLLM_PORT", 65535, WHY_PORT)]),
        ({"ports": {"MASTER_PORT": "29500"}}, [("ports.MASTER_PORT", "29500", WHY_PORT)]),
        ({"url": "tcp://[fe80::1]:8000"}, [("url", "tcp://[fe80::1]:8000", WHY_IPV6)]),
        # A list of scalars is one factor: reported once, under its own key.
        ({"u": ["x", "http://10.0.0.5:80"]}, [("u", ["x", "http://10.0.0.5:80"], WHY_IPV4)]),
        ({"m": "/tmp"}, [("m", "/tmp", WHY_TMP)]),
    ],
)
def test_volatile_factors_edge_cases(
    factors: Mapping[str, object], expected: list[tuple[str, object, str]]
) -> None:
    assert [(f.key, f.value, f.why) for f in volatile_factors(factors)] == expected


# --------------------------------------------------------------------------
# SGLang
# --------------------------------------------------------------------------


def test_sglang_locates_both_dirs_defaults_and_env(tmp_path: Path) -> None:
    home = tmp_path / "home"
    root = make_sglang_tree(home / ".cache" / "sglang")
    found = SGLANG.locate({"HOME": str(home)})
    assert [(loc.component.name, loc.path) for loc in found] == [
        ("cache", root),
        ("jit", root / "jit"),
    ]
    # The JIT dir does not follow SGLANG_CACHE_DIR (SGLang hard-codes its default).
    other = make_sglang_tree(tmp_path / "other", jit=tmp_path / "jit")
    env = {"HOME": str(home), "SGLANG_CACHE_DIR": str(other)}
    assert [loc.path for loc in SGLANG.locate(env)] == [other, root / "jit"]
    env["SGLANG_JIT_CACHE_DIR"] = str(tmp_path / "jit")
    assert [loc.path for loc in SGLANG.locate(env)] == [other, tmp_path / "jit"]
    assert SGLANG.restore_env(tmp_path / "t") == {
        "SGLANG_CACHE_DIR": str(tmp_path / "t" / "sglang"),
        "SGLANG_JIT_CACHE_DIR": str(tmp_path / "t" / "sglang-jit"),
    }


def test_sglang_round_trip(tmp_path: Path) -> None:
    home = tmp_path / "home"
    root = make_sglang_tree(home / ".cache" / "sglang")
    layer, dirs = round_trip(SGLANG, SGLANG.locate({"HOME": str(home)}), tmp_path)
    out = dirs["cache"]
    skip = skipped(layer)
    fi = f"cache/.cache/flashinfer/{OPS}"
    assert skip["cache/jit"] == "excluded by family"  # nested default of the jit component
    assert "group file" in skip["cache/triton/" + "Z" * 52]
    assert skip["cache/triton/tmp.pid_123_abc"] == "excluded by family"
    assert (
        "Corrupted JIT cache"
        in skip["cache/deep_gemm/cache/kernel.sm90_fp8_gemm_1d1d.00000000deadbeef"]
    )
    assert skip["cache/deep_gemm/tmp"] == "excluded by family"
    assert "rope.so" in skip[f"{fi}/rope"]
    assert ".ninja_log" in skip[f"{fi}/sampling"]
    assert skip[f"{fi}/tmp"] == "excluded by family"
    assert skip["cache/kernels.lock"] == "excluded by family"
    # SGLang 0.5.23: not caches a pod should get.
    for not_cache in (
        "gpu_p2p_access_cache_for_0,1,2,3.json",
        "model_streamer",
        "ple",
        "rust_extensions/targets",
    ):
        assert skip[f"cache/{not_cache}"] == "excluded by family", not_cache
    build = "jit/sm90a/fused_add_rmsnorm/build-" + "1a" * 8
    assert "never a hit" in skip[f"{build}/deps-" + "3c" * 8]
    assert skip[f"{build}/.staging-5e6f7a8b"] == "excluded by family"

    files = shipped(layer)
    for sub in ("nv/ComputeCache/index", "cute_aot/cute_dsl_fa4_fwd_3f2a.o", "tilelang/0.1.15"):
        assert any(p.startswith(f"cache/{sub}") for p in files), sub
    assert any(p.startswith("cache/flashinfer/autotune/") for p in files)
    assert f"cache/deep_gemm/cache/sm90_fp8_gemm_1d2d.{'5d' * 8}/.committed" in files
    assert any(p.startswith("cache/rust_extensions/artifacts/sgl-router/") for p in files)
    pw = f"torch_compile_cache/{'9e' * 5}/rank_0_0/backbone/triton_cache"
    (group,) = (out / pw).glob("*/__grp__*.json")
    for child in json.loads(group.read_text())["child_paths"].values():
        assert child.startswith(str(out / pw) + "/")
    assert (tmp_path / "staging" / build / ("deps-" + "2b" * 8)).is_dir()

    # Triton group files now point into the restored tree.
    groups = list((out / "triton").glob("*/__grp__*.json"))
    assert len(groups) == 2
    for g in groups:
        for child in json.loads(g.read_text())["child_paths"].values():
            assert child.startswith(str(out / "triton") + "/")
            assert Path(child).is_file()
    # The FlashInfer tree inside keeps its mtimes.
    so = PurePosixPath(".cache/flashinfer", OPS, "norm", "norm.so")
    assert (out / so).stat().st_mtime == (root / so).stat().st_mtime == FLASHINFER_T0 + 20

    assert SGLANG.pinned_paths("jit", root / "jit") == ["/opt/custom/include"]
    cache_pins = SGLANG.pinned_paths("cache", root)
    # The hosted FlashInfer tree moves with the cache: only the paths outside it are pinned.
    assert not [p for p in cache_pins if p == str(root) or p.startswith(f"{root}/")]
    assert ENGINE_CUDA in cache_pins
    assert layer.pinned == sorted({*cache_pins, "/opt/custom/include"})
    # ninja's records of the hosted ops name the restored root, hashes computed there.
    _assert_records_moved(out / ".cache" / "flashinfer" / OPS / "norm", root)


# --------------------------------------------------------------------------
# Scopes
# --------------------------------------------------------------------------


def _keys(fp: Fingerprint) -> dict[str, str]:
    return {
        f.name: fp.scope_key(f.name, f.scope, f.scope_revision) for f in (FLASHINFER, VLLM, SGLANG)
    }


def test_scope_keys_follow_workload_and_flashinfer_version(local_fp: Fingerprint) -> None:
    libs = dict(local_fp.libraries)
    libs["flashinfer-python"] = LibraryInfo(version="0.6.18")
    base = local_fp.model_copy(update={"libraries": libs, "workload": {"model": "llama"}})
    other_model = base.model_copy(update={"workload": {"model": "qwen"}})
    libs2 = dict(libs)
    libs2["flashinfer-python"] = LibraryInfo(version="0.6.19")
    other_fi = base.model_copy(update={"libraries": libs2})

    k0, k1, k2 = _keys(base), _keys(other_model), _keys(other_fi)
    assert k1["flashinfer"] == k0["flashinfer"]
    assert k1["vllm"] != k0["vllm"]
    assert k1["sglang"] != k0["sglang"]
    assert k2["flashinfer"] != k0["flashinfer"]
    assert k2["sglang"] != k0["sglang"]  # SGLang hosts a FlashInfer tree
    # vLLM 0.33 hosts FlashInfer autotune tables: one with another version's _metadata is
    # never loaded and never overwritten.
    assert k2["vllm"] != k0["vllm"]


def test_the_deepgemm_sglang_pins_is_in_the_keys_that_hold_its_kernels(
    local_fp: Fingerprint,
) -> None:
    """SGLang installs DeepGEMM as the distribution ``sgl-deep-gemm``, not ``deep_gemm``."""
    libs = dict(local_fp.libraries)
    libs["sgl-deep-gemm"] = LibraryInfo(version="0.2.3.post2")
    base = local_fp.model_copy(update={"libraries": libs})
    libs2 = dict(libs)
    libs2["sgl-deep-gemm"] = LibraryInfo(version="0.2.4")
    other = base.model_copy(update={"libraries": libs2})

    def key(fp: Fingerprint, name: str) -> str:
        fam = get_family(name)
        return fp.scope_key(fam.name, fam.scope, fam.scope_revision)

    for family in ("deepgemm", "sglang", "vllm"):
        assert key(other, family) != key(base, family), family
    assert key(other, "triton") == key(base, "triton")
    assert "sgl-deep-gemm" in TRACKED_LIBRARIES  # the probe reports it where it is installed


def test_scopes_name_real_fingerprint_fields(local_fp: Fingerprint) -> None:
    flat = local_fp.flatten()
    for fam in (FLASHINFER, VLLM, SGLANG):
        for dim in fam.scope:
            if dim.startswith(("libraries.", "workload")):
                continue  # absent here, present where the library is installed
            assert any(k == dim or k.startswith(dim + ".") for k in flat), (fam.name, dim)


def test_engine_modules_read_only_named_env_vars() -> None:
    for mod in (fi, vl, sg):
        tree = ast.parse(Path(mod.__file__ or "").read_text())
        reads = [
            node.attr
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
            and node.attr in ("environ", "getenv", "environb")
        ]
        assert reads == [], mod.__name__


# --------------------------------------------------------------------------
# Through harvest and restore (the registered families)
# --------------------------------------------------------------------------


def test_harvest_and_restore_engine_families(
    tmp_path: Path, local_fp: Fingerprint, monkeypatch: pytest.MonkeyPatch
) -> None:
    for fam in (FLASHINFER, VLLM, SGLANG):
        assert type(FAMILIES[fam.name]) is type(fam)
    home = tmp_path / "home"
    make_flashinfer_tree(home)
    make_vllm_tree(home / ".cache" / "vllm")
    make_sglang_tree(home / ".cache" / "sglang")
    store = open_store(f"oci:{tmp_path / 'store'}", create=True)
    names = ["flashinfer", "vllm", "sglang"]
    result = harvest(store, local_fp, families=names, environ={"HOME": str(home)})
    assert {f.family for f in result.families} == set(names)

    target = tmp_path / "target"
    plan = plan_restore(
        StoreSource(store), local_fp, target, families=names, trust=UNSAFE_NO_VERIFICATION
    )
    assert plan.match == "full"
    restore(plan, StoreSource(store))
    # A second, real restore swaps every dir out (the nested deep_gemm included).
    stale = target / "vllm" / "torch_compile_cache" / "stale"
    stale.mkdir()
    shutil.rmtree(target / "sglang-jit")
    vol = CacheVolume(target)
    assert (
        noop_plan(StoreSource(store), local_fp.hash, local_fp.flatten(), vol, families=names)
        is None
    )
    again = plan_restore(
        StoreSource(store), local_fp, target, families=names, trust=UNSAFE_NO_VERIFICATION
    )
    restore(again, StoreSource(store))
    assert not stale.exists()

    dg = target / "vllm" / "deep_gemm" / "cache" / "kernel.sm90_fp8_gemm_1d2d.0123456789abcdef"
    assert (dg / "kernel.cubin").is_file()
    assert not (target / "vllm" / "modelinfos").exists()
    (handles,) = (target / "vllm").glob(
        f"torch_compile_cache/{VLLM_CLEAN_HASH}/rank_1_0/backbone/vllm_compile_cache.py"
    )
    for key, path in ast.literal_eval(handles.read_text()).values():
        assert path == str(handles.parent / key)
    so = target / "flashinfer-home/.cache/flashinfer" / OPS / "norm" / "norm.so"
    assert so.stat().st_mtime == FLASHINFER_T0 + 20
    assert (target / "sglang-jit" / "sm90a").is_dir()
    assert not (target / "sglang" / "jit").exists()
    env = (target / "artifactd.env").read_text()
    for line in (
        f"FLASHINFER_WORKSPACE_BASE={target}/flashinfer-home",
        f"VLLM_CACHE_ROOT={target}/vllm",
        f"SGLANG_CACHE_DIR={target}/sglang",
        f"SGLANG_JIT_CACHE_DIR={target}/sglang-jit",
    ):
        assert line in env
    assert "DG_JIT_CACHE_DIR" not in env
