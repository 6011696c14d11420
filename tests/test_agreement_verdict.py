"""One "compiled anyway" verdict: ``status``, ``verify``, the metrics and the engine log agree.

The rule lives in :mod:`artifactd.pod.verdict`; these tests hold every caller to it
on the same trees:

* end to end: a real ``build`` of a vLLM-layout matrix into a local OCI
  layout, then a real ``verify`` whose cell, on the restored cache, does one of
  what a vLLM start does (nothing; rewrite ``vllm_compile_cache.py`` alone, as
  releases before vLLM's ``is_cache_updated`` check do at every start, hit or
  not; compile a new hash dir; lose the cache root), and a real ``status`` on
  the very roots the gate kept (``--keep-roots``), with the cell's output as
  the engine log: the same verdict, and the gate fails exactly when ``status``
  says anything but ``used``;
* in process, on one restored tree per case: ``status``, verify's cell
  comparison (:func:`artifactd.build.gate.judge_cell`), the status metrics and the
  engine-log evidence;
* a structural guard: the comparison with the restore time and the load
  rewrites are read nowhere but in :mod:`artifactd.pod.verdict`.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from cachetrees import ENGINE_SITE, VLLM_CLEAN_HASH, make_vllm_tree, vllm_factors
from conftest import clean_env, run_artifactd, run_artifactd_json
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import artifactd
from artifactd.build.gate import family_failures, judge_cell
from artifactd.families import get_family
from artifactd.pod.enginelogs import restored_key_dirs, scan
from artifactd.pod.metrics import status_registry
from artifactd.pod.status import target_status
from artifactd.pod.verdict import restore_time, wait_past, written_after

TESTS = Path(__file__).resolve().parent

#: A cell that stands in for a vLLM start on ``VLLM_CACHE_ROOT``: at the build
#: it compiles (writes vLLM's layout); at the gate it does what ``MODE`` says.
CELL = f"""\
import json, os, shutil, sys
from pathlib import Path
sys.path.insert(0, {str(TESTS)!r})
from cachetrees import ENGINE_SITE, make_vllm_tree, vllm_factors
root = Path(os.environ["VLLM_CACHE_ROOT"])
mode_file = Path(sys.argv[1])
mode = mode_file.read_text().strip() if mode_file.exists() else "build"
tcc = root / "torch_compile_cache"
if mode == "build":
    make_vllm_tree(root)
elif mode == "rewrite":
    # vLLM before is_cache_updated: every start rewrites its handles file, hit or not.
    for handles in sorted(tcc.rglob("vllm_compile_cache.py")):
        handles.write_text(handles.read_text())
elif mode == "new":
    new = tcc / "0f8b20bdea" / "rank_0_0" / "backbone"
    new.mkdir(parents=True)
    factors = vllm_factors(ENGINE_SITE, pod_ip="10.244.7.9", port=5600, tmp_code=True)
    (new / "cache_key_factors.json").write_text(json.dumps(factors))
    (new / "artifact_compile_range_1_8192_subgraph_0").write_bytes(b"PK" * 64)
elif mode == "gone":
    shutil.rmtree(root)
print(json.dumps({{"checks": {{"answer": 42}}}}))
"""

#: The verdict each mode must get, from ``status`` and the gate alike.
EXPECTED = {
    "untouched": "used",
    "rewrite": "used",
    "new": "compiled anyway",
    "gone": "not restored",
}


def _env(base: Path) -> dict[str, str]:
    return clean_env({"HOME": str(base / "home"), "TMPDIR": str(base)})


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, Path]:
    """A vLLM-layout matrix built once into a local layout: (matrix, store, mode file)."""
    base = tmp_path_factory.mktemp("verdict")
    (base / "cell.py").write_text(CELL)
    mode = base / "mode"
    matrix = base / "vllm-cell.yaml"
    matrix.write_text(
        "schema_version: 1\nname: vllm-verdict\nbase_image: null\n"
        "target:\n  gpu_arch: sm_90a\nfamilies: [vllm]\n"
        "workload:\n  model: artifactd/verdict-demo\n  dtype: bfloat16\n"
        "gpus: 0\n"
        f'command: "{{{{ python }}}} {base / "cell.py"} {mode}"\n'
    )
    store = f"oci:{base / 'store'}"
    run_artifactd_json("build", str(matrix), "--store", store, env=_env(base), timeout=300)
    return matrix, store, mode


def by_family(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["family"]: f for f in doc["families"]}


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_verify_and_status_give_the_same_verdict_on_the_same_tree(
    built: tuple[Path, str, Path], tmp_path: Path, mode: str
) -> None:
    """The gate passes exactly when ``status`` on its roots says ``used`` (a load rewrite is)."""
    matrix, store, mode_file = built
    mode_file.write_text(mode)
    roots = tmp_path / "roots"
    gate = run_artifactd(
        "verify", str(matrix), "--store", store, "--keep-roots", str(roots), "--json",
        env=_env(tmp_path), timeout=300,
    )  # fmt: skip
    assert "Traceback" not in gate.stderr
    doc = json.loads(gate.stdout)
    [cell] = doc["cells"]
    verdict = EXPECTED[mode]
    assert gate.returncode == (0 if verdict == "used" else 12), (mode, doc["failures"])
    assert cell["verdicts"] == {"vllm": verdict}, (mode, doc["failures"])
    assert doc["passed"] is (verdict == "used")

    target = roots / "cells" / cell["id"]
    log = target / ".artifactd" / "verify-cell.log"
    status = run_artifactd(
        "status", "--target", str(target), "--engine-log", str(log), "--json",
        "--fail-on-compile", env=_env(tmp_path),
    )  # fmt: skip
    assert "Traceback" not in status.stderr
    fam = by_family(json.loads(status.stdout))["vllm"]
    assert fam["verdict"] == verdict
    assert fam["files_written"] == cell["compiled"]["vllm"]
    assert status.returncode == (13 if verdict == "compiled anyway" else 0)
    if mode == "new":
        assert cell["compiled"]["vllm"] == 2
        assert any("vllm compiled anyway: 2 file(s) written" in f for f in doc["failures"])
    if mode == "gone":
        assert any("vllm is no longer restored after the run" in f for f in doc["failures"])


# --------------------------------------------------------------------------
# Every caller, in process, on the same tree
# --------------------------------------------------------------------------


def _restored_vllm(tmp_path: Path) -> Path:
    """A vLLM cache in vLLM's layout, harvested and restored into ``tmp_path/cache``."""
    build = make_vllm_tree(tmp_path / "build" / "vllm")
    target = tmp_path / "cache"
    store = f"oci:{tmp_path / 'store'}"
    env = clean_env({"VLLM_CACHE_ROOT": str(build), "HOME": str(tmp_path)})
    run_artifactd_json(
        "harvest", "--store", store, "--family", "vllm", "--gpu-arch", "sm_90a", env=env
    )
    done = run_artifactd_json(
        "restore", "--store", store, "--target", str(target), "--gpu-arch", "sm_90a", env=env
    )
    assert done["restored"] == ["vllm"]
    return target


def _later(target: Path, *paths: Path) -> None:
    """Stamp ``paths`` 10 s after the restore, as an engine writing later leaves them."""
    marker = json.loads((target / ".artifactd" / "restored.json").read_text())
    later = marker["restored_at"] + 10
    for path in paths:
        os.utime(path, (later, later))


def _vllm_line(message: str) -> str:
    return f"(EngineCore_DP0 pid=3021) INFO 09-23 18:12:27 [backends.py:539] {message}\n"


def _case(tmp_path: Path, case: str) -> tuple[Path, Path]:
    """Restore a vLLM tree, then leave on it what ``case`` says; return (target, engine log)."""
    target = _restored_vllm(tmp_path)
    root = target / "vllm"
    local = root / "torch_compile_cache" / VLLM_CLEAN_HASH / "rank_0_0" / "backbone"
    lines = [f"Using cache directory: {local} for vLLM's torch.compile"]
    if case == "load rewrite":
        _later(target, local / "vllm_compile_cache.py")
        lines.append("Directly load the compiled graph(s) for compile range (1, 8192) "
                     "from the cache, took 0.648 s")  # fmt: skip
    elif case == "new entry":
        new = root / "torch_compile_cache" / "0f8b20bdea" / "rank_0_0" / "backbone"
        new.mkdir(parents=True)
        factors = vllm_factors(ENGINE_SITE, pod_ip="10.244.7.9", port=5600, tmp_code=True)
        (new / "cache_key_factors.json").write_text(json.dumps(factors))
        (new / "artifact_compile_range_1_8192_subgraph_0").write_bytes(b"PK\x03\x04")
        _later(target, *new.iterdir())
        lines = [
            f"Using cache directory: {new} for vLLM's torch.compile",
            "Compiling a graph for compile range (1, 8192) takes 20.50 s",
        ]
    elif case == "missing dir":
        shutil.rmtree(root)
    elif case == "compiled elsewhere":
        home = "/root/.cache/vllm/torch_compile_cache/0f8b20bdea/rank_0_0/backbone"
        lines = [
            f"Using cache directory: {home} for vLLM's torch.compile",
            "Compiling a graph for dynamic shape takes 28.96 s",
        ]
    log = tmp_path / "engine.log"
    log.write_text("".join(_vllm_line(m) for m in lines))
    return target, log


def _metric(text: str, name: str, family: str) -> float:
    for metric in text_string_to_metric_families(text):
        for sample in metric.samples:
            if sample.name == name and sample.labels.get("family") == family:
                return float(sample.value)
    raise AssertionError(f"{name}{{family={family}}} not in the exposition")


@pytest.mark.parametrize(
    ("case", "verdict"),
    [
        ("untouched", "used"),
        ("load rewrite", "used"),
        ("new entry", "compiled anyway"),
        ("missing dir", "not restored"),
        ("compiled elsewhere", "compiled anyway"),
    ],
)
def test_every_caller_agrees_on_the_same_input(tmp_path: Path, case: str, verdict: str) -> None:
    """``status``, verify's cell comparison, the metrics and the engine log: one verdict."""
    target, log = _case(tmp_path, case)
    vllm = get_family("vllm")

    status = target_status(target, engine_log=log)
    [fam] = [f for f in status.families if f.family == "vllm"]
    assert fam.verdict == verdict, fam.why

    gate = judge_cell(target, [vllm], log)["vllm"]
    assert (gate.verdict, gate.files_written) == (fam.verdict, fam.files_written)
    failures = family_failures("0", {"vllm": gate}, installed={"vllm"})
    assert bool(failures) is (verdict != "used"), failures

    text = generate_latest(status_registry(status.families)).decode()
    assert _metric(text, "artifactd_family_used", "vllm") == (1.0 if verdict == "used" else 0.0)
    assert _metric(text, "artifactd_family_compiled_files", "vllm") == fam.files_written

    engine = fam.engine
    assert engine is not None
    # The log's own claim never contradicts a used verdict.
    if verdict == "used":
        assert not engine.compiled and engine.other_dirs == []
    if case == "compiled elsewhere":
        assert engine.compiled and fam.files_written == 0
    if case == "new entry":
        # The dir the engine named is one the verdict counted files in, not a restored one.
        [other] = engine.other_dirs
        assert any(p.startswith(other.path) for p in fam.written_examples)

    # What the engine log takes as restored is what the verdict does not count as written.
    root = target / "vllm"
    if root.is_dir():
        cutoff = restore_time(target / ".artifactd" / "restored.json", status.restored_at or 0.0)
        keys = restored_key_dirs(root, cutoff)
        tcc = root / "torch_compile_cache"
        for hash_dir in (d for d in tcc.iterdir() if d.name != "torch_aot_compile"):
            files = [p for p in hash_dir.rglob("*") if p.is_file()]
            old = any(not written_after(p.stat(), cutoff) for p in files)
            assert (hash_dir.relative_to(root).as_posix() in {k.as_posix() for k in keys}) is old


def test_a_verdict_from_the_log_alone_is_the_same_in_the_gate(tmp_path: Path) -> None:
    """A cell whose log says it compiled (nothing written) fails the gate as status says."""
    target, log = _case(tmp_path, "compiled elsewhere")
    facts = scan(log.read_text().splitlines())
    assert facts.vllm.misses == 1
    gate = judge_cell(target, [get_family("vllm")], log)["vllm"]
    assert gate.verdict == "compiled anyway"
    assert "engine log says it compiled" in gate.why
    # Without the log, only the files speak: nothing was written.
    assert judge_cell(target, [get_family("vllm")])["vllm"].verdict == "used"


def test_a_family_the_artifact_lacks_fails_the_gate_only_if_the_cell_filled_it(
    tmp_path: Path,
) -> None:
    """A miss is ``not restored`` for ``status`` and the gate; the gate fails once files appear."""
    target, log = _case(tmp_path, "untouched")
    families = [get_family("vllm"), get_family("generic")]
    status = {f.family: f for f in target_status(target, engine_log=log).families}
    assert status["generic"].verdict == "not restored"
    judged = judge_cell(target, families, log)
    assert {n: v.verdict for n, v in judged.items()} == {"vllm": "used", "generic": "not restored"}
    assert family_failures("0", judged, installed={"vllm"}) == []

    generic = target / "generic"
    generic.mkdir()
    (generic / "axpy.sm_90a.cubin").write_bytes(b"\x7fELF")
    _later(target, generic / "axpy.sm_90a.cubin")
    judged = judge_cell(target, families, log)
    assert judged["generic"].verdict == "not restored"
    assert judged["generic"].files_written == 1
    assert family_failures("0", judged, installed={"vllm"}) == [
        "0: generic is not in the artifact, and the cell compiled 1 file(s) into its dirs"
    ]
    # status on the pod keeps a miss fail-open: not restored, exit 0 with --fail-on-compile.
    again = {f.family: f for f in target_status(target, engine_log=log).families}
    assert again["generic"].verdict == "not restored"


# --------------------------------------------------------------------------
# One owner: no second copy of the rule
# --------------------------------------------------------------------------

#: The package under test (its sources, wherever it is imported from).
PACKAGE = Path(artifactd.__file__).resolve().parent
OWNER = PACKAGE / "pod" / "verdict.py"


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p != OWNER)


#: Functions that read ``load_rewrites`` for a rule that is not the verdict, each with its reason.
OTHER_RULES = {
    # The node store's linking rule: a file the library rewrites when it loads is
    # never a pod's hard link to the node store's copy (it is copied instead).
    ("artifactd/families/base.py", "shares_inode"),
}


def test_the_rule_is_decided_in_one_module() -> None:
    """Only ``artifactd/pod/verdict.py`` compares an mtime with the restore or reads load rewrites.

    A family declares its ``load_rewrites`` (an assignment in its class); any
    other read, or a comparison of ``st_mtime`` with anything, is a second copy
    of the verdict that can drift from the first.
    """
    copies = []
    for path in _sources():
        tree = ast.parse(path.read_text(), str(path))
        rel = path.relative_to(PACKAGE.parent)
        exempt = {
            id(n)
            for f in ast.walk(tree)
            if (str(rel), getattr(f, "name", None)) in OTHER_RULES
            for n in ast.walk(f)
        }
        for node in ast.walk(tree):
            if id(node) in exempt:
                continue
            if isinstance(node, ast.Compare):
                names = {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)} | {
                    n.id for n in ast.walk(node) if isinstance(n, ast.Name)
                }
                if names & {"st_mtime", "st_mtime_ns"} and names & {"cutoff", "restored_at"}:
                    copies.append(f"{rel}:{node.lineno}: compares an mtime with the restore")
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "load_rewrites"
                and isinstance(node.ctx, ast.Load)
            ):
                copies.append(f"{rel}:{node.lineno}: reads load_rewrites")
    assert copies == [], "decide through artifactd.pod.verdict instead:\n" + "\n".join(copies)


def test_verify_has_no_snapshot_comparison_of_its_own() -> None:
    """The gate judges a cell's roots through ``artifactd.pod.verdict``, not its own listing."""
    tree = ast.parse((PACKAGE / "build" / "gate.py").read_text())
    attrs = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert not attrs & {"st_mtime", "st_mtime_ns", "st_size"}
    imported = {
        alias.name
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.module == "artifactd.pod.verdict"
        for alias in n.names
    }
    assert imported, "verify must decide through artifactd.pod.verdict"


def test_the_gate_waits_for_the_file_clock_to_pass_the_restore(tmp_path: Path) -> None:
    """A cell's first write lands after the restore on the file clock, so it counts."""
    cutoff = time.time() + 0.3
    wait_past(tmp_path, cutoff)
    first = tmp_path / "first-write"
    first.write_bytes(b"")
    assert written_after(first.stat(), cutoff)
    assert list(tmp_path.iterdir()) == [first], "the clock probe is left behind"


# --------------------------------------------------------------------------
# Inductor's entries rewritten at load (torch's Mega-Cache load, as vLLM does)
# --------------------------------------------------------------------------

#: Inductor entries as torch names them: ``fxgraph/<xx>/<key>/<hash of the bytes>``.
FXGRAPH = "fxgraph/n3/fn35hvsvxamytn654ncreerb6ve35xi3gcdidwneprsxpk35faxx/55ey3aoqkgznhmj3uc5c5ih"
AOTAUTOGRAD = "aotautograd/a3e7ap6kotbio54xsgde572pvzp6z6cn45f2vlxl3wwdgmqnddjs/dmxdynhoooxmyu6g26x"
KERNEL = "ce/cceloqc3oxen2r3vmnvhb73irgnpoetp2byx5iftyhbip7sxnrdn.py"


@pytest.fixture(scope="module")
def inductor_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, str]]:
    """An Inductor cache harvested once into a local layout: (store, env)."""
    base = tmp_path_factory.mktemp("inductor")
    build = base / "build" / "inductor"
    for rel, data in ((FXGRAPH, b"\x80\x04graph" * 40), (AOTAUTOGRAD, b"\x80\x04aot" * 30),
                      (KERNEL, b"# kernel\n" * 20)):  # fmt: skip
        (build / rel).parent.mkdir(parents=True, exist_ok=True)
        (build / rel).write_bytes(data)
    env = clean_env({"TORCHINDUCTOR_CACHE_DIR": str(build), "HOME": str(base),
                     "TMPDIR": str(base / "build")})  # fmt: skip
    store = f"oci:{base / 'store'}"
    run_artifactd_json(
        "harvest", "--store", store, "--family", "inductor", "--gpu-arch", "sm_90a", env=env
    )
    return store, env


def _restored_inductor(tmp_path: Path, inductor_store: tuple[str, dict[str, str]]) -> Path:
    """The harvested Inductor cache restored into ``tmp_path/cache``; returns the target."""
    store, env = inductor_store
    target = tmp_path / "cache"
    done = run_artifactd_json(
        "restore", "--store", store, "--target", str(target), "--gpu-arch", "sm_90a", env=env
    )
    assert done["restored"] == ["inductor"]
    return target


@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "verdict", "counted"),
    [
        ("same bytes", "used", 0),
        ("other bytes, same size", "compiled anyway", 1),
        ("a kernel rewritten with the same bytes", "compiled anyway", 1),
        ("a new entry in a restored key dir", "compiled anyway", 1),
    ],
)
def test_an_entry_rewritten_at_load_with_the_restored_bytes_is_not_a_compile(
    tmp_path: Path,
    inductor_store: tuple[str, dict[str, str]],
    case: str,
    verdict: str,
    counted: int,
) -> None:
    """torch's Mega-Cache load writes restored entries again (same name, same bytes): ``used``.

    Only what the family names (:attr:`Family.rewritten_at_load`: ``fxgraph/``,
    ``aotautograd/``) and only with exactly the bytes the restore installed;
    ``status``, the gate and the metrics agree.
    """
    target = _restored_inductor(tmp_path, inductor_store)
    cache = target / "inductor"
    entry = cache / FXGRAPH
    data = entry.read_bytes()
    if case == "same bytes":
        for rel in (FXGRAPH, AOTAUTOGRAD):
            (cache / rel).write_bytes((cache / rel).read_bytes())
        touched = [cache / FXGRAPH, cache / AOTAUTOGRAD]
    elif case == "other bytes, same size":
        entry.write_bytes(data[::-1])
        touched = [entry]
    elif case == "a kernel rewritten with the same bytes":
        (cache / KERNEL).write_bytes((cache / KERNEL).read_bytes())
        touched = [cache / KERNEL]
    else:
        new = entry.parent / "zzzz"
        new.write_bytes(data)
        touched = [new]
    _later(target, *touched)

    inductor = get_family("inductor")
    [fam] = [f for f in target_status(target).families if f.family == "inductor"]
    assert (fam.verdict, fam.files_written) == (verdict, counted), fam.why
    gate = judge_cell(target, [inductor])["inductor"]
    assert (gate.verdict, gate.files_written) == (verdict, counted)
    text = generate_latest(status_registry([fam])).decode()
    assert _metric(text, "artifactd_family_used", "inductor") == (1.0 if verdict == "used" else 0.0)


@pytest.mark.slow
def test_a_record_naming_another_layer_is_not_trusted(
    tmp_path: Path, inductor_store: tuple[str, dict[str, str]]
) -> None:
    """The record is written before the marker: one naming another layer counts every rewrite."""
    target = _restored_inductor(tmp_path, inductor_store)
    record = target / ".artifactd" / "installed.json"
    doc = json.loads(record.read_text())
    assert set(doc["families"]["inductor"]["files"]) == {f"cache/{FXGRAPH}", f"cache/{AOTAUTOGRAD}"}
    doc["families"]["inductor"]["layer"] = "sha256:" + "0" * 64
    record.write_text(json.dumps(doc))
    entry = target / "inductor" / FXGRAPH
    entry.write_bytes(entry.read_bytes())
    _later(target, entry)
    [fam] = [f for f in target_status(target).families if f.family == "inductor"]
    assert (fam.verdict, fam.files_written) == ("compiled anyway", 1)
