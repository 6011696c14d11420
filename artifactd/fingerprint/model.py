"""The compatibility fingerprint: a typed, canonical description of an environment.

A fingerprint answers "would a compile cache built there be valid here?". It is
a frozen pydantic model; its hash is the sha256 of its canonical JSON with the
informational section (``info``: hostname, probe time) left out, so two probes
of the same environment always hash the same.

Each cache family depends on only some of its fields, named by dotted paths
(``gpu.arch``, ``libraries.triton``); :meth:`Fingerprint.scope_key` hashes just
those, so a model or TP change still restores the Triton kernels.

Probing lives in :mod:`artifactd.fingerprint.probe` (no pydantic, no torch), which
also returns a probe typed by this model
(:func:`~artifactd.fingerprint.probe.probe_fingerprint`); this module adds the
typed model, its JSON Schema and ``--set``-style views over it, and never probes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from artifactd import __version__
from artifactd.errors import ConfigError, UsageError
from artifactd.fingerprint import key
from artifactd.fingerprint.key import flatten, parse_gpu_arch, parse_pairs

__all__ = [
    "Fingerprint",
    "flatten",
    "parse_gpu_arch",
    "parse_pairs",
]

SCHEMA_VERSION: Literal[1] = 1


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class GPUInfo(_Model):
    """The GPU the caches target: read from NVML, or declared for GPU-less builds."""

    arch: str | None = Field(None, description="Compile target, e.g. sm_90a.")
    capability: str | None = Field(None, description="Compute capability, e.g. 9.0.")
    name: str | None = Field(None, description="Device name as NVML reports it.")
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

    cc: str | None = Field(
        None,
        description="First line of `$CC --version` (default `cc`), its leading program "
        "name resolved through symlinks (`cc` and `gcc` name one compiler).",
    )


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
    topology: str | None = Field(None, description="GPU interconnect summary (advisory).")
    gpu_count: int = Field(
        0,
        description="GPUs this process saw. Not hashed: what engines key on is the parallel "
        "layout (workload tp, pp, ep, dp), not how many devices a builder or pod was given.",
    )
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

    @model_validator(mode="before")
    @classmethod
    def _count_is_informational(cls, data: Any) -> Any:
        """Read documents from before the GPU count left the hash (see the function it runs)."""
        return key.count_is_informational(data)

    def hashed_view(self) -> dict[str, Any]:
        """Return the JSON data that enters the hash (everything but ``info``)."""
        return key.hashed_view(self.model_dump(mode="json"))

    @property
    def hash(self) -> str:
        """The sha256 of the canonical JSON of :meth:`hashed_view`."""
        return key.raw_hash(self.hashed_view())

    def document(self) -> dict[str, Any]:
        """Return the whole document as JSON data, ``info`` included."""
        return self.model_dump(mode="json")

    def flatten(self) -> dict[str, Any]:
        """Return hashed fields as ``{"dotted.path": value}`` leaves."""
        return flatten(self.hashed_view())

    def select(self, dimensions: Sequence[str]) -> dict[str, Any]:
        """Return the leaves under each dotted prefix in ``dimensions`` (absent ones: None)."""
        return key.select(self.flatten(), dimensions)

    def scope_key(self, family: str, dimensions: Sequence[str], revision: int = 1) -> str:
        """Hash of the fields one family's validity depends on, and nothing else."""
        return key.scope_key(self.flatten(), family, dimensions, revision)

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


def from_raw(raw: Mapping[str, Any]) -> Fingerprint:
    """Validate a probed (and possibly overridden) document into a Fingerprint."""
    try:
        return Fingerprint.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UsageError(
            f"fingerprint field {where}: {first['msg']}",
            hint="check the --set values against registry-schema/fingerprint.schema.json",
        ) from exc
