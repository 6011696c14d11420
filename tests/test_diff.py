"""diff(): which fields differ between two fingerprints, and what that invalidates."""

from __future__ import annotations

import pytest

from artifactd.errors import UsageError
from artifactd.fingerprint.diff import FieldDiff, diff
from artifactd.fingerprint.model import (
    CPUInfo,
    CudaInfo,
    Fingerprint,
    GPUInfo,
    Info,
    LibraryInfo,
    PathsInfo,
    PlatformInfo,
    PythonInfo,
)


@pytest.fixture
def base() -> Fingerprint:
    return Fingerprint(
        gpu=GPUInfo(arch="sm_90a", capability="9.0", name="NVIDIA H200", source="nvml"),
        cuda=CudaInfo(nvcc="12.8.93", ptxas="12.8.93", torch_cuda="cu128"),
        python=PythonInfo(
            implementation="cpython",
            version="3.11",
            cache_tag="cpython-311",
            soabi="cpython-311-x86_64-linux-gnu",
            ext_suffix=".cpython-311-x86_64-linux-gnu.so",
        ),
        platform=PlatformInfo(system="Linux", machine="x86_64", glibc="glibc 2.36"),
        cpu=CPUInfo(isa_level="x86-64-v4", features=("avx512f",)),
        libraries={
            "torch": LibraryInfo(version="2.13.0+cu128", content_hash="a" * 64),
            "triton": LibraryInfo(version="3.7.1", content_hash="b" * 64),
        },
        paths=PathsInfo(site_packages="/opt/venv/lib/python3.11/site-packages"),
        workload={"model": "meta-llama/Llama-3.1-8B", "dtype": "bfloat16"},
        info=Info(hostname="builder-1", probed_at=1.0),
    )


def _verdicts(result: object) -> dict[str, str]:
    return {v.family: v.verdict for v in result.families}  # type: ignore[attr-defined]


def test_workload_change_keeps_every_family(base: Fingerprint) -> None:
    other = base.model_copy(update={"workload": {**base.workload, "model": "Qwen/Qwen3-8B"}})
    result = diff(base, other)
    assert not result.identical
    assert result.a_hash == base.hash
    assert result.b_hash == other.hash
    assert result.fields == [
        FieldDiff(path="workload.model", a="meta-llama/Llama-3.1-8B", b="Qwen/Qwen3-8B")
    ]
    verdicts = _verdicts(result)
    assert {verdicts[f] for f in ("triton", "generic", "inductor", "deepgemm", "tilelang")} == {
        "hit"
    }
    missed = {v.family for v in result.families if v.verdict == "miss"}
    assert missed == {"vllm", "sglang"}  # the engines hash the workload, and only they
    assert all(v.deciding == [] for v in result.families if v.verdict == "hit")


def test_triton_content_hash_change_misses_triton(base: Fingerprint) -> None:
    triton = base.libraries["triton"].model_copy(update={"content_hash": "c" * 64})
    libs = {**base.libraries, "triton": triton}
    other = base.model_copy(update={"libraries": libs})
    result = diff(base, other)
    assert not result.identical
    assert [f.path for f in result.fields] == ["libraries.triton.content_hash"]
    verdicts = {v.family: v for v in result.families}
    assert verdicts["triton"].verdict == "miss"
    assert verdicts["triton"].deciding == [
        FieldDiff(path="libraries.triton.content_hash", a="b" * 64, b="c" * 64)
    ]
    # Inductor keys also hold Triton's version; loose cubins do not care.
    assert verdicts["inductor"].verdict == "miss"
    assert [d.path for d in verdicts["inductor"].deciding] == ["libraries.triton.content_hash"]
    assert verdicts["generic"].verdict == "hit"


def test_identical_fingerprints(base: Fingerprint) -> None:
    elsewhere = base.model_copy(
        update={"info": base.info.model_copy(update={"hostname": "pod-7", "probed_at": 2.0})}
    )
    result = diff(base, elsewhere)
    assert result.identical
    assert result.fields == []
    assert set(_verdicts(result).values()) == {"hit"}
    # Informational fields are reported, never hashed.
    assert {d.path for d in result.informational} == {"info.hostname", "info.probed_at"}


def test_missing_library_is_a_deciding_difference(base: Fingerprint) -> None:
    libs = {k: v for k, v in base.libraries.items() if k != "triton"}
    result = diff(base, base.model_copy(update={"libraries": libs}))
    triton = next(v for v in result.families if v.family == "triton")
    assert triton.verdict == "miss"
    assert {d.path for d in triton.deciding} >= {"libraries.triton.version"}
    assert all(d.b is None for d in triton.deciding)


def test_family_selection(base: Fingerprint) -> None:
    other = base.model_copy(update={"cuda": base.cuda.model_copy(update={"nvcc": "13.0.88"})})
    result = diff(base, other, ["generic"])
    assert [(v.family, v.verdict) for v in result.families] == [("generic", "miss")]
    with pytest.raises(UsageError):
        diff(base, other, ["nope"])
