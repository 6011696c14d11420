"""The compatibility fingerprint: a typed, canonical description of an environment.

A fingerprint answers "would a compile cache built there be valid here?". It is
a frozen pydantic model; its hash is the sha256 of its canonical JSON with the
informational section (``info``: hostname, probe time) left out, so two probes
of the same environment always hash the same.

Each cache family depends on only some of its fields, named by dotted paths
(``gpu.arch``, ``libraries.triton``); :meth:`Fingerprint.scope_key` hashes just
those, so a model or TP change still restores the Triton kernels.

Probing never imports torch or any engine: versions come from
``importlib.metadata``, content hashes from each distribution's ``RECORD``,
GPU facts from NVML when ``nvidia-ml-py`` and a driver are present.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import platform
import re
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from artifactd import __version__
from artifactd.constants import current_environ
from artifactd.errors import ConfigError, UsageError
from artifactd.hashing import canonical_hash, sha256_hex

SCHEMA_VERSION: Literal[1] = 1

#: Distributions whose version and content hash enter the fingerprint.
TRACKED_LIBRARIES = (
    "torch",
    "triton",
    "vllm",
    "sglang",
    "deep_gemm",
    "tilelang",
    "flashinfer-python",
    "nvidia-cutlass-dsl",
)


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GPUInfo(_Model):
    """The GPU the caches target: read from NVML, or declared for GPU-less builds."""

    arch: str | None = Field(None, description="Compile target, e.g. sm_90a.")
    capability: str | None = Field(None, description="Compute capability, e.g. 9.0.")
    name: str | None = Field(None, description="Device name as NVML reports it.")
    count: int = Field(0, description="Visible GPUs.")
    sm_count: int | None = Field(None, description="Streaming multiprocessors per GPU.")
    mig: bool | None = Field(None, description="MIG mode enabled.")
    source: Literal["nvml", "declared", "absent"] = "absent"


class DriverInfo(_Model):
    """The NVIDIA kernel driver, or ``None`` fields when there is none."""

    version: str | None = None
    cuda_version: str | None = Field(None, description="Highest CUDA version the driver supports.")


class CudaInfo(_Model):
    """CUDA toolchains that compile kernels at run time."""

    nvcc: str | None = Field(None, description="nvcc release, e.g. 13.0.88.")
    ptxas: str | None = Field(None, description="Release of the ptxas bundled with Triton.")
    torch_cuda: str | None = Field(None, description="CUDA local version of torch (cu130, cpu).")


class PythonInfo(_Model):
    """The interpreter ABI that compiled extension modules are bound to."""

    implementation: str
    version: str
    cache_tag: str | None
    soabi: str | None
    ext_suffix: str | None


class PlatformInfo(_Model):
    """Operating system, machine and C library."""

    system: str
    machine: str
    glibc: str | None


class CPUInfo(_Model):
    """Host CPU ISA: Inductor's CPU kernels are built with ``-march=native``."""

    isa_level: str | None = Field(None, description="x86-64 micro-architecture level or arch.")
    features: tuple[str, ...] = Field((), description="ISA extensions that change codegen.")


class CompilersInfo(_Model):
    """Host compilers that JIT paths call (Triton launcher, Inductor C++)."""

    cc: str | None = Field(None, description="First line of `cc --version`.")


class LibraryInfo(_Model):
    """One installed distribution: its version and a content hash of its files."""

    version: str
    content_hash: str | None = Field(None, description="sha256 of the dist's RECORD.")
    source_install: bool = Field(False, description="Installed from a local tree or VCS.")


class PathsInfo(_Model):
    """Absolute paths that other keys bake in (include flags, traced sources)."""

    site_packages: str | None = None


class ImageInfo(_Model):
    """The runtime image the caches were built in."""

    digest: str | None = None


class Info(_Model):
    """Informational fields: shown, never hashed."""

    hostname: str | None = None
    user: str | None = None
    probed_at: float | None = None
    cpu_model: str | None = None
    artifactd_version: str = __version__


class Fingerprint(_Model):
    """A canonical description of the environment a cache was built in."""

    schema_version: Literal[1] = SCHEMA_VERSION
    gpu: GPUInfo = GPUInfo()
    driver: DriverInfo = DriverInfo()
    cuda: CudaInfo = CudaInfo()
    python: PythonInfo
    platform: PlatformInfo
    cpu: CPUInfo = CPUInfo()
    compilers: CompilersInfo = CompilersInfo()
    libraries: dict[str, LibraryInfo] = Field(default_factory=dict)
    paths: PathsInfo = PathsInfo()
    image: ImageInfo = ImageInfo()
    workload: dict[str, str] = Field(
        default_factory=dict, description="Model id, revision, dtype, TP... from the matrix."
    )
    info: Info = Info()

    def hashed_view(self) -> dict[str, Any]:
        """Return the JSON data that enters the hash (everything but ``info``)."""
        return self.model_dump(mode="json", exclude={"info"})

    @property
    def hash(self) -> str:
        """The sha256 of the canonical JSON of :meth:`hashed_view`."""
        return canonical_hash(self.hashed_view())

    def flatten(self) -> dict[str, Any]:
        """Return hashed fields as ``{"dotted.path": value}`` leaves."""
        return flatten(self.hashed_view())

    def select(self, dimensions: Sequence[str]) -> dict[str, Any]:
        """Return the leaves under each dotted prefix in ``dimensions``."""
        flat = self.flatten()
        chosen: dict[str, Any] = {}
        for dim in dimensions:
            for key, value in flat.items():
                if key == dim or key.startswith(dim + "."):
                    chosen[key] = value
            if dim not in chosen and not any(k.startswith(dim + ".") for k in chosen):
                # Record absence explicitly: "no torch" must differ from "torch X".
                chosen.setdefault(dim, None)
        return chosen

    def scope_key(self, family: str, dimensions: Sequence[str], revision: int = 1) -> str:
        """Hash of the fields one family's validity depends on, and nothing else."""
        return canonical_hash(
            {"family": family, "revision": revision, "scope": self.select(dimensions)}
        )

    @classmethod
    def from_json(cls, text: str | bytes, *, source: str = "fingerprint") -> Fingerprint:
        """Parse a fingerprint document, raising :class:`ConfigError` when invalid."""
        try:
            return cls.model_validate_json(text)
        except ValidationError as exc:
            raise ConfigError(
                f"{source} is not a valid artifactd fingerprint: {exc.error_count()} error(s); "
                f"first: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}",
                hint="produce one with `artifactd fingerprint --json`",
            ) from exc


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


# --------------------------------------------------------------------------
# Probing
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


def _run_version(argv: list[str]) -> str | None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


_RELEASE_RE = re.compile(r"release [\d.]+, V([\d.]+)")


def _cuda_release(text: str | None) -> str | None:
    if not text:
        return None
    m = _RELEASE_RE.search(text)
    return m.group(1) if m else None


def _distribution(name: str) -> metadata.Distribution | None:
    try:
        return metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None


def _library(dist: metadata.Distribution) -> LibraryInfo:
    record = dist.read_text("RECORD")
    direct_url = dist.read_text("direct_url.json") or ""
    return LibraryInfo(
        version=dist.version,
        content_hash=sha256_hex(record.encode()) if record else None,
        source_install='"dir_info"' in direct_url or '"vcs_info"' in direct_url,
    )


_X86_LEVELS: tuple[tuple[str, frozenset[str]], ...] = (
    ("x86-64-v4", frozenset({"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"})),
    ("x86-64-v3", frozenset({"avx2", "bmi1", "bmi2", "fma", "movbe", "f16c", "abm"})),
    ("x86-64-v2", frozenset({"sse4_2", "popcnt", "ssse3", "cx16", "sse4_1"})),
)
_NOTABLE = re.compile(r"^(avx512\w*|amx\w*|avx_vnni\w*|avx10\w*|sve\w*|sve2|asimd\w*|bf16|i8mm)$")


def probe_cpu(cpuinfo: str | None = None, machine: str | None = None) -> tuple[CPUInfo, str | None]:
    """Return the CPU ISA level and the extensions that change generated code."""
    machine = machine or platform.machine()
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
    features = tuple(sorted(f for f in flags if _NOTABLE.match(f)))
    return CPUInfo(isa_level=level, features=features), model


def _proc_driver_version(path: Path = Path("/proc/driver/nvidia/version")) -> str | None:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    m = re.search(r"Kernel Module(?:\s+for\s+\S+)?\s+([\d.]+)", text)
    return m.group(1) if m else None


def probe_gpu_nvml() -> tuple[GPUInfo, DriverInfo] | None:
    """Read GPU and driver facts from NVML; ``None`` without nvidia-ml-py or a driver."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        return gpu_from_nvml(pynvml)
    finally:
        with contextlib.suppress(Exception):  # a failed shutdown changes nothing we report
            pynvml.nvmlShutdown()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def gpu_from_nvml(nvml: Any) -> tuple[GPUInfo, DriverInfo]:
    """Build GPU and driver info from an initialised NVML module (or a recorded double)."""
    count = int(nvml.nvmlDeviceGetCount())
    driver = DriverInfo(version=_text(nvml.nvmlSystemGetDriverVersion()))
    try:
        cuda_v = int(nvml.nvmlSystemGetCudaDriverVersion_v2())
        cuda_version = f"{cuda_v // 1000}.{cuda_v % 1000 // 10}"
        driver = driver.model_copy(update={"cuda_version": cuda_version})
    except Exception:  # noqa: S110 - older drivers lack the call; the field stays None
        pass
    if count == 0:
        return GPUInfo(source="nvml", count=0), driver
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
    mig: bool | None
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        mig = bool(current)
    except Exception:
        mig = None
    sm_count: int | None
    try:
        sm_count = int(nvml.nvmlDeviceGetNumGpuCores(handle)) or None
    except Exception:
        sm_count = None
    gpu = GPUInfo(
        arch=arch_for_capability(int(major), int(minor)),
        capability=f"{int(major)}.{int(minor)}",
        name=_text(nvml.nvmlDeviceGetName(handle)),
        count=count,
        sm_count=sm_count,
        mig=mig,
        source="nvml",
    )
    return gpu, driver


def probe(
    *,
    gpu_arch: str | None = None,
    image_digest: str | None = None,
    workload: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
    use_nvml: bool = True,
) -> Fingerprint:
    """Probe this machine and return its fingerprint.

    ``gpu_arch`` declares the target for builds without a GPU (``sm_90a``); when
    given, it overrides what NVML reports for the architecture. Nothing heavy is
    imported: torch and Triton are found through their distribution metadata.
    """
    environ = current_environ() if environ is None else environ
    dists = {name: _distribution(name) for name in TRACKED_LIBRARIES}
    triton = dists.get("triton")
    ptxas_path = environ.get("TRITON_PTXAS_PATH") or (
        str(triton.locate_file("triton/backends/nvidia/bin/ptxas")) if triton else None
    )
    with ThreadPoolExecutor(max_workers=4) as pool:
        nvcc_f = pool.submit(_run_version, ["nvcc", "--version"])
        ptxas_f = pool.submit(_run_version, [ptxas_path, "--version"]) if ptxas_path else None
        cc_f = pool.submit(_run_version, [environ.get("CC", "cc"), "--version"])
        nvml_f = pool.submit(probe_gpu_nvml) if use_nvml else None
        libraries = {name: _library(dist) for name, dist in dists.items() if dist is not None}
        cpu, cpu_model = probe_cpu()
        nvml = nvml_f.result() if nvml_f else None
        nvcc = _cuda_release(nvcc_f.result())
        ptxas = _cuda_release(ptxas_f.result()) if ptxas_f else None
        cc_out = cc_f.result()

    if nvml is not None:
        gpu, driver = nvml
    else:
        gpu, driver = GPUInfo(), DriverInfo(version=_proc_driver_version())
    if gpu_arch:
        arch, capability = parse_gpu_arch(gpu_arch)
        gpu = gpu.model_copy(
            update={
                "arch": arch,
                "capability": capability,
                "source": gpu.source if gpu.source == "nvml" else "declared",
            }
        )

    torch = dists.get("torch")
    torch_cuda = None
    if torch is not None and "+" in torch.version:
        torch_cuda = torch.version.split("+", 1)[1]
    site = str(torch.locate_file("")) if torch is not None else sysconfig.get_paths()["purelib"]
    glibc = os.confstr("CS_GNU_LIBC_VERSION") if hasattr(os, "confstr") else None

    return Fingerprint(
        gpu=gpu,
        driver=driver,
        cuda=CudaInfo(nvcc=nvcc, ptxas=ptxas, torch_cuda=torch_cuda),
        python=PythonInfo(
            implementation=sys.implementation.name,
            version=f"{sys.version_info.major}.{sys.version_info.minor}",
            cache_tag=sys.implementation.cache_tag,
            soabi=sysconfig.get_config_var("SOABI"),
            ext_suffix=sysconfig.get_config_var("EXT_SUFFIX"),
        ),
        platform=PlatformInfo(system=platform.system(), machine=platform.machine(), glibc=glibc),
        cpu=cpu,
        compilers=CompilersInfo(cc=cc_out.splitlines()[0].strip() if cc_out else None),
        libraries=libraries,
        paths=PathsInfo(site_packages=os.path.realpath(site)),
        image=ImageInfo(digest=image_digest or None),
        workload=dict(workload or {}),
        info=Info(
            hostname=socket.gethostname(),
            user=_user(),
            probed_at=round(time.time(), 3),
            cpu_model=cpu_model,
        ),
    )


def _user() -> str | None:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return None


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
