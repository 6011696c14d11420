"""What a lint found: findings, one sentence of cost each, and the counts around them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Severity = Literal["warning", "error"]

KIND_PATH = "absolute-path"
KIND_USER = "user-name"
KIND_HOST = "host-name"
KIND_VOLATILE = "volatile-factor"


@dataclass(frozen=True)
class Finding:
    """One thing in a cache that ties it to the build machine.

    ``file`` is relative to the component root (POSIX separators); ``value``
    is what was found (the leaked build path, user or host name, or a hash
    factor's value); ``detail`` says where (an example of the embedded path,
    the occurrence count, or the factor's key); ``cost`` is one sentence
    saying what it will cost on the pod.
    """

    severity: Severity
    kind: str
    family: str
    component: str
    file: str
    value: str
    cost: str
    detail: str = ""

    def sort_key(self) -> tuple[str, ...]:
        """Return the deterministic order of a report: family, component, file, kind, value."""
        return (self.family, self.component, self.file, self.kind, self.value, self.detail)


@dataclass
class LintReport:
    """What :func:`lint` found.

    ``files_truncated`` counts files longer than the read cap (searched in
    their first part only); ``unreadable`` lists ``family:component:file``
    entries that could not be read or parsed, or whose name is not UTF-8 (the
    harvest leaves them out; bytes shown as ``\\xNN``); ``unknown_families`` the
    names of ``roots`` keys artifactd has no family for (scanned with default
    rules: nothing is treated as rewritten on restore).
    """

    findings: list[Finding] = field(default_factory=list)
    files_scanned: int = 0
    bytes_scanned: int = 0
    files_truncated: int = 0
    unreadable: list[str] = field(default_factory=list)
    unknown_families: list[str] = field(default_factory=list)

    @property
    def errors(self) -> int:
        """How many findings are errors."""
        return sum(1 for f in self.findings if f.severity == "error")

    @property
    def warnings(self) -> int:
        """How many findings are warnings."""
        return sum(1 for f in self.findings if f.severity == "warning")

    def fails(self, *, strict: bool) -> bool:
        """Whether a lint fails (exit 11): on an error, or with ``strict`` on any finding."""
        return bool(self.errors or (strict and self.findings))
