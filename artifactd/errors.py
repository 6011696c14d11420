"""One error hierarchy for the whole library.

Every error says what went wrong (``str(err)``) and what to do about it
(``err.hint``). The CLI maps each class to one line on stderr and a documented
exit code (the table in :mod:`artifactd.cli` and docs/reference/exit-codes.md); the library
itself never prints and never exits. ``kind`` names the failure class that
``--json`` reports (``"unreachable"``, ``"corrupt"``, ``"no_space"``...).
"""

from __future__ import annotations


class ArtifactdError(Exception):
    """Base class of every error artifactd raises on purpose."""

    #: Process exit code the CLI uses for this class of error.
    exit_code: int = 1
    #: Failure class reported in ``--json`` documents.
    kind: str = "internal"

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
    kind = "usage"


class ConfigError(ArtifactdError):
    """A matrix, fingerprint file or setting is malformed."""

    exit_code = 2
    kind = "config"


class StoreError(ArtifactdError):
    """A store could not be read or written (missing dir, I/O error, network)."""

    exit_code = 3
    kind = "unreachable"


class NotFoundError(StoreError):
    """The store answered, but has no such artifact, tag or blob."""

    exit_code = 4
    kind = "not_found"


class IntegrityError(ArtifactdError):
    """Bytes did not match their digest or size: the artifact is corrupt."""

    exit_code = 5
    kind = "corrupt"


class UnsafeArtifactError(IntegrityError):
    """An artifact tried to write outside its root or carried a forbidden member."""

    exit_code = 5
    kind = "hostile"


class CacheMissError(ArtifactdError):
    """No artifact matches the local fingerprint and the caller required one."""

    exit_code = 6
    kind = "miss"


class BuildError(ArtifactdError):
    """A warm-up cell failed or produced nothing to harvest."""

    exit_code = 7
    kind = "build"


class LintError(BuildError):
    """``--strict`` and the hygiene lint found something that ties caches to this machine.

    The same findings give the same code from ``lint --strict`` and ``build --strict``.
    """

    exit_code = 11
    kind = "lint"


class VerifyError(BuildError):
    """The correctness gate failed: a check differs, or a restored cell compiled anyway."""

    exit_code = 12
    kind = "verify"


class TrustError(ArtifactdError):
    """A manifest is not signed by a trusted key.

    Unsigned, signed for another digest, signed by a key not given, or its
    signature is unreadable: ``reason`` says which (``unsigned``, ``wrong_digest``, ``unknown_key``,
    ``malformed``). A restore with a verification policy installs nothing then.
    """

    exit_code = 14
    kind = "untrusted"

    def __init__(self, message: str, *, reason: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.reason = reason


class UnboundError(IntegrityError):
    """A tag names an artifact whose own content says it is for something else.

    Another fingerprint behind ``fp-<hash>``, another scope key behind a
    family tag: a tag re-pointed or mis-published. Such an artifact is never
    installed; this is the failure of a restore with ``--require`` that met one.
    """

    exit_code = 5
    kind = "corrupt"


class SchemaError(IntegrityError):
    """An artifact document failed validation or has an unknown schema version."""

    exit_code = 5
    kind = "schema"


class NoSpaceError(ArtifactdError):
    """The target filesystem has not enough free space (or quota) for the restore."""

    exit_code = 9
    kind = "no_space"


class TargetError(ArtifactdError):
    """The restore target cannot be written or locked (read-only, permissions, busy)."""

    exit_code = 10
    kind = "target"


class PredictedMissError(ArtifactdError):
    """``predict --require-hit``: the engine's own cache key will not match (or is unknown).

    The pod can refuse to start rather than spend its compile time: the
    message names each factor that differs.
    """

    exit_code = 17
    kind = "predicted_miss"
