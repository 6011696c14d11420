"""The fast suite on every supported Python: ``nox -f scripts/noxfile.py``.

``scripts/test.sh`` runs the whole suite on the development interpreter (.venv)
and this file's ``fast`` session on each other Python from 3.10 to 3.13 that
the machine has (it says which ran, and skips an absent one with a line). Each
session is a fresh virtualenv (under ``.nox/``, reused when it exists) holding
artifactd with its ``dev`` extra and without torch (the ``warmup`` extra): what
an init container installs, and the tests prove that nothing of the pure core,
the formats or the pod-start path needs more.

The fast suite (:data:`FAST_SUITE`): the pure core (canonical hashing, digests,
bounds, JSON text as ``json`` writes it, the restore's thread primitives on
``_thread``, zstandard's C backend loaded alone), fingerprints and their probe
cache and diff, the artifact format and its pack/unpack tests (the extractor's
own reading of tar headers against ``tarfile``'s), the C batch writer (built for each Python by
the editable install) against the Python loop, the pod-start fast path (its import rule, its
parser, a no-op restore and ``fingerprint --hash`` run for real), restores from
a local layout store and ``status`` on what they restored, the stage-order and
layout rules, the document schemas, and that a test which runs torch
(``@pytest.mark.torch``) skips here; ``-m "not slow"`` within them. No
registry, container engine, GPU or CUDA compiler: the parts of the code whose
behaviour can differ between Pythons (imports, the standard library, typing at
run time, tarfile and json), in about a minute a Python.
"""

from __future__ import annotations

from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent.parent
#: Every Python that ``requires-python`` admits and CI tests; keep in step with
#: pyproject.toml (``requires-python``, ruff's ``target-version``, mypy's
#: ``python_version``: the lowest).
PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
#: The test files of the fast suite (module docstring).
FAST_SUITE = [
    "tests/test_hashing.py",
    "tests/test_jsontext.py",
    "tests/test_workers.py",
    "tests/test_zstd.py",
    "tests/test_bounds.py",
    "tests/test_fingerprint.py",
    "tests/test_probecache.py",
    "tests/test_diff.py",
    "tests/test_format_v2.py",
    "tests/test_archive.py",
    "tests/test_unpack_properties.py",
    "tests/test_unpack_pipeline.py",
    "tests/test_batchwrite.py",
    "tests/test_fastpath.py",
    "tests/test_cli_fast.py",
    "tests/test_agreement_fastpath.py",
    "tests/test_startup.py",
    "tests/test_layout_store.py",
    "tests/test_status.py",
    "tests/test_layout.py",
    "tests/test_schema.py",
    "tests/test_suite_markers.py",
]

nox.options.envdir = str(ROOT / ".nox")
nox.options.reuse_venv = "yes"
# An absent interpreter is a skip (scripts/test.sh names it), in CI too.
nox.options.error_on_missing_interpreters = False
nox.options.sessions = ["fast"]


@nox.session(python=PYTHONS)
def fast(session: nox.Session) -> None:
    """Run the fast suite on one Python, in a virtualenv without torch."""
    session.chdir(ROOT)
    session.install("-e", ".[dev]")
    session.run(
        "python",
        "-m",
        "pytest",
        "-n",
        "0",
        "-p",
        "no:cacheprovider",
        "-m",
        "not slow",
        *FAST_SUITE,
        *session.posargs,
    )
