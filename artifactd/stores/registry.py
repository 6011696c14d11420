"""An OCI registry repository as a store (``HOST[:PORT]/REPO``).

This is the only module that talks to oras-py. We use oras-py for what it does
well, the authentication handshake (Basic, and Bearer tokens fetched from the
registry's realm), and do the distribution-API calls ourselves, because we need
what oras-py 0.2.x does not give: request timeouts, bounded retries, blobs
streamed from and to disk (never whole in RAM), manifests pushed as our exact
bytes (so digests are reproducible), digests verified, and no logging or
``sys.exit`` of its own. Nothing from oras-py (exceptions, log lines) crosses
this module's boundary: every failure becomes a :class:`StoreError`.

Credentials come from ``ARTIFACTD_REGISTRY_USERNAME`` / ``_PASSWORD``, else the
Docker config (``$DOCKER_CONFIG/config.json`` or ``~/.docker/config.json``:
``auths``, ``credHelpers``, ``credsStore``). They never appear in messages.

Plain HTTP is used automatically for loopback registries (as Docker treats
127.0.0.0/8), and otherwise only with ``insecure=True``.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import logging
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urljoin

from artifactd.constants import (
    DOCKER_CONFIG,
    ENV_REGISTRY_PASSWORD,
    ENV_REGISTRY_USERNAME,
    current_environ,
)
from artifactd.errors import IntegrityError, NotFoundError, StoreError, UsageError
from artifactd.oci import DIGEST_RE, MANIFEST_MEDIA_TYPE, check_digest, check_tag
from artifactd.stores.base import ManifestRef, Progress, Store

#: (connect, read) timeouts in seconds for every request.
TIMEOUT = (5.0, 60.0)
#: Attempts for requests that fail with a connection error, a timeout or a 5xx.
ATTEMPTS = 4
BACKOFF_S = 0.25
#: Slowest average rate (bytes/s) a blob download may keep after a grace of
#: ``TIMEOUT[1]`` seconds; a registry that drips bytes slower is given up on,
#: so a restore always ends in bounded time (a read timeout alone never fires
#: while a byte arrives now and then).
MIN_RATE = 64 << 10
#: Largest body a non-blob answer (manifest, tag list, error document) may have.
MAX_DOCUMENT = 4 << 20
_CHUNK = 1 << 20
_ACCEPT = ", ".join([MANIFEST_MEDIA_TYPE, "application/vnd.oci.image.index.v1+json"])
_REPO_RE = re.compile(
    r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$"
)


@dataclass(frozen=True)
class RegistryRef:
    """A parsed ``HOST[:PORT]/REPO[:TAG|@DIGEST]`` reference."""

    host: str
    repo: str
    reference: str | None = None

    @property
    def store(self) -> str:
        """The store part, without tag or digest."""
        return f"{self.host}/{self.repo}"


def looks_like_registry(text: str) -> bool:
    """Whether ``text`` names a registry (its first component is a host)."""
    text = text.removeprefix("docker://")
    if "://" in text:
        return False  # another scheme (https://, oci-archive://...): not HOST/REPO
    first, sep, _ = text.partition("/")
    return bool(sep) and ("." in first or ":" in first or first == "localhost")


def parse_registry_ref(text: str) -> RegistryRef:
    """Parse a registry reference; raise :class:`UsageError` when malformed."""
    body = text.strip().removeprefix("docker://")
    if not looks_like_registry(body):
        raise UsageError(
            f"not a registry reference: {text!r}",
            hint="use HOST[:PORT]/REPO, e.g. registry.example.com/team/caches or 127.0.0.1:5000/c",
        )
    host, _, rest = body.partition("/")
    reference: str | None = None
    if "@" in rest:
        rest, _, reference = rest.partition("@")
        check_digest(reference)
    else:
        last = rest.rsplit("/", 1)[-1]
        if ":" in last:
            rest, _, reference = rest.rpartition(":")
            check_tag(reference)
    if not _REPO_RE.match(rest):
        raise UsageError(
            f"not a valid repository name: {rest!r}",
            hint="lowercase letters, digits and . _ - separators, / for nesting",
        )
    return RegistryRef(host, rest, reference)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (with optional port) is a loopback address, as Docker decides."""
    if host.startswith("["):
        name = host[1 : host.find("]")]  # [::1]:5000
    elif host.count(":") == 1:
        name = host.split(":", maxsplit=1)[0]  # 127.0.0.1:5000, localhost:5000
    else:
        name = host  # a bare IPv6 address, or a name without port
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


# --------------------------------------------------------------------------
# Credentials
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Credentials:
    """A username and password (or identity token); ``repr`` never shows them."""

    username: str
    password: str = ""

    def __repr__(self) -> str:
        return f"Credentials(username={self.username!r}, password=***)"


def _docker_config_path(environ: Mapping[str, str]) -> Path:
    base = environ.get(DOCKER_CONFIG)
    if base:
        return Path(base) / "config.json"
    home = environ.get("HOME")
    return (Path(home) if home else Path.home()) / ".docker" / "config.json"


def _from_helper(helper: str, host: str) -> Credentials | None:
    try:
        proc = subprocess.run(
            [f"docker-credential-{helper}", "get"],
            input=host,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    try:
        doc = json.loads(proc.stdout)
        return Credentials(str(doc["Username"]), str(doc["Secret"]))
    except (ValueError, KeyError, TypeError):
        return None


def find_credentials(host: str, environ: Mapping[str, str] | None = None) -> Credentials | None:
    """Return credentials for ``host`` from the environment or the Docker config."""
    environ = current_environ() if environ is None else environ
    user = environ.get(ENV_REGISTRY_USERNAME)
    if user:
        return Credentials(user, environ.get(ENV_REGISTRY_PASSWORD, ""))
    try:
        config = json.loads(_docker_config_path(environ).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return _from_docker_config(config, host) if isinstance(config, dict) else None


def _from_auth_entry(entry: Mapping[str, Any]) -> Credentials | None:
    if entry.get("auth"):
        try:
            decoded = base64.b64decode(str(entry["auth"])).decode()
        except (ValueError, UnicodeDecodeError):
            return None
        name, _, secret = decoded.partition(":")
        return Credentials(name, secret)
    if entry.get("username"):
        return Credentials(str(entry["username"]), str(entry.get("password", "")))
    if entry.get("identitytoken"):
        return Credentials("<token>", str(entry["identitytoken"]))
    return None


def _from_docker_config(config: Mapping[str, Any], host: str) -> Credentials | None:
    """Look ``host`` up as Docker does: credHelpers, then auths, then credsStore."""
    helper = (config.get("credHelpers") or {}).get(host)
    if helper:
        return _from_helper(str(helper), host)
    auths = config.get("auths") or {}
    for key in (host, f"https://{host}", f"http://{host}", f"https://{host}/v1/"):
        entry = auths.get(key)
        if isinstance(entry, dict) and (found := _from_auth_entry(entry)) is not None:
            return found
    if config.get("credsStore"):
        return _from_helper(str(config["credsStore"]), host)
    return None


# --------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------


def _quiet_oras() -> None:
    """Keep oras-py's own log lines (which may name endpoints) out of our output."""
    for name in ("oras", "oras.logger", "oras.provider", "oras.auth"):
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)
    try:
        from oras.logger import logger as oras_logger

        oras_logger.quiet = True
        oras_logger.level = logging.CRITICAL + 1
    except (ImportError, AttributeError):
        pass


def _default_timeout(session: Any) -> None:
    """Give every request on ``session`` our timeouts unless it sets its own.

    oras-py fetches Bearer tokens from the realm with ``session.get`` and no
    timeout; without this, a token service that accepts and never answers
    hangs the whole command.
    """
    send = session.request

    def request(method: str, url: str, **kwargs: Any) -> Any:
        kwargs.setdefault("timeout", TIMEOUT)
        return send(method, url, **kwargs)

    session.request = request


class _CountingFile:
    """A file body that reports bytes as requests reads them out."""

    def __init__(self, handle: Any, progress: Progress) -> None:
        self._handle = handle
        self._progress = progress
        self._sent = 0
        self._size = os.fstat(handle.fileno()).st_size

    def __len__(self) -> int:
        return self._size

    def read(self, n: int = -1) -> bytes:
        data = bytes(self._handle.read(n))
        self._sent += len(data)
        self._progress(self._sent)
        return data


class _BlobReader:
    """File-like reading of a streamed response; transport errors become StoreError.

    Also enforces :data:`MIN_RATE`: after a grace period, a transfer whose
    average rate falls below it is aborted.
    """

    def __init__(self, response: Any, what: str) -> None:
        self._raw = response.raw
        self._raw.decode_content = True
        self._what = what
        self._response = response
        self._start = time.monotonic()
        self._done = 0

    def read(self, n: int = -1) -> bytes:
        """Read up to ``n`` bytes of the body."""
        import requests
        import urllib3

        try:
            # read1: whatever one socket read brings, so a dripping registry is
            # noticed between reads instead of inside one endless read(n).
            data = bytes(self._raw.read1(n if n and n > 0 else _CHUNK))
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise StoreError(f"transfer of {self._what} failed: {type(exc).__name__}") from None
        self._done += len(data)
        elapsed = time.monotonic() - self._start
        grace = TIMEOUT[1]
        if elapsed > grace and self._done < MIN_RATE * (elapsed - grace):
            raise StoreError(
                f"transfer of {self._what} stalled: {self._done} bytes in {elapsed:.0f} s "
                f"(slower than {MIN_RATE} B/s)",
                hint="the registry or the network is too slow; the engine compiles as before",
            )
        return data

    def close(self) -> None:
        self._response.close()


def _read_document(resp: Any, what: str) -> None:
    """Read a non-blob answer's body whole, as requests would, bounded in time and size.

    requests' own read has only the per-read timeout: a registry that drips a
    manifest, or sends an endless one, would hold the restore forever (and
    fill memory). Transport errors propagate, for the caller to retry.
    """
    raw = resp.raw
    raw.decode_content = True
    start = time.monotonic()
    chunks: list[bytes] = []
    total = 0
    while chunk := raw.read1(64 << 10):
        total += len(chunk)
        if total > MAX_DOCUMENT:
            raise StoreError(f"{what}: answer larger than {MAX_DOCUMENT} bytes")
        elapsed = time.monotonic() - start
        if elapsed > TIMEOUT[1] and total < MIN_RATE * (elapsed - TIMEOUT[1]):
            raise StoreError(
                f"{what}: answer stalled: {total} bytes in {elapsed:.0f} s "
                f"(slower than {MIN_RATE} B/s)"
            )
        chunks.append(chunk)
    # Hand the body to requests as if it had read it: resp.content / resp.json() use it.
    resp._content = b"".join(chunks)
    resp._content_consumed = True


class RegistryStore(Store):
    """A repository in an OCI registry, spoken to over the distribution API."""

    def __init__(
        self,
        ref: RegistryRef,
        *,
        insecure: bool = False,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.target = ref
        self.ref = ref.store
        self.plain_http = insecure or is_loopback(ref.host)
        self.base = f"{'http' if self.plain_http else 'https'}://{ref.host}/v2/{ref.repo}"
        self._credentials = find_credentials(ref.host, environ)
        self._local = threading.local()
        _quiet_oras()

    # -- transport ----------------------------------------------------------
    def _client(self) -> Any:
        """One oras Registry (session + auth state) per thread: they are not thread-safe."""
        client = getattr(self._local, "client", None)
        if client is None:
            import oras.provider

            client = oras.provider.Registry(
                hostname=self.target.host,
                insecure=self.plain_http,
                auth_backend="token",
            )
            _default_timeout(client.session)
            if self._credentials is not None:
                client.auth.set_basic_auth(self._credentials.username, self._credentials.password)
            self._local.client = client
            self._local.scheme = None
        return client

    def _authenticate(self, client: Any, response: Any, headers: dict[str, str]) -> bool:
        """Answer a 401 challenge through oras-py's auth backends; True if we can retry."""
        challenge = response.headers.get("Www-Authenticate", "")
        if challenge.lower().startswith("basic"):
            if self._credentials is None:
                return False
            token = base64.b64encode(
                f"{self._credentials.username}:{self._credentials.password}".encode()
            ).decode()
            self._local.basic = f"Basic {token}"
            headers["Authorization"] = self._local.basic
            return True
        import requests

        try:
            client.auth.token = None  # a token for another scope must not be reused
            new_headers, changed = client.auth.authenticate_request(response, dict(headers))
        except requests.RequestException as exc:
            raise StoreError(
                f"{self.ref}: cannot reach the registry's token service: {type(exc).__name__}",
                hint="check that the token realm in the registry's challenge is reachable",
            ) from None
        except Exception:
            return False
        if changed:
            headers.update(new_headers)
            self._local.bearer = new_headers.get("Authorization")
        return bool(changed)

    def _send(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        body: Path | bytes | None = None,
        stream: bool = False,
        ok: tuple[int, ...] = (200,),
        missing: tuple[int, ...] = (),
        what: str = "",
        progress: Progress | None = None,
    ) -> Any:
        """Send one request with auth, timeouts and bounded retries.

        Returns the response for a status in ``ok`` or ``missing`` (the caller
        tells them apart); raises :class:`StoreError` for anything else.
        Connection errors, timeouts, 429 and 5xx are retried with backoff.
        """
        client = self._client()
        hdrs = dict(headers or {})
        for cached in (getattr(self._local, "basic", None), getattr(self._local, "bearer", None)):
            if cached:
                hdrs["Authorization"] = cached
        delay = BACKOFF_S
        last_error = ""
        authed = False
        attempt = 0
        while attempt < ATTEMPTS:
            resp, last_error = self._attempt(
                client,
                method,
                url=url,
                headers=hdrs,
                body=body,
                stream=stream,
                progress=progress,
            )
            if resp is not None and resp.status_code in (401, 403) and not authed:
                authed = True  # one challenge answered per call; not counted as an attempt
                resp.close()
                if not self._authenticate(client, resp, hdrs):
                    raise self._auth_error(resp.status_code)
                continue
            if resp is not None:
                if resp.status_code in ok or resp.status_code in missing:
                    return resp
                self._raise_for(resp, what or method)
                last_error = f"HTTP {resp.status_code}"
                resp.close()
            attempt += 1
            if attempt < ATTEMPTS:
                time.sleep(delay)
                delay *= 2
        raise StoreError(
            f"cannot reach registry {self.target.host} ({what or method}): {last_error} "
            f"after {ATTEMPTS} attempts",
            hint="check that the registry is up and reachable from here"
            + ("" if self.plain_http else "; for a plain-HTTP registry pass --insecure"),
        )

    @staticmethod
    def _attempt(
        client: Any,
        method: str,
        *,
        url: str,
        headers: dict[str, str],
        body: Path | bytes | None,
        stream: bool,
        progress: Progress | None = None,
    ) -> tuple[Any, str]:
        """One HTTP exchange; a file body is reopened each time so a retry resends it all."""
        import requests

        handle = body.open("rb") if isinstance(body, Path) else None
        data: Any = body
        if handle is not None:
            data = _CountingFile(handle, progress) if progress else handle
        import urllib3

        resp = None
        try:
            resp = client.session.request(
                method,
                url,
                headers=headers,
                data=data,
                stream=True,  # small bodies too: read below, under MIN_RATE and a size cap
                timeout=TIMEOUT,
                allow_redirects=True,
            )
            if not stream:
                _read_document(resp, f"{method} {url.rsplit('/', 2)[-2]}")
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
            if resp is not None:
                resp.close()
            return None, type(exc).__name__  # retried
        except StoreError:
            if resp is not None:
                resp.close()
            raise  # stalled or oversized: not retried
        finally:
            if handle is not None:
                handle.close()
        return resp, ""

    def _raise_for(self, resp: Any, what: str) -> None:
        """Raise for a final, non-retryable answer; return for retryable ones (429, 5xx)."""
        if resp.status_code in (401, 403):
            resp.close()
            raise self._auth_error(resp.status_code)
        if resp.status_code < 500 and resp.status_code != 429:
            detail = self._error_detail(resp)
            resp.close()
            raise StoreError(f"{self.ref}: {what} answered {resp.status_code}{detail}")

    def _auth_error(self, status: int) -> StoreError:
        if self._credentials is None:
            return StoreError(
                f"{self.ref}: the registry requires authentication ({status})",
                hint="log in (docker login, or set ARTIFACTD_REGISTRY_USERNAME and "
                "ARTIFACTD_REGISTRY_PASSWORD)",
            )
        return StoreError(
            f"{self.ref}: the registry rejected the credentials for user "
            f"{self._credentials.username!r} ({status})",
            hint="check the password or token in the Docker config or ARTIFACTD_REGISTRY_*",
        )

    @staticmethod
    def _error_detail(resp: Any) -> str:
        try:
            errors = resp.json().get("errors") or []
            codes = ", ".join(str(e.get("code")) for e in errors if isinstance(e, dict))
        except (ValueError, AttributeError):
            return ""
        return f" ({codes})" if codes else ""

    # -- blobs --------------------------------------------------------------
    def has_blob(self, digest: str) -> bool:
        """HEAD the blob: 200 present, 404 absent."""
        check_digest(digest)
        resp = self._send("HEAD", f"{self.base}/blobs/{digest}", missing=(404,), what="blob lookup")
        resp.close()
        return bool(resp.status_code == 200)

    def put_blob(self, path: Path, digest: str, size: int, progress: Progress | None = None) -> int:
        """Upload a file unless the registry has it (monolithic POST + PUT, streamed)."""
        check_digest(digest)
        if self.has_blob(digest):
            return 0
        start = self._send(
            "POST",
            f"{self.base}/blobs/uploads/",
            ok=(202,),
            headers={"Content-Length": "0"},
            what="upload start",
        )
        location = start.headers.get("Location")
        start.close()
        if not location:
            raise StoreError(f"{self.ref}: upload start returned no Location")
        url = urljoin(f"{self.base}/", location)
        url += ("&" if "?" in url else "?") + f"digest={digest}"
        done = self._send(
            "PUT",
            url,
            body=path,
            progress=progress,
            ok=(201, 204),
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
            what="blob upload",
        )
        done.close()
        return size

    @contextmanager
    def open_blob(self, digest: str, size: int) -> Iterator[BinaryIO]:
        """Stream a blob; the caller verifies digest and size while reading."""
        check_digest(digest)
        resp = self._send(
            "GET", f"{self.base}/blobs/{digest}", stream=True, missing=(404,), what="blob download"
        )
        if resp.status_code == 404:
            resp.close()
            raise NotFoundError(f"{self.ref} has no blob {digest}")
        reader = _BlobReader(resp, f"blob {digest[:19]}")
        try:
            yield reader  # type: ignore[misc]
        finally:
            reader.close()

    # -- manifests ----------------------------------------------------------
    def put_manifest(self, data: bytes, media_type: str, tags: list[str]) -> str:
        """PUT our exact bytes under each tag (or by digest); return the digest."""
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        for ref in [check_tag(t) for t in tags] or [digest]:
            resp = self._send(
                "PUT",
                f"{self.base}/manifests/{ref}",
                body=data,
                ok=(201, 200),
                headers={"Content-Type": media_type},
                what="manifest upload",
            )
            answered = resp.headers.get("Docker-Content-Digest")
            resp.close()
            if answered and answered != digest:
                raise IntegrityError(
                    f"{self.ref}: registry stored manifest as {answered}, expected {digest}"
                )
        return digest

    def get_manifest(self, reference: str) -> ManifestRef | None:
        """GET a manifest by tag or digest; verify its digest."""
        if not DIGEST_RE.match(reference):
            check_tag(reference)
        resp = self._send(
            "GET",
            f"{self.base}/manifests/{reference}",
            missing=(404,),
            headers={"Accept": _ACCEPT},
            what="manifest lookup",
        )
        if resp.status_code == 404:
            resp.close()
            return None
        data = resp.content
        media_type = resp.headers.get("Content-Type", "").split(";")[0].strip()
        resp.close()
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        if DIGEST_RE.match(reference) and digest != reference:
            raise IntegrityError(f"{self.ref}: manifest {reference} hashes to {digest}")
        return ManifestRef(data=data, digest=digest, media_type=media_type)

    def tag_digest(self, tag: str) -> str | None:
        """HEAD a tag and return the digest it points at (no body transferred)."""
        resp = self._send(
            "HEAD",
            f"{self.base}/manifests/{check_tag(tag)}",
            missing=(404,),
            headers={"Accept": _ACCEPT},
            what="tag lookup",
        )
        resp.close()
        if resp.status_code == 404:
            return None
        digest = resp.headers.get("Docker-Content-Digest")
        if digest and DIGEST_RE.match(digest):
            return str(digest)
        ref = self.get_manifest(tag)
        return ref.digest if ref else None

    def list_tags(self) -> list[str]:
        """All tags, following ``Link`` pagination."""
        tags: list[str] = []
        url: str | None = f"{self.base}/tags/list?n=1000"
        while url:
            resp = self._send("GET", url, missing=(404,), what="tag listing")
            if resp.status_code == 404:
                resp.close()
                return []
            try:
                tags.extend(resp.json().get("tags") or [])
            except ValueError:
                raise StoreError(f"{self.ref}: tag listing is not JSON") from None
            link = resp.headers.get("Link", "")
            resp.close()
            m = re.search(r"<([^>]+)>", link)
            url = urljoin(self.base + "/", m.group(1)) if m else None
        return sorted(tags)

    def close(self) -> None:
        """Close this thread's session."""
        client = getattr(self._local, "client", None)
        if client is not None:
            client.session.close()
            self._local.client = None


def open_registry(text: str, *, insecure: bool = False) -> RegistryStore:
    """Open ``HOST[:PORT]/REPO`` as a store."""
    ref = parse_registry_ref(text)
    return RegistryStore(RegistryRef(ref.host, ref.repo), insecure=insecure)
