"""One shape for every command: the table of options, derived from the click commands.

A new command or option that breaks the shape fails here, naming it:

* an option name means one thing: the same type, flag-ness and repetition in
  every command that has it (:data:`SAME_NAME_DIFFERS` lists, with reasons, the
  few that may not);
* every command that reads or writes a store takes ``--store`` (a positional
  ``STORE`` stays as an alias), and every command that works on a target
  directory takes ``--target``: :data:`NO_STORE` and :data:`NO_TARGET` name
  the commands whose operands are something else, with the reason;
* every byte-count option reads a size (``500M``, ``20G``) through the one
  :data:`artifactd.bounds.SIZE` range;
* every command that deletes is a dry run unless ``--apply``;
* every environment variable an init-container command reads is in the
  list in docs/guide/using.md.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click
import pytest
from conftest import clean_env, run_artifactd

from artifactd import bounds as B  # noqa: N812
from artifactd.cli import render
from artifactd.cli.app import cli
from artifactd.cli.options import Number
from artifactd.stores import open_store

#: The page that lists every variable the init-container commands read.
VARIABLES_PAGE = Path(__file__).resolve().parents[1] / "docs" / "guide" / "using.md"

#: Options whose name is shared by commands that mean different things by it.
SAME_NAME_DIFFERS: dict[str, str] = {
    "--store": "gc, node-features and prefetch name the node store (oci:PATH, required); "
    "the others a registry or layout with a default",
    "--target": "status and lint read a target, restore, exec and contribute also write one",
    "--tag": "copy selects tags (repeatable), image build names the one image it writes",
    "--dry-run": "a flag everywhere; restore's and exec's read ARTIFACTD_DRY_RUN, gc's does not",
    "--metrics-file": "restore/exec/status/gc write node-exporter textfiles: the same meaning, "
    "the pod-start ones declared once for the fast parser",
}
#: Commands that touch a store, and why they take no ``--store``.
NO_STORE: dict[str, str] = {
    "copy": "two stores: SOURCE and DESTINATION, positional as in cp",
    "inspect": "REF names one artifact, store and tag together",
    "mirrors": "REF names a registry repository; it reads mirror configuration, never the store",
    "predict": "--from REF names one artifact, store and tag together (only its config is read)",
    "sign": "REF names one artifact, store and tag together",
    "diff": "A and B are operands: local, a file or an artifact reference",
    "image append": "--base, --artifact and --to are image and artifact references",
    "image build": "--artifact and --base are references; --push names the image",
    "status": "reads the target's restore marker, which names the store",
    "fingerprint": "probes this machine; reads no store",
    "keygen": "writes a key pair",
    "schema": "writes the JSON Schemas",
    "matrix cells": "reads a matrix",
    "matrix shapes": "reads a matrix and engine logs or metrics",
    "lint": "reads cache directories (a target or the build's roots), not a store",
}
#: The commands that work on a target directory (restore's, a pod's) take ``--target``.
TARGET_COMMANDS = ("restore", "exec", "status", "contribute", "lint")
#: Commands that delete what they select: each is a dry run unless ``--apply``.
DELETING = ("prune", "gc")
#: The init-container commands, whose variables docs/guide/using.md lists.
INIT_COMMANDS = ("restore", "exec", "status", "fingerprint", "prefetch")


def _commands(group: click.Group = cli, prefix: str = "") -> dict[str, click.Command]:
    out: dict[str, click.Command] = {}
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            out.update(_commands(command, f"{prefix}{name} "))
        else:
            out[f"{prefix}{name}"] = command
    return out


def _options(command: click.Command) -> dict[str, click.Option]:
    return {
        o: p
        for p in command.params
        if isinstance(p, click.Option)
        for o in p.opts
        if o.startswith("--")
    }


def _shape(option: click.Option) -> tuple[str, bool, bool]:
    kind = type(option.type).__name__
    if isinstance(option.type, Number):
        kind = f"Number({option.type.bound.kind})"
    return kind, option.is_flag, option.multiple


def test_an_option_name_means_one_thing() -> None:
    shapes: dict[str, dict[tuple[str, bool, bool], list[str]]] = {}
    for name, command in _commands().items():
        for flag, option in _options(command).items():
            shapes.setdefault(flag, {}).setdefault(_shape(option), []).append(name)
    differing = {
        flag: by for flag, by in shapes.items() if len(by) > 1 and flag not in SAME_NAME_DIFFERS
    }
    assert differing == {}, f"one option name, several shapes: {differing}"
    stale = [flag for flag in SAME_NAME_DIFFERS if flag not in shapes]
    assert stale == [], f"exceptions for options no command has: {stale}"


def test_every_store_command_takes_store_and_every_target_command_takes_target() -> None:
    commands = _commands()
    missing = [
        name
        for name, command in commands.items()
        if "--store" not in _options(command) and name not in NO_STORE
    ]
    assert missing == [], f"commands without --store (or a reason in NO_STORE): {missing}"
    assert [n for n in NO_STORE if n not in commands] == [], "NO_STORE names a gone command"
    assert [n for n in NO_STORE if "--store" in _options(commands[n])] == []
    no_target = [n for n in TARGET_COMMANDS if "--target" not in _options(commands[n])]
    assert no_target == [], f"commands on a target without --target: {no_target}"


def test_every_byte_option_reads_a_size() -> None:
    wrong = [
        f"{name} {flag}"
        for name, command in _commands().items()
        for flag, option in _options(command).items()
        if flag.endswith("-bytes")
        and not (isinstance(option.type, Number) and option.type.bound is B.SIZE)
    ]
    assert wrong == [], f"byte options that do not read 500M/20G: {wrong}"


def test_every_deleting_command_is_a_dry_run_unless_apply() -> None:
    commands = _commands()
    for name in DELETING:
        apply = _options(commands[name]).get("--apply")
        assert apply is not None and apply.is_flag, name
        assert apply.get_default(click.Context(commands[name])) is False, name


def test_every_variable_an_init_command_reads_is_listed() -> None:
    text = VARIABLES_PAGE.read_text()
    listed = set(re.findall(r"`(ARTIFACTD_[A-Z_]+)`", text))
    commands = _commands()
    read = {
        var: name
        for name in INIT_COMMANDS
        for option in _options(commands[name]).values()
        for var in ([option.envvar] if isinstance(option.envvar, str) else option.envvar or [])
    }
    missing = {var: name for var, name in read.items() if var not in listed}
    assert missing == {}, f"variables docs/guide/using.md does not list: {missing}"


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["ls", "--store", "oci:{tmp}/s"], ["tags"]),
        (["lint", "--target", "{tmp}/t"], ["nothing to lint"]),
    ],
)
def test_the_option_spellings_of_old_positionals_work(
    tmp_path: Path, argv: list[str], words: list[str]
) -> None:
    (tmp_path / "t").mkdir()
    open_store(f"oci:{tmp_path / 's'}", create=True).close()
    args = [a.format(tmp=tmp_path) for a in argv]
    proc = run_artifactd(*args, *(["--json"] if args[0] == "ls" else []), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert all(w in proc.stdout for w in words), proc.stdout
    both = run_artifactd(args[0], f"{tmp_path}/other", *args[1:], cwd=tmp_path)
    assert both.returncode == 2 and "given twice" in both.stderr


def test_a_bad_variable_is_named_by_its_own_name(tmp_path: Path) -> None:
    env = clean_env({"ARTIFACTD_DRY_RUN": "maybe"})
    proc = run_artifactd("restore", "--target", str(tmp_path / "t"), env=env, cwd=tmp_path)
    assert proc.returncode == 2
    assert "ARTIFACTD_DRY_RUN='maybe' (read for --dry-run)" in proc.stderr, proc.stderr
    typed = run_artifactd("restore", "--target", str(tmp_path / "t"), "--max-bytes", "lots")
    assert typed.returncode == 2 and "ARTIFACTD_" not in typed.stderr


def test_long_commands_say_each_stage_in_a_log(capsys: pytest.CaptureFixture[str]) -> None:
    """Off a terminal (CI), build-like commands print a line per event, never progress ticks."""
    events: list[dict[str, Any]] = [
        {"stage": "cell", "event": "start", "cell": "0-inductor"},
        {"stage": "push", "event": "progress", "bytes": 5, "total": 10},
        {"stage": "cell", "event": "done", "cell": "0-inductor", "elapsed_ms": 183000.0},
    ]
    for event in events:
        render.event_printer(False, lines=True)(event)
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "[cell] start cell=0-inductor",
        "[cell] done cell=0-inductor elapsed_ms=183000.0",
    ]
    for event in events:
        render.event_printer(False)(event)  # restore's: silent in a log
    assert capsys.readouterr().err == ""
