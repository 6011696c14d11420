"""The build machine's identity: the paths and names that must not end up inside a cache."""

from __future__ import annotations

import contextlib
import getpass
import os
import sys
import sysconfig
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from artifactd.constants import LOGNAME, TMPDIR, USER, XDG_CACHE_HOME, current_environ
from artifactd.families.base import home

#: Shorter user and host names are ignored: they would match almost anywhere.
MIN_NAME_LEN = 3
#: Temp dirs that are the same on every machine: never a hazard by themselves.
_SYSTEM_TMP = frozenset({"/tmp", "/var/tmp"})  # noqa: S108 - names, not used as files
#: Host names that say nothing about the build machine.
_GENERIC_HOSTS = frozenset({"localhost", "localhost.localdomain", "(none)"})


def _clean_paths(paths: Iterable[str]) -> tuple[str, ...]:
    out: dict[str, None] = {}
    for p in paths:
        s = str(p).rstrip("/")
        if s.startswith("/") and s not in out:
            out[s] = None
    return tuple(sorted(out, key=lambda s: (-len(s), s)))


def _clean_names(names: Iterable[str], *, drop: frozenset[str] = frozenset()) -> tuple[str, ...]:
    out: dict[str, None] = {}
    for n in names:
        s = str(n).strip()
        if len(s) >= MIN_NAME_LEN and s.lower() not in drop and s not in out:
            out[s] = None
    return tuple(sorted(out, key=lambda s: (-len(s), s)))


def _with_realpaths(paths: Iterable[str]) -> list[str]:
    out: list[str] = []
    for p in paths:
        out.append(p)
        real = os.path.realpath(p)
        if real != p:
            out.append(real)
    return out


@dataclass(frozen=True)
class Hazards:
    """What identifies the build machine and must not end up inside a cache.

    ``paths``: absolute paths that do not exist (or differ) on the pods: the
    build dir and cache roots, ``HOME``, a non-default ``TMPDIR``.
    ``python_paths``: the Python install the warm-up ran in (site-packages, a
    venv prefix); reported separately because several libraries hash them
    into their keys. ``users`` and ``hosts``: names searched in paths written
    inside files and in file and dir names (names under
    :data:`MIN_NAME_LEN` characters are dropped; host names match
    case-insensitively). Values are normalized: trailing slashes removed,
    relative paths and duplicates dropped, longest first.
    """

    paths: tuple[str, ...] = ()
    python_paths: tuple[str, ...] = ()
    users: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "paths", _clean_paths(self.paths))
        object.__setattr__(self, "python_paths", _clean_paths(self.python_paths))
        object.__setattr__(self, "users", _clean_names(self.users))
        object.__setattr__(self, "hosts", _clean_names(self.hosts, drop=_GENERIC_HOSTS))

    @classmethod
    def from_environ(
        cls,
        environ: Mapping[str, str] | None = None,
        extra_paths: Iterable[str | os.PathLike[str]] = (),
    ) -> Hazards:
        """Fill the hazards from an environment and this interpreter, without importing torch.

        ``extra_paths`` are the build root and the cache roots. Added: ``HOME``,
        ``XDG_CACHE_HOME`` and ``TMPDIR`` when set (``/tmp`` and ``/var/tmp``
        are the same everywhere and left out), the user (``USER``/``LOGNAME``,
        else the login name), the host name and its short form, site-packages
        and a venv prefix (``sys.prefix`` when it is not the base install);
        each path also as its resolved form when that differs.
        """
        environ = current_environ() if environ is None else environ
        paths = [os.fspath(p) for p in extra_paths]
        paths.append(str(home(environ)))
        if environ.get(XDG_CACHE_HOME):
            paths.append(environ[XDG_CACHE_HOME])
        tmp = environ.get(TMPDIR, "").rstrip("/")
        if tmp and tmp not in _SYSTEM_TMP:
            paths.append(tmp)

        installed = sysconfig.get_paths()
        python = [installed[key] for key in ("purelib", "platlib") if installed.get(key)]
        if sys.prefix != sys.base_prefix:
            python.append(sys.prefix)

        users = [environ[k] for k in (USER, LOGNAME) if environ.get(k)]
        if not users:
            with contextlib.suppress(KeyError, OSError):
                users.append(getpass.getuser())

        node = os.uname().nodename
        hosts = [node, node.split(".", 1)[0]] if node else []
        return cls(
            paths=tuple(_with_realpaths(paths)),
            python_paths=tuple(_with_realpaths(python)),
            users=tuple(users),
            hosts=tuple(hosts),
        )
