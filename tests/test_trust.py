"""Trust: keys, cosign-format signatures and provenance, verified fail-closed on a real registry.

Signatures are checked three ways: by artifactd's verifier, by ``openssl``
(an independent implementation of ECDSA over the exact payload bytes) and,
for the format, against signatures cosign itself made (``fixtures/cosign/``,
from the containers/image and sigstore-rs test suites, Apache-2.0: each
directory's SOURCE.txt). ``skopeo`` reads the ``.sig`` and ``.att`` manifests.
The attacker's moves are made with artifactd's own publisher and the store
API, as someone with push rights to the repository would make them.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import stat
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import zstandard
from cachetrees import build_caches, make_generic_tree
from conftest import clean_env, run_artifactd
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from faultproxy import FaultProxy
from registry_server import RegistryServer, start_registry

from artifactd import __version__
from artifactd.errors import TrustError
from artifactd.fingerprint.model import from_raw
from artifactd.fingerprint.probe import probe_request
from artifactd.format.imagemanifest import Descriptor, ImageManifest
from artifactd.hashing import digest_of
from artifactd.images.append import write_layout
from artifactd.restore.resolve import plan_restore
from artifactd.restore.source import StoreSource
from artifactd.stores import open_store
from artifactd.stores.artifacts import open_artifact
from artifactd.stores.layout import LayoutStore
from artifactd.stores.nodestore import gc
from artifactd.stores.registry import RegistryStore, parse_registry_ref
from artifactd.trust.inspection import examine
from artifactd.trust.keys import KeyFileError, generate, load_private_key, load_public_keys
from artifactd.trust.policy import UNSAFE_NO_VERIFICATION, TrustPolicy
from artifactd.trust.signatures import (
    ANN_PREDICATE_TYPE,
    ANN_SIGNATURE,
    DSSE_MEDIA_TYPE,
    MAX_LAYERS,
    SIMPLESIGNING_MEDIA_TYPE,
    _write_attached,
    attached_tag,
    attest,
    pae,
    read_attestations,
    signing_payload,
)

COSIGN = Path(__file__).parent / "fixtures" / "cosign"
PASSWORD = "correct horse battery staple"


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


class Keys:
    """Two key pairs (the publisher's, and a second for rotation) and an attacker's."""

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.one = generate(root / "one", password=PASSWORD)
        self.two = generate(root / "two")
        self.evil = generate(root / "evil")

    def secrets(self) -> list[str]:
        """Every string that must never be printed: key bodies and the password."""
        out = [PASSWORD]
        for pair in (self.one, self.two, self.evil):
            text = Path(pair.private).read_text()
            out += [line for line in text.splitlines() if line and "-----" not in line]
        return out


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    return Keys(tmp_path / "keys")


def cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    full = clean_env({"ARTIFACTD_KEY_PASSWORD": PASSWORD, **(env or {})})
    return run_artifactd(*args, env=full, cwd=cwd, timeout=timeout)


def doc_of(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return doc


def harvest(store: str, environ: dict[str, str], *extra: str) -> dict[str, Any]:
    proc = cli("harvest", "--store", store, "--gpu-arch", "sm_90a", "--json", *extra, env=environ)
    assert proc.returncode == 0, proc.stderr
    return doc_of(proc)


def restore(
    store: str, target: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return cli(
        "restore",
        "--store",
        store,
        "--target",
        str(target),
        "--gpu-arch",
        "sm_90a",
        "--json",
        *extra,
        env=env,
    )


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".artifactd" not in p.parts
    }


# --------------------------------------------------------------------------
# Keys
# --------------------------------------------------------------------------


def test_keygen_writes_a_p256_pair_private_0600_encrypted_with_the_password(
    tmp_path: Path,
) -> None:
    proc = cli("keygen", "--out", str(tmp_path / "ci" / "signing"), "--json")
    assert proc.returncode == 0, proc.stderr
    pair = doc_of(proc)
    key, pub = Path(pair["private"]), Path(pair["public"])
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert key.read_text().startswith("-----BEGIN ENCRYPTED PRIVATE KEY-----")
    assert pub.read_text().startswith("-----BEGIN PUBLIC KEY-----")
    assert pair["encrypted"] is True
    loaded = load_private_key(str(key), password=PASSWORD)
    assert loaded.id == pair["key_id"] == load_public_keys([str(pub)])[0].id
    assert loaded.key.curve.name == "secp256r1"
    # openssl reads both halves as the standard formats they claim to be.
    out = subprocess.run(
        ["openssl", "pkey", "-pubin", "-in", str(pub), "-noout", "-text"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "prime256v1" in out or "P-256" in out

    again = cli("keygen", "--out", str(tmp_path / "ci" / "signing"))
    assert again.returncode == 2 and "exists" in again.stderr
    assert key.read_text() == Path(pair["private"]).read_text()  # not replaced


def test_key_errors_name_the_spec_never_the_key(tmp_path: Path, keys: Keys) -> None:
    with pytest.raises(KeyFileError, match="password"):
        load_private_key(keys.one.private, password="wrong")
    with pytest.raises(KeyFileError, match="encrypted and no password"):
        load_private_key(keys.one.private, password="", environ={})
    with pytest.raises(KeyFileError, match="holds a private key"):
        load_public_keys([keys.two.private])
    with pytest.raises(KeyFileError, match="NOPE is not set"):
        load_private_key("env://NOPE", environ={})
    with pytest.raises(KeyFileError, match="no PEM PUBLIC KEY"):
        load_public_keys([str(_write(tmp_path / "junk.pub", "not a key"))])
    with pytest.raises(KeyFileError, match="cannot read it"):
        load_public_keys([str(tmp_path / "missing.pub")])
    # env://NAME holds the PEM itself (a Kubernetes Secret as an env var).
    pem = Path(keys.two.private).read_text()
    assert load_private_key("env://K", environ={"K": pem}).id == keys.two.key_id
    # The CLI: exit 2, one line naming the file, nothing of the key.
    proc = cli(
        "sign",
        "oci:/nowhere:tag",
        "--sign-key",
        keys.one.private,
        "--sign-unverified",
        env={"ARTIFACTD_KEY_PASSWORD": "wrong"},
    )
    assert proc.returncode == 2, proc.stderr
    assert keys.one.private in proc.stderr and "Traceback" not in proc.stderr
    for secret in keys.secrets():
        assert secret not in proc.stdout + proc.stderr


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# --------------------------------------------------------------------------
# The format: signatures cosign made, and an independent verifier
# --------------------------------------------------------------------------


def _cosign_vector(name: str) -> tuple[Path, bytes, str]:
    d = COSIGN / name
    return d / "pub.pem", (d / "payload.json").read_bytes(), (d / "sig.b64").read_text().strip()


def _plant_signature(store_ref: str, digest: str, payload: bytes, signature_b64: str) -> None:
    """Push a ``.sig`` manifest holding this payload and signature, as cosign lays it out."""
    with open_store(store_ref, create=True) as store:
        layer = Descriptor(
            media_type=SIMPLESIGNING_MEDIA_TYPE,
            digest=digest_of(payload),
            size=len(payload),
            annotations={ANN_SIGNATURE: signature_b64},
        )
        _write_attached(store, digest, "sig", [layer], {layer.digest: payload})


@pytest.mark.parametrize(
    "vector",
    ["ci-cosign-valid", "ci-cosign-valid-2-sig2", "ci-cosign-key-rekor", "rs-busybox"],
)
def test_signatures_cosign_made_verify_in_the_registry(
    registry: RegistryServer, repo: str, tmp_path: Path, vector: str
) -> None:
    pub, payload, sig = _cosign_vector(vector)
    digest = json.loads(payload)["critical"]["image"]["docker-manifest-digest"]
    ref = registry.ref(f"{repo}-{vector}")
    _plant_signature(ref, digest, payload, sig)
    policy = TrustPolicy(tuple(load_public_keys([str(pub)])))
    with open_store(ref) as store:
        assert policy.check(store, digest) == policy.key_ids[0]
        # The same signature does not vouch for any other manifest.
        other = "sha256:" + "0" * 64
        _plant_signature(ref, other, payload, sig)
        with pytest.raises(TrustError) as err:
            policy.check(store, other)
        assert err.value.reason == "wrong_digest"


def test_a_signature_cosign_made_with_another_key_is_refused(
    registry: RegistryServer, repo: str, tmp_path: Path
) -> None:
    pub, _, _ = _cosign_vector("ci-cosign-valid")
    _, payload, sig = _cosign_vector("neg-ci-unknown-cosign-key")
    digest = json.loads(payload)["critical"]["image"]["docker-manifest-digest"]
    _plant_signature(registry.ref(repo), digest, payload, sig)
    with open_store(registry.ref(repo)) as store, pytest.raises(TrustError) as err:
        TrustPolicy(tuple(load_public_keys([str(pub)]))).check(store, digest)
    assert err.value.reason == "unknown_key"
    assert "another key" in err.value.message


def test_our_payload_is_byte_for_byte_the_one_cosign_writes() -> None:
    for vector in ("ci-cosign-valid", "rs-busybox", "ci-cosign-key-rekor"):
        _, payload, _ = _cosign_vector(vector)
        crit = json.loads(payload)["critical"]
        ours = signing_payload(
            crit["image"]["docker-manifest-digest"], crit["identity"]["docker-reference"]
        )
        assert ours == payload, vector


def test_a_dsse_envelope_cosign_made_verifies_with_our_pae() -> None:
    d = COSIGN / "dsse-cosign-blobSLSAProvenanceSignature"
    envelope = json.loads((d / "envelope.json").read_bytes())
    body = base64.b64decode(envelope["payload"])
    sig = base64.b64decode(envelope["signatures"][0]["sig"])
    (key,) = load_public_keys([str(d / "pub.pem")])
    key.key.verify(sig, pae(envelope["payloadType"], body), ec.ECDSA(hashes.SHA256()))

    with pytest.raises(InvalidSignature):
        key.key.verify(sig, pae(envelope["payloadType"], body + b" "), ec.ECDSA(hashes.SHA256()))


def test_openssl_verifies_what_artifactd_signed_and_skopeo_reads_it(
    registry: RegistryServer, repo: str, tmp_path: Path, keys: Keys, caches: dict[str, str]
) -> None:
    ref = registry.ref(repo)
    pub = harvest(ref, caches, "--sign-key", keys.one.private)
    digest = pub["digest"]
    raw = subprocess.run(
        [
            "skopeo",
            "inspect",
            "--raw",
            "--tls-verify=false",
            f"docker://{ref}:{attached_tag(digest, 'sig')}",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    manifest = json.loads(raw)
    assert manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    (layer,) = manifest["layers"]
    assert layer["mediaType"] == SIMPLESIGNING_MEDIA_TYPE
    with open_store(ref) as store, store.open_blob(layer["digest"], layer["size"]) as f:
        payload = f.read()
    assert json.loads(payload)["critical"]["image"]["docker-manifest-digest"] == digest
    assert json.loads(payload)["critical"]["identity"]["docker-reference"] == ref
    (tmp_path / "payload").write_bytes(payload)
    (tmp_path / "sig.der").write_bytes(base64.b64decode(layer["annotations"][ANN_SIGNATURE]))
    ok = subprocess.run(
        [
            "openssl",
            "dgst",
            "-sha256",
            "-verify",
            keys.one.public,
            "-signature",
            str(tmp_path / "sig.der"),
            str(tmp_path / "payload"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert ok.returncode == 0 and "Verified OK" in ok.stdout, ok.stdout + ok.stderr
    bad = subprocess.run(
        [
            "openssl",
            "dgst",
            "-sha256",
            "-verify",
            keys.two.public,
            "-signature",
            str(tmp_path / "sig.der"),
            str(tmp_path / "payload"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode != 0
    # Every family manifest is signed too.
    with open_store(ref) as store:
        for tag in pub["tags"][1:]:
            fam_digest = store.tag_digest(tag)
            assert fam_digest and store.tag_digest(attached_tag(fam_digest, "sig"))


# --------------------------------------------------------------------------
# Restore: verified before anything is downloaded, fail-closed
# --------------------------------------------------------------------------


def test_sign_and_verify_round_trip_and_no_op(
    registry: RegistryServer, repo: str, tmp_path: Path, keys: Keys, caches: dict[str, str]
) -> None:
    ref = registry.ref(repo)
    pub = harvest(ref, caches, "--sign-key", keys.one.private)
    target = tmp_path / "cache"
    proc = restore(ref, target, "--verify-key", keys.one.public, "--require")
    assert proc.returncode == 0, proc.stderr
    doc = doc_of(proc)
    assert doc["status"] == "restored"
    assert {f["family"] for f in doc["plan"]["families"] if f["verdict"] == "hit"} == {
        "triton",
        "generic",
    }
    marker = json.loads((target / ".artifactd" / "restored.json").read_text())
    assert {f["signed_by"] for f in marker["families"].values()} == {keys.one.key_id}
    assert all(f["artifact"] == pub["digest"] for f in marker["families"].values())
    # A second run under the same key is a no-op; under a key that never signed
    # it, the marker's record does not satisfy the policy: resolved, refused.
    again = doc_of(restore(ref, target, "--verify-key", keys.one.public))
    assert again["status"] == "noop"
    other = doc_of(restore(ref, target, "--verify-key", keys.two.public))
    assert other["status"] == "failed" and other["failure"]["kind"] == "untrusted"


def test_refusal_comes_before_any_of_the_artifacts_blobs_is_read(
    registry: RegistryServer, repo: str, tmp_path: Path, keys: Keys, caches: dict[str, str]
) -> None:
    ref = registry.ref(repo)
    pub = harvest(ref, caches, "--sign-key", keys.one.private)
    opened: list[str] = []

    class Recording(RegistryStore):
        def open_blob(self, digest: str, size: int) -> Any:
            opened.append(digest)
            return super().open_blob(digest, size)

        def consume_blob(self, digest: str, size: int, consume: Any) -> Any:
            opened.append(digest)  # every read of a registry's blob comes here
            return super().consume_blob(digest, size, consume)

    local = from_raw(probe_request(gpu_arch="sm_90a"))
    with Recording(parse_registry_ref(ref)) as store:
        found = store.get_manifest(pub["digest"])
        assert found is not None
        manifest = json.loads(found.data)
        artifact_blobs = {manifest["config"]["digest"], *(x["digest"] for x in manifest["layers"])}
        with pytest.raises(TrustError):
            plan_restore(
                StoreSource(store),
                local,
                tmp_path / "t",
                trust=TrustPolicy(tuple(load_public_keys([keys.two.public]))),
            )
        assert opened, "the signature payload is read"
        assert not artifact_blobs & set(opened)
        # The control: the same plan under the right key reads the config.
        opened.clear()
        plan = plan_restore(
            StoreSource(store),
            local,
            tmp_path / "t",
            trust=TrustPolicy(tuple(load_public_keys([keys.one.public]))),
        )
        assert plan.match == "full" and manifest["config"]["digest"] in opened


def test_a_registry_dying_during_the_check_is_unreachable_not_untrusted(
    registry: RegistryServer, repo: str, tmp_path: Path, keys: Keys, caches: dict[str, str]
) -> None:
    pub = harvest(registry.ref(repo), caches, "--sign-key", keys.one.private)
    with open_store(registry.ref(repo)) as store:
        found = store.get_manifest(attached_tag(pub["digest"], "sig"))
        assert found is not None
        payload = json.loads(found.data)["layers"][0]["digest"]
    with FaultProxy(registry.host) as proxy:
        # Every download of the signature's payload is cut: the registry answers
        # the manifest lookups, then goes away. That is an outage (exit 3 with
        # --require), not a verdict on the signature; nothing is installed.
        proxy.cut_blobs(0, digests=[payload])
        proc = restore(
            proxy.ref(repo), tmp_path / "t", "--verify-key", keys.one.public, "--require"
        )
        assert proc.returncode == 3, proc.stderr
        doc = doc_of(proc)
        assert doc["failure"]["kind"] == "unreachable" and doc["status"] == "failed"
        assert not (tmp_path / "t").exists() or not tree_bytes(tmp_path / "t")
        assert proxy.blob_gets([payload])
        # A payload that arrives with other bytes is a bad signature, though.
        proxy.clear()
        proxy.corrupt_blobs(digests=[payload])
        doc = doc_of(restore(proxy.ref(repo), tmp_path / "u", "--verify-key", keys.one.public))
        assert doc["failure"]["kind"] == "untrusted" and doc["failure"]["reason"] == "malformed"


def _attacker_publishes(ref: str, tmp_path: Path, caches: dict[str, str]) -> dict[str, Any]:
    """Someone with push rights re-points the tags at an artifact of their own making."""
    evil = build_caches(tmp_path / "evil-build")
    shutil.rmtree(Path(evil["ARTIFACTD_GENERIC_DIR"]))
    make_generic_tree(Path(evil["ARTIFACTD_GENERIC_DIR"]))  # other bytes, same paths
    return harvest(ref, evil)


def test_tampered_artifacts_are_refused_and_the_good_cache_stays(
    registry: RegistryServer, repo: str, tmp_path: Path, keys: Keys, caches: dict[str, str]
) -> None:
    ref = registry.ref(repo)
    good = harvest(ref, caches, "--sign-key", keys.one.private)
    target = tmp_path / "cache"
    assert doc_of(restore(ref, target, "--verify-key", keys.one.public))["status"] == "restored"
    before = tree_bytes(target)
    marker = (target / ".artifactd" / "restored.json").read_bytes()

    # 1. Tags re-pointed at the attacker's manifest, unsigned.
    evil = _attacker_publishes(ref, tmp_path, caches)
    assert evil["digest"] != good["digest"]
    fresh = tmp_path / "fresh"
    for attempt in range(3):
        if attempt == 1:  # 2. ... signed with the attacker's own key.
            assert (
                cli(
                    "sign",
                    f"{ref}@{evil['digest']}",
                    "--sign-key",
                    keys.evil.private,
                    "--sign-unverified",
                ).returncode
                == 0
            )
        if attempt == 2:  # 3. ... with the genuine signature copied onto it.
            with open_store(ref) as store:
                good_sig = store.get_manifest(attached_tag(good["digest"], "sig"))
                assert good_sig is not None
                store.put_manifest(
                    good_sig.data, good_sig.media_type, [attached_tag(evil["digest"], "sig")]
                )
        for tgt in (target, fresh):
            proc = restore(ref, tgt, "--verify-key", keys.one.public)
            doc = doc_of(proc)
            assert proc.returncode == 0 and doc["status"] == "failed", doc
            assert doc["failure"]["kind"] == "untrusted"
            with_require = restore(ref, tgt, "--verify-key", keys.one.public, "--require")
            assert with_require.returncode == 14, with_require.stderr
        expected = ["is not signed", "does not verify with any", "is for another digest"][attempt]
        assert expected in doc["failure"]["message"], doc["failure"]["message"]
        reason = ["unsigned", "unknown_key", "wrong_digest"][attempt]
        assert doc["failure"]["reason"] == reason
        assert tree_bytes(target) == before
        assert (target / ".artifactd" / "restored.json").read_bytes() == marker
        assert not fresh.exists() or not tree_bytes(fresh)
    # Without a policy the attacker's artifact would have been installed: the
    # refusal above is the policy's doing, not a broken artifact.
    assert doc_of(restore(ref, tmp_path / "unchecked"))["status"] == "restored"


def test_key_rotation_with_two_keys(
    registry: RegistryServer, repo: str, tmp_path: Path, keys: Keys, caches: dict[str, str]
) -> None:
    ref = registry.ref(repo)
    pub = harvest(ref, caches, "--sign-key", keys.one.private)
    both = ("--verify-key", keys.one.public, "--verify-key", keys.two.public)
    # Pods trust old and new; the artifact is signed with the old key only.
    assert doc_of(restore(ref, tmp_path / "a", *both))["status"] == "restored"
    assert (
        doc_of(restore(ref, tmp_path / "b", "--verify-key", keys.two.public))["status"] == "failed"
    )
    # The publisher adds the new key's signature; signing twice adds nothing.
    for added in (True, False):
        signed = doc_of(
            cli(
                "sign",
                f"{ref}:fp-{pub['fingerprint_hash']}",
                "--sign-key",
                keys.two.private,
                "--verify-key",
                keys.one.public,
                "--json",
            )
        )
        assert signed["signed"][0]["added"] is added
    with open_store(ref) as store:
        sig = store.get_manifest(attached_tag(pub["digest"], "sig"))
        assert sig is not None and len(json.loads(sig.data)["layers"]) == 2
    # Then pods drop the old key. Family manifests were signed with the old key only,
    # the whole artifact with both: a full match needs only the whole artifact's.
    done = doc_of(restore(ref, tmp_path / "c", "--verify-key", keys.two.public))
    assert done["status"] == "restored", done
    # ARTIFACTD_VERIFY_KEY holds several specs, whitespace-separated.
    env_doc = doc_of(
        restore(
            ref,
            tmp_path / "d",
            env={"ARTIFACTD_VERIFY_KEY": f"{keys.evil.public} {keys.two.public}"},
        )
    )
    assert env_doc["status"] == "restored"


def test_copy_to_a_second_registry_keeps_signatures_verifiable(
    registry: RegistryServer, repo: str, tmp_path: Path, keys: Keys, caches: dict[str, str]
) -> None:
    ref = registry.ref(repo)
    harvest(ref, caches, "--sign-key", keys.one.private, "--family", "triton")
    second = start_registry(tmp_path / "second-registry")
    try:
        dst = second.ref("prod/caches")
        proc = cli("copy", ref, dst, "--json")
        assert proc.returncode == 0, proc.stderr
        copied = doc_of(proc)
        assert len(copied["attached"]) == 2  # the artifact's and the family manifest's .sig
        assert (
            doc_of(restore(dst, tmp_path / "a", "--verify-key", keys.one.public))["status"]
            == "restored"
        )
        # A promotion signs with the production key too; both verify afterwards.
        promote = ("--sign-key", keys.two.private, "--verify-key", keys.one.public)
        proc = cli("copy", ref, dst, *promote, "--json")
        assert doc_of(proc)["signing"]["key_id"] == keys.two.key_id
        for key in (keys.one.public, keys.two.public):
            assert (
                doc_of(restore(dst, tmp_path / f"b{key[-5]}", "--verify-key", key))["status"]
                == "restored"
            )
        # Copying again from the source keeps the production signature (layers merged).
        cli("copy", ref, dst)
        assert (
            doc_of(restore(dst, tmp_path / "c", "--verify-key", keys.two.public))["status"]
            == "restored"
        )
        # And a local layout is a store like any other.
        layout = f"oci:{tmp_path / 'layout'}"
        assert cli("copy", dst, layout).returncode == 0
        assert (
            doc_of(restore(layout, tmp_path / "d", "--verify-key", keys.one.public))["status"]
            == "restored"
        )
    finally:
        second.stop()


def test_a_mounted_tree_carries_no_signature_and_is_refused_under_a_policy(
    tmp_path: Path, keys: Keys, caches: dict[str, str]
) -> None:
    store = f"oci:{tmp_path / 'store'}"
    harvest(store, caches, "--sign-key", keys.one.private)
    with open_store(store) as st:
        tags = st.list_tags()
    fp_tag = next(t for t in tags if t.startswith("fp-"))
    mounted = tmp_path / "mounted"
    mounted.mkdir()
    # The layers merged into one tree, as an image volume presents them.

    with open_store(store) as st:
        ref = st.get_manifest(fp_tag)
        assert ref is not None
        for layer in json.loads(ref.data)["layers"]:
            with st.open_blob(layer["digest"], layer["size"]) as blob:
                stream = zstandard.ZstdDecompressor().stream_reader(blob)
                with tarfile.open(fileobj=stream, mode="r|") as tar:
                    tar.extractall(mounted, filter="data")
    unchecked = cli(
        "restore",
        "--from-dir",
        str(mounted),
        "--target",
        str(tmp_path / "a"),
        "--gpu-arch",
        "sm_90a",
        "--json",
    )
    assert doc_of(unchecked)["status"] == "restored", unchecked.stderr
    proc = cli(
        "restore",
        "--from-dir",
        str(mounted),
        "--target",
        str(tmp_path / "b"),
        "--gpu-arch",
        "sm_90a",
        "--verify-key",
        keys.one.public,
        "--json",
    )
    doc = doc_of(proc)
    assert doc["status"] == "failed" and doc["failure"]["kind"] == "untrusted"
    assert "mounted tree" in doc["failure"]["message"]
    assert not (tmp_path / "b").exists() or not tree_bytes(tmp_path / "b")


def test_hostile_signature_manifests_fail_cleanly(
    registry: RegistryServer, repo: str, tmp_path: Path, keys: Keys, caches: dict[str, str]
) -> None:
    ref = registry.ref(repo)
    pub = harvest(ref, caches)
    digest = pub["digest"]
    policy = TrustPolicy(tuple(load_public_keys([keys.one.public])))
    tag = attached_tag(digest, "sig")
    payload = signing_payload(digest, ref)
    good_sig = base64.b64encode(
        load_private_key(keys.one.private, password=PASSWORD).sign(payload)
    ).decode()
    cases = ["not json", "too many layers", "huge payload", "no annotation", "garbage signature"]

    layout = f"oci:{tmp_path / 'layout'}"
    assert cli("copy", ref, layout).returncode == 0
    for where, name in [(w, n) for w in (ref, layout) for n in cases]:
        if where == ref and name == "not json":
            continue  # the registry itself refuses to store it (HTTP 500)
        with open_store(where) as store:
            if name == "not json":
                store.put_manifest(b"{}", "application/vnd.oci.image.manifest.v1+json", [tag])
            else:
                desc = Descriptor(
                    media_type=SIMPLESIGNING_MEDIA_TYPE,
                    digest=digest_of(payload),
                    size=len(payload) if name != "huge payload" else 1 << 30,
                    annotations={}
                    if name == "no annotation"
                    else {ANN_SIGNATURE: "!!!" if name == "garbage signature" else good_sig},
                )
                layers = [desc] * (100 if name == "too many layers" else 1)
                _write_attached(store, digest, "sig", layers, {desc.digest: payload})
            with pytest.raises(TrustError) as err:
                policy.check(store, digest)
            assert err.value.reason in ("malformed", "unknown_key"), (name, err.value)
    # And the restore through the CLI reports it as untrusted, exit 0, no traceback.
    for where in (ref, layout):
        proc = restore(where, tmp_path / "t", "--verify-key", keys.one.public)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr
        assert doc_of(proc)["failure"]["kind"] == "untrusted"
        assert not (tmp_path / "t").exists() or not tree_bytes(tmp_path / "t")
    # The publisher signs over the wreck (the layout holds the garbage one):
    # a valid signature joins it, and the restore verifies.
    resign = ("--sign-key", keys.one.private, "--sign-unverified")
    assert cli("sign", f"{layout}@{digest}", *resign).returncode == 0
    assert doc_of(restore(layout, tmp_path / "u", "--verify-key", keys.one.public))["status"] == (
        "restored"
    )


# --------------------------------------------------------------------------
# Node store and baked store: the same policy from every source
# --------------------------------------------------------------------------


def test_node_store_carries_signatures_and_a_tampered_one_is_passed_over(
    registry: RegistryServer, repo: str, tmp_path: Path, keys: Keys, caches: dict[str, str]
) -> None:
    ref = registry.ref(repo)
    pub = harvest(ref, caches)
    node = tmp_path / "node"
    # The node store filled before the publisher signed: a verifying restore
    # fetches the signatures into it (no layer again) and restores from it.
    unsigned = doc_of(restore(ref, tmp_path / "early", "--node-store", f"oci:{node}"))
    assert unsigned["node_store"]["outcome"] == "fetched"
    resign = ("--sign-key", keys.one.private, "--sign-unverified")
    assert cli("sign", f"{ref}@{pub['digest']}", *resign).returncode == 0
    args = ("--node-store", f"oci:{node}", "--verify-key", keys.one.public)
    first = doc_of(restore(ref, tmp_path / "a", *args))
    assert first["status"] == "restored" and first["node_store"]["outcome"] == "fetched"
    assert first["node_store"]["fetched"] == [attached_tag(pub["digest"], "sig")]
    assert first["node_store"]["bytes_fetched"] == 0
    assert first["plan"]["store"] == f"oci:{node}"
    with open_store(f"oci:{node}") as st:
        assert st.tag_digest(attached_tag(pub["digest"], "sig")) is not None
    second = doc_of(restore(ref, tmp_path / "b", *args))
    assert second["status"] == "restored" and second["node_store"]["outcome"] == "node"
    # Someone on the node replaces the signature: the node store's copy no
    # longer verifies; the restore goes to the registry, which verifies.
    with open_store(f"oci:{node}") as st:
        st.put_manifest(
            b'{"schemaVersion":2}',
            "application/vnd.oci.image.manifest.v1+json",
            [attached_tag(pub["digest"], "sig")],
        )
    third = restore(ref, tmp_path / "c", *args)
    assert doc_of(third)["status"] == "restored", third.stdout
    assert '"bypassed"' in third.stdout or "bypassed" in third.stderr
    # gc never strips a signature from a kept artifact, and drops it with its subject.

    layout = LayoutStore(node)
    tags_before = set(layout.list_tags())
    gc(layout, max_bytes=10**12)
    assert set(layout.list_tags()) == tags_before
    gc(layout, max_bytes=0)
    assert not [t for t in layout.list_tags() if t.endswith((".sig", ".att"))]


def test_the_baked_store_of_a_derived_image_keeps_signatures(
    registry: RegistryServer, repo: str, tmp_path: Path, keys: Keys, caches: dict[str, str]
) -> None:
    ref = registry.ref(repo)
    pub = harvest(ref, caches, "--sign-key", keys.one.private)
    art_ref = f"{ref}:fp-{pub['fingerprint_hash']}"
    art = open_artifact(art_ref, trust=UNSAFE_NO_VERIFICATION)
    baked = tmp_path / "root" / "opt" / "prebuilt-cache" / pub["fingerprint_hash"]
    work = tmp_path / "work"
    work.mkdir()
    write_layout(art_ref, art, baked, work)
    proc = cli(
        "restore",
        "--from-dir",
        str(tmp_path / "root"),
        "--target",
        str(tmp_path / "t"),
        "--gpu-arch",
        "sm_90a",
        "--verify-key",
        keys.one.public,
        "--require",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    assert doc_of(proc)["status"] == "restored"


# --------------------------------------------------------------------------
# Provenance
# --------------------------------------------------------------------------

RECORDER = """\
import json, os, sys
gen = os.environ["ARTIFACTD_GENERIC_DIR"]
os.makedirs(gen, exist_ok=True)
path = os.path.join(gen, f"k-{sys.argv[1]}.cubin")
if not os.path.exists(path):  # a cache: compiled only when missing
    open(path, "w").write("kernel " + sys.argv[1])
print(json.dumps({"checks": {"sum": len(sys.argv[1])}}))
"""


def matrix_cli(
    command: str, matrix: Path, ref: str, key: str, env: dict[str, str]
) -> dict[str, Any]:
    """``artifactd COMMAND MATRIX --store REF --sign-key KEY --json``, required to succeed."""
    proc = cli(command, str(matrix), "--store", ref, "--gpu-arch", "sm_90a", "--sign-key", key,
               "--json", env=env, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return doc_of(proc)


def test_build_attaches_signed_slsa_provenance_and_verify_adds_its_verdict(
    registry: RegistryServer, repo: str, tmp_path: Path, keys: Keys
) -> None:
    (tmp_path / "cell.py").write_text(RECORDER)
    matrix = tmp_path / "tiny.yaml"
    matrix.write_text(
        "name: tiny\nfamilies: [generic]\ngpus: 0\n"
        "base_image: sha256:" + "ab" * 32 + "\n"
        "axes:\n  batch: [1, 8]\n"
        f'command: "{{{{ python }}}} {tmp_path / "cell.py"} {{{{ batch }}}}"\n'
    )
    ref = registry.ref(repo)
    env = {"HOME": str(tmp_path / "home"), "TMPDIR": str(tmp_path)}
    built = matrix_cli("build", matrix, ref, keys.one.private, env)
    digest = built["harvest"]["digest"]
    assert len(built["harvest"]["signing"]["attestations"]) == 1
    (key,) = load_public_keys([keys.one.public])
    with open_store(ref) as store:
        (att,) = read_attestations(store, digest, [key])
        raw = store.get_manifest(attached_tag(digest, "att"))
    assert att.signed_by == key.id and att.problem is None
    layer = json.loads(raw.data)["layers"][0] if raw else {}
    assert layer["mediaType"] == DSSE_MEDIA_TYPE
    assert layer["annotations"] == {
        ANN_SIGNATURE: "",
        ANN_PREDICATE_TYPE: "https://slsa.dev/provenance/v1",
    }
    st = att.statement or {}
    assert st["_type"] == "https://in-toto.io/Statement/v1"
    assert st["subject"] == [{"name": ref, "digest": {"sha256": digest.split(":")[1]}}]
    pred = att.predicate
    bd, rd = pred["buildDefinition"], pred["runDetails"]
    matrix_doc = bd["externalParameters"]["matrix"]

    assert matrix_doc["digest"]["sha256"] == hashlib.sha256(matrix.read_bytes()).hexdigest()
    assert matrix_doc["content"] == matrix.read_text()
    assert bd["resolvedDependencies"] == [
        {"uri": "oci:sha256:" + "ab" * 32, "digest": {"sha256": "ab" * 32}}
    ]
    assert bd["internalParameters"]["fingerprintHash"] == built["harvest"]["fingerprint_hash"]
    assert bd["internalParameters"]["fingerprint"]["gpu"]["arch"] == "sm_90a"

    assert rd["builder"]["version"] == {"artifactd": __version__}
    by = {b["name"]: b["annotations"] for b in rd["byproducts"]}
    cells = by["cells"]["cells"]
    assert [c["id"] for c in cells] == [c["id"] for c in built["cells"]]
    assert all(c["seconds"] > 0 and c["returncode"] == 0 for c in cells)
    assert cells[0]["checks"] == {"sum": 1}
    assert set(by["lint"]) == {"errors", "warnings", "files_scanned"}
    assert "verify" not in by
    assert rd["metadata"]["startedOn"] <= rd["metadata"]["finishedOn"]

    # The gate attests its verdict; inspect shows both, and checks them.
    assert matrix_cli("verify", matrix, ref, keys.one.private, env)["passed"] is True
    shown = cli("inspect", f"{ref}@{digest}", "--verify-key", keys.one.public, "--json")
    assert shown.returncode == 0, shown.stderr
    trust = doc_of(shown)["trust"]
    assert trust["verified_by"] == key.id
    assert [a["signed_by"] for a in trust["attestations"]] == [key.id, key.id]
    assert trust["attestations"][1]["summary"]["verify"]["passed"] is True
    text = cli("inspect", f"{ref}@{digest}", "--verify-key", keys.one.public)
    assert "verify passed" in text.stdout and "verified: signed by" in text.stdout
    refused = cli("inspect", f"{ref}@{digest}", "--verify-key", keys.two.public)
    assert refused.returncode == 14 and "NOT VERIFIED" in refused.stdout


def test_attestations_do_not_grow_past_what_readers_accept(tmp_path: Path, keys: Keys) -> None:
    key = load_private_key(keys.two.private)
    digest = "sha256:" + "1" * 64
    with open_store(f"oci:{tmp_path / 'st'}", create=True) as store:
        for i in range(MAX_LAYERS + 5):
            statement = {
                "_type": "https://in-toto.io/Statement/v1",
                "subject": [{"name": "x", "digest": {"sha256": "1" * 64}}],
                "predicateType": "https://example.com/test",
                "predicate": {"n": i},
            }
            attest(store, digest, statement, key)
        found = read_attestations(store, digest, load_public_keys([keys.two.public]))
        assert len(found) == MAX_LAYERS
        assert [a.predicate["n"] for a in found][-1] == MAX_LAYERS + 4  # the newest kept
        assert all(a.signed_by == keys.two.key_id for a in found)
        report = examine(store, digest)
        assert len(report.attestations) == MAX_LAYERS and report.signatures == []


def test_merge_signs_the_whole_artifact_and_attests_the_cells(
    registry: RegistryServer, repo: str, tmp_path: Path, keys: Keys
) -> None:
    (tmp_path / "cell.py").write_text(RECORDER)
    matrix = tmp_path / "tiny.yaml"
    matrix.write_text(
        "name: tiny\nfamilies: [generic]\ngpus: 0\naxes:\n  batch: [1, 8]\n"
        f'command: "{{{{ python }}}} {tmp_path / "cell.py"} {{{{ batch }}}}"\n'
    )
    ref = registry.ref(repo)
    env = {"HOME": str(tmp_path / "home"), "TMPDIR": str(tmp_path)}
    for index in ("0", "1"):
        proc = cli("build", str(matrix), "--cell", index, "--run-id", "r1", "--store", ref,
                   "--gpu-arch", "sm_90a", env=env, timeout=300)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
    proc = cli("merge", str(matrix), "--run-id", "r1", "--store", ref, "--sign-key",
               keys.one.private, "--json", env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    merged = doc_of(proc)
    assert merged["signing"]["key_id"] == keys.one.key_id
    assert len(merged["signing"]["signed"]) == 2  # the whole artifact and the generic family
    done = doc_of(restore(ref, tmp_path / "t", "--verify-key", keys.one.public, "--require"))
    assert done["status"] == "restored" and done["match"] == "full"
    with open_store(ref) as store:
        (att,) = read_attestations(store, merged["digest"], load_public_keys([keys.one.public]))
    ext = att.predicate["buildDefinition"]["externalParameters"]
    assert ext["runId"] == "r1" and ext["matrix"]["content"] == matrix.read_text()
    cells = {b["name"]: b for b in att.predicate["runDetails"]["byproducts"]}["cells"]
    assert sorted(c["id"] for c in cells["annotations"]["cells"]) == sorted(merged["cells"])


def test_hostile_attestations_are_reported_not_trusted_and_never_crash(
    tmp_path: Path, keys: Keys
) -> None:
    key = load_private_key(keys.two.private)
    (pub,) = load_public_keys([keys.two.public])
    digest = "sha256:" + "2" * 64
    weird: list[dict[str, Any]] = [
        {"predicateType": "x", "subject": 5, "predicate": [1]},
        {"predicateType": "x", "subject": [{"digest": ["sha256", "2" * 64]}]},
        {
            "predicateType": "https://slsa.dev/provenance/v1",
            "subject": [{"name": "x", "digest": {"sha256": "2" * 64}}],
            "predicate": {"buildDefinition": [], "runDetails": {"byproducts": "cells"}},
        },
    ]
    with open_store(f"oci:{tmp_path / 'st'}", create=True) as store:
        for statement in weird:
            attest(store, digest, statement, key)
        # And envelopes that are not envelopes at all.
        junk = [b"[]", b'{"payload": "!", "payloadType": 1, "signatures": "abc"}', b"\xff"]
        layers = list(_read_layers(store, digest))
        blobs = {digest_of(j): j for j in junk}
        layers += [
            Descriptor(media_type=DSSE_MEDIA_TYPE, digest=d, size=len(j), annotations={})
            for d, j in blobs.items()
        ]
        _write_attached(store, digest, "att", layers, blobs)
        found = read_attestations(store, digest, [pub])
        assert len(found) == 6
        signed = [a for a in found if a.signed_by]
        assert len(signed) == 1  # only the one whose subject names the digest
        assert signed[0].predicate["runDetails"] == {"byproducts": "cells"}
        assert [a.problem for a in found[:2]] == ["its subject is another digest"] * 2
        assert all(a.problem for a in found[3:])
        report = examine(store, digest, [pub])
        assert report.attestations[2]["summary"]["matrix"] is None


def _read_layers(store: Any, digest: str) -> list[Any]:
    ref = store.get_manifest(attached_tag(digest, "att"))
    return list(ImageManifest.from_bytes(ref.data).layers)


# --------------------------------------------------------------------------
# Secrets never printed
# --------------------------------------------------------------------------


def test_keys_and_password_never_appear_in_any_output(
    registry: RegistryServer, repo: str, tmp_path: Path, keys: Keys, caches: dict[str, str]
) -> None:
    ref = registry.ref(repo)
    pem = Path(keys.two.private).read_text()
    outputs = []
    runs = [
        cli("keygen", "--out", str(tmp_path / "k3")),
        cli(
            "harvest",
            "--store",
            ref,
            "--gpu-arch",
            "sm_90a",
            "--sign-key",
            keys.one.private,
            env=caches,
        ),
        cli(
            "harvest",
            "--store",
            ref,
            "--gpu-arch",
            "sm_90a",
            "--json",
            env={**caches, "ARTIFACTD_SIGN_KEY": "env://SIGNING_PEM", "SIGNING_PEM": pem},
        ),
        cli(
            "harvest",
            "--store",
            ref,
            "--gpu-arch",
            "sm_90a",
            "--sign-key",
            keys.one.private,
            env={**caches, "ARTIFACTD_KEY_PASSWORD": "wrong"},
        ),
        cli(
            "harvest",
            "--store",
            ref,
            "--gpu-arch",
            "sm_90a",
            "--sign-key",
            "env://UNSET",
            env=caches,
        ),
        cli("ls", ref),
        restore(ref, tmp_path / "t", "--verify-key", keys.one.public),
        cli(
            "restore",
            "--store",
            ref,
            "--target",
            str(tmp_path / "u"),
            "--gpu-arch",
            "sm_90a",
            "--verify-key",
            keys.one.private,
        ),
        cli(
            "inspect",
            f"{ref}:fp-{doc_of(restore(ref, tmp_path / 'v'))['plan']['fingerprint_hash']}",
            "--verify-key",
            keys.one.public,
            "--json",
        ),
        cli(
            "copy",
            ref,
            f"oci:{tmp_path / 'copy'}",
            "--sign-key",
            keys.one.private,
            "--sign-unverified",
            "--json",
        ),
    ]
    for proc in runs:
        outputs.append(proc.stdout + proc.stderr)
        assert "Traceback" not in proc.stderr, proc.stderr
    everything = "\n".join(outputs)
    assert "PRIVATE KEY" not in everything
    for secret in keys.secrets() + [line for line in pem.splitlines() if "-----" not in line]:
        assert secret not in everything
    assert runs[3].returncode == 2 and "password" in runs[3].stderr
    assert runs[4].returncode == 2 and "UNSET" in runs[4].stderr
    assert runs[7].returncode == 2 and "holds a private key" in runs[7].stderr
    assert os.environ.get("ARTIFACTD_KEY_PASSWORD") is None
