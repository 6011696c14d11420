"""One sentence per finding saying what it will cost on the pod.

The library-specific sentences live on each family (:attr:`Family.library`,
:attr:`Family.path_cost`, :attr:`Family.python_path_cost`) and vLLM's hash
factor costs beside its classifier; this module holds the sentences that
depend only on the kind of hazard, with the family's name put in.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from artifactd.families.base import Family, is_group_file
from artifactd.families.vllm import FACTORS_PATH_COST
from artifactd.lint.report import KIND_USER

GROUP_COST = (
    "Triton silently recompiles when restored anywhere else: this group file points"
    " outside the cache root, so restore cannot rewrite it"
)


def path_cost(
    family: Family, rel: str, *, python: bool, binary: bool, rewritten: bool, factors: bool
) -> str:
    """Return the cost of a build-machine path found in the file ``rel`` of ``family``.

    ``python``: the path is the build machine's Python install; ``binary``:
    the file is binary; ``rewritten``: restore rewrites the file's paths under
    its own root (so this one points outside it); ``factors``: the file is
    vLLM's hash factors.
    """
    lib = family.library
    if binary:
        return (
            f"{lib}'s binary embeds this build path (debug info, an rpath or a baked-in"
            " include dir): harmless if informational, a load failure or recompile where"
            " it is followed"
        )
    if python:
        return family.python_path_cost or (
            f"{lib} embeds the build machine's Python install path: a pod whose image"
            " installs packages elsewhere misses and recompiles"
        )
    if factors:
        return FACTORS_PATH_COST
    if rewritten:
        if is_group_file(PurePosixPath(rel)):
            return GROUP_COST
        return (
            f"{lib} restore rewrites only the paths under the cache root: this one points"
            " outside it and stays the build machine's path on the pod (a miss and a recompile)"
        )
    return family.path_cost or (
        f"{lib} reads this file as shipped: the build path is not rewritten on restore, so"
        " on a pod laid out differently it resolves to nothing (a miss and a recompile, or"
        " a load error)"
    )


def name_cost(family: Family, kind: str, *, in_name: bool) -> str:
    """Return the cost of the build user or host name in a path (``in_name``: in a file name)."""
    lib = family.library
    who = "user" if kind == KIND_USER else "host"
    if in_name:
        other = "running as another user" if who == "user" else "on another host"
        return (
            f"the name carries the build {who}: {lib} {other} looks under its own name,"
            " so these files ship but are never used"
        )
    other = "running as another user" if who == "user" else "with another host name"
    return (
        f"{lib} reads a path naming the build {who}: a pod {other} has no such path, so"
        " the lookup misses and recompiles"
    )
