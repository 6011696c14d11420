"""The pydantic-free probe and the typed fingerprint must never drift apart."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cachetrees import make_generic_tree
from conftest import clean_env

from artifactd.fingerprint import Fingerprint
from artifactd.probing import flatten, hashed_view, probe_raw, raw_hash


def test_raw_probe_has_the_models_exact_shape() -> None:
    raw = probe_raw(gpu_arch="sm_90a", workload={"model": "m"}, use_nvml=False)
    model = Fingerprint.model_validate(raw)
    assert model.model_dump(mode="json") == raw
    assert raw_hash(raw) == model.hash
    assert flatten(hashed_view(raw)) == model.flatten()


def test_raw_hash_ignores_info_only() -> None:
    raw = probe_raw(use_nvml=False)
    other = json.loads(json.dumps(raw))
    other["info"]["hostname"] = "elsewhere"
    other["info"]["probed_at"] = 0
    assert raw_hash(other) == raw_hash(raw)
    other["workload"] = {"tp": "8"}
    assert raw_hash(other) != raw_hash(raw)


def test_noop_restore_and_fingerprint_never_import_pydantic(tmp_path: Path) -> None:
    """The init container's common case (warm volume) stays cheap: no model is built."""
    gen = make_generic_tree(tmp_path / "gen")
    env = clean_env({"ARTIFACTD_GENERIC_DIR": str(gen)})
    store = f"oci:{tmp_path / 'store'}"
    run = [sys.executable, "-m", "artifactd"]
    subprocess.run(
        [*run, "harvest", "--store", store, "--family", "generic"],
        env=env,
        check=True,
        capture_output=True,
    )
    restore = ["restore", "--store", store, "--target", str(tmp_path / "t"), "--json"]
    first = subprocess.run([*run, *restore], env=env, check=True, capture_output=True, text=True)
    assert json.loads(first.stdout)["restored"] == ["generic"]
    probe = (
        "import sys, runpy\n"
        "sys.argv = ['artifactd', *sys.argv[1:]]\n"
        "try:\n    runpy.run_module('artifactd', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "print('PYDANTIC' if 'pydantic' in sys.modules else 'LEAN', 'torch' in sys.modules)\n"
    )
    for args in (restore, ["fingerprint", "--json"]):
        proc = subprocess.run(
            [sys.executable, "-c", probe, *args],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        lines = proc.stdout.strip().splitlines()
        assert lines[-1] == "LEAN False", (args, lines)
    noop = json.loads(
        subprocess.run([*run, *restore], env=env, check=True, capture_output=True, text=True).stdout
    )
    assert noop["noop"] is True
