"""One HTTP exchange, bounded: a single deadline over all of it, and a capped body.

The endpoints artifactd talks to outside the registry transport (an engine's
``/metrics`` for ``matrix shapes``, its ``/health`` and completions for
``status --ready`` and a build's serve cells) are hostile until bounded. A
per-read socket timeout is not a bound: a server that drips its status line or
headers a byte a second resets it at every byte and holds the caller forever.
So :func:`exchange` takes one deadline that covers connecting (each address
tried gets only the time left), sending, the status line, the headers and the
body: every read from the socket is given only what is left of it. The body is
cut at ``max_bytes`` (a declared ``Content-Length`` over it is refused before
reading); http.client caps the header block (100 lines of at most 64 KiB).
Name resolution is the system resolver's, with its own timeouts.

A URL is parsed once (:func:`parse_url`): http or https, a host, a numeric
port, no control characters or spaces, at most :data:`MAX_URL_CHARS`; anything
else is a :class:`~artifactd.errors.UsageError` (exit 2). Credentials in the
URL (``http://user:pass@host/``) are sent as HTTP Basic to that host only
(no redirect is ever followed) and never shown: every message names the URL
as :func:`redact_url` writes it. Proxies from the environment are not used:
these endpoints are in the pod or the cluster.

Failures to get an answer are :class:`ExchangeError` (a
:class:`~artifactd.errors.StoreError`, exit 3) with a ``reason``; each caller
words its own error from it. Any HTTP status is an answer: the caller judges it.
"""

from __future__ import annotations

import base64
import http.client
import io
import re
import socket
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from artifactd.errors import StoreError, UsageError

#: Longest URL accepted, in characters.
MAX_URL_CHARS = 2048

#: Longest one exchange may be given, in seconds (a day; a bigger wait is a mistake).
MAX_TIMEOUT_S = 86400.0

#: Why :func:`exchange` got no (whole) answer.
Reason = Literal["timeout", "unreachable", "too_large"]

# Everything between "scheme://" and the last "@": the user information, and
# (over-redacting, never under) anything else a malformed URL puts before an "@".
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)(.*)@", re.DOTALL)
_FORBIDDEN = re.compile(r"[\x00-\x20\x7f]")


def redact_url(url: str) -> str:
    """Return ``url`` with its user information (a password) replaced by ``***``."""
    return _USERINFO.sub(r"\1***@", url, count=1)


class ExchangeError(StoreError):
    """No whole answer: ``reason`` is ``timeout``, ``unreachable`` or ``too_large``.

    ``detail`` says what happened in words that fit after the redacted URL
    (``is unreachable (ConnectionRefusedError: ...)``), ``why`` the same
    without the verb, to fit in parentheses (``ConnectionRefusedError: ...``).
    """

    def __init__(self, url: str, detail: str, *, reason: Reason, why: str | None = None) -> None:
        super().__init__(f"{url} {detail}", hint="check the URL and that the server is up")
        self.url = url
        self.detail = detail
        self.why = why or detail
        self.reason: Reason = reason


@dataclass(frozen=True)
class Endpoint:
    """A parsed http(s) URL: where to connect, what to ask, and how to name it."""

    shown: str
    https: bool
    host: str
    port: int
    target: str
    authorization: str | None


@dataclass(frozen=True)
class Answer:
    """A whole answer: its status and its body (at most the cap)."""

    status: int
    body: bytes
    headers: Mapping[str, str]


def parse_url(url: str, what: str = "URL") -> Endpoint:
    """Parse an http(s) URL, or raise :class:`UsageError` naming ``what`` (the flag)."""
    shown = redact_url(url)
    hint = "give an http(s) URL such as http://127.0.0.1:8000"
    if len(url) > MAX_URL_CHARS:
        raise UsageError(f"{what} is over {MAX_URL_CHARS} characters", hint=hint)
    if _FORBIDDEN.search(url):
        raise UsageError(f"{what} {shown!r} holds a space or a control character", hint=hint)
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        raise UsageError(
            f"{what} {shown!r} is not a URL (unbalanced brackets, or a port that is not "
            "a number in 0-65535)",
            hint=hint,
        ) from None
    if parts.scheme not in ("http", "https"):
        raise UsageError(f"{what} {shown!r} is not an http(s) URL", hint=hint)
    if not parts.hostname:
        raise UsageError(f"{what} {shown!r} names no host", hint=hint)
    https = parts.scheme == "https"
    authorization = None
    if parts.username is not None or parts.password is not None:
        pair = f"{urllib.parse.unquote(parts.username or '')}:"
        pair += urllib.parse.unquote(parts.password or "")
        authorization = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Endpoint(
        shown, https, parts.hostname, port or (443 if https else 80), target, authorization
    )


class _DeadlineReader(io.RawIOBase):
    """A socket's reading side where every read gets only what is left of the deadline."""

    def __init__(self, owner: _DeadlineSocket) -> None:
        super().__init__()
        self._owner = owner

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self._owner.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        self._owner.sock.settimeout(left)
        return self._owner.sock.recv_into(buffer)

    def close(self) -> None:
        if not self.closed:
            self._owner.release()
        super().close()


class _DeadlineSocket:
    """What http.client uses of a socket (sendall, makefile, close), read under the deadline.

    As a socket does, it stays open while a reader made by makefile is open:
    http.client closes the connection once the answer has begun when the
    server will close it, and reads the body afterwards.
    """

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self._readers = 0
        self._closing = False

    def sendall(self, data: Any) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        self.sock.settimeout(left)  # since 3.5: the total for the whole sendall
        self.sock.sendall(data)

    def makefile(self, mode: str, *args: Any, **kwargs: Any) -> io.BufferedReader:
        self._readers += 1
        return io.BufferedReader(_DeadlineReader(self))

    def release(self) -> None:
        self._readers -= 1
        if self._closing and self._readers <= 0:
            self.sock.close()

    def close(self) -> None:
        self._closing = True
        if self._readers <= 0:
            self.sock.close()


def _connect(
    address: tuple[str, int], timeout: Any = None, source: Any = None, *, deadline: float
) -> socket.socket:
    """socket.create_connection, where every address tried gets only the time left."""
    host, port = address
    problem: OSError = OSError(f"no address for {host}")
    for family, kind, proto, _, where in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(left)
            sock.connect(where)
        except OSError as exc:
            sock.close()
            problem = exc
            continue
        return sock
    raise problem


class _Bounded(http.client.HTTPConnection):
    deadline: float

    def connect(self) -> None:
        self.timeout = max(0.001, self.deadline - time.monotonic())
        super().connect()
        self.sock = _DeadlineSocket(self.sock, self.deadline)


class _BoundedTLS(http.client.HTTPSConnection):
    deadline: float

    def connect(self) -> None:
        # The TLS handshake's reads get the time left when it starts, each.
        self.timeout = max(0.001, self.deadline - time.monotonic())
        super().connect()
        self.sock = _DeadlineSocket(self.sock, self.deadline)


def _connection(endpoint: Endpoint, deadline: float) -> http.client.HTTPConnection:
    timeout = max(0.001, deadline - time.monotonic())
    conn: _Bounded | _BoundedTLS
    if endpoint.https:
        conn = _BoundedTLS(endpoint.host, endpoint.port, timeout=timeout)
    else:
        conn = _Bounded(endpoint.host, endpoint.port, timeout=timeout)
    conn.deadline = deadline

    def connect(address: tuple[str, int], timeout: Any = None, source: Any = None) -> Any:
        return _connect(address, timeout, source, deadline=deadline)

    # http.client's own hook for how to connect (an instance attribute it sets in __init__).
    vars(conn)["_create_connection"] = connect
    return conn


def exchange(
    url: str | Endpoint,
    *,
    timeout_s: float,
    max_bytes: int,
    method: str = "GET",
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    deadline: float | None = None,
) -> Answer:
    """Send one request and read the whole answer within ``timeout_s`` (and ``deadline``).

    ``deadline`` (a :func:`time.monotonic` instant) bounds it further, for a
    caller with several exchanges under one overall deadline. Raises
    :class:`UsageError` for a bad URL, :class:`ExchangeError` when no whole
    answer came in time, the server is unreachable or its body is over ``max_bytes``.
    """
    endpoint = url if isinstance(url, Endpoint) else parse_url(url)
    if not (0 < timeout_s <= MAX_TIMEOUT_S):  # NaN fails it too
        raise UsageError(
            f"a timeout of {timeout_s} s for {endpoint.shown}: not in (0, {MAX_TIMEOUT_S:g}]",
            hint="give a finite number of seconds",
        )
    start = time.monotonic()
    end = start + timeout_s if deadline is None else min(start + timeout_s, deadline)
    budget = max(0.0, end - start)
    sent = dict(headers or {})
    if endpoint.authorization is not None:
        sent["Authorization"] = endpoint.authorization
    conn = _connection(endpoint, end)
    response: http.client.HTTPResponse | None = None
    try:
        if budget <= 0:
            raise TimeoutError
        conn.request(method, endpoint.target, body=body, headers=sent)
        response = conn.getresponse()
        declared = response.getheader("Content-Length") or ""
        if (
            declared.isascii()
            and declared.isdigit()
            and (len(declared) > 18 or int(declared) > max_bytes)
        ):
            raise ExchangeError(
                endpoint.shown, f"answers {declared} bytes, over {max_bytes}", reason="too_large"
            )
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = response.read1(min(1 << 16, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                raise ExchangeError(
                    endpoint.shown, f"sent over {max_bytes} bytes", reason="too_large"
                )
        return Answer(response.status, b"".join(chunks), dict(response.getheaders()))
    except TimeoutError:
        raise ExchangeError(
            endpoint.shown, f"did not answer within {budget:.3g} s", reason="timeout"
        ) from None
    except (OSError, http.client.HTTPException) as exc:
        # An error's text names no URL (the redacted one is ours): the host and port at most.
        what = redact_url(f"{type(exc).__name__}: {exc}"[:300])
        raise ExchangeError(
            endpoint.shown, f"is unreachable ({what})", reason="unreachable", why=what
        ) from None
    finally:
        if response is not None:
            response.close()
        conn.close()


__all__ = [
    "MAX_TIMEOUT_S",
    "MAX_URL_CHARS",
    "Answer",
    "Endpoint",
    "ExchangeError",
    "exchange",
    "parse_url",
    "redact_url",
]
