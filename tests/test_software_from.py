"""``restore --software-from``: an init image that cannot see the runtime image's software.

The init image holds artifactd alone: its probe finds no torch or triton, and
its own Python. Here that probe is made the honest way, by removing what such
a container lacks from this machine's fingerprint document; the artifact it
names supplies the software fields, and the machine's fields still decide.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from artifactd.build.harvest import harvest
from artifactd.fingerprint.key import SOFTWARE_FIELDS, adopt_software, raw_hash
from artifactd.fingerprint.model import Fingerprint
from artifactd.restore.policy import RestoreRequest, run_restore
from artifactd.stores import open_store


def _raw(fp: Fingerprint) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(fp.model_dump_json())
    return data


def _as_init_image_sees_it(fp: Fingerprint) -> dict[str, Any]:
    """This machine's document less the runtime image's software: no libraries, another Python."""
    raw = _raw(fp)
    raw["libraries"] = {}
    raw["python"] = {**raw["python"], "version": "3.12", "cache_tag": "cpython-312"}
    raw["paths"] = {"site_packages": "/opt/artifactd/lib/python3.12/site-packages"}
    return raw


@pytest.fixture
def store_ref(tmp_path: Path, caches: dict[str, str], local_fp: Fingerprint) -> str:
    store = open_store(f"oci:{tmp_path / 'store'}", create=True)
    harvest(store, local_fp, environ=caches)
    return store.ref


def test_adopt_software_takes_only_the_software_fields(local_fp: Fingerprint) -> None:
    mine = _as_init_image_sees_it(local_fp)
    mine["gpu"] = {**mine["gpu"], "arch": "sm_100a"}
    merged = adopt_software(mine, _raw(local_fp))
    for name in SOFTWARE_FIELDS:
        group, _, leaf = name.partition(".")
        theirs, ours = _raw(local_fp)[group], merged[group]
        assert (ours.get(leaf) if leaf else ours) == (theirs.get(leaf) if leaf else theirs)
    assert merged["gpu"]["arch"] == "sm_100a"  # the machine's own
    assert mine["libraries"] == {}  # the input is not changed


def test_the_init_image_misses_without_it_and_hits_with_it(
    tmp_path: Path, store_ref: str, local_fp: Fingerprint
) -> None:
    seen = _as_init_image_sees_it(local_fp)
    assert raw_hash(seen) != local_fp.hash
    blind = run_restore(RestoreRequest(store=store_ref, target=tmp_path / "a"), seen)
    assert blind.plan.match != "full"
    # Triton's scope holds the Triton version: the blind probe misses even per family.
    assert {f.family for f in blind.plan.families if f.verdict == "hit"} <= {"generic"}
    assert not (tmp_path / "a" / "triton").exists()
    told = RestoreRequest(
        store=store_ref, target=tmp_path / "b", software_from=f"{store_ref}:fp-{local_fp.hash}"
    )
    outcome = run_restore(told, seen)
    assert outcome.status == "restored", outcome.failure
    assert outcome.plan.match == "full"
    assert (tmp_path / "b" / "triton").is_dir()


def test_the_machine_still_decides(tmp_path: Path, store_ref: str, local_fp: Fingerprint) -> None:
    seen = _as_init_image_sees_it(local_fp)
    seen["gpu"] = {**seen["gpu"], "arch": "sm_80", "capability": "8.0"}
    told = RestoreRequest(
        store=store_ref, target=tmp_path / "t", software_from=f"{store_ref}:fp-{local_fp.hash}"
    )
    outcome = run_restore(told, seen)
    assert outcome.plan.match != "full"
    triton = next(f for f in outcome.plan.families if f.family == "triton")
    assert triton.verdict == "miss"


def test_an_unreadable_software_source_is_a_failure_not_a_crash(
    tmp_path: Path, store_ref: str, local_fp: Fingerprint
) -> None:
    seen = _as_init_image_sees_it(local_fp)
    for ref, require in [(f"{store_ref}:fp-{'0' * 64}", False), ("127.0.0.1:9/none:x", True)]:
        req = RestoreRequest(
            store=store_ref, target=tmp_path / "t", software_from=ref, require=require
        )
        outcome = run_restore(req, seen)
        assert outcome.status == "failed"
        assert (outcome.exit_code != 0) == require
        assert not (tmp_path / "t" / "triton").exists()
