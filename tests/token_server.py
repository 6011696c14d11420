"""A Docker token server for tests, and a distribution registry that trusts it.

The token server implements the registry token protocol
(https://distribution.github.io/distribution/spec/auth/token/): ``GET /token``
with ``service`` and ``scope=repository:NAME:ACTIONS`` parameters, HTTP Basic
credentials checked against one fixed user (401 otherwise), and anonymous
requests answered with a token that grants nothing. Tokens are JWTs signed
RS256 with a key made at start-up; the header carries ``x5c``, a self-signed
certificate for that key, which the registry verifies against its
``rootcertbundle`` (the same certificate, written as PEM).

Every request is recorded, so tests can show which scopes were asked for and
granted: evidence that the Bearer path ran.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID
from registry_server import RegistryServer, free_port, start_registry

SERVICE = "artifactd-test"
ISSUER = "artifactd-token-issuer"
#: Actions a token may grant on a repository; anything else asked for is dropped.
GRANTABLE = ("pull", "push")
EXPIRES_IN = 300


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass
class TokenRequest:
    """One request to the token endpoint, as the server saw and answered it."""

    path: str
    service: str | None
    scopes: list[str]
    #: The user whose Basic credentials were accepted; None for an anonymous request.
    user: str | None
    #: True when Basic credentials were sent (accepted or not).
    sent_credentials: bool
    status: int
    access: list[dict[str, object]] = field(default_factory=list)
    #: The ``Authorization`` header as sent (to tell whose credentials came), or None.
    authorization: str | None = None


def parse_scope(scope: str) -> tuple[str, str, list[str]] | None:
    """``repository:NAME:pull,push`` -> (type, name, actions); None if malformed.

    The registry builds a challenge's action list from a map, so its order
    varies (``pull,push`` or ``push,pull``): compare actions as sets.
    """
    kind, sep, rest = scope.partition(":")
    name, sep2, actions = rest.rpartition(":")
    if not (sep and sep2 and kind and name):
        return None
    return kind, name, [a for a in actions.split(",") if a]


class TokenServer:
    """A token server on a free loopback port, served from a background thread."""

    def __init__(self, workdir: Path, *, user: str, password: str) -> None:
        self.user = user
        self.password = password
        self.requests: list[TokenRequest] = []
        self._lock = threading.Lock()
        workdir.mkdir(parents=True, exist_ok=True)
        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ISSUER)])
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.cert_path = workdir / "token-cert.pem"
        self.cert_path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        self._x5c = base64.b64encode(self.cert.public_bytes(serialization.Encoding.DER)).decode()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", free_port()), self._handler())
        self._httpd.daemon_threads = True
        self.port = int(self._httpd.server_address[1])
        self._thread: threading.Thread | None = None

    @property
    def realm(self) -> str:
        return f"http://127.0.0.1:{self.port}/token"

    # -- tokens ---------------------------------------------------------------
    def issue(self, subject: str, service: str, access: list[dict[str, object]]) -> str:
        """A signed JWT in the form distribution's token access controller accepts."""
        now = int(time.time())
        header = {"typ": "JWT", "alg": "RS256", "x5c": [self._x5c]}
        claims = {
            "iss": ISSUER,
            "sub": subject,
            "aud": service,
            "exp": now + EXPIRES_IN,
            "nbf": now - 1,
            "iat": now,
            "jti": uuid.uuid4().hex,
            "access": access,
        }
        signing_input = ".".join(
            _b64url(json.dumps(part, separators=(",", ":")).encode()) for part in (header, claims)
        )
        signature = self._key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signing_input}.{_b64url(signature)}"

    def _credentials_ok(self, authorization: str) -> bool:
        scheme, _, encoded = authorization.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            decoded = base64.b64decode(encoded.strip(), validate=True).decode()
        except (ValueError, UnicodeDecodeError):
            return False
        name, _, secret = decoded.partition(":")
        return name == self.user and secret == self.password

    def answer(self, path: str, authorization: str | None) -> tuple[int, dict[str, object]]:
        """Decide one token request; record it; return (status, JSON body)."""
        url = urlsplit(path)
        query = parse_qs(url.query)
        service = query["service"][0] if query.get("service") else None
        scopes = query.get("scope") or []
        record = TokenRequest(
            path=url.path,
            service=service,
            scopes=scopes,
            user=None,
            sent_credentials=authorization is not None,
            status=200,
            authorization=authorization,
        )
        if url.path != "/token":
            record.status = 404
            body: dict[str, object] = {"errors": [{"code": "NOT_FOUND"}]}
        elif authorization is not None and not self._credentials_ok(authorization):
            record.status = 401
            body = {"errors": [{"code": "UNAUTHORIZED", "message": "bad credentials"}]}
        else:
            if authorization is not None:
                record.user = self.user
                for scope in scopes:
                    parsed = parse_scope(scope)
                    if parsed is None or parsed[0] != "repository":
                        continue
                    granted = [a for a in parsed[2] if a in GRANTABLE]
                    record.access.append(
                        {"type": "repository", "name": parsed[1], "actions": granted}
                    )
            token = self.issue(record.user or "", service or SERVICE, record.access)
            body = {"token": token, "access_token": token, "expires_in": EXPIRES_IN}
        with self._lock:
            self.requests.append(record)
        return record.status, body

    @staticmethod
    def asked(request: TokenRequest, repo: str) -> set[str]:
        """The actions ``request`` asked for on repository ``repo``."""
        found: set[str] = set()
        for scope in request.scopes:
            parsed = parse_scope(scope)
            if parsed is not None and parsed[:2] == ("repository", repo):
                found.update(parsed[2])
        return found

    @staticmethod
    def granted(request: TokenRequest, repo: str) -> set[str]:
        """The actions the token issued for ``request`` grants on repository ``repo``."""
        found: set[str] = set()
        for entry in request.access:
            actions = entry.get("actions")
            if entry.get("name") == repo and isinstance(actions, list):
                found.update(str(a) for a in actions)
        return found

    def recorded(self) -> list[TokenRequest]:
        with self._lock:
            return list(self.requests)

    # -- HTTP -----------------------------------------------------------------
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, body = server.answer(self.path, self.headers.get("Authorization"))
                data = json.dumps(body).encode()
                self.send_response(status)
                if status == 401:
                    self.send_header("WWW-Authenticate", f'Basic realm="{SERVICE}"')
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                pass  # keep test output clean (and credentials out of it)

        return Handler

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="token-server", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


def start_token_registry(workdir: Path, tokens: TokenServer) -> RegistryServer:
    """Start docker-registry with ``auth: token:`` trusting ``tokens``."""
    return start_registry(
        workdir,
        user=tokens.user,
        password=tokens.password,
        auth=[
            "auth:",
            "  token:",
            f"    realm: {tokens.realm}",
            f"    service: {SERVICE}",
            f"    issuer: {ISSUER}",
            f"    rootcertbundle: {tokens.cert_path}",
        ],
    )


@contextlib.contextmanager
def running_token_registry(
    workdir: Path, *, user: str, password: str
) -> Iterator[tuple[TokenServer, RegistryServer]]:
    """A token server and a registry that trusts it; both stopped on exit."""
    tokens = TokenServer(workdir / "tokens", user=user, password=password)
    tokens.start()
    try:
        registry = start_token_registry(workdir / "registry", tokens)
        try:
            yield tokens, registry
        finally:
            registry.stop()
    finally:
        tokens.stop()
