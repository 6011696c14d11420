"""The ``artifactd`` click group with every command registered.

The group itself is :mod:`artifactd.cli.group`; the command modules decorate
it, and importing them here registers them.
"""

from __future__ import annotations

from artifactd.cli import (
    builds,
    deltas,
    fanout,
    fingerprints,
    images,
    keys,
    nodes,
    pods,
    predicts,
    restores,
    retention,
    schemas,
    shapes,
    stores,
)
from artifactd.cli.group import cli

__all__ = [
    "builds",
    "cli",
    "deltas",
    "fanout",
    "fingerprints",
    "images",
    "keys",
    "nodes",
    "pods",
    "predicts",
    "restores",
    "retention",
    "schemas",
    "shapes",
    "stores",
]
