"""``image append`` reads the base image as hostile input.

The base comes from a registry, and from whoever can push to it. Each
document append reads (the manifest, an index, the image config) is checked
for every field it uses before it is used: a malformed one is exit 5
(``schema``) naming the document and the field, in bounded time, and nothing
is written under the target tag.

Configs are blobs, which the real registry stores whatever they hold: those
variants are pushed to it. The registry refuses to store a malformed
manifest, but a registry the base comes from (or anyone on a plain-HTTP path
to it) can answer with anything: those variants are planted by a proxy in
front of the same real registry, which answers the base tag's GET with them
and passes every other request, the writes included, through.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cachetrees import make_generic_tree
from conftest import clean_env, run_artifactd
from faultproxy import FaultProxy, Record, _BodyFault, _send_head
from images import ARCH, make_base
from registry_server import RegistryServer
from test_image_append import SKOPEO, push_base, skopeo

from artifactd.stores import open_store

pytestmark = pytest.mark.skipif(SKOPEO is None, reason="skopeo not installed (scripts/setup.sh)")

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
#: Every refusal here comes in well under this (seconds, the subprocess included).
LIMIT = 10.0
DEEP = 100_000


class HostileRegistry(FaultProxy):
    """The real registry behind a proxy that answers chosen manifest GETs with planted bytes."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        #: request path (``/v2/REPO/manifests/TAG``) -> (body, Content-Type)
        self.planted: dict[str, tuple[bytes, str]] = {}

    def plant(self, repo: str, tag: str, body: bytes, media_type: str) -> None:
        """Answer GET and HEAD of ``repo:tag`` with ``body`` from now on (writes pass through)."""
        self.planted[f"/v2/{repo}/manifests/{tag}"] = (body, media_type)

    def _relay(
        self,
        conn: socket.socket,
        method: str,
        resp: Any,
        rec: Record,
        fault: _BodyFault | None,
    ) -> None:
        planted = self.planted.get(rec.path) if method in ("GET", "HEAD") else None
        if planted is None:
            super()._relay(conn, method, resp, rec, fault)
            return
        resp.read()  # the registry's own answer (a 404: the tag is not there) is dropped
        body, media_type = planted
        rec.status, rec.fault = 200, "planted"
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        headers = [("Content-Type", media_type), ("Docker-Content-Digest", digest)]
        _send_head(conn, 200, "OK", [*headers, ("Content-Length", str(len(body)))])
        if method != "HEAD":
            self._sendall(conn, body, rec)


@pytest.fixture
def hostile(registry: RegistryServer) -> Iterator[HostileRegistry]:
    proxy = HostileRegistry(registry.host)
    try:
        yield proxy
    finally:
        proxy.close()


class Base:
    """A good base pushed to the real registry, and how to plant variants of it."""

    def __init__(self, tmp_path: Path, registry: RegistryServer, repo: str) -> None:
        self.registry, self.repo = registry, repo
        self.ref = push_base(make_base(tmp_path), registry, repo, docker=False)
        raw = skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{self.ref}").stdout
        self.manifest: dict[str, Any] = json.loads(raw)
        self.manifest_bytes = raw.encode()
        self.digest = "sha256:" + hashlib.sha256(self.manifest_bytes).hexdigest()
        with (
            open_store(registry.ref(repo)) as st,
            st.open_blob(
                self.manifest["config"]["digest"], self.manifest["config"]["size"]
            ) as reader,
        ):
            self.config: dict[str, Any] = json.loads(reader.read())
        self.work = tmp_path

    def with_config(self, tag: str, data: bytes) -> None:
        """Push ``data`` as the config blob of a copy of the base manifest, under ``tag``."""
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        path = self.work / f"config-{tag}"
        path.write_bytes(data)
        manifest = {**self.manifest, "config": {**self.manifest["config"], "digest": digest,
                                                "size": len(data)}}  # fmt: skip
        with open_store(self.registry.ref(self.repo)) as st:
            st.put_blob(path, digest, len(data))
            st.put_manifest(json.dumps(manifest).encode(), OCI_MANIFEST, [tag])


@pytest.fixture(scope="module")
def repo() -> str:
    """One repository for the module: every test appends under tags of its own.

    The base and the artifact are only read, so they are pushed once (a
    skopeo push and a CLI harvest per test were most of this module's cost).
    """
    return "t/hostile-image-base"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, registry: RegistryServer, repo: str) -> Base:
    return Base(tmp_path_factory.mktemp("base"), registry, repo)


@pytest.fixture(scope="module")
def artifact(
    tmp_path_factory: pytest.TempPathFactory, registry: RegistryServer, repo: str
) -> tuple[str, dict[str, str]]:
    """A harvested generic cache in the registry: (its ref through the proxy's repo name, env)."""
    tmp_path = tmp_path_factory.mktemp("artifact")
    env = clean_env(
        {"HOME": str(tmp_path), "ARTIFACTD_GENERIC_DIR": str(make_generic_tree(tmp_path / "g"))}
    )
    proc = run_artifactd("harvest", "--store", registry.ref(f"{repo}-caches"), "--family",
                         "generic", "--json", env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return f"{repo}-caches:fp-{json.loads(proc.stdout)['fingerprint_hash']}", env


def _deep(n: int) -> str:
    return "[" * n + "]" * n


def _doc(value: dict[str, Any], deep_key: str | None = None) -> bytes:
    """Compact JSON; with ``deep_key``, that key holds an array nested :data:`DEEP` levels."""
    data = json.dumps(value, separators=(",", ":"))
    if deep_key is not None:
        data = data[:-1] + f',"{deep_key}":{_deep(DEEP)}}}'
    return data.encode()


def _append(
    host: str, repo: str, tag: str, art: tuple[str, dict[str, str]]
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run ``image append`` of the base ``repo:tag`` to ``repo-app:tag``; killed after LIMIT s."""
    args = ("image", "append", "--base", f"{host}/{repo}:{tag}", "--artifact", f"{host}/{art[0]}",
            "--to", f"{host}/{repo}-app:{tag}")  # fmt: skip
    started = time.monotonic()
    try:
        proc = run_artifactd(*args, env=art[1], timeout=LIMIT)
    except subprocess.TimeoutExpired:
        proc = subprocess.CompletedProcess(args, -9, "", f"still running after {LIMIT} s")
    return proc, time.monotonic() - started


def _refused(
    proc: subprocess.CompletedProcess[str],
    took: float,
    *,
    registry: RegistryServer,
    repo: str,
    tag: str,
    says: str,
    code: int = 5,
) -> None:
    """The documented exit code, one clear line, no traceback, quick, nothing under the target."""
    assert proc.returncode == code, (tag, proc.returncode, proc.stderr[-1500:])
    assert "Traceback" not in proc.stderr and "internal" not in proc.stderr, proc.stderr
    assert re.search(says, proc.stderr), (tag, says, proc.stderr)
    assert took < LIMIT
    with open_store(registry.ref(f"{repo}-app")) as st:
        assert st.tag_digest(tag) is None


# --------------------------------------------------------------------------
# The config: a blob, stored by the real registry whatever it holds
# --------------------------------------------------------------------------

CONFIGS: dict[str, tuple[Callable[[dict[str, Any]], bytes], str]] = {
    "not-json": (lambda c: b"\x00\xffnot json {", r"config .* is not JSON"),
    "a-list": (lambda c: b"[1, 2, 3]", r"config .* is a JSON array, not an object"),
    "string-for-object": (
        lambda c: _doc({**c, "config": "Env=PATH=/x"}),
        r"config sha256:\w+\.\.\.: config is a JSON string, not an object",
    ),
    "rootfs-string": (
        lambda c: _doc({**c, "rootfs": "layers"}),
        r"rootfs is a JSON string, not an object",
    ),
    "no-diff-ids": (
        lambda c: _doc({**c, "rootfs": {"type": "layers"}}),
        r"rootfs.diff_ids is a JSON null, not an array",
    ),
    "env-number": (
        lambda c: _doc({**c, "config": {"Env": [1]}}),
        r"config.Env\[0\] is a JSON number, not a string",
    ),
    "labels-list": (
        lambda c: _doc({**c, "config": {"Labels": ["a"]}}),
        r"config.Labels is a JSON array, not an object",
    ),
    "architecture-object": (
        lambda c: _doc({**c, "architecture": {"x": 1}}),
        r"architecture is a JSON object, not a string",
    ),
    "deep": (lambda c: _doc(c, "x"), r"nests deeper than 32 levels"),
    "oversized": (
        lambda c: _doc({**c, "pad": "x" * (5 << 20)}),
        r"claims \d+ bytes .*not an image config",
    ),
    "diff-ids-mismatch": (
        lambda c: _doc({**c, "rootfs": {"type": "layers", "diff_ids": []}}),
        r"rootfs.diff_ids lists 0 layer\(s\), the manifest 1",
    ),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_malformed_config_is_refused(
    name: str,
    base: Base,
    registry: RegistryServer,
    repo: str,
    artifact: tuple[str, dict[str, str]],
) -> None:
    make, says = CONFIGS[name]
    base.with_config(name, make(base.config))
    proc, took = _append(registry.host, repo, name, artifact)
    _refused(proc, took, registry=registry, repo=repo, tag=name, says=says)


def test_the_good_base_appends(
    base: Base, registry: RegistryServer, repo: str, artifact: tuple[str, dict[str, str]]
) -> None:
    """The checks refuse what is malformed, not the base every variant is made from."""
    base.with_config("same", json.dumps(base.config).encode())
    proc, _ = _append(registry.host, repo, "same", artifact)
    assert proc.returncode == 0, proc.stderr
    with open_store(registry.ref(f"{repo}-app")) as st:
        assert st.tag_digest("same") is not None


# --------------------------------------------------------------------------
# The manifest and the index: planted by a registry that answers anything
# --------------------------------------------------------------------------


def _manifests(base: Base) -> dict[str, tuple[bytes, str, str]]:
    """name -> (the planted body, its Content-Type, what the error must say)."""
    m, cfg = base.manifest, base.manifest["config"]
    no_config = {k: v for k, v in m.items() if k != "config"}
    entry = {"mediaType": OCI_MANIFEST, "digest": base.digest, "size": len(base.manifest_bytes),
             "platform": {"os": "linux", "architecture": ARCH}}  # fmt: skip
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX}
    return {
        "m-not-json": (b"not json {", OCI_MANIFEST, r"is not JSON"),
        "m-list": (b"[1,2]", OCI_MANIFEST, r"is a JSON array, not an object"),
        "m-config-string": (
            _doc({**m, "config": cfg["digest"]}),
            OCI_MANIFEST,
            r": config is a JSON string, not a descriptor object",
        ),
        "m-no-config": (_doc(no_config), OCI_MANIFEST, r"has no config"),
        "m-no-digest": (
            _doc({**m, "config": {k: v for k, v in cfg.items() if k != "digest"}}),
            OCI_MANIFEST,
            r": config has no digest",
        ),
        "m-bad-digest": (
            _doc({**m, "config": {**cfg, "digest": "sha256:../../x"}}),
            OCI_MANIFEST,
            r"is not sha256:<64 hex>",
        ),
        "m-size-string": (
            _doc({**m, "config": {**cfg, "size": "12"}}),
            OCI_MANIFEST,
            r"size '12' is not a byte count",
        ),
        "m-layers-strings": (
            _doc({**m, "layers": ["sha256:" + "0" * 64]}),
            OCI_MANIFEST,
            r"layers\[0\] is a JSON string, not a descriptor object",
        ),
        "m-many-layers": (
            _doc({**m, "layers": m["layers"] * 600}),
            OCI_MANIFEST,
            r"has 600 layers \(at most 512\)",
        ),
        "m-deep": (_doc(m, "annotations"), OCI_MANIFEST, r"nests deeper than"),
        "i-strings": (
            _doc({**index, "manifests": ["a", "b"]}),
            OCI_INDEX,
            r"manifests\[0\] is a JSON string, not a descriptor object",
        ),
        "i-no-manifests": (_doc(index), OCI_INDEX, r"has no manifests"),
        "i-manifests-object": (
            _doc({**index, "manifests": {"a": entry}}),
            OCI_INDEX,
            r"manifests is a JSON object, not an array",
        ),
        "i-platform-string": (
            _doc({**index, "manifests": [{**entry, "platform": "linux/amd64"}]}),
            OCI_INDEX,
            r"manifests\[0\].platform is a JSON string, not an object",
        ),
        "i-entry-no-digest": (
            _doc({**index, "manifests": [{k: v for k, v in entry.items() if k != "digest"}]}),
            OCI_INDEX,
            r"manifests\[0\] has no digest",
        ),
        "i-20000-platforms": (
            _doc({**index, "manifests": [entry] * 20_000}),
            OCI_INDEX,
            r"lists 20000 manifests \(at most 256\)",
        ),
        "i-deep": (
            _doc({**index, "manifests": [entry]}, "annotations"),
            OCI_INDEX,
            r"nests deeper",
        ),
        "i-nested-index": (
            _doc({**index, "manifests": [{**entry, "mediaType": OCI_INDEX}]}),
            OCI_INDEX,
            r"an index inside the index",
        ),
    }


def test_malformed_manifests_and_indexes_are_refused(
    base: Base,
    hostile: HostileRegistry,
    registry: RegistryServer,
    repo: str,
    artifact: tuple[str, dict[str, str]],
) -> None:
    cases = _manifests(base)
    for name, (body, media_type, _) in cases.items():
        hostile.plant(repo, name, body, media_type)
    failed = []
    for name, (_, _, says) in cases.items():
        proc, took = _append(hostile.host, repo, name, artifact)
        try:
            _refused(proc, took, registry=registry, repo=repo, tag=name, says=says)
        except AssertionError as exc:
            failed.append(f"{name}: {str(exc)[:300]}")
    assert not failed, "\n".join(failed)
    # The planted documents were what append read: the proxy served every one.
    served = {r.path.rsplit("/", 1)[-1] for r in hostile.log if r.fault == "planted"}
    assert served == set(cases)


def test_an_oversized_manifest_is_refused_by_the_transport(
    base: Base,
    hostile: HostileRegistry,
    registry: RegistryServer,
    repo: str,
    artifact: tuple[str, dict[str, str]],
) -> None:
    """Over the transport's 4 MiB for any registry answer: refused unread, exit 3."""
    hostile.plant(repo, "big", _doc({**base.manifest, "pad": "x" * (5 << 20)}), OCI_MANIFEST)
    proc, took = _append(hostile.host, repo, "big", artifact)
    _refused(
        proc, took, registry=registry, repo=repo, tag="big", says=r"larger than \d+ bytes", code=3
    )


def test_the_proxy_passes_a_good_base_through(
    base: Base,
    hostile: HostileRegistry,
    registry: RegistryServer,
    repo: str,
    artifact: tuple[str, dict[str, str]],
) -> None:
    """Planted as it is, the base's own manifest appends: the proxy changes nothing else."""
    # A tag of its own: test_the_good_base_appends writes "same" in the shared repository.
    hostile.plant(repo, "same-planted", base.manifest_bytes, OCI_MANIFEST)
    proc, _ = _append(hostile.host, repo, "same-planted", artifact)
    assert proc.returncode == 0, proc.stderr
    with open_store(registry.ref(f"{repo}-app")) as st:
        assert st.tag_digest("same-planted") is not None


def test_an_index_whose_platforms_reference_too_many_blobs_is_refused_quickly(
    base: Base,
    hostile: HostileRegistry,
    registry: RegistryServer,
    repo: str,
    artifact: tuple[str, dict[str, str]],
) -> None:
    """Each entry within the limits, their sum not: the requests an append makes are bounded."""
    wide = _doc({**base.manifest, "layers": base.manifest["layers"] * 500})
    digest = "sha256:" + hashlib.sha256(wide).hexdigest()
    hostile.plant(repo, digest, wide, OCI_MANIFEST)  # served by digest, and it hashes to it
    other = "arm64" if ARCH != "arm64" else "amd64"
    entry = {"mediaType": OCI_MANIFEST, "digest": digest, "size": len(wide)}
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {**entry, "platform": {"os": "linux", "architecture": other, "variant": f"v{i}"}}
        for i in range(5)
    ]}  # fmt: skip
    hostile.plant(repo, "wide", _doc(index), OCI_INDEX)
    proc, took = _append(hostile.host, repo, "wide", artifact)
    _refused(proc, took, registry=registry, repo=repo, tag="wide",
             says=r"references more than 2048 blobs")  # fmt: skip
    # One question per distinct blob, however often the manifests repeat it.
    assert hostile.count(method="HEAD") < 20
