"""Warm-up matrices: loading, validation errors and deterministic expansion."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from artifactd.build.matrix import expand, load_matrix
from artifactd.errors import ArtifactdError, ConfigError, UsageError

REPO = Path(__file__).resolve().parents[1]
CPU_DEMO = REPO / "warmup_matrices" / "cpu-demo.yaml"

AXES_MATRIX = """\
name: llama-sweep
families: [triton, inductor]
workload:
  model: meta-llama/Llama-3.1-8B
axes:
  # written in non-sorted order on purpose: expansion sorts axis names
  tp: [1, 2]
  dtype: [bfloat16, fp8]
command: >-
  {{ python }} -m warm --model {{ model }} --tp {{ tp }}
  --dtype {{ dtype }} --cell {{ cell_id }}
"""


def _write(tmp_path: Path, text: str, name: str = "m.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_cpu_demo_loads() -> None:
    matrix = load_matrix(CPU_DEMO)
    assert matrix.name == "cpu-demo"
    assert matrix.target.gpu_arch == "sm_90a"
    assert matrix.families == ["inductor", "triton", "generic"]
    assert matrix.workload["model"] == "artifactd/cpu-demo"


def test_cpu_demo_expansion_is_deterministic() -> None:
    matrix = load_matrix(CPU_DEMO)
    first = expand(matrix, CPU_DEMO)
    second = expand(load_matrix(CPU_DEMO), CPU_DEMO)
    assert first == second
    assert len(first) == 1
    cell = first[0]
    assert cell.index == 0
    assert cell.id == "0-inductor_triton_nvcc"
    assert cell.argv == [
        sys.executable,
        str(CPU_DEMO.parent / "cpu-demo" / "warmup.py"),
        "--parts",
        "inductor,triton,nvcc",
        "--arch",
        "90",
    ]
    assert Path(cell.argv[1]).is_file()


def test_axes_expand_in_sorted_axis_order(tmp_path: Path) -> None:
    path = _write(tmp_path, AXES_MATRIX)
    cells = expand(load_matrix(path), path)
    assert [c.index for c in cells] == [0, 1, 2, 3]
    # Axis names sorted (dtype before tp), values in file order.
    assert [c.values for c in cells] == [
        {"dtype": "bfloat16", "tp": 1},
        {"dtype": "bfloat16", "tp": 2},
        {"dtype": "fp8", "tp": 1},
        {"dtype": "fp8", "tp": 2},
    ]
    assert len({c.id for c in cells}) == 4
    assert [c.id for c in cells] == ["0-bfloat16_1", "1-bfloat16_2", "2-fp8_1", "3-fp8_2"]
    assert cells[3].argv == [
        sys.executable,
        "-m",
        "warm",
        "--model",
        "meta-llama/Llama-3.1-8B",
        "--tp",
        "2",
        "--dtype",
        "fp8",
        "--cell",
        "3",
    ]
    assert expand(load_matrix(path), path) == cells


def test_matrix_without_axes_has_one_cell(tmp_path: Path) -> None:
    path = _write(tmp_path, 'name: single\ncommand: "{{ python }} -c pass"\n')
    cells = expand(load_matrix(path), path)
    assert [(c.index, c.id, c.values) for c in cells] == [(0, "0-cell", {})]
    assert cells[0].argv == [sys.executable, "-c", "pass"]


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError) as err:
        load_matrix(path)
    assert str(path) in str(err.value)
    assert "does not exist" in str(err.value)
    assert err.value.hint is not None


def test_bad_yaml(tmp_path: Path) -> None:
    path = _write(tmp_path, "name: x\ncommand: [unclosed\n")
    with pytest.raises(ConfigError) as err:
        load_matrix(path)
    assert "not valid YAML" in str(err.value)
    assert str(path) in str(err.value)


def test_unknown_field(tmp_path: Path) -> None:
    path = _write(tmp_path, "name: x\ncommand: echo\ncomand_typo: echo\n")
    with pytest.raises(ConfigError) as err:
        load_matrix(path)
    assert "comand_typo" in str(err.value)
    assert str(path) in str(err.value)


def test_nested_bad_field_is_named_by_dotted_path(tmp_path: Path) -> None:
    path = _write(tmp_path, "name: x\ncommand: echo\ntarget:\n  gpu: sm_90a\n")
    with pytest.raises(ConfigError) as err:
        load_matrix(path)
    assert "target.gpu" in str(err.value)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        pytest.param("name: x\n", "command", id="missing-command"),
        pytest.param("name: Bad Name\ncommand: echo\n", "name", id="bad-name"),
        pytest.param("", "", id="empty-file"),
        pytest.param("- a\n- b\n", "", id="not-a-mapping"),
        pytest.param("name: x\ncommand: echo\ntimeout_s: 0\n", "timeout_s", id="zero-timeout"),
    ],
)
def test_invalid_documents(tmp_path: Path, text: str, needle: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_matrix(path)
    assert str(path) in str(err.value)
    assert needle in str(err.value)


def test_unknown_family(tmp_path: Path) -> None:
    path = _write(tmp_path, "name: x\ncommand: echo\nfamilies: [triton, cutlass]\n")
    with pytest.raises((ConfigError, UsageError)) as err:
        load_matrix(path)
    assert "cutlass" in str(err.value)
    assert isinstance(err.value, ArtifactdError)
    assert err.value.hint is not None
    assert "triton" in err.value.hint  # the hint lists the known families


def test_undefined_template_variable(tmp_path: Path) -> None:
    path = _write(tmp_path, 'name: x\ncommand: "{{ python }} --model {{ modle }}"\n')
    matrix = load_matrix(path)
    with pytest.raises(ConfigError) as err:
        expand(matrix, path)
    assert "modle" in str(err.value)
    assert str(path) in str(err.value)


def test_template_syntax_error(tmp_path: Path) -> None:
    path = _write(tmp_path, 'name: x\ncommand: "{{ python "\n')
    with pytest.raises(ConfigError) as err:
        expand(load_matrix(path), path)
    assert "command template" in str(err.value)


def test_paths_with_spaces_stay_one_argument(tmp_path: Path) -> None:
    spaced = tmp_path / "my matrices"
    spaced.mkdir()
    path = _write(spaced, 'name: x\ncommand: "{{ python }} {{ matrix_dir }}/warm.py"\n')
    cells = expand(load_matrix(path), path)
    assert cells[0].argv == [sys.executable, f"{spaced}/warm.py"]
