"""``image append`` measured: time and bytes against the size of the base it extends.

Starts a loopback registry, pushes a base image (one gzip layer of
incompressible bytes, ``--base-mb`` MiB) with skopeo, harvests a generic cache
of ``--cache-mb`` MiB, then appends it to the base twice and prints, for each
run: wall time, bytes uploaded, base bytes reused (mounted, not moved), and
the registry's stored-blob growth. bench/image_build.py compares append with
an engine build of the same derived image.

Usage: python bench/image_append.py [--base-mb 200] [--cache-mb 20]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from images import make_base  # noqa: E402
from registry_server import start_registry  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-mb", type=int, default=200, help="base layer size (MiB)")
    parser.add_argument("--cache-mb", type=int, default=20, help="cache size (MiB)")
    args = parser.parse_args()
    skopeo = shutil.which("skopeo")
    if skopeo is None:
        sys.exit("skopeo not installed: run scripts/setup.sh")
    work = Path(tempfile.mkdtemp(prefix="artifactd-append-bench-"))
    server = start_registry(work / "registry")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARTIFACTD_")}
    env["HOME"] = str(work)
    try:
        layout = make_base(work, payload=os.urandom(args.base_mb << 20))
        base = server.ref("bench/base:1")
        subprocess.run(
            [skopeo, "copy", "--dest-tls-verify=false", f"oci:{layout}:base", f"docker://{base}"],
            check=True,
            capture_output=True,
        )
        gen = work / "generic"
        gen.mkdir()
        for i in range(args.cache_mb):
            (gen / f"kernel{i}.cubin").write_bytes(os.urandom(1 << 20))
        harvest = subprocess.run(
            [sys.executable, "-m", "artifactd", "harvest", "--store", server.ref("bench/caches"),
             "--family", "generic", "--json"],
            env={**env, "ARTIFACTD_GENERIC_DIR": str(gen)},
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        artifact = (
            f"{server.ref('bench/caches')}:fp-{json.loads(harvest.stdout)['fingerprint_hash']}"
        )
        blobs = server.root / "docker/registry/v2/blobs/sha256"
        print(f"base layer {args.base_mb} MiB, cache {args.cache_mb} MiB (incompressible)")
        print(f"{'run':6} {'seconds':>8} {'uploaded MiB':>13} {'reused MiB':>11} {'new blobs':>10}")
        for run in ("first", "again"):
            before = {p.name for p in blobs.glob("*/*")}
            t0 = time.monotonic()
            proc = subprocess.run(
                [sys.executable, "-m", "artifactd", "image", "append", "--base", base,
                 "--artifact", artifact, "--to", server.ref("bench/app:1"), "--json"],
                env=env, check=True, capture_output=True, text=True,
            )  # fmt: skip
            seconds = time.monotonic() - t0
            doc = json.loads(proc.stdout)
            grown = len({p.name for p in blobs.glob("*/*")} - before)
            print(
                f"{run:6} {seconds:8.2f} {doc['bytes_uploaded'] / 2**20:13.1f} "
                f"{doc['bytes_reused'] / 2**20:11.1f} {grown:10d}"
            )
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
