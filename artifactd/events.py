"""Structured progress events: the library reports, the caller decides how to show them.

An event is a flat JSON-able dict with at least ``stage`` and ``event``; the CLI
prints them as JSON lines (``--json``) or folds them into human text.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeAlias

    Event: TypeAlias = dict[str, Any]
    EventSink: TypeAlias = Callable[[Event], None]
else:
    # The same names at run time, for the modules that import them there: typing is
    # off a pod start's first modules (artifactd/cli/fast.py), and no code reads them.
    Event = dict
    EventSink = object


def discard(event: Event) -> None:
    """Drop an event: the library's default sink."""
    del event
