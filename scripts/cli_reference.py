"""Write docs/reference/cli.md from the click commands, so the reference cannot drift.

Usage: python scripts/cli_reference.py [--check]

Each command's section is its own ``--help``, exactly as the command prints it
(click's formatting at a fixed width). ``--check`` writes nothing and exits 1
when the file is not what the commands say (``tests/test_docs.py`` runs it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import click

from artifactd.cli.app import cli

OUT = Path(__file__).resolve().parents[1] / "docs" / "reference" / "cli.md"
WIDTH = 100

HEAD = """# Command reference

Every command's `--help`, generated from the commands themselves by
`scripts/cli_reference.py` (a test fails when this page and the commands
disagree). What each exit code means is in
[Failure policy and exit codes](exit-codes.md).
"""


def _leaves(group: click.Group, prefix: str) -> list[tuple[str, click.Command]]:
    out: list[tuple[str, click.Command]] = []
    for name in sorted(group.commands):
        command = group.commands[name]
        if isinstance(command, click.Group):
            out += _leaves(command, f"{prefix}{name} ")
        else:
            out.append((f"{prefix}{name}", command))
    return out


def render() -> str:
    """Return the page: a section per command, its help as click prints it."""
    parts = [HEAD]
    for name, command in _leaves(cli, ""):
        ctx = click.Context(
            command, info_name=f"artifactd {name}", terminal_width=WIDTH, max_content_width=WIDTH
        )
        parts.append(f"## artifactd {name}\n\n```text\n{command.get_help(ctx).rstrip()}\n```\n")
    return "\n".join(parts)


def main() -> int:
    """Write the page, or with ``--check`` compare it; return the exit code."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    args = parser.parse_args()
    text = render()
    if args.check:
        current = OUT.read_text(encoding="utf-8") if OUT.is_file() else ""
        if current != text:
            print(f"{OUT} is stale: run python scripts/cli_reference.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
