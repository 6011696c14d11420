"""The GPU acceptance: real warm-ups on one Hopper GPU, harvest, restore, none compiled again.

Run it through ``scripts/gpu-acceptance.sh`` (which picks the Python that has
a CUDA torch) on an H200 or any Hopper node, offline (its budget: 10 minutes)::

    bash scripts/gpu-acceptance.sh --wheels /path/to/wheels --out /tmp/acc

Steps, each ``ok``, ``failed`` or ``skipped: <why>``, with its seconds:

1. ``wheels``: install the extra wheels of ``--wheels DIR`` (FlashInfer, CuTe
   DSL, TileLang, SGLang, sgl-deep-gemm, vLLM, artifactd's own and the
   dependencies the node lacks) into
   ``OUT/site``, with pip, offline; a failure here stops the run;
2. ``environment``: nvidia-smi, torch and its CUDA, Triton, nvcc, the
   optional packages, which artifactd runs, and whether a Hopper GPU is here;
3. ``gpu-probe``: ``scripts/record_gpu_fixtures.py`` against the real driver
   (the recording the test doubles replay, ``OUT/gpu-probe.json``, and with
   ``--fixture NAME`` ``tests/fixtures/gpu/NAME.json``), then ``artifactd
   fingerprint --json``: the probe must have read the same GPU;
4. ``nvcc-ptx``: ``nvcc --ptx`` of the demo kernel for the virtual arch
   ``compute_90``, the module the driver JIT warm-up loads;
5. ``cold <family>``: one warm-up per family (``warmup_matrices/gpu-acceptance``)
   with fresh cache roots at ``OUT/cache``, in the layout a restore produces;
   all ten families (:data:`FAMILIES`); each kernel is launched and its result
   checked against torch, vLLM's generate keeps its token ids;
6. ``harvest``: ``artifactd harvest`` of the families that warmed up into the
   local OCI layout ``OUT/store``; the cold roots then move to ``OUT/cache-cold``;
7. ``restore``: ``artifactd restore --require`` into a fresh ``OUT/cache``,
   in a new process: the same path as the cold caches, so FlashInfer's ninja
   files (absolute paths) can hit; ``--relocate`` restores into
   ``OUT/restored`` instead, as a pod's ``/cache`` differs from a CI cell's
   roots, and shows which families then compile again;
8. ``restored <family>``: the same warm-up with only the env file's variables;
   it must compile nothing: the library's own counter where it has one
   (Inductor's fxgraph misses, Triton's listener, ptxas's record, the nvcc or
   ninja runs TileLang and SGLang start, vLLM's compile counter), no file
   written under any restored family's dirs (``artifactd.pod.verdict``), and
   vLLM's token ids those of the cold run;
9. ``status``: ``artifactd status --target <restore root> --json``: every
   restored family ``used``;
10. ``canary``: the tiny engine (``tests/engines/tiny_engine.py``) built with a
    ``serve.canary`` (recorded on this GPU model and driver), restored, started
    under ``artifactd exec``, and ``status --canary --ready verified`` must
    replay it exactly (the replay's seconds are in the report).

Without a Hopper GPU (no NVML, no libcuda, no device), or with ``--dry-run``,
the steps that need one are skipped with the reason, and the rest run: the
environment report, the PTX and the sm_90a cubin (nvcc), Triton's AOT
compilation to sm_90a, and harvest, restore, restored runs and status on
those. The last line is the summary; ``OUT/report.json`` holds every step,
``OUT/logs/`` every command's output. Exit 0 when no step failed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import os
import re
import shutil
import site
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal

from artifactd.build.demo import restored_environ
from artifactd.build.run import cell_environ
from artifactd.families import get_family
from artifactd.pod.readiness import probe_health
from artifactd.pod.verdict import wait_past, written_files

REPO = Path(__file__).resolve().parent.parent
WARMUP = REPO / "warmup_matrices" / "gpu-acceptance" / "warmup.py"
AXPY = REPO / "warmup_matrices" / "cpu-demo" / "axpy.cu"
RECORDER = REPO / "scripts" / "record_gpu_fixtures.py"
FIXTURES = REPO / "tests" / "fixtures" / "gpu"
#: The families the acceptance warms up, in the order it runs them.
FAMILIES = (
    "generic",
    "triton",
    "cuda-jit",
    "inductor",
    "flashinfer",
    "cutedsl",
    "tilelang",
    "sglang",
    "deepgemm",
    "vllm",
)
#: The families whose warm-up needs an optional library: (its module, its distribution).
OPTIONAL = {
    "flashinfer": ("flashinfer", "flashinfer-python"),
    "cutedsl": ("cutlass", "nvidia-cutlass-dsl"),
    "tilelang": ("tilelang", "tilelang"),
    "sglang": ("sglang", "sglang"),
    "deepgemm": ("deep_gemm", "sgl-deep-gemm"),
    "vllm": ("vllm", "vllm"),
}
#: The virtual arch of the PTX the driver JIT-compiles, and the cubins' real one.
PTX_ARCH = "compute_90"
ARCH = 90
#: One warm-up's limit: FlashInfer's first JIT build of an op, or vLLM's start and
#: compile of its tiny model, is the slowest.
WARMUP_TIMEOUT_S = 420
#: What the issue promises on one H200: the run's time is compared with it.
BUDGET_S = 600
NO_NVCC = "nvcc is not on PATH"

Status = Literal["ok", "failed", "skipped"]


class StepError(Exception):
    """A step's check did not hold; the message says what and where to look."""


@dataclass
class Step:
    """One step of the acceptance: its name, status, why (or a detail when ok) and seconds."""

    name: str
    status: Status = "ok"
    reason: str = ""
    seconds: float = 0.0
    data: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        """Return the step as one line of the live log."""
        why = f": {self.reason}" if self.reason else ""
        return f"  {self.name:<20} {self.status}{why} ({self.seconds:.1f} s)"


@dataclass
class Proc:
    """A finished command: exit code, output, the last JSON line of stdout, seconds."""

    rc: int
    stdout: str
    stderr: str
    doc: dict[str, Any] | None
    seconds: float


class Acceptance:
    """The steps, the output folder and the environment the commands run with."""

    def __init__(
        self,
        out: Path,
        wheels: Path | None,
        *,
        dry_run: bool,
        relocate: bool = False,
        fixture: str | None = None,
    ) -> None:
        self.out = out
        self.fixture = fixture  # also record into tests/fixtures/gpu/<fixture>.json
        self.wheels = wheels
        self.forced_dry = dry_run
        self.site = out / "site"
        self.logs = out / "logs"
        self.work = out / "work"
        # The cold caches' root, and the restore's: the same path unless --relocate.
        self.cache = out / "cache"
        self.target = out / "restored" if relocate else self.cache
        self.store = f"oci:{out / 'store'}"
        self.steps: list[Step] = []
        self.started = time.monotonic()
        self.stopped: str | None = None  # why every later step is skipped
        self.dry: str | None = None  # why the GPU steps are skipped
        self.ptx: Path | None = None
        self.harvested: list[str] = []
        self.outputs: dict[str, Any] = {}  # a cold warm-up's "output", the restored run's check
        self.installed = False  # whether OUT/site holds this run's wheels
        self.site_paths: list[str] = []  # OUT/site and what its .pth files add

    # -- running steps and commands ------------------------------------------------

    def step(self, name: str, body: Callable[[Step], None], *, skip: str | None = None) -> Step:
        """Run ``body`` as step ``name`` (unless skipped); a raised error fails the step."""
        st = Step(name)
        self.steps.append(st)
        why = self.stopped or skip
        if why:
            st.status, st.reason = "skipped", why
        else:
            t0 = time.monotonic()
            try:
                body(st)
            except StepError as exc:
                st.status, st.reason = "failed", str(exc)
            except Exception as exc:  # a bug or an environment fault: reported, never raised
                self.log(name, "traceback", traceback.format_exc())
                st.status = "failed"
                st.reason = f"{type(exc).__name__}: {exc} (traceback in {self.log_path(name)})"
            st.seconds = round(time.monotonic() - t0, 3)
        print(st.line(), flush=True)
        return st

    def log_path(self, name: str) -> Path:
        """Return the log file of step ``name``: OUT/logs/<name, dashed>.log."""
        return self.logs / f"{name.replace(' ', '-')}.log"

    def log(self, name: str, title: str, text: str) -> Path:
        """Append a titled block to the step's log file; return its path."""
        self.logs.mkdir(parents=True, exist_ok=True)
        path = self.log_path(name)
        with path.open("a", encoding="utf-8") as f:
            f.write(f"==== {title}\n{text}\n")
        return path

    def run(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        timeout: float = 300,
        cwd: Path | None = None,
    ) -> Proc:
        """Run a command for step ``name``, log it, and parse its last JSON line."""
        t0 = time.monotonic()
        try:
            proc = subprocess.run(
                list(argv),
                env=dict(env),
                cwd=cwd,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise StepError(f"{Path(argv[0]).name} ran past {timeout:.0f} s") from exc
        except OSError as exc:
            raise StepError(f"cannot run {argv[0]}: {exc.strerror}") from exc
        seconds = time.monotonic() - t0
        self.log(name, " ".join(argv), f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return Proc(proc.returncode, proc.stdout, proc.stderr, last_json(proc.stdout), seconds)

    def checked(self, name: str, argv: Sequence[str], env: Mapping[str, str], **kw: Any) -> Proc:
        """:meth:`run`, failing the step on a nonzero exit with the end of stderr."""
        proc = self.run(name, argv, env, **kw)
        if proc.rc != 0:
            tail = " | ".join(proc.stderr.strip().splitlines()[-3:]) or "no output"
            raise StepError(f"exit {proc.rc}: {tail} (log: {self.log_path(name)})")
        return proc

    def base_env(self) -> dict[str, str]:
        """Return this environment, with the installed wheels and the checkout importable."""
        env = dict(os.environ)
        paths = list(self.site_paths)
        paths += [str(REPO), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        if self.installed and (self.site / "bin").is_dir():  # the wheels' console scripts
            env["PATH"] = f"{self.site / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        return env

    def artifactd(self, *args: str) -> list[str]:
        """Return the argv of an artifactd command, as a maintainer would type it."""
        return [sys.executable, "-m", "artifactd", *args]

    # -- the steps -----------------------------------------------------------------

    def wheels_step(self, st: Step) -> None:
        """Install every wheel of ``--wheels`` into OUT/site, offline and without resolving."""
        if self.wheels is None or not self.wheels.is_dir():
            raise StepError(f"--wheels {self.wheels} is not a directory")
        found = sorted(self.wheels.glob("*.whl"))
        if not found:
            raise StepError(f"--wheels {self.wheels} holds no .whl file")
        shutil.rmtree(self.site, ignore_errors=True)  # only this run's wheels
        # --no-deps: the folder names every package the node lacks; nothing is fetched.
        argv = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps"]
        argv += ["--disable-pip-version-check", "--target", str(self.site), *map(str, found)]
        self.checked(st.name, argv, os.environ)
        # A --target dir is no site dir: its .pth files (CuTe DSL puts its packages
        # on sys.path through one) run only through site.addsitedir. Run them here
        # and hand the commands every path they added, first.
        before = list(sys.path)
        site.addsitedir(str(self.site))
        self.site_paths = [p for p in sys.path if p not in before]
        sys.path[:] = [*self.site_paths, *(p for p in sys.path if p not in self.site_paths)]
        self.installed = True
        st.reason = f"{len(found)} wheel(s) into {self.site}"
        st.data.update(wheels=[p.name for p in found], paths=self.site_paths)

    def environment_step(self, st: Step) -> None:
        """Report the node's software and GPU; fail only when artifactd cannot be imported."""
        try:  # what the later steps use: a dependency missing on the node shows here
            # lazy: this step is the one that reports a dependency missing on the node
            import artifactd  # noqa: PLC0415
            import artifactd.build.demo  # noqa: PLC0415
            import artifactd.build.run  # noqa: PLC0415
            import artifactd.pod.verdict  # noqa: PLC0415
        except ImportError as exc:
            raise StepError(
                f"cannot import artifactd: {exc} (put its wheel and the missing ones in --wheels)"
            ) from exc
        report: dict[str, Any] = {
            "python": sys.executable,
            "artifactd": str(Path(artifactd.__file__).parent),
        }
        smi = shutil.which("nvidia-smi")
        if smi:
            query = "--query-gpu=name,driver_version,memory.total,compute_cap"
            proc = self.run(st.name, [smi, query, "--format=csv,noheader"], os.environ, timeout=60)
            report["nvidia-smi"] = proc.stdout.strip() or proc.stderr.strip()
        else:
            report["nvidia-smi"] = "not on PATH"
        nvcc = shutil.which("nvcc")
        if nvcc:
            proc = self.run(st.name, [nvcc, "--version"], os.environ, timeout=60)
            release = [line for line in proc.stdout.splitlines() if "release" in line]
            report["nvcc"] = (release or ["?"])[-1].strip()
        else:
            report["nvcc"] = "not on PATH"
        proc = self.run(st.name, [sys.executable, "-c", VERSIONS], self.base_env(), timeout=120)
        report.update(proc.doc or {"versions": proc.stderr.strip()[-300:]})
        missing = gpu_missing()
        report["hopper_gpu"] = missing or "yes"
        if missing:
            self.dry = f"no GPU: {missing}"
        elif self.forced_dry:
            self.dry = "dry run (--dry-run)"
        st.data.update(report)
        for key, value in report.items():
            print(f"    {key}: {value}")
        st.reason = self.dry or "Hopper GPU found"

    def probe_step(self, st: Step) -> None:
        """Record NVML and libcuda as the test doubles replay them; the probe must agree."""
        recording = self.out / "gpu-probe.json"
        self.checked(st.name, [sys.executable, str(RECORDER), str(recording)], self.base_env())
        rec = json.loads(recording.read_text(encoding="utf-8"))
        proc = self.checked(st.name, self.artifactd("fingerprint", "--json"), self.base_env())
        fp = (proc.doc or {}).get("fingerprint") or {}
        (self.out / "fingerprint.json").write_text(json.dumps(fp, indent=2), encoding="utf-8")
        gpu, driver = fp.get("gpu") or {}, fp.get("driver") or {}
        device = (rec["nvml"]["devices"] or [{}])[0]
        expected = {
            "gpu.source": "nvml",
            "gpu.name": device.get("nvmlDeviceGetName", {}).get("value"),
            "gpu.sm_count": rec["libcuda"]["cuDeviceGetAttribute"].get("16", {}).get("value"),
            "driver.version": rec["nvml"]["nvmlSystemGetDriverVersion"].get("value"),
        }
        seen = {
            "gpu.source": gpu.get("source"),
            "gpu.name": gpu.get("name"),
            "gpu.sm_count": gpu.get("sm_count"),
            "driver.version": driver.get("version"),
        }
        wrong = [
            f"{k}: probe {seen[k]!r}, driver {v!r}" for k, v in expected.items() if seen[k] != v
        ]
        if not str(gpu.get("arch") or "").startswith("sm_90"):
            wrong.append(f"gpu.arch: {gpu.get('arch')!r}, not sm_90*")
        if wrong:
            raise StepError("the probe disagrees with the driver: " + "; ".join(wrong))
        if self.fixture:  # the doubles replay it (tests/test_gpu_probe.py round-trips each)
            shutil.copyfile(recording, FIXTURES / f"{self.fixture}.json")
            recording = FIXTURES / f"{self.fixture}.json"
        st.data.update(recording=str(recording), gpu=gpu, driver=driver)
        st.reason = (
            f"{gpu['name']}, {gpu['arch']}, {gpu['sm_count']} SMs, driver {driver['version']}; "
            f"recorded {recording}"
        )

    def ptx_step(self, st: Step) -> None:
        """Compile the demo kernel to PTX for a virtual arch: the driver JIT-compiles it."""
        nvcc = shutil.which("nvcc")
        if nvcc is None:
            raise StepError(NO_NVCC)
        self.work.mkdir(parents=True, exist_ok=True)
        ptx = self.work / f"axpy.{PTX_ARCH}.ptx"
        self.checked(
            st.name, [nvcc, "--ptx", f"-arch={PTX_ARCH}", "-o", str(ptx), str(AXPY)], os.environ
        )
        if b".entry axpy" not in ptx.read_bytes():
            raise StepError(f"{ptx} holds no axpy entry")
        self.ptx = ptx
        st.reason = f"{ptx.name}, {ptx.stat().st_size} bytes"

    def warmup_argv(self, family: str) -> list[str] | None:
        """Return a family's warm-up command, or None when it cannot run in this mode."""
        argv = [sys.executable, str(WARMUP)]
        if family == "generic":
            return [*argv, "generic", "--arch", str(ARCH), *([] if self.dry else ["--gpu"])]
        if family == "triton":
            return [*argv, "triton-aot" if self.dry else "triton", "--arch", str(ARCH)]
        if self.dry:
            return None
        if family == "cuda-jit":
            return [*argv, "cuda-jit", "--ptx", str(self.ptx)] if self.ptx else None
        return [*argv, family]

    def skip_reason(self, family: str) -> str | None:
        """Why a family's warm-up cannot run here, naming what is missing; None if it can."""
        missing = []
        if family in OPTIONAL:
            module, dist = OPTIONAL[family]
            if importlib.util.find_spec(module) is None:
                missing.append(f"{dist} is not installed")
        if family == "cuda-jit" and self.ptx is None:
            missing.append("no PTX (nvcc-ptx did not run)")
        if self.warmup_argv(family) is None or missing:
            return "; ".join(filter(None, [self.dry, *missing]))
        return None

    def warm(self, st: Step, family: str, env: Mapping[str, str], *, restored: bool) -> None:
        """Run a family's warm-up with ``env``; judge what it compiled and wrote."""
        argv = self.warmup_argv(family)
        if argv is None:
            raise StepError(f"no warm-up for {family} in this mode")
        cutoff = time.time()
        root = self.target if restored else self.cache
        wait_past(root, cutoff)  # what the warm-up writes gets a later mtime
        proc = self.checked(st.name, argv, env, timeout=WARMUP_TIMEOUT_S, cwd=self.work)
        doc = proc.doc or {}
        if "skipped" in doc:
            st.status, st.reason = "skipped", str(doc["skipped"])
            return
        watched = self.harvested if restored else list(FAMILIES)
        written = {
            name: written_files(fam, {c: str(p) for c, p in fam.restore_dirs(root).items()}, cutoff)
            for name in watched
            for fam in [get_family(name)]
        }
        counts = {name: len(files) for name, files in written.items() if files}
        st.data.update(report=doc, wall_seconds=round(proc.seconds, 3), files_written=counts)
        compiled = doc.get("compiled")
        own = counts.get(family, 0)
        if restored:
            if family in self.outputs and doc.get("output") != self.outputs[family]:
                raise StepError(
                    f"the restored run computed {doc.get('output')!r}, "
                    f"the cold run {self.outputs[family]!r}"
                )
            problems = []
            if compiled:
                problems.append(f"the library reports {compiled} compiled")
            for name, files in written.items():
                if files:
                    problems.append(f"{len(files)} file(s) written under {name} ({files[0]}, ...)")
            if problems:
                raise StepError("compiled anyway: " + "; ".join(problems))
            st.reason = f"0 compiled, {proc.seconds:.1f} s"
            return
        if own == 0:
            raise StepError(f"wrote nothing into the {family} cache: nothing to restore")
        if "output" in doc:
            self.outputs[family] = doc["output"]
        counter = f"{compiled} compiled, " if compiled is not None else ""
        st.reason = f"{counter}{own} file(s), {proc.seconds:.1f} s"

    def harvest_step(self, st: Step, env: Mapping[str, str]) -> None:
        """Harvest the warmed-up families into OUT/store, then move the cold roots aside."""
        families = ",".join(self.harvested)
        argv = self.artifactd("harvest", "--store", self.store, "--family", families, "--json")
        doc = self.checked(st.name, argv, env).doc or {}
        packed = {f["family"]: f["files"] for f in doc.get("families", [])}
        missing = [f for f in self.harvested if not packed.get(f)]
        if missing:
            raise StepError(f"harvested nothing for {', '.join(missing)}")
        if self.target == self.cache:  # the restore's root must be fresh
            self.cache.rename(self.out / "cache-cold")
        st.data.update(families=packed, tags=doc.get("tags"))
        st.reason = ", ".join(f"{k} {v} file(s)" for k, v in packed.items())

    def restore_step(self, st: Step) -> None:
        """Restore into a fresh root in a new process, as an init container would."""
        argv = self.artifactd(
            "restore", "--store", self.store, "--target", str(self.target), "--require", "--json"
        )
        proc = self.checked(st.name, argv, self.base_env())
        restored = (proc.doc or {}).get("restored") or []
        missing = [f for f in self.harvested if f not in restored]
        if missing:
            raise StepError(f"the restore did not install {', '.join(missing)}")
        st.data.update(restored=restored, wall_seconds=round(proc.seconds, 3))
        st.reason = (
            f"{len(restored)} famil{'y' if len(restored) == 1 else 'ies'} in {proc.seconds:.2f} s"
        )

    def status_step(self, st: Step) -> None:
        """``artifactd status`` must call every restored family ``used``."""
        argv = self.artifactd("status", "--target", str(self.target), "--json")
        doc = self.checked(st.name, argv, self.base_env()).doc or {}
        verdicts = {f["family"]: f for f in doc.get("families", [])}
        st.data["verdicts"] = {
            name: verdicts.get(name, {}).get("verdict") for name in self.harvested
        }
        bad = [
            f"{name}: {v.get('verdict')} ({v.get('why')})"
            for name in self.harvested
            for v in [verdicts.get(name, {})]
            if v.get("verdict") != "used"
        ]
        if bad:
            raise StepError("; ".join(bad))
        st.reason = f"{len(self.harvested)} used"

    def canary_step(self, st: Step) -> None:
        """Record a canary at build and replay it in a pod, on this node's GPU and driver.

        The tiny engine (tests/engines/tiny_engine.py) is built with a canary
        (``artifactd build``: recorded on this GPU model and driver), restored
        into a fresh root, started under ``artifactd exec``, and ``status
        --canary --ready verified`` must replay it exactly.
        """
        engine = REPO / "tests" / "engines" / "tiny_engine.py"
        root = self.out / "canary"
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        matrix = root / "canary.yaml"
        matrix.write_text(
            "name: gpu-acceptance-canary\nfamilies: [inductor]\ngpus: 0\n"
            f"workload: {{model: tiny-llm, engine: {json.dumps(str(engine))}}}\n"
            'serve:\n  command: "{{ python }} {{ engine }} --port {{ port }}"\n'
            f"  port: {port}\n  requests: [{{prompt_tokens: [4], max_tokens: 2}}]\n"
            "  canary: {count: 2, tokens: 16, top_k: 5}\n",
            encoding="utf-8",
        )
        env, store = self.base_env(), f"oci:{root / 'store'}"
        self.checked(st.name, self.artifactd("build", str(matrix), "--store", store, "--json"), env)
        target = root / "pod"
        restore = ["restore", "--store", store, "--target", str(target), "--require", "--json"]
        restore += ["--workload", "model=tiny-llm", "--workload", f"engine={engine}"]
        self.checked(st.name, self.artifactd(*restore, "--family", "inductor"), env)
        url = f"http://127.0.0.1:{port}"
        engine_argv = [sys.executable, str(engine), "--port", str(port)]
        pod = subprocess.Popen(
            [*self.artifactd("exec", "--target", str(target)), "--", *engine_argv],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 300
            while True:
                if probe_health(url, timeout=2)[0]:
                    break
                if pod.poll() is not None or time.monotonic() > deadline:
                    raise StepError("the tiny engine did not start")
                time.sleep(0.2)
            argv = self.artifactd("status", "--target", str(target), "--engine-url", url)
            argv += ["--prewarm", str(matrix), "--canary", "--ready", "verified", "--json"]
            doc = self.checked(st.name, argv, env).doc or {}
        finally:
            pod.terminate()
            pod.wait(timeout=60)
        replay = (doc.get("readiness") or {}).get("canary") or {}
        if replay.get("outcome") != "verified" or replay.get("mode") != "exact":
            raise StepError(f"the canary did not replay exactly: {replay}")
        st.data.update(recorded_on=replay.get("recorded_on"), replay_seconds=replay.get("seconds"))
        st.reason = f"verified (exact) in {replay.get('seconds')} s on {replay.get('recorded_on')}"

    # -- the whole run -------------------------------------------------------------

    def main(self) -> int:
        """Run every step, print the table and the summary line; return the exit code."""
        self.out.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.logs, ignore_errors=True)  # this run's logs only
        print(f"gpu-acceptance: {self.out}", flush=True)
        no_wheels = None if self.wheels else "no --wheels DIR given: nothing extra to install"
        if self.step("wheels", self.wheels_step, skip=no_wheels).status == "failed":
            self.stopped = "wheels failed"
        if self.step("environment", self.environment_step).status == "failed":
            self.stopped = "environment failed"
        self.step("gpu-probe", self.probe_step, skip=self.dry)
        self.step("nvcc-ptx", self.ptx_step, skip=None if shutil.which("nvcc") else NO_NVCC)
        for name in (self.cache, self.target, self.out / "cache-cold", self.out / "store"):
            shutil.rmtree(name, ignore_errors=True)
        self.run_families()
        return self.finish()

    def run_families(self) -> None:
        """Cold warm-ups, harvest, restore, restored warm-ups and status."""
        base = self.base_env()
        cold_env: dict[str, str] = {}
        if not self.stopped:  # artifactd imports: the environment step found it
            cold_env = cell_environ(self.cache, list(FAMILIES), {}, base)
        self.work.mkdir(parents=True, exist_ok=True)
        cold: dict[str, Step] = {}
        for family in FAMILIES:
            cold[family] = self.step(
                f"cold {family}",
                partial(self.warm, family=family, env=cold_env, restored=False),
                skip=self.skip_reason(family),
            )
            if cold[family].status == "ok":
                self.harvested.append(family)
        nothing = None if self.harvested else "no warm-up ran"
        if (
            self.step("harvest", partial(self.harvest_step, env=cold_env), skip=nothing).status
            != "ok"
        ):
            self.stopped = self.stopped or "harvest did not run"
        if self.step("restore", self.restore_step).status != "ok":
            self.stopped = self.stopped or "restore did not run"
        warm_env: dict[str, str] = {}
        if not self.stopped:
            warm_env = restored_environ(self.target / "artifactd.env", base, self.out / "empty")
        for family in FAMILIES:
            why = None
            if family not in self.harvested:  # the cold step's reason, so the summary says it once
                why = cold[family].reason if cold[family].status == "skipped" else "cold run failed"
            self.step(
                f"restored {family}",
                partial(self.warm, family=family, env=warm_env, restored=True),
                skip=why,
            )
        self.step("status", self.status_step)
        self.step("canary", self.canary_step, skip=self.dry)

    def finish(self) -> int:
        """Print the per-family timings and the summary line; write OUT/report.json."""
        total = time.monotonic() - self.started
        by_name = {s.name: s for s in self.steps}
        print("  family       cold s  restored s  cold files  restored compiled")
        seconds = {"cold": 0.0, "restored": 0.0}
        for family in self.harvested:
            cold, warm = by_name[f"cold {family}"], by_name[f"restored {family}"]
            files = cold.data.get("files_written", {}).get(family, 0)
            again = "0" if warm.status == "ok" else warm.status
            cold_s, warm_s = cold.data.get("wall_seconds", 0.0), warm.data.get("wall_seconds", 0.0)
            seconds["cold"] += cold_s
            seconds["restored"] += warm_s
            print(f"  {family:<12} {cold_s:>6.1f}  {warm_s:>10.1f}  {files:>10}  {again:>17}")
        if self.harvested:
            print(f"  {'all':<12} {seconds['cold']:>6.1f}  {seconds['restored']:>10.1f}")
        counts = {
            s: sum(1 for x in self.steps if x.status == s) for s in ("ok", "failed", "skipped")
        }
        failed = [s.name for s in self.steps if s.status == "failed"]
        parts = [p for s in self.steps if s.status == "skipped" for p in s.reason.split("; ")]
        reasons = list(dict.fromkeys(parts))
        summary = (
            f"gpu-acceptance: {counts['ok']} ok, {counts['failed']} failed"
            + (f" ({', '.join(failed)})" if failed else "")
            + f", {counts['skipped']} skipped"
            + (f" ({'; '.join(reasons)})" if reasons else "")
            + f" in {total:.0f} s"
        )
        report = {
            "summary": summary,
            "mode": "dry" if self.dry else "gpu",
            "dry_reason": self.dry,
            "seconds": round(total, 3),
            "warmup_seconds": {k: round(v, 3) for k, v in seconds.items()},
            "budget_seconds": BUDGET_S,
            "steps": [asdict(s) for s in self.steps],
        }
        path = self.out / "report.json"
        path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        print(f"  report: {path}")
        print(summary, flush=True)
        return 1 if failed else 0


#: Run in the warm-ups' Python: versions of what they use, and whether torch sees a GPU.
VERSIONS = """
import json, importlib.metadata as md
out = {}
for dist in ("torch", "triton", "flashinfer-python", "nvidia-cutlass-dsl", "nvidia-ml-py",
             "tilelang", "sglang", "sgl-deep-gemm", "vllm", "apache-tvm-ffi"):
    try:
        out[dist] = md.version(dist)
    except md.PackageNotFoundError:
        out[dist] = "not installed"
try:
    import torch
    out["torch.version.cuda"] = torch.version.cuda
    out["torch.cuda.is_available"] = torch.cuda.is_available()
    if out["torch.cuda.is_available"]:
        out["torch.cuda.device"] = torch.cuda.get_device_name(0)
except ImportError as exc:
    out["torch.import"] = str(exc)
print(json.dumps(out))
"""


def last_json(text: str) -> dict[str, Any] | None:
    """Return the last line of ``text`` that is a JSON object, or None."""
    for raw in reversed(text.strip().splitlines()):
        if raw.startswith("{"):
            try:
                doc = json.loads(raw)
            except ValueError:
                return None
            return doc if isinstance(doc, dict) else None
    return None


def gpu_missing() -> str | None:
    """Return why there is no Hopper GPU to run on, naming what is missing; None if there is."""
    return nvml_missing() or libcuda_missing()


def nvml_missing() -> str | None:
    """Return what NVML lacks for a Hopper GPU 0 (the library, a device, the arch), or None."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return "no NVML (libnvidia-ml.so.1 not found: no NVIDIA driver)"
    if (rc := nvml.nvmlInit_v2()) != 0:
        return f"nvmlInit failed (NVML error {rc})"
    try:
        count = ctypes.c_uint(0)
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0 or count.value == 0:
            return "no CUDA device (NVML sees no GPU)"
        handle = ctypes.c_void_p()
        major, minor = ctypes.c_int(0), ctypes.c_int(0)
        nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle))
        nvml.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major), ctypes.byref(minor))
    finally:
        nvml.nvmlShutdown()
    if major.value != 9:
        return f"GPU 0 is compute capability {major.value}.{minor.value}, not Hopper (9.x)"
    return None


def libcuda_missing() -> str | None:
    """Return why the driver API cannot reach a device (no libcuda, cuInit, none), or None."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "no libcuda.so.1 (the driver's CUDA library)"
    if (rc := cuda.cuInit(0)) != 0:
        return f"cuInit failed (CUDA error {rc})"
    devices = ctypes.c_int(0)
    if cuda.cuDeviceGetCount(ctypes.byref(devices)) != 0 or devices.value == 0:
        return "no CUDA device (libcuda sees none)"
    return None


def main(argv: list[str] | None = None) -> int:
    """Parse the flags and run the acceptance."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--wheels",
        type=Path,
        help="a folder of extra wheels to install offline (flashinfer-python, "
        "nvidia-cutlass-dsl, tilelang, sglang, sgl-deep-gemm, vllm, artifactd's own "
        "and its dependencies the node lacks)",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("gpu-acceptance"), help="output folder (reused)"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="skip the GPU steps even where a GPU is found"
    )
    parser.add_argument(
        "--relocate",
        action="store_true",
        help="restore into OUT/restored, not at the cold caches' path (OUT/cache): "
        "a pod's /cache is not a CI cell's root; FlashInfer's ninja files pin absolute paths",
    )
    parser.add_argument(
        "--fixture",
        metavar="NAME",
        type=fixture_name,
        help="also keep the GPU probe's recording as tests/fixtures/gpu/NAME.json "
        "(e.g. h200x1-sxm), for the test doubles to replay",
    )
    args = parser.parse_args(argv)
    return Acceptance(
        args.out.resolve(),
        args.wheels,
        dry_run=args.dry_run,
        relocate=args.relocate,
        fixture=args.fixture,
    ).main()


def fixture_name(value: str) -> str:
    """Return ``value`` if it can name a fixture file: lowercase letters, digits, ``.-_``."""
    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,63}", value):
        raise argparse.ArgumentTypeError(
            f"{value!r}: use lowercase letters, digits, '.', '_' and '-' (e.g. h200x1-sxm)"
        )
    return value


if __name__ == "__main__":
    sys.exit(main())
