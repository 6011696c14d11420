"""``artifactd predict``: vLLM's own cache key recomputed before the engine starts.

The recorded side is a cache dir laid out as vLLM writes it: the env factors
come from the vllm 0.33.0 release's own ``vllm/envs.py`` (its
``compile_factors`` and variable list, run in a child Python as the engine's
image would run it; only ``vllm.config.utils.normalize_value``, which that
release's drift pin does not fetch, is reproduced here from its documented
behaviour), and 0.33's dir-name and code-hash recipes are executed from the
release's ``backends.py`` text itself. Each change the issue names (an env
variable, a traced file's content, its venv path, ``max_num_batched_tokens``,
the torch build, the GPU name) must be named by the prediction.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from conftest import clean_env, run_artifactd
from faultproxy import FaultProxy
from registry_server import RegistryServer
from test_drift_guards import release_dir

from artifactd.build.harvest import harvest
from artifactd.errors import UsageError
from artifactd.families import FAMILIES, vllmkey
from artifactd.families.vllmkey import RECIPE_033, RECIPE_034, PodFactors
from artifactd.fingerprint.model import Fingerprint
from artifactd.reports import restore_report
from artifactd.restore import engineside as P  # noqa: N812
from artifactd.restore.engineside import (
    PodInputs,
    config_leaves,
    engine_factors,
    pod_factors,
    read_traced,
)
from artifactd.restore.policy import RestoreRequest, run_restore
from artifactd.restore.predict import (
    MAX_ENGINE_ARGS,
    PredictOptions,
    engine_argv,
    predict,
    predict_entry,
    recorded_from_facts,
    recorded_from_root,
    run_predict,
)
from artifactd.stores import open_store

VLLM = "vllm-0.33.0"
VLLM_034 = "vllm-0.34.0"
GPU = "NVIDIA H100 80GB HBM3"
TORCH_KEY = "9f" * 32
#: A variable of vLLM 0.33's list that compile_factors hashes (not ignored).
ENV_VAR = "VLLM_BATCH_INVARIANT"

#: normalize_value as vLLM documents it, for the values env getters return.
_NORMALIZE = """
def normalize_value(x):
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, dict):
        return tuple(sorted((str(k), normalize_value(v)) for k, v in x.items()))
    if isinstance(x, (set, frozenset)):
        return tuple(sorted(repr(normalize_value(v)) for v in x))
    if isinstance(x, (list, tuple)):
        return tuple(normalize_value(v) for v in x)
    raise TypeError(type(x).__name__)
"""


@pytest.fixture(scope="module")
def vllm_pkg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``vllm`` package holding the 0.33.0 release's own ``envs.py``."""
    root = tmp_path_factory.mktemp("engine")
    pkg = root / "vllm"
    (pkg / "config").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "config" / "__init__.py").write_text("")
    (pkg / "config" / "utils.py").write_text(_NORMALIZE)
    (pkg / "envs.py").write_bytes((release_dir(VLLM) / "vllm" / "envs.py").read_bytes())
    return root


@pytest.fixture
def static_env() -> dict[str, Any]:
    """Env factors as vLLM 0.33 records them, for the tests that do not run its code."""
    return {
        "VLLM_TARGET_DEVICE": "cuda",
        ENV_VAR: False,
        "VLLM_USE_FASTOKENS": False,
        "VERBOSE": False,
    }


def _engine_env(pkg: Path, **extra: str) -> dict[str, str]:
    return {**clean_env(), "PYTHONPATH": str(pkg), **extra}


@pytest.fixture(scope="module")
def build_env_factors(vllm_pkg: Path) -> dict[str, Any]:
    """vLLM 0.33's env factors of the build (its own code, in a child Python)."""
    doc = engine_factors(_engine_env(vllm_pkg), torch=False)
    env = doc.get("env")
    assert isinstance(env, dict), doc
    return env


def _traced(root: Path, venv: str, text: str = "def forward(x):\n    return x\n") -> Path:
    path = root / venv / "lib/python3.11/site-packages/vllm/model_executor/models/llama.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _config(tokens: int = 8192) -> dict[str, Any]:
    return {
        "model_config": {"model": "meta-llama/Llama-3.1-8B", "dtype": "torch.bfloat16"},
        "scheduler_config": {"max_num_batched_tokens": tokens},
        "parallel_config": {"tensor_parallel_size": 1, "pipeline_parallel_size": 1},
    }


def _compiler(gpu: str = GPU, torch_key: str = TORCH_KEY) -> dict[str, Any]:
    return {
        "system": {"device": {"name": gpu}, "version": {"cuda": "12.8", "triton": "3.5"}},
        "torch_key": torch_key,
        "inductor_config": {"max_autotune": False},
    }


def _doc_034(
    env: Mapping[str, Any], traced: Path, torch_key: str = TORCH_KEY
) -> tuple[str, dict[str, Any]]:
    """A vLLM 0.34 record and its dir name (the recipe as 0.34's backends.py writes it)."""
    code = [
        {"path": str(traced), "hash": vllmkey.content_hash(traced.read_text())},
        {"path": "<string>"},
    ]
    doc = {
        "env": dict(env),
        "config": _config(),
        "config_hash": "c" * 64,
        "compiler": _compiler(torch_key=torch_key),
        "compiler_hash": "d" * 64,
        "code": {"files": code},
        "code_hash": "e" * 64,
    }
    everything = {"env": doc["env"], "config": doc["config"], "code": doc["code"]}
    everything["compiler"] = doc["compiler"]
    name = hashlib.sha256(json.dumps(everything, sort_keys=True).encode()).hexdigest()[:10]
    return name, doc


def _write_root(root: Path, name: str, doc: Mapping[str, Any]) -> Path:
    rank = root / "torch_compile_cache" / name / "rank_0_0" / "backbone"
    rank.mkdir(parents=True)
    (rank / "cache_key_factors.json").write_text(json.dumps(doc, indent=2, sort_keys=True))
    return root


def _pod(env: Mapping[str, Any], **kw: Any) -> PodFactors:
    base: dict[str, Any] = {
        "env": env,
        "config": _config(),
        "compiler": _compiler(),
        "read_file": read_traced,
    }
    base.update(kw)
    return PodFactors(**base)


def _named(pred: Any) -> list[str]:
    return [d.describe() for c in pred.checks for d in c.differences]


# --------------------------------------------------------------------------
# The recipes, held to the release's own source
# --------------------------------------------------------------------------


def _backends() -> str:
    return (release_dir(VLLM) / "vllm" / "compilation" / "backends.py").read_text()


def _block(source: str, first: str, last: str) -> str:
    """The source lines from the one starting with ``first`` to the one starting with ``last``."""
    lines = source.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(first))
    end = next(i for i in range(start, len(lines)) if lines[i].strip().startswith(last))
    return textwrap.dedent("\n".join(lines[start : end + 1]))


def test_033_dir_name_recipe_is_the_release_own_code() -> None:
    """The two lines of 0.33's backends.py that name the dir, executed, agree with dir_key."""
    source = _backends()
    assert "env_hash = hash_factors(env_factors)" in source
    snippet = _block(source, "factors = [env_hash", "hash_key = hashlib.sha256")
    env = {"VLLM_X": True, "B": ["1", 2]}
    ns: dict[str, Any] = {
        "hashlib": hashlib,
        "env_hash": vllmkey.hash_factors(env),
        "config_hash": "a" * 64,
        "code_hash": "b" * 64,
        "compiler_hash": "c" * 10,
    }
    exec(snippet, ns)  # noqa: S102 - the pinned release's own two lines
    doc = {"env": env, "config_hash": "a" * 64, "code_hash": "b" * 64, "compiler_hash": "c" * 10}
    assert vllmkey.recipe_of(doc) == RECIPE_033
    assert vllmkey.dir_key(doc, RECIPE_033) == ns["hash_key"]
    assert vllmkey.self_check(ns["hash_key"], doc) == RECIPE_033


def test_033_code_hash_is_the_release_own_code(tmp_path: Path) -> None:
    """0.33's traced-file loop, executed from its source, agrees with code_hash_033."""
    snippet = _block(_backends(), "hash_content = []", "code_hash = hashlib")
    a, b = tmp_path / "b.py", tmp_path / "a.py"
    a.write_text("x = 1\n")
    b.write_text("y = 2\n")
    missing = str(tmp_path / "gone.py")
    files = sorted([str(a), str(b), "<string>", missing])

    class _Log:
        def warning(self, *args: object) -> None:
            del args

    ns: dict[str, Any] = {"hashlib": hashlib, "forward_code_files": files, "logger": _Log()}
    exec(snippet, ns)  # noqa: S102 - the pinned release's own loop
    ours = vllmkey.code_hash_033(
        [(str(a), a.read_text()), (str(b), b.read_text()), ("<string>", None), (missing, None)]
    )
    assert ours == ns["code_hash"]


def _source_034(rel: str) -> str:
    return (release_dir(VLLM_034) / rel).read_text()


def test_034_dir_name_recipe_is_the_release_own_code(tmp_path: Path) -> None:
    """0.34's own hash_factors, get_code_factors and dir-name lines, executed, agree."""
    ns: dict[str, Any] = {"hashlib": hashlib, "json": json, "Mapping": Mapping, "Path": Path}
    utils = _source_034("vllm/config/utils.py")
    exec(_block(utils, "def hash_factors(", "return hashlib.sha256(json.dumps(items"), ns)  # noqa: S102 - the pinned release's own function
    caching = _source_034("vllm/compilation/caching.py")
    exec(_block(caching, "def get_code_factors(", "return code_factors"), ns)  # noqa: S102 - as above
    traced = _traced(tmp_path, "venv")
    contents = {traced: traced.read_text(), Path("<string>"): None}
    ns["code_factors"] = ns["get_code_factors"](contents)
    ns.update(env_factors={"VLLM_X": True}, config_factors=_config(), compiler_factors=_compiler())
    backends = _source_034("vllm/compilation/backends.py")
    exec(_block(backends, "all_factors: dict[str, object] = {", "}"), ns)  # noqa: S102 - as above
    line = "hash_key = hash_factors(all_factors)[:10]"
    exec(_block(backends, line, line), ns)  # noqa: S102 - as above
    # What 0.34 writes to cache_key_factors.json, as JSON holds it.
    doc = json.loads(json.dumps({**ns["all_factors"], "config_hash": "a", "code_hash": "b"}))
    doc["compiler_hash"] = "c"
    assert vllmkey.recipe_of(doc) == RECIPE_034
    assert vllmkey.self_check(ns["hash_key"], doc) == RECIPE_034
    assert ns["code_factors"] == [
        {"path": str(traced), "hash": vllmkey.content_hash(traced.read_text())},
        {"path": "<string>"},
    ]
    assert ns["hash_factors"]({"a": [1]}) == vllmkey.hash_factors({"a": [1]})
    # The 0.33 record shape is never read as 0.34's, nor 0.34's as 0.33's.
    assert vllmkey.self_check(ns["hash_key"], {**doc, "code": [doc["code"]]}) is None
    assert vllmkey.recipe_of({**doc, "code": doc["code"]["files"]}) is None  # nor as 0.33's


def test_unknown_recipe_is_said_never_guessed(static_env: dict[str, Any], tmp_path: Path) -> None:
    name, doc = _doc_034(static_env, _traced(tmp_path, "venv"))
    pod = _pod(static_env)
    assert predict_entry(name, doc, pod).outcome == "hit"
    # Another release's recipe (here: one more factor hashed) gives another name.
    other = predict_entry("0123456789", doc, pod)
    assert other.outcome == "unknown"
    assert other.recipe is None
    assert "unknown recipe" in other.line()
    # A record of neither shape.
    odd = predict_entry(name, {"env": {}, "factors": []}, pod)
    assert odd.outcome == "unknown" and "unknown recipe" in odd.reason


# --------------------------------------------------------------------------
# Each change the issue names is named
# --------------------------------------------------------------------------


@pytest.mark.slow
def test_env_variable_is_named(
    vllm_pkg: Path, build_env_factors: dict[str, Any], tmp_path: Path
) -> None:
    """The pod's env goes through vLLM's own compile_factors; the changed variable is named."""
    name, doc = _doc_034(build_env_factors, _traced(tmp_path, "venv"))
    root = _write_root(tmp_path / "vllm", name, doc)
    recorded = vllmkey_read(root)
    same = engine_factors(_engine_env(vllm_pkg), torch=False)
    assert predict(recorded, _pod(same["env"]), source="t").outcome == "hit"
    changed = engine_factors(_engine_env(vllm_pkg, **{ENV_VAR: "1"}), torch=False)
    pred = predict(recorded, _pod(changed["env"]), source="t")
    assert pred.outcome == "miss"
    assert _named(pred.entries[0]) == [f"env.{ENV_VAR}: false -> true"]
    # An ignored variable (vLLM's own ignore list) changes nothing.
    port = engine_factors(_engine_env(vllm_pkg, VLLM_PORT="12345"), torch=False)
    assert predict(recorded, _pod(port["env"]), source="t").outcome == "hit"


def vllmkey_read(root: Path) -> dict[str, dict[str, Any]]:
    return recorded_from_root(root)


def test_traced_file_content_is_named(static_env: dict[str, Any], tmp_path: Path) -> None:
    traced = _traced(tmp_path, "venv")
    name, doc = _doc_034(static_env, traced)
    traced.write_text("def forward(x):\n    return x * 2\n")
    pred = predict_entry(name, doc, _pod(static_env))
    assert pred.outcome == "miss"
    (only,) = _named(pred)
    assert only.startswith(f"code[{traced}].hash: ") and only.endswith("(changed)")


def test_traced_file_path_in_another_venv_is_named(
    static_env: dict[str, Any], tmp_path: Path
) -> None:
    """Built under one venv path, the pod's at another: the file is named as moved."""
    built = _traced(tmp_path, "venv-build")
    name, doc = _doc_034(static_env, built)
    moved = _traced(tmp_path, "venv-pod")
    built.unlink()
    reloc = ((str(tmp_path / "venv-build"), str(tmp_path / "venv-pod")),)
    pred = predict_entry(name, doc, _pod(static_env, relocations=reloc))
    assert pred.outcome == "miss"
    assert _named(pred) == [f"code[{built}].path: {built} -> {moved} (moved)"]
    bare = predict_entry(name, doc, _pod(static_env))
    assert _named(bare) == [f"code[{built}]: present -> missing (missing)"]
    # The engine's Python names its own site-packages: found there without --relocate.
    site = str(moved.parents[3])
    assert site.endswith("site-packages")
    found = predict_entry(name, doc, _pod(static_env, site_packages=(site,)))
    assert _named(found) == [f"code[{built}].path: {built} -> {moved} (moved)"]


def test_max_num_batched_tokens_from_the_pod_args(
    static_env: dict[str, Any], tmp_path: Path
) -> None:
    name, doc = _doc_034(static_env, _traced(tmp_path, "venv"))
    inputs = PodInputs(
        environ={},
        argv=("vllm", "serve", "meta-llama/Llama-3.1-8B", "--max-num-batched-tokens", "4096"),
        gpu_name=GPU,
        engine={"env": static_env, "torch_key": TORCH_KEY, "cuda": "12.8"},
    )
    pred = predict_entry(name, doc, pod_factors(inputs))
    assert pred.outcome == "miss"
    assert _named(pred) == ["config.scheduler_config.max_num_batched_tokens: 8192 -> 4096"]
    # The same args as the build: nothing differs, but the config factors the
    # args do not give cannot be rebuilt here: unknown, said with its reason.
    same = PodInputs(**{**inputs.__dict__, "argv": ("vllm", "serve", "meta-llama/Llama-3.1-8B")})
    unsure = predict_entry(name, doc, pod_factors(same))
    assert unsure.outcome == "unknown"
    assert "config: 1 of 5 config factors compared" in unsure.reason


def test_torch_build_is_named(static_env: dict[str, Any], tmp_path: Path) -> None:
    name, doc = _doc_034(static_env, _traced(tmp_path, "venv"))
    inputs = PodInputs(
        environ={},
        gpu_name=GPU,
        engine={"env": static_env, "torch_key": "0a" * 32, "cuda": "12.8"},
    )
    pred = predict_entry(name, doc, pod_factors(inputs))
    assert pred.outcome == "miss"
    assert _named(pred) == [f"compiler.torch_key: {TORCH_KEY} -> {'0a' * 32}"]


def test_gpu_name_is_named(static_env: dict[str, Any], tmp_path: Path) -> None:
    name, doc = _doc_034(static_env, _traced(tmp_path, "venv"))
    pod = _pod(static_env, compiler=_compiler(gpu="NVIDIA A100-SXM4-80GB"))
    pred = predict_entry(name, doc, pod)
    assert _named(pred) == [f"compiler.system.device.name: {GPU} -> NVIDIA A100-SXM4-80GB"]
    # From a node label (--gpu-name), never a CUDA context.
    inputs = PodInputs(environ={}, gpu_name="NVIDIA L4", engine={"env": static_env})
    by_label = predict_entry(name, doc, pod_factors(inputs))
    assert _named(by_label) == [f"compiler.system.device.name: {GPU} -> NVIDIA L4"]


def test_033_record_names_env_and_says_what_it_cannot(
    static_env: dict[str, Any],
) -> None:
    doc = {
        "env": static_env,
        "config_hash": "a" * 64,
        "code_hash": "b" * 64,
        "compiler_hash": "c" * 10,
    }
    name = vllmkey.dir_key(doc, RECIPE_033)
    env = {**static_env, ENV_VAR: True}
    pred = predict_entry(name, doc, PodFactors(env=env))
    assert pred.outcome == "miss"
    assert _named(pred) == [f"env.{ENV_VAR}: false -> true"]
    same = predict_entry(name, doc, PodFactors(env=static_env))
    assert same.outcome == "unknown"
    assert "records only code_hash" in same.reason


def test_recipe_names_are_distinct() -> None:
    assert set(vllmkey.RECIPES) == {RECIPE_034, RECIPE_033}


# --------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------


def _engine_groups(tmp_path: Path, torch_key: str) -> Path:
    path = tmp_path / "engine.json"
    path.write_text(json.dumps({"config": _config(), "compiler": _compiler(torch_key=torch_key)}))
    return path


@pytest.mark.slow
def test_cli_predicts_and_require_hit_exits_17(
    vllm_pkg: Path, build_env_factors: dict[str, Any], tmp_path: Path
) -> None:
    """This image's own torch_key (torch imported in a child, CPU only) is the recorded one."""
    image = engine_factors(clean_env(), torch=True)
    assert isinstance(image.get("torch_key"), str), image
    name, doc = _doc_034(build_env_factors, _traced(tmp_path, "venv"), image["torch_key"])
    root = _write_root(tmp_path / "vllm", name, doc)
    groups = _engine_groups(tmp_path, image["torch_key"])
    args = ("predict", "--cache-root", str(root), "--engine-factors", str(groups))
    env = _engine_env(vllm_pkg)
    hit = run_artifactd(*args, "--require-hit", "--json", env=env)
    assert hit.returncode == 0, hit.stderr[-2000:]
    report = json.loads(hit.stdout.strip().splitlines()[-1])
    assert report["outcome"] == "hit"
    event = json.loads(hit.stderr.strip().splitlines()[-1])
    assert event["stage"] == "predict" and event["entries"] == {name: "hit"}
    assert report["entries"][0]["line"] == "will hit"
    metrics = tmp_path / "m.prom"
    miss = run_artifactd(
        *args,
        "--require-hit",
        "--metrics-file",
        str(metrics),
        "--",
        "vllm",
        "serve",
        "x",
        "--max-num-batched-tokens=2048",
        env={**env, ENV_VAR: "1"},
    )
    assert miss.returncode == 17, miss.stderr[-2000:]
    assert f"will miss: env.{ENV_VAR}: false -> true" in miss.stdout
    assert "max_num_batched_tokens: 8192 -> 2048" in miss.stdout
    assert "Traceback" not in miss.stderr
    assert re.search(r"hint: ", miss.stderr)
    prom = metrics.read_text()
    assert 'artifactd_engine_hit_predicted{family="vllm",outcome="miss"} 1.0' in prom


def test_cli_without_factors_is_unknown_and_refuses_a_fifo(tmp_path: Path) -> None:
    (tmp_path / "vllm").mkdir()
    proc = run_artifactd("predict", "--cache-root", str(tmp_path / "vllm"), "--require-hit")
    assert proc.returncode == 17
    assert "no vLLM compile cache entry" in proc.stdout
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    bad = run_artifactd(
        "predict", "--cache-root", str(tmp_path / "vllm"), "--engine-factors", str(fifo), timeout=60
    )
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr


@pytest.mark.slow
def test_cli_from_an_artifact_reads_only_its_config(
    build_env_factors: dict[str, Any], tmp_path: Path
) -> None:
    """``--from REF``: the harvested vLLM facts in the config; no layer blob is needed."""
    name, doc = _doc_034(build_env_factors, _traced(tmp_path, "venv"))
    root = _write_root(tmp_path / "vllm", name, doc)
    (root / "torch_compile_cache" / name / "rank_0_0" / "backbone" / "graph.py").write_text("g\n")
    layout = tmp_path / "store"
    env = clean_env({"HOME": str(tmp_path), "VLLM_CACHE_ROOT": str(root)})
    harvested = run_artifactd(
        "harvest", "--store", f"oci:{layout}", "--family", "vllm", "--json", env=env
    )
    assert harvested.returncode == 0, harvested.stderr[-2000:]
    index = json.loads((layout / "index.json").read_text())
    manifest_digest = index["manifests"][0]["digest"]
    tag = index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"]
    blobs = layout / "blobs" / "sha256"
    manifest = json.loads((blobs / manifest_digest.split(":")[1]).read_text())
    for layer in manifest["layers"]:
        (blobs / layer["digest"].split(":")[1]).unlink()
    engine = {"env": {**build_env_factors, ENV_VAR: True}}
    pred = PodInputs(environ={}, engine=engine, gpu_name=GPU)
    result = run_predict(cache_root=None, ref=f"oci:{layout}:{tag}", inputs=pred)
    assert [e.entry for e in result.entries] == [name]
    assert result.outcome == "miss"
    assert _named(result.entries[0]) == [f"env.{ENV_VAR}: false -> true"]


def test_config_leaves_from_the_engine_args_and_the_model_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    argv = ("vllm", "serve", "/models/m", "-tp", "2", "--max-num-batched-tokens=2048")
    assert config_leaves(argv, tmp_path) == {
        "model": "/models/m",
        "tensor_parallel_size": 2,
        "max_num_batched_tokens": 2048,
        "dtype": "torch.bfloat16",
    }
    assert config_leaves(("vllm", "serve", "m", "--dtype", "half"))["dtype"] == "torch.float16"
    # auto without the model's config.json: not a factor the args give.
    assert "dtype" not in config_leaves(("vllm", "serve", "m", "--dtype", "auto"))


def test_a_traced_path_that_is_a_fifo_is_missing_never_waited_on(
    static_env: dict[str, Any], tmp_path: Path
) -> None:
    traced = _traced(tmp_path, "venv")
    name, doc = _doc_034(static_env, traced)
    traced.unlink()
    os.mkfifo(traced)
    pred = predict_entry(name, doc, _pod(static_env))
    assert _named(pred) == [f"code[{traced}]: present -> missing (missing)"]


def _fake_python(tmp_path: Path, body: str) -> str:
    path = tmp_path / "python"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_the_engine_answer_is_capped_and_its_time_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child that floods or hangs is killed: an error the prediction reports, never a hang."""
    flood = _fake_python(tmp_path, "exec yes {}")
    doc = engine_factors({}, python=flood, torch=False)
    assert doc == {"env_error": f"the engine's answer is over {P.MAX_ENGINE_OUTPUT} bytes"}
    monkeypatch.setattr(P, "ENGINE_TIMEOUT_S", 0.5)
    hang = _fake_python(tmp_path, "exec sleep 600")
    assert "did not answer within" in engine_factors({}, python=hang, torch=False)["env_error"]
    pod = pod_factors(PodInputs(environ={}, gpu_name=GPU, engine=doc))
    assert pod.env is None
    assert "over" in pod.why["env"]


def test_a_file_vllm_could_not_read_at_build_and_can_here_is_named(
    static_env: dict[str, Any], tmp_path: Path
) -> None:
    """vLLM records no hash for a file it could not read; a pod that can read it hashes it."""
    traced = _traced(tmp_path, "venv")
    name, doc = _doc_034(static_env, traced)
    doc["code"]["files"][0].pop("hash")
    name = vllmkey.dir_key(doc, RECIPE_034)
    (only,) = _named(predict_entry(name, doc, _pod(static_env)))
    assert only.startswith(f"code[{traced}].hash: null -> ") and only.endswith("(readable)")


def test_the_engine_python_is_the_one_asked(static_env: dict[str, Any], tmp_path: Path) -> None:
    """--engine-python: vLLM lives in the engine's venv, artifactd may run from another."""
    answer = json.dumps({"env": {**static_env, ENV_VAR: True}})
    engine = _fake_python(tmp_path, f"echo '{answer}'")
    pod = pod_factors(PodInputs(environ={}, gpu_name=GPU, python=engine), torch=False)
    name, doc = _doc_034(static_env, _traced(tmp_path, "venv"))
    assert _named(predict_entry(name, doc, pod))[0] == f"env.{ENV_VAR}: false -> true"


# --------------------------------------------------------------------------
# restore --predict: said before any layer is fetched
# --------------------------------------------------------------------------


def _published(registry: RegistryServer, repo: str, root: Path, fp: Fingerprint) -> dict[str, str]:
    """Harvest the vLLM root straight into the registry; return its layer digests by family."""
    with open_store(registry.ref(repo)) as st:
        result = harvest(st, fp, families=["vllm"], environ={"VLLM_CACHE_ROOT": str(root)})
    return {f.family: f.layer_digest for f in result.families if f.layer_digest}


def _raw(fp: Fingerprint) -> dict[str, Any]:
    raw: dict[str, Any] = fp.model_dump(mode="json")
    return raw


def _pod_inputs(env: Mapping[str, Any], **kw: Any) -> PodInputs:
    """The pod's side, the engine's image answer given (no vLLM here): env, groups, GPU."""
    groups = {"config": _config(), "compiler": _compiler()}
    return PodInputs(environ={}, engine={"env": dict(env)}, gpu_name=GPU, groups=groups, **kw)


@pytest.mark.slow
def test_restore_predicts_before_any_layer_is_fetched(
    static_env: dict[str, Any],
    registry: RegistryServer,
    repo: str,
    local_fp: Fingerprint,
    tmp_path: Path,
) -> None:
    """The prediction (an event, then the outcome) comes from the config; layers come after."""
    name, doc = _doc_034(static_env, _traced(tmp_path, "venv"))
    root = _write_root(tmp_path / "vllm", name, doc)
    layers = _published(registry, repo, root, local_fp)
    seen: list[tuple[dict[str, Any], int]] = []
    with FaultProxy(registry.host) as proxy:

        def on_event(event: dict[str, Any]) -> None:
            if event.get("stage") == "predict":
                seen.append((event, len(proxy.blob_gets(layers.values()))))

        pod = _pod_inputs({**static_env, ENV_VAR: True})
        request = RestoreRequest(
            store=proxy.ref(repo),
            target=tmp_path / "t",
            families=["vllm"],
            predict=PredictOptions(pod),
        )
        out = run_restore(request, _raw(local_fp), on_event=on_event)
        assert out.status == "restored", out.failure
        assert len(proxy.blob_gets(layers.values())) == 1  # the vLLM layer, after
    ((event, fetched_then),) = seen
    assert fetched_then == 0  # the prediction was made before any layer GET
    assert event["outcome"] == "miss"
    assert event["lines"] == {name: f"will miss: env.{ENV_VAR}: false -> true"}
    assert out.prediction is not None and out.prediction.outcome == "miss"
    report = restore_report(out)
    assert report["prediction"]["entries"][0]["line"] == event["lines"][name]


@pytest.mark.slow
def test_restore_require_hit_installs_nothing_and_exits_17(
    static_env: dict[str, Any],
    registry: RegistryServer,
    repo: str,
    local_fp: Fingerprint,
    tmp_path: Path,
) -> None:
    """--require-hit: a predicted miss fetches no layer, installs nothing and exits 17."""
    name, doc = _doc_034(static_env, _traced(tmp_path, "venv"))
    layers = _published(registry, repo, _write_root(tmp_path / "vllm", name, doc), local_fp)
    with FaultProxy(registry.host) as proxy:
        miss = PredictOptions(_pod_inputs({**static_env, ENV_VAR: True}), require_hit=True)
        target = tmp_path / "t"
        request = RestoreRequest(
            store=proxy.ref(repo), target=target, families=["vllm"], predict=miss
        )
        out = run_restore(request, _raw(local_fp))
        assert proxy.blob_gets(layers.values()) == []
        assert (out.status, out.exit_code) == ("failed", 17)
        assert out.failure is not None and out.failure.kind == "predicted_miss"
        assert f"env.{ENV_VAR}: false -> true" in out.failure.message
        assert not (target / "vllm").exists()
        # The same pod as the build: it will hit, so the restore installs.
        same = request._replace(predict=PredictOptions(_pod_inputs(static_env), require_hit=True))
        done = run_restore(same, _raw(local_fp))
        assert (done.status, done.exit_code) == ("restored", 0), done.failure
        assert done.prediction is not None and done.prediction.outcome == "hit"
        # A restarted pod (a no-op): predicted from the caches now in the target.
        again = run_restore(same, _raw(local_fp))
        assert again.status == "noop" and again.prediction is not None
        assert again.prediction.outcome == "hit"
        assert again.prediction.source == str(target / "vllm")


def test_restore_predict_without_a_vllm_layer_is_unknown(
    registry: RegistryServer, repo: str, local_fp: Fingerprint, tmp_path: Path
) -> None:
    empty = tmp_path / "store"
    request = RestoreRequest(
        store=f"oci:{empty}",
        target=tmp_path / "t",
        families=["vllm"],
        predict=PredictOptions(PodInputs(environ={}, engine={"env": {}}), require_hit=True),
    )
    open_store(f"oci:{empty}", create=True).close()
    out = run_restore(request, _raw(local_fp))
    assert out.prediction is not None and out.prediction.outcome == "unknown"
    assert "this restore installs no vLLM cache" in out.prediction.entries[0].reason
    assert out.exit_code == 17


def test_engine_args_split_as_a_shell_would_and_are_bounded() -> None:
    line = "vllm serve '/models/my model' --max-num-batched-tokens 4096"
    argv = engine_argv((), line)
    assert argv == ("vllm", "serve", "/models/my model", "--max-num-batched-tokens", "4096")
    assert engine_argv(("a",), line) == ("a",)  # the arguments after -- win
    with pytest.raises(UsageError, match="cannot be split"):
        engine_argv((), "vllm serve 'open")
    with pytest.raises(UsageError, match="at most"):
        engine_argv((), "x " * (MAX_ENGINE_ARGS + 1))


@pytest.mark.slow
def test_cli_restore_predict_prints_before_the_plan_and_require_hit_exits_17(
    static_env: dict[str, Any], local_fp: Fingerprint, tmp_path: Path
) -> None:
    """The command line: --predict's lines, --json's prediction, --require-hit's exit 17."""
    name, doc = _doc_034(static_env, _traced(tmp_path, "venv"))
    root = _write_root(tmp_path / "vllm", name, doc)
    layout = tmp_path / "store"
    env = clean_env({"HOME": str(tmp_path), "VLLM_CACHE_ROOT": str(root)})
    harvested = run_artifactd("harvest", "--store", f"oci:{layout}", "--family", "vllm", env=env)
    assert harvested.returncode == 0, harvested.stderr[-2000:]
    # The engine's image answers with the build's env (no vLLM here to ask).
    engine = _fake_python(tmp_path, f"echo '{json.dumps({'env': static_env})}'")
    args = ("restore", "--store", f"oci:{layout}", "--engine-python", engine)
    target = ("--target", str(tmp_path / "t"))
    proc = run_artifactd(*args, *target, "--predict", "--gpu-name", "NVIDIA L4", env=clean_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"predict: oci:{layout}" in proc.stderr and "the engine will miss" in proc.stderr
    assert f"will miss: compiler.system.device.name: {GPU} -> NVIDIA L4" in proc.stderr
    assert "the engine will miss" in proc.stdout  # and again under the plan
    pod = {"ARTIFACTD_REQUIRE_HIT": "1", "ARTIFACTD_GPU_NAME": "NVIDIA L4"}
    refused = run_artifactd(*args, "--target", str(tmp_path / "t2"), "--json", env=clean_env(pod))
    assert refused.returncode == 17, refused.stderr[-2000:]
    report = json.loads(refused.stdout)
    assert report["status"] == "failed" and report["failure"]["kind"] == "predicted_miss"
    assert report["prediction"]["outcome"] == "miss"
    assert not (tmp_path / "t2" / "vllm").exists()
    assert "Traceback" not in refused.stderr


# --------------------------------------------------------------------------
# vLLM 0.33: the build recovers the traced-file list its code_hash covered
# --------------------------------------------------------------------------


def _release_code_hash(files: list[str]) -> str:
    """0.33's own traced-file loop, executed from its source, over ``files``."""

    class _Log:
        def warning(self, *args: object) -> None:
            del args

    ns: dict[str, Any] = {"hashlib": hashlib, "forward_code_files": sorted(files), "logger": _Log()}
    exec(_block(_backends(), "hash_content = []", "code_hash = hashlib"), ns)  # noqa: S102 - the pinned release's own loop
    return str(ns["code_hash"])


def _graph_line(path: Path, line: int = 3, fn: str = "forward") -> str:
    """A ``# File:`` line as torch's FX ``print_readable`` writes it (see the torch test below)."""
    return f"        # File: {path}:{line} in {fn}, code: return x * 2\n"


def _root_033(
    tmp_path: Path, env: Mapping[str, Any], traced: list[Path], named: list[Path]
) -> tuple[Path, str]:
    """A 0.33 cache root: code_hash over ``traced``; its graph file names ``named``."""
    doc = {
        "env": dict(env),
        "config_hash": "a" * 64,
        "code_hash": _release_code_hash([str(p) for p in traced]),
        "compiler_hash": "c" * 10,
    }
    name = vllmkey.dir_key(doc, RECIPE_033)
    root = _write_root(tmp_path / "vllm", name, doc)
    graph = root / "torch_compile_cache" / name / "rank_0_0" / "backbone" / vllmkey.GRAPH_FILE
    graph.write_text("class GraphModule(torch.nn.Module):\n" + "".join(map(_graph_line, named)))
    return root, name


def _recorded_033(root: Path) -> dict[str, dict[str, Any]]:
    """What an artifact's config carries for the root: the vLLM family's facts, as harvested."""
    return recorded_from_facts({"cache": FAMILIES["vllm"].facts("cache", root)})


def test_033_traced_files_are_recorded_and_each_change_is_named(
    static_env: dict[str, Any], tmp_path: Path
) -> None:
    """The list is kept only as 0.33's own code_hash confirms it; then a change is named."""
    model = _traced(tmp_path, "venv-build")
    layer = model.with_name("layers.py")
    layer.write_text("def rms(x):\n    return x\n")
    root, name = _root_033(tmp_path, static_env, [model, layer], [model, layer])
    recorded = _recorded_033(root)
    traced = recorded[name][vllmkey.TRACED_KEY]
    assert traced["schema_version"] == vllmkey.TRACED_SCHEMA_VERSION
    assert [f["path"] for f in traced["files"]] == sorted([str(model), str(layer)])

    def code(**kw: Any) -> Any:
        pod = PodFactors(env=static_env, read_file=read_traced, **kw)
        entry = predict_entry(name, recorded[name], pod)
        return next(c for c in entry.checks if c.group == "code"), entry

    same, _ = code()
    assert same.status == "match"
    layer.write_text("def rms(x):\n    return x * 2\n")
    changed, entry = code()
    assert entry.outcome == "miss"
    ((diff),) = changed.differences
    assert diff.key == f"code[{layer}].sha256" and diff.category == "changed"
    layer.write_text("def rms(x):\n    return x\n")
    moved = _traced(tmp_path, "venv-pod")
    model.unlink()
    reloc = ((str(tmp_path / "venv-build"), str(tmp_path / "venv-pod")),)
    where, _ = code(relocations=reloc)
    assert [d.describe() for d in where.differences] == [
        f"code[{model}].path: {model} -> {moved} (moved)"
    ]
    gone, _ = code()
    assert [d.describe() for d in gone.differences] == [
        f"code[{model}]: present -> missing (missing)"
    ]


def test_033_a_graph_that_names_too_few_files_records_no_list(
    static_env: dict[str, Any], tmp_path: Path
) -> None:
    """vLLM traced a file the graph does not name: no list is kept, and code stays unknown."""
    model = _traced(tmp_path, "venv")
    helper = model.with_name("utils.py")
    helper.write_text("def helper():\n    pass\n")
    root, name = _root_033(tmp_path, static_env, [model, helper], [model])
    recorded = _recorded_033(root)
    assert "files" not in recorded[name][vllmkey.TRACED_KEY]
    entry = predict_entry(name, recorded[name], PodFactors(env=static_env, read_file=read_traced))
    code = next(c for c in entry.checks if c.group == "code")
    assert code.status == "unknown"
    assert "do not give vLLM's code_hash" in code.reason


def test_033_a_recorded_list_is_bounded(static_env: dict[str, Any]) -> None:
    many = {"schema_version": 1, "files": [{"path": f"/x/{i}.py"} for i in range(5000)]}
    doc = {"env": static_env, "config_hash": "a", "code_hash": "b", "compiler_hash": "c"}
    doc[vllmkey.TRACED_KEY] = many
    pod = PodFactors(env=static_env, read_file=read_traced)
    (code,) = [c for c in vllmkey.compare(doc, RECIPE_033, pod) if c.group == "code"]
    assert code.status == "unknown" and "over 4096" in code.reason
    paths = [f"/x/{i}.py" for i in range(vllmkey.MAX_TRACED_FILES + 1)]
    assert "more than" in vllmkey.traced_033(doc, paths, lambda p: None)["reason"]


@pytest.mark.slow
@pytest.mark.torch
def test_the_graph_file_lines_are_what_torch_writes(tmp_path: Path) -> None:
    """torch's own FX ``print_readable`` (what vLLM 0.33 saves) names the traced source files."""
    src = tmp_path / "model_src.py"
    src.write_text(
        "def helper(x):\n    return x.sin() * 2\n\ndef f(x):\n    return helper(x) + 1\n"
    )
    script = textwrap.dedent(
        f"""
        import importlib.util, sys, torch
        spec = importlib.util.spec_from_file_location("model_src", {str(src)!r})
        mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
        out = []
        def backend(gm, example):
            out.append(gm.print_readable(print_output=False))
            return gm.forward
        torch.compile(mod.f, backend=backend)(torch.randn(3))
        sys.stdout.write(out[0])
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert vllmkey.graph_paths(proc.stdout) == [str(src)]
