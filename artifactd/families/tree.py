"""The tree a family ships: one walk of a component root, used to pack it and to lint it.

Packing and linting must agree on what a layer holds, so both walk it here:
sorted, the children of a directory before its subdirectories' contents,
symlinks not followed, and every entry the harvest leaves out (an invalid
entry, a name that is not UTF-8, a family exclusion) yielded once with its
reason and, when it is a directory, not entered.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from artifactd.families.base import Family

#: Why a name that is not UTF-8 stays out of a layer (lint reports those entries).
NOT_UTF8 = "file name is not valid UTF-8"


class TreeEntry(NamedTuple):
    """One entry under a component root.

    ``rel`` is relative to the root, ``st`` its lstat, ``skip`` why the
    harvest leaves it out (None: it is packed).
    """

    rel: PurePosixPath
    path: Path
    st: os.stat_result
    skip: str | None

    @property
    def is_dir(self) -> bool:
        """Whether the entry is a directory (not a symlink to one)."""
        return stat.S_ISDIR(self.st.st_mode)

    @property
    def is_file(self) -> bool:
        """Whether the entry is a regular file (not a symlink to one)."""
        return stat.S_ISREG(self.st.st_mode)


def root_spellings(root: Path) -> tuple[str, ...]:
    """Return ``root`` as the packer swaps it in path-bearing files: absolute, then resolved.

    A library may write either (FlashInfer resolves its paths, Triton keeps
    them as given); packing, the cells' merge and the lint use this one list.
    """
    return tuple(dict.fromkeys([str(root.absolute()), os.path.realpath(root)]))


def skip_reason(
    family: Family,
    component: str,
    rel: PurePosixPath,
    is_dir: bool,
    invalid: Mapping[PurePosixPath, str],
) -> str | None:
    """Return why ``rel`` stays out of the layer, or None to pack it."""
    if rel in invalid:
        return invalid[rel]
    try:
        rel.as_posix().encode("utf-8")
    except UnicodeEncodeError:
        return NOT_UTF8  # not representable in tar or JSON config
    if family.excluded(component, rel, is_dir):
        return "excluded by family"
    return None


def walk_component(
    family: Family,
    component: str,
    root: Path,
    *,
    on_error: Callable[[PurePosixPath, OSError], None] | None = None,
) -> Iterator[TreeEntry]:
    """Yield every entry under ``root`` as the harvest sees it (see the module doc).

    ``on_error`` hears of a directory that cannot be listed; an entry that
    vanishes while the walk runs (a concurrent writer's temp file) is passed
    over in silence.
    """
    invalid = family.invalid_entries(component, root)
    stack = [PurePosixPath()]
    while stack:
        rel_dir = stack.pop()
        try:
            names = sorted(os.listdir(root / rel_dir))
        except OSError as exc:
            if on_error is not None:
                on_error(rel_dir, exc)
            continue
        subdirs: list[PurePosixPath] = []
        for name in names:
            rel = rel_dir / name
            path = root / rel
            try:
                st = os.lstat(path)
            except OSError:
                continue
            entry = TreeEntry(rel, path, st, None)
            reason = skip_reason(family, component, rel, entry.is_dir, invalid)
            if reason is not None:
                entry = TreeEntry(rel, path, st, reason)
            elif entry.is_dir:
                subdirs.append(rel)
            yield entry
        stack.extend(reversed(subdirs))
