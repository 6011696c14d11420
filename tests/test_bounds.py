"""Every number a user gives is finite and within its stated range, or refused with exit 2.

Generated, not listed: the tests walk every click command of the app for its
numeric options, and the warm-up matrix's JSON Schema for its numeric fields,
so a new option or field is covered without a new test. For each, NaN,
infinities and a value past either end are refused with exit 2 and a message
that states the range; on the command line and through the option's
environment variable; through the pod-start fast path as through click.
The matrix's serve requests are also refused end to end, by ``build`` before
an engine starts and by ``status --prewarm`` before a request is sent.
"""

from __future__ import annotations

import copy
import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from conftest import clean_env, run_artifactd

from artifactd import bounds as B  # noqa: N812
from artifactd.build.matrix import RANGES, Matrix, expand, parse_matrix
from artifactd.cli.app import cli
from artifactd.cli.main import main
from artifactd.cli.options import Number, range_help
from artifactd.errors import ConfigError

#: A generous ceiling on a refusal that must come before any work: "does not hang".
BOUND = 60.0


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))
        else:
            yield (*path, name)


def _command(path: tuple[str, ...]) -> click.Command:
    command: click.Command = cli
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    return command


def _params() -> list[tuple[tuple[str, ...], click.Parameter]]:
    return [(path, p) for path in _commands(cli) for p in _command(path).params]


#: Every numeric option of every command: (command path, option's long flag).
NUMERIC = [(path, p.opts[0]) for path, p in _params() if isinstance(p.type, Number) and p.opts]


def _option(path: tuple[str, ...], flag: str) -> click.Option:
    found = next(p for p in _command(path).params if flag in p.opts)
    assert isinstance(found, click.Option) and isinstance(found.type, Number)
    return found


def _show(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _hostile(bound: B.Range) -> list[str]:
    """NaN, the infinities, huge, and a value just past each end of the range."""
    below = bound.lo if bound.lo_open else bound.lo - 1
    above = bound.hi + 1
    if bound.kind == "float":
        below = bound.lo if bound.lo_open else bound.lo - 0.5
        above = bound.hi + 0.5
    return ["nan", "NaN", "inf", "-inf", "Infinity", "1e308", _show(below), _show(above)]


def _required_stand_ins(path: tuple[str, ...], skip: click.Parameter) -> list[str]:
    """Values for the command's other required parameters, so that only ``skip`` can fail."""
    args: list[str] = []
    for p in _command(path).params:
        if p is skip or not p.required:
            continue
        value = p.type.choices[0] if isinstance(p.type, click.Choice) else "x"
        if isinstance(p, click.Option):
            args.append(f"{p.opts[0]}={value}")
        else:
            args += ["--", value] if p.nargs == -1 else [value]
    # Positional stand-ins go last (after every option).
    options = [a for a in args if a.startswith("--") and "=" in a]
    return options + [a for a in args if a not in options]


def _run(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, str]:
    """Run the real entry point in this process: the fast path, then click, exit codes mapped."""
    with pytest.raises(SystemExit) as ended:
        main(argv)
    code = ended.value.code
    err = capsys.readouterr().err
    monkeypatch.undo()
    return (code if isinstance(code, int) else 1), err


def test_no_option_is_a_plain_click_number() -> None:
    """click's FloatRange lets NaN through: no option or argument uses click's number types."""
    plain = [
        f"{' '.join(path)} {p.name}: {p.type!r}"
        for path, p in _params()
        if isinstance(
            p.type,
            (click.types.IntParamType, click.types.FloatParamType, click.types._NumberRangeBase),
        )
    ]
    assert plain == []
    # The walk is not vacuous: it finds the options the issue named, and the pod-start ones.
    found = {(" ".join(path), flag) for path, flag in NUMERIC}
    assert {
        ("prune", "--grace"),
        ("prune", "--older-than"),
        ("matrix shapes", "--timeout"),
        ("restore", "--lock-timeout"),
        ("restore", "--max-bytes"),
        ("exec", "--max-bytes"),
        ("gc", "--max-bytes"),
        ("contribute", "--max-bytes"),
        ("build", "--cell"),
    } <= found
    assert len(NUMERIC) >= 17


@pytest.mark.parametrize(("path", "flag"), NUMERIC, ids=[f"{' '.join(p)} {f}" for p, f in NUMERIC])
def test_every_numeric_option_refuses_nan_infinities_and_out_of_range(
    path: tuple[str, ...],
    flag: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    option = _option(path, flag)
    bound: B.Range = option.type.bound  # type: ignore[attr-defined]
    assert range_help(bound) in (option.help or ""), "--help states the range"
    # Both ends are accepted as typed (a closed low end), and read as the range's kind.
    assert option.type.convert(_show(bound.hi), option, None) == bound.hi
    if not bound.lo_open:
        assert option.type.convert(_show(bound.lo), option, None) == bound.lo
    others = _required_stand_ins(path, option)
    monkeypatch.chdir(tmp_path)
    started = time.monotonic()
    for value in _hostile(bound):
        runs: list[tuple[list[str], dict[str, str]]] = [([*path, f"{flag}={value}", *others], {})]
        for envvar in [option.envvar] if isinstance(option.envvar, str) else option.envvar or []:
            runs.append(([*path, *others], {envvar: value}))
        for argv, env in runs:
            for name, text in env.items():
                monkeypatch.setenv(name, text)
            code, err = _run(argv, capsys, monkeypatch)
            where = f"{' '.join(argv)} {env}"
            assert code == 2, f"{where}: exit {code}\n{err}"
            assert bound.describe() in err, f"{where}: the range is not stated\n{err}"
            assert "Traceback" not in err and "internal error" not in err, err
    assert time.monotonic() - started < BOUND
    assert list(tmp_path.iterdir()) == [], "a refused option ran the command"


def test_the_readme_table_states_every_range() -> None:
    """The docs' "Bounds of every input" has a row per range of artifactd/bounds.py, stating it."""
    page = Path(__file__).resolve().parent.parent / "docs" / "reference" / "bounds.md"
    section = page.read_text().split("# Bounds of every input", 1)[1].split("\n## ", 1)[0]
    rows = section.splitlines()
    for name, value in vars(B).items():
        if isinstance(value, B.Range):
            row = next((r for r in rows if f"`bounds.{name}`" in r), "")
            assert value.span() in row, f"bounds.{name} ({value.span()}): row {row!r}"
        elif name.isupper() and isinstance(value, int) and not isinstance(value, bool):
            assert str(value) in section, f"bounds.{name} = {value} is not in the table"


# --------------------------------------------------------------------------
# The warm-up matrix's numeric fields, from its JSON Schema
# --------------------------------------------------------------------------

SCHEMA = Matrix.model_json_schema()
#: A matrix that holds every object of the schema once (a serve cell, a request
#: group, an axis), so each numeric field has a place to be set. The walk below
#: fails when a numeric field of the schema is not reached from here.
BASE: dict[str, Any] = {
    "name": "bounds",
    "axes": {"a": [1]},
    "serve": {"command": "engine --port {{ port }}", "requests": [{"prompt_tokens": [8]}]},
}


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if ref is None:
        return node
    resolved: dict[str, Any] = SCHEMA["$defs"][ref.rsplit("/", 1)[1]]
    return resolved


def _is_number(node: dict[str, Any]) -> bool:
    """A numeric subschema that takes more than one value (a ``const`` is its own bound)."""
    return node.get("type") in ("integer", "number") and not {"const", "enum"} & set(node)


def _numeric_alternatives(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [o for o in node.get("anyOf", [node]) if _is_number(o)]


def _all_numeric(node: Any, pointer: str = "#") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every numeric subschema of the schema, by JSON pointer."""
    if isinstance(node, dict):
        if _is_number(node):
            yield pointer, node
        for key, value in node.items():
            yield from _all_numeric(value, f"{pointer}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _all_numeric(value, f"{pointer}/{i}")


def _places(
    node: dict[str, Any], doc: Any, path: tuple[Any, ...]
) -> Iterator[tuple[tuple[Any, ...], dict[str, Any]]]:
    """(where in BASE, its schema) for every numeric place BASE reaches or may add."""
    node = _resolve(node)
    if _numeric_alternatives(node):
        yield path, node
    for option in node.get("anyOf", []):
        if option.get("type") in ("object", "array") or "$ref" in option:
            yield from _places(option, doc, path)
    if node.get("type") == "object" or "properties" in node:
        mapping = doc if isinstance(doc, dict) else {}
        for key, sub in node.get("properties", {}).items():
            yield from _places(sub, mapping.get(key), (*path, key))
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            for key in mapping:
                if key not in node.get("properties", {}):
                    yield from _places(extra, mapping[key], (*path, key))
    if node.get("type") == "array" and isinstance(node.get("items"), dict):
        items = doc if isinstance(doc, list) and doc else [None]
        yield from _places(node["items"], items[0], (*path, 0))


PLACES = list(_places(SCHEMA, BASE, ()))


def _set(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    here: Any = out
    for step in path[:-1]:
        if isinstance(step, int):
            while len(here) <= step:
                here.append({})
        here = here[step] if isinstance(step, int) else here.setdefault(step, {})
    here[path[-1]] = value
    return out


def _ends(node: dict[str, Any]) -> tuple[float, float, bool]:
    """The widest range of a place's numeric alternatives: (low, high, low end open)."""
    alternatives = _numeric_alternatives(node)
    lows: list[float] = [
        a["minimum"] if "minimum" in a else a["exclusiveMinimum"] for a in alternatives
    ]
    highs: list[float] = [a["maximum"] for a in alternatives]
    return min(lows), max(highs), any("exclusiveMinimum" in a for a in alternatives)


def test_every_numeric_field_of_the_matrix_schema_is_bounded_and_reached() -> None:
    unbounded = [
        pointer
        for pointer, node in _all_numeric(SCHEMA)
        if not ({"minimum", "exclusiveMinimum"} & set(node) and "maximum" in node)
    ]
    assert unbounded == [], "a numeric field without a stated range"
    reached = {id(a) for _, node in PLACES for a in _numeric_alternatives(node)}
    missed = [p for p, node in _all_numeric(SCHEMA) if id(node) not in reached]
    assert missed == [], "extend BASE so that the walk reaches these fields"
    Matrix.model_validate(BASE)  # the base itself is valid
    assert len(PLACES) >= 11


@pytest.mark.parametrize(("path", "node"), PLACES, ids=[".".join(map(str, p)) for p, _ in PLACES])
def test_every_numeric_field_refuses_nan_infinities_and_out_of_range(
    path: tuple[Any, ...], node: dict[str, Any], tmp_path: Path
) -> None:
    low, high, low_open = _ends(node)
    integer = all(a["type"] == "integer" for a in _numeric_alternatives(node))
    below = low if low_open else low - (1 if integer else 0.5)
    above = high + (1 if integer else 0.5)
    matrix = tmp_path / "m.yaml"
    for value in [float("nan"), float("inf"), float("-inf"), 1e308, below, above]:
        text = yaml.safe_dump(_set(BASE, path, value))
        with pytest.raises(ConfigError) as refused:
            parse_matrix(text, matrix)
        message = str(refused.value)
        assert refused.value.exit_code == 2
        assert ".".join(map(str, path)) in message, message
        assert _show(low) in message and _show(high) in message, f"range not stated: {message}"
    # Both ends themselves are accepted (a closed low end).
    parse_matrix(yaml.safe_dump(_set(BASE, path, high)), matrix)
    if not low_open:
        parse_matrix(yaml.safe_dump(_set(BASE, path, low)), matrix)


def test_a_rendered_gpus_template_is_held_to_the_same_range(tmp_path: Path) -> None:
    for shown in ("1e300", "257", "-1", "nan", "inf"):
        doc = {"name": "g", "command": "true", "gpus": f"{{{{ {shown!r} | float }}}}"}
        matrix = parse_matrix(yaml.safe_dump(doc), tmp_path / "m.yaml")
        with pytest.raises(ConfigError, match="a whole number of GPUs from 0 to 256"):
            expand(matrix, tmp_path / "m.yaml")


# --------------------------------------------------------------------------
# End to end: the serve requests, refused before anything is started or sent
# --------------------------------------------------------------------------

#: The issue's hostile request groups (item 7), and where each is refused.
HOSTILE_REQUESTS: dict[str, tuple[dict[str, Any], str]] = {
    "a billion-word prompt": ({"prompt_tokens": [1_000_000_000]}, "prompt_tokens"),
    "a hundred million repeats": ({"repeat": 100_000_000}, "repeat"),
    "a million in flight": ({"concurrency": 1_000_000}, "concurrency"),
    "a negative prompt": ({"prompt_tokens": [-5]}, "prompt_tokens"),
    "10**18 tokens": ({"max_tokens": 10**18}, "max_tokens"),
}


def _serve_matrix(tmp_path: Path, group: dict[str, Any]) -> tuple[Path, Path]:
    """A serve matrix whose engine would leave a marker file if it were ever started."""
    marker = tmp_path / "engine-started"
    doc = {
        "name": "hostile-serve",
        "families": ["inductor"],
        "gpus": 0,
        "serve": {
            "command": f"touch {marker}",
            "ready_timeout_s": 5,
            "requests": [{"prompt_tokens": [8], **group}],
        },
    }
    matrix = tmp_path / "m.yaml"
    matrix.write_text(yaml.safe_dump(doc))
    return matrix, marker


class _Engine(http.server.BaseHTTPRequestHandler):
    """An engine that is healthy and counts the completions it is sent."""

    posts: list[str]

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        type(self).posts.append(self.path)
        self.send_response(500)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        del args


@pytest.fixture
def fake_engine() -> Iterator[tuple[str, list[str]]]:
    posts: list[str] = []
    handler = type("Engine", (_Engine,), {"posts": posts})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", posts
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("case", sorted(HOSTILE_REQUESTS))
def test_build_refuses_hostile_serve_requests_before_the_engine_starts(
    tmp_path: Path, case: str
) -> None:
    group, field = HOSTILE_REQUESTS[case]
    matrix, marker = _serve_matrix(tmp_path, group)
    store = tmp_path / "store"
    started = time.monotonic()
    proc = run_artifactd(
        "build", str(matrix), "--store", f"oci:{store}", env=clean_env(), timeout=BOUND
    )
    assert time.monotonic() - started < BOUND
    assert proc.returncode == 2, proc.stderr
    assert field in proc.stderr and "Traceback" not in proc.stderr
    assert f"give {RANGES[field].describe()}" in proc.stderr, "the range is stated"
    assert not marker.exists() and not store.exists()


@pytest.mark.parametrize("case", sorted(HOSTILE_REQUESTS))
def test_status_prewarm_refuses_hostile_serve_requests_before_sending(
    tmp_path: Path, case: str, fake_engine: tuple[str, list[str]]
) -> None:
    url, posts = fake_engine
    group, field = HOSTILE_REQUESTS[case]
    matrix, _ = _serve_matrix(tmp_path, group)
    started = time.monotonic()
    proc = run_artifactd(
        "status", "--target", str(tmp_path), "--engine-url", url, "--prewarm", str(matrix),
        timeout=BOUND,
    )  # fmt: skip
    assert time.monotonic() - started < BOUND
    assert proc.returncode == 2, proc.stderr
    assert field in proc.stderr and "Traceback" not in proc.stderr
    assert f"give {RANGES[field].describe()}" in proc.stderr, "the range is stated"
    assert posts == [], "a request was sent"
