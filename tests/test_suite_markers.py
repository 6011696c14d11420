"""The inner loop (``-m "not slow"``) leaves out engine, image-build and kill-loop tests.

``podman``, ``image`` and ``killloop`` say what a test needs or does, and
each implies ``slow`` (tests/conftest.py): collected with ``-m "not slow"``,
none of them may be selected, and the default run still holds them all.
``torch`` marks every test that runs torch or Triton (the CPU demo's warm-up,
the tiny engine): ``-m "not torch"`` leaves them all out. These checks collect
in subprocesses, so they are slow themselves: the default run
(``scripts/test.sh``) guards the inner loop.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
#: Modules that hold engine, image-build and kill-loop tests.
EXPENSIVE = ("test_image_build.py", "test_deploy_k8s.py", "test_restore_crash.py")
#: What the inner loop must never start, by test (node id suffix).
MUST_BE_SLOW = {
    "test_image_build.py::test_init_image_holds_artifactd_alone_and_runs_as_non_root",
    "test_image_build.py::test_runtime_image_bakes_the_artifact_onto_the_base_and_pushes",
    "test_image_build.py::test_a_base_tag_the_registry_lacks_exits_4",
    "test_deploy_k8s.py::test_the_pods_containers_restore_and_start_the_engine_on_podman",
    "test_restore_crash.py::test_kill9_at_random_points",
}


def _collected(marks: str, files: Sequence[str] = EXPENSIVE) -> set[str]:
    """Node ids (file::name, parameters dropped) that ``-m MARKS`` selects in ``files``."""
    argv = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    proc = subprocess.run(
        [*argv, "-m", marks, *(str(TESTS / m) for m in files)],
        capture_output=True,
        text=True,
        cwd=TESTS.parent,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return {line.split("/")[-1].split("[")[0] for line in proc.stdout.splitlines() if "::" in line}


@pytest.mark.slow
def test_not_slow_leaves_out_engine_image_and_kill_loop_tests() -> None:
    inner = _collected("not slow")
    assert not inner & MUST_BE_SLOW, sorted(inner & MUST_BE_SLOW)
    # Cheap tests of the same modules stay in the inner loop.
    assert "test_image_build.py::test_a_dead_docker_host_is_one_clear_line" in inner
    assert "test_restore_crash.py::test_recover_alone_repairs_and_is_idempotent" in inner
    # Each marker selects its tests alone, and every one of them is slow.
    marked = _collected("podman or image or killloop")
    assert marked >= MUST_BE_SLOW, sorted(MUST_BE_SLOW - marked)
    assert not marked & inner


#: Tests that run torch or Triton (the CPU demo's warm-up, the tiny engine), by
#: node id suffix: ``-m "not torch"`` must leave every one of them out.
MUST_BE_TORCH = {
    "test_e2e.py::test_triton_cubins_restore_to_another_root_and_hit",
    "test_e2e.py::test_build_restore_warm_start_hits_every_family",
    "test_e2e.py::test_demo_command_reports_the_time_saved",
    "test_e2e.py::test_megacache_restores_graphs_into_an_empty_inductor_dir",
    "test_fanout.py::test_fan_out_merge_verify_and_promote",
    "test_fanout.py::test_cells_sharing_a_family_are_merged_and_repacked",
    "test_status.py::test_restored_caches_are_used_and_status_says_so",
    "test_status.py::test_a_changed_shape_and_arch_compile_anyway",
    "test_status.py::test_a_model_change_still_restores_kernels_and_they_are_used",
    "test_status.py::test_a_restore_that_misses_is_not_restored_and_never_fails_a_probe",
    "test_readiness.py::test_tiny_engine_goes_serviceable_then_prewarmed_and_a_new_shape_keeps_it_serviceable",
    "test_shapes.py::test_tiny_engine_metrics_give_buckets_that_cover_the_lengths_sent",
    "test_deltas.py::test_the_loop_with_the_tiny_engine",
    "test_image_build.py::test_init_container_restores_the_cpu_demo_and_the_warm_up_compiles_nothing",
    "test_gpu_acceptance.py::test_dry_run_runs_what_needs_no_gpu_and_says_why_it_skipped_the_rest",
    "test_serve.py::test_a_serve_matrix_builds_restores_and_passes_the_gate",
}


@pytest.mark.slow
def test_not_torch_leaves_out_every_test_that_runs_torch() -> None:
    """``-m "not torch"`` skips the demo's warm-up and the tiny engine; cheap tests stay."""
    files = sorted({name.split("::")[0] for name in MUST_BE_TORCH})
    without = _collected("not torch", files)
    assert not without & MUST_BE_TORCH, sorted(without & MUST_BE_TORCH)
    assert _collected("torch", files) >= MUST_BE_TORCH
    # The same modules' tests that need no torch stay in.
    assert "test_e2e.py::test_nvcc_hit_is_ptxas_record_not_a_file_being_there" in without
    assert "test_status.py::test_the_human_report_says_when_the_target_was_restored" in without


#: Runs pytest with torch made unimportable (``find_spec`` answers None), as in the
#: fast suite's virtualenvs (scripts/noxfile.py), which do not install it.
WITHOUT_TORCH = "import sys; sys.modules['torch'] = None; import pytest; sys.exit(pytest.main())"


def test_tests_that_run_torch_skip_where_it_is_not_installed() -> None:
    """The tiny engine imports torch: its tests skip with the reason, they do not fail."""
    runs_torch = "not_ready_in_time or ignoring_sigterm or a_failed_request_fails_the_cell"
    argv = [sys.executable, "-c", WITHOUT_TORCH, "-q", "-rs", "-n", "0", "-p", "no:cacheprovider"]
    proc = subprocess.run(
        [*argv, "-k", runs_torch, str(TESTS / "test_serve.py")],
        capture_output=True,
        text=True,
        cwd=TESTS.parent,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "5 skipped" in proc.stdout, proc.stdout[-2000:]
    assert "needs torch (the warmup extra): not installed" in proc.stdout
