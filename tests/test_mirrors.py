"""Mirrors: configuration read as containerd and CRI-O read it, and the one pull transport.

The transport is checked against two real registries (Debian's docker-registry):
the origin, and a pull-through cache of it (the same binary with ``proxy:
remoteurl:``) used as the mirror. A :class:`~faultproxy.FaultProxy` in front of
the origin records what artifactd asked of it; one in front of a mirror records
what a mirror was sent (headers, ``?ns=``, credentials) or drips its bytes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cachetrees import build_caches
from conftest import clean_env, run_artifactd
from faultproxy import FaultProxy
from images import make_base
from registry_server import RegistryServer, free_port, start_registry

from artifactd.build.harvest import harvest
from artifactd.errors import ConfigError, StoreError
from artifactd.fingerprint.model import Fingerprint
from artifactd.stores import transport
from artifactd.stores.mirrors import MirrorSettings, host_dirs, plan_mirrors
from artifactd.stores.registry import RegistryStore, parse_registry_ref
from artifactd.trust.keys import generate, load_private_key

#: A generous ceiling on a restore whose mirror is down or drips: "does not hang".
CEILING_S = 60.0
GPU = ("--gpu-arch", "sm_90a")


def settings(**kw: Any) -> MirrorSettings:
    base = {"urls": (), "hosts_dir": Path("/nonexistent"), "registries_conf": Path("/nonexistent")}
    return MirrorSettings(**{**base, **kw})


# --------------------------------------------------------------------------
# Configuration (pure: files on disk, no network)
# --------------------------------------------------------------------------


def _hosts(root: Path, name: str, text: str) -> Path:
    (root / name).mkdir(parents=True, exist_ok=True)
    path = root / name / "hosts.toml"
    path.write_text(text)
    return path


def test_hosts_toml_follows_containerds_lookup_order_and_its_fields(tmp_path: Path) -> None:
    root = tmp_path / "certs.d"
    _hosts(
        root,
        "_default",
        """
[host."http://spegel.local:30020"]
  capabilities = ["pull", "resolve"]
""",
    )
    assert host_dirs("reg.example:5000") == ["reg.example_5000_", "reg.example:5000", "_default"]
    plan = plan_mirrors("reg.example:5000", "team/caches", settings(hosts_dir=root))
    assert [m.url for m in plan.mirrors] == ["http://spegel.local:30020"]
    assert plan.mirrors[0].ns == "reg.example:5000"  # Spegel needs ?ns= on every lookup
    assert plan.mirrors[0].base == "http://spegel.local:30020/v2/team/caches"

    _hosts(
        root,
        "reg.example:5000",
        """
server = "https://reg.example:5000"
[host."https://dragonfly.local:4001/proxy"]
  capabilities = ["pull"]
  override_path = true
  skip_verify = true
  [host."https://dragonfly.local:4001/proxy".header]
    X-Dragonfly-Registry = ["https://reg.example:5000"]
[host."http://resolver-only.local"]
  capabilities = ["resolve"]
""",
    )
    plan = plan_mirrors("reg.example:5000", "team/caches", settings(hosts_dir=root))
    assert "reg.example:5000/hosts.toml" in plan.source  # host:port before _default
    mirror, resolver = plan.mirrors
    assert mirror.base == "https://dragonfly.local:4001/proxy/team/caches"  # override_path
    assert mirror.headers == (("X-Dragonfly-Registry", "https://reg.example:5000"),)
    assert mirror.skip_verify and mirror.pull and not mirror.resolve
    assert resolver.resolve and not resolver.pull  # never serves content
    assert any("tags only" in line for line in plan.why)

    _hosts(root, "reg.example_5000_", '[host."http://first.local"]\n')
    plan = plan_mirrors("reg.example:5000", "team/caches", settings(hosts_dir=root))
    assert [m.url for m in plan.mirrors] == ["http://first.local"]  # host_port_ first


def test_registries_conf_longest_prefix_rewrite_drop_ins_and_blocked(tmp_path: Path) -> None:
    conf = tmp_path / "registries.conf"
    conf.write_text(
        """
[[registry]]
prefix = "reg.example/team"
location = "reg.example/team"
[[registry.mirror]]
location = "mirror.local/cache/team"
[[registry.mirror]]
location = "127.0.0.1:5001/other"
pull-from-mirror = "digest-only"

[[registry]]
prefix = "reg.example"
[[registry.mirror]]
location = "never.local"
"""
    )
    plan = plan_mirrors("reg.example", "team/caches", settings(registries_conf=conf))
    assert [m.base for m in plan.mirrors] == [
        "https://mirror.local/v2/cache/team/caches",  # the prefix rewritten
        "http://127.0.0.1:5001/v2/other/caches",  # loopback: plain HTTP
    ]
    assert plan.mirrors[0].resolve and not plan.mirrors[1].resolve
    assert all(m.ns is None for m in plan.mirrors)  # registries.conf sends no ?ns=
    drop_in = tmp_path / "registries.conf.d"
    drop_in.mkdir()
    (drop_in / "50-block.conf").write_text(
        '[[registry]]\nprefix = "reg.example/team"\nblocked = true\n'
    )
    plan = plan_mirrors("reg.example", "team/caches", settings(registries_conf=conf))
    assert plan.blocked and plan.mirrors == ()  # the drop-in replaced the entry
    other = plan_mirrors("reg.example", "teams/x", settings(registries_conf=conf))
    assert [m.url for m in other.mirrors] == ["https://never.local"]  # path boundary


def test_flags_win_then_hosts_toml_then_registries_conf(tmp_path: Path) -> None:
    _hosts(tmp_path / "certs.d", "_default", '[host."http://hosts.local"]\n')
    conf = tmp_path / "registries.conf"
    conf.write_text(
        '[[registry]]\nprefix = "reg.example"\n[[registry.mirror]]\nlocation = "c.local"\n'
    )
    both = {"hosts_dir": tmp_path / "certs.d", "registries_conf": conf}
    flagged = plan_mirrors("reg.example", "r", settings(urls=("http://flag.local",), **both))
    assert [m.url for m in flagged.mirrors] == ["http://flag.local"]
    assert [m.url for m in plan_mirrors("reg.example", "r", settings(**both)).mirrors] == [
        "http://hosts.local"
    ]
    conf_only = settings(hosts_dir=tmp_path / "none", registries_conf=conf)
    assert [m.url for m in plan_mirrors("reg.example", "r", conf_only).mirrors] == [
        "https://c.local"
    ]
    env = MirrorSettings.from_environ({"ARTIFACTD_MIRRORS": "http://a.local  http://b.local"})
    assert env.urls == ("http://a.local", "http://b.local")


def test_mirror_files_are_bounded_and_a_bad_one_is_a_config_error(tmp_path: Path) -> None:
    root = tmp_path / "certs.d"
    (root / "_default").mkdir(parents=True)
    fifo = root / "_default" / "hosts.toml"
    os.mkfifo(fifo)
    start = time.monotonic()
    with pytest.raises(ConfigError, match="not a regular file"):
        plan_mirrors("reg.example", "r", settings(hosts_dir=root))
    assert time.monotonic() - start < CEILING_S  # refused, never waited on
    fifo.unlink()
    fifo.write_bytes(b"#" * ((1 << 20) + 1))
    with pytest.raises(ConfigError, match="larger than"):
        plan_mirrors("reg.example", "r", settings(hosts_dir=root))
    fifo.write_text("[host.\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        plan_mirrors("reg.example", "r", settings(hosts_dir=root))
    fifo.write_text("".join(f'[host."http://m{i}.local"]\n' for i in range(17)))
    with pytest.raises(ConfigError, match="more than 16"):
        plan_mirrors("reg.example", "r", settings(hosts_dir=root))
    fifo.write_text(
        '[host."http://m.local"]\n[host."http://m.local".header]\nX-A = "a\\r\\nB: c"\n'
    )
    with pytest.raises(ConfigError, match="line break"):
        plan_mirrors("reg.example", "r", settings(hosts_dir=root))
    with pytest.raises(ConfigError, match="credentials"):
        plan_mirrors("reg.example", "r", settings(urls=("http://u:pw@m.local",)))


def test_mirrors_command_explains_the_order(tmp_path: Path) -> None:
    _hosts(
        tmp_path / "certs.d",
        "_default",
        '[host."http://p2p.local:5000"]\n[host."http://p2p.local:5000".header]\nX-Hop = "1"\n',
    )
    proc = run_artifactd(
        "mirrors",
        "reg.example/team/caches:fp-1",
        "--hosts-dir",
        str(tmp_path / "certs.d"),
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["source"].startswith("hosts.toml")
    assert [m["url"] for m in doc["mirrors"]] == ["http://p2p.local:5000"]
    assert doc["mirrors"][0]["headers"] == ["X-Hop"] and doc["mirrors"][0]["ns"] == "reg.example"
    assert doc["origin"] == {"host": "reg.example", "repository": "team/caches", "tags": True}
    text = run_artifactd(  # --mirror wins over the hosts.toml there
        "mirrors", "reg.example/team/caches", "--mirror", "http://a.local",
        "--hosts-dir", str(tmp_path / "certs.d"),
    )  # fmt: skip
    assert text.returncode == 0, text.stderr
    assert "1. http://a.local/v2/team/caches" in text.stdout
    assert "2. reg.example/team/caches (the registry" in text.stdout
    (tmp_path / "certs.d" / "_default" / "hosts.toml").write_text("[host.\n")
    bad = run_artifactd("mirrors", "reg.example/x", "--hosts-dir", str(tmp_path / "certs.d"))
    assert bad.returncode == 2 and "not valid TOML" in bad.stderr
    assert "Traceback" not in bad.stderr


# --------------------------------------------------------------------------
# Two real registries: the origin and a pull-through cache of it
# --------------------------------------------------------------------------


@dataclass
class Pair:
    origin: RegistryServer
    #: What artifactd asks of the origin passes through here (and is recorded).
    front: FaultProxy
    #: A pull-through cache of the origin (it talks to the origin directly).
    mirror: RegistryServer
    repo: str
    key: Any
    digests: dict[str, str]
    files: dict[str, bytes]

    @property
    def ref(self) -> str:
        return self.front.ref(self.repo)


def _installed(target: Path) -> dict[str, bytes]:
    """Every file restored, the target's own path (rewritten into some) made neutral."""
    return {
        str(p.relative_to(target)): p.read_bytes().replace(str(target).encode(), b"<target>")
        for p in sorted(target.rglob("*"))
        if p.is_file() and ".artifactd" not in p.parts
    }


@pytest.fixture
def pair(tmp_path: Path, local_fp: Fingerprint) -> Iterator[Pair]:
    origin = start_registry(tmp_path / "origin")
    mirror = start_registry(tmp_path / "mirror", proxy=origin.host)
    front = FaultProxy(origin.host)
    try:
        keys = tmp_path / "keys"
        keys.mkdir()
        key = generate(keys / "ci")
        trees = build_caches(tmp_path / "caches")
        with RegistryStore(parse_registry_ref(origin.ref("t/caches"))) as st:
            pushed = harvest(st, local_fp, environ=trees, sign_key=load_private_key(key.private))
        digests = {f.family: f.layer_digest for f in pushed.families if f.layer_digest}
        p = Pair(origin, front, mirror, "t/caches", key, digests, {})
        yield p
    finally:
        front.close()
        mirror.stop()
        origin.stop()


def _restore(
    pair: Pair, target: Path, *extra: str, env: dict[str, str] | None = None, prelude: str = ""
) -> tuple[dict[str, Any], float]:
    start = time.monotonic()
    proc = run_artifactd(
        "restore",
        "--store",
        pair.ref,
        "--target",
        str(target),
        "--verify-key",
        pair.key.public,
        "--require",
        "--json",
        *GPU,
        *extra,
        env=clean_env(env),
        prelude=prelude,
        timeout=300,
    )
    took = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc["cache_hit"] is True, doc
    doc["_events"] = proc.stderr
    return doc, took


def _origin_reads(front: FaultProxy) -> list[str]:
    return [f"{r.method} {r.path}" for r in front.records()]


def test_a_restore_through_the_mirror_moves_every_blob_through_it(
    tmp_path: Path, pair: Pair
) -> None:
    _restore(pair, tmp_path / "t", "--mirror", f"http://{pair.mirror.host}")
    reads = _origin_reads(pair.front)
    # The origin answered tags only: the artifact's and its signature's.
    assert reads, "the origin resolved nothing"
    assert all(re.search(r"/manifests/[^@/]+$", r) and ":" not in r.split("/")[-1] for r in reads)
    assert any("/manifests/fp-" in r for r in reads)
    assert any(r.endswith(".sig") for r in reads)
    assert not pair.front.blob_gets()
    for digest in pair.digests.values():  # the cache fetched and kept every layer
        assert pair.mirror.blob_stored(digest)


@pytest.mark.slow
def test_with_the_origin_stopped_a_pinned_digest_restores_from_the_warm_mirror(
    tmp_path: Path, pair: Pair, local_fp: Fingerprint
) -> None:
    mirror = ("--mirror", f"http://{pair.mirror.host}")
    _restore(pair, tmp_path / "warm", *mirror)
    with RegistryStore(parse_registry_ref(pair.origin.ref(pair.repo))) as st:
        pinned = st.tag_digest(f"fp-{local_fp.hash}")
    assert pinned
    pair.origin.stop()
    proc = run_artifactd(
        "restore",
        "--store",
        f"{pair.ref}@{pinned}",
        "--target",
        str(tmp_path / "cold"),
        "--require",
        "--json",
        *GPU,
        *mirror,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _installed(tmp_path / "cold") == _installed(tmp_path / "warm")
    # Without the pin, the same restore has no way to know the digest: the origin is down.
    unpinned = run_artifactd(
        "restore", "--store", pair.ref, "--target", str(tmp_path / "x"), "--require", *GPU, *mirror
    )
    assert unpinned.returncode == 3, unpinned.stderr


@pytest.mark.slow
def test_with_the_origin_stopped_the_node_stores_verified_digest_repairs_through_the_mirror(
    tmp_path: Path, pair: Pair
) -> None:
    node = tmp_path / "node"
    flags = ("--node-store", f"oci:{node}", "--mirror", f"http://{pair.mirror.host}")
    _restore(pair, tmp_path / "warm", *flags)  # fills the node store, warms the mirror
    digest = pair.digests["triton"]
    blob = node / "blobs" / "sha256" / digest.split(":", 1)[1]
    good = blob.read_bytes()
    damaged = bytearray(good)
    damaged[len(damaged) // 2] ^= 0xFF
    blob.chmod(0o644)
    blob.write_bytes(bytes(damaged))
    pair.origin.stop()
    doc, _ = _restore(pair, tmp_path / "t", *flags)
    assert doc["node_store"]["fetched"], doc["_events"]  # repaired from the mirror, by digest
    assert _installed(tmp_path / "t") == _installed(tmp_path / "warm")
    assert blob.read_bytes() == good


def _wait_for_file(path: Path, limit_s: float = 120.0) -> None:
    """Wait until ``path`` exists (a background writer's commit); fail after ``limit_s``."""
    deadline = time.monotonic() + limit_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


def _metric(text: str, name: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, _, value = line.rpartition(" ")
            out[labels[len(name) :]] = float(value)
    return out


def test_a_blob_tampered_on_the_mirror_is_caught_and_the_origin_serves_it(
    tmp_path: Path, pair: Pair
) -> None:
    mirror_url = f"http://{pair.mirror.host}"
    _restore(pair, tmp_path / "warm", "--mirror", mirror_url)
    digest = pair.digests["triton"]
    algo, hexd = digest.split(":")
    data = pair.mirror.root / "docker/registry/v2/blobs" / algo / hexd[:2] / hexd / "data"
    # The pull-through mirror serves the blob while it stores it, and moves it to this path
    # when it is whole: on a loaded machine that can come after the restore has ended.
    _wait_for_file(data)
    body = bytearray(data.read_bytes())
    body[len(body) // 2] ^= 0xFF  # same length: only a client that hashes notices
    data.write_bytes(bytes(body))
    pair.front.reset_log()
    metrics = tmp_path / "m.prom"
    _restore(pair, tmp_path / "t2", "--mirror", mirror_url, "--metrics-file", str(metrics))
    assert _installed(tmp_path / "t2") == _installed(tmp_path / "warm")
    assert [r.blob_digest for r in pair.front.blob_gets()] == [digest]  # the next source
    failures = _metric(metrics.read_text(), "artifactd_mirror_failures_total")
    assert failures == {f'{{mirror="{mirror_url}",reason="digest"}}': 1.0}


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["down", "drip"])
def test_a_mirror_down_or_dripping_costs_at_most_its_deadline(
    tmp_path: Path, pair: Pair, fault: str
) -> None:
    prelude = "import artifactd.stores.pull as p; p.MIRROR_TIMEOUT = (1.0, 2.0)"
    _restore(pair, tmp_path / "warm", "--mirror", f"http://{pair.mirror.host}")
    if fault == "down":
        url = f"http://127.0.0.1:{free_port()}"  # nothing listens: refused at once
        proxy = None
    else:
        proxy = FaultProxy(pair.mirror.host)
        proxy.drip_blobs(chunk=16, every=0.5)  # far below 64 KiB/s
        url = f"http://{proxy.host}"
    try:
        pair.front.reset_log()
        metrics = tmp_path / "m.prom"
        _, took = _restore(
            pair, tmp_path / "t", "--mirror", url, "--metrics-file", str(metrics), prelude=prelude
        )
    finally:
        if proxy is not None:
            proxy.close()
    assert took < CEILING_S
    assert _installed(tmp_path / "t") == _installed(tmp_path / "warm")
    assert {r.blob_digest for r in pair.front.blob_gets()} >= set(pair.digests.values())
    reasons = {
        k.split('reason="')[1].rstrip('"}')
        for k in _metric(metrics.read_text(), "artifactd_mirror_failures_total")
    }
    assert reasons == ({"unreachable"} if fault == "down" else {"timeout"})


# --------------------------------------------------------------------------
# A recording fake mirror: what a mirror is sent
# --------------------------------------------------------------------------


@pytest.fixture
def authed(
    tmp_path: Path, local_fp: Fingerprint
) -> Iterator[tuple[RegistryServer, RegistryServer, dict[str, str]]]:
    """An origin behind Basic auth, and a plain registry holding the same artifact."""
    origin = start_registry(tmp_path / "origin", user="ci", password="origin-secret")
    backend = start_registry(tmp_path / "backend")
    creds = {
        "ARTIFACTD_REGISTRY_HOST": origin.host,
        "ARTIFACTD_REGISTRY_USERNAME": "ci",
        "ARTIFACTD_REGISTRY_PASSWORD": "origin-secret",
    }
    try:
        trees = build_caches(tmp_path / "caches")
        for store in (
            origin.ref("team/caches"),
            backend.ref("team/caches"),
            backend.ref("elsewhere/caches"),
        ):
            with RegistryStore(parse_registry_ref(store), environ=creds) as st:
                harvest(st, local_fp, environ=trees)
        yield origin, backend, creds
    finally:
        backend.stop()
        origin.stop()


def _restore_env(ref: str, target: Path, env: dict[str, str]) -> dict[str, Any]:
    proc = run_artifactd(
        "restore",
        "--store",
        ref,
        "--target",
        str(target),
        "--require",
        "--json",
        *GPU,
        env=clean_env(env),
    )
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc["cache_hit"] is True
    return doc


def test_hosts_toml_default_with_header_routes_as_configured(
    tmp_path: Path, authed: tuple[RegistryServer, RegistryServer, dict[str, str]]
) -> None:
    origin, backend, creds = authed
    with FaultProxy(backend.host) as fake:
        certs = tmp_path / "certs.d"
        _hosts(
            certs,
            "_default",
            f"""
[host."http://{fake.host}"]
  capabilities = ["pull", "resolve"]
  [host."http://{fake.host}".header]
    X-Dragonfly-Registry = ["http://{origin.host}"]
""",
        )
        _restore_env(
            origin.ref("team/caches"), tmp_path / "t", {**creds, "ARTIFACTD_HOSTS_DIR": str(certs)}
        )
        blobs = fake.blob_gets()
        assert blobs, "the mirror served nothing"
        for rec in fake.records():
            assert rec.path.endswith(f"?ns={origin.host}"), rec.path
            assert rec.headers.get("X-Dragonfly-Registry") == f"http://{origin.host}"
            assert rec.authorization is None  # the origin's password stays with the origin
            assert "/manifests/fp-" not in rec.path  # tags are the origin's


def test_registries_conf_prefix_rewrite_routes_as_configured(
    tmp_path: Path, authed: tuple[RegistryServer, RegistryServer, dict[str, str]]
) -> None:
    origin, backend, creds = authed
    with FaultProxy(backend.host) as fake:
        conf = tmp_path / "registries.conf"
        conf.write_text(
            f"""
[[registry]]
prefix = "{origin.host}/team"
[[registry.mirror]]
location = "{fake.host}/elsewhere"
"""
        )
        env = {
            **creds,
            "ARTIFACTD_REGISTRIES_CONF": str(conf),
            "ARTIFACTD_HOSTS_DIR": str(tmp_path / "none"),
        }
        _restore_env(origin.ref("team/caches"), tmp_path / "t", env)
        blobs = fake.blob_gets()
        assert blobs and all(r.path.startswith("/v2/elsewhere/caches/") for r in fake.records())
        assert all(r.authorization is None and "ns=" not in r.path for r in fake.records())


def test_every_pull_path_goes_through_the_mirror(
    tmp_path: Path, pair: Pair, local_fp: Fingerprint
) -> None:
    """restore, prefetch (the node store's fill), --software-from, copy's source,
    image append's base: each reads content by digest through the mirror only."""
    env = {"ARTIFACTD_MIRRORS": f"http://{pair.mirror.host}"}
    tag = f"{pair.ref}:fp-{local_fp.hash}"
    runs = {
        "restore": ("restore", "--store", pair.ref, "--target", str(tmp_path / "t"), *GPU),
        "prefetch": (
            "prefetch",
            "--store",
            pair.ref,
            "--node-store",
            f"oci:{tmp_path / 'node'}",
            *GPU,
        ),
        "software-from": (
            "restore",
            "--store",
            f"oci:{tmp_path / 'empty'}",
            "--software-from",
            tag,
            "--target",
            str(tmp_path / "t2"),
            *GPU,
        ),
        "copy": ("copy", pair.ref, f"oci:{tmp_path / 'copy'}"),
    }
    if shutil.which("skopeo") is not None:  # the base image is pushed with skopeo
        base = f"{pair.origin.host}/base:1"
        subprocess.run(
            ["skopeo", "copy", "--format", "oci", "--dest-tls-verify=false",
             f"oci:{make_base(tmp_path / 'base')}:base", f"docker://{base}"],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        runs["image append"] = (
            "image", "append", "--base", f"{pair.front.host}/base:1", "--artifact", tag,
            "--to", f"{pair.front.host}/out:1",
        )  # fmt: skip
    for name, args in runs.items():
        pair.front.reset_log()
        proc = run_artifactd(*args, env=clean_env(env), timeout=300)
        assert proc.returncode == 0, (name, proc.stderr)
        assert not pair.front.blob_gets(), name
        assert not [
            r
            for r in pair.front.records()
            if "@sha256:" in r.path or "/manifests/sha256:" in r.path
        ], name


def test_a_pin_stands_in_for_a_registry_that_is_down_never_for_one_that_refuses(
    tmp_path: Path, auth_registry: RegistryServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transport, "BACKOFF_S", 0.01)  # the down registry's retries, quickly
    pin = {"fp-x": "sha256:" + "a" * 64}
    refusing = RegistryStore(parse_registry_ref(auth_registry.ref("t/pins")), environ={}, pins=pin)
    with refusing, pytest.raises(StoreError, match="requires authentication"):
        refusing.tag_digest("fp-x")  # an answer: a pin never overrides the registry's word
    down = f"127.0.0.1:{free_port()}/t/pins"
    with RegistryStore(parse_registry_ref(down), environ={}, pins=pin) as st:
        assert st.tag_digest("fp-x") == pin["fp-x"]
        assert st.tag_digest("fp-other") is None  # with pins, an unpinned tag is absent
