"""Warm-up matrices: a YAML file of axes, a command template, and the families to harvest.

Expansion is deterministic: axes are taken in sorted name order and their
values in file order, so cell ``i`` is the same cell on every machine (CI
matrix jobs and Kubernetes Indexed Jobs index into it).
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
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from artifactd.errors import ConfigError
from artifactd.families import select_families


class Target(BaseModel):
    """The GPU the matrix builds for."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)
    gpu_arch: str | None = Field(None, description="Declared target, e.g. sm_90a.")


class Matrix(BaseModel):
    """A warm-up matrix file (``warmup_matrices/*.yaml``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)
    schema_version: Literal[1] = 1
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    description: str = ""
    base_image: str | None = None
    target: Target = Target()
    families: list[str] = Field(default_factory=list)
    workload: dict[str, str] = Field(default_factory=dict)
    axes: dict[str, list[str | int | float | bool]] = Field(default_factory=dict)
    command: str
    env: dict[str, str] = Field(default_factory=dict)
    timeout_s: float = Field(1800, gt=0)


class Cell(BaseModel):
    """One expanded cell: its index, id, axis values and rendered argv."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)
    index: int
    id: str
    values: dict[str, Any]
    argv: list[str]


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


def expand(matrix: Matrix, matrix_path: Path) -> list[Cell]:
    """Return every cell of the matrix, rendered, in a deterministic order."""
    # Each {{ value }} is shell-quoted, so it stays one argument after shlex.split
    # (a python or matrix path with a space in it must not become two).
    env = jinja2.Environment(
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # noqa: S701 - renders an argv, not HTML
        finalize=lambda value: shlex.quote(str(value)),
    )
    try:
        template = env.from_string(matrix.command)
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(f"{matrix_path}: command template: {exc}") from exc
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
        try:
            rendered = template.render(**context)
        except jinja2.UndefinedError as exc:
            raise ConfigError(f"{matrix_path}: command template: {exc}") from exc
        cells.append(
            Cell(
                index=index,
                id=f"{index}-{_slug(values)}",
                values=values,
                argv=shlex.split(rendered),
            )
        )
    return cells
