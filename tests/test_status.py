"""``artifactd status``: did the engine use what was restored, or compile anyway?

The slow tests run the real CPU demo (torch.compile, Triton AOT) through
``artifactd exec`` on a restored target, as a pod would, and read the verdict
back; the compilers' own reports (Inductor's fx-graph counters, Triton's
compilation listener, printed by the warm-up) say independently what happened.

The vLLM tests build the layout of ``vllm/compilation/backends.py`` with
``cachetrees.make_vllm_tree`` and feed ``status`` log lines in the formats
vLLM's source prints them (vllm-project/vllm):

* ``vllm/compilation/backends.py`` (commit 0041b00, late 2025),
  ``VllmBackend.__call__``: ``logger.info("Using cache directory: %s for vLLM's
  torch.compile", local_cache_dir)`` with ``local_cache_dir =
  <VLLM_CACHE_ROOT>/torch_compile_cache/<hash>/rank_<r>_<dp>/<prefix>``, and
  ``"vLLM's torch.compile cache is disabled."``;
* the same file, ``CompilerManager.compile``: ``"Directly load the compiled
  graph(s) for compile range %s from the cache, took %.3f s"`` (``"... for
  dynamic shape from the cache, ..."``) and ``"Compiling a graph for compile
  range %s takes %.2f s"`` (``"... for dynamic compile range takes ..."``);
  at commit 8ea6b37 (early 2025) ``"Directly load the compiled graph(s) for
  shape %s from the cache, took %.3f s"`` and ``"Compiling a graph for general
  shape takes %.2f s"`` / ``"Compiling a graph for shape %s takes %.2f s"``;
* ``vllm/compilation/decorators.py`` (commit 01a7e5d): ``"Directly load AOT
  compilation from path %s"`` and ``"Cannot load aot compilation from path %s,
  error: %s"``; the 2026 ``AotCompileCache`` (dir
  ``torch_compile_cache/torch_aot_compile/<sha256>/rank_<r>_<dp>/model``):
  ``"Compiling model again due to a load failure from %s, reason: %s"`` and
  ``"saved AOT compiled function to %s"``.

torch's lines are from ``torch/_inductor/codecache.py`` (torch 2.13.0,
``FxGraphCache.load_with_key``): ``log.info("fx graph cache hit for key %s",
key)`` and ``"fx graph cache miss for key %s"``; the slow test also captures
them from the real warm-up with ``TORCH_LOGS=inductor``.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from cachetrees import (
    ENGINE_SITE,
    VLLM_AUTOTUNE_TABLES,
    VLLM_CLEAN_HASH,
    VLLM_VOLATILE_HASH,
    make_generic_tree,
    make_triton_tree,
    make_vllm_tree,
    vllm_factors,
)
from conftest import DEMO_MATRIX, PYTHON, WARMUP, clean_env, run_artifactd, run_artifactd_json

import artifactd
from artifactd.families import FAMILIES
from artifactd.pod.enginelogs import scan
from artifactd.pod.status import COMPILED_ANYWAY_EXIT
from artifactd.reports import REPORT_SCHEMA_VERSION

DEMO_WORKLOAD = ("--gpu-arch", "sm_90a", "--workload", "model=artifactd/cpu-demo,dtype=float32")


def status(target: Path, *args: str, code: int = 0) -> dict[str, Any]:
    """``artifactd status --target TARGET ARGS --json``: its exit code checked, its document."""
    proc = run_artifactd("status", "--target", str(target), *args, "--json")
    assert proc.returncode == code, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    assert doc["schema_version"] == REPORT_SCHEMA_VERSION
    assert doc["exit_code"] == code
    return doc


def by_family(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["family"]: f for f in doc["families"]}


def marker(target: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((target / ".artifactd" / "restored.json").read_text())
    return doc


def written_after_restore(target: Path, *paths: Path) -> None:
    """Stamp ``paths`` 10 s after the restore: what an engine writing later leaves."""
    later = marker(target)["restored_at"] + 10
    for path in paths:
        os.utime(path, (later, later))


# --------------------------------------------------------------------------
# The real CPU demo, through `artifactd exec`
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The CPU demo matrix built once for the module (inductor, triton, generic)."""
    store = f"oci:{tmp_path_factory.mktemp('demo') / 'store'}"
    run_artifactd_json("build", str(DEMO_MATRIX), "--store", store, timeout=900)
    return store


def exec_warmup(
    target: Path, home: Path, *args: str, log: Path, extra: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run the demo warm-up as a pod's engine: ``artifactd exec --target T -- python warmup.py``.

    Its stdout and stderr go to ``log`` (the engine log); returns its report.
    """
    home.mkdir(parents=True, exist_ok=True)
    env = clean_env({"HOME": str(home), **(extra or {})})
    command = [PYTHON, "-m", "artifactd", "exec", "--target", str(target), "--", PYTHON]
    with log.open("w") as out:
        proc = subprocess.run(
            [*command, str(WARMUP), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            timeout=600,
            check=False,
        )
    text = log.read_text()
    assert proc.returncode == 0, text[-3000:]
    report: dict[str, Any] = json.loads(
        next(line for line in reversed(text.splitlines()) if line.startswith("{"))
    )
    return report


@pytest.mark.torch
@pytest.mark.slow
def test_restored_caches_are_used_and_status_says_so(demo_store: str, tmp_path: Path) -> None:
    target = tmp_path / "cache"
    restored = run_artifactd_json(
        "restore", "--store", demo_store, "--target", str(target), *DEMO_WORKLOAD
    )
    assert sorted(restored["restored"]) == ["generic", "inductor", "triton"]
    before = by_family(status(target))
    assert before["inductor"]["verdict"] == before["triton"]["verdict"] == "used"

    log = tmp_path / "engine.log"
    report = exec_warmup(
        target,
        tmp_path / "home",
        "--parts",
        "inductor,triton",
        log=log,
        extra={"TORCH_LOGS": "inductor"},
    )
    assert report["inductor"]["hits"] == 3 and report["inductor"]["compiled"] == 0
    assert report["triton"]["hits"] == 3 and report["triton"]["compiled"] == 0

    doc = status(target, "--engine-log", str(log), "--fail-on-compile")
    fams = by_family(doc)
    assert doc["target"] == str(target) and doc["state"] == "restored"
    assert doc["fingerprint_hash"] == marker(target)["fingerprint_hash"]
    assert doc["restored_at"] == marker(target)["restored_at"]
    for name in ("inductor", "triton", "generic"):
        assert fams[name]["verdict"] == "used", fams[name]
        assert fams[name]["files_written"] == 0 and fams[name]["written_examples"] == []
        assert fams[name]["files_restored"] == marker(target)["families"][name]["files"]
    # Inductor wrote its FileLock files on every hit: left out, as the harvest leaves them.
    assert list((target / "inductor" / "locks").glob("*.lock"))
    assert fams["vllm"]["verdict"] == "not restored"
    # torch's own lines win over the warm-up's report; Triton's evidence is its listener's.
    assert fams["inductor"]["engine"]["source"].startswith("torch log")
    assert (fams["inductor"]["engine"]["hits"], fams["inductor"]["engine"]["misses"]) == (3, 0)
    assert "fx graph cache hit for key" in fams["inductor"]["engine"]["lines"][0]
    assert (fams["triton"]["engine"]["hits"], fams["triton"]["engine"]["misses"]) == (3, 0)
    assert doc["compiled_anyway"] == []


@pytest.mark.torch
@pytest.mark.slow
def test_a_changed_shape_and_arch_compile_anyway(demo_store: str, tmp_path: Path) -> None:
    """Restored for sm_90a and batch 8; the engine runs batch 16 and compiles for sm_80.

    Both families are restored and cannot serve what the engine asks: Inductor
    compiles two graphs of new shapes (like a pod with another
    --max-num-batched-tokens), Triton every kernel for an arch the restore's
    fingerprint (--gpu-arch sm_90a) did not describe.
    """
    target = tmp_path / "cache"
    run_artifactd_json("restore", "--store", demo_store, "--target", str(target), *DEMO_WORKLOAD)
    log = tmp_path / "engine.log"
    report = exec_warmup(
        target,
        tmp_path / "home",
        "--parts",
        "inductor,triton",
        "--batch",
        "16",
        "--arch",
        "80",
        log=log,
    )
    assert (report["inductor"]["hits"], report["inductor"]["compiled"]) == (1, 2)
    assert (report["triton"]["hits"], report["triton"]["compiled"]) == (0, 3)

    doc = status(target, "--engine-log", str(log))
    fams = by_family(doc)
    assert doc["compiled_anyway"] == ["inductor", "triton"]
    inductor, triton = fams["inductor"], fams["triton"]
    assert inductor["verdict"] == triton["verdict"] == "compiled anyway"
    assert inductor["files_written"] > 0 and triton["files_written"] >= 3 * 4
    assert 0 < len(triton["written_examples"]) <= 5
    for fam in (inductor, triton):
        for path in fam["written_examples"]:
            assert Path(path).is_relative_to(target / fam["family"]), path
            assert not path.endswith(".lock") and "/locks/" not in path
    since = marker(target)["restored_at"]
    assert [p for p in (target / "inductor").rglob("*.so") if p.stat().st_mtime > since]
    # The warm-up's report, read from the log: what each compiler said it did.
    assert (inductor["engine"]["hits"], inductor["engine"]["misses"]) == (1, 2)
    assert (triton["engine"]["hits"], triton["engine"]["misses"]) == (0, 3)
    assert fams["generic"]["verdict"] == "used"

    proc = run_artifactd("status", "--target", str(target), "--fail-on-compile")
    assert proc.returncode == COMPILED_ANYWAY_EXIT == 13
    assert "compiled anyway" in proc.stdout
    assert proc.stderr.startswith("artifactd: error: compiled anyway: inductor, triton")
    assert "Traceback" not in proc.stderr


@pytest.mark.torch
@pytest.mark.slow
def test_a_model_change_still_restores_kernels_and_they_are_used(
    demo_store: str, tmp_path: Path
) -> None:
    """Another model: no full match, but Inductor's and Triton's scopes hold no workload.

    They are restored by their family scope tags and the engine uses them.
    """
    target = tmp_path / "cache"
    restored = run_artifactd_json(
        "restore",
        "--store",
        demo_store,
        "--target",
        str(target),
        "--gpu-arch",
        "sm_90a",
        "--workload",
        "model=other,dtype=float32",
    )
    assert restored["match"] == "partial"
    assert {"inductor", "triton"} <= set(restored["restored"])
    log = tmp_path / "engine.log"
    report = exec_warmup(target, tmp_path / "home", "--parts", "inductor,triton", log=log)
    assert report["compiled"] == 0
    fams = by_family(status(target, "--engine-log", str(log), "--fail-on-compile"))
    assert fams["inductor"]["verdict"] == fams["triton"]["verdict"] == "used"


@pytest.mark.torch
@pytest.mark.slow
def test_a_restore_that_misses_is_not_restored_and_never_fails_a_probe(
    demo_store: str, tmp_path: Path
) -> None:
    """A fingerprint the store does not hold (gpu.arch sm_80): nothing restored, no marker.

    exec warns and runs the engine on its own caches; status says `not
    restored` for every family and exits 0 even with --fail-on-compile (the
    fail-open policy: a miss is not an error, and a probe must not flap).
    """
    target = tmp_path / "cache"
    report = run_artifactd_json(
        "restore",
        "--store",
        demo_store,
        "--target",
        str(target),
        *DEMO_WORKLOAD,
        "--set",
        "gpu.arch=sm_80",
    )
    assert report["cache_hit"] is False and report["match"] == "miss"
    home = tmp_path / "home"
    log = tmp_path / "engine.log"
    warm = exec_warmup(target, home, "--parts", "triton", log=log)
    assert warm["triton"]["compiled"] == 3
    assert "artifactd: warning: no env file at" in log.read_text()
    assert list((home / ".triton" / "cache").glob("*/*.cubin")), "Triton compiled into HOME"
    doc = status(target, "--engine-log", str(log), "--fail-on-compile")
    assert doc["state"] == "no marker" and doc["fingerprint_hash"] is None
    assert {f["verdict"] for f in doc["families"]} == {"not restored"}
    assert by_family(doc)["triton"]["engine"]["misses"] == 3


# --------------------------------------------------------------------------
# What counts as written (fast: synthetic trees, real harvest and restore)
# --------------------------------------------------------------------------


def harvest_and_restore(
    tmp_path: Path, family: str, environ: dict[str, str], target: Path
) -> dict[str, Any]:
    store = f"oci:{tmp_path / 'store'}"
    run_artifactd_json(
        "harvest", "--store", store, "--family", family, "--gpu-arch", "sm_90a", env=environ
    )
    return run_artifactd_json(
        "restore", "--store", store, "--target", str(target), "--gpu-arch", "sm_90a"
    )


def test_locks_and_temp_dirs_never_count_a_partial_entry_does(tmp_path: Path) -> None:
    build = make_triton_tree(tmp_path / "build" / "triton")
    target = tmp_path / "cache"
    env = clean_env({"TRITON_CACHE_DIR": str(build), "HOME": str(tmp_path)})
    assert harvest_and_restore(tmp_path, "triton", env, target)["restored"] == ["triton"]
    tri = target / "triton"
    # Triton's lock-free temp dir, a lock dir, lock and tmp files: left out of a harvest.
    (tri / "tmp.pid_77_deadbeef").mkdir()
    (tri / "tmp.pid_77_deadbeef" / "mm.cubin").write_bytes(b"x")
    (tri / "locks").mkdir()
    (tri / "locks" / "k.lock").write_bytes(b"")
    (tri / "k.lock").write_bytes(b"")
    (tri / "AAAA.tmp").write_bytes(b"")
    noise = [tri / "tmp.pid_77_deadbeef" / "mm.cubin", tri / "locks" / "k.lock"]
    written_after_restore(target, *noise, tri / "k.lock", tri / "AAAA.tmp")
    # Reading the cache (a hit) changes no mtime.
    assert by_family(status(target))["triton"]["verdict"] == "used"

    # A kernel dir still being written (no group file yet) counts: a compile is under way.
    partial = tri / ("Z" * 52)
    partial.mkdir()
    (partial / "mm.cubin").write_bytes(b"\x7fELF")
    written_after_restore(target, partial / "mm.cubin")
    fam = by_family(status(target))["triton"]
    assert fam["verdict"] == "compiled anyway"
    assert fam["written_examples"] == [str(partial / "mm.cubin")]


def test_the_human_report_says_when_the_target_was_restored(tmp_path: Path) -> None:
    """The plain (not --json) report prints the restore's time, in UTC, on every Python."""
    build = make_triton_tree(tmp_path / "build" / "triton")
    target = tmp_path / "cache"
    env = clean_env({"TRITON_CACHE_DIR": str(build), "HOME": str(tmp_path)})
    assert harvest_and_restore(tmp_path, "triton", env, target)["restored"] == ["triton"]
    proc = run_artifactd("status", "--target", str(target))
    assert proc.returncode == 0, proc.stderr
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(marker(target)["restored_at"]))
    assert f"status of {target}: restored {when} UTC" in proc.stdout


def vllm_target(tmp_path: Path) -> Path:
    """A vLLM cache in vLLM's layout, harvested and restored into ``tmp_path/cache``."""
    build = make_vllm_tree(tmp_path / "build" / "vllm")
    target = tmp_path / "cache"
    env = clean_env({"VLLM_CACHE_ROOT": str(build), "HOME": str(tmp_path)})
    assert harvest_and_restore(tmp_path, "vllm", env, target)["restored"] == ["vllm"]
    return target


def vllm_line(message: str) -> str:
    """A line as vLLM's logger prints it in an engine core process (with colour codes)."""
    return (
        f"(EngineCore_DP0 pid=3021) \x1b[32mINFO\x1b[0m 09-23 18:12:27 [backends.py:539] {message}"
    )


def engine_log(tmp_path: Path, *messages: str) -> Path:
    log = tmp_path / "engine.log"
    log.write_text("".join(vllm_line(m) + "\n" for m in messages))
    return log


def test_vllm_used_its_restored_dir(tmp_path: Path) -> None:
    target = vllm_target(tmp_path)
    local = target / "vllm" / "torch_compile_cache" / VLLM_CLEAN_HASH / "rank_0_0" / "backbone"
    # vLLM releases that rewrite vllm_compile_cache.py at every start, hit or not.
    written_after_restore(target, local / "vllm_compile_cache.py")
    aot = next((target / "vllm" / "torch_compile_cache" / "torch_aot_compile").glob("*"))
    log = engine_log(
        tmp_path,
        f"Using cache directory: {local} for vLLM's torch.compile",
        "Dynamo bytecode transform time: 0.98 s",
        "Directly load the compiled graph(s) for compile range (1, 8192) from the cache, "
        "took 0.648 s",
        f"Directly load AOT compilation from path {aot}/rank_0_0/model",
    )
    fam = by_family(status(target, "--engine-log", str(log), "--fail-on-compile"))["vllm"]
    assert fam["verdict"] == "used", fam
    engine = fam["engine"]
    assert (engine["hits"], engine["misses"]) == (2, 0)
    assert engine["cache_dirs"] == [str(local), f"{aot}/rank_0_0/model"]
    assert engine["other_dirs"] == []
    assert engine["lines"][0].startswith("(EngineCore_DP0 pid=3021) INFO")  # colours stripped


def test_vllm_deep_gemm_hit_is_used_a_retuned_autotune_table_is_not(tmp_path: Path) -> None:
    # Read from source: deep_jit (sgl-deep-gemm 0.2.3.post2) touches .committed on a hit;
    # vLLM 0.33 saves a FlashInfer autotune table only after tuning (kernel_warmup.py).
    build = make_vllm_tree(tmp_path / "build" / "vllm")
    dj = build / "deep_gemm" / "cache" / ("sm90_fp8_gemm_1d2d." + "5d" * 8)
    dj.mkdir(parents=True)
    for name in ("kernel.cu", "kernel.cubin", ".committed"):
        (dj / name).write_bytes(name.encode())
    target = tmp_path / "cache"
    env = clean_env({"VLLM_CACHE_ROOT": str(build), "HOME": str(tmp_path)})
    assert harvest_and_restore(tmp_path, "vllm", env, target)["restored"] == ["vllm"]
    root = target / "vllm"
    written_after_restore(target, root / "deep_gemm" / "cache" / dj.name / ".committed")
    assert by_family(status(target))["vllm"]["verdict"] == "used"
    table = root / VLLM_AUTOTUNE_TABLES / "autotune_configs_dp0_rank0.json"
    written_after_restore(target, table)
    fam = by_family(status(target))["vllm"]
    assert fam["verdict"] == "compiled anyway"
    assert fam["written_examples"] == [str(table)]


def test_vllm_chose_another_hash_dir_and_status_names_the_factor(tmp_path: Path) -> None:
    """The case peers report most: a pod IP in vLLM's hash factors gives a new dir."""
    target = vllm_target(tmp_path)
    new = target / "vllm" / "torch_compile_cache" / "0f8b20bdea" / "rank_0_0" / "backbone"
    new.mkdir(parents=True)
    factors = vllm_factors(ENGINE_SITE, pod_ip="10.244.7.9", port=5600, tmp_code=True)
    (new / "cache_key_factors.json").write_text(json.dumps(factors))
    (new / "artifact_compile_range_1_8192_subgraph_0").write_bytes(b"PK\x03\x04")
    written_after_restore(target, *new.iterdir())
    log = engine_log(
        tmp_path,
        f"Using cache directory: {new} for vLLM's torch.compile",
        "Compiling a graph for compile range (1, 8192) takes 20.50 s",
    )
    doc = status(target, "--engine-log", str(log), "--fail-on-compile", code=13)
    fam = by_family(doc)["vllm"]
    assert fam["verdict"] == "compiled anyway"
    assert fam["files_written"] == 2
    engine = fam["engine"]
    assert (engine["hits"], engine["misses"]) == (0, 1)
    [other] = engine["other_dirs"]
    assert other["path"] == str(new)
    assert "torch_compile_cache/0f8b20bdea is not a dir the restore installed" in other["why"]
    # Compared with the closest restored dir (the one built with another pod IP).
    assert other["factors"] == [
        'env.VLLM_NIXL_SIDE_CHANNEL_HOST: "10.244.3.17" restored -> "10.244.7.9" engine (ip)'
    ]
    text = run_artifactd(
        "status", "--target", str(target), "--engine-log", str(log), "--fail-on-compile"
    )
    assert text.returncode == 13
    assert f"vllm: the engine used {new}" in text.stdout
    assert "VLLM_NIXL_SIDE_CHANNEL_HOST" in text.stdout


def test_vllm_outside_the_restored_root_is_compiled_anyway(tmp_path: Path) -> None:
    """The env file never reached the engine: it compiled under HOME, the target is untouched."""
    target = vllm_target(tmp_path)
    home_dir = f"/root/.cache/vllm/torch_compile_cache/{VLLM_VOLATILE_HASH}/rank_0_0/backbone"
    log = engine_log(
        tmp_path,
        f"Using cache directory: {home_dir} for vLLM's torch.compile",
        "Compiling a graph for dynamic shape takes 28.96 s",
    )
    fam = by_family(status(target, "--engine-log", str(log)))["vllm"]
    assert fam["verdict"] == "compiled anyway" and fam["files_written"] == 0
    assert "engine log says it compiled" in fam["why"]
    [other] = fam["engine"]["other_dirs"]
    assert other["path"] == home_dir and "outside the restored VLLM_CACHE_ROOT" in other["why"]


def test_vllm_cache_disabled_and_a_failed_aot_load(tmp_path: Path) -> None:
    target = vllm_target(tmp_path)
    aot = next((target / "vllm" / "torch_compile_cache" / "torch_aot_compile").glob("*"))
    log = engine_log(
        tmp_path,
        "vLLM's torch.compile cache is disabled.",
        f"Compiling model again due to a load failure from {aot}/rank_0_0/model, "
        "reason: Source code has changed since the last compilation. Recompiling the model.",
    )
    engine = by_family(status(target, "--engine-log", str(log)))["vllm"]["engine"]
    assert engine["cache_disabled"] is True
    assert (engine["hits"], engine["misses"]) == (0, 1)


def test_log_formats_from_the_engines_sources() -> None:
    """Each format the module reads, as the source prints it (see the module doc)."""
    facts = scan(
        [
            # vllm/compilation/backends.py at 8ea6b37 (early 2025)
            b"INFO 03-07 03:06:55 [backends.py:409] Using cache directory: "
            b"/root/.cache/vllm/torch_compile_cache/1517964802/rank_0_0 for vLLM's torch.compile",
            b"INFO 03-07 03:07:01 [backends.py:140] Compiling a graph for general shape "
            b"takes 9.12 s",
            b"INFO 03-07 03:07:02 [backends.py:140] Compiling a graph for shape 256 takes 1.50 s",
            b"INFO 03-07 03:09:01 [backends.py:110] Directly load the compiled graph(s) for shape "
            b"None from the cache, took 0.351 s",
            # decorators.py at 01a7e5d
            b"WARNING [decorators.py:290] Cannot load aot compilation from path "
            b"/c/torch_aot_compile/ab/rank_0_0/model, error: EOF",
            b"INFO [decorators.py:708] saved AOT compiled function to /c/x/rank_0_0/model",
            # torch/_inductor/codecache.py
            b"I1202 00:55:45.394000 1991 torch/_inductor/codecache.py:2299] [0/0] "
            b"fx graph cache miss for key fxuljkgd3oicxm",
            b"\xff\xfe not UTF-8 is replaced, not fatal",
        ],
        "log",
    )
    assert facts.lines == 8
    assert (facts.vllm.hits, facts.vllm.misses) == (1, 4)
    assert facts.vllm_dirs[0] == "/root/.cache/vllm/torch_compile_cache/1517964802/rank_0_0"
    assert (facts.fx_graph.hits, facts.fx_graph.misses) == (0, 1)
    # A printed counters mapping (Counter repr or JSON) when no log line is there.
    counted = scan(["Counter({'fxgraph_cache_miss': 2, 'fxgraph_cache_hit': 5})"])
    assert counted.counters == {"miss": 2, "hit": 5}


# --------------------------------------------------------------------------
# States of the target: never a flapping probe
# --------------------------------------------------------------------------


def test_no_marker_journal_and_stale_env_file_are_not_restored_exit_0(tmp_path: Path) -> None:
    empty = status(tmp_path / "nothing", "--fail-on-compile")
    assert empty["state"] == "no marker"
    assert {f["verdict"] for f in empty["families"]} == {"not restored"}

    build = make_triton_tree(tmp_path / "build" / "triton")
    target = tmp_path / "cache"
    env = clean_env({"TRITON_CACHE_DIR": str(build), "HOME": str(tmp_path)})
    harvest_and_restore(tmp_path, "triton", env, target)
    kernel = next(p for p in (target / "triton").glob("A*/*.cubin"))
    written_after_restore(target, kernel)
    assert status(target, "--fail-on-compile", code=13)["compiled_anyway"] == ["triton"]

    journal = target / ".artifactd" / "journal.json"
    journal.write_text("{}")  # a restore installing (or interrupted): the marker is not trusted
    busy = status(target, "--fail-on-compile")
    assert busy["state"] == "restore in progress"
    assert by_family(busy)["triton"]["verdict"] == "not restored"
    journal.unlink()

    env_file = target / "artifactd.env"
    original = env_file.read_text()
    env_file.write_text(original + "EXTRA=1\n")
    stale = status(target)
    assert stale["state"] == "stale" and "env file" in stale["detail"]
    env_file.write_text(original)
    # The env file elsewhere: status must be told, as the restore was.
    moved = tmp_path / "elsewhere.env"
    env_file.rename(moved)
    assert status(target)["state"] == "stale"
    assert status(target, "--env-file", str(moved), code=0)["state"] == "restored"
    assert (target / ".artifactd" / "restored.json").exists()  # nothing was repaired or removed


def test_an_unreadable_engine_log_is_reported_not_fatal(tmp_path: Path) -> None:
    doc = status(tmp_path, "--engine-log", str(tmp_path / "missing.log"), "--fail-on-compile")
    assert "cannot read" in doc["engine_log_error"]
    proc = run_artifactd(
        "status", "--target", str(tmp_path), "--engine-log", str(tmp_path / "missing.log")
    )
    assert proc.returncode == 0 and "engine log: cannot read" in proc.stdout


def test_an_engine_log_that_is_a_fifo_or_a_device_is_refused_at_once(tmp_path: Path) -> None:
    """A FIFO no engine writes would block the read, /dev/zero never end: both are refused."""
    fifo = tmp_path / "engine.fifo"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero")):
        proc = run_artifactd(
            "status", "--target", str(tmp_path), "--engine-log", str(path), "--json", timeout=30
        )
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout.strip().splitlines()[-1])
        assert doc["engine_log_error"].startswith(f"cannot read {path}"), doc
        assert "regular file" in doc["engine_log_error"], doc
    link = tmp_path / "engine.log"
    (tmp_path / "logs").mkdir()
    link.symlink_to(engine_log(tmp_path / "logs", "a line"))
    doc = status(tmp_path, "--engine-log", str(link))
    assert doc["engine_log_error"] is None, doc


def test_engine_log_from_stdin_and_environment_variables(tmp_path: Path) -> None:
    target = vllm_target(tmp_path)
    local = target / "vllm" / "torch_compile_cache" / VLLM_CLEAN_HASH / "rank_0_0" / "backbone"
    lines = vllm_line(f"Using cache directory: {local} for vLLM's torch.compile") + "\n"
    env = clean_env(
        {
            "ARTIFACTD_TARGET": str(target),
            "ARTIFACTD_ENGINE_LOG": "-",
            "ARTIFACTD_FAIL_ON_COMPILE": "1",
            "ARTIFACTD_JSON": "1",
        }
    )
    proc = subprocess.run(
        [PYTHON, "-m", "artifactd", "status"],
        input=lines,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["engine_log"] == "-"
    assert by_family(doc)["vllm"]["engine"]["cache_dirs"] == [str(local)]


def test_docs_say_what_written_since_restore_means_for_each_family() -> None:
    """``docs/families.md`` carries each family's ``written_since_restore`` and load rewrites."""
    doc = (Path(__file__).resolve().parent.parent / "docs" / "families.md").read_text()
    for name in sorted(FAMILIES):
        fam = FAMILIES[name]
        rewrites = ", ".join(f"`{n}`" for n in sorted(fam.load_rewrites)) or "-"
        assert f"| `{name}` | {fam.written_since_restore} | {rewrites} |" in doc, name


def test_vllm_aot_at_the_old_root_layout_is_named(tmp_path: Path) -> None:
    """decorators.py at 01a7e5d puts AOT artifacts at ``$VLLM_CACHE_ROOT/torch_aot_compile``.

    The vllm family ships ``torch_compile_cache/`` only, so such a dir is never
    restored: status says so instead of blaming a hash factor.
    """
    target = vllm_target(tmp_path)
    model = target / "vllm" / "torch_aot_compile" / ("ab" * 32) / "rank_0_0" / "model"
    log = engine_log(tmp_path, f"Directly load AOT compilation from path {model}")
    engine = by_family(status(target, "--engine-log", str(log)))["vllm"]["engine"]
    [other] = engine["other_dirs"]
    assert other["path"] == str(model) and "older AOT layout" in other["why"]
    assert other["factors"] == []


def test_status_metrics_as_a_textfile_and_for_a_scrape(tmp_path: Path) -> None:
    """A generic cache restored, then one file written into it: the metrics say so."""
    env = clean_env(
        {"HOME": str(tmp_path), "ARTIFACTD_GENERIC_DIR": str(make_generic_tree(tmp_path / "g"))}
    )
    store = f"oci:{tmp_path / 'store'}"
    assert (
        run_artifactd("harvest", "--store", store, "--family", "generic", env=env).returncode == 0
    )
    target = tmp_path / "cache"
    done = run_artifactd(
        "restore", "--store", store, "--target", str(target), "--family", "generic", env=env
    )
    assert done.returncode == 0, done.stderr
    time.sleep(0.05)
    (target / "generic" / "compiled-later.cubin").write_bytes(b"\x7fELF")
    prom = tmp_path / "status.prom"
    proc = run_artifactd("status", "--target", str(target), "--metrics-file", str(prom), env=env)
    assert proc.returncode == 0, proc.stderr
    text = prom.read_text()
    assert 'artifactd_family_compiled_files{family="generic"} 1.0' in text
    assert 'artifactd_family_used{family="generic"} 0.0' in text
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = ["status", "--target", str(target), "--serve", f"127.0.0.1:{port}"]
    server = subprocess.Popen(
        [PYTHON, "-m", "artifactd", *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        body = ""
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    body = r.read().decode()
                break
            except OSError:
                time.sleep(0.1)
        assert 'artifactd_family_compiled_files{family="generic"} 1.0' in body
    finally:
        server.terminate()
        server.wait(timeout=10)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_status_serve_is_prometheus_clients_server(tmp_path: Path) -> None:
    """--serve answers as Prometheus asks (OpenMetrics, gzip), afresh, and a busy port is exit 2."""
    env = clean_env(
        {"HOME": str(tmp_path), "ARTIFACTD_GENERIC_DIR": str(make_generic_tree(tmp_path / "g"))}
    )
    store = f"oci:{tmp_path / 'store'}"
    assert (
        run_artifactd("harvest", "--store", store, "--family", "generic", env=env).returncode == 0
    )
    target = tmp_path / "cache"
    done = run_artifactd(
        "restore", "--store", store, "--target", str(target), "--family", "generic", env=env
    )
    assert done.returncode == 0, done.stderr
    port = _free_port()
    server = subprocess.Popen(
        [PYTHON, "-m", "artifactd", "status", "--target", str(target)],
        env={**env, "ARTIFACTD_STATUS_SERVE": f"127.0.0.1:{port}"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}/metrics"

    def scrape(**headers: str) -> tuple[dict[str, str], bytes]:
        request = urllib.request.Request(url, headers=headers)
        with urllib.request.urlopen(request, timeout=5) as r:  # noqa: S310 - loopback
            return dict(r.headers), r.read()

    try:
        for _ in range(100):
            try:
                scrape()
                break
            except OSError:
                time.sleep(0.1)
        head, body = scrape(Accept="application/openmetrics-text; version=1.0.0")
        assert head["Content-Type"].startswith("application/openmetrics-text"), head
        text = body.decode()
        assert text.endswith("# EOF\n"), text[-200:]
        assert 'artifactd_family_compiled_files{family="generic"} 0.0' in text
        # Afresh at each scrape: a file the engine compiles now shows in the next one.
        time.sleep(0.05)
        (target / "generic" / "compiled-later.cubin").write_bytes(b"\x7fELF")
        head, body = scrape(**{"Accept-Encoding": "gzip"})
        assert head.get("Content-Encoding") == "gzip", head
        assert head["Content-Type"].startswith("text/plain; version=0.0.4"), head
        assert b'artifactd_family_compiled_files{family="generic"} 1.0' in gzip.decompress(body)
        # The port is taken now: a second server says so in one line, exit 2.
        busy = run_artifactd(
            "status", "--target", str(target), "--serve", f"127.0.0.1:{port}", env=env
        )
        assert busy.returncode == 2, (busy.returncode, busy.stderr)
        assert "cannot listen" in busy.stderr and "Traceback" not in busy.stderr, busy.stderr
        bad = run_artifactd("status", "--target", str(target), "--serve", ":99999", env=env)
        assert bad.returncode == 2 and "HOST:PORT" in bad.stderr, bad.stderr
    finally:
        server.terminate()
        _, err = server.communicate(timeout=10)
    assert "Traceback" not in err, err


def test_metrics_are_served_by_one_server_prometheus_clients() -> None:
    """No second, hand-written HTTP server: metrics.serving is the one that answers scrapes."""
    package = Path(artifactd.__file__).parent
    hand_written = [
        str(path.relative_to(package))
        for path in sorted(package.rglob("*.py"))
        for word in ("http.server", "socketserver", "wsgiref", "BaseHTTPRequestHandler")
        if word in path.read_text()
    ]
    assert hand_written == [], hand_written
    assert "start_http_server" in (package / "pod" / "metrics.py").read_text()
