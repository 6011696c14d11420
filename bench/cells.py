"""The builder on one node and fanned out: the CPU demo matrix split into cells.

Builds ``warmup_matrices/cpu-demo-cells.yaml`` (one cell per compiler:
Inductor, Triton AOT, nvcc) three ways, each from fresh cache roots into a
fresh local OCI layout store, in one run so the figures are side by side:

  sequential  `artifactd build MATRIX --jobs 1`: one cell after another
  packed      `artifactd build MATRIX --jobs N`: as many at once as the jobs allow
  fan-out     `artifactd build MATRIX --cell I --run-id R` per cell (as CI
              workers would, here one after another), then `artifactd merge`

and prints wall times, the merge's time and bytes uploaded (a second merge,
which must upload nothing, too). On a machine with few cores the packed
build gains little: the Inductor cell is most of the work.

Usage: python bench/cells.py [--jobs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MATRIX = REPO / "warmup_matrices" / "cpu-demo-cells.yaml"


def artifactd(*args: str, env: dict[str, str]) -> tuple[float, dict[str, Any]]:
    """Run ``artifactd ARGS --json``; its wall time and its document."""
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
        sys.exit(f"artifactd {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    doc: dict[str, Any] = json.loads(proc.stdout)
    return seconds, doc


def main() -> None:
    """Build the matrix three ways; print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3, help="CPU-only cells at once when packed")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="artifactd-cells-bench-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARTIFACTD_")}
    env["HOME"] = str(work / "home")
    rows: list[tuple[str, float, str]] = []

    seq_s, seq = artifactd(
        "build", str(MATRIX), "--store", f"oci:{work / 'seq'}", "--jobs", "1", env=env
    )
    cells = ", ".join(f"{c['id']} {c['seconds']:.1f} s" for c in seq["cells"])
    rows.append(("sequential build (--jobs 1)", seq_s, cells))
    packed_s, _ = artifactd(
        "build", str(MATRIX), "--store", f"oci:{work / 'packed'}", "--jobs", str(args.jobs),
        env=env,
    )  # fmt: skip
    rows.append((f"packed build (--jobs {args.jobs})", packed_s, f"{seq_s / packed_s:.2f}x"))

    store = f"oci:{work / 'fanout'}"
    count = len(json.loads(subprocess.run(
        [sys.executable, "-m", "artifactd", "matrix", "cells", str(MATRIX), "--json"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout)["include"])  # fmt: skip
    cell_s = 0.0
    for index in range(count):
        s, _ = artifactd(
            "build", str(MATRIX), "--cell", str(index), "--run-id", "bench", "--store", store,
            env=env,
        )  # fmt: skip
        cell_s += s
    rows.append((f"fan-out: {count} cell builds", cell_s, "one after another here"))
    merge_s, merged = artifactd(
        "merge", str(MATRIX), "--run-id", "bench", "--store", store, env=env
    )
    how = ", ".join(f"{f['family']} {f['how']}" for f in merged["families"])
    rows.append(("merge", merge_s, f"uploaded {merged['bytes_uploaded']} B; {how}"))
    again_s, again = artifactd("merge", str(MATRIX), "--run-id", "bench", "--store", store, env=env)
    same = "same digest" if again["digest"] == merged["digest"] else "ANOTHER DIGEST"
    rows.append(("merge again", again_s, f"uploaded {again['bytes_uploaded']} B; {same}"))

    print(f"cells: the CPU demo matrix in {count} cells, on {os.cpu_count()} CPU(s)")
    print(f"  {'run':<32} {'seconds':>8}  notes")
    for name, seconds, notes in rows:
        print(f"  {name:<32} {seconds:>8.1f}  {notes}")


if __name__ == "__main__":
    main()
