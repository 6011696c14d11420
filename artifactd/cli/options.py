"""Options shared by several commands, as click options, and their parsing.

The options themselves are declared as data in :mod:`artifactd.cli.specs`.
Every option of the init-container commands also reads an ``ARTIFACTD_*``
environment variable, so a Kubernetes pod spec configures them through ``env``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

import click

from artifactd import bounds as B  # noqa: N812
from artifactd.cli import specs as S  # noqa: N812
from artifactd.cli.specs import Opt
from artifactd.errors import UsageError

if TYPE_CHECKING:
    from artifactd.trust.policy import Basis

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


class Number(click.ParamType):  # type: ignore[type-arg]  # not generic in every click allowed
    """A number from the command line or its environment variable, checked against its range.

    The one click type of every numeric option (click's ``FloatRange`` lets
    NaN through): the value is read and checked by
    :meth:`artifactd.bounds.Range.read`, and anything outside the range
    (NaN, infinities, a value past either end) is exit 2 with the range in
    the message.
    """

    name = "number"

    def __init__(self, bound: B.Range) -> None:
        self.bound = bound

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """Return the value read as the range's kind; fail (exit 2) when it is out of range."""
        number = self.bound.read(value)
        if number is None:
            self.fail(f"{str(value)!r} is not {self.bound.describe()}", param, ctx)
        return number

    def __repr__(self) -> str:
        return f"Number({self.bound.describe()})"


def number_option(*decls: str, bound: B.Range, help: str, **kwargs: Any) -> Callable[[F], F]:
    """Add a click option of type :class:`Number`, its range stated at the end of its help."""
    return click.option(*decls, type=Number(bound), help=f"{help} {range_help(bound)}", **kwargs)


def range_help(bound: B.Range) -> str:
    """Return the sentence that ends a numeric option's help (``Range: 0 to 600 seconds.``)."""
    unit = "bytes" if bound.kind == "size" else bound.unit
    return f"Range: {bound.span()}{' ' + unit if unit else ''}."


def option(spec: Opt) -> Callable[[F], F]:
    """Return the click option an :class:`~artifactd.cli.specs.Opt` declares."""
    extra: dict[str, Any] = {}
    if spec.is_flag:
        extra["is_flag"] = True
    if spec.multiple:
        extra["multiple"] = True
    help = spec.help
    if spec.bound is not None:
        extra["type"] = Number(spec.bound)
        help = f"{help} {range_help(spec.bound)}"
    elif spec.kind == "path":
        extra["type"] = click.Path(path_type=Path)
    if spec.default is not None:
        extra.update(default=spec.default, show_default=spec.show_default)
    if spec.required:
        extra["required"] = True
    return click.option(
        spec.flag, spec.dest, help=help, envvar=spec.envvar, metavar=spec.metavar, **extra
    )


def options(specs: Sequence[Opt]) -> Callable[[F], F]:
    """Add ``specs`` as click options, listed in ``--help`` in their order."""

    def add(f: F) -> F:
        for spec in reversed(specs):
            f = option(spec)(f)
        return f

    return add


def json_option(f: F) -> F:
    """Add ``--json``."""
    return option(S.JSON)(f)


def insecure_option(f: F) -> F:
    """Add ``--insecure``."""
    return option(S.INSECURE)(f)


def store_option(f: F) -> F:
    """Add ``--store`` and ``--insecure``."""
    return options((S.STORE, S.INSECURE))(f)


def positional_or_option(
    positional: T | None, option: T | None, *, flag: str, name: str
) -> T | None:
    """Return what a positional argument and its ``--option`` spelling gave (either, or None).

    Commands that took a positional ``STORE`` or ``DIR`` also take the
    ``--store``/``--target`` every other command uses; giving both, differently,
    is a usage error rather than a silent pick.
    """
    if positional is not None and option is not None and positional != option:
        raise UsageError(
            f"{name} given twice: {positional} and {flag} {option}",
            hint=f"give one of them ({flag} is the spelling every command takes)",
        )
    return positional if positional is not None else option


def sign_key_option(f: F) -> F:
    """Add ``--sign-key KEY`` (``ARTIFACTD_SIGN_KEY``): sign what the command publishes."""
    return option(S.SIGN_KEY)(f)


def verify_key_option(help: str | None = None) -> Callable[[F], F]:
    """Add ``--verify-key KEY`` (repeatable; ``ARTIFACTD_VERIFY_KEY``)."""
    return option(S.VERIFY_KEY._replace(help=help) if help else S.VERIFY_KEY)


def load_sign_key(spec: str | None) -> Any:
    """Load the private key ``--sign-key`` names (None when not given)."""
    if not spec:
        return None
    # lazy: every click command loads this module, and --help loads none of the library
    # (tests/test_startup.py)
    from artifactd.trust.keys import load_private_key  # noqa: PLC0415

    return load_private_key(spec)


def sign_unverified_option(f: F) -> F:
    """Add ``--sign-unverified``: re-sign without a ``--verify-key`` policy (unsafe, explicit)."""
    return click.option(
        "--sign-unverified",
        is_flag=True,
        help="UNSAFE: sign with --sign-key without verifying first. Signing vouches for "
        "whoever put the content in the store; without --verify-key this is required.",
    )(f)


@overload
def signing_basis(
    verify_keys: Sequence[str], sign_unverified: bool, *, signing: Literal[True], what: str
) -> Basis: ...
@overload
def signing_basis(
    verify_keys: Sequence[str], sign_unverified: bool, *, signing: bool, what: str
) -> Basis | None: ...
def signing_basis(
    verify_keys: Sequence[str], sign_unverified: bool, *, signing: bool, what: str
) -> Basis | None:
    """Return what re-signing rests on: a policy from ``--verify-key``, or the unsafe opt-out.

    None when nothing is verified or signed. Signing (``--sign-key``) with
    neither is a :class:`~artifactd.errors.UsageError`, as is passing both
    (one of them would be ignored).
    """
    # lazy: every click command loads this module, and --help loads none of the library
    # (tests/test_startup.py)
    from artifactd.trust.policy import UNSAFE_NO_VERIFICATION, TrustPolicy  # noqa: PLC0415

    if sign_unverified and verify_keys:
        raise UsageError(
            "--sign-unverified and --verify-key contradict each other",
            hint="keep --verify-key: what verifies under it is signed",
        )
    if sign_unverified:
        if not signing:
            raise UsageError("--sign-unverified without --sign-key signs nothing")
        return UNSAFE_NO_VERIFICATION
    if verify_keys:
        return TrustPolicy.from_specs(verify_keys)
    if signing:
        raise UsageError(
            f"{what} --sign-key needs --verify-key: signing vouches for what the store "
            "holds, whoever put it there, so it must verify first",
            hint="pass --verify-key with the public key that signed it (CI's); to sign "
            "content you checked by other means, pass --sign-unverified",
        )
    return None


def family_option(f: F) -> F:
    """Add ``--family`` (repeatable or comma-separated; ``ARTIFACTD_FAMILIES``)."""
    return option(S.FAMILY)(f)


def gpu_arch_option(help: str) -> Callable[[F], F]:
    """Add ``--gpu-arch`` (``ARTIFACTD_GPU_ARCH``) with a command's own help text."""
    return option(S.GPU_ARCH._replace(help=help))


def image_digest_option(help: str) -> Callable[[F], F]:
    """Add ``--image-digest`` (``ARTIFACTD_IMAGE_DIGEST``) with a command's own help text."""
    return option(S.IMAGE_DIGEST._replace(help=help))


def workload_option(help: str, *, envvar: bool = True) -> Callable[[F], F]:
    """Add ``--workload KEY=VALUE`` (repeatable), from ``ARTIFACTD_WORKLOAD`` if ``envvar``."""
    return option(S.WORKLOAD._replace(help=help, envvar=S.WORKLOAD.envvar if envvar else None))


def set_option(f: F) -> F:
    """Add ``--set PATH=VALUE`` (fingerprint overrides)."""
    return option(S.SET)(f)


def fingerprint_options(f: F) -> F:
    """Add the options that shape the probed fingerprint."""
    return options(S.FINGERPRINT)(f)


def run_id_option(help: str, *, required: bool = False) -> Callable[[F], F]:
    """Add ``--run-id ID``, checked as it is parsed: a bad id fails before a store is opened."""
    return click.option(
        "--run-id", metavar="ID", required=required, help=help, callback=_check_run_id
    )


def _check_run_id(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    del ctx, param
    if value is None:
        return None
    # lazy: every click command loads this module, and --help loads none of the library
    # (tests/test_startup.py)
    from artifactd.build.run import check_run_id  # noqa: PLC0415

    return check_run_id(value)


def cell_options(fn: F) -> F:
    """``--gpus`` and ``--jobs``: how a node runs a matrix's cells (``build``, ``verify``)."""
    fn = number_option(
        "--jobs",
        bound=B.JOBS,
        default=1,
        show_default=True,
        help="CPU-only cells (gpus: 0) running at once.",
    )(fn)
    return click.option(
        "--gpus",
        metavar="LIST",
        help="This node's GPUs, e.g. 0,1,2,3 (default: CUDA_VISIBLE_DEVICES, else every GPU).",
    )(fn)
