"""Where the pod-start fast path keeps a light twin of a full-path rule, the two agree.

The fast path (:mod:`artifactd.cli.fast`) answers a no-op without pydantic or
the crypto library, so two rules have a light form beside the full one:

* the fingerprint as plain data (the probe's document, hashed, flattened and
  scoped by :mod:`artifactd.fingerprint.key`) beside the typed model
  (:class:`~artifactd.fingerprint.model.Fingerprint`, which validates and
  coerces, then calls the same key functions);
* the restore marker checked by :func:`artifactd.restore.marker.load` (from the
  class's annotations, no pydantic: the no-op reads it) beside the committed
  JSON Schema that pydantic generates from the same class
  (``registry-schema/restore-marker.schema.json``, what other tools check);
* the ids of the verification keys read from the PEM text
  (:func:`~artifactd.trust.keys.verification_key_ids`) beside the ids of the
  keys the crypto library parses (:class:`~artifactd.trust.policy.TrustPolicy`).
  Both name a key by :func:`~artifactd.trust.keys.key_id`, the one definition.

Each test runs both on the same inputs and requires the same answer. (The
click-free parser and click agree in ``tests/test_cli_fast.py``.)
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from artifactd.families import FAMILIES
from artifactd.fingerprint.key import flatten, hashed_view, raw_hash, scope_key
from artifactd.fingerprint.model import from_raw
from artifactd.fingerprint.probe import probe_request
from artifactd.restore.marker import RESTORE_MARKER, MarkerFormatError, load
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


SCHEMA = Path(__file__).resolve().parent.parent / "registry-schema" / "restore-marker.schema.json"
MARKER: dict[str, Any] = {
    "schema_version": 1,
    "fingerprint_hash": "a" * 64,
    "store": "oci:/s",
    "match": "full",
    "selected": ["generic"],
    "missed": [],
    "restored_at": 1.5,
    "env": {"ARTIFACTD_GENERIC_DIR": "/cache/generic"},
    "families": {
        "generic": {
            "artifact": DIGEST,
            "tag": "fp-" + "a" * 64,
            "source": "full",
            "layer": DIGEST,
            "scope_key": "d" * 64,
            "dirs": {"generic": "/cache/generic"},
            "files": 2,
            "bytes": 10,
        }
    },
}


def _markers() -> Iterator[tuple[str, Any]]:
    """A sound marker, then one variant per way a marker can be wrong or unusual."""
    yield "sound", MARKER
    family = MARKER["families"]["generic"]
    for key in MARKER:
        yield f"no {key}", {k: v for k, v in MARKER.items() if k != key}
    for key in family:
        yield (
            f"no families.generic.{key}",
            {
                **MARKER,
                "families": {"generic": {k: v for k, v in family.items() if k != key}},
            },
        )
    changes: dict[str, Callable[[dict[str, Any]], None]] = {
        "an unknown key": lambda d: d.update(extra=1),
        "an unknown family key": lambda d: d["families"]["generic"].update(extra=1),
        "signed_by (optional)": lambda d: d["families"]["generic"].update(signed_by=DIGEST),
        "signed_by null": lambda d: d["families"]["generic"].update(signed_by=None),
        "a bool for an int": lambda d: d["families"]["generic"].update(files=True),
        "a string for an int": lambda d: d["families"]["generic"].update(files="2"),
        "a fraction for an int": lambda d: d["families"]["generic"].update(files=2.5),
        "an int for a float": lambda d: d.update(restored_at=2),
        "a bool for a float": lambda d: d.update(restored_at=True),
        "a bool for the version": lambda d: d.update(schema_version=True),
        "version 2": lambda d: d.update(schema_version=2),
        "a partial match": lambda d: d.update(match="partial"),
        "a miss": lambda d: d.update(match="miss"),
        "a string for a list": lambda d: d.update(selected="generic"),
        "null in a list": lambda d: d.update(missed=[None]),
        "an int env value": lambda d: d.update(env={"X": 1}),
        "an unknown source": lambda d: d["families"]["generic"].update(source="other"),
        "a list for an object": lambda d: d.update(families=[]),
    }
    for name, change in changes.items():
        doc = copy.deepcopy(MARKER)
        change(doc)
        yield name, doc
    yield "not an object", [MARKER]


def test_the_light_marker_check_and_the_published_schema_agree() -> None:
    schema = json.loads(SCHEMA.read_text())
    verdicts = []
    for name, doc in _markers():
        try:
            load(RESTORE_MARKER, json.dumps(doc).encode())
            light = True
        except MarkerFormatError:
            light = False
        try:
            jsonschema.validate(doc, schema)
            published = True
        except jsonschema.ValidationError:
            published = False
        assert light == published, name
        verdicts.append(light)
    assert True in verdicts and False in verdicts  # both answers occur: not vacuous
