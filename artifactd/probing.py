"""Probe the local environment into a plain fingerprint document, fast.

This module imports nothing heavy (no pydantic, no torch, no engine): a no-op
restore in an init container probes, hashes and compares without building a
single model. :func:`probe_raw` returns exactly the JSON shape of
:class:`artifactd.fingerprint.Fingerprint` (every field present), so
``raw_hash(probe_raw())`` equals ``Fingerprint.model_validate(raw).hash``; a
test keeps the two in step.

Where each fact comes from:

* GPU and driver: NVML (``nvidia-ml-py``) when a driver is present, else
  ``/proc/driver/nvidia/version``; a declared ``--gpu-arch`` for GPU-less builds.
* Library versions and content hashes: ``<name>-<version>.dist-info`` and the
  sha256 of its ``RECORD`` (torch and Triton hash their own files into keys).
* Toolchains: ``nvcc --version``, Triton's bundled ``ptxas --version``,
  ``cc --version``, run concurrently.
* Python ABI, platform, glibc, CPU ISA level (Inductor compiles with ``-march=native``).
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import re
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from artifactd import __version__
from artifactd.constants import current_environ
from artifactd.errors import UsageError
from artifactd.hashing import canonical_hash, sha256_hex

#: Distributions whose version and content hash enter the fingerprint.
TRACKED_LIBRARIES = (
    "torch",
    "triton",
    "vllm",
    "sglang",
    "deep_gemm",
    "tilelang",
    "flashinfer-python",
    "flashinfer-cubin",
    "flashinfer-jit-cache",
    "nvidia-cutlass-dsl",
)

#: Present wherever the NVIDIA kernel driver is (hosts, and GPU containers).
_DRIVER_MARKERS = ("/dev/nvidiactl", "/proc/driver/nvidia/version")

Raw = dict[str, Any]


# --------------------------------------------------------------------------
# Pure helpers shared with the pydantic model
# --------------------------------------------------------------------------


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten nested mappings into dotted-path leaves (lists stay leaves)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, path + "."))
        else:
            out[path] = value
    return out


def hashed_view(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Return the part of a fingerprint document that enters its hash (all but ``info``)."""
    return {k: v for k, v in raw.items() if k != "info"}


def raw_hash(raw: Mapping[str, Any]) -> str:
    """Hash a fingerprint document: sha256 of the canonical JSON of its hashed view."""
    return canonical_hash(hashed_view(raw))


def select(flat: Mapping[str, Any], dimensions: Sequence[str]) -> dict[str, Any]:
    """Return the leaves under each dotted prefix; an absent dimension maps to None."""
    chosen: dict[str, Any] = {}
    for dim in dimensions:
        hit = False
        for key, value in flat.items():
            if key == dim or key.startswith(dim + "."):
                chosen[key] = value
                hit = True
        if not hit:
            # Record absence explicitly: "no torch" must differ from "torch X".
            chosen.setdefault(dim, None)
    return chosen


def scope_key(
    flat: Mapping[str, Any], family: str, dimensions: Sequence[str], revision: int = 1
) -> str:
    """Hash the fields one family's validity depends on, and nothing else."""
    return canonical_hash(
        {"family": family, "revision": revision, "scope": select(flat, dimensions)}
    )


# --------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------

_ARCH_RE = re.compile(r"^sm_(\d+)(\d)([af]?)$")


def parse_gpu_arch(arch: str) -> tuple[str, str]:
    """Parse ``sm_90a`` into ``("sm_90a", "9.0")``; raise :class:`UsageError` if malformed."""
    m = _ARCH_RE.match(arch.strip())
    if not m:
        raise UsageError(
            f"not a GPU architecture: {arch!r}",
            hint="use the form nvcc and Triton print, e.g. sm_80, sm_90a, sm_100a",
        )
    return arch.strip(), f"{int(m.group(1))}.{m.group(2)}"


def arch_for_capability(major: int, minor: int) -> str:
    """Return the compile target Triton uses: ``sm_XYa`` from capability 9.0 on."""
    suffix = "a" if major >= 9 else ""
    return f"sm_{major}{minor}{suffix}"


def empty_gpu() -> Raw:
    """Return the GPU section of a machine without a GPU."""
    return {
        "arch": None,
        "capability": None,
        "name": None,
        "count": 0,
        "sm_count": None,
        "mig": None,
        "source": "absent",
    }


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def gpu_from_nvml(nvml: Any) -> tuple[Raw, Raw]:
    """Read GPU and driver sections from an initialised NVML module (or a recorded double).

    The SM count is left to other probes: NVML has no whole-GPU SM query
    (``nvmlDeviceGetNumGpuCores`` counts CUDA cores, not SMs).
    """
    count = int(nvml.nvmlDeviceGetCount())
    driver: Raw = {"version": _text(nvml.nvmlSystemGetDriverVersion()), "cuda_version": None}
    try:
        cuda_v = int(nvml.nvmlSystemGetCudaDriverVersion_v2())
        driver["cuda_version"] = f"{cuda_v // 1000}.{cuda_v % 1000 // 10}"
    except Exception:  # noqa: S110 - older drivers lack the call; the field stays None
        pass
    gpu = empty_gpu() | {"source": "nvml"}
    if count == 0:
        return gpu, driver
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    major, minor = (int(v) for v in nvml.nvmlDeviceGetCudaComputeCapability(handle))
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        gpu["mig"] = bool(current)
    except Exception:  # noqa: S110 - MIG unsupported on this GPU: unknown, not "off"
        pass
    gpu.update(
        arch=arch_for_capability(major, minor),
        capability=f"{major}.{minor}",
        name=_text(nvml.nvmlDeviceGetName(handle)),
        count=count,
    )
    return gpu, driver


#: nvmlGpuTopologyLevel_t values, as nvidia-ml-py names them.
_TOPOLOGY_LEVELS = {
    0: "same board",
    10: "PCIe switch",
    20: "PCIe switches",
    30: "host bridge",
    40: "NUMA node",
    50: "system (SMP link)",
}
_NVLINK_LINKS = 18


def topology_from_nvml(nvml: Any) -> str | None:
    """Summarise GPU interconnect (advisory: it changes tuning, not kernel validity)."""
    try:
        count = int(nvml.nvmlDeviceGetCount())
        if count < 1:
            return None
        first = nvml.nvmlDeviceGetHandleByIndex(0)
        active = 0
        for link in range(_NVLINK_LINKS):
            try:
                active += int(bool(nvml.nvmlDeviceGetNvLinkState(first, link)))
            except Exception:
                break
        parts = [f"{count} GPU(s)", f"GPU0 NVLink links active: {active}"]
        if count > 1:
            second = nvml.nvmlDeviceGetHandleByIndex(1)
            level = int(nvml.nvmlDeviceGetTopologyCommonAncestor(first, second))
            parts.append(f"GPU0-GPU1 common ancestor: {_TOPOLOGY_LEVELS.get(level, level)}")
        return "; ".join(parts)
    except Exception:
        return None


#: CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT in cuda.h.
_CU_MULTIPROCESSOR_COUNT = 16


def probe_libcuda(lib: Any = None, *, init: bool = True) -> Raw:
    """Ask libcuda (through ctypes) for the driver's CUDA version and the SM count.

    ``cuDriverGetVersion`` needs no ``cuInit``; the SM count does, so it is read
    only with ``init=True`` (a GPU is known to be present): DeepGEMM bakes it
    into its kernels. ``lib`` is a loaded libcuda, or a recorded double in tests.
    """
    out: Raw = {"cuda_version": None, "sm_count": None}
    if lib is None:
        import ctypes

        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError:
            return out
    import ctypes

    version = ctypes.c_int(0)
    if lib.cuDriverGetVersion(ctypes.byref(version)) == 0 and version.value:
        out["cuda_version"] = f"{version.value // 1000}.{version.value % 1000 // 10}"
    if init and lib.cuInit(0) == 0:
        device, count = ctypes.c_int(0), ctypes.c_int(0)
        if (
            lib.cuDeviceGet(ctypes.byref(device), 0) == 0
            and lib.cuDeviceGetAttribute(ctypes.byref(count), _CU_MULTIPROCESSOR_COUNT, device) == 0
        ):
            out["sm_count"] = count.value or None
    return out


def probe_gpu_nvml() -> tuple[Raw, Raw, str | None] | None:
    """Read GPU, driver and topology facts from NVML (+ libcuda for the SM count).

    ``None`` without nvidia-ml-py or a driver.
    """
    if not any(Path(p).exists() for p in _DRIVER_MARKERS):
        return None  # no NVIDIA driver on this host: skip importing and loading NVML
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound and friends: no NVML here
        return None
    try:
        gpu, driver = gpu_from_nvml(pynvml)
        topology = topology_from_nvml(pynvml)
    finally:
        with contextlib.suppress(Exception):  # a failed shutdown changes nothing we report
            pynvml.nvmlShutdown()
    if gpu["count"]:
        gpu["sm_count"] = probe_libcuda()["sm_count"]
    return gpu, driver, topology


def proc_driver_version(path: Path = Path("/proc/driver/nvidia/version")) -> str | None:
    """Read the kernel module version from ``/proc`` (no NVML needed)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    m = re.search(r"Kernel Module(?:\s+for\s+\S+)?\s+([\d.]+)", text)
    return m.group(1) if m else None


# --------------------------------------------------------------------------
# CPU
# --------------------------------------------------------------------------

_X86_LEVELS: tuple[tuple[str, frozenset[str]], ...] = (
    ("x86-64-v4", frozenset({"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"})),
    ("x86-64-v3", frozenset({"avx2", "bmi1", "bmi2", "fma", "movbe", "f16c", "abm"})),
    ("x86-64-v2", frozenset({"sse4_2", "popcnt", "ssse3", "cx16", "sse4_1"})),
)
_NOTABLE = re.compile(r"^(avx512\w*|amx\w*|avx_vnni\w*|avx10\w*|sve\w*|sve2|asimd\w*|bf16|i8mm)$")


def probe_cpu(cpuinfo: str | None = None, machine: str | None = None) -> tuple[Raw, str | None]:
    """Return the CPU section (ISA level, codegen-relevant extensions) and the model name."""
    machine = machine or os.uname().machine
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            cpuinfo = ""
    flags: set[str] = set()
    model = None
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("flags", "Features") and not flags:
            flags = set(value.split())
        elif key == "model name" and model is None:
            model = value.strip()
    level = machine
    if machine in ("x86_64", "AMD64"):
        level = "x86-64"
        for name, needed in _X86_LEVELS:
            if needed <= flags:
                level = name
                break
    features = sorted(f for f in flags if _NOTABLE.match(f))
    return {"isa_level": level, "features": features}, model


# --------------------------------------------------------------------------
# Libraries and toolchains
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class InstalledDist:
    """An installed distribution found by its ``*.dist-info`` directory."""

    name: str
    version: str
    dist_info: Path

    @property
    def location(self) -> Path:
        """The directory the distribution is installed into (site-packages)."""
        return self.dist_info.parent

    def read_text(self, name: str) -> str | None:
        """Return a metadata file's text, or None when absent."""
        try:
            return (self.dist_info / name).read_text(encoding="utf-8")
        except OSError:
            return None


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def find_distributions(
    names: Sequence[str], paths: Sequence[str] | None = None
) -> dict[str, InstalledDist]:
    """Find installed distributions by name, the first on ``sys.path`` winning.

    Reads ``<name>-<version>.dist-info`` directory names (PEP 376/427) with one
    ``listdir`` per path entry: much cheaper than ``importlib.metadata``, which
    parses every METADATA file it touches. A missing name is simply absent.
    """
    wanted = {_normalize(n): n for n in names}
    found: dict[str, InstalledDist] = {}
    for entry in sys.path if paths is None else paths:
        try:
            listing = os.listdir(entry or ".")
        except OSError:
            continue
        for item in listing:
            if not item.endswith(".dist-info"):
                continue
            dist_name, sep, version = item[: -len(".dist-info")].partition("-")
            original = wanted.get(_normalize(dist_name))
            if sep and original and original not in found:
                found[original] = InstalledDist(original, version, Path(entry or ".") / item)
    return found


def library_info(dist: InstalledDist) -> Raw:
    """Version, RECORD hash (a cheap content proxy) and whether it is a source install."""
    record = dist.read_text("RECORD")
    direct_url = dist.read_text("direct_url.json") or ""
    return {
        "version": dist.version,
        "content_hash": sha256_hex(record.encode()) if record else None,
        "source_install": '"dir_info"' in direct_url or '"vcs_info"' in direct_url,
    }


def run_version(argv: list[str]) -> str | None:
    """Run ``tool --version``; None when the tool is missing or fails."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


_RELEASE_RE = re.compile(r"release [\d.]+, V([\d.]+)")


def cuda_release(text: str | None) -> str | None:
    """Extract ``13.0.88`` from nvcc's or ptxas's ``--version`` text."""
    if not text:
        return None
    m = _RELEASE_RE.search(text)
    return m.group(1) if m else None


class _Background:
    """Run a few probes on threads (subprocess waits overlap); collect their results."""

    def __init__(self) -> None:
        self._threads: list[threading.Thread] = []
        self._results: dict[str, Any] = {}

    def start(self, name: str, fn: Callable[[], Any]) -> None:
        def run() -> None:
            self._results[name] = fn()

        thread = threading.Thread(target=run, name=f"probe-{name}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def results(self) -> dict[str, Any]:
        for thread in self._threads:
            thread.join()
        return self._results


def _user() -> str | None:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return None


def probe_raw(
    *,
    gpu_arch: str | None = None,
    image_digest: str | None = None,
    workload: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
    use_nvml: bool = True,
) -> Raw:
    """Probe this machine; return the fingerprint document as plain JSON data.

    ``gpu_arch`` declares the target for builds without a GPU (``sm_90a``); it
    overrides the architecture NVML reports.
    """
    environ = current_environ() if environ is None else environ
    arch = parse_gpu_arch(gpu_arch) if gpu_arch else None  # bad input fails before any work
    dists = find_distributions(TRACKED_LIBRARIES)
    triton = dists.get("triton")
    ptxas_path = environ.get("TRITON_PTXAS_PATH") or (
        str(triton.location / "triton" / "backends" / "nvidia" / "bin" / "ptxas")
        if triton
        else None
    )
    bg = _Background()
    bg.start("nvcc", lambda: run_version(["nvcc", "--version"]))
    if ptxas_path:
        bg.start("ptxas", lambda: run_version([ptxas_path, "--version"]))
    bg.start("cc", lambda: run_version([environ.get("CC", "cc"), "--version"]))
    if use_nvml:
        bg.start("nvml", probe_gpu_nvml)
    libraries = {name: library_info(dist) for name, dist in sorted(dists.items())}
    cpu, cpu_model = probe_cpu()
    found = bg.results()

    nvml = found.get("nvml")
    topology = None
    if nvml is not None:
        gpu, driver, topology = nvml
    else:
        gpu, driver = empty_gpu(), {"version": proc_driver_version(), "cuda_version": None}
        if driver["version"] is not None:  # a driver without NVML bindings: ask libcuda
            driver["cuda_version"] = probe_libcuda(init=False)["cuda_version"]
    if arch:
        gpu.update(
            arch=arch[0],
            capability=arch[1],
            source="nvml" if gpu["source"] == "nvml" else "declared",
        )

    torch = dists.get("torch")
    torch_cuda = torch.version.split("+", 1)[1] if torch and "+" in torch.version else None
    site = str(torch.location) if torch is not None else sysconfig.get_paths()["purelib"]
    glibc = os.confstr("CS_GNU_LIBC_VERSION") if hasattr(os, "confstr") else None
    uname = os.uname()
    cc_out = found.get("cc")
    return {
        "schema_version": 1,
        "gpu": gpu,
        "driver": driver,
        "cuda": {
            "nvcc": cuda_release(found.get("nvcc")),
            "ptxas": cuda_release(found.get("ptxas")),
            "torch_cuda": torch_cuda,
        },
        "python": {
            "implementation": sys.implementation.name,
            "version": f"{sys.version_info.major}.{sys.version_info.minor}",
            "cache_tag": sys.implementation.cache_tag,
            "soabi": sysconfig.get_config_var("SOABI"),
            "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"),
        },
        "platform": {"system": uname.sysname, "machine": uname.machine, "glibc": glibc},
        "cpu": cpu,
        "compilers": {"cc": cc_out.splitlines()[0].strip() if cc_out else None},
        "libraries": libraries,
        "paths": {"site_packages": os.path.realpath(site)},
        "image": {"digest": image_digest or None},
        "workload": dict(workload or {}),
        "info": {
            "hostname": uname.nodename,
            "user": _user(),
            "probed_at": round(time.time(), 3),
            "cpu_model": cpu_model,
            "topology": topology,
            "artifactd_version": __version__,
        },
    }


def parse_pairs(pairs: Sequence[str], *, what: str) -> dict[str, str]:
    """Parse ``KEY=VALUE`` strings (CLI ``--workload`` and friends) into a dict."""
    out: dict[str, str] = {}
    for pair in pairs:
        for item in (p for p in pair.split(",") if p.strip()):
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise UsageError(f"{what} must be KEY=VALUE, got {item!r}")
            out[key.strip()] = value.strip()
    return out


#: Sections where ``--set`` may create keys that the probe did not find.
_OPEN_SECTIONS = ("workload", "libraries")


def _parse_value(text: str) -> Any:
    """Parse a ``--set`` value: text, ``null``, or a ``[...]`` JSON list.

    Text stays text; the model converts "8" and "true" where a field is a
    number or a flag.
    """
    stripped = text.strip()
    if stripped == "null":
        return None
    if stripped.startswith("["):
        try:
            return json.loads(stripped)
        except ValueError:
            pass
    return text


def apply_overrides(raw: Raw, assignments: Sequence[str]) -> Raw:
    """Apply ``PATH=VALUE`` overrides (dotted paths as in the JSON Schema) to a document.

    For building on one machine for another target and for "what if" questions:
    ``gpu.arch=sm_100a``, ``driver.version=575.51``, ``workload.tp=8``,
    ``libraries.vllm.version=0.33.0``. A path must exist, except under
    ``workload`` and ``libraries``, where new keys may be added; ``info.*`` may
    be set too (it is never hashed). Returns a new document.
    """
    doc: Raw = json.loads(json.dumps(raw))
    for item in assignments:
        path, sep, text = item.partition("=")
        keys = [k for k in path.strip().split(".") if k]
        if not sep or not keys:
            raise UsageError(
                f"--set wants PATH=VALUE with a dotted path, got {item!r}",
                hint="e.g. --set gpu.arch=sm_100a --set workload.tp=8",
            )
        node: Any = doc
        for depth, key in enumerate(keys[:-1]):
            if not isinstance(node, dict):
                raise UsageError(f"--set {path}: {'.'.join(keys[:depth])} is not a section")
            if key not in node:
                if keys[0] not in _OPEN_SECTIONS:
                    raise UsageError(
                        f"--set {path}: no field {'.'.join(keys[: depth + 1])}",
                        hint="see registry-schema/fingerprint.schema.json",
                    )
                node[key] = {}
            node = node[key]
        leaf = keys[-1]
        if not isinstance(node, dict) or (leaf not in node and keys[0] not in _OPEN_SECTIONS):
            raise UsageError(
                f"--set {path}: no such field", hint="see registry-schema/fingerprint.schema.json"
            )
        if isinstance(node.get(leaf), dict):
            raise UsageError(f"--set {path}: is a section; set one of its fields")
        node[leaf] = text if keys[0] == "workload" else _parse_value(text)
    return doc
