"""The registry backend against a real CNCF distribution registry (Debian's docker-registry).

Interoperability is checked with skopeo, an independent OCI client; incremental
push is checked in the registry's own storage, not only through our counters.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
import requests
import zstandard
from cachetrees import build_caches, make_generic_tree
from conftest import clean_env, run_artifactd
from registry_server import RegistryServer, start_registry

from artifactd import hashing
from artifactd.build.harvest import harvest
from artifactd.errors import ArtifactdError, IntegrityError, StoreError, UsageError
from artifactd.fingerprint.model import Fingerprint
from artifactd.format import unpack
from artifactd.restore.destination import MARKER_NAME, STATE_DIR, CacheVolume
from artifactd.restore.install import restore
from artifactd.restore.resolve import noop_plan, plan_restore
from artifactd.restore.source import StoreSource
from artifactd.stores import open_store, parse_artifact_ref
from artifactd.stores.base import progress_events
from artifactd.stores.registry import (
    Credentials,
    RegistryStore,
    find_credentials,
    is_loopback,
    parse_registry_ref,
)
from artifactd.trust.policy import UNSAFE_NO_VERIFICATION


@pytest.fixture
def trees(tmp_path: Path) -> dict[str, str]:
    return build_caches(tmp_path / "b")


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_artifactd(*args, env=env)


def cli_json(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    proc = cli(*args, "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return doc


class CountingStore(RegistryStore):
    """Records every request path: evidence that resolving is tag lookups, not a scan."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requests: list[tuple[str, str]] = []

    def _send(self, method: str, url: str, **kwargs: Any) -> Any:
        self.requests.append((method, url.split("/v2/", 1)[1]))
        return super()._send(method, url, **kwargs)


def counting(ref: str) -> CountingStore:
    parsed = parse_registry_ref(ref)
    return CountingStore(parsed)


# --------------------------------------------------------------------------
# References, loopback, credentials (pure)
# --------------------------------------------------------------------------


def test_reference_parsing() -> None:
    r = parse_registry_ref("127.0.0.1:5000/team/caches:fp-abc")
    assert (r.host, r.repo, r.reference) == ("127.0.0.1:5000", "team/caches", "fp-abc")
    r = parse_registry_ref("docker://registry.example.com/c@sha256:" + "a" * 64)
    assert (r.host, r.repo, r.reference) == ("registry.example.com", "c", "sha256:" + "a" * 64)
    assert parse_registry_ref("localhost/c").reference is None
    for bad in ("caches", "host.io/UPPER", "host.io/c:bad tag", "https://host.io/c"):
        with pytest.raises(UsageError):
            parse_registry_ref(bad)
    assert parse_artifact_ref("127.0.0.1:5000/c:fp-1").store == "127.0.0.1:5000/c"
    with pytest.raises(UsageError, match="names an artifact"):
        open_store("127.0.0.1:5000/c:fp-1")


def test_plain_http_only_for_loopback() -> None:
    assert is_loopback("127.0.0.1:5000") and is_loopback("127.8.9.10") and is_loopback("[::1]:80")
    assert is_loopback("localhost:5000")
    assert not is_loopback("10.0.0.1:5000") and not is_loopback("registry.example.com")
    assert RegistryStore(parse_registry_ref("127.0.0.1:5000/c")).base.startswith("http://")
    remote = RegistryStore(parse_registry_ref("registry.example.com/c"), environ={})
    assert remote.base.startswith("https://")
    insecure = RegistryStore(
        parse_registry_ref("registry.example.com/c"), insecure=True, environ={}
    )
    assert insecure.base.startswith("http://")


def test_credentials_from_env_then_docker_config(tmp_path: Path) -> None:
    cfg = tmp_path / "docker"
    cfg.mkdir()
    auth = base64.b64encode(b"alice:pw-from-config").decode()
    (cfg / "config.json").write_text(json.dumps({"auths": {"reg.io:5000": {"auth": auth}}}))
    env = {"DOCKER_CONFIG": str(cfg)}
    assert find_credentials("reg.io:5000", env) == Credentials("alice", "pw-from-config")
    assert find_credentials("other.io", env) is None
    env.update(ARTIFACTD_REGISTRY_USERNAME="bob", ARTIFACTD_REGISTRY_PASSWORD="pw-env")
    creds = find_credentials("reg.io:5000", env)
    assert creds == Credentials("bob", "pw-env")
    assert "pw-env" not in repr(creds)


def test_credentials_from_a_credential_helper(tmp_path: Path) -> None:
    """A real docker-credential-* helper program on PATH, as Docker runs it."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    helper = bindir / "docker-credential-fake"
    helper.write_text(
        '#!/bin/sh\nread host\nprintf \'{"Username":"u-%s","Secret":"from-helper"}\' "$host"\n'
    )
    helper.chmod(0o755)
    cfg = tmp_path / "docker"
    cfg.mkdir()
    (cfg / "config.json").write_text(json.dumps({"credHelpers": {"reg.io": "fake"}}))
    old = os.environ["PATH"]
    os.environ["PATH"] = f"{bindir}:{old}"
    try:
        creds = find_credentials("reg.io", {"DOCKER_CONFIG": str(cfg)})
    finally:
        os.environ["PATH"] = old
    assert creds == Credentials("u-reg.io", "from-helper")


# --------------------------------------------------------------------------
# Push, resolve, restore against the real registry
# --------------------------------------------------------------------------


def test_push_restore_round_trip_and_resolution_cost(
    tmp_path: Path,
    registry: RegistryServer,
    repo: str,
    trees: dict[str, str],
    local_fp: Fingerprint,
) -> None:
    ref = registry.ref(repo)
    with open_store(ref) as st:
        pushed = harvest(st, local_fp, environ=trees)
    assert pushed.bytes_uploaded > 0
    for fam in pushed.families:
        assert fam.layer_digest and registry.blob_stored(fam.layer_digest)

    st = counting(ref)
    target = tmp_path / "target"
    plan = plan_restore(StoreSource(st), local_fp, target, trust=UNSAFE_NO_VERIFICATION)
    assert plan.match == "full"
    # Resolution: the full tag's manifest and its config blob; no tag listing.
    assert len(st.requests) <= 3, st.requests
    assert not any("tags/list" in path for _, path in st.requests)
    done = restore(plan, StoreSource(st))
    assert sorted(done.restored) == ["generic", "triton"]
    group = next((target / "triton").glob("*/__grp__*.json"))
    assert str(target / "triton") in group.read_text()

    st.requests.clear()
    again = noop_plan(StoreSource(st), local_fp.hash, local_fp.flatten(), CacheVolume(target))
    assert again is not None and again.noop
    assert all(method == "HEAD" for method, _ in st.requests), st.requests


_REAL_SHA256 = hashlib.sha256


class _CountedSha256:
    """hashlib.sha256, remembered: every hash object a restore makes, to count passes over bytes."""

    made: ClassVar[list[_CountedSha256]] = []

    def __init__(self, data: bytes = b"", **kwargs: Any) -> None:
        self._h = _REAL_SHA256(data, **kwargs)
        self.made.append(self)

    def update(self, data: Any) -> None:
        self._h.update(data)

    def hexdigest(self) -> str:
        return self._h.hexdigest()

    def digest(self) -> bytes:
        return self._h.digest()


def test_a_registry_restore_hashes_each_layer_blob_once(
    tmp_path: Path,
    registry: RegistryServer,
    repo: str,
    trees: dict[str, str],
    local_fp: Fingerprint,
    *,
    batch_writer: str,
) -> None:
    """The compressed bytes are hashed where they arrive (the pull's verifier), not again.

    Each file's sha256 is checked by hashlib, or by the C batch writer it is handed to.
    """
    ref = registry.ref(repo)
    with open_store(ref) as st:
        harvest(st, local_fp, environ=trees)
    with open_store(ref) as st:
        plan = plan_restore(StoreSource(st), local_fp, tmp_path / "t", trust=UNSAFE_NO_VERIFICATION)
        layers = {fp.family: fp.layer for fp in plan.hits if fp.layer is not None}
        assert set(layers) == {"triton", "generic"}
        checked_natively: list[str] = []
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(_CountedSha256, "made", [])
            mp.setattr(hashlib, "sha256", _CountedSha256)
            # Small layers hash with CPython's own sha256 (hashing.sha256_for): count those too.
            mp.setattr(hashing, "_small_sha256", _CountedSha256)
            native = unpack._write_natively
            if native is not None:

                def write_batch(items: list[Any], umask: int) -> int:
                    checked_natively.extend(item[3] for item in items if item[3] is not None)
                    assert native is not None
                    return native(items, umask)

                mp.setattr(unpack, "_write_natively", write_batch)
            restore(plan, StoreSource(st))
            made = list(_CountedSha256.made)
    digests = [h.hexdigest() for h in made]
    assert bool(checked_natively) is (batch_writer == "c")
    for family, layer in layers.items():
        assert digests.count(layer.digest.split(":", 1)[1]) == 1, family
        # Every file's sha256 against the record is still checked.
        for entry in layer.files:
            if entry.link is None:
                assert entry.sha256 in digests + checked_natively, entry.path


def _same_size_other_bytes(blob: bytes) -> bytes:
    """The layer's tar, compressed otherwise and padded to the blob's size with a skippable frame.

    Every file and the tar decode exactly as before; only the blob's digest tells.
    """
    tar = zstandard.ZstdDecompressor().stream_reader(blob).read()
    other = min((zstandard.ZstdCompressor(level=n).compress(tar) for n in (1, 19)), key=len)
    pad = len(blob) - len(other) - 8
    assert pad >= 0 and other != blob, "another level should compress the text layer smaller"
    # A skippable frame: magic 0x184D2A50, the payload's length, the payload.
    return other + (0x184D2A50).to_bytes(4, "little") + pad.to_bytes(4, "little") + bytes(pad)


def test_a_blob_that_does_not_match_its_digest_installs_nothing(
    tmp_path: Path,
    registry: RegistryServer,
    repo: str,
    trees: dict[str, str],
    local_fp: Fingerprint,
) -> None:
    """Same size, same files, another digest: refused at the blob's end, before any install."""
    ref = registry.ref(repo)
    with open_store(ref) as st:
        pushed = harvest(st, local_fp, environ=trees)
    layer = next(f for f in pushed.families if f.family == "triton")  # text: compressible
    assert layer.layer_digest is not None
    algo, hexd = layer.layer_digest.split(":")
    data = registry.root / "docker/registry/v2/blobs" / algo / hexd[:2] / hexd / "data"
    original = data.read_bytes()
    data.write_bytes(_same_size_other_bytes(original))
    target = tmp_path / "t"
    try:
        with open_store(ref) as st:
            plan = plan_restore(StoreSource(st), local_fp, target, trust=UNSAFE_NO_VERIFICATION)
            with pytest.raises(IntegrityError, match="does not match its digest"):
                restore(plan, StoreSource(st))
    finally:
        data.write_bytes(original)
    assert not (target / "generic").exists() and not (target / "triton").exists()
    assert not (target / STATE_DIR / MARKER_NAME).exists()


def test_incremental_push_uploads_only_what_changed(
    registry: RegistryServer, repo: str, trees: dict[str, str], local_fp: Fingerprint
) -> None:
    ref = registry.ref(repo)
    with open_store(ref) as st:
        first = harvest(st, local_fp, environ=trees)
        second = harvest(st, local_fp, environ=trees)
    assert second.bytes_uploaded == 0
    assert second.bytes_skipped == first.bytes_uploaded + first.bytes_skipped

    (Path(trees["ARTIFACTD_GENERIC_DIR"]) / "new.cubin").write_bytes(os.urandom(4096))
    with open_store(ref) as st:
        third = harvest(st, local_fp, environ=trees)
    layers = {f.family: f for f in third.families}
    old_layers = {f.family: f for f in first.families}
    assert layers["triton"].layer_digest == old_layers["triton"].layer_digest
    assert layers["generic"].layer_digest != old_layers["generic"].layer_digest
    assert third.publish is not None
    uploaded = set(third.publish.blobs_uploaded)
    assert layers["generic"].layer_digest in uploaded
    assert old_layers["triton"].layer_digest not in uploaded
    # Only the new layer and small configs went over the wire.
    assert third.bytes_uploaded < layers["generic"].layer_size + 64 * 1024
    assert all(registry.blob_stored(d) for d in uploaded)


def test_partial_restore_by_family_tags(
    tmp_path: Path,
    registry: RegistryServer,
    repo: str,
    trees: dict[str, str],
    local_fp: Fingerprint,
) -> None:
    ref = registry.ref(repo)
    built = local_fp.model_copy(update={"workload": {"model": "llama", "tp": "8"}})
    with open_store(ref) as st:
        harvest(st, built, environ=trees)
    pod = local_fp.model_copy(update={"workload": {"model": "qwen", "tp": "2"}})
    st = counting(ref)
    plan = plan_restore(
        StoreSource(st),
        pod,
        tmp_path / "t",
        families=["triton", "generic"],
        trust=UNSAFE_NO_VERIFICATION,
    )
    assert plan.match == "partial"
    assert {f.family for f in plan.hits} == {"triton", "generic"}
    assert not any("tags/list" in path for _, path in st.requests)
    restore(plan, StoreSource(st))
    assert (tmp_path / "t" / "generic" / "axpy.sm_90a.cubin").is_file()


def test_skopeo_reads_pushed_artifacts_and_its_copy_restores(
    tmp_path: Path,
    registry: RegistryServer,
    repo: str,
    trees: dict[str, str],
    local_fp: Fingerprint,
) -> None:
    ref = registry.ref(repo)
    with open_store(ref) as st:
        pushed = harvest(st, local_fp, environ=trees)
    tag = pushed.tags[0]
    inspect = subprocess.run(
        ["skopeo", "inspect", "--tls-verify=false", f"docker://{ref}:{tag}"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert inspect.returncode == 0, inspect.stderr
    assert json.loads(inspect.stdout)["Digest"] == pushed.digest
    raw = subprocess.run(
        ["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{ref}:{tag}"],
        capture_output=True,
        check=True,
    )
    doc = json.loads(raw.stdout)
    assert doc["artifactType"] == "application/vnd.artifactd.cache.v1"

    layout = tmp_path / "copied"
    copy = subprocess.run(
        [
            "skopeo",
            "--insecure-policy",
            "copy",
            "--src-tls-verify=false",
            f"docker://{ref}:{tag}",
            f"oci:{layout}:{tag}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert copy.returncode == 0, copy.stderr
    with open_store(f"oci:{layout}") as st:
        plan = plan_restore(StoreSource(st), local_fp, tmp_path / "t", trust=UNSAFE_NO_VERIFICATION)
        assert plan.match == "full"
        assert sorted(restore(plan, StoreSource(st)).restored) == ["generic", "triton"]


def test_copy_between_layout_and_registry(
    tmp_path: Path,
    registry: RegistryServer,
    repo: str,
    trees: dict[str, str],
    local_fp: Fingerprint,
) -> None:
    layout = f"oci:{tmp_path / 'local'}"
    with open_store(layout, create=True) as st:
        pushed = harvest(st, local_fp, environ=trees)
    up = cli_json("copy", layout, registry.ref(repo))
    assert sorted(up["tags"]) == sorted(pushed.tags)
    assert up["bytes_uploaded"] > 0
    again = cli_json("copy", layout, registry.ref(repo))
    assert again["bytes_uploaded"] == 0 and again["bytes_skipped"] > 0
    down = cli_json("copy", registry.ref(repo), f"oci:{tmp_path / 'back'}")
    assert down["manifests"] == len(pushed.tags)
    listing = cli_json("ls", registry.ref(repo))
    assert set(listing["tags"]) == set(pushed.tags)
    shown = cli_json("inspect", f"{registry.ref(repo)}:{pushed.tags[0]}")
    assert shown["digest"] == pushed.digest


# --------------------------------------------------------------------------
# Authentication
# --------------------------------------------------------------------------


def test_basic_auth_accepts_credentials_and_rejects_a_wrong_password(
    tmp_path: Path, auth_registry: RegistryServer, repo: str, trees: dict[str, str]
) -> None:
    ref = auth_registry.ref(repo)
    good = clean_env(
        {**trees, "ARTIFACTD_REGISTRY_USERNAME": "ci", "ARTIFACTD_REGISTRY_PASSWORD": "s3cret-pw"}
    )
    pushed = cli_json("harvest", "--store", ref, env=good)
    assert pushed["bytes_uploaded"] > 0

    # The Docker config works as well as the env vars.
    cfg = tmp_path / "docker"
    cfg.mkdir()
    auth = base64.b64encode(b"ci:s3cret-pw").decode()
    (cfg / "config.json").write_text(json.dumps({"auths": {auth_registry.host: {"auth": auth}}}))
    restored = cli_json(
        "restore",
        "--store",
        ref,
        "--target",
        str(tmp_path / "t"),
        env=clean_env({**trees, "DOCKER_CONFIG": str(cfg)}),
    )
    assert restored["cache_hit"] and restored["match"] == "full"

    bad = clean_env(
        {
            **trees,
            "ARTIFACTD_REGISTRY_USERNAME": "ci",
            "ARTIFACTD_REGISTRY_PASSWORD": "wrong-pw-123",
        }
    )
    proc = cli("harvest", "--store", ref, env=bad)
    assert proc.returncode == 3
    assert "rejected the credentials" in proc.stderr
    assert "wrong-pw-123" not in proc.stderr + proc.stdout
    anonymous = cli("ls", ref, env=clean_env({"HOME": str(tmp_path / "nohome")}))
    assert anonymous.returncode == 3
    assert "requires authentication" in anonymous.stderr


class _TokenStub(BaseHTTPRequestHandler):
    """A registry that challenges for a Bearer token, and a token service that answers badly."""

    challenge = ""
    token_body = b""

    def do_GET(self) -> None:
        if self.path.startswith("/token"):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(self.token_body)))
            self.end_headers()
            self.wfile.write(self.token_body)
            return
        self.send_response(401)
        self.send_header("Www-Authenticate", self.challenge)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        del format, args


@pytest.fixture
def token_stub() -> Iterator[tuple[ThreadingHTTPServer, type[_TokenStub]]]:
    handler = type("Handler", (_TokenStub,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server, handler
    finally:
        server.shutdown()
        server.server_close()


_BEARER = 'Bearer realm="http://127.0.0.1:{port}/token",service="stub",scope="repository:c:pull"'


@pytest.mark.parametrize(
    ("challenge", "token_body", "message"),
    [
        (_BEARER, b"<html>not json</html>", "token service answered with no token document"),
        (_BEARER, b'["a list, not an object"]', "token service answered with no token document"),
        ('Bearer service="stub"', b"", "the registry requires authentication"),
    ],
    ids=["not-json", "not-an-object", "no-realm"],
)
def test_a_token_service_that_answers_badly_is_a_store_error(
    token_stub: tuple[ThreadingHTTPServer, type[_TokenStub]],
    tmp_path: Path,
    challenge: str,
    token_body: bytes,
    message: str,
) -> None:
    server, handler = token_stub
    handler.challenge = challenge.format(port=server.server_port)
    handler.token_body = token_body
    ref = parse_registry_ref(f"127.0.0.1:{server.server_port}/c")
    with (
        RegistryStore(ref, environ={"HOME": str(tmp_path)}) as st,
        pytest.raises(StoreError, match=message),
    ):
        st.list_tags()


def test_close_closes_the_session_of_every_thread(
    registry: RegistryServer, repo: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Restore fetches on a pool: closing from the main thread must close the workers' sessions."""
    closed: set[int] = set()
    real_close = requests.Session.close

    def close(session: requests.Session) -> None:
        closed.add(id(session))
        real_close(session)

    monkeypatch.setattr(requests.Session, "close", close)
    store = RegistryStore(parse_registry_ref(registry.ref(repo)))
    together = threading.Barrier(4)

    def lookup(_: int) -> list[str]:
        together.wait(timeout=10)  # four live threads at once: four sessions
        return store.list_tags()

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(lookup, range(4))) == [[]] * 4
    store.close()
    assert len(closed) == 4
    assert store.list_tags() == []  # a closed store opens a new session when used again
    store.close()
    assert len(closed) == 5


def test_progress_events_are_throttled_but_start_and_end(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([100.0, 100.1, 100.2, 100.3, 100.4, 100.45])
    monkeypatch.setattr("artifactd.stores.base.time.monotonic", lambda: next(clock))
    events: list[dict[str, Any]] = []
    report = progress_events(events.append, stage="push", family="triton", total=50)
    for done in (10, 20, 30, 40, 45, 50):
        report(done)
    # 10: first; 20, 30: within 0.25 s of it; 40: 0.3 s later; 45: too soon; 50: the end.
    assert [e["bytes"] for e in events] == [10, 40, 50]
    assert events[-1] == {
        "stage": "push",
        "event": "progress",
        "family": "triton",
        "bytes": 50,
        "total": 50,
    }


# --------------------------------------------------------------------------
# Faults
# --------------------------------------------------------------------------


def test_stopped_registry_is_a_clean_miss(tmp_path: Path) -> None:
    server = start_registry(tmp_path / "reg")
    ref = server.ref("c")
    server.stop()
    target = tmp_path / "t"
    proc = cli("restore", "--store", ref, "--target", str(target), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["cache_hit"] is False and doc["match"] == "miss"
    assert "cannot reach registry" in doc["error"]
    assert not target.exists()
    assert doc["failure"]["kind"] == "unreachable" and doc["failure"]["exit_code"] == 3
    required = cli("restore", "--store", ref, "--target", str(target), "--require")
    assert required.returncode == 3  # unreachable, documented; 6 is for a real miss
    assert "cannot reach registry" in required.stderr
    assert "Traceback" not in required.stderr


def test_registry_killed_mid_pull_leaves_the_target_untouched(
    tmp_path: Path, local_fp: Fingerprint
) -> None:
    server = start_registry(tmp_path / "reg")
    ref = server.ref("c")
    big = make_generic_tree(tmp_path / "gen")
    (big / "big.so").write_bytes(os.urandom(48 << 20))  # incompressible: many socket buffers
    env = {
        "ARTIFACTD_GENERIC_DIR": str(big),
        "HOME": str(tmp_path / "h"),
        "TMPDIR": str(tmp_path / "tmp"),
    }
    old = make_generic_tree(tmp_path / "old")
    try:
        with open_store(ref) as st:
            harvest(
                st,
                local_fp,
                environ={**env, "ARTIFACTD_GENERIC_DIR": str(old)},
                families=["generic"],
            )
            target = tmp_path / "target"
            restore(
                plan_restore(
                    StoreSource(st),
                    local_fp,
                    target,
                    families=["generic"],
                    trust=UNSAFE_NO_VERIFICATION,
                ),
                StoreSource(st),
            )
            before = {p: p.read_bytes() for p in (target / "generic").rglob("*") if p.is_file()}
            newer = local_fp.model_copy(update={"workload": {"model": "newer"}})
            harvest(st, newer, environ=env, families=["generic"])

        class KillOnFirstRead(RegistryStore):
            # Every blob read goes through consume_blob (the pull transport's one entry).
            def consume_blob(self, digest: str, size: int, consume: Any) -> Any:
                def killing(reader: Any) -> Any:
                    first = reader.read(1 << 16)
                    server.kill()
                    return consume(_Prefixed(first, reader))

                return super().consume_blob(digest, size, killing)

        st2 = KillOnFirstRead(parse_registry_ref(ref))
        plan = plan_restore(
            StoreSource(st2), newer, target, families=["generic"], trust=UNSAFE_NO_VERIFICATION
        )
        assert plan.match == "full"
        with pytest.raises(ArtifactdError) as err:
            restore(plan, StoreSource(st2))
        assert isinstance(err.value, StoreError) or "layer" in err.value.message
        after = {p: p.read_bytes() for p in (target / "generic").rglob("*") if p.is_file()}
        assert after == before
        assert sorted(p.name for p in (target / STATE_DIR).iterdir() if p.name != "lock") == [
            "restored.json"
        ]
    finally:
        server.stop()
        shutil.rmtree(tmp_path / "reg", ignore_errors=True)


class _Prefixed:
    """A reader that first returns bytes already read, then the rest of the stream."""

    def __init__(self, head: bytes, rest: Any) -> None:
        self._head = head
        self._rest = rest

    def read(self, n: int = -1) -> bytes:
        if self._head:
            out, self._head = self._head[:n] if n > 0 else self._head, b""
            if n > 0 and len(out) < n:
                out += self._rest.read(n - len(out))
            return out
        return bytes(self._rest.read(n))


def test_push_reports_progress_events(
    registry: RegistryServer, repo: str, tmp_path: Path, local_fp: Fingerprint
) -> None:
    big = make_generic_tree(tmp_path / "gen")
    (big / "big.so").write_bytes(os.urandom(8 << 20))
    events: list[dict[str, Any]] = []
    with open_store(registry.ref(repo)) as st:
        res = harvest(
            st,
            local_fp,
            families=["generic"],
            on_event=events.append,
            environ={"ARTIFACTD_GENERIC_DIR": str(big), "HOME": str(tmp_path)},
        )
    layer = res.families[0]
    progress = [e for e in events if e["event"] == "progress"]
    assert progress and progress[-1]["bytes"] == progress[-1]["total"] == layer.layer_size
    assert [e["bytes"] for e in progress] == sorted(e["bytes"] for e in progress)
    assert {
        "stage": "push",
        "event": "done",
        "family": "generic",
        "bytes": layer.layer_size,
    } in events


def test_registry_down_after_a_restore_keeps_the_installed_caches(
    tmp_path: Path, trees: dict[str, str], local_fp: Fingerprint
) -> None:
    """A restarted pod whose volume is warm but whose registry is gone: a clean miss."""
    server = start_registry(tmp_path / "reg")
    ref = server.ref("c")
    target = tmp_path / "t"
    try:
        with open_store(ref) as st:
            harvest(st, local_fp, environ=trees)
        env = clean_env(trees)
        first = cli(
            "restore",
            "--store",
            ref,
            "--target",
            str(target),
            "--gpu-arch",
            "sm_90a",
            "--json",
            env=env,
        )
        assert json.loads(first.stdout)["cache_hit"] is True, first.stderr
    finally:
        server.stop()
    before = (target / "artifactd.env").read_text()
    proc = cli(
        "restore",
        "--store",
        ref,
        "--target",
        str(target),
        "--gpu-arch",
        "sm_90a",
        "--json",
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["match"] == "miss" and "cannot reach registry" in doc["error"]
    assert (target / "artifactd.env").read_text() == before
    assert list((target / "triton").glob("*/__grp__*.json"))
