"""The ``artifactd`` command line: parse, call one library function, render.

Commands import the library inside each command, so that a command loads only
what it uses; each package of the library lists its own modules (and the
module map in docs/dev/index.md, all of them).

Modules:

* :mod:`~artifactd.cli.main`: the entry point: every error to one line and an exit code.
* :mod:`~artifactd.cli.group`: the bare click group the command modules decorate.
* :mod:`~artifactd.cli.app`: the group with every command registered.
* :mod:`~artifactd.cli.specs`: the pod-start commands' options, declared as data.
* :mod:`~artifactd.cli.options`: those and the other shared options as click options.
* :mod:`~artifactd.cli.fast`: the pod-start fast path: ``fingerprint`` and ``restore``
  parsed and run without click (its docstring lists what it may import).
* :mod:`~artifactd.cli.render`: how results look to people (``--json`` documents are
  built in :mod:`artifactd.reports`).
* :mod:`~artifactd.cli.progress`: progress on a terminal: a bar per transfer, a status
  line while cells run.
* :mod:`~artifactd.cli.fingerprints`: ``fingerprint`` and ``diff``.
* :mod:`~artifactd.cli.builds`: ``harvest``, ``build``, ``demo`` and ``lint``.
* :mod:`~artifactd.cli.fanout`: ``matrix cells``, ``merge`` and ``verify``.
* :mod:`~artifactd.cli.restores`: ``restore`` (what it does lives in ``fast``).
* :mod:`~artifactd.cli.stores`: ``inspect``, ``ls``, ``copy`` and ``mirrors``.
* :mod:`~artifactd.cli.keys`: ``keygen`` and ``sign``.
* :mod:`~artifactd.cli.schemas`: ``schema``, the JSON Schemas.
* :mod:`~artifactd.cli.images`: ``image``, runtime images carrying caches.
* :mod:`~artifactd.cli.nodes`: ``prefetch``, ``gc``, ``node-features`` and ``quarantine``.
* :mod:`~artifactd.cli.pods`: ``exec`` and ``status``.
* :mod:`~artifactd.cli.predicts`: ``predict``, the engine's own cache hit before it starts.
* :mod:`~artifactd.cli.shapes`: ``matrix shapes``, from an engine's traffic metrics.
* :mod:`~artifactd.cli.deltas`: ``contribute`` and ``absorb``.
* :mod:`~artifactd.cli.retention`: ``prune`` and ``du``.

Every command has ``--json``; errors become one line on stderr (plus a hint)
and a documented exit code:

====  =====================================================
code  meaning
====  =====================================================
0     success; also any restore failure without ``--require``
1     unexpected error (a bug)
2     bad usage, bad matrix or fingerprint file
3     store unreachable or unreadable (a local layout this user cannot read or
      write); no container engine answers (``image build``)
4     artifact, tag or blob not found
5     integrity: digest mismatch, hostile or schema-invalid artifact
6     restore miss with ``--require``
7     a warm-up cell failed, cells conflict (``build``, ``merge``), a cell's
      partial artifact is missing (``merge``), an image build failed, or
      there was nothing to harvest
9     not enough space on the restore target (or a layout's disk, ``contribute``'s temp dir)
10    restore target not writable, or its lock not taken in time; an output
      (``schema --out``, ``node-features --out``, ``matrix shapes --write``) or a node
      store that cannot be written (a ``--metrics-file`` is an add-on: a warning)
11    ``lint --strict`` or ``build --strict``: the hygiene lint found something
12    ``verify``: a check differs from the build's, or a cell compiled anyway
13    ``status --fail-on-compile``: a restored family compiled anyway
14    untrusted: with ``--verify-key``, a manifest is unsigned, signed by
      another key or for another digest (``restore --require``, ``inspect``,
      ``prefetch --software-from``, ``copy`` and ``sign`` before re-signing)
17    ``predict --require-hit``: the engine will not hit its own compile cache
      (a predicted miss, or unknown)
126   ``exec``: the command is not executable (127: not found); otherwise
      ``exec`` is the command, and its exit code is the command's
====  =====================================================

Set ``ARTIFACTD_TRACEBACK=1`` to see Python tracebacks.
"""

from __future__ import annotations

from artifactd.cli.main import main

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["cli", "main"]


def __getattr__(name: str) -> Any:
    """``artifactd.cli.cli``, the click group, imported (with click) on first use."""
    if name == "cli":
        # lazy: click and every command module, only when the group is asked for
        from artifactd.cli.app import cli  # noqa: PLC0415

        return cli
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
