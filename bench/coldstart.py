"""Cold start vs restored start, and the start-up cost of the two pod-start commands.

Prints, for the CPU demo matrix:
  cold      warm-up with fresh, empty caches
  restore   `artifactd restore` into a new dir, as a new process: from the
            store (a node's first pod) and through a warm node store (every
            later pod on a node, as deploy/k8s restores)
  restored  warm-up with only the restored caches (new TMPDIR, build gone)
  local     warm-up again with the build's own caches left in place
and, for each restore, the ratios restored/cold, restored/local and
(restore + restored)/local (target: at most 1.05; rounds in both orders,
see demo()), with its parts from its --json phases (start+exit: the
interpreter's start, imports and exit, outside the command's own clock;
lookup: probe, resolve and plan; fetch: download, verify and unpack;
install) and its fixed cost (see fixed_cost()) against a bare
`python -c pass` timed in the same round (target: within 3x). Then the
start-up table: `python -c pass`, `artifactd fingerprint --hash` and a no-op restore
(the target already holds the matching restore and its marker) in every form
the docs and the deploy/k8s manifests use (--env-file, --gpu-arch,
--workload, --node-store on a local layout, --verify-key; each also given as
ARTIFACTD_* variables, and the plain one with an empty probe cache), and a
restore that installs (the small cache, into a new target each run: its
fixed cost), run in turn, each the median of --runs, with each command's
ratio to the bare Python start and ok/FAIL against 2.5x (3x for the fixed
cost); and which heavy modules each command imported. Exits 1 when a target
is missed.

Python runs with its bytecode cached, as an installed package does (in a
private cache directory, so the tree gets no __pycache__); one untimed run of
each command fills it. Every command, the bare start included, runs in a
plain environment made for the run (bench/plainenv.py): a development
checkout's editable install would otherwise load its finder, pathlib and more
into every process, the bare start's too, and every ratio would read low.

Usage: python bench/coldstart.py [--runs 9] [--demo-runs 10] [--only startup]

The start-up rows always run against a store holding one small generic cache
(built with and without the --workload form's workload, and signed for the
--verify-key form); --only startup skips the demo matrix: it runs in seconds.
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
sys.path.insert(0, str(REPO / "bench"))

from plainenv import command, plain_python  # noqa: E402

from artifactd.build.demo import restored_environ  # noqa: E402
from artifactd.build.run import cell_environ  # noqa: E402
from artifactd.cli.specs import COMMANDS  # noqa: E402
from artifactd.constants import ENV_CACHE_DIR, ENV_GENERIC_DIR  # noqa: E402

#: Modules neither start-up command may import (torch and engines, pydantic, the
#: registry client, compression, templating).
HEAVY = ("torch", "triton", "pydantic", "requests", "oras", "zstandard", "jinja2")
#: The ratio to a bare Python start every start-up command must stay within.
TARGET_RATIO = 2.5
#: The ratio to a bare Python start a restore's fixed cost must stay within.
TARGET_FIXED_RATIO = 3.0
#: A restore's --json phases that move bytes: the rest of its wall time is its fixed cost.
BYTE_PHASES = ("fetch", "verify", "install")
#: The start-up row of a restore that installs (the small cache into a new target each run).
REAL = "restore that installs: fixed cost"
#: The most (restore + warm-up on restored caches) may cost over a warm-up on local caches.
TARGET_RESTORED_LOCAL = 1.05
#: The workload of the ``--workload`` form (the store holds an artifact built for it).
WORKLOAD = "model=m,tp=8"


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    # In REPO: `python -m` imports from the working directory first (this checkout, then).
    proc = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed:\n{proc.stderr[-2000:]}")
    return elapsed, proc.stdout


def fixed_cost(wall: float, stdout: str) -> float:
    """A restore's fixed cost: its wall time less the phases that move bytes (BYTE_PHASES).

    What is left is what every restore pays whatever it installs: the
    interpreter's start and exit, imports, the probe, the lookup (reading and
    validating the artifact's documents) and the plan.
    """
    phases = json.loads(stdout.strip().splitlines()[-1]).get("phases") or {}
    return wall - sum(float(phases.get(name, 0.0)) for name in BYTE_PHASES)


def compiled(stdout: str) -> int:
    return int(json.loads(stdout.strip().splitlines()[-1])["compiled"])


def bytecode_env(base: dict[str, str], cache: Path) -> dict[str, str]:
    """``base`` with bytecode written to and read from ``cache``, as an install has it."""
    env = {k: v for k, v in base.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(cache)
    return env


#: The no-op restore forms the docs and the deploy/k8s manifests use, each
#: timed with its flags and again with the same settings as ``ARTIFACTD_*``
#: variables: (row name, the options beyond --store, --target and --gpu-arch).
NOOP_FORMS: dict[str, list[str]] = {
    "no-op": [],
    "no-op --env-file FILE": ["--env-file", "{work}/env/pod.env"],
    "no-op --workload k=v": ["--workload", WORKLOAD],
    "no-op --node-store DIR": ["--node-store", "oci:{work}/node-store"],
    "no-op --verify-key PEM": ["--verify-key", "{work}/keys/ci.pub"],
}


def as_environ(args: list[str]) -> dict[str, str]:
    """The ``ARTIFACTD_*`` variables that say what the ``restore`` options ``args`` say."""
    by_flag = {opt.flag: opt for opt in COMMANDS["restore"]}
    env: dict[str, list[str]] = {}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        envvar = by_flag[flag].envvar
        assert envvar is not None, flag
        env.setdefault(envvar, []).append(value)
    return {name: " ".join(values) for name, values in env.items()}


def startup(  # noqa: PLR0917 - a benchmark's one call site
    py: str, store: str, target: Path, base: dict[str, str], runs: int, work: Path
) -> tuple[list[str], bool]:
    """Time bare Python, fingerprint and every no-op form in turn; return the lines, and a pass.

    Each form gets its own target, restored once first with that form, so the
    timed run is the no-op a restarted pod makes. The row REAL restores into a
    new target each run (removed untimed before it) and counts its fixed cost.
    """
    env = bytecode_env(base, work / "pycache")
    fresh = work / "fresh-probe-cache"
    # A new container starts with an empty probe cache: this row clears it before each run.
    fresh_env = env | {ENV_CACHE_DIR: str(fresh)}
    restore_cmd = [*command(py), "restore", "--json"]
    commands: dict[str, tuple[list[str], dict[str, str]]] = {
        "python -c pass": ([py, "-c", "pass"], env),
        "fingerprint --hash": (
            [*command(py), "fingerprint", "--hash", "--gpu-arch", "sm_90a"],
            env,
        ),
    }
    for i, (name, extra) in enumerate(NOOP_FORMS.items()):
        pod = target if i == 0 else work / f"pod-{i}"
        args = ["--store", store, "--target", str(pod), "--gpu-arch", "sm_90a"]
        args += [a.format(work=work) for a in extra]
        commands[name] = ([*restore_cmd, *args], env)
        commands[f"{name} (ARTIFACTD_*)"] = (restore_cmd, env | as_environ(args))
        if i == 0:
            commands[f"{name} (empty probe cache)"] = ([*restore_cmd, *args], fresh_env)
    real = work / "real"
    real_args = ["--store", store, "--target", str(real), "--gpu-arch", "sm_90a"]
    commands[REAL] = ([*restore_cmd, *real_args], env)
    for name, (argv, cmd_env) in commands.items():
        shutil.rmtree(real, ignore_errors=True)
        _, out = timed(argv, cmd_env)  # restores (a form's first run), fills the bytecode cache
        shutil.rmtree(real, ignore_errors=True)
        _, out = timed(argv, cmd_env)
        if name.startswith("no-op") and json.loads(out)["status"] != "noop":
            sys.exit(f"{name}: the restore to time is not a no-op: {out[-500:]}")
        if name == REAL and json.loads(out)["status"] != "restored":
            sys.exit(f"{name}: the restore to time did not install: {out[-500:]}")
    times: dict[str, list[float]] = {name: [] for name in commands}
    real_walls: list[float] = []
    for i in range(runs):  # interleaved, so machine load weighs on every command alike
        for name, (argv, cmd_env) in commands.items():
            shutil.rmtree(fresh, ignore_errors=True)
            shutil.rmtree(real, ignore_errors=True)
            elapsed, out = timed(argv, cmd_env)
            if name == REAL:
                real_walls.append(elapsed)
                elapsed = fixed_cost(elapsed, out)
            times[name].append(elapsed)
        progress(f"start-up round {i + 1}/{runs}")
    bare = statistics.median(times["python -c pass"])
    lines = [f"{f'start-up, median of {runs}':40} {'ms':>7} {'x bare':>7}  {'':4}  min-max ms"]
    passed = True
    for name, ts in times.items():
        med = statistics.median(ts)
        ceiling = TARGET_FIXED_RATIO if name == REAL else TARGET_RATIO
        verdict = "" if name == "python -c pass" else "ok" if med / bare <= ceiling else "FAIL"
        passed = passed and verdict != "FAIL"
        lines.append(
            f"{name:40} {med * 1000:7.1f} {med / bare:7.2f}  {verdict:4}  "
            f"{min(ts) * 1000:.1f}-{max(ts) * 1000:.1f}"
        )
    lines.append(
        f"{REAL}: the median of its wall times is {statistics.median(real_walls) * 1000:.1f} ms"
    )
    lines.append(
        f"target: each artifactd command within {TARGET_RATIO} x the bare start, "
        f"a restore's fixed cost within {TARGET_FIXED_RATIO} x"
    )
    for name in ("fingerprint --hash", *NOOP_FORMS, REAL):
        argv, cmd_env = commands[name]
        shutil.rmtree(real, ignore_errors=True)
        lines.append(
            f"{name} imported: {', '.join(heavy_imports(py, argv[1:], cmd_env)) or 'none'}"
        )
    return lines, passed


def heavy_imports(py: str, args: list[str], env: dict[str, str]) -> list[str]:
    """Run ``artifactd ARGS`` in a Python that then lists the heavy modules it loaded.

    ``args`` follow the command (``argv[1:]`` of the launcher's command line).
    """
    code = (
        "import sys\n"
        "from artifactd.cli import main\n"
        "try:\n"
        f"    main({args!r})  # given argv, main returns (by SystemExit) instead of ending\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print('\\nheavy:', *(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    _, out = timed([py, "-c", code], env)
    return out.rsplit("\nheavy:", 1)[-1].split()


def small_store(py: str, work: Path, base: dict[str, str]) -> tuple[str, Path]:
    """Harvest one small generic cache into a fresh store and restore it once."""
    tree = work / "generic"
    (tree / "sub").mkdir(parents=True)
    (tree / "kernel.bin").write_bytes(b"\x7fELF" + bytes(4096))
    (tree / "sub" / "index.json").write_text('{"kernels": 1}\n')
    env = cell_environ(work / "roots", ["generic"], {ENV_GENERIC_DIR: str(tree)}, base)
    store = f"oci:{work / 'store'}"
    fp = ["--gpu-arch", "sm_90a"]
    harvest = [py, "-m", "artifactd", "harvest", "--store", store, "--family", "generic", *fp]
    timed(harvest, env)
    timed([*harvest, "--workload", WORKLOAD], env)
    sign(py, store, work, base)
    target = work / "pod"
    timed([py, "-m", "artifactd", "restore", "--store", store, "--target", str(target), *fp], base)
    return store, target


def sign(py: str, store: str, work: Path, base: dict[str, str]) -> None:
    """Make a key pair under ``work/keys`` and sign the whole artifacts in ``store``."""
    keys = work / "keys"
    keys.mkdir()
    timed([py, "-m", "artifactd", "keygen", "--out", str(keys / "ci")], base)
    _, out = timed([py, "-m", "artifactd", "ls", store, "--json"], base)
    for tag in json.loads(out)["tags"]:
        if tag.startswith("fp-"):
            ref = f"{store}:{tag}"
            argv = ["sign", ref, "--sign-key", str(keys / "ci.key"), "--sign-unverified"]
            timed([py, "-m", "artifactd", *argv], base)


def progress(line: str) -> None:
    """Say on stderr where a long run is (the results go to stdout at the end)."""
    print(f"[coldstart] {line}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=9, help="start-up runs per command")
    parser.add_argument(
        "--demo-runs", type=int, default=10, help="demo rounds (pairs of them decide: see demo())"
    )
    parser.add_argument("--only", choices=["startup"], help="run only this part")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="artifactd-bench-"))
    py = plain_python(work)  # as installed: no editable finder in every start (plainenv.py)
    base = dict(os.environ)
    # The probe cache starts empty and lives with the run, like a new pod's.
    base[ENV_CACHE_DIR] = str(work / "probe-cache")
    try:
        if args.only == "startup":
            store, target = small_store(py, work, base)
            lines, passed = startup(py, store, target, base, args.runs, work)
        else:
            demo_lines, demo_passed = demo(py, work / "demo", base, args.demo_runs)
            store, target = small_store(py, work, base)
            lines, passed = startup(py, store, target, base, args.runs, work)
            lines, passed = demo_lines + lines, passed and demo_passed
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for line in lines:
        print(line)
    if not passed:
        sys.exit("FAIL: a target above is not met")


#: The demo's restored sides: from the store itself (a node's first pod), and
#: through a warm node store (every later pod on the node, as deploy/k8s restores).
SIDES = {"store": [], "node store": ["--node-store", "oci:{work}/node-store"]}


class Side:
    """One restored side of the demo's rounds: its restores and the warm-ups on them."""

    def __init__(self, name: str, options: list[str]) -> None:
        self.name, self.options = name, options
        self.restores: list[float] = []
        self.restoreds: list[float] = []
        self.overheads: list[float] = []  # (restore + restored) / the round's local
        self.bares: list[float] = []
        self.fixeds: list[float] = []
        self.phases: list[dict[str, float]] = []
        self.compiled = 0

    def verdict(self) -> tuple[float, str]:
        """The median, over pairs of rounds (one of each order), of the pair's mean overhead."""
        pairs = zip(self.overheads[::2], self.overheads[1::2], strict=True)
        overhead = statistics.median((a + b) / 2 for a, b in pairs)
        return overhead, "ok" if overhead <= TARGET_RESTORED_LOCAL else "FAIL"

    def lines(self, local_s: float, cold_s: float) -> list[str]:
        restore_s, restored_s = statistics.median(self.restores), statistics.median(self.restoreds)
        overhead, verdict = self.verdict()
        parts = ", ".join(
            f"{name} {statistics.median(p.get(name, 0.0) for p in self.phases):.2f}"
            for name in self.phases[0]
        )
        fixed_ratio = statistics.median(f / b for f, b in zip(self.fixeds, self.bares, strict=True))
        return [
            f"{'artifactd restore, from the ' + self.name:40} {restore_s:8.2f} {'-':>9}",
            f"  its parts (its --json phases, medians): {parts}",
            f"  its fixed cost {statistics.median(self.fixeds):.3f} s = {fixed_ratio:.2f} x a "
            f"bare start ({statistics.median(self.bares):.3f} s, timed beside it)",
            f"{'warm-up on what it restored':40} {restored_s:8.2f} {self.compiled:9d}",
            f"  restore/local = {restore_s / local_s:.3f} (the restore's own share), "
            f"restored/local = {restored_s / local_s:.3f} (the warm-ups' spread), "
            f"(restore + restored)/cold = {(restore_s + restored_s) / cold_s:.3f}",
            f"  (restore + restored)/local = {overhead:.3f}  {verdict} (target: at most "
            f"{TARGET_RESTORED_LOCAL}; rounds: {', '.join(f'{o:.3f}' for o in self.overheads)})",
        ]


def demo(py: str, work: Path, base: dict[str, str], runs: int) -> tuple[list[str], bool]:
    """Cold, restore, restored and local runs of the CPU demo matrix.

    Each of ``runs`` rounds (made even) warms up on the local caches, and for
    each restored side (:data:`SIDES`) restores into a new pod dir, warms up on
    it with the build's caches moved aside, and removes the pod dir (as the
    kubelet removes a pod's emptyDir). A side's overhead in a round is its own
    (restore + restored) / the round's local warm-up, run back to back so the
    machine's drift weighs on all of them; rounds run the sides in one order
    and then in the reverse one, and a side's verdict is the median, over
    pairs of rounds (one of each order), of the pair's mean overhead. Every
    round's overhead is printed: a warm-up here varies by about 5% from one
    run to the next, so a verdict within 0.02 of the target is the noise's.
    The node store is filled once before the rounds (the node's first pod)
    and then serves every round's restore by link. The fixed-cost verdict
    is the restore from the store's. artifactd runs with its bytecode
    cached, as installed.
    """
    work.mkdir(parents=True, exist_ok=True)
    roots, aside = work / "build", work / "build-aside"
    env = cell_environ(roots, ["inductor", "triton", "generic"], {}, base)
    art_env = bytecode_env(base, work / "pycache")
    warm_argv = [py, str(WARMUP)]
    progress("demo: cold warm-up (compiles everything; a few minutes on 2 cores)")
    cold_s, out = timed(warm_argv, env)
    cold_n = compiled(out)
    progress(f"demo: cold warm-up {cold_s:.1f} s, {cold_n} compiled")
    store = f"oci:{work / 'store'}"
    harvest = [py, "-m", "artifactd", "harvest", "--store", store, "--gpu-arch", "sm_90a"]
    timed(harvest, bytecode_env(env, work / "pycache"))
    sides = [Side(name, [o.format(work=work) for o in options]) for name, options in SIDES.items()]
    locals_: list[float] = []
    local_n = 0

    def restore_argv(side: Side, target: Path) -> list[str]:
        return [
            *command(py), "restore", "--store", store, "--target", str(target),
            "--gpu-arch", "sm_90a", "--json", *side.options,
        ]  # fmt: skip

    def restored(side: Side, target: Path) -> None:
        roots.rename(aside)  # nothing of the build is left for the restored run
        try:
            side.bares.append(timed([py, "-c", "pass"], art_env)[0])  # the same moment's load
            restore_s, out = timed(restore_argv(side, target), art_env)
            side.restores.append(restore_s)
            side.fixeds.append(fixed_cost(restore_s, out))
            report = json.loads(out.strip().splitlines()[-1])
            # What the process spent before and after its own clock (start, imports, exit).
            start_exit = restore_s - report["elapsed_ms"] / 1000
            side.phases.append({"start+exit": start_exit, **report["phases"]})
            renv = restored_environ(target / "artifactd.env", base, work / "empty")
            restored_s, out = timed(warm_argv, renv)
            side.restoreds.append(restored_s)
            side.compiled = max(side.compiled, compiled(out))
        finally:
            shutil.rmtree(target, ignore_errors=True)
            aside.rename(roots)

    fill = work / "pod-fill"
    for side in sides:
        if side.options:  # the node's first pod fills its node store
            roots.rename(aside)
            try:
                timed(restore_argv(side, fill), art_env)
            finally:
                shutil.rmtree(fill, ignore_errors=True)
                aside.rename(roots)
    runs = max(2, runs + runs % 2)  # pairs of rounds, one of each order
    for i in range(runs):
        order: list[Side | None] = [*sides, None]  # None: the local warm-up
        if i % 2:
            order.reverse()
        for step in order:
            if step is None:
                local_s, out = timed(warm_argv, env)
                locals_.append(local_s)
                local_n = max(local_n, compiled(out))
            else:
                restored(step, work / f"pod-{i}")
        for side in sides:
            side.overheads.append((side.restores[-1] + side.restoreds[-1]) / locals_[-1])
        progress(
            f"demo round {i + 1}/{runs}: (restore + restored)/local "
            + ", ".join(f"{side.name} {side.overheads[-1]:.3f}" for side in sides)
        )
    local_s = statistics.median(locals_)
    store_side = sides[0]
    fixed_ratio = statistics.median(
        f / b for f, b in zip(store_side.fixeds, store_side.bares, strict=True)
    )
    fixed_verdict = "ok" if fixed_ratio <= TARGET_FIXED_RATIO else "FAIL"
    lines = [
        f"{f'stage (median of {runs}; cold: 1 run)':40} {'seconds':>8} {'compiled':>9}",
        f"{'cold warm-up (fresh caches)':40} {cold_s:8.2f} {cold_n:9d}",
        f"{'warm-up, local caches left in place':40} {local_s:8.2f} {local_n:9d}",
    ]
    for side in sides:
        lines += side.lines(local_s, cold_s)
    lines.append(
        f"the restore's fixed cost (from the store): {fixed_ratio:.2f} x a bare start, median "
        f"of per-round ratios  {fixed_verdict} (target: within {TARGET_FIXED_RATIO} x)"
    )
    passed = fixed_verdict == "ok" and all(side.verdict()[1] == "ok" for side in sides)
    return lines, passed


if __name__ == "__main__":
    main()
