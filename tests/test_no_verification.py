"""A restore that verifies nothing says so: ``UNSAFE_NO_VERIFICATION``, never a forgotten argument.

The restore side's "no verification" was ``trust=None``, the default of
``plan_restore``: a caller that forgot the policy restored unverified, and
nothing read as unsafe. Now the policy is a required keyword (mypy refuses a
call without it), ``None`` is refused at run time, and
:func:`artifactd.trust.policy.verification` is the one place that turns "no
``--verify-key`` configured" into the named opt-out, for ``restore`` and
``verify`` alike. Real stores (an OCI layout) and real keys; the one stand-in
is a recorder around ``plan_restore`` that passes every call through.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import clean_env, run_artifactd_json
from test_trust import RECORDER

import artifactd.restore.policy as restore_policy
from artifactd.build.absorb import absorb
from artifactd.build.harvest import harvest
from artifactd.fingerprint.model import Fingerprint
from artifactd.restore.destination import MARKER_NAME, STATE_DIR
from artifactd.restore.policy import RestoreRequest, run_restore
from artifactd.restore.resolve import plan_restore
from artifactd.restore.source import StoreSource
from artifactd.stores import open_store
from artifactd.stores.artifacts import choose_artifacts, copy_artifacts, open_artifact
from artifactd.stores.layout import LayoutStore
from artifactd.stores.retention import Rules, plan
from artifactd.trust.keys import generate, load_public_keys
from artifactd.trust.policy import UNSAFE_NO_VERIFICATION, TrustPolicy, verification


@pytest.fixture
def store(tmp_path: Path, caches: dict[str, str], local_fp: Fingerprint) -> LayoutStore:
    """A local layout holding an unsigned artifact for ``local_fp``."""
    st = open_store(f"oci:{tmp_path / 'store'}", create=True)
    assert isinstance(st, LayoutStore)
    harvest(st, local_fp, environ=caches)
    return st


def test_a_restore_without_a_policy_is_refused(
    tmp_path: Path, store: LayoutStore, local_fp: Fingerprint
) -> None:
    source = StoreSource(store)
    target = tmp_path / "target"
    with pytest.raises(TypeError, match="trust"):
        plan_restore(source, local_fp, target)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="UNSAFE_NO_VERIFICATION"):
        plan_restore(source, local_fp, target, trust=None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="UNSAFE_NO_VERIFICATION"):
        plan_restore(None, local_fp, target, trust=None, store_error="x")  # type: ignore[arg-type]
    assert not target.exists()
    # Said out loud, the same restore resolves: the store's artifact is unsigned.
    plan = plan_restore(source, local_fp, target, trust=UNSAFE_NO_VERIFICATION)
    assert plan.match == "full"
    assert plan.trusted is None
    assert all(f.signed_by is None for f in plan.hits)


def test_no_key_configured_is_the_named_unsafe_policy_and_a_key_is_a_policy(
    tmp_path: Path,
) -> None:
    assert verification(()) is UNSAFE_NO_VERIFICATION
    assert repr(verification([])) == "UNSAFE_NO_VERIFICATION"
    pair = generate(tmp_path / "one")
    policy = verification([str(pair.public)])
    assert isinstance(policy, TrustPolicy)
    assert len(policy.key_ids) == 1


@pytest.mark.parametrize("with_key", [False, True])
def test_the_restore_command_plans_under_the_policy_verification_decides(
    tmp_path: Path,
    store: LayoutStore,
    local_fp: Fingerprint,
    monkeypatch: pytest.MonkeyPatch,
    with_key: bool,
) -> None:
    """``restore`` hands plan_restore the named opt-out without a key, a policy with one."""
    seen: list[Any] = []

    def recording(source: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append((source is not None, kwargs["trust"]))
        return plan_restore(source, *args, **kwargs)

    monkeypatch.setattr(restore_policy, "plan_restore", recording)
    keys = (str(generate(tmp_path / "one").public),) if with_key else ()
    request = RestoreRequest(store=store.ref, target=tmp_path / "target", verify_keys=keys)
    outcome = run_restore(request, local_fp.model_dump(mode="json"))
    resolved = [trust for has_source, trust in seen if has_source]
    assert len(resolved) == 1
    if with_key:
        assert isinstance(resolved[0], TrustPolicy)
        # The artifact is unsigned: refused, nothing installed (the failure's
        # plan has no source to resolve from, so nothing to verify either).
        assert seen[1:] == [(False, UNSAFE_NO_VERIFICATION)]
        assert outcome.status == "failed"
        assert outcome.failure is not None and outcome.failure.kind == "untrusted"
        assert not (tmp_path / "target" / "triton").exists()
    else:
        assert seen == [(True, UNSAFE_NO_VERIFICATION)]
        assert outcome.status == "restored"
        assert outcome.plan.trusted is None


def test_the_gate_restores_every_cell_under_its_policy(tmp_path: Path) -> None:
    """``verify --verify-key``: each cell's restore verifies, as a pod's does (see its marker)."""
    (tmp_path / "cell.py").write_text(RECORDER)
    matrix = tmp_path / "tiny.yaml"
    matrix.write_text(
        "name: tiny\nfamilies: [generic]\ngpus: 0\n"
        "base_image: sha256:" + "ab" * 32 + "\n"
        "axes:\n  batch: [1]\n"
        f'command: "{{{{ python }}}} {tmp_path / "cell.py"} {{{{ batch }}}}"\n'
    )
    pair = generate(tmp_path / "keys" / "one")
    (key,) = load_public_keys([str(pair.public)])
    env = {**clean_env(), "HOME": str(tmp_path / "home"), "TMPDIR": str(tmp_path)}
    store = f"oci:{tmp_path / 'store'}"
    common = ("--store", store, "--gpu-arch", "sm_90a", "--json")
    run_artifactd_json("build", str(matrix), *common, "--sign-key", str(pair.private), env=env)
    roots = tmp_path / "roots"
    gate = run_artifactd_json(
        "verify", str(matrix), *common, "--verify-key", str(pair.public),
        "--keep-roots", str(roots), env=env, timeout=300,
    )  # fmt: skip
    assert gate["passed"] is True
    markers = sorted(roots.glob(f"cells/*/{STATE_DIR}/{MARKER_NAME}"))
    assert len(markers) == 1
    families = json.loads(markers[0].read_text())["families"]
    assert {name: fam.get("signed_by") for name, fam in families.items()} == {"generic": key.id}


def test_the_store_side_says_which_basis_too(tmp_path: Path, store: LayoutStore) -> None:
    """Copy, open, prune and absorb: a policy or the named opt-out, never a forgotten None.

    A copy into the node store, an image bake, a prune's ranking and an absorb's
    screening each act on a store's content; each takes the basis it acts on.
    """

    tag = next(t for t in store.list_tags() if t.startswith("fp-"))
    dst = open_store(f"oci:{tmp_path / 'dst'}", create=True)
    refusals: list[Callable[[], object]] = [
        lambda: choose_artifacts(store, [tag], trust=None),  # type: ignore[arg-type]
        lambda: copy_artifacts(store, dst, [tag], tmp_path, trust=None),  # type: ignore[arg-type]
        lambda: open_artifact(f"{store.ref}:{tag}", trust=None),  # type: ignore[arg-type]
        lambda: plan(store, Rules(trust=None)),  # type: ignore[arg-type]
        lambda: absorb(tmp_path / "m.yaml", store, store, trust=None),  # type: ignore[arg-type]
    ]
    for call in refusals:
        with pytest.raises(TypeError, match="UNSAFE_NO_VERIFICATION"):
            call()
    assert dst.list_tags() == [], "a refused copy wrote to its destination"
    with pytest.raises(TypeError):
        Rules()  # type: ignore[call-arg]
    # Said out loud, each acts: the copy lands, unverified.
    copied = copy_artifacts(store, dst, [tag], tmp_path, trust=UNSAFE_NO_VERIFICATION)
    assert copied.tags == [tag] and copied.verified == {}
    assert open_artifact(f"{dst.ref}:{tag}", trust=UNSAFE_NO_VERIFICATION).config.kind == "full"
