"""``artifactd image append`` against a real registry, checked with skopeo.

The base images are written here as plain OCI layouts (one gzip layer holding
a file, a config with a history) and pushed with skopeo, in OCI and in Docker
schema 2 form; the appended image is read back with skopeo and its new layer
unpacked with Python's own tarfile, as a runtime would, then restored from.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
from cachetrees import make_generic_tree
from conftest import clean_env, run_artifactd
from images import ARCH, make_base
from images import blob as _blob
from registry_server import RegistryServer

from artifactd.stores import open_store

SKOPEO = shutil.which("skopeo")
OTHER = "arm64" if ARCH != "arm64" else "amd64"
pytestmark = pytest.mark.skipif(SKOPEO is None, reason="skopeo not installed (scripts/setup.sh)")


def skopeo(*args: str) -> subprocess.CompletedProcess[str]:
    """Run skopeo against the plain-HTTP loopback registry."""
    assert SKOPEO is not None
    proc = subprocess.run([SKOPEO, *args], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc


def push_base(layout: Path, registry: RegistryServer, repo: str, docker: bool) -> str:
    """Push the layout's image to ``repo:1`` (Docker schema 2 when ``docker``); its ref."""
    ref = registry.ref(f"{repo}:1")
    fmt = ["--format", "v2s2"] if docker else ["--format", "oci"]
    skopeo("copy", *fmt, "--dest-tls-verify=false", f"oci:{layout}:base", f"docker://{ref}")
    return ref


@pytest.fixture
def artifact(tmp_path: Path, registry: RegistryServer, repo: str) -> tuple[str, dict[str, str]]:
    """A harvested generic cache in the registry: (artifact ref, the env it was built with)."""
    env = clean_env(
        {"HOME": str(tmp_path), "ARTIFACTD_GENERIC_DIR": str(make_generic_tree(tmp_path / "g"))}
    )
    store = registry.ref(f"{repo}-caches")
    proc = run_artifactd("harvest", "--store", store, "--family", "generic", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    tag = "fp-" + json.loads(proc.stdout)["fingerprint_hash"]
    return f"{store}:{tag}", env


def append(*args: str, env: dict[str, str]) -> dict[str, Any]:
    proc = run_artifactd("image", "append", *args, "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def _stored_blobs(registry: RegistryServer) -> set[str]:
    root = registry.root / "docker/registry/v2/blobs/sha256"
    return {p.name for p in root.glob("*/*")} if root.is_dir() else set()


@pytest.mark.parametrize("docker", [False, True], ids=["oci-base", "docker-base"])
def test_append_bakes_a_store_that_restores_without_any_registry(
    tmp_path: Path,
    registry: RegistryServer,
    repo: str,
    artifact: tuple[str, dict[str, str]],
    docker: bool,
) -> None:
    art_ref, env = artifact
    base = push_base(make_base(tmp_path), registry, repo, docker)
    to = registry.ref(f"{repo}-app:1")
    before = _stored_blobs(registry)
    doc = append("--base", base, "--artifact", art_ref, "--to", to, env=env)
    fp_hash = doc["fingerprint_hash"]
    assert doc["schema_version"] == 1
    assert doc["platforms"] == [ARCH]

    # Only the new layer, the new config and the manifest were stored; the base's
    # layer was mounted, not sent again.
    raw_manifest = skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{to}").stdout
    manifest = json.loads(raw_manifest)
    config_raw = skopeo("inspect", "--config", "--raw", "--tls-verify=false", f"docker://{to}")
    assert doc["bytes_uploaded"] == doc["layer_size"] + len(config_raw.stdout.encode())
    assert len(_stored_blobs(registry) - before) == 3
    base_layer = json.loads(
        skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{base}").stdout
    )["layers"][0]
    assert manifest["layers"][0]["digest"] == base_layer["digest"]
    assert doc["bytes_reused"] == base_layer["size"]
    assert manifest["layers"][-1]["digest"] == doc["layer_digest"]
    expected_type = "docker.image.rootfs.diff.tar.gzip" if docker else "oci.image.layer.v1.tar+gzip"
    assert manifest["layers"][-1]["mediaType"].endswith(expected_type)

    # The config: the new diff_id, a history entry, the labels and the env.
    config = json.loads(config_raw.stdout)
    assert len(config["rootfs"]["diff_ids"]) == 2
    assert config["history"][-1]["created_by"].startswith("artifactd image append")
    assert config["config"]["Labels"]["io.artifactd.fingerprint"] == fp_hash
    assert config["config"]["Labels"]["base"] == "yes"
    assert config["config"]["Labels"]["io.artifactd.families"] == "generic"
    assert "ARTIFACTD_PREBUILT=/opt/prebuilt-cache" in config["config"]["Env"]

    # Pull it with skopeo, unpack the new layer as a runtime would, restore from it.
    out = tmp_path / "pulled"
    skopeo("copy", "--src-tls-verify=false", f"docker://{to}", f"oci:{out}:app")
    layer_path = out / "blobs" / "sha256" / doc["layer_digest"].removeprefix("sha256:")
    data = gzip.decompress(layer_path.read_bytes())
    assert "sha256:" + hashlib.sha256(data).hexdigest() == config["rootfs"]["diff_ids"][-1]
    rootfs = tmp_path / "rootfs"
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(rootfs, filter="data")
    baked = rootfs / "opt" / "prebuilt-cache" / fp_hash
    assert (baked / "oci-layout").is_file()
    # No --store: the image's own baked store for this fingerprint, no registry.
    target = tmp_path / "volume"
    pod = {**env, "ARTIFACTD_PREBUILT": str(rootfs / "opt" / "prebuilt-cache")}
    proc = run_artifactd("restore", "--target", str(target), "--json", "--require", env=pod)
    assert proc.returncode == 0, proc.stderr
    restored = json.loads(proc.stdout)
    assert restored["restored"] == ["generic"]
    assert restored["plan"]["store"] == f"oci:{baked}"
    assert (target / "generic" / "axpy.sm_90a.cubin").is_file()


def test_append_twice_writes_the_same_image_and_uploads_nothing(
    tmp_path: Path, registry: RegistryServer, repo: str, artifact: tuple[str, dict[str, str]]
) -> None:
    art_ref, env = artifact
    base = push_base(make_base(tmp_path), registry, repo, docker=False)
    to = registry.ref(f"{repo}-app:1")
    first = append("--base", base, "--artifact", art_ref, "--to", to, env=env)
    again = append("--base", base, "--artifact", art_ref, "--to", to, env=env)
    assert again["digest"] == first["digest"]
    assert again["layer_digest"] == first["layer_digest"]
    assert first["bytes_uploaded"] > 0
    assert again["bytes_uploaded"] == 0


def test_verify_key_bakes_only_a_signed_artifact_and_refuses_before_writing(
    tmp_path: Path, registry: RegistryServer, repo: str, artifact: tuple[str, dict[str, str]]
) -> None:
    """--verify-key: an unsigned artifact is refused (exit 14) and TO is never written."""
    art_ref, env = artifact
    base = push_base(make_base(tmp_path), registry, repo, docker=False)
    to = registry.ref(f"{repo}-app:checked")
    key = run_artifactd("keygen", "--out", str(tmp_path / "ci"), env=env)
    assert key.returncode == 0, key.stderr
    pub = str(tmp_path / "ci.pub")
    refused = run_artifactd(
        "image", "append", "--base", base, "--artifact", art_ref, "--to", to,
        "--verify-key", pub, env=env,
    )  # fmt: skip
    assert refused.returncode == 14, refused.stderr
    assert "Traceback" not in refused.stderr
    with open_store(registry.ref(f"{repo}-app")) as st:
        assert st.get_manifest("checked") is None, "an unverified artifact was baked"
    signed = run_artifactd(
        "sign", art_ref, "--sign-key", str(tmp_path / "ci.key"), "--sign-unverified", env=env
    )
    assert signed.returncode == 0, signed.stderr
    doc = append("--base", base, "--artifact", art_ref, "--to", to, "--verify-key", pub, env=env)
    assert doc["digest"].startswith("sha256:")


def test_zstd_needs_an_oci_base(
    tmp_path: Path, registry: RegistryServer, repo: str, artifact: tuple[str, dict[str, str]]
) -> None:
    art_ref, env = artifact
    layout = make_base(tmp_path)
    docker = push_base(layout, registry, repo, docker=True)
    to = registry.ref(f"{repo}-app:z")
    proc = run_artifactd(
        "image", "append", "--base", docker, "--artifact", art_ref, "--to", to,
        "--compression", "zstd", env=env,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "no zstd layer type" in proc.stderr
    oci = push_base(layout, registry, f"{repo}-oci", docker=False)
    doc = append("--base", oci, "--artifact", art_ref, "--to", to, "--compression", "zstd", env=env)
    manifest = json.loads(skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{to}").stdout)
    assert manifest["layers"][-1]["mediaType"] == "application/vnd.oci.image.layer.v1.tar+zstd"
    assert doc["digest"] != ""


def test_base_in_another_registry_is_refused_before_anything_moves(tmp_path: Path) -> None:
    proc = run_artifactd(
        "image", "append", "--base", "127.0.0.1:1/base:1", "--artifact", "oci:nowhere:x",
        "--to", "127.0.0.1:2/app:1", env=clean_env({"HOME": str(tmp_path)}),
    )  # fmt: skip
    assert proc.returncode == 2
    assert "different registries" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_restore_prefers_the_baked_store_for_its_own_fingerprint(tmp_path: Path) -> None:
    """Without --store: the baked store for this fingerprint, else the only one, else local."""
    env = clean_env(
        {"HOME": str(tmp_path), "ARTIFACTD_GENERIC_DIR": str(make_generic_tree(tmp_path / "g"))}
    )
    store = f"oci:{tmp_path / 'store'}"
    done = run_artifactd("harvest", "--store", store, "--family", "generic", "--json", env=env)
    assert done.returncode == 0, done.stderr
    fp_hash = json.loads(done.stdout)["fingerprint_hash"]
    prebuilt = tmp_path / "prebuilt"
    copied = run_artifactd("copy", store, f"oci:{prebuilt / fp_hash}", "--json", env=env)
    assert copied.returncode == 0, copied.stderr
    pod = {**env, "ARTIFACTD_PREBUILT": str(prebuilt)}

    def restore(*args: str) -> dict[str, Any]:
        proc = run_artifactd("restore", "--json", *args, env=pod, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        doc: dict[str, Any] = json.loads(proc.stdout)
        return doc

    assert restore("--target", "a")["plan"]["store"] == f"oci:{prebuilt / fp_hash}"
    # Another fingerprint (another model): the only baked store is still used, and
    # the generic kernels, whose scope has no model in it, hit by their family tag.
    other = restore("--target", "b", "--workload", "model=other")
    assert other["plan"]["store"] == f"oci:{prebuilt / fp_hash}"
    assert other["status"] == "restored" and other["plan"]["match"] == "partial"
    # With two baked stores, neither for this fingerprint: the local default.
    copied = run_artifactd("copy", store, f"oci:{prebuilt / ('0' * 64)}", env=env)
    assert copied.returncode == 0, copied.stderr
    third = restore("--target", "d", "--workload", "model=other")
    assert third["plan"]["store"] == "oci:.artifactd/store"
    assert third["status"] == "failed"  # no local store here: fails open
    # An explicit store wins over the baked one.
    assert restore("--target", "c", "--store", store)["plan"]["store"] == store


def make_index_base(tmp: Path) -> Path:
    """An OCI layout whose tag ``base`` is an index: linux/amd64 and linux/arm64 images."""
    layout = make_base(tmp)
    index = json.loads((layout / "index.json").read_text())
    amd64 = index["manifests"][0]
    amd64_manifest = json.loads(
        (layout / "blobs" / "sha256" / amd64["digest"].removeprefix("sha256:")).read_bytes()
    )
    config = json.loads(
        (
            layout / "blobs" / "sha256" / amd64_manifest["config"]["digest"].removeprefix("sha256:")
        ).read_bytes()
    )
    arm_config = _blob(layout, json.dumps({**config, "architecture": OTHER}).encode())
    arm_manifest = _blob(
        layout,
        json.dumps(
            {**amd64_manifest, "config": {**amd64_manifest["config"], **arm_config}}
        ).encode(),
    )
    media = "application/vnd.oci.image.manifest.v1+json"
    entries = [
        {"mediaType": media, "digest": amd64["digest"], "size": amd64["size"],
         "platform": {"os": "linux", "architecture": ARCH}},
        {"mediaType": media, **arm_manifest, "platform": {"os": "linux", "architecture": OTHER}},
    ]  # fmt: skip
    top = _blob(
        layout,
        json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.index.v1+json",
                "manifests": entries,
            }
        ).encode(),
    )
    (layout / "index.json").write_text(
        json.dumps(
            {
                "schemaVersion": 2,
                "manifests": [
                    {
                        "mediaType": "application/vnd.oci.image.index.v1+json",
                        **top,
                        "annotations": {"org.opencontainers.image.ref.name": "base"},
                    }
                ],
            }
        )
    )
    return layout


def test_an_index_base_gets_the_layer_on_the_matching_platform_only(
    tmp_path: Path, registry: RegistryServer, repo: str, artifact: tuple[str, dict[str, str]]
) -> None:
    art_ref, env = artifact
    layout = make_index_base(tmp_path)
    base = registry.ref(f"{repo}:1")
    skopeo("copy", "--all", "--dest-tls-verify=false", f"oci:{layout}:base", f"docker://{base}")
    to = registry.ref(f"{repo}-app:1")
    doc = append("--base", base, "--artifact", art_ref, "--to", to, env=env)
    assert doc["platforms"] == [ARCH]
    assert doc["media_type"] == "application/vnd.oci.image.index.v1+json"
    index = json.loads(skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{to}").stdout)
    old = json.loads(skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{base}").stdout)
    by_arch = {m["platform"]["architecture"]: m for m in index["manifests"]}
    old_by_arch = {m["platform"]["architecture"]: m for m in old["manifests"]}
    assert by_arch[OTHER] == old_by_arch[OTHER]  # carried over untouched
    assert by_arch[ARCH]["digest"] != old_by_arch[ARCH]["digest"]
    for arch, layers in ((ARCH, 2), (OTHER, 1)):
        ref = f"docker://{registry.ref(repo + '-app')}@{by_arch[arch]['digest']}"
        manifest = json.loads(skopeo("inspect", "--raw", "--tls-verify=false", ref).stdout)
        assert len(manifest["layers"]) == layers
    # Every platform of the result pulls (its blobs are all in the target repository).
    skopeo("copy", "--all", "--src-tls-verify=false", f"docker://{to}", f"oci:{tmp_path / 'out'}:x")


def test_a_base_of_another_architecture_is_refused(
    tmp_path: Path, registry: RegistryServer, repo: str, artifact: tuple[str, dict[str, str]]
) -> None:
    art_ref, env = artifact
    layout = make_index_base(tmp_path)
    index = json.loads((layout / "index.json").read_text())["manifests"][0]
    top = json.loads(
        (layout / "blobs/sha256" / index["digest"].removeprefix("sha256:")).read_text()
    )
    other = next(m for m in top["manifests"] if m["platform"]["architecture"] == OTHER)
    (layout / "index.json").write_text(
        json.dumps({"schemaVersion": 2, "manifests": [{**other, "annotations": {
            "org.opencontainers.image.ref.name": "base"}}]})
    )  # fmt: skip
    base = push_base(layout, registry, repo, docker=False)
    proc = run_artifactd(
        "image", "append", "--base", base, "--artifact", art_ref,
        "--to", registry.ref(f"{repo}-app:1"), env=env,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert f"a {OTHER} image" in proc.stderr


def test_a_base_whose_config_claims_gigabytes_is_refused_before_reading_it(
    tmp_path: Path, registry: RegistryServer, repo: str, artifact: tuple[str, dict[str, str]]
) -> None:
    """A consistent-looking manifest that claims a 4 GiB config: nothing is read whole."""
    art_ref, env = artifact
    base = push_base(make_base(tmp_path), registry, repo, docker=False)
    manifest = json.loads(
        skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{base}").stdout
    )
    manifest["config"]["size"] = 4 << 30
    with open_store(registry.ref(repo)) as st:
        st.put_manifest(json.dumps(manifest).encode(), manifest["mediaType"], ["huge"])
    proc = run_artifactd(
        "image", "append", "--base", registry.ref(f"{repo}:huge"), "--artifact", art_ref,
        "--to", registry.ref(f"{repo}-app:1"), env=env,
    )  # fmt: skip
    assert proc.returncode == 5, proc.stderr
    assert "not an image config" in proc.stderr
    assert "Traceback" not in proc.stderr
