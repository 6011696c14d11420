"""Progress on a terminal: a bar per transfer, a status line while cells run.

The library reports long work as events (:mod:`artifactd.events`): ``progress``
events with ``bytes`` and ``total`` for a transfer (push, fetch, image
append), and ``cell`` events (``queued``, ``start``, ``done``, ``failed``) for
a build's cells. On a terminal, :class:`Display` turns them into one line at
the bottom of the screen that is redrawn in place: a bar with the rate and
the time left for a transfer, and for cells how many are done, which run, and
for how long. Every other event prints as a line above it. Off a terminal
(a CI log), :func:`artifactd.cli.render.event_printer` prints stage lines and
nothing of this module runs.

While a cell runs, nothing reports for minutes (a torch.compile cell), so a
daemon thread redraws the status line once a second; it only ever redraws,
under the same lock as every other write, and stops with the last cell.
Standard library only: the pod-start fast path (``cli/fast.py``) loads it.
"""

from __future__ import annotations

import os
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    import threading
    from collections.abc import Callable
    from typing import Any, TextIO

#: Least time between two redraws of a transfer's bar.
REDRAW_S = 0.1
#: How often the status line is redrawn while cells run and nothing reports.
TICK_S = 1.0
#: Width of the bar itself, in characters, before the terminal's width caps it.
BAR_WIDTH = 24


def human_bytes(n: float) -> str:
    """Format a byte count for people (as :func:`artifactd.cli.render.human_bytes`)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def duration(seconds: float) -> str:
    """``7s``, ``3m05s``, ``1h02m``: short enough for a status line."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def bar(done: int, total: int, width: int = BAR_WIDTH) -> str:
    """``[#########---------------]``: ``done`` of ``total``, clamped to 0..100 %."""
    frac = min(1.0, max(0.0, done / total)) if total > 0 else 0.0
    filled = round(frac * width)
    return "[" + "#" * filled + "-" * (width - filled) + "]"


class _Transfer:
    """What one transfer's bar needs: when it started, its last size."""

    def __init__(self, now: float) -> None:
        self.started = now
        self.done = 0
        self.total = 0


class Display:
    """One redrawn status line at the bottom of a terminal, and lines above it.

    Call it with each event. ``clock`` and ``columns`` are for tests; a
    terminal's width is read at each redraw, so a resized window is followed.
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        columns: Callable[[], int] | None = None,
        tick_s: float = TICK_S,
    ) -> None:
        # lazy: a display is made on a terminal only; the fast path loads this module for
        # human_bytes, and threading is off its modules (cli/fast.py FLOOR)
        import threading  # noqa: PLC0415

        self._stream = stream if stream is not None else sys.stderr
        self._clock = clock
        self._columns = columns or self._terminal_columns
        self._tick_s = tick_s
        self._lock = threading.Lock()
        self._status = ""
        self._drawn_at = float("-inf")
        self._transfers: dict[tuple[str, str], _Transfer] = {}
        self._queued = 0
        self._finished = 0
        self._running: dict[str, float] = {}
        self._ticker: threading.Thread | None = None
        self._stop = threading.Event()

    # -- events -----------------------------------------------------------

    def __call__(self, event: dict[str, Any]) -> None:
        """Show one library event: redraw the status line, or print a line above it."""
        if event.get("event") == "progress":
            self._progress(event)
            return
        if event.get("stage") == "cell":
            self._cell(event)
        detail = " ".join(f"{k}={v}" for k, v in event.items() if k not in ("stage", "event"))
        self.line(f"[{event.get('stage')}] {event.get('event')} {detail}".rstrip())

    def _progress(self, event: dict[str, Any]) -> None:
        now = self._clock()
        key = (str(event.get("stage", "")), str(event.get("family", "")))
        transfer = self._transfers.setdefault(key, _Transfer(now))
        transfer.done = _count(event.get("bytes"))
        transfer.total = _count(event.get("total"))
        finished = transfer.total > 0 and transfer.done >= transfer.total
        if finished:
            del self._transfers[key]
            if not self._transfers:  # the last one: nothing lingers under the output
                self._drawn_at = now
                self.status(self._cells_line())
                return
        if now - self._drawn_at < REDRAW_S:
            return
        self._drawn_at = now
        self.status(self._transfer_line(key[0], now))

    def _transfer_line(self, stage: str, now: float) -> str:
        """Draw one bar for every transfer under way, summed (layers come side by side)."""
        active = list(self._transfers.items())
        done = sum(t.done for _, t in active)
        total = sum(t.total for _, t in active)
        elapsed = now - min(t.started for _, t in active)
        what = active[0][0][1] if len(active) == 1 else f"{len(active)} layers"
        parts = [f"[{stage}] {what}".rstrip(), bar(done, total)]
        if total > 0:
            parts.append(f"{100 * min(done, total) / total:.0f}%")
        parts.append(f"{human_bytes(done)} / {human_bytes(total)}")
        rate = done / elapsed if elapsed > 0 else 0.0
        if rate > 0 and elapsed >= 0.5:
            parts.append(f"{human_bytes(rate)}/s")
            if total > done:
                parts.append(f"{duration((total - done) / rate)} left")
        return "  ".join(parts)

    def _cell(self, event: dict[str, Any]) -> None:
        kind, cell = event.get("event"), str(event.get("cell", ""))
        if kind == "queued":
            self._queued += 1
        elif kind == "start":
            self._running[cell] = self._clock()
            self._start_ticker()
        elif kind in ("done", "failed"):
            self._running.pop(cell, None)
            self._finished += 1
            if not self._running:
                self._stop.set()
        self.status(self._cells_line())

    def _cells_line(self) -> str:
        if not self._running:
            return ""
        now = self._clock()
        running = ", ".join(
            f"{cell} {duration(now - since)}" for cell, since in list(self._running.items())[:3]
        )
        more = f" +{len(self._running) - 3}" if len(self._running) > 3 else ""
        total = max(self._queued, self._finished + len(self._running))
        return f"[cells] {self._finished}/{total} done; running {running}{more}"

    def _start_ticker(self) -> None:
        if self._ticker is not None and self._ticker.is_alive():
            return
        self._stop.clear()

        def tick() -> None:
            while not self._stop.wait(self._tick_s):
                self.status(self._cells_line())

        import threading  # noqa: PLC0415  # lazy: as in __init__

        self._ticker = threading.Thread(target=tick, name="artifactd-progress", daemon=True)
        self._ticker.start()

    def close(self) -> None:
        """Stop the ticker and clear the status line (the command's output follows)."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=2 * self._tick_s)
        self.status("")

    # -- drawing ----------------------------------------------------------

    def _terminal_columns(self) -> int:
        try:
            columns = os.get_terminal_size(self._stream.fileno()).columns
        except (OSError, ValueError, AttributeError):
            return 100
        return columns or 100  # a terminal of unknown size says 0

    def status(self, text: str) -> None:
        """Replace the bottom line with ``text`` (cut to the terminal's width)."""
        with self._lock:
            self._draw(text[: max(10, self._columns() - 1)])

    def line(self, text: str) -> None:
        """Print ``text`` above the status line, then draw the status line again."""
        with self._lock:
            status = self._status
            self._draw("")
            self._stream.write(text + "\n")
            self._draw(status)

    def _draw(self, text: str) -> None:
        # Under the lock: back to the line's start, the text, spaces over what
        # was longer; an emptied line leaves the cursor at its start.
        if text or self._status:
            pad = " " * max(0, len(self._status) - len(text))
            self._stream.write("\r" + text + pad + ("" if text else "\r"))
            self._stream.flush()
        self._status = text


def _count(value: object) -> int:
    """Read a byte count from an event: a non-negative int, anything else 0."""
    return value if isinstance(value, int) and value >= 0 else 0
