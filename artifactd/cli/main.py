"""The entry point: run a command and map every error to one line and an exit code.

Click is imported only when it is needed: the ordinary command lines of the
pod-start commands (``fingerprint``, ``restore``) and ``--version`` are parsed
and run by :mod:`artifactd.cli.fast` without it (and, as the program's entry
point, end without the interpreter's module teardown: :func:`_leave`); everything else,
``--help`` and every command line the fast parser does not fully understand
go through click.
"""

from __future__ import annotations

import atexit
import os
import sys

from artifactd import constants as C  # noqa: N812
from artifactd.cli.fast import parse
from artifactd.cli.render import echo
from artifactd.cli.specs import env_flag
from artifactd.errors import ArtifactdError, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import NoReturn


def main(argv: Sequence[str] | None = None) -> None:
    """Run the CLI, mapping every error to one line on stderr and an exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        traceback = env_flag(C.ENV_TRACEBACK)
    except UsageError as exc:
        echo(f"artifactd: error: {exc.diagnostics()}", err=True)
        sys.exit(exc.exit_code)
    try:
        invocation = parse(args)
        if invocation is not None:
            code = _run(invocation)
            if argv is None:
                _leave(code)
            sys.exit(code)
        _run_click(args)
    except ArtifactdError as exc:
        if traceback:
            raise
        echo(f"artifactd: error: {exc.diagnostics()}", err=True)
        sys.exit(exc.exit_code)
    except OSError as exc:
        # Every filesystem error a user can cause is mapped where it happens, to
        # its documented code (store 3, no space 9, target 10, input file 2): one
        # that reaches here was not foreseen, which is what exit 1 means.
        if traceback:
            raise
        echo(
            f"artifactd: error: {exc.strerror or exc}: {exc.filename or ''}\n"
            "  hint: artifactd did not map this error (exit 1: a bug); "
            "ARTIFACTD_TRACEBACK=1 shows where, please report it",
            err=True,
        )
        sys.exit(1)
    except Exception as exc:
        if traceback:
            raise
        echo(
            f"artifactd: internal error: {type(exc).__name__}: {str(exc)[:200]}\n"
            "  hint: this is a bug; set ARTIFACTD_TRACEBACK=1 and report the traceback",
            err=True,
        )
        sys.exit(1)
    sys.exit(0)


def _run(invocation: Callable[[], None]) -> int:
    """Run a fast-path command; return its exit code (it may exit with one)."""
    try:
        invocation()
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        raise
    return 0


def _leave(code: int) -> NoReturn:
    """End the process now: exit handlers run and output is flushed, the module teardown skipped.

    Tearing down the fifty-odd modules a pod-start command loaded costs a few
    milliseconds, a sixth of what the command adds to a bare Python start; a
    finished command has nothing left to clean up. Exit handlers still run
    (coverage, a test's probe), and a stream that cannot be flushed takes the
    ordinary exit, which reports it.
    """
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        sys.exit(code)
    os._exit(code)


def _run_click(args: list[str]) -> None:
    """Run ``args`` through the click group; click's own outcomes become exit codes."""
    # lazy: click only for a command line the fast path does not take (LATER in
    # artifactd/cli/fast.py)
    import click  # noqa: PLC0415

    from artifactd.cli.app import cli  # noqa: PLC0415

    try:
        cli.main(args=args, prog_name="artifactd", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        echo("aborted", err=True)
        sys.exit(130)
    except click.BadParameter as exc:
        source = _from_environment(exc.param, args)
        if source is None:
            exc.show()
            sys.exit(exc.exit_code)
        # A value from the environment is named by its variable, not a flag the
        # user never typed.
        name, raw, flag = source
        echo(f"artifactd: error: {name}={raw!r} (read for {flag}): {exc.message}", err=True)
        sys.exit(UsageError.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)


def _from_environment(param: object, args: Sequence[str]) -> tuple[str, str, str] | None:
    """Return (variable, value, flag) when ``param``'s value came from its environment variable."""
    import click  # noqa: PLC0415  # lazy: only the click path gets here (the fast path never)

    if not isinstance(param, click.Option) or not param.envvar:
        return None
    if any(a == o or a.startswith(o + "=") for a in args for o in param.opts):
        return None  # typed on the command line
    names = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar)
    environ = C.current_environ()
    flag = param.opts[0]
    return next(((n, environ[n], flag) for n in names if environ.get(n) is not None), None)
