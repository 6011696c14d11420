"""``artifactd prune`` and ``du`` on a real registry (deletes enabled, and not) and a local layout.

Artifacts are real harvests of synthetic Triton and generic caches, one per GPU
arch (each arch is a fingerprint and a family scope of its own), published
with ``SOURCE_DATE_EPOCH`` set so their ages are known. Tags are read back
with skopeo (registry) or from index.json (layout), never through the code
under test alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from cachetrees import build_caches, harvest_environ, make_generic_tree, make_triton_tree
from conftest import clean_env, run_artifactd
from registry_server import RegistryServer, start_registry

from artifactd.build.harvest import harvest
from artifactd.constants import SOURCE_DATE_EPOCH
from artifactd.fingerprint.model import Fingerprint
from artifactd.format.oci import INDEX_MEDIA_TYPE, parse_superseded_tag
from artifactd.restore.policy import RestoreRequest, run_restore
from artifactd.stores import open_store
from artifactd.stores.artifacts import publish, read_artifact
from artifactd.stores.layout import LayoutStore
from artifactd.stores.retention import REGISTRY_CONFIG, Rules, apply, plan
from artifactd.trust.keys import generate, load_private_key
from artifactd.trust.policy import UNSAFE_NO_VERIFICATION
from artifactd.trust.signatures import attached_tag, sign

DAY = 86400
ARCHES = ("sm_80", "sm_86", "sm_89", "sm_90a")

#: Rules that keep nothing: every age, no grace, ranked by age alone.
DELETE_ALL_NOW = Rules(keep_last=0, older_than_days=0, grace_s=0, trust=UNSAFE_NO_VERIFICATION)


def _fp(base: Fingerprint, arch: str) -> Fingerprint:
    return base.model_copy(update={"gpu": base.gpu.model_copy(update={"arch": arch})})


def _push(
    ref: str, fp: Fingerprint, trees: dict[str, str], days_ago: float, mp: pytest.MonkeyPatch
) -> list[str]:
    """Harvest ``trees`` for ``fp`` into ``ref``, stamped ``days_ago``; return its tags."""
    mp.setenv(SOURCE_DATE_EPOCH, str(int(time.time() - days_ago * DAY)))
    with open_store(ref, create=ref.startswith("oci:")) as st:
        tags = harvest(st, fp, environ=trees).tags
    mp.delenv(SOURCE_DATE_EPOCH)
    return list(tags)


def _fill(
    ref: str, local_fp: Fingerprint, tmp_path: Path, mp: pytest.MonkeyPatch
) -> dict[str, list[str]]:
    """One artifact per arch, the first 40 days old, then 30, 20 and 10: arch -> its tags.

    Each arch has caches of its own, so no two artifacts share a layer.
    """
    out = {}
    for i, arch in enumerate(ARCHES):
        base = tmp_path / "caches" / arch
        make_triton_tree(base / "triton", kernels=("add", f"k_{arch}"))
        make_generic_tree(base / "generic")
        out[arch] = _push(ref, _fp(local_fp, arch), harvest_environ(base), 40 - 10 * i, mp)
    return out


def _tag(tags: list[str], prefix: str) -> str:
    return next(t for t in tags if t.startswith(prefix))


def _skopeo_tags(registry: RegistryServer, repo: str) -> set[str]:
    out = subprocess.run(
        ["skopeo", "list-tags", "--tls-verify=false", f"docker://{registry.ref(repo)}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(json.loads(out.stdout)["Tags"] or [])


def _index_tags(root: Path) -> set[str]:
    index = json.loads((root / "index.json").read_text())
    return {m["annotations"]["org.opencontainers.image.ref.name"] for m in index["manifests"]}


def _prune(ref: str, *args: str) -> dict[str, Any]:
    proc = run_artifactd("prune", "--store", ref, *args, "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def _restored(ref: str, fp: Fingerprint, target: Path) -> str:
    raw = json.loads(fp.model_dump_json())
    outcome = run_restore(RestoreRequest(store=ref, target=target, require=True), raw)
    return str(outcome.status)


# --------------------------------------------------------------------------
# A real registry (docker-registry with deletes enabled)
# --------------------------------------------------------------------------


def test_registry_apply_deletes_exactly_what_the_dry_run_listed(
    registry: RegistryServer,
    repo: str,
    local_fp: Fingerprint,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ref = registry.ref(repo)
    pushed = _fill(ref, local_fp, tmp_path, monkeypatch)
    key = generate(tmp_path / "ci")
    with open_store(ref) as st:
        old = st.tag_digest(pushed["sm_80"][0])
        new = st.tag_digest(pushed["sm_90a"][0])
        assert old and new
        sign(st, old, load_private_key(key.private))
        sign(st, new, load_private_key(key.private))
    before = _skopeo_tags(registry, repo)
    assert {attached_tag(old, "sig"), attached_tag(new, "sig")} <= before

    dry = _prune(ref, "--keep-last", "2", "--older-than", "15", "--grace", "0")
    assert dry["dry_run"] is True
    # Commands that exist: Debian's binary first, then distribution 3's.
    assert dry["gc_hints"] == [
        "docker-registry garbage-collect --delete-untagged /etc/docker/registry/config.yml",
        "registry garbage-collect --delete-untagged CONFIG",
    ]
    assert _skopeo_tags(registry, repo) == before  # a dry run changes nothing
    # The two oldest of each group go (sm_80, sm_86), with sm_80's signature.
    expected = set(pushed["sm_80"] + pushed["sm_86"]) | {attached_tag(old, "sig")}
    assert set(dry["delete_tags"]) == expected

    done = _prune(ref, "--keep-last", "2", "--older-than", "15", "--grace", "0", "--apply")
    assert done["dry_run"] is False and done["delete_tags"] == dry["delete_tags"]
    assert _skopeo_tags(registry, repo) == before - expected
    for tag in expected:  # gone from the registry itself, not only from our listing
        with open_store(ref) as st:
            assert st.tag_digest(tag) is None
    assert _restored(ref, _fp(local_fp, "sm_90a"), tmp_path / "r") == "restored"


def test_registry_push_racing_a_prune_survives(
    registry: RegistryServer,
    repo: str,
    local_fp: Fingerprint,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A push lands after the plan, between two deletes: it is neither planned nor touched."""
    ref = registry.ref(repo)
    pushed = _fill(ref, local_fp, tmp_path, monkeypatch)
    trees = build_caches(tmp_path / "racing")
    racer = _fp(local_fp, "sm_100a")
    raced: list[str] = []

    def push_now(event: dict[str, Any]) -> None:
        if event.get("event") == "deleted" and not raced:
            with open_store(ref) as st:  # a client of its own, as another CI job
                raced.extend(harvest(st, racer, environ=trees).tags)

    with open_store(ref) as st:
        pruned = plan(st, Rules(keep_last=0, older_than_days=0, trust=UNSAFE_NO_VERIFICATION))
        assert {t for d in pruned.decisions for t in d.tags if d.decision == "keep"} == set()
        apply(st, pruned, on_event=push_now)
    assert raced, "the racing push did not run"
    left = _skopeo_tags(registry, repo)
    assert left == set(raced)
    assert not set(left) & {t for tags in pushed.values() for t in tags}
    # The racing artifact is whole: a restore fetches and verifies every layer.
    assert _restored(ref, racer, tmp_path / "r") == "restored"
    # A second prune now sees it, pushed seconds ago: the grace keeps it.
    again = _prune(ref, "--keep-last", "0", "--older-than", "0", "--apply")
    assert again["delete_tags"] == []
    assert all("grace" in d["reason"] for d in again["decisions"])
    assert _skopeo_tags(registry, repo) == set(raced)


def test_registry_with_deletes_disabled_is_a_clear_error_and_deletes_nothing(
    tmp_path_factory: pytest.TempPathFactory,
    local_fp: Fingerprint,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = start_registry(tmp_path_factory.mktemp("nodelete"), delete=False)
    try:
        ref = server.ref("t/nodelete")
        _fill(ref, local_fp, tmp_path, monkeypatch)
        before = _skopeo_tags(server, "t/nodelete")
        proc = run_artifactd(
            "prune", "--store", ref, "--keep-last", "1", "--older-than", "0", "--apply"
        )
        assert proc.returncode == 3, proc.stderr
        assert "REGISTRY_STORAGE_DELETE_ENABLED" in proc.stderr
        assert "Traceback" not in proc.stderr
        assert _skopeo_tags(server, "t/nodelete") == before
    finally:
        server.stop()


def test_registry_du_matches_the_manifests_skopeo_reads(
    registry: RegistryServer,
    repo: str,
    local_fp: Fingerprint,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ref = registry.ref(repo)
    _fill(ref, local_fp, tmp_path, monkeypatch)
    blobs: dict[str, int] = {}
    family_layers: dict[str, dict[str, int]] = {}
    for tag in _skopeo_tags(registry, repo):
        raw = subprocess.run(
            ["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{ref}:{tag}"],
            capture_output=True,
            check=True,
        ).stdout
        blobs["sha256:" + hashlib.sha256(raw).hexdigest()] = len(raw)
        doc = json.loads(raw)
        blobs[doc["config"]["digest"]] = doc["config"]["size"]
        for layer in doc["layers"]:
            blobs[layer["digest"]] = layer["size"]
            fam = layer["annotations"]["io.artifactd.family"]
            family_layers.setdefault(fam, {})[layer["digest"]] = layer["size"]
    proc = run_artifactd("du", "--store", ref, "--json")
    assert proc.returncode == 0, proc.stderr
    du = json.loads(proc.stdout)
    assert du["total_bytes"] == sum(blobs.values())
    assert {f: u["bytes"] for f, u in du["families"].items()} == {
        f: sum(layers.values()) for f, layers in family_layers.items()
    }
    assert len(du["fingerprints"]) == len(ARCHES)
    text = run_artifactd("du", "--store", ref)
    assert text.returncode == 0 and f"({sum(blobs.values())} bytes)" in text.stdout


# --------------------------------------------------------------------------
# A local OCI layout
# --------------------------------------------------------------------------


def _registry_blob_bytes(server: RegistryServer) -> int:
    """Bytes of every blob the registry's own storage holds (manifests included)."""
    blobs = server.root / "docker/registry/v2/blobs"
    return sum(p.stat().st_size for p in blobs.rglob("data") if p.is_file())


@pytest.mark.slow
def test_a_republish_leaves_no_manifest_prune_cannot_see_and_gc_frees_the_space(
    local_fp: Fingerprint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Re-pointed tags used to leave untagged manifests that no listing, prune or du saw.

    Measured on the registry's own disk after the garbage collection the
    prune prints: what it holds is exactly what ``du`` counts.
    """
    server = start_registry(tmp_path / "reg")
    try:
        ref = server.ref("t/republish")
        base = tmp_path / "caches"
        make_triton_tree(base / "triton", kernels=("add",))
        make_generic_tree(base / "generic")
        first = _push(ref, local_fp, harvest_environ(base), 20, monkeypatch)
        with open_store(ref) as st:
            old = {tag: str(st.tag_digest(tag)) for tag in first}
        rebuilt = tmp_path / "rebuilt"  # Triton rebuilt with other bytes
        make_triton_tree(rebuilt / "triton", kernels=("mul",))
        shutil.copytree(base / "generic", rebuilt / "generic")
        second = _push(ref, local_fp, harvest_environ(rebuilt), 10, monkeypatch)
        assert set(second) == set(first)  # the same tags, re-pointed
        tags = _skopeo_tags(server, "t/republish")
        superseded = [s for t in tags if (s := parse_superseded_tag(t))]
        with open_store(ref) as st:
            moved = {tag for tag in first if st.tag_digest(tag) != old[tag]}
        assert moved
        assert {d for _, d in superseded} == {old[t] for t in moved}

        du = json.loads(run_artifactd("du", "--store", ref, "--json").stdout)
        assert du["superseded_bytes"] > 0
        dry = _prune(ref, "--grace", "0")
        kinds = {d["digest"]: (d["kind"], d["decision"]) for d in dry["decisions"]}
        assert {kinds[old[t]] for t in moved} == {("superseded", "delete")}
        assert dry["bytes_freed"] == du["superseded_bytes"]
        # Within the grace (the default 10 minutes), a superseded manifest stays:
        # a pod that resolved the tag just before may be pulling it by digest.
        assert not _prune(ref)["delete_tags"]

        _prune(ref, "--grace", "0", "--apply")
        with open_store(ref) as st:
            assert all(st.get_manifest(old[t]) is None for t in moved)
        assert not [t for t in _skopeo_tags(server, "t/republish") if parse_superseded_tag(t)]
        after = json.loads(run_artifactd("du", "--store", ref, "--json").stdout)
        assert after["superseded_bytes"] == 0
        assert after["total_bytes"] == du["total_bytes"] - du["superseded_bytes"]

        # The collection the prune prints, run as printed (Debian's binary, this config).
        server.stop()
        command = dry["gc_hints"][0].replace(REGISTRY_CONFIG, str(server.config)).split()
        subprocess.run(command, check=True, capture_output=True)
        assert _registry_blob_bytes(server) == after["total_bytes"]
        server.start()
        assert _restored(ref, local_fp, tmp_path / "r") == "restored"
    finally:
        server.stop()


def test_the_gc_line_leaves_out_delete_untagged_where_an_index_has_untagged_children(
    registry: RegistryServer,
    repo: str,
    local_fp: Fingerprint,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ref = registry.ref(repo)
    make_generic_tree(tmp_path / "c" / "generic")
    tags = _push(ref, local_fp, harvest_environ(tmp_path / "c"), 1, monkeypatch)
    with open_store(ref) as st:
        child = st.get_manifest(tags[0])
        assert child is not None
        index = {
            "schemaVersion": 2,
            "mediaType": INDEX_MEDIA_TYPE,
            "manifests": [
                {"mediaType": child.media_type, "digest": child.digest, "size": len(child.data)}
            ],
        }
        st.put_manifest(json.dumps(index).encode(), INDEX_MEDIA_TYPE, ["image"])
        hints = plan(st, Rules(trust=UNSAFE_NO_VERIFICATION)).gc_hints
    assert hints and not [h for h in hints if "--delete-untagged" in h]
    assert hints[0] == "docker-registry garbage-collect /etc/docker/registry/config.yml"


def test_keep_last_counts_fan_out_runs_and_a_run_goes_or_stays_whole(
    local_fp: Fingerprint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--keep-last 2`` keeps two runs (not two cells); a fresh cell keeps its run whole."""
    root = tmp_path / "store"
    ref = f"oci:{root}"
    runs = {"old": (40, 40, 40), "mid": (30, 30, 30), "new": (20, 20, 20), "open": (25, 0)}
    cells: dict[str, list[str]] = {}
    for run, ages in runs.items():
        for i, days in enumerate(ages):
            base = tmp_path / "caches" / run / str(i)
            make_generic_tree(base / "generic")
            monkeypatch.setenv(SOURCE_DATE_EPOCH, str(int(time.time() - days * DAY)))
            with open_store(ref, create=True) as st:
                tag = f"run-{run}-cell-{i}"
                harvest(st, local_fp, environ=harvest_environ(base), cell_tag=tag)
            cells.setdefault(run, []).append(tag)
    monkeypatch.delenv(SOURCE_DATE_EPOCH)
    decided = {
        t: d["decision"] for d in _prune(ref, "--keep-last", "2")["decisions"] for t in d["tags"]
    }
    # "open" (its newest cell is new) and "new" are the two newest runs; all cells stay.
    assert {decided[t] for t in cells["open"] + cells["new"]} == {"keep"}
    assert {decided[t] for t in cells["mid"] + cells["old"]} == {"delete"}
    # With no run kept by rank, the one in the grace still stays whole.
    doc = _prune(ref, "--keep-last", "0")
    decided = {t: (d["decision"], d["reason"]) for d in doc["decisions"] for t in d["tags"]}
    assert decided["run-open-cell-0"][0] == "keep"
    assert decided["run-open-cell-0"][1].startswith("run open stays whole (within the")
    assert set(doc["delete_tags"]) == set(cells["old"] + cells["mid"] + cells["new"])


def _blob_files(root: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in (root / "blobs" / "sha256").iterdir()}


def test_layout_prune_removes_listed_tags_and_unreferenced_blobs(
    local_fp: Fingerprint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "store"
    ref = f"oci:{root}"
    pushed = _fill(ref, local_fp, tmp_path, monkeypatch)
    before, files_before = _index_tags(root), _blob_files(root)
    du = json.loads(run_artifactd("du", "--store", ref, "--json").stdout)
    assert du["total_bytes"] + du["unreferenced_bytes"] == sum(files_before.values())

    dry = _prune(ref, "--keep-last", "1", "--grace", "0")
    assert _index_tags(root) == before and _blob_files(root) == files_before
    expected = set(pushed["sm_80"] + pushed["sm_86"] + pushed["sm_89"])
    assert set(dry["delete_tags"]) == expected
    done = _prune(ref, "--keep-last", "1", "--grace", "0", "--apply")
    assert _index_tags(root) == before - expected == set(pushed["sm_90a"])
    assert done["blobs_removed"] > 0
    assert done["bytes_removed"] == sum(files_before.values()) - sum(_blob_files(root).values())
    # What is left is exactly what the remaining tags reference, and it restores.
    du = json.loads(run_artifactd("du", "--store", ref, "--json").stdout)
    assert du["unreferenced_bytes"] == 0
    assert du["total_bytes"] == sum(_blob_files(root).values())
    assert _restored(ref, _fp(local_fp, "sm_90a"), tmp_path / "r") == "restored"


def test_promoted_and_keep_tag_patterns_are_kept_with_what_they_reference(
    local_fp: Fingerprint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "store"
    ref = f"oci:{root}"
    pushed = _fill(ref, local_fp, tmp_path, monkeypatch)
    st = LayoutStore(root)
    pins = {
        "release-42": _tag(pushed["sm_80"], "fp-"),  # promoted (verify --promote's tag)
        "pin-a": _tag(pushed["sm_86"], "triton-"),  # one family manifest, by pattern
        "keep1": _tag(pushed["sm_89"], "fp-"),  # by the other pattern
    }
    for extra, tag in pins.items():
        found = st.get_manifest(tag)
        assert found is not None
        st.put_manifest(found.data, found.media_type, [extra])
    args = ["--keep-last", "0", "--older-than", "0", "--grace", "0"]
    args += ["--keep-tag", "pin-*", "--keep-tag", "keep?"]
    dry = _prune(ref, *args)
    reasons = {t: d["reason"] for d in dry["decisions"] for t in d["tags"]}
    assert reasons["release-42"] == "promoted as release-42"
    assert reasons[pins["release-42"]] == "promoted as release-42"
    assert reasons["pin-a"] == "--keep-tag matches pin-a"
    assert reasons["keep1"] == "--keep-tag matches keep1"
    # The family manifests that carry a kept whole artifact's layers stay with it.
    for tag in [*pushed["sm_80"], *pushed["sm_89"]]:
        assert reasons[tag].split()[0] in ("promoted", "--keep-tag", "carries"), reasons[tag]
    expected = {*pushed["sm_90a"], _tag(pushed["sm_86"], "fp-"), _tag(pushed["sm_86"], "generic-")}
    assert set(dry["delete_tags"]) == expected
    before = _index_tags(root)
    _prune(ref, *args, "--apply")
    assert _index_tags(root) == before - expected
    assert _restored(ref, _fp(local_fp, "sm_80"), tmp_path / "r") == "restored"


def test_older_than_and_grace_decide_by_the_stamped_creation_time(
    local_fp: Fingerprint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "store"
    ref = f"oci:{root}"
    pushed = _fill(ref, local_fp, tmp_path, monkeypatch)
    recent = _push(ref, _fp(local_fp, "sm_100a"), build_caches(tmp_path / "n"), 0, monkeypatch)
    doc = _prune(ref, "--keep-last", "0", "--older-than", "25")
    assert set(doc["delete_tags"]) == set(pushed["sm_80"] + pushed["sm_86"])
    # --older-than 0: every artifact is old enough, but the grace still keeps a fresh push.
    doc = _prune(ref, "--keep-last", "0", "--older-than", "0")
    keep = {t for d in doc["decisions"] if d["decision"] == "keep" for t in d["tags"]}
    assert keep == set(recent)
    doc = _prune(ref, "--keep-last", "0", "--older-than", "0", "--grace", "0")
    assert not [d for d in doc["decisions"] if d["decision"] == "keep"]
    text = run_artifactd("prune", "--store", ref, "--keep-last", "0", "--older-than", "25")
    assert text.returncode == 0
    assert "DECISION" in text.stdout and "dry run: would delete 6 manifest(s)" in text.stdout


def test_layout_sweep_spares_blobs_a_push_wrote_but_has_not_tagged_yet(
    local_fp: Fingerprint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "store"
    ref = f"oci:{root}"
    _fill(ref, local_fp, tmp_path, monkeypatch)
    # A publish writes its layers first and tags them last: one caught in between.
    layer = b"a layer whose manifest is not written yet" * 100
    digest = hashlib.sha256(layer).hexdigest()
    (root / "blobs" / "sha256" / digest).write_bytes(layer)
    done = _prune(ref, "--keep-last", "0", "--older-than", "0", "--grace", "300", "--apply")
    assert (root / "blobs" / "sha256" / digest).read_bytes() == layer
    assert done["blobs_removed"] == 0  # every old artifact's blobs too: written seconds ago
    # Once older than the grace, nothing references it: it goes.
    old = time.time() - 600
    os.utime(root / "blobs" / "sha256" / digest, (old, old))
    _prune(ref, "--keep-last", "0", "--older-than", "0", "--grace", "300", "--apply")
    assert not (root / "blobs" / "sha256" / digest).exists()


def test_layout_push_racing_a_prune_survives(
    local_fp: Fingerprint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process publishes into the layout between two of the prune's deletes."""
    root = tmp_path / "store"
    ref = f"oci:{root}"
    _fill(ref, local_fp, tmp_path, monkeypatch)
    trees = build_caches(tmp_path / "racing")
    raced: list[str] = []

    def push_now(event: dict[str, Any]) -> None:
        if event.get("event") == "deleted" and not raced:
            args = ("harvest", "--store", ref, "--gpu-arch", "sm_100a", "--json")
            proc = run_artifactd(*args, env=clean_env(trees))
            assert proc.returncode == 0, proc.stderr[-2000:]
            raced.extend(json.loads(proc.stdout)["tags"])

    with open_store(ref) as st:
        pruned = plan(
            st, Rules(keep_last=0, older_than_days=0, grace_s=0, trust=UNSAFE_NO_VERIFICATION)
        )
        apply(st, pruned, on_event=push_now)
    assert raced and _index_tags(root) == set(raced)
    assert pruned.blobs_removed > 0
    with open_store(ref) as st:
        art = read_artifact(st, _tag(raced, "fp-"))
    assert art is not None
    assert _restored(ref, art.config.fingerprint, tmp_path / "r") == "restored"


def test_publishing_again_keeps_the_creation_time_and_the_digest(
    local_fp: Fingerprint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "store"
    ref = f"oci:{root}"
    trees = build_caches(tmp_path / "c")
    first = _push(ref, local_fp, trees, 20, monkeypatch)
    digests = {t: LayoutStore(root).tag_digest(t) for t in first}
    again = _push(ref, local_fp, trees, 0, monkeypatch)  # a later, identical publish
    assert again == first
    assert {t: LayoutStore(root).tag_digest(t) for t in again} == digests
    doc = _prune(ref, "--keep-last", "0", "--older-than", "15")
    assert set(doc["delete_tags"]) == set(first)  # still 20 days old
    proc = run_artifactd("harvest", "--store", ref, "--json", env=clean_env(
        {**trees, SOURCE_DATE_EPOCH: "yesterday"}))  # fmt: skip
    assert proc.returncode == 2 and SOURCE_DATE_EPOCH in proc.stderr, proc.stderr


def test_an_artifact_without_a_creation_time_is_kept_unless_everything_is_old(
    local_fp: Fingerprint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "store"
    ref = f"oci:{root}"
    pushed = _fill(ref, local_fp, tmp_path, monkeypatch)
    st = LayoutStore(root)
    legacy = _tag(pushed["sm_80"], "fp-")
    found = st.get_manifest(legacy)
    assert found is not None
    doc = json.loads(found.data)
    del doc["annotations"]["org.opencontainers.image.created"]  # as published before
    st.put_manifest(json.dumps(doc).encode(), found.media_type, [legacy])
    dry = _prune(ref, "--keep-last", "0", "--older-than", "0")
    reasons = {t: d["reason"] for d in dry["decisions"] for t in d["tags"]}
    assert reasons[legacy].startswith("no creation time")
    dry = _prune(ref, "--keep-last", "0", "--older-than", "0", "--grace", "0")
    assert legacy in dry["delete_tags"]


def test_a_manifest_promoted_during_the_prune_is_left(
    local_fp: Fingerprint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "store"
    ref = f"oci:{root}"
    pushed = _fill(ref, local_fp, tmp_path, monkeypatch)
    with open_store(ref) as st:
        pruned = plan(
            st, Rules(keep_last=0, older_than_days=0, grace_s=0, trust=UNSAFE_NO_VERIFICATION)
        )
        target = _tag(pushed["sm_90a"], "fp-")
        found = st.get_manifest(target)
        assert found is not None and target in pruned.delete_tags
        # Promoted after the plan was made, before the deletes (verify --promote, elsewhere).
        st.put_manifest(found.data, found.media_type, ["release-7"])
        apply(st, pruned)
    assert pruned.skipped == [found.digest]
    assert _index_tags(root) == {target, "release-7"}
    assert _restored(ref, _fp(local_fp, "sm_90a"), tmp_path / "r") == "restored"


# --------------------------------------------------------------------------
# Hostile stamps, submissions and signed ranking (issue 28, item 4)
# --------------------------------------------------------------------------


def _junk(st: Any, template: str, stamp: str, n: int) -> list[str]:
    """Push ``n`` whole-artifact manifests stamped ``stamp``, as a pusher without a key could."""
    found = st.get_manifest(template)
    assert found is not None
    tags = []
    for i in range(n):
        doc = json.loads(found.data)
        fake = hashlib.sha256(f"junk-{i}".encode()).hexdigest()
        doc["annotations"]["org.opencontainers.image.created"] = stamp
        doc["annotations"]["io.artifactd.fingerprint"] = fake
        st.put_manifest(json.dumps(doc).encode(), found.media_type, [f"fp-{fake}"])
        tags.append(f"fp-{fake}")
    return tags


def test_junk_stamped_in_the_future_does_not_get_legitimate_artifacts_deleted(
    registry: RegistryServer,
    repo: str,
    local_fp: Fingerprint,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ref = registry.ref(repo)
    pushed = _fill(ref, local_fp, tmp_path, monkeypatch)
    with open_store(ref) as st:
        junk = _junk(st, _tag(pushed["sm_90a"], "fp-"), "2999-01-01T00:00:00Z", 3)
    done = _prune(ref, "--apply")  # the defaults: --keep-last 3, --grace 600
    # The oldest legitimate artifact goes, as --keep-last 3 says; the three newest stay.
    assert set(done["delete_tags"]) == set(pushed["sm_80"])
    left = _skopeo_tags(registry, repo)
    for arch in ("sm_86", "sm_89", "sm_90a"):
        assert set(pushed[arch]) <= left, arch
    reasons = {t: d["reason"] for d in done["decisions"] for t in d["tags"]}
    for tag in junk:  # an unknown age: ranked last, kept, never "the newest"
        assert tag in left and "in the future (unknown age)" in reasons[tag], reasons[tag]
    # A clock a little ahead (within the 5 minutes of skew) is still an age.
    with open_store(ref) as st:
        ahead = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 60))
        (soon,) = _junk(st, _tag(pushed["sm_90a"], "fp-"), ahead, 1)
        pruned = plan(st, Rules(trust=UNSAFE_NO_VERIFICATION))
    soon_reason = next(d.reason for d in pruned.decisions if soon in d.tags)
    assert "newest" in soon_reason or "grace" in soon_reason, soon_reason
    assert _restored(ref, _fp(local_fp, "sm_90a"), tmp_path / "r") == "restored"


def _submit(
    st: Any, source: str, *, kind: str, tag: str, days_ago: float, mp: pytest.MonkeyPatch, tmp: Path
) -> str:
    """Publish ``source``'s artifact again as a ``kind`` (delta or full) under ``tag`` only."""
    art = read_artifact(st, source)
    assert art is not None
    mp.setenv(SOURCE_DATE_EPOCH, str(int(time.time() - days_ago * DAY)))
    tmp.mkdir(parents=True, exist_ok=True)
    config = art.config.model_copy(update={"kind": kind})
    digest = publish(st, config, {}, tmp, tags=[tag]).digest
    mp.delenv(SOURCE_DATE_EPOCH)
    return digest


def test_deltas_and_candidates_are_pruned_by_age_with_what_they_held(
    registry: RegistryServer,
    repo: str,
    local_fp: Fingerprint,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Submissions: kept 7 days by default, then deleted; they hold no family manifest."""
    ref = registry.ref(repo)
    pushed = _fill(ref, local_fp, tmp_path, monkeypatch)
    old_fp, new_fp = _tag(pushed["sm_80"], "fp-"), _tag(pushed["sm_90a"], "fp-")
    names = {
        "old_delta": "delta-" + "a" * 64,
        "new_delta": "delta-" + "b" * 64,
        "future_delta": "delta-" + "c" * 64,
        "old_candidate": "candidate-" + "d" * 32,
        "new_candidate": "candidate-" + "e" * 32,
    }
    key = generate(tmp_path / "ci")
    with open_store(ref) as st:
        work = tmp_path / "pub"
        old_delta = _submit(
            st, old_fp, kind="delta", tag=names["old_delta"], days_ago=30, mp=monkeypatch, tmp=work
        )
        _submit(
            st, new_fp, kind="delta", tag=names["new_delta"], days_ago=1, mp=monkeypatch, tmp=work
        )
        _submit(
            st,
            new_fp,
            kind="delta",
            tag=names["future_delta"],
            days_ago=-365 * 500,
            mp=monkeypatch,
            tmp=work,
        )
        # The old candidate extends sm_80: it shares sm_80's layers.
        _submit(
            st,
            old_fp,
            kind="full",
            tag=names["old_candidate"],
            days_ago=30,
            mp=monkeypatch,
            tmp=work,
        )
        _submit(
            st,
            new_fp,
            kind="full",
            tag=names["new_candidate"],
            days_ago=1,
            mp=monkeypatch,
            tmp=work,
        )
        sign(st, old_delta, load_private_key(key.private))
    done = _prune(ref, "--apply")
    by_tag = {t: d for d in done["decisions"] for t in d["tags"]}
    assert by_tag[names["old_delta"]]["kind"] == "delta"
    assert by_tag[names["old_candidate"]]["kind"] == "candidate"
    gone = {names["old_delta"], names["future_delta"], names["old_candidate"]}
    gone |= {attached_tag(old_delta, "sig")} | set(pushed["sm_80"])
    # sm_80 is the oldest of its groups: nothing but the old candidate held it.
    assert set(done["delete_tags"]) == gone, by_tag
    left = _skopeo_tags(registry, repo)
    assert not gone & left
    assert {names["new_delta"], names["new_candidate"]} <= left
    assert "younger than 7 days" in by_tag[names["new_delta"]]["reason"]
    # --older-than sets how long a submission stays.
    dry = _prune(ref, "--older-than", "0.5")
    assert set(dry["delete_tags"]) == {names["new_delta"], names["new_candidate"]}


def test_with_verify_key_signed_artifacts_rank_ahead_of_unsigned_ones(
    local_fp: Fingerprint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Junk pushed seconds after the legitimate artifacts, unsigned, pushes none of them out."""
    root = tmp_path / "store"
    ref = f"oci:{root}"
    pushed = _fill(ref, local_fp, tmp_path, monkeypatch)
    key = generate(tmp_path / "ci")
    st = LayoutStore(root)
    for arch in ARCHES:
        digest = st.tag_digest(_tag(pushed[arch], "fp-"))
        assert digest
        sign(st, digest, load_private_key(key.private))
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 3600))
    junk = _junk(st, _tag(pushed["sm_90a"], "fp-"), now, 3)
    fp_tags = {_tag(pushed[a], "fp-") for a in ARCHES}
    # Without a policy, age alone: the junk is newest and the older signed ones go.
    unsigned = _prune(ref, "--keep-last", "3")
    assert fp_tags <= set(unsigned["delete_tags"])
    signed = _prune(ref, "--keep-last", "3", "--verify-key", key.public)
    # With it: the three newest signed stay, the oldest goes (with its signature), junk goes.
    assert fp_tags & set(signed["delete_tags"]) == {_tag(pushed["sm_80"], "fp-")}
    assert set(junk) <= set(signed["delete_tags"])
