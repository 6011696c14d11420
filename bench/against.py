"""What a change costs a pod start: restore and no-op, this tree against another checkout.

Publishes one synthetic artifact (one generic cache of ``--files`` random
files of ``--size`` bytes, signed with a fresh key) into a fresh local OCI
layout with each tree's own artifactd (so a change of format or key does not
make the baseline miss), then times, side by side in one run and
interleaved (medians of ``--runs``), each as a new process the way an init
container runs it, with this tree's library and with ``--baseline``'s:

  restore           into a fresh target, no policy
  restore+verify    into a fresh target, --verify-key
  no-op             again into a restored target, no policy
  no-op+verify      again into a target restored under the key, --verify-key

and prints, per row, both medians and the ratio this/baseline. The
baseline is any checkout of artifactd that reads the same format (make one
with ``git worktree add /tmp/base <commit>``).

Usage: python bench/against.py --baseline /tmp/base [--runs 9] [--files 200] [--size 65536]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROWS = ("restore", "restore+verify", "no-op", "no-op+verify")


def run(tree: Path, args: list[str], env: dict[str, str]) -> float:
    """Run ``artifactd ARGS`` from ``tree`` as a new process; its wall time (it must exit 0).

    The process runs in ``tree`` with it first on ``PYTHONPATH``: ``-m`` puts
    the working directory first on ``sys.path``, so that tree's package is the
    one imported, whatever the virtualenv has installed.
    """
    t0 = time.monotonic()
    argv = [sys.executable, "-m", "artifactd", *args]
    proc = subprocess.run(
        argv,
        env={**env, "PYTHONPATH": str(tree)},
        cwd=tree,
        capture_output=True,
        text=True,
        check=False,
    )
    took = time.monotonic() - t0
    if proc.returncode != 0:
        sys.exit(f"{tree}: artifactd {' '.join(args)} failed:\n{proc.stderr[-2000:]}")
    return took


def main() -> None:
    """Publish, then time the four rows for both trees and print medians and ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True, help="another artifactd checkout")
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--size", type=int, default=64 << 10)
    opts = parser.parse_args()
    baseline = opts.baseline.resolve()
    if not (baseline / "artifactd" / "__init__.py").is_file():
        sys.exit(f"{baseline} is not an artifactd checkout")
    work = Path(tempfile.mkdtemp(prefix="artifactd-bench-against-"))
    try:
        gen = work / "gen"
        gen.mkdir()
        for i in range(opts.files):
            (gen / f"k{i:04d}.cubin").write_bytes(os.urandom(opts.size))
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("ARTIFACTD_")},
            "ARTIFACTD_GENERIC_DIR": str(gen),
            "ARTIFACTD_CACHE_DIR": str(work / "probe-cache"),
            "TRITON_CACHE_DIR": str(work / "no-triton"),
            "TORCHINDUCTOR_CACHE_DIR": str(work / "no-inductor"),
            "PYTHONPYCACHEPREFIX": str(work / "pycache"),
        }
        run(REPO, ["keygen", "--out", str(work / "k")], env)
        trees = {"this": REPO, "baseline": baseline}
        stores = {name: f"oci:{work / ('store-' + name)}" for name in trees}
        for name, tree in trees.items():  # each publishes its own: formats and keys may differ
            run(tree, ["harvest", "--store", stores[name], "--family", "generic",
                       "--gpu-arch", "sm_90a", "--sign-key", str(work / "k.key")], env)  # fmt: skip
        key = ["--verify-key", str(work / "k.pub")]
        times: dict[tuple[str, str], list[float]] = {(t, r): [] for t in trees for r in ROWS}
        for i in range(opts.runs + 1):  # the first round only fills the bytecode caches
            for name, tree in trees.items():
                base = ["restore", "--store", stores[name], "--gpu-arch", "sm_90a"]
                base += ["--family", "generic"]
                for row, extra in (("restore", []), ("restore+verify", key)):
                    target = work / f"t-{name}-{row}-{i}"
                    took = run(tree, [*base, "--target", str(target), *extra], env)
                    again = run(tree, [*base, "--target", str(target), *extra], env)
                    if not (target / ".artifactd" / "restored.json").is_file():
                        sys.exit(f"{tree}: the restore installed nothing: not a fair comparison")
                    if i:
                        times[name, row].append(took)
                        times[name, row.replace("restore", "no-op")].append(again)
                    shutil.rmtree(target)
        med = {k: statistics.median(v) for k, v in times.items()}
        size = opts.files * opts.size
        print(f"artifact: 1 family, {opts.files} files, {size / 2**20:.1f} MiB; runs {opts.runs}")
        print(f"baseline: {baseline}")
        print(f"  {'':16} {'this':>9} {'baseline':>9} {'ratio':>7}")
        for row in ROWS:
            this, other = med["this", row], med["baseline", row]
            print(f"  {row:16} {this:8.3f}s {other:8.3f}s {this / other:6.2f}x")
        print(json.dumps({f"{t}/{r}": round(v, 4) for (t, r), v in med.items()}))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
