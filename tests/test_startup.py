"""The two pod-start paths, ``fingerprint`` and a no-op ``restore``, import only what they use.

Each test runs the library calls those commands make (as
:mod:`artifactd.cli.podstart` makes them) in a fresh Python and lists the
modules the calls loaded that the interpreter had not already loaded at start.
Family code, the write helpers (``tempfile``, ``shutil``) and the parsers only
a harvest needs are imported lazily; these tests keep them off the fast paths.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cachetrees import make_generic_tree
from conftest import clean_env, run_artifactd

from artifactd.errors import UsageError
from artifactd.families import FAMILIES, get_family, select_families, select_names

#: Runs one pod-start path; prints the outcome and the modules it loaded, as JSON.
CHILD = """
import json, sys
before = set(sys.modules)
from pathlib import Path

path, store, target, workload = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
if path == "fingerprint":
    from artifactd.fingerprint.probe import probe_request
    from artifactd.fingerprint.key import raw_hash

    status = raw_hash(probe_request(workload=workload))
else:
    from artifactd.fingerprint.probe import start_request

    pending = start_request(workload=[w for w in workload if not w.endswith(".pub")])
    from artifactd.restore.policy import RestoreRequest, run_restore

    keys = tuple(k for k in workload if k.endswith(".pub"))
    workload = [w for w in workload if not w.endswith(".pub")]
    request = RestoreRequest(store=store, target=Path(target), verify_keys=keys)
    status = run_restore(request, pending.result()).status
print(json.dumps({"status": status, "loaded": sorted(set(sys.modules) - before)}))
"""

#: The family modules: a full-match no-op restore needs only their names.
FAMILY_MODULES = {f"artifactd.families.{m}" for m in ("base", "layouts", "ninja", "tree")} | {
    f"artifactd.families.{name.replace('-', '')}" for name in FAMILIES
}
#: Only writes need these: temp files, and tree removal (``shutil`` loads bz2 and lzma).
WRITE_HELPERS = {"tempfile", "shutil"}
#: Only classifying or rewriting a vLLM cache needs these (``ast`` too, but
#: ``dataclasses`` imports it through ``inspect``).
VLLM_PARSERS = {"pprint", "ipaddress"}
#: Only planning a miss or installing needs these.
RESTORE_WORK = {
    "artifactd.stores.artifacts",
    "artifactd.format.unpack",
    "artifactd.fingerprint.diff",
    "artifactd.fingerprint.model",
    "artifactd.restore.journal",
}


def _run(path: str, store: str, target: Path, *workload: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, path, store, str(target), *workload],
        env=clean_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return doc


def _forbidden(loaded: list[str], names: set[str]) -> set[str]:
    found = set(loaded) & names
    if "pynvml" in loaded:
        # On a GPU host NVML's bindings import ctypes.util, which loads shutil itself.
        found.discard("shutil")
    return found


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A store holding one generic cache, harvested without a workload."""
    tmp = tmp_path_factory.mktemp("startup")
    gen = make_generic_tree(tmp / "gen")
    ref = f"oci:{tmp / 'store'}"
    env = clean_env({"ARTIFACTD_GENERIC_DIR": str(gen)})
    proc = run_artifactd("harvest", "--store", ref, "--family", "generic", env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return ref


def _restored(store: str, target: Path, *workload: str) -> Path:
    args = [arg for w in workload for arg in ("--workload", w)]
    proc = run_artifactd("restore", "--store", store, "--target", str(target), *args, "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["restored"] == ["generic"]
    return target


def test_fingerprint_loads_no_dataclasses_family_or_write_helper(tmp_path: Path) -> None:
    _run("fingerprint", "-", tmp_path)  # fills the probe cache, as an earlier start did
    doc = _run("fingerprint", "-", tmp_path)
    assert len(doc["status"]) == 64
    # dataclasses imports inspect (and ast, dis, tokenize): a third of a bare start;
    # subprocess (with locale, signal, selectors) another sixth: tools are posix_spawned.
    # hashlib loads OpenSSL (about 2 ms): a fingerprint is small, CPython's sha256 hashes it.
    heavy = {"dataclasses", "inspect", "ast", "subprocess", "_hashlib"}
    heavy |= {*FAMILY_MODULES, *WRITE_HELPERS}
    assert _forbidden(doc["loaded"], heavy | RESTORE_WORK) == set()
    assert "select" in doc["loaded"]  # the probe did wait for its tools


def test_full_match_noop_restore_loads_no_family(store: str, tmp_path: Path) -> None:
    target = _restored(store, tmp_path / "t")
    doc = _run("restore", store, target)
    assert doc["status"] == "noop"
    # Nor ``dataclasses`` (with inspect, about 5 ms): the marker is a typed dict and
    # the plan and outcome types are named tuples.
    heavy = {
        *FAMILY_MODULES,
        *WRITE_HELPERS,
        *VLLM_PARSERS,
        *RESTORE_WORK,
        "dataclasses",
        "_hashlib",
    }
    assert _forbidden(doc["loaded"], heavy) == set()
    assert "artifactd.restore.marker" in doc["loaded"]  # the no-op did read the marker


def test_noop_restore_under_a_verification_policy_loads_no_crypto(
    store: str, tmp_path: Path
) -> None:
    from artifactd.trust.keys import generate

    pair = generate(tmp_path / "k")
    sign = run_artifactd(
        "sign", f"{store}:{_fp_tag(store)}", "--sign-key", pair.private, "--sign-unverified"
    )
    assert sign.returncode == 0, sign.stderr
    target = tmp_path / "t"
    proc = run_artifactd("restore", "--store", store, "--target", str(target),
                         "--verify-key", pair.public, "--json")  # fmt: skip
    assert json.loads(proc.stdout.strip().splitlines()[-1])["status"] == "restored"
    doc = _run("restore", store, target, pair.public)
    assert doc["status"] == "noop"
    # The marker records the key id; the no-op compares it with the ids of the
    # PEM blocks given, hashed without OpenSSL: nothing of ``cryptography``.
    heavy = {*FAMILY_MODULES, *WRITE_HELPERS, *RESTORE_WORK, "dataclasses", "_hashlib"}
    assert _forbidden(doc["loaded"], heavy) == set()
    assert not [m for m in doc["loaded"] if m.startswith("cryptography")]
    assert "artifactd.trust.keys" in doc["loaded"]


def _fp_tag(store: str) -> str:
    from artifactd.stores import open_store

    with open_store(store) as st:
        return next(t for t in st.list_tags() if t.startswith("fp-"))


def test_partial_match_noop_restore_loads_families_but_not_their_parsers(
    store: str, tmp_path: Path
) -> None:
    # A workload changes the whole fingerprint but not generic's scope: a family-tag hit.
    target = _restored(store, tmp_path / "t", "model=m")
    doc = _run("restore", store, target, "model=m")
    assert doc["status"] == "noop"
    # The families that missed are read for their scope keys: vLLM among them.
    assert "artifactd.families.vllm" in doc["loaded"]
    assert _forbidden(doc["loaded"], {*WRITE_HELPERS, *VLLM_PARSERS, *RESTORE_WORK}) == set()


def test_registry_knows_names_and_builds_each_family_once() -> None:
    assert list(FAMILIES) == [
        "triton",
        "inductor",
        "generic",
        "deepgemm",
        "tilelang",
        "cutedsl",
        "cuda-jit",
        "flashinfer",
        "vllm",
        "sglang",
    ]
    assert len(FAMILIES) == 10
    assert all(FAMILIES[name].name == name for name in FAMILIES)
    assert FAMILIES["vllm"] is FAMILIES["vllm"]
    assert "nope" not in FAMILIES
    assert FAMILIES.get("nope") is None
    with pytest.raises(KeyError):
        FAMILIES["nope"]
    with pytest.raises(UsageError, match="unknown cache family 'nope'"):
        get_family("nope")


def test_select_names_selects_as_select_families_does() -> None:
    for names in (None, [], [" triton", "triton", ""], ["vllm", "generic"]):
        assert select_names(names) == [f.name for f in select_families(names)]
    assert select_names(None) == sorted(FAMILIES)
    with pytest.raises(UsageError, match="'nope'"):
        select_names(["triton", "nope"])
