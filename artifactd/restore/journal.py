"""The journal of an install in progress: ``<target>/.artifactd/journal.json``.

Written before the first directory is swapped and removed after the marker
(:mod:`artifactd.restore.marker`), so a restore that was killed in between is repaired
(rolled back, or finished when the new marker had already been written) by the
next one, and a no-op check never trusts a marker while a journal exists. Read
and written with :func:`artifactd.restore.marker.load` / :func:`~artifactd.restore.marker.dump`.
Only an install or a repair imports this module: a no-op restore checks only
that no journal file exists.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Literal

from artifactd.restore.marker import STRICT


@dataclass(frozen=True)
class JournalEntry:
    """One directory swap a restore is about to make.

    ``dest`` is the live directory; ``staged`` the new tree, which after the
    swap holds the old one (or nothing, when ``dest`` did not exist before).
    ``new_inode`` identifies the new tree, so recovery can tell, after a crash,
    whether ``dest`` already holds it.
    """

    __pydantic_config__: typing.ClassVar[dict[str, str]] = STRICT

    family: str
    dest: str
    staged: str
    new_inode: list[int]
    had_old: bool


@dataclass(frozen=True)
class RestoreJournal:
    """``<target>/.artifactd/journal.json``: the intent of an install in progress."""

    __pydantic_config__: typing.ClassVar[dict[str, str]] = STRICT

    run_id: str
    staging: str
    entries: list[JournalEntry]
    #: sha256 of the exact bytes of the marker this install commits with.
    marker_sha256: str
    env_file: str
    env_text: str
    schema_version: Literal[1] = 1
    started_at: float = field(default=0.0)
