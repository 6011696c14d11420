"""GPU depth: topology from NVML and the SM count and CUDA version from libcuda.

This machine has no GPU and no driver, so these tests feed recorded doubles
that answer in the real return formats (nvidia-ml-py 13.x and the CUDA driver
API through ctypes). They stand in for a GPU; they do not claim to test one.
"""

from __future__ import annotations

import ctypes
from typing import Any

from artifactd.probing import probe_libcuda, topology_from_nvml


class RecordedNvml8xH200:
    """NVML on an 8x H200 HGX node (NVSwitch): 18 NVLinks per GPU, PCIe switch pairs."""

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802 - NVML's name
        return 8

    def nvmlDeviceGetHandleByIndex(self, index: int) -> tuple[str, int]:  # noqa: N802
        return ("handle", index)

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:  # noqa: N802
        if link >= 18:
            raise RuntimeError("NVML_ERROR_INVALID_ARGUMENT")
        return 1  # NVML_FEATURE_ENABLED

    def nvmlDeviceGetTopologyCommonAncestor(self, a: Any, b: Any) -> int:  # noqa: N802
        return 10  # NVML_TOPOLOGY_SINGLE


class RecordedNvmlPcieOnly(RecordedNvml8xH200):
    """Two PCIe cards on different host bridges, no NVLink (NVML_ERROR_NOT_SUPPORTED)."""

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return 2

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:  # noqa: N802
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

    def nvmlDeviceGetTopologyCommonAncestor(self, a: Any, b: Any) -> int:  # noqa: N802
        return 30  # NVML_TOPOLOGY_HOSTBRIDGE


def test_topology_summaries() -> None:
    hgx = topology_from_nvml(RecordedNvml8xH200())
    assert hgx == ("8 GPU(s); GPU0 NVLink links active: 18; GPU0-GPU1 common ancestor: PCIe switch")
    pcie = topology_from_nvml(RecordedNvmlPcieOnly())
    assert pcie is not None and "links active: 0" in pcie and "host bridge" in pcie


def test_topology_failure_is_advisory() -> None:
    class Broken(RecordedNvml8xH200):
        def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:  # noqa: N802
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")

    assert topology_from_nvml(Broken()) is None


class RecordedLibcuda:
    """The CUDA driver API as ctypes calls it on an H200 with driver 570 (CUDA 12.8)."""

    def __init__(self, *, init_rc: int = 0) -> None:
        self.init_rc = init_rc
        self.calls: list[str] = []

    @staticmethod
    def _set(ptr: Any, value: int) -> None:
        ctypes.cast(ptr, ctypes.POINTER(ctypes.c_int))[0] = value

    def cuDriverGetVersion(self, out: Any) -> int:  # noqa: N802 - the driver API's name
        self.calls.append("cuDriverGetVersion")
        self._set(out, 12080)
        return 0  # CUDA_SUCCESS

    def cuInit(self, flags: int) -> int:  # noqa: N802
        self.calls.append("cuInit")
        return self.init_rc

    def cuDeviceGet(self, out: Any, ordinal: int) -> int:  # noqa: N802
        self._set(out, 0)
        return 0

    def cuDeviceGetAttribute(self, out: Any, attr: int, dev: Any) -> int:  # noqa: N802
        assert attr == 16  # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
        self._set(out, 132)
        return 0


def test_libcuda_version_and_sm_count() -> None:
    lib = RecordedLibcuda()
    assert probe_libcuda(lib) == {"cuda_version": "12.8", "sm_count": 132}
    lib = RecordedLibcuda()
    assert probe_libcuda(lib, init=False) == {"cuda_version": "12.8", "sm_count": None}
    assert "cuInit" not in lib.calls  # no context creation unless a GPU is known present


def test_libcuda_without_a_device() -> None:
    # CUDA_ERROR_NO_DEVICE (100) from cuInit: version still known, SM count not.
    assert probe_libcuda(RecordedLibcuda(init_rc=100)) == {"cuda_version": "12.8", "sm_count": None}


def test_no_libcuda_here() -> None:
    """This machine has no driver: loading libcuda fails cleanly."""
    assert probe_libcuda() == {"cuda_version": None, "sm_count": None}
