"""Record what NVML and libcuda answer on this GPU host, for the test doubles.

The GPU probe's tests replay these recordings (tests/gpudoubles.py) on
machines without a GPU. Run this on a GPU host to add or refresh one:

    python scripts/record_gpu_fixtures.py tests/fixtures/gpu/<name>.json

It asks exactly what ``artifactd.fingerprint.probe`` asks (counts, driver and CUDA
versions, name, capability, MIG mode, NVLink states, the GPU0-GPU1
topology, and through libcuda the driver version and SM count) and writes
the answers, errors included, in the format the doubles read. Needs
nvidia-ml-py (the ``gpu`` extra) and the driver's libcuda.so.1.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

FORMAT = "artifactd-gpu-recording/1"
#: NVLink links probed per GPU (NVML_NVLINK_MAX_LINKS on Hopper).
NVLINK_LINKS = 18
#: Devices whose per-device answers are kept: the probe reads GPU0, and GPU1 for topology.
DEVICES = 2
#: CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT in cuda.h: the one attribute the probe reads.
CU_MULTIPROCESSOR_COUNT = 16

Call = dict[str, Any]


def _nvml_call(fn: Any, *args: Any) -> Call:
    """One NVML call as ``{"value": ...}`` or ``{"error": class name, "code": n}``."""
    try:
        value = fn(*args)
    except Exception as exc:  # NVMLError subclasses carry the NVML return code as .value
        return {"error": type(exc).__name__, "code": int(getattr(exc, "value", -1))}
    if isinstance(value, bytes):  # bindings before nvidia-ml-py 11.515 returned bytes
        value = value.decode()
    if isinstance(value, tuple):
        value = list(value)
    return {"value": value}


def record_nvml(nvml: Any) -> dict[str, Any]:
    """Record an initialised ``pynvml`` module (or anything that answers like it)."""
    count = _nvml_call(nvml.nvmlDeviceGetCount)
    out: dict[str, Any] = {
        "nvmlDeviceGetCount": count,
        "nvmlSystemGetDriverVersion": _nvml_call(nvml.nvmlSystemGetDriverVersion),
        "nvmlSystemGetCudaDriverVersion_v2": _nvml_call(nvml.nvmlSystemGetCudaDriverVersion_v2),
        "devices": [],
        "nvmlDeviceGetTopologyCommonAncestor": {},
    }
    handles = [
        nvml.nvmlDeviceGetHandleByIndex(i) for i in range(min(count.get("value", 0), DEVICES))
    ]
    for handle in handles:
        links: list[Call] = []
        for link in range(NVLINK_LINKS):
            links.append(_nvml_call(nvml.nvmlDeviceGetNvLinkState, handle, link))
            if "error" in links[-1]:
                break  # the probe stops at the first error too
        out["devices"].append(
            {
                "nvmlDeviceGetName": _nvml_call(nvml.nvmlDeviceGetName, handle),
                "nvmlDeviceGetCudaComputeCapability": _nvml_call(
                    nvml.nvmlDeviceGetCudaComputeCapability, handle
                ),
                "nvmlDeviceGetMigMode": _nvml_call(nvml.nvmlDeviceGetMigMode, handle),
                "nvmlDeviceGetNvLinkState": links,
            }
        )
    if len(handles) > 1:
        out["nvmlDeviceGetTopologyCommonAncestor"]["0-1"] = _nvml_call(
            nvml.nvmlDeviceGetTopologyCommonAncestor, handles[0], handles[1]
        )
    return out


def _cu_call(fn: Any, *args: Any, out: ctypes.c_int | None = None) -> Call:
    """One driver API call as ``{"rc": CUresult, "value": the int written, or None}``."""
    rc = int(fn(*([ctypes.byref(out)] if out is not None else []), *args))
    return {"rc": rc, "value": out.value if out is not None and rc == 0 else None}


def record_libcuda(lib: Any) -> dict[str, Any]:
    """Record a loaded libcuda (``ctypes.CDLL("libcuda.so.1")``, or a double of one)."""
    out: dict[str, Any] = {
        "cuDriverGetVersion": _cu_call(lib.cuDriverGetVersion, out=ctypes.c_int(0)),
        "cuInit": _cu_call(lib.cuInit, 0),
        "cuDeviceGet": {},
        "cuDeviceGetAttribute": {},
    }
    if out["cuInit"]["rc"] != 0:
        return out
    device = ctypes.c_int(0)
    out["cuDeviceGet"]["0"] = _cu_call(lib.cuDeviceGet, 0, out=device)
    if out["cuDeviceGet"]["0"]["rc"] == 0:
        out["cuDeviceGetAttribute"][str(CU_MULTIPROCESSOR_COUNT)] = _cu_call(
            lib.cuDeviceGetAttribute, CU_MULTIPROCESSOR_COUNT, device, out=ctypes.c_int(0)
        )
    return out


def record(nvml: Any, lib: Any, provenance: str) -> dict[str, Any]:
    """Return a whole recording document."""
    return {
        "format": FORMAT,
        "provenance": provenance,
        "nvml": record_nvml(nvml),
        "libcuda": record_libcuda(lib),
    }


def main(argv: list[str] | None = None) -> int:
    """Record this host's NVML and libcuda answers into the given JSON file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path, help="the JSON file to write")
    args = parser.parse_args(argv)
    # lazy: nvidia-ml-py is optional (the gpu extra)
    import pynvml  # noqa: PLC0415

    lib = ctypes.CDLL("libcuda.so.1")
    pynvml.nvmlInit()
    try:
        provenance = (
            f"recorded by scripts/record_gpu_fixtures.py with nvidia-ml-py "
            f"{metadata.version('nvidia-ml-py')} on {time.strftime('%Y-%m-%d')}"
        )
        doc = record(pynvml, lib, provenance)
    finally:
        pynvml.nvmlShutdown()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    sys.stderr.write(f"wrote {args.output}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
