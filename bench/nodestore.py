"""A restore from a warm node store against `cp -al` and `cp -a` of the same tree.

Builds a Triton-like tree (--files files of 2-30 KiB, about 4 a directory;
18,000 by default, about 300 MB), publishes it as a generic layer to a local
layout, and restores it once with --node-store (which fills the node store and
unpacks the layer there). Then, --rounds times, in an order that alternates
round by round:

  restore   `artifactd restore --node-store` into a new target, as a new process
            (start, probe, lookup, plan, serve, install, marker: all of it)
  cp -al    `cp -al` of the node store's unpacked tree into a new directory
  cp -a     `cp -a` of the same tree

and prints the medians (wall seconds, and the CPU seconds the process used,
user and system), the median of the per-round ratios restore / cp -al
(target: at most 1.3) and restore / cp -a, with their ranges, the restore's
phases (from its --json: lookup, verify, fetch, install), the ratio of its
fetch phase (here: checking and linking every file) to cp -al, and how the
restore took its files (linked, reflinked, copied, from its events). Before
each timed command the filesystem is synced, untimed: the restore syncs
before its commit, and would otherwise pay for the bytes the round's `cp -a`
left dirty (a pod's restore pays for its own writes, not a benchmark's). The
rounds' trees stay until the end (about 3.5 GB with --header): ext4 without a
journal skips every inode freed in the last 60 s (360 s while its inode
table block is dirty) when it picks one for a new directory, a lookup each,
so trees removed between rounds would make the next rounds' `mkdir`s pay
for tens of thousands of freed inodes. Start it a minute after removing
many files for the same reason. With
--header, the same for one file of 156 MB (the CPU demo's precompiled header):
linked, it costs what `cp -al` costs, whatever its size. Every artifactd
process runs in the plain environment of bench/plainenv.py: it starts as an
installed artifactd does.

Usage: python bench/nodestore.py [--files 18000] [--rounds 7] [--header] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from plainenv import command, plain_python  # noqa: E402

TARGET = 1.3
#: The interpreter every artifactd process runs on: set by main() (see bench/plainenv.py).
PY = [sys.executable]


def make_tree(root: Path, files: int, seed: int = 32) -> int:
    """Write ``files`` files of 2-30 KiB, about 4 a directory, half random; return the bytes."""
    rng = random.Random(seed)
    total = 0
    for i in range(files):
        d = root / f"{i // 4:052x}"
        if i % 4 == 0:
            d.mkdir(parents=True)
        size = rng.randint(2 << 10, 30 << 10)
        (d / f"k{i}.cubin").write_bytes(os.urandom(size // 2) + bytes(size - size // 2))
        total += size
    return total


def make_header(root: Path, size: int = 156 << 20) -> int:
    """Write one file of ``size`` bytes, as the CPU demo's precompiled header."""
    root.mkdir(parents=True)
    with (root / "c10.h.gch").open("wb") as f:
        left = size
        while left:
            chunk = min(left, 8 << 20)
            f.write(os.urandom(chunk // 4) + bytes(chunk - chunk // 4))
            left -= chunk
    return size


def artifactd(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run the CLI as a new process, as an init container does (``-m``: from REPO, see timed)."""
    return subprocess.run(
        [PY[0], "-m", "artifactd", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )


def cpu_of_children() -> float:
    """Return the user and system CPU seconds of the children waited for so far."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def timed(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float, str, str]:
    """Run ``argv`` on a synced filesystem; return wall and CPU seconds, stderr and stdout."""
    os.sync()
    cpu = cpu_of_children()
    start = time.perf_counter()
    # In REPO: `python -m` puts the working directory first on the import path, so a bench
    # started in another checkout would otherwise time that checkout's code, not REPO's.
    proc = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{argv[:4]} failed: {proc.stderr[-2000:]}")
    return seconds, cpu_of_children() - cpu, proc.stderr, proc.stdout


def case(name: str, tree: Path, work: Path, rounds: int) -> bool:
    """Publish ``tree``, fill a node store, time the three ways; True when on target."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "HOME": str(work / "home"),
        "ARTIFACTD_GENERIC_DIR": str(tree),
        "TMPDIR": str(work / "no-tmp"),
    }
    store, node = f"oci:{work / 'origin'}", f"oci:{work / 'node'}"
    t0 = time.perf_counter()
    proc = artifactd("harvest", "--store", store, "--family", "generic", "--json", env=env)
    if proc.returncode:
        raise SystemExit(proc.stderr[-2000:])
    print(f"[{name}] published in {time.perf_counter() - t0:.1f} s")
    restore = [
        *command(PY[0]), "restore", "--family", "generic",
        "--store", store, "--node-store", node, "--json", "--require",
    ]  # fmt: skip
    t0 = time.perf_counter()
    timed([*restore, "--target", str(work / "fill")], env)
    print(f"[{name}] node store filled (fetch, unpack, serve) in {time.perf_counter() - t0:.1f} s")
    unpacked = next((work / "node" / "unpacked").iterdir()) / "cache"
    times: dict[str, list[float]] = {"restore": [], "cp -al": [], "cp -a": []}
    cpus: dict[str, list[float]] = {way: [] for way in times}
    phases: dict[str, list[float]] = {}
    how = ""
    for r in range(rounds):
        ways = ["restore", "cp -al", "cp -a"]
        order = ways if r % 2 == 0 else ways[::-1]
        for way in order:
            dest = work / f"round-{r}-{way.replace(' ', '')}"
            if way == "restore":
                seconds, cpu, err, out = timed([*restore, "--target", str(dest)], env)
                for phase, value in json.loads(out)["phases"].items():
                    phases.setdefault(phase, []).append(value)
                served = [json.loads(x) for x in err.splitlines() if '"served"' in x]
                if served:
                    s = served[0]
                    how = f"linked {s['linked']}, reflinked {s['reflinked']}, copied {s['copied']}"
            else:
                seconds, cpu, _, _ = timed(["cp", way.split()[1], str(unpacked), str(dest)])
            times[way].append(seconds)
            cpus[way].append(cpu)
    al = [a / b for a, b in zip(times["restore"], times["cp -al"], strict=True)]
    a = [x / y for x, y in zip(times["restore"], times["cp -a"], strict=True)]
    for way, values in times.items():
        print(f"[{name}] {way:8} median {statistics.median(values):.3f} s  "
              f"[{min(values):.3f}-{max(values):.3f}]  "
              f"CPU {statistics.median(cpus[way]):.3f} s")  # fmt: skip
    parts = ", ".join(f"{k} {statistics.median(v):.3f}" for k, v in phases.items())
    print(f"[{name}] the restore's phases (median s): {parts}")
    serve = [f / c for f, c in zip(phases["fetch"], times["cp -al"], strict=True)]
    print(
        f"[{name}] its serve (the fetch phase: check and link every file) / cp -al "
        f"{statistics.median(serve):.2f} [{min(serve):.2f}-{max(serve):.2f}]"
    )
    cpu_al = [a / max(b, 1e-3) for a, b in zip(cpus["restore"], cpus["cp -al"], strict=True)]
    print(f"[{name}] CPU seconds, restore / cp -al {statistics.median(cpu_al):.2f}")
    ok = statistics.median(al) <= TARGET
    print(
        f"[{name}] restore / cp -al {statistics.median(al):.2f} [{min(al):.2f}-{max(al):.2f}] "
        f"({'ok' if ok else 'FAIL'} against {TARGET}); restore / cp -a "
        f"{statistics.median(a):.2f} [{min(a):.2f}-{max(a):.2f}]; the restore {how}"
    )
    return ok


def main() -> int:
    """Build the trees, run the cases, print the table; exit 1 when a target is missed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--files", type=int, default=18_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--header", action="store_true", help="also one 156 MB file")
    parser.add_argument("--dir", type=Path, default=None, help="work here (default: a temp dir)")
    args = parser.parse_args()
    if not 1 <= args.files <= 1_000_000 or not 1 <= args.rounds <= 100:
        parser.error("--files 1-1000000, --rounds 1-100")
    if args.dir is not None and not args.dir.is_dir():
        sys.exit(f"--dir {args.dir}: no such directory")
    work = Path(tempfile.mkdtemp(prefix="artifactd-nodestore-", dir=args.dir))
    PY[0] = plain_python(work)  # starts as an installed artifactd does
    ok = True
    try:
        total = make_tree(work / "small" / "tree", args.files)
        print(f"tree: {args.files} files, {total / 1e6:.0f} MB")
        ok = case(f"{args.files} files", work / "small" / "tree", work / "small", args.rounds)
        if args.header:
            make_header(work / "header" / "tree")
            header = case("156 MB header", work / "header" / "tree", work / "header", args.rounds)
            ok = ok and header
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
