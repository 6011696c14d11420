"""NFD labels for what a node store holds: bounded, valid Kubernetes label keys, written atomically.

The node stores here are real OCI layouts: filled by real restores (the CLI in
its own process, ``--node-store``) from a layout store that real harvests
wrote, and, for hostile tag names, tagged through the layout's own API.
Kubernetes' label rules are written out again here, independently of
:mod:`artifactd.pod.nodefeatures` (the ``kubernetes`` client ships no
validator): a key is an optional DNS-1123 subdomain prefix (at most 253
characters) and ``/``, then a name of at most 63 characters,
``([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest
from cachetrees import make_generic_tree
from conftest import clean_env, run_artifactd
from hypothesis import given, settings
from hypothesis import strategies as st

from artifactd.errors import TargetError, UsageError
from artifactd.pod.nodefeatures import (
    fingerprint_label,
    label_name,
    node_labels,
    valid_label_key,
    write_features,
)
from artifactd.stores.layout import LayoutStore

#: An OCI tag, as the distribution spec allows it.
OCI_TAG = r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}"


def k8s_label_key(key: str) -> bool:
    """Kubernetes' rule for a label key (the module doc), the test's own copy."""
    prefix, slash, name = key.rpartition("/")
    if slash:
        part = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
        if len(prefix) > 253 or not re.fullmatch(rf"{part}(\.{part})*", prefix):
            return False
    return (
        0 < len(name) <= 63
        and re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", name) is not None
    )


@settings(max_examples=400, deadline=None)
@given(st.from_regex(OCI_TAG, fullmatch=True))
def test_every_oci_tag_becomes_a_valid_label_key(tag: str) -> None:
    key = f"artifactd.io/{label_name(tag)}"
    assert k8s_label_key(key), key
    assert valid_label_key(key)
    if len(tag) <= 63 and k8s_label_key(tag):
        assert label_name(tag) == tag or tag.startswith("fp-"), "a valid tag is kept as it is"


@settings(max_examples=200, deadline=None)
@given(st.from_regex(OCI_TAG, fullmatch=True), st.from_regex(OCI_TAG, fullmatch=True))
def test_distinct_tags_get_distinct_labels(a: str, b: str) -> None:
    # fp tags keep 16 hex digits, and a cut tag ends with 12 of its SHA-256: a
    # collision needs a hash prefix collision, which this search does not find.
    if a != b and not (a.startswith("fp-") or b.startswith("fp-")):
        assert label_name(a) != label_name(b), (a, b)


def test_fingerprint_tags_keep_16_hex_and_the_validator_refuses_what_kubernetes_does() -> None:
    fp = "0123456789abcdef" * 4
    assert label_name(f"fp-{fp}") == "fp-0123456789abcdef"
    assert fingerprint_label(fp) == "artifactd.io/fp-0123456789abcdef"
    long = "x" * 100
    assert len(label_name(long)) == 63 and label_name(long).startswith("x" * 50)
    assert label_name("_private-") == label_name("_private-")  # stable
    assert re.fullmatch(r"private-[0-9a-f]{12}", label_name("_private-"))
    assert re.fullmatch(r"tag-[0-9a-f]{12}", label_name("___"))
    for bad in ("Artifactd.io/x", "artifactd.io/-x", "a/" + "x" * 64, "a_b.io/x", "a/x/"):
        assert not valid_label_key(bad) and not k8s_label_key(bad), bad
    for good in ("artifactd.io/x", "x", "a.b-c.io/A_b.c-9", "a/" + "x" * 63):
        assert valid_label_key(good) and k8s_label_key(good), good


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A node store filled by three real restores of three workloads (read only: copy to change)."""
    tmp_path = tmp_path_factory.mktemp("nodefeatures")
    tree = make_generic_tree(tmp_path / "gen")
    env = clean_env({"HOME": str(tmp_path / "home"), "ARTIFACTD_GENERIC_DIR": str(tree)})
    store = f"oci:{tmp_path / 'store'}"
    for model in ("m1", "m2", "m3"):
        w = ("--workload", f"model={model}")
        proc = run_artifactd("harvest", "--store", store, "--family", "generic", *w, env=env)
        assert proc.returncode == 0, proc.stderr
    for model in ("m2", "m3", "m1"):
        proc = run_artifactd(
            "restore", "--store", store, "--node-store", f"oci:{tmp_path / 'node'}",
            "--family", "generic", "--workload", f"model={model}",
            "--target", str(tmp_path / f"t-{model}"), "--require", env=env,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
    return tmp_path / "node"


def test_labels_are_bounded_most_recently_used_first(node: Path) -> None:
    store = LayoutStore(node)
    fps = [t for t in store.list_tags() if t.startswith("fp-")]
    assert len(fps) == 3
    every = node_labels(store, max_labels=100)
    # Each workload's artifact and the family's scope tag(s): each one label, all valid.
    assert len(every) == len(store.list_tags()) and all(map(k8s_label_key, every))
    assert node_labels(store, max_labels=0) == []
    two = node_labels(store, max_labels=2)
    assert len(two) == 2 and two == every[:2]
    # The last restore (m1) used its fingerprint most recently: first.
    usage = json.loads((node / ".artifactd-last-used.json").read_text())
    newest = max(fps, key=lambda t: usage.get(store.tag_digest(t) or "", 0.0))
    assert every[0] == fingerprint_label(newest[3:]), (every, newest)
    with pytest.raises(UsageError):
        node_labels(store, max_labels=-1)
    with pytest.raises(UsageError):
        node_labels(store, prefix="Not_A.Domain")


def test_hostile_tags_in_the_node_store_become_valid_labels(node: Path, tmp_path: Path) -> None:
    store = LayoutStore(Path(shutil.copytree(node, tmp_path / "node")))
    digest = store.tag_digest(next(t for t in store.list_tags() if t.startswith("fp-")))
    assert digest
    ref = store.get_manifest(digest)
    assert ref is not None
    hostile = ["_leading", "trailing.", "x" * 128, "a..b--c__d", "fp-NOTHEX", "-".join("9" * 40)]
    store.put_manifest(ref.data, ref.media_type, hostile)
    keys = node_labels(store, max_labels=100)
    assert len(keys) == len(set(keys)) >= len(hostile)
    assert all(k8s_label_key(k) for k in keys), keys


def test_the_features_file_is_replaced_atomically_and_lists_the_labels(
    node: Path, tmp_path: Path
) -> None:
    features = tmp_path / "features.d"
    out = features / "artifactd"
    proc = run_artifactd(
        "node-features", "--store", f"oci:{node}", "--out", str(out), "--max-labels", "3",
        "--json", env=clean_env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["schema_version"] == 1 and doc["store"] == f"oci:{node}"
    lines = [ln for ln in out.read_text().splitlines() if ln and not ln.startswith("#")]
    assert lines == [f"{k}=true" for k in doc["labels"]] and len(lines) == 3
    first = os.stat(out).st_ino
    keys = write_features(node, out, max_labels=1)
    assert len(keys) == 1
    # A new file renamed over the old one: a reader holds the old or the new, never a part.
    assert os.stat(out).st_ino != first
    assert sorted(p.name for p in features.iterdir()) == ["artifactd"], "a temp file was left"
    # A node store not made yet: no labels, so a node's stale labels go.
    assert write_features(tmp_path / "no-store", out) == []
    assert [ln for ln in out.read_text().splitlines() if not ln.startswith("#")] == []


def test_an_unwritable_features_file_is_an_error_with_a_hint(node: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(TargetError, match="cannot write the node features") as err:
        write_features(node, blocker / "features")
    assert err.value.hint
    proc = run_artifactd(
        "node-features", "--store", f"oci:{node}", "--out", str(blocker / "features"),
        env=clean_env(),
    )  # fmt: skip
    assert proc.returncode != 0 and "hint:" in proc.stderr and "Traceback" not in proc.stderr


def test_node_features_is_not_quadratic_in_the_number_of_tags(node: Path, tmp_path: Path) -> None:
    """20,000 tags on one node store: labels in bounded time (a ceiling, not a benchmark).

    The tags are real index entries written through the layout's own API, all
    naming one real manifest; the ceiling is generous (a lookup per tag, as
    before, took minutes for 20,000).
    """
    count = 20_000
    store = LayoutStore(Path(shutil.copytree(node, tmp_path / "node")))
    digest = store.tag_digest(next(t for t in store.list_tags() if t.startswith("fp-")))
    ref = store.get_manifest(digest or "")
    assert ref is not None
    many = [f"fp-{hashlib.sha256(str(i).encode()).hexdigest()}" for i in range(count)]
    store.put_manifest(ref.data, ref.media_type, many)
    out = tmp_path / "features"
    start = time.monotonic()
    proc = run_artifactd(
        "node-features", "--store", f"oci:{store.root}", "--out", str(out),
        "--max-labels", "16", "--json", env=clean_env(), timeout=60,
    )  # fmt: skip
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr
    labels = json.loads(proc.stdout)["labels"]
    assert len(labels) == 16 and all(map(k8s_label_key, labels))
    assert elapsed < 30, f"{count} tags took {elapsed:.1f} s"
    assert len(store.list_tags()) >= count
