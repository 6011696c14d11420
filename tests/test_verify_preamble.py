"""``verify`` and ``verify --candidate`` set up once: :func:`artifactd.build.gate.preamble`.

Both gates load and expand the matrix, compute the fingerprint ``build``
publishes and take the basis every cell's restore verifies under; two copies
of that setup could drift (one reading the environment, the other not). The
command line builds the basis with :func:`artifactd.trust.policy.verification`
for both. Held here by what both gates do without a basis, and by the source:
only the preamble loads a matrix or computes a fingerprint.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from test_layout import PACKAGE

from artifactd.build.candidate import verify_candidate
from artifactd.build.gate import GateSetup, verify
from artifactd.stores import open_store

GATES = ("build/gate.py", "build/candidate.py")
#: What the preamble alone calls, among the gates' modules.
SETUP = {"load_matrix", "expand", "published_fingerprint", "current_environ"}


def _run(gate: str, matrix: Path, store: Any, setup: Any) -> Any:
    if gate == "verify":
        return verify(matrix, store, setup)
    return verify_candidate(matrix, store, "candidate-1", setup)


@pytest.mark.parametrize("gate", ["verify", "candidate"])
def test_both_gates_refuse_a_missing_policy_before_reading_anything(
    tmp_path: Path, gate: str
) -> None:
    missing = tmp_path / "no-such-matrix.yaml"
    setup = GateSetup(None, gpu_arch="sm_90a")  # type: ignore[arg-type]
    with (
        open_store(f"oci:{tmp_path / 'store'}", create=True) as store,
        pytest.raises(TypeError, match="UNSAFE_NO_VERIFICATION"),
    ):
        _run(gate, missing, store, setup)
    with pytest.raises(TypeError, match="trust"):
        GateSetup(gpu_arch="sm_90a")  # type: ignore[call-arg]


def _calls(path: Path) -> dict[str, set[str]]:
    """Per top-level function (and method) of a module: the names it calls."""
    out: dict[str, set[str]] = {}
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            out[node.name] = {
                c.func.id if isinstance(c.func, ast.Name) else getattr(c.func, "attr", "")
                for c in ast.walk(node)
                if isinstance(c, ast.Call)
            }
    return out


def test_only_the_preamble_sets_a_gate_up() -> None:
    setting_up = {
        f"{module}:{name}"
        for module in GATES
        for name, called in _calls(PACKAGE / module).items()
        if called & SETUP
    }
    assert setting_up == {"build/gate.py:preamble"}, (
        "verify's and verify --candidate's setup (matrix, cells, environment, fingerprint) "
        f"belongs in artifactd.build.gate.preamble alone; also found in {sorted(setting_up)}"
    )
