"""The install journal as typed dictionaries: for type checkers and its JSON Schema.

``<target>/.artifactd/journal.json`` is read and written by
:mod:`artifactd.restore.destination` against its shape, stated as data in
:mod:`artifactd.restore.journal` (a restore that installs imports no
``typing``). The typed dictionaries here are the same document for mypy and
for ``registry-schema/`` (pydantic reads them); ``tests/test_marker.py`` holds
the shapes and these classes to the same fields, types and optional keys.
:mod:`artifactd.restore.journal` still serves both classes by name, importing
this module on first use.
"""

from __future__ import annotations

from typing import Literal, TypedDict

from artifactd.restore.marker import STRICT


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
