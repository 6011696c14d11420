"""The click-free parser of the pod-start commands agrees with click, or defers to it.

For each command line and environment, either the fast parser returns exactly
the parameters click's own parser produces, or it returns None and click
parses (and, for a bad line, gives its usual error). The ordinary lines an
init container uses must take the fast path, and then click is not imported.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path, PurePath
from typing import Any

import click
import pytest
from click.testing import CliRunner
from conftest import clean_env

from artifactd import __version__
from artifactd.cli import cli
from artifactd.cli.fast import parse_options
from artifactd.cli.render import VERSION_LINE

POD_ENV = {
    "ARTIFACTD_TARGET": "/cache",
    "ARTIFACTD_STORE": "registry.local:5000/caches",
    "ARTIFACTD_REQUIRE": "1",
    "ARTIFACTD_JSON": "true",
    "ARTIFACTD_FAMILIES": "triton inductor,vllm",
    "ARTIFACTD_WORKLOAD": "model=llama tp=8",
    "ARTIFACTD_SET": "gpu.arch=sm_100a driver.version=575.51",
    "ARTIFACTD_LOCK_TIMEOUT": "2.5",
    "ARTIFACTD_MAX_BYTES": "20G",
    "ARTIFACTD_INSECURE": "off",
    "ARTIFACTD_DRY_RUN": "",
}

#: (command, args, environment): lines the fast parser must read as click does.
FAST = [
    ("restore", ["--target", "t"], {}),
    ("restore", ["--target=t", "--require", "--json"], {}),
    ("restore", [], POD_ENV),
    ("restore", ["--family", "triton", "--family", "vllm", "--target", "t"], POD_ENV),
    ("restore", ["--target", "a", "--target", "b"], {}),
    ("restore", ["--target", "t"], {"ARTIFACTD_REQUIRE": "0", "ARTIFACTD_JSON": "no"}),
    ("restore", ["--target", "t", "--lock-timeout", "1e3", "--max-bytes", "500M"], {}),
    (
        "restore",
        [
            "--store",
            "oci:/s",
            "--insecure",
            "--target",
            "t",
            "--dry-run",
            "--env-file",
            "e.env",
            "--consumer-user",
            "vllm",
            "--gpu-arch",
            "sm_90a",
            "--image-digest",
            "sha256:" + "a" * 64,
            "--workload",
            "model=x,tp=2",
            "--set",
            "driver.version=1",
        ],
        {},
    ),
    ("fingerprint", [], {}),
    ("fingerprint", ["--hash"], {"ARTIFACTD_GPU_ARCH": "sm_90a"}),
    ("fingerprint", ["--json", "--workload", "model=x", "--set", "a.b=c"], POD_ENV),
]

#: Lines the fast parser must leave to click (some valid, most not).
DEFER = [
    ("restore", ["--help"], {}),
    ("restore", ["-h"], {}),
    ("restore", [], {}),  # --target missing
    ("restore", ["--target"], {}),
    ("restore", ["--target", "t", "extra"], {}),
    ("restore", ["--target", "t", "--bogus"], {}),
    ("restore", ["--require=1", "--target", "t"], {}),
    ("restore", ["--target="], {}),
    ("restore", ["--target", "t", "--lock-timeout", "soon"], {}),
    ("restore", ["--target", "t"], {"ARTIFACTD_REQUIRE": "maybe"}),
    ("restore", ["--target", "t"], {"ARTIFACTD_LOCK_TIMEOUT": "soon"}),
    ("restore", ["--target", "t", "--lock-timeout", "-1"], {}),
    ("restore", ["--", "--target", "t"], {}),
    ("fingerprint", ["--hash=yes"], {}),
]


def click_params(command: str, args: list[str], env: dict[str, str]) -> dict[str, Any] | None:
    """What click's parser makes of the line, or None when it refuses it."""
    mp = pytest.MonkeyPatch()
    for key, value in env.items():
        mp.setenv(key, value)
    try:
        ctx = cli.commands[command].make_context(command, list(args))
        return dict(ctx.params)
    except (click.exceptions.Exit, click.ClickException):
        return None
    finally:
        mp.undo()


@pytest.mark.parametrize(("command", "args", "env"), FAST)
def test_fast_parser_reads_ordinary_lines_as_click_does(
    command: str, args: list[str], env: dict[str, str]
) -> None:
    fast = parse_options(command, args, env)
    assert fast is not None
    # A path is text from the fast parser (no pathlib at a pod start), a Path from click's.
    clicked = click_params(command, args, env)
    assert clicked is not None
    assert fast == {k: os.fspath(v) if isinstance(v, PurePath) else v for k, v in clicked.items()}


@pytest.mark.parametrize(("command", "args", "env"), DEFER)
def test_fast_parser_defers_everything_else(
    command: str, args: list[str], env: dict[str, str]
) -> None:
    assert parse_options(command, args, env) is None


def test_the_env_file_and_target_are_paths_as_text() -> None:
    values = parse_options("restore", ["--target", "t", "--env-file", "e"], {})
    assert values is not None
    assert values["target"] == "t" and values["env_file"] == "e"


def _imported(*args: str, cwd: Path, code: int = 0) -> set[str]:
    """The modules loaded by the time ``artifactd ARGS`` exits (with exit ``code``)."""
    program = (
        "import atexit, sys\n"
        "atexit.register(lambda: sys.stderr.write('MODULES ' + ' '.join(sys.modules)))\n"
        "from artifactd.cli import main\nmain()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", program, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=clean_env({"HOME": str(cwd)}),
        timeout=120,
        check=False,
    )
    assert proc.returncode == code, proc.stderr
    return set(proc.stderr.rsplit("MODULES ", 1)[1].split())


def test_pod_start_commands_do_not_import_click(tmp_path: Path) -> None:
    assert "click" not in _imported("fingerprint", "--hash", cwd=tmp_path)
    store = f"oci:{tmp_path / 'store'}"
    modules = _imported("restore", "--store", store, "--target", "t", cwd=tmp_path)
    assert "click" not in modules
    assert "artifactd.restore.policy" in modules  # the restore did run
    # Help and every other command still go through click.
    assert "click" in _imported("restore", "--help", cwd=tmp_path)
    assert "click" in _imported("ls", store, cwd=tmp_path, code=4)


def test_version_is_answered_without_click_as_click_answers_it(tmp_path: Path) -> None:
    """``artifactd --version`` takes the fast path; click, for any other line, prints the same."""
    assert "click" not in _imported("--version", cwd=tmp_path)
    assert "click" in _imported("--version", "--help", cwd=tmp_path)
    by_click = CliRunner().invoke(cli, ["--version"])
    assert by_click.exit_code == 0
    assert by_click.output == f"{VERSION_LINE}\n" == f"artifactd, version {__version__}\n"
