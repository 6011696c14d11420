"""The command line: help, JSON output, and the documented exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cachetrees import make_generic_tree
from click.testing import CliRunner
from conftest import clean_env, run_artifactd
from test_cli_contract import COMMANDS

from artifactd.cli import cli
from artifactd.stores import open_store


@pytest.fixture(autouse=True)
def _scratch_cwd(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A scratch cwd for the default store (conftest already drops ARTIFACTD_*)."""
    monkeypatch.chdir(tmp_path)


def _invoke(*args: str) -> Any:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the real entry point, which maps errors to exit codes."""
    return run_artifactd(*args, cwd=cwd)


def _assert_one_error_line(proc: subprocess.CompletedProcess[str]) -> None:
    lines = proc.stderr.splitlines()
    assert lines, "expected an error on stderr"
    assert lines[0].startswith("artifactd: error:")
    assert sum(line.startswith("artifactd: error:") for line in lines) == 1
    assert all(line.startswith("  hint:") for line in lines[1:])
    assert "Traceback" not in proc.stderr


# --------------------------------------------------------------------------
# In-process (CliRunner)
# --------------------------------------------------------------------------


def test_help_lists_every_command() -> None:
    out = _invoke("--help").stdout
    section = out.split("Commands:", 1)[1]
    listed = {line.split()[0] for line in section.splitlines() if line.startswith("  ")}
    assert listed == set(cli.commands)
    assert listed == {c.split()[0] for c in COMMANDS}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_command_has_help_and_json(command: str) -> None:
    out = _invoke(*command.split(), "--help").stdout
    assert "--json" in out


def test_fingerprint_json_matches_hash() -> None:
    doc = json.loads(_invoke("fingerprint", "--json", "--gpu-arch", "sm_90a").stdout)
    assert set(doc) == {"schema_version", "hash", "fingerprint"}
    assert doc["fingerprint"]["gpu"]["arch"] == "sm_90a"
    assert doc["fingerprint"]["schema_version"] == 1
    hash_only = _invoke("fingerprint", "--hash", "--gpu-arch", "sm_90a").stdout.strip()
    assert len(hash_only) == 64
    assert doc["hash"] == hash_only
    # A different declared target is a different fingerprint.
    assert _invoke("fingerprint", "--hash", "--gpu-arch", "sm_80").stdout.strip() != hash_only


def test_fingerprint_workload_enters_the_document() -> None:
    doc = json.loads(_invoke("fingerprint", "--json", "--workload", "model=m,tp=2").stdout)
    assert doc["fingerprint"]["workload"] == {"model": "m", "tp": "2"}


def test_diff_local_against_saved_fingerprint(tmp_path: Path) -> None:
    saved = json.loads(_invoke("fingerprint", "--json", "--workload", "model=a").stdout)
    saved["fingerprint"]["workload"]["model"] = "b"
    path = tmp_path / "fp.json"
    path.write_text(json.dumps(saved), encoding="utf-8")

    differs = CliRunner().invoke(
        cli, ["diff", "local", str(path), "--workload", "model=a", "--json"], catch_exceptions=False
    )
    assert differs.exit_code == 1  # as diff(1): the sides differ
    doc = json.loads(differs.stdout)
    zero = _invoke("diff", "local", str(path), "--workload", "model=a", "--json", "--exit-zero")
    assert json.loads(zero.stdout)["fields"] == doc["fields"]
    assert doc["identical"] is False
    assert doc["a"] == "local"
    assert doc["b"] == str(path)
    assert doc["a_hash"] != doc["b_hash"]
    assert doc["fields"] == [{"path": "workload.model", "a": "a", "b": "b"}]
    verdicts = {f["family"]: f["verdict"] for f in doc["families"]}
    # A model change invalidates the engines' caches (vLLM and SGLang key them on
    # the model) and none of the kernel caches: the docs' scope table, by hand.
    misses = {"sglang", "vllm"}
    kernels = {"cuda-jit", "cutedsl", "deepgemm", "flashinfer", "generic", "inductor"}
    assert verdicts == dict.fromkeys(misses, "miss") | dict.fromkeys(
        kernels | {"tilelang", "triton"}, "hit"
    )


def test_diff_shows_a_workload_only_one_side_has_once(tmp_path: Path) -> None:
    """No stray ``workload {} None`` row above the fields that really differ."""
    bare = json.loads(_invoke("fingerprint", "--json").stdout)
    assert bare["fingerprint"]["workload"] == {}
    runner = CliRunner()
    (tmp_path / "fp.json").write_text(json.dumps(bare), encoding="utf-8")
    args = ["diff", "local", str(tmp_path / "fp.json"), "--workload", "model=m", "--json"]
    proc = runner.invoke(cli, args, catch_exceptions=False)
    text = runner.invoke(cli, args[:-1], catch_exceptions=False)
    assert proc.exit_code == 1 and text.exit_code == 1
    assert json.loads(proc.stdout)["fields"] == [{"path": "workload.model", "a": "m", "b": None}]
    assert "1 field(s) differ" in text.stdout and "{}" not in text.stdout


def test_diff_against_itself_is_identical(tmp_path: Path) -> None:
    path = tmp_path / "fp.json"
    path.write_text(_invoke("fingerprint", "--json").stdout, encoding="utf-8")
    doc = json.loads(_invoke("diff", str(path), str(path), "--json").stdout)
    assert doc["identical"] is True
    assert doc["fields"] == []
    assert {f["verdict"] for f in doc["families"]} == {"hit"}


# --------------------------------------------------------------------------
# Exit codes, through `python -m artifactd`
# --------------------------------------------------------------------------


def test_ls_missing_store_exits_4(tmp_path: Path) -> None:
    proc = _run("ls", "oci:/nonexistent", cwd=tmp_path)
    assert proc.returncode == 4
    assert proc.stdout == ""
    _assert_one_error_line(proc)
    assert "oci:/nonexistent" in proc.stderr


def test_restore_from_missing_store_is_a_miss(tmp_path: Path) -> None:
    target = tmp_path / "cache"
    proc = _run("restore", "--store", "oci:/nonexistent", "--target", str(target), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "MISS" in proc.stdout
    assert not target.exists()  # a miss writes nothing


def test_restore_miss_json(tmp_path: Path) -> None:
    target = tmp_path / "cache"
    proc = _run(
        "restore", "--store", "oci:/nonexistent", "--target", str(target), "--json", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["cache_hit"] is False
    assert doc["match"] == "miss"


def test_restore_require_exits_6_on_a_miss(tmp_path: Path) -> None:
    open_store(f"oci:{tmp_path / 'empty'}", create=True)
    args = ("restore", "--store", f"oci:{tmp_path / 'empty'}", "--target", str(tmp_path / "c"))
    proc = _run(*args, "--require", cwd=tmp_path)
    assert proc.returncode == 6
    _assert_one_error_line(proc)
    assert _run(*args, cwd=tmp_path).returncode == 0


def test_restore_require_exits_4_for_a_missing_store(tmp_path: Path) -> None:
    args = ("restore", "--store", "oci:/nonexistent", "--target", str(tmp_path / "cache"))
    proc = _run(*args, "--require", cwd=tmp_path)
    assert proc.returncode == 4
    _assert_one_error_line(proc)
    assert "restore failed (not_found)" in proc.stderr
    lenient = _run(*args, cwd=tmp_path)
    assert lenient.returncode == 0
    assert "the engine will compile as before" in lenient.stderr
    assert not (tmp_path / "cache").exists()


def test_restore_bad_store_reference_exits_2(tmp_path: Path) -> None:
    proc = _run("restore", "--store", "bogus://x", "--target", str(tmp_path / "t"), cwd=tmp_path)
    assert proc.returncode == 2
    _assert_one_error_line(proc)
    assert "bogus://x" in proc.stderr


def test_inspect_store_without_tag_exits_2(tmp_path: Path) -> None:
    proc = _run("inspect", f"oci:{tmp_path}", cwd=tmp_path)
    assert proc.returncode == 2
    _assert_one_error_line(proc)
    assert ":TAG" in proc.stderr  # the hint says how to name an artifact


def test_bad_declared_arch_exits_2(tmp_path: Path) -> None:
    proc = _run("fingerprint", "--gpu-arch", "gfx90a", cwd=tmp_path)
    assert proc.returncode == 2
    _assert_one_error_line(proc)


def test_diff_with_non_json_file_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("not json", encoding="utf-8")
    proc = _run("diff", "local", str(bad), cwd=tmp_path)
    assert proc.returncode == 2
    _assert_one_error_line(proc)


def test_diff_with_invalid_wrapped_fingerprint_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"hash": "x", "fingerprint": {"bogus": 1}}), encoding="utf-8")
    proc = _run("diff", "local", str(bad), cwd=tmp_path)
    assert proc.returncode == 2
    _assert_one_error_line(proc)


@pytest.mark.slow  # the inner loop's slowest: waits out deadlines or runs many processes
def test_restore_is_configured_by_env_alone(tmp_path: Path) -> None:
    """An init container sets ARTIFACTD_* variables, no flags."""
    gen = make_generic_tree(tmp_path / "gen")
    store = f"oci:{tmp_path / 'store'}"
    env = {**clean_env(), "ARTIFACTD_GENERIC_DIR": str(gen), "HOME": str(tmp_path)}
    subprocess.run(
        [sys.executable, "-m", "artifactd", "harvest", "--store", store],
        env=env,
        check=True,
        capture_output=True,
    )
    pod = {
        **clean_env(),
        "HOME": str(tmp_path),
        "ARTIFACTD_STORE": store,
        "ARTIFACTD_TARGET": str(tmp_path / "cache"),
        "ARTIFACTD_FAMILIES": "generic",
        "ARTIFACTD_JSON": "1",
        "ARTIFACTD_REQUIRE": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "artifactd", "restore"],
        env=pod,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["restored"] == ["generic"]
    assert (tmp_path / "cache" / "generic" / "axpy.sm_90a.cubin").is_file()
