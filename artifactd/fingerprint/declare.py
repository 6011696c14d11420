"""What a machine must declare to match an artifact, and what it cannot declare.

A fingerprint has two kinds of fields. Most are *probed*: the driver, the
libraries, the Python ABI are what this machine is, and no flag may claim
otherwise (a forced match is a wrong hit). A few are *declared* by the
command, for machines that build or restore for another target: the GPU
architecture on a machine without that GPU (``--gpu-arch``), the workload
(``--workload``) and the runtime image's digest (``--image-digest``). When a
restore misses, or the demo tells a user how to restore its artifact, the
differing fields are sorted into the flags that would declare them and the
probed fields that no flag may change. This module is that one rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from artifactd.fingerprint.diff import FieldDiff, differences
from artifactd.fingerprint.model import Fingerprint

#: The GPU fields ``--gpu-arch`` declares on a machine whose GPU it does not probe.
GPU_DECLARED = ("gpu.arch", "gpu.capability", "gpu.source")
#: The probe's ``gpu.source`` where it saw no GPU, or was told one: the only
#: machines on which a declaration may stand in for the hardware.
_UNPROBED_GPU = ("absent", "declared")
WORKLOAD_PREFIX = "workload."
IMAGE_DIGEST = "image.digest"


@dataclass(frozen=True)
class Declaration:
    """A flag that would make this machine's fields equal the artifact's."""

    #: The flag and its value, as typed (``--gpu-arch sm_90a``).
    flag: str
    #: The dotted fields it settles.
    fields: tuple[str, ...]


@dataclass(frozen=True)
class ToMatch:
    """What a machine would declare to match an artifact, and what it cannot."""

    declare: list[Declaration]
    #: Workload fields declared here that the artifact was built without: leave
    #: them out of ``--workload``.
    undeclare: list[str]
    #: Probed fields that differ: this machine is not what the artifact was built for.
    probed: list[FieldDiff]
    #: Flags given here that the artifact was built without (``--gpu-arch`` on
    #: this machine, none at the build): leave them out.
    omit: list[str] = field(default_factory=list)

    @property
    def flags(self) -> list[str]:
        """The flags alone, in order, ready to append to a command."""
        return [d.flag for d in self.declare]


def to_match(artifact: Fingerprint, here: Fingerprint) -> ToMatch:
    """Sort the fields ``artifact`` and this machine (``here``) differ in.

    A GPU field is declarable only where ``here`` probed no GPU (or was told
    one): a real GPU of another architecture is a machine the artifact is not
    for. ``--workload`` is given whole, as the artifact has it, so a field
    declared here that the artifact lacks goes too.
    """
    differing = differences(artifact.flatten(), here.flatten())
    declare: list[Declaration] = []
    probed: list[FieldDiff] = []
    omit: list[str] = []
    gpu = [d for d in differing if d.path in GPU_DECLARED]
    if gpu and artifact.gpu.arch and here.gpu.source in _UNPROBED_GPU:
        declare.append(Declaration(f"--gpu-arch {artifact.gpu.arch}", tuple(d.path for d in gpu)))
    elif gpu and here.gpu.source == "declared" and artifact.gpu.source == "absent":
        omit.append("--gpu-arch")  # built on a machine without a GPU, and none declared
    else:
        probed += gpu
    workload = [d for d in differing if d.path.startswith(WORKLOAD_PREFIX)]
    undeclare = [d.path[len(WORKLOAD_PREFIX) :] for d in workload if d.a is None]
    if workload and artifact.workload:
        pairs = ",".join(f"{k}={v}" for k, v in artifact.workload.items())
        declared = tuple(d.path for d in workload if d.a is not None)
        declare.append(Declaration(f"--workload {pairs}", declared))
    image = next((d for d in differing if d.path == IMAGE_DIGEST), None)
    if image is not None and image.a:
        declare.append(Declaration(f"--image-digest {image.a}", (IMAGE_DIGEST,)))
    elif image is not None:
        omit.append("--image-digest")
    settled = {p for d in declare for p in d.fields} | {d.path for d in probed}
    settled |= set(GPU_DECLARED) if "--gpu-arch" in omit else set()
    settled |= {IMAGE_DIGEST} if "--image-digest" in omit else set()
    settled |= {WORKLOAD_PREFIX + k for k in undeclare}
    probed += [d for d in differing if d.path not in settled]
    return ToMatch(declare, undeclare, probed, omit)
