"""Restore throughput from a real loopback registry, side by side with the alternatives.

Builds a realistic cache tree (many small files of a few KiB, some 1-50 MiB
.so/.cubin files; part compressible, part not), pushes it to a CNCF
distribution registry on 127.0.0.1, then times in one run, each into a fresh
directory on the same disk:

  artifactd   `artifactd restore` (the whole command: probe, resolve, fetch,
              verify, extract, rename, marker)
  hand-built  what a user would write otherwise: oras-py pull of the layer,
              then `tar --zstd -xf`
  cp -a       copying the unpacked tree (no network, no decompression)

and prints the ratios. Goals: artifactd <= 0.5x hand-built, <= 1.5x cp -a.

Usage: python bench/restore_throughput.py [--size-mib 1024] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from registry_server import start_registry  # noqa: E402


def compressible(rng: random.Random, n: int) -> bytes:
    """Bytes that compress like IR and metadata do (a small alphabet, some repetition)."""
    words = [
        bytes(rng.choice(b"abcdefghijklmnop_0123456789 .;{}()\n") for _ in range(8))
        for _ in range(64)
    ]
    out = bytearray()
    while len(out) < n:
        out += rng.choice(words)
    return bytes(out[:n])


def make_tree(root: Path, size_mib: int, seed: int = 7) -> tuple[int, int]:
    """Write the synthetic cache tree; return (files, bytes)."""
    rng = random.Random(seed)
    budget = size_mib << 20
    files = total = 0
    # ~8% of bytes in small files (1-8 KiB): Triton IR/metadata, Inductor .py, group files.
    small_budget = budget * 8 // 100
    d = 0
    while total < small_budget:
        sub = root / f"{d // 200:02x}" / f"k{d:05d}"
        sub.mkdir(parents=True, exist_ok=True)
        for ext in ("json", "ttir", "ptx"):
            n = rng.randint(1024, 8192)
            data = compressible(rng, n) if ext != "ptx" or d % 2 else os.urandom(n)
            (sub / f"kernel.{ext}").write_bytes(data)
            files += 1
            total += n
        d += 1
    # The rest in medium and large binaries, about half incompressible.
    i = 0
    while total < budget:
        n = min(rng.choice([1, 2, 4, 8, 16, 24, 32, 48]) << 20, budget - total)
        data = os.urandom(n) if i % 2 else compressible(rng, n)
        name = f"lib{i:03d}.so" if i % 3 else f"kernel{i:03d}.cubin"
        (root / "bin").mkdir(exist_ok=True)
        (root / "bin" / name).write_bytes(data)
        files += 1
        total += n
        i += 1
    return files, total


HAND_BUILT = r"""
import sys, oras.provider, oras.container
reg = oras.provider.Registry(hostname=sys.argv[1], insecure=True)
container = reg.get_container(sys.argv[2])
reg.download_blob(container, sys.argv[3], sys.argv[4])
"""


def quiesce() -> None:
    """Flush dirty pages and wait for writeback: every timing starts from a quiet disk."""
    subprocess.run(["sync"], check=False)
    for _ in range(150):
        with open("/proc/meminfo") as f:
            dirty_kib = next(int(line.split()[1]) for line in f if line.startswith("Dirty:"))
        if dirty_kib < 16 << 10:
            break
        time.sleep(0.2)
    time.sleep(0.5)


def timed(argv: list[str], env: dict[str, str] | None = None) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"{argv[:4]} failed: {proc.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--keep", action="store_true", help="keep the work dir")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each method")
    args = parser.parse_args()
    py = sys.executable
    parent = REPO / ".artifactd" if (REPO / ".artifactd").is_dir() else Path(tempfile.gettempdir())
    # Every run's target is kept until the end, next to the tree, the registry and the blob.
    need = (3 * args.rounds + 4) * args.size_mib * 11 // 10 << 20
    if shutil.disk_usage(parent).free < need + (2 << 30):
        sys.exit(f"{parent}: needs about {need >> 30} GiB free (+2): lower --size-mib or --rounds")
    work = Path(tempfile.mkdtemp(prefix="artifactd-bench-", dir=parent))
    server = start_registry(work / "registry")
    try:
        tree = work / "tree"
        t0 = time.perf_counter()
        files, nbytes = make_tree(tree, args.size_mib)
        print(
            f"tree: {files} files, {nbytes / 2**20:.0f} MiB (made in "
            f"{time.perf_counter() - t0:.1f} s)"
        )
        env = {
            **os.environ,
            "ARTIFACTD_GENERIC_DIR": str(tree),
            "HOME": str(work / "home"),
            "TMPDIR": str(work / "tmp"),
        }
        for var in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
            env.pop(var, None)
        store = server.ref("bench/caches")
        t0 = time.perf_counter()
        out = subprocess.run(
            [py, "-m", "artifactd", "harvest", "--store", store, "--family", "generic", "--json"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        push_s = time.perf_counter() - t0
        harvest = json.loads(out)
        layer = harvest["families"][0]
        print(f"push: layer {layer['layer_size'] / 2**20:.0f} MiB compressed, {push_s:.1f} s")

        restore_env = {k: v for k, v in env.items() if k != "ARTIFACTD_GENERIC_DIR"}
        blob = work / "layer.tar.zst"

        def run_artifactd(dest: Path) -> float:
            return timed(
                [
                    py,
                    "-m",
                    "artifactd",
                    "restore",
                    "--store",
                    store,
                    "--target",
                    str(dest),
                    "--family",
                    "generic",
                    "--require",
                ],
                restore_env,
            )

        def run_hand_built(dest: Path) -> float:
            dest.mkdir()
            t0 = time.perf_counter()
            subprocess.run(
                [py, "-c", HAND_BUILT, server.host, store, layer["layer_digest"], str(blob)],
                check=True,
                capture_output=True,
            )
            pulls.append(time.perf_counter() - t0)
            subprocess.run(["tar", "--zstd", "-xf", str(blob), "-C", str(dest)], check=True)
            elapsed = time.perf_counter() - t0
            blob.unlink()
            return elapsed

        def run_cp(dest: Path) -> float:
            return timed(["cp", "-a", str(tree), str(dest)])

        methods = {
            "artifactd restore": run_artifactd,
            "oras-py pull + tar --zstd -xf": run_hand_built,
            "cp -a (unpacked tree)": run_cp,
        }
        pulls: list[float] = []
        results: dict[str, list[float]] = {name: [] for name in methods}
        for r in range(args.rounds):
            order = list(methods) if r % 2 == 0 else list(reversed(methods))
            for name in order:
                # A new target each run, none deleted before the end: on ext4 without a
                # journal, creating files soon after deleting many first scans every inode
                # freed in the last 30 s-5.5 min (recently_deleted()), which made every
                # method here several times slower (bench/restore_network.py measures it).
                dest = work / f"out-{r}-{len(results[name])}-{list(methods).index(name)}"
                quiesce()
                results[name].append(methods[name](dest))
    finally:
        server.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    med = {name: statistics.median(times) for name, times in results.items()}
    print(f"{'method':34} {'median s':>9} {'MiB/s':>7}  runs")
    for name, secs in med.items():
        runs = " ".join(f"{t:.2f}" for t in results[name])
        print(f"{name:34} {secs:9.2f} {nbytes / 2**20 / secs:7.0f}  {runs}")
    print(f"  (of which oras-py pull alone: median {statistics.median(pulls):.2f} s)")
    ours = med["artifactd restore"]
    print(
        f"artifactd / hand-built = {ours / med['oras-py pull + tar --zstd -xf']:.2f}  (goal <= 0.5)"
    )
    print(f"artifactd / cp -a      = {ours / med['cp -a (unpacked tree)']:.2f}  (goal <= 1.5)")


if __name__ == "__main__":
    main()
