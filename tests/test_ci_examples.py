"""The CI examples in ``examples/ci/`` stay true to the command line.

Every YAML file there parses and has the structure its runner needs (GitHub
Actions: ``on``, ``jobs``, ``runs-on``, ``steps``, ``needs`` and the job
outputs it reads; GitLab CI: ``stages``, ``stage``, ``script``, ``needs``,
``extends``); every script in it is valid bash. Every ``artifactd`` command
line in a ``run:`` or ``script:`` (multi-line blocks, backslash continuations,
``$(...)`` substitutions, pipes, ``&&``, ``VAR=$(artifactd ...)``) names a
command whose ``--help`` exits 0 and lists every ``--option`` the line uses:
renaming a command or an option fails here until the examples follow.

``--help`` runs in this process through click's ``CliRunner``, once per
distinct command path: importing the click group costs about 0.05 s, and
``--help`` takes the same click path in the real entry point.
"""

from __future__ import annotations

import functools
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner
from conftest import REPO

from artifactd.cli import cli

EXAMPLES = REPO / "examples" / "ci"
#: At least this many ``artifactd`` lines, and these commands, per file: an
#: extractor that finds nothing cannot pass.
EXPECTED = {
    "github-actions.yml": (5, {"build", "image append", "image build", "copy", "inspect"}),
    "gitlab-ci.yml": (5, {"build", "image append", "image build", "copy"}),
}

# --------------------------------------------------------------------------
# Shell: split a script into simple commands, find artifactd's argv
# --------------------------------------------------------------------------

#: What a command substitution, or a GitHub ``${{ ... }}`` expression, becomes.
SUBST = "__SUBST__"
EXPR = "__EXPR__"
_GH_EXPR = re.compile(r"\$\{\{.*?\}\}", re.DOTALL)
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
#: Words that may precede a command without being it.
_PREFIXES = {"!", "{", "}", "do", "then", "else", "elif", "if", "while", "until", "time", "exec"}
_REDIRECT_OP = re.compile(r"^(\d*|&)(>>?|<<<|<|>&|<&|>\||&>>?)$")
_REDIRECT_WORD = re.compile(r"^(\d*|&)(>>?|<|>&|<&|&>>?)\S")


def _closing(text: str, start: int) -> int:
    """Index of the ``)`` that closes the ``(`` at ``start`` (quotes and nesting respected)."""
    depth, quote, i = 0, "", start
    while i < len(text):
        c = text[i]
        if quote == '"' and text.startswith("$(", i):
            i = _closing(text, i + 1)
        elif quote:
            if c == "\\" and quote == '"':
                i += 1
            elif c == quote:
                quote = ""
        elif c == "\\":
            i += 1
        elif c in "'\"":
            quote = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise ValueError(f"unbalanced $( in {text[start - 1 : start + 60]!r}")


class _Splitter:
    """Split shell text into simple commands; substitutions are split as scripts too."""

    def __init__(self, out: list[str]) -> None:
        self.out = out
        self.current: list[str] = []

    def flush(self) -> None:
        command = "".join(self.current).strip()
        if command:
            self.out.append(command)
        self.current.clear()

    def at_word_start(self) -> bool:
        return not self.current or self.current[-1][-1:].isspace()

    def separator(self, text: str, i: int) -> bool:
        """Whether ``text[i]`` ends a command: newline, ``;``, ``|``, ``&``, parentheses."""
        c = text[i]
        if c in "\n;()":
            return True
        if c == "|":
            return not text[:i].endswith(">")  # >| is a redirection
        if c == "&":
            return not (text[:i].endswith(("<", ">")) or text.startswith(">", i + 1))
        return False

    def split(self, text: str) -> None:
        """Append every simple command of ``text`` (and of its substitutions) to ``out``."""
        quote, i = "", 0
        while i < len(text):
            c = text[i]
            if quote == "'":
                quote = "" if c == "'" else quote
            elif c == "\\" and text.startswith("\n", i + 1):
                self.current.append(" ")
                i += 2
                continue
            elif c == "\\":
                self.current.append(text[i : i + 2])
                i += 2
                continue
            elif text.startswith("$(", i) or c == "`":
                end = _closing(text, i + 1) if c == "$" else text.index("`", i + 1)
                _Splitter(self.out).split(text[i + 2 if c == "$" else i + 1 : end])
                self.current.append(SUBST)
                i = end + 1
                continue
            elif quote == '"':
                quote = "" if c == '"' else quote
            elif c in "'\"":
                quote = c
            elif c == "#" and self.at_word_start():
                end = text.find("\n", i)
                i = len(text) if end < 0 else end
                continue
            elif self.separator(text, i):
                self.flush()
                i += 1
                continue
            self.current.append(c)
            i += 1
        if quote:
            raise ValueError(f"unterminated {quote} in {text[:80]!r}")
        self.flush()


def simple_commands(script: str) -> list[str]:
    """Every simple command in ``script``, those inside ``$(...)`` first; comments dropped."""
    out: list[str] = []
    _Splitter(out).split(_GH_EXPR.sub(EXPR, script))
    return out


def _without_redirections(words: Sequence[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
        elif _REDIRECT_OP.match(word):
            skip = True
        elif not _REDIRECT_WORD.match(word):
            out.append(word)
    return out


def artifactd_argv(command: str) -> list[str] | None:
    """The arguments ``command`` passes to artifactd, or None when it runs something else."""
    words = shlex.split(command)
    while words and (words[0] in _PREFIXES or _ASSIGNMENT.match(words[0])):
        words.pop(0)
    program = words[0].rsplit("/", 1)[-1] if words else ""
    if program == "artifactd":
        return _without_redirections(words[1:])
    if program.startswith("python") and words[1:3] == ["-m", "artifactd"]:
        return _without_redirections(words[3:])
    return None


def artifactd_lines(script: str) -> list[list[str]]:
    """The argv of every artifactd invocation in ``script``."""
    found = (artifactd_argv(command) for command in simple_commands(script))
    return [argv for argv in found if argv is not None]


# --------------------------------------------------------------------------
# The examples: YAML, scripts, invocations
# --------------------------------------------------------------------------

#: GitLab's top-level keywords: everything else not starting with "." is a job.
_GITLAB_GLOBALS = {
    "default",
    "include",
    "stages",
    "variables",
    "workflow",
    "image",
    "services",
    "cache",
    "before_script",
    "after_script",
    "spec",
}
_SCRIPT_KEYS = ("before_script", "script", "after_script")


def example_files() -> list[Path]:
    """Every YAML file under ``examples/ci/``."""
    return sorted(p for p in EXAMPLES.rglob("*") if p.suffix in (".yml", ".yaml"))


def load(path: Path) -> dict[Any, Any]:
    """The document ``path`` holds, which must be a mapping."""
    doc = yaml.safe_load(path.read_text())
    assert isinstance(doc, dict), f"{path.name}: not a mapping"
    return doc


def is_gitlab(path: Path) -> bool:
    """GitLab CI by name (``.gitlab-ci.yml``, ``gitlab-ci.yml``); GitHub Actions otherwise."""
    return "gitlab" in path.name


def _entries(value: Any) -> Iterator[str]:
    """The script lines of a ``script:`` value: a string or (nested) lists of them."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _entries(item)


def scripts(path: Path) -> Iterator[tuple[str, str]]:
    """``(where, shell text)`` for every ``run:`` (GitHub) or script entry (GitLab)."""
    doc = load(path)
    if is_gitlab(path):
        for name, job in doc.items():
            sections = {name: job} if name in _SCRIPT_KEYS else {}
            if isinstance(job, dict):
                sections = {f"{name}/{key}": job.get(key) for key in _SCRIPT_KEYS}
            for where, value in sections.items():
                for n, text in enumerate(_entries(value)):
                    yield f"{where}[{n}]", text
        return
    for name, job in (doc.get("jobs") or {}).items():
        for n, step in enumerate(job.get("steps") or []):
            if isinstance(step, dict) and isinstance(step.get("run"), str):
                yield f"{name}/{step.get('id') or f'step{n}'}", step["run"]


@dataclass(frozen=True)
class Invocation:
    """One artifactd command line of an example: where, its command path, its options."""

    file: str
    where: str
    path: tuple[str, ...]
    options: tuple[str, ...]

    @property
    def id(self) -> str:
        """A test id: ``github-actions.yml:bake/append:image append``."""
        return f"{self.file}:{self.where}:{' '.join(self.path) or '(root)'}"


def split_path(argv: Sequence[str]) -> tuple[tuple[str, ...], list[str]]:
    """``(command path, the rest)``: names are taken while they name a group's subcommand.

    A name a group does not have still ends the path (``image nosuch``), so
    that its ``--help`` fails instead of the line being read as arguments.
    """
    command: click.Command | None = cli
    path: list[str] = []
    rest = list(argv)
    while isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
        path.append(rest.pop(0))
        command = command.commands.get(path[-1])
    return tuple(path), rest


def used_options(rest: Sequence[str]) -> tuple[str, ...]:
    """The long options in ``rest`` (``--tag=x`` is ``--tag``), up to a ``--``."""
    out: list[str] = []
    for word in rest:
        if word == "--":
            break
        if word.startswith("--"):
            out.append(word.split("=", 1)[0])
    return tuple(out)


def invocations(path: Path) -> list[Invocation]:
    """Every artifactd command line in ``path``'s scripts."""
    out: list[Invocation] = []
    for where, text in scripts(path):
        for argv in artifactd_lines(text):
            command, rest = split_path(argv)
            out.append(Invocation(path.name, where, command, used_options(rest)))
    return out


INVOCATIONS = [inv for path in example_files() for inv in invocations(path)]

# --------------------------------------------------------------------------
# --help, once per command path
# --------------------------------------------------------------------------

_OPTION_ROW = re.compile(r"^  (?:-\w, )?(--[\w-]+)(?: / (--[\w-]+))?")


@functools.cache
def run_help(path: tuple[str, ...]) -> tuple[int, str]:
    """``artifactd PATH --help``: exit code and output."""
    result = CliRunner().invoke(cli, [*path, "--help"], prog_name="artifactd")
    return result.exit_code, result.output


def listed_options(help_text: str) -> set[str]:
    """The long options in the ``Options:`` section of a ``--help`` text."""
    options: set[str] = set()
    section = False
    for line in help_text.splitlines():
        if line and not line[0].isspace():
            section = line.rstrip() == "Options:"
        elif section and (row := _OPTION_ROW.match(line)):
            options.update(name for name in row.groups() if name)
    return options


# --------------------------------------------------------------------------
# Tests: the extractor
# --------------------------------------------------------------------------

TRICKY = r"""
# artifactd ls --commented-out
FP=$(artifactd build m.yaml --store "$S" \
      --json | jq -r .harvest.fingerprint_hash)
echo "artifactd copy is not run here, # nor this" && .venv/bin/artifactd copy \
  "$SRC" "$DST" --tag "fp-$FP" 2>&1 | tee copy.log
for t in $TAGS; do artifactd inspect "$S:$t" --files; done
test -n "$(artifactd fingerprint --hash --gpu-arch=sm_90a)" || exit 1
X="$(echo "$(artifactd ls "$S" --json)")"
artifactd restore --target /cache --dry-run & wait
pip install "artifactd==0.1.0"  # not artifactd itself
python3 -m artifactd diff local local --json > d.json
ARTIFACTD_INSECURE=1 artifactd image append --base ${{ env.BASE }} \
  --artifact "$S:fp-$FP" --to ${REPO%%@*}:warm --json >> "$GITHUB_OUTPUT"
"""


def test_extractor_on_a_tricky_script() -> None:
    assert artifactd_lines(TRICKY) == [
        ["build", "m.yaml", "--store", "$S", "--json"],
        ["copy", "$SRC", "$DST", "--tag", "fp-$FP"],
        ["inspect", "$S:$t", "--files"],
        ["fingerprint", "--hash", "--gpu-arch=sm_90a"],
        ["ls", "$S", "--json"],
        ["restore", "--target", "/cache", "--dry-run"],
        ["diff", "local", "local", "--json"],
        [
            "image",
            "append",
            "--base",
            EXPR,
            "--artifact",
            "$S:fp-$FP",
            "--to",
            "${REPO%%@*}:warm",
            "--json",
        ],
    ]


def test_extractor_paths_and_options() -> None:
    assert split_path(["image", "append", "--base", "x"]) == (("image", "append"), ["--base", "x"])
    assert split_path(["image", "nosuch", "--x"]) == (("image", "nosuch"), ["--x"])
    assert split_path(["copy", "image", "b"]) == (("copy",), ["image", "b"])
    assert split_path(["--version"]) == ((), ["--version"])
    assert used_options(["a", "--tag=x", "--json", "--", "--not"]) == ("--tag", "--json")
    assert listed_options(run_help(("copy",))[1]) == {
        "--tag",
        "--verify-key",
        "--sign-key",
        "--sign-unverified",
        "--insecure",
        "--json",
        "--help",
    }


def test_extractor_refuses_broken_shell() -> None:
    with pytest.raises(ValueError, match="unbalanced"):
        simple_commands("X=$(artifactd ls")
    with pytest.raises(ValueError, match="unterminated"):
        simple_commands('artifactd ls "oops')


# --------------------------------------------------------------------------
# Tests: the examples
# --------------------------------------------------------------------------


def test_examples_exist_and_each_has_its_commands() -> None:
    files = {p.name for p in example_files()}
    assert set(EXPECTED) <= files, files
    for path in example_files():
        found = invocations(path)
        least, commands = EXPECTED.get(path.name, (1, set()))
        assert len(found) >= least, (path.name, [inv.id for inv in found])
        assert commands <= {" ".join(inv.path) for inv in found}, path.name


def _needs(value: Any) -> list[str]:
    """Job names in a ``needs:`` (a name, or a list of names or ``{job: name}``)."""
    items = value if isinstance(value, list) else [] if value is None else [value]
    return [item["job"] if isinstance(item, dict) else item for item in items]


def _check_github(doc: Mapping[Any, Any]) -> None:
    assert "on" in doc or True in doc, "no `on` (YAML 1.1 reads a bare `on:` as true)"
    jobs = doc.get("jobs")
    assert isinstance(jobs, dict) and jobs, "no jobs"
    for name, job in jobs.items():
        assert "runs-on" in job, f"{name}: no runs-on"
        steps = job.get("steps")
        assert isinstance(steps, list) and steps, f"{name}: no steps"
        for step in steps:
            assert ("run" in step) != ("uses" in step), f"{name}: a step needs run or uses"
        needs = _needs(job.get("needs"))
        assert set(needs) <= set(jobs), f"{name}: needs {needs}"
        ids = {step["id"] for step in steps if "id" in step}
        for output in (job.get("outputs") or {}).values():
            for step_id in re.findall(r"steps\.([\w-]+)\.outputs", output):
                assert step_id in ids, f"{name}: output from unknown step {step_id}"
        for other, output in re.findall(r"needs\.([\w-]+)\.outputs\.([\w-]+)", str(job)):
            assert other in needs, f"{name}: reads {other}'s outputs without needing it"
            assert output in (jobs[other].get("outputs") or {}), f"{name}: {other}.{output}"


def _merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """GitLab's ``extends``: mappings merge deeply, anything else is replaced."""
    out = dict(base)
    for key, value in top.items():
        old = out.get(key)
        if isinstance(old, dict) and isinstance(value, dict):
            out[key] = _merge(old, value)
        else:
            out[key] = value
    return out


def _resolved(doc: Mapping[str, Any], name: str) -> dict[str, Any]:
    job = doc[name]
    bases = job.get("extends") or []
    out: dict[str, Any] = {}
    for base in [bases] if isinstance(bases, str) else bases:
        assert base in doc, f"{name}: extends unknown {base}"
        out = _merge(out, _resolved(doc, base))
    return _merge(out, {k: v for k, v in job.items() if k != "extends"})


def _check_gitlab(doc: Mapping[str, Any]) -> None:
    stages = doc.get("stages")
    assert isinstance(stages, list) and stages, "no stages"
    names = [k for k in doc if k not in _GITLAB_GLOBALS and not k.startswith(".")]
    assert names, "no jobs"
    jobs = {name: _resolved(doc, name) for name in names}
    for name, job in jobs.items():
        stage = job.get("stage", "test")
        assert stage in stages, f"{name}: stage {stage} is not in stages"
        assert job.get("script"), f"{name}: no script"
        for need in _needs(job.get("needs")):
            assert need in jobs, f"{name}: needs unknown job {need}"
            need_stage = jobs[need].get("stage", "test")
            assert stages.index(need_stage) <= stages.index(stage), f"{name}: needs {need} later"


@pytest.mark.parametrize("path", example_files(), ids=lambda p: p.name)
def test_example_has_the_structure_its_runner_needs(path: Path) -> None:
    doc = load(path)
    if is_gitlab(path):
        _check_gitlab(doc)
    else:
        _check_github(doc)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("path", example_files(), ids=lambda p: p.name)
def test_every_script_is_valid_bash(path: Path) -> None:
    for where, text in scripts(path):
        proc = subprocess.run(
            ["bash", "-n", "-c", _GH_EXPR.sub(EXPR, text)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, f"{path.name}:{where}: {proc.stderr}"


@pytest.mark.parametrize("inv", INVOCATIONS, ids=[inv.id for inv in INVOCATIONS])
def test_command_and_its_options_exist(inv: Invocation) -> None:
    code, text = run_help(inv.path)
    shown = " ".join(["artifactd", *inv.path, "--help"])
    assert code == 0, f"{shown} exited {code}: {text.strip()[-300:]}"
    missing = sorted(set(inv.options) - listed_options(text))
    assert not missing, f"{inv.id}: {shown} lists no {', '.join(missing)}"
