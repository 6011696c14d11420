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
Every template is rendered with ``StrictUndefined``.
"""

from __future__ import annotations

import itertools
import re
import shlex
import sys
from pathlib import Path
from typing import Any, Literal

import jinja2
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from artifactd.errors import ConfigError
from artifactd.families import select_families


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
    prompt_tokens: list[int] = Field(
        default_factory=lambda: [128],
        description="Prompt lengths, in words (about one token each): one request per length.",
    )
    max_tokens: int = Field(16, ge=1, description="Tokens to generate per request.")
    concurrency: int = Field(1, ge=1, description="Requests in flight at once.")
    repeat: int = Field(1, ge=1, description="How many times to send the whole group.")


class Serve(_Frozen):
    """A cell that serves: start the engine, wait until ready, send requests, stop it."""

    command: str = Field(description="jinja2, like `command`; `port` is the cell's port.")
    ready_url: str = Field(
        "http://127.0.0.1:{{ port }}/health", description="jinja2; polled until it answers 200."
    )
    base_url: str = Field(
        "http://127.0.0.1:{{ port }}", description="jinja2; where the /v1 endpoints are."
    )
    model: str | None = Field(
        None, description="The `model` of each request (default: workload.model)."
    )
    port: int = Field(18000, ge=1024, le=65000, description="Cell i serves on port + i.")
    ready_timeout_s: float = Field(600, gt=0)
    requests: list[ServeRequests] = Field(default_factory=lambda: [ServeRequests()])
    shutdown_grace_s: float = Field(30, ge=0, description="After SIGTERM, before SIGKILL.")


class Matrix(_Frozen):
    """A warm-up matrix file (``warmup_matrices/*.yaml``)."""

    schema_version: Literal[1] = 1
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    description: str = ""
    base_image: str | None = None
    target: Target = Target()
    families: list[str] = Field(default_factory=list)
    workload: dict[str, str] = Field(default_factory=dict)
    axes: dict[str, list[str | int | float | bool]] = Field(default_factory=dict)
    command: str | None = Field(None, description="jinja2: a one-shot warm-up (or give serve).")
    serve: Serve | None = Field(None, description="An engine to serve instead of a command.")
    gpus: int | str = Field(
        1, description="GPUs a cell needs: a number or a jinja2 expression over the axes."
    )
    env: dict[str, str] = Field(default_factory=dict)
    timeout_s: float = Field(1800, gt=0)
    check_tolerance: float = Field(
        1e-6, ge=0, description="Relative tolerance when verify compares numeric checks."
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


class Cell(_Frozen):
    """One expanded cell: index, id, axis values, GPUs needed, and what to run."""

    index: int
    id: str
    values: dict[str, Any]
    gpus: int = 1
    argv: list[str] = Field(default_factory=list, description="Empty for a serve cell.")
    serve: ServeCell | None = None


def load_matrix(path: Path) -> Matrix:
    """Read and validate a matrix file; raise :class:`ConfigError` with the bad field."""
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"matrix file {path} does not exist",
            hint="the demo matrix is warmup_matrices/cpu-demo.yaml",
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
    try:
        matrix = Matrix.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"{path}: {loc}: {first['msg']}") from exc
    select_families(matrix.families)  # unknown family names fail here, not after the warm-up
    return matrix


def _slug(values: dict[str, Any]) -> str:
    text = "-".join(str(values[k]) for k in sorted(values))
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")[:48] or "cell"


def _environment(*, quote: bool) -> jinja2.Environment:
    # A command's {{ value }} is shell-quoted, so it stays one argument after
    # shlex.split (a python or matrix path with a space in it must not become two).
    return jinja2.Environment(
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # noqa: S701 - renders an argv or a URL, not HTML
        finalize=(lambda value: shlex.quote(str(value))) if quote else None,
    )


def _render(env: jinja2.Environment, source: str, context: dict[str, Any], where: str) -> str:
    try:
        return env.from_string(source).render(**context)
    except (jinja2.TemplateSyntaxError, jinja2.UndefinedError) as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def _gpus(matrix: Matrix, context: dict[str, Any], where: str) -> int:
    if isinstance(matrix.gpus, int):
        count = matrix.gpus
    else:
        text = _render(_environment(quote=False), matrix.gpus, context, f"{where}: gpus").strip()
        try:
            number = float(text)
        except ValueError:
            number = -1.5  # not a number: refused below
        if not number.is_integer():
            raise ConfigError(f"{where}: gpus rendered to {text!r}, not a whole number")
        count = int(number)
    if count < 0:
        raise ConfigError(f"{where}: gpus is {count}; a cell needs 0 or more GPUs")
    return count


def expand(matrix: Matrix, matrix_path: Path) -> list[Cell]:
    """Return every cell of the matrix, rendered, in a deterministic order."""
    quoted, plain = _environment(quote=True), _environment(quote=False)
    names = sorted(matrix.axes)
    combos = itertools.product(*(matrix.axes[n] for n in names)) if names else [()]
    cells = []
    for index, combo in enumerate(combos):
        values = dict(zip(names, combo, strict=True))
        context = {
            **matrix.workload,
            **values,
            "python": sys.executable,
            "matrix_dir": str(matrix_path.resolve().parent),
            "cell_id": f"{index}",
            "workload": matrix.workload,
        }
        where = f"{matrix_path}: cell {index}"
        gpus = _gpus(matrix, context, where)
        cell_id = f"{index}-{_slug(values)}"
        if matrix.serve is None:
            assert matrix.command is not None  # noqa: S101 - the model's validator says so
            argv = shlex.split(
                _render(quoted, matrix.command, context, f"{where}: command template")
            )
            cells.append(Cell(index=index, id=cell_id, values=values, gpus=gpus, argv=argv))
            continue
        serve = matrix.serve
        port = serve.port + index
        ctx = {**context, "port": port}
        rendered = ServeCell(
            argv=shlex.split(_render(quoted, serve.command, ctx, f"{where}: serve.command")),
            ready_url=_render(plain, serve.ready_url, ctx, f"{where}: serve.ready_url"),
            base_url=_render(plain, serve.base_url, ctx, f"{where}: serve.base_url"),
            model=serve.model or matrix.workload.get("model", matrix.name),
            port=port,
            ready_timeout_s=serve.ready_timeout_s,
            requests=serve.requests,
            shutdown_grace_s=serve.shutdown_grace_s,
        )
        cells.append(Cell(index=index, id=cell_id, values=values, gpus=gpus, serve=rendered))
    return cells
