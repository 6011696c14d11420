"""What keeps the inner loop fast: the processes tests start reuse their bytecode.

Most of the suite's CPU time is ``python -m artifactd`` processes. Each one
compiled artifactd's modules from source where the shell sets
PYTHONDONTWRITEBYTECODE; tests/conftest.py gives every process a test starts
a session bytecode prefix instead (outside every tree a test snapshots).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import PYTHON, REPO, clean_env, machine_factor, scaled

from artifactd.cli import main as _main_function  # noqa: F401  (imports the module)


def test_a_cli_process_writes_its_bytecode_under_the_session_prefix() -> None:
    probe = (
        "import json, sys, artifactd.cli.main\n"
        "m = sys.modules['artifactd.cli.main']\n"
        "print(json.dumps([sys.flags.dont_write_bytecode, sys.pycache_prefix, m.__file__]))"
    )
    proc = subprocess.run(
        [PYTHON, "-c", probe],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    dont_write, prefix, source = json.loads(proc.stdout)
    assert dont_write == 0
    assert prefix == os.environ["PYTHONPYCACHEPREFIX"]
    assert Path(source) == Path(sys.modules["artifactd.cli.main"].__file__ or "")
    # Where the child put main's bytecode: PREFIX/<source dir>/<name>.<tag>.pyc.
    cached = Path(prefix + str(Path(source).parent), f"main.{sys.implementation.cache_tag}.pyc")
    assert cached.is_file(), sorted(str(p) for p in Path(prefix).rglob("main.*.pyc"))


def test_time_limits_scale_with_how_slow_the_machine_runs() -> None:
    """A loaded or slower machine gets longer ceilings, never shorter ones."""
    factor = machine_factor()
    assert 1.0 <= factor <= 20.0
    assert scaled(120) == 120 * factor >= 120
    assert machine_factor() == factor  # measured once per session
