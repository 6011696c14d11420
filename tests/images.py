"""OCI image layouts written by hand, for the image tests and benches.

Written here, not by artifactd, so that what artifactd does to an image is
checked against an independent writer (and skopeo, which pushes and pulls
them).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import platform
import tarfile
from pathlib import Path
from typing import Any

import zstandard

from artifactd.format.config import goarch
from artifactd.stores import open_store

#: This machine's architecture, as OCI names it: the artifacts built here are for it.
ARCH = goarch(platform.machine())


def blob(layout: Path, data: bytes) -> dict[str, Any]:
    """Write ``data`` as a blob of ``layout``; its descriptor's digest and size."""
    digest = hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256" / digest).write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def make_base(tmp: Path, payload: bytes | None = None) -> Path:
    """An OCI layout with one image, tag ``base``: a gzip layer with ``/app/hello``.

    ``payload`` adds ``/app/blob`` holding those bytes (a base of a chosen size).
    """
    layout = tmp / "base-layout"
    (layout / "blobs" / "sha256").mkdir(parents=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    raw = io.BytesIO()
    extra = payload
    with tarfile.open(fileobj=raw, mode="w") as tar:
        payload = b"#!/bin/sh\necho hello\n"
        info = tarfile.TarInfo("app/hello")
        info.size, info.mode = len(payload), 0o755
        tar.addfile(info, io.BytesIO(payload))
        if extra is not None:
            big = tarfile.TarInfo("app/blob")
            big.size, big.mode = len(extra), 0o644
            tar.addfile(big, io.BytesIO(extra))
    diff_id = "sha256:" + hashlib.sha256(raw.getvalue()).hexdigest()
    layer = blob(layout, gzip.compress(raw.getvalue(), mtime=0))
    config = blob(
        layout,
        json.dumps(
            {
                "architecture": ARCH,
                "os": "linux",
                "config": {"Env": ["PATH=/usr/bin:/bin"], "Labels": {"base": "yes"}},
                "rootfs": {"type": "layers", "diff_ids": [diff_id]},
                "history": [{"created_by": "test base layer"}],
            }
        ).encode(),
    )
    manifest = blob(
        layout,
        json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **layer}],
            }
        ).encode(),
    )
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                **manifest,
                "annotations": {"org.opencontainers.image.ref.name": "base"},
            }
        ],
    }
    (layout / "index.json").write_text(json.dumps(index))
    return layout


def mount_artifact(store: str, tag: str, where: Path) -> None:
    """Merge an artifact's layers into one tree, as a runtime mounts an image volume."""
    where.mkdir(parents=True)
    with open_store(store) as st:
        found = st.get_manifest(tag)
        assert found is not None
        for layer in json.loads(found.data)["layers"]:
            with st.open_blob(layer["digest"], layer["size"]) as blob:
                stream = zstandard.ZstdDecompressor().stream_reader(blob)
                with tarfile.open(fileobj=stream, mode="r|") as tar:
                    tar.extractall(where, filter="data")
