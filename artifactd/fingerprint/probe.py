"""Probe the local environment into a plain fingerprint document, fast.

This module imports nothing heavy (no pydantic, no torch, no engine): a no-op
restore in an init container probes, hashes and compares without building a
single model. :func:`probe_raw` returns exactly the JSON shape of
:class:`artifactd.fingerprint.model.Fingerprint` (every field present), so
``raw_hash(probe_raw())`` equals ``Fingerprint.model_validate(raw).hash``; a
test keeps the two in step. :class:`PendingProbe` (and :func:`start_request`)
start the slow part, subprocesses and NVML (on a thread), and answer later, so
a command can import what it needs meanwhile.

The hash, the scope keys and the parsing of what a command states about
the document (``--workload``, ``--set``, ``--gpu-arch``) are
:mod:`artifactd.fingerprint.key`'s.

Where each fact comes from:

* GPU and driver: NVML (``nvidia-ml-py``) when a driver is present, else
  ``/proc/driver/nvidia/version``; a declared ``--gpu-arch`` for GPU-less builds.
* Library versions and content hashes: ``<name>-<version>.dist-info`` and the
  sha256 of its ``RECORD`` (torch and Triton hash their own files into keys),
  kept in the :mod:`probe cache <artifactd.fingerprint.probecache>` while the file is unchanged.
* Toolchains: ``nvcc --version`` (the nvcc the JIT libraries run:
  ``$CUDA_HOME/bin/nvcc`` first, :func:`~artifactd.fingerprint.tools.nvcc_path`),
  Triton's bundled ``ptxas --version``, ``cc --version``, run concurrently;
  each output is kept in the probe cache by the binary's identity
  (:class:`~artifactd.fingerprint.tools.Version`), so a warm start runs none.
* Python ABI, platform, glibc, CPU ISA level (Inductor compiles with ``-march=native``).
"""

from __future__ import annotations

import os
import pwd
import sys
import time

from artifactd import __version__
from artifactd.constants import CC, CUDA_HOME, CUDA_PATH, TRITON_PTXAS_PATH, current_environ
from artifactd.fingerprint.key import (
    apply_overrides,
    parse_gpu_arch,
    parse_image_digest,
    parse_pairs,
)
from artifactd.fingerprint.probecache import ProbeCache, default_path
from artifactd.fingerprint.tools import (
    COMPILER_NAMES,
    Version,
    compiler_identity,
    cuda_release,
    nvcc_path,
)
from artifactd.hashing import sha256_hex
from artifactd.records import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    import threading
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any

    from artifactd.fingerprint.key import Raw
    from artifactd.fingerprint.model import Fingerprint

#: Distributions whose version and content hash enter the fingerprint.
TRACKED_LIBRARIES = (
    "torch",
    "triton",
    "vllm",
    "sglang",
    "deep_gemm",
    "sgl-deep-gemm",
    "tilelang",
    "flashinfer-python",
    "flashinfer-cubin",
    "flashinfer-jit-cache",
    "nvidia-cutlass-dsl",
)

#: The variables the probe reads, and the field each one decides (artifactd.build.published).
PROBED_ENV = {
    CC: "compilers.cc",
    TRITON_PTXAS_PATH: "cuda.ptxas",
    CUDA_HOME: "cuda.nvcc",
    CUDA_PATH: "cuda.nvcc",
}

#: Present wherever the NVIDIA kernel driver is (hosts, and GPU containers).
_DRIVER_MARKERS = ("/dev/nvidiactl", "/proc/driver/nvidia/version")


# --------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------


def arch_for_capability(major: int, minor: int) -> str:
    """Return the compile target Triton uses: ``sm_XYa`` from capability 9.0 on."""
    suffix = "a" if major >= 9 else ""
    return f"sm_{major}{minor}{suffix}"


def empty_gpu() -> Raw:
    """Return the GPU readings of a machine without a GPU (``count`` goes to ``info``)."""
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
        # lazy: ctypes only on a host with an NVIDIA driver (artifactd/cli/fast.py's GPU list)
        import ctypes  # noqa: PLC0415

        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError:
            return out
    import ctypes  # noqa: PLC0415  # lazy: as above

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


def has_nvidia_driver() -> bool:
    """Whether this host has an NVIDIA kernel driver (else NVML has nothing to say)."""
    return any(os.path.exists(p) for p in _DRIVER_MARKERS)


def probe_gpu_nvml() -> tuple[Raw, Raw, str | None] | None:
    """Read GPU, driver and topology facts from NVML (+ libcuda for the SM count).

    ``None`` without nvidia-ml-py or a driver.
    """
    if not has_nvidia_driver():
        return None  # skip importing and loading NVML
    try:
        # lazy: nvidia-ml-py is optional (the gpu extra), read only on a host with an NVIDIA driver
        import pynvml  # noqa: PLC0415
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
        try:  # noqa: SIM105 - contextlib is off a pod start's modules (cli/fast.py FLOOR)
            pynvml.nvmlShutdown()
        except Exception:  # noqa: S110 - a failed shutdown changes nothing we report
            pass
    if gpu["count"]:
        gpu["sm_count"] = probe_libcuda()["sm_count"]
    return gpu, driver, topology


def proc_driver_version(path: str | os.PathLike[str] = _DRIVER_MARKERS[1]) -> str | None:
    """Read the kernel module version from ``/proc`` (no NVML needed)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    import re  # noqa: PLC0415  # lazy: a host with a driver only (re is off the first modules)

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
#: CPU flags that change generated code: these, and any flag that starts with a prefix
#: of :data:`_NOTABLE_PREFIXES` followed by word characters only.
_NOTABLE = frozenset({"bf16", "i8mm"})
_NOTABLE_PREFIXES = ("avx512", "amx", "avx_vnni", "avx10", "sve", "asimd")


def notable_flag(flag: str) -> bool:
    """Whether a CPU flag is one the fingerprint lists (``avx512*``, ``amx*``, ``sve*``...)."""
    if flag in _NOTABLE:
        return True
    prefix = next((p for p in _NOTABLE_PREFIXES if flag.startswith(p)), None)
    return prefix is not None and all(c == "_" or c.isalnum() for c in flag[len(prefix) :])


def probe_cpu(cpuinfo: str | None = None, machine: str | None = None) -> tuple[Raw, str | None]:
    """Return the CPU section (ISA level, codegen-relevant extensions) and the model name."""
    machine = machine or os.uname().machine
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo = f.read()
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
    features = sorted(f for f in flags if notable_flag(f))
    return {"isa_level": level, "features": features}, model


# --------------------------------------------------------------------------
# Libraries and toolchains
# --------------------------------------------------------------------------


class InstalledDist(Record):
    """An installed distribution found by its ``*.dist-info`` directory.

    A record, not a dataclass: ``dataclasses`` imports ``inspect``, which
    would add a third of a bare Python start to every ``fingerprint``.
    """

    name: str
    version: str
    dist_info: str

    @property
    def location(self) -> str:
        """The directory the distribution is installed into (site-packages)."""
        return os.path.dirname(self.dist_info)

    def read_text(self, name: str) -> str | None:
        """Return a metadata file's text, or None when absent."""
        try:
            with open(os.path.join(self.dist_info, name), encoding="utf-8") as f:
                return f.read()
        except OSError:
            return None


def _normalize(name: str) -> str:
    """Return a distribution's name as PEP 503 compares it (``-``, ``_``, ``.`` runs: one ``_``)."""
    name = name.replace("-", "_").replace(".", "_")
    while "__" in name:
        name = name.replace("__", "_")
    return name.lower()


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
                found[original] = InstalledDist(original, version, os.path.join(entry or ".", item))
    return found


def record_digest(path: str | os.PathLike[str]) -> str | None:
    """Return the sha256 of a ``RECORD``'s text; None when it is missing, unreadable or empty.

    The text is the file decoded as UTF-8 with universal newlines, encoded again.
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if data.isascii():
        # ASCII decodes to itself, and universal newlines turn CRLF and a lone CR
        # into LF: the same text, made from the bytes without decoding them (a
        # third of the time for torch's 1.5 MB; wheels write RECORD with CRLF).
        if b"\r" in data:
            if data.count(b"\r") == data.count(b"\r\n"):
                # Every CR ends a CRLF: dropping them is the same text, and one
                # pass (1.1 ms for a 1.7 MB RECORD, against 3.2 for two replaces).
                data = data.translate(None, b"\r")
            else:
                data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        return sha256_hex(data) if data else None
    # The text with universal newlines, as reading the file as text gives it (and
    # as that read did, a RECORD that is not UTF-8 raises UnicodeDecodeError).
    record = data.decode().replace("\r\n", "\n").replace("\r", "\n")
    return sha256_hex(record.encode()) if record else None


def library_info(dist: InstalledDist, cache: ProbeCache | None = None) -> Raw:
    """Version, RECORD hash (a cheap content proxy) and whether it is a source install.

    ``cache`` reuses the RECORD's digest while the file is unchanged.
    """
    record = os.path.join(dist.dist_info, "RECORD")
    direct_url = dist.read_text("direct_url.json") or ""
    return {
        "version": dist.version,
        "content_hash": (cache or ProbeCache(None)).digest(record, record_digest),
        "source_install": '"dir_info"' in direct_url or '"vcs_info"' in direct_url,
    }


class _Background:
    """Run a few probes on threads; collect their results."""

    def __init__(self) -> None:
        self._threads: list[threading.Thread] = []
        self._results: dict[str, Any] = {}
        self._errors: list[BaseException] = []

    def start(self, name: str, fn: Callable[[], Any]) -> None:
        # lazy: no thread, nor threading, on a CPU host: only the NVML probe runs on one
        import threading  # noqa: PLC0415

        def run() -> None:
            try:
                self._results[name] = fn()
            except BaseException as exc:  # raised by results(), on the caller's thread
                self._errors.append(exc)

        thread = threading.Thread(target=run, name=f"probe-{name}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def results(self) -> dict[str, Any]:
        for thread in self._threads:
            thread.join()
        if self._errors:
            raise self._errors[0]
        return self._results


def _user() -> str | None:
    # The account's name, as the passwd database gives it for this uid (getpass
    # would read LOGNAME and USER first, and load termios to do it).

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # an arbitrary uid (OpenShift) has no passwd entry
        return None


def probe_raw(
    *,
    gpu_arch: str | None = None,
    image_digest: str | None = None,
    workload: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
    use_nvml: bool = True,
    cache: ProbeCache | None = None,
) -> Raw:
    """Probe this machine; return the fingerprint document as plain JSON data.

    ``gpu_arch`` declares the target for builds without a GPU (``sm_90a``); it
    overrides the architecture NVML reports. ``cache`` holds the RECORD digests
    of earlier probes (default: the one :func:`~artifactd.fingerprint.probecache.default_path`
    names for ``environ``); it changes how fast the answer comes, never the answer.
    """
    return PendingProbe(
        gpu_arch=gpu_arch,
        image_digest=image_digest,
        workload=workload,
        environ=environ,
        use_nvml=use_nvml,
        cache=cache,
    ).result()


def probe_fingerprint(
    *,
    gpu_arch: str | None = None,
    image_digest: str | None = None,
    workload: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
    use_nvml: bool = True,
    overrides: Sequence[str] = (),
) -> Fingerprint:
    """Probe this machine and return its typed fingerprint (see :func:`probe_raw`).

    ``overrides`` are ``PATH=VALUE`` assignments (``--set``) applied to the probed
    document before validation.
    """
    # lazy: the model (pydantic) stays off the fast path, which probes untyped
    from artifactd.fingerprint.model import from_raw  # noqa: PLC0415

    raw = probe_raw(
        gpu_arch=gpu_arch,
        image_digest=image_digest,
        workload=workload,
        environ=environ,
        use_nvml=use_nvml,
    )
    return from_raw(apply_overrides(raw, overrides) if overrides else raw)


class PendingProbe:
    """A probe under way: the toolchains and NVML answer while the caller does other work.

    Creating one checks the arguments (a bad ``gpu_arch`` raises here, before
    any work) and starts the slow part: the ``nvcc``, ``ptxas`` and ``cc``
    subprocesses (those the probe cache does not answer), and the NVML query
    on a thread. :meth:`result` does the rest and
    returns the document :func:`probe_raw` returns. A restore imports its own
    modules in between, so the two overlap. Arguments as :func:`probe_raw`'s;
    ``overrides`` are applied as :func:`probe_request` applies them.
    """

    def __init__(
        self,
        *,
        gpu_arch: str | None = None,
        image_digest: str | None = None,
        workload: Mapping[str, str] | None = None,
        environ: Mapping[str, str] | None = None,
        use_nvml: bool = True,
        cache: ProbeCache | None = None,
        overrides: Sequence[str] = (),
    ) -> None:
        environ = current_environ() if environ is None else environ
        self._arch = parse_gpu_arch(gpu_arch) if gpu_arch else None  # fails before any work
        self._image_digest = parse_image_digest(image_digest) if image_digest else None
        self._workload = dict(workload or {})
        self._cache = ProbeCache(default_path(environ)) if cache is None else cache
        self._overrides = list(overrides)
        self._dists = find_distributions(TRACKED_LIBRARIES)
        self._raw: Raw | None = None
        triton = self._dists.get("triton")
        ptxas_path = environ.get(TRITON_PTXAS_PATH) or (
            os.path.join(triton.location, "triton", "backends", "nvidia", "bin", "ptxas")
            if triton
            else None
        )
        self._tools = {"nvcc": Version(nvcc_path(environ), self._cache, ("nvcc",))}
        if ptxas_path:
            self._tools["ptxas"] = Version(ptxas_path, self._cache, ("ptxas",))
        self._cc = environ.get(CC, "cc")
        self._tools["cc"] = Version(self._cc, self._cache, COMPILER_NAMES)
        self._bg = _Background()
        if use_nvml and has_nvidia_driver():  # no thread on a CPU host
            self._bg.start("nvml", probe_gpu_nvml)

    def result(self) -> Raw:
        """Wait for the probe and return its document (the same one on every call)."""
        if self._raw is None:
            raw = self._finish()
            if self._overrides:
                # The one use of the typed model here: only overrides need its coercion
                # (lazy: pydantic stays off the fast path).
                from artifactd.fingerprint.model import from_raw  # noqa: PLC0415

                raw = from_raw(apply_overrides(raw, self._overrides)).model_dump(mode="json")
            self._raw = raw
        return self._raw

    def _finish(self) -> Raw:
        # lazy: imported as the probe finishes, so its load (about 7 ms) overlaps the tools'
        # subprocesses
        import sysconfig  # noqa: PLC0415

        dists = self._dists
        libraries = {name: library_info(d, self._cache) for name, d in sorted(dists.items())}
        cpu, cpu_model = probe_cpu()
        found = self._bg.results() | {name: t.output() for name, t in self._tools.items()}
        self._cache.save()

        nvml = found.get("nvml")
        topology = None
        if nvml is not None:
            gpu, driver, topology = nvml
        else:
            gpu, driver = empty_gpu(), {"version": proc_driver_version(), "cuda_version": None}
            if driver["version"] is not None:  # a driver without NVML bindings: ask libcuda
                driver["cuda_version"] = probe_libcuda(init=False)["cuda_version"]
        if self._arch:
            gpu.update(
                arch=self._arch[0],
                capability=self._arch[1],
                source="nvml" if gpu["source"] == "nvml" else "declared",
            )

        gpu_count = gpu.pop("count")  # information, never key: see artifactd.build.published
        torch = dists.get("torch")
        torch_cuda = torch.version.split("+", 1)[1] if torch and "+" in torch.version else None
        site = torch.location if torch is not None else sysconfig.get_paths()["purelib"]
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
            "compilers": {"cc": compiler_identity(self._cc, cc_out)},
            "libraries": libraries,
            "paths": {"site_packages": os.path.realpath(site)},
            "image": {"digest": self._image_digest or None},
            "workload": self._workload,
            "info": {
                "hostname": uname.nodename,
                "user": _user(),
                "probed_at": round(time.time(), 3),
                "cpu_model": cpu_model,
                "topology": topology,
                "gpu_count": gpu_count,
                "artifactd_version": __version__,
            },
        }


def start_request(
    *,
    gpu_arch: str | None = None,
    image_digest: str | None = None,
    workload: Sequence[str] = (),
    overrides: Sequence[str] = (),
) -> PendingProbe:
    """Start :func:`probe_request`'s probe and return it under way (see :class:`PendingProbe`).

    Bad ``gpu_arch`` or ``workload`` raise here; bad ``overrides`` at ``result()``.
    """
    return PendingProbe(
        gpu_arch=gpu_arch,
        image_digest=image_digest,
        workload=parse_pairs(workload, what="--workload"),
        overrides=overrides,
    )


def probe_request(
    *,
    gpu_arch: str | None = None,
    image_digest: str | None = None,
    workload: Sequence[str] = (),
    overrides: Sequence[str] = (),
) -> Raw:
    """Probe this machine as a command asks: flags in, the fingerprint document out.

    ``workload`` holds ``KEY=VALUE`` strings (``--workload``, repeatable or
    comma-separated); ``overrides`` holds ``PATH=VALUE`` assignments (``--set``).
    Without overrides the probe's plain document is returned as is: no model
    is built, which keeps a no-op restore fast. With them, the overridden
    document is validated by :class:`~artifactd.fingerprint.model.Fingerprint` and
    dumped back, so a value like ``"8"`` becomes the number the schema wants
    and the document hashes as the typed model does; an invalid value raises
    :class:`UsageError`.
    """
    return start_request(
        gpu_arch=gpu_arch, image_digest=image_digest, workload=workload, overrides=overrides
    ).result()
