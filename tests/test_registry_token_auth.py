"""Bearer-token auth against a real distribution registry (``auth: token:``).

The registry trusts only JWTs from tests/token_server.py (x5c chain checked
against its rootcertbundle), so a successful push proves the whole handshake:
401 challenge -> token fetched with Basic credentials for the challenged scope
-> request retried with ``Authorization: Bearer``. The token server's records
show which scopes were asked for and granted.
"""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from cachetrees import build_caches
from conftest import clean_env, run_artifactd
from registry_server import RegistryServer
from token_server import SERVICE, TokenServer, running_token_registry

USER = "ci-token"
PASSWORD = "t0ken-s3cret-pw"
WRONG = "wrong-t0ken-pw-987"


@pytest.fixture(scope="module")
def token_registry(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[TokenServer, RegistryServer]]:
    with running_token_registry(
        tmp_path_factory.mktemp("token-registry"), user=USER, password=PASSWORD
    ) as pair:
        yield pair


def env_for(tmp_path: Path, name: str, **extra: str) -> dict[str, str]:
    """Synthetic cache trees, HOME and TMPDIR of their own, plus ``extra``."""
    return clean_env(build_caches(tmp_path / name, **extra))


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_artifactd(*args, env=env, timeout=60)


def cli_json(*args: str, env: dict[str, str]) -> dict[str, Any]:
    proc = cli(*args, "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    assert PASSWORD not in proc.stdout + proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return doc


def creds(password: str = PASSWORD) -> dict[str, str]:
    return {"ARTIFACTD_REGISTRY_USERNAME": USER, "ARTIFACTD_REGISTRY_PASSWORD": password}


def test_registry_accepts_only_bearer_tokens(
    token_registry: tuple[TokenServer, RegistryServer],
) -> None:
    """The setup itself: Basic is refused with a Bearer challenge; a minted token is accepted."""
    tokens, registry = token_registry
    url = f"http://{registry.host}/v2/t/probe/tags/list"
    basic = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    refused = requests.get(url, headers={"Authorization": f"Basic {basic}"}, timeout=5)
    assert refused.status_code == 401
    challenge = refused.headers["Www-Authenticate"]
    assert challenge.startswith("Bearer ")
    assert f'realm="{tokens.realm}"' in challenge and f'service="{SERVICE}"' in challenge
    assert 'scope="repository:t/probe:pull"' in challenge

    access: list[dict[str, object]] = [
        {"type": "repository", "name": "t/probe", "actions": ["pull"]}
    ]
    token = tokens.issue(USER, SERVICE, access)
    missing = requests.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=5)
    assert missing.status_code == 404  # authorised; the repository just does not exist
    assert missing.json()["errors"][0]["code"] == "NAME_UNKNOWN"


def test_harvest_restore_ls_through_bearer_tokens(
    tmp_path: Path, token_registry: tuple[TokenServer, RegistryServer]
) -> None:
    tokens, registry = token_registry
    ref = registry.ref("t/bearer")
    before = len(tokens.recorded())

    pushed = cli_json("harvest", "--store", ref, env=env_for(tmp_path, "push", **creds()))
    assert pushed["bytes_uploaded"] > 0
    fp_tags = [t for t in pushed["tags"] if t.startswith("fp-")]
    assert fp_tags, pushed["tags"]

    # The Bearer path ran: tokens were fetched with the user's credentials for
    # the push scope the registry challenged with, and granted it.
    pushing = tokens.recorded()[before:]
    assert pushing, "no token was requested"
    assert all(r.sent_credentials and r.user == USER for r in pushing), pushing
    assert all(r.status == 200 and r.service == SERVICE for r in pushing), pushing
    push_requests = [r for r in pushing if tokens.asked(r, "t/bearer") == {"pull", "push"}]
    assert push_requests, pushing
    assert all(tokens.granted(r, "t/bearer") == {"pull", "push"} for r in push_requests)
    # Harvest is sequential: the push token is fetched once, then reused.
    assert len(push_requests) == 1, pushing

    middle = len(tokens.recorded())
    target = tmp_path / "target"
    restored = cli_json(
        "restore",
        "--store",
        ref,
        "--target",
        str(target),
        env=env_for(tmp_path, "pull", **creds()),
    )
    assert restored["cache_hit"] is True and restored["match"] == "full"
    assert any(target.rglob("*.cubin"))
    pulling = tokens.recorded()[middle:]
    assert pulling and all(r.status == 200 and r.user == USER for r in pulling), pulling
    assert all(tokens.asked(r, "t/bearer") == {"pull"} for r in pulling), pulling
    assert all(tokens.granted(r, "t/bearer") == {"pull"} for r in pulling), pulling

    listing = cli_json("ls", ref, env=env_for(tmp_path, "ls", **creds()))
    assert set(fp_tags) <= set(listing["tags"])


def test_wrong_password_and_anonymous_are_refused(
    tmp_path: Path, token_registry: tuple[TokenServer, RegistryServer]
) -> None:
    tokens, registry = token_registry
    ref = registry.ref("t/bearer-denied")

    before = len(tokens.recorded())
    proc = cli("harvest", "--store", ref, env=env_for(tmp_path, "bad", **creds(WRONG)))
    assert proc.returncode == 3, proc.stderr
    assert "rejected the credentials" in proc.stderr and repr(USER) in proc.stderr
    assert WRONG not in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    refused = tokens.recorded()[before:]
    assert refused and all(r.sent_credentials and r.status == 401 for r in refused), refused

    # Anonymous: the token server hands out a token that grants nothing; the
    # registry still refuses, and the message says to log in.
    before = len(tokens.recorded())
    anonymous = cli("ls", ref, env=env_for(tmp_path, "anon"))
    assert anonymous.returncode == 3, anonymous.stderr
    assert "requires authentication" in anonymous.stderr
    asked = tokens.recorded()[before:]
    assert asked and all(not r.sent_credentials for r in asked), asked
    assert all(r.status == 200 and r.access == [] for r in asked), asked


def _private_ca(tmp: Path) -> tuple[Path, Path, Path]:
    """A CA of its own and a server certificate for 127.0.0.1 it signed: (ca, cert, key)."""
    ca_key, ca, key, csr, cert = (
        tmp / n for n in ("ca.key", "ca.pem", "srv.key", "srv.csr", "srv.pem")
    )
    ext = tmp / "srv.ext"
    ext.write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n"
        "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1\n"
    )
    for argv in (
        ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", ca_key, "-out", ca, "-days", "2", "-subj", "/CN=artifactd test CA"],
        ["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1"],
        ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
         "-out", cert, "-days", "2", "-extfile", ext],
    ):  # fmt: skip
        subprocess.run(["openssl", *map(str, argv)], check=True, capture_output=True)
    return ca, cert, key


@pytest.mark.parametrize("bundle_env", [False, True], ids=["plain", "REQUESTS_CA_BUNDLE"])
def test_a_registry_behind_a_private_ca_is_asked_with_its_own_ca_token_realm_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bundle_env: bool
) -> None:
    # A mirror configured with its own CA (hosts.toml ``ca``) whose Bearer realm is on
    # the same host: every request, the token request too, trusts that CA, whatever
    # CA bundle the pod's environment names. (Two defects: oras-py's handshake asked
    # the realm with ``verify=True``, the system's CAs; and requests lets
    # REQUESTS_CA_BUNDLE override a session's own bundle, so the mirror's CA was
    # ignored wherever the environment set one, as many images do.)
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    if bundle_env:
        # The system's bundle (a real one, without the test's CA), as images set it.
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", ssl.get_default_verify_paths().openssl_cafile)
    import threading  # noqa: PLC0415
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer  # noqa: PLC0415

    from artifactd.stores.transport import Transport  # noqa: PLC0415

    ca, cert, key = _private_ca(tmp_path)
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            headers: dict[str, str] = {}
            if self.path.startswith("/token?"):
                status, body = 200, b'{"token": "t0k"}'
            elif self.headers.get("Authorization") == "Bearer t0k":
                status, body = 200, b"blob bytes"
            else:
                realm = f"https://{self.headers['Host']}/token"
                challenge = f'Bearer realm="{realm}",service="s",scope="repository:r:pull"'
                status, body = 401, b"{}"
                headers["WWW-Authenticate"] = challenge
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    host = f"127.0.0.1:{server.server_address[1]}"
    transport = Transport(host, plain_http=False, credentials=None, name=host, verify=str(ca))
    try:
        resp = transport.send("GET", f"https://{host}/v2/r/blobs/b", what="blob")
        assert resp.content == b"blob bytes"
        assert [p.split("?")[0] for p in asked] == ["/v2/r/blobs/b", "/token", "/v2/r/blobs/b"]
    finally:
        transport.close()
        server.shutdown()
        server.server_close()
