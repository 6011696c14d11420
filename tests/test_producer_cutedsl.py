"""CuTe DSL (nvidia-cutlass-dsl 4.8.1) on its real producer: the DSL's own JIT writes the cache.

No GPU here: the DSL compiles for the arch ``CUTE_DSL_ARCH`` names (its own
cross-compiling override, ``EnvironmentVarManager._arch`` in
``base_dsl/env_manager.py``), sm_90a, what it detects on an H100 or H200. That
variable stands in for the GPU this machine lacks; everything else is real:
the DSL traces, lowers and runs ptxas, writes ``cute_dsl_<hash>.mlir`` into
its default cache dir and only then launches, which fails for want of a
driver (``cudaErrorInsufficientDriver``). The producer is
``tests/engines/cutedsl_op.py`` (one kernel); the registry is the real one of
``tests/registry_server.py``.

Installed by ``scripts/setup.sh --tests`` (the ``producers`` extra); skipped, with
the reason, only where ``nvidia_cutlass_dsl`` is not importable.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pwd
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import GPU_HOST, PYTHON, clean_env, run_artifactd, run_artifactd_json
from registry_server import RegistryServer

from artifactd.families.cutedsl import CACHE_DIRNAME, crc_ok

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("nvidia_cutlass_dsl") is None,
        reason="nvidia-cutlass-dsl is not importable (scripts/setup.sh --tests installs the "
        "producers extra: pip install -e '.[producers]')",
    ),
]

PRODUCER = Path(__file__).resolve().parent / "engines" / "cutedsl_op.py"
ARCH = "sm_90a"
#: ELF machine of CUDA binaries; the DSL embeds the cubin in the cached module.
EM_CUDA = 190
#: In the cubin's e_flags, measured with this release: the SM number in the low
#: byte, and this bit set for the arch-specific target (sm_90a 0x5a0d5a, sm_90 0x5a055a).
ARCH_SPECIFIC = 0x800


def produce(env: dict[str, str], cwd: Path, *prefix: str) -> dict[str, Any]:
    """Run the producer (under ``prefix``, an ``artifactd exec``) and return its report."""
    cwd.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [*prefix, PYTHON, str(PRODUCER)],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])["cutedsl_op"]
    return report


def build_env(tmp: Path, user: str, **extra: str) -> dict[str, str]:
    """A process environment: its own temp dir, user name and home, the DSL's target arch."""
    env = clean_env({"TMPDIR": str(tmp), "HOME": str(tmp.parent / f"home-{user}")})
    env.pop("USERNAME", None)
    env.update({"USER": user, "CUTE_DSL_ARCH": ARCH, **extra})
    return env


def cubin_flags(module: Path) -> tuple[int, int]:
    """Return the ELF machine and e_flags of the cubin the cached module embeds."""
    data = module.read_bytes()
    start = data.find(b"\x7fELF")
    assert start >= 0, f"no cubin in {module}"
    elf = data[start:]
    assert elf[4] == 2, "a 64-bit ELF"
    machine: int = struct.unpack_from("<H", elf, 18)[0]
    flags: int = struct.unpack_from("<I", elf, 48)[0]
    return machine, flags


def newer_than(root: Path, when: float) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.stat().st_mtime > when)


def test_the_dsl_cache_round_trips_to_another_user_and_temp_dir_and_is_used(
    registry: RegistryServer, repo: str, tmp_path: Path
) -> None:
    """Built as ``builder`` in one TMPDIR, used as ``poduser`` in another: nothing compiled.

    Then a pod whose GPU differs (``--set gpu.arch=sm_100a``) misses the family
    with ``gpu.arch`` named, and the DSL agrees: compiling for sm_100a on the
    restored cache is a miss in its own key, which ``status`` calls
    ``compiled anyway``.
    """
    build_tmp = tmp_path / "build-tmp"
    env = build_env(build_tmp, "builder")
    built = produce(env, tmp_path / "build-cwd")
    assert built["file_cache"] == "miss" and built["arch"] == ARCH
    if not GPU_HOST.driver:  # the one step that needs what this machine lacks
        assert built["launch"] == "cudaErrorInsufficientDriver", built
    name = f"cute_dsl_{built['module_hash']}.mlir"
    cache = build_tmp / "builder" / CACHE_DIRNAME
    assert sorted(p.name for p in cache.iterdir()) == [name]
    assert crc_ok(str(cache / name))
    machine, flags = cubin_flags(cache / name)
    assert (machine, flags & 0xFF, bool(flags & ARCH_SPECIFIC)) == (EM_CUDA, 90, True)

    ref = registry.ref(repo)
    harvested = run_artifactd_json(
        "harvest", "--store", ref, "--family", "cutedsl", "--gpu-arch", ARCH, env=env
    )
    assert [f["files"] for f in harvested["families"]] == [1]

    target = tmp_path / "pod"
    pod_env = build_env(tmp_path / "pod-own-tmp", "poduser")
    restored = run_artifactd_json(
        "restore",
        "--store",
        ref,
        "--target",
        str(target),
        "--family",
        "cutedsl",
        "--gpu-arch",
        ARCH,
        "--consumer-user",
        "poduser",
        env=pod_env,
    )
    assert restored["restored"] == ["cutedsl"] and restored["match"] == "full"
    (plan,) = restored["plan"]["families"]
    assert plan["layer"]["pinned_paths"] == [built["dsl_site"]], (
        "the runtime library's dir is keyed"
    )
    installed = target / "tmp" / "poduser" / CACHE_DIRNAME / name
    assert installed.read_bytes() == (cache / name).read_bytes()
    marker = json.loads((target / ".artifactd" / "restored.json").read_text())
    since = max(marker["restored_at"], (target / ".artifactd" / "restored.json").stat().st_mtime)

    exec_prefix = (PYTHON, "-m", "artifactd", "exec", "--target", str(target), "--")
    pod = produce(pod_env, tmp_path / "pod-cwd", *exec_prefix)
    assert pod == built | {"file_cache": "hit"}, pod
    assert newer_than(target, since) == []
    assert not (tmp_path / "pod-own-tmp").exists(), "the env file set TMPDIR"
    doc = json.loads(run_artifactd("status", "--target", str(target), "--json").stdout)
    fams = {f["family"]: f for f in doc["families"]}
    assert fams["cutedsl"]["verdict"] == "used", fams

    other = tmp_path / "other-gpu"
    missed = run_artifactd_json(
        "restore",
        "--store",
        ref,
        "--target",
        str(other),
        "--family",
        "cutedsl",
        "--gpu-arch",
        ARCH,
        "--set",
        "gpu.arch=sm_100a",
        env=pod_env,
    )
    assert missed["cache_hit"] is False and missed["match"] == "miss"
    (plan,) = missed["plan"]["families"]
    assert (plan["family"], plan["verdict"]) == ("cutedsl", "miss")
    assert plan["deciding"] == [{"path": "gpu.arch", "a": ARCH, "b": "sm_100a"}]
    assert "differs in gpu.arch" in plan["reason"]
    assert [d["path"] for d in missed["plan"]["nearest"]["differing"]] == ["gpu.arch"]
    assert not other.joinpath("tmp").exists()

    blackwell = produce(pod_env | {"CUTE_DSL_ARCH": "sm_100a"}, tmp_path / "pod-cwd", *exec_prefix)
    assert blackwell["file_cache"] == "miss"
    assert blackwell["module_hash"] != built["module_hash"]
    doc = json.loads(run_artifactd("status", "--target", str(target), "--json").stdout)
    fams = {f["family"]: f for f in doc["families"]}
    assert fams["cutedsl"]["verdict"] == "compiled anyway", fams


def test_without_user_the_harvest_finds_the_cache_where_the_dsl_wrote_it(tmp_path: Path) -> None:
    """No ``$USER``: the DSL names its dir after the uid's login, whatever ``$LOGNAME`` says."""
    tmp = tmp_path / "tmp"
    env = build_env(tmp, "unused", LOGNAME="not-the-login")
    del env["USER"]
    built = produce(env, tmp_path / "cwd")
    assert built["file_cache"] == "miss"
    written = tmp / pwd.getpwuid(os.getuid()).pw_name / CACHE_DIRNAME
    assert [p.name for p in written.iterdir()] == [f"cute_dsl_{built['module_hash']}.mlir"]
    store = f"oci:{tmp_path / 'store'}"
    harvested = run_artifactd_json(
        "harvest", "--store", store, "--family", "cutedsl", "--gpu-arch", ARCH, env=env
    )
    (fam,) = harvested["families"]
    assert fam["found"] == {"cache": str(written)} and fam["files"] == 1


def test_a_file_failing_its_crc_is_left_out_and_the_dsl_recompiles_it(tmp_path: Path) -> None:
    """The DSL discards a cache file whose CRC32 fails and compiles again: not worth shipping."""
    tmp = tmp_path / "tmp"
    env = build_env(tmp, "builder")
    built = produce(env, tmp_path / "cwd")
    cached = tmp / "builder" / CACHE_DIRNAME / f"cute_dsl_{built['module_hash']}.mlir"
    data = bytearray(cached.read_bytes())
    data[len(data) // 2] ^= 0xFF
    cached.write_bytes(bytes(data))
    assert not crc_ok(str(cached))

    # A second, sound file (the same kernel for sm_100a), so that there is a cache to harvest.
    other = produce(env | {"CUTE_DSL_ARCH": "sm_100a"}, tmp_path / "cwd")
    store = f"oci:{tmp_path / 'store'}"
    harvested = run_artifactd_json(
        "harvest", "--store", store, "--family", "cutedsl", "--gpu-arch", ARCH, env=env
    )
    (fam,) = harvested["families"]
    assert (fam["files"], fam["skipped"]) == (1, 1)
    shown = run_artifactd_json("inspect", f"{store}:{harvested['tags'][0]}", "--files")
    (layer,) = shown["config"]["layers"]
    assert [f["path"] for f in layer["files"]] == [f"cache/cute_dsl_{other['module_hash']}.mlir"]
    assert layer["skipped"] == [
        {
            "path": f"cache/{cached.name}",
            "reason": "corrupt CuTe DSL cache file: CRC32 mismatch (discarded at load)",
        }
    ]

    again = produce(env, tmp_path / "cwd")
    assert (again["file_cache"], again["load_failures"]) == ("miss", 1)
    assert again["module_hash"] == built["module_hash"]
    assert crc_ok(str(cached)), "the DSL wrote the file again"
