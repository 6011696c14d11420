"""The node-local tier, against the real registry: fill, one fetch per node, outage, gc, prefetch.

Every restore here is the real CLI in its own process, as init containers
are; several run at once to show that one node fetches once. The registry is
Debian's docker-registry on a loopback port; "down" is a registry reference
to a port nothing listens on.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from cachetrees import make_generic_tree
from conftest import PYTHON, clean_env, run_artifactd
from registry_server import RegistryServer

from artifactd.errors import TargetError
from artifactd.stores.artifacts import read_artifact
from artifactd.stores.layout import LayoutStore
from artifactd.stores.nodestore import (
    USAGE_NAME,
    USE_RESOLUTION_S,
    gc,
    node_lock,
    read_usage,
    record_use,
)


def _dead_registry() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"127.0.0.1:{port}/nobody/home"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A pod's environment: a generic cache to harvest, a home of its own."""
    tree = make_generic_tree(tmp_path / "gen")
    (tree / "big.cubin").write_bytes(os.urandom(256 << 10))
    return clean_env({"HOME": str(tmp_path / "home"), "ARTIFACTD_GENERIC_DIR": str(tree)})


def _harvest(store: str, env: dict[str, str], *workload: str) -> str:
    extra = [a for w in workload for a in ("--workload", w)]
    proc = run_artifactd(
        "harvest", "--store", store, "--family", "generic", *extra, "--json", env=env
    )
    assert proc.returncode == 0, proc.stderr
    return str(json.loads(proc.stdout)["fingerprint_hash"])


def _restore(env: dict[str, str], *args: str) -> dict[str, Any]:
    proc = run_artifactd("restore", "--family", "generic", "--json", *args, env=env)
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def test_fill_then_serve_without_the_registry(
    tmp_path: Path, registry: RegistryServer, repo: str, env: dict[str, str]
) -> None:
    store = registry.ref(repo)
    _harvest(store, env)
    node = f"oci:{tmp_path / 'node'}"
    first = _restore(env, "--store", store, "--node-store", node, "--target", str(tmp_path / "a"))
    assert first["status"] == "restored" and first["plan"]["store"] == node
    assert first["node_store"]["outcome"] == "fetched"
    assert first["node_store"]["bytes_fetched"] > 256 << 10
    second = _restore(env, "--store", store, "--node-store", node, "--target", str(tmp_path / "b"))
    assert second["node_store"]["outcome"] == "node"
    assert second["node_store"]["bytes_fetched"] == 0
    # The registry goes away: the warm node store still restores, no network needed.
    down = _restore(
        env, "--store", _dead_registry(), "--node-store", node, "--target", str(tmp_path / "c")
    )
    assert down["status"] == "restored" and down["match"] == "full"
    assert down["node_store"]["outcome"] == "node"
    assert (tmp_path / "c" / "generic" / "big.cubin").read_bytes() == (
        Path(env["ARTIFACTD_GENERIC_DIR"]) / "big.cubin"
    ).read_bytes()
    # A cold node store with the registry down: the restore fails open, target untouched.
    cold = _restore(
        env, "--store", _dead_registry(), "--node-store", f"oci:{tmp_path / 'cold'}",
        "--target", str(tmp_path / "d"),
    )  # fmt: skip
    assert cold["status"] in ("miss", "failed") and cold["exit_code"] == 0
    assert not (tmp_path / "d" / "generic").exists()
    # Each restore recorded its use of the manifest, for gc.
    assert read_usage(tmp_path / "node")


def test_pods_starting_at_once_on_one_node_fetch_once(
    tmp_path: Path, registry: RegistryServer, repo: str, env: dict[str, str]
) -> None:
    store = registry.ref(repo)
    _harvest(store, env)
    node = f"oci:{tmp_path / 'node'}"
    procs = [
        subprocess.Popen(
            [
                PYTHON,
                "-m",
                "artifactd",
                "restore",
                "--family",
                "generic",
                "--json",
                "--store",
                store,
                "--node-store",
                node,
                "--target",
                str(tmp_path / f"pod{i}"),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    docs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        docs.append(json.loads(out))
    assert all(d["status"] == "restored" for d in docs)
    outcomes = sorted(d["node_store"]["outcome"] for d in docs)
    assert outcomes == ["fetched", "node", "node", "node"]
    assert sum(d["node_store"]["bytes_fetched"] for d in docs) == max(
        d["node_store"]["bytes_fetched"] for d in docs
    )


def test_node_store_must_be_a_local_layout(tmp_path: Path, env: dict[str, str]) -> None:
    proc = run_artifactd(
        "restore", "--node-store", "registry.example.com/x", "--target", str(tmp_path / "t"),
        env=env,
    )  # fmt: skip
    assert proc.returncode == 2 and "oci:PATH" in proc.stderr


def test_metrics_file_names_phases_sources_and_families(
    tmp_path: Path, registry: RegistryServer, repo: str, env: dict[str, str]
) -> None:
    store = registry.ref(repo)
    _harvest(store, env)
    prom = tmp_path / "textfile" / "artifactd.prom"
    _restore(
        env, "--store", store, "--node-store", f"oci:{tmp_path / 'node'}",
        "--target", str(tmp_path / "t"), "--metrics-file", str(prom),
    )  # fmt: skip
    text = prom.read_text()
    for phase in ("lookup", "verify", "fetch", "install"):
        assert f'artifactd_restore_duration_seconds{{phase="{phase}"}}' in text
    assert 'artifactd_restore_fetched_bytes_total{source="node"}' in text
    assert 'artifactd_restore_fetched_bytes_total{source="registry"}' in text
    assert 'artifactd_restore_family_hits_total{family="generic"} 1.0' in text
    assert 'artifactd_restore_status{status="restored"} 1.0' in text
    assert "_created" not in text


def test_prefetch_warms_a_node_for_pods_that_then_need_no_registry(
    tmp_path: Path, registry: RegistryServer, repo: str, env: dict[str, str]
) -> None:
    store = registry.ref(repo)
    fp_hash = _harvest(store, env, "model=m1")
    node = f"oci:{tmp_path / 'node'}"
    pre = run_artifactd(
        "prefetch", "--store", store, "--node-store", node, "--family", "generic",
        "--workload", "model=m1", "--json", env=env,
    )  # fmt: skip
    assert pre.returncode == 0, pre.stderr
    assert json.loads(pre.stdout)["outcome"] == "fetched"
    pod = _restore(
        env, "--store", _dead_registry(), "--node-store", node, "--workload", "model=m1",
        "--target", str(tmp_path / "t"),
    )  # fmt: skip
    assert pod["status"] == "restored" and pod["match"] == "full"
    told = run_artifactd(
        "prefetch", "--store", store, "--node-store", f"oci:{tmp_path / 'node2'}",
        "--family", "generic", "--workload", "model=m1",
        "--software-from", f"{store}:fp-{fp_hash}", "--json", env=env,
    )  # fmt: skip
    assert told.returncode == 0, told.stderr
    assert json.loads(told.stdout)["outcome"] == "fetched"
    dead = run_artifactd("prefetch", "--store", _dead_registry(), "--node-store", node, env=env)
    assert dead.returncode == 3, dead.stderr


@pytest.fixture(scope="module")
def three_models(
    tmp_path_factory: pytest.TempPathFactory, registry: RegistryServer
) -> tuple[Path, list[str]]:
    """A node store that restored three models, in order m1, m2, m3, a second apart in use.

    Built once per module (three harvests and three restores, all real CLI
    runs); each test gets a copy of its own to gc.
    """
    base = tmp_path_factory.mktemp("three-models")
    tree = make_generic_tree(base / "gen")
    (tree / "big.cubin").write_bytes(os.urandom(256 << 10))
    env = clean_env({"HOME": str(base / "home"), "ARTIFACTD_GENERIC_DIR": str(tree)})
    store = registry.ref("t/nodestore-three-models")
    hashes = []
    for i, model in enumerate(("m1", "m2", "m3")):
        (tree / f"only-{model}.cubin").write_bytes(os.urandom(64 << 10))
        hashes.append(_harvest(store, env, f"model={model}"))
        _restore(
            env, "--store", store, "--node-store", f"oci:{base / 'node'}",
            "--workload", f"model={model}", "--target", str(base / f"t{i}"),
        )  # fmt: skip
        time.sleep(0.01)
    return base / "node", hashes


def _node_with_three_models(
    tmp_path: Path, three_models: tuple[Path, list[str]]
) -> tuple[LayoutStore, list[str]]:
    """A copy of :func:`three_models`'s node store in ``tmp_path``, and the models' hashes."""
    node, hashes = three_models
    shutil.copytree(node, tmp_path / "node", symlinks=True)
    return LayoutStore(tmp_path / "node"), list(hashes)


def test_gc_evicts_least_recently_used_and_keeps_what_remains_whole(
    tmp_path: Path, three_models: tuple[Path, list[str]]
) -> None:
    node, hashes = _node_with_three_models(tmp_path, three_models)
    tags_before = node.list_tags()
    size = sum(node.blob_digests().values())
    dry = gc(node, max_bytes=size - 1, dry_run=True)
    assert dry.evicted and node.list_tags() == tags_before  # nothing changed
    # Room for about one model: the two used longest ago go, oldest first.
    result = gc(node, max_bytes=size // 2)
    evicted = [e.tag for e in result.evicted]
    assert evicted[0] == f"fp-{hashes[0]}"
    assert f"fp-{hashes[2]}" not in evicted
    assert result.bytes_after <= size // 2 and result.freed == size - result.bytes_after
    assert sum(node.blob_digests().values()) == result.bytes_after
    # Every tag that remains is whole: its manifest, config and layers are all there.
    blobs = node.blob_digests()
    for tag in node.list_tags():
        art = read_artifact(node, tag)
        assert art is not None
        for desc in [art.manifest.config, *art.manifest.layers]:
            assert desc.digest in blobs, (tag, desc.digest)
    assert set(read_usage(node.root)) <= {node.tag_digest(t) for t in node.list_tags()}
    assert (node.root / USAGE_NAME).is_file()


def test_a_use_is_recorded_once_a_minute_and_a_new_or_stale_one_at_once(tmp_path: Path) -> None:
    """Pods restarting in a loop do not rewrite the last-use record at every start."""
    node = LayoutStore(tmp_path / "node", create=True)
    a, b = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    record = node.root / USAGE_NAME
    record_use(node, [a], now=1000.0)
    first = record.stat().st_ino
    record_use(node, [a], now=1000.0 + USE_RESOLUTION_S - 1)
    assert read_usage(node.root) == {a: 1000.0} and record.stat().st_ino == first
    # A digest not yet recorded is written at once, and the others with it.
    record_use(node, [a, b], now=1010.0)
    assert read_usage(node.root) == {a: 1010.0, b: 1010.0}
    # A minute on, the same use is written again.
    record_use(node, [a], now=1010.0 + USE_RESOLUTION_S)
    assert read_usage(node.root)[a] == 1010.0 + USE_RESOLUTION_S
    # A record from the future (a clock set back) is no reason to keep it.
    record_use(node, [b], now=500.0)
    assert read_usage(node.root)[b] == 500.0


def test_gc_waits_for_a_restore_in_progress(
    tmp_path: Path, three_models: tuple[Path, list[str]], env: dict[str, str]
) -> None:
    node, _ = _node_with_three_models(tmp_path, three_models)
    tags = node.list_tags()
    with node_lock(node.root, shared=True), pytest.raises(TargetError, match="stayed locked"):
        gc(node, max_bytes=0, timeout=0.3)
    assert node.list_tags() == tags
    cli = run_artifactd(
        "gc", "--store", f"oci:{node.root}", "--max-bytes", "1", "--apply", "--json", env=env
    )
    assert cli.returncode == 0, cli.stderr
    doc = json.loads(cli.stdout)
    assert len(doc["evicted"]) == len(tags) and doc["bytes_after"] == 0
    assert doc["note"] is None
    no_target = run_artifactd("gc", "--store", f"oci:{node.root}", env=env)
    assert no_target.returncode == 2


def test_gc_counts_evictions_across_runs_for_the_metrics(
    tmp_path: Path, three_models: tuple[Path, list[str]], env: dict[str, str]
) -> None:
    """The exported eviction counter only grows, so Prometheus' increase() sees every eviction."""
    node, _ = _node_with_three_models(tmp_path, three_models)
    size = sum(node.blob_digests().values())
    assert gc(node, max_bytes=size - 1, dry_run=True).evictions_total == 0, "a dry run counts none"
    first = gc(node, max_bytes=size - 1)
    assert first.evictions_total == len(first.evicted) >= 1
    assert 0 <= first.free_pct_after <= 100
    prom = tmp_path / "textfile" / "node.prom"
    cli = run_artifactd(
        "gc", "--store", f"oci:{node.root}", "--max-bytes", "0", "--min-free", "1",
        "--metrics-file", str(prom), "--apply", "--json", env=env,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    doc = json.loads(cli.stdout)
    total = first.evictions_total + len(doc["evicted"])
    assert doc["evictions_total"] == total > first.evictions_total
    text = prom.read_text()
    assert f"artifactd_node_store_evictions_total {float(total)}" in text
    assert "artifactd_node_store_high_water_bytes 0.0" in text
    assert "artifactd_node_store_min_free_ratio 0.01" in text
    free = re.search(r"^artifactd_node_store_free_ratio (\S+)$", text, re.MULTILINE)
    assert free and 0 < float(free.group(1)) <= 1, text
