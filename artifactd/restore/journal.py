"""The journal of an install in progress: ``<target>/.artifactd/journal.json``.

Written before the first directory is swapped and removed after the marker
(:mod:`artifactd.restore.marker`), so a restore that was killed in between is repaired
(rolled back, or finished when the new marker had already been written) by the
next one, and a no-op check never trusts a marker while a journal exists. Read
and written with :func:`artifactd.restore.marker.load` (against :data:`RESTORE_JOURNAL`,
the shape of :class:`RestoreJournal` as data) / :func:`~artifactd.restore.marker.dump`.
Only an install or a repair imports this module: a no-op restore checks only
that no journal file exists.
"""

from __future__ import annotations

from typing import Literal, TypedDict

from artifactd.restore.marker import STRICT

TYPE_CHECKING = False
if TYPE_CHECKING:
    from artifactd.restore.marker import Shape


class JournalEntry(TypedDict):
    """One directory swap a restore is about to make.

    ``dest`` is the live directory; ``staged`` the new tree, which after the
    swap holds the old one (or nothing, when ``dest`` did not exist before).
    ``new_inode`` identifies the new tree, so recovery can tell, after a crash,
    whether ``dest`` already holds it.
    """

    family: str
    dest: str
    staged: str
    new_inode: list[int]
    had_old: bool


class _RestoreJournalOptional(TypedDict, total=False):
    #: Always written; absent from a journal written by hand (a test's forgery) or
    #: an older release, where it reads as 1 and 0.0.
    schema_version: Literal[1]
    started_at: float


class RestoreJournal(_RestoreJournalOptional):
    """``<target>/.artifactd/journal.json``: the intent of an install in progress."""

    run_id: str
    staging: str
    entries: list[JournalEntry]
    #: sha256 of the exact bytes of the marker this install commits with.
    marker_sha256: str
    env_file: str
    env_text: str


# Typed dictionaries, as the marker's (no dataclasses on a restore's path); pydantic
# reads this when it generates the JSON Schema: unknown keys are refused.
JournalEntry.__pydantic_config__ = STRICT  # type: ignore[attr-defined]
RestoreJournal.__pydantic_config__ = STRICT  # type: ignore[attr-defined]

#: :class:`JournalEntry`'s shape, as :func:`artifactd.restore.marker.load` reads it.
JOURNAL_ENTRY: Shape = (
    "JournalEntry",
    {
        "family": ("str", True),
        "dest": ("str", True),
        "staged": ("str", True),
        "new_inode": (("list", "int"), True),
        "had_old": ("bool", True),
    },
)
#: :class:`RestoreJournal`'s shape (``tests/test_marker.py`` holds the two equal).
RESTORE_JOURNAL: Shape = (
    "RestoreJournal",
    {
        "schema_version": (("literal", (1,)), False),
        "started_at": ("float", False),
        "run_id": ("str", True),
        "staging": ("str", True),
        "entries": (("list", ("doc", JOURNAL_ENTRY)), True),
        "marker_sha256": ("str", True),
        "env_file": ("str", True),
        "env_text": ("str", True),
    },
)
