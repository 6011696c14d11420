"""A small fault-injecting HTTP/1.1 proxy to put in front of a registry.

:class:`FaultProxy` listens on a free ``127.0.0.1`` port and forwards every
request to an upstream ``HOST:PORT`` (one upstream connection per client
connection, keep-alive on both sides). Faults are switched at runtime, from
any thread, and apply to the requests that arrive after the switch:

* :meth:`FaultProxy.fail_next` / :meth:`FaultProxy.fail_always`: answer with
  an HTTP 5xx (or 429) without forwarding (a burst, or an outage), with a
  ``Retry-After`` header when given one;
* :meth:`FaultProxy.cut_blobs`: forward a blob download but close the
  connection after ``after`` bytes of its body;
* :meth:`FaultProxy.drip_blobs`: forward a blob download ``chunk`` bytes at a
  time, one chunk every ``every`` seconds;
* :meth:`FaultProxy.corrupt_blobs`: flip bytes of a blob download, keeping its
  length (the digest no longer matches);
* :attr:`FaultProxy.on_blob_get`: a callback run with the digest before a
  blob download is forwarded (to fill a disk at the worst moment, say);
* :meth:`FaultProxy.rewrite`: forward GETs whose path matches, then hand
  each 200 answer's headers and whole body to a function that returns the
  ones sent instead (a crafted ``Link`` header, a malformed tag list), the
  registry's own challenges and errors passing through untouched.

Body faults apply to ``GET /v2/<repo>/blobs/sha256:<hex>`` requests, all of
them or only those whose digest is in ``digests``; with ``path`` (a regular
expression searched in the request path) to the GETs it matches instead, such
as manifests. Every request is recorded
in :attr:`FaultProxy.log` (method, path, status, the fault applied, the
``Authorization`` header, when it arrived), so tests and benchmarks can count
requests and retries, time the waits between them, and see which credentials a
registry was sent.

Only as much HTTP as that needs is parsed: request lines, headers and
``Content-Length`` or chunked request bodies; responses come from
:mod:`http.client` (which decodes chunked upstream bodies) and are re-emitted
with a ``Content-Length``, streamed when upstream gave one.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import BinaryIO

_BLOB_GET = re.compile(r"^/v2/.+/blobs/(sha256:[0-9a-f]{64})(?:\?.*)?$")
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
}
_STREAM_CHUNK = 64 << 10


@dataclass
class Record:
    """One request the proxy saw."""

    method: str
    path: str
    status: int | None = None
    #: The fault applied: "5xx", "cut", "drip", "corrupt", "rewrite", "upstream-down", or None.
    fault: str | None = None
    #: Body bytes sent back to the client.
    sent: int = 0
    #: The request's ``Authorization`` header as the client sent it, or None.
    authorization: str | None = None
    #: Every request header as the client sent it (hop-by-hop ones aside).
    headers: dict[str, str] = field(default_factory=dict)
    #: ``time.monotonic()`` when the request had arrived.
    at: float = field(default_factory=time.monotonic)

    @property
    def blob_digest(self) -> str | None:
        """The digest of a blob GET, else None."""
        if self.method != "GET":
            return None
        m = _BLOB_GET.match(self.path)
        return m.group(1) if m else None


@dataclass
class _BodyFault:
    kind: str  # "cut" | "drip" | "corrupt"
    digests: frozenset[str] | None
    path: re.Pattern[str] | None = None
    after: int = 0
    chunk: int = 1
    every: float = 0.25
    offsets: tuple[int, ...] | None = None
    times: int | None = None  # None: every matching request

    def matches(self, rec: Record) -> bool:
        if self.path is not None:
            return rec.method == "GET" and self.path.search(rec.path) is not None
        digest = rec.blob_digest
        return digest is not None and (self.digests is None or digest in self.digests)


@dataclass
class _Faults:
    fail_left: int = 0
    fail_forever: bool = False
    fail_status: int = 503
    #: A header value, or a function giving it when the answer is sent (an HTTP
    #: date relative to the answer, not to when the test set the fault).
    retry_after: str | Callable[[], str] | None = None
    blob: _BodyFault | None = None


#: Given a request's path, and its answer's headers and body, return those sent instead.
Rewriter = Callable[[str, list[tuple[str, str]], bytes], tuple[list[tuple[str, str]], bytes]]


class _ClosedError(Exception):
    """The client connection is gone (or was cut on purpose)."""


class FaultProxy:
    """A threaded TCP proxy for HTTP/1.1 with switchable faults."""

    def __init__(self, upstream: str, *, upstream_timeout: float = 30.0) -> None:
        host, _, port = upstream.rpartition(":")
        self.upstream = (host, int(port))
        self.upstream_timeout = upstream_timeout
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port = int(self._listener.getsockname()[1])
        self.host = f"127.0.0.1:{self.port}"
        self.log: list[Record] = []
        #: Called with the digest before a blob GET is forwarded.
        self.on_blob_get: Callable[[str], None] | None = None
        self._rewrites: list[tuple[re.Pattern[str], Rewriter]] = []
        self._faults = _Faults()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._conns: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._acceptor = threading.Thread(target=self._accept_loop, daemon=True)
        self._acceptor.start()

    # -- public API -------------------------------------------------------
    def ref(self, repo: str) -> str:
        """``127.0.0.1:PORT/REPO`` through this proxy."""
        return f"{self.host}/{repo}"

    def fail_next(
        self, n: int, status: int = 503, *, retry_after: str | Callable[[], str] | None = None
    ) -> None:
        """Answer the next ``n`` requests with ``status`` (and ``Retry-After``) unforwarded."""
        with self._lock:
            self._faults.fail_left = n
            self._faults.fail_forever = False
            self._faults.fail_status = status
            self._faults.retry_after = retry_after

    def fail_always(self, status: int = 503, *, retry_after: str | None = None) -> None:
        """Answer every request with ``status`` (and ``Retry-After``) until :meth:`clear`."""
        with self._lock:
            self._faults.fail_forever = True
            self._faults.fail_status = status
            self._faults.retry_after = retry_after

    def cut_blobs(
        self,
        after: int,
        *,
        digests: Iterable[str] | None = None,
        path: str | None = None,
        times: int | None = None,
    ) -> None:
        """Close the connection after ``after`` body bytes of matching blob GETs."""
        self._set_blob(_BodyFault("cut", _set(digests), _re(path), after=after, times=times))

    def drip_blobs(
        self,
        chunk: int = 1,
        every: float = 0.25,
        *,
        digests: Iterable[str] | None = None,
        path: str | None = None,
        times: int | None = None,
    ) -> None:
        """Send matching blob bodies ``chunk`` bytes every ``every`` seconds."""
        fault = _BodyFault("drip", _set(digests), _re(path), chunk=chunk, every=every, times=times)
        self._set_blob(fault)

    def corrupt_blobs(
        self,
        *,
        digests: Iterable[str] | None = None,
        offsets: Iterable[int] | None = None,
        path: str | None = None,
        times: int | None = None,
    ) -> None:
        """Flip (XOR 0xFF) body bytes of matching blob GETs; the length is kept.

        ``offsets`` default to the middle byte of the body.
        """
        offs = tuple(offsets) if offsets is not None else None
        fault = _BodyFault("corrupt", _set(digests), _re(path), offsets=offs, times=times)
        self._set_blob(fault)

    def rewrite(self, path: str, rewriter: Rewriter) -> None:
        """Rewrite the 200 answers to GETs whose path ``path`` (a regex) matches, until cleared."""
        with self._lock:
            self._rewrites.append((re.compile(path), rewriter))

    def clear(self) -> None:
        """Remove every fault and rewrite: forward faithfully again."""
        with self._lock:
            self._faults = _Faults()
            self._rewrites = []

    def reset_log(self) -> None:
        """Forget the recorded requests."""
        with self._lock:
            self.log.clear()

    def records(
        self, *, method: str | None = None, fault: str | None = None, blob: bool | None = None
    ) -> list[Record]:
        """Recorded requests, filtered by method, fault, and whether they are blob GETs."""
        with self._lock:
            out = list(self.log)
        return [
            r
            for r in out
            if (method is None or r.method == method)
            and (fault is None or r.fault == fault)
            and (blob is None or (r.blob_digest is not None) == blob)
        ]

    def count(self, **filters: object) -> int:
        """How many requests :meth:`records` returns for ``filters``."""
        return len(self.records(**filters))  # type: ignore[arg-type]

    def blob_gets(self, digests: Iterable[str] | None = None) -> list[Record]:
        """Blob GETs seen, optionally only those for ``digests``."""
        wanted = _set(digests)
        return [
            r
            for r in self.records(blob=True)
            if wanted is None or (r.blob_digest is not None and r.blob_digest in wanted)
        ]

    def close(self) -> None:
        """Stop listening and cut every open connection; the port then refuses."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        self._acceptor.join(timeout=5)
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for t in list(self._threads):
            t.join(timeout=5)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals --------------------------------------------------------
    def _set_blob(self, fault: _BodyFault) -> None:
        with self._lock:
            self._faults.blob = fault

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            with self._lock:
                self._conns.add(conn)
                self._threads = [x for x in self._threads if x.is_alive()] + [t]
            t.start()

    def _take_fault(self, rec: Record) -> tuple[int | None, str | None, _BodyFault | None]:
        """Decide, atomically, what happens to this request: (status, Retry-After, body fault)."""
        with self._lock:
            self.log.append(rec)
            f = self._faults
            if f.fail_forever or f.fail_left > 0:
                if not f.fail_forever:
                    f.fail_left -= 1
                rec.fault = "5xx"
                after = f.retry_after() if callable(f.retry_after) else f.retry_after
                return f.fail_status, after, None
            blob = f.blob
            if blob is not None and blob.matches(rec):
                if blob.times is not None:
                    if blob.times <= 0:
                        return None, None, None
                    blob.times -= 1
                rec.fault = blob.kind
                return None, None, blob
        return None, None, None

    def _serve(self, conn: socket.socket) -> None:
        rfile = conn.makefile("rb")
        upstream: http.client.HTTPConnection | None = None
        try:
            while not self._stop.is_set():
                request = _read_request(rfile)
                if request is None:
                    return
                method, path, headers, body = request
                auth = [v for k, v in headers.items() if k.lower() == "authorization"]
                rec = Record(
                    method, path, authorization=auth[0] if auth else None, headers=dict(headers)
                )
                status, retry_after, blob_fault = self._take_fault(rec)
                if status is not None:
                    rec.status = status
                    _send_error(conn, status, head=method == "HEAD", retry_after=retry_after)
                    continue
                hook = self.on_blob_get
                if hook is not None and rec.blob_digest is not None:
                    hook(rec.blob_digest)
                if upstream is None:
                    upstream = http.client.HTTPConnection(
                        *self.upstream, timeout=self.upstream_timeout
                    )
                try:
                    upstream.request(method, path, body=body, headers=headers)
                    resp = upstream.getresponse()
                except (OSError, http.client.HTTPException):
                    rec.fault = rec.fault or "upstream-down"
                    return  # the client sees its connection closed, like a dead registry
                rec.status = resp.status
                self._relay(conn, method, resp, rec, blob_fault)
                if resp.will_close:
                    upstream.close()
                    upstream = None
        except _ClosedError:
            return
        except OSError:
            return
        finally:
            if upstream is not None:
                upstream.close()
            with contextlib.suppress(OSError):
                rfile.close()
            with contextlib.suppress(OSError):
                conn.close()
            with self._lock:
                self._conns.discard(conn)

    def _rewriter(self, rec: Record) -> Rewriter | None:
        with self._lock:
            found = [fn for pat, fn in self._rewrites if pat.search(rec.path)]
        if rec.method != "GET" or not found:
            return None
        rec.fault = "rewrite"
        return found[0]

    def _send_rewritten(
        self, conn: socket.socket, resp: http.client.HTTPResponse, rec: Record, fn: Rewriter
    ) -> None:
        headers = [
            (k, v)
            for k, v in resp.getheaders()
            if k.lower() not in _HOP_BY_HOP and k.lower() != "content-length"
        ]
        headers, body = fn(rec.path, headers, resp.read())
        _send_head(conn, 200, "OK", [*headers, ("Content-Length", str(len(body)))])
        self._sendall(conn, body, rec)

    def _relay(
        self,
        conn: socket.socket,
        method: str,
        resp: http.client.HTTPResponse,
        rec: Record,
        fault: _BodyFault | None,
    ) -> None:
        """Send ``resp`` to the client with ``fault`` (raise _ClosedError when it cut)."""
        rewriter = self._rewriter(rec) if resp.status == 200 else None
        if rewriter is not None:
            self._send_rewritten(conn, resp, rec, rewriter)
            return
        headers = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP_BY_HOP]
        no_body = method == "HEAD" or resp.status in (204, 304) or 100 <= resp.status < 200
        if no_body:
            resp.read()
            _send_head(conn, resp.status, resp.reason, headers)
            return
        length = resp.length  # None when upstream sent chunked or no length
        chunks: Iterable[bytes]
        if length is None:
            data = resp.read()
            length = len(data)
            chunks = [data] if data else []
        else:
            chunks = iter(lambda: resp.read(_STREAM_CHUNK), b"")
        headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
        headers.append(("Content-Length", str(length)))
        _send_head(conn, resp.status, resp.reason, headers)
        self._body(conn, chunks, length, rec, fault)

    def _body(
        self,
        conn: socket.socket,
        chunks: Iterable[bytes],
        length: int,
        rec: Record,
        fault: _BodyFault | None,
    ) -> None:
        """Send the body chunks, applying ``fault`` (cut, drip or corrupt)."""
        flips: set[int] = set()
        if fault is not None and fault.kind == "corrupt":
            flips = set(fault.offsets if fault.offsets is not None else (length // 2,))
        pos = 0
        for chunk in chunks:
            data = _flip(chunk, pos, flips) if flips else chunk
            if fault is not None and fault.kind == "cut" and pos + len(data) >= fault.after:
                self._sendall(conn, data[: max(0, fault.after - pos)], rec)
                _cut(conn)
                raise _ClosedError
            if fault is not None and fault.kind == "drip":
                for i in range(0, len(data), fault.chunk):
                    self._sendall(conn, data[i : i + fault.chunk], rec)
                    if self._stop.wait(fault.every):
                        raise _ClosedError
            else:
                self._sendall(conn, data, rec)
            pos += len(data)

    @staticmethod
    def _sendall(conn: socket.socket, data: bytes, rec: Record) -> None:
        try:
            conn.sendall(data)
        except OSError:
            raise _ClosedError from None
        rec.sent += len(data)


def _flip(data: bytes, pos: int, offsets: set[int]) -> bytes:
    """XOR 0xFF the bytes of ``data`` (at body offset ``pos``) that fall on ``offsets``."""
    buf = bytearray(data)
    for off in offsets:
        if pos <= off < pos + len(buf):
            buf[off - pos] ^= 0xFF
    return bytes(buf)


def _re(path: str | None) -> re.Pattern[str] | None:
    return None if path is None else re.compile(path)


def _set(digests: Iterable[str] | None) -> frozenset[str] | None:
    return None if digests is None else frozenset(digests)


def _cut(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_RDWR)


#: The first byte of a TLS handshake record.
_TLS_HANDSHAKE = b"\x16"


def _read_request(rfile: io.BufferedReader) -> tuple[str, str, dict[str, str], bytes | None] | None:
    """Read one request (line, headers, body); None at end of connection.

    A TLS ClientHello (skopeo tries TLS first) is refused on its first byte:
    waiting for a line end it may not have would stall the client until its
    handshake timeout, before it falls back to plain HTTP.
    """
    if rfile.peek(1)[:1] == _TLS_HANDSHAKE:
        raise _ClosedError
    line = rfile.readline(65537)
    while line in (b"\r\n", b"\n"):
        line = rfile.readline(65537)
    if not line:
        return None
    parts = line.decode("latin-1").split()
    if len(parts) != 3:
        raise _ClosedError
    method, path, _version = parts
    msg = http.client.parse_headers(rfile)
    headers = {k: v for k, v in msg.items() if k.lower() not in _HOP_BY_HOP}
    body: bytes | None = None
    if "chunked" in (msg.get("Transfer-Encoding") or "").lower():
        body = _read_chunked(rfile)
        headers["Content-Length"] = str(len(body))
    elif msg.get("Content-Length"):
        body = rfile.read(int(msg["Content-Length"]))
    return method, path, headers, body


def _read_chunked(rfile: BinaryIO) -> bytes:
    out = bytearray()
    while True:
        size_line = rfile.readline(1024)
        if not size_line:
            raise _ClosedError
        size = int(size_line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            while rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return bytes(out)
        out += rfile.read(size)
        rfile.readline(3)


def _send_head(
    conn: socket.socket, status: int, reason: str, headers: list[tuple[str, str]]
) -> None:
    lines = [f"HTTP/1.1 {status} {reason}"] + [f"{k}: {v}" for k, v in headers]
    try:
        conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    except OSError:
        raise _ClosedError from None


def _send_error(
    conn: socket.socket, status: int, *, head: bool, retry_after: str | None = None
) -> None:
    body = b'{"errors":[{"code":"UNAVAILABLE","message":"injected by faultproxy"}]}'
    reason = http.client.responses.get(status, "Error")
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    if retry_after is not None:
        headers.append(("Retry-After", retry_after))
    _send_head(conn, status, reason, headers)
    if not head:
        try:
            conn.sendall(body)
        except OSError:
            raise _ClosedError from None
