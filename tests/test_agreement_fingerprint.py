"""What a build publishes is what a pod picks: one published fingerprint, every caller.

Every command here is the real entry point in its own process, on real
files: ``build`` (whole, or one cell of a fan-out), ``merge``, ``verify``, and
the pod's side (``fingerprint --hash`` and ``restore``, with the flags and
variables :mod:`artifactd.build.published` says a pod passes). Cells are small
Python programs that write a cache file.

GPUs: this machine has none, so processes that must see some get the
recorded NVML and libcuda doubles of ``tests/gpudoubles.py`` (an H200
recording cut to N devices) installed before the CLI starts (``prelude``):
the probe's real NVML path then reads N visible GPUs, as a worker or a pod
given N devices would.
"""

from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import PYTHON, clean_env, run_artifactd

import artifactd

TESTS = Path(__file__).resolve().parent
WORKLOAD = {"model": "acme/agree", "dtype": "bfloat16"}
POD_FLAGS = ["--gpu-arch", "sm_90a", *(f"--workload={k}={v}" for k, v in WORKLOAD.items())]

#: A cell: writes one file into each family root it is given (once: a re-run on
#: restored caches compiles nothing), and prints a check.
CELL = """\
import json, os, sys
name = sys.argv[1]
backbone = "torch_compile_cache/5a1e0c2d9b/rank_0_0/backbone"
for var, rel in (("ARTIFACTD_GENERIC_DIR", f"k-{name}.cubin"),
                 ("VLLM_CACHE_ROOT", f"{backbone}/artifact_{name}")):
    root = os.environ.get(var)
    if root:
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if not os.path.exists(path):
            open(path, "w").write("compiled " + name)
print(json.dumps({"checks": {"cell": name}}))
"""

#: A ptxas that answers ``--version`` as CUDA 12.9's does (not the one Triton bundles here).
PTXAS = """#!/bin/sh
echo "ptxas: NVIDIA (R) Ptx optimizing assembler"
echo "Cuda compilation tools, release 12.9, V12.9.41"
"""


def gpus(count: int) -> str:
    """Python run before the CLI: NVML and libcuda answer as an H200 node with ``count`` GPUs."""
    return f"""
import sys, types
sys.path.insert(0, {str(TESTS)!r})
from gpudoubles import RecordedLibcuda, RecordedNvml, load_recording
from artifactd.fingerprint import probe as probing
doc = load_recording("h200x8-nvswitch")
doc["nvml"]["nvmlDeviceGetCount"] = {{"value": {count}}}
doc["nvml"]["devices"] = doc["nvml"]["devices"][:{count}]
nvml = RecordedNvml(doc)
module = types.ModuleType("pynvml")
for name in dir(nvml):
    if name.startswith("nvml"):
        setattr(module, name, getattr(nvml, name))
sys.modules["pynvml"] = module
probing._DRIVER_MARKERS = ("/",)
_real = probing.probe_libcuda
probing.probe_libcuda = lambda lib=None, init=True: _real(RecordedLibcuda(doc), init=init)
"""


def write_matrix(tmp_path: Path, name: str, body: str) -> Path:
    (tmp_path / "cell.py").write_text(CELL)
    path = tmp_path / f"{name}.yaml"
    workload = "".join(f"  {k}: {v!r}\n" for k, v in WORKLOAD.items())
    path.write_text(
        f"schema_version: 1\nname: {name}\ntarget:\n  gpu_arch: sm_90a\nworkload:\n{workload}{body}"
    )
    return path


def fake_ptxas(tmp_path: Path) -> str:
    path = tmp_path / "bin" / "ptxas"
    path.parent.mkdir(exist_ok=True)
    path.write_text(PTXAS)
    path.chmod(0o755)
    return str(path)


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = clean_env({"HOME": str(tmp_path / "home"), "TMPDIR": str(tmp_path)})
    for var in ("CC", "TRITON_PTXAS_PATH", "CUDA_VISIBLE_DEVICES"):
        env.pop(var, None)  # the machine's own: no compiler or ptxas declared
    return {**env, **extra}


def cli(
    *args: str, env: dict[str, str], n_gpus: int | None = None
) -> subprocess.CompletedProcess[str]:
    proc = run_artifactd(
        *args, env=env, timeout=600, prelude=gpus(n_gpus) if n_gpus is not None else ""
    )
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc


def last_json(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return doc


def events(proc: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]


def config(store: Path, tag: str) -> dict[str, Any]:
    """The artifact config a tag of an OCI layout names, read from its files."""
    index = json.loads((store / "index.json").read_text())
    (desc,) = [
        m for m in index["manifests"]
        if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag
    ]  # fmt: skip
    blobs = store / "blobs" / "sha256"
    manifest = json.loads((blobs / desc["digest"].removeprefix("sha256:")).read_text())
    doc: dict[str, Any] = json.loads(
        (blobs / manifest["config"]["digest"].removeprefix("sha256:")).read_text()
    )
    return doc


def restore(
    store: Path, target: Path, env: dict[str, str], *flags: str, n_gpus: int | None = None
) -> dict[str, Any]:
    proc = cli(
        "restore", "--store", f"oci:{store}", "--target", str(target), *POD_FLAGS, *flags,
        "--json", env=env, n_gpus=n_gpus,
    )  # fmt: skip
    assert proc.returncode == 0, (
        f"exit {proc.returncode}: {proc.stdout[-1500:]}{proc.stderr[-1500:]}"
    )
    return last_json(proc)


def verdicts(report: dict[str, Any]) -> dict[str, str]:
    return {f["family"]: f["verdict"] for f in report["plan"]["families"]}


def hits(report: dict[str, Any]) -> set[str]:
    return {name for name, verdict in verdicts(report).items() if verdict == "hit"}


# --------------------------------------------------------------------------
# Defect 1: the matrix's env: is the cells', not the key's
# --------------------------------------------------------------------------


@pytest.mark.slow  # the inner loop's slowest: waits out deadlines or runs many processes
def test_a_matrix_setting_cc_builds_what_verify_and_a_pod_find(tmp_path: Path) -> None:
    """``env: {CC: gcc}``, no family keyed on CC: the published key is the machine's own."""
    matrix = write_matrix(
        tmp_path, "with-cc",
        f'families: [generic]\ngpus: 0\nenv:\n  CC: gcc\n'
        f'command: "{{{{ python }}}} {tmp_path / "cell.py"} one"\n',
    )  # fmt: skip
    env = env_for(tmp_path)
    store = tmp_path / "store"
    built = cli("build", str(matrix), "--store", f"oci:{store}", "--json", env=env)
    assert built.returncode == 0, built.stderr[-2000:]
    published = last_json(built)["harvest"]["fingerprint_hash"]

    gate = cli("verify", str(matrix), "--store", f"oci:{store}", "--json", env=env)
    assert gate.returncode == 0, gate.stdout + gate.stderr[-2000:]
    assert last_json(gate)["fingerprint_hash"] == published

    pod = restore(store, tmp_path / "pod", env, "--require")
    assert pod["plan"]["match"] == "full"
    assert pod["plan"]["fingerprint_hash"] == published
    probe = [e for e in events(built) if e.get("stage") == "probe"]
    assert probe and probe[0]["pod_env"] == {}, "no family keys on CC: pods set nothing"


def test_a_variable_a_family_keys_on_enters_the_key_and_pods_set_it(tmp_path: Path) -> None:
    """``TRITON_PTXAS_PATH`` (triton keys on ``cuda.ptxas``) is in the key; ``CC`` is not."""
    ptxas = fake_ptxas(tmp_path)
    matrix = write_matrix(
        tmp_path, "with-ptxas",
        f"families: [triton, generic]\ngpus: 0\n"
        f"env:\n  TRITON_PTXAS_PATH: {ptxas}\n  CC: gcc\n  HF_HUB_OFFLINE: '1'\n"
        f'command: "{{{{ python }}}} {tmp_path / "cell.py"} one"\n',
    )  # fmt: skip
    env = env_for(tmp_path)
    store = tmp_path / "store"
    built = cli("build", str(matrix), "--store", f"oci:{store}", "--json", env=env)
    assert built.returncode == 0, built.stderr[-2000:]
    published = last_json(built)["harvest"]["fingerprint_hash"]
    assert config(store, f"fp-{published}")["fingerprint"]["cuda"]["ptxas"] == "12.9.41"

    # verify runs in the builder's plain environment and still finds the artifact.
    gate = cli("verify", str(matrix), "--store", f"oci:{store}", "--json", env=env)
    assert gate.returncode == 0, gate.stdout + gate.stderr[-2000:]
    assert last_json(gate)["fingerprint_hash"] == published
    (probe,) = [e for e in events(built) if e.get("stage") == "probe"]
    assert probe["pod_env"] == {"TRITON_PTXAS_PATH": ptxas}

    # A pod that sets what the build reported hits the full tag...
    pod = restore(store, tmp_path / "pod", {**env, **probe["pod_env"]}, "--require")
    assert pod["plan"]["match"] == "full" and pod["plan"]["fingerprint_hash"] == published
    # ...one that does not probes another ptxas: Triton's kernels are not for it.
    other = restore(store, tmp_path / "other", env)
    assert other["plan"]["match"] != "full"
    assert verdicts(other)["triton"] == "miss" and verdicts(other)["generic"] == "hit"


# --------------------------------------------------------------------------
# Defect 2: the GPU count is information; the parallel layout is the key
# --------------------------------------------------------------------------


def test_cells_built_seeing_1_2_and_4_gpus_publish_one_fingerprint_and_merge(
    tmp_path: Path,
) -> None:
    matrix = write_matrix(
        tmp_path, "layouts",
        'families: [generic]\naxes:\n  tp: [1, 2, 4]\ngpus: "{{ tp }}"\n'
        f'command: "{{{{ python }}}} {tmp_path / "cell.py"} tp{{{{ tp }}}}"\n',
    )  # fmt: skip
    env = env_for(tmp_path)
    store = tmp_path / "store"
    run = ["--run-id", "r1", "--store", f"oci:{store}"]
    published = set()
    for index, count in enumerate((1, 2, 4)):  # each worker sees its cell's GPUs
        done = cli(
            "build", str(matrix), "--cell", str(index), *run, "--json", env=env, n_gpus=count
        )
        assert done.returncode == 0, done.stderr[-2000:]
        published.add(last_json(done)["harvest"]["fingerprint_hash"])
    assert len(published) == 1, published

    merged = cli("merge", str(matrix), *run, "--json", env=env)
    assert merged.returncode == 0, merged.stderr[-2000:]
    assert last_json(merged)["fingerprint_hash"] in published
    # A pod seeing one GPU restores the merged artifact whole.
    pod = restore(store, tmp_path / "pod", env, "--require", n_gpus=1)
    assert pod["plan"]["match"] == "full"
    for index, count in enumerate((1, 2, 4)):
        fp = config(store, f"run-r1-cell-{index}")["fingerprint"]
        assert fp["gpu"]["name"] == "NVIDIA H200" and fp["gpu"]["source"] == "nvml"
        assert fp["info"]["gpu_count"] == count, "the count is kept, as information"
        assert "count" not in fp["gpu"]


def test_a_tp1_pod_seeing_one_gpu_hits_an_8_gpu_builds_vllm_scope(tmp_path: Path) -> None:
    """The layout (workload tp=1) is the vLLM key; the build node's 8 GPUs are not."""
    matrix = write_matrix(
        tmp_path, "vllm-tp1",
        "families: [vllm]\ngpus: 1\n"
        f'command: "{{{{ python }}}} {tmp_path / "cell.py"} tp1"\n',
    )  # fmt: skip
    matrix.write_text(matrix.read_text().replace("workload:\n", "workload:\n  tp: '1'\n"))
    env = env_for(tmp_path)
    store = tmp_path / "store"
    built = cli("build", str(matrix), "--store", f"oci:{store}", "--json", env=env, n_gpus=8)
    assert built.returncode == 0, built.stderr[-2000:]
    published = last_json(built)["harvest"]["fingerprint_hash"]

    # The pod runs another image build (its digest differs: no full tag), tp=1, one GPU.
    pod = restore(
        store, tmp_path / "pod", env, "--workload", "tp=1",
        "--image-digest", "sha256:" + "ab" * 32, "--require", n_gpus=1,
    )  # fmt: skip
    assert pod["plan"]["fingerprint_hash"] != published, "resolved by the vllm scope tag"
    assert hits(pod) == {"vllm"}
    restored = tmp_path / "pod" / "vllm" / "torch_compile_cache" / "5a1e0c2d9b" / "rank_0_0"
    assert (restored / "backbone" / "artifact_tp1").read_text() == "compiled tp1"
    # Another layout is another key: a tp=2 pod does not take tp=1's compile cache.
    tp2 = restore(
        store, tmp_path / "tp2", env, "--workload", "tp=2", "--image-digest",
        "sha256:" + "ab" * 32, n_gpus=2,
    )  # fmt: skip
    assert verdicts(tp2)["vllm"] == "miss"
    assert config(store, f"fp-{published}")["fingerprint"]["info"]["gpu_count"] == 8


def test_a_layout_in_both_workload_and_axes_is_refused_before_any_cell_runs(
    tmp_path: Path,
) -> None:
    """``workload: {tp: 8}`` with ``axes: {tp: [1, 2]}``: cells of tp 1 and 2 keyed as tp=8."""
    matrix = write_matrix(
        tmp_path, "two-layouts",
        "families: [vllm]\naxes:\n  tp: [1, 2]\ngpus: 0\n"
        f'command: "{{{{ python }}}} {tmp_path / "cell.py"} tp{{{{ tp }}}}"\n',
    )  # fmt: skip
    matrix.write_text(matrix.read_text().replace("workload:\n", "workload:\n  tp: '8'\n"))
    env = env_for(tmp_path)
    store = tmp_path / "store"
    for argv in (
        ["build", str(matrix), "--store", f"oci:{store}"],
        ["matrix", "cells", str(matrix)],
    ):
        proc = cli(*argv, env=env)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert "tp are both in workload and in axes" in proc.stderr
    assert not list(tmp_path.glob("artifactd-*")), "no cell ran: no roots were made"
    assert not (store / "index.json").exists(), "nothing published"


# --------------------------------------------------------------------------
# Agreement: every caller, one input, one hash; and one owner in the source
# --------------------------------------------------------------------------


def published_in_process(matrix: Path, env: dict[str, str], n_gpus: int) -> str:
    code = (
        gpus(n_gpus)
        + "from pathlib import Path\nfrom artifactd.build.matrix import load_matrix\n"
        + "from artifactd.build.published import published_fingerprint\n"
        + f"print(published_fingerprint(load_matrix(Path({str(matrix)!r}))).hash)\n"
    )
    proc = subprocess.run(
        [PYTHON, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


@pytest.mark.slow  # the inner loop's slowest: waits out deadlines or runs many processes
def test_build_merge_verify_and_the_pod_agree_on_one_hash(tmp_path: Path) -> None:
    """One matrix (env: with a keyed and unkeyed variable, cells on 1 and 2 GPUs), every caller."""
    ptxas = fake_ptxas(tmp_path)
    matrix = write_matrix(
        tmp_path, "agree",
        f"families: [triton, generic]\naxes:\n  part: [a, b]\ngpus: 1\n"
        f"env:\n  TRITON_PTXAS_PATH: {ptxas}\n  CC: gcc\n"
        f'command: "{{{{ python }}}} {tmp_path / "cell.py"} {{{{ part }}}}"\n',
    )  # fmt: skip
    env = env_for(tmp_path)
    pod_env = {**env, "TRITON_PTXAS_PATH": ptxas}
    store, whole = tmp_path / "store", tmp_path / "whole"
    seen: dict[str, str] = {}

    one = cli("build", str(matrix), "--store", f"oci:{whole}", "--json", env=env, n_gpus=8)
    assert one.returncode == 0, one.stderr[-2000:]
    seen["build"] = last_json(one)["harvest"]["fingerprint_hash"]
    for index, count in ((0, 1), (1, 2)):
        cell = cli(
            "build", str(matrix), "--cell", str(index), "--run-id", "r2",
            "--store", f"oci:{store}", "--json", env=env, n_gpus=count,
        )  # fmt: skip
        assert cell.returncode == 0, cell.stderr[-2000:]
        seen[f"build --cell {index}"] = last_json(cell)["harvest"]["fingerprint_hash"]
    merged = cli(
        "merge", str(matrix), "--run-id", "r2", "--store", f"oci:{store}", "--json", env=env
    )
    assert merged.returncode == 0, merged.stderr[-2000:]
    seen["merge"] = last_json(merged)["fingerprint_hash"]
    gate = cli("verify", str(matrix), "--store", f"oci:{store}", "--json", env=env, n_gpus=4)
    assert gate.returncode == 0, gate.stdout + gate.stderr[-2000:]
    seen["verify"] = last_json(gate)["fingerprint_hash"]
    seen["published_fingerprint"] = published_in_process(matrix, env, 2)
    fp = cli("fingerprint", "--hash", *POD_FLAGS, env=pod_env, n_gpus=1)
    assert fp.returncode == 0, fp.stderr
    seen["pod fingerprint"] = fp.stdout.strip()
    pod = restore(store, tmp_path / "pod", pod_env, "--require", n_gpus=1)
    seen["pod restore"] = pod["plan"]["fingerprint_hash"]
    assert pod["plan"]["match"] == "full"
    assert len(set(seen.values())) == 1, seen


def _calls(tree: ast.AST, name: str) -> list[int]:
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (getattr(node.func, "id", None) == name or getattr(node.func, "attr", None) == name)
    ]


def test_the_published_fingerprint_has_one_owner() -> None:
    """No command probes a matrix's fingerprint, or builds a pod's flags for it, on its own.

    ``artifactd.build.published`` is the one place that turns a matrix (its target,
    image, workload, ``env:``) into a probe; the commands that publish or look
    up an artifact for a matrix call it. A second copy (a ``probe(...)`` in
    build, verify or merge; ``matrix.target.gpu_arch`` read elsewhere) fails here.
    """
    package = Path(artifactd.__file__).resolve().parent  # the code under test
    owner = package / "build" / "published.py"
    assert owner.is_file(), "no artifactd.build.published: the rule has no owner"
    for path in sorted(package.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if path == owner:
            continue
        rel = path.relative_to(package.parent)
        assert "target.gpu_arch" not in text, f"{rel} reads the matrix's target itself"
        tree = ast.parse(text)
        if "load_matrix" in text:  # a command working from a matrix
            for name in ("probe", "probe_raw", "probe_request", "start_request", "PendingProbe"):
                assert not _calls(tree, name), f"{rel} probes a matrix's fingerprint itself"
    for command, module in (
        ("build", "run"),
        ("verify", "gate"),
        ("merge", "merge"),
        ("demo", "demo"),
    ):
        text = (package / "build" / f"{module}.py").read_text(encoding="utf-8")
        assert "artifactd.build.published import" in text, f"{command} does not call the owner"
