"""Warm-up matrices: a YAML file of axes, a command (or an engine to serve), the families.

Expansion is deterministic: axes are taken in sorted name order and their
values in file order, so cell ``i`` is the same cell on every machine (CI
matrix jobs and Kubernetes Indexed Jobs index into it).

A cell either runs ``command`` (a one-shot warm-up that may print one JSON
line, whose ``checks`` member the correctness gate compares) or ``serve``:
an inference engine started with its command, polled at its readiness URL,
sent OpenAI-compatible requests that hit every shape it will compile, then
stopped (SIGTERM, a grace period, SIGKILL). ``gpus`` says how many GPUs a
cell needs: a number, or a jinja2 expression over the axes (``{{ tp * pp }}``).

A matrix is untrusted input: a CI plan job that only lists its cells may hold
secrets, so neither reading nor expanding it may run code, hang or exhaust
the machine. The file is bounded before it is parsed (:data:`MAX_MATRIX_BYTES`,
:data:`MAX_YAML_DEPTH`, :data:`MAX_SCALAR_CHARS`; UTF-8 text, no NUL) and the
grid before it is expanded (:data:`MAX_CELLS`). Every template (``command``,
``gpus``, ``serve.command``, ``serve.ready_url``, ``serve.base_url``) is
rendered in jinja2's immutable sandbox with ``StrictUndefined`` and may use
only what :data:`TEMPLATE_RULES` says; anything else is a
:class:`~artifactd.errors.ConfigError` naming the field.
"""

from __future__ import annotations

import itertools
import math
import re
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import jinja2
import jinja2.exceptions
import jinja2.nodes
import jinja2.sandbox
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from artifactd import bounds as B  # noqa: N812
from artifactd.errors import ConfigError
from artifactd.families import select_families
from artifactd.format.canary import CanarySpec
from artifactd.fsutil import InputFileError, read_regular, text_problem

#: Largest matrix file read, in bytes. A matrix is a page of YAML; a bigger
#: file is refused before it is parsed.
MAX_MATRIX_BYTES = 1 << 20
#: Deepest nesting of YAML sequences and mappings. A matrix needs 5 levels;
#: the bound is checked on the parser's event stream, before any recursion.
MAX_YAML_DEPTH = 32
#: Longest YAML scalar (a key, a command, an axis value), in characters.
MAX_SCALAR_CHARS = 64 << 10
#: Most cells a matrix may expand to (:data:`artifactd.bounds.MAX_CELLS`): the
#: product of its axes' lengths, computed before anything is expanded.
MAX_CELLS = B.MAX_CELLS
#: Longest text a template may render to, in characters.
MAX_RENDERED_CHARS = 64 << 10
#: Longest string a template may make with ``*`` (kept small: a template of a
#: few thousand such terms must still render in a few megabytes).
MAX_REPEAT_CHARS = 4096
#: Largest integer a template may compute with ``**``, in bits.
MAX_POWER_BITS = 4096

#: The highest TCP port: cell i serves on ``serve.port + i``.
_MAX_PORT = 65535

#: Jinja2 filters a template may use (all pure and cheap on bounded input).
TEMPLATE_FILTERS = (
    "abs", "capitalize", "d", "default", "first", "float", "int", "last",
    "length", "lower", "max", "min", "round", "string", "title", "trim", "upper",
)  # fmt: skip
#: What a matrix template may use, as the docs and errors state it.
TEMPLATE_RULES = (
    "text with {{ expression }} placeholders and {% if %} blocks; an expression "
    "uses the context's names (every axis, the workload's keys, workload, python, "
    "matrix_dir, cell_id, and port in serve), literals, arithmetic, comparisons, "
    "and/or/not, `x if c else y`, `~`, item access, `is` tests and the filters "
    + ", ".join(TEMPLATE_FILTERS)
    + "; no calls, loops, set, macros, imports or names starting with _"
)


#: The range of each numeric field, by name (the same range wherever the name
#: appears); a refusal names it. The ranges themselves are :mod:`artifactd.bounds`'s.
RANGES = {
    "axes": B.AXIS_NUMBER,
    "gpus": B.GPUS_PER_CELL,
    "timeout_s": B.CELL_TIMEOUT_S,
    "check_tolerance": B.CHECK_TOLERANCE,
    "port": B.SERVE_PORT,
    "ready_timeout_s": B.READY_TIMEOUT_S,
    "shutdown_grace_s": B.SHUTDOWN_GRACE_S,
    "prompt_tokens": B.PROMPT_WORDS,
    "max_tokens": B.MAX_TOKENS,
    "concurrency": B.CONCURRENCY,
    "repeat": B.REPEAT,
    "count": B.CANARY_COUNT,
    "tokens": B.CANARY_TOKENS,
    "top_k": B.CANARY_TOP_K,
    "precision": B.CANARY_PRECISION,
    "seed": B.CANARY_SEED,
    "deadline_s": B.CANARY_DEADLINE_S,
    "match_rate": B.CANARY_MATCH_RATE,
}


def _bounds(name: str) -> dict[str, Any]:
    return RANGES[name].field()


#: A number given as an axis value.
_AxisInt = Annotated[int, Field(**RANGES["axes"]._replace(kind="int").field())]
_AxisFloat = Annotated[float, Field(**_bounds("axes"))]


class Target(BaseModel):
    """The GPU the matrix builds for."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)
    gpu_arch: str | None = Field(None, description="Declared target, e.g. sm_90a.")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class ServeRequests(_Frozen):
    """One group of requests sent to a serving engine once it is ready."""

    kind: Literal["completions", "chat"] = Field(
        "completions", description="/v1/completions or /v1/chat/completions (OpenAI-compatible)."
    )
    prompt_tokens: list[Annotated[int, Field(**_bounds("prompt_tokens"))]] = Field(
        default_factory=lambda: [128],
        max_length=B.MAX_PROMPT_LENGTHS,
        description="Prompt lengths, in words (about one token each): one request per length.",
    )
    max_tokens: int = Field(
        16, **_bounds("max_tokens"), description="Tokens to generate per request."
    )
    concurrency: int = Field(1, **_bounds("concurrency"), description="Requests in flight at once.")
    repeat: int = Field(
        1, **_bounds("repeat"), description="How many times to send the whole group."
    )


class Serve(_Frozen):
    """A cell that serves: start the engine, wait until ready, send requests, stop it."""

    command: str = Field(description="A template, like `command`; `port` is the cell's port.")
    ready_url: str = Field(
        "http://127.0.0.1:{{ port }}/health", description="A template; polled until it answers 200."
    )
    base_url: str = Field(
        "http://127.0.0.1:{{ port }}", description="A template; where the /v1 endpoints are."
    )
    model: str | None = Field(
        None, description="The `model` of each request (default: workload.model)."
    )
    port: int = Field(18000, **_bounds("port"), description="Cell i serves on port + i.")
    ready_timeout_s: float = Field(600, **_bounds("ready_timeout_s"))
    requests: list[ServeRequests] = Field(
        default_factory=lambda: [ServeRequests()], max_length=B.MAX_REQUEST_GROUPS
    )
    shutdown_grace_s: float = Field(
        30, **_bounds("shutdown_grace_s"), description="After SIGTERM, before SIGKILL."
    )
    canary: CanarySpec | None = Field(
        None,
        description="Record a canary in every serve cell (greedy ids and a digest of the "
        "rounded top-k logprobs of a few prompts): verify and `status --canary` replay it.",
    )


class Matrix(_Frozen):
    """A warm-up matrix file (``warmup_matrices/*.yaml``).

    At most 1 MiB of UTF-8 YAML, nested at most 32 levels, each value at
    most 65536 characters; the axes make at most 10000 cells. Templates
    (command, gpus, serve.command, serve.ready_url, serve.base_url) are
    sandboxed jinja2: `{{ expression }}` and `{% if %}` over the axes, the
    workload's keys, workload, python, matrix_dir, cell_id and (serve) port,
    with literals, arithmetic, comparisons, and/or/not, `x if c else y`, `~`,
    item access, tests and the filters abs, capitalize, default, first,
    float, int, last, length, lower, max, min, round, string, title, trim,
    upper; no calls, loops, set, macros or names starting with `_`.
    """

    schema_version: Literal[1] = 1
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    description: str = ""
    base_image: str | None = None
    target: Target = Target()
    families: list[str] = Field(default_factory=list)
    workload: dict[str, str] = Field(default_factory=dict)
    axes: dict[str, list[str | _AxisInt | _AxisFloat | bool]] = Field(default_factory=dict)
    command: str | None = Field(None, description="A template: a one-shot warm-up (or give serve).")
    serve: Serve | None = Field(None, description="An engine to serve instead of a command.")
    gpus: Annotated[int, Field(**_bounds("gpus"))] | str = Field(
        1, description="GPUs a cell needs: a number or a template over the axes."
    )
    env: dict[Annotated[str, Field(pattern=r"^[^=]+$")], str] = Field(
        default_factory=dict, description="Extra variables for every cell (a name holds no `=`)."
    )
    timeout_s: float = Field(1800, **_bounds("timeout_s"))
    check_tolerance: float = Field(
        1e-6,
        **_bounds("check_tolerance"),
        description="Relative tolerance when verify compares numeric checks.",
    )

    @model_validator(mode="after")
    def _one_way_to_run(self) -> Matrix:
        if (self.command is None) == (self.serve is None):
            raise ValueError("give exactly one of `command` and `serve`")
        return self


class ServeCell(_Frozen):
    """A serve cell, rendered: the engine's argv, its URLs and what to send."""

    argv: list[str]
    ready_url: str
    base_url: str
    model: str
    port: int
    ready_timeout_s: float
    requests: list[ServeRequests]
    shutdown_grace_s: float
    canary: CanarySpec | None = None


class Cell(_Frozen):
    """One expanded cell: index, id, axis values, GPUs needed, and what to run."""

    index: int
    id: str
    values: dict[str, Any]
    gpus: int = 1
    argv: list[str] = Field(default_factory=list, description="Empty for a serve cell.")
    serve: ServeCell | None = None


def load_matrix(path: Path) -> Matrix:
    """Read and validate a matrix file; raise :class:`ConfigError` with the bad field.

    The file is refused before it is parsed when it is not a regular file, is
    over :data:`MAX_MATRIX_BYTES`, is not UTF-8 text, or nests deeper than
    :data:`MAX_YAML_DEPTH` or holds a scalar over :data:`MAX_SCALAR_CHARS`.
    """
    return parse_matrix(read_matrix_text(path), path)


def parse_matrix(text: str, path: Path) -> Matrix:
    """Validate a matrix's text, read from ``path``; raise :class:`ConfigError` with the bad field.

    The checks of :func:`load_matrix` but the file's own (size, encoding): a
    matrix edited in memory (``matrix shapes --write``) is checked before it is written.
    """
    try:
        _check_shape(text, path)
        doc = yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader, C or Python
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    try:
        matrix = Matrix.model_validate(doc)
    except ValidationError as exc:
        raise _config_error(exc, path) from None
    select_families(matrix.families)  # unknown family names fail here, not after the warm-up
    return matrix


#: Pydantic's refusals of a number: its range (a union's other members refuse
#: its type, and are not shown) or that it is not one.
_NUMBER_ERRORS = frozenset(
    {"finite_number", "greater_than", "greater_than_equal", "less_than", "less_than_equal"}
)
_NOT_A_NUMBER = frozenset(
    {"int_parsing", "int_parsing_size", "int_from_float", "int_type", "float_parsing", "float_type"}
)
_UNION_MEMBER = re.compile(r"(constrained-)?(str|int|float|bool)|function-\w+\[.*\]")


def _config_error(exc: ValidationError, path: Path) -> ConfigError:
    """Return a matrix's first problem as one line; a number's names the field's range."""
    errors = exc.errors()
    first = next((e for e in errors if e["type"] in _NUMBER_ERRORS), errors[0])
    loc = list(first["loc"])
    if loc and isinstance(loc[-1], str) and _UNION_MEMBER.fullmatch(loc[-1]) and len(errors) > 1:
        loc.pop()  # which member of `int | str` refused is noise
    message = f"{path}: {'.'.join(str(p) for p in loc)}: {first['msg']}"
    named = [p for p in loc if isinstance(p, str) and p in RANGES]
    if first["type"] in _NUMBER_ERRORS | _NOT_A_NUMBER and named:
        message += f"; give {RANGES[named[-1]].describe()}"
    return ConfigError(message)


#: The safe loader, libyaml's when it is there (a 1 MiB file parses in a blink).
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_matrix_text(path: Path) -> str:
    """Return a matrix file's text: a regular file, read without blocking, at most the cap."""
    try:
        # Followed: a matrix may be a symlink into a checkout; a FIFO must not hang it.
        data = read_regular(path, MAX_MATRIX_BYTES, follow=True)
    except InputFileError as exc:
        if exc.reason == "missing":
            raise ConfigError(
                f"matrix file {path} does not exist",
                hint="the demo matrix is warmup_matrices/cpu-demo.yaml",
            ) from None
        if exc.reason == "too_large":
            raise ConfigError(
                f"matrix file {path} is over {MAX_MATRIX_BYTES} bytes",
                hint="a matrix is a page of YAML; check that this is the file you meant",
            ) from None
        hint = "pass the path of a YAML file (warmup_matrices/*.yaml)"
        raise ConfigError(f"matrix file {exc}", hint=hint) from None
    problem = text_problem(data)
    if problem is not None:
        raise ConfigError(f"matrix file {path} {problem}", hint="a matrix is UTF-8 YAML text")
    return data.decode("utf-8")


def _check_shape(text: str, path: Path) -> None:
    """Refuse deep nesting and long scalars from the parser's events, before composing.

    Composing a document recurses once per level, so the depth is bounded here,
    on the flat event stream, first.
    """
    depth = 0
    for event in yaml.parse(text, Loader=_LOADER):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                raise ConfigError(
                    f"{path}: line {_line(event)}: nested deeper than {MAX_YAML_DEPTH} levels",
                    hint="a matrix is a flat mapping of settings, axes and a command",
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
        elif isinstance(event, yaml.ScalarEvent):
            if len(event.value) > MAX_SCALAR_CHARS:
                raise ConfigError(
                    f"{path}: line {_line(event)}: a value of {len(event.value)} characters, "
                    f"over the limit of {MAX_SCALAR_CHARS}",
                    hint="a command or an axis value is a line or two",
                )
            if "\0" in event.value:  # a "\0" escape: no argv, variable or URL can hold it
                raise ConfigError(
                    f"{path}: line {_line(event)}: a value holds a NUL character",
                    hint="remove the \\0 escape",
                )


def _line(event: yaml.Event) -> int:
    mark = event.start_mark
    return mark.line + 1 if mark is not None else 0


def cell_count(matrix: Matrix) -> int:
    """Return how many cells ``matrix`` expands to (the product of its axes' lengths)."""
    return math.prod(len(values) for values in matrix.axes.values())


def _check_grid(matrix: Matrix, matrix_path: Path) -> int:
    """Return the cell count; refuse a grid over :data:`MAX_CELLS` before expanding it."""
    count = cell_count(matrix)
    if count > MAX_CELLS:
        sizes = " x ".join(f"{len(matrix.axes[n])} {n}" for n in sorted(matrix.axes))
        raise ConfigError(
            f"{matrix_path}: axes make {count} cells ({sizes}), over the limit of {MAX_CELLS}",
            hint="split the matrix into several files, or drop values from an axis",
        )
    if matrix.serve is not None and count and matrix.serve.port + count - 1 > _MAX_PORT:
        raise ConfigError(
            f"{matrix_path}: serve.port: cell {count - 1} would serve on port "
            f"{matrix.serve.port + count - 1}, over {_MAX_PORT}",
            hint="cell i serves on port + i: lower serve.port",
        )
    return count


def _slug(values: dict[str, Any]) -> str:
    text = "-".join(str(values[k]) for k in sorted(values))
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")[:48] or "cell"


class _Sandbox(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """jinja2's immutable sandbox, with no globals, few filters and bounded operators."""

    # ``*`` and ``**`` can make a string or a number of any size from a short
    # expression, and ``%`` formats strings: each is checked before it runs.
    intercepted_binops = frozenset({"*", "**", "%"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        """Run ``left operator right`` when its result stays small; else refuse it."""
        if operator == "%" and isinstance(left, str):
            raise jinja2.exceptions.SecurityError("string formatting with % is not allowed")
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                if not isinstance(times, int):
                    continue
                if isinstance(seq, list | tuple):
                    # A list shown renders every item: 4 KiB items x 64 Ki would be 256 GiB.
                    raise jinja2.exceptions.SecurityError("repeating a list is not allowed")
                if isinstance(seq, str) and len(seq) * max(times, 0) > MAX_REPEAT_CHARS:
                    raise jinja2.exceptions.SecurityError(
                        f"repeating makes a string over {MAX_REPEAT_CHARS} characters"
                    )
        if (
            operator == "**"
            and isinstance(left, int)
            and isinstance(right, int)
            and right > 0
            and max(abs(left).bit_length(), 1) * right > MAX_POWER_BITS
        ):
            raise jinja2.exceptions.SecurityError(f"** makes over {MAX_POWER_BITS} bits")
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        """Refuse every call: a template has nothing to call (checked at parse time too)."""
        del __context, args, kwargs
        raise jinja2.exceptions.SecurityError(f"calling {__obj!r} is not allowed")


#: Template nodes a matrix template may hold (:data:`TEMPLATE_RULES`).
_ALLOWED_NODES = (
    jinja2.nodes.Template, jinja2.nodes.Output, jinja2.nodes.TemplateData, jinja2.nodes.If,
    jinja2.nodes.Name, jinja2.nodes.Const, jinja2.nodes.List, jinja2.nodes.Tuple,
    jinja2.nodes.Getattr, jinja2.nodes.Getitem, jinja2.nodes.Slice, jinja2.nodes.BinExpr,
    jinja2.nodes.UnaryExpr, jinja2.nodes.Compare, jinja2.nodes.Operand, jinja2.nodes.CondExpr,
    jinja2.nodes.Concat, jinja2.nodes.Filter, jinja2.nodes.Test, jinja2.nodes.Keyword,
)  # fmt: skip


def _environment(*, quote: bool) -> _Sandbox:
    # A command's {{ value }} is shell-quoted, so it stays one argument after
    # shlex.split (a python or matrix path with a space in it must not become two).
    env = _Sandbox(
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # renders an argv or a URL, not HTML
        finalize=(lambda value: shlex.quote(str(value))) if quote else None,
    )
    env.globals.clear()  # range, lipsum, cycler, joiner, namespace, dict: none is needed
    env.filters = {name: env.filters[name] for name in TEMPLATE_FILTERS}
    return env


#: A compiled template: context in, text out (or :class:`ConfigError` naming ``where``).
Render = Callable[[dict[str, Any], str], str]


def _compile(env: _Sandbox, source: str, field: str, matrix_path: Path) -> Render:
    """Parse ``source`` once, refuse what :data:`TEMPLATE_RULES` does not allow, compile it."""
    where = f"{matrix_path}: {field} template"
    try:
        tree = env.parse(source)
        for node in tree.find_all(jinja2.nodes.Node):
            if not isinstance(node, _ALLOWED_NODES):
                raise ConfigError(
                    f"{where}: {type(node).__name__.lower()} is not allowed",
                    hint=f"a matrix template is {TEMPLATE_RULES}",
                )
            name = getattr(node, "attr", None) or getattr(node, "name", None)
            if isinstance(name, str) and name.startswith("_"):
                raise ConfigError(
                    f"{where}: {name} is not allowed", hint=f"a matrix template is {TEMPLATE_RULES}"
                )
        template = env.from_string(tree)
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(
            f"{where}: {exc}", hint=f"a matrix template is {TEMPLATE_RULES}"
        ) from None

    def render(context: dict[str, Any], cell: str) -> str:
        try:
            out: list[str] = []
            size = 0
            for chunk in template.generate(**context):
                size += len(chunk)
                if size > MAX_RENDERED_CHARS:
                    raise jinja2.exceptions.SecurityError(
                        f"renders to over {MAX_RENDERED_CHARS} characters"
                    )
                if "\0" in chunk:  # no argv or URL can hold it
                    raise jinja2.exceptions.SecurityError("renders a NUL character")
                out.append(chunk)
            return "".join(out)
        except jinja2.UndefinedError as exc:
            raise ConfigError(
                f"{matrix_path}: {cell}.{field} template: {exc}",
                hint=f"it sees: {', '.join(sorted(context))}",
            ) from None
        except jinja2.exceptions.SecurityError as exc:
            raise ConfigError(
                f"{matrix_path}: {cell}.{field} template: {exc}",
                hint=f"a matrix template is {TEMPLATE_RULES}",
            ) from None
        except Exception as exc:  # the matrix's own arithmetic: 1/0, 'a' - 1, 1e308 ** 2...
            raise ConfigError(
                f"{matrix_path}: {cell}.{field} template: {type(exc).__name__}: {exc}",
                hint="fix the expression for this cell's values",
            ) from None

    return render


_GPUS_HINT = "gpus is a whole number, or a template that renders one: {{ tp * pp }}"


def _gpus(
    matrix: Matrix, render: Render | None, context: dict[str, Any], cell: str, matrix_path: Path
) -> int:
    where = f"{matrix_path}: {cell}.gpus"
    if render is None:
        assert isinstance(matrix.gpus, int)  # noqa: S101 - a string is compiled by the caller
        count = matrix.gpus
    else:
        text = render(context, cell).strip()
        try:
            number = float(text)
        except ValueError:
            number = -1.5  # not a number: refused below
        if not B.GPUS_PER_CELL.contains(number) or not number.is_integer():
            shown = text if len(text) <= 80 else text[:77] + "..."
            raise ConfigError(
                f"{where} rendered to {shown!r}, not {B.GPUS_PER_CELL.describe()}",
                hint=_GPUS_HINT,
            )
        count = int(number)
    return count


def expand(matrix: Matrix, matrix_path: Path) -> list[Cell]:
    """Return every cell of the matrix, rendered, in a deterministic order.

    A grid over :data:`MAX_CELLS` and a template that breaks
    :data:`TEMPLATE_RULES` are refused (:class:`ConfigError`) before any cell
    is rendered; each template is compiled once.
    """
    _check_grid(matrix, matrix_path)
    quoted, plain = _environment(quote=True), _environment(quote=False)

    def compiled(env: _Sandbox, source: str, field: str) -> Render:
        return _compile(env, source, field, matrix_path)

    gpus_t = None if isinstance(matrix.gpus, int) else compiled(plain, matrix.gpus, "gpus")
    serve = matrix.serve
    if serve is None:
        assert matrix.command is not None  # noqa: S101 - the model's validator says so
        command_t = compiled(quoted, matrix.command, "command")
    else:
        command_t = compiled(quoted, serve.command, "serve.command")
        ready_t = compiled(plain, serve.ready_url, "serve.ready_url")
        base_t = compiled(plain, serve.base_url, "serve.base_url")
    names = sorted(matrix.axes)
    combos = itertools.product(*(matrix.axes[n] for n in names)) if names else [()]
    matrix_dir = str(matrix_path.resolve().parent)
    cells = []
    for index, combo in enumerate(combos):
        values = dict(zip(names, combo, strict=True))
        context = {
            **matrix.workload,
            **values,
            "python": sys.executable,
            "matrix_dir": matrix_dir,
            "cell_id": f"{index}",
            "workload": matrix.workload,
        }
        cell = f"cells[{index}]"
        gpus = _gpus(matrix, gpus_t, context, cell, matrix_path)
        cell_id = f"{index}-{_slug(values)}"
        if serve is None:
            argv = shlex.split(command_t(context, cell))
            cells.append(Cell(index=index, id=cell_id, values=values, gpus=gpus, argv=argv))
            continue
        port = serve.port + index
        ctx = {**context, "port": port}
        rendered = ServeCell(
            argv=shlex.split(command_t(ctx, cell)),
            ready_url=ready_t(ctx, cell),
            base_url=base_t(ctx, cell),
            model=serve.model or matrix.workload.get("model", matrix.name),
            port=port,
            ready_timeout_s=serve.ready_timeout_s,
            requests=serve.requests,
            shutdown_grace_s=serve.shutdown_grace_s,
            canary=serve.canary,
        )
        cells.append(Cell(index=index, id=cell_id, values=values, gpus=gpus, serve=rendered))
    return cells
