"""Agreement: the artifact a build publishes is the one a pod picks, from every source.

One harvest of synthetic caches (a Triton and a generic cache, as a build's
last step publishes them: ``fp-<hash>`` plus one single-family manifest per
family) is served five ways: the real Debian ``docker-registry``, a local OCI
layout, a node store in front of the registry, a derived image's baked store
(``--from-dir``) and the artifact's layers merged as a runtime mounts an image
volume (``--from-dir``). A pod on the same machine restores from each with
the real CLI, and the plans and installed markers are compared family by
family: for a full hit (the pod's own fingerprint) and a partial one (a pod
whose fingerprint differs only in its workload, which neither family's scope
holds, so each family resolves by its scope tag).

And the rule has one owner: a structural test fails when a second copy of the
tag-selection rule or a second plan builder appears in the package.
"""

from __future__ import annotations

import ast
import json
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cachetrees import build_caches
from conftest import clean_env, run_artifactd
from images import mount_artifact
from registry_server import RegistryServer

import artifactd
from artifactd.format.config import LayerRecord
from artifactd.hashing import digest_of
from artifactd.stores import open_store
from artifactd.stores.artifacts import copy_between, read_artifact

#: The package under test (the one imported, wherever it is).
PACKAGE = Path(artifactd.__file__).resolve().parent
ARCH = "sm_90a"
BUILT = "model=a"
#: A pod whose fingerprint differs from the build's only in its workload:
#: neither family's scope holds it, so both resolve by their scope tags.
OTHER = "model=b"
FAMILIES = ("generic", "triton")
#: A pod selects the families it uses, as its init container says (--family).
SELECT = tuple(arg for family in FAMILIES for arg in ("--family", family))
#: How long one restore may take, at most (seconds).
TIMEOUT = 120


@dataclass
class Published:
    """What the harvest published: the whole artifact and each family's manifest and record."""

    store: str
    fingerprint_hash: str
    tag: str
    digest: str
    records: dict[str, LayerRecord]
    family_tags: dict[str, str]
    family_digests: dict[str, str]


def _harvest(store: str, environ: dict[str, str], workload: str) -> dict[str, Any]:
    proc = run_artifactd(
        "harvest", "--store", store, "--gpu-arch", ARCH, "--workload", workload, "--json",
        env=clean_env(environ), timeout=TIMEOUT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def _published(store: str, doc: dict[str, Any]) -> Published:
    tag = next(t for t in doc["tags"] if t.startswith("fp-"))
    with open_store(store) as st:
        art = read_artifact(st, tag)
        assert art is not None
        records = {rec.family: rec for rec in art.config.layers}
        family_tags = {f: next(t for t in doc["tags"] if t.startswith(f"{f}-")) for f in FAMILIES}
        family_digests = {f: st.tag_digest(t) or "" for f, t in family_tags.items()}
    assert set(records) == set(FAMILIES)
    return Published(
        store, doc["fingerprint_hash"], tag, art.digest, records, family_tags, family_digests
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Published, dict[str, str]]:
    """The build's publication (workload ``model=a``), and the environ that harvested it."""
    root = tmp_path_factory.mktemp("agreement")
    environ = build_caches(root / "caches")
    store = f"oci:{root / 'published'}"
    return _published(store, _harvest(store, environ, BUILT)), environ


def restore(*args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """The pod's restore, by the real CLI in its own process, within :data:`TIMEOUT`."""
    proc = run_artifactd(
        "restore", "--gpu-arch", ARCH, *SELECT, "--json", *args, env=clean_env(), timeout=TIMEOUT
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc.get("failure") is None, doc["failure"]
    return proc, doc


def _sources(
    pub: Published, registry: RegistryServer, tmp: Path, *, image: bool
) -> dict[str, list[str]]:
    """The five sources, each holding exactly what the build published.

    ``image`` names the baked store by the image's root (found by the pod's
    own fingerprint hash), else the baked layout itself (for any fingerprint).
    """
    ref = registry.ref(f"t/agreement-{uuid.uuid4().hex[:12]}")
    copy_between(pub.store, ref, None)
    layout = f"oci:{tmp / 'layout'}"
    copy_between(pub.store, layout, None)
    baked = tmp / "image" / "opt" / "prebuilt-cache" / pub.fingerprint_hash
    copy_between(pub.store, f"oci:{baked}", None)
    mount_artifact(pub.store, pub.tag, tmp / "mounted")
    return {
        "registry": ["--store", ref],
        "layout": ["--store", layout],
        "node-store": ["--store", ref, "--node-store", f"oci:{tmp / 'node'}"],
        "baked": ["--from-dir", str(tmp / "image" if image else baked)],
        "tree": ["--from-dir", str(tmp / "mounted")],
    }


def _picks(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per family, what the plan picked: artifact, tag, source, layer digest and content."""
    out = {}
    assert [fam["family"] for fam in doc["plan"]["families"]] == list(FAMILIES)
    for fam in doc["plan"]["families"]:
        layer = fam["layer"] or {}
        out[fam["family"]] = {
            "verdict": fam["verdict"],
            "artifact": fam["artifact"],
            "tag": fam["tag"],
            "source": fam["source"],
            "layer": layer.get("digest"),
            "scope_key": layer.get("scope_key"),
            "files": layer.get("files"),
        }
    return out


def _marker(target: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((target / ".artifactd" / "restored.json").read_bytes())
    for fam in doc["families"].values():
        del fam["dirs"]  # each under its own target
    del doc["restored_at"], doc["env"], doc["store"]
    doc.pop("restore_seconds", None)  # how long this restore took
    return doc


def _installed(target: Path) -> dict[str, bytes]:
    """Every cache file, except what names its own root (Triton's group files, the env file)."""
    return {
        str(p.relative_to(target)): p.read_bytes()
        for p in sorted(target.rglob("*"))
        if p.is_file()
        and ".artifactd" not in p.parts
        and "__grp__" not in p.name
        and p.name != "artifactd.env"
    }


def _tree_digest(rec: LayerRecord) -> str:
    """How a mounted tree names a family: the digest of the record's own tree document."""
    return digest_of(rec.tree().canonical())


def _restore_everywhere(
    sources: dict[str, list[str]], tmp: Path, workload: str
) -> dict[str, tuple[dict[str, Any], Path]]:
    out = {}
    for name, source in sources.items():
        target = tmp / f"pod-{name}"
        proc, doc = restore(*source, "--workload", workload, "--target", str(target), "--require")
        assert proc.returncode == 0 and doc["status"] == "restored", (name, doc)
        assert doc["plan"]["unbound"] == {}, (name, doc["plan"]["unbound"])
        out[name] = (doc, target)
    return out


def test_a_full_hit_picks_the_published_artifact_from_every_source(
    built: tuple[Published, dict[str, str]], registry: RegistryServer, tmp_path: Path
) -> None:
    pub, _ = built
    sources = _sources(pub, registry, tmp_path, image=True)
    done = _restore_everywhere(sources, tmp_path, BUILT)
    # Every store resolves the whole artifact's tag: the published one, family by family.
    stores = {n: v for n, v in done.items() if n != "tree"}
    for name, (doc, _) in stores.items():
        assert doc["plan"]["fingerprint_hash"] == pub.fingerprint_hash
        assert doc["match"] == "full", name
        for family, pick in _picks(doc).items():
            rec = pub.records[family]
            assert pick == {
                "verdict": "hit",
                "artifact": pub.digest,
                "tag": pub.tag,
                "source": "full",
                "layer": rec.digest,
                "scope_key": rec.scope_key,
                "files": [f.model_dump(mode="json") for f in rec.files],
            }, (name, family)
    markers = {name: _marker(target) for name, (_, target) in stores.items()}
    assert all(m == markers["registry"] for m in markers.values()), markers
    # A mounted tree has no fp-<hash> tag: each family resolves by its scope tag,
    # to the published record's own files.
    doc, _ = done["tree"]
    assert doc["match"] == "partial"
    for family, pick in _picks(doc).items():
        rec = pub.records[family]
        assert pick["tag"] == pub.family_tags[family] and pick["source"] == "family"
        assert pick["artifact"] == pick["layer"] == _tree_digest(rec)
        assert pick["scope_key"] == rec.scope_key
        assert pick["files"] == [f.model_dump(mode="json") for f in rec.files]
    installed = {name: _installed(target) for name, (_, target) in done.items()}
    assert installed["registry"] and all(i == installed["registry"] for i in installed.values())


def test_a_partial_hit_picks_each_published_family_from_every_source(
    built: tuple[Published, dict[str, str]], registry: RegistryServer, tmp_path: Path
) -> None:
    """Another workload: no fp tag for it anywhere, every family by its scope tag, alike."""
    pub, _ = built
    sources = _sources(pub, registry, tmp_path, image=False)
    done = _restore_everywhere(sources, tmp_path, OTHER)
    for name, (doc, _) in done.items():
        assert doc["plan"]["fingerprint_hash"] != pub.fingerprint_hash
        assert doc["match"] == "partial", (name, doc["match"])
        for family, pick in _picks(doc).items():
            rec = pub.records[family]
            tree = name == "tree"
            assert pick["verdict"] == "hit" and pick["source"] == "family", (name, family)
            assert pick["tag"] == pub.family_tags[family], (name, family)
            # A store names the single-family manifest the build published; a tree, the
            # document of the same record.
            want = _tree_digest(rec) if tree else pub.family_digests[family]
            assert pick["artifact"] == want, (name, family)
            assert pick["layer"] == (_tree_digest(rec) if tree else rec.digest)
            assert pick["scope_key"] == rec.scope_key
            assert pick["files"] == [f.model_dump(mode="json") for f in rec.files]
    markers = {name: _marker(target) for name, (_, target) in done.items()}
    shape = {
        name: {
            "match": m["match"],
            "missed": m["missed"],
            "families": {
                f: (v["tag"], v["source"], v["scope_key"]) for f, v in m["families"].items()
            },
        }
        for name, m in markers.items()
    }
    assert all(s == shape["registry"] for s in shape.values()), shape
    installed = {name: _installed(target) for name, (_, target) in done.items()}
    assert installed["registry"] and all(i == installed["registry"] for i in installed.values())
    # Each source agrees with itself too: a restart is a no-op everywhere.
    for name, source in sources.items():
        target = str(tmp_path / f"pod-{name}")
        _, doc = restore(*source, "--workload", OTHER, "--target", target)
        assert doc["status"] == "noop", (name, doc["status"])


def test_a_warm_node_store_picks_what_the_registry_picks_after_a_publish(
    built: tuple[Published, dict[str, str]],
    registry: RegistryServer,
    repo: str,
    tmp_path: Path,
) -> None:
    """A node store that went warm on family tags picks the whole artifact published since.

    The node resolves by the families' scope tags while the registry has no
    artifact for the pod's fingerprint; CI then publishes one. A pod asking the
    registry picks it; a pod on the warm node must pick it too, not keep
    restoring the older family manifests the node already holds.
    """
    pub, environ = built
    ref = registry.ref(repo)
    copy_between(pub.store, ref, None)
    node = ["--store", ref, "--node-store", f"oci:{tmp_path / 'node'}", "--workload", OTHER]
    _, doc = restore(*node, "--target", str(tmp_path / "first"))
    assert doc["status"] == "restored" and doc["match"] == "partial", doc
    theirs = _published(ref, _harvest(ref, environ, OTHER))
    _, direct = restore("--store", ref, "--workload", OTHER, "--target", str(tmp_path / "d"))
    assert (
        direct["match"] == "full" and direct["plan"]["fingerprint_hash"] == theirs.fingerprint_hash
    )
    _, via_node = restore(*node, "--target", str(tmp_path / "second"))
    assert via_node["status"] == "restored", via_node
    assert via_node["match"] == "full", via_node["plan"]["families"]
    assert _picks(via_node) == _picks(direct)
    assert _marker(tmp_path / "second") == _marker(tmp_path / "d")


def test_a_tree_no_op_rechecks_the_scope_key_a_marker_records_as_a_store_does(
    built: tuple[Published, dict[str, str]], tmp_path: Path
) -> None:
    """The no-op check is the rule's, for every source: one marker, one verdict.

    A marker that records another scope key for an installed family (what a
    release that did not check binding left behind) is not trusted by a
    store's no-op; a mounted tree's must not trust it either.
    """
    pub, _ = built
    layout = tmp_path / "layout"
    copy_between(pub.store, f"oci:{layout}", None)
    mount_artifact(pub.store, pub.tag, tmp_path / "mounted")
    sources = {
        "layout": ["--store", f"oci:{layout}"],
        "tree": ["--from-dir", str(tmp_path / "mounted")],
    }
    for name, source in sources.items():
        target = tmp_path / f"pod-{name}"
        args = (*source, "--workload", OTHER, "--target", str(target))
        assert restore(*args)[1]["status"] == "restored"
        assert restore(*args)[1]["status"] == "noop"
        path = target / ".artifactd" / "restored.json"
        marker = json.loads(path.read_bytes())
        marker["families"]["generic"]["scope_key"] = "0" * 64
        path.write_text(json.dumps(marker))
        _, doc = restore(*args)
        assert doc["status"] == "restored", (name, doc["status"])
        rewritten = json.loads(path.read_bytes())
        assert rewritten["families"]["generic"]["scope_key"] == pub.records["generic"].scope_key


# --------------------------------------------------------------------------
# One owner: the rule lives in artifactd/restore/resolve.py alone
# --------------------------------------------------------------------------

#: What names a restore's tags or keys: the selection rule's vocabulary.
RULE_CALLS = {"full_tag", "family_tag", "scope_key"}
#: Modules that call them for something other than choosing what to restore.
ALLOWED = {
    "restore/resolve.py": "the selection rule itself",
    "stores/artifacts.py": "tags what it publishes, from the artifact's own records",
    "images/append.py": "tags what it bakes into an image, from the artifact's own records",
    "build/harvest.py": "records each family's scope key in the artifact it packs",
    "fingerprint/diff.py": "explains which fields decide a family's verdict",
    "fingerprint/model.py": "the model's own scope_key method",
    "build/candidate.py": "checks the promoted artifact a candidate extends still holds its tag",
    "stores/retention.py": "tells the scheme's own tags from promotions, to keep the latter",
}


def _modules() -> dict[str, ast.Module]:
    return {
        str(p.relative_to(PACKAGE)): ast.parse(p.read_text(), str(p))
        for p in sorted(PACKAGE.rglob("*.py"))
    }


def _called(tree: ast.AST) -> list[tuple[str, int]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name is not None:
                out.append((name, node.lineno))
    return out


def test_only_resolve_names_the_tags_a_restore_reads() -> None:
    """A second copy of "fp tag, else each family's scope tag" fails here, wherever it appears."""
    copies = [
        f"{path}:{line} calls {name}()"
        for path, tree in _modules().items()
        if path not in ALLOWED
        for name, line in _called(tree)
        if name in RULE_CALLS
    ]
    assert copies == [], (
        "the selection rule belongs to artifactd/restore/resolve.py:\n" + "\n".join(copies)
    )


def test_one_plan_builder_and_no_dispatch_on_the_kind_of_source() -> None:
    """Only resolve builds a plan; restore and resolve never ask which kind of source they hold."""
    modules = _modules()
    builders = [
        f"{path}:{line}"
        for path, tree in modules.items()
        if path != "restore/resolve.py"
        for name, line in _called(tree)
        if name in {"RestorePlan", "FamilyPlan"} or name == "hit"
    ]
    assert builders == [], builders
    kinds = {"Store", "LayoutStore", "RegistryStore", "MountedTree"}
    dispatch = []
    for path in (
        "restore/install.py",
        "restore/policy.py",
        "restore/resolve.py",
        "stores/nodestore.py",
        "restore/nodefill.py",
    ):
        for node in ast.walk(modules[path]):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "isinstance"
            ):
                names = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
                if names & kinds:
                    dispatch.append(f"{path}:{node.lineno}")
    assert dispatch == [], dispatch
