"""The restore target: a writable cache volume, and every write restore makes to it.

:class:`CacheVolume` owns ``<target>/.artifactd/``:

* ``lock``: an exclusive ``flock`` held for a whole restore (two init
  containers sharing a node-local volume serialize; the second finds the
  first one's marker and does nothing);
* ``staging-<id>/``: where layers are extracted, on the target's filesystem
  so installing is a rename;
* ``journal.json``: the intent of an install, written (durably) before the
  first directory is swapped;
* ``restored.json``: the marker, written (durably) after the last swap. It
  is the commit point.

Installing is one transaction over every family of a plan. Each component
directory is swapped with its staged replacement by ``renameat2(RENAME_EXCHANGE)``
(a reader sees the old tree or the new one; where the kernel or filesystem
lacks it, two renames). The old trees stay in staging until the marker is on
disk. On any error before the marker, every swap already made is undone and
the marker and env file are left as they were. After a crash (kill -9, power
cut), the next restore finds the journal under the lock and repairs: when the
marker on disk is the one the journal announced, the install had committed
and only the env file and clean-up remain; otherwise every swap is undone.
Which tree sits at a destination is told by the inode the journal recorded for
the new one, so repair is correct after a crash at any instruction and can
itself be interrupted and run again. A no-op check never trusts a marker while
a journal exists.
"""

from __future__ import annotations

import errno
import os
import stat
import time

from artifactd.errors import ArtifactdError, NoSpaceError, TargetError, UsageError
from artifactd.fsutil import (
    as_path,
    atomic_write,
    fsync_dir,
    make_durable,
    read_regular,
    rmtree,
    unlink_if_there,
    write_temp,
)
from artifactd.hashing import sha256_hex
from artifactd.records import Record
from artifactd.restore.envfile import MAX_ENV_FILE, render_env_file
from artifactd.restore.marker import RESTORE_MARKER, MarkerFormatError, dump, load

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path
    from types import TracebackType
    from typing import IO

    from artifactd.fsutil import StrPath
    from artifactd.restore.journal import JournalEntry, RestoreJournal
    from artifactd.restore.markertypes import RestoreMarker

STATE_DIR = ".artifactd"
MARKER_NAME = "restored.json"
JOURNAL_NAME = "journal.json"
#: The canaries of the whole artifact installed (:mod:`artifactd.format.canary`).
CANARY_NAME = "canary.json"
LOCK_NAME = "lock"
ENV_FILE_NAME = "artifactd.env"
ENV_TMP_PREFIX = ".tmp-artifactd-env-"
#: An env file holds a few lines a restore wrote; a larger one is not read.

#: The marker and the journal hold a few paths per family; a larger one is not read.
MAX_STATE_FILE = 16 << 20
#: Seconds a restore waits for another restore's lock on the same target.
DEFAULT_LOCK_TIMEOUT = 600.0
#: Space asked for on top of the file bytes: per file (block rounding, inode
#: and directory entries) and for the volume as a whole (state files).
PER_FILE_OVERHEAD = 4096
SPACE_MARGIN = 1 << 20

if TYPE_CHECKING:
    from typing import TypeAlias

    #: Called with the name of each step boundary of an install; tests inject crashes here.
    StepHook: TypeAlias = Callable[[str], None]


def no_hook(step: str) -> None:
    """Do nothing: the default step hook."""
    del step


def os_error(exc: OSError, doing: str) -> ArtifactdError:
    """Map a filesystem error on the target to the artifactd error a user can act on."""
    detail = f"{doing}: {exc.strerror or exc}"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return NoSpaceError(
            f"no space left on the target filesystem ({detail})",
            hint="give the cache volume more space, or restore fewer families (--family)",
        )
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return TargetError(
            f"the target is not writable ({detail})",
            hint="mount the cache volume read-write for the user the init container runs as",
        )
    return TargetError(f"cannot write the target ({detail})")


class Swap(Record):
    """One component directory to install: the staged tree and its live place (absolute paths)."""

    family: str
    staged: str
    dest: str


class CacheVolume:
    """A restore target directory and the state restore keeps in it."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        env_file: str | os.PathLike[str] | None = None,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        step_hook: StepHook = no_hook,
    ) -> None:
        # Held as text: a no-op restore reads the marker without loading pathlib;
        # the Path views below load it when an install or a command asks for them.
        #: The target, absolute and normalised.
        self.root_dir = os.path.abspath(root)
        #: ``<target>/.artifactd``.
        self.state_dir = os.path.join(self.root_dir, STATE_DIR)
        #: The env file (default ``<target>/artifactd.env``), absolute and normalised.
        self.env_path = os.path.abspath(
            env_file if env_file is not None else os.path.join(self.root_dir, ENV_FILE_NAME)
        )
        self.lock_timeout = lock_timeout
        self._hook = step_hook

    @property
    def root(self) -> Path:
        """The target directory."""
        return as_path(self.root_dir)

    @property
    def state(self) -> Path:
        """``<target>/.artifactd``."""
        return as_path(self.state_dir)

    @property
    def env_file(self) -> Path:
        """The env file the restore writes."""
        return as_path(self.env_path)

    @property
    def marker_path(self) -> Path:
        """``<target>/.artifactd/restored.json``."""
        return as_path(os.path.join(self.state_dir, MARKER_NAME))

    @property
    def journal_path(self) -> Path:
        """``<target>/.artifactd/journal.json``."""
        return as_path(os.path.join(self.state_dir, JOURNAL_NAME))

    # -- reading -------------------------------------------------------------
    @property
    def canary_path(self) -> Path:
        """``<target>/.artifactd/canary.json``."""
        return as_path(os.path.join(self.state_dir, CANARY_NAME))

    def write_canaries(self, doc: bytes | None) -> None:
        """Replace the canary document (``None``: remove it); before the marker, under the lock.

        A reader trusts it only while it names the artifact the marker records,
        so a crash between this write and the marker leaves nothing trusted.
        """
        path = os.path.join(self.state_dir, CANARY_NAME)
        if doc is None:
            unlink_if_there(path)
        else:
            atomic_write(path, doc, durable=True)

    def read_marker(self) -> RestoreMarker | None:
        """Return the marker, or None when it is missing or malformed."""
        try:
            data = read_regular(os.path.join(self.state_dir, MARKER_NAME), MAX_STATE_FILE)
            marker: RestoreMarker = load(RESTORE_MARKER, data)
            return marker
        except (OSError, MarkerFormatError):
            return None

    def installed(self) -> RestoreMarker | None:
        """Return the marker only when it describes what is on disk right now.

        No journal (no install in progress or interrupted), every recorded
        directory present, and the env file holding exactly what the marker
        says. This is the one check a no-op restore trusts.
        """
        try:
            os.stat(os.path.join(self.state_dir, JOURNAL_NAME))
        except FileNotFoundError:
            pass
        except OSError:  # the target cannot be looked into (no permission, a name too long)
            return None
        else:
            return None  # a journal: an install in progress, or interrupted
        marker = self.read_marker()
        if marker is None or not all(
            _is_dir(d) for fam in marker["families"].values() for d in fam["dirs"].values()
        ):
            return None
        try:
            text = read_regular(self.env_path, MAX_ENV_FILE, follow=True).decode("utf-8")
            if text != render_env_file(marker["env"]):
                return None
        except (OSError, UnicodeError, UsageError):
            return None
        return marker

    # -- locking and repair --------------------------------------------------
    def locked(self, *, timeout: float | None = None) -> _TargetLock:
        """Hold the target's exclusive lock in a ``with`` block; :class:`TargetError` if it cannot.

        Waits up to ``timeout`` seconds (default: the volume's lock timeout; 0:
        one try).
        """
        return _TargetLock(self, self.lock_timeout if timeout is None else timeout)

    def tidy(self) -> bool:
        """Remove what a restore killed after its commit left in staging (the old trees).

        For the no-op path, which trusts the marker without the lock: when the
        state dir holds staging leftovers, the lock is tried once and, if no
        restore holds it, :meth:`recover` removes them. Never waits; returns
        whether it tidied.
        """
        try:
            names = os.listdir(self.state_dir)
        except OSError:
            return False
        if not any(n.startswith(("staging-", "trash-")) for n in names):
            return False
        try:
            with self.locked(timeout=0):
                self.recover()
        except TargetError:
            return False  # a restore is running: its own repair step cleans up
        except (ArtifactdError, OSError):
            return False  # best effort: the caches in place are intact, the no-op stands
        return True

    def recover(self) -> str | None:
        """Repair what an interrupted restore left (call under the lock).

        Returns ``"completed"`` (the install had committed: env file written),
        ``"rolled back"`` (every swap undone), ``"discarded"`` (a journal that
        cannot be acted on: the marker is dropped so the next install starts
        afresh) or None when there was nothing to repair. Leftover staging
        directories are removed in every case.

        The journal lives on a volume other containers may write, so it is
        acted on only when every path in it is one this volume's own restore
        would have written: staging under the state dir, destinations under
        the target, the env file this volume uses.
        """
        outcome = None
        journal = None
        journal_path = os.path.join(self.state_dir, JOURNAL_NAME)
        try:
            data: bytes | None = read_regular(journal_path, MAX_STATE_FILE)
        except FileNotFoundError:
            data = None
        except OSError:
            data, outcome = None, "discarded"
        if data is not None:
            # lazy: fast path: LATER in artifactd/cli/fast.py, never loaded by a no-op restore
            from artifactd.restore.journal import (  # noqa: PLC0415
                RESTORE_JOURNAL,  # only a crashed install leaves one
            )

            try:
                journal = load(RESTORE_JOURNAL, data)
            except MarkerFormatError:
                outcome = "discarded"
        if journal is not None and not self._plausible(journal):
            journal = None
            outcome = "discarded"
        if outcome == "discarded":
            # We cannot tell what was swapped. Distrust the marker so no restore
            # no-ops on top of it, and install afresh.
            self.marker_path.unlink(missing_ok=True)
            self.journal_path.unlink(missing_ok=True)
        if journal is not None:
            try:
                marker = read_regular(self.marker_path, MAX_STATE_FILE)
                committed = sha256_hex(marker) == journal["marker_sha256"]
            except OSError:
                committed = False
            if committed:
                try:
                    atomic_write(journal["env_file"], journal["env_text"].encode(), durable=True)
                    outcome = "completed"
                except OSError:
                    # Committed, but its env file cannot be written (any more): the
                    # marker cannot become true. Distrust it, so the next restore
                    # installs afresh, rather than failing here on every restore.
                    self.marker_path.unlink(missing_ok=True)
                    outcome = "discarded"
            else:
                for entry in reversed(journal["entries"]):
                    _undo(entry)
                outcome = "rolled back"
            self.journal_path.unlink(missing_ok=True)
            fsync_dir(self.state)
        self._clean_leftovers()
        return outcome

    def _plausible(self, journal: RestoreJournal) -> bool:
        """Whether every path in ``journal`` is one this volume's restore writes."""
        staging = as_path(os.path.normpath(journal["staging"]))
        if staging.parent != self.state or not staging.name.startswith("staging-"):
            return False
        if os.path.normpath(journal["env_file"]) != self.env_path:
            return False
        for entry in journal["entries"]:
            staged = as_path(os.path.normpath(entry["staged"]))
            dest = as_path(os.path.normpath(entry["dest"]))
            if not staged.is_relative_to(staging) or staged == staging:
                return False
            if not dest.is_relative_to(self.root) or dest.is_relative_to(self.state):
                return False
            if dest == self.root or entry["staged"] != str(staged) or entry["dest"] != str(dest):
                return False
        return True

    def _clean_leftovers(self) -> None:
        if not _is_dir(self.state_dir):
            return
        for name in os.listdir(self.state_dir):
            if name.startswith(("staging-", "trash-")):
                remove_tree(os.path.join(self.state_dir, name))
            elif name.startswith(".tmp-"):
                unlink_if_there(os.path.join(self.state_dir, name))
        env_dir = os.path.dirname(self.env_path)
        try:
            names = os.listdir(env_dir)
        except OSError:
            return  # no such directory: no leftover in it
        for name in names:
            if name.startswith(ENV_TMP_PREFIX):
                unlink_if_there(os.path.join(env_dir, name))

    # -- checks before anything is downloaded --------------------------------
    def check_writable(self) -> None:
        """Prove the target and the env file's directory take a new file, or raise."""
        for directory in dict.fromkeys([self.state_dir, os.path.dirname(self.env_path)]):
            try:
                os.makedirs(directory, exist_ok=True)
                os.unlink(write_temp(directory, b""))
            except OSError as exc:
                raise os_error(exc, f"writing in {directory}") from None
        # The env file is renamed into place after the commit point, where a
        # failure can no longer be undone: refuse what a rename cannot replace.
        if os.path.isdir(self.env_path) and not os.path.islink(self.env_path):
            raise TargetError(
                f"the env file {self.env_path} is a directory",
                hint="point --env-file at a file path (its directory must be writable)",
            )

    def check_space(self, needs: dict[str, tuple[int, int]], *, max_bytes: int | None) -> int:
        """Refuse a restore that cannot fit; ``needs`` maps family -> (bytes, files).

        Counts every file rounded up to :data:`PER_FILE_OVERHEAD` plus a margin,
        and compares with the free space (and free inodes) of the target's
        filesystem, and with ``max_bytes`` when given. The old caches stay on
        disk until the new ones are committed, so their space is not counted as
        free. Returns the bytes needed.
        """
        need = SPACE_MARGIN + sum(b + f * PER_FILE_OVERHEAD for b, f in needs.values())
        files = sum(f for _, f in needs.values())
        detail = ", ".join(f"{k} {_mib(b)}" for k, (b, _) in sorted(needs.items()))
        if max_bytes is not None and need - SPACE_MARGIN > max_bytes:
            raise NoSpaceError(
                f"the restore would unpack {_mib(need - SPACE_MARGIN)}, over --max-bytes "
                f"{_mib(max_bytes)} ({detail})",
                hint="raise --max-bytes or restore fewer families (--family)",
            )
        try:
            vfs = os.statvfs(self.state_dir)
        except OSError as exc:
            raise os_error(exc, f"statfs {self.state_dir}") from None
        free = vfs.f_bavail * vfs.f_frsize
        if need > free:
            raise NoSpaceError(
                f"the restore needs {_mib(need)} on {self.root_dir} and {_mib(free)} are free "
                f"({detail})",
                hint="give the cache volume more space, or restore fewer families (--family)",
            )
        if vfs.f_files and files > vfs.f_favail:
            raise NoSpaceError(
                f"the restore creates {files} files on {self.root_dir} and only {vfs.f_favail} "
                "inodes are free",
                hint="give the cache volume more inodes, or restore fewer families",
            )
        return need

    def new_staging(self) -> str:
        """Create and return a fresh staging directory inside the state dir."""
        path = os.path.join(self.state_dir, f"staging-{os.urandom(6).hex()}")
        try:
            os.makedirs(path)
        except OSError as exc:
            raise os_error(exc, f"creating {path}") from None
        return path

    # -- the transaction -----------------------------------------------------
    def install(self, staging: StrPath, swaps: list[Swap], marker: RestoreMarker) -> None:
        """Swap every staged tree into place, then commit ``marker`` and the env file.

        All or nothing: on any error before the marker is on disk, every swap
        is undone, and marker and env file are untouched. ``staging`` (which
        ends up holding the old trees) is removed in every case.
        """
        staging = os.fspath(staging)
        journal_path = os.path.join(self.state_dir, JOURNAL_NAME)
        try:
            marker_bytes = dump(marker)
            env_text = render_env_file(marker["env"])
            entries = _plan_swaps(swaps)
            journal: RestoreJournal = {
                "schema_version": 1,
                "run_id": os.path.basename(staging),
                "staging": staging,
                "entries": entries,
                "marker_sha256": sha256_hex(marker_bytes),
                "env_file": self.env_path,
                "env_text": env_text,
                "started_at": round(time.time(), 3),
            }
            # The staged files' bytes reach the disk before anything points at
            # them: after a power cut, a committed marker must not describe
            # files the page cache never wrote back. Not by waiting on the
            # whole disk's writeback when another pod is writing (make_durable).
            families = marker["families"].values()
            written = sum(f["bytes"] for f in families)
            make_durable(staging, written, sum(f["files"] for f in families))
            self._hook("before-journal")
            done: list[JournalEntry] = []
            try:
                # Inside the rollback scope: a failure once the journal may be on
                # disk (its own fsync, the hook) removes it, as for any later step.
                atomic_write(journal_path, dump(journal), durable=True)
                self._hook("journal")
                for entry in entries:
                    _swap_in(entry)
                    done.append(entry)
                    self._hook(f"swap:{entry['dest']}")
                # The env file's bytes go to disk before the commit; moving them
                # into place afterwards is a rename, which a full disk cannot fail.
                env_tmp = write_temp(
                    os.path.dirname(self.env_path),
                    env_text.encode(),
                    durable=True,
                    prefix=ENV_TMP_PREFIX,
                )
                try:
                    self._hook("env-staged")
                    atomic_write(
                        os.path.join(self.state_dir, MARKER_NAME), marker_bytes, durable=True
                    )
                except BaseException:
                    unlink_if_there(env_tmp)
                    raise
            except BaseException:
                for entry in reversed(done):
                    _undo(entry)
                unlink_if_there(journal_path)
                raise
            self._hook("marker")
            os.replace(env_tmp, self.env_path)
            self._hook("env")
            unlink_if_there(journal_path)
            fsync_dir(self.state_dir)
            self._hook("journal-removed")
        except OSError as exc:
            raise os_error(exc, "installing the restored caches") from None
        finally:
            # With the journal gone, staging holds only trees nobody needs. With
            # it still there (an undo failed), staging holds the old trees that
            # the next restore's repair puts back: keep them.
            if not os.path.exists(journal_path):
                remove_tree(staging)


class _TargetLock:
    """The target's lock, held while a ``with`` block runs (see :meth:`CacheVolume.locked`).

    A class, not a generator under ``contextlib``: ``contextlib`` (with
    ``functools`` and ``collections``) is off a no-op restore's path.
    """

    def __init__(self, volume: CacheVolume, wait: float) -> None:
        self._volume = volume
        self._wait = wait
        self._handle: IO[str] | None = None

    def __enter__(self) -> None:
        # lazy: only an install takes the lock; a no-op restore never loads fcntl
        import fcntl  # noqa: PLC0415

        lock_path = os.path.join(self._volume.state_dir, LOCK_NAME)
        try:
            os.makedirs(self._volume.state_dir, exist_ok=True)
            handle = open(lock_path, "a")
        except OSError as exc:
            raise os_error(exc, f"creating {lock_path}") from None
        deadline = time.monotonic() + self._wait
        try:
            while True:
                try:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise TargetError(
                            f"another restore has held the lock on {self._volume.root_dir} "
                            f"for more than {self._wait:.0f} s",
                            hint="is another init container stuck on this volume?",
                        ) from None
                    time.sleep(0.05)
                except OSError as exc:
                    raise os_error(exc, f"locking {lock_path}") from None
        except BaseException:  # not held: the file goes (an interrupt in the wait too)
            handle.close()
            raise
        self._handle = handle

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._handle is not None:
            self._handle.close()  # closing the file releases the lock
            self._handle = None


def _plan_swaps(swaps: list[Swap]) -> list[JournalEntry]:
    """Order the swaps outer directories first and say what each will find at its place.

    A component may live inside another one's directory (vLLM keeps
    ``deep_gemm/`` under its cache root). Once the outer tree is swapped, the
    inner destination is inside the *new* outer tree, so whether it "had an
    old" one, and where its parent directories are made, is read from the
    staged outer tree, before anything moves.
    """
    ordered = sorted(swaps, key=lambda s: len(_parts(s.dest)))
    entries: list[JournalEntry] = []
    for i, swap in enumerate(ordered):
        st = os.lstat(swap.staged)
        if not stat.S_ISDIR(st.st_mode):  # pragma: no cover - the extractor guarantees it
            raise TargetError(f"staged {swap.staged} is not a directory")
        dest = _parts(swap.dest)
        outer = next(
            (o for o in reversed(ordered[:i]) if dest[: len(_parts(o.dest))] == _parts(o.dest)),
            None,
        )
        # Where ``dest`` will be resolved at swap time: inside the staged outer tree.
        future = (
            os.path.join(outer.staged, *dest[len(_parts(outer.dest)) :]) if outer else swap.dest
        )
        os.makedirs(os.path.dirname(future), exist_ok=True)
        entries.append(
            {
                "family": swap.family,
                "dest": swap.dest,
                "staged": swap.staged,
                "new_inode": [st.st_dev, st.st_ino],
                "had_old": os.path.lexists(future),
            }
        )
    return entries


def _parts(path: str) -> list[str]:
    """Split an absolute path into its parts below the root, as ``pathlib`` reads them."""
    return [part for part in path.split("/") if part not in ("", ".")]


def _is_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def remove_tree(path: StrPath) -> None:
    """Remove a directory tree or a file, whatever is there (errors ignored)."""
    if os.path.isdir(path) and not os.path.islink(path):
        rmtree(path)
    else:
        try:  # noqa: SIM105 - contextlib is off a pod start's modules (cli/fast.py FLOOR)
            os.unlink(path)
        except OSError:
            pass


def _aside(entry: JournalEntry) -> str:
    """Where the two-rename fallback parks the old tree."""
    return entry["staged"] + ".old"


def _holds_new(path: str, entry: JournalEntry) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return [st.st_dev, st.st_ino] == entry["new_inode"]


def _swap_in(entry: JournalEntry) -> None:
    """Put the staged tree at ``dest``; the old one (if any) ends up in staging."""
    if not entry["had_old"]:
        os.rename(entry["staged"], entry["dest"])
    elif not _exchange(entry["staged"], entry["dest"]):
        os.rename(entry["dest"], _aside(entry))
        os.rename(entry["staged"], entry["dest"])


def _undo(entry: JournalEntry) -> None:
    """Put the old tree back at ``dest``, from whichever step a swap stopped at.

    Idempotent: running it again after it was interrupted finishes the job.
    """
    aside = _aside(entry)
    if _holds_new(entry["dest"], entry):
        if not entry["had_old"]:
            os.rename(entry["dest"], entry["staged"])
        elif os.path.lexists(entry["staged"]):  # exchanged: the old tree is at ``staged``
            if not _exchange(entry["staged"], entry["dest"]):  # pragma: no cover - exchanged before
                os.rename(entry["dest"], entry["staged"] + ".new")
                os.rename(entry["staged"], entry["dest"])
        else:  # two renames: the old tree is aside
            os.rename(entry["dest"], entry["staged"] + ".new")
            os.rename(aside, entry["dest"])
    elif not os.path.lexists(entry["dest"]) and os.path.lexists(aside):
        os.rename(aside, entry["dest"])  # stopped between the fallback's two renames


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


#: libc's renameat2 once looked up ([None] where there is none).
_RENAMEAT2: list[object] = []


def _renameat2() -> object:
    """Return libc's renameat2, or None where libc lacks it (old glibc, musl, macOS)."""
    if not _RENAMEAT2:
        # lazy: ctypes is off the fast path (artifactd/cli/fast.py allows it for the GPU probe only)
        import ctypes  # noqa: PLC0415

        try:
            libc = ctypes.CDLL(None, use_errno=True)  # the libc this process already loaded
        except OSError:
            _RENAMEAT2.append(None)
        else:
            _RENAMEAT2.append(getattr(libc, "renameat2", None))
    return _RENAMEAT2[0]


def _exchange(a: str | Path, b: str | Path) -> bool:
    """Atomically swap two paths with renameat2(RENAME_EXCHANGE); False if unsupported.

    Raises ``OSError`` for real failures (a full disk cannot happen: no bytes move).
    """
    fn = _renameat2()
    if fn is None:
        return False
    # lazy: ctypes is off the fast path (artifactd/cli/fast.py allows it for the GPU probe only)
    import ctypes  # noqa: PLC0415

    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)  # type: ignore[operator]
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False  # this filesystem or kernel has no exchange
    raise OSError(err, os.strerror(err), str(b))
