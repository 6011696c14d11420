"""Instructions a pod-start command executes, against a bare Python start, under callgrind.

Wall-clock start-up ratios (``bench/coldstart.py``) swing with the machine's
load; the instructions a command executes do not. This counts them with
valgrind's callgrind (``valgrind --tool=callgrind``, every thread, the
interpreter's start and exit included) for a bare ``python -c pass``,
``fingerprint --hash``, a no-op restore and a restore that installs a small
cache into a new target, each the median of --runs, and prints each as a
ratio to the bare start. Instructions are not time (a syscall, a page fault or
a cache miss costs more than one), but an import or a model build that is
gone shows here on any machine, loaded or not. Every command runs in the plain
environment of ``bench/plainenv.py`` (an installed artifactd's start, without a
development install's editable finder). Needs ``valgrind`` on PATH.

Usage: python bench/instructions.py [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from coldstart import bytecode_env, small_store  # noqa: E402
from plainenv import command, plain_python  # noqa: E402

from artifactd.constants import ENV_CACHE_DIR  # noqa: E402

COLLECTED = re.compile(r"Collected : (\d+)")


def instructions(argv: list[str], env: dict[str, str]) -> int:
    """Return the instructions ``argv`` executed, counted by callgrind."""
    proc = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv],
        env=env,
        cwd=REPO,  # `python -m` imports from the working directory first: this checkout
        capture_output=True,
        text=True,
        check=True,
    )
    found = COLLECTED.search(proc.stderr)
    if found is None:
        sys.exit(f"callgrind printed no count: {proc.stderr[-500:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per command (median)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not on PATH (apt-get install valgrind)")
    work = Path(tempfile.mkdtemp(prefix="artifactd-instructions-"))
    try:
        py = plain_python(work)  # as installed: no editable finder in every start
        base = dict(os.environ) | {ENV_CACHE_DIR: str(work / "probe-cache")}
        store, target = small_store(py, work, base)
        env = bytecode_env(base, work / "pycache")
        artifactd = command(py)  # the console script, as a pod runs it
        restore = [*artifactd, "restore", "--json", "--store", store]
        fp = ["--gpu-arch", "sm_90a"]
        real = work / "real"
        commands = {
            "python -c pass": [py, "-c", "pass"],
            "fingerprint --hash": [*artifactd, "fingerprint", "--hash", *fp],
            "no-op restore": [*restore, "--target", str(target), *fp],
            "restore that installs": [*restore, "--target", str(real), *fp],
        }
        counts: dict[str, list[int]] = {name: [] for name in commands}
        for argv in commands.values():  # once untimed: the bytecode cache fills
            shutil.rmtree(real, ignore_errors=True)
            subprocess.run(argv, env=env, cwd=REPO, capture_output=True, check=True)
        for _ in range(args.runs):
            for name, argv in commands.items():
                shutil.rmtree(real, ignore_errors=True)
                counts[name].append(instructions(argv, env))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    bare = statistics.median(counts["python -c pass"])
    print(f"{f'median of {args.runs}':28} {'M instr':>8} {'x bare':>7}  min-max M")
    for name, ns in counts.items():
        med = statistics.median(ns)
        print(
            f"{name:28} {med / 1e6:8.1f} {med / bare:7.2f}  {min(ns) / 1e6:.1f}-{max(ns) / 1e6:.1f}"
        )


if __name__ == "__main__":
    main()
