"""Making a staged tree durable on a busy disk: one ``syncfs`` against ``make_durable``.

Before a restore commits its marker, the staged files must be on disk. One
``syncfs`` does that in a single call, but it waits for every dirty page of
the filesystem, also another pod's (a model download, a checkpoint). This
bench writes a staged tree (--files files of 2-30 KiB, as a restore stages
them) and, beside it, --foreign-mib of another writer's data left dirty in
the page cache, then times making the tree durable both ways, alternating
which goes first round by round:

  syncfs        ``artifactd.fsutil.sync_filesystem``, what every restore did before
  make_durable  ``artifactd.fsutil.make_durable``, which fsyncs the tree's own
                files when the page cache holds more than FOREIGN_DIRTY_MAX
                (plus FSYNC_COST_BYTES a file) besides them, and takes the
                syncfs otherwise

and prints the medians and the per-round ratio syncfs / make_durable, for a
quiet disk (no foreign data: make_durable must cost what syncfs costs) and
for a busy one. Everything written stays until the end (a mass delete slows
this VM's next file creations), then goes.

Usage: python bench/busy_disk.py [--files 2000] [--foreign-mib 1024] [--rounds 3] [--work DIR]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from artifactd.fsutil import make_durable, sync_filesystem  # noqa: E402


def write_tree(root: Path, files: int, seed: int) -> int:
    """Write a Triton-like tree of ``files`` files; return its bytes."""
    rnd = random.Random(seed)
    data = os.urandom(30 << 10)
    total = 0
    for i in range(files):
        d = root / f"d{i // 4:05d}"
        if i % 4 == 0:
            d.mkdir(parents=True)
        size = rnd.randint(2 << 10, 30 << 10)
        (d / f"k{i}.cubin").write_bytes(data[:size])
        total += size
    return total


def write_foreign(path: Path, mib: int) -> None:
    """Leave ``mib`` MiB of another writer's data dirty in the page cache."""
    block = os.urandom(1 << 20)
    with open(path, "wb") as f:
        for _ in range(mib):
            f.write(block)


def round_once(work: Path, tag: str, way: str, files: int, foreign_mib: int) -> tuple[float, str]:
    """Stage a tree beside ``foreign_mib`` MiB of dirty data; time making it durable ``way``."""
    os.sync()  # what earlier rounds left dirty is not this round's
    if foreign_mib:
        write_foreign(work / f"foreign-{tag}", foreign_mib)
    tree = work / f"tree-{tag}"
    written = write_tree(tree, files, seed=len(tag))
    t0 = time.perf_counter()
    if way == "syncfs":
        sync_filesystem(tree)
        taken = "syncfs"
    else:
        taken = make_durable(tree, written, files)
    return time.perf_counter() - t0, taken


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--files", type=int, default=2000, help="files in the staged tree")
    parser.add_argument("--foreign-mib", type=int, default=1024, help="another writer's dirty MiB")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per case")
    parser.add_argument("--work", type=Path, help="scratch directory (default: a new temp dir)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="artifactd-busy-", dir=args.work))
    try:
        for case, foreign in (("quiet disk", 0), ("busy disk", args.foreign_mib)):
            times: dict[str, list[float]] = {"syncfs": [], "make_durable": []}
            taken: set[str] = set()
            for r in range(args.rounds):
                order = ["syncfs", "make_durable"] if r % 2 == 0 else ["make_durable", "syncfs"]
                for way in order:
                    seconds, how = round_once(work, f"{case[0]}{r}{way}", way, args.files, foreign)
                    times[way].append(seconds)
                    if way == "make_durable":
                        taken.add(how)
            ratios = [s / m for s, m in zip(times["syncfs"], times["make_durable"], strict=True)]
            print(
                f"{case} ({foreign} MiB foreign dirty, {args.files} files): "
                f"syncfs {statistics.median(times['syncfs']):.3f} s, "
                f"make_durable {statistics.median(times['make_durable']):.3f} s "
                f"(took: {', '.join(sorted(taken))}); syncfs / make_durable "
                f"{statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]"
            )
    finally:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
