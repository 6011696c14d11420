"""Registry credentials: from ``ARTIFACTD_REGISTRY_*``, else the Docker config.

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
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from artifactd.constants import (
    DOCKER_CONFIG,
    ENV_REGISTRY_PASSWORD,
    ENV_REGISTRY_USERNAME,
    HOME,
    current_environ,
)

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
    """Return credentials for ``host`` from the environment or the Docker config."""
    environ = current_environ() if environ is None else environ
    user = environ.get(ENV_REGISTRY_USERNAME)
    if user:
        return Credentials(user, environ.get(ENV_REGISTRY_PASSWORD, ""))
    try:
        config = json.loads(_docker_config_path(environ).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return _from_docker_config(config, host) if isinstance(config, dict) else None


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
