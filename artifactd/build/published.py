"""The published fingerprint of a warm-up matrix: the one rule build, merge and verify key on.

Why a module of its own: a build publishes ``fp-<hash>`` and each family's
``<family>-<scope key>``, and a pod finds them only if its own probe gives the
same fingerprint. So every command that computes "the fingerprint this matrix
publishes" calls :func:`published_fingerprint` (``build``, ``verify``) or
:func:`agreed_fingerprint` (``merge``, which composes what the cells
published), and both rest on the probe a pod runs (:mod:`artifactd.fingerprint.probe`).
It imports nothing at module level beyond the errors: the matrix, the
families and the typed model are read when a function is called.

**What the matrix's ``env:`` may change.** The cells run with it; the probe
does not, with one exception. The probe reads a few variables itself
(:data:`~artifactd.fingerprint.probe.PROBED_ENV`: ``CC`` names the compiler behind
``compilers.cc``, ``TRITON_PTXAS_PATH`` the ptxas behind ``cuda.ptxas``). A
variable of ``env:`` enters the published fingerprint only when a family of
the matrix keys on the field it sets (the field is in the family's scope):
then the cells' caches really depend on it, and a pod reproduces the key by
setting the same variable to the same value (:func:`pod_environ` names them;
``build`` reports them). Any other variable of ``env:`` changes what the cells
do, not the key: a pod never sees the matrix, so a key it changed could never
be found.

**The parallel layout, not the GPU count.** How many GPUs a builder or a pod
happened to see is information (``info.gpu_count``), never key: an 8-GPU build
node serves tp=1 pods. What vLLM and SGLang key their caches on is the
parallel layout (:data:`PARALLEL_LAYOUT`: tp, pp, ep, dp), a workload fact: a
matrix for one layout declares it in ``workload:`` (and its pods pass the same
``--workload``); a matrix whose axes span layouts publishes one artifact that
holds them side by side (each engine names its cache dir by its own config
hash, which includes the layout), keyed without the layout, and its pods name
none. A key in both places is refused (:func:`check_key`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from artifactd.constants import current_environ
from artifactd.errors import BuildError, ConfigError
from artifactd.families import select_families
from artifactd.fingerprint.diff import differences
from artifactd.fingerprint.probe import PROBED_ENV, probe_fingerprint

if TYPE_CHECKING:
    from artifactd.build.matrix import Matrix
    from artifactd.fingerprint.model import Fingerprint
    from artifactd.format.config import ArtifactConfig

#: Workload keys that name the parallel layout (tensor, pipeline, expert, data).
PARALLEL_LAYOUT = ("tp", "pp", "ep", "dp")


def _covers(scope: Iterable[str], field: str) -> bool:
    """Whether a scope's dotted dimensions include ``field`` (a dimension names a subtree)."""
    return any(field == dim or field.startswith(dim + ".") for dim in scope)


def key_variables(families: Sequence[str] | None = None) -> dict[str, list[str]]:
    """Map each variable the probe reads to the families (of ``families``) that key on it.

    A variable no family keys on is absent. ``families`` None or empty: every family.
    """
    chosen = select_families(list(families) if families else None)
    out: dict[str, list[str]] = {}
    for var, field in PROBED_ENV.items():
        names = [f.name for f in chosen if _covers(f.scope, field)]
        if names:
            out[var] = names
    return out


def pod_environ(matrix: Matrix) -> dict[str, str]:
    """Return the variables of the matrix's ``env:`` that enter its fingerprint: pods set them."""
    keyed = key_variables(matrix.families)
    return {k: v for k, v in matrix.env.items() if k in keyed}


def check_key(matrix: Matrix, source: object = "matrix") -> None:
    """Refuse a matrix whose key would say one thing while its cells do another.

    A workload key that is also an axis (``workload: {tp: 8}`` with ``axes:
    {tp: [1, 2]}``): the cells' templates see the axis's values, the key the
    workload's, so pods asking for tp=8 would hit caches built for tp=1 and 2.
    Raises :class:`ConfigError` naming the keys.
    """
    both = sorted(set(matrix.workload) & set(matrix.axes))
    if both:
        layout = [k for k in both if k in PARALLEL_LAYOUT]
        what = "parallel layout " if layout == both else ""
        raise ConfigError(
            f"{source}: {what}key(s) {', '.join(both)} are both in workload and in axes: "
            "the cells would run the axis's values while the artifact is keyed on the "
            "workload's",
            hint="keep a key in one place: in workload for an artifact of one value (pods "
            "pass it with --workload), in axes for one artifact holding every value",
        )


def pod_flags(matrix: Matrix) -> list[str]:
    """Return the ``restore`` (or ``fingerprint``) flags with which a pod asks for this matrix.

    With :func:`pod_environ` set, a pod on the build's machine probes the
    fingerprint :func:`published_fingerprint` gives.
    """
    flags = ["--gpu-arch", matrix.target.gpu_arch] if matrix.target.gpu_arch else []
    if matrix.base_image:
        flags += ["--image-digest", matrix.base_image]
    for key, value in sorted(matrix.workload.items()):
        flags += ["--workload", f"{key}={value}"]
    return flags


def probe_environ(matrix: Matrix, base: Mapping[str, str]) -> dict[str, str]:
    """Return the environment the fingerprint is probed with: ``base`` plus :func:`pod_environ`.

    ``base`` is the builder's own environment (the machine), not the cells':
    their cache roots and the rest of ``env:`` never reach the probe.
    """
    return {**base, **pod_environ(matrix)}


def published_fingerprint(
    matrix: Matrix,
    *,
    gpu_arch: str | None = None,
    image_digest: str | None = None,
    overrides: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
) -> Fingerprint:
    """Probe the fingerprint a build of ``matrix`` on this machine publishes (module doc).

    ``gpu_arch`` and ``image_digest`` default to the matrix's ``target.gpu_arch``
    and ``base_image``; ``overrides`` are ``--set PATH=VALUE``; ``environ`` is
    the caller's environment (default: this process's).
    """
    check_key(matrix)
    base = current_environ() if environ is None else environ
    return probe_fingerprint(
        gpu_arch=gpu_arch or matrix.target.gpu_arch,
        image_digest=image_digest or matrix.base_image,
        workload=matrix.workload,
        environ=probe_environ(matrix, base),
        overrides=overrides,
    )


def agreed_fingerprint(parts: Sequence[tuple[str, ArtifactConfig]]) -> tuple[Fingerprint, str]:
    """Return the fingerprint and hash every cell's part was built for; refuse parts that differ.

    ``parts`` are (cell id, config) pairs, at least one. The error names the
    first fields that differ between two cells.
    """
    cell0, first = parts[0]
    for cell, config in parts[1:]:
        if config.fingerprint_hash == first.fingerprint_hash:
            continue
        fields = differences(first.fingerprint.flatten(), config.fingerprint.flatten())
        names = ", ".join(f"{d.path} ({d.a!r} vs {d.b!r})" for d in fields[:4])
        raise BuildError(
            f"cells {cell0} and {cell} were built for different fingerprints: {names}",
            hint="build every cell in the same image, for the same target and workload "
            "(`artifactd diff` compares two fingerprints)",
        )
    return first.fingerprint, first.fingerprint_hash
