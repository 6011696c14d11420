"""Fingerprint probing, hashing, scope keys, NVML decoding and CPU ISA detection."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from artifactd.errors import ConfigError, UsageError
from artifactd.families import FAMILIES
from artifactd.fingerprint import probe as probing
from artifactd.fingerprint.model import (
    CompilersInfo,
    CPUInfo,
    CudaInfo,
    DriverInfo,
    Fingerprint,
    GPUInfo,
    Info,
    LibraryInfo,
    PathsInfo,
    PlatformInfo,
    PythonInfo,
    parse_gpu_arch,
)
from artifactd.fingerprint.probe import (
    arch_for_capability,
    gpu_from_nvml,
    probe_cpu,
    probe_fingerprint,
)

# --------------------------------------------------------------------------
# A fixed, synthetic fingerprint (no probing) and helpers to make variants
# --------------------------------------------------------------------------


def make_fingerprint() -> Fingerprint:
    return Fingerprint(
        gpu=GPUInfo(
            arch="sm_90a",
            capability="9.0",
            name="NVIDIA H200",
            sm_count=132,
            mig=False,
            source="nvml",
        ),
        driver=DriverInfo(version="570.133.20", cuda_version="12.8"),
        cuda=CudaInfo(nvcc="12.8.93", ptxas="12.8.93", torch_cuda="cu128"),
        python=PythonInfo(
            implementation="cpython",
            version="3.11",
            cache_tag="cpython-311",
            soabi="cpython-311-x86_64-linux-gnu",
            ext_suffix=".cpython-311-x86_64-linux-gnu.so",
        ),
        platform=PlatformInfo(system="Linux", machine="x86_64", glibc="glibc 2.36"),
        cpu=CPUInfo(isa_level="x86-64-v4", features=("avx512bw", "avx512f")),
        compilers=CompilersInfo(cc="cc (Debian 12.2.0-14+deb12u1) 12.2.0"),
        libraries={
            "torch": LibraryInfo(version="2.13.0+cu128", content_hash="a" * 64),
            "triton": LibraryInfo(version="3.7.1", content_hash="b" * 64),
        },
        paths=PathsInfo(site_packages="/opt/venv/lib/python3.11/site-packages"),
        workload={"model": "meta-llama/Llama-3.1-8B", "dtype": "bfloat16", "tp": "1"},
        info=Info(hostname="builder-1", user="ci", probed_at=1_700_000_000.0),
    )


def with_section(fp: Fingerprint, section: str, **changes: Any) -> Fingerprint:
    """Copy ``fp`` with fields of one nested section (gpu, cuda, cpu...) changed."""
    return fp.model_copy(update={section: getattr(fp, section).model_copy(update=changes)})


def with_library(fp: Fingerprint, name: str, **changes: Any) -> Fingerprint:
    libs = dict(fp.libraries)
    libs[name] = libs[name].model_copy(update=changes)
    return fp.model_copy(update={"libraries": libs})


def with_workload(fp: Fingerprint, **changes: str) -> Fingerprint:
    return fp.model_copy(update={"workload": {**fp.workload, **changes}})


def scope_keys(fp: Fingerprint) -> dict[str, str]:
    return {
        name: fp.scope_key(fam.name, fam.scope, fam.scope_revision)
        for name, fam in FAMILIES.items()
    }


# --------------------------------------------------------------------------
# Declared architectures
# --------------------------------------------------------------------------


def test_probe_with_declared_arch() -> None:
    fp = probe_fingerprint(gpu_arch="sm_90a", use_nvml=False)
    assert fp.gpu.arch == "sm_90a"
    assert fp.gpu.capability == "9.0"
    assert fp.gpu.source == "declared"
    # The probe's own output must round-trip through the public parser.
    assert Fingerprint.from_json(fp.model_dump_json()) == fp


def test_probe_without_gpu_or_declaration_is_absent() -> None:
    fp = probe_fingerprint(use_nvml=False)
    assert fp.gpu.source == "absent"
    assert fp.gpu.arch is None
    assert fp.info.gpu_count == 0


@pytest.mark.parametrize(
    ("arch", "capability"),
    [("sm_80", "8.0"), ("sm_90a", "9.0"), ("sm_100a", "10.0"), ("sm_120f", "12.0")],
)
def test_parse_gpu_arch_accepts_nvcc_spellings(arch: str, capability: str) -> None:
    assert parse_gpu_arch(arch) == (arch, capability)


@pytest.mark.parametrize("junk", ["sm90", "gfx90a", "", "sm_", "sm_9", "compute_90a", "sm_90x"])
def test_parse_gpu_arch_rejects_junk(junk: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_gpu_arch(junk)
    assert repr(junk) in str(err.value)
    assert err.value.hint is not None
    assert "sm_90a" in err.value.hint


def test_probe_rejects_junk_declared_arch() -> None:
    with pytest.raises(UsageError):
        probe_fingerprint(gpu_arch="gfx90a", use_nvml=False)


@pytest.mark.parametrize(
    ("major", "minor", "arch"),
    [(9, 0, "sm_90a"), (8, 0, "sm_80"), (8, 6, "sm_86"), (10, 0, "sm_100a"), (12, 0, "sm_120a")],
)
def test_arch_for_capability(major: int, minor: int, arch: str) -> None:
    assert arch_for_capability(major, minor) == arch


# --------------------------------------------------------------------------
# The hash
# --------------------------------------------------------------------------


def test_hash_ignores_info() -> None:
    fp = make_fingerprint()
    moved = with_section(fp, "info", hostname="another-host", probed_at=1_800_000_000.5, user="x")
    assert moved.info != fp.info
    assert moved.hash == fp.hash
    assert "info" not in fp.hashed_view()


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda fp: with_workload(fp, model="Qwen/Qwen3-8B"), id="workload.model"),
        pytest.param(lambda fp: with_workload(fp, tp="8"), id="workload.tp"),
        pytest.param(
            lambda fp: with_library(fp, "torch", content_hash="c" * 64),
            id="libraries.torch.content_hash",
        ),
        pytest.param(lambda fp: with_section(fp, "driver", version="580.0"), id="driver.version"),
        pytest.param(lambda fp: with_section(fp, "gpu", mig=True), id="gpu.mig"),
        pytest.param(lambda fp: with_section(fp, "image", digest="sha256:" + "d" * 64), id="image"),
    ],
)
def test_hash_changes_with_any_hashed_field(change: Callable[[Fingerprint], Fingerprint]) -> None:
    fp = make_fingerprint()
    assert change(fp).hash != fp.hash


def test_hash_is_stable_across_probes() -> None:
    assert (
        probe_fingerprint(gpu_arch="sm_90a", use_nvml=False).hash
        == probe_fingerprint(gpu_arch="sm_90a", use_nvml=False).hash
    )


# --------------------------------------------------------------------------
# Scope keys: each family depends on only some fields
# --------------------------------------------------------------------------

# The documented scope facts (docs/reference/fingerprint.md): for each change,
# families whose key MUST change and families whose key MUST stay. Families not
# named either way are free (and covered by the docs' table test).
_GPU_FAMILIES = {
    "triton",
    "inductor",
    "generic",
    "deepgemm",
    "tilelang",
    "cutedsl",
    "cuda-jit",
    "flashinfer",
    "vllm",
    "sglang",
}
_KERNEL_FAMILIES = {"triton", "deepgemm", "tilelang", "flashinfer", "generic", "cutedsl"}


@pytest.mark.parametrize(
    ("change", "must_change", "must_keep"),
    [
        pytest.param(
            lambda fp: with_workload(fp, model="Qwen/Qwen3-8B", dtype="fp8", tp="8"),
            {"vllm", "sglang"},
            _KERNEL_FAMILIES | {"inductor", "cuda-jit"},
            id="workload",
        ),
        pytest.param(
            lambda fp: with_library(fp, "triton", content_hash="e" * 64),
            {"triton", "inductor"},
            {"deepgemm", "tilelang", "generic", "cuda-jit"},
            id="libraries.triton.content_hash",
        ),
        pytest.param(
            lambda fp: with_section(fp, "cuda", ptxas="13.0.88"),
            {"triton"},
            {"deepgemm", "tilelang", "inductor", "generic", "cuda-jit"},
            id="cuda.ptxas",
        ),
        pytest.param(
            lambda fp: with_section(fp, "gpu", arch="sm_100a", capability="10.0"),
            _GPU_FAMILIES,
            set(),
            id="gpu.arch",
        ),
        pytest.param(
            lambda fp: with_section(fp, "cpu", isa_level="x86-64-v3"),
            {"inductor"},
            _KERNEL_FAMILIES | {"cuda-jit"},
            id="cpu.isa_level",
        ),
        pytest.param(
            lambda fp: with_section(fp, "paths", site_packages="/usr/lib/python3/dist-packages"),
            {"inductor", "deepgemm", "flashinfer", "vllm", "sglang"},
            {"triton", "tilelang", "generic", "cuda-jit"},
            id="paths.site_packages",
        ),
        pytest.param(
            lambda fp: with_section(fp, "cuda", nvcc="13.0.88"),
            {"generic", "deepgemm", "tilelang", "flashinfer"},
            {"triton", "inductor", "cuda-jit"},
            id="cuda.nvcc",
        ),
        pytest.param(
            lambda fp: with_section(fp, "driver", version="580.65.06", cuda_version="13.0"),
            {"cuda-jit"},
            _KERNEL_FAMILIES | {"inductor", "vllm", "sglang"},
            id="driver",
        ),
        pytest.param(
            lambda fp: with_section(fp, "gpu", sm_count=78),
            {"deepgemm"},
            {"triton", "tilelang", "inductor", "generic", "cuda-jit"},
            id="gpu.sm_count",
        ),
        pytest.param(
            lambda fp: with_section(fp, "gpu", name="NVIDIA H100 80GB HBM3"),
            {"inductor", "cuda-jit"},
            {"triton", "deepgemm", "tilelang", "generic", "flashinfer"},
            id="gpu.name",
        ),
    ],
)
def test_scope_keys(
    change: Callable[[Fingerprint], Fingerprint], must_change: set[str], must_keep: set[str]
) -> None:
    fp = make_fingerprint()
    variant = change(fp)
    assert variant.hash != fp.hash  # every change here is to a hashed field
    before, after = scope_keys(fp), scope_keys(variant)
    assert must_change | must_keep <= set(before), "a named family is not registered"
    changed = {name for name in before if before[name] != after[name]}
    assert must_change <= changed
    assert not must_keep & changed


def test_scope_key_depends_on_family_name_and_revision() -> None:
    fp = make_fingerprint()
    scope = FAMILIES["triton"].scope
    assert fp.scope_key("triton", scope, 1) != fp.scope_key("triton", scope, 2)
    assert fp.scope_key("triton", scope) != fp.scope_key("other", scope)


# --------------------------------------------------------------------------
# select / flatten
# --------------------------------------------------------------------------


def test_select_records_absent_dimensions_as_none() -> None:
    fp = make_fingerprint()
    chosen = fp.select(["libraries.vllm", "libraries.triton", "gpu.arch"])
    assert chosen["libraries.vllm"] is None
    assert chosen["libraries.triton.version"] == "3.7.1"
    assert chosen["libraries.triton.content_hash"] == "b" * 64
    assert "libraries.triton" not in chosen  # present: recorded by its leaves
    assert chosen["gpu.arch"] == "sm_90a"
    assert not any(k.startswith("libraries.torch") for k in chosen)


def test_select_prefix_does_not_match_sibling_names() -> None:
    fp = make_fingerprint()
    libs = {**fp.libraries, "torchvision": LibraryInfo(version="0.28.0")}
    chosen = fp.model_copy(update={"libraries": libs}).select(["libraries.torch"])
    assert chosen
    assert all(k.startswith("libraries.torch.") for k in chosen)


def test_absent_library_changes_the_scope_key() -> None:
    fp = make_fingerprint()
    libs = {k: v for k, v in fp.libraries.items() if k != "triton"}
    without = fp.model_copy(update={"libraries": libs})
    assert without.select(["libraries.triton"]) == {"libraries.triton": None}
    assert scope_keys(without)["triton"] != scope_keys(fp)["triton"]


def test_probed_select_records_uninstalled_vllm_as_none() -> None:
    try:
        metadata.distribution("vllm")
    except metadata.PackageNotFoundError:
        pass
    else:
        pytest.skip("vllm is installed here")
    fp = probe_fingerprint(use_nvml=False)
    assert "vllm" not in fp.libraries
    assert fp.select(["libraries.vllm"]) == {"libraries.vllm": None}


# --------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("{not json", id="invalid-json"),
        pytest.param("", id="empty"),
        pytest.param("[]", id="not-an-object"),
        pytest.param('{"schema_version": 1}', id="missing-required"),
        pytest.param("SCHEMA2", id="wrong-schema-version"),
        pytest.param("EXTRA", id="unknown-field"),
    ],
)
def test_from_json_rejects_invalid_documents(text: str) -> None:
    good = json.loads(make_fingerprint().model_dump_json())
    if text == "SCHEMA2":
        text = json.dumps({**good, "schema_version": 2})
    elif text == "EXTRA":
        text = json.dumps({**good, "gpu": {**good["gpu"], "vendor": "nvidia"}})
    with pytest.raises(ConfigError) as err:
        Fingerprint.from_json(text, source="fp.json")
    assert "fp.json" in str(err.value)
    assert err.value.hint is not None


def test_from_json_round_trips() -> None:
    fp = make_fingerprint()
    back = Fingerprint.from_json(fp.model_dump_json().encode())
    assert back == fp
    assert back.hash == fp.hash


# --------------------------------------------------------------------------
# Probing must not import torch or triton
# --------------------------------------------------------------------------

_NO_HEAVY_IMPORTS = """
import io, json, sys
from contextlib import redirect_stdout
from artifactd.cli import main
out = io.StringIO()
code = None
with redirect_stdout(out):
    try:
        main(["fingerprint", "--json"])  # given argv: main returns (raises SystemExit)
    except SystemExit as exc:
        code = exc.code
doc = json.loads(out.getvalue())
print(json.dumps({
    "code": code,
    "hash": doc["hash"],
    "heavy": sorted(m for m in ("torch", "triton") if m in sys.modules),
}))
"""


def test_fingerprint_cli_does_not_import_torch_or_triton() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _NO_HEAVY_IMPORTS],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["code"] == 0
    assert len(report["hash"]) == 64
    assert report["heavy"] == []


def test_probe_does_not_import_torch_or_triton() -> None:
    script = (
        "import sys, artifactd.fingerprint.probe as f; f.probe_fingerprint(); "
        "print(','.join(m for m in ('torch', 'triton') if m in sys.modules) or 'none')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "none"


# --------------------------------------------------------------------------
# NVML, through a recorded double
# --------------------------------------------------------------------------

# The pynvml functions below, as nvidia-ml-py 13.x (pynvml.py) defines them:
#   nvmlDeviceGetCount()                   -> int (c_uint.value)
#   nvmlSystemGetDriverVersion()           -> str (@convertStrBytes decodes the bytes)
#   nvmlSystemGetCudaDriverVersion_v2()    -> int, e.g. 12080 for CUDA 12.8
#   nvmlDeviceGetHandleByIndex(i)          -> opaque ctypes POINTER(struct_c_nvmlDevice_t)
#   nvmlDeviceGetCudaComputeCapability(h)  -> tuple (major, minor)
#   nvmlDeviceGetName(h)                   -> str (@convertStrBytes)
#   nvmlDeviceGetMigMode(h)                -> list [current, pending]; raises
#                                             NVMLError_NotSupported on non-MIG GPUs
#   nvmlDeviceGetNumGpuCores(h)            -> int: CUDA *cores* (16896 on H100/H200), not SMs
try:
    import pynvml as _real_pynvml

    NVMLNotSupported: type[Exception] = _real_pynvml.NVMLError_NotSupported
except ImportError:  # nvidia-ml-py is an optional extra

    class _NVMLNotSupportedError(Exception):
        """Stand-in for pynvml.NVMLError_NotSupported (NVML_ERROR_NOT_SUPPORTED = 3)."""

        value = 3

        def __str__(self) -> str:
            return "Not Supported"

    NVMLNotSupported = _NVMLNotSupportedError


class _Handle:
    """Opaque device handle, like pynvml's ctypes ``c_nvmlDevice_t``."""

    def __init__(self, index: int) -> None:
        self.index = index


class RecordedNvmlH200:
    """A recorded double of the ``pynvml`` module on an 8x H200 host.

    It stands in for a GPU this machine lacks: each function returns what
    nvidia-ml-py 13.x returns there, in the same Python types (see the comment
    above), and records every call so tests can check how it was used.
    """

    driver_version = "570.133.20"
    cuda_driver_version = 12080
    count = 8

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.handles: list[_Handle] = []

    def nvmlInit(self) -> None:  # noqa: N802 - NVML's own names
        self.calls.append(("nvmlInit", None))

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.calls.append(("nvmlShutdown", None))

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        self.calls.append(("nvmlDeviceGetCount", None))
        return self.count

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:  # noqa: N802
        return self.cuda_driver_version

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:  # noqa: N802
        handle = _Handle(index)
        self.handles.append(handle)
        return handle

    def _check(self, name: str, handle: _Handle) -> None:
        assert handle in self.handles, f"{name} got a handle the double never issued"
        self.calls.append((name, handle.index))

    def nvmlDeviceGetCudaComputeCapability(self, handle: _Handle) -> tuple[int, int]:  # noqa: N802
        self._check("nvmlDeviceGetCudaComputeCapability", handle)
        return (9, 0)

    def nvmlDeviceGetName(self, handle: _Handle) -> str:  # noqa: N802
        self._check("nvmlDeviceGetName", handle)
        return "NVIDIA H200"

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:  # noqa: N802
        self._check("nvmlDeviceGetMigMode", handle)
        return [0, 0]

    def nvmlDeviceGetNumGpuCores(self, handle: _Handle) -> int:  # noqa: N802
        self._check("nvmlDeviceGetNumGpuCores", handle)
        return 16896


class RecordedNvmlNoMig(RecordedNvmlH200):
    """The same host where the MIG query is not supported (NVML_ERROR_NOT_SUPPORTED)."""

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:  # noqa: N802
        self._check("nvmlDeviceGetMigMode", handle)
        raise NVMLNotSupported()


class RecordedNvmlNoDevices(RecordedNvmlH200):
    """A driver with no visible GPU (CUDA_VISIBLE_DEVICES-style empty node)."""

    count = 0


def test_gpu_from_recorded_nvml_h200() -> None:
    nvml = RecordedNvmlH200()
    gpu, driver = gpu_from_nvml(nvml)
    assert gpu["arch"] == "sm_90a"
    assert gpu["capability"] == "9.0"
    assert gpu["name"] == "NVIDIA H200"
    assert gpu["count"] == 8
    assert gpu["mig"] is False
    assert gpu["source"] == "nvml"
    assert driver["version"] == "570.133.20"
    assert driver["cuda_version"] == "12.8"
    # Every per-device query went to the one handle issued, device 0's.
    assert [h.index for h in nvml.handles] == [0]
    per_device = [idx for name, idx in nvml.calls if idx is not None]
    assert per_device
    assert set(per_device) == {0}


def test_gpu_from_nvml_mig_not_supported_is_none() -> None:
    gpu, driver = gpu_from_nvml(RecordedNvmlNoMig())
    assert gpu["mig"] is None
    assert gpu["arch"] == "sm_90a"  # the failure is contained to the one field
    assert driver["version"] == "570.133.20"


def test_gpu_from_nvml_without_devices() -> None:
    gpu, driver = gpu_from_nvml(RecordedNvmlNoDevices())
    assert gpu["source"] == "nvml"
    assert gpu["count"] == 0
    assert gpu["arch"] is None
    assert driver["cuda_version"] == "12.8"


@pytest.mark.parametrize(("raw", "text"), [(13000, "13.0"), (12040, "12.4"), (11080, "11.8")])
def test_cuda_driver_version_decoding(raw: int, text: str) -> None:
    nvml = RecordedNvmlH200()
    nvml.cuda_driver_version = raw
    assert gpu_from_nvml(nvml)[1]["cuda_version"] == text


def test_bytes_from_older_bindings_are_decoded() -> None:
    class OldBindings(RecordedNvmlH200):
        """Bindings before nvidia-ml-py 11.515 returned bytes for strings."""

        def nvmlSystemGetDriverVersion(self) -> bytes:  # type: ignore[override]  # noqa: N802
            return b"535.54.03"

    assert gpu_from_nvml(OldBindings())[1]["version"] == "535.54.03"


def test_sm_count_is_not_the_cuda_core_count() -> None:
    """NVML's GetNumGpuCores counts CUDA cores (16896 on H200), not SMs (132).

    NVML has no SM count, so the NVML part of the probe leaves it unset (the
    driver API fills it in); it must never take the core count instead.
    """
    gpu, _ = gpu_from_nvml(RecordedNvmlH200())
    assert gpu["sm_count"] is None


@pytest.fixture
def driver_present(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Make the probe believe an NVIDIA driver is installed (it checks marker paths)."""
    monkeypatch.setattr(probing, "_DRIVER_MARKERS", (str(tmp_path),), raising=False)


@pytest.mark.usefixtures("driver_present")
def test_probe_reads_nvml_through_the_module(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = RecordedNvmlH200()
    module = types.ModuleType("pynvml")
    for name in dir(nvml):
        if name.startswith("nvml"):
            setattr(module, name, getattr(nvml, name))
    monkeypatch.setitem(sys.modules, "pynvml", module)

    fp = probe_fingerprint()
    assert fp.gpu.source == "nvml"
    assert fp.gpu.arch == "sm_90a"
    assert fp.driver.version == "570.133.20"
    names = [name for name, _ in nvml.calls]
    assert names[0] == "nvmlInit"
    assert names[-1] == "nvmlShutdown"

    # A declared arch overrides NVML's, keeping the NVML source.
    declared = probe_fingerprint(gpu_arch="sm_100a")
    assert declared.gpu.arch == "sm_100a"
    assert declared.gpu.capability == "10.0"
    assert declared.gpu.name == "NVIDIA H200"


@pytest.mark.usefixtures("driver_present")
def test_probe_gpu_nvml_when_nvml_cannot_load_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("pynvml")

    def init() -> None:
        raise RuntimeError("NVML Shared Library Not Found")

    module.nvmlInit = init  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", module)
    assert probing.probe_gpu_nvml() is None


# --------------------------------------------------------------------------
# CPU ISA from recorded /proc/cpuinfo text
# --------------------------------------------------------------------------

# Recorded from a Sapphire Rapids VM (trimmed to the fields probe_cpu reads).
CPUINFO_AVX512 = """\
processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush \
mmx fxsr sse sse2 ss ht syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology \
cpuid pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt aes xsave avx f16c \
rdrand hypervisor lahf_lm abm 3dnowprefetch fsgsbase bmi1 avx2 smep bmi2 erms invpcid avx512f \
avx512dq rdseed adx smap avx512ifma clflushopt clwb avx512cd sha_ni avx512bw avx512vl xsaveopt \
avx_vnni avx512_bf16 avx512vbmi umip pku avx512_vbmi2 gfni vaes avx512_vnni avx512_bitalg \
avx512_vpopcntdq amx_bf16 avx512_fp16 amx_tile amx_int8

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse sse2
"""

# Recorded from an AMD EPYC 7003 (Zen 3) host: AVX2, no AVX-512.
CPUINFO_AVX2 = """\
processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7763 64-Core Processor
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush \
mmx fxsr sse sse2 ht syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl \
cpuid pni pclmulqdq ssse3 fma cx16 sse4_1 sse4_2 movbe popcnt aes xsave avx f16c rdrand \
lahf_lm cmp_legacy cr8_legacy abm sse4a misalignsse 3dnowprefetch bmi1 avx2 smep bmi2 erms \
invpcid rdseed adx smap clflushopt clwb sha_ni xsaveopt xsavec xgetbv1 xsaves vaes vpclmulqdq
"""

# Recorded from a Grace (Neoverse V2) host.
CPUINFO_AARCH64 = """\
processor\t: 0
BogoMIPS\t: 2000.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm \
jscvt fcma lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs sb \
paca pacg dcpodp sve2 sveaes svepmull svebitperm svesha3 svesm4 flagm2 frint svei8mm svebf16 \
i8mm bf16 dgh bti
CPU implementer\t: 0x41
CPU part\t: 0xd4f
"""


def test_probe_cpu_avx512() -> None:
    cpu, model = probe_cpu(CPUINFO_AVX512, machine="x86_64")
    assert cpu["isa_level"] == "x86-64-v4"
    assert "avx512f" in cpu["features"]
    assert "amx_tile" in cpu["features"]
    assert "avx2" not in cpu["features"]  # only codegen-relevant extensions are listed
    assert list(cpu["features"]) == sorted(cpu["features"])
    assert model == "Intel(R) Xeon(R) Platinum 8480+"


def test_probe_cpu_avx2_only() -> None:
    cpu, model = probe_cpu(CPUINFO_AVX2, machine="x86_64")
    assert cpu["isa_level"] == "x86-64-v3"
    assert not any(f.startswith("avx512") for f in cpu["features"])
    assert model == "AMD EPYC 7763 64-Core Processor"


def test_probe_cpu_baseline_x86() -> None:
    cpu, _ = probe_cpu("flags\t: fpu sse sse2\n", machine="x86_64")
    assert cpu["isa_level"] == "x86-64"
    assert cpu["features"] == []


def test_probe_cpu_aarch64() -> None:
    cpu, model = probe_cpu(CPUINFO_AARCH64, machine="aarch64")
    assert cpu["isa_level"] == "aarch64"
    assert {"sve", "sve2", "asimd", "bf16", "i8mm"} <= set(cpu["features"])
    assert model is None
