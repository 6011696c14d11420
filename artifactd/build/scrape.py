"""Reading a metrics source: a saved scrape or an http(s) ``/metrics`` URL, bounded.

A source is untrusted: a file is read as a regular file (a FIFO never waited
on) of at most :data:`MAX_EXPOSITION_BYTES`; a URL is fetched with the whole
exchange (connect, headers, body) within a deadline and the body cut at the
same cap; the bytes must be UTF-8 text without NUL. Bad content is a
:class:`~artifactd.errors.ConfigError` (exit 2) naming the source; an
unreachable, failing or silent URL a :class:`~artifactd.errors.StoreError` (exit 3).
"""

from __future__ import annotations

import time
from pathlib import Path

from artifactd.errors import ConfigError, StoreError, UsageError
from artifactd.fsutil import text_problem

#: Largest exposition read from one source, in bytes. A busy vLLM's /metrics
#: is tens of kilobytes; a bigger input is refused before it is parsed (4 MiB
#: parse in about 3 s on one core).
MAX_EXPOSITION_BYTES = 4 << 20
#: Longest a URL may take to answer in full (connect, headers and body), in seconds.
FETCH_TIMEOUT_S = 10.0


def is_url(source: str) -> bool:
    """Whether ``source`` names an http(s) endpoint rather than a file."""
    return source.startswith(("http://", "https://"))


def read_source(
    source: str, *, timeout_s: float = FETCH_TIMEOUT_S, max_bytes: int = MAX_EXPOSITION_BYTES
) -> str:
    """Return the exposition text of a file or an http(s) URL, bounded in size and time."""
    data = _fetch(source, timeout_s, max_bytes) if is_url(source) else _read_file(source, max_bytes)
    problem = text_problem(data)
    if problem is not None:
        raise ConfigError(
            f"metrics source {source} {problem}",
            hint="give the Prometheus text exposition of /metrics",
        )
    return data.decode("utf-8")


def _read_file(source: str, max_bytes: int) -> bytes:
    from artifactd.fsutil import InputFileError, read_regular

    try:
        # Followed: a scrape saved next to a checkout may be a symlink; a FIFO must not hang.
        return read_regular(Path(source), max_bytes, follow=True)
    except InputFileError as exc:
        if exc.reason == "too_large":
            raise ConfigError(
                f"metrics file {source} is over {max_bytes} bytes",
                hint="an engine's /metrics is tens of kilobytes; check that this is the file",
            ) from None
        raise ConfigError(
            f"metrics file {exc}",
            hint="give a saved /metrics scrape (curl -s http://POD:PORT/metrics > FILE) or a URL",
        ) from None


def _fetch(url: str, timeout_s: float, max_bytes: int) -> bytes:
    """GET ``url``: the whole exchange within ``timeout_s``, at most ``max_bytes`` of body.

    http.client, not a proxy-aware opener: a /metrics endpoint is in the
    cluster, and every environment variable artifactd reads is one it names.
    """
    # Imported here: the command line imports this module for its defaults, fast.
    import http.client
    import urllib.parse

    hint = "check the URL (http://POD:PORT/metrics) and that the engine is up"
    parts = urllib.parse.urlsplit(url)
    if not parts.hostname:
        raise UsageError(f"metrics URL {url} names no host", hint=hint)
    deadline = time.monotonic() + timeout_s
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = kind(parts.hostname, parts.port, timeout=timeout_s)
    try:
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn.request("GET", target, headers={"Accept": "text/plain"})
        response = conn.getresponse()
        if response.status != http.client.OK:
            raise StoreError(f"metrics source {url} answered HTTP {response.status}", hint=hint)
        declared = response.getheader("Content-Length") or ""
        if declared.isdigit() and int(declared) > max_bytes:
            raise ConfigError(
                f"metrics source {url} answers {declared} bytes, over {max_bytes}",
                hint="an engine's /metrics is tens of kilobytes",
            )
        chunks: list[bytes] = []
        size = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            if conn.sock is not None:  # each read gets only the time that is left
                conn.sock.settimeout(left)
            chunk = response.read1(min(1 << 16, max_bytes + 1 - size))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                raise ConfigError(
                    f"metrics source {url} sent over {max_bytes} bytes",
                    hint="an engine's /metrics is tens of kilobytes",
                )
    except TimeoutError:
        raise StoreError(
            f"metrics source {url} did not answer within {timeout_s:g} s", hint=hint
        ) from None
    except (OSError, http.client.HTTPException) as exc:
        raise StoreError(f"metrics source {url} is unreachable: {exc}", hint=hint) from None
    finally:
        conn.close()
