"""Reading a metrics source: a saved scrape or an http(s) ``/metrics`` URL, bounded.

A source is untrusted: a file is read as a regular file (a FIFO never waited
on) of at most :data:`MAX_EXPOSITION_BYTES`; a URL is fetched with the whole
exchange (connect, headers, body) within a deadline and the body cut at the
same cap; the bytes must be UTF-8 text without NUL. Bad content is a
:class:`~artifactd.errors.ConfigError` (exit 2) naming the source; an
unreachable, failing or silent URL a :class:`~artifactd.errors.StoreError` (exit 3).
"""

from __future__ import annotations

from pathlib import Path

from artifactd.errors import ConfigError, StoreError
from artifactd.fsutil import InputFileError, read_regular, text_problem

#: Largest exposition read from one source, in bytes. A busy vLLM's /metrics
#: is tens of kilobytes; a bigger input is refused before it is parsed (4 MiB
#: parse in about 3 s on one core).
MAX_EXPOSITION_BYTES = 4 << 20
#: Longest a URL may take to answer in full (connect, headers and body), in seconds.
FETCH_TIMEOUT_S = 10.0


def is_url(source: str) -> bool:
    """Whether ``source`` names an http(s) endpoint rather than a file."""
    return source.startswith(("http://", "https://"))


def shown(source: str) -> str:
    """How a source is named in messages and results: a URL without its password."""
    # lazy: artifactd.cli.shapes imports this module for its option default at every
    # click start; http.client and ssl load only to fetch (tests/test_startup.py)
    from artifactd.boundedhttp import redact_url  # noqa: PLC0415

    return redact_url(source) if is_url(source) else source


def read_source(
    source: str, *, timeout_s: float = FETCH_TIMEOUT_S, max_bytes: int = MAX_EXPOSITION_BYTES
) -> str:
    """Return the exposition text of a file or an http(s) URL, bounded in size and time."""
    data = _fetch(source, timeout_s, max_bytes) if is_url(source) else _read_file(source, max_bytes)
    problem = text_problem(data)
    if problem is not None:
        raise ConfigError(
            f"metrics source {shown(source)} {problem}",
            hint="give the Prometheus text exposition of /metrics",
        )
    return data.decode("utf-8")


def _read_file(source: str, max_bytes: int) -> bytes:
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

    :func:`artifactd.boundedhttp.exchange`: one deadline over connect, status
    line, headers and body; no proxy (a /metrics endpoint is in the cluster);
    a password in the URL never shown.
    """
    # lazy: as in shown()
    from artifactd.boundedhttp import ExchangeError, exchange, parse_url  # noqa: PLC0415

    hint = "check the URL (http://POD:PORT/metrics) and that the engine is up"
    endpoint = parse_url(url, "metrics URL")
    try:
        answer = exchange(
            endpoint, timeout_s=timeout_s, max_bytes=max_bytes, headers={"Accept": "text/plain"}
        )
    except ExchangeError as exc:
        if exc.reason == "too_large":
            raise ConfigError(
                f"metrics source {exc}", hint="an engine's /metrics is tens of kilobytes"
            ) from None
        raise StoreError(f"metrics source {exc}", hint=hint) from None
    if answer.status != 200:
        raise StoreError(
            f"metrics source {endpoint.shown} answered HTTP {answer.status}", hint=hint
        )
    return answer.body
