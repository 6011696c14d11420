"""A node store that heals: damaged copies are fetched again, kills and full disks leave no wreck.

Real parts only: Debian's docker-registry, node stores as OCI layouts on disk,
bytes flipped, cut or deleted in them with ordinary file operations, a CLI
restore killed with SIGKILL in the middle of a fill, and a node disk that is
a tmpfs filled to the brim. Every restore and prefetch is the real CLI.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from cachetrees import make_generic_tree
from conftest import PYTHON, clean_env, run_artifactd
from diskfaults import fill, mount_tmpfs, unmount
from registry_server import RegistryServer

from artifactd.stores import open_store


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A pod's environment: a generic cache to harvest, a home of its own."""
    tree = make_generic_tree(tmp_path / "gen")
    (tree / "big.cubin").write_bytes(os.urandom(256 << 10))
    return clean_env({"HOME": str(tmp_path / "home"), "ARTIFACTD_GENERIC_DIR": str(tree)})


def _dead_registry() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"127.0.0.1:{port}/nobody/home"


def _harvest(store: str, env: dict[str, str]) -> dict[str, Any]:
    proc = run_artifactd("harvest", "--store", store, "--family", "generic", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def _restore(
    env: dict[str, str], *args: str, code: int = 0
) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    proc = run_artifactd("restore", "--family", "generic", "--json", *args, env=env, timeout=120)
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    assert doc.get("failure") is None or doc["failure"]["kind"] != "internal", doc
    return doc, proc


def _blobs(node: Path, tag: str) -> dict[str, Path]:
    """The node store's files of the artifact ``tag`` names: its manifest, config and layer."""
    with open_store(f"oci:{node}") as st:
        digest = st.tag_digest(tag)
        assert digest is not None
    sha = node / "blobs" / "sha256"
    manifest = json.loads((sha / digest.split(":")[1]).read_bytes())
    return {
        "manifest": sha / digest.split(":")[1],
        "config": sha / manifest["config"]["digest"].split(":")[1],
        "layer": sha / manifest["layers"][0]["digest"].split(":")[1],
    }


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "flip":
        i = len(data) // 2
        path.write_bytes(data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1 :])
    elif how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    else:
        path.unlink()


def _leftovers(node: Path) -> list[str]:
    return sorted(
        str(p.relative_to(node))
        for d in (node, node / "blobs" / "sha256")
        if d.is_dir()
        for p in d.iterdir()
        if p.name.startswith(".tmp-")
    )


@pytest.fixture(scope="module")
def published(
    tmp_path_factory: pytest.TempPathFactory, registry: RegistryServer
) -> tuple[str, dict[str, Any], dict[str, str]]:
    """One harvest in the registry for the damage cases: (store, harvest doc, pod env).

    The cases damage node stores of their own, never the registry's copy, so
    they share it (one CLI harvest, not nine).
    """
    root = tmp_path_factory.mktemp("published")
    tree = make_generic_tree(root / "gen")
    (tree / "big.cubin").write_bytes(os.urandom(256 << 10))
    env = clean_env({"HOME": str(root / "home"), "ARTIFACTD_GENERIC_DIR": str(tree)})
    store = registry.ref("t/nodestore-heal-damaged")
    return store, _harvest(store, env), env


@pytest.mark.parametrize("how", ["flip", "truncate", "delete"])
@pytest.mark.parametrize("what", ["layer", "config", "manifest"])
def test_a_damaged_node_copy_is_fetched_again_and_the_pod_starts_warm(
    tmp_path: Path, published: tuple[str, dict[str, Any], dict[str, str]], what: str, how: str
) -> None:
    store, pub, env = published
    node = tmp_path / "node"
    args = ("--store", store, "--node-store", f"oci:{node}", "--require")
    first, _ = _restore(env, *args, "--target", str(tmp_path / "a"))
    assert first["status"] == "restored" and first["node_store"]["outcome"] == "fetched"
    good = {k: p.read_bytes() for k, p in _blobs(node, pub["tags"][0]).items()}

    _damage(_blobs(node, pub["tags"][0])[what], how)
    healed, proc = _restore(env, *args, "--target", str(tmp_path / "b"))
    # Warm in the same run, from the node store (not a bypass to the registry) ...
    assert healed["status"] == "restored" and healed["plan"]["store"] == f"oci:{node}", proc.stderr
    assert healed["node_store"]["outcome"] == "fetched"
    assert pub["tags"][0] in healed["node_store"]["set_aside"]
    assert '"set_aside"' in proc.stderr
    assert (tmp_path / "b" / "generic" / "big.cubin").read_bytes() == (
        Path(env["ARTIFACTD_GENERIC_DIR"]) / "big.cubin"
    ).read_bytes()
    # ... and the node copy is whole again: the next pod reads it from the node.
    assert {k: p.read_bytes() for k, p in _blobs(node, pub["tags"][0]).items()} == good
    again, _ = _restore(env, *args, "--target", str(tmp_path / "c"))
    assert again["status"] == "restored" and again["node_store"]["outcome"] == "node"
    assert again["node_store"]["bytes_fetched"] == 0


@pytest.mark.slow
def test_registry_down_and_a_damaged_node_copy_fail_cleanly_then_heal(
    tmp_path: Path, registry: RegistryServer, repo: str, env: dict[str, str]
) -> None:
    store = registry.ref(repo)
    pub = _harvest(store, env)
    node = tmp_path / "node"
    _restore(env, "--store", store, "--node-store", f"oci:{node}", "--target", str(tmp_path / "a"))
    _damage(_blobs(node, pub["tags"][0])["layer"], "flip")
    down = ("--store", _dead_registry(), "--node-store", f"oci:{node}")
    target = tmp_path / "b"
    # The damaged copy cannot be fetched again: the outage is what the pod is told.
    doc, _ = _restore(env, *down, "--target", str(target), "--require", code=3)
    assert doc["failure"]["kind"] == "unreachable" and not doc["cache_hit"]
    assert not (target / "generic").exists()
    # Set aside, the node store is cold: a miss, exit 0, the engine compiles.
    doc, _ = _restore(env, *down, "--target", str(target))
    assert doc["status"] in ("miss", "failed") and not doc["cache_hit"], doc
    assert not (target / "generic").exists()
    # The damaged copy was set aside, not left to fail every pod: once the
    # registry answers, the node store is filled again.
    with open_store(f"oci:{node}") as st:
        assert st.tag_digest(pub["tags"][0]) is None
    doc, _ = _restore(env, "--store", store, "--node-store", f"oci:{node}", "--target", str(target))
    assert doc["status"] == "restored" and doc["node_store"]["outcome"] == "fetched"


def test_a_tag_repointed_on_the_node_is_replaced_by_the_registrys(
    tmp_path: Path, registry: RegistryServer, repo: str, env: dict[str, str]
) -> None:
    store = registry.ref(repo)
    pub = _harvest(store, env)
    node = tmp_path / "node"
    args = ("--store", store, "--node-store", f"oci:{node}", "--require")
    _restore(env, *args, "--target", str(tmp_path / "a"))
    # Someone on the node points the pod's tag at another workload's artifact.
    other_env = {**env, "ARTIFACTD_GENERIC_DIR": str(make_generic_tree(tmp_path / "other"))}
    proc = run_artifactd(
        "harvest", "--store", f"oci:{node}", "--family", "generic", "--workload",
        "model=other", "--json", env=other_env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    other = json.loads(proc.stdout)
    with open_store(f"oci:{node}") as st:
        found = st.get_manifest(other["tags"][0])
        assert found is not None
        st.put_manifest(found.data, found.media_type, [pub["tags"][0]])
    doc, _ = _restore(env, *args, "--target", str(tmp_path / "b"))
    assert doc["status"] == "restored" and doc["plan"]["store"] == f"oci:{node}", doc
    assert pub["tags"][0] in doc["node_store"]["set_aside"]
    with open_store(f"oci:{node}") as st:
        assert st.tag_digest(pub["tags"][0]) == pub["digest"]


SLOW_BLOB_WRITES = """
import time
import artifactd.stores.layout as layout
_copy = layout.copy_hashed
def _slow(*args, **kwargs):
    done = _copy(*args, **kwargs)
    time.sleep(120)  # the temp file is written, not yet renamed: the kill lands here
    return done
layout.copy_hashed = _slow
"""


def test_a_fill_killed_mid_write_leaves_nothing_the_next_fill_does_not_remove(
    tmp_path: Path, registry: RegistryServer, repo: str, env: dict[str, str]
) -> None:
    store = registry.ref(repo)
    _harvest(store, env)
    node = tmp_path / "node"
    argv = [
        PYTHON, "-c", f"{SLOW_BLOB_WRITES}\nfrom artifactd.cli import main\nmain()\n",
        "restore", "--family", "generic", "--store", store, "--node-store", f"oci:{node}",
        "--target", str(tmp_path / "a"), "--json",
    ]  # fmt: skip
    killed = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not any("blobs" in p for p in _leftovers(node)):
            assert killed.poll() is None, "the fill ended before it could be killed"
            assert time.monotonic() < deadline, "no blob write began"
            time.sleep(0.05)
    finally:
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
    assert killed.returncode == -signal.SIGKILL
    assert _leftovers(node), "the kill left the temp files of the write in progress"
    doc, _ = _restore(
        env, "--store", store, "--node-store", f"oci:{node}", "--target", str(tmp_path / "b")
    )
    assert doc["status"] == "restored" and doc["node_store"]["outcome"] == "fetched"
    assert _leftovers(node) == []
    assert doc["node_store"]["cleared"]


@pytest.fixture
def full_disk(tmp_path: Path) -> Any:
    """A node disk (a 4 MiB tmpfs) with 64 KiB left."""
    disk = tmp_path / "disk"
    why = mount_tmpfs(disk, "4m")
    if why:
        pytest.skip(why)
    try:
        yield disk
    finally:
        unmount(disk)


def test_prefetch_into_a_full_disk_is_no_space_and_a_restore_goes_to_the_registry(
    tmp_path: Path, registry: RegistryServer, repo: str, env: dict[str, str], full_disk: Path
) -> None:
    store = registry.ref(repo)
    _harvest(store, env)
    node = full_disk / "node"
    node.mkdir()
    fill(full_disk / "filler", leave=64 << 10)
    proc = run_artifactd(
        "prefetch", "--store", store, "--node-store", f"oci:{node}", "--family", "generic",
        env=env, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 9, proc.stderr
    assert "Traceback" not in proc.stderr and "internal" not in proc.stderr
    assert "node store" in proc.stderr and "out of space" in proc.stderr
    assert "hint: collect it" in proc.stderr
    assert _leftovers(node) == []
    # A pod on that node still starts warm: the full node store is passed over.
    doc, proc = _restore(
        env, "--store", store, "--node-store", f"oci:{node}", "--target", str(tmp_path / "t"),
        "--require",
    )  # fmt: skip
    assert doc["status"] == "restored" and doc["plan"]["store"] == store
    assert '"bypassed"' in proc.stderr
    assert _leftovers(node) == []


@pytest.mark.parametrize("size", ["-5", "-1G", "inf", "nan", "-0.5M"])
def test_gc_refuses_a_limit_that_is_not_a_size(
    tmp_path: Path, registry: RegistryServer, repo: str, env: dict[str, str], size: str
) -> None:
    store = registry.ref(repo)
    _harvest(store, env)
    node = tmp_path / "node"
    _restore(env, "--store", store, "--node-store", f"oci:{node}", "--target", str(tmp_path / "a"))
    with open_store(f"oci:{node}") as st:
        tags = st.list_tags()
    proc = run_artifactd("gc", "--store", f"oci:{node}", f"--max-bytes={size}", env=env)
    assert proc.returncode == 2, proc.stderr
    assert "is not a size" in proc.stderr and "Traceback" not in proc.stderr
    with open_store(f"oci:{node}") as st:
        assert st.list_tags() == tags
    # 0 is a size: it empties the node store, as documented.
    if size == "-5":
        proc = run_artifactd("gc", "--store", f"oci:{node}", "--max-bytes", "0", "--apply", env=env)
        assert proc.returncode == 0, proc.stderr
        with open_store(f"oci:{node}") as st:
            assert st.list_tags() == []
