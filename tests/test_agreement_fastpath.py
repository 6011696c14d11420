"""Where the pod-start fast path keeps a light twin of a full-path rule, the two agree.

The fast path (:mod:`artifactd.cli.fast`) answers a no-op without pydantic or
the crypto library, so two rules have a light form beside the full one:

* the fingerprint as plain data (the probe's document, hashed, flattened and
  scoped by :mod:`artifactd.fingerprint.key`) beside the typed model
  (:class:`~artifactd.fingerprint.model.Fingerprint`, which validates and
  coerces, then calls the same key functions);
* the ids of the verification keys read from the PEM text
  (:func:`~artifactd.trust.keys.verification_key_ids`) beside the ids of the
  keys the crypto library parses (:class:`~artifactd.trust.policy.TrustPolicy`).
  Both name a key by :func:`~artifactd.trust.keys.key_id`, the one definition.

Each test runs both on the same inputs and requires the same answer. (The
click-free parser and click agree in ``tests/test_cli_fast.py``.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from artifactd.families import FAMILIES
from artifactd.fingerprint.key import flatten, hashed_view, raw_hash, scope_key
from artifactd.fingerprint.model import from_raw
from artifactd.fingerprint.probe import probe_request
from artifactd.trust.keys import generate, key_ids_of_pem, verification_key_ids
from artifactd.trust.policy import TrustPolicy

DIGEST = "sha256:" + "ab" * 32

#: What a pod states about its fingerprint, as the fast path parses it.
REQUESTS = {
    "nothing": {},
    "gpu-arch": {"gpu_arch": "sm_90a"},
    "workload": {"gpu_arch": "sm_100a", "workload": ["model=Qwen/Qwen3-8B,tp=8", "dtype=bf16"]},
    "image digest": {"image_digest": f"registry.local/llm@{DIGEST}"},
    "overrides": {"gpu_arch": "sm_90a", "overrides": ["driver.version=575.51"]},
}


@pytest.mark.parametrize("name", list(REQUESTS))
def test_the_plain_fingerprint_and_the_model_agree(name: str) -> None:
    raw = probe_request(**REQUESTS[name])  # type: ignore[arg-type]
    model = from_raw(raw)
    assert model.model_dump(mode="json") == raw
    assert raw_hash(raw) == model.hash
    flat = flatten(hashed_view(raw))
    assert flat == model.flatten()
    for family in FAMILIES.values():
        plain = scope_key(flat, family.name, family.scope, family.scope_revision)
        assert plain == model.scope_key(family.name, family.scope, family.scope_revision)


def test_the_requests_differ_so_agreement_is_not_vacuous() -> None:
    hashes = {raw_hash(probe_request(**r)) for r in REQUESTS.values()}  # type: ignore[arg-type]
    assert len(hashes) == len(REQUESTS)


def test_key_ids_from_pem_text_and_from_parsed_keys_agree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old, new = generate(tmp_path / "old"), generate(tmp_path / "new")
    both = tmp_path / "both.pub"  # one file holding two keys, as during a rotation
    both.write_bytes(Path(old.public).read_bytes() + b"\n" + Path(new.public).read_bytes())
    monkeypatch.setenv("TEST_VERIFY_PUB", Path(new.public).read_text())  # a Secret as a variable
    cases = [
        [old.public],
        [new.public, old.public],
        [str(both)],
        ["env://TEST_VERIFY_PUB", old.public],
    ]
    for specs in cases:
        light = list(dict.fromkeys(verification_key_ids(specs)))  # ids in order, each once
        policy = TrustPolicy.from_specs(specs)
        assert policy is not None
        assert light == policy.key_ids, specs
    assert key_ids_of_pem(Path(old.public).read_bytes()) == [old.key_id]
    assert verification_key_ids([str(both)]) == [old.key_id, new.key_id]
