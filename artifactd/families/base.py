"""What every cache family declares, and the shared machinery they use.

A family is one library's compile cache. It names:

* its **components**: the directories it owns, where to find each at harvest
  time (the env var the library reads, or its default) and where to put it at
  restore time (a subdirectory of the target, and the env var that points the
  library there);
* what to **exclude** (locks, temp dirs, interrupted writes);
* its **scope**: the fingerprint dimensions its validity depends on;
* which files carry **absolute paths** that must be rewritten when the cache
  moves, and whether **mtimes** matter.

Adding a family means writing one small module with a subclass of
:class:`Family` and listing it in :mod:`artifactd.families`. A family module
imports this base (and the layouts several families host,
:mod:`artifactd.families.layouts`), never another family. What each family
caches, and the library sources that was read from, is in ``docs/families.md``.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod

from artifactd import jsontext
from artifactd.constants import (
    HOME,
    LNAME,
    LOGNAME,
    TEMP,
    TMP,
    TMPDIR,
    USER,
    USERNAME,
    current_environ,
)
from artifactd.fsutil import path_text
from artifactd.records import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    import re
    from collections.abc import Mapping
    from pathlib import Path, PurePosixPath
    from typing import Any, ClassVar

    from artifactd.fsutil import StrPath

#: Stands for the component's root in stored path-bearing files.
ROOT_PLACEHOLDER = "@ARTIFACTD_ROOT@"


class Component(Record):
    """One directory a family owns.

    ``restore_subdir`` is relative to the restore target. ``env`` maps the
    variables the consumer must see to a value template in which ``{dir}`` is
    the restored directory and ``{target}`` the restore target.
    """

    name: str
    restore_subdir: str
    env: Mapping[str, str]


class Located(Record):
    """A component found on disk at harvest time."""

    component: Component
    path: Path


class Family(ABC):
    """Base class of a cache family; subclasses set the class attributes and :meth:`locate`.

    The lint texts say what a hazard costs with this library: ``library`` names
    it in a sentence, ``path_cost`` is the cost of a build-machine path left in
    a file restore does not rewrite, ``python_path_cost`` that of the build
    machine's Python install path; None falls back to the lint's generic text.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    #: Fingerprint dimensions (dotted paths) the cache's validity depends on.
    scope: ClassVar[tuple[str, ...]]
    #: Bump when the family's packing changes so old layers stop matching.
    scope_revision: ClassVar[int] = 1
    components: ClassVar[tuple[Component, ...]]
    #: Keep file mtimes in the layer (ninja-driven caches need them).
    keep_mtimes: ClassVar[bool] = False
    #: Directory names skipped anywhere in the tree.
    exclude_dirs: ClassVar[frozenset[str]] = frozenset({"locks", "lock"})
    #: Name patterns skipped anywhere in the tree (files and dirs): regular
    #: expressions matched at the start of the name (``re.match``), compiled on
    #: first use (:func:`_compiled`).
    exclude_patterns: ClassVar[tuple[str, ...]] = (
        r".*\.lock$",
        r".*\.tmp$",
        r"^tmp\.pid_\d+_.*",
    )
    #: Components whose Triton group files (``__grp__*.json``) are rewritten on restore.
    triton_group_components: ClassVar[frozenset[str]] = frozenset()
    #: What a file written since the restore means for this library (``artifactd
    #: status``): a file under the installed dirs whose mtime is later than the
    #: marker's ``restored_at``, found by the harvest's walk, so what the family
    #: leaves out (locks, temp and staging dirs) never counts. One sentence or two
    #: per family; ``docs/families.md`` lists them.
    written_since_restore: ClassVar[str] = (
        "A cache file newer than the restore: the library compiled something the"
        " restored cache did not hold."
    )
    #: File names the library rewrites when it LOADS a cached entry, compile or not:
    #: never counted as written since the restore (a real compile also writes
    #: files that do count).
    load_rewrites: ClassVar[frozenset[str]] = frozenset()
    #: Name patterns (``fnmatch``, on ``<component>/<relative path>``) of files the
    #: library may write again, same name and same bytes, when it loads them: the
    #: restore records their size and sha256 (:mod:`artifactd.restore.installed`),
    #: and such a rewrite with exactly the restored bytes never counts as written
    #: since the restore (other bytes do).
    rewritten_at_load: ClassVar[tuple[str, ...]] = ()
    #: Name patterns (``fnmatch``, on the file's name) of files the library opens
    #: for writing in place (appends to, truncates and rewrites), beyond
    #: :attr:`load_rewrites`. A file it only ever replaces by a rename, or never
    #: writes, is not one. Every family states it (an empty tuple says: in place,
    #: never), because a restore from the node store hands a pod the node's own
    #: inode of every other file (:meth:`shares_inode`).
    written_in_place: ClassVar[tuple[str, ...]] = ()
    library: ClassVar[str] = "The library"
    path_cost: ClassVar[str | None] = None
    python_path_cost: ClassVar[str | None] = None
    #: Name patterns (``fnmatch``, on the file's name) of files the library keeps
    #: but never keys on nor follows a path from when it loads an entry (IR kept
    #: for debugging, metadata whose paths are only used while compiling): a
    #: build path in them is a warning with :attr:`informational_cost`, not an
    #: error. Read from the library's source; docs/families.md says which.
    informational_files: ClassVar[tuple[str, ...]] = ()
    informational_cost: ClassVar[str] = ""

    def informational(self, rel: PurePosixPath) -> bool:
        """Whether a build path in ``rel`` costs nothing at load (:attr:`informational_files`).

        A Triton group file never is: its child paths are followed.
        """
        if is_group_file(rel):
            return False
        return any(fnmatchcase(rel.name, p) for p in self.informational_files)

    def informational_reason(self, rel: PurePosixPath) -> str:
        """Return the cost of a build path in ``rel`` that :meth:`informational` calls information.

        :attr:`informational_cost` by default; a family hosting another library's tree
        (SGLang's and vLLM's DeepGEMM dirs) gives that library's reason for its files.
        """
        del rel
        return self.informational_cost

    def records_at_restore(self, path: str) -> bool:
        """Whether the restore records ``<component>/<rel>`` (:attr:`rewritten_at_load`)."""
        return any(fnmatchcase(path, p) for p in self.rewritten_at_load)

    @abstractmethod
    def locate(self, environ: Mapping[str, str]) -> list[Located]:
        """Return the component directories that exist on this machine."""

    def excluded(self, component: str, rel: PurePosixPath, is_dir: bool) -> bool:
        """Whether a path (relative to its component root) is left out of the layer."""
        del component
        name = rel.name
        if is_dir and name in self.exclude_dirs:
            return True
        return any(p.match(name) for p in _compiled(self.exclude_patterns))

    def invalid_entries(self, component: str, root: Path) -> dict[PurePosixPath, str]:
        """Return partial or corrupt cache entries (paths relative to ``root``) and why.

        They are skipped and reported at harvest, never shipped: a DeepGEMM dir
        without its cubin or a Triton dir without its group file makes the
        library fail or silently recompile on the pod.
        """
        del component, root
        return {}

    def pinned_paths(self, component: str, root: Path) -> list[str]:
        """Return absolute paths outside the cache that its files or keys embed.

        Recorded in the manifest: the cache is only valid where these paths hold
        the same things (a site-packages dir in DeepGEMM's include flags,
        FlashInfer's build.ninja), so the family's scope includes them.
        """
        del component, root
        return []

    def facts(self, component: str, root: Path) -> dict[str, Any]:
        """Return JSON data about the cache worth keeping in the manifest for ``diff``.

        vLLM's raw hash factors, for instance: diffing them field by field is how
        a volatile value (a pod IP in an env var) is found.
        """
        del component, root
        return {}

    def path_bearing(self, component: str, rel: PurePosixPath) -> bool:
        """Whether this file holds absolute paths to its own root (rewritten on restore).

        By default: the Triton group files of :attr:`triton_group_components`.
        """
        return component in self.triton_group_components and is_group_file(rel)

    def normalize(self, data: bytes, roots: tuple[str, ...]) -> bytes:
        """Replace the harvest root in a path-bearing file with the placeholder.

        A Triton group file has its child paths rewritten; any other file goes
        to :meth:`normalize_text`.
        """
        doc = group_doc(data)
        if doc is not None:
            return rewrite_group_doc(doc, roots, ROOT_PLACEHOLDER)
        return self.normalize_text(data, roots)

    def normalize_text(self, data: bytes, roots: tuple[str, ...]) -> bytes:
        """:meth:`normalize` of a file that is not a group file: every ``<root>/`` replaced."""
        text = data.decode("utf-8")
        for root in roots:
            text = text.replace(root.rstrip("/") + "/", ROOT_PLACEHOLDER + "/")
        return text.encode("utf-8")

    def relocate(self, data: bytes, root: str) -> bytes:
        """Replace the placeholder with the restored root (in a group file's child paths).

        Runs on the extracting thread for every file a restore rewrites (a
        Triton cache has one group file per kernel), so a group file's JSON is
        parsed once. Any other file goes to :meth:`relocate_text`.
        """
        doc = group_doc(data)
        if doc is not None:
            return rewrite_group_doc(doc, (ROOT_PLACEHOLDER,), root)
        return self.relocate_text(data, root)

    def relocate_text(self, data: bytes, root: str) -> bytes:
        """:meth:`relocate` of a file that is not a group file: every placeholder replaced."""
        return data.decode("utf-8").replace(ROOT_PLACEHOLDER, root.rstrip("/")).encode("utf-8")

    def shares_inode(self, component: str, rel: str, rewrite: bool = False) -> bool:
        """Whether a pod may be given the node store's own copy of a file (a hard link).

        The one rule of which files a restore from the node store links rather
        than copies (:func:`artifactd.stores.nodetree.serve`). Never a file
        restore rewrites for its target (``rewrite``: the record marks it
        path-bearing, its bytes are the target's), one the library rewrites when
        it loads an entry (:attr:`load_rewrites`), or one it opens for writing in
        place (:attr:`written_in_place`). ``rel`` is the POSIX path under
        ``component``: a string, as this runs once per file of a restore.
        """
        del component
        if rewrite:
            return False
        if not self.written_in_place and not self.load_rewrites:
            return True  # most families: every file (a serve asks 18,000 times)
        name = rel.rpartition("/")[2]
        if name in self.load_rewrites:
            return False
        return not any(fnmatchcase(name, p) for p in self.written_in_place)

    def keyed(self, component: str, rel: PurePosixPath) -> bool:
        """Whether ``rel`` is a key: a path the library derives from what it compiled.

        Two warm-up cells that wrote one keyed path compiled one thing; their
        bytes may still differ (toolchains embed build ids, pickles are not
        byte-stable), and either copy serves, so a merge keeps the first
        without comparing. By default no path is keyed.
        """
        del component, rel
        return False

    def compile_key(self, component: str, rel: PurePosixPath) -> PurePosixPath | None:
        """Return what a re-compile of the file at ``rel`` is recognised by, or None.

        ``verify --candidate`` vouches for a file a pod contributed when a
        gate cell wrote one with the same key (bytes may differ, as for
        :meth:`keyed` paths), or, with None, only the same path with equal
        bytes. By default a keyed path is its own key.
        """
        return rel if self.keyed(component, rel) else None

    def merge_file(
        self, component: str, rel: PurePosixPath, ours: bytes, theirs: bytes
    ) -> bytes | None:
        """Merge two warm-up cells' different copies of one file; None when they conflict.

        Called by :func:`artifactd.build.treemerge.merge_family` only when the copies
        differ. ``ours`` is what the merge holds so far (the first cell's copy,
        or an earlier merge), ``theirs`` the next cell's; a path-bearing file
        comes in normalised form (its root replaced by the placeholder). By
        default nothing merges: two cells that wrote the same path with other
        bytes are a conflict, and the build names both cells.
        """
        del component, rel, ours, theirs
        return None

    def restore_subdirs(self, *, user: str | None = None) -> dict[str, str]:
        """Return where each component is installed, relative to the restore target."""
        name = sanitize_user(user)
        return {c.name: c.restore_subdir.format(user=name) for c in self.components}

    def restore_dirs(self, target: Path, *, user: str | None = None) -> dict[str, Path]:
        """Return where each component is installed under ``target``."""
        return {name: target / sub for name, sub in self.restore_subdirs(user=user).items()}

    def restore_paths(self, target: StrPath, *, user: str | None = None) -> dict[str, str]:
        """Return :meth:`restore_dirs` as text, as ``str(Path(...))`` writes it (:func:`path_text`).

        What a restore's plan names and its env file points at, whether
        ``target`` is a ``Path`` or text, without :mod:`pathlib`.
        """
        root = path_text(os.fspath(target))
        subs = self.restore_subdirs(user=user)
        return {name: path_text(os.path.join(root, sub)) for name, sub in subs.items()}

    def restore_env(self, target: StrPath, *, user: str | None = None) -> dict[str, str]:
        """Return the env vars that point the library at the restored directories.

        The paths are :meth:`restore_paths`'s, whether ``target`` is a ``Path`` or text.
        """
        root = path_text(os.fspath(target))
        dirs = self.restore_paths(root, user=user)
        env: dict[str, str] = {}
        for comp in self.components:
            for key, template in comp.env.items():
                env[key] = template.format(dir=dirs[comp.name], target=root)
        return env


def is_group_file(rel: PurePosixPath) -> bool:
    """Whether ``rel`` is a Triton group file (``__grp__<name>.json``)."""
    return rel.name.startswith("__grp__") and rel.suffix == ".json"


def group_doc(data: bytes) -> dict[str, Any] | None:
    """Return ``data`` parsed if it is a Triton group file (a JSON object with ``child_paths``)."""
    try:
        doc = jsontext.loads(data)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and "child_paths" in doc else None


def rewrite_group_doc(doc: dict[str, Any], old: tuple[str, ...], new: str) -> bytes:
    """Rewrite the child paths of a Triton group file, parsed (:func:`group_doc`); its new bytes.

    Triton stores ABSOLUTE paths there and silently recompiles when one does not
    exist, so a cache restored to another root misses unless they are rewritten.
    Paths under none of ``old`` are left alone (lint reports them). ``doc`` is
    changed in place.
    """
    children = doc.get("child_paths")
    if isinstance(children, dict):
        for key, value in list(children.items()):
            if not isinstance(value, str):
                continue
            for prefix in old:
                p = prefix.rstrip("/") + "/"
                if value.startswith(p):
                    children[key] = new.rstrip("/") + "/" + value[len(p) :]
                    break
    return jsontext.dumps(doc).encode("utf-8")  # json.dumps(doc), byte for byte


def gettempdir(environ: Mapping[str, str]) -> Path:
    """Return the temp dir a process with ``environ`` would use (as ``tempfile`` does)."""
    from pathlib import Path  # noqa: PLC0415  # lazy: only a harvest locates caches

    for key in (TMPDIR, TEMP, TMP):
        value = environ.get(key)
        if value:
            return Path(value)
    return Path("/tmp")  # noqa: S108 - this mirrors tempfile's own fallback


def home(environ: Mapping[str, str]) -> Path:
    """Return the home directory a process with ``environ`` would use."""
    from pathlib import Path  # noqa: PLC0415  # lazy: as in gettempdir

    value = environ.get(HOME)
    return Path(value) if value else Path.home()


def expanduser(value: str, environ: Mapping[str, str]) -> Path:
    """``os.path.expanduser`` with the HOME of ``environ``."""
    from pathlib import Path  # noqa: PLC0415  # lazy: as in gettempdir

    if value == "~" or value.startswith("~/"):
        return home(environ) / value[2:]
    return Path(os.path.expanduser(value))


#: What torch replaces with ``_`` in a user name (``re.sub(r'[\\/:*?"<>|]', "_", user)``).
_NOT_IN_USER = str.maketrans(dict.fromkeys('\\/:*?"<>|', "_"))


def sanitize_user(user: str | None) -> str:
    """Return the user name as torch puts it into ``torchinductor_<user>``.

    No user given: ``getpass.getuser()``'s (:func:`_login`), else ``uid_<uid>``.
    A restore plans every family's directories with this.
    """
    if user is None:
        try:
            user = _login()
        except (KeyError, OSError):
            user = f"uid_{os.getuid()}"
    return user.translate(_NOT_IN_USER)


def _login() -> str:
    """Return ``getpass.getuser()`` without importing :mod:`getpass` (it loads ``termios``).

    ``getpass``'s own lookup, in its order: the first of ``$LOGNAME``, ``$USER``,
    ``$LNAME`` and ``$USERNAME`` that is set and not empty, else the password
    database's name for the uid (a KeyError when it has none).
    """
    environ = current_environ()
    for key in (LOGNAME, USER, LNAME, USERNAME):
        value = environ.get(key)
        if value:
            return value
    import pwd  # noqa: PLC0415  # lazy: POSIX only, imported where getpass imports it

    return pwd.getpwuid(os.getuid())[0]


def fnmatchcase(name: str, pattern: str) -> bool:
    """Return ``fnmatch.fnmatchcase(name, pattern)``; without ``re`` when ``*`` is its one wildcard.

    A restore asks this of every file it installs (:meth:`Family.shares_inode`,
    :meth:`Family.records_at_restore`), and every family's patterns there are
    names or ``*`` globs: ``*`` matches any run of characters, ``/`` and
    newlines included, and every other character itself. A pattern with ``?``
    or ``[`` goes to :mod:`fnmatch`.
    """
    if "?" in pattern or "[" in pattern:
        from fnmatch import fnmatchcase as match  # noqa: PLC0415  # lazy: it compiles (re)

        return match(name, pattern)
    parts = pattern.split("*")
    if len(parts) == 1:
        return name == pattern
    head, tail = parts[0], parts[-1]
    end = len(name) - len(tail)
    if end < len(head) or not name.startswith(head) or not name.endswith(tail):
        return False
    at = len(head)
    for part in parts[1:-1]:  # in order, each as early as it fits: as a regex would
        at = name.find(part, at, end)
        if at < 0:
            return False
        at += len(part)
    return True


#: Each tuple of :attr:`Family.exclude_patterns` compiled, made on first use.
_COMPILED: dict[tuple[str, ...], tuple[re.Pattern[str], ...]] = {}


def _compiled(patterns: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    """Return ``patterns`` compiled (``re.compile``), once per tuple: a walk matches every name."""
    found = _COMPILED.get(patterns)
    if found is None:
        import re  # noqa: PLC0415  # lazy: only a walk of a tree matches names, never a restore

        found = _COMPILED.setdefault(patterns, tuple(re.compile(p) for p in patterns))
    return found


#: The paths :func:`pure_path` made, by their text.
_PURE: dict[str, PurePosixPath] = {}


def pure_path(text: str) -> PurePosixPath:
    """Return ``PurePosixPath(text)``, made once per text: pathlib is imported on first use.

    The family modules hold the relative paths they compare walked paths with
    as text (:mod:`artifactd.families.layouts`): a restore imports every one of
    them, and walks no tree.
    """
    found = _PURE.get(text)
    if found is None:
        from pathlib import PurePosixPath  # noqa: PLC0415  # lazy: see the docstring

        found = _PURE.setdefault(text, PurePosixPath(text))
    return found
