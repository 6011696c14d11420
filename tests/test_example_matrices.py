"""The matrices in ``warmup_matrices/`` load, expand, and say what a warm-up needs.

Every ``*.yaml`` there validates and expands into cells with unique ids. The
two GPU matrices (vLLM on H100/H200, SGLang on H20) have NOT run here (no
GPU; each says so at its top), so what is checked is what can go wrong
without one: they are serve matrices whose cells need one GPU per TP rank,
serve on distinct ports that the engine is told, pass the TP size to the
engine, stay inside the engine's context length with every request, name
known families and leave the cache directories to the builder. The CPU demo
stays a command matrix.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import REPO

from artifactd.build.matrix import Cell, Matrix, expand, load_matrix
from artifactd.constants import CACHE_ENV_VARS
from artifactd.families import FAMILIES

MATRICES = REPO / "warmup_matrices"
#: matrix name: (the engine's TP flag, its context-length flag, argv prefix).
GPU_MATRICES = {
    "vllm-h100": ("--tensor-parallel-size", "--max-model-len", ["vllm", "serve"]),
    "sglang-h20": ("--tp", "--context-length", ["-m", "sglang.launch_server"]),
}


def matrix_files() -> list[Path]:
    """Every matrix file: ``warmup_matrices/*.yaml``."""
    return sorted(MATRICES.glob("*.yaml"))


def _load(path: Path) -> tuple[Matrix, list[Cell]]:
    matrix = load_matrix(path)
    return matrix, expand(matrix, path)


def _value(argv: list[str], flag: str) -> str:
    """The word after ``flag`` in ``argv``; the flag must appear exactly once."""
    assert argv.count(flag) == 1, f"{flag} appears {argv.count(flag)} times in {argv}"
    i = argv.index(flag)
    assert i + 1 < len(argv), f"{flag} has no value"
    return argv[i + 1]


def _prompt_tokens_at_most(words: int) -> int:
    """An upper bound on the tokens of the builder's prompt ``"w0 w1 ..."``.

    A word ``w<i>`` is at most one token for ``w`` (with its space) and one
    per digit (tokenizers that split numbers digit by digit, such as Qwen's).
    """
    return sum(1 + len(str(i)) for i in range(words))


def test_the_expected_matrices_are_there() -> None:
    names = {p.stem for p in matrix_files()}
    assert {"cpu-demo", *GPU_MATRICES} <= names, names


@pytest.mark.parametrize("path", matrix_files(), ids=lambda p: p.name)
def test_matrix_loads_and_expands(path: Path) -> None:
    matrix, cells = _load(path)
    assert matrix.name == path.stem, f"{path.name}: name {matrix.name}"
    assert cells, f"{path.name}: no cells"
    assert [c.index for c in cells] == list(range(len(cells)))
    assert len({c.id for c in cells}) == len(cells), "cell ids repeat"
    assert set(matrix.families) <= set(FAMILIES), matrix.families
    # The builder points every cache variable at fresh roots: a matrix that
    # set one would send the engine's caches past the harvest.
    assert not set(matrix.env) & set(CACHE_ENV_VARS), sorted(matrix.env)
    for cell in cells:
        if cell.serve is None:
            assert cell.argv, f"{cell.id}: neither an argv nor a serve"
        else:
            assert not cell.argv, f"{cell.id}: both an argv and a serve"


def test_cpu_demo_stays_a_command_matrix() -> None:
    matrix, cells = _load(MATRICES / "cpu-demo.yaml")
    assert matrix.command is not None
    assert matrix.serve is None
    assert all(cell.serve is None and cell.argv for cell in cells)


@pytest.mark.parametrize("name", sorted(GPU_MATRICES))
def test_gpu_matrix_says_it_has_not_run(name: str) -> None:
    head = (MATRICES / f"{name}.yaml").read_text().splitlines()[0]
    assert head.startswith("# UNTESTED:"), f"{name}.yaml must say at its top that it has not run"


@pytest.mark.parametrize("name", sorted(GPU_MATRICES))
def test_gpu_matrix_cells_serve_with_their_tp_and_port(name: str) -> None:
    tp_flag, _, prefix = GPU_MATRICES[name]
    matrix, cells = _load(MATRICES / f"{name}.yaml")
    assert matrix.serve is not None and matrix.command is None, f"{name}: not a serve matrix"
    assert matrix.target.gpu_arch == "sm_90a"
    assert "tp" in matrix.axes, f"{name}: no tp axis"
    assert "model" in matrix.workload, f"{name}: the workload names no model"
    ports = [cell.serve.port for cell in cells if cell.serve is not None]
    assert len(ports) == len(cells), f"{name}: a cell that does not serve"
    assert len(set(ports)) == len(ports), f"{name}: cells share a port: {ports}"
    for cell in cells:
        serve = cell.serve
        assert serve is not None
        tp = cell.values["tp"]
        assert cell.gpus == tp, f"{cell.id}: gpus {cell.gpus} for tp={tp}"
        argv = serve.argv
        assert argv[: len(prefix)] == prefix or argv[1 : 1 + len(prefix)] == prefix, argv
        assert _value(argv, "--port") == str(serve.port), f"{cell.id}: the engine's port"
        assert _value(argv, tp_flag) == str(tp), f"{cell.id}: the engine's TP size"
        assert _value(argv, "--host") == "127.0.0.1", f"{cell.id}: listens beyond loopback"
        assert serve.ready_url == f"http://127.0.0.1:{serve.port}/health", serve.ready_url
        assert serve.base_url == f"http://127.0.0.1:{serve.port}", serve.base_url
        assert serve.model == matrix.workload["model"]
        assert matrix.workload["model"] in argv, f"{cell.id}: the engine serves another model"


@pytest.mark.parametrize("name", sorted(GPU_MATRICES))
def test_gpu_matrix_requests_fit_the_context(name: str) -> None:
    _, context_flag, _ = GPU_MATRICES[name]
    matrix, cells = _load(MATRICES / f"{name}.yaml")
    assert matrix.serve is not None
    kinds = {group.kind for group in matrix.serve.requests}
    assert kinds == {"completions", "chat"}, f"{name}: both endpoints, got {kinds}"
    for cell in cells:
        assert cell.serve is not None
        context = int(_value(cell.serve.argv, context_flag))
        for group in cell.serve.requests:
            longest = _prompt_tokens_at_most(max(group.prompt_tokens)) + group.max_tokens
            assert longest <= context, (
                f"{cell.id}: {max(group.prompt_tokens)} words + {group.max_tokens} tokens "
                f"may exceed {context_flag} {context}"
            )
    # Some prompt is longer than a prefill chunk, some batch is large.
    assert max(max(g.prompt_tokens) for g in matrix.serve.requests) >= 1000
    assert max(g.concurrency for g in matrix.serve.requests) >= 64


def test_vllm_compilation_config_is_json_with_capture_sizes() -> None:
    _, cells = _load(MATRICES / "vllm-h100.yaml")
    for cell in cells:
        assert cell.serve is not None
        config = json.loads(_value(cell.serve.argv, "--compilation-config"))
        sizes = config["cudagraph_capture_sizes"]
        assert sizes == sorted(set(sizes)) and sizes[0] == 1, sizes
        batched = int(_value(cell.serve.argv, "--max-num-batched-tokens"))
        assert sizes[-1] <= batched, "a capture size above --max-num-batched-tokens"
        assert set(config.get("compile_sizes", [])) <= set(sizes)
        # Removed from current vLLM: the capture sizes live in the config.
        assert "--cuda-graph-sizes" not in cell.serve.argv


def test_sglang_precompiles_deepgemm() -> None:
    matrix, _ = _load(MATRICES / "sglang-h20.yaml")
    assert {"sglang", "deepgemm"} <= set(matrix.families)
    assert matrix.env.get("SGLANG_JIT_DEEPGEMM_PRECOMPILE") in ("1", "true")
    assert matrix.env.get("SGLANG_ENABLE_JIT_DEEPGEMM") in ("1", "true")
