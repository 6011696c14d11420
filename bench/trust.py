"""What verification costs a pod start: restore with and without ``--verify-key``.

Publishes a synthetic artifact (one generic cache of ``--files`` random files
of ``--size`` bytes) into a fresh local OCI layout, signed with a fresh key,
then times, side by side in one run (medians of ``--runs``), as new processes
the way an init container runs them:

  restore           into a fresh target, no policy
  restore+verify    into a fresh target, --verify-key
  no-op             again into a restored target, no policy
  no-op+verify      again into a target restored under the key, --verify-key

and prints the ratios. Verification reads one small signature manifest and
payload per manifest it installs and loads the crypto library; a no-op under
a policy only hashes the public key's PEM (no crypto import).

Usage: python bench/trust.py [--runs 7] [--files 200] [--size 65536]
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


def run(args: list[str], env: dict[str, str]) -> float:
    """Run ``artifactd ARGS`` as a new process; its wall time (it must exit 0)."""
    t0 = time.monotonic()
    argv = [sys.executable, "-m", "artifactd", *args]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    took = time.monotonic() - t0
    if proc.returncode != 0:
        sys.exit(f"artifactd {' '.join(args)} failed:\n{proc.stderr[-2000:]}")
    return took


def main() -> None:
    """Publish, then time the four restores and print medians and ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--size", type=int, default=64 << 10)
    opts = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="artifactd-bench-trust-"))
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
        }
        store = f"oci:{work / 'store'}"
        run(["keygen", "--out", str(work / "k")], env)
        run(["harvest", "--store", store, "--family", "generic", "--gpu-arch", "sm_90a",
             "--sign-key", str(work / "k.key")], env)  # fmt: skip
        base = ["restore", "--store", store, "--gpu-arch", "sm_90a", "--family", "generic"]
        key = ["--verify-key", str(work / "k.pub")]
        times: dict[str, list[float]] = {k: [] for k in ("plain", "verify", "noop", "noop+v")}
        for i in range(opts.runs):
            for name, extra in (("plain", []), ("verify", key)):
                target = work / f"t-{name}-{i}"
                times[name].append(run([*base, "--target", str(target), *extra], env))
                noop = "noop" if name == "plain" else "noop+v"
                times[noop].append(run([*base, "--target", str(target), *extra], env))
                shutil.rmtree(target)
        med = {k: statistics.median(v) for k, v in times.items()}
        size = opts.files * opts.size
        print(f"artifact: 1 family, {opts.files} files, {size / 2**20:.1f} MiB; runs {opts.runs}")
        print(f"  restore            {med['plain']:.3f} s")
        print(f"  restore+verify     {med['verify']:.3f} s   ({med['verify'] / med['plain']:.2f}x)")
        print(f"  no-op              {med['noop']:.3f} s")
        print(f"  no-op+verify       {med['noop+v']:.3f} s   ({med['noop+v'] / med['noop']:.2f}x)")
        print(json.dumps({k: round(v, 4) for k, v in med.items()}))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
