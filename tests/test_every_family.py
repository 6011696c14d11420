"""Every registered family harvests, packs and restores through a real local store.

Each family's cache is built in its library's real layout (tests/cachetrees.py
names the source of each), found through the variable the library reads,
harvested alone, restored into a fresh target, and checked: files back in
place, partial entries left out, and the env file pointing the library there.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import pytest
from cachetrees import (
    VLLM_AUTOTUNE_TABLES,
    make_cudajit_tree,
    make_cutedsl_tree,
    make_deepgemm_tree,
    make_flashinfer_tree,
    make_generic_tree,
    make_sglang_tree,
    make_tilelang_tree,
    make_triton_tree,
    make_vllm_tree,
)
from conftest import run_artifactd

from artifactd.build.harvest import harvest
from artifactd.families import FAMILIES, Family
from artifactd.families.vllm import volatile_factors
from artifactd.fingerprint.model import Fingerprint
from artifactd.restore.install import restore
from artifactd.restore.resolve import plan_restore
from artifactd.restore.source import StoreSource
from artifactd.stores import open_store
from artifactd.trust.policy import UNSAFE_NO_VERIFICATION


def _inductor(root: Path) -> dict[str, str]:
    """torch 2.13's layout: fxgraph/<k[1:3]>/<key>/<entry>, <xx>/<hash>.py, locks/."""
    entry = root / "inductor" / "fxgraph" / "ab" / "fabcdef" / "entry0"
    entry.parent.mkdir(parents=True)
    entry.write_bytes(b"pickled graph")
    (root / "inductor" / "cd").mkdir()
    (root / "inductor" / "cd" / "ccd123.py").write_text("# generated kernel\n")
    (root / "inductor" / "locks").mkdir()
    (root / "inductor" / "locks" / "x.lock").write_text("")
    return {"TORCHINDUCTOR_CACHE_DIR": str(root / "inductor")}


def _flashinfer(root: Path) -> dict[str, str]:
    make_flashinfer_tree(root / "fi-home")
    return {"FLASHINFER_WORKSPACE_BASE": str(root / "fi-home")}


def _sglang(root: Path) -> dict[str, str]:
    make_sglang_tree(root / "sglang", jit=root / "sglang-jit")
    return {
        "SGLANG_CACHE_DIR": str(root / "sglang"),
        "SGLANG_JIT_CACHE_DIR": str(root / "sglang-jit"),
    }


def _simple(
    var: str, build: Callable[[Path], object], sub: str
) -> Callable[[Path], dict[str, str]]:
    def make(root: Path) -> dict[str, str]:
        build(root / sub)
        return {var: str(root / sub)}

    return make


BUILDERS: dict[str, Callable[[Path], dict[str, str]]] = {
    "triton": _simple("TRITON_CACHE_DIR", make_triton_tree, "triton"),
    "inductor": _inductor,
    "generic": _simple("ARTIFACTD_GENERIC_DIR", make_generic_tree, "generic"),
    "deepgemm": _simple("DG_JIT_CACHE_DIR", make_deepgemm_tree, "dg"),
    "tilelang": _simple("TILELANG_CACHE_DIR", make_tilelang_tree, "tl"),
    "cutedsl": _simple("CUTE_DSL_CACHE_DIR", make_cutedsl_tree, "cute"),
    "cuda-jit": _simple("CUDA_CACHE_PATH", make_cudajit_tree, "nv"),
    "flashinfer": _flashinfer,
    "vllm": _simple("VLLM_CACHE_ROOT", make_vllm_tree, "vllm"),
    "sglang": _sglang,
}


def test_every_registered_family_has_a_builder() -> None:
    assert set(BUILDERS) == set(FAMILIES)


@pytest.mark.parametrize("family", sorted(BUILDERS))
def test_family_harvests_and_restores(family: str, tmp_path: Path, local_fp: Fingerprint) -> None:
    environ = {
        "HOME": str(tmp_path / "home"),
        "TMPDIR": str(tmp_path / "tmp"),
        **BUILDERS[family](tmp_path / "build"),
    }
    (tmp_path / "tmp").mkdir()
    with open_store(f"oci:{tmp_path / 'store'}", create=True) as st:
        result = harvest(st, local_fp, families=[family], environ=environ)
        [packed] = result.families
        assert packed.family == family and packed.files > 0
        target = tmp_path / "pod"
        plan = plan_restore(
            StoreSource(st), local_fp, target, families=[family], trust=UNSAFE_NO_VERIFICATION
        )
        assert plan.match == "full"
        done = restore(plan, StoreSource(st))
    assert done.restored == [family] and done.files == packed.files
    fam = FAMILIES[family]
    # A set: vLLM nests its deep_gemm component inside its cache dir.
    restored = {
        p
        for d in fam.restore_dirs(target).values()
        if d.is_dir()
        for p in d.rglob("*")
        if p.is_file() or p.is_symlink()
    }
    assert len(restored) == packed.files
    assert_same_content(fam, environ, target)
    env = (target / "artifactd.env").read_text()
    for var in {k for c in fam.components for k in c.env}:
        assert f"{var}=" in env


def assert_same_content(fam: Family, environ: dict[str, str], target: Path) -> None:
    """Each restored file holds the harvested bytes, or them with the root moved.

    Path-bearing files (group files, vLLM's handles, FlashInfer's ninja files)
    may differ from the original only by the harvest root's path replaced with
    the restored one (and, in a ``.ninja_log``, the command hashes);
    the expected bytes are computed here by plain substitution, not by the
    family's own rewrite. Symlinks keep their target the same way.
    """
    dirs = fam.restore_dirs(target)
    checked = 0
    for loc in fam.locate(environ):
        src_root, dst_root = loc.path, dirs[loc.component.name]
        for dst in (p for p in dst_root.rglob("*") if p.is_file() or p.is_symlink()):
            rel = dst.relative_to(dst_root)
            src = src_root / rel
            if dst.is_symlink():
                link, was = os.readlink(dst), os.readlink(src)
                assert link in (was, was.replace(str(src_root), str(dst_root))), rel
            elif fam.path_bearing(loc.component.name, PurePosixPath(rel.as_posix())):
                want = src.read_bytes().replace(str(src_root).encode(), str(dst_root).encode())
                if rel.name == ".ninja_log":
                    # The command hashes change with the paths (tests/test_families_engines.py).
                    def cut(data: bytes) -> list[bytes]:
                        return [line.rsplit(b"\t", 1)[0] for line in data.splitlines()]

                    assert cut(dst.read_bytes()) == cut(want), rel
                elif rel.name == ".ninja_deps":  # binary: the record sizes change too
                    got = dst.read_bytes()
                    assert str(dst_root).encode() in got and str(src_root).encode() not in got
                else:
                    assert dst.read_bytes() == want, rel
            else:
                assert dst.read_bytes() == src.read_bytes(), rel
            checked += 1
    assert checked > 0


def test_version_strings_are_not_addresses() -> None:
    found = volatile_factors({"env": {"CUDNN_VERSION": "9.1.0.70", "VLLM_HOST": "10.1.2.3"}})
    assert [(f.key, f.value) for f in found] == [("env.VLLM_HOST", "10.1.2.3")]


def test_diff_of_two_vllm_artifacts_names_the_volatile_factor(
    tmp_path: Path, local_fp: Fingerprint
) -> None:
    """Same fingerprint shape, two pods: diff of the artifacts shows the pod IP in the factors."""
    store = f"oci:{tmp_path / 'store'}"
    tags = []
    for pod, ip in (("a", "10.244.3.17"), ("b", "10.244.9.80")):
        root = tmp_path / pod / "vllm"
        make_vllm_tree(root, pod_ip=ip)
        fp = local_fp.model_copy(update={"workload": {"pod": pod}})
        with open_store(store, create=True) as st:
            res = harvest(
                st,
                fp,
                families=["vllm"],
                environ={"VLLM_CACHE_ROOT": str(root), "HOME": str(tmp_path)},
            )
        tags.append(res.tags[0])
    proc = run_artifactd("diff", f"{store}:{tags[0]}", f"{store}:{tags[1]}", "--json")
    assert proc.returncode == 1, proc.stderr  # the sides differ
    doc = json.loads(proc.stdout)
    assert {f["path"] for f in doc["fields"]} == {"workload.pod"}
    changed = {(f["a"], f["b"]) for f in doc["facts"] if f["family"] == "vllm"}
    assert ("10.244.3.17", "10.244.9.80") in changed


@pytest.mark.parametrize("family", ["vllm", "sglang", "deepgemm"])
def test_restored_components_are_where_the_library_looks(
    family: str, tmp_path: Path, local_fp: Fingerprint
) -> None:
    # Read from source (vLLM 0.33, SGLang 0.5.23, sgl-deep-gemm 0.2.3.post2): a pod that
    # loads the env file must find every restored component where the library defaults it,
    # vLLM's flashinfer_autotune_cache and deep_gemm included (no variable of their own).
    environ = {"HOME": str(tmp_path / "home"), **BUILDERS[family](tmp_path / "build")}
    with open_store(f"oci:{tmp_path / 'store'}", create=True) as st:
        harvest(st, local_fp, families=[family], environ=environ)
        target = tmp_path / "pod"
        restore(
            plan_restore(
                StoreSource(st), local_fp, target, families=[family], trust=UNSAFE_NO_VERIFICATION
            ),
            StoreSource(st),
        )
    fam = FAMILIES[family]
    pod_env = {"HOME": str(tmp_path / "pod-home")}
    for line in (target / "artifactd.env").read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith("#"):
            pod_env[key.removeprefix("export ").strip()] = value.strip().strip("'\"")
    found = {loc.component.name: loc.path for loc in fam.locate(pod_env)}
    harvested = {loc.component.name for loc in fam.locate(environ)}
    assert found == {n: d for n, d in fam.restore_dirs(target).items() if n in harvested}
    if family == "vllm":
        assert "flashinfer_autotune" in found
        # vLLM 0.33: $VLLM_CACHE_ROOT/flashinfer_autotune_cache/<fi version>/<archs>/<hash>/
        root = Path(pod_env["VLLM_CACHE_ROOT"])
        tables = root / VLLM_AUTOTUNE_TABLES
        assert sorted(p.name for p in tables.iterdir()) == [
            "autotune_configs_dp0_rank0.json",
            "autotune_configs_dp0_rank1.json",
        ]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_text_paths_a_restore_plans_are_the_path_ones(name: str) -> None:
    """restore_paths (the plan's and the env file's, without pathlib) is restore_dirs as text."""
    fam = FAMILIES[name]
    for target in ("/cache", "/cache/", "//cache/./pod", "/a/../b", "rel/pod"):
        for user in (None, "alice", "", ".", "a/b:c"):
            texts = fam.restore_paths(target, user=user)
            paths = fam.restore_dirs(Path(target), user=user)
            assert texts == {k: str(v) for k, v in paths.items()}, (target, user)
            env = fam.restore_env(Path(target), user=user)
            assert env == fam.restore_env(target, user=user), (target, user)
