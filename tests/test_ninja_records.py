"""FlashInfer's ninja records moved to another root, on files ninja itself wrote.

A tiny C build (gcc, with a header so a deps log is recorded) is run by ninja
under root A; the family's own normalize/relocate move ``build.ninja``,
``.ninja_log`` and ``.ninja_deps`` to root B, as a harvest and a restore do.
Ninja is then asked, with ``-n -d explain``, whether B has work: none. A
plain copy (nothing rewritten) is the control: ninja rebuilds it. Each ninja
on this machine is used (the system one writes log v5, MurmurHash64A; the
``ninja`` wheel's 1.13 writes v7, rapidhash).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from artifactd.families.flashinfer import FlashInferFamily
from artifactd.families.ninjarecords import (
    command_hash,
    ninja_commands,
    ninja_relocation_problem,
    rewrite_ninja_deps,
)

FAMILY = FlashInferFamily()


def _ninjas() -> list[str]:
    # The one on PATH, the system's, and the producers extra's wheel (ninja 1.13) in the venv.
    venv = os.path.join(os.path.dirname(sys.executable), "ninja")
    found = [p for p in (shutil.which("ninja"), "/usr/bin/ninja", venv) if p]
    return sorted({os.path.realpath(p) for p in found if os.path.exists(p)})


NINJAS = _ninjas()
RECORDS = ("build.ninja", ".ninja_log", ".ninja_deps")


def _build(ninja: str, root: Path) -> Path:
    """Write an op dir as FlashInfer lays one out (absolute outputs) and let ninja build it."""
    op = root / "0.7.2" / "90a" / "cached_ops" / "tiny"
    gen = root / "0.7.2" / "90a" / "generated"
    op.mkdir(parents=True)
    gen.mkdir(parents=True)
    (gen / "tiny.h").write_text("#define TINY 3\n")
    (gen / "tiny.c").write_text('#include "tiny.h"\nint tiny(void) { return TINY; }\n')
    obj, so = op / "generated_tiny.o", op / "tiny.so"
    (op / "build.ninja").write_text(
        "ninja_required_version = 1.3\n"
        "cxx = gcc\n"
        "cxx_launcher = \n"
        f"cflags = -fPIC $\n    -I{gen} $\n    -O1\n"
        "ldflags = -shared\n\n"
        "rule compile\n"
        "  command = $cxx_launcher $cxx -MMD -MF $out.d $cflags -c $in -o $out\n"
        "  depfile = $out.d\n"
        "  deps = gcc\n\n"
        "rule link\n"
        "  command = $cxx $in $ldflags -o $out\n\n"
        f"build {obj}: compile {gen / 'tiny.c'}\n"
        f"build {so}: link {obj}\n"
        f"default {so}\n"
    )
    run = subprocess.run([ninja, "-C", str(op)], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    return op


def _explain(ninja: str, op: Path) -> str:
    run = subprocess.run(
        [ninja, "-n", "-d", "explain", "-C", str(op)], capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout + run.stderr


def _move(src_root: Path, dst_root: Path, *, rewrite: bool) -> None:
    """Copy a tree keeping mtimes; with ``rewrite``, pass ninja's records through the family.

    Without it, only build.ninja names the new root, as FlashInfer writes it
    again for the root it runs under.
    """
    shutil.copytree(src_root, dst_root)
    for path in dst_root.rglob("*"):
        if path.name == "build.ninja" and not rewrite:
            text = path.read_text().replace(str(src_root), str(dst_root))
            path.write_text(text)
        elif path.name in RECORDS and rewrite:
            src = src_root / path.relative_to(dst_root)
            stored = FAMILY.normalize(src.read_bytes(), (str(src_root),))
            assert str(src_root).encode() not in stored
            path.write_bytes(FAMILY.relocate(stored, str(dst_root)))
            shutil.copystat(src, path)


@pytest.mark.skipif(not NINJAS, reason="no ninja binary on this machine")
@pytest.mark.parametrize("ninja", NINJAS)
def test_moved_records_leave_ninja_nothing_to_do(tmp_path: Path, ninja: str) -> None:
    root_a = tmp_path / "a" / ".cache" / "flashinfer"
    op_a = _build(ninja, root_a)
    assert "no work to do" in _explain(ninja, op_a)
    assert ninja_relocation_problem(op_a, (str(root_a),)) is None

    # Control: copied as is, ninja finds neither deps nor commands for the new paths.
    plain = tmp_path / "plain" / "cache"
    _move(root_a, plain, rewrite=False)
    assert "no work to do" not in _explain(ninja, plain / op_a.relative_to(root_a))

    root_b = tmp_path / "pod-user" / "flashinfer-home" / ".cache" / "flashinfer"
    _move(root_a, root_b, rewrite=True)
    op_b = root_b / op_a.relative_to(root_a)
    verdict = _explain(ninja, op_b)
    assert "no work to do" in verdict, verdict
    assert "is dirty" not in verdict
    log = (op_b / ".ninja_log").read_text()
    assert str(root_a) not in log and str(op_b / "tiny.so") in log


@pytest.mark.skipif(not NINJAS, reason="no ninja binary on this machine")
@pytest.mark.parametrize("ninja", NINJAS)
def test_hashes_of_evaluated_commands_are_ninjas(tmp_path: Path, ninja: str) -> None:
    op = _build(ninja, tmp_path / "root")
    log = (op / ".ninja_log").read_text().splitlines()
    version = int(log[0].rsplit("v", 1)[1])
    commands = ninja_commands((op / "build.ninja").read_text())
    recorded = {line.split("\t")[3]: int(line.split("\t")[4], 16) for line in log[1:]}
    assert set(recorded) == set(commands)
    for output, command in commands.items():
        assert command_hash(command, version) == recorded[output], command


def test_a_log_that_disagrees_with_its_build_file_is_not_moved(tmp_path: Path) -> None:
    if not NINJAS:
        pytest.skip("no ninja binary on this machine")
    root = tmp_path / "root"
    op = _build(NINJAS[0], root)
    text = (op / "build.ninja").read_text().replace("-O1", "-O2")
    (op / "build.ninja").write_text(text)  # a changed flag: ninja would rebuild
    problem = ninja_relocation_problem(op, (str(root),))
    assert problem is not None and "does not match its build.ninja" in problem


def test_deps_rewrite_keeps_ids_and_rejects_a_cut_file(tmp_path: Path) -> None:
    if not NINJAS:
        pytest.skip("no ninja binary on this machine")
    root = tmp_path / "r"
    deps = (_build(NINJAS[0], root) / ".ninja_deps").read_bytes()
    longer = rewrite_ninja_deps(deps, (str(root),), "/somewhere/much/longer/than/before")
    back = rewrite_ninja_deps(longer, ("/somewhere/much/longer/than/before",), str(root))
    assert back == deps
    with pytest.raises(ValueError, match="cut short"):
        rewrite_ninja_deps(deps[:-3], (str(root),), "/x")


def test_a_root_ninja_would_quote_gets_no_entries_it_would_misread(tmp_path: Path) -> None:
    if not NINJAS:
        pytest.skip("no ninja binary on this machine")
    root = tmp_path / "root"
    op = _build(NINJAS[0], root)
    stored = FAMILY.normalize((op / ".ninja_log").read_bytes(), (str(root),))
    good = FAMILY.relocate(stored, "/pod/cache").decode().splitlines()
    assert len(good) == 3 and all("/pod/cache/" in line for line in good[1:])
    # '@' is quoted in $in/$out: a substituted command would hash otherwise than ninja's.
    quoted = FAMILY.relocate(stored, "/pod/ca@che").decode().splitlines()
    assert quoted == good[:1]
