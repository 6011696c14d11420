"""Synthetic cache trees in the real layouts of each library (sources named per tree).

Where the library runs on this machine (torch CPU, Triton AOT, nvcc), the
end-to-end tests produce caches with the real library instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import pprint
import struct
import sys
import zlib
from pathlib import Path, PurePosixPath

from artifactd.families.ninjarecords import command_hash, ninja_commands


def make_triton_tree(root: Path, kernels: tuple[str, ...] = ("add", "softmax")) -> Path:
    """A Triton cache in the real layout: <key dir>/{name.cubin,name.json,__grp__name.json}."""
    for i, name in enumerate(kernels):
        d = root / f"{'ABCDEFGHIJKLMNOP'[i] * 52}"
        d.mkdir(parents=True)
        children = {}
        for ext in ("cubin", "json", "ptx"):
            p = d / f"{name}.{ext}"
            p.write_bytes(f"{name}-{ext}-payload".encode() * 50)
            children[f"{name}.{ext}"] = str(p)
        (d / f"__grp__{name}.json").write_text(json.dumps({"child_paths": children}))
    (root / "tmp.pid_123_abc").mkdir()
    (root / "tmp.pid_123_abc" / "partial.cubin").write_bytes(b"half")
    return root


def make_generic_tree(root: Path) -> Path:
    """A loose cubin tree as nvcc would leave it."""
    (root / "sub").mkdir(parents=True)
    (root / "axpy.sm_90a.cubin").write_bytes(b"\x7fELF" + os.urandom(256))
    (root / "sub" / "kernel.so").write_bytes(b"\x7fELF" + os.urandom(128))
    (root / "sub" / "kernel.so").chmod(0o755)
    return root


def harvest_environ(base: Path, **extra: str) -> dict[str, str]:
    """The environ a harvest of ``base/triton`` and ``base/generic`` sees, plus ``extra``.

    Every other cache variable points at a missing dir under ``base``, so the
    machine's own caches (``/tmp/torchinductor_<user>``, ``~/.triton``) stay out.
    """
    return {
        "TRITON_CACHE_DIR": str(base / "triton"),
        "ARTIFACTD_GENERIC_DIR": str(base / "generic"),
        "TMPDIR": str(base / "tmp-empty"),
        "TORCHINDUCTOR_CACHE_DIR": str(base / "no-inductor"),
        "HOME": str(base / "home"),
        **extra,
    }


def build_caches(base: Path, **extra: str) -> dict[str, str]:
    """Write a Triton and a generic cache under ``base``; return :func:`harvest_environ`."""
    make_triton_tree(base / "triton")
    make_generic_tree(base / "generic")
    return harvest_environ(base, **extra)


# --- JIT cache families: DeepGEMM, TileLang, CuTe DSL / FA4, CUDA driver JIT ---


def make_deepgemm_tree(root: Path) -> Path:
    """A DeepGEMM JIT cache in the real layout (deepseek-ai/DeepGEMM csrc/jit/compiler.hpp).

    ``cache/kernel.<name>.<digest>/{kernel.cu,kernel.cubin}``: two complete
    entries (one with the optional ``kernel.ptx``), one partial entry (cubin
    missing: DeepGEMM's hard "Corrupted JIT cache" error), a ``tmp/<uuid>/``
    staging dir and an old-release ``locks/`` dir; and deep_jit's entries
    (sgl-deep-gemm 0.2.3.post2): one committed, one uncommitted, one committed
    without its cubin.
    """
    entries = {
        "kernel.sm90_fp8_gemm_1d2d.0123456789abcdef": ("kernel.cu", "kernel.cubin"),
        "kernel.sm90_bf16_gemm.fedcba9876543210": ("kernel.cu", "kernel.cubin", "kernel.ptx"),
        "kernel.sm90_fp8_gemm_1d1d.00000000deadbeef": ("kernel.cu",),
    }
    for entry, files in entries.items():
        d = root / "cache" / entry
        d.mkdir(parents=True)
        for name in files:
            body = b"\x7fELF" if name.endswith(".cubin") else b"// generated\n"
            (d / name).write_bytes(body + f"{entry}/{name}".encode() * 40)
    # deep_jit (sgl-deep-gemm 0.2.x, include/deep_jit/cache/disk.hpp): <tag>.<digest>/ with
    # .committed written last; one committed entry, one not yet committed, one without cubin.
    for entry, files in {
        "sm90_fp8_gemm_1d2d.00c0ffee00c0ffee": (
            "kernel.cu",
            "kernel.cubin",
            "meta.json",
            ".committed",
        ),
        "sm90_bf16_gemm.00000000000000aa": ("kernel.cu", "meta.json"),
        "sm90_bf16_gemm.00000000000000bb": ("kernel.cu", ".committed"),
    }.items():
        d = root / "cache" / entry
        d.mkdir(parents=True)
        for name in files:
            (d / name).write_bytes(f"{entry}/{name}".encode() * 20)
    staging = root / "tmp" / "5b0c1d2e-aaaa-bbbb-cccc-0123456789ab"
    staging.mkdir(parents=True)
    (staging / "kernel.cu").write_bytes(b"// half-written\n")
    (root / "locks").mkdir()
    (root / "locks" / "kernel.lock").write_bytes(b"")
    return root


def tilelang_manifest(entry: Path) -> None:
    """Write ``manifest.json`` over an entry as TileLang 0.1.15 does (_write_manifest)."""
    files = {
        p.name: {"size": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
        for p in sorted(entry.iterdir())
        if p.is_file() and p.name != "manifest.json"
    }
    manifest = {"version": 1, "files": files}
    (entry / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))


def make_tilelang_tree(root: Path, machine: str = "x86_64") -> Path:
    """A TileLang cache in the 0.1.15 layout (tilelang/cache/kernel_cache.py, binary_cache.py).

    ``0.1.15/linux-<machine>/kernels/<sha256>/`` entries with a per-file sha256
    ``manifest.json``: two valid (cython and tvm_ffi backends), one without a
    manifest, one whose ``kernel_lib.so`` no longer matches it, one whose
    manifest is not JSON; a ``.staging/`` dir with a temp sibling; a verified
    ``cuda-binaries/<key>/`` entry and a corrupt one; and a 0.1.13-layout
    entry (``params.pkl``, no manifest by design).
    """
    ns = root / "0.1.15" / f"linux-{machine}"
    kernels = ns / "kernels"

    def entry(key: str, lib: str) -> Path:
        d = kernels / (key * 64)
        d.mkdir(parents=True)
        (d / "device_kernel.cu").write_text(f"// device {key}\n" * 20)
        (d / "host_kernel.cu").write_text(f"// host {key}\n" * 20)
        (d / lib).write_bytes(b"\x7fELF" + key.encode() * 300)
        (d / "params.json").write_text(json.dumps([{"name": "A", "dtype": "float16"}]))
        return d

    tilelang_manifest(entry("a", "kernel_lib.so"))
    tilelang_manifest(entry("b", "executable.so"))
    entry("c", "kernel_lib.so")  # no manifest: an incomplete entry
    tampered = entry("d", "kernel_lib.so")
    tilelang_manifest(tampered)
    (tampered / "kernel_lib.so").write_bytes(b"\x7fELF" + b"X" * 300)  # same size, other bytes
    garbled = entry("e", "kernel_lib.so")
    (garbled / "manifest.json").write_text("{not json")
    staging = ns / ".staging" / ("f" * 64 + "_4242_0badcafe")
    staging.mkdir(parents=True)
    (staging / ".params.json.4242_0badcafe.tmp").write_text("[")
    binaries = root / "0.1.15" / "cuda-binaries"
    for key, payload, claimed in (("1", b"\x7fELF-cubin" * 50, None), ("2", b"short", 999)):
        d = binaries / (key * 64)
        d.mkdir(parents=True)
        (d / "kernel.cubin").write_bytes(payload)
        meta = {
            "format": "tilelang.cuda-binary-cache.v1",
            "size": claimed if claimed is not None else len(payload),
            "sha256": hashlib.sha256(payload).hexdigest(),
        }
        (d / "metadata.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    (root / "0.1.15" / ".staging" / "cuda-binaries").mkdir(parents=True)
    legacy = root / "0.1.13" / f"linux-{machine}" / "kernels" / ("9" * 64)
    legacy.mkdir(parents=True)
    (legacy / "kernel_lib.so").write_bytes(b"\x7fELF" + b"L" * 100)
    (legacy / "params.pkl").write_bytes(b"\x80\x05N.")
    return root


def cute_dsl_file(data: bytes) -> bytes:
    """MLIR bytecode followed by its CRC32, as CuTe DSL's write_bytecode_with_crc32 writes it."""
    return data + zlib.crc32(data).to_bytes(4, sys.byteorder)


def make_cutedsl_tree(root: Path) -> Path:
    """A CuTe DSL file cache in the real layout (NVIDIA/cutlass base_dsl/cache_helpers.py).

    ``cute_dsl_<sha256>.mlir`` files (bytecode + CRC32): two valid, one whose
    CRC32 no longer matches; and a ``tmp.pid_<pid>_<uuid>/`` left by an
    interrupted write.
    """
    root.mkdir(parents=True, exist_ok=True)
    for key in ("1", "2"):
        body = cute_dsl_file(b"ML\xefR" + key.encode() * 200)
        (root / f"cute_dsl_{key * 64}.mlir").write_bytes(body)
    bad = bytearray(cute_dsl_file(b"ML\xefR" + b"3" * 200))
    bad[10] ^= 0xFF
    (root / f"cute_dsl_{'3' * 64}.mlir").write_bytes(bytes(bad))
    tmp = root / "tmp.pid_77_0f0e0d0c-0000-1111-2222-333344445555"
    tmp.mkdir()
    (tmp / f"cute_dsl_{'4' * 64}.mlir").write_bytes(b"ML\xefR")
    return root


def make_fa4_tree(root: Path) -> Path:
    """FlashAttention-4's AOT cache (Dao-AILab/flash-attention flash_attn/cute/cache_utils.py).

    ``<source fingerprint>/<name>/<sha256(pickle(key))>.o`` objects with their
    ``<hash>.lock`` files, an export temp file ``.<hash>.<hex>.tmp.o`` and one
    empty object (fails to load).
    """
    d = root / ("c" * 64) / "fwd"
    d.mkdir(parents=True)
    for key in ("1", "2"):
        (d / f"{key * 64}.o").write_bytes(b"\x7fELF" + key.encode() * 500)
        (d / f"{key * 64}.lock").write_bytes(b"")
    (d / f".{'3' * 64}.0123456789abcdef.tmp.o").write_bytes(b"\x7fELF")
    (d / f"{'4' * 64}.o").write_bytes(b"")
    return root


def make_cudajit_tree(root: Path) -> Path:
    """A CUDA driver JIT cache (``~/.nv/ComputeCache``): opaque, an index and hashed subdirs.

    The layout is the driver's and undocumented; this one is only shaped like it.
    """
    (root / "a" / "3").mkdir(parents=True)
    (root / "index").write_bytes(b"\x00\x01index" * 30)
    (root / "a" / "3" / "9c2f41d07e5b8a16").write_bytes(b"sass" * 200)
    return root


# --- engine families: FlashInfer, vLLM, SGLang ---------------------------------

#: A site-packages and CUDA home that exist nowhere: paths the fixtures embed.
ENGINE_SITE = "/opt/venv/lib/python3.12/site-packages"
ENGINE_CUDA = "/usr/local/cuda-12.9"
FLASHINFER_VERSION = "0.6.18"
#: mtimes the FlashInfer fixture sets: sources, then objects, then .so, then logs.
FLASHINFER_T0 = 1_700_000_000


def flashinfer_build_ninja(
    module_dir: Path, name: str, sources: list[str], site: str, cuda: str
) -> tuple[str, list[Path]]:
    """``build.ninja`` text as flashinfer/jit/cpp_ext.py generate_ninja_build_for_op writes it.

    Absolute (resolved) object and ``.so`` outputs under the module dir, objects
    named ``<source dir>_<stem>.cuda.o``, ``$``-continued flag lists, include
    dirs in site-packages and the CUDA home. Returns the text and the objects.
    """
    data = f"{site}/flashinfer/data"
    common = [
        "-DPy_LIMITED_API=0x03090000",
        "-D_GLIBCXX_USE_CXX11_ABI=1",
        f"-I{data}/cccl/cub",
        f"-I{data}/cccl/libcudacxx/include",
        "-isystem /usr/include/python3.12",
        "-isystem $cuda_home/include",
        f"-isystem {site}/tvm_ffi/include",
        f"-isystem {data}/include",
        f"-isystem {data}/csrc",
        f"-isystem {data}/cutlass/include",
        f"-isystem {data}/spdlog/include",
    ]
    cuda_flags = [
        "$common_cflags",
        "--compiler-options=-fPIC",
        "--expt-relaxed-constexpr",
        "-static-global-template-stub=false",
        "-gencode=arch=compute_90a,code=sm_90a",
        "--threads=1",
    ]
    ldflags = ["-shared", "-L$cuda_home/lib64", "-L$cuda_home/lib64/stubs", "-lcudart", "-lcuda"]
    join = " $\n    ".join
    lines = [
        "ninja_required_version = 1.3",
        f"name = {name}",
        f"cuda_home = {cuda}",
        "cxx = c++",
        "nvcc = $cuda_home/bin/nvcc",
        "cxx_launcher = ",
        "nvcc_launcher = ",
        "",
        "common_cflags = " + join(common),
        "cflags = " + join(["$common_cflags", "-fPIC"]),
        "post_cflags =",
        "cuda_cflags = " + join(cuda_flags),
        "cuda_post_cflags =",
        "ldflags = " + join(ldflags),
        "",
        "rule compile",
        "  command = $cxx_launcher $cxx -MMD -MF $out.d $cflags -c $in -o $out $post_cflags",
        "  depfile = $out.d",
        "  deps = gcc",
        "",
        "rule cuda_compile",
        "  command = $nvcc_launcher $nvcc --generate-dependencies-with-compile -MF $out.d "
        "$cuda_cflags -c $in -o $out $cuda_post_cflags",
        "  depfile = $out.d",
        "  deps = gcc",
        "",
        "rule link",
        "  command = $cxx $in $ldflags -o $out",
        "",
    ]
    objects: list[Path] = []
    for src in sources:
        p = PurePosixPath(src)
        cuda_src = p.suffix == ".cu"
        obj = module_dir / f"{p.parent.name}_{p.stem}{'.cuda.o' if cuda_src else '.o'}"
        objects.append(obj)
        lines.append(f"build {obj}: {'cuda_compile' if cuda_src else 'compile'} {src}")
    so = module_dir / f"{name}.so"
    lines += ["", f"build {so}: link " + " ".join(map(str, objects)), f"default {so}", ""]
    return "\n".join(lines), objects


def ninja_log(build_ninja: str, outputs: list[Path], t0: int) -> str:
    """A ninja 1.13 ``.ninja_log`` (v7) for ``outputs``, hashing the commands ``build_ninja`` runs.

    The hashes are what ninja would record: rapidhash of each evaluated
    command (the relocation code's own hash, which tests/test_ninja_records.py
    checks against logs ninja itself wrote).
    """
    commands = ninja_commands(build_ninja)
    return "# ninja log v7\n" + "".join(
        f"{i * 900}\t{i * 900 + 850}\t{(t0 + 10 + i) * 10**9}\t{p}\t"
        f"{command_hash(commands[str(p)], 7):x}\n"
        for i, p in enumerate(outputs)
    )


def ninja_deps(output: Path, inputs: list[str], mtime: int) -> bytes:
    """A version-4 ``.ninja_deps``: path records for ``output`` and ``inputs``, one deps record."""
    out = [b"# ninjadeps\n", struct.pack("<i", 4)]
    paths = [str(output), *inputs]
    for node_id, path in enumerate(paths):
        raw = path.encode() + b"\0" * ((4 - len(path.encode()) % 4) % 4)
        out.append(struct.pack("<I", len(raw) + 4) + raw + struct.pack("<I", ~node_id & 0xFFFFFFFF))
    ids = range(1, len(paths))
    body = struct.pack("<iII", 0, mtime * 10**9 & 0xFFFFFFFF, mtime * 10**9 >> 32)
    body += b"".join(struct.pack("<i", i) for i in ids)
    out.append(struct.pack("<I", len(body) | 0x80000000) + body)
    return b"".join(out)


def make_flashinfer_tree(
    base: Path, *, site: str = ENGINE_SITE, cuda: str = ENGINE_CUDA, arch: str = "90a"
) -> Path:
    """A FlashInfer workspace under ``base/.cache/flashinfer`` (flashinfer 0.6.18 jit/).

    ``<version>/<arch>/cached_ops/<module>/`` ninja builds: two complete modules,
    ``rope`` interrupted before its link (objects, no ``.so``) and ``sampling``
    built by a batch (subninja) run, so without its own ``.ninja_log``/
    ``.ninja_deps``; ``cached_ops/tmp/`` locks and batch ninja file;
    ``generated/`` sources and the absolute symlink ``ensure_symlink`` makes into
    the cubin dir; ``autotune/``; the JIT log; ``cubins/`` at the root with a
    download lock and temp file. mtimes ascend sources < objects < .so < logs.
    Returns the ``.cache/flashinfer`` dir.
    """
    root = base / ".cache" / "flashinfer"
    ws = root / FLASHINFER_VERSION / arch
    ops = ws / "cached_ops"
    gen = ws / "generated"
    t0 = FLASHINFER_T0

    def stamp(p: Path, t: int) -> None:
        os.utime(p, (t, t))

    cubin_dir = root / "cubins" / ("5f" * 20) / "batched_gemm"
    cubin_dir.mkdir(parents=True)
    (cubin_dir / "Bmm_E4m3_sm90a.cubin").write_bytes(b"\x7fELF" + b"bmm" * 300)
    (cubin_dir / "Bmm_E4m3_sm90a.cubin.lock").write_bytes(b"")
    (cubin_dir / "Bmm_Bf16_sm90a.cubin.0f3c9a.tmp").write_bytes(b"\x7fELF half")
    gen_dir = gen / "batch_prefill_bf16_h128"
    gen_dir.mkdir(parents=True)
    (gen_dir / "batch_prefill.cu").write_text("// generated from batch_prefill.cu.jinja\n" * 40)
    (gen_dir / "batch_prefill_config.inc").write_text("#define HEAD_DIM_QK 128\n" * 10)
    for p in gen_dir.iterdir():
        stamp(p, t0 - 100)
    trtllm = gen / "flashinfer" / "trtllm" / "batched_gemm"
    trtllm.mkdir(parents=True)
    (trtllm / "trtllmGen_bmm_export").symlink_to(cubin_dir)

    csrc = f"{site}/flashinfer/data/csrc"
    modules = {
        "batch_prefill_bf16_h128": (
            [f"{gen_dir}/batch_prefill.cu", f"{csrc}/batch_prefill_jit_binding.cu"],
            True,
            True,
        ),
        "norm": ([f"{csrc}/norm.cu", f"{csrc}/flashinfer_norm_binding.cu"], True, True),
        "rope": ([f"{csrc}/rope.cu", f"{csrc}/flashinfer_rope_binding.cu"], False, True),
        "sampling": ([f"{csrc}/sampling.cu", f"{csrc}/renorm.cu"], True, False),
    }
    for name, (sources, linked, logged) in modules.items():
        d = ops / name
        d.mkdir(parents=True)
        text, objects = flashinfer_build_ninja(d, name, sources, site, cuda)
        (d / "build.ninja").write_text(text)
        stamp(d / "build.ninja", t0)
        for i, obj in enumerate(objects):
            obj.write_bytes(b"\x7fELF" + f"{name}:{i}".encode() * 64)
            stamp(obj, t0 + 10 + i)
        if linked:
            so = d / f"{name}.so"
            so.write_bytes(b"\x7fELF" + name.encode() * 200)
            so.chmod(0o755)
            stamp(so, t0 + 20)
        if logged:
            entries = [*objects, *([d / f"{name}.so"] if linked else [])]
            (d / ".ninja_log").write_text(ninja_log(text, entries, t0))
            (d / ".ninja_deps").write_bytes(ninja_deps(objects[0], sources, t0 + 10))
            stamp(d / ".ninja_log", t0 + 30)
            stamp(d / ".ninja_deps", t0 + 30)
    tmp = ops / "tmp"
    tmp.mkdir()
    (tmp / "norm.lock").write_bytes(b"")
    (tmp / "flashinfer_jit.lock").write_bytes(b"")
    (tmp / "flashinfer_jit.ninja").write_text(
        "ninja_required_version = 1.3\n" + f"subninja {ops / 'sampling' / 'build.ninja'}\n"
    )
    (ws / "autotune").mkdir()
    (ws / "autotune" / "pcie_ipc_all_reduce_ws8.json").write_text('{"tactics": [[4096, 2]]}')
    (ws / "flashinfer_jit.log").write_text("INFO: Loading JIT ops: norm\n" * 5)
    return root


def vllm_factors(
    site: str, *, pod_ip: str | None, port: int | None, tmp_code: bool
) -> dict[str, object]:
    """cache_key_factors.json content (vllm/compilation/backends.py VllmBackend.__call__).

    Top-level keys are vLLM's (env, config, config_hash, compiler, compiler_hash,
    code, code_hash); env keys are real ``VLLM_*`` names (``compile_factors``).
    The config and code entries are abridged and their shape is illustrative.
    With ``pod_ip``/``port`` set, the values a volatility lint must flag appear
    in env vars vLLM does not ignore (older releases hashed the side-channel
    host), a Ray bundle index, an IPv6 DP master and a KV-transfer port.
    """
    env: dict[str, object] = {
        "VLLM_ATTENTION_BACKEND": None,
        "VLLM_FUSED_MOE_CHUNK_SIZE": 32768,
        "VLLM_MAIN_CUDA_VERSION": "12.9",
        "VLLM_RAY_BUNDLE_INDICES": "3,4" if pod_ip else "",
        "VLLM_RAY_PER_WORKER_GPUS": 1.0,
        "VLLM_TARGET_DEVICE": "cuda",
        "VLLM_USE_DEEP_GEMM": True,
        "VLLM_NIXL_SIDE_CHANNEL_HOST": pod_ip or "localhost",
        "VLLM_NIXL_SIDE_CHANNEL_PORT": port,
        "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": None,
    }
    config: dict[str, object] = {
        "model": "Qwen/Qwen3-8B",
        "dtype": "torch.bfloat16",
        "max_model_len": 8192,
        "tensor_parallel_size": 2,
        "kv_transfer_config": {"kv_connector": "NixlConnector", "kv_ip": "127.0.0.1"},
    }
    if pod_ip:
        config["data_parallel_master_ip"] = "fd00:10:244:3::17"
        config["kv_transfer_config"] = {
            "kv_connector": "NixlConnector",
            "kv_ip": "127.0.0.1",
            "kv_port": 14579,
        }
    code = [{"path": f"{site}/vllm/model_executor/models/qwen3.py", "sha256": "3c" * 32}]
    if tmp_code:
        code.append({"path": "/tmp/tmpq8x_remote/modeling_qwen3_moe.py", "sha256": "9d" * 32})
    return {
        "env": env,
        "config": config,
        "config_hash": "e1f0" * 16,
        "compiler": {"torch_version": "2.14.1", "system": {"device": "NVIDIA H200"}},
        "compiler_hash": "b7a2" * 16,
        "code": code,
        "code_hash": "44c0" * 16,
    }


VLLM_VOLATILE_HASH = "8f3a21c0de"
#: Where make_vllm_tree puts its valid FlashInfer autotune tables, under the root.
VLLM_AUTOTUNE_TABLES = f"flashinfer_autotune_cache/{FLASHINFER_VERSION}/90/{'a7' * 32}"
VLLM_CLEAN_HASH = "51be09a7c4"


def make_vllm_tree(
    root: Path, *, site: str = ENGINE_SITE, pod_ip: str = "10.244.3.17", port: int = 5600
) -> Path:
    """A ``VLLM_CACHE_ROOT`` in vLLM's layout (vllm/compilation/backends.py, decorators.py).

    ``torch_compile_cache/<hash10>/rank_<r>_0/backbone/`` with
    ``cache_key_factors.json`` (the ``VLLM_VOLATILE_HASH`` dir's factors carry
    a pod IP, a port, a Ray bundle index...; ``VLLM_CLEAN_HASH``'s do not),
    ``vllm_compile_cache.py`` (pprint'ed handles with ABSOLUTE artifact paths),
    ``computation_graph.py`` and an artifact; a torch ``write_atomic`` temp file;
    ``torch_aot_compile/<sha256>/`` with ``inductor_cache/triton/0/<key>/``
    (group file with absolute child paths), ``locks/`` and ``rank_0_0/model``;
    ``deep_gemm/`` as vLLM's DG_JIT_CACHE_DIR default (one complete entry,
    one partial, a ``tmp/`` staging file); ``modelinfos/``, not a compile cache.
    vLLM 0.33 (model_executor/warmup/flashinfer_autotune_cache.py,
    v1/worker/startup_plan.py, all_reduce_utils.py): FlashInfer autotune tables
    ``flashinfer_autotune_cache/<FLASHINFER_VERSION>/90/<sha256>/autotune_configs_dp0_rank<r>.json``
    (one corrupt, one ``.<name>.<random>.tmp`` write in flight), a startup plan
    and the build node's ``gpu_p2p_access_cache_for_0,1.json``.
    """
    tcc = root / "torch_compile_cache"
    for hash_dir, volatile in ((VLLM_VOLATILE_HASH, True), (VLLM_CLEAN_HASH, False)):
        factors = vllm_factors(
            site,
            pod_ip=pod_ip if volatile else None,
            port=port if volatile else None,
            tmp_code=volatile,
        )
        for rank in ("rank_0_0", "rank_1_0"):
            d = tcc / hash_dir / rank / "backbone"
            d.mkdir(parents=True)
            (d / "cache_key_factors.json").write_text(json.dumps(factors, indent=2, sort_keys=True))
            handles = {}
            for i, (lo, hi) in enumerate(((1, 8192), (8193, 16384))):
                key = f"artifact_compile_range_{lo}_{hi}_subgraph_{i}"
                (d / key).write_bytes(b"PK\x03\x04" + f"{hash_dir}/{rank}/{key}".encode() * 50)
                handles[((lo, hi), f"{i:02x}" * 32, "inductor_standalone")] = (key, str(d / key))
            (d / "vllm_compile_cache.py").write_text(
                pprint.PrettyPrinter(indent=4).pformat(handles)
            )
            (d / "computation_graph.py").write_text(
                "from __future__ import annotations\nimport torch\n"
                "class GraphModule(torch.nn.Module):\n    pass\n"
            )
    (tcc / VLLM_VOLATILE_HASH / "rank_0_0" / ".4242.139872.tmp").write_bytes(b"half")
    aot = tcc / "torch_aot_compile" / ("c4" * 32)
    kernel = aot / "inductor_cache" / "triton" / "0" / ("Q" * 52)
    kernel.mkdir(parents=True)
    children = {}
    for ext in ("cubin", "json", "ptx"):
        p = kernel / f"triton_poi_fused_add_0.{ext}"
        p.write_bytes(f"poi-{ext}".encode() * 80)
        children[p.name] = str(p)
    (kernel / "__grp__triton_poi_fused_add_0.json").write_text(
        json.dumps({"child_paths": children})
    )
    (aot / "inductor_cache" / "locks").mkdir()
    (aot / "inductor_cache" / "locks" / "fx.lock").write_bytes(b"")
    (aot / "rank_0_0").mkdir()
    (aot / "rank_0_0" / "model").write_bytes(b"\x80\x04aot-model" * 100)
    dg = root / "deep_gemm"
    for entry, files in (
        ("kernel.sm90_fp8_gemm_1d2d.0123456789abcdef", ("kernel.cu", "kernel.cubin")),
        ("kernel.sm90_fp8_gemm_1d1d.00000000deadbeef", ("kernel.cu",)),
    ):
        (dg / "cache" / entry).mkdir(parents=True)
        for name in files:
            (dg / "cache" / entry / name).write_bytes(f"{entry}/{name}".encode() * 40)
    (dg / "tmp").mkdir()
    (dg / "tmp" / "5b0c1d2e-aaaa-bbbb-cccc-0123456789ab").write_bytes(b"half")
    (root / "modelinfos").mkdir()
    (root / "modelinfos" / "Qwen3ForCausalLM-7a1c.json").write_text(
        '{"is_text_generation_model": true}'
    )
    tables = root / VLLM_AUTOTUNE_TABLES
    tables.mkdir(parents=True)
    for tp_rank in (0, 1):
        (tables / f"autotune_configs_dp0_rank{tp_rank}.json").write_text(
            json.dumps({"_metadata": {"flashinfer_version": FLASHINFER_VERSION}, "configs": {}})
        )
    (tables / ".autotune_configs_dp0_rank1.json.k3j9x2.tmp").write_text('{"half')
    broken = root / "flashinfer_autotune_cache" / FLASHINFER_VERSION / "90" / ("0b" * 32)
    broken.mkdir(parents=True)
    (broken / "autotune_configs_dp0_rank0.json").write_text('{"configs": ')
    (root / "startup_plan").mkdir()
    (root / "startup_plan" / "startup_plan_3f1e2d4c5b6a7980.json").write_text(
        '{"schema": 1, "fingerprint": "3f1e2d4c5b6a7980", "kv_cache_memory": 1073741824}'
    )
    (root / "gpu_p2p_access_cache_for_0,1.json").write_text('{"0->1": true}')
    return root


def make_sglang_tree(
    root: Path, *, jit: Path | None = None, site: str = ENGINE_SITE, cuda: str = ENGINE_CUDA
) -> Path:
    """A ``SGLANG_CACHE_DIR`` as sglang/srt/environ.py redirects third-party caches into it.

    ``triton/`` (a Triton cache, plus a partial entry without group file),
    ``inductor/``, ``nv/ComputeCache``, ``tilelang/``, ``deep_gemm/`` (one
    partial entry, a ``tmp/``), ``cute_aot/``, ``.cache/flashinfer`` (the
    FlashInfer fixture), ``flashinfer/autotune/...`` and the HF-kernels
    ``kernels.lock``. The JIT cache (sglang/kernels/jit/utils/compile/cache.py)
    goes to ``jit`` or, by default, the nested ``<root>/jit``:
    ``sm90a/<module>/build-<key>/deps-<key>/{sgl_deps.json, <module>.so}`` with
    one leaf missing its ``.so`` and a ``.staging-<uuid>/`` build.
    """
    make_triton_tree(root / "triton")
    partial = root / "triton" / ("Z" * 52)
    partial.mkdir()
    (partial / "_fwd_kernel.cubin").write_bytes(b"\x7fELF half")
    fx = root / "inductor" / "fxgraph" / "ab" / ("fab" + "c" * 49)
    fx.mkdir(parents=True)
    (fx / "entry").write_bytes(b"fxgraph" * 40)
    (root / "inductor" / "locks").mkdir()
    (root / "inductor" / "locks" / "graph.lock").write_bytes(b"")
    (root / "nv" / "ComputeCache" / "a" / "3").mkdir(parents=True)
    (root / "nv" / "ComputeCache" / "index").write_bytes(b"\x00\x01index" * 30)
    (root / "nv" / "ComputeCache" / "a" / "3" / "9c2f41d07e5b8a16").write_bytes(b"sass" * 200)
    tl = root / "tilelang" / "0.1.15" / "linux-x86_64" / "kernels" / ("e" * 64)
    tl.mkdir(parents=True)
    (tl / "kernel_lib.so").write_bytes(b"\x7fELF" + b"tl" * 100)
    (tl / "params.json").write_text("[]")
    for entry, files in (
        ("kernel.sm90_fp8_gemm_1d2d.0123456789abcdef", ("kernel.cu", "kernel.cubin")),
        ("kernel.sm90_fp8_gemm_1d1d.00000000deadbeef", ("kernel.cubin",)),
    ):
        (root / "deep_gemm" / "cache" / entry).mkdir(parents=True)
        for name in files:
            (root / "deep_gemm" / "cache" / entry / name).write_bytes(name.encode() * 40)
    (root / "deep_gemm" / "tmp").mkdir()
    (root / "deep_gemm" / "tmp" / "0c1d2e3f").write_bytes(b"half")
    (root / "cute_aot").mkdir()
    (root / "cute_aot" / "cute_dsl_fa4_fwd_3f2a.o").write_bytes(b"\x7fELF" + b"cute" * 100)
    make_flashinfer_tree(root, site=site, cuda=cuda)
    tune = root / "flashinfer" / "autotune" / FLASHINFER_VERSION / "sm90" / ("7c" * 8)
    tune.mkdir(parents=True)
    (tune / "rank_tp0_pp0_dp0.json").write_text('{"configs": {}}')
    (root / "kernels.lock").write_text('{"kernels-community/sgl-flash-attn3": "v1"}')
    # SGLang 0.5.23: a deep_jit entry (sgl-deep-gemm 0.2.x), the piecewise compile cache,
    # a built Rust extension, and what is not a cache (P2P topology, model data, cargo).
    dj = root / "deep_gemm" / "cache" / ("sm90_fp8_gemm_1d2d." + "5d" * 8)
    dj.mkdir(parents=True)
    for name in ("kernel.cu", "kernel.cubin", "meta.json", ".committed"):
        (dj / name).write_bytes(name.encode() * 10)
    (dj / ".committed").write_bytes(b"")
    pw = root / "torch_compile_cache" / ("9e" * 5) / "rank_0_0" / "backbone"
    make_triton_tree(pw / "triton_cache", kernels=("piecewise",))
    (pw / "sglang_compile_cache.py").write_text(f"{{(None, 0, 'inductor'): ('k', '{pw}/x')}}")
    ext = root / "rust_extensions" / "artifacts" / "sgl-router" / ("4f" * 12)
    ext.mkdir(parents=True)
    (ext / "sgl_router_rs.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF" + b"rs" * 50)
    (root / "rust_extensions" / "targets" / ("4f" * 12) / "release").mkdir(parents=True)
    (root / "rust_extensions" / "targets" / ("4f" * 12) / "release" / "libx.rlib").write_bytes(
        b"rlib" * 50
    )
    (root / "gpu_p2p_access_cache_for_0,1,2,3.json").write_text('{"0->1": true}')
    (root / "model_streamer" / ("6a" * 8)).mkdir(parents=True)
    (root / "model_streamer" / ("6a" * 8) / "model.safetensors").write_bytes(b"w" * 100)
    (root / "ple").mkdir()
    (root / "ple" / "qwen4_ple.bin").write_bytes(b"p" * 100)

    jit = root / "jit" if jit is None else jit
    build = jit / "sm90a" / "fused_add_rmsnorm" / ("build-" + "1a" * 8)
    deps = [
        ["kernels", "csrc/norm/fused_add_rmsnorm.cuh", "aa" * 32],
        ["toolkit", "include/cuda_fp16.h", "bb" * 32],
        ["abs", "/opt/custom/include/extra_ops.cuh", "cc" * 32],
    ]
    good = build / ("deps-" + "2b" * 8)
    good.mkdir(parents=True)
    (good / "sgl_deps.json").write_text(json.dumps(deps, separators=(",", ":")))
    (good / "fused_add_rmsnorm.so").write_bytes(b"\x7fELF" + b"rms" * 200)
    stale = build / ("deps-" + "3c" * 8)
    stale.mkdir()
    (stale / "sgl_deps.json").write_text(json.dumps(deps[:2], separators=(",", ":")))
    staging = build / ".staging-5e6f7a8b"
    staging.mkdir()
    (staging / "cuda.cu").write_text("// being built\n")
    return root
