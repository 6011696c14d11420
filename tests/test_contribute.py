"""``contribute`` against hostile sizes, a small temp dir and unreadable files (issue 28, item 8).

Real parts: a one-family matrix built into a local layout by the real CLI, a
real restore into a pod dir, files the "engine" wrote after it (sparse, so
256 MiB cost no disk), a real size-limited tmpfs as the temp dir (``TMPDIR``),
and a mode-000 file read by a process that cannot read it (root without its
DAC capabilities, through ``setpriv``, as tests/test_hostile_inputs.py does).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import PYTHON, clean_env, run_artifactd, tmpfs
from test_hostile_inputs import UNREADABLE_WRAPPER

from artifactd.pod.contribute import _stage, _written
from artifactd.pod.verdict import restore_time, wait_past
from artifactd.restore.destination import CacheVolume
from artifactd.stores import open_store

WRITE = (
    "import os, pathlib; d = pathlib.Path(os.environ['ARTIFACTD_GENERIC_DIR']); "
    "d.mkdir(parents=True, exist_ok=True); (d / 'k-A.cubin').write_bytes(b'ELF A')"
)
MiB = 1 << 20


def _json(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return doc


def _clean(proc: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "internal error" not in proc.stderr, proc.stderr


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A local layout holding one whole artifact of the generic family."""
    tmp = tmp_path_factory.mktemp("contribute-store")
    m = tmp / "m.yaml"
    m.write_text(
        "schema_version: 1\nname: deltas\ntarget: {gpu_arch: sm_90a}\nfamilies: [generic]\n"
        f"gpus: 0\ncommand: {json.dumps(sys.executable + ' -c ' + json.dumps(WRITE))}\n"
    )
    store = f"oci:{tmp / 'store'}"
    proc = run_artifactd("build", str(m), "--store", store, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return store


@pytest.fixture
def pod(published: str, tmp_path: Path) -> Path:
    """A pod dir the published artifact was restored into, its file clock past the restore."""
    target = tmp_path / "pod"
    proc = run_artifactd(
        "restore", "--store", published, "--target", str(target), "--gpu-arch", "sm_90a", "--json"
    )
    assert proc.returncode == 0 and _json(proc)["restored"] == ["generic"], proc.stderr
    volume = CacheVolume(target)
    marker = volume.read_marker()
    assert marker is not None
    # What the "engine" writes from here on counts as written since the restore.
    wait_past(target / "generic", restore_time(volume.marker_path, marker["restored_at"]))
    return target


@pytest.fixture
def small_tmp(tmp_path: Path) -> Iterator[Path]:
    """A 32 MiB tmpfs, the temp dir contribute gets (TMPDIR)."""
    with tmpfs(tmp_path / "tmpfs", "32m") as mnt:
        yield mnt


def _sparse(path: Path, size: int) -> None:
    with path.open("wb") as f:
        f.truncate(size)


def _contribute(
    pod: Path, store: str, *args: str, tmp: Path, wrapper: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    argv = ["contribute", "--target", str(pod), "--store", store, "--json", *args]
    env = clean_env({"TMPDIR": str(tmp)})
    if wrapper:
        return subprocess.run(
            [*wrapper, PYTHON, "-m", "artifactd", *argv],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
    return run_artifactd(*argv, env=env, timeout=120)


def test_over_the_cap_nothing_is_copied_nor_published(
    pod: Path, small_tmp: Path, tmp_path: Path
) -> None:
    """256 MiB written, a 1 MB cap, a 32 MiB temp dir: exit 0, "over the cap", no byte copied."""
    for i in range(4):
        _sparse(pod / "generic" / f"big-{i}.cubin", 64 * MiB)
    before = os.stat(small_tmp).st_mtime_ns
    deltas = tmp_path / "deltas"
    proc = _contribute(pod, f"oci:{deltas}", "--max-bytes", "1000000", tmp=small_tmp)
    _clean(proc)
    assert proc.returncode == 0, proc.stderr
    doc = _json(proc)
    assert not doc["published"] and doc["tag"] is None
    assert f"take {256 * MiB} B, over the 1000000 B cap" in doc["reason"]
    assert "nothing published" in doc["reason"]
    # Nothing was created in the temp dir (its mtime would change), nothing in the store.
    assert os.stat(small_tmp).st_mtime_ns == before and not list(small_tmp.iterdir())
    assert not deltas.exists()


def test_a_temp_dir_too_small_for_the_copy_is_no_space_and_publishes_nothing(
    pod: Path, small_tmp: Path, tmp_path: Path
) -> None:
    """48 MiB under the default cap, a 32 MiB temp dir: exit 9, a hint, nothing published."""
    _sparse(pod / "generic" / "big.cubin", 48 * MiB)
    deltas = tmp_path / "deltas"
    proc = _contribute(pod, f"oci:{deltas}", tmp=small_tmp)
    _clean(proc)
    assert proc.returncode == 9, proc.stderr
    assert "temp dir is out of space" in proc.stderr and "nothing published" in proc.stderr
    assert "hint: point TMPDIR at a larger directory" in proc.stderr
    assert not list(small_tmp.iterdir())  # the staging copy is gone
    assert not deltas.exists() or not open_store(f"oci:{deltas}").list_tags()


@pytest.mark.skipif(UNREADABLE_WRAPPER is None, reason="no way to deny reads to this user here")
def test_an_unreadable_written_file_is_left_out_with_a_warning(pod: Path, tmp_path: Path) -> None:
    (pod / "generic" / "k-B.cubin").write_bytes(b"ELF B")
    secret = pod / "generic" / "k-C.cubin"
    secret.write_bytes(b"ELF C")
    secret.chmod(0)
    deltas = tmp_path / "deltas"
    proc = _contribute(pod, f"oci:{deltas}", tmp=tmp_path, wrapper=UNREADABLE_WRAPPER)
    _clean(proc)
    assert proc.returncode == 0, proc.stderr
    doc = _json(proc)
    assert doc["published"], doc
    assert [(f["family"], f["files"]) for f in doc["families"]] == [("generic", 1)]
    assert len(doc["skipped"]) == 1 and doc["skipped"][0].startswith("generic/cache/k-C.cubin: ")
    assert "warning: left out, unreadable: generic/cache/k-C.cubin" in proc.stderr
    with open_store(f"oci:{deltas}") as st:
        assert st.list_tags() == [doc["tag"]]


def test_files_that_grow_past_the_cap_while_copied_stop_the_copy(pod: Path, tmp_path: Path) -> None:
    """Sized under the cap by the walk, then grown: the copy reads at most the cap, and stops."""
    grows = pod / "generic" / "grows.cubin"
    grows.write_bytes(b"x" * 1000)
    volume = CacheVolume(pod)
    marker = volume.installed()
    assert marker is not None
    written = _written(marker, restore_time(volume.marker_path, marker["restored_at"]), {})
    assert sum(w.st.st_size for w in written) <= 4096
    with grows.open("ab") as f:  # the engine keeps writing after the walk
        f.write(b"y" * (8 * MiB))
    skipped: list[str] = []
    stage = tmp_path / "stage"
    assert _stage(written, stage, 4096, skipped) is None
    copied = sum(p.stat().st_size for p in stage.rglob("*") if p.is_file())
    assert copied <= 4096 and skipped == []
