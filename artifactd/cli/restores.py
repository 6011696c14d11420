"""``restore``: the init container's one job (what it does: :mod:`artifactd.cli.fast`)."""

from __future__ import annotations

from typing import Any

from artifactd.cli import fast
from artifactd.cli import specs as S  # noqa: N812
from artifactd.cli.group import cli
from artifactd.cli.options import options


@cli.command()
@options(S.COMMANDS["restore"])
def restore(**options: Any) -> None:
    """Install the caches that match this machine into TARGET (the init container's job).

    Looks up the artifact tagged with the local fingerprint; failing that, each
    family's own scope tag (so a model or TP change still restores kernels).
    Before downloading, every layer's file list is checked against the format's
    rules and the restore's size against TARGET's free space. Layers are then
    verified while they stream, staged next to TARGET and installed in one
    transaction: every family or none.

    --node-store oci:PATH (a hostPath on the node) is a node-local tier:
    restore from it, fetching into it first what it lacks, so N pods starting
    on one node fetch once; with the registry down it still serves what it
    holds. The node store keeps each layer unpacked once and gives the pod its
    files by reflink, else by hard link for files the family never writes,
    else by copy (--node-link copy: never a hard link). --metrics-file writes
    Prometheus metrics (node-exporter textfile).

    --from-dir restores from a directory instead: an artifact mounted as a
    Kubernetes image volume (one directory per family), or a derived image's
    baked store; every file is verified the same way.

    --verify-key PUB (repeatable) makes the restore fail closed: before any
    layer is downloaded, each manifest it would install must carry a valid
    signature (cosign's sha256-<hex>.sig) by one of the keys over exactly its
    digest, from whatever source (registry, layout, node store, baked store).

    A miss, an unreachable store, a corrupt or hostile artifact, a full disk
    or an unwritable target prints the error, leaves TARGET as it was and
    exits 0 (the engine compiles as before), unless --require.

    \b
    Every flag also reads an environment variable (for Kubernetes):
      ARTIFACTD_STORE, ARTIFACTD_FROM_DIR, ARTIFACTD_TARGET, ARTIFACTD_FAMILIES,
      ARTIFACTD_WORKLOAD, ARTIFACTD_SOFTWARE_FROM, ARTIFACTD_NODE_STORE,
      ARTIFACTD_METRICS_FILE, ARTIFACTD_VERIFY_KEY,
      ARTIFACTD_SET, ARTIFACTD_GPU_ARCH, ARTIFACTD_IMAGE_DIGEST, ARTIFACTD_ENV_FILE,
      ARTIFACTD_CONSUMER_USER, ARTIFACTD_REQUIRE, ARTIFACTD_DRY_RUN, ARTIFACTD_JSON,
      ARTIFACTD_INSECURE, ARTIFACTD_MAX_BYTES, ARTIFACTD_LOCK_TIMEOUT.
    """
    fast.restore(**options)
