"""Promotion verifies before it signs; ``--software-from`` is adopted one way, verified.

A promotion (``copy STAGING PROD --sign-key PROD_KEY``) vouches with the
production key for whatever staging holds. Anyone who can push to staging
could otherwise launder an artifact into production: here the attacker's
artifact is an honest harvest pushed unsigned (or half signed) to the real
registry, production is a local OCI layout, and the pods' check is a real
``restore --verify-key``. The same input goes through ``restore`` and
``prefetch`` ``--software-from``: they must adopt the same fingerprint and
refuse the same unsigned source.

``verify --candidate --promote`` is a promotion too: it must promote the
artifact it extends plus exactly the entries its gate vouched for. Here the
candidate is re-pushed after ``absorb`` by someone without a key (a file
added, a promoted file changed or removed, an entry an earlier gate dropped
put back), ``fp-<hash>`` is re-pointed while the proof pass runs, and under
``--verify-key`` the candidate or its base is unsigned or signed by another
key: each is refused before anything is tagged or signed, and what a pod then
restores is checked file by file.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import clean_env
from registry_server import RegistryServer
from test_deltas import WRITE as DELTA_WRITE
from test_trust import PASSWORD, Keys, cli, doc_of, harvest, restore

from artifactd.build.merge import unpack_record
from artifactd.errors import TrustError, UsageError
from artifactd.families import Located, get_family
from artifactd.format.archive import pack_family
from artifactd.format.config import RootFS
from artifactd.format.oci import MANIFEST_MEDIA_TYPE
from artifactd.stores import open_store
from artifactd.stores.artifacts import copy_between, publish, read_artifact, sign_ref
from artifactd.trust.keys import load_private_key, load_public_keys
from artifactd.trust.policy import UNSAFE_NO_VERIFICATION, TrustPolicy
from artifactd.trust.signatures import attached_tag

#: The image the caches were built for: a software field the pod's probe cannot see.
IMAGE = "sha256:" + "ab" * 32
#: Every command here is refused or done in seconds; this is the bound.
LIMIT = 60.0


def ok_clean(proc: subprocess.CompletedProcess[str], code: int) -> None:
    """The documented exit code, and one line, never a traceback or an internal error."""
    assert proc.returncode == code, (proc.returncode, proc.stdout[-800:], proc.stderr[-800:])
    assert "Traceback" not in proc.stderr
    assert "internal" not in proc.stderr and "this is a bug" not in proc.stderr


def tags_of(store: str) -> list[str]:
    with open_store(store) as st:
        return st.list_tags()


def signed_by(store: str, digest: str, key: str) -> bool:
    """Whether ``key`` (a .pub) verifies ``digest`` in ``store``."""
    with open_store(store) as st:
        try:
            TrustPolicy(tuple(load_public_keys([key]))).check(st, digest)
        except TrustError:
            return False
    return True


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    return Keys(tmp_path / "keys")


@pytest.fixture
def staging(registry: RegistryServer, repo: str) -> str:
    return registry.ref(repo)


# --------------------------------------------------------------------------
# copy --sign-key
# --------------------------------------------------------------------------


def test_copy_sign_key_alone_is_a_usage_error_and_touches_nothing(
    staging: str, tmp_path: Path, keys: Keys, caches: dict[str, str]
) -> None:
    harvest(staging, caches)
    prod = tmp_path / "prod"
    for extra, says in [
        ((), "--verify-key"),
        (("--sign-unverified", "--verify-key", keys.one.public), "contradict"),
    ]:
        proc = cli("copy", staging, f"oci:{prod}", "--sign-key", keys.two.private, *extra,
                   timeout=LIMIT)  # fmt: skip
        ok_clean(proc, 2)
        assert says in proc.stderr and "--sign-unverified" in proc.stderr, proc.stderr
        assert not prod.exists()  # nothing written, not even an empty layout
    proc = cli("copy", staging, f"oci:{prod}", "--sign-unverified", timeout=LIMIT)
    ok_clean(proc, 2)
    assert not prod.exists()
    # The library has no default a caller could forget: signing needs a basis.
    with pytest.raises(UsageError, match="needs a basis"):
        copy_between(staging, f"oci:{prod}", None, sign_key=load_private_key(keys.two.private))
    assert not prod.exists()


def test_an_unsigned_artifact_in_staging_gets_no_production_signature(
    staging: str, tmp_path: Path, keys: Keys, caches: dict[str, str]
) -> None:
    evil = harvest(staging, caches)  # pushed by someone without CI's key
    prod = f"oci:{tmp_path / 'prod'}"
    promote = ("--sign-key", keys.two.private, "--verify-key", keys.one.public, "--json")
    proc = cli("copy", staging, prod, *promote, timeout=LIMIT)
    ok_clean(proc, 14)
    assert "not signed" in proc.stderr, proc.stderr
    # Verified before the destination is touched: no tag, no signature, no layout.
    assert not (tmp_path / "prod").exists()
    assert not signed_by(staging, evil["digest"], keys.two.public)
    # One tag at a time, as the CI examples promote: the same.
    for tag in evil["tags"]:
        ok_clean(cli("copy", staging, prod, "--tag", tag, *promote, timeout=LIMIT), 14)
    assert not (tmp_path / "prod").exists()


def test_every_manifest_must_verify_before_any_is_copied_or_signed(
    staging: str, tmp_path: Path, keys: Keys, caches: dict[str, str]
) -> None:
    # CI signed the whole artifact; a family tag beside it is unsigned (re-pointed,
    # or pushed before signing began): the promotion copies nothing.
    pub = harvest(staging, caches)
    fp_tag = f"fp-{pub['fingerprint_hash']}"
    ci = ("--sign-key", keys.one.private, "--sign-unverified")
    ok_clean(cli("sign", f"{staging}:{fp_tag}", *ci, timeout=LIMIT), 0)
    assert len(pub["tags"]) > 1  # the family tags
    prod = f"oci:{tmp_path / 'prod'}"
    promote = ("--sign-key", keys.two.private, "--verify-key", keys.one.public)
    proc = cli("copy", staging, prod, *promote, timeout=LIMIT)
    ok_clean(proc, 14)
    assert not (tmp_path / "prod").exists()
    assert not signed_by(staging, pub["digest"], keys.two.public)
    # Just the signed tag: copied and signed.
    proc = cli("copy", staging, prod, "--tag", fp_tag, *promote, "--json", timeout=LIMIT)
    ok_clean(proc, 0)
    assert tags_of(prod) == sorted([fp_tag, attached_tag(pub["digest"], "sig")])


def test_a_ci_signed_artifact_is_promoted_with_the_production_signature(
    staging: str, tmp_path: Path, keys: Keys, caches: dict[str, str]
) -> None:
    pub = harvest(staging, caches, "--sign-key", keys.one.private)
    prod = f"oci:{tmp_path / 'prod'}"
    proc = cli("copy", staging, prod, "--sign-key", keys.two.private,
               "--verify-key", keys.one.public, "--json", timeout=LIMIT)  # fmt: skip
    ok_clean(proc, 0)
    doc = doc_of(proc)
    digests = set(doc["digests"].values())
    assert set(doc["verified"]) == digests and len(digests) == len(pub["tags"])
    assert set(doc["verified"].values()) == {keys.one.key_id}
    assert doc["signing"]["key_id"] == keys.two.key_id
    assert {s["digest"] for s in doc["signing"]["signed"]} == digests
    for digest in digests:  # the production key in prod only, CI's carried along
        assert signed_by(prod, digest, keys.two.public)
        assert signed_by(prod, digest, keys.one.public)
        assert not signed_by(staging, digest, keys.two.public)
    pods = restore(prod, tmp_path / "pod", "--verify-key", keys.two.public, "--require")
    ok_clean(pods, 0)
    assert doc_of(pods)["status"] == "restored"
    # --verify-key without --sign-key: a verified copy, nothing signed.
    plain = cli("copy", staging, f"oci:{tmp_path / 'mirror'}", "--verify-key", keys.one.public,
                "--json", timeout=LIMIT)  # fmt: skip
    ok_clean(plain, 0)
    assert doc_of(plain)["signing"] is None
    assert not signed_by(f"oci:{tmp_path / 'mirror'}", pub["digest"], keys.two.public)


def test_sign_unverified_is_the_explicit_way_to_vouch_for_unchecked_content(
    staging: str, tmp_path: Path, keys: Keys, caches: dict[str, str]
) -> None:
    pub = harvest(staging, caches)
    prod = f"oci:{tmp_path / 'prod'}"
    proc = cli("copy", staging, prod, "--sign-key", keys.two.private, "--sign-unverified",
               "--json", timeout=LIMIT)  # fmt: skip
    ok_clean(proc, 0)
    assert doc_of(proc)["verified"] == {}
    assert signed_by(prod, pub["digest"], keys.two.public)
    # In the library the opt-out is a named object, not a missing argument.

    assert repr(UNSAFE_NO_VERIFICATION) == "UNSAFE_NO_VERIFICATION"
    result = copy_between(
        staging,
        f"oci:{tmp_path / 'lib'}",
        None,
        trust=UNSAFE_NO_VERIFICATION,
        sign_key=load_private_key(keys.evil.private),
    )
    assert result.signing is not None and result.signing.key_id == keys.evil.key_id


# --------------------------------------------------------------------------
# sign
# --------------------------------------------------------------------------


def test_sign_re_signs_only_what_verifies_or_what_is_explicitly_unverified(
    staging: str, tmp_path: Path, keys: Keys, caches: dict[str, str]
) -> None:
    pub = harvest(staging, caches)
    ref = f"{staging}:fp-{pub['fingerprint_hash']}"
    sig = attached_tag(pub["digest"], "sig")
    # Neither a policy nor the opt-out: exit 2, nothing written.
    proc = cli("sign", ref, "--sign-key", keys.two.private, timeout=LIMIT)
    ok_clean(proc, 2)
    assert "--verify-key" in proc.stderr and "--sign-unverified" in proc.stderr
    # Someone else's unsigned push under a policy: exit 14, nothing written.
    proc = cli("sign", ref, "--sign-key", keys.two.private, "--verify-key", keys.one.public,
               timeout=LIMIT)  # fmt: skip
    ok_clean(proc, 14)
    assert "not signed" in proc.stderr
    assert sig not in tags_of(staging)
    # Published before signing began: the publisher vouches, explicitly.
    first = ("--sign-key", keys.one.private, "--sign-unverified")
    ok_clean(cli("sign", ref, *first, timeout=LIMIT), 0)
    assert signed_by(staging, pub["digest"], keys.one.public)
    # A rotation or a second signer: signed only because the first key verifies it.
    rotate = ("--sign-key", keys.two.private, "--verify-key", keys.one.public, "--json")
    proc = cli("sign", ref, *rotate, timeout=LIMIT)
    ok_clean(proc, 0)
    assert doc_of(proc)["signed"][0]["added"] is True
    assert signed_by(staging, pub["digest"], keys.two.public)
    # A key that did not sign it is no basis: exit 14, the evil key adds nothing.
    proc = cli("sign", ref, "--sign-key", keys.evil.private, "--verify-key", keys.evil.public,
               timeout=LIMIT)  # fmt: skip
    ok_clean(proc, 14)
    assert not signed_by(staging, pub["digest"], keys.evil.public)


# --------------------------------------------------------------------------
# --software-from: one adoption for restore and prefetch
# --------------------------------------------------------------------------


def _software_from(
    staging: str, tmp_path: Path, name: str, source: str, *extra: str
) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """Run restore and prefetch on the same input: the pod's probe, one source artifact."""
    common = ("--store", staging, "--gpu-arch", "sm_90a", "--software-from", source, *extra,
              "--json")  # fmt: skip
    rest = cli("restore", "--target", str(tmp_path / f"{name}-t"), "--require", *common,
               timeout=LIMIT)  # fmt: skip
    pre = cli("prefetch", "--node-store", f"oci:{tmp_path / f'{name}-node'}", *common,
              timeout=LIMIT)  # fmt: skip
    return rest, pre


def test_restore_and_prefetch_adopt_the_same_software_and_refuse_the_same_source(
    staging: str, tmp_path: Path, keys: Keys, caches: dict[str, str]
) -> None:
    pub = harvest(staging, caches, "--image-digest", IMAGE)
    source = f"{staging}:fp-{pub['fingerprint_hash']}"
    policy = ("--verify-key", keys.one.public)
    # Unsigned source under a policy: both refuse, exit 14, nothing installed or fetched.
    rest, pre = _software_from(staging, tmp_path, "unsigned", source, *policy)
    ok_clean(rest, 14)
    ok_clean(pre, 14)
    assert doc_of(rest)["failure"]["kind"] == "untrusted"
    assert "not signed" in pre.stderr, pre.stderr
    assert not (tmp_path / "unsigned-t" / "triton").exists()
    assert not (tmp_path / "unsigned-node").exists() or not tags_of(
        f"oci:{tmp_path / 'unsigned-node'}"
    )
    # Signed: both adopt the source's software (its image digest, which the probe
    # here cannot know) and land on the same fingerprint: the artifact's.
    # CI signs every tag: what `sign --sign-unverified` calls, in process (one CLI run a
    # tag was this test's biggest cost; the sign command has tests of its own).
    ci_key = load_private_key(keys.one.private, password=PASSWORD)
    for tag in pub["tags"]:
        assert sign_ref(f"{staging}:{tag}", ci_key, basis=UNSAFE_NO_VERIFICATION).signed
    for name, extra in [("signed", policy), ("nopolicy", ())]:
        rest, pre = _software_from(staging, tmp_path, name, source, *extra)
        ok_clean(rest, 0)
        ok_clean(pre, 0)
        plan = doc_of(rest)["plan"]
        assert plan["fingerprint_hash"] == pub["fingerprint_hash"]
        assert plan["match"] == "full"
        assert f"fp-{pub['fingerprint_hash']}" in doc_of(pre)["tags"]
    # Without the source, the probe misses that digest: the adoption is what matched.
    blind = cli("restore", "--store", staging, "--target", str(tmp_path / "blind"),
                "--gpu-arch", "sm_90a", "--json", timeout=LIMIT)  # fmt: skip
    assert doc_of(blind)["plan"]["fingerprint_hash"] != pub["fingerprint_hash"]


def test_prefetch_verify_key_reads_its_environment_variable(
    staging: str, tmp_path: Path, keys: Keys, caches: dict[str, str]
) -> None:
    pub = harvest(staging, caches, "--image-digest", IMAGE)
    proc = cli("prefetch", "--store", staging, "--node-store", f"oci:{tmp_path / 'node'}",
               "--gpu-arch", "sm_90a", "--software-from", f"{staging}:fp-{pub['fingerprint_hash']}",
               env={"ARTIFACTD_VERIFY_KEY": f"{keys.two.public} {keys.one.public}"},
               timeout=LIMIT)  # fmt: skip
    ok_clean(proc, 14)
    assert "not signed" in proc.stderr


# --------------------------------------------------------------------------
# verify --candidate: promotion binds to what the gate vouched for
# --------------------------------------------------------------------------
#
# The promoted store is a repository of the real registry; the attacker can push
# there but holds no key. After `absorb` publishes the candidate, they republish it
# under the same candidate-* tag with one change, as consistent as the format
# allows (the layer repacked, its record and tree document rewritten to match,
# provenance untouched): no digest check can tell it from what absorb wrote.


def candidate_matrix(
    tmp: Path, shapes: list[str], name: str, ran: Path, hook: Path | None = None
) -> Path:
    """The deltas loop's matrix (tests/test_deltas.py); each cell also logs its shape to ``ran``.

    ``hook``: a Python file every cell runs after its work.
    """
    code = DELTA_WRITE + "; open(" + repr(str(ran)) + ", 'a').write('{{ shape }} ')"
    if hook is not None:
        code += "; import runpy; runpy.run_path(" + repr(str(hook)) + ")"
    path = tmp / name
    path.write_text(
        "schema_version: 1\nname: deltas\ntarget: {gpu_arch: sm_90a}\nfamilies: [generic]\n"
        f"gpus: 0\naxes:\n  shape: {json.dumps(shapes)}\n"
        f"command: {json.dumps(sys.executable + ' -c ' + json.dumps(code))}\n"
    )
    return path


class Loop:
    """Shapes A and Z built into ``store``; a pod compiled B (and a stray file) as a delta."""

    def __init__(self, store: str, tmp: Path, keys: Keys, *, signed: bool = False) -> None:
        self.store, self.tmp, self.keys = store, tmp, keys
        self.ran = tmp / "ran.log"
        sign = ("--sign-key", keys.one.private) if signed else ()
        built = candidate_matrix(tmp, ["A", "Z"], "built.yaml", self.ran)
        ok_clean(cli("build", str(built), "--store", store, "--json", *sign, timeout=LIMIT), 0)
        self.fp_tag = next(t for t in tags_of(store) if t.startswith("fp-"))
        self.base = tag_digest(store, self.fp_tag)
        pod = tmp / "pod"
        restore(store, pod, "--require")
        serve_shapes(pod, "B")
        (pod / "generic" / "stray").mkdir()
        (pod / "generic" / "stray" / "x.cubin").write_bytes(b"no cell makes this")
        self.deltas = f"oci:{tmp / 'deltas'}"
        ok_clean(cli("contribute", "--target", str(pod), "--store", self.deltas, timeout=LIMIT), 0)
        # The traffic asks for A and B now: Z is still promoted, no cell warms it.
        self.matrix = candidate_matrix(tmp, ["A", "B"], "now.yaml", self.ran)

    def absorb(self, *extra: str) -> str:
        proc = cli("absorb", str(self.matrix), "--store", self.store, "--deltas", self.deltas,
                   "--json", *extra, timeout=LIMIT)  # fmt: skip
        ok_clean(proc, 0)
        doc = doc_of(proc)
        assert doc["contributed"] == {"generic": ["cache/k-B.cubin", "cache/stray/x.cubin"]}
        candidate: str = doc["candidate"]
        return candidate

    def verify(self, candidate: str, *extra: str) -> subprocess.CompletedProcess[str]:
        return cli("verify", str(self.matrix), "--store", self.store, "--candidate", candidate,
                   "--promote", "rel", "--sign-key", self.keys.two.private, *extra,
                   timeout=LIMIT)  # fmt: skip

    def installs(self, name: str) -> dict[str, bytes]:
        """What a pod restoring fp-<hash> from the store gets: generic's files by name."""
        target = self.tmp / name
        ok_clean(restore(self.store, target, "--require"), 0)
        root = target / "generic"
        return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def tag_digest(store: str, tag: str) -> str | None:
    with open_store(store) as st:
        return st.tag_digest(tag)


def serve_shapes(target: Path, *shapes: str) -> None:
    """The pod's engine: the cell's own command on the restored dir (tests/test_deltas.py)."""
    time.sleep(0.02)  # past the restore's file-clock tick: what is written counts
    for shape in shapes:
        env = clean_env({"ARTIFACTD_GENERIC_DIR": str(target / "generic")})
        code = DELTA_WRITE.replace("{{ shape }}", shape)
        subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=LIMIT)


def signatures(store: str) -> list[str]:
    return [t for t in tags_of(store) if t.endswith(".sig")]


def repush(store: str, tag: str, work: Path, change: Callable[[Path], None]) -> str:
    """Republish ``tag`` with ``change`` made to its generic files: consistent, unsigned.

    What someone with push access and no key can do: unpack the layer, change
    the tree, repack it (a new record and tree document that match it), and
    publish the same config (provenance untouched) with that layer under ``tag``.
    """
    fam = get_family("generic")
    with open_store(store) as st:
        art = read_artifact(st, tag)
        assert art is not None
        rec = art.config.layer("generic")
        assert rec is not None
        dirs = unpack_record(st, fam, rec, work / "unpacked")
        change(dirs["cache"])
        comps = {c.name: c for c in fam.components}
        located = [Located(comps[name], path) for name, path in dirs.items()]
        lay = pack_family(fam, located, work / "evil.tar.zst", scope_key=rec.scope_key,
                          scope=rec.scope)  # fmt: skip
        sizes = {"size": lay.size, "unpacked_size": lay.unpacked_size}
        new = rec.model_copy(
            update={"files": lay.files, "digest": lay.digest, "diff_id": lay.diff_id, **sizes}
        )
        cfg = art.config.model_copy(
            update={"layers": [new], "rootfs": RootFS(diff_ids=[new.diff_id])}
        )
        assert cfg.provenance == art.config.provenance
        return publish(st, cfg, {"generic": lay}, work, tags=[tag]).digest


def _add_evil(cache: Path) -> None:
    (cache / "evil.cubin").write_bytes(b"EVIL")


def _change_promoted(cache: Path) -> None:
    (cache / "k-A.cubin").write_bytes(b"EVIL A")


def _remove_promoted(cache: Path) -> None:
    (cache / "k-Z.cubin").unlink()


TAMPERING = {
    "extra-file": (_add_evil, "file(s) no delta contributed: cache/evil.cubin"),
    "changed-file": (_change_promoted, "promoted file(s) changed: cache/k-A.cubin"),
    "removed-entry": (_remove_promoted, "file(s) missing: cache/k-Z.cubin"),
}


@pytest.mark.slow  # the inner loop's slowest: waits out deadlines or runs many processes
@pytest.mark.parametrize("case", sorted(TAMPERING))
def test_a_tampered_candidate_is_refused(
    registry: RegistryServer, repo: str, tmp_path: Path, keys: Keys, case: str
) -> None:
    """A file added, a promoted file changed or removed: refused; its bytes reach nothing."""
    change, says = TAMPERING[case]
    loop = Loop(registry.ref(repo), tmp_path, keys)
    candidate = loop.absorb()
    tampered = repush(loop.store, candidate, tmp_path / "attacker", change)
    assert tag_digest(loop.store, candidate) == tampered
    sigs, ran = signatures(loop.store), loop.ran.read_text()

    proc = loop.verify(candidate, "--json")
    ok_clean(proc, 12)
    assert says in proc.stderr and candidate in proc.stderr, proc.stderr
    # Refused before any cell ran; nothing tagged, published or signed.
    assert loop.ran.read_text() == ran
    assert tag_digest(loop.store, "rel") is None
    assert tag_digest(loop.store, loop.fp_tag) == loop.base
    assert signatures(loop.store) == sigs
    assert not signed_by(loop.store, tampered, keys.two.public)
    base = loop.installs("after")
    assert base == {"k-A.cubin": b"ELF A", "k-Z.cubin": b"ELF Z"}

    # The honest candidate, absorbed again, is promoted: base plus what a cell vouched for.
    assert loop.absorb() == candidate
    proc = loop.verify(candidate, "--json")
    ok_clean(proc, 0)
    doc = doc_of(proc)
    assert doc["gate"]["promoted"] == "rel" and doc["vouched"] == {"generic": ["cache/k-B.cubin"]}
    promoted = tag_digest(loop.store, loop.fp_tag)
    assert promoted not in (loop.base, tampered) and tag_digest(loop.store, "rel") == promoted
    assert promoted is not None and signed_by(loop.store, promoted, keys.two.public)
    want = {"k-A.cubin": b"ELF A", "k-B.cubin": b"ELF B", "k-Z.cubin": b"ELF Z"}
    assert loop.installs("fp") == want


@pytest.mark.slow  # the inner loop's slowest: waits out deadlines or runs many processes
def test_an_entry_a_gate_dropped_does_not_come_back_in_the_next_candidate(
    registry: RegistryServer, repo: str, tmp_path: Path, keys: Keys
) -> None:
    """The gate dropped stray/x.cubin; the next candidate carries it again, listed nowhere."""
    loop = Loop(registry.ref(repo), tmp_path, keys)
    first = loop.absorb()
    ok_clean(loop.verify(first), 0)
    promoted = tag_digest(loop.store, loop.fp_tag)
    assert "stray/x.cubin" not in loop.installs("first")
    assert tag_digest(loop.store, "rel") == promoted
    # Another pod compiles C; its candidate extends the promoted artifact.
    pod = tmp_path / "pod2"
    restore(loop.store, pod, "--require")
    serve_shapes(pod, "C")
    deltas = f"oci:{tmp_path / 'deltas2'}"
    ok_clean(cli("contribute", "--target", str(pod), "--store", deltas, timeout=LIMIT), 0)
    loop.matrix = candidate_matrix(tmp_path, ["A", "B", "C"], "next.yaml", loop.ran)
    proc = cli("absorb", str(loop.matrix), "--store", loop.store, "--deltas", deltas, "--json",
               timeout=LIMIT)  # fmt: skip
    ok_clean(proc, 0)
    second = doc_of(proc)["candidate"]

    def resurrect(cache: Path) -> None:
        (cache / "stray").mkdir()
        (cache / "stray" / "x.cubin").write_bytes(b"no cell makes this")

    repush(loop.store, second, tmp_path / "attacker", resurrect)
    sigs = signatures(loop.store)
    proc = loop.verify(second)
    ok_clean(proc, 12)
    assert "file(s) no delta contributed: cache/stray/x.cubin" in proc.stderr, proc.stderr
    assert tag_digest(loop.store, loop.fp_tag) == promoted
    assert signatures(loop.store) == sigs
    assert tag_digest(loop.store, "rel") == promoted
    assert "stray/x.cubin" not in loop.installs("second")


@pytest.mark.slow  # the inner loop's slowest: waits out deadlines or runs many processes
def test_under_a_policy_verify_gates_only_a_signed_candidate_on_a_signed_base(
    registry: RegistryServer, repo: str, tmp_path: Path, keys: Keys
) -> None:
    loop = Loop(registry.ref(repo), tmp_path, keys, signed=True)
    policy = ("--verify-key", keys.one.public)
    # Unsigned (absorb without --sign-key): refused before the gate runs. First, while no
    # candidate is signed: a later absorb within the same second publishes the same bytes
    # as a signed one, and those bytes are rightly trusted.
    ran = loop.ran.read_text()
    proc = cli("absorb", str(loop.matrix), "--store", loop.store, "--deltas", loop.deltas,
               "--json", timeout=LIMIT)  # fmt: skip
    ok_clean(proc, 0)
    proc = loop.verify(doc_of(proc)["candidate"], *policy)
    ok_clean(proc, 14)
    assert "is not signed" in proc.stderr, proc.stderr
    assert loop.ran.read_text() == ran and tag_digest(loop.store, "rel") is None

    # absorb signs what it publishes with --sign-key.
    proc = cli("absorb", str(loop.matrix), "--store", loop.store, "--deltas", loop.deltas,
               "--sign-key", keys.one.private, "--json", timeout=LIMIT)  # fmt: skip
    ok_clean(proc, 0)
    doc = doc_of(proc)
    candidate, digest = doc["candidate"], doc["digest"]
    assert doc["signing"]["key_id"] == keys.one.key_id
    assert [s["digest"] for s in doc["signing"]["signed"]] == [digest]
    assert signed_by(loop.store, digest, keys.one.public)

    # Republished by someone without the key (an extra file, consistent): unsigned.
    tampered = repush(loop.store, candidate, tmp_path / "unsigned", _add_evil)
    # ... or signed with their own key.
    evil = repush(loop.store, candidate, tmp_path / "evil", _add_evil)
    assert evil == tampered  # the same bytes: one manifest, now signed by the wrong key
    ok_clean(cli("sign", f"{loop.store}:{candidate}", "--sign-key", keys.evil.private,
                 "--sign-unverified", timeout=LIMIT), 0)  # fmt: skip
    sigs, ran = signatures(loop.store), loop.ran.read_text()
    for extra, says in [(policy, "does not verify"), (("--verify-key", keys.two.public), "")]:
        proc = loop.verify(candidate, *extra)
        ok_clean(proc, 14)
        assert says in proc.stderr and candidate in proc.stderr, proc.stderr
    assert loop.ran.read_text() == ran  # refused before the gate ran
    assert tag_digest(loop.store, "rel") is None
    assert tag_digest(loop.store, loop.fp_tag) == loop.base
    assert signatures(loop.store) == sigs

    # Signed by absorb: gated, promoted, signed by the gate's key.
    ok_clean(cli("absorb", str(loop.matrix), "--store", loop.store, "--deltas", loop.deltas,
                 "--sign-key", keys.one.private, timeout=LIMIT), 0)  # fmt: skip
    proc = loop.verify(candidate, *policy, "--json")
    ok_clean(proc, 0)
    doc = doc_of(proc)
    assert doc["signed_by"] == keys.one.key_id and doc["gate"]["promoted"] == "rel"
    promoted = tag_digest(loop.store, loop.fp_tag)
    assert promoted is not None and signed_by(loop.store, promoted, keys.two.public)
    assert tag_digest(loop.store, "rel") == promoted
    assert "evil.cubin" not in loop.installs("fp")


def test_under_a_policy_an_unsigned_promoted_artifact_is_not_gated(
    registry: RegistryServer, repo: str, tmp_path: Path, keys: Keys
) -> None:
    """What is promoted is rebuilt from fp-<hash>: an unsigned base is refused, with or without
    --candidate, before any cell runs."""
    loop = Loop(registry.ref(repo), tmp_path, keys)
    candidate = loop.absorb("--sign-key", keys.one.private)
    ran = loop.ran.read_text()
    proc = loop.verify(candidate, "--verify-key", keys.one.public)
    ok_clean(proc, 14)
    assert "is not signed" in proc.stderr and loop.fp_tag in proc.stderr, proc.stderr
    proc = cli("verify", str(loop.matrix), "--store", loop.store, "--promote", "rel",
               "--verify-key", keys.one.public, timeout=LIMIT)  # fmt: skip
    ok_clean(proc, 14)
    assert "is not signed" in proc.stderr, proc.stderr
    assert loop.ran.read_text() == ran and tag_digest(loop.store, "rel") is None


def test_a_proof_run_on_another_artifact_vouches_for_nothing(
    registry: RegistryServer, repo: str, tmp_path: Path, keys: Keys
) -> None:
    """fp-<hash> is re-pointed while the proof pass runs: the candidate is refused."""
    loop = Loop(registry.ref(repo), tmp_path, keys)
    candidate = loop.absorb()
    # Another full artifact for the fingerprint (the base plus a file), pushed aside.
    other = repush(loop.store, loop.fp_tag, tmp_path / "other", _add_evil)
    with open_store(loop.store) as st:
        base, theirs = st.get_manifest(str(loop.base)), st.get_manifest(other)
        assert base is not None and theirs is not None
        st.put_manifest(base.data, MANIFEST_MEDIA_TYPE, [loop.fp_tag])
        moved = theirs.data
    assert tag_digest(loop.store, loop.fp_tag) == loop.base
    # The first proof cell re-points fp-<hash> at it, as a racing pusher would.
    armed = tmp_path / "armed"
    armed.write_bytes(moved)
    host, name = loop.store.split("/", 1)
    hook = tmp_path / "hook.py"
    hook.write_text(
        "import pathlib, urllib.request\n"
        f"armed = pathlib.Path({str(armed)!r})\n"
        "if armed.exists():\n"
        f"    req = urllib.request.Request('http://{host}/v2/{name}/manifests/{loop.fp_tag}',\n"
        f"        data=armed.read_bytes(), method='PUT',\n"
        f"        headers={{'Content-Type': {MANIFEST_MEDIA_TYPE!r}}})\n"
        "    urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req).close()\n"
        "    armed.unlink()\n"
    )
    loop.matrix = candidate_matrix(tmp_path, ["A", "B"], "racing.yaml", loop.ran, hook)
    sigs = signatures(loop.store)
    proc = loop.verify(candidate)
    ok_clean(proc, 12)
    assert not armed.exists()  # the race happened
    assert f"restored {other}, not {loop.base}" in proc.stderr, proc.stderr
    assert tag_digest(loop.store, "rel") is None and signatures(loop.store) == sigs
    assert tag_digest(loop.store, loop.fp_tag) == other  # the racer's, not a promotion
