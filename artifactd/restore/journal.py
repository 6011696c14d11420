"""The journal of an install in progress: ``<target>/.artifactd/journal.json``.

Written before the first directory is swapped and removed after the marker
(:mod:`artifactd.restore.marker`), so a restore that was killed in between is repaired
(rolled back, or finished when the new marker had already been written) by the
next one, and a no-op check never trusts a marker while a journal exists. Read
and written with :func:`artifactd.restore.marker.load` (against :data:`RESTORE_JOURNAL`,
the shape of :class:`RestoreJournal` as data) / :func:`~artifactd.restore.marker.dump`.
Only a repair imports this module (an install writes the journal as a plain
dict, its type checked by mypy): a no-op restore checks only that no journal
file exists. The typed dictionaries, for type checkers and the
JSON Schema, are :mod:`artifactd.restore.journaltypes`' (served here by name).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from artifactd.restore.journaltypes import JournalEntry, RestoreJournal
    from artifactd.restore.marker import Shape
else:

    def __getattr__(name: str) -> object:
        """``JournalEntry`` and ``RestoreJournal``, from :mod:`~artifactd.restore.journaltypes`.

        The typed dictionaries need ``typing``, which a restore never loads: only
        what reads them at run time (the JSON Schema, tests) imports that module.
        """
        if name in ("JournalEntry", "RestoreJournal"):
            # lazy: typing, off a restore's path (see the docstring)
            from artifactd.restore import journaltypes  # noqa: PLC0415

            return getattr(journaltypes, name)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["JOURNAL_ENTRY", "RESTORE_JOURNAL", "JournalEntry", "RestoreJournal"]

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
