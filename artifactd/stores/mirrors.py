"""Which mirrors a registry reference is pulled through, and why: read, never written.

Clusters already run a distribution layer for images (Spegel, Dragonfly, a
Harbor proxy cache, a registry pull-through cache) and describe it to
containerd and to CRI-O/podman/skopeo. artifactd reads the same files, first
match wins:

1. ``--mirror URL`` (repeatable) or ``ARTIFACTD_MIRRORS`` (whitespace-separated),
   in order, for every registry;
2. containerd's hosts directory (``--hosts-dir`` / ``ARTIFACTD_HOSTS_DIR``,
   default ``/etc/containerd/certs.d``): the first of ``<host>_<port>_/``,
   ``<host>:<port>/`` (or ``<host>/``) and ``_default/`` holding a ``hosts.toml``.
   Its ``[host."URL"]`` tables, in file order, are the mirrors:
   ``capabilities`` (``pull``: may serve content by digest; ``resolve``: may
   answer a tag), ``ca``, ``client``, ``skip_verify``, ``override_path`` and
   ``[header]`` are honoured, and ``?ns=<registry>`` is added to every request
   to a host that is not the registry (as containerd does; Spegel needs it).
   ``server`` is the registry itself: it is never a mirror;
3. ``registries.conf`` v2 (``--registries-conf`` / ``ARTIFACTD_REGISTRIES_CONF``,
   default ``/etc/containers/registries.conf``) and the ``*.conf`` files of the
   ``registries.conf.d`` directory beside it, in name order, later files
   replacing a ``[[registry]]`` of the same prefix: the longest ``prefix``
   matching the reference (on a path boundary) wins; its ``[[registry.mirror]]``
   ``location`` s (the prefix replaced by each, so a mirror may keep the
   repository under another path) are the mirrors, in order; ``insecure``,
   ``pull-from-mirror`` and ``mirror-by-digest-only`` are honoured, and a
   ``blocked`` registry is refused. The registry's own ``location`` is shown,
   but tags are still resolved at the host the reference names.

What a mirror is trusted with is decided in :mod:`artifactd.stores.pull`:
content by digest (verified while it streams), never a tag's answer unless its
configuration says it may resolve and the origin cannot answer, never the
origin's credentials.

Every file is hostile until bounded: opened as a regular file (a FIFO or a
device is refused at once), at most :data:`~artifactd.bounds.MAX_MIRROR_CONFIG_BYTES`
each, at most :data:`~artifactd.bounds.MAX_REGISTRIES_CONF_FILES` files of
``registries.conf.d``, at most :data:`~artifactd.bounds.MAX_MIRRORS` mirrors and
:data:`~artifactd.bounds.MAX_MIRROR_HEADERS` headers per mirror. A file that is
absent means no configuration; one that is present and malformed is a
:class:`~artifactd.errors.ConfigError` (exit 2): a cluster's mirror config that
artifactd cannot read is worth a clear failure, not a silent direct pull.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from artifactd import bounds as B  # noqa: N812
from artifactd.boundedhttp import parse_url
from artifactd.constants import (
    DEFAULT_HOSTS_DIR,
    DEFAULT_REGISTRIES_CONF,
    ENV_HOSTS_DIR,
    ENV_MIRRORS,
    ENV_REGISTRIES_CONF,
    current_environ,
)
from artifactd.errors import ConfigError, UsageError
from artifactd.fsutil import InputFileError, MissingInputError, read_regular
from artifactd.stores.reference import is_loopback, parse_registry_ref

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the oldest supported Python
    import tomli as tomllib


@dataclass(frozen=True)
class MirrorSettings:
    """Where mirror configuration comes from: flags or their ``ARTIFACTD_*`` variables."""

    urls: tuple[str, ...] = ()
    hosts_dir: Path = Path(DEFAULT_HOSTS_DIR)
    registries_conf: Path = Path(DEFAULT_REGISTRIES_CONF)

    @classmethod
    def from_environ(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        urls: Sequence[str] = (),
        hosts_dir: Path | str | None = None,
        registries_conf: Path | str | None = None,
    ) -> MirrorSettings:
        """Read the settings: flags given win, else the ``ARTIFACTD_*`` variables, else defaults."""
        env = current_environ() if environ is None else environ
        listed = tuple(urls) or tuple(env.get(ENV_MIRRORS, "").split())
        hosts = hosts_dir or env.get(ENV_HOSTS_DIR) or DEFAULT_HOSTS_DIR
        conf = registries_conf or env.get(ENV_REGISTRIES_CONF) or DEFAULT_REGISTRIES_CONF
        return cls(listed, Path(hosts), Path(conf))


#: No mirrors at all: what a store opened without settings uses in tests and tools.
NO_MIRRORS = MirrorSettings((), Path("/nonexistent"), Path("/nonexistent"))


@dataclass(frozen=True)
class Mirror:
    """One host a reference's content may come from, as its configuration says."""

    #: ``scheme://host[:port]``, no trailing slash.
    url: str
    #: The path the distribution API lives under there (``/v2``, or ``override_path``'s).
    api: str
    #: The repository at that host (a ``registries.conf`` prefix rewrite may change it).
    repo: str
    #: Where it was configured, in words (``--mirror``, a file's path).
    source: str
    #: May serve manifests and blobs by digest (containerd's ``pull``).
    pull: bool = True
    #: May answer a tag, used only when the origin cannot (containerd's ``resolve``).
    resolve: bool = False
    #: Sent with every request (hosts.toml ``[header]``).
    headers: tuple[tuple[str, str], ...] = ()
    #: ``?ns=`` value: the registry the content belongs to.
    ns: str | None = None
    skip_verify: bool = False
    #: CA bundles to trust (hosts.toml ``ca``).
    ca: tuple[str, ...] = ()
    #: Client certificate and key (hosts.toml ``client``): the first pair.
    client: tuple[str, str | None] | None = None

    @property
    def host(self) -> str:
        """``host[:port]``."""
        return self.url.split("://", 1)[1]

    @property
    def plain_http(self) -> bool:
        """Whether requests go over plain HTTP."""
        return self.url.startswith("http://")

    @property
    def base(self) -> str:
        """The repository's URL under the API path."""
        return f"{self.url}{self.api}/{self.repo}"

    def describe(self) -> dict[str, Any]:
        """Describe it as JSON (``artifactd mirrors --json``); header values are not shown."""
        return {
            "url": self.url,
            "repository": self.repo,
            "api": self.api,
            "source": self.source,
            "pull": self.pull,
            "resolve": self.resolve,
            "headers": sorted({k for k, _ in self.headers}),
            "ns": self.ns,
            "skip_verify": self.skip_verify,
        }


@dataclass(frozen=True)
class MirrorPlan:
    """The hosts a reference is pulled from, in order, and why."""

    host: str
    repo: str
    #: Mirrors in the order they are tried; the origin comes after them.
    mirrors: tuple[Mirror, ...]
    #: Which configuration matched (``--mirror``, a hosts.toml, a registries.conf, ``none``).
    source: str
    #: Lines saying why (what was looked at, what matched, what was skipped).
    why: tuple[str, ...] = ()
    #: registries.conf ``blocked = true``: no pull from this registry at all.
    blocked: bool = False
    #: registries.conf ``insecure`` of the registry itself: plain HTTP to the origin.
    insecure: bool = False

    def describe(self) -> dict[str, Any]:
        """Describe the plan as JSON (``artifactd mirrors --json``)."""
        return {
            "schema_version": 1,
            "registry": self.host,
            "repository": self.repo,
            "source": self.source,
            "blocked": self.blocked,
            "mirrors": [m.describe() for m in self.mirrors],
            "origin": {"host": self.host, "repository": self.repo, "tags": True},
            "why": list(self.why),
        }


# --------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------


def explain(ref: str, settings: MirrorSettings) -> MirrorPlan:
    """Return the mirror plan of a registry reference (``artifactd mirrors REF``)."""
    parsed = parse_registry_ref(ref)
    return plan_mirrors(parsed.host, parsed.repo, settings)


def plan_mirrors(host: str, repo: str, settings: MirrorSettings) -> MirrorPlan:
    """Return the mirrors ``host/repo`` is pulled through, first configuration that matches."""
    why: list[str] = []
    if settings.urls:
        mirrors = tuple(_flag_mirror(u, host, repo) for u in settings.urls)
        _check_count(mirrors, "--mirror / " + ENV_MIRRORS)
        why.append(f"--mirror / {ENV_MIRRORS}: {len(mirrors)} mirror(s), in the order given")
        return MirrorPlan(host, repo, mirrors, "--mirror", tuple(why))
    found = _hosts_toml(settings.hosts_dir, host, why)
    if found is not None:
        path, doc = found
        return _from_hosts_toml(host, repo, path, doc, why)
    conf = _registries_conf(settings.registries_conf, host, repo, why)
    if conf is not None:
        return conf
    why.append("no mirror configured: every request goes to the registry")
    return MirrorPlan(host, repo, (), "none", tuple(why))


def _check_count(mirrors: Sequence[Mirror], where: str) -> None:
    if len(mirrors) > B.MAX_MIRRORS:
        raise ConfigError(
            f"{where} names {len(mirrors)} mirrors, more than {B.MAX_MIRRORS}",
            hint="list the few mirrors a node should try, nearest first",
        )


def _url(text: str, where: str) -> tuple[str, str]:
    """Return ``(scheme://host[:port], path)`` of a mirror URL (https unless loopback)."""
    raw = text.strip()
    if "://" not in raw:
        host = raw.partition("/")[0]
        raw = f"{'http' if is_loopback(host) else 'https'}://{raw}"
    try:
        endpoint = parse_url(raw, where)
    except UsageError as exc:
        raise ConfigError(exc.message, hint=exc.hint) from None
    if endpoint.authorization is not None:
        raise ConfigError(
            f"{where} {endpoint.shown!r} carries credentials in the URL",
            hint="a mirror gets no credentials from artifactd; drop the user:password@ part",
        )
    scheme, _, rest = raw.partition("://")
    hostport, _, path = rest.partition("/")
    return f"{scheme.lower()}://{hostport}", "/" + path.strip("/") if path.strip("/") else ""


def _flag_mirror(text: str, host: str, repo: str) -> Mirror:
    url, path = _url(text, "--mirror")
    return Mirror(url, f"{path}/v2", repo, "--mirror", ns=host)


def _read_toml(path: Path) -> dict[str, Any] | None:
    """Read a TOML file, bounded; None when it does not exist."""
    try:
        data = read_regular(path, B.MAX_MIRROR_CONFIG_BYTES, follow=True)
    except MissingInputError:
        return None
    except InputFileError as exc:
        raise ConfigError(f"mirror configuration {exc}", hint=_FILE_HINT) from None
    try:
        doc: dict[str, Any] = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(
            f"mirror configuration {path} is not valid TOML: {str(exc)[:200]}", hint=_FILE_HINT
        ) from None
    return doc


_FILE_HINT = (
    "fix the file, or point --hosts-dir / --registries-conf (ARTIFACTD_HOSTS_DIR, "
    "ARTIFACTD_REGISTRIES_CONF) elsewhere"
)


def host_dirs(host: str) -> list[str]:
    """Return containerd's lookup order: ``host_port_``, ``host:port``, ``_default``."""
    names = []
    idx = host.rfind(":")
    if idx > 0 and not host.endswith("]"):
        names.append(f"{host[:idx]}_{host[idx + 1 :]}_")
    names.append(host)
    names.append("_default")
    return names


def _hosts_toml(root: Path, host: str, why: list[str]) -> tuple[Path, dict[str, Any]] | None:
    for name in host_dirs(host):
        path = root / name / "hosts.toml"
        doc = _read_toml(path)
        if doc is not None:
            why.append(f"hosts.toml: {path} (containerd's lookup: {', '.join(host_dirs(host))})")
            return path, doc
    why.append(f"hosts.toml: none under {root} for {host}")
    return None


def _strings(value: Any, what: str, path: Path) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise ConfigError(f"{path}: {what} must be a string or a list of strings", hint=_FILE_HINT)


def _headers(table: Any, path: Path) -> tuple[tuple[str, str], ...]:
    if table is None:
        return ()
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [header] must be a table", hint=_FILE_HINT)
    out = []
    for key, value in table.items():
        for v in _strings(value, f"header {key!r}", path):
            if any(c in key + v for c in "\r\n\x00") or not key.strip():
                raise ConfigError(f"{path}: header {key!r} holds a line break", hint=_FILE_HINT)
            out.append((key, v))
    if len(out) > B.MAX_MIRROR_HEADERS:
        raise ConfigError(
            f"{path}: {len(out)} header values, more than {B.MAX_MIRROR_HEADERS}", hint=_FILE_HINT
        )
    return tuple(out)


def _client(value: Any, path: Path) -> tuple[str, str | None] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return (value, None)
    if isinstance(value, list) and value:
        first = value[0]
        if isinstance(first, str):
            return (first, value[1] if len(value) > 1 and isinstance(value[1], str) else None)
        if isinstance(first, list) and first and all(isinstance(v, str) for v in first):
            return (first[0], first[1] if len(first) > 1 else None)
    raise ConfigError(f"{path}: client must be a path or [cert, key] pairs", hint=_FILE_HINT)


def _from_hosts_toml(
    host: str, repo: str, path: Path, doc: Mapping[str, Any], why: list[str]
) -> MirrorPlan:
    hosts = doc.get("host", {})
    if not isinstance(hosts, dict):
        raise ConfigError(f'{path}: [host."URL"] entries must be tables', hint=_FILE_HINT)
    mirrors = []
    for key, table in hosts.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: [host.{key!r}] must be a table", hint=_FILE_HINT)
        url, prefix = _url(key, f"{path}: host")
        caps = _strings(table.get("capabilities", ["pull", "resolve"]), "capabilities", path)
        override = table.get("override_path", False) is True
        api = prefix if override else f"{prefix}/v2"
        mirror_host = url.split("://", 1)[1]
        mirror = Mirror(
            url,
            api,
            repo,
            str(path),
            pull="pull" in caps,
            resolve="resolve" in caps,
            headers=_headers(table.get("header"), path),
            ns=host if mirror_host.lower() != host.lower() else None,
            skip_verify=table.get("skip_verify", False) is True,
            ca=tuple(_strings(table["ca"], "ca", path)) if "ca" in table else (),
            client=_client(table.get("client"), path),
        )
        if not mirror.pull and not mirror.resolve:
            why.append(f"{url}: skipped, its capabilities {caps} have neither pull nor resolve")
            continue
        if not mirror.pull:
            why.append(f"{url}: tags only, when the registry cannot answer (no 'pull')")
        mirrors.append(mirror)
    _check_count(mirrors, str(path))
    server = doc.get("server")
    if isinstance(server, str):
        why.append(f"server = {server!r}: the registry itself, where tags are resolved")
    why.append(f"{len(mirrors)} mirror(s) in file order, then the registry {host}")
    return MirrorPlan(host, repo, tuple(mirrors), f"hosts.toml {path}", tuple(why))


def _registries_files(conf: Path, why: list[str]) -> list[tuple[Path, dict[str, Any]]]:
    files = []
    doc = _read_toml(conf)
    if doc is not None:
        files.append((conf, doc))
    drop_in = Path(f"{conf}.d")
    try:
        names = sorted(p.name for p in drop_in.iterdir() if p.name.endswith(".conf"))
    except OSError:
        names = []
    if len(names) > B.MAX_REGISTRIES_CONF_FILES:
        why.append(
            f"{drop_in}: {len(names)} files, only the first {B.MAX_REGISTRIES_CONF_FILES} read"
        )
        names = names[: B.MAX_REGISTRIES_CONF_FILES]
    for name in names:
        d = _read_toml(drop_in / name)
        if d is not None:
            files.append((drop_in / name, d))
    return files


def _prefix_matches(prefix: str, ref: str) -> bool:
    """containers-image's rule: the prefix, then the end or a path or tag separator."""
    if prefix.startswith("*."):
        host = ref.partition("/")[0]
        return host.endswith(prefix[1:])
    return ref == prefix or (ref.startswith(prefix) and ref[len(prefix)] in "/:@")


def _flag(table: Mapping[str, Any], key: str, path: Path) -> bool:
    value = table.get(key, False)
    if not isinstance(value, bool):
        raise ConfigError(f"{path}: {key} must be true or false", hint=_FILE_HINT)
    return value


def _registry_entries(conf: Path, why: list[str]) -> dict[str, tuple[Path, dict[str, Any]]]:
    """Every ``[[registry]]`` by prefix; a later file's replaces an earlier one's."""
    entries: dict[str, tuple[Path, dict[str, Any]]] = {}
    for path, doc in _registries_files(conf, why):
        regs = doc.get("registry", [])
        if not isinstance(regs, list):
            raise ConfigError(f"{path}: [[registry]] must be an array of tables", hint=_FILE_HINT)
        for reg in regs:
            if not isinstance(reg, dict):
                raise ConfigError(f"{path}: a [[registry]] is not a table", hint=_FILE_HINT)
            prefix = reg.get("prefix") or reg.get("location")
            if not isinstance(prefix, str) or not prefix:
                raise ConfigError(
                    f"{path}: a [[registry]] has no prefix or location", hint=_FILE_HINT
                )
            entries[prefix] = (path, reg)
            if len(entries) > B.MAX_REGISTRY_ENTRIES:
                raise ConfigError(
                    f"more than {B.MAX_REGISTRY_ENTRIES} [[registry]] entries", hint=_FILE_HINT
                )
    return entries


def _registries_conf(conf: Path, host: str, repo: str, why: list[str]) -> MirrorPlan | None:
    entries = _registry_entries(conf, why)
    ref = f"{host}/{repo}"
    matching = [p for p in entries if _prefix_matches(p, ref)]
    if not matching:
        why.append(f"registries.conf: no [[registry]] prefix matches {ref} ({conf} and .d)")
        return None
    prefix = max(matching, key=len)
    path, reg = entries[prefix]
    why.append(f"registries.conf: {path}: prefix {prefix!r} (the longest that matches {ref})")
    blocked = _flag(reg, "blocked", path)
    digest_only = _flag(reg, "mirror-by-digest-only", path)
    default_mode = reg.get("pull-from-mirror", "all")
    location = reg.get("location")
    if isinstance(location, str) and location and location != prefix:
        why.append(f"location {location!r} shown only: tags are resolved at {host}")
    mirrors = []
    rest = ref[len(prefix) :] if not prefix.startswith("*.") else ref[len(host) :]
    raw_mirrors = reg.get("mirror", [])
    if not isinstance(raw_mirrors, list):
        raise ConfigError(
            f"{path}: [[registry.mirror]] must be an array of tables", hint=_FILE_HINT
        )
    for m in raw_mirrors:
        if not isinstance(m, dict) or not isinstance(m.get("location"), str):
            raise ConfigError(f"{path}: a [[registry.mirror]] has no location", hint=_FILE_HINT)
        mode = m.get("pull-from-mirror", default_mode)
        if mode not in ("all", "digest-only", "tag-only"):
            raise ConfigError(
                f"{path}: pull-from-mirror {mode!r} is not all, digest-only or tag-only",
                hint=_FILE_HINT,
            )
        target = m["location"] + rest
        mhost, _, mrepo = target.partition("/")
        insecure = _flag(m, "insecure", path)
        scheme = "http" if insecure or is_loopback(mhost) else "https"
        url, _ = _url(f"{scheme}://{mhost}", f"{path}: mirror location")
        mirror = Mirror(
            url,
            "/v2",
            mrepo,
            str(path),
            pull=mode != "tag-only",
            resolve=mode != "digest-only" and not digest_only,
            ns=None,
        )
        if not mirror.pull and not mirror.resolve:
            continue
        mirrors.append(mirror)
        why.append(f"mirror {target} (pull-from-mirror = {mode!r})")
    _check_count(mirrors, str(path))
    return MirrorPlan(
        host,
        repo,
        tuple(mirrors),
        f"registries.conf {path}",
        tuple(why),
        blocked=blocked,
        insecure=_flag(reg, "insecure", path),
    )


__all__ = [
    "NO_MIRRORS",
    "Mirror",
    "MirrorPlan",
    "MirrorSettings",
    "explain",
    "host_dirs",
    "plan_mirrors",
]
