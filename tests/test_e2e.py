"""End to end on real compilers: torch.compile (Inductor CPU), Triton AOT sm_90a, nvcc.

Every restored run happens in a fresh process whose only caches are the
restored ones (new temp dir, build roots deleted), and the evidence of a hit
comes from the compilers themselves: Inductor's fxgraph cache counters,
Triton's compilation listener (``cache_hit``), the note ptxas writes into each
cubin (nvcc keeps no cache, so a cubin that is merely there is no hit), and
the precompiled header's mtime.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import DEMO_MATRIX, PYTHON, WARMUP, clean_env
from conftest import run_artifactd_json as artifactd
from producer_checks import restored_at

from artifactd.restore.envfile import parse_env_file

pytestmark = pytest.mark.slow


def warmup(parts: str, env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run(
        [PYTHON, str(WARMUP), "--parts", parts],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return doc


@pytest.mark.torch
def test_triton_cubins_restore_to_another_root_and_hit(tmp_path: Path) -> None:
    build = tmp_path / "build-cache"
    cold = warmup("triton", clean_env({"TRITON_CACHE_DIR": str(build)}))
    assert cold["triton"]["compiled"] == 3 and cold["triton"]["cubins"] == 3
    assert list(build.glob("*/*.cubin")), "Triton wrote no sm_90a cubin"

    store = f"oci:{tmp_path / 'store'}"
    artifactd(
        "harvest",
        "--store",
        store,
        "--family",
        "triton",
        "--gpu-arch",
        "sm_90a",
        env=clean_env({"TRITON_CACHE_DIR": str(build)}),
    )
    # Control: a plain copy of the cache, original gone, recompiles everything.
    shutil.copytree(build, tmp_path / "plain-copy")
    shutil.rmtree(build)
    control = warmup("triton", clean_env({"TRITON_CACHE_DIR": str(tmp_path / "plain-copy")}))
    assert control["triton"]["compiled"] == 3

    target = tmp_path / "pod-cache"
    report = artifactd("restore", "--store", store, "--target", str(target), "--gpu-arch", "sm_90a")
    assert report["cache_hit"] and report["restored"] == ["triton"]
    env = clean_env(parse_env_file(target / "artifactd.env"))
    assert env["TRITON_CACHE_DIR"] == str(target / "triton")
    warm = warmup("triton", env)
    assert warm["triton"] == {**warm["triton"], "compiled": 0, "hits": 3}


@pytest.mark.torch
def test_build_restore_warm_start_hits_every_family(tmp_path: Path) -> None:
    """The README's path: build the CPU demo matrix, restore fresh, warm start hits."""
    store = f"oci:{tmp_path / 'store'}"
    built = artifactd("build", str(DEMO_MATRIX), "--store", store)
    cell = built["cells"][0]["report"]
    assert cell["inductor"]["compiled"] == 3 and cell["inductor"]["hits"] == 0
    assert cell["triton"]["compiled"] == 3 and cell["nvcc"]["compiled"] == 1
    families = {f["family"]: f for f in built["harvest"]["families"]}
    assert set(families) == {"inductor", "triton", "generic"}
    # The precompiled header is harvested, outside the Inductor cache dir.
    assert "pch" in families["inductor"]["found"]
    assert not Path(built["roots"]).exists(), "build roots must be cleaned up"

    tag = "fp-" + built["harvest"]["fingerprint_hash"]
    skopeo = subprocess.run(
        ["skopeo", "inspect", f"{store}:{tag}"], capture_output=True, text=True, check=False
    )
    assert skopeo.returncode == 0, skopeo.stderr
    assert len(json.loads(skopeo.stdout)["Layers"]) == 3

    target = tmp_path / "pod-cache"
    args = [
        "restore",
        "--store",
        store,
        "--target",
        str(target),
        "--gpu-arch",
        "sm_90a",
        "--workload",
        "model=artifactd/cpu-demo,dtype=float32",
    ]
    report = artifactd(*args)
    assert report["match"] == "full"
    assert sorted(report["restored"]) == ["generic", "inductor", "triton"]
    pch = list((target / "tmp").glob("torchinductor_*/precompiled_headers/*.gch"))
    assert len(pch) == 1
    pch_mtime = pch[0].stat().st_mtime_ns

    env = clean_env(parse_env_file(target / "artifactd.env"))
    assert env["TMPDIR"] == str(target / "tmp")
    warm = warmup("inductor,triton,nvcc", env)
    assert warm["inductor"]["hits"] == 3 and warm["inductor"]["compiled"] == 0
    assert warm["triton"]["hits"] == 3 and warm["triton"]["compiled"] == 0
    assert warm["nvcc"]["hits"] == 1 and warm["nvcc"]["compiled"] == 0
    assert pch[0].stat().st_mtime_ns == pch_mtime, "the precompiled header was rebuilt"
    # No CPU kernel was recompiled into the restored cache: nothing written since
    # the restore finished (the order files are extracted in is not an order).
    done = restored_at(target)
    assert not [p for p in (target / "inductor").rglob("*.so") if p.stat().st_mtime > done]

    again = artifactd(*args)
    assert again["noop"] is True


@pytest.mark.torch
def test_demo_command_reports_the_time_saved(tmp_path: Path) -> None:
    result = artifactd(
        "demo",
        "--matrix",
        str(DEMO_MATRIX),
        "--store",
        f"oci:{tmp_path / 'store'}",
        "--workdir",
        str(tmp_path / "demo"),
        timeout=900,
    )
    assert result["cold_compiled"] == 7
    assert result["restored_compiled"] == 0
    assert 0 < result["restored_seconds"] < result["cold_seconds"]
    # What it restored is removed (it was 150 MB a run); the store stays.
    assert result["kept"] is False and not Path(result["target"]).exists()
    assert not (tmp_path / "demo" / "restored-logs").exists()
    # The command it prints for this machine finds the artifact, typed as printed.
    command = result["restore_command"]
    assert "--gpu-arch sm_90a" in command and "--workload model=artifactd/cpu-demo" in command
    fresh = tmp_path / "by-hand"
    typed = command.replace("artifactd restore", f"{shlex.quote(PYTHON)} -m artifactd restore", 1)
    proc = subprocess.run(
        ["bash", "-c", typed.replace(" DIR", f" {shlex.quote(str(fresh))}") + " --json"],
        capture_output=True,
        text=True,
        env=clean_env(),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["match"] == "full"
    assert sorted(report["restored"]) == ["generic", "inductor", "triton"]


@pytest.mark.torch
def test_megacache_restores_graphs_into_an_empty_inductor_dir(tmp_path: Path) -> None:
    """Mega-Cache bytes are path-independent: graphs hit in a fresh, empty cache dir."""
    build_env = clean_env(
        {
            "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "build" / "inductor"),
            "TMPDIR": str(tmp_path / "build" / "tmp"),
            "ARTIFACTD_MEGACACHE_DIR": str(tmp_path / "build" / "mega"),
        }
    )
    (tmp_path / "build" / "tmp").mkdir(parents=True)
    proc = subprocess.run(
        [PYTHON, str(WARMUP), "--parts", "inductor", "--save-megacache"],
        capture_output=True,
        text=True,
        env=build_env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    cold = json.loads(proc.stdout.strip().splitlines()[-1])["inductor"]
    assert cold["compiled"] == 3 and cold["megacache_saved"]

    store = f"oci:{tmp_path / 'store'}"
    pushed = artifactd("harvest", "--store", store, "--family", "inductor", env=build_env)
    assert pushed["families"][0]["found"].keys() >= {"cache", "pch", "megacache"}
    target = tmp_path / "pod"
    report = artifactd("restore", "--store", store, "--target", str(target), "--family", "inductor")
    env = clean_env(parse_env_file(target / "artifactd.env"))
    assert env["ARTIFACTD_MEGACACHE_DIR"] == str(target / "inductor-megacache")
    assert report["restored"] == ["inductor"]
    # Only the Mega-Cache: an empty Inductor dir somewhere else entirely.
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "elsewhere" / "empty")
    proc = subprocess.run(
        [PYTHON, str(WARMUP), "--parts", "inductor", "--load-megacache"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    warm = json.loads(proc.stdout.strip().splitlines()[-1])["inductor"]
    assert warm["megacache_loaded"] == 1
    assert warm["hits"] == 3 and warm["compiled"] == 0


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc on PATH")
def test_nvcc_hit_is_ptxas_record_not_a_file_being_there(tmp_path: Path) -> None:
    """A cubin counts as a hit only if ptxas's note in it says it built axpy for sm_90a."""
    env = clean_env({"ARTIFACTD_GENERIC_DIR": str(tmp_path / "gen")})

    def nvcc() -> tuple[int, int]:
        part = warmup("nvcc", env)["nvcc"]
        return part["compiled"], part["hits"]

    assert nvcc() == (1, 0)
    assert nvcc() == (0, 1)
    [cubin] = (tmp_path / "gen").glob("axpy-*.sm_90a.cubin")
    good = cubin.read_bytes()

    cubin.write_bytes(good[: len(good) // 2])  # truncated: no readable note
    assert nvcc() == (1, 0)
    assert cubin.read_bytes() == good

    # A real cubin of the same kernel for another arch, at the sm_90a name.
    src = WARMUP.parent / "axpy.cu"
    subprocess.run(["nvcc", "-cubin", "-arch=sm_80", "-o", str(cubin), str(src)], check=True)
    assert nvcc() == (1, 0)
    assert cubin.read_bytes() == good
