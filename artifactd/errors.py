"""One error hierarchy for the whole library.

Every error says what went wrong (``str(err)``) and what to do about it
(``err.hint``). The CLI maps each class to one line on stderr and a documented
exit code (see ``EXIT_CODES`` in :mod:`artifactd.cli`); the library itself
never prints and never exits.
"""

from __future__ import annotations


class ArtifactdError(Exception):
    """Base class of every error artifactd raises on purpose."""

    #: Process exit code the CLI uses for this class of error.
    exit_code: int = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def diagnostics(self) -> str:
        """Return the message followed by the hint, for humans."""
        if self.hint:
            return f"{self.message}\n  hint: {self.hint}"
        return self.message


class UsageError(ArtifactdError):
    """The caller asked for something that cannot make sense (bad flag, bad ref)."""

    exit_code = 2


class ConfigError(ArtifactdError):
    """A matrix, fingerprint file or setting is malformed."""

    exit_code = 2


class StoreError(ArtifactdError):
    """A store could not be read or written (missing dir, I/O error, network)."""

    exit_code = 3


class NotFoundError(StoreError):
    """The store answered, but has no such artifact, tag or blob."""

    exit_code = 4


class IntegrityError(ArtifactdError):
    """Bytes did not match their digest or size: the artifact is corrupt."""

    exit_code = 5


class UnsafeArtifactError(IntegrityError):
    """An artifact tried to write outside its root or carried a forbidden member."""

    exit_code = 5


class CacheMissError(ArtifactdError):
    """No artifact matches the local fingerprint and the caller required one."""

    exit_code = 6


class BuildError(ArtifactdError):
    """A warm-up cell failed or produced nothing to harvest."""

    exit_code = 7


class ProbeError(ArtifactdError):
    """The local environment could not be probed."""

    exit_code = 8
