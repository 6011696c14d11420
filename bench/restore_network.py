"""Restore over a slow network, and from a node's local store, side by side with the alternatives.

Builds a realistic multi-family artifact (default ~400 MiB in ~3,700 files:
a Triton cache of a few hundred kernel dirs with their IR, cubins and group
files, a CUDA driver JIT cache of hashed SASS blobs, a generic tree of large
.so/.cubin files; part compressible, part not), harvests it with
``artifactd harvest`` into a CNCF distribution registry on 127.0.0.1, then
times, for each link rate (bench/throttle.py between the client and the
registry; ``off``: straight to the registry), each into a fresh directory on
the same disk:

  artifactd   ``artifactd restore --store REG --target T --require`` (the whole
              command: probe, resolve, fetch, verify, extract, install, marker),
              started as a pod starts it: the console script of a plain
              environment (``bench/plainenv.py``), not this development
              venv's ``python -m`` (11-15 ms more per start, which no pod pays)
  hand-built  download every layer to a file, then ``tar --zstd -xf`` each
              into the target: ``skopeo copy docker://REG:TAG dir:D``, an
              independent client (Go; there is no oras CLI here; into a
              ``dir:`` it fetches the layers one after another on one
              connection, where ``oras pull`` runs 3 at once: through one
              shared link rate that changes little), or with
              ``--baseline curl``, one ``curl --parallel`` of the layer blobs

and the floor: the layers' compressed bytes at the link rate (no restore can
beat it, so floor / hand-built is the lowest ratio reachable). Then the node
store case: ``artifactd restore --store oci:LAYOUT`` against ``cp -a`` of the
same unpacked tree. Goals: artifactd <= 0.6x hand-built at 1 Gbit/s,
<= 1.3x cp -a from a local layout. Then the mirror case: a pull-through cache
of the registry (the same registry binary with ``proxy: remoteurl:``, warmed
by one untimed restore) on 127.0.0.1, as a node-local Spegel or cache would
be, against the registry over the first link rate: ``artifactd restore
--mirror URL`` (tags and signatures from the registry, every blob from the
mirror by digest) against the same restore straight from the registry,
alternating, with the ratio.

Each run starts after a sync and a wait for writeback; the registry's blobs
stay in the page cache (they are the far end of the link). ``--drop-caches``
drops the page cache before every run instead (root only; it slows every
other process on the machine). No target is deleted before the last run:
on ext4 without a journal (this VM's root), allocating an inode skips every
inode freed in the last 30 s (5.5 min while its inode-table block is dirty,
which creating files next to it makes it), and that scan made every method
here 5-10x slower after an ``rm -rf`` of the previous target. So the run
needs about (runs x unpacked size) of free disk, which it checks first, and
numbers taken soon after anything deleted many files on the same
filesystem are inflated.

``--tree small`` replaces the artifact with a Triton-like cache of 18,000
files of 2-30 KiB (the per-file cost), ``--tree big`` with two files of
``--big-gib`` GiB (the per-byte cost); ``--baseline stream`` compares with
``curl BLOB | zstd -dc | tar -x``, every layer at once, which overlaps the
download and the disk as a restore does. ``--against DIR`` also times the
restore of another checkout (``git archive main | tar -x -C DIR``), run
from a plain environment of its own, in the same alternating rounds through
the same link, and prints the per-round ratios of wall and CPU time: a before/after
comparison that one machine's load drift does not skew. Every method's CPU
seconds (user + system of its processes) are printed beside its time. Ratios
are the median of the per-round ratios, with their range.

Usage: python bench/restore_network.py [--size-mib 400] [--rates 1g,10g,off]
           [--rounds 7] [--rtt-ms 0.5] [--per-conn off] [--baseline skopeo|curl|stream]
           [--tree mixed|small|big] [--big-gib 1] [--against DIR]
           [--skip-local] [--skip-mirror] [--drop-caches] [--keep] [--dir DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

from plainenv import command, plain_python  # noqa: E402
from registry_server import RegistryServer, start_registry  # noqa: E402
from throttle import Throttle, format_rate, parse_rate  # noqa: E402

PY = sys.executable
MiB = 1 << 20
#: The cache variables a harvest or restore could pick up from this machine.
CACHE_VARS = (
    "TRITON_CACHE_DIR",
    "TRITON_HOME",
    "TORCHINDUCTOR_CACHE_DIR",
    "CUDA_CACHE_PATH",
    "TMPDIR",
)


# --------------------------------------------------------------------------
# The artifact
# --------------------------------------------------------------------------


class Data:
    """Bytes for synthetic files: text that compresses like IR (~3.4x at zstd -6), or binaries."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        alphabet = b"abcdefghijklmnopqrstuvwxyz_0123456789.%"
        words = [bytes(self.rng.choices(alphabet, k=self.rng.randint(2, 10))) for _ in range(2048)]
        # Zipf-like word frequencies, as in code and IR.
        weights = list(itertools.accumulate(1 / (rank + 1) for rank in range(len(words))))
        punct = [b" ", b"\n  ", b", ", b"(", b") ", b" = ", b";\n", b"{\n", b"}\n"]
        parts = self.rng.choices(words, cum_weights=weights, k=1 << 20)
        seps = self.rng.choices(punct, k=len(parts))
        self.pool = b"".join(w + s for w, s in zip(parts, seps, strict=True))

    def text(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            start = self.rng.randrange(len(self.pool) - 4096)
            out += self.pool[start : start + min(n - len(out), len(self.pool) - start)]
        return bytes(out)

    def binary(self, n: int) -> bytes:
        """Incompressible bytes behind an ELF magic."""
        return b"\x7fELF" + os.urandom(max(n - 4, 0))

    def elf(self, n: int) -> bytes:
        """A cubin or SASS blob: mostly incompressible code, a third tables and strings."""
        text = n // 3
        return self.binary(n - text) + self.text(text)


def make_artifact_trees(src: Path, size_mib: int, seed: int = 11) -> tuple[int, int]:
    """Write the triton, cuda-jit and generic trees under ``src``; return (files, bytes).

    About 30% of the bytes in Triton kernel dirs (six files each: cubin, IR,
    metadata and the group file, whose absolute paths restore rewrites), 15%
    in the driver's JIT cache (hashed SASS blobs of 16-256 KiB), the rest in
    1-48 MiB libraries and cubins, about half of them incompressible.
    """
    data = Data(seed)
    rng = data.rng
    budget = size_mib * MiB
    files = total = 0

    def put(path: Path, body: bytes, mode: int = 0o644) -> None:
        nonlocal files, total
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
        if mode != 0o644:
            path.chmod(mode)
        files += 1
        total += len(body)

    triton = src / "triton"
    k = 0
    while total < budget * 30 // 100:
        key = "".join(rng.choices("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", k=52))
        name = f"kernel_{k}"
        d = triton / key
        children = {}
        for ext, body in (
            ("cubin", data.elf(rng.randint(16, 256) << 10)),
            ("ptx", data.text(rng.randint(16, 96) << 10)),
            ("ttir", data.text(rng.randint(4, 24) << 10)),
            ("llir", data.text(rng.randint(8, 48) << 10)),
            ("json", data.text(rng.randint(1, 3) << 10)),
        ):
            put(d / f"{name}.{ext}", body)
            children[f"{name}.{ext}"] = str(d / f"{name}.{ext}")
        put(d / f"__grp__{name}.json", json.dumps({"child_paths": children}).encode())
        k += 1
    cuda = src / "cuda-jit"
    put(cuda / "index", data.binary(64 << 10))
    while total < budget * 45 // 100:
        sub = cuda / f"{rng.randrange(16):x}" / f"{rng.randrange(16):x}"
        put(sub / f"{rng.getrandbits(64):016x}", data.elf(rng.randint(16, 256) << 10))
    generic = src / "generic"
    i = 0
    while total < budget:
        n = min(rng.choice([1, 2, 4, 8, 16, 24, 32, 48]) * MiB, budget - total)
        body = data.binary(n) if i % 2 else data.text(n)
        if i % 3:
            put(generic / "lib" / f"lib{i:03d}.so", body, 0o755)
        else:
            put(generic / "cubin" / f"kernel{i:03d}.sm_90a.cubin", body)
        i += 1
    return files, total


def make_small_trees(src: Path, files: int = 18000, seed: int = 11) -> tuple[int, int]:
    """A Triton-like cache of ``files`` small files (2-30 KiB) in kernel dirs of six.

    Each dir holds a cubin, IR, metadata and its group file (which restore
    rewrites); this is the shape whose cost is per file, not per byte.
    """
    data = Data(seed)
    rng = data.rng
    n = total = 0
    triton = src / "triton"
    while n < files:
        key = "".join(rng.choices("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", k=52))
        d = triton / key
        d.mkdir(parents=True)
        name = f"kernel_{n}"
        children = {}
        for ext in ("cubin", "ptx", "ttir", "llir", "json"):
            size = rng.randint(2, 30) << 10
            body = data.elf(size) if ext == "cubin" else data.text(size)
            (d / f"{name}.{ext}").write_bytes(body)
            children[f"{name}.{ext}"] = str(d / f"{name}.{ext}")
            total += size
        grp = json.dumps({"child_paths": children}).encode()
        (d / f"__grp__{name}.json").write_bytes(grp)
        total += len(grp)
        n += 6
    return n, total


def make_big_trees(src: Path, gib: int) -> tuple[int, int]:
    """Two files of ``gib`` GiB each (one IR-like text, one incompressible): cost per byte."""
    data = Data(11)
    generic = src / "generic"
    generic.mkdir(parents=True)
    size = gib << 30
    for i, make in enumerate((data.text, data.binary)):
        with (generic / f"lib{i}.so").open("wb") as f:
            left = size
            while left:
                piece = make(min(left, 64 * MiB))
                f.write(piece)
                left -= len(piece)
    return 2, 2 * size


def make_trees(src: Path, tree: str, size_mib: int, big_gib: int) -> tuple[int, int]:
    """The ``--tree`` asked for under ``src``; return (files, bytes)."""
    if tree == "small":
        return make_small_trees(src)
    if tree == "big":
        return make_big_trees(src, big_gib)
    return make_artifact_trees(src, size_mib)


@dataclass
class Artifact:
    """What the harvest published."""

    repo: str
    tag: str
    #: (family, digest, compressed size) per layer.
    layers: list[tuple[str, str, int]]
    files: int
    unpacked: int

    @property
    def compressed(self) -> int:
        return sum(size for _, _, size in self.layers)


def clean_env(work: Path, **extra: str) -> dict[str, str]:
    """This process's environment without cache variables or ``ARTIFACTD_*``, plus ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in CACHE_VARS and not k.startswith("ARTIFACTD_")
    }
    env["HOME"] = str(work / "home")
    env.update(extra)
    return env


def harvest(work: Path, src: Path, server: RegistryServer, repo: str) -> tuple[str, float]:
    """``artifactd harvest`` the trees (those that exist) into ``server``; return (tag, seconds)."""
    for name in ("triton", "cuda-jit", "generic"):
        (src / name).mkdir(parents=True, exist_ok=True)
    env = clean_env(
        work,
        TRITON_CACHE_DIR=str(src / "triton"),
        CUDA_CACHE_PATH=str(src / "cuda-jit"),
        ARTIFACTD_GENERIC_DIR=str(src / "generic"),
        TORCHINDUCTOR_CACHE_DIR=str(work / "no-inductor"),
        TMPDIR=str(work / "tmp"),
    )
    (work / "tmp").mkdir(exist_ok=True)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [PY, "-m", "artifactd", "harvest", "--store", server.ref(repo), "--json"],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        sys.exit(f"harvest failed: {proc.stderr[-2000:]}")
    doc = json.loads(proc.stdout)
    return f"fp-{doc['fingerprint_hash']}", time.perf_counter() - t0


def read_artifact(server: RegistryServer, repo: str, tag: str, files: int, nbytes: int) -> Artifact:
    """The artifact's layers, from its manifest (the families from the layers' annotations)."""
    req = urllib.request.Request(
        f"http://{server.host}/v2/{repo}/manifests/{tag}",
        headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - loopback http
        manifest = json.load(resp)
    layers = []
    for layer in manifest["layers"]:
        ann = layer.get("annotations") or {}
        family = next(
            (v for k, v in ann.items() if k.endswith("family")),
            ann.get("org.opencontainers.image.title", "?"),
        )
        layers.append((str(family), str(layer["digest"]), int(layer["size"])))
    return Artifact(repo, tag, layers, files, nbytes)


# --------------------------------------------------------------------------
# The methods
# --------------------------------------------------------------------------


def quiesce(drop_caches: bool) -> None:
    """Flush dirty pages and wait for writeback; with ``drop_caches``, drop the page cache."""
    subprocess.run(["sync"], check=False)
    for _ in range(150):
        with open("/proc/meminfo") as f:
            dirty_kib = next(int(line.split()[1]) for line in f if line.startswith("Dirty:"))
        if dirty_kib < 16 << 10:
            break
        time.sleep(0.2)
    if drop_caches:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    time.sleep(0.3)


def run(
    argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, cwd=cwd)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv[:6])} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc


@dataclass
class Timing:
    """One timed run: wall seconds, and the phases it reported."""

    seconds: float
    #: Phase -> seconds (download, extract; for artifactd the slowest family's fetch).
    phases: dict[str, float] = field(default_factory=dict)
    #: CPU seconds (user + system) of the method's processes (set by :func:`timed_rounds`).
    cpu: float = 0.0


def restore_cmd(work: Path, launcher: list[str], store: str, target: Path, *extra: str) -> Timing:
    """``artifactd restore --store STORE --target TARGET --require`` (with ``--json`` events).

    ``launcher``: the ``artifactd`` command of a plain environment (:func:`launchers`).
    """
    t0 = time.perf_counter()
    proc = run(
        [*launcher, "restore", "--store", store, "--target", str(target),
         "--require", "--json", *extra],
        clean_env(work),
    )  # fmt: skip
    elapsed = time.perf_counter() - t0
    fetch: dict[str, float] = {}
    for line in proc.stderr.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("stage") == "fetch" and event.get("event") == "done":
            fetch[str(event["family"])] = float(event["elapsed_ms"]) / 1000
    doc = json.loads(proc.stdout)
    if doc.get("status") not in (None, "restored"):
        sys.exit(f"restore did not restore: {proc.stdout[-2000:]}")
    phases = {"fetch+extract": max(fetch.values(), default=0.0)}
    return Timing(elapsed, phases)


def launchers(work: Path, against: Path | None) -> dict[Path | None, list[str]]:
    """The ``artifactd`` command that a pod runs, for this checkout (None) and ``against``.

    Each is the console script of a plain environment (``bench/plainenv.py``):
    a wheel's install, not this development venv, whose ``.pth`` files
    (the editable finder, setuptools' distutils hack, a package's own) cost
    every Python start here 11-15 ms, nor ``python -m`` (runpy). A pod's
    init container pays neither.
    """
    out: dict[Path | None, list[str]] = {None: command(plain_python(work / "env-this"))}
    if against is not None:
        out[against] = command(plain_python(work / "env-against", against.resolve()))
    return out


def hand_built(art: Artifact, host: str, target: Path, scratch: Path, *, tool: str) -> Timing:
    """Download every layer to a file (skopeo or curl), then ``tar --zstd -xf`` each."""
    target.mkdir()
    shutil.rmtree(scratch, ignore_errors=True)
    t0 = time.perf_counter()
    blobs: list[Path] = []
    if tool == "skopeo":
        run(["skopeo", "copy", "--quiet", "--src-tls-verify=false",
             f"docker://{host}/{art.repo}:{art.tag}", f"dir:{scratch}"])  # fmt: skip
        blobs = [scratch / digest.split(":", 1)[1] for _, digest, _ in art.layers]
    else:
        scratch.mkdir(parents=True)
        argv = ["curl", "--fail", "--silent", "--show-error", "--parallel"]
        for _, digest, _ in art.layers:
            blob = scratch / digest.split(":", 1)[1]
            argv += ["-o", str(blob), f"http://{host}/v2/{art.repo}/blobs/{digest}"]
            blobs.append(blob)
        run(argv)
    t1 = time.perf_counter()
    for blob in blobs:
        run(["tar", "--zstd", "-xf", str(blob), "-C", str(target)])
    t2 = time.perf_counter()
    shutil.rmtree(scratch, ignore_errors=True)
    return Timing(t2 - t0, {"download": t1 - t0, "extract": t2 - t1})


def streamed(art: Artifact, host: str, target: Path) -> Timing:
    """``curl BLOB | zstd -dc | tar -x`` for every layer at once: download and disk overlap."""
    target.mkdir()
    t0 = time.perf_counter()
    procs = []
    for _, digest, _ in art.layers:
        url = f"http://{host}/v2/{art.repo}/blobs/{digest}"
        cmd = f"curl --fail --silent --show-error '{url}' | zstd -dc | tar -x -C '{target}'"
        # pipefail: a failed download is a failed run, not a short tree.
        procs.append(subprocess.Popen(["bash", "-o", "pipefail", "-c", cmd]))
    if any(p.wait() != 0 for p in procs):
        sys.exit("the streaming pipeline failed")
    return Timing(time.perf_counter() - t0)


def cp_a(src: Path, target: Path) -> Timing:
    t0 = time.perf_counter()
    run(["cp", "-a", str(src), str(target)])
    return Timing(time.perf_counter() - t0)


# --------------------------------------------------------------------------
# The bench
# --------------------------------------------------------------------------


@dataclass
class Row:
    """One (link, method) cell: every run, and the proxy's view of the last one."""

    link: str
    method: str
    runs: list[Timing] = field(default_factory=list)
    peak_conns: int = 0

    @property
    def median(self) -> float:
        return statistics.median(t.seconds for t in self.runs)

    def phase(self, name: str) -> float | None:
        values = [t.phases[name] for t in self.runs if name in t.phases]
        return statistics.median(values) if values else None

    @property
    def cpu(self) -> float:
        return statistics.median(t.cpu for t in self.runs)


def children_cpu() -> float:
    """CPU seconds (user + system) of every child process waited for so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_rounds(
    methods: dict[str, Callable[[Path], Timing]],
    rows: dict[str, Row],
    work: Path,
    *,
    rounds: int,
    drop_caches: bool,
    proxy: Throttle | None,
) -> None:
    """Run every method ``rounds`` times, alternating the order, each into a fresh target."""
    runs = work / "runs"
    runs.mkdir(exist_ok=True)
    for r in range(rounds):
        order = list(methods) if r % 2 == 0 else list(reversed(methods))
        for name in order:
            # A new directory each run, and none deleted until the end (see the module doc).
            dest = runs / f"{len(list(runs.iterdir())):03d}"
            quiesce(drop_caches)
            if proxy is not None:
                proxy.reset_stats()
            cpu0 = children_cpu()
            timing = methods[name](dest)
            timing.cpu = children_cpu() - cpu0
            rows[name].runs.append(timing)
            if proxy is not None:
                rows[name].peak_conns = max(rows[name].peak_conns, proxy.stats.peak_open)
            print(f"  {rows[name].link:>14}  {name:34} {rows[name].runs[-1].seconds:7.2f} s",
                  file=sys.stderr, flush=True)  # fmt: skip


def work_parent(given: Path | None) -> Path:
    """Where the work dir goes: ``given`` (it must exist), else .artifactd/, else the temp dir."""
    if given is not None:
        if not given.is_dir():
            sys.exit(f"--dir {given}: no such directory")
        return given
    parent = REPO / ".artifactd"
    return parent if parent.is_dir() else Path(tempfile.gettempdir())


def fmt(value: float | None, spec: str = "7.2f") -> str:
    return (
        format(value, spec) if value is not None else "-".rjust(int(spec.split(".", maxsplit=1)[0]))
    )


def main() -> None:
    # A SIGTERM (a timeout, a CI cancel) ends the run through its finally blocks,
    # which stop the registry and the throttle instead of leaving them running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=400, help="unpacked artifact size")
    parser.add_argument("--rates", default="1g,10g,off", help="link rates, bits/s (off: direct)")
    parser.add_argument("--per-conn", default="off", help="rate limit per connection, bits/s")
    parser.add_argument("--rtt-ms", type=float, default=0.5, help="added RTT on throttled links")
    parser.add_argument("--rounds", type=int, default=7, help="runs of each method per link")
    parser.add_argument(
        "--tree",
        choices=("mixed", "small", "big"),
        default="mixed",
        help="mixed: --size-mib of three families; small: 18,000 files of 2-30 KiB; "
        "big: 2 files of --big-gib GiB",
    )
    parser.add_argument("--big-gib", type=int, default=1, help="size of each --tree big file")
    parser.add_argument(
        "--baseline",
        choices=("skopeo", "curl", "stream"),
        default="skopeo",
        help="stream: curl | zstd -dc | tar -x per layer, all layers at once",
    )
    parser.add_argument(
        "--against",
        type=Path,
        help="a checkout (e.g. of main) whose artifactd restore is timed too, alternating",
    )
    parser.add_argument("--skip-local", action="store_true", help="skip the oci: vs cp -a part")
    parser.add_argument(
        "--skip-mirror", action="store_true", help="skip the pull-through mirror vs direct part"
    )
    parser.add_argument("--drop-caches", action="store_true", help="drop the page cache per run")
    parser.add_argument("--keep", action="store_true", help="keep the work dir")
    parser.add_argument(
        "--dir",
        type=Path,
        help="where the work dir goes (default: .artifactd/ in the checkout, else the temp "
        "dir); a filesystem nothing deleted many files on lately (see above)",
    )
    args = parser.parse_args()
    if args.baseline == "skopeo" and shutil.which("skopeo") is None:
        sys.exit("skopeo not installed (scripts/setup.sh); or pass --baseline curl")
    args.size_mib = {"small": 320, "big": 2 * args.big_gib * 1024}.get(args.tree, args.size_mib)
    rates = [parse_rate(r) for r in args.rates.split(",")]
    per_conn = parse_rate(args.per_conn)
    start = time.perf_counter()
    parent = work_parent(args.dir)
    # Source tree, registry, layout, warm-up restore, then every run's target.
    runs = args.rounds * (
        (3 if args.against else 2) * len(rates)
        + (0 if args.skip_local else 2)
        + (0 if args.skip_mirror else 2)
    )
    need = (runs + 5) * args.size_mib * MiB * 11 // 10
    free = shutil.disk_usage(parent).free
    if free < need + (2 << 30):
        sys.exit(
            f"{parent}: {free >> 30} GiB free; this run keeps every target until it ends and "
            f"needs about {need >> 30} GiB (plus 2 GiB spare): lower --size-mib or --rounds"
        )
    work = Path(tempfile.mkdtemp(prefix="artifactd-netbench-", dir=parent))
    server = start_registry(work / "registry")
    rows: dict[str, Row] = {}
    links: list[tuple[str, float | None]] = []
    try:
        src = work / "src"
        t0 = time.perf_counter()
        files, nbytes = make_trees(src, args.tree, args.size_mib, args.big_gib)
        made = time.perf_counter() - t0
        repo = "bench/net"
        tag, push_s = harvest(work, src, server, repo)
        art = read_artifact(server, repo, tag, files, nbytes)
        print(
            f"artifact: {files} files, {nbytes / MiB:.0f} MiB unpacked, "
            f"{art.compressed / MiB:.0f} MiB in {len(art.layers)} zstd layers "
            f"({', '.join(f'{fam} {size / MiB:.0f}' for fam, _, size in art.layers)} MiB); "
            f"made in {made:.1f} s, harvested and pushed in {push_s:.1f} s"
        )
        # An untimed restore: artifactd's own cache of library hashes, and the registry's
        # blobs in the page cache, are then as warm for every timed run.
        launch = launchers(work, args.against)
        restore_cmd(work, launch[None], server.ref(repo), work / "warm")
        if args.against is not None:
            restore_cmd(work, launch[args.against], server.ref(repo), work / "warm-against")

        for rate in rates:
            proxy = (
                None
                if rate is None and per_conn is None
                else Throttle(
                    server.host, rate_bps=rate, per_conn_bps=per_conn, rtt_s=args.rtt_ms / 1000
                )
            )
            link = format_rate(rate) if proxy is not None else "direct"
            links.append((link, rate))
            host = proxy.host if proxy is not None else server.host
            store = f"{host}/{repo}"
            ours, theirs = f"{link}|artifactd", f"{link}|hand-built"
            rows[ours] = Row(link, "artifactd restore")
            rows[theirs] = Row(
                link,
                "curl | zstd -dc | tar -x"
                if args.baseline == "stream"
                else f"{args.baseline} + tar --zstd -xf",
            )

            def ours_run(dest: Path, store: str = store) -> Timing:
                return restore_cmd(work, launch[None], store, dest)

            def theirs_run(dest: Path, host: str = host) -> Timing:
                if args.baseline == "stream":
                    return streamed(art, host, dest)
                return hand_built(art, host, dest, work / "download", tool=args.baseline)

            methods: dict[str, Callable[[Path], Timing]] = {ours: ours_run, theirs: theirs_run}
            if args.against is not None:
                rows[f"{link}|against"] = Row(link, f"artifactd restore ({args.against.name})")

                def against_run(dest: Path, store: str = store) -> Timing:
                    return restore_cmd(work, launch[args.against], store, dest)

                methods[f"{link}|against"] = against_run
            try:
                timed_rounds(
                    methods, rows, work,
                    rounds=args.rounds, drop_caches=args.drop_caches, proxy=proxy,
                )  # fmt: skip
            finally:
                if proxy is not None:
                    proxy.close()

        if not args.skip_local:
            layout = work / "layout"
            run([PY, "-m", "artifactd", "copy", server.ref(repo), f"oci:{layout}"],
                clean_env(work))  # fmt: skip
            rows["local|artifactd"] = Row("local layout", "artifactd restore --store oci:")
            rows["local|cp"] = Row("local layout", "cp -a (unpacked tree)")

            def local_run(dest: Path) -> Timing:
                return restore_cmd(work, launch[None], f"oci:{layout}", dest)

            def cp_run(dest: Path) -> Timing:
                return cp_a(src, dest)

            timed_rounds(
                {"local|artifactd": local_run, "local|cp": cp_run}, rows, work,
                rounds=args.rounds, drop_caches=args.drop_caches, proxy=None,
            )  # fmt: skip
        if not args.skip_mirror:
            mirror_rows(
                work, launch[None], server, repo,
                rate=rates[0], per_conn=per_conn, rows=rows, args=args,
            )  # fmt: skip
    finally:
        server.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"work dir kept: {work}")

    print_report(rows, links, art, args, time.perf_counter() - start)


def mirror_rows(
    work: Path,
    launcher: list[str],
    server: RegistryServer,
    repo: str,
    *,
    rate: float | None,
    per_conn: float | None,
    rows: dict[str, Row],
    args: Any,
) -> None:
    """Time a restore through a warm pull-through mirror against one straight from the registry."""
    mirror = start_registry(work / "mirror", proxy=server.host)
    proxy = (
        None
        if rate is None and per_conn is None
        else Throttle(server.host, rate_bps=rate, per_conn_bps=per_conn, rtt_s=args.rtt_ms / 1000)
    )
    link = f"registry {format_rate(rate)}" if proxy is not None else "registry direct"
    store = f"{proxy.host if proxy is not None else server.host}/{repo}"
    flag = ("--mirror", f"http://{mirror.host}")
    try:
        # The mirror fetches every blob: then it is warm.
        restore_cmd(work, launcher, store, work / "mirror-warm", *flag)
        rows["mirror|through"] = Row(link, "artifactd restore --mirror (warm)")
        rows["mirror|direct"] = Row(link, "artifactd restore, registry only")

        def through(dest: Path) -> Timing:
            return restore_cmd(work, launcher, store, dest, *flag)

        def direct(dest: Path) -> Timing:
            return restore_cmd(work, launcher, store, dest)

        timed_rounds(
            {"mirror|through": through, "mirror|direct": direct}, rows, work,
            rounds=args.rounds, drop_caches=args.drop_caches, proxy=None,
        )  # fmt: skip
    finally:
        if proxy is not None:
            proxy.close()
        mirror.stop()


def print_report(
    rows: dict[str, Row],
    links: list[tuple[str, float | None]],
    art: Artifact,
    args: Any,
    elapsed: float,
) -> None:
    rtt = f", +{args.rtt_ms:g} ms RTT" if args.rtt_ms else ""
    per_conn = parse_rate(args.per_conn)
    per = f", per connection {format_rate(per_conn)}" if per_conn else ""
    print(f"\nlinks through bench/throttle.py{rtt}{per}; {args.rounds} runs each, median")
    head = (
        f"{'link':14} {'method':34} {'seconds':>7} {'floor':>7} {'x floor':>7} "
        f"{'MiB/s':>6} {'layers':>6} {'download':>8} {'extract':>7} {'cpu s':>6} {'conns':>5}  runs"
    )
    print(head)
    print("-" * len(head))
    ratios: list[tuple[str, list[float], list[float], float | None]] = []
    for link, rate in links:
        floor = art.compressed * 8 / rate if rate else None
        pair = [rows[f"{link}|artifactd"], rows[f"{link}|hand-built"]]
        against = rows.get(f"{link}|against")
        for row in [*pair, *([against] if against else [])]:
            med = row.median
            dl = row.phase("download")
            ex = row.phase("extract")
            staged = row.phase("fetch+extract")
            runs = " ".join(f"{t.seconds:.2f}" for t in row.runs)
            print(
                f"{link:14} {row.method:34} {med:7.2f} {fmt(floor)} "
                f"{fmt(med / floor if floor else None)} {art.unpacked / MiB / med:6.0f} "
                f"{fmt(staged, '6.2f')} {fmt(dl, '8.2f')} {fmt(ex)} {row.cpu:6.2f} "
                f"{row.peak_conns or '-':>5}  {runs}"
            )
        per_round = [
            a.seconds / b.seconds for a, b in zip(pair[0].runs, pair[1].runs, strict=False)
        ]
        over_floor = [t.seconds / floor for t in pair[0].runs] if floor else []
        goal = (1.5 if args.baseline == "stream" else 0.6) if rate == 1e9 else None
        ratios.append((link, per_round, over_floor, goal))
    if "local|artifactd" in rows:
        for key in ("local|artifactd", "local|cp"):
            row = rows[key]
            runs = " ".join(f"{t.seconds:.2f}" for t in row.runs)
            print(
                f"{row.link:14} {row.method:34} {row.median:7.2f} {fmt(None)} {fmt(None)} "
                f"{art.unpacked / MiB / row.median:6.0f} {fmt(row.phase('fetch+extract'), '6.2f')} "
                f"{fmt(None, '8.2f')} {fmt(None)} {row.cpu:6.2f} {'-':>5}  {runs}"
            )
    print(
        "(floor: the layers' compressed bytes at the link rate; layers: artifactd's slowest "
        "layer, fetch to staged (the rest is start-up, plan, install with its sync); "
        "download/extract: the hand-built pipeline's two steps; cpu s: CPU seconds, user + "
        "system, of the method's own processes (the throttle and the registry not counted); "
        "conns: most connections open at once through the throttle)"
    )
    print()
    print("ratios: the median of the per-round ratios [their range]")
    for link, per_round, over_floor, goal in ratios:
        ratio = statistics.median(per_round)
        tail = f"  (goal <= {goal}{', met' if ratio <= goal else ', MISSED'})" if goal else ""
        spread = f"[{min(per_round):.2f}-{max(per_round):.2f}]"
        low = ""
        if over_floor:
            low = (
                f"; artifactd / floor = {statistics.median(over_floor):.2f} "
                f"[{min(over_floor):.2f}-{max(over_floor):.2f}]"
            )
        print(f"{link:>14}: artifactd / hand-built = {ratio:.2f} {spread}{low}{tail}")
        against = rows.get(f"{link}|against")
        if against is not None:
            ours = rows[f"{link}|artifactd"].runs
            wall = [a.seconds / b.seconds for a, b in zip(ours, against.runs, strict=False)]
            cpu = [a.cpu / b.cpu for a, b in zip(ours, against.runs, strict=False) if b.cpu]
            print(
                f"{link:>14}: artifactd / {against.method} = {statistics.median(wall):.2f} "
                f"[{min(wall):.2f}-{max(wall):.2f}] wall, "
                f"{statistics.median(cpu):.2f} [{min(cpu):.2f}-{max(cpu):.2f}] CPU"
            )
    if "local|artifactd" in rows:
        ratio = rows["local|artifactd"].median / rows["local|cp"].median
        print(
            f"{'local layout':>14}: artifactd / cp -a       = {ratio:.2f}  (goal <= 1.3"
            f"{', met' if ratio <= 1.3 else ', MISSED'})"
        )
    if "mirror|through" in rows:
        for key in ("mirror|through", "mirror|direct"):
            row = rows[key]
            runs = " ".join(f"{t.seconds:.2f}" for t in row.runs)
            print(f"{row.link:>16}: {row.method:34} {row.median:7.2f} s  {runs}")
        ratio = rows["mirror|through"].median / rows["mirror|direct"].median
        print(f"{'mirror':>16}: through the mirror / registry only = {ratio:.2f}")
    print(f"elapsed: {elapsed:.0f} s")


if __name__ == "__main__":
    main()
