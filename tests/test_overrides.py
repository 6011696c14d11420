"""`--set PATH=VALUE`: override probed fields, for cross-target builds and what-ifs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cachetrees import make_triton_tree
from conftest import clean_env

from artifactd.errors import UsageError
from artifactd.fingerprint.key import apply_overrides, raw_hash
from artifactd.fingerprint.model import from_raw
from artifactd.fingerprint.probe import probe_raw, probe_request, start_request


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    return probe_raw(use_nvml=False)


def test_existing_fields_and_open_sections(raw: dict[str, Any]) -> None:
    out = apply_overrides(
        raw,
        [
            "gpu.arch=sm_100a",
            "gpu.sm_count=8",
            "workload.tp=8",
            "libraries.vllm.version=0.33.0",
            'cpu.features=["avx2"]',
            "driver.version=575.51.03",
        ],
    )
    assert out["gpu"]["arch"] == "sm_100a"
    assert out["workload"]["tp"] == "8"
    assert out["libraries"]["vllm"] == {"version": "0.33.0"}
    assert out["cpu"]["features"] == ["avx2"]
    assert raw["gpu"]["arch"] is None, "the input document is not modified"
    model = from_raw({**out, "libraries": {**out["libraries"], "vllm": {"version": "0.33.0"}}})
    assert model.gpu.sm_count == 8  # "8" became a number through the schema
    assert model.driver.version == "575.51.03"
    assert raw_hash(out) != raw_hash(raw)


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("gpu.nope=1", "no such field"),
        ("gpu=1", "is a section"),
        ("nothing", "PATH=VALUE"),
        ("python.version.x=1", "no such field"),
        ("made.up=1", "no field"),
    ],
)
def test_bad_paths_are_usage_errors(raw: dict[str, Any], assignment: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        apply_overrides(raw, [assignment])


def test_type_errors_name_the_field(raw: dict[str, Any]) -> None:
    with pytest.raises(UsageError, match=r"gpu\.sm_count"):
        from_raw(apply_overrides(raw, ["gpu.sm_count=many"]))


def test_probe_request_without_overrides_is_the_plain_probe() -> None:
    digest = "sha256:" + "0a" * 32
    raw = probe_request(
        gpu_arch="sm_90a", image_digest=digest, workload=["model=m,tp=8", "dtype=bf16"]
    )
    assert raw["image"] == {"digest": digest}
    assert raw["workload"] == {"model": "m", "tp": "8", "dtype": "bf16"}
    assert raw["gpu"]["arch"] == "sm_90a"
    assert raw["gpu"]["capability"] == "9.0"
    assert from_raw(raw).model_dump(mode="json") == raw


def test_probe_request_validates_overrides_through_the_schema() -> None:
    raw = probe_request(overrides=["gpu.sm_count=4", "workload.tp=8", "gpu.arch=sm_100a"])
    assert raw["gpu"]["sm_count"] == 4  # text became the number the schema wants
    assert raw["workload"] == {"tp": "8"}  # workload values stay text
    assert raw["gpu"]["arch"] == "sm_100a"
    assert raw_hash(raw) == from_raw(raw).hash
    assert raw_hash(raw) != raw_hash(probe_request(overrides=["gpu.sm_count=5"]))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"overrides": ["gpu.sm_count=many"]}, r"gpu\.sm_count"),
        ({"overrides": ["gpu.nope=1"]}, "no such field"),
        ({"workload": ["model"]}, "--workload must be KEY=VALUE"),
        ({"gpu_arch": "hopper"}, "not a GPU architecture"),
    ],
)
def test_probe_request_refuses_bad_flags(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        probe_request(**kwargs)


def test_a_started_request_answers_like_probe_request() -> None:
    """Started early (a restore imports while the tools run), the answer is the same."""
    pending = start_request(gpu_arch="sm_90a", workload=["tp=8"], overrides=["gpu.sm_count=2"])
    first = pending.result()
    assert pending.result() is first
    assert raw_hash(first) == raw_hash(
        probe_request(gpu_arch="sm_90a", workload=["tp=8"], overrides=["gpu.sm_count=2"])
    )
    with pytest.raises(UsageError, match="not a GPU architecture"):
        start_request(gpu_arch="sm90")  # before any work starts
    late = start_request(overrides=["gpu.sm_count=many"])
    with pytest.raises(UsageError, match=r"gpu\.sm_count"):
        late.result()


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "artifactd", *args],
        capture_output=True,
        text=True,
        env=env or clean_env(),
        check=False,
    )


def test_cli_fingerprint_and_diff_what_if() -> None:
    base = run("fingerprint", "--hash").stdout.strip()
    moved = run("fingerprint", "--hash", "--set", "driver.version=999.1").stdout.strip()
    assert base and moved and base != moved
    shown = json.loads(run("fingerprint", "--json", "--set", "gpu.sm_count=4").stdout)
    assert shown["fingerprint"]["gpu"]["sm_count"] == 4
    diff = json.loads(run("diff", "local", "local", "--json", "--set", "gpu.arch=sm_100a").stdout)
    verdicts = {v["family"]: v["verdict"] for v in diff["families"]}
    assert verdicts["triton"] == "miss" and verdicts["generic"] == "miss"
    assert [f["path"] for f in diff["fields"]] == ["gpu.arch"]
    bad = run("fingerprint", "--set", "gpu.sm_count=many")
    assert bad.returncode == 2 and "gpu.sm_count" in bad.stderr


def test_build_elsewhere_then_restore_with_the_same_override(tmp_path: Path) -> None:
    """Harvest for a target this machine is not (sm_100a); restore asks for it the same way."""
    tree = make_triton_tree(tmp_path / "triton")
    env = clean_env(
        {
            "TRITON_CACHE_DIR": str(tree),
            "HOME": str(tmp_path / "h"),
            "TMPDIR": str(tmp_path / "tmp"),
        }
    )
    store = f"oci:{tmp_path / 'store'}"
    pushed = json.loads(
        run(
            "harvest",
            "--store",
            store,
            "--json",
            "--set",
            "gpu.arch=sm_100a",
            "--set",
            "gpu.capability=10.0",
            env=env,
        ).stdout
    )
    inspected = json.loads(
        run("inspect", f"{store}:fp-{pushed['fingerprint_hash']}", "--json").stdout
    )
    assert inspected["config"]["fingerprint"]["gpu"]["arch"] == "sm_100a"
    plain = json.loads(
        run(
            "restore",
            "--store",
            store,
            "--target",
            str(tmp_path / "a"),
            "--family",
            "triton",
            "--json",
            env=env,
        ).stdout
    )
    assert plain["cache_hit"] is False
    same = json.loads(
        run(
            "restore",
            "--store",
            store,
            "--target",
            str(tmp_path / "b"),
            "--family",
            "triton",
            "--json",
            "--set",
            "gpu.arch=sm_100a",
            "--set",
            "gpu.capability=10.0",
            env=env,
        ).stdout
    )
    assert same["cache_hit"] is True and same["match"] == "full"


def test_an_image_digest_is_one_fingerprint_however_it_is_spelled() -> None:
    digest = "sha256:" + "0a" * 32
    plain = probe_request(image_digest=digest)
    for spelling in (f"registry.example.com:5000/vllm@{digest}", f" {digest} "):
        assert probe_request(image_digest=spelling)["image"] == plain["image"]
    for bad in ("vllm:0.8", "sha256:0a", "registry/vllm@sha256:XYZ", "latest"):
        with pytest.raises(UsageError, match="not an image digest"):
            probe_request(image_digest=bad)
