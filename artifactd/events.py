"""Structured progress events: the library reports, the caller decides how to show them.

An event is a flat JSON-able dict with at least ``stage`` and ``event``; the CLI
prints them as JSON lines (``--json``) or folds them into human text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Event = dict[str, Any]
EventSink = Callable[[Event], None]


def discard(event: Event) -> None:
    """Drop an event: the library's default sink."""
    del event
