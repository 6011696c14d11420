"""A throttling TCP proxy: a slow link between a client and a loopback registry.

:class:`Throttle` listens on a free ``127.0.0.1`` port and forwards every
connection, byte for byte, to an upstream ``HOST:PORT`` (one upstream
connection per client connection). It never parses HTTP, so whatever speaks
to it (artifactd, skopeo, curl) sees the registry exactly as it is, only
slower:

* bandwidth: a token bucket per direction for the whole link (``rate_bps``,
  in bits/s) and, optionally, one per connection and direction
  (``per_conn_bps``), each with a burst of ``burst_s`` seconds of its rate;
* latency: ``rtt_s`` is added once to every connection's setup (the TCP
  handshake) and to every chunk the client sends (requests are small, so
  each request reaches the registry a round trip later; response bytes are
  paced, not delayed, which is what a link does to a stream once it flows).

tests/faultproxy.py is an HTTP-level proxy (it parses requests and re-emits
responses through http.client, in Python, chunk by chunk); on a two-core
machine that costs as much CPU as the client it measures, so this proxy
moves bytes at the TCP level instead, with ``os.splice`` where the platform
has it (the payload never enters Python). Per connection it runs one thread
per direction; :attr:`Throttle.stats` counts connections, the most open at
once and the bytes moved each way.

As a command, it runs until interrupted::

    python bench/throttle.py --upstream 127.0.0.1:5000 --rate 1g [--per-conn 400m] [--rtt-ms 0.5]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import socket
import threading
import time
from dataclasses import dataclass

#: Bytes moved per step: one read from the source, paid for, then written.
CHUNK = 256 << 10
_UNITS = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9}


def parse_rate(text: str) -> float | None:
    """``1g``, ``1gbit``, ``400m``, ``2.5e9`` (bits/s); ``0``/``none``/``off``: no limit."""
    t = text.strip().lower().removesuffix("bit/s").removesuffix("bps").removesuffix("bit")
    if t in ("", "0", "none", "off", "inf"):
        return None
    unit = t[-1] if t[-1] in "kmg" else ""
    value = float(t[: len(t) - len(unit)]) * _UNITS[unit]
    if value <= 0:
        raise ValueError(f"rate {text!r} is not positive")
    return value


def format_rate(bps: float | None) -> str:
    """A rate in bits/s as people write it: ``1 Gbit/s``, ``400 Mbit/s``, ``unlimited``."""
    if bps is None:
        return "unlimited"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if bps >= scale:
            return f"{bps / scale:g} {unit}bit/s"
    return f"{bps:g} bit/s"


class TokenBucket:
    """A token bucket in bytes, shared by threads; callers pay after they read (debt allowed).

    :meth:`take` charges ``n`` bytes and returns how long the caller must wait
    before sending them: the bucket may go into debt, and later callers queue
    behind it, so the long-run rate never exceeds ``rate`` and concurrent
    connections share it about evenly.
    """

    def __init__(self, rate_bytes: float, burst_bytes: float) -> None:
        self.rate = rate_bytes
        self.burst = max(burst_bytes, 1.0)
        self._tokens = self.burst
        self._stamp = time.monotonic()
        self._lock = threading.Lock()

    def take(self, n: int) -> float:
        """Charge ``n`` bytes; return the seconds to wait before sending them."""
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now
            self._tokens -= n
            return -self._tokens / self.rate if self._tokens < 0 else 0.0


@dataclass
class Stats:
    """What the proxy moved."""

    connections: int = 0
    open_now: int = 0
    #: The most connections open at once: how many fetches ran concurrently.
    peak_open: int = 0
    bytes_down: int = 0
    bytes_up: int = 0


def _bucket(bps: float | None, burst_s: float) -> TokenBucket | None:
    if bps is None:
        return None
    rate = bps / 8
    return TokenBucket(rate, max(rate * burst_s, CHUNK))


class Throttle:
    """A bandwidth- and latency-limited TCP proxy to ``upstream`` on a free loopback port."""

    def __init__(
        self,
        upstream: str,
        *,
        rate_bps: float | None,
        per_conn_bps: float | None = None,
        rtt_s: float = 0.0,
        burst_s: float = 0.002,
        zero_copy: bool = True,
    ) -> None:
        host, _, port = upstream.rpartition(":")
        self.upstream = (host, int(port))
        self.rate_bps = rate_bps
        self.per_conn_bps = per_conn_bps
        self.rtt_s = rtt_s
        self.burst_s = burst_s
        self.zero_copy = zero_copy and hasattr(os, "splice")
        self.stats = Stats()
        self._down = _bucket(rate_bps, burst_s)
        self._up = _bucket(rate_bps, burst_s)
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self._listener.settimeout(0.1)
        self.port = int(self._listener.getsockname()[1])
        self.host = f"127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._socks: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._acceptor = threading.Thread(target=self._accept_loop, daemon=True)
        self._acceptor.start()

    def ref(self, repo: str) -> str:
        """``127.0.0.1:PORT/REPO`` through this proxy."""
        return f"{self.host}/{repo}"

    def reset_stats(self) -> None:
        """Start counting afresh (connections still open stay counted as open)."""
        with self._lock:
            self.stats = Stats(open_now=self.stats.open_now, peak_open=self.stats.open_now)

    def close(self) -> None:
        """Stop listening and cut every open connection."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        self._acceptor.join(timeout=5)
        with self._lock:
            socks = list(self._socks)
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        for t in list(self._threads):
            t.join(timeout=5)

    def __enter__(self) -> Throttle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals --------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            t = threading.Thread(target=self._connect, args=(conn,), daemon=True)
            with self._lock:
                self._threads = [x for x in self._threads if x.is_alive()] + [t]
            t.start()

    def _connect(self, client: socket.socket) -> None:
        if self.rtt_s:
            time.sleep(self.rtt_s)  # the handshake's round trip
        try:
            upstream = socket.create_connection(self.upstream, timeout=10)
        except OSError:
            client.close()
            return
        for s in (client, upstream):
            s.settimeout(None)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            self._socks.update((client, upstream))
            st = self.stats
            st.connections += 1
            st.open_now += 1
            st.peak_open = max(st.peak_open, st.open_now)
        conn_down = _bucket(self.per_conn_bps, self.burst_s)
        conn_up = _bucket(self.per_conn_bps, self.burst_s)
        up = threading.Thread(
            target=self._pump,
            args=(client, upstream, (self._up, conn_up), self.rtt_s, False),
            daemon=True,
        )
        up.start()
        self._pump(upstream, client, (self._down, conn_down), 0.0, True)
        up.join()
        for s in (client, upstream):
            with contextlib.suppress(OSError):
                s.close()
        with self._lock:
            self._socks.difference_update((client, upstream))
            self.stats.open_now -= 1

    def _pump(
        self,
        src: socket.socket,
        dst: socket.socket,
        buckets: tuple[TokenBucket | None, TokenBucket | None],
        delay: float,
        down: bool,
    ) -> None:
        """Move ``src`` -> ``dst`` until EOF, paced by ``buckets``, each chunk ``delay`` late."""
        mover = _Splicer(src, dst) if self.zero_copy else _Copier(src, dst)
        try:
            while n := mover.read():
                arrived = time.monotonic()
                wait = max((b.take(n) for b in buckets if b is not None), default=0.0)
                wait = max(wait, arrived + delay - time.monotonic())
                if wait > 0:
                    time.sleep(wait)
                mover.write(n)
                with self._lock:
                    if down:
                        self.stats.bytes_down += n
                    else:
                        self.stats.bytes_up += n
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
        except OSError:
            # One side is gone: cut both, so the other direction's thread ends too.
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
        finally:
            mover.close()


class _Copier:
    """Moves a chunk through a buffer in Python (where there is no ``os.splice``)."""

    def __init__(self, src: socket.socket, dst: socket.socket) -> None:
        self._src, self._dst = src, dst
        self._buf = bytearray(CHUNK)
        self._view = memoryview(self._buf)

    def read(self) -> int:
        return self._src.recv_into(self._buf)

    def write(self, n: int) -> None:
        self._dst.sendall(self._view[:n])

    def close(self) -> None:
        self._view.release()


class _Splicer:
    """Moves a chunk socket -> pipe -> socket with ``splice(2)``: the bytes never enter Python."""

    def __init__(self, src: socket.socket, dst: socket.socket) -> None:
        self._src, self._dst = src.fileno(), dst.fileno()
        self._r, self._w = os.pipe()
        with contextlib.suppress(OSError, AttributeError):
            fcntl.fcntl(self._w, fcntl.F_SETPIPE_SZ, CHUNK)

    def read(self) -> int:
        return os.splice(self._src, self._w, CHUNK)

    def write(self, n: int) -> None:
        while n:
            n -= os.splice(self._r, self._dst, n)

    def close(self) -> None:
        os.close(self._r)
        os.close(self._w)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="HOST:PORT to forward to")
    parser.add_argument("--rate", default="1g", help="link rate, bits/s (1g, 400m, off)")
    parser.add_argument("--per-conn", default="off", help="rate per connection, bits/s")
    parser.add_argument("--rtt-ms", type=float, default=0.0, help="added round trip, ms")
    args = parser.parse_args()
    proxy = Throttle(
        args.upstream,
        rate_bps=parse_rate(args.rate),
        per_conn_bps=parse_rate(args.per_conn),
        rtt_s=args.rtt_ms / 1000,
    )
    print(
        f"{proxy.host} -> {args.upstream}: {format_rate(proxy.rate_bps)} "
        f"(per connection {format_rate(proxy.per_conn_bps)}), +{args.rtt_ms:g} ms RTT",
        flush=True,
    )
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        proxy.close()
        s = proxy.stats
        print(f"{s.connections} connections (peak {s.peak_open} open), {s.bytes_down} bytes down")


if __name__ == "__main__":
    main()
