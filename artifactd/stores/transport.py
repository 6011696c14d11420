"""HTTP to a registry: sessions, authentication, timeouts and bounded retries.

oras-py fetches Bearer tokens from the realm a registry's challenge names;
everything else is ours (Basic answers too), because oras-py 0.2.x has no
request timeouts, no bounded retries and no limit on how long a body may
take. oras-py is imported at the first Bearer challenge, not before: a
registry that asks for no token (an in-cluster registry or pull-through
cache, a node's mirror, a Basic-only registry) never needs it, and importing
it (with the ``jsonschema`` it loads) costs about 40 ms of a pod's start.
Nothing from oras-py (exceptions, log lines) leaves this module: every
failure becomes a :class:`StoreError`.

A transport holds the credentials of its own registry only (found for its host
by :func:`~artifactd.stores.credentials.find_credentials`), so whatever a
registry asks, it can be sent no other registry's. A Bearer challenge's token
realm gets the credentials of the registry that issued the challenge, wherever
the realm is (Docker Hub's is ``auth.docker.io``, as Docker does): the realm is
that registry's login service, and the registry could have asked for them in a
Basic challenge anyway.

Every request has the :data:`TIMEOUT` pair; connection errors, timeouts, 429
and 5xx answers are retried up to :data:`ATTEMPTS` times with doubling backoff
from :data:`BACKOFF_S`. A 429 or 5xx answer's ``Retry-After`` (seconds or an
HTTP date) is honoured: the wait before the next attempt is at least what it
asks, capped at :data:`MAX_RETRY_AFTER_S` so a registry cannot hold a pod's
start for longer than the cap allows; a body that arrives slower than :data:`MIN_RATE` on
average (after a grace of the read timeout) is given up on, so every call ends
in bounded time. The constants are read when used, so tests may patch them on
this module.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timezone
from email.utils import parsedate_to_datetime
from http.cookiejar import DefaultCookiePolicy
from pathlib import Path
from typing import Any

import requests
import urllib3

from artifactd.errors import StoreError
from artifactd.stores.base import Progress
from artifactd.stores.credentials import Credentials

#: (connect, read) timeouts in seconds for every request.
TIMEOUT = (5.0, 60.0)
#: Attempts for requests that fail with a connection error, a timeout or a 5xx.
ATTEMPTS = 4
BACKOFF_S = 0.25
#: Longest wait a ``Retry-After`` header may ask for between two attempts
#: (seconds); a longer one is waited for this long, then the request is retried.
MAX_RETRY_AFTER_S = 10.0
#: Slowest average rate (bytes/s) a blob download may keep after a grace of
#: ``TIMEOUT[1]`` seconds; a registry that drips bytes slower is given up on,
#: so a restore always ends in bounded time (a read timeout alone never fires
#: while a byte arrives now and then).
MIN_RATE = 64 << 10
#: Largest body a non-blob answer (manifest, tag list, error document) may have.
MAX_DOCUMENT = 4 << 20
_CHUNK = 1 << 20
_REALM_RE = re.compile(r'realm="[^"]+"')  # the key as oras-py matches it


def _token_auth(
    session: requests.Session,
    *,
    plain_http: bool,
    verify: bool | str,
    credentials: Credentials | None,
) -> Any:
    """Return oras-py's Bearer token handshake, sharing ``session``, its log lines silenced.

    The token request gets the session's TLS settings (a private CA bundle
    too), and the registry's own credentials for the realm, if it has any.
    """
    # lazy: only a Bearer challenge needs oras-py (see the module docstring)
    import oras.auth  # noqa: PLC0415
    from oras.logger import logger as oras_logger  # noqa: PLC0415

    # Keep oras-py's own log lines (which may name endpoints) out of our output.
    for name in ("oras", "oras.logger", "oras.provider", "oras.auth"):
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)
    try:
        oras_logger.quiet = True
        oras_logger.level = logging.CRITICAL + 1
    except AttributeError:  # a logger without these knobs: the levels above still hold
        pass
    auth = oras.auth.get_auth_backend("token", session, plain_http, tls_verify=verify)
    if credentials is not None:
        auth.set_basic_auth(credentials.username, credentials.password)
    return auth


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


def _too_slow(done: int, start: float, grace: float | None = None) -> float | None:
    """Seconds elapsed if ``done`` bytes since ``start`` is below :data:`MIN_RATE`, else None.

    ``grace`` defaults to the read timeout of :data:`TIMEOUT`.
    """
    elapsed = time.monotonic() - start
    grace = TIMEOUT[1] if grace is None else grace
    return elapsed if elapsed > grace and done < MIN_RATE * (elapsed - grace) else None


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


class BlobReader:
    """File-like reading of a streamed response; transport errors become StoreError.

    Also enforces :data:`MIN_RATE`: after a grace period, a transfer whose
    average rate falls below it is aborted.
    """

    def __init__(self, response: Any, what: str, *, grace: float | None = None) -> None:
        self._grace = grace
        self._raw = response.raw
        self._raw.decode_content = True
        self._what = what
        self._response = response
        self._start = time.monotonic()
        self._done = 0

    def read(self, n: int = -1) -> bytes:
        """Read up to ``n`` bytes of the body."""
        try:
            # read1: whatever one socket read brings, so a dripping registry is
            # noticed between reads instead of inside one endless read(n).
            data = bytes(self._raw.read1(n if n and n > 0 else _CHUNK))
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise StoreError(f"transfer of {self._what} failed: {type(exc).__name__}") from None
        self._done += len(data)
        if (elapsed := _too_slow(self._done, self._start, self._grace)) is not None:
            raise StoreError(
                f"transfer of {self._what} stalled: {self._done} bytes in {elapsed:.0f} s "
                f"(slower than {MIN_RATE} B/s)",
                hint="the registry or the network is too slow; the engine compiles as before",
            )
        return data

    def close(self) -> None:
        """Close the response."""
        self._response.close()


def read_document(resp: Any, what: str, *, grace: float | None = None) -> None:
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
        if (elapsed := _too_slow(total, start, grace)) is not None:
            raise StoreError(
                f"{what}: answer stalled: {total} bytes in {elapsed:.0f} s "
                f"(slower than {MIN_RATE} B/s)"
            )
        chunks.append(chunk)
    # Hand the body to requests as if it had read it: resp.content / resp.json() use it.
    resp._content = b"".join(chunks)
    resp._content_consumed = True


@dataclass
class _Session:
    """One thread's requests session, its Bearer handshake (made when first challenged), auth."""

    http: requests.Session
    #: oras-py's token handshake on ``http``: see :func:`_token_auth`.
    token_auth: Any = None
    basic: str | None = None
    bearer: str | None = None


class Transport:
    """Requests to one registry, safe to use from many threads.

    Each thread gets its own session (requests sessions and oras-py's token
    state are not thread-safe); :meth:`close` closes all of them.
    """

    def __init__(
        self,
        host: str,
        *,
        plain_http: bool,
        credentials: Credentials | None,
        name: str,
        attempts: int | None = None,
        timeout: tuple[float, float] | None = None,
        verify: bool | str = True,
        cert: tuple[str, str | None] | None = None,
    ) -> None:
        self.host = host
        self.plain_http = plain_http
        self.credentials = credentials
        self._name = name  # the store reference, for messages
        #: None: :data:`ATTEMPTS` and :data:`TIMEOUT`, read when used (a mirror passes its own).
        self.attempts = attempts
        self.timeout = timeout
        self._verify = verify
        self._cert = cert
        self._lock = threading.Lock()
        self._sessions: dict[int, _Session] = {}

    def _session(self) -> _Session:
        """Return the calling thread's session, made on first use."""
        key = threading.get_ident()
        with self._lock:
            session = self._sessions.get(key)
        if session is not None:
            return session

        http = requests.Session()
        # No cookies: some registries (Harbor) take one as a sign of a browser and
        # start asking for CSRF tokens.
        http.cookies.set_policy(DefaultCookiePolicy(allowed_domains=[]))
        _default_timeout(http)
        # TLS verification is passed with every request (see _attempt), not set here.
        if self._cert is not None:
            cert_file, key_file = self._cert
            http.cert = cert_file if key_file is None else (cert_file, key_file)
        session = _Session(http)
        with self._lock:
            self._sessions[key] = session
        return session

    def close(self) -> None:
        """Close every thread's session; a later request opens a new one."""
        with self._lock:
            sessions = list(self._sessions.values())
            self._sessions.clear()
        for session in sessions:
            session.http.close()

    def _authenticate(self, session: _Session, response: Any, headers: dict[str, str]) -> bool:
        """Answer a 401 challenge; True if the request can be retried with ``headers``."""
        challenge = response.headers.get("Www-Authenticate", "")
        if challenge.lower().startswith("basic"):
            if self.credentials is None:
                return False
            session.basic = headers["Authorization"] = self.credentials.basic_header()
            return True
        if not _REALM_RE.search(challenge):
            return False  # no Bearer challenge we could answer: an auth error for the caller

        if session.token_auth is None:
            session.token_auth = _token_auth(
                session.http,
                plain_http=self.plain_http,
                verify=self._verify,
                credentials=self.credentials,
            )
        auth = session.token_auth
        try:
            auth.token = None  # a token for another scope must not be reused
            new_headers, changed = auth.authenticate_request(response, dict(headers))
        except requests.JSONDecodeError:
            raise self._token_answer_error() from None
        except requests.RequestException as exc:
            raise StoreError(
                f"{self._name}: cannot reach the registry's token service: {type(exc).__name__}",
                hint="check that the token realm in the registry's challenge is reachable",
            ) from None
        except AttributeError:
            # oras-py reads the token answer with .get(): JSON that is not an object.
            raise self._token_answer_error() from None
        if changed:
            headers.update(new_headers)
            session.bearer = new_headers.get("Authorization")
        return bool(changed)

    def _token_answer_error(self) -> StoreError:
        return StoreError(
            f"{self._name}: the registry's token service answered with no token document",
            hint="check the token realm in the registry's challenge; it must answer JSON",
        )

    def send(
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
        Connection errors, timeouts, 429 and 5xx are retried with backoff (at
        least what a 429 or 5xx answer's ``Retry-After`` asks, capped).
        """
        session = self._session()
        hdrs = dict(headers or {})
        for cached in (session.basic, session.bearer):
            if cached:
                hdrs["Authorization"] = cached
        delay = BACKOFF_S
        last_error = ""
        authed = False
        attempt = 0
        attempts = ATTEMPTS if self.attempts is None else self.attempts
        while attempt < attempts:
            resp, last_error = _attempt(
                session.http,
                method,
                url=url,
                headers=hdrs,
                body=body,
                stream=stream,
                progress=progress,
                timeout=self.timeout or TIMEOUT,
                verify=self._verify,
            )
            if resp is not None and resp.status_code in (401, 403) and not authed:
                authed = True  # one challenge answered per call; not counted as an attempt
                resp.close()
                if not self._authenticate(session, resp, hdrs):
                    raise self._auth_error(resp.status_code)
                continue
            asked: float | None = None
            if resp is not None:
                if resp.status_code in ok or resp.status_code in missing:
                    return resp
                self._raise_for(resp, what or method)
                last_error = f"HTTP {resp.status_code}"
                asked = retry_after(resp.headers.get("Retry-After"))
                resp.close()
            attempt += 1
            if attempt < attempts:
                time.sleep(delay if asked is None else max(delay, asked))
                delay *= 2
        raise StoreError(
            f"cannot reach registry {self.host} ({what or method}): {last_error} "
            f"after {attempts} attempt{'s' if attempts > 1 else ''}",
            hint="check that the registry is up and reachable from here"
            + ("" if self.plain_http else "; for a plain-HTTP registry pass --insecure"),
        )

    def _raise_for(self, resp: Any, what: str) -> None:
        """Raise for a final, non-retryable answer; return for retryable ones (429, 5xx)."""
        if resp.status_code in (401, 403):
            resp.close()
            raise self._auth_error(resp.status_code)
        if resp.status_code < 500 and resp.status_code != 429:
            detail = _error_detail(resp)
            resp.close()
            raise StoreError(f"{self._name}: {what} answered {resp.status_code}{detail}")

    def _auth_error(self, status: int) -> StoreError:
        if self.credentials is None:
            return StoreError(
                f"{self._name}: the registry requires authentication ({status})",
                hint=f"log in (docker login {self.host}), or set ARTIFACTD_REGISTRY_USERNAME "
                f"and ARTIFACTD_REGISTRY_PASSWORD with ARTIFACTD_REGISTRY_HOST={self.host}: "
                "the pair is sent only to the registry that variable names",
            )
        return StoreError(
            f"{self._name}: the registry rejected the credentials for user "
            f"{self.credentials.username!r} ({status})",
            hint="check the password or token in the Docker config or ARTIFACTD_REGISTRY_*",
        )


def retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Return the seconds a ``Retry-After`` header value asks to wait, at most the cap.

    The value is delta-seconds or an HTTP date (RFC 9110, 10.2.3); a date in
    the past asks for no wait. None when there is no value or it is neither
    form (the backoff alone applies). Never more than :data:`MAX_RETRY_AFTER_S`.
    """
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        seconds = float(text)
    else:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:  # an HTTP date is GMT; parsedate leaves "-0000" naive
            when = when.replace(tzinfo=timezone.utc)
        seconds = max(0.0, when.timestamp() - (time.time() if now is None else now))
    return min(seconds, MAX_RETRY_AFTER_S)


def _attempt(
    http: requests.Session,
    method: str,
    *,
    url: str,
    headers: dict[str, str],
    body: Path | bytes | None,
    stream: bool,
    progress: Progress | None = None,
    timeout: tuple[float, float] = TIMEOUT,
    verify: bool | str = True,
) -> tuple[Any, str]:
    """One HTTP exchange; a file body is reopened each time so a retry resends it all."""
    handle = body.open("rb") if isinstance(body, Path) else None
    data: Any = body
    if handle is not None:
        data = _CountingFile(handle, progress) if progress else handle
    resp = None
    try:
        resp = http.request(
            method,
            url,
            headers=headers,
            data=data,
            stream=True,  # small bodies too: read below, under MIN_RATE and a size cap
            timeout=timeout,
            allow_redirects=True,
            # Per request: requests lets REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE in the
            # environment override a session's own CA bundle, never a request's. A
            # mirror's ``ca`` (hosts.toml) must hold whatever the pod's environment says.
            verify=verify,
        )
        if not stream:
            read_document(resp, f"{method} {url.rsplit('/', 2)[-2]}", grace=timeout[1])
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


def _error_detail(resp: Any) -> str:
    try:
        errors = resp.json().get("errors") or []
        codes = ", ".join(str(e.get("code")) for e in errors if isinstance(e, dict))
    except (ValueError, AttributeError):
        return ""
    return f" ({codes})" if codes else ""
