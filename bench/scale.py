"""How restore's extraction scales with file count and bytes, side by side with tar.

For each case, packs a generated tree into a format-2 layer as a harvest does,
then alternates, round by round, each into a fresh directory on one disk:

  artifactd   the restore's extraction: ``check_layer`` on the record, then
              ``unpack_layer`` (zstd, the format's checks, sha256 of every
              file, the writes)
  tar         ``zstd -dc LAYER | tar -x -C DIR`` (two processes, no checks)

and prints the medians, seconds per 1,000 files, MB/s, and the ratio
artifactd/tar as the median of the per-round ratios with their range.

Cases: ``--files`` trees of 4 KiB files (default 1k, 10k, 100k), and
``--sizes`` trees of 16 MiB files (default 100 MB and 1 GB; ``--big`` adds
5 GB). A series keeps every target until it ends: on this VM's ext4 a mass
delete slows the file creations that follow it, so each case's targets are
removed only after its last round (the run needs rounds x 2 x the tree's size
free on the work dir's disk).

Usage: python bench/scale.py [--files 1000,10000,100000] [--sizes 100,1000]
           [--big] [--rounds 7] [--work DIR]
"""

from __future__ import annotations

import argparse
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
sys.path.insert(0, str(REPO))

from layers import pack, record  # noqa: E402

from artifactd.families import get_family  # noqa: E402
from artifactd.families.base import Located  # noqa: E402
from artifactd.format.archive import PackedLayer  # noqa: E402
from artifactd.format.unpack import check_layer, unpack_layer  # noqa: E402

#: Files per directory in the small-file trees (Triton writes a few per kernel dir).
PER_DIR = 6


def _body(rng: random.Random, words: list[bytes], size: int) -> bytes:
    """``size`` bytes that zstd shrinks a few times, as compiled kernels do."""
    out = b"".join(rng.choices(words, k=size // 8 + 1))
    return out[:size]


def make_tree(root: Path, files: int, size: int, seed: int = 7) -> None:
    """``files`` files of ``size`` bytes under ``root``, :data:`PER_DIR` to a directory."""
    rng = random.Random(seed)
    words = [rng.randbytes(rng.randrange(4, 24)) for _ in range(2048)]
    chunk = _body(rng, words, min(size, 1 << 20))
    for i in range(files):
        d = root / f"{i // PER_DIR:06x}-kernel"
        if i % PER_DIR == 0:
            d.mkdir(parents=True)
        if size <= len(chunk):
            body = _body(rng, words, size)
        else:  # large files: a repeated chunk with a unique head (fast to make)
            body = rng.randbytes(4096) + chunk * (size // len(chunk) + 1)
            body = body[:size]
        (d / f"k{i}.bin").write_bytes(body)


def ours(layer: PackedLayer, dest: Path) -> None:
    """Extract as a restore does: check the record, then unpack the blob."""
    rec = record(layer)
    components = frozenset(rec.components)
    bound = check_layer(rec, components, prefix=rec.family)
    with layer.path.open("rb") as blob:
        unpack_layer(
            blob,
            digest=layer.digest,
            size=layer.size,
            entries=rec.files,
            staging=dest,
            components=components,
            max_tar_bytes=bound,
            record=rec,
            prefix=rec.family,
        )


def tar(layer: PackedLayer, dest: Path) -> None:
    """``zstd -dc | tar -x``: the floor without checks."""
    dest.mkdir()
    cmd = f"zstd -dc '{layer.path}' | tar -x -C '{dest}'"
    subprocess.run(cmd, shell=True, check=True)  # noqa: S602 - our own paths, quoted


def sync() -> None:
    """Start every round with writeback done, so no round pays for the last one's."""
    os.sync()


def case(work: Path, label: str, files: int, size: int, rounds: int) -> str:
    """Build, pack and time one case; return its report line."""
    base = work / label
    src = base / "src"
    make_tree(src, files, size)
    family = get_family("generic")
    layer = pack(family, [Located(family.components[0], src)], base / "layer.tar.zst")
    times: dict[str, list[float]] = {"artifactd": [], "tar": []}
    runners = {"artifactd": ours, "tar": tar}
    n = 0
    for r in range(rounds):
        order = ["artifactd", "tar"] if r % 2 == 0 else ["tar", "artifactd"]
        for name in order:
            n += 1
            sync()
            t0 = time.perf_counter()
            runners[name](layer, base / f"out-{n}-{name}")
            times[name].append(time.perf_counter() - t0)
    ratios = [a / t for a, t in zip(times["artifactd"], times["tar"], strict=True)]
    mb = files * size / 1e6
    cols = []
    for name in ("artifactd", "tar"):
        med = statistics.median(times[name])
        cols.append(
            f"{name} {med:7.3f} s {1000 * med / files:7.4f} s/1k files {mb / med:7.0f} MB/s"
        )
    line = (
        f"{label:>16}  " + "  |  ".join(cols) + f"  |  ratio {statistics.median(ratios):.2f} "
        f"[{min(ratios):.2f}-{max(ratios):.2f}]"
    )
    print(line, flush=True)  # before the (long) delete of this series' targets
    shutil.rmtree(base, ignore_errors=True)  # the series has ended: its targets may go
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--files", default="1000,10000,100000", help="4 KiB-file tree sizes")
    parser.add_argument("--sizes", default="100,1000", help="MB of 16 MiB files per tree")
    parser.add_argument("--big", action="store_true", help="add a 5 GB tree")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--work", type=Path, default=None, help="work dir (default: a temp dir)")
    args = parser.parse_args()
    if shutil.which("zstd") is None or shutil.which("tar") is None:
        parser.error("needs zstd and tar on PATH")
    if args.work is not None and not args.work.is_dir():
        sys.exit(f"--work {args.work}: no such directory")
    work = Path(tempfile.mkdtemp(prefix="artifactd-bench-scale-", dir=args.work))
    cases = [(f"{n} x 4 KiB", n, 4096) for n in map(int, filter(None, args.files.split(",")))]
    sizes = [int(s) for s in args.sizes.split(",") if s] + ([5000] if args.big else [])
    cases += [(f"{mb} MB", max(1, mb * 10**6 // (16 << 20)), 16 << 20) for mb in sizes]
    print(f"rounds: {args.rounds}, alternating; medians; ratio = median of per-round ratios")
    try:
        for label, files, size in cases:
            case(work, label, files, size, args.rounds)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
