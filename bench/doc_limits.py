"""What the document size limits are sized from: a big harvest, and parsing at the limits.

Harvests a synthetic Triton cache of ``--files`` files (real layout: one
``<key>/`` directory per kernel with ``.cubin``, ``.json``, ``.ptx`` and a
``__grp__`` file; real-length names) with artifactd's own harvest into a
fresh OCI layout, then reports the artifact config's size, the family tree
document's size and their bytes per file entry. Then, each in a fresh Python
so the peak is its own, it parses a tree document and a config padded to
:data:`artifactd.format.config.MAX_TREE_DOC` and
:data:`artifactd.stores.artifacts.MAX_CONFIG_BYTES`
(the same entries repeated under new names) and reports the peak resident
memory (``VmHWM``: ``ru_maxrss`` would include the parent's) and the time.
Last, ``artifactd restore --from-dir`` of the harvested artifact unpacked as
a runtime unpacks it (honest), and of the same tree with its document padded
to the limit (hostile: refused once the tree is walked), with their time and
peak memory.

Measured on the 2-core development VM (shared), 100,000 files: 245 B per
file entry in both documents; parsing 47 MiB of tree document 1.1-1.5 s,
+440 MiB; 55 MiB of config 1.3-1.7 s, +510 MiB; the honest restore 48-58 s,
378 MiB; the padded one refused after 20-32 s at 680-690 MiB.

Usage: python bench/doc_limits.py [--files 100000]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import zstandard

from artifactd.build.harvest import harvest
from artifactd.fingerprint.probe import probe_fingerprint
from artifactd.format.config import MAX_TREE_DOC
from artifactd.stores import open_store
from artifactd.stores.artifacts import read_artifact, read_config
from artifactd.stores.reading import MAX_CONFIG_BYTES

REPO = Path(__file__).resolve().parent.parent

#: Parses one document from a file in a fresh interpreter; prints seconds and peak RSS.
PARSE = """
import resource, sys, time
from pathlib import Path
kind, path = sys.argv[1], sys.argv[2]

def peak():
    # VmHWM, not ru_maxrss: ru_maxrss survives exec, so a child would report its parent's peak.
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

base = peak()
if kind == "tree":
    from artifactd.format.config import FamilyTree as Doc
else:
    from artifactd.format.config import ArtifactConfig as Doc
data = Path(path).read_bytes()
t0 = time.monotonic()
doc = Doc.from_json(data, source=path)
seconds = time.monotonic() - t0
print(f"{seconds:.2f} {peak() >> 10} {base >> 10}")
"""


def make_cache(root: Path, files: int) -> None:
    """A Triton cache of about ``files`` files in its real layout (4 per kernel)."""
    for i in range(files // 4):
        key = f"{i:052X}"
        d = root / key
        d.mkdir(parents=True)
        name = f"triton_poi_fused_add_mul_{i}"
        children = {}
        for ext in ("cubin", "json", "ptx"):
            (d / f"{name}.{ext}").write_bytes(f"{i}.{ext}".encode())
            children[f"{name}.{ext}"] = str(d / f"{name}.{ext}")
        (d / f"__grp__{name}.json").write_text(json.dumps({"child_paths": children}))


def restore_cost(tree: Path, target: Path) -> tuple[float, int, str]:
    """Seconds, peak RSS (MiB) and status of ``artifactd restore --from-dir TREE``."""
    prelude = (
        "import atexit, sys\n"
        "def _peak():\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith('VmHWM:'):\n"
        "            sys.stderr.write(f'PEAK_KIB={line.split()[1]}\\n')\n"
        "atexit.register(_peak)\n"
        "from artifactd.cli import main\n"
        "main()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = ["restore", "--from-dir", str(tree), "--target", str(target), "--gpu-arch", "sm_90a"]
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", prelude, *args, "--json"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    seconds = time.monotonic() - t0
    peak = next(x for x in proc.stderr.splitlines() if x.startswith("PEAK_KIB="))
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    failure = doc.get("failure") or {}
    status = doc["status"] + (f" ({failure.get('message', '')[:60]})" if failure else "")
    return seconds, int(peak.split("=")[1]) >> 10, status


def runtime_merge(store_dir: Path, dest: Path) -> None:
    """Unpack every layer of the store's one artifact into ``dest``, as a runtime does."""
    store = open_store(f"oci:{store_dir}")
    tag = next(t for t in store.list_tags() if t.startswith("fp-"))
    art = read_artifact(store, tag)
    assert art is not None
    for desc in art.manifest.layers:
        with store.open_blob(desc.digest, desc.size) as blob:
            data = zstandard.ZstdDecompressor().decompressobj().decompress(blob.read())
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(dest)  # noqa: S202 - the layers this script just packed


def harvest_sizes(work: Path, files: int) -> tuple[bytes, bytes]:
    """Harvest the synthetic cache; return (config bytes, triton tree document bytes)."""
    make_cache(work / "triton", files)
    store = open_store(f"oci:{work / 'store'}", create=True)
    environ = {
        "TRITON_CACHE_DIR": str(work / "triton"),
        "HOME": str(work / "home"),
        "TMPDIR": str(work / "tmp-empty"),
        "TORCHINDUCTOR_CACHE_DIR": str(work / "none"),
    }
    result = harvest(store, probe_fingerprint(gpu_arch="sm_90a", use_nvml=False), environ=environ)
    art = read_artifact(store, result.digest)
    assert art is not None
    config = read_config(store, art.manifest)
    tree = next(r for r in art.config.layers if r.family == "triton").tree().canonical()
    return config, tree


def padded(doc: dict[str, Any], size: int, key: str) -> bytes:
    """``doc`` with its ``files`` list repeated (under new paths) until it is ``size`` bytes."""
    files = doc[key] if key == "files" else doc["layers"][0]["files"]
    entry = json.dumps(files[0], separators=(",", ":"))
    out: list[dict[str, Any]] = []
    per = len(entry) + 9  # each copy's path gains ".<i>"
    for i in range(max(1, (size - (64 << 10)) // per)):
        e = dict(files[i % len(files)])
        e["path"] = f"{e['path']}.{i}"
        out.append(e)
    if key == "files":
        doc = {**doc, "files": out}
        doc["unpacked_size"] = sum(e["size"] for e in out)
    else:
        layer = {**doc["layers"][0], "files": out}
        layer["unpacked_size"] = sum(e["size"] for e in out)
        doc = {**doc, "layers": [layer]}
    return json.dumps(doc, separators=(",", ":")).encode()


def parse_cost(kind: str, data: bytes, work: Path) -> tuple[float, int]:
    """Seconds and peak RSS (MiB, over the interpreter's own) to parse ``data``."""
    path = work / f"{kind}.json"
    path.write_bytes(data)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", PARSE, kind, str(path)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode:
        raise SystemExit(proc.stderr[-2000:])
    seconds, peak, base = proc.stdout.split()
    return float(seconds), int(peak) - int(base)


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="artifactd-doclimits-") as tmp:
        work = Path(tmp)
        t0 = time.monotonic()
        config, tree = harvest_sizes(work, args.files)
        n = len(json.loads(tree)["files"])
        print(f"harvest of {n} files: {time.monotonic() - t0:.1f} s")
        print(f"  config {len(config)} B ({len(config) / n:.0f} B/file)")
        print(f"  tree document {len(tree)} B ({len(tree) / n:.0f} B/file)")
        for kind, limit, key, data in (
            ("tree", MAX_TREE_DOC, "files", tree),
            ("config", MAX_CONFIG_BYTES, "layers", config),
        ):
            doc = padded(json.loads(data), limit, key)
            seconds, peak = parse_cost(kind, doc, work)
            print(
                f"  parse a {kind} of {len(doc) >> 20} MiB (limit {limit >> 20} MiB): "
                f"{seconds:.1f} s, peak +{peak} MiB"
            )
        tree_dir = work / "mnt"
        runtime_merge(work / "store", tree_dir)
        seconds, peak, status = restore_cost(tree_dir, work / "target")
        print(
            f"  restore --from-dir of those {n} files: {seconds:.1f} s, peak {peak} MiB: {status}"
        )
        doc_path = tree_dir / "triton" / ".artifactd-layer.json"
        doc_path.write_bytes(padded(json.loads(tree), MAX_TREE_DOC, "files"))
        seconds, peak, status = restore_cost(tree_dir, work / "target2")
        print(
            f"  restore --from-dir, its document padded to {doc_path.stat().st_size >> 20} MiB: "
            f"{seconds:.1f} s, peak {peak} MiB: {status}"
        )


if __name__ == "__main__":
    main()
