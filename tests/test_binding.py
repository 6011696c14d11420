"""Binding: an artifact installs only where its own content says it is for, from every source.

The attack: someone with push rights re-points the pod's ``fp-<hash>`` tag at
an artifact CI genuinely built (and signed) for another fingerprint, here
``gpu.arch=sm_100a`` on an ``sm_90a`` pod, or a family tag at another scope
key's family manifest. A signature vouches for bytes; a tag is anyone's. Each
source is real: the Debian ``docker-registry``, a local OCI layout, a node
store in front of the registry, a derived image's baked store (``--from-dir``)
and a mounted tree. Every restore is the real CLI in its own process.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cachetrees import build_caches
from conftest import clean_env, run_artifactd
from images import mount_artifact
from registry_server import RegistryServer

from artifactd.build.harvest import harvest
from artifactd.build.run import cell_tag
from artifactd.stores import open_store
from artifactd.stores.artifacts import copy_between, read_artifact
from artifactd.stores.layout import LayoutStore
from artifactd.trust.keys import KeyPair, generate

PASSWORD = "binding test password"
POD_ARCH = "sm_90a"
OTHER_ARCH = "sm_100a"


@dataclass
class World:
    """The pod's artifact (A) and another fingerprint's (B), signed and unsigned, in layouts."""

    key: KeyPair
    evil: KeyPair
    pod_signed: str
    other_signed: str
    other_unsigned: str
    pod: dict[str, Any]
    other: dict[str, Any]

    def pod_tag(self, family: str | None) -> str:
        """The tag the pod resolves: ``fp-<hash>``, or the family's scope tag."""
        prefix = f"{family}-" if family else "fp-"
        return str(next(t for t in self.pod["tags"] if t.startswith(prefix)))

    def other_tag(self, family: str | None) -> str:
        """The same tag of the other fingerprint's artifact."""
        prefix = f"{family}-" if family else "fp-"
        return str(next(t for t in self.other["tags"] if t.startswith(prefix)))


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return run_artifactd(
        *args, env=clean_env({"ARTIFACTD_KEY_PASSWORD": PASSWORD}), timeout=timeout
    )


def _harvest(store: str, environ: dict[str, str], arch: str, *extra: str) -> dict[str, Any]:
    proc = run_artifactd(
        "harvest",
        "--store",
        store,
        "--gpu-arch",
        arch,
        "--json",
        *extra,
        env=clean_env({**environ, "ARTIFACTD_KEY_PASSWORD": PASSWORD}),
    )
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    root = tmp_path_factory.mktemp("binding")
    key = generate(root / "ci", password=PASSWORD)
    evil = generate(root / "evil")
    environ = build_caches(root / "build")
    signing = ("--sign-key", key.private)
    pod = _harvest(f"oci:{root / 'pod'}", environ, POD_ARCH, *signing)
    other = _harvest(f"oci:{root / 'other-signed'}", environ, OTHER_ARCH, *signing)
    _harvest(f"oci:{root / 'other-unsigned'}", environ, OTHER_ARCH)
    assert pod["fingerprint_hash"] != other["fingerprint_hash"]
    return World(
        key,
        evil,
        f"oci:{root / 'pod'}",
        f"oci:{root / 'other-signed'}",
        f"oci:{root / 'other-unsigned'}",
        pod,
        other,
    )


def fresh(registry: RegistryServer) -> str:
    """A repository of its own (parametrized names are too long to tell apart)."""
    return registry.ref(f"t/binding-{uuid.uuid4().hex[:12]}")


def repoint(store: str, source_tag: str, tag: str) -> str:
    """Point ``tag`` at the manifest ``source_tag`` names, as anyone with push rights can."""
    with open_store(store) as st:
        found = st.get_manifest(source_tag)
        assert found is not None
        st.put_manifest(found.data, found.media_type, [tag])
        return found.digest


def restore(*args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    proc = cli("restore", "--gpu-arch", POD_ARCH, "--json", *args)
    assert "Traceback" not in proc.stderr, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc.get("failure") is None or doc["failure"]["kind"] != "internal", doc
    return proc, doc


def installed(target: Path) -> dict[str, bytes]:
    if not target.exists():
        return {}
    return {
        str(p.relative_to(target)): p.read_bytes()
        for p in sorted(target.rglob("*"))
        if p.is_file() and ".artifactd" not in p.parts
    }


def assert_refused(source: list[str], target: Path, tag: str, policy: list[str]) -> None:
    """The mis-bound artifact: a miss naming why (exit 0), corrupt with --require (exit 5)."""
    before = installed(target)
    proc, doc = restore(*source, "--target", str(target), *policy)
    assert proc.returncode == 0, proc.stderr
    assert doc["status"] == "miss", doc
    assert tag in doc["plan"]["unbound"], doc["plan"]
    assert "built for another" in doc["plan"]["unbound"][tag]
    assert installed(target) == before
    proc, doc = restore(*source, "--target", str(target), *policy, "--require")
    assert proc.returncode == 5, proc.stderr
    assert doc["status"] == "failed" and doc["failure"]["kind"] == "corrupt", doc
    assert tag in doc["failure"]["message"] and "built for another" in doc["failure"]["message"]
    assert installed(target) == before


def _stage(world: World, store: str, signed: bool, family: str | None) -> str:
    """Put the other fingerprint's artifact in ``store`` and re-point the pod's tag at it."""
    copy_between(world.other_signed if signed else world.other_unsigned, store, None)
    with open_store(store) as st:
        assert st.tag_digest(world.pod_tag(None)) is None  # the pod's own was never published
    return repoint(store, world.other_tag(family), world.pod_tag(family))


ATTACKS = [
    pytest.param(None, True, id="full-tag-signed"),
    pytest.param(None, False, id="full-tag-unsigned"),
    pytest.param("generic", True, id="family-tag-signed"),
    pytest.param("generic", False, id="family-tag-unsigned"),
]


@pytest.mark.parametrize(("family", "signed"), ATTACKS)
def test_registry_refuses_an_artifact_tagged_for_another_machine(
    registry: RegistryServer,
    tmp_path: Path,
    world: World,
    family: str | None,
    signed: bool,
) -> None:
    ref = fresh(registry)
    _stage(world, ref, signed, family)
    policy = ["--verify-key", world.key.public] if signed else []
    assert_refused(["--store", ref], tmp_path / "cache", world.pod_tag(family), policy)


@pytest.mark.parametrize(("family", "signed"), ATTACKS)
def test_a_local_layout_refuses_an_artifact_tagged_for_another_machine(
    tmp_path: Path, world: World, family: str | None, signed: bool
) -> None:
    layout = f"oci:{tmp_path / 'layout'}"
    _stage(world, layout, signed, family)
    policy = ["--verify-key", world.key.public] if signed else []
    assert_refused(["--store", layout], tmp_path / "cache", world.pod_tag(family), policy)


@pytest.mark.parametrize(("family", "signed"), ATTACKS)
def test_the_node_store_refuses_an_artifact_tagged_for_another_machine(
    registry: RegistryServer,
    tmp_path: Path,
    world: World,
    family: str | None,
    signed: bool,
) -> None:
    ref = fresh(registry)
    _stage(world, ref, signed, family)
    node = tmp_path / "node"
    policy = ["--verify-key", world.key.public] if signed else []
    source = ["--store", ref, "--node-store", f"oci:{node}"]
    assert_refused(source, tmp_path / "cache", world.pod_tag(family), policy)
    # The node store mirrors the registry's tag, and the restore read it there.
    with open_store(f"oci:{node}") as st:
        assert st.tag_digest(world.pod_tag(family)) is not None


@pytest.mark.parametrize(("family", "signed"), ATTACKS)
def test_a_baked_store_refuses_an_artifact_tagged_for_another_machine(
    tmp_path: Path, world: World, family: str | None, signed: bool
) -> None:
    # A derived image's baked store: an OCI layout at opt/prebuilt-cache/<hash>/.
    image = tmp_path / "image"
    baked = image / "opt" / "prebuilt-cache" / world.pod["fingerprint_hash"]
    _stage(world, f"oci:{baked}", signed, family)
    policy = ["--verify-key", world.key.public] if signed else []
    source = ["--from-dir", str(image)]
    assert_refused(source, tmp_path / "cache", world.pod_tag(family), policy)
    # The same layout named directly.
    assert_refused(["--from-dir", str(baked)], tmp_path / "c2", world.pod_tag(family), policy)


def test_a_mounted_tree_of_another_scope_is_refused_by_the_same_check(
    tmp_path: Path, world: World
) -> None:
    mounted = tmp_path / "mounted"
    mount_artifact(world.other_unsigned, world.other_tag(None), mounted)
    target = tmp_path / "cache"
    proc, doc = restore("--from-dir", str(mounted), "--target", str(target))
    assert proc.returncode == 0 and doc["status"] == "miss", doc
    assert set(doc["plan"]["unbound"]) == {world.pod_tag("generic"), world.pod_tag("triton")}
    generic = next(f for f in doc["plan"]["families"] if f["family"] == "generic")
    assert "gpu.arch" in generic["reason"] and "built for another scope" in generic["reason"]
    assert installed(target) == {}
    proc, doc = restore("--from-dir", str(mounted), "--target", str(target), "--require")
    assert proc.returncode == 5 and doc["failure"]["kind"] == "corrupt", proc.stderr
    assert installed(target) == {}
    # The control: the pod's own tree restores.
    mine = tmp_path / "mine"
    mount_artifact(world.pod_signed, world.pod_tag(None), mine)
    proc, doc = restore("--from-dir", str(mine), "--target", str(target), "--require")
    assert proc.returncode == 0 and doc["status"] == "restored", proc.stderr


def test_a_warm_pod_keeps_its_cache_and_a_no_op_never_hides_a_repointed_tag(
    registry: RegistryServer, repo: str, tmp_path: Path, world: World
) -> None:
    ref = registry.ref(repo)
    copy_between(world.pod_signed, ref, None)
    copy_between(world.other_signed, ref, None)
    policy = ["--verify-key", world.key.public]
    target = tmp_path / "cache"
    proc, doc = restore("--store", ref, "--target", str(target), *policy, "--require")
    assert doc["status"] == "restored" and doc["match"] == "full", proc.stderr
    before = installed(target)
    marker = (target / ".artifactd" / "restored.json").read_bytes()
    proc, doc = restore("--store", ref, "--target", str(target), *policy)
    assert doc["status"] == "noop"
    # The fp tag re-pointed at the signed sm_100a artifact: the marker no longer
    # matches the tag, so the restore resolves again and never installs it.
    repoint(ref, world.other_tag(None), world.pod_tag(None))
    proc, doc = restore("--store", ref, "--target", str(target), *policy, "--require")
    assert proc.returncode == 5 and doc["failure"]["kind"] == "corrupt", proc.stderr
    assert world.pod_tag(None) in doc["plan"]["unbound"]
    assert installed(target) == before
    assert (target / ".artifactd" / "restored.json").read_bytes() == marker
    # Without --require the families resolve by their own (bound) tags: the
    # pod's own layers, installed again; the re-pointed tag is named.
    proc, doc = restore("--store", ref, "--target", str(target), *policy)
    assert proc.returncode == 0 and doc["status"] == "restored", doc
    assert doc["match"] == "partial" and world.pod_tag(None) in doc["plan"]["unbound"]
    assert installed(target) == before
    recorded = json.loads((target / ".artifactd" / "restored.json").read_bytes())
    assert {f["tag"] for f in recorded["families"].values()} == {
        world.pod_tag("generic"),
        world.pod_tag("triton"),
    }
    # Through a node store: the fill brings the pod's family tags too, so the
    # pod restores the bound families from the node, and the tag is named.
    node = f"oci:{tmp_path / 'node'}"
    proc, doc = restore("--store", ref, "--node-store", node, "--target", str(tmp_path / "n"))
    assert doc["status"] == "restored" and doc["plan"]["store"] == node, doc
    assert doc["match"] == "partial" and world.pod_tag(None) in doc["plan"]["unbound"]
    assert set(installed(tmp_path / "n")) == set(before)  # (triton embeds its own path)
    # The human output names it too.
    plain = cli("restore", "--store", ref, "--target", str(tmp_path / "t2"), "--gpu-arch", POD_ARCH)
    assert "passed over: " + world.pod_tag(None) in plain.stdout, plain.stdout


def test_an_unbound_artifact_was_installed_before_without_a_policy(
    tmp_path: Path, world: World
) -> None:
    """The control for the tests above: only the binding stands in the way."""
    layout = f"oci:{tmp_path / 'layout'}"
    _stage(world, layout, False, None)
    # Resolving the other machine's own tag installs it: the artifact itself is sound.
    with open_store(layout) as st:
        assert st.tag_digest(world.other_tag(None)) is not None
    proc = cli(
        "restore",
        "--store",
        layout,
        "--target",
        str(tmp_path / "t"),
        "--gpu-arch",
        OTHER_ARCH,
        "--json",
    )
    assert json.loads(proc.stdout)["status"] == "restored", proc.stderr
    shutil.rmtree(tmp_path / "t")


def test_a_no_op_rechecks_the_scope_key_a_family_marker_records(
    tmp_path: Path, world: World
) -> None:
    """A marker is written only after bound hits; one that records another scope is not trusted.

    Such a marker is what a release that did not check binding left behind
    after installing a re-pointed family tag.
    """
    layout = tmp_path / "layout"
    copy_between(world.pod_signed, f"oci:{layout}", None)
    LayoutStore(layout).remove_tags([world.pod_tag(None)])  # families resolve by their tags
    target = tmp_path / "cache"
    proc, doc = restore("--store", f"oci:{layout}", "--target", str(target))
    assert doc["status"] == "restored" and doc["match"] == "partial", proc.stderr
    assert restore("--store", f"oci:{layout}", "--target", str(target))[1]["status"] == "noop"
    marker_path = target / ".artifactd" / "restored.json"
    marker = json.loads(marker_path.read_bytes())
    marker["families"]["generic"]["scope_key"] = world.other_tag("generic").split("-", 1)[1]
    marker_path.write_text(json.dumps(marker))
    proc, doc = restore("--store", f"oci:{layout}", "--target", str(target))
    assert doc["status"] == "restored", doc
    rewritten = json.loads(marker_path.read_bytes())
    assert (
        rewritten["families"]["generic"]["scope_key"] == world.pod_tag("generic").split("-", 1)[1]
    )


def test_a_fan_out_cell_of_the_same_fingerprint_is_never_restored(
    tmp_path: Path, world: World
) -> None:
    """One cell's part of a fan-out build carries the pod's fingerprint, but only for merge."""
    layout = f"oci:{tmp_path / 'layout'}"
    with open_store(world.pod_signed) as st:
        pod = read_artifact(st, world.pod_tag(None))
        assert pod is not None
    tag = cell_tag("run1", 0)
    with open_store(layout, create=True) as st:
        environ = build_caches(tmp_path / "build")
        cell = harvest(st, pod.config.fingerprint, environ=environ, cell_tag=tag)
        found = st.get_manifest(cell.digest)
        assert found is not None
        st.put_manifest(found.data, found.media_type, [world.pod_tag(None)])
    target = tmp_path / "cache"
    proc, doc = restore("--store", layout, "--target", str(target))
    assert proc.returncode == 0 and doc["status"] == "miss", doc
    assert "fan-out" in doc["plan"]["unbound"][world.pod_tag(None)]
    proc, doc = restore("--store", layout, "--target", str(target), "--require")
    assert proc.returncode == 5 and doc["failure"]["kind"] == "corrupt", proc.stderr
    assert installed(target) == {}


def _generic_matrix(tmp: Path) -> Path:
    """A one-cell matrix whose command writes one generic-family file: no compiler needed."""
    writes = (
        "import os, pathlib; d = pathlib.Path(os.environ['ARTIFACTD_GENERIC_DIR']); "
        "d.mkdir(parents=True, exist_ok=True); (d / 'k.cubin').write_bytes(b'ELF binding')"
    )
    matrix = tmp / "m.yaml"
    matrix.write_text(
        "schema_version: 1\nname: binding\ntarget: {gpu_arch: sm_90a}\nfamilies: [generic]\n"
        "gpus: 0\n"
        f"command: {json.dumps(sys.executable + ' -c ' + json.dumps(writes))}\n"
    )
    return matrix


def test_verify_never_promotes_an_artifact_tagged_for_another_machine(tmp_path: Path) -> None:
    """The gate promotes what ``fp-<hash>`` names: a re-pointed tag fails it, nothing is tagged."""
    matrix = _generic_matrix(tmp_path)
    store, other = f"oci:{tmp_path / 'store'}", f"oci:{tmp_path / 'other'}"
    built = json.loads(cli("build", str(matrix), "--store", store, "--json").stdout)
    theirs = json.loads(
        cli("build", str(matrix), "--store", other, "--gpu-arch", OTHER_ARCH, "--json").stdout
    )
    ours_tag = next(t for t in built["harvest"]["tags"] if t.startswith("fp-"))
    theirs_tag = next(t for t in theirs["harvest"]["tags"] if t.startswith("fp-"))
    assert ours_tag != theirs_tag
    with open_store(other) as src, open_store(store) as dst:
        found = src.get_manifest(theirs_tag)
        assert found is not None
        copy_between(other, store, [theirs_tag])
        dst.put_manifest(found.data, found.media_type, [ours_tag])

    proc = cli("verify", str(matrix), "--store", store, "--promote", "release")
    assert proc.returncode == 12, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "built for another fingerprint" in proc.stderr, proc.stderr
    with open_store(store) as st:
        assert st.tag_digest("release") is None
