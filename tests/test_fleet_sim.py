"""The rollout simulation (bench/fleet.py): the model's invariants, pure and fast.

No registry and no network: the simulation is arithmetic over a heap of
events, so each test states a property of the model that a wrong sharing rule,
a lost byte or a scheduling slip would break, and checks it on small rollouts
(hypothesis draws them) or on one node where the answer is a formula.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import fleet
from fleet import GBIT, MIB, RANGES, SCENARIOS, Node, Outcome, Params, simulate

#: Relative slack for float sums over thousands of events.
REL = 1e-9
#: The same examples on every run: no flaky discoveries in CI.
SETTINGS = settings(deadline=None, database=None, derandomize=True)


def close(a: float, b: float, rel: float = REL) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-6)


rollouts = st.builds(
    Params,
    nodes=st.integers(10, 60),
    pods_per_node=st.integers(1, 8),
    gb=st.sampled_from([0.5, 2.0, 12.0]),
    files=st.integers(1, 50_000),
    layers=st.integers(1, 8),
    registry_gbps=st.sampled_from([0.5, 2.0, 10.0, 40.0]),
    nic_gbps=st.sampled_from([1.0, 10.0, 25.0]),
    disk_mibps=st.sampled_from([200.0, 2_000.0]),
    mirrors=st.integers(1, 6),
    mirror_gbps=st.sampled_from([1.0, 10.0, 100.0]),
    p2p_origin_slots=st.integers(1, 6),
    ramp=st.sampled_from([0.0, 5.0, 60.0]),
    jitter=st.sampled_from([0.0, 0.1, 0.5]),
    seed=st.integers(0, 1_000),
)


def one_node(p: Params, nic_gbps: float) -> list[Node]:
    return [Node(start=0.0, nic=nic_gbps * GBIT, disk=p.disk_mibps * MIB)]


@pytest.mark.parametrize(("registry_gbps", "nic_gbps"), [(10.0, 25.0), (40.0, 25.0)])
@pytest.mark.parametrize("pods", [1, 4])
@pytest.mark.parametrize("disk_mibps", [2_000.0, 200.0])
def test_one_node_direct_is_its_transfer_then_its_restore(
    registry_gbps: float, nic_gbps: float, pods: int, disk_mibps: float
) -> None:
    """One node alone: its pods' bytes at min(egress, NIC), then one restore (disk shared)."""
    p = Params(
        pods_per_node=pods, registry_gbps=registry_gbps, nic_gbps=nic_gbps, disk_mibps=disk_mibps
    )
    out = simulate(p, "direct", one_node(p, nic_gbps))
    transfer = pods * p.artifact_bytes / (min(registry_gbps, nic_gbps) * GBIT)
    rate = min(p.restore_mibps * MIB, p.disk_mibps * MIB / pods)
    restore = p.restore_overhead_s + p.files / p.restore_files_per_s + p.artifact_bytes / rate
    assert len(out.warm) == pods
    for t in out.warm:
        assert close(t, transfer + restore)
    # The node store pulls once for all of them: the same restore after one artifact's transfer.
    stored = simulate(p, "node-store", one_node(p, nic_gbps))
    single = p.artifact_bytes / (min(registry_gbps, nic_gbps) * GBIT)
    assert all(close(t, single + restore) for t in stored.warm)
    # Alone, the swarm and a mirror faster than the registry change nothing but the route.
    alone = simulate(p, "p2p", one_node(p, nic_gbps))
    assert all(close(t, single + restore) for t in alone.warm)


@settings(SETTINGS, max_examples=25)
@given(rollouts)
def test_node_store_with_one_pod_per_node_is_direct(p: Params) -> None:
    """With one pod a node, a node-store fill is the pod's own pull: same times, same bytes."""
    p = dataclasses.replace(p, pods_per_node=1)
    direct, stored = simulate(p, "direct"), simulate(p, "node-store")
    assert direct.node_warm == stored.node_warm
    assert direct.registry_bytes == stored.registry_bytes


@settings(SETTINGS, max_examples=25)
@given(rollouts)
def test_bytes_are_conserved_and_the_tiers_spare_the_registry(p: Params) -> None:
    """Every byte a node receives left exactly one source; no tier sends more than direct."""
    out = {s: simulate(p, s) for s in SCENARIOS}
    artifact = p.artifact_bytes
    assert close(out["direct"].delivered_bytes, p.nodes * p.pods_per_node * artifact)
    assert close(out["direct"].registry_bytes, out["direct"].delivered_bytes)
    assert close(out["node-store"].registry_bytes, p.nodes * artifact)
    for s in ("node-store", "mirror", "p2p"):
        assert close(out[s].delivered_bytes, p.nodes * artifact), s
        assert out[s].registry_bytes <= out["direct"].registry_bytes * (1 + REL), s
    # A mirror pulls each layer once from the registry and sends every node's bytes.
    used = min(p.mirrors, p.nodes)
    assert close(out["mirror"].registry_bytes, used * artifact)
    assert close(out["mirror"].mirror_bytes, out["mirror"].delivered_bytes)
    # In the swarm, each layer a node gets came from the registry or from one peer.
    swarm = out["p2p"]
    assert close(swarm.registry_bytes + swarm.peer_bytes, swarm.delivered_bytes)
    assert swarm.registry_bytes >= artifact * (1 - REL)  # someone had to fetch each layer
    for o in out.values():
        assert len(o.warm) == p.nodes * p.pods_per_node
        assert not any(math.isnan(t) for t in o.node_warm)


@settings(SETTINGS, max_examples=25)
@given(rollouts)
def test_no_pod_is_warm_before_its_bytes_could_arrive(p: Params) -> None:
    """A node's fill is at least its artifact at the rate of its NIC (and of the registry)."""
    nodes = fleet.draw_nodes(p)
    for s in SCENARIOS:
        out = simulate(p, s, nodes)
        per_node = p.pods_per_node if s == "direct" else 1
        for node, warm in zip(nodes, out.node_warm, strict=True):
            rate = node.nic if s != "direct" else min(node.nic, p.registry_gbps * GBIT)
            floor = node.start + per_node * p.artifact_bytes / rate
            assert warm >= floor + fleet.restore_seconds(p, node) - 1e-6, s


@settings(SETTINGS, max_examples=25)
@given(rollouts)
def test_quantiles_are_ordered_and_count_the_pods(p: Params) -> None:
    for s in SCENARIOS:
        out = simulate(p, s)
        t50, t95, t100 = out.at(50), out.at(95), out.at(100)
        assert min(out.warm) <= t50 <= t95 <= t100 == max(out.warm)
        for q, t in ((50, t50), (95, t95)):
            # The earliest time at which at least q percent of the pods are warm.
            assert sum(w <= t for w in out.warm) >= q / 100 * len(out.warm)
            assert sum(w < t for w in out.warm) < q / 100 * len(out.warm)


@settings(SETTINGS, max_examples=20)
@given(rollouts)
def test_doubling_the_registry_egress_never_slows_a_rollout(p: Params) -> None:
    """Direct and node store: never later. Mirror and P2P schedule greedily (who fetches
    which layer from whom depends on when layers arrive), so a faster registry can reorder
    them and cost a quantile a little, as in any list schedule; held under 5 %."""
    faster = dataclasses.replace(p, registry_gbps=p.registry_gbps * 2)
    nodes = fleet.draw_nodes(p)
    for s in SCENARIOS:
        slow, fast = simulate(p, s, nodes), simulate(faster, s, nodes)
        slack = REL if s in ("direct", "node-store") else 0.05
        for q in (50, 95, 100):
            assert fast.at(q) <= slow.at(q) * (1 + slack) + 1e-9, (s, q)


def test_the_tiers_warm_a_large_rollout_sooner() -> None:
    """The rollout of docs/guide/fleet.md: each tier beats the one before, P2P fetches little."""
    p = Params(nodes=1_000)
    out = {o.scenario: o for o in fleet.simulate_all(p)}
    assert out["node-store"].at(100) < out["direct"].at(100) / 4
    assert out["mirror"].at(100) < out["node-store"].at(100)
    assert out["p2p"].at(100) < out["mirror"].at(100)
    assert out["p2p"].registry_bytes < 10 * p.artifact_bytes


@settings(SETTINGS, max_examples=10)
@given(rollouts)
def test_a_seed_decides_the_rollout(p: Params) -> None:
    for s in SCENARIOS:
        a, b = simulate(p, s), simulate(p, s)
        assert (a.warm, a.node_warm, a.registry_bytes, a.peer_bytes) == (
            b.warm,
            b.node_warm,
            b.registry_bytes,
            b.peer_bytes,
        )
    other = dataclasses.replace(p, seed=p.seed + 1, ramp=60.0)
    assert fleet.draw_nodes(other) != fleet.draw_nodes(dataclasses.replace(other, seed=p.seed))


def test_every_input_has_a_range_and_a_meaning() -> None:
    """A new field of Params is bounded and explained, or this fails."""
    names = {f.name for f in dataclasses.fields(Params)}
    assert set(RANGES) == names == set(fleet.MEANINGS)
    assert Params().check() == Params()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("nodes", 9),
        ("nodes", 10_001),
        ("nodes", 12.5),
        ("gb", 0.0),
        ("gb", math.nan),
        ("gb", math.inf),
        ("registry_gbps", -1.0),
        ("jitter", math.nan),
        ("ramp", 1e308),
        ("layers", 33),
        ("pods_per_node", True),
    ],
)
def test_params_out_of_range_are_refused(field: str, value: float) -> None:
    fields: dict[str, Any] = {field: value}
    p = dataclasses.replace(Params(), **fields)
    with pytest.raises(ValueError, match=field):
        simulate(p, "direct")


@pytest.mark.parametrize(
    "argv",
    [
        ["--nodes", "nan"],
        ["--nodes", "10001"],
        ["--gb", "inf"],
        ["--jitter", "1e999"],
        ["--registry-gbps", "0"],
        ["--scenarios", "direct,carrier-pigeon"],
    ],
)
def test_the_command_line_refuses_with_the_range(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        fleet.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert argv[0] in err
    name = argv[0].removeprefix("--").replace("-", "_")
    if name in RANGES:
        assert RANGES[name].span() in err


def test_json_has_every_scenario_and_its_quantiles(capsys: pytest.CaptureFixture[str]) -> None:
    assert fleet.main(["--nodes", "40", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema_version"] == 1
    assert [s["scenario"] for s in doc["scenarios"]] == list(SCENARIOS)
    for s in doc["scenarios"]:
        assert s["warm_50_s"] <= s["warm_95_s"] <= s["warm_100_s"]
        assert s["registry_bytes"] > 0


def test_plot_without_matplotlib_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if absent
    with pytest.raises(SystemExit) as exc:
        fleet.main(["--nodes", "10", "--plot", str(tmp_path / "plots")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "matplotlib" in err
    assert "Traceback" not in err
    assert not (tmp_path / "plots").exists()


def test_plot_draws_one_png_per_scenario(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    assert fleet.main(["--nodes", "10", "--plot", str(tmp_path)]) == 0
    for s in SCENARIOS:
        assert (tmp_path / f"fleet-{s}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_calibration_restores_through_the_library() -> None:
    """--calibrate restores real artifacts from a local layout: figures the model accepts."""
    figures = fleet.calibrate(runs=1)
    assert set(figures) == {"restore_mibps", "restore_files_per_s", "restore_overhead_s"}
    fields: dict[str, Any] = dict(figures)
    p = dataclasses.replace(Params(), **fields)
    assert p.check() is p  # finite, positive, in range
    assert figures["restore_overhead_s"] > 0


@pytest.mark.slow
def test_ten_thousand_nodes_run_to_the_end() -> None:
    """The largest rollout answers (the bench's figure is measured, not asserted here)."""
    p = Params(nodes=10_000)
    for o in fleet.simulate_all(p):
        assert isinstance(o, Outcome)
        assert len(o.warm) == 80_000
        expected = p.nodes * p.artifact_bytes * (p.pods_per_node if o.scenario == "direct" else 1)
        assert close(o.delivered_bytes, expected)
