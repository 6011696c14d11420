"""The probe cache: facts derived from a file's bytes, kept by the file's identity.

Probing hashes every tracked library's ``RECORD`` (torch's alone is 1.5 MB),
on every pod start and every probe. The bytes only change when the file does,
so each digest is kept next to the file's identity as :func:`os.stat` reports
it (device, inode, size, modification and change time in nanoseconds) and is
reused while that identity is unchanged, as git's index and ccache's direct
mode do. Anything that rewrites the file changes its change time, which no
user-space tool can set back.

The cache is an optimisation that is safe to lose. A missing, unreadable,
corrupt or foreign (owned by another user) cache file reads as empty, and one
that cannot be written is not written: the digest is recomputed, never wrong.
A file changed less than :data:`SETTLE_NS` ago is never cached: a coarse
filesystem clock could give a rewrite within the same tick the same identity
(git's "racily clean" entries). The cache file is replaced atomically, so
concurrent probes each leave a whole file and at worst drop the other's news.

Where it lives (:func:`default_path`): ``$ARTIFACTD_CACHE_DIR``, else
``$XDG_CACHE_HOME/artifactd``, else ``~/.cache/artifactd``; the file is
``probe-cache.json``.
"""

from __future__ import annotations

import os
import time

from artifactd.constants import ENV_CACHE_DIR, HOME, XDG_CACHE_HOME
from artifactd.fsutil import atomic_write
from artifactd.jsontext import dumps, loads

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any, TypeAlias, TypeVar

    #: A file's path as the caller spells it (``compute`` is given it back).
    P = TypeVar("P", bound="str | os.PathLike[str]")

    #: ``[st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns]``.
    Identity: TypeAlias = list[int]

    from artifactd.fsutil import StrPath

SCHEMA_VERSION = 1
CACHE_FILE_NAME = "probe-cache.json"
#: A file whose modification or change time is closer than this to now is not cached.
SETTLE_NS = 2_000_000_000
#: Entries kept; the least recently used go first. Each tracked library is one entry.
MAX_ENTRIES = 256


def default_path(environ: Mapping[str, str]) -> str | None:
    """Return the cache file for this environment, or None when there is no home to put it in."""
    base = environ.get(ENV_CACHE_DIR)
    if base:
        return os.path.join(base, CACHE_FILE_NAME)
    xdg = environ.get(XDG_CACHE_HOME)
    if xdg and os.path.isabs(xdg):  # the XDG spec: a relative value is to be ignored
        return os.path.join(xdg, "artifactd", CACHE_FILE_NAME)
    home = environ.get(HOME)
    if home:
        return os.path.join(home, ".cache", "artifactd", CACHE_FILE_NAME)
    return None


def identity(st: os.stat_result) -> Identity:
    """Return the parts of a stat that change whenever a file's bytes can have changed."""
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


class ProbeCache:
    """Digests of files by identity, read once from ``path`` and written back by :meth:`save`.

    ``path`` None keeps nothing: every lookup computes.
    """

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = path
        self._entries: dict[str, dict[str, Any]] | None = None
        self._dirty = False

    def _load(self) -> dict[str, dict[str, Any]]:
        if self._entries is None:
            self._entries = _read(self.path) if self.path is not None else {}
        return self._entries

    def digest(self, file: P, compute: Callable[[P], str | None]) -> str | None:
        """Return ``compute(file)``, from the cache while ``file`` keeps its identity.

        ``compute`` runs on a miss, after the file's identity was taken (so a
        change while it reads shows up as a different identity next time).
        Errors from ``compute`` propagate unchanged; nothing is cached for them.
        """
        found, seen = self.lookup(file)
        if found is not None:
            return found
        value = compute(file)
        if seen is not None:
            self.remember(file, seen, value)
        return value

    def lookup(self, file: StrPath, *, kind: str = "") -> tuple[str | None, os.stat_result | None]:
        """Return what is kept for ``file`` (None on a miss), and its stat as of now.

        ``kind`` names what is kept, when one file has more than one fact
        (a tool's ``--version`` output, say, beside nothing else): each kind is
        an entry of its own. The stat is None when the file cannot be looked
        at; nothing is kept for it then. Give the stat to :meth:`remember`
        with what was computed from the file after it was taken.
        """
        path = os.path.abspath(os.fspath(file))
        try:
            st = os.stat(path)
        except OSError:
            return None, None
        key = _key(path, kind)
        entries = self._load()
        hit = entries.get(key)
        if (
            hit is not None
            and hit.get("stat") == identity(st)
            and isinstance(hit.get("value"), str)
        ):
            # Most recently used last: what :meth:`save` trims is what no probe asked for.
            entries[key] = entries.pop(key)
            return str(hit["value"]), st
        return None, st

    def remember(
        self, file: StrPath, seen: os.stat_result, value: str | None, *, kind: str = ""
    ) -> None:
        """Keep ``value``, computed from ``file`` as ``seen`` stated it, for later lookups.

        Not kept: a None value, or a file changed less than :data:`SETTLE_NS`
        before now (a rewrite within the filesystem clock's tick could keep
        its identity).
        """
        settled = time.time_ns() - max(seen.st_mtime_ns, seen.st_ctime_ns) >= SETTLE_NS
        if self.path is None or value is None or not settled:
            return
        key = _key(os.path.abspath(os.fspath(file)), kind)
        entries = self._load()
        entries.pop(key, None)
        entries[key] = {"stat": identity(seen), "value": value}
        self._dirty = True

    def save(self) -> None:
        """Write the cache back if a lookup added to it; any failure just leaves it unsaved."""
        if not self._dirty or self.path is None or self._entries is None:
            return
        kept = dict(list(self._entries.items())[-MAX_ENTRIES:])
        data = dumps({"schema_version": SCHEMA_VERSION, "entries": kept}).encode()

        try:
            atomic_write(self.path, data, mode=0o600)
        except OSError:
            return
        self._dirty = False


def _key(path: str, kind: str) -> str:
    """Return an entry's key: the absolute ``path``, after ``kind:`` when there is a kind.

    An absolute path starts with ``/``, so ``kind:/path`` is never a path's own key.
    """
    return f"{kind}:{path}" if kind else path


def _read(path: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """Read the cache file's entries; anything that is not a sound cache of ours is empty."""
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_uid != os.getuid():
                return {}  # another user could write it: its digests are not evidence
            doc = loads(f.read())
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(doc, dict) or doc.get("schema_version") != SCHEMA_VERSION:
        return {}
    entries = doc.get("entries")
    if not isinstance(entries, dict):
        return {}
    return {k: v for k, v in entries.items() if isinstance(v, dict)}
