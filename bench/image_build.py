"""``image append`` next to ``image build --kind runtime --push``: the same image two ways.

Starts a loopback registry and podman's Docker-API service (the recipe of
``docs/dev/podman-engine.md``, through ``tests/engine.py``), loads the
Debian bookworm + python3 base the image tests use (mmdebstrap, cached under
``.artifactd/cache/``) and pushes it to the registry, harvests a generic cache
of ``--cache-mb`` MiB of incompressible bytes, then derives the runtime image
from the same base and artifact twice each way:

  append   `artifactd image append`: straight in the registry, no engine; the
           base's layers are mounted, never moved
  build    `artifactd image build --kind runtime --push`: the template, built
           by the engine FROM the base's digest (pulled into the engine's
           storage), then pushed

and prints, per run: wall time, bytes the registry stored (new blobs), and
what append reports uploading. Engine start and base import are not timed
(one-time costs of a CI runner). A last "cold" build runs on an engine emptied
of every image, so that it pulls the base from the registry first, as a CI
runner without a warm image store does; append never downloads the base.

Usage: python bench/image_build.py [--cache-mb 20]
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
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from engine import load_python_base, start_engine  # noqa: E402
from registry_server import RegistryServer, start_registry  # noqa: E402


def stored(server: RegistryServer) -> dict[str, int]:
    """The registry's blobs on disk: digest hex -> size."""
    root = server.root / "docker/registry/v2/blobs/sha256"
    if not root.is_dir():
        return {}
    return {p.name: (p / "data").stat().st_size for p in root.glob("*/*") if (p / "data").is_file()}


def artifactd(*args: str, env: dict[str, str]) -> tuple[dict[str, Any], float]:
    """Run ``artifactd ARGS --json``; its document and wall time."""
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "artifactd", *args, "--json"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.monotonic() - t0
    if proc.returncode != 0:
        sys.exit(f"artifactd {' '.join(args[:2])} failed:\n{proc.stderr[-3000:]}")
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-mb", type=int, default=20, help="cache size (MiB)")
    args = parser.parse_args()
    for tool in ("podman", "runc", "mmdebstrap", "docker-registry"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} not installed: run scripts/setup.sh")
    work = Path(tempfile.mkdtemp(prefix="artifactd-build-bench-"))
    server = start_registry(work / "registry")
    engine = start_engine(Path(tempfile.mkdtemp(prefix="artifactd-engine-")))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARTIFACTD_")}
    env.update(HOME=str(work), DOCKER_HOST=engine.base_url)
    try:
        base = load_python_base(engine, server, "bench/base")
        gen = work / "generic"
        gen.mkdir()
        for i in range(args.cache_mb):
            (gen / f"kernel{i}.cubin").write_bytes(os.urandom(1 << 20))
        harvest, _ = artifactd(
            "harvest", "--store", server.ref("bench/caches"), "--family", "generic",
            env={**env, "ARTIFACTD_GENERIC_DIR": str(gen)},
        )  # fmt: skip
        artifact = f"{server.ref('bench/caches')}:fp-{harvest['fingerprint_hash']}"
        base_mib = sum(stored(server).values()) / 2**20
        print(
            f"base {base.ref} ({base_mib:.0f} MiB compressed in the registry), "
            f"cache {args.cache_mb} MiB (incompressible)"
        )
        header = f"{'method':7} {'run':6} {'seconds':>8} {'stored MiB':>11} {'new blobs':>10} "
        print(header + f"{'uploaded MiB':>13}  image")
        runs = [("append", "first"), ("append", "again"), ("build", "first"), ("build", "again")]
        for method, run in [*runs, ("build", "cold")]:
            if run == "cold":  # an engine without the base: the build pulls it first
                engine.podman("rmi", "--all", "--force")
            before = stored(server)
            if method == "append":
                to = server.ref("bench/app:append")
                doc, seconds = artifactd(
                    "image", "append", "--base", base.ref, "--artifact", artifact, "--to", to,
                    env=env,
                )  # fmt: skip
                uploaded = f"{doc['bytes_uploaded'] / 2**20:13.1f}"
                image = f"{to} {doc['digest'][:19]}"
            else:
                to = server.ref("bench/app:build")
                doc, seconds = artifactd(
                    "image", "build", "--kind", "runtime", "--base", base.ref,
                    "--artifact", artifact, "--push", to, env=env,
                )  # fmt: skip
                uploaded = f"{'-':>13}"
                image = f"{to} {doc['digest'][:19]} (local {doc['size'] / 2**20:.0f} MiB)"
            after = stored(server)
            new = set(after) - set(before)
            grown = sum(after[d] for d in new) / 2**20
            print(
                f"{method:7} {run:6} {seconds:8.2f} {grown:11.1f} {len(new):10d} "
                f"{uploaded}  {image}"
            )
    finally:
        engine.stop()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
