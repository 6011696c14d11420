"""Registry references: ``HOST[:PORT]/REPO[:TAG|@DIGEST]``, parsed and checked.

A reference names a registry when its first component is a host (it has a dot
or a port, or is ``localhost``), as Docker decides; ``docker://`` may prefix
it. Loopback hosts are told apart here because they alone get plain HTTP
without being asked.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from artifactd.errors import UsageError
from artifactd.format.oci import check_digest, check_tag

_REPO_RE = re.compile(
    r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$"
)


@dataclass(frozen=True)
class RegistryRef:
    """A parsed ``HOST[:PORT]/REPO[:TAG|@DIGEST]`` reference."""

    host: str
    repo: str
    reference: str | None = None

    @property
    def store(self) -> str:
        """The store part, without tag or digest."""
        return f"{self.host}/{self.repo}"


def looks_like_registry(text: str) -> bool:
    """Whether ``text`` names a registry (its first component is a host)."""
    text = text.removeprefix("docker://")
    if "://" in text:
        return False  # another scheme (https://, oci-archive://...): not HOST/REPO
    first, sep, _ = text.partition("/")
    return bool(sep) and ("." in first or ":" in first or first == "localhost")


def parse_registry_ref(text: str) -> RegistryRef:
    """Parse a registry reference; raise :class:`UsageError` when malformed."""
    body = text.strip().removeprefix("docker://")
    if not looks_like_registry(body):
        raise UsageError(
            f"not a registry reference: {text!r}",
            hint="use HOST[:PORT]/REPO, e.g. registry.example.com/team/caches or 127.0.0.1:5000/c",
        )
    host, _, rest = body.partition("/")
    reference: str | None = None
    if "@" in rest:
        rest, _, reference = rest.partition("@")
        check_digest(reference)
    else:
        last = rest.rsplit("/", 1)[-1]
        if ":" in last:
            rest, _, reference = rest.rpartition(":")
            check_tag(reference)
    if not _REPO_RE.match(rest):
        raise UsageError(
            f"not a valid repository name: {rest!r}",
            hint="lowercase letters, digits and . _ - separators, / for nesting",
        )
    return RegistryRef(host, rest, reference)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (with optional port) is a loopback address, as Docker decides."""
    if host.startswith("["):
        name = host[1 : host.find("]")]  # [::1]:5000
    elif host.count(":") == 1:
        name = host.split(":", maxsplit=1)[0]  # 127.0.0.1:5000, localhost:5000
    else:
        name = host  # a bare IPv6 address, or a name without port
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
