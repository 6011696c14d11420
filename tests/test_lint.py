"""Lint: build-machine paths, users, hosts and volatile vLLM factors found in cache trees."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from cachetrees import make_triton_tree
from conftest import WARMUP, clean_env, run_artifactd

from artifactd.build.run import lint_roots
from artifactd.errors import UsageError
from artifactd.families.layouts import DEEPGEMM_META_COST
from artifactd.families.vllm import classify_factor, volatile_factors
from artifactd.lint import (
    KIND_HOST,
    KIND_PATH,
    KIND_USER,
    KIND_VOLATILE,
    Finding,
    Hazards,
    LintReport,
    lint,
    lint_caches,
    root_key,
    roots_for_lint,
)

BUILD_HOME = "/home/builduser"
SITE = "/opt/buildenv/lib/python3.11/site-packages"
USER = "builduser"
HOST = "buildhost-7f9c"
POD_IP = "10.1.2.3"
KERNEL_DIR = "A" * 52  # make_triton_tree's first entry (kernel "add")
FXKEY = "fabcdef0123456789"
FACTORS = "torch_compile_cache/abcdef0123/rank_0_0/backbone/cache_key_factors.json"


def hazards_for(build: Path) -> Hazards:
    return Hazards(
        paths=(BUILD_HOME, str(build)), python_paths=(SITE,), users=(USER,), hosts=(HOST,)
    )


def triton_tree(root: Path, *, leak: bool) -> Path:
    """Triton's layout; group files hold absolute paths under ``root`` (rewritten on restore)."""
    make_triton_tree(root)
    meta = {"name": "add", "num_warps": 4, "target": {"backend": "cuda", "arch": 90}}
    if leak:
        meta["debug_dump"] = f"{BUILD_HOME}/.triton/dump/add.ttir"
    (root / KERNEL_DIR / "add.json").write_text(json.dumps(meta))
    # An interrupted write: excluded from the layer, so never linted.
    (root / "tmp.pid_123_abc" / "partial.json").write_text(f'{{"p": "{BUILD_HOME}/x"}}')
    return root


def inductor_tree(root: Path, *, leak: bool) -> Path:
    """Inductor's layout: fxgraph entries, generated .py, a CPU kernel .so, locks."""
    user_dir = "torchinductor_builduser" if leak else "torchinductor_consumer"
    log_name = f"{HOST}.log" if leak else "worker.log"
    kernel_path = (
        f"{BUILD_HOME}/.cache/torchinductor_{USER}/xy/cxyabc.py" if leak else "xy/cxyabc.py"
    )
    scratch = f"/scratch/torchinductor_{USER}/cq/cqk.so" if leak else "/scratch/shared/cq/cqk.so"
    mount = f"/mnt/{HOST}/weights" if leak else "/mnt/models/weights"
    include = f"{SITE}/torch/include" if leak else "/usr/include/python3.11"
    files = {
        f"fxgraph/ab/{FXKEY}/entry": b"\x80\x04graph-bytes" * 10,
        f"fxgraph/ab/{FXKEY}/{log_name}": b"compiled in 1.2 s\n",
        "aotautograd/akey123/entry": b"\x80\x04aot" * 10,
        "xy/cxyabc.py": (
            f"# kernel path: {kernel_path}\nimport torch\ndef call(args):\n    return args\n"
        ).encode(),
        "xy/cxyabc.best_config": b'{"XBLOCK": 128, "num_warps": 4}',
        "cq/cqk.py": f'LIB = "{scratch}"\nWEIGHTS = "{mount}"\n'.encode(),
        "c5/c5abc.so": b"\x7fELF\x00\x00\x01" + b"-I" + include.encode() + b"\x00" * 64,
        f"{user_dir}/precompiled_headers/x.h": b"#include <ATen/ATen.h>\n",
        "locks/c5abc.lock": f"{BUILD_HOME}/held".encode(),
    }
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def vllm_tree(root: Path, *, leak: bool) -> Path:
    """vLLM's layout: torch_compile_cache/<hash10>/rank_0_0/backbone/ with its factors."""
    env: dict[str, object] = {
        "VLLM_USE_V1": True,
        "VLLM_ATTENTION_BACKEND": None,
        "VLLM_LOOPBACK_IP": "127.0.0.1",
        "VLLM_HOST_IP": POD_IP if leak else "",
        "VLLM_PORT": 8000 if leak else None,
        "VLLM_RAY_BUNDLE_INDICES": "0,1,2,3" if leak else "",
    }
    code_root = SITE if leak else "/usr/lib/python3/dist-packages"
    factors = {
        "env": env,
        "config": {"model": "meta-llama/Llama-3.1-8B", "tensor_parallel_size": 4},
        "config_hash": "c0ffee" * 4,
        "code": [f"{code_root}/vllm/model_executor/models/llama.py"],
        "code_hash": "beef" * 8,
        "compiler": {"torch": "2.14.1"},
        "compiler_hash": "d00d" * 8,
    }
    path = root / FACTORS
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(factors, indent=2, sort_keys=True))
    (path.parent / "computation_graph.py").write_text("def forward(x):\n    return x\n")
    (path.parent / "artifact_compile_range_1_8192_subgraph_0").write_bytes(b"\x80\x04" * 40)
    return root


def build_trees(build: Path, *, leak: bool) -> dict[str, Path]:
    return {
        "triton": triton_tree(build / "triton", leak=leak),
        "inductor": inductor_tree(build / "inductor", leak=leak),
        "vllm": vllm_tree(build / "vllm", leak=leak),
    }


def summary(report: LintReport) -> set[tuple[str, str, str, str, str]]:
    return {(f.family, f.file, f.kind, f.value, f.severity) for f in report.findings}


EXPECTED = {
    # Triton never follows nor keys on a path in an entry's metadata: informational.
    ("triton", f"{KERNEL_DIR}/add.json", KIND_PATH, BUILD_HOME, "warning"),
    ("inductor", "xy/cxyabc.py", KIND_PATH, BUILD_HOME, "error"),
    ("inductor", "cq/cqk.py", KIND_USER, USER, "warning"),
    ("inductor", "cq/cqk.py", KIND_HOST, HOST, "warning"),
    ("inductor", "c5/c5abc.so", KIND_PATH, SITE, "warning"),
    ("inductor", f"fxgraph/ab/{FXKEY}/{HOST}.log", KIND_HOST, HOST, "warning"),
    ("inductor", "torchinductor_builduser", KIND_USER, USER, "warning"),
    ("vllm", FACTORS, KIND_PATH, SITE, "error"),
    ("vllm", FACTORS, KIND_VOLATILE, POD_IP, "error"),
    ("vllm", FACTORS, KIND_VOLATILE, "8000", "error"),
    ("vllm", FACTORS, KIND_VOLATILE, "0,1,2,3", "error"),
}


def test_planted_hazards_are_found_with_kind_file_value_and_cost(tmp_path: Path) -> None:
    build = tmp_path / "build"
    report = lint(build_trees(build, leak=True), hazards=hazards_for(build))

    assert summary(report) == EXPECTED
    assert all(f.cost.strip() and ". " not in f.cost for f in report.findings)  # one sentence
    by_key = {(f.file, f.kind, f.value): f for f in report.findings}

    triton_meta = by_key[(f"{KERNEL_DIR}/add.json", KIND_PATH, BUILD_HOME)]
    assert "Triton" in triton_meta.cost
    assert ".triton/dump/add.ttir" in triton_meta.detail
    # The whole embedded path is one finding: no separate user-name finding for it.
    assert (("xy/cxyabc.py", KIND_USER, USER)) not in by_key
    assert "/scratch/torchinductor_builduser" in by_key[("cq/cqk.py", KIND_USER, USER)].detail
    assert "Python install" in by_key[("c5/c5abc.so", KIND_PATH, SITE)].detail
    assert "directory name" in by_key[("torchinductor_builduser", KIND_USER, USER)].detail

    ip = by_key[(FACTORS, KIND_VOLATILE, POD_IP)]
    assert "env.VLLM_HOST_IP" in ip.detail
    assert "another IP" in ip.cost
    assert "env.VLLM_PORT" in by_key[(FACTORS, KIND_VOLATILE, "8000")].detail
    assert "port" in by_key[(FACTORS, KIND_VOLATILE, "8000")].cost
    ray = by_key[(FACTORS, KIND_VOLATILE, "0,1,2,3")]
    assert "VLLM_RAY_BUNDLE_INDICES" in ray.detail
    assert "Ray" in ray.cost
    assert "site-packages" in by_key[(FACTORS, KIND_PATH, SITE)].cost

    assert report.files_scanned > 10
    assert report.bytes_scanned > 0
    assert report.unreadable == []
    assert report.errors + report.warnings == len(report.findings)


def test_clean_tree_in_the_same_layout_has_no_findings(tmp_path: Path) -> None:
    build = tmp_path / "build"
    report = lint(build_trees(build, leak=False), hazards=hazards_for(build))
    assert report.findings == []
    assert report.files_scanned > 10
    assert not report.fails(strict=True)
    assert not report.fails(strict=False)


def test_errors_fail_and_warnings_fail_only_when_strict(tmp_path: Path) -> None:
    build = tmp_path / "build"
    warned = lint({"triton": triton_tree(build, leak=True)}, hazards=hazards_for(build))
    assert warned.findings and not warned.errors
    assert warned.fails(strict=True) and not warned.fails(strict=False)
    errors = lint(build_trees(tmp_path / "all", leak=True), hazards=hazards_for(tmp_path / "all"))
    assert errors.errors
    assert errors.fails(strict=False) and errors.fails(strict=True)


def test_findings_are_sorted_and_deterministic(tmp_path: Path) -> None:
    build = tmp_path / "build"
    roots = build_trees(build, leak=True)
    first = lint(roots, hazards=hazards_for(build))
    second = lint(dict(reversed(list(roots.items()))), hazards=hazards_for(build))
    assert first.findings == second.findings
    assert first.findings == sorted(first.findings, key=Finding.sort_key)


def test_group_file_rewritten_paths_exempt_but_outside_paths_reported(tmp_path: Path) -> None:
    build = tmp_path / "build"
    root = make_triton_tree(build / "triton")
    hazards = hazards_for(build)
    assert lint({"triton": root}, hazards=hazards).findings == []

    group = root / KERNEL_DIR / "__grp__add.json"
    doc = json.loads(group.read_text())
    doc["child_paths"]["add.ptx"] = f"{BUILD_HOME}/.triton/cache/{KERNEL_DIR}/add.ptx"
    group.write_text(json.dumps(doc))
    [finding] = lint({"triton": root}, hazards=hazards).findings
    assert (finding.kind, finding.file, finding.value) == (
        KIND_PATH,
        f"{KERNEL_DIR}/__grp__add.json",
        BUILD_HOME,
    )
    assert "group file points outside the cache root" in finding.cost


def test_unknown_family_is_scanned_with_default_rules(tmp_path: Path) -> None:
    build = tmp_path / "build"
    root = make_triton_tree(build / "mystery")
    report = lint({"mystery": root}, hazards=hazards_for(build))
    assert report.unknown_families == ["mystery"]
    # Nothing is known to be rewritten: the group files' absolute paths are reported.
    assert {f.file for f in report.findings} == {
        f"{KERNEL_DIR}/__grp__add.json",
        f"{'B' * 52}/__grp__softmax.json",
    }
    assert {f.value for f in report.findings} == {str(build)}
    assert all(f.family == "mystery" and f.component == "cache" for f in report.findings)


def test_component_key_selects_the_component(tmp_path: Path) -> None:
    pch = tmp_path / "pch"
    pch.mkdir()
    (pch / f"{HOST}.h.gch").write_bytes(b"gpch\x00" * 8)
    report = lint({root_key("inductor", "pch"): pch}, hazards=hazards_for(tmp_path / "b"))
    [finding] = report.findings
    assert (finding.family, finding.component, finding.kind) == ("inductor", "pch", KIND_HOST)
    assert "file name" in finding.detail


def test_read_cap(tmp_path: Path) -> None:
    root = tmp_path / "generic"
    root.mkdir()
    (root / "early.bin").write_bytes(BUILD_HOME.encode() + b"/x" + b"\x00" * 200)
    (root / "late.bin").write_bytes(b"\x00" * 200 + BUILD_HOME.encode() + b"/x")
    report = lint({"generic": root}, hazards=hazards_for(tmp_path / "b"), max_read=100)
    assert [f.file for f in report.findings] == ["early.bin"]
    assert report.files_truncated == 2
    assert report.bytes_scanned == 200


def test_missing_root_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        lint({"triton": tmp_path / "nope"}, hazards=Hazards())


def test_no_hazards_configured_finds_only_volatile_factors(tmp_path: Path) -> None:
    build = tmp_path / "build"
    report = lint(build_trees(build, leak=True), hazards=Hazards())
    assert {f.kind for f in report.findings} == {KIND_VOLATILE}


@pytest.mark.parametrize(
    ("key", "value", "category"),
    [
        ("env.VLLM_HOST_IP", POD_IP, "ip"),
        ("env.VLLM_HOST_IP", "fd00::1234", "ip"),
        ("env.MASTER", "[fd00::1]:8000", "ip"),
        ("env.VLLM_DP_MASTER", "tcp://10.0.0.7:29500", "ip"),
        ("env.VLLM_NODES", "10.0.0.7,10.0.0.8", "ip"),
        ("env.VLLM_HOST_IP", "127.0.0.1", None),
        ("env.VLLM_HOST_IP", "::1", None),
        ("env.VLLM_HOST_IP", "0.0.0.0", None),  # noqa: S104 - a value, not a bind
        ("env.VLLM_HOST_IP", "", None),
        ("env.VLLM_HOST_IP", "pod-7.svc", "address"),
        ("env.VLLM_PORT", 8000, "port"),
        # The three inputs the lint's and the vLLM family's copies disagreed on:
        ("env.VLLM_PORT", 99999, None),  # not a port: the same value on every pod
        ("env.RAY_BUNDLE_INDEX", 0, "ray"),  # bundle 0 is a placement, not "unset"
        ("config.download_dir", "/data//tmp/x", None),  # /data/tmp/x: not under /tmp
        ("env.VLLM_PORT", 0, None),  # 0 asks the OS for a port: stable
        ("env.VLLM_DP_MASTER_PORT", "29500", "port"),
        ("env.VLLM_PORT", None, None),
        ("env.VLLM_PORT", True, None),
        ("env.VLLM_RAY_BUNDLE_INDICES", "0,1", "ray"),
        ("env.VLLM_RAY_BUNDLE_INDICES", [0, 1], "ray"),
        ("env.RAY_PLACEMENT_GROUP_ID", "b7e1c0ffee", "ray"),
        ("config.model", "/data1/models/llama", "model"),
        ("config.model", "meta-llama/Llama-3.1-8B", None),
        ("config.download_dir", "/tmp/run-123/models", "tmp"),
        ("config.cudnn_version", "9.1.0.70", None),
        ("env.VLLM_USE_V1", True, None),
    ],
)
def test_classify_factor(key: str, value: object, category: str | None) -> None:
    assert classify_factor(key, value) == category


def test_volatile_factors_walks_nested_documents() -> None:
    doc = {
        "env": {"VLLM_PORT": 8000, "VLLM_USE_V1": True},
        "config": {"parallel": {"placement_group": "pg-1"}, "hosts": [{"ip": "10.9.8.7"}]},
    }
    assert [(f.key, f.value, f.category) for f in volatile_factors(doc)] == [
        ("config.hosts[0].ip", "10.9.8.7", "ip"),
        ("config.parallel.placement_group", "pg-1", "ray"),
        ("env.VLLM_PORT", 8000, "port"),
    ]


@pytest.mark.parametrize(
    ("env", "found"),
    [
        ({"VLLM_PORT": 99999}, []),
        ({"RAY_BUNDLE_INDEX": 0}, [("0", "error", "factor env.RAY_BUNDLE_INDEX (ray)")]),
        ({"VLLM_CACHE_DIR": "/data//tmp/x"}, []),
        ({"VLLM_CACHE_DIR": "/tmp/x"}, [("/tmp/x", "warning", "factor env.VLLM_CACHE_DIR (tmp)")]),
    ],
)
def test_lint_reports_what_the_one_classifier_says(
    tmp_path: Path, env: dict[str, object], found: list[tuple[str, str, str]]
) -> None:
    """The lint's volatile findings are the vLLM family's classification, nothing merged in."""
    path = tmp_path / "vllm" / FACTORS
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"env": env}))
    report = lint({"vllm": tmp_path / "vllm"}, hazards=Hazards())
    got = [(f.value, f.severity, f.detail.split(":", 1)[0]) for f in report.findings]
    assert got == found


def test_ipv6_pod_address_in_factors_is_reported(tmp_path: Path) -> None:
    root = tmp_path / "vllm"
    path = root / FACTORS
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"env": {"VLLM_HOST_IP": "fd00:10:244::17"}}))
    [finding] = lint({"vllm": root}, hazards=Hazards()).findings
    assert (finding.kind, finding.value, finding.severity) == (
        KIND_VOLATILE,
        "fd00:10:244::17",
        "error",
    )


def test_vllm_handle_file_is_rewritten_so_not_reported(tmp_path: Path) -> None:
    build = tmp_path / "build"
    root = vllm_tree(build / "vllm", leak=False)
    backbone = root / FACTORS.rsplit("/", 1)[0]
    handle = backbone / "artifact_compile_range_1_8192_subgraph_0"
    (backbone / "vllm_compile_cache.py").write_text(
        repr({(1, 8192, 0): ("key", str(handle))}) + "\n"
    )
    assert lint({"vllm": root}, hazards=hazards_for(build)).findings == []
    # Outside its root the handle is not rewritten: reported.
    (backbone / "vllm_compile_cache.py").write_text(
        repr({(1, 8192, 0): ("key", f"{BUILD_HOME}/elsewhere/artifact")}) + "\n"
    )
    [finding] = lint({"vllm": root}, hazards=hazards_for(build)).findings
    assert (finding.kind, finding.value) == (KIND_PATH, BUILD_HOME)
    assert "outside" in finding.cost


def test_planted_hazards_with_the_vllm_family_registered(tmp_path: Path) -> None:
    build = tmp_path / "build"
    report = lint(build_trees(build, leak=True), hazards=hazards_for(build))
    assert summary(report) == EXPECTED
    assert report.unknown_families == []


def test_hazards_are_normalized() -> None:
    h = Hazards(
        paths=("/home/x/", "relative/dir", "/", "/home/x", "/opt/longer/path"),
        users=("ci", "alice", "alice"),
        hosts=("localhost", "node-1"),
    )
    assert h.paths == ("/opt/longer/path", "/home/x")
    assert h.users == ("alice",)
    assert h.hosts == ("node-1",)


def test_hazards_from_environ(tmp_path: Path) -> None:
    build = tmp_path / "build"
    environ = {"HOME": "/home/alice", "TMPDIR": "/scratch/tmp", "USER": "alice"}
    h = Hazards.from_environ(environ, [build])
    assert {"/home/alice", "/scratch/tmp", str(build)} <= set(h.paths)
    assert h.users == ("alice",)
    assert sysconfig.get_paths()["purelib"] in h.python_paths
    node = os.uname().nodename
    if len(node) >= 3 and node != "localhost":
        assert node in h.hosts

    default_tmp = Hazards.from_environ({"HOME": "/home/alice", "TMPDIR": "/tmp"})
    assert "/tmp" not in default_tmp.paths


def test_from_environ_does_not_import_torch() -> None:
    code = (
        "import sys; from artifactd.lint import Hazards; Hazards.from_environ({}); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_build_lint_step_sees_what_harvest_will_pack(tmp_path: Path) -> None:
    """build.lint_roots lints the caches a matrix wrote, found as harvest finds them."""
    home = tmp_path / "home" / "builduser"
    roots = tmp_path / "roots"
    triton = roots / "triton"
    make_triton_tree(triton)
    meta = next(triton.glob("*/add.json"))
    meta.write_text('{"extern_libs": "' + str(home) + '/venv/libdevice.10.bc"}')
    env = {
        "HOME": str(home),
        "TMPDIR": str(roots / "tmp"),
        "TRITON_CACHE_DIR": str(triton),
        "USER": "builduser",
    }
    report = lint_roots(["triton"], env, roots)
    assert [(f.family, f.file) for f in report.findings if f.kind == "absolute-path"] == [
        ("triton", meta.relative_to(triton).as_posix())
    ]
    assert report.fails(strict=True)


def test_roots_for_lint_by_directory_or_by_environment(tmp_path: Path) -> None:
    """A directory is read in the restore layout; without one, caches are found as harvest does."""
    roots = tmp_path / "roots"
    make_triton_tree(roots / "triton")
    (roots / "inductor").mkdir()
    assert roots_for_lint(roots, ["triton", "inductor"], {}) == {
        "inductor:cache": roots / "inductor",
        "triton:cache": roots / "triton",
    }
    assert roots_for_lint(roots, [], {}) == {}
    elsewhere = make_triton_tree(tmp_path / "elsewhere")
    # TMPDIR of its own: Inductor's default cache is <TMPDIR>/torchinductor_<user>,
    # which any torch.compile on this machine may have left in /tmp.
    env = {
        "HOME": str(tmp_path / "nohome"),
        "TMPDIR": str(tmp_path / "notmp"),
        "TRITON_CACHE_DIR": str(elsewhere),
    }
    assert roots_for_lint(None, ["triton"], env) == {"triton:cache": elsewhere}
    assert set(roots_for_lint(None, None, env)) == {"triton:cache"}


def test_lint_caches_counts_the_directory_as_a_build_path(tmp_path: Path) -> None:
    roots = tmp_path / "roots"
    make_triton_tree(roots / "triton")
    meta = next((roots / "triton").glob("*/add.json"))
    meta.write_text(json.dumps({"dump": f"{roots}/dump/add.ttir"}))
    found, report = lint_caches(roots, ["triton"], environ={"HOME": "/nonexistent"})
    assert found == {"triton:cache": roots / "triton"}
    assert [(f.file, f.value) for f in report.findings] == [
        (meta.relative_to(roots / "triton").as_posix(), str(roots))
    ]


@pytest.mark.slow
@pytest.mark.torch
def test_a_real_triton_cache_lints_without_errors_and_a_followed_path_fails(
    tmp_path: Path,
) -> None:
    """Triton's own AOT compile (sm_90a, no GPU) leaves only informational paths.

    The build paths in its IR and metadata (source locations, libdevice) are
    warnings: the demo's own cache restores with no compile. A group file
    naming a child outside the cache root is followed at load: an error, and
    ``lint`` exits 11 without ``--strict``.
    """
    cache = tmp_path / "triton"
    env = clean_env({"TRITON_CACHE_DIR": str(cache), "HOME": str(tmp_path)})
    subprocess.run(
        [sys.executable, str(WARMUP), "--parts", "triton"], env=env, check=True, capture_output=True
    )
    assert list(cache.glob("*/*.cubin"))
    doc = json.loads(run_artifactd("lint", "--family", "triton", "--json", env=env).stdout)
    findings = doc["report"]["findings"] if "report" in doc else doc["findings"]
    assert findings, "the IR holds build paths: the scan must see them"
    assert {f["severity"] for f in findings} == {"warning"}
    text = run_artifactd("lint", "--family", "triton", env=env)
    assert text.returncode == 0 and "0 error(s)" in text.stdout
    assert run_artifactd("lint", "--family", "triton", "--strict", env=env).returncode == 11

    group = next(cache.glob("*/__grp__*.json"))
    doc = json.loads(group.read_text())
    name = next(iter(doc["child_paths"]))
    doc["child_paths"][name] = f"{tmp_path}/old-cache/{name}"  # under $HOME, not the root
    group.write_text(json.dumps(doc))
    failed = run_artifactd("lint", "--family", "triton", env=env)
    assert failed.returncode == 11, failed.stdout + failed.stderr
    assert f"error: triton/cache/{group.parent.name}/{group.name}" in failed.stdout


def test_lint_with_no_cache_says_there_was_nothing_to_lint(tmp_path: Path) -> None:
    env = clean_env({"TRITON_CACHE_DIR": str(tmp_path / "none"), "HOME": str(tmp_path)})
    proc = run_artifactd("lint", "--family", "triton", env=env)
    assert proc.returncode == 0
    assert "nothing to lint" in proc.stdout and "clean" not in proc.stdout


def deepgemm_tree(root: Path, build: Path) -> Path:
    """deep_jit's layout: one committed entry whose ``meta.json`` names the build's paths."""
    entry = root / "cache" / "sm90_fp8_gemm_1d2d.0123456789abcdef0123456789abcdef"
    entry.mkdir(parents=True)
    (entry / "kernel.cu").write_text("#include <deep_gemm/impls/sm90_fp8_gemm_1d2d.cuh>\n")
    (entry / "kernel.cubin").write_bytes(b"\x7fELF" + bytes(60))
    (entry / ".committed").write_bytes(b"")
    command = f"nvcc {build}/dg/tmp/1-2/kernel.cu --include-path {SITE}/deep_gemm/include"
    (entry / "meta.json").write_text(json.dumps({"command": command}))
    return root


def test_deepgemm_meta_json_is_information_in_every_family_that_ships_a_deepgemm_tree(
    tmp_path: Path,
) -> None:
    """deep_jit writes ``meta.json`` after compiling and never reads it back.

    Its build paths are warnings with DeepGEMM's reason in the ``deepgemm`` family and
    in the DeepGEMM dirs SGLang and vLLM host (one rule, ``layouts.deepgemm_meta``);
    the same path in the kernel source, which deep_jit hashes into its key, is an error.
    """
    build = tmp_path / "build"
    sglang = build / "sglang"
    deepgemm_tree(sglang / "deep_gemm", build)
    trees = {
        "deepgemm": deepgemm_tree(build / "dg", build),
        "sglang:cache": sglang,
        "vllm:deep_gemm": deepgemm_tree(build / "vllm-dg", build),
    }
    report = lint(trees, hazards=hazards_for(build))
    meta = [f for f in report.findings if f.kind == KIND_PATH]
    assert {(f.family, f.file) for f in meta} == {
        ("deepgemm", "cache/sm90_fp8_gemm_1d2d.0123456789abcdef0123456789abcdef/meta.json"),
        ("sglang", "deep_gemm/cache/sm90_fp8_gemm_1d2d.0123456789abcdef0123456789abcdef/meta.json"),
        ("vllm", "cache/sm90_fp8_gemm_1d2d.0123456789abcdef0123456789abcdef/meta.json"),
    }
    assert {(f.severity, f.cost) for f in meta} == {("warning", DEEPGEMM_META_COST)}
    assert not report.errors

    source = next((build / "dg" / "cache").iterdir()) / "kernel.cu"
    source.write_text(f"// built in {BUILD_HOME}/src\n")
    (error,) = [
        f for f in lint(trees, hazards=hazards_for(build)).findings if f.severity == "error"
    ]
    assert (error.family, Path(error.file).name, error.value) == (
        "deepgemm",
        "kernel.cu",
        BUILD_HOME,
    )
