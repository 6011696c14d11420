"""Promotion verifies before it signs; ``--software-from`` is adopted one way, verified.

A promotion (``copy STAGING PROD --sign-key PROD_KEY``) vouches with the
production key for whatever staging holds. Anyone who can push to staging
could otherwise launder an artifact into production: here the attacker's
artifact is an honest harvest pushed unsigned (or half signed) to the real
registry, production is a local OCI layout, and the pods' check is a real
``restore --verify-key``. The same input goes through ``restore`` and
``prefetch`` ``--software-from``: they must adopt the same fingerprint and
refuse the same unsigned source.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from registry_server import RegistryServer
from test_trust import PASSWORD, Keys, cli, doc_of, harvest, restore

from artifactd.errors import TrustError, UsageError
from artifactd.stores import open_store
from artifactd.stores.artifacts import copy_between
from artifactd.trust.keys import load_private_key, load_public_keys
from artifactd.trust.policy import UNSAFE_NO_VERIFICATION, TrustPolicy, sign_ref
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
    from artifactd.trust.policy import UNSAFE_NO_VERIFICATION

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
