"""Hostile matrices and command lines: nothing runs code, hangs or crashes.

A CI plan job that only lists a matrix's cells may hold secrets, so every
template a matrix holds renders in jinja2's sandbox, and a matrix file is
bounded before it is parsed (size, UTF-8, nesting, scalar size) and its grid
before it is expanded. Run ids, cell indexes, ``--set`` values and lint paths
from the command line are checked too. Each test runs the real CLI in a
subprocess (with a timeout: nothing may hang) and asserts the documented exit
code, no traceback, no "internal error", and that nothing happened (no file
written by a template, no artifact published, no cell run).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import PYTHON, clean_env, run_artifactd

import artifactd.build.matrix as matrix_mod
from artifactd.build.matrix import Matrix, expand, load_matrix
from artifactd.build.published import check_key
from artifactd.errors import ConfigError

#: Every hostile run must end well within this (seconds).
BOUND = 10.0


def _clean_failure(proc: subprocess.CompletedProcess[Any], code: int) -> str:
    """Assert exit ``code``, no traceback and no internal error; return stderr as text."""
    err = proc.stderr if isinstance(proc.stderr, str) else proc.stderr.decode(errors="replace")
    assert proc.returncode == code, (proc.returncode, err[-2000:])
    assert "Traceback" not in err
    assert "internal error" not in err and "this is a bug" not in err
    return err


def _run_bytes(
    *args: bytes, env: Mapping[bytes, bytes] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[bytes]:
    """Run ``python -m artifactd`` with arguments (and environment) as raw bytes."""
    base = {os.fsencode(k): os.fsencode(v) for k, v in clean_env().items()}
    return subprocess.run(
        [os.fsencode(PYTHON), b"-m", b"artifactd", *args],
        capture_output=True,
        env={**base, **(env or {})},
        cwd=cwd,
        timeout=60,
        check=False,
    )


def _cells(path: Path, cwd: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    proc = run_artifactd("matrix", "cells", str(path), "--json", cwd=cwd, timeout=BOUND)
    return proc, time.monotonic() - start


# --------------------------------------------------------------------------
# Templates: every templated field, sandboxed
# --------------------------------------------------------------------------

#: Reaching Python through the template's globals and objects, as published.
ESCAPES = {
    "cycler-globals": "{{ cycler.__init__.__globals__.os.popen('touch PWNED').read() }}",
    "subclasses": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "self-globals": "{{ self.__init__.__globals__ }}",
    "lipsum-globals": "{{ lipsum.__globals__['os'].popen('touch PWNED').read() }}",
    "joiner-system": "{{ joiner.__init__.__globals__.os.system('touch PWNED') }}",
    "getitem-dunder": "{{ python['__class__']['__mro__'] }}",
    "namespace": "{% set ns = namespace(x=1) %}{{ ns }}",
    "format-method": "{{ '{0.__class__}'.format(python) }}",
}

#: Small templates that would make a huge string, number or loop.
EXHAUSTION = {
    "repeat-string": "{{ 'x' * 100000000 }}",
    "repeat-list": "{{ ['x' * 4096] * 65536 }}",
    "many-terms": "{{ " + " ~ ".join(["('x' * 4096)"] * 3000) + " }}",
    "zfill": "{{ 'x'.zfill(100000000) }}",
    "percent-width": "{{ '%0100000000d' % 1 }}",
    "power": "{{ 2 ** 100000000 }}",
    "nested-loops": (
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    ),
}

FIELDS = ("command", "gpus", "serve.command", "serve.ready_url", "serve.base_url")


def _templated(field: str, template: str) -> dict[str, Any]:
    """A matrix whose ``field`` is ``template``, every other field benign."""
    doc: dict[str, Any] = {"name": "hostile", "axes": {"tp": [1, 2]}}
    if field.startswith("serve."):
        serve = {"command": "{{ python }} -c pass --port {{ port }}"}
        serve[field.split(".", 1)[1]] = template
        doc["serve"] = serve
    elif field == "gpus":
        doc.update(command="{{ python }} -c pass", gpus=f"{template}1")
    else:
        doc["command"] = f"{{{{ python }}}} -c pass {template}"
    return doc


def _write(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(doc))
    return path


def _refused_in_process(path: Path) -> str:
    """What ``matrix cells`` does with ``path``, in this process: the ConfigError's text.

    The field x payload grid is a property of the sandbox (a library result);
    the process boundary (exit code, no traceback, bounded time) is proved
    once per payload through the real CLI below.
    """
    with pytest.raises(ConfigError) as info:
        loaded = load_matrix(path)
        check_key(loaded, path)
        expand(loaded, path)
    return str(info.value)


@pytest.mark.parametrize("payload", sorted(ESCAPES))
@pytest.mark.parametrize("field", FIELDS)
def test_template_escape_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, field: str, payload: str
) -> None:
    monkeypatch.chdir(tmp_path)  # where a template that escaped would touch PWNED
    start = time.monotonic()
    err = _refused_in_process(_write(tmp_path / "m.yaml", _templated(field, ESCAPES[payload])))
    assert f"{field} template" in err  # the field is named
    assert not (tmp_path / "PWNED").exists()
    assert time.monotonic() - start < BOUND


@pytest.mark.parametrize(("index", "payload"), list(enumerate(sorted(ESCAPES))))
def test_template_escape_is_refused_by_the_cli(tmp_path: Path, index: int, payload: str) -> None:
    field = FIELDS[index % len(FIELDS)]  # each payload once, the fields in turn
    path = _write(tmp_path / "m.yaml", _templated(field, ESCAPES[payload]))
    proc, took = _cells(path, tmp_path)
    err = _clean_failure(proc, ConfigError.exit_code)
    assert f"{field} template" in err  # the field is named
    assert not (tmp_path / "PWNED").exists()
    assert proc.stdout == ""
    assert took < BOUND


EXHAUSTED_FIELDS = ("command", "gpus", "serve.ready_url")


@pytest.mark.parametrize("payload", sorted(EXHAUSTION))
@pytest.mark.parametrize("field", EXHAUSTED_FIELDS)
def test_template_exhaustion_is_refused(tmp_path: Path, field: str, payload: str) -> None:
    start = time.monotonic()
    err = _refused_in_process(_write(tmp_path / "m.yaml", _templated(field, EXHAUSTION[payload])))
    assert f"{field} template" in err
    assert time.monotonic() - start < BOUND


@pytest.mark.parametrize(("index", "payload"), list(enumerate(sorted(EXHAUSTION))))
def test_template_exhaustion_is_refused_by_the_cli(
    tmp_path: Path, index: int, payload: str
) -> None:
    field = EXHAUSTED_FIELDS[index % len(EXHAUSTED_FIELDS)]
    path = _write(tmp_path / "m.yaml", _templated(field, EXHAUSTION[payload]))
    proc, took = _cells(path, tmp_path)
    err = _clean_failure(proc, ConfigError.exit_code)
    assert f"{field} template" in err
    assert took < BOUND


def test_template_error_names_the_cell(tmp_path: Path) -> None:
    doc = {"name": "x", "axes": {"tp": [1, 0]}, "command": "run", "gpus": "{{ 2 // tp }}"}
    proc, _ = _cells(_write(tmp_path / "m.yaml", doc), tmp_path)
    err = _clean_failure(proc, ConfigError.exit_code)
    assert "cells[1].gpus template" in err and "ZeroDivisionError" in err


def test_what_templates_may_use_still_renders(tmp_path: Path) -> None:
    doc = {
        "name": "allowed",
        "workload": {"model": "org/m"},
        "axes": {"tp": [1, 2], "pp": [2]},
        "gpus": "{{ tp * pp }}",
        "command": (
            "{{ python }} -m warm --model {{ model|upper }} --w {{ workload['model'] }}"
            " {% if tp > 1 %}--big{% endif %} --k {{ 'a' if tp is odd else 'b' }}"
            " --x {{ (tp ~ '-' ~ pp)|trim }} --n {{ [tp, pp]|max }} --c {{ cell_id|int + 1 }}"
        ),
    }
    path = _write(tmp_path / "m.yaml", doc)
    cells = expand(load_matrix(path), path)
    assert [c.gpus for c in cells] == [2, 4]
    assert cells[1].argv[1:] == [
        "-m", "warm", "--model", "ORG/M", "--w", "org/m", "--big", "--k", "b",
        "--x", "2-2", "--n", "2", "--c", "2",
    ]  # fmt: skip


def test_template_rules_are_documented() -> None:
    """The model's docstring (the schema's description) states the limits and the filters."""
    doc = " ".join((Matrix.__doc__ or "").split())
    assert f"{matrix_mod.MAX_MATRIX_BYTES >> 20} MiB" in doc
    assert f"at most {matrix_mod.MAX_YAML_DEPTH} levels" in doc
    assert f"at most {matrix_mod.MAX_SCALAR_CHARS} characters" in doc
    assert f"at most {matrix_mod.MAX_CELLS} cells" in doc
    for name in matrix_mod.TEMPLATE_FILTERS:
        assert name in doc or name == "d"  # "d" is default's alias


# --------------------------------------------------------------------------
# Bounded matrix files
# --------------------------------------------------------------------------


def test_deep_flow_sequence(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("name: d\ncommand: x\nenv: " + "[" * 50_000 + "]" * 50_000 + "\n")
    proc, took = _cells(path, tmp_path)
    _clean_failure(proc, ConfigError.exit_code)
    assert took < BOUND


def test_deep_block_sequence(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("name: d\ncommand: x\nenv:\n" + "".join("  " * i + "-\n" for i in range(100)))
    proc, _ = _cells(path, tmp_path)
    err = _clean_failure(proc, ConfigError.exit_code)
    assert f"nested deeper than {matrix_mod.MAX_YAML_DEPTH} levels" in err


def test_depth_bound_holds_with_the_python_parser(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without libyaml, the pre-scan (not Python's recursion limit) refuses the depth."""
    monkeypatch.setattr(matrix_mod, "_LOADER", yaml.SafeLoader, raising=False)
    path = tmp_path / "deep.yaml"
    path.write_text("name: d\ncommand: x\nenv: " + "[" * 50_000 + "]" * 50_000 + "\n")
    with pytest.raises(ConfigError, match="nested deeper than"):
        load_matrix(path)


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        pytest.param(b"\x00\xff\xfe binary \x89PNG\r\n\x1a\n" * 100, "binary", id="nul"),
        pytest.param(b"name: caf\xe9\ncommand: x\n", "not UTF-8", id="latin-1"),
        pytest.param(os.urandom(4096).replace(b"\0", b"") + b"\xff", "UTF-8", id="random"),
    ],
)
def test_binary_junk(tmp_path: Path, data: bytes, needle: str) -> None:
    path = tmp_path / "junk.yaml"
    path.write_bytes(data)
    proc, _ = _cells(path, tmp_path)
    assert needle in _clean_failure(proc, ConfigError.exit_code)


def test_ten_megabyte_scalar(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text('name: b\ncommand: "' + "a" * 10_000_000 + '"\n')
    proc, took = _cells(path, tmp_path)
    err = _clean_failure(proc, ConfigError.exit_code)
    assert f"over {matrix_mod.MAX_MATRIX_BYTES} bytes" in err
    assert took < BOUND


def test_long_scalar_in_a_small_file(tmp_path: Path) -> None:
    path = tmp_path / "long.yaml"
    path.write_text('name: b\ncommand: "' + "a" * 100_000 + '"\n')  # 100 kB: a small file
    proc, _ = _cells(path, tmp_path)
    err = _clean_failure(proc, ConfigError.exit_code)
    assert "100000 characters" in err and "line 2" in err


def test_oversized_file_of_small_lines(tmp_path: Path) -> None:
    path = tmp_path / "many.yaml"
    path.write_text("name: b\ncommand: x\n" + "# padding\n" * ((2 << 20) // 10))  # 2 MiB
    proc, _ = _cells(path, tmp_path)
    assert "bytes" in _clean_failure(proc, ConfigError.exit_code)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        pytest.param('command: "true \\0"\n', "NUL character", id="nul-escape"),
        pytest.param("command: \"true {{ '\\\\x00' }}\"\n", "NUL character", id="nul-rendered"),
        pytest.param('command: "true"\nenv: {"A=B": x}\n', "env", id="env-name-with-equals"),
    ],
)
def test_values_no_process_can_take(tmp_path: Path, text: str, needle: str) -> None:
    """A NUL in an argv or a variable, a '=' in a variable's name: refused before a cell runs."""
    path = tmp_path / "m.yaml"
    path.write_text("name: n\ngpus: 0\nfamilies: [generic]\n" + text)
    store = tmp_path / "store"
    proc = run_artifactd("build", str(path), "--store", f"oci:{store}", timeout=BOUND * 3)
    assert needle in _clean_failure(proc, ConfigError.exit_code)
    assert not store.exists()


def test_million_cell_grid(tmp_path: Path) -> None:
    values = list(range(100))
    doc = {"name": "g", "command": "echo {{ a }}", "axes": {"a": values, "b": values, "c": values}}
    proc, took = _cells(_write(tmp_path / "grid.yaml", doc), tmp_path)
    err = _clean_failure(proc, ConfigError.exit_code)
    assert "1000000 cells" in err and str(matrix_mod.MAX_CELLS) in err
    assert took < BOUND


def test_grid_limit_is_exact(tmp_path: Path) -> None:
    values = list(range(100))
    at = _write(tmp_path / "at.yaml", {"name": "g", "command": "x", "axes": {"a": values}})
    assert len(expand(load_matrix(at), at)) == 100
    doc = {"name": "g", "command": "x", "axes": {"a": values, "b": list(range(101))}}
    over = _write(tmp_path / "over.yaml", doc)
    with pytest.raises(ConfigError, match="10100 cells"):
        expand(load_matrix(over), over)


def test_serve_ports_past_65535(tmp_path: Path) -> None:
    doc = {"name": "p", "axes": {"a": list(range(600))}, "serve": {"command": "x", "port": 65000}}
    proc, _ = _cells(_write(tmp_path / "m.yaml", doc), tmp_path)
    assert "65599" in _clean_failure(proc, ConfigError.exit_code)


def test_fifo_does_not_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "m.yaml"
    os.mkfifo(fifo)
    proc, took = _cells(fifo, tmp_path)
    assert "not a regular file" in _clean_failure(proc, ConfigError.exit_code)
    assert took < BOUND


def test_directory(tmp_path: Path) -> None:
    proc, _ = _cells(tmp_path, tmp_path)
    assert "not a regular file" in _clean_failure(proc, ConfigError.exit_code)


# --------------------------------------------------------------------------
# Run ids and cell indexes
# --------------------------------------------------------------------------


def _marker_matrix(tmp_path: Path) -> tuple[Path, Path]:
    """A one-cell-per-value matrix whose cells leave a marker file when they run."""
    marker = tmp_path / "ran"
    doc = {
        "name": "m",
        "families": ["generic"],
        "axes": {"i": [0, 1, 2]},
        "gpus": 0,
        "command": f"{{{{ python }}}} -c \"open('{marker}', 'w').write('x')\"",
    }
    return _write(tmp_path / "m.yaml", doc), marker


BAD_RUN_IDS = ["../../etc/x", "..", "a..b", ".hidden", "-dash", "x" * 65, "a/b", "ok\n", ""]


@pytest.mark.parametrize("run_id", BAD_RUN_IDS)
def test_merge_bad_run_id_is_a_usage_error(tmp_path: Path, run_id: str) -> None:
    matrix, _ = _marker_matrix(tmp_path)
    store = tmp_path / "store"
    proc = run_artifactd(
        "merge", str(matrix), "--run-id", run_id, "--store", f"oci:{store}", timeout=BOUND
    )
    assert "--run-id" in _clean_failure(proc, 2)
    assert not store.exists()


@pytest.mark.parametrize("run_id", ["..", "a..b", "ok\n"])
def test_build_cell_bad_run_id_runs_nothing(tmp_path: Path, run_id: str) -> None:
    matrix, marker = _marker_matrix(tmp_path)
    store = tmp_path / "store"
    proc = run_artifactd(
        "build", str(matrix), "--cell", "0", "--run-id", run_id, "--store", f"oci:{store}"
    )
    assert "--run-id" in _clean_failure(proc, 2)
    assert not marker.exists() and not store.exists()


@pytest.mark.parametrize(
    ("args", "env"),
    [
        pytest.param(["--cell", "3"], {}, id="past-the-end"),
        pytest.param(["--cell", "-1"], {}, id="negative"),
        pytest.param(["--cell", "99999999999999999999999"], {}, id="huge"),
        pytest.param(["--cell", "1.5"], {}, id="fraction"),
        pytest.param([], {"JOB_COMPLETION_INDEX": "abc"}, id="env-not-a-number"),
        pytest.param([], {"JOB_COMPLETION_INDEX": "7"}, id="env-past-the-end"),
    ],
)
def test_bad_cell_index_runs_nothing(tmp_path: Path, args: list[str], env: dict[str, str]) -> None:
    matrix, marker = _marker_matrix(tmp_path)
    store = tmp_path / "store"
    proc = run_artifactd(
        "build",
        str(matrix),
        *args,
        "--run-id",
        "r1",
        "--store",
        f"oci:{store}",
        env=clean_env(env),
        timeout=BOUND * 3,
    )
    assert "cell" in _clean_failure(proc, 2).lower()
    assert not marker.exists() and not store.exists()


# --------------------------------------------------------------------------
# --set and --workload values that are not UTF-8
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        pytest.param([b"--set", b"gpu.arch=sm_\xff"], id="set-value"),
        pytest.param([b"--set", b"workload.tp=\xff\xfe"], id="set-workload"),
        pytest.param([b"--set", b"\xff=1"], id="set-path"),
        pytest.param([b"--workload", b"tp=\xff"], id="workload"),
    ],
)
def test_fingerprint_non_utf8_value(args: list[bytes]) -> None:
    err = _clean_failure(_run_bytes(b"fingerprint", *args), 2)
    assert "not UTF-8" in err


def test_non_utf8_set_from_the_environment() -> None:
    proc = _run_bytes(b"fingerprint", b"--json", env={b"ARTIFACTD_SET": b"gpu.arch=sm_\xff"})
    assert "--set" in _clean_failure(proc, 2)


def test_build_refuses_a_non_utf8_set_before_any_cell_runs(tmp_path: Path) -> None:
    matrix, marker = _marker_matrix(tmp_path)
    store = tmp_path / "store"
    proc = _run_bytes(
        b"build",
        os.fsencode(matrix),
        b"--store",
        os.fsencode(f"oci:{store}"),
        b"--set",
        b"gpu.arch=sm_\xff",
    )
    assert "not UTF-8" in _clean_failure(proc, 2)
    assert not marker.exists() and not store.exists()


# --------------------------------------------------------------------------
# lint: missing paths and names that are not UTF-8
# --------------------------------------------------------------------------


@pytest.mark.parametrize("strict", [True, False])
def test_lint_missing_directory_is_a_usage_error(tmp_path: Path, strict: bool) -> None:
    flags = ["--strict"] if strict else []
    proc = run_artifactd("lint", str(tmp_path / "nonexistent"), *flags, timeout=BOUND * 3)
    err = _clean_failure(proc, 2)
    assert "does not exist" in err and "clean" not in proc.stdout


def test_lint_a_file_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    proc = run_artifactd("lint", str(tmp_path / "f"), "--strict", timeout=BOUND * 3)
    assert "not a directory" in _clean_failure(proc, 2)


def _non_utf8_tree(root: bytes) -> None:
    os.makedirs(root + b"/generic/d\xfe")
    with open(root + b"/generic/k\xff.cubin", "wb") as f:
        f.write(b"kernel")
    with open(root + b"/generic/d\xfe/inner", "wb") as f:
        f.write(b"kernel")
    with open(root + b"/generic/leak.txt", "wb") as f:
        f.write(root + b"/generic/x.so\n")


def test_lint_reports_non_utf8_names(tmp_path: Path) -> None:
    root = os.fsencode(tmp_path / "roots")
    _non_utf8_tree(root)
    text = _run_bytes(b"lint", root)
    out = text.stdout.decode()
    _clean_failure(text, 11)  # leak.txt's build path is an error: lint fails
    assert "k\\xff.cubin: file name is not valid UTF-8" in out
    assert "d\\xfe: file name is not valid UTF-8" in out
    doc = json.loads(_run_bytes(b"lint", root, b"--json").stdout)
    assert len(doc["unreadable"]) == 2 and doc["files_scanned"] == 1
    assert doc["findings"][0]["file"] == "leak.txt"  # the build path found inside


def test_lint_directory_whose_name_is_not_utf8(tmp_path: Path) -> None:
    root = os.fsencode(tmp_path) + b"/roots\xff"
    _non_utf8_tree(root)
    proc = _run_bytes(b"lint", root, b"--json")
    _clean_failure(proc, 11)  # leak.txt's build path is an error: lint fails
    doc = json.loads(proc.stdout)
    assert [f["file"] for f in doc["findings"]] == ["leak.txt"]  # the path, found as bytes
    strict = _run_bytes(b"lint", root, b"--strict")
    _clean_failure(strict, 11)
