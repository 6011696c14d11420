"""Parse the ordinary command lines of ``fingerprint`` and ``restore`` without click.

An init container runs ``artifactd restore`` with a few flags or none (its
settings come from ``ARTIFACTD_*`` variables), and importing click costs about
as much as starting Python. This parser reads exactly those command lines, from
the same declarations click reads (:mod:`artifactd.cli.specs`) and with
click's rules: long options as ``--name VALUE`` or ``--name=VALUE``; a flag
takes no value; the command line wins over the environment, which wins over
the default; an empty variable counts as unset; the variable of a repeatable
option holds several values separated by whitespace; a flag's variable is a
boolean in click's spelling.

Anything else (``--help``, a positional argument, an unknown or malformed
option, a value that does not convert, a missing required option) returns
None, and the caller hands the command line to click, which gives its usual
answer or error.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from artifactd.cli.specs import COMMANDS, FALSE, TRUE, Opt


def parse(
    args: Sequence[str], environ: Mapping[str, str] | None = None
) -> Callable[[], None] | None:
    """Return a call that runs ``args``, or None when click must parse them."""
    if not args or args[0] not in COMMANDS:
        return None
    values = parse_options(args[0], args[1:], os.environ if environ is None else environ)
    if values is None:
        return None
    from artifactd.cli import podstart

    run: Callable[..., None] = getattr(podstart, args[0])
    return lambda: run(**values)


def parse_options(
    command: str, args: Sequence[str], environ: Mapping[str, str]
) -> dict[str, Any] | None:
    """Return the keyword arguments click would pass to ``command``, or None if unsure."""
    specs = COMMANDS[command]
    given = _given(specs, args)
    if given is None:
        return None
    out: dict[str, Any] = {}
    for spec in specs:
        raw = given.get(spec.dest)
        if raw is None:
            raw = _from_environ(spec, environ)
        if raw is None:
            if spec.required:
                return None
            out[spec.dest] = False if spec.is_flag else () if spec.multiple else spec.default
            continue
        converted = [_convert(spec, v) for v in raw]
        if any(v is None for v in converted):
            return None
        out[spec.dest] = tuple(converted) if spec.multiple else converted[-1]
    return out


def _given(specs: Sequence[Opt], args: Sequence[str]) -> dict[str, list[str]] | None:
    """Collect each option's values from the command line, or None if any is odd."""
    by_flag = {spec.flag: spec for spec in specs}
    given: dict[str, list[str]] = {}
    i = 0
    while i < len(args):
        flag, eq, value = args[i].partition("=")
        spec = by_flag.get(flag)
        if spec is None or (spec.is_flag and eq) or (eq and not value):
            return None
        if spec.is_flag:
            value = "1"
        elif not eq:
            i += 1
            if i == len(args) or args[i].startswith("-"):
                return None
            value = args[i]
        given.setdefault(spec.dest, []).append(value)
        i += 1
    return given


def _from_environ(spec: Opt, environ: Mapping[str, str]) -> list[str] | None:
    text = environ.get(spec.envvar) if spec.envvar else None
    if not text:
        return None
    if spec.is_flag:
        return [text]
    return text.split() if spec.multiple else [text]


def _convert(spec: Opt, text: str) -> Any:
    """Return the value as click converts it, or None when click would refuse it."""
    if spec.is_flag:
        word = text.strip().lower()
        return True if word in TRUE else False if word in FALSE else None
    if spec.kind == "path":
        return Path(text)
    if spec.kind == "float":
        try:
            return float(text)
        except ValueError:
            return None
    return text
