"""JSON Schemas of every document artifactd writes, generated from the models.

``registry-schema/*.schema.json`` is produced by :func:`write_schemas`
(``artifactd schema --out registry-schema``); a test fails when the committed
files are stale.
"""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Any, get_args, get_origin, is_typeddict

import typing_extensions
from pydantic import TypeAdapter

from artifactd.build.matrix import Matrix
from artifactd.errors import TargetError
from artifactd.fingerprint.model import Fingerprint
from artifactd.format.config import ArtifactConfig, FamilyTree
from artifactd.restore.journal import RestoreJournal
from artifactd.restore.markertypes import RestoreMarker

SCHEMA_BASE = "https://artifactd.dev/schema/"

#: Pydantic models, and the plain typed dict and dataclass of the restore state documents.
DOCUMENTS: dict[str, type] = {
    "artifact-config": ArtifactConfig,
    "family-tree": FamilyTree,
    "fingerprint": Fingerprint,
    "restore-journal": RestoreJournal,
    "restore-marker": RestoreMarker,
    "warmup-matrix": Matrix,
}


def render_schemas() -> dict[str, str]:
    """Return ``{file name: JSON text}`` for every document schema."""
    out = {}
    for name, model in DOCUMENTS.items():
        adapted = _for_pydantic(model, {}) if is_typeddict(model) else model
        schema = TypeAdapter(adapted).json_schema()
        schema = {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": f"{SCHEMA_BASE}{name}.v1.json",
            **schema,
        }
        out[f"{name}.schema.json"] = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    return out


def write_schemas(directory: Path) -> list[Path]:
    """Write every schema into ``directory``; return the paths written.

    Raises :class:`TargetError` when ``directory`` cannot be made or written
    (a file where the directory belongs, no permission, a name too long).
    """
    written = []
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for name, text in render_schemas().items():
            path = directory / name
            path.write_text(text, encoding="utf-8")
            written.append(path)
    except OSError as exc:
        raise TargetError(
            f"cannot write the schemas into {directory}: {exc.strerror or exc}",
            hint="--out names a directory (made if missing) this user can write",
        ) from None
    return written


def _for_pydantic(cls: type, made: dict[type, Any]) -> Any:
    """Return a ``typing_extensions`` copy of the typed dict ``cls``, nested ones too.

    Pydantic reads only ``typing_extensions.TypedDict`` on Python < 3.12, and
    the restore marker is a ``typing.TypedDict`` so that a no-op restore does
    not import ``typing_extensions`` (about 15 ms). Same name, docstring, keys
    optional keys and config: the same schema.
    """
    if cls in made:
        return made[cls]

    def convert(tp: Any) -> Any:
        if is_typeddict(tp):
            return _for_pydantic(tp, made)
        origin = get_origin(tp)
        if origin in (list, dict):
            return origin[tuple(convert(arg) for arg in get_args(tp))]
        return tp

    optional: frozenset[str] = getattr(cls, "__optional_keys__", frozenset())
    keys = {
        # A key the class may leave out (``signed_by``) stays optional in the schema.
        k: typing_extensions.NotRequired[convert(v)] if k in optional else convert(v)
        for k, v in typing.get_type_hints(cls).items()
    }
    typed_dict: Any = typing_extensions.TypedDict  # the functional form, called at run time
    copy: Any = typed_dict(cls.__name__, keys)
    copy.__doc__ = cls.__doc__
    copy.__pydantic_config__ = getattr(cls, "__pydantic_config__", None)
    made[cls] = copy
    return copy
