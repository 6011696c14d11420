"""Rewrite a matrix's ``serve.requests`` block in place, leaving every other byte alone.

A matrix is a commented, reviewed file: a YAML round trip would drop its
comments and reflow it. So the block is replaced by text surgery instead. The
block is located on the lines themselves: the one top-level ``serve:`` key
(block style), then its one ``requests:`` key at the indentation of serve's
keys; the block runs from that line through every line that is blank, a
comment, indented deeper, or a ``-`` item at the key's own indentation, less
the blank and comment lines at its end (those belong to what follows). Any
doubt (no ``serve:``, two of them, serve written inline, no ``requests:`` key)
is refused; the result must load as a matrix equal to the old one but for
``serve.requests``, or nothing is written; it is written atomically. A file
that cannot be replaced (a read-only directory, no space) is a
:class:`~artifactd.errors.TargetError` (exit 10), the matrix left as it was.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from artifactd.build.matrix import (
    MAX_MATRIX_BYTES,
    ServeRequests,
    parse_matrix,
    read_matrix_text,
)
from artifactd.errors import ConfigError, TargetError
from artifactd.fsutil import atomic_write

_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w.-]*|\"[^\"]*\"|'[^']*')\s*:(?:\s|$)")


def requests_yaml(requests: Iterable[ServeRequests], indent: str = "") -> list[str]:
    """Return the ``requests:`` block as YAML lines (no line ends), each after ``indent``."""
    lines = [f"{indent}requests:"]
    for r in requests:
        lines.append(f"{indent}  - kind: {r.kind}")
        lines.append(f"{indent}    prompt_tokens: [{', '.join(str(n) for n in r.prompt_tokens)}]")
        lines.append(f"{indent}    max_tokens: {r.max_tokens}")
        lines.append(f"{indent}    concurrency: {r.concurrency}")
        if r.repeat != 1:
            lines.append(f"{indent}    repeat: {r.repeat}")
    return lines


def _content(line: str) -> str:
    """Return the line without its end; empty for a blank or comment-only line."""
    stripped = line.rstrip("\r\n")
    return "" if not stripped.strip() or stripped.lstrip().startswith("#") else stripped


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _key(line: str) -> tuple[int, str] | None:
    match = _KEY.match(line)
    if match is None:
        return None
    return len(match["indent"]), match["key"].strip("\"'")


def locate_requests(lines: Sequence[str], path: Path) -> tuple[int, int, str]:
    """Return the ``serve.requests`` block as (first line, end line, indent); refuse doubt."""
    serves = [i for i, line in enumerate(lines) if _key(line) == (0, "serve")]
    if not serves:
        raise ConfigError(
            f"{path} has no top-level `serve:` key",
            hint="--write updates a serve matrix's serve.requests; this matrix runs a command",
        )
    if len(serves) > 1:
        raise ConfigError(
            f"{path} has `serve:` on lines {', '.join(str(i + 1) for i in serves)}",
            hint="keep one top-level serve: key",
        )
    start = serves[0]
    rest = lines[start].rstrip("\r\n").split(":", 1)[1].split("#", 1)[0].strip()
    if rest:
        raise ConfigError(
            f"{path}: line {start + 1}: serve is written inline",
            hint="write serve as a block (one key per line) for --write to edit it",
        )
    child: int | None = None
    found: list[int] = []
    end = len(lines)
    for i in range(start + 1, len(lines)):
        text = _content(lines[i])
        if not text:
            continue
        indent = _indent(text)
        if indent == 0:
            end = i
            break
        child = indent if child is None else child
        if indent == child and _key(text) == (child, "requests"):
            found.append(i)
    if len(found) != 1:
        where = "no" if not found else f"{len(found)}"
        raise ConfigError(
            f"{path}: {where} `requests:` key(s) under serve (lines {start + 1}-{end})",
            hint="add one `requests:` key under serve (see warmup_matrices/vllm-h100.yaml)",
        )
    first = found[0]
    key_indent = _indent(lines[first])
    last = first
    for i in range(first + 1, end):
        text = _content(lines[i])
        if not text:
            continue
        indent = _indent(text)
        if indent > key_indent or (indent == key_indent and text.lstrip().startswith("-")):
            last = i
        else:
            break
    return first, last + 1, " " * key_indent


def replace_requests(
    path: Path, requests: Sequence[ServeRequests], *, comment: str | None = None
) -> str:
    """Rewrite ``path``'s ``serve.requests`` with ``requests``; return the new text.

    Every line outside the block stays byte-identical. ``comment`` (one line)
    is written above the new items, inside the block. Refused, with nothing
    written, when the block cannot be located (:func:`locate_requests`) or the
    result does not load as the same matrix with the new requests.
    """
    path = path.resolve()  # a symlinked matrix: its target is rewritten, the link stays
    text = read_matrix_text(path)
    before = parse_matrix(text, path)
    lines = text.splitlines(keepends=True)
    first, end, indent = locate_requests(lines, path)
    newline = "\r\n" if lines[first].endswith("\r\n") else "\n"
    block = requests_yaml(requests, indent)
    if comment:
        block.insert(1, f"{indent}  # {comment}")
    # The block was the file's last line, without a line end: keep it without one.
    after_block = newline if lines[end - 1].endswith(("\n", "\r")) else ""
    new = "".join(lines[:first]) + newline.join(block) + after_block + "".join(lines[end:])
    if len(new.encode()) > MAX_MATRIX_BYTES:
        raise ConfigError(
            f"{path} would grow over {MAX_MATRIX_BYTES} bytes",
            hint="a matrix is a page of YAML",
        )
    after = parse_matrix(new, path)
    if before.serve is None:
        raise ConfigError(f"{path}: serve is empty", hint="this matrix runs a command")
    expected = before.model_copy(
        update={"serve": before.serve.model_copy(update={"requests": list(requests)})}
    )
    if after != expected:
        raise ConfigError(
            f"{path}: rewriting serve.requests would change more than serve.requests",
            hint="the requests block is not where --write looked; edit it by hand",
        )

    try:
        atomic_write(path, new.encode(), mode=os.stat(path).st_mode & 0o7777)
    except OSError as exc:
        raise TargetError(
            f"cannot write {path}: {exc.strerror or exc} (it is unchanged)",
            hint="the matrix is replaced by a file written next to it: its directory must be "
            "writable; or print the requests without --write and paste them",
        ) from None
    return new
