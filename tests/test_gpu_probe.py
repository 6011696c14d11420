"""GPU depth: topology from NVML and the SM count and CUDA version from libcuda.

Two kinds of test. Most replay recordings (tests/fixtures/gpu/*.json through
tests/gpudoubles.py): the doubles stand in for GPU hardware this machine
lacks, answering in the real return formats of nvidia-ml-py and of the CUDA
driver API through ctypes; they do not claim to test a GPU. The ``gpu``-marked
tests run the real NVML and libcuda path, and only where a GPU is; the one
marked ``gpu(absent=True)`` runs only where no NVIDIA driver is.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from gpudoubles import FIXTURES, FORMAT, RecordedLibcuda, RecordedNvml, load_recording

from artifactd.fingerprint import probe as probing
from artifactd.fingerprint.probe import gpu_from_nvml, probe_libcuda, topology_from_nvml

RECORDER = Path(__file__).resolve().parent.parent / "scripts" / "record_gpu_fixtures.py"
RECORDINGS = sorted(p.stem for p in FIXTURES.glob("*.json"))


def recorder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("record_gpu_fixtures", RECORDER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------
# The recordings themselves
# --------------------------------------------------------------------------


def test_there_are_recordings() -> None:
    assert RECORDINGS == ["h200x8-nvswitch", "l40sx2-pcie"]


@pytest.mark.parametrize("name", RECORDINGS)
def test_recording_has_the_recorders_format(name: str) -> None:
    """The recorder, pointed at the doubles, reads back exactly the file they replay.

    So every call the recorder (and so the probe) makes is in the file, in the
    shape the doubles read, and a re-recorded file can replace it as is.
    """
    doc = load_recording(name)
    assert doc["format"] == FORMAT == recorder().FORMAT
    assert set(doc) == {"format", "provenance", "nvml", "libcuda"}
    assert doc["provenance"]
    rec = recorder()
    assert rec.record_nvml(RecordedNvml(doc)) == doc["nvml"]
    assert rec.record_libcuda(RecordedLibcuda(doc)) == doc["libcuda"]
    # Written as the recorder writes it: sorted keys, two-space indent.
    text = (FIXTURES / f"{name}.json").read_text(encoding="utf-8")
    assert text == json.dumps(doc, indent=2, sort_keys=True) + "\n"


def test_recorder_keeps_errors_with_their_code() -> None:
    doc = load_recording("l40sx2-pcie")
    device = recorder().record_nvml(RecordedNvml(doc))["devices"][0]
    assert device["nvmlDeviceGetMigMode"] == {"error": "NVMLError_NotSupported", "code": 3}
    assert device["nvmlDeviceGetNvLinkState"] == [{"error": "NVMLError_NotSupported", "code": 3}]


# --------------------------------------------------------------------------
# The probe against the recordings
# --------------------------------------------------------------------------


def test_topology_summaries() -> None:
    hgx = topology_from_nvml(RecordedNvml(load_recording("h200x8-nvswitch")))
    assert hgx == ("8 GPU(s); GPU0 NVLink links active: 18; GPU0-GPU1 common ancestor: PCIe switch")
    pcie = topology_from_nvml(RecordedNvml(load_recording("l40sx2-pcie")))
    assert pcie == "2 GPU(s); GPU0 NVLink links active: 0; GPU0-GPU1 common ancestor: host bridge"


def test_gpu_and_driver_sections() -> None:
    gpu, driver = gpu_from_nvml(RecordedNvml(load_recording("l40sx2-pcie")))
    assert gpu == {
        "arch": "sm_89",
        "capability": "8.9",
        "name": "NVIDIA L40S",
        "count": 2,
        "sm_count": None,  # NVML has no SM count: libcuda supplies it
        "mig": None,  # NVML_ERROR_NOT_SUPPORTED: unknown, not "off"
        "source": "nvml",
    }
    assert driver == {"version": "570.133.20", "cuda_version": "12.8"}


def test_topology_failure_is_advisory() -> None:
    class Broken(RecordedNvml):
        def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:  # noqa: N802
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")

    assert topology_from_nvml(Broken(load_recording("h200x8-nvswitch"))) is None


def test_libcuda_version_and_sm_count() -> None:
    doc = load_recording("h200x8-nvswitch")
    assert probe_libcuda(RecordedLibcuda(doc)) == {"cuda_version": "12.8", "sm_count": 132}
    lib = RecordedLibcuda(doc)
    assert probe_libcuda(lib, init=False) == {"cuda_version": "12.8", "sm_count": None}
    assert lib.calls == ["cuDriverGetVersion"]  # no context unless a GPU is known present


def test_libcuda_without_a_device() -> None:
    # CUDA_ERROR_NO_DEVICE (100) from cuInit: version still known, SM count not.
    lib = RecordedLibcuda(load_recording("h200x8-nvswitch"), init_rc=100)
    assert probe_libcuda(lib) == {"cuda_version": "12.8", "sm_count": None}
    assert "cuDeviceGet" not in lib.calls


def test_probe_gpu_nvml_through_the_module(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The whole NVML path, with the recording as ``pynvml`` and as libcuda."""
    doc = load_recording("h200x8-nvswitch")
    nvml = RecordedNvml(doc)
    module = ModuleType("pynvml")
    for name in dir(nvml):
        if name.startswith("nvml"):
            setattr(module, name, getattr(nvml, name))
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monkeypatch.setattr(probing, "_DRIVER_MARKERS", (str(tmp_path),))
    real_probe_libcuda = probing.probe_libcuda
    monkeypatch.setattr(probing, "probe_libcuda", lambda: real_probe_libcuda(RecordedLibcuda(doc)))
    found = probing.probe_gpu_nvml()
    assert found is not None
    gpu, _driver, topology = found
    assert (gpu["arch"], gpu["count"], gpu["sm_count"], gpu["mig"]) == ("sm_90a", 8, 132, False)
    assert topology is not None and topology.startswith("8 GPU(s)")
    assert nvml.calls[0] == "nvmlInit" and nvml.calls[-1] == "nvmlShutdown"


# --------------------------------------------------------------------------
# The real hardware path: only on a GPU host, or only without a driver
# --------------------------------------------------------------------------


@pytest.mark.gpu
def test_real_libcuda_reports_version_and_sm_count() -> None:
    found = probe_libcuda()
    assert re.fullmatch(r"\d+\.\d+", found["cuda_version"] or "")
    assert isinstance(found["sm_count"], int) and found["sm_count"] > 0


@pytest.mark.gpu
def test_real_nvml_probe_reads_this_gpu() -> None:
    pytest.importorskip("pynvml", reason="the real NVML path needs nvidia-ml-py")
    found = probing.probe_gpu_nvml()
    assert found is not None
    gpu, driver, topology = found
    assert gpu["source"] == "nvml" and gpu["count"] >= 1
    assert re.fullmatch(r"sm_\d+a?", gpu["arch"] or "")
    assert isinstance(gpu["sm_count"], int) and gpu["sm_count"] > 0
    assert re.fullmatch(r"\d+\.\d+(\.\d+)*", driver["version"] or "")
    assert topology is not None and topology.startswith(f"{gpu['count']} GPU(s)")


@pytest.mark.gpu
def test_recording_this_gpu_replays_like_it(tmp_path: Path) -> None:
    """Record this host, then check the doubles answer the probe as the hardware did."""
    pynvml = pytest.importorskip("pynvml", reason="recording needs nvidia-ml-py")
    out = tmp_path / "this-host.json"
    assert recorder().main([str(out)]) == 0
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["format"] == FORMAT
    pynvml.nvmlInit()
    try:
        real = (gpu_from_nvml(pynvml), topology_from_nvml(pynvml))
    finally:
        pynvml.nvmlShutdown()
    assert (gpu_from_nvml(RecordedNvml(doc)), topology_from_nvml(RecordedNvml(doc))) == real
    assert probe_libcuda(RecordedLibcuda(doc)) == probe_libcuda()


@pytest.mark.gpu(absent=True)
def test_no_libcuda_here() -> None:
    """Without a driver, loading libcuda fails cleanly: nothing known, nothing raised."""
    assert probe_libcuda() == {"cuda_version": None, "sm_count": None}
    assert probing.probe_gpu_nvml() is None
