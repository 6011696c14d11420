"""The two pod-start paths, ``fingerprint`` and a no-op ``restore``, import only what they use.

The rule is :mod:`artifactd.cli.fast`'s (its docstring; ``tests/test_fastpath.py``
holds the code to it): a real ``artifactd restore`` no-op, in every form the
docs and the manifests use, with flags or ``ARTIFACTD_*`` variables, loads
artifactd modules of :data:`~artifactd.cli.fast.LIGHT` only, nothing of
:data:`~artifactd.cli.fast.LATER`, and none of the heavy dependencies. Two
library-level tests (the calls the commands make, in a fresh Python) keep
what no list covers off the paths: the standard library modules a fingerprint
must not load, and a family's own parsers on a partial-match no-op.

Click's path is lazy too, by the command: ``--help`` loads every command module
but none of the library behind the commands (each imports it inside the command).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cachetrees import harvest_environ, make_generic_tree, make_triton_tree
from conftest import clean_env, run_artifactd
from registry_server import RegistryServer

from artifactd.cli.fast import INSTALLING, LATER, LIGHT
from artifactd.cli.specs import COMMANDS
from artifactd.constants import PYDANTIC_DISABLE_PLUGINS, current_environ, pydantic_plugins_off
from artifactd.errors import UsageError
from artifactd.families import FAMILIES, get_family, select_families, select_names
from artifactd.stores import open_store
from artifactd.trust.keys import generate

#: Runs the library calls of a restore (as :func:`artifactd.cli.fast.restore` makes
#: them); prints the outcome and the modules it loaded, as JSON.
CHILD = """
import json, sys
before = set(sys.modules)
from pathlib import Path

from artifactd.fingerprint.probe import start_request

store, target, workload = sys.argv[1], sys.argv[2], sys.argv[3:]
pending = start_request(workload=workload)
from artifactd.restore.policy import RestoreRequest, run_restore

request = RestoreRequest(store=store, target=Path(target))
status = run_restore(request, pending.result()).status
print(json.dumps({"status": status, "loaded": sorted(set(sys.modules) - before)}))
"""

#: Only classifying or rewriting a vLLM cache needs these (``ast`` too, but
#: ``dataclasses`` imports it through ``inspect``).
VLLM_PARSERS = {"pprint", "ipaddress"}


def _run(store: str, target: Path, *workload: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, store, str(target), *workload],
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


#: What neither pod-start command may ever load (torch and engines, pydantic, the
#: registry client, compression, templating, click).
HEAVY = ("torch", "triton", "pydantic", "oras", "requests", "zstandard", "jinja2", "click")
#: Lists the modules the command loaded beyond those Python starts with, at exit.
LOADED = (
    "import atexit, sys\n"
    "_before = set(sys.modules)\n"
    "atexit.register(lambda: sys.stderr.write("
    "'\\nLOADED ' + ' '.join(sorted(set(sys.modules) - _before))))"
)
#: The no-op forms of the docs and the deploy/k8s manifests: the options beyond
#: ``--store`` and ``--target`` (``{tmp}``: the test's directory; ``{pub}``: a public key).
NOOP_FORMS = {
    "plain": [],
    "env-file": ["--env-file", "{tmp}/env/pod.env"],
    "gpu-arch, workload": ["--gpu-arch", "sm_90a", "--workload", "model=m,tp=8"],
    "node-store": ["--node-store", "oci:{tmp}/node-store"],
    "verify-key": ["--verify-key", "{pub}"],
}


@pytest.fixture(scope="module")
def signed_store(store: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """``store`` with a second generic artifact (sm_90a, a workload), both signed; and the key."""
    tmp = tmp_path_factory.mktemp("signed")
    gen = make_generic_tree(tmp / "gen")
    env = clean_env({"ARTIFACTD_GENERIC_DIR": str(gen)})
    fp = ["--gpu-arch", "sm_90a", "--workload", "model=m,tp=8"]
    proc = run_artifactd("harvest", "--store", store, "--family", "generic", *fp, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    pair = generate(tmp / "k")
    for tag in _fp_tags(store):
        sign = run_artifactd(
            "sign", f"{store}:{tag}", "--sign-key", pair.private, "--sign-unverified"
        )
        assert sign.returncode == 0, sign.stderr
    return store, pair.public


def _outside_the_fast_path(loaded: set[str]) -> set[str]:
    """The loaded modules the fast path's rule refuses: artifactd's off LIGHT, LATER, HEAVY."""
    ours = {m for m in loaded if m.startswith("artifactd")} - LIGHT - {"artifactd.cli.fast"}
    return ours | {m for m in loaded if m.split(".")[0] in {*HEAVY, *LATER} or m in LATER}


def _pod_start(args: list[str], env: dict[str, str]) -> tuple[str, set[str]]:
    """Run ``artifactd restore --json ARGS``; return its status and the modules it loaded."""
    proc = run_artifactd("restore", "--json", *args, env=env, prelude=LOADED)
    assert proc.returncode == 0, proc.stderr[-2000:]
    status = json.loads(proc.stdout.strip().splitlines()[-1])["status"]
    return status, set(proc.stderr.rsplit("\nLOADED ", 1)[1].split())


FAST = "artifactd.cli.fast"
#: Standard library modules whose import costs a sizeable part of a bare start (cli/fast.py).
#: From Python 3.12, ``sysconfig`` (which the probe reads SOABI and EXT_SUFFIX from) imports
#: ``threading`` itself: there it is the standard library's cost, not ours.
COSTLY = frozenset(
    {"typing", "re", "json", "pathlib", "contextlib", "functools", "collections", "enum"}
    | {"dataclasses"}
    | ({"threading"} if sys.version_info < (3, 12) else set())
)
#: The no-op forms held to the light modules alone (artifactd/cli/fast.py): every one.
FLOOR_FORMS = ("plain", "env-file", "gpu-arch, workload", "verify-key", "node-store")


@pytest.mark.parametrize("form", list(NOOP_FORMS))
def test_every_noop_form_loads_only_the_fast_path(
    form: str, signed_store: tuple[str, str], tmp_path: Path
) -> None:
    store, pub = signed_store
    args = ["--store", store, "--target", str(tmp_path / "t")]
    args += [a.format(tmp=tmp_path, pub=pub) for a in NOOP_FORMS[form]]
    first, _ = _pod_start(args, clean_env())
    assert first == "restored"
    envvars = {opt.flag: opt.envvar for opt in COMMANDS["restore"]}
    as_environ = {str(envvars[f]): v for f, v in zip(args[::2], args[1::2], strict=True)}
    for how, (argv, env) in {
        "flags": (args, clean_env()),
        "ARTIFACTD_* variables": ([], clean_env(as_environ)),
    }.items():
        status, loaded = _pod_start(argv, env)
        assert status == "noop", how
        assert _outside_the_fast_path(loaded) == set(), how
        assert "_hashlib" not in loaded, how  # OpenSSL: CPython's own sha256 hashes a fingerprint
        assert "artifactd.restore.marker" in loaded  # the no-op did read the marker
        if form == "verify-key":
            assert "artifactd.trust.keys" in loaded  # key ids from the PEM, no crypto library
        if form in FLOOR_FORMS:
            # Held to the first modules alone, and none of the costly standard library.
            assert {m for m in loaded if m.startswith("artifactd")} <= LIGHT | {FAST}, how
            assert loaded & COSTLY == set(), how


def test_fingerprint_hash_loads_nothing_heavy() -> None:
    run_artifactd("fingerprint", "--hash", env=clean_env())  # fills the probe cache, as at a start
    proc = run_artifactd("fingerprint", "--hash", env=clean_env(), prelude=LOADED)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(proc.stdout.strip()) == 64
    loaded = set(proc.stderr.rsplit("\nLOADED ", 1)[1].split())
    assert _outside_the_fast_path(loaded) == set()
    # Nor these, which no list names: inspect (with ast, dis, tokenize) is a third of
    # a bare start, subprocess a sixth (tools are posix_spawned), and hashlib loads
    # OpenSSL (a fingerprint is small: CPython's own sha256 hashes it).
    assert loaded & {"inspect", "ast", "subprocess", "_hashlib"} == set()
    assert "select" in loaded  # the probe did wait for its tools
    # The light modules alone (artifactd/cli/fast.py), and none of the standard
    # library modules whose import costs a sizeable part of a bare start.
    assert {m for m in loaded if m.startswith("artifactd")} <= LIGHT | {FAST}
    assert loaded & COSTLY == set()


#: Also says, at exit, whether pydantic scanned for plugins: its cache of them stays
#: None when the scan was off (``PYDANTIC_DISABLE_PLUGINS``), a dict once it ran.
PLUGINS = (
    LOADED + "\natexit.register(lambda: sys.stderr.write('\\nPLUGINS ' + repr(getattr("
    "sys.modules.get('pydantic.plugin._loader'), '_plugins', 'not loaded'))))"
)
#: What a restore that installs from one store, verifying nothing, has no use for:
#: signatures (and the crypto library), a second registry's credentials, subprocesses,
#: keys, what only ``inspect`` shows; nor what would cost it a tenth of a bare start
#: each: dataclasses (which loads inspect, ast, dis, tokenize) and concurrent.futures
#: (which loads logging); vLLM's key recipe (read at harvest and predict), ninja's
#: parsers and the harvest's tree walk (a restore plans every family, harvests none).
NOT_INSTALLING = {
    "dataclasses",
    "inspect",
    "concurrent.futures",
    "logging",
    "artifactd.families.vllmkey",
    "artifactd.families.ninja",
    "artifactd.families.ninjarecords",
    "artifactd.families.tree",
    "artifactd.trust.keys",
    "artifactd.trust.inspection",
    "artifactd.trust.signatures",
    "artifactd.stores.credentials",
    "cryptography",
    # On 3.10 the standard library's `platform` imports subprocess at module level
    # (3.11 made it lazy), and the restore loads platform; from 3.11 nothing does.
    *(["subprocess"] if sys.version_info >= (3, 11) else []),
}


def test_a_restore_that_installs_loads_no_pydantic_and_no_signing(
    store: str, tmp_path: Path
) -> None:
    args = ["restore", "--json", "--store", store, "--target", str(tmp_path / "t")]
    env = clean_env()
    env.pop(PYDANTIC_DISABLE_PLUGINS, None)  # the switch is the restore's own doing
    proc = run_artifactd(*args, env=env, prelude=PLUGINS)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["status"] == "restored"
    loaded = set(proc.stderr.rsplit("\nLOADED ", 1)[1].split())
    # It read the artifact's documents with the light reader, by the models' rules...
    assert "artifactd.format.light" in loaded
    # ...without pydantic (or its scan of every installed distribution for plugins),
    assert {m for m in loaded if m.split(".")[0] in ("pydantic", "pydantic_core")} == set()
    assert proc.stderr.rsplit("\nPLUGINS ", 1)[1].split("\n", 1)[0] == "'not loaded'"
    # and without the modules only signing, verifying or a second registry use.
    assert loaded & NOT_INSTALLING == set()


#: Beyond COSTLY, what a restore that installs from a local layout never loads (the rule of
#: INSTALLING, artifactd/cli/fast.py): tarfile (a plain layer is read without it), shutil,
#: tempfile, zstandard's package (its C backend is loaded alone, without platform and typing),
#: what pathlib loads, and getpass (the user is looked up directly).
NEVER_INSTALLING = frozenset(
    {"tarfile", "shutil", "tempfile", "zstandard", "platform", "fnmatch", "urllib.parse"}
    | {"copy", "getpass", "bz2", "lzma", "ipaddress", "string"}
)


def test_a_restore_that_installs_loads_none_of_the_costly_modules(tmp_path: Path) -> None:
    """Triton's group files rewritten and a generic cache, from a local layout: a third of
    the standard library's cost stays off a pod start (bench/coldstart.py times it)."""
    make_triton_tree(tmp_path / "build" / "triton")
    make_generic_tree(tmp_path / "build" / "generic")
    store = f"oci:{tmp_path / 'store'}"
    env = clean_env(harvest_environ(tmp_path / "build"))
    harvested = run_artifactd("harvest", "--store", store, env=env)
    assert harvested.returncode == 0, harvested.stderr[-2000:]
    # A first pod on the node fills the probe cache (the probe's tools run on threads).
    assert _pod_start(["--store", store, "--target", str(tmp_path / "first")], clean_env())[0]
    args = ["--store", store, "--target", str(tmp_path / "t")]
    status, loaded = _pod_start(args, clean_env())
    assert status == "restored"
    assert "artifactd.format.unpack" in loaded and "zstandard.backend_c" in loaded
    assert loaded & (COSTLY | NEVER_INSTALLING) == set()
    # Small layers: CPython's own sha256 checks them, OpenSSL is not loaded (hashing.BULK).
    assert "_hashlib" not in loaded
    installed = {m for m in loaded if m.startswith("artifactd.")}
    assert installed <= LIGHT | INSTALLING | {FAST, "artifactd.format._batchwrite"}
    # The group file was rewritten for this target (jsontext, not json, did it).
    groups = list((tmp_path / "t").rglob("__grp__*.json"))
    assert groups and all(str(tmp_path / "t") in g.read_text() for g in groups)
    # Through a warm node store (every pod but the node's first, which copies the artifact
    # in and makes the trees): served from the node's trees, by link.
    node = ["--node-store", f"oci:{tmp_path / 'node'}"]
    first = ["--store", store, "--target", str(tmp_path / "node-first"), *node]
    assert _pod_start(first, clean_env())[0] == "restored"
    args = ["--store", store, "--target", str(tmp_path / "node-later"), *node]
    status, loaded = _pod_start(args, clean_env())
    assert status == "restored"
    assert "artifactd.stores.nodetree" in loaded
    assert loaded & (COSTLY | NEVER_INSTALLING) == set()


def test_a_restore_from_a_registry_loads_neither_pydantic_nor_oras(
    store: str, registry: RegistryServer, tmp_path: Path
) -> None:
    # A registry that asks for no token (as an in-cluster registry or a node's mirror):
    # oras-py, and the jsonschema it imports, load only to answer a Bearer challenge
    # (tests/test_registry_token_auth.py); pydantic not at all. Together about 80 ms
    # of every pod start that restores from a registry.
    ref = registry.ref("startup/no-models")
    copied = run_artifactd("copy", store, ref)
    assert copied.returncode == 0, copied.stderr[-2000:]
    args = ["restore", "--json", "--store", ref, "--target", str(tmp_path / "t")]
    proc = run_artifactd(*args, prelude=LOADED)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["status"] == "restored"
    loaded = set(proc.stderr.rsplit("\nLOADED ", 1)[1].split())
    assert "requests" in loaded  # it did speak HTTP to the registry
    roots = {m.split(".")[0] for m in loaded}
    assert roots & {"pydantic", "pydantic_core", "oras", "jsonschema"} == set()


def test_the_plugin_switch_ends_with_the_restore(store: str, tmp_path: Path) -> None:
    """``exec --restore``: the engine it becomes gets the environment it was given."""
    seen = tmp_path / "seen"
    engine = (
        "import os, pathlib\n"
        f"pathlib.Path({str(seen)!r}).write_text(repr(os.environ.get({PYDANTIC_DISABLE_PLUGINS!r})))"
    )
    target = tmp_path / "t"
    env = clean_env()
    env.pop(PYDANTIC_DISABLE_PLUGINS, None)
    argv = ["exec", "--restore", "--store", store, "--target", str(target), "--"]
    proc = run_artifactd(*argv, sys.executable, "-c", engine, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (target / "artifactd.env").is_file()  # it restored: it built and used the models
    assert seen.read_text() == "None"


def test_the_plugin_switch_keeps_a_value_already_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PYDANTIC_DISABLE_PLUGINS, "logfire")
    with pydantic_plugins_off():
        assert current_environ()[PYDANTIC_DISABLE_PLUGINS] == "logfire"
    assert current_environ()[PYDANTIC_DISABLE_PLUGINS] == "logfire"
    monkeypatch.delenv(PYDANTIC_DISABLE_PLUGINS)
    with pytest.raises(RuntimeError), pydantic_plugins_off():
        assert current_environ()[PYDANTIC_DISABLE_PLUGINS] == "__all__"
        raise RuntimeError  # a restore that fails still ends the switch
    assert PYDANTIC_DISABLE_PLUGINS not in current_environ()


def _fp_tags(store: str) -> list[str]:
    with open_store(store) as st:
        return [t for t in st.list_tags() if t.startswith("fp-")]


def test_partial_match_noop_restore_loads_families_but_not_their_parsers(
    store: str, tmp_path: Path
) -> None:
    # A workload changes the whole fingerprint but not generic's scope: a family-tag hit.
    target = _restored(store, tmp_path / "t", "model=m")
    doc = _run(store, target, "model=m")
    assert doc["status"] == "noop"
    # The families that missed are read for their scope keys: vLLM among them.
    assert "artifactd.families.vllm" in doc["loaded"]
    # Family code (the family classes are dataclasses) is the one part of LATER it may load.
    later = LATER - {"artifactd.families.base", "dataclasses"}
    assert _forbidden(doc["loaded"], {*VLLM_PARSERS, *later}) == set()


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


#: The library behind the commands, which click's path loads only for the command
#: that runs: the command modules import it inside each command (pyproject.toml's
#: PLC0415 exception for them), since the app imports every command module.
BEHIND_THE_COMMANDS = (
    "artifactd.families",
    "artifactd.fingerprint",
    "artifactd.restore",
    "artifactd.trust",
    "artifactd.images",
    "artifactd.lint",
    *(h for h in HEAVY if h not in {"click", "pydantic"}),  # the group and option types
    "docker",
    "cryptography",
    "http",  # with ssl and email: only a command that talks HTTP loads them
    "ssl",
)


def test_help_loads_the_commands_but_not_the_library_behind_them() -> None:
    proc = run_artifactd("--help", env=clean_env(), prelude=LOADED)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "restore" in proc.stdout
    loaded = set(proc.stderr.rsplit("\nLOADED ", 1)[1].split())
    assert "artifactd.cli.app" in loaded and "artifactd.cli.stores" in loaded
    behind = {m for m in loaded if m.split(".")[0] in BEHIND_THE_COMMANDS}
    behind |= {m for m in loaded for b in BEHIND_THE_COMMANDS if m == b or m.startswith(b + ".")}
    assert behind == set(), sorted(behind)
