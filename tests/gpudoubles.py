"""Doubles of NVML and libcuda that replay a recording (tests/fixtures/gpu/*.json).

They stand in for GPU hardware the test machine usually lacks. A recording
holds what each call the probe makes returned on one host, in the types
nvidia-ml-py and the CUDA driver API (through ctypes) return there;
scripts/record_gpu_fixtures.py writes one from a real GPU, and the same
script, pointed at a double, must read back the recording it was built from
(tests/test_gpu_probe.py checks that for every file).

Format (``FORMAT``): ``{"format", "provenance", "nvml", "libcuda"}``. Each
recorded call is ``{"value": ...}`` or, where the call raised or returned an
error code, ``{"error": name, "code": n}`` (NVML) or ``{"rc": n, "value": ...}``
(libcuda, which returns ``CUresult`` codes).
"""

from __future__ import annotations

import ctypes
import json
from pathlib import Path
from typing import Any

FORMAT = "artifactd-gpu-recording/1"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "gpu"

Call = dict[str, Any]


def load_recording(name: str) -> dict[str, Any]:
    """Read ``tests/fixtures/gpu/<name>.json``."""
    doc: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))
    return doc


def nvml_error(call: Call) -> Exception:
    """The exception nvidia-ml-py raises for a recorded error (its own class when installed)."""
    try:
        # lazy: nvidia-ml-py is optional (the gpu extra)
        import pynvml  # noqa: PLC0415
    except ImportError:
        return RecordedNvmlError(call["code"], call["error"])
    # NVMLError.__new__ picks the subclass (NVMLError_NotSupported...) from the code.
    error: Exception = pynvml.NVMLError(call["code"])
    return error


class RecordedNvmlError(Exception):
    """Stands in for ``pynvml.NVMLError`` where nvidia-ml-py is not installed."""

    def __init__(self, code: int, name: str) -> None:
        super().__init__(name)
        self.value = code


class RecordedHandle:
    """An opaque device handle, like pynvml's ``c_nvmlDevice_t``."""

    def __init__(self, index: int) -> None:
        self.index = index


class RecordedNvml:
    """The ``pynvml`` module as a recording saw it; records every call made."""

    def __init__(self, recording: dict[str, Any]) -> None:
        self.data: dict[str, Any] = recording["nvml"]
        self.calls: list[str] = []

    def _replay(self, call: Call) -> Any:
        if "error" in call:
            raise nvml_error(call)
        return call["value"]

    def _device(self, handle: RecordedHandle) -> dict[str, Any]:
        assert isinstance(handle, RecordedHandle), "a handle the double never issued"
        device: dict[str, Any] = self.data["devices"][handle.index]
        return device

    def nvmlInit(self) -> None:  # noqa: N802 - NVML's own names
        self.calls.append("nvmlInit")

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.calls.append("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        self.calls.append("nvmlDeviceGetCount")
        return int(self._replay(self.data["nvmlDeviceGetCount"]))

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        self.calls.append("nvmlSystemGetDriverVersion")
        return str(self._replay(self.data["nvmlSystemGetDriverVersion"]))

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:  # noqa: N802
        self.calls.append("nvmlSystemGetCudaDriverVersion_v2")
        return int(self._replay(self.data["nvmlSystemGetCudaDriverVersion_v2"]))

    def nvmlDeviceGetHandleByIndex(self, index: int) -> RecordedHandle:  # noqa: N802
        self.calls.append("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.data["devices"]):
            raise nvml_error({"error": "NVMLError_InvalidArgument", "code": 2})
        return RecordedHandle(index)

    def nvmlDeviceGetName(self, handle: RecordedHandle) -> str:  # noqa: N802
        self.calls.append("nvmlDeviceGetName")
        return str(self._replay(self._device(handle)["nvmlDeviceGetName"]))

    def nvmlDeviceGetCudaComputeCapability(self, handle: RecordedHandle) -> tuple[int, int]:  # noqa: N802
        self.calls.append("nvmlDeviceGetCudaComputeCapability")
        major, minor = self._replay(self._device(handle)["nvmlDeviceGetCudaComputeCapability"])
        return int(major), int(minor)

    def nvmlDeviceGetMigMode(self, handle: RecordedHandle) -> list[int]:  # noqa: N802
        self.calls.append("nvmlDeviceGetMigMode")
        return list(self._replay(self._device(handle)["nvmlDeviceGetMigMode"]))

    def nvmlDeviceGetNvLinkState(self, handle: RecordedHandle, link: int) -> int:  # noqa: N802
        self.calls.append("nvmlDeviceGetNvLinkState")
        links = self._device(handle)["nvmlDeviceGetNvLinkState"]
        if link >= len(links):
            raise nvml_error({"error": "NVMLError_InvalidArgument", "code": 2})
        return int(self._replay(links[link]))

    def nvmlDeviceGetTopologyCommonAncestor(  # noqa: N802
        self, a: RecordedHandle, b: RecordedHandle
    ) -> int:
        self.calls.append("nvmlDeviceGetTopologyCommonAncestor")
        pair = f"{a.index}-{b.index}"
        return int(self._replay(self.data["nvmlDeviceGetTopologyCommonAncestor"][pair]))


class RecordedLibcuda:
    """libcuda through ctypes as a recording saw it: ``CUresult`` codes, values by pointer."""

    def __init__(self, recording: dict[str, Any], *, init_rc: int | None = None) -> None:
        self.data: dict[str, Any] = recording["libcuda"]
        self.init_rc = self.data["cuInit"]["rc"] if init_rc is None else init_rc
        self.calls: list[str] = []

    @staticmethod
    def _set(ptr: Any, value: int) -> None:
        ctypes.cast(ptr, ctypes.POINTER(ctypes.c_int))[0] = value

    def _replay(self, name: str, call: Call, out: Any) -> int:
        self.calls.append(name)
        if call.get("value") is not None:
            self._set(out, int(call["value"]))
        return int(call["rc"])

    def cuDriverGetVersion(self, out: Any) -> int:  # noqa: N802 - the driver API's names
        return self._replay("cuDriverGetVersion", self.data["cuDriverGetVersion"], out)

    def cuInit(self, flags: int) -> int:  # noqa: N802
        self.calls.append("cuInit")
        return int(self.init_rc)

    def cuDeviceGet(self, out: Any, ordinal: int) -> int:  # noqa: N802
        assert "cuInit" in self.calls, "cuDeviceGet before cuInit"
        return self._replay("cuDeviceGet", self.data["cuDeviceGet"][str(ordinal)], out)

    def cuDeviceGetAttribute(self, out: Any, attr: int, dev: Any) -> int:  # noqa: N802
        recorded = self.data["cuDeviceGetAttribute"]
        assert str(attr) in recorded, f"attribute {attr} was never recorded"
        return self._replay("cuDeviceGetAttribute", recorded[str(attr)], out)
