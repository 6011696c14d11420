"""What a restore installed of the files a library writes again when it merely loads them.

Some libraries rewrite a cached entry when they load it, with the same name
and the same bytes. torch's Mega-Cache load (``torch.compiler.load_cache_artifacts``),
through which vLLM loads each compiled artifact, writes every FX-graph and
AOTAutograd entry the artifact holds into Inductor's cache dir again
(``write_atomic`` under the entry's content-hash name), compile or not.
A family names such files (:attr:`~artifactd.families.base.Family.rewritten_at_load`);
the restore records each one's size and sha256 from its layer record in
``<target>/.artifactd/installed.json`` before it writes the marker, and the
"compiled anyway" verdict (:mod:`artifactd.pod.verdict`) does not count a
file rewritten with exactly the bytes the restore installed. A compile writes
other bytes, or another name, and still counts.

The record is trusted only for a family whose layer digest it names as the
marker does (it is written before the marker: a crash in between leaves a
record naming other layers, which is ignored). A family with more than
:data:`artifactd.bounds.MAX_INSTALLED_RECORD` such files is not recorded:
every rewrite of it counts, as without a record. The file is read up to
:data:`artifactd.bounds.MAX_INSTALLED_BYTES`; a larger, malformed or non-regular one is ignored.
"""

from __future__ import annotations

import os
from _collections_abc import Mapping  # collections.abc's own: importing it loads collections

from artifactd.bounds import MAX_INSTALLED_BYTES, MAX_INSTALLED_RECORD
from artifactd.families import get_family
from artifactd.fsutil import atomic_write, read_regular
from artifactd.jsontext import dumps, loads

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

    from artifactd.fsutil import StrPath
    from artifactd.restore.markertypes import RestoreMarker
    from artifactd.restore.resolve import FamilyPlan

RECORD_NAME = "installed.json"
SCHEMA_VERSION = 1

#: Per family, ``"<component>/<relative path>"`` to ``(size, sha256)``.
Installed = dict[str, dict[str, tuple[int, str]]]


def record(hits: Iterable[FamilyPlan]) -> bytes | None:
    """Return the record of what ``hits`` install that their libraries rewrite at load, or None."""
    families: dict[str, Any] = {}
    for fp in hits:
        if fp.layer is None:
            continue
        fam = get_family(fp.family)
        if not fam.rewritten_at_load:
            continue
        files = {
            f.path: [f.size, f.sha256]
            for f in fp.layer.files
            if f.link is None and not f.rewrite and fam.records_at_restore(f.path)
        }
        if files and len(files) <= MAX_INSTALLED_RECORD:
            families[fp.family] = {"layer": fp.layer.digest, "files": files}
    if not families:
        return None
    return dumps({"schema_version": SCHEMA_VERSION, "families": families}).encode()


def write(state: StrPath, doc: bytes | None) -> None:
    """Replace the record under the state dir ``state`` (None: remove it); before the marker."""
    path = os.path.join(state, RECORD_NAME)
    if doc is None:
        try:  # noqa: SIM105 - contextlib is off a restore's modules (cli/fast.py INSTALL_FLOOR)
            os.unlink(path)
        except FileNotFoundError:
            pass
    else:
        atomic_write(path, doc, durable=True)


def read(state: StrPath, marker: RestoreMarker) -> Installed:
    """Return the record's files of each family whose layer is the one ``marker`` records.

    Anything unreadable, malformed or naming another layer is left out (an
    empty result: every rewrite counts).
    """
    try:
        doc = loads(read_regular(os.path.join(state, RECORD_NAME), MAX_INSTALLED_BYTES))
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(doc, dict) or doc.get("schema_version") != SCHEMA_VERSION:
        return {}
    families = doc.get("families")
    if not isinstance(families, dict):
        return {}
    out: Installed = {}
    for name, fam_marker in marker["families"].items():
        entry = families.get(name)
        if not isinstance(entry, dict) or entry.get("layer") != fam_marker["layer"]:
            continue
        files = _files(entry.get("files"))
        if files:
            out[name] = files
    return out


def _files(raw: object) -> dict[str, tuple[int, str]]:
    if not isinstance(raw, Mapping) or len(raw) > MAX_INSTALLED_RECORD:
        return {}
    files: dict[str, tuple[int, str]] = {}
    for path, value in raw.items():
        if (
            isinstance(path, str)
            and isinstance(value, list)
            and len(value) == 2
            and isinstance(value[0], int)
            and not isinstance(value[0], bool)
            and value[0] >= 0
            and isinstance(value[1], str)
        ):
            files[path] = (value[0], value[1])
    return files


__all__ = ["RECORD_NAME", "Installed", "read", "record", "write"]
