"""Cold start vs restored start, measured side by side in one run.

Prints, for the CPU demo matrix:
  cold      warm-up with fresh, empty caches
  restore   `artifactd restore` into a new dir, as a new process
  restored  warm-up with only the restored caches (new TMPDIR, build gone)
  local     warm-up again with the build's own caches left in place
and the ratios restored/cold and restored/local. Then the wall time of
`artifactd fingerprint` and of a no-op restore (marker already matches), each
the median of several runs, and whether either imported torch.

Usage: python bench/coldstart.py [--runs 7]
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
WARMUP = REPO / "warmup_matrices" / "cpu-demo" / "warmup.py"
sys.path.insert(0, str(REPO))

from artifactd.build import cell_environ  # noqa: E402
from artifactd.demo import restored_environ  # noqa: E402


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed:\n{proc.stderr[-2000:]}")
    return elapsed, proc.stdout


def compiled(stdout: str) -> int:
    return int(json.loads(stdout.strip().splitlines()[-1])["compiled"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    py = sys.executable
    work = Path(tempfile.mkdtemp(prefix="artifactd-bench-"))
    base = dict(os.environ)
    try:
        roots = work / "build"
        env = cell_environ(roots, ["inductor", "triton", "generic"], {}, base)
        warm_argv = [py, str(WARMUP)]
        cold_s, out = timed(warm_argv, env)
        cold_n = compiled(out)
        local_s, out = timed(warm_argv, env)
        local_n = compiled(out)

        store = f"oci:{work / 'store'}"
        timed([py, "-m", "artifactd", "harvest", "--store", store, "--gpu-arch", "sm_90a"], env)
        shutil.rmtree(roots)  # nothing of the build is left for the restored run

        target = work / "pod"
        restore_argv = [
            py,
            "-m",
            "artifactd",
            "restore",
            "--store",
            store,
            "--target",
            str(target),
            "--gpu-arch",
            "sm_90a",
        ]
        restore_s, _ = timed(restore_argv, base)
        renv = restored_environ(target / "artifactd.env", base)
        restored_s, out = timed(warm_argv, renv)
        restored_n = compiled(out)

        noop = [timed(restore_argv, base)[0] for _ in range(args.runs)]
        fp = [
            timed([py, "-m", "artifactd", "fingerprint", "--hash"], base)[0]
            for _ in range(args.runs)
        ]
        probe = (
            "import sys, artifactd.cli, artifactd.restore, artifactd.fingerprint as f; "
            "f.probe(); print('torch' in sys.modules, 'triton' in sys.modules)"
        )
        imports = subprocess.run(
            [py, "-c", probe], capture_output=True, text=True, check=True
        ).stdout.split()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"{'stage':40} {'seconds':>8} {'compiled':>9}")
    print(f"{'cold warm-up (fresh caches)':40} {cold_s:8.2f} {cold_n:9d}")
    print(f"{'artifactd restore (new process)':40} {restore_s:8.2f} {'-':>9}")
    print(f"{'warm-up on restored caches':40} {restored_s:8.2f} {restored_n:9d}")
    print(f"{'warm-up, local caches left in place':40} {local_s:8.2f} {local_n:9d}")
    print(f"restored/cold  = {restored_s / cold_s:.3f}")
    print(f"restored/local = {restored_s / local_s:.3f}")
    print(f"(restore + restored)/cold = {(restore_s + restored_s) / cold_s:.3f}")
    print(
        f"artifactd fingerprint --hash: median {statistics.median(fp):.3f} s "
        f"(min {min(fp):.3f}, max {max(fp):.3f}, n={len(fp)})"
    )
    print(
        f"no-op restore:                median {statistics.median(noop):.3f} s "
        f"(min {min(noop):.3f}, max {max(noop):.3f}, n={len(noop)})"
    )
    print(f"imports torch: {imports[0]}, imports triton: {imports[1]}")


if __name__ == "__main__":
    main()
