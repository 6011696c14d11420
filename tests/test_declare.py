"""to_match(): which flags declare an artifact's fields on this machine, and which no flag may.

The rule behind a restore miss's hint (and the demo's printed command): only
the declared fields (``--gpu-arch`` without a GPU, ``--workload``,
``--image-digest``) may be set by a flag; a probed field that differs means
the artifact is not for this machine, and the hint says so instead of
offering a flag that would force a wrong hit.
"""

from __future__ import annotations

import pytest
import test_diff

from artifactd.fingerprint.declare import to_match
from artifactd.fingerprint.model import Fingerprint, GPUInfo, ImageInfo, LibraryInfo

base = test_diff.base  # the same fingerprint fixture


def _cpu(fp: Fingerprint, **workload: str) -> Fingerprint:
    """The same software on a machine without a GPU, with ``workload`` declared."""
    return fp.model_copy(update={"gpu": GPUInfo(source="absent"), "workload": workload})


def _declared(fp: Fingerprint) -> Fingerprint:
    return fp.model_copy(
        update={"gpu": GPUInfo(arch="sm_90a", capability="9.0", source="declared")}
    )


def test_a_machine_without_the_gpu_is_told_every_flag_and_nothing_else(base: Fingerprint) -> None:
    built = _declared(base)
    settle = to_match(built, _cpu(base))
    assert settle.flags == [
        "--gpu-arch sm_90a",
        "--workload model=meta-llama/Llama-3.1-8B,dtype=bfloat16",
    ]
    assert settle.probed == [] and settle.undeclare == []
    assert set(settle.declare[0].fields) == {"gpu.arch", "gpu.capability", "gpu.source"}
    # Declaring them is exactly a match: the flags are the whole difference.
    assert _cpu(base).model_copy(update={"gpu": built.gpu, "workload": built.workload}).hash == (
        built.hash
    )


def test_a_real_gpu_of_another_arch_is_probed_not_declared(base: Fingerprint) -> None:
    here = base.model_copy(
        update={"gpu": GPUInfo(arch="sm_100a", capability="10.0", name="B200", source="nvml")}
    )
    settle = to_match(base, here)
    assert settle.flags == []
    assert {d.path for d in settle.probed} >= {"gpu.arch", "gpu.capability"}


def test_libraries_are_never_declared_and_extra_workload_is_left_out(base: Fingerprint) -> None:
    libs = dict(base.libraries) | {"torch": LibraryInfo(version="2.12.0", content_hash="c" * 64)}
    here = _cpu(base, model="meta-llama/Llama-3.1-8B", dtype="bfloat16", tp="2").model_copy(
        update={"libraries": libs, "image": ImageInfo(digest="sha256:" + "1" * 64)}
    )
    built = _declared(base).model_copy(update={"image": ImageInfo(digest="sha256:" + "2" * 64)})
    settle = to_match(built, here)
    assert settle.flags == [
        "--gpu-arch sm_90a",
        "--workload model=meta-llama/Llama-3.1-8B,dtype=bfloat16",  # whole: tp goes
        f"--image-digest sha256:{'2' * 64}",
    ]
    assert settle.undeclare == ["tp"]
    assert [d.path for d in settle.probed] == [
        "libraries.torch.content_hash",
        "libraries.torch.version",
    ]


@pytest.mark.parametrize("same", [True, False])
def test_identical_sides_need_nothing(base: Fingerprint, same: bool) -> None:
    settle = to_match(base, base if same else base.model_copy())
    assert settle.flags == [] and settle.probed == [] and settle.undeclare == []


def test_a_flag_the_artifact_was_built_without_is_to_be_left_out(base: Fingerprint) -> None:
    """Built on a machine without a GPU and no target declared: drop ``--gpu-arch`` here."""
    built = _cpu(base)
    settle = to_match(built, _declared(_cpu(base)))
    assert settle.omit == ["--gpu-arch"]
    assert settle.flags == [] and settle.probed == []
    here = _cpu(base).model_copy(update={"image": ImageInfo(digest="sha256:" + "3" * 64)})
    assert to_match(built, here).omit == ["--image-digest"]
