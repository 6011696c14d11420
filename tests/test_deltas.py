"""Compiled-anyway deltas: ``contribute`` in the pod, ``absorb`` and ``verify --candidate`` in CI.

The loop runs with real processes on real stores: a one-family matrix whose
cell command writes ``k-<shape>.cubin`` into ``ARTIFACTD_GENERIC_DIR`` only when
it is not there yet (a compiler on a miss), so a pod's "engine" is the very
command a cell runs (:func:`serve`), and ``status`` judges what it wrote. The
delta store is a repository of the real registry (its own repository, as a
pod's write-only store would be), the promoted store a local layout.

Hostile deltas are published into the delta store as an attacker who can write
there would: escaping members (``tests/hostile.py``), a changed entry of the
promoted artifact, another fingerprint, an unknown or no key under a policy,
an oversized delta. None of their bytes reaches a candidate.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import hostile
import pytest
from conftest import clean_env, run_artifactd
from registry_server import RegistryServer
from test_ci_examples import listed_options, run_help, split_path, used_options
from test_deploy_k8s import DEPLOY, calls_of, env_value, kustomize

from artifactd.build.cells import prompt_text
from artifactd.format.oci import MANIFEST_MEDIA_TYPE, full_tag
from artifactd.stores import open_store
from artifactd.stores.artifacts import read_artifact
from artifactd.trust.keys import generate

WRITE = (
    "import os, pathlib; d = pathlib.Path(os.environ['ARTIFACTD_GENERIC_DIR']); "
    "d.mkdir(parents=True, exist_ok=True); p = d / 'k-{{ shape }}.cubin'; "
    "p.exists() or p.write_bytes(b'ELF {{ shape }}')"
)


def matrix(tmp: Path, shapes: list[str], name: str = "m.yaml") -> Path:
    """A matrix warming ``shapes``: one cell per shape, each "compiling" ``k-<shape>.cubin``."""
    path = tmp / name
    path.write_text(
        "schema_version: 1\nname: deltas\ntarget: {gpu_arch: sm_90a}\nfamilies: [generic]\n"
        f"gpus: 0\naxes:\n  shape: {json.dumps(shapes)}\n"
        f"command: {json.dumps(sys.executable + ' -c ' + json.dumps(WRITE))}\n"
    )
    return path


def cli(*args: str, code: int = 0) -> dict[str, Any]:
    """Run ``artifactd ARGS --json``; check the exit code; return the last JSON line."""
    proc = run_artifactd(*args, "--json", timeout=180)
    assert proc.returncode == code, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return doc


def restore(store: str, target: Path, arch: str = "sm_90a") -> None:
    doc = cli("restore", "--store", store, "--target", str(target), "--gpu-arch", arch)
    assert doc["restored"] == ["generic"], doc


def serve(target: Path, *shapes: str, data: bytes | None = None) -> None:
    """The pod's engine serves ``shapes``: the cell's own command on the restored dir.

    ``data`` replaces what a miss writes (a pod whose compiler differs, or an attacker).
    """
    time.sleep(0.02)  # past the restore's file-clock tick: what is written counts
    for shape in shapes:
        if data is not None:
            (target / "generic" / f"k-{shape}.cubin").write_bytes(data)
            continue
        code = WRITE.replace("{{ shape }}", shape)
        env = clean_env({"ARTIFACTD_GENERIC_DIR": str(target / "generic")})
        subprocess.run([sys.executable, "-c", code], env=env, check=True)


def verdict(target: Path) -> str:
    doc = cli("status", "--target", str(target))
    fam = next(f for f in doc["families"] if f["family"] == "generic")
    verdict: str = fam["verdict"]
    return verdict


def tags(ref: str) -> list[str]:
    with open_store(ref) as st:
        return sorted(st.list_tags())


@pytest.fixture
def built(tmp_path: Path) -> tuple[Path, str]:
    """Shapes A warmed and published into a local layout: (matrix, store)."""
    store = f"oci:{tmp_path / 'store'}"
    m = matrix(tmp_path, ["A"])
    cli("build", str(m), "--store", store)
    return m, store


@pytest.mark.slow
def test_the_loop_a_pods_compile_reaches_the_next_artifact_through_the_gate(
    built: tuple[Path, str], tmp_path: Path, registry: RegistryServer, repo: str
) -> None:
    _, store = built
    deltas = registry.ref(f"{repo}-deltas")
    pod = tmp_path / "pod"
    restore(store, pod)
    serve(pod, "A")
    assert verdict(pod) == "used"
    serve(pod, "B")  # a shape the warm-up never sent
    (pod / "generic" / "stray").mkdir()
    (pod / "generic" / "stray" / "x.cubin").write_bytes(b"no cell makes this")
    assert verdict(pod) == "compiled anyway"

    first = cli("contribute", "--target", str(pod), "--store", deltas)
    assert first["published"] and not first["existed"], first
    assert first["tag"].startswith("delta-") and first["fingerprint_hash"]
    assert [(f["family"], f["files"]) for f in first["families"]] == [("generic", 2)]
    with open_store(store) as st:
        base = read_artifact(st, full_tag(first["fingerprint_hash"]))
    assert base is not None and first["extends"] == base.digest
    # A second pod that compiled the same bytes publishes the same delta: nothing new.
    again = cli("contribute", "--target", str(pod), "--store", deltas)
    assert again["existed"] and again["tag"] == first["tag"] and again["digest"] == first["digest"]
    assert again["bytes_uploaded"] == 0
    assert tags(deltas) == [first["tag"]]
    with open_store(deltas) as st:
        delta = read_artifact(st, first["tag"])
    assert delta is not None and delta.config.kind == "delta"
    assert delta.config.provenance.extends == base.digest
    assert {f.path for f in delta.config.layers[0].files} == {
        "cache/k-B.cubin",
        "cache/stray/x.cubin",
    }

    # The traffic asks for B too: the matrix now warms A and B.
    m2 = matrix(tmp_path, ["A", "B"], "m2.yaml")
    absorbed = cli("absorb", str(m2), "--store", store, "--deltas", deltas)
    assert [(d["tag"], d["accepted"]) for d in absorbed["deltas"]] == [(first["tag"], True)]
    assert absorbed["contributed"] == {"generic": ["cache/k-B.cubin", "cache/stray/x.cubin"]}
    candidate = absorbed["candidate"]
    assert candidate.startswith("candidate-")
    # Not restorable before the gate: the fingerprint's tag still names the base.
    with open_store(store) as st:
        assert st.tag_digest(full_tag(first["fingerprint_hash"])) == base.digest

    kept = tmp_path / "kept"
    gated = cli("verify", str(m2), "--store", store, "--candidate", candidate, "--promote", "rel",
                "--keep-roots", str(kept))  # fmt: skip
    assert gated["gate"]["passed"] and gated["gate"]["promoted"] == "rel", gated
    # --keep-roots keeps the candidate's work to read: the proof run and the gate's run.
    assert {"proof", "gate", "submitted"} <= {p.name for p in kept.iterdir()}
    assert gated["vouched"] == {"generic": ["cache/k-B.cubin"]}
    assert gated["dropped"] == {"generic": ["cache/stray/x.cubin"]}
    with open_store(store) as st:
        promoted = read_artifact(st, full_tag(first["fingerprint_hash"]))
        assert promoted is not None and st.tag_digest("rel") == promoted.digest
    prov = promoted.config.provenance
    assert prov.source == "absorb" and prov.extends == base.digest
    assert prov.deltas == [first["digest"]]
    assert prov.contributed == {"generic": ["cache/k-B.cubin"]}

    fresh = tmp_path / "fresh"
    restore(store, fresh)
    assert sorted(p.name for p in (fresh / "generic").iterdir()) == ["k-A.cubin", "k-B.cubin"]
    serve(fresh, "A", "B")
    assert verdict(fresh) == "used"


def test_nothing_compiled_publishes_nothing_and_exits_0(
    built: tuple[Path, str], tmp_path: Path
) -> None:
    _, store = built
    pod = tmp_path / "pod"
    restore(store, pod)
    serve(pod, "A")
    deltas = tmp_path / "deltas"
    doc = cli("contribute", "--target", str(pod), "--store", f"oci:{deltas}")
    assert not doc["published"] and doc["tag"] is None
    assert "nothing was compiled" in doc["reason"]
    assert not deltas.exists()
    # No restore at all: nothing a delta could extend, still exit 0.
    doc = cli("contribute", "--target", str(tmp_path / "empty"), "--store", f"oci:{deltas}")
    assert not doc["published"] and "no complete restore" in doc["reason"]


def test_no_restore_ever_installs_a_delta(built: tuple[Path, str], tmp_path: Path) -> None:
    """A delta re-tagged as the fingerprint's artifact or a family's scope tag is refused."""
    _, store = built
    pod = tmp_path / "pod"
    restore(store, pod)
    serve(pod, "B")
    doc = cli("contribute", "--target", str(pod), "--store", store)
    with open_store(store) as st:
        ref = st.get_manifest(doc["tag"])
        assert ref is not None
        names = [t for t in st.list_tags() if t.startswith(("fp-", "generic-"))]
        assert len(names) == 2
        st.put_manifest(ref.data, MANIFEST_MEDIA_TYPE, names)
    proc = run_artifactd(
        "restore",
        "--store",
        store,
        "--target",
        str(tmp_path / "new"),
        "--gpu-arch",
        "sm_90a",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["match"] == "miss" and not out["cache_hit"]
    generic = next(f for f in out["plan"]["families"] if f["family"] == "generic")
    assert generic["verdict"] == "miss"
    assert "names a pod's contributed delta, which is never restored" in generic["reason"]
    assert not (tmp_path / "new" / "generic" / "k-B.cubin").exists()


def absorb(m: Path, store: str, deltas: str, *extra: str) -> dict[str, Any]:
    return cli("absorb", str(m), "--store", store, "--deltas", deltas, *extra)


def reasons(doc: dict[str, Any]) -> dict[str, str]:
    return {d["tag"]: d["reason"] for d in doc["deltas"] if not d["accepted"]}


def test_a_delta_that_changes_a_promoted_entry_is_refused(
    built: tuple[Path, str], tmp_path: Path
) -> None:
    m, store = built
    pod = tmp_path / "pod"
    restore(store, pod)
    serve(pod, "A", data=b"ELF evil A")  # rewrites the promoted k-A.cubin
    deltas = f"oci:{tmp_path / 'deltas'}"
    tag = cli("contribute", "--target", str(pod), "--store", deltas)["tag"]
    doc = absorb(m, store, deltas)
    assert "conflict: it would change generic/cache/k-A.cubin" in reasons(doc)[tag]
    assert doc["candidate"] is None and not any(t.startswith("candidate-") for t in tags(store))


def test_two_deltas_that_disagree_the_later_is_refused_by_the_merge_rule(
    built: tuple[Path, str], tmp_path: Path
) -> None:
    m, store = built
    deltas = f"oci:{tmp_path / 'deltas'}"
    published = []
    for i, data in enumerate([b"ELF B one", b"ELF B two"]):
        pod = tmp_path / f"pod{i}"
        restore(store, pod)
        serve(pod, "B", data=data)
        published.append(cli("contribute", "--target", str(pod), "--store", deltas)["tag"])
    doc = absorb(m, store, deltas)
    verdicts = {d["tag"]: d["accepted"] for d in doc["deltas"]}
    assert sorted(verdicts.values()) == [False, True]
    refused = next(t for t, ok in verdicts.items() if not ok)
    assert reasons(doc)[refused].startswith("conflict: generic/cache/k-B.cubin")
    assert doc["candidate"] is not None


def test_another_fingerprint_and_an_oversized_delta_are_refused(
    built: tuple[Path, str], tmp_path: Path
) -> None:
    m, store = built
    other = f"oci:{tmp_path / 'other'}"
    cli("build", str(m), "--store", other, "--gpu-arch", "sm_80")
    deltas = f"oci:{tmp_path / 'deltas'}"
    pod = tmp_path / "pod80"
    restore(other, pod, arch="sm_80")
    serve(pod, "B")
    theirs = cli("contribute", "--target", str(pod), "--store", deltas)["tag"]
    doc = absorb(m, store, deltas)
    assert "built for another fingerprint" in reasons(doc)[theirs]
    assert doc["candidate"] is None

    ours = tmp_path / "pod"
    restore(store, ours)
    serve(ours, "B")
    tag = cli("contribute", "--target", str(ours), "--store", deltas)["tag"]
    doc = absorb(m, store, deltas, "--max-bytes", "3")
    assert reasons(doc)[tag].startswith("size: 5 B of files, over the 3 B cap")
    assert doc["candidate"] is None
    # Over the pod's own cap: nothing is published at all.
    capped = cli(
        "contribute", "--target", str(ours), "--store", f"oci:{tmp_path / 'd2'}", "--max-bytes", "3"
    )
    assert not capped["published"] and "over the 3 B cap" in capped["reason"]


def test_under_a_policy_unsigned_and_unknown_keys_are_refused(
    built: tuple[Path, str], tmp_path: Path
) -> None:
    m, store = built
    ours, evil = generate(tmp_path / "keys" / "pods"), generate(tmp_path / "keys" / "evil")
    deltas = f"oci:{tmp_path / 'deltas'}"
    tagged = {}
    for name, key, shape in [("signed", ours, "B"), ("evil", evil, "C"), ("unsigned", None, "D")]:
        pod = tmp_path / name
        restore(store, pod)
        serve(pod, shape)
        extra = ("--sign-key", key.private) if key is not None else ()
        doc = cli("contribute", "--target", str(pod), "--store", deltas, *extra)
        tagged[name] = doc["tag"]
    doc = absorb(m, store, deltas, "--verify-key", ours.public)
    why = reasons(doc)
    assert set(why) == {tagged["evil"], tagged["unsigned"]}
    assert all(why[t].startswith("untrusted: ") for t in why)
    accepted = next(d for d in doc["deltas"] if d["accepted"])
    assert accepted["tag"] == tagged["signed"] and accepted["signed_by"]
    assert doc["contributed"] == {"generic": ["cache/k-B.cubin"]}


@pytest.mark.parametrize("lying", [False, True], ids=["record", "stream"])
def test_escaping_members_never_leave_staging_nor_reach_a_candidate(
    built: tuple[Path, str], tmp_path: Path, lying: bool
) -> None:
    m, store = built
    deltas = f"oci:{tmp_path / 'deltas'}"
    with open_store(store) as st:
        fp_tag = next(t for t in st.list_tags() if t.startswith("fp-"))
        base = read_artifact(st, fp_tag)
    assert base is not None
    fp = base.config.fingerprint
    evil = [hostile.f(f"generic/cache/{hostile.UP6}/{hostile.PWN}", b"pwned")]
    # The record lists the escaping path, or lies: a benign file over the evil tar.
    listed = "cache/k-Z.cubin" if lying else f"cache/{hostile.UP6}/{hostile.PWN}"
    lay = hostile.layer(evil, files=hostile.entries_of("generic", [hostile.f(listed, b"pwned")]))
    config = hostile.config_doc(fp, [lay])
    config.update(kind="delta", schema_version=2)
    config["fingerprint_hash"] = base.config.fingerprint_hash
    config["layers"][0]["scope_key"] = base.config.layers[0].scope_key
    with open_store(deltas, create=True) as st:
        built_art = hostile.publish(st, fp, tmp_path / "tmp", [lay], config=config)
        ref = st.get_manifest(built_art.tag)
        assert ref is not None
        st.put_manifest(ref.data, MANIFEST_MEDIA_TYPE, ["delta-evil"])
    doc = absorb(m, store, deltas)
    why = reasons(doc)["delta-evil"]
    assert "'..'" in why
    assert why.startswith("refused by the restore's checks (generic): "), why
    assert doc["candidate"] is None
    assert not list(tmp_path.rglob(hostile.PWN)) and not Path("/tmp", hostile.PWN).exists()


def test_the_commands_say_what_they_do(tmp_path: Path) -> None:
    """Human output: contribute's reason, absorb's per-delta table; errors without tracebacks."""
    proc = run_artifactd("contribute", "--target", str(tmp_path), "--store", f"oci:{tmp_path}/d")
    assert proc.returncode == 0 and "no complete restore" in proc.stdout
    proc = run_artifactd(
        "absorb",
        str(matrix(tmp_path, ["A"])),
        "--store",
        f"oci:{tmp_path}/s",
        "--deltas",
        f"oci:{tmp_path}/d",
    )
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("artifactd: error:"), proc.stderr


def test_the_contribute_overlay_runs_a_real_command_line_with_its_own_credentials() -> None:
    """deploy/k8s/overlays/contribute: the sidecar's preStop is a valid `contribute` line."""
    docs = kustomize(DEPLOY / "overlays" / "contribute")
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    ((what, c, argv),) = calls_of(deployment, "contribute")
    assert what == "preStop" and c["restartPolicy"] == "Always"
    path, rest = split_path(argv)
    code, text = run_help(path)
    assert code == 0 and not set(used_options(rest)) - listed_options(text)
    store = rest[rest.index("--store") + 1]
    restored_from = next(d for d in docs if d["kind"] == "ConfigMap")["data"]["store"]
    assert store != restored_from
    secrets = {e["valueFrom"]["secretKeyRef"]["name"] for e in c["env"] if "valueFrom" in e}
    assert secrets == {"artifactd-deltas"}
    assert env_value(c, "ARTIFACTD_SIGN_KEY")
    assert all(m.get("readOnly") for m in c["volumeMounts"])


# --------------------------------------------------------------------------
# The loop with the tiny engine (a real torch.compile'd server, Inductor)
# --------------------------------------------------------------------------

ENGINE = Path(__file__).resolve().parent / "engines" / "tiny_engine.py"


def tiny_matrix(tmp: Path, lengths: list[int], port: int, name: str) -> Path:
    """A one-cell serve matrix for the tiny engine sending prompts of ``lengths`` words."""
    path = tmp / name
    path.write_text(
        "name: tiny-deltas\nfamilies: [inductor]\ngpus: 0\n"
        f"workload:\n  model: tiny-llm\n  engine: {json.dumps(str(ENGINE))}\n"
        "serve:\n  command: >-\n"
        "    {{ python }} {{ engine }} --port {{ port }} --model {{ model }}\n"
        f"  port: {port}\n  ready_timeout_s: 180\n  shutdown_grace_s: 20\n"
        f"  requests:\n    - kind: completions\n      prompt_tokens: {json.dumps(lengths)}\n"
        "      max_tokens: 3\n"
    )
    return path


def pod_serves(target: Path, home: Path, port: int, *lengths: int) -> dict[str, int]:
    """A pod's engine, ``artifactd exec --target T -- tiny_engine``, serving ``lengths`` words.

    Returns the engine's own report (``compiled``, ``cache_hits``: Inductor's counters).
    """
    home.mkdir(parents=True, exist_ok=True)
    time.sleep(0.02)
    argv = [sys.executable, "-m", "artifactd", "exec", "--target", str(target), "--"]
    argv += [sys.executable, str(ENGINE), "--port", str(port), "--model", "tiny-llm"]
    proc = subprocess.Popen(
        argv,
        env=clean_env({"HOME": str(home)}),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with opener.open(f"{url}/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "the engine never came up"
            time.sleep(0.2)
        for n in lengths:
            body = json.dumps({"model": "tiny-llm", "prompt": prompt_text(n), "max_tokens": 3})
            req = urllib.request.Request(  # noqa: S310 - loopback
                f"{url}/v1/completions", body.encode(), {"Content-Type": "application/json"}
            )
            with opener.open(req, timeout=120) as resp:
                assert resp.status == 200
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    line = next(x for x in reversed(out.splitlines()) if x.startswith('{"tiny_engine"'))
    report: dict[str, int] = json.loads(line)["tiny_engine"]
    return report


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.torch
@pytest.mark.slow
def test_the_loop_with_the_tiny_engine(tmp_path: Path) -> None:
    """Shapes A built; a pod serves A and B (B compiles); the delta comes back through the gate."""
    port = free_port()
    a = tiny_matrix(tmp_path, [4], port, "a.yaml")
    store, deltas = f"oci:{tmp_path / 'store'}", f"oci:{tmp_path / 'deltas'}"
    env = clean_env({"HOME": str(tmp_path / "home")})

    def run(*args: str) -> dict[str, Any]:
        proc = run_artifactd(*args, "--json", env=env, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        doc: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        return doc

    run("build", str(a), "--store", store)
    workload = f"model=tiny-llm,engine={ENGINE}"
    pod = tmp_path / "pod"
    assert run("restore", "--store", store, "--target", str(pod), "--workload", workload)[
        "restored"
    ] == ["inductor"]
    report = pod_serves(pod, tmp_path / "home", port, 4, 8)
    assert report["compiled"] >= 1  # the prefill graph of 8 words: shape B
    status = run("status", "--target", str(pod))
    assert status["compiled_anyway"] == ["inductor"]

    delta = run("contribute", "--target", str(pod), "--store", deltas)
    assert delta["published"] and delta["families"][0]["family"] == "inductor"
    ab = tiny_matrix(tmp_path, [4, 8], port, "ab.yaml")
    absorbed = run("absorb", str(ab), "--store", store, "--deltas", deltas)
    assert [d["accepted"] for d in absorbed["deltas"]] == [True], absorbed
    gated = run(
        "verify",
        str(ab),
        "--store",
        store,
        "--candidate",
        absorbed["candidate"],
        "--promote",
        "rel",
    )
    assert gated["gate"]["passed"] and gated["gate"]["promoted"] == "rel"
    assert gated["vouched"]["inductor"]

    fresh = tmp_path / "fresh"
    run("restore", "--store", store, "--target", str(fresh), "--workload", workload)
    report = pod_serves(fresh, tmp_path / "home2", port, 4, 8)
    assert report["compiled"] == 0, report
    status = run("status", "--target", str(fresh))
    assert status["compiled_anyway"] == []
