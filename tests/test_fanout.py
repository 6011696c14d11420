"""The builder for fleets, on the CPU: isolated cells, packing, fan-out, merge and the gate.

Cells here are real processes. The packing tests use small Python cells that
record the ``CUDA_VISIBLE_DEVICES`` they were given and when they ran (a
declared ``--gpus`` list stands in for the node's GPUs: this machine has
none, and the scheduler only hands out their names). The fan-out, merge and
verify tests run the CPU demo's real compilers (torch.compile, Triton AOT,
nvcc), one cell per compiler, into a local OCI layout store.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import PYTHON, REPO, clean_env, run_artifactd

from artifactd.build.matrix import Cell, expand, load_matrix
from artifactd.build.schedule import run_packed

CELLS_MATRIX = REPO / "warmup_matrices" / "cpu-demo-cells.yaml"
WARMUP = REPO / "warmup_matrices" / "cpu-demo" / "warmup.py"

#: A cell that writes one generic-family file (so there is something to harvest)
#: and records its devices and run time into a directory the test reads.
RECORDER = """\
import json, os, sys, time
out = sys.argv[1]
start = time.time()
time.sleep(float(sys.argv[3]))
body = sys.argv[4] if len(sys.argv) > 4 else sys.argv[2]
gen = os.environ["ARTIFACTD_GENERIC_DIR"]
os.makedirs(gen, exist_ok=True)
name = sys.argv[5] if len(sys.argv) > 5 else f"k-{sys.argv[2]}.cubin"
open(os.path.join(gen, name), "w").write(body)
record = {"cell": sys.argv[2], "devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
          "start": start, "end": time.time(), "generic": gen}
open(os.path.join(out, f"{sys.argv[2]}.json"), "w").write(json.dumps(record))
print(json.dumps({"checks": {"cell": sys.argv[2]}}))
"""


def _recorder_matrix(tmp_path: Path, axes: str, gpus: str, args: str) -> Path:
    (tmp_path / "rec").mkdir(exist_ok=True)
    (tmp_path / "recorder.py").write_text(RECORDER)
    path = tmp_path / "m.yaml"
    path.write_text(
        "name: packing\nfamilies: [generic]\n"
        f"axes:\n{axes}"
        f"gpus: {gpus!r}\n"
        f'command: "{{{{ python }}}} {tmp_path / "recorder.py"} {tmp_path / "rec"} {args}"\n'
    )
    return path


def _records(tmp_path: Path) -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in (tmp_path / "rec").glob("*.json")}


def _env(tmp_path: Path) -> dict[str, str]:
    return clean_env({"HOME": str(tmp_path / "home"), "TMPDIR": str(tmp_path)})


def test_cells_pack_onto_the_declared_gpus_in_index_order(tmp_path: Path) -> None:
    """Cells needing 2, 1, 1, 2 GPUs on 3: disjoint devices while overlapping, started in order."""
    matrix = _recorder_matrix(tmp_path, "  tp: [2, 1, 1, 2]\n", "{{ tp }}", "{{ cell_id }} 1.0")
    proc = run_artifactd(
        "build", str(matrix), "--store", f"oci:{tmp_path / 'store'}", "--gpus", "0,1,2",
        "--json", env=_env(tmp_path), timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    recs = _records(tmp_path)
    assert {k: len(v["devices"].split(",")) for k, v in recs.items()} == {
        "0": 2, "1": 1, "2": 1, "3": 2,
    }  # fmt: skip
    # Each got the first free devices (the start order is in the events, below).
    assert recs["0"]["devices"] == "0,1" and recs["1"]["devices"] == "2"
    # Cells that overlapped in time had disjoint devices.
    for a in recs.values():
        for b in recs.values():
            if a is not b and a["start"] < b["end"] and b["start"] < a["end"]:
                assert not set(a["devices"].split(",")) & set(b["devices"].split(","))
    # 0 and 1 fit together (3 GPUs); 2 waited for a device.
    assert recs["1"]["start"] < recs["0"]["end"]
    assert recs["2"]["start"] >= min(recs["0"]["end"], recs["1"]["end"]) - 0.05
    # Each cell had roots of its own.
    assert len({r["generic"] for r in recs.values()}) == 4
    events = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    kinds = [(e["event"], e["cell"]) for e in events if e.get("stage") == "cell"]
    assert [c for e, c in kinds if e == "start"] == [
        "0-2", "1-1", "2-1", "3-2",
    ]  # fmt: skip
    doc = json.loads(proc.stdout)
    # Each cell's log outlives its (deleted) roots in the report: its last lines.
    assert all('"checks"' in c["log_tail"][-1] for c in doc["cells"])
    assert {c["id"]: c["checks"] for c in doc["cells"]} == {
        "0-2": {"cell": "0"}, "1-1": {"cell": "1"}, "2-1": {"cell": "2"}, "3-2": {"cell": "3"},
    }  # fmt: skip


def test_a_cell_that_needs_more_gpus_than_the_node_has_fails_before_any_runs(
    tmp_path: Path,
) -> None:
    matrix = _recorder_matrix(tmp_path, "  tp: [1, 4]\n", "{{ tp }}", "{{ cell_id }} 0")
    proc = run_artifactd(
        "build", str(matrix), "--store", f"oci:{tmp_path / 'store'}", "--gpus", "0,1",
        env=_env(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 7, proc.stderr
    assert "needs 4 GPU(s); this node has 2" in proc.stderr
    assert _records(tmp_path) == {}  # nothing ran
    assert "Traceback" not in proc.stderr


def test_run_packed_bounds_cpu_cells_by_jobs(tmp_path: Path) -> None:
    cells = expand(load_matrix(CELLS_MATRIX), CELLS_MATRIX)
    running, peak = 0, 0
    lock = threading.Lock()

    def run(cell: Cell, taken: tuple[str, ...]) -> str:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.2)
        with lock:
            running -= 1
        return cell.id

    assert run_packed(cells, [], run, jobs=2) == [c.id for c in cells]
    assert peak == 2
    peak = 0
    run_packed(cells, [], run, jobs=1)
    assert peak == 1


def test_two_cells_writing_one_path_differently_fail_naming_both(tmp_path: Path) -> None:
    matrix = _recorder_matrix(
        tmp_path, "  body: [one, two]\n", "0", "{{ cell_id }} 0 {{ body }} same.cubin"
    )
    proc = run_artifactd(
        "build", str(matrix), "--store", f"oci:{tmp_path / 'store'}", env=_env(tmp_path)
    )
    assert proc.returncode == 7, proc.stderr
    assert "generic/cache/same.cubin" in proc.stderr
    assert "'0-one'" in proc.stderr and "'1-two'" in proc.stderr
    assert (
        not (tmp_path / "store").exists()
        or "fp-" not in run_artifactd("ls", f"oci:{tmp_path / 'store'}", env=_env(tmp_path)).stdout
    )


def test_identical_bytes_from_two_cells_are_kept_once(tmp_path: Path) -> None:
    matrix = _recorder_matrix(
        tmp_path, "  body: [one, one2]\n", "0", "{{ cell_id }} 0 same same.cubin"
    )
    proc = run_artifactd(
        "build", str(matrix), "--store", f"oci:{tmp_path / 'store'}", "--json",
        env=_env(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (fam,) = json.loads(proc.stdout)["harvest"]["families"]
    assert fam["family"] == "generic" and fam["files"] == 1


def test_cell_and_run_id_go_together(tmp_path: Path) -> None:
    store = f"oci:{tmp_path / 'store'}"
    alone = run_artifactd("build", str(CELLS_MATRIX), "--cell", "0", "--store", store)
    assert alone.returncode == 2 and "--run-id" in alone.stderr
    out_of_range = run_artifactd(
        "build", str(CELLS_MATRIX), "--cell", "9", "--run-id", "r", "--store", store
    )
    assert out_of_range.returncode == 2 and "3 cell(s)" in out_of_range.stderr
    bad_id = run_artifactd(
        "build", str(CELLS_MATRIX), "--cell", "0", "--run-id", "a/b", "--store", store
    )
    assert bad_id.returncode == 2


def test_matrix_cells_json_is_a_github_matrix() -> None:
    proc = run_artifactd("matrix", "cells", str(CELLS_MATRIX), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["count"] == 3
    assert doc["include"] == [
        {"index": 0, "id": "0-inductor", "gpus": 0, "parts": "inductor"},
        {"index": 1, "id": "1-triton", "gpus": 0, "parts": "triton"},
        {"index": 2, "id": "2-nvcc", "gpus": 0, "parts": "nvcc"},
    ]


# --------------------------------------------------------------------------
# Fan-out, merge, verify: the CPU demo's real compilers
# --------------------------------------------------------------------------


def _warm(env: dict[str, str], *args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [PYTHON, str(WARMUP), *args], capture_output=True, text=True, env=env, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return doc


@pytest.mark.torch
@pytest.mark.slow
def test_fan_out_merge_verify_and_promote(tmp_path: Path) -> None:
    env = _env(tmp_path)
    store = f"oci:{tmp_path / 'store'}"
    run = ["--run-id", "ci-42", "--store", store]
    # Cells 0 and 2 only: the merge must refuse a run with a cell missing.
    for index in ("0", "2"):
        done = run_artifactd(
            "build", str(CELLS_MATRIX), "--cell", index, *run, env=env, timeout=900
        )
        assert done.returncode == 0, done.stderr[-2000:]
    missing = run_artifactd("merge", str(CELLS_MATRIX), *run, env=env)
    assert missing.returncode == 7 and "cell(s) 1 of 3" in missing.stderr
    # The last cell comes from a "worker" told its index by Kubernetes' variable.
    k8s = run_artifactd(
        "build", str(CELLS_MATRIX), *run, env={**env, "JOB_COMPLETION_INDEX": "1"}, timeout=900
    )
    assert k8s.returncode == 0, k8s.stderr[-2000:]
    tags = run_artifactd("ls", store, env=env).stdout.split()
    assert sorted(tags) == ["run-ci-42-cell-0", "run-ci-42-cell-1", "run-ci-42-cell-2"]

    merged = run_artifactd("merge", str(CELLS_MATRIX), *run, "--json", env=env)
    assert merged.returncode == 0, merged.stderr
    doc = json.loads(merged.stdout)
    # Each family came from one cell: reused in the store, nothing downloaded.
    assert {f["family"]: f["how"] for f in doc["families"]} == {
        "triton": "reused", "inductor": "reused", "generic": "reused",
    }  # fmt: skip
    assert all(f["bytes_downloaded"] == 0 for f in doc["families"])
    layers = sum(1 for _ in (tmp_path / "store" / "blobs" / "sha256").iterdir())
    again = json.loads(run_artifactd("merge", str(CELLS_MATRIX), *run, "--json", env=env).stdout)
    assert again["digest"] == doc["digest"] and again["bytes_uploaded"] == 0
    assert sum(1 for _ in (tmp_path / "store" / "blobs" / "sha256").iterdir()) == layers

    # The merged artifact restores like any build's, and the warm-up then hits.
    target = tmp_path / "pod"
    restored = run_artifactd(
        "restore", "--store", store, "--target", str(target), "--gpu-arch", "sm_90a",
        "--workload", "model=artifactd/cpu-demo,dtype=float32", "--require", "--json", env=env,
    )  # fmt: skip
    assert restored.returncode == 0, restored.stderr
    assert json.loads(restored.stdout)["match"] == "full"

    # The gate: every cell re-run on restored caches, checks equal, nothing compiled.
    gate = run_artifactd(
        "verify", str(CELLS_MATRIX), "--store", store, "--promote", "verified", "--json",
        env=env, timeout=900,
    )  # fmt: skip
    assert gate.returncode == 0, gate.stderr[-2000:]
    verdict = json.loads(gate.stdout)
    assert verdict["passed"] and verdict["promoted"] == "verified"
    by_cell = {c["id"]: c for c in verdict["cells"]}
    assert [c["name"] for c in by_cell["0-inductor"]["checks"]] == ["inductor_sum"]
    assert all(n == 0 for c in verdict["cells"] for n in c["compiled"].values())
    assert "verified" in run_artifactd("ls", store, env=env).stdout.split()

    # A check that diverges (the same cells, inputs perturbed): exit 12, no promotion.
    perturbed = tmp_path / "perturbed.yaml"
    text = CELLS_MATRIX.read_text().replace("{{ matrix_dir }}", str(CELLS_MATRIX.parent))
    perturbed.write_text(text + 'env:\n  CPU_DEMO_PERTURB: "0.25"\n')
    bad = run_artifactd(
        "verify", str(perturbed), "--store", store, "--promote", "bad", env=env, timeout=900
    )
    assert bad.returncode == 12, bad.stderr[-2000:]
    assert "check inductor_sum: expected" in bad.stdout
    assert "bad" not in run_artifactd("ls", store, env=env).stdout.split()


@pytest.mark.torch
@pytest.mark.slow
def test_cells_sharing_a_family_are_merged_and_repacked(tmp_path: Path) -> None:
    """Two Inductor cells (two batch sizes): the merge downloads both layers and packs one."""
    matrix = tmp_path / "batches.yaml"
    text = CELLS_MATRIX.read_text().replace("{{ matrix_dir }}", str(CELLS_MATRIX.parent))
    text = text.replace("name: cpu-demo-cells", "name: batches")
    text = text.replace("  parts: [inductor, triton, nvcc]", "  batch: [8, 16]")
    text = text.replace("--parts {{ parts }}", "--parts inductor --batch {{ batch }}")
    matrix.write_text(text)
    env = _env(tmp_path)
    store = f"oci:{tmp_path / 'store'}"
    for index in ("0", "1"):
        done = run_artifactd(
            "build", str(matrix), "--cell", index, "--run-id", "r", "--store", store,
            env=env, timeout=900,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
    merged = run_artifactd(
        "merge", str(matrix), "--run-id", "r", "--store", store, "--json", env=env
    )
    assert merged.returncode == 0, merged.stderr
    (fam,) = json.loads(merged.stdout)["families"]
    assert fam["family"] == "inductor" and fam["how"] == "repacked"
    assert fam["cells"] == ["0-8", "1-16"] and fam["bytes_downloaded"] > 0
    gate = run_artifactd("verify", str(matrix), "--store", store, env=env, timeout=900)
    assert gate.returncode == 0, gate.stdout + gate.stderr[-2000:]
    assert "PASS" in gate.stdout
    shutil.rmtree(tmp_path / "store")
