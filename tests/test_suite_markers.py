"""The inner loop (``-m "not slow"``) leaves out engine, image-build and kill-loop tests.

``podman``, ``image`` and ``killloop`` say what a test needs or does, and
each implies ``slow`` (tests/conftest.py): collected with ``-m "not slow"``,
none of them may be selected, and the default run still holds them all.
This check collects twice in subprocesses, so it is slow itself: the default
run (``scripts/test.sh``) guards the inner loop.
"""

from __future__ import annotations

import subprocess
import sys
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


def _collected(marks: str) -> set[str]:
    """Node ids (file::name, parameters dropped) that ``-m MARKS`` selects in EXPENSIVE."""
    argv = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    proc = subprocess.run(
        [*argv, "-m", marks, *(str(TESTS / m) for m in EXPENSIVE)],
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
