"""Registry credentials: from ``ARTIFACTD_REGISTRY_*``, else the Docker config.

The environment pair (``ARTIFACTD_REGISTRY_USERNAME`` and ``_PASSWORD``)
belongs to the registry ``ARTIFACTD_REGISTRY_HOST`` names (``HOST[:PORT]``, as
references spell it, case aside): it is sent to that registry and to no
other, and every other registry is looked up in the Docker config. A pair
without a host (the older spelling) still works for a command that talks to
one registry; a command that talks to more first calls
:func:`check_unbound_pair`, which refuses (a :class:`ConfigError`): artifactd
cannot tell which registry the pair is for, and sending it to the wrong one
hands it a password it was never given.

The Docker config is ``$DOCKER_CONFIG/config.json`` or ``~/.docker/config.json``;
a host is looked up as Docker does: ``credHelpers``, then ``auths``, then
``credsStore`` (helpers are run as ``docker-credential-<name> get``). A missing
or unreadable config means no credentials, never an error. Credentials never
appear in messages or reprs.
"""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from artifactd.constants import (
    DOCKER_CONFIG,
    ENV_REGISTRY_HOST,
    ENV_REGISTRY_PASSWORD,
    ENV_REGISTRY_USERNAME,
    HOME,
    current_environ,
)
from artifactd.errors import ConfigError
from artifactd.stores.reference import looks_like_registry

#: Seconds a credential helper may take before it counts as having no answer.
HELPER_TIMEOUT_S = 10


@dataclass(frozen=True)
class Credentials:
    """A username and password (or identity token); ``repr`` never shows them."""

    username: str
    password: str = ""

    def __repr__(self) -> str:
        return f"Credentials(username={self.username!r}, password=***)"

    def basic_header(self) -> str:
        """Return the ``Authorization`` value for HTTP Basic auth."""
        token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        return f"Basic {token}"


def find_credentials(host: str, environ: Mapping[str, str] | None = None) -> Credentials | None:
    """Return credentials for ``host``: the environment pair if it is ``host``'s, else Docker's.

    The pair is ``host``'s when ``ARTIFACTD_REGISTRY_HOST`` names ``host``, or
    names nothing (a command that talks to several registries has refused
    such a pair already, in :func:`check_unbound_pair`).
    """
    environ = current_environ() if environ is None else environ
    user = environ.get(ENV_REGISTRY_USERNAME)
    if user:
        bound = bound_host(environ)
        if bound is None or bound == host.lower():
            return Credentials(user, environ.get(ENV_REGISTRY_PASSWORD, ""))
    try:
        config = json.loads(_docker_config_path(environ).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return _from_docker_config(config, host) if isinstance(config, dict) else None


def bound_host(environ: Mapping[str, str] | None = None) -> str | None:
    """Return the ``HOST[:PORT]`` the environment pair belongs to (lowercase), or None.

    ``https://``, ``http://`` or ``docker://`` before the host and a trailing
    ``/`` are dropped, as people paste them; anything with a path is refused,
    since a pair belongs to a registry, not to a repository in it.
    """
    environ = current_environ() if environ is None else environ
    raw = environ.get(ENV_REGISTRY_HOST, "").strip()
    if not raw:
        return None
    host = raw.lower()
    for scheme in ("https://", "http://", "docker://"):
        host = host.removeprefix(scheme)
    host = host.rstrip("/")
    if not host or "/" in host or any(c.isspace() for c in host) or "@" in host:
        raise ConfigError(
            f"{ENV_REGISTRY_HOST}={raw!r} is not a registry host",
            hint=f"set it to the HOST[:PORT] the {ENV_REGISTRY_USERNAME}/PASSWORD pair is for, "
            "as your references spell it: registry.example.com or 127.0.0.1:5000",
        )
    return host


def registry_host(ref: str) -> str | None:
    """Return the registry host (lowercase) a store or artifact reference names, or None."""
    text = ref.strip()
    if text.startswith("oci:") or not looks_like_registry(text):
        return None
    return text.removeprefix("docker://").partition("/")[0].lower()


def check_unbound_pair(
    refs: Iterable[str | None], environ: Mapping[str, str] | None = None
) -> None:
    """Refuse an environment pair without a host when ``refs`` name several registries.

    Called by every command that talks to more than one store, before it
    opens any: which of the registries the pair belongs to is the user's to
    say (``ARTIFACTD_REGISTRY_HOST``), never artifactd's to guess.
    ``refs`` are store or artifact references; local ones and None are skipped.
    """
    environ = current_environ() if environ is None else environ
    if not environ.get(ENV_REGISTRY_USERNAME) or bound_host(environ) is not None:
        return
    hosts = sorted({h for ref in refs if ref and (h := registry_host(ref)) is not None})
    if len(hosts) > 1:
        raise ConfigError(
            f"{ENV_REGISTRY_USERNAME} is set without {ENV_REGISTRY_HOST}, and this command "
            f"talks to {len(hosts)} registries ({', '.join(hosts)}): the pair can belong to "
            "only one of them",
            hint=f"set {ENV_REGISTRY_HOST} to the registry the pair is for (HOST[:PORT]); "
            "log in to the other in the Docker config (docker login HOST)",
        )


def _docker_config_path(environ: Mapping[str, str]) -> Path:
    base = environ.get(DOCKER_CONFIG)
    if base:
        return Path(base) / "config.json"
    home = environ.get(HOME)
    return (Path(home) if home else Path.home()) / ".docker" / "config.json"


def _from_helper(helper: str, host: str) -> Credentials | None:
    try:
        proc = subprocess.run(
            [f"docker-credential-{helper}", "get"],
            input=host,
            capture_output=True,
            text=True,
            timeout=HELPER_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    try:
        doc = json.loads(proc.stdout)
        return Credentials(str(doc["Username"]), str(doc["Secret"]))
    except (ValueError, KeyError, TypeError):
        return None


def _from_auth_entry(entry: Mapping[str, Any]) -> Credentials | None:
    if entry.get("auth"):
        try:
            decoded = base64.b64decode(str(entry["auth"])).decode()
        except (ValueError, UnicodeDecodeError):
            return None
        name, _, secret = decoded.partition(":")
        return Credentials(name, secret)
    if entry.get("username"):
        return Credentials(str(entry["username"]), str(entry.get("password", "")))
    if entry.get("identitytoken"):
        return Credentials("<token>", str(entry["identitytoken"]))
    return None


def _from_docker_config(config: Mapping[str, Any], host: str) -> Credentials | None:
    """Look ``host`` up as Docker does: credHelpers, then auths, then credsStore."""
    helper = (config.get("credHelpers") or {}).get(host)
    if helper:
        return _from_helper(str(helper), host)
    auths = config.get("auths") or {}
    for key in (host, f"https://{host}", f"http://{host}", f"https://{host}/v1/"):
        entry = auths.get(key)
        if isinstance(entry, dict) and (found := _from_auth_entry(entry)) is not None:
            return found
    if config.get("credsStore"):
        return _from_helper(str(config["credsStore"]), host)
    return None
