"""A rollout's time to warm, simulated: direct, node store, pull-through mirrors, P2P.

A discrete-event simulation (a heap of events, fluid transfers) of one
rollout: ``--nodes`` nodes, each with ``--pods-per-node`` pods that need the
same compile-cache artifact (``--gb`` of blobs in ``--layers`` equal layers,
``--files`` files). Four scenarios, on the same nodes (the same start times
and rates, drawn from ``--seed``):

  direct      every pod pulls the artifact from the registry, then restores it
  node-store  one pull per node from the registry into the node store; each of
              the node's pods then restores from it
  mirror      one pull per node, through a tier of ``--mirrors`` pull-through
              caches (node i uses mirror i mod M); a mirror fetches a layer
              from the registry at the first request for it and serves it once
              it holds all of it
  p2p         one pull per node, through a swarm: a node that holds a layer
              serves it to one peer at a time at its NIC rate; a node with no
              free peer for any layer it lacks goes to the registry if fewer
              than ``--p2p-origin-slots`` registry downloads are running, else
              it waits for a peer

For each it prints the time until 50, 95 and 100% of the pods are warm
(counted from the rollout's start) and the bytes out of the registry; ``--json``
prints one document instead, ``--plot DIR`` draws one PNG per scenario (the
fraction of pods warm over time; matplotlib, the ``bench`` extra).

The model, stated plainly:
* Transfers are fluid. A shared egress (the registry, each mirror) is divided
  max-min fairly among its transfers (per pod, for direct pulls), each capped
  by the receiving node's NIC (divided among that node's pods); nothing else
  in the network (switches, cross-zone links) is a bottleneck. A peer transfer
  runs at the lower of the two NICs; upload and download are separate
  (full duplex). Round trips, connection setup and TLS are not modelled.
* A node's pods are all created at the node's start time: uniform in
  ``[0, --ramp]``. NIC and disk rates vary per node by up to ``--jitter``
  (uniform, relative).
* A pod is warm when its restore ends. A restore takes
  ``overhead + files / files-per-s + bytes / min(restore rate, disk / pods)``:
  the rates are what ``artifactd`` restores from a local OCI layout on this
  machine (the defaults were measured with ``--calibrate``; pass your own),
  and the pods of a node restore at once, sharing its disk. The download is
  not written twice: its disk writes overlap the transfer.
* Nothing fails, nothing is retried, and the engine's image is already on the
  node; mirrors and peers start empty.

Every input is bounded (``RANGES``; NaN and infinities refused): 10 to 10,000
nodes. 10,000 nodes x 8 pods answer in well under a minute on two cores.

Usage: python bench/fleet.py [--nodes 1000] [--pods-per-node 8] [--gb 12]
           [--files 20000] [--layers 8] [--registry-gbps 10] [--nic-gbps 25]
           [--disk-mibps 2000] [--mirrors 4] [--mirror-gbps 25]
           [--p2p-origin-slots 4] [--ramp 30] [--jitter 0.1] [--seed 0]
           [--restore-mibps R] [--restore-files-per-s F] [--restore-overhead-s S]
           [--calibrate] [--scenarios direct,node-store,mirror,p2p]
           [--json] [--plot DIR]
"""

from __future__ import annotations

import argparse
import bisect
import functools
import heapq
import json
import math
import random
import shutil
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from artifactd.bounds import Range  # noqa: E402
from artifactd.build.harvest import harvest  # noqa: E402
from artifactd.constants import CACHE_ENV_VARS, ENV_GENERIC_DIR  # noqa: E402
from artifactd.fingerprint.probe import probe_fingerprint  # noqa: E402
from artifactd.restore.install import restore  # noqa: E402
from artifactd.restore.resolve import plan_restore  # noqa: E402
from artifactd.restore.source import StoreSource  # noqa: E402
from artifactd.stores import open_store  # noqa: E402
from artifactd.trust.policy import UNSAFE_NO_VERIFICATION  # noqa: E402

GBIT = 1e9 / 8  # bytes per second in one Gbit/s
MIB = float(1 << 20)
GB = 1e9

#: Every input's range (the bench's own; artifactd.bounds.Range does the one check).
RANGES: dict[str, Range] = {
    "nodes": Range(10, 10_000, "nodes", kind="int"),
    "pods_per_node": Range(1, 64, "pods", kind="int"),
    "gb": Range(0, 1_000, "GB", lo_open=True),
    "files": Range(1, 10_000_000, "files", kind="int"),
    "layers": Range(1, 32, "layers", kind="int"),
    "registry_gbps": Range(0.001, 10_000, "Gbit/s"),
    "nic_gbps": Range(0.001, 3_200, "Gbit/s"),
    "disk_mibps": Range(1, 1_000_000, "MiB/s"),
    "mirrors": Range(1, 1_000, "mirrors", kind="int"),
    "mirror_gbps": Range(0.001, 10_000, "Gbit/s"),
    "p2p_origin_slots": Range(1, 10_000, "downloads", kind="int"),
    "ramp": Range(0, 86_400, "seconds"),
    "jitter": Range(0, 0.9),
    "seed": Range(0, 2**63 - 1, kind="int"),
    "restore_mibps": Range(1, 1_000_000, "MiB/s"),
    "restore_files_per_s": Range(1, 100_000_000, "files/s"),
    "restore_overhead_s": Range(0, 3_600, "seconds"),
}

#: What each input is, for ``--help``.
MEANINGS: dict[str, str] = {
    "nodes": "nodes rolled out",
    "pods_per_node": "pods on each node, each with its own cache volume",
    "gb": "the artifact's bytes on the wire, in GB (10^9)",
    "files": "files in the artifact",
    "layers": "equal layers (blobs) the artifact is in",
    "registry_gbps": "the registry's egress",
    "nic_gbps": "each node's NIC (each way)",
    "disk_mibps": "each node's disk write rate",
    "mirrors": "pull-through mirrors",
    "mirror_gbps": "each mirror's egress (and its pull from the registry)",
    "p2p_origin_slots": "P2P: registry downloads running at once, at most",
    "ramp": "pods are created over this many seconds",
    "jitter": "per-node NIC and disk rates vary by up to this fraction",
    "seed": "the seed of the start times and the jitter",
    "restore_mibps": "one restore's rate from a local layout",
    "restore_files_per_s": "one restore's files per second",
    "restore_overhead_s": "one restore's fixed cost",
}

SCENARIOS = ("direct", "node-store", "mirror", "p2p")

#: Fractions of pods warm that every report gives the time of.
QUANTILES = (50, 95, 100)


@dataclass(frozen=True)
class Params:
    """One rollout. Units are the options' (see ``RANGES``); ``check`` bounds them all."""

    nodes: int = 1_000
    pods_per_node: int = 8
    gb: float = 12.0
    files: int = 20_000
    layers: int = 8
    registry_gbps: float = 10.0
    nic_gbps: float = 25.0
    disk_mibps: float = 2_000.0
    mirrors: int = 4
    mirror_gbps: float = 25.0
    p2p_origin_slots: int = 4
    ramp: float = 30.0
    jitter: float = 0.1
    seed: int = 0
    # `python bench/fleet.py --calibrate` on the 2-core development VM, shared with
    # other work: 263-270 MiB/s, 2,000-3,300 files/s, 0.04-0.05 s over four runs.
    restore_mibps: float = 265.0
    restore_files_per_s: float = 3_000.0
    restore_overhead_s: float = 0.04

    def check(self) -> Params:
        """Return self when every field is a finite number in its range; ValueError otherwise."""
        for name, rng in RANGES.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{name}: expected {rng.describe()}, got {value!r}")
            if rng.kind == "int" and not float(value).is_integer():
                raise ValueError(f"{name}: expected {rng.describe()}, got {value!r}")
            if not rng.contains(value):
                raise ValueError(f"{name}: expected {rng.describe()}, got {value!r}")
        return self

    @property
    def artifact_bytes(self) -> float:
        """The artifact's bytes on the wire."""
        return self.gb * GB


@dataclass(frozen=True)
class Node:
    """One node of the rollout: when its pods are created, and its own rates (bytes/s)."""

    start: float
    nic: float
    disk: float


def draw_nodes(p: Params) -> list[Node]:
    """The rollout's nodes, the same for every scenario of one seed."""
    rng = random.Random(p.seed)
    j = p.jitter
    return [
        Node(
            start=rng.uniform(0.0, p.ramp),
            nic=p.nic_gbps * GBIT * rng.uniform(1 - j, 1 + j),
            disk=p.disk_mibps * MIB * rng.uniform(1 - j, 1 + j),
        )
        for _ in range(p.nodes)
    ]


def restore_seconds(p: Params, node: Node) -> float:
    """One pod's restore on ``node`` while all of the node's pods restore at once."""
    rate = min(p.restore_mibps * MIB, node.disk / p.pods_per_node)
    return p.restore_overhead_s + p.files / p.restore_files_per_s + p.artifact_bytes / rate


# --- the event loop and the shared egress ----------------------------------


class Sim:
    """A heap of timed callbacks; ties run in the order they were scheduled."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0
        self.dirty: dict[Link, None] = {}  # ordered: ties replay alike
        self.events = 0

    def at(self, t: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` at time ``t`` (never before now)."""
        self._seq += 1
        heapq.heappush(self._heap, (max(t, self.now), self._seq, fn))

    def run(self) -> None:
        """Run every event, rescheduling each link changed by one before the next."""
        while self._heap:
            t, _, fn = heapq.heappop(self._heap)
            self.now = t
            self.events += 1
            fn()
            while self.dirty:
                link = next(iter(self.dirty))
                del self.dirty[link]
                link.schedule()


@dataclass(eq=False)
class Flow:
    """One transfer over a shared egress: ``size`` bytes, weight (pods) and cap (bytes/s)."""

    size: float
    weight: float
    cap: float
    done: Callable[[float], None]
    fid: int = 0
    capped: bool | None = None  # None until placed
    ver: int = 0
    rem: float = 0.0  # remaining bytes at ``since`` (capped) or at entry (uncapped)
    since: float = 0.0
    vkey: float = 0.0  # virtual time at which an uncapped flow ends

    @property
    def theta(self) -> float:
        """The fair level above which this flow runs at its cap."""
        return self.cap / self.weight


class Link:
    """A shared egress: weighted max-min fair among its flows, each capped by its receiver.

    A flow runs at ``min(cap, weight * level)``, ``level`` chosen so that the
    rates add up to the capacity (or unbounded when the caps add up to less).
    Uncapped flows advance together in virtual time (``level`` integrated), so
    an arrival or a departure costs a sort insertion and the few flows whose
    cap crosses the level, not a pass over every flow.
    """

    def __init__(self, sim: Sim, capacity: float) -> None:
        self.sim = sim
        self.capacity = capacity
        self.flows: dict[int, Flow] = {}
        self._order: list[tuple[float, int]] = []  # (theta, fid), ascending
        self._caps = 0.0
        self._weights = 0.0
        self._capped_n = 0
        self.level = math.inf
        self.virtual = 0.0
        self._updated = 0.0
        self._uheap: list[tuple[float, int, int]] = []  # (vkey, fid, ver)
        self._cheap: list[tuple[float, int, int]] = []  # (finish time, fid, ver)
        self._next_fid = 0
        self._version = 0
        self.bytes_sent = 0.0

    def _advance(self) -> None:
        now = self.sim.now
        if self.level != math.inf:
            self.virtual += self.level * (now - self._updated)
        self._updated = now

    def _remaining(self, f: Flow) -> float:
        if f.capped is None:
            return f.size
        if f.capped:
            return f.rem - f.cap * (self.sim.now - f.since)
        return (f.vkey - self.virtual) * f.weight

    def _place(self, f: Flow, capped: bool) -> None:
        if f.capped is capped:
            return
        rem = max(self._remaining(f), 0.0)
        f.capped = capped
        f.ver += 1
        if capped:
            f.rem, f.since = rem, self.sim.now
            heapq.heappush(self._cheap, (self.sim.now + rem / f.cap, f.fid, f.ver))
        else:
            f.vkey = self.virtual + rem / f.weight
            heapq.heappush(self._uheap, (f.vkey, f.fid, f.ver))

    def _rebalance(self) -> None:
        old = self._capped_n
        n = len(self._order)
        if self._caps <= self.capacity:
            level, capped_n = math.inf, n
        else:
            used, weights, capped_n = 0.0, self._weights, 0
            while capped_n < n and weights > 0:
                theta, fid = self._order[capped_n]
                if theta >= (self.capacity - used) / weights:
                    break
                f = self.flows[fid]
                used += f.cap
                weights -= f.weight
                capped_n += 1
            level = (self.capacity - used) / weights if weights > 0 else math.inf
        self.level = level
        self._capped_n = capped_n
        for i in range(min(n, max(capped_n, old + 1))):
            self._place(self.flows[self._order[i][1]], i < capped_n)
        self._version += 1
        self.sim.dirty[self] = None

    def add(self, size: float, weight: float, cap: float, done: Callable[[float], None]) -> None:
        """Start a transfer; ``done(now)`` runs when its last byte has arrived."""
        self._advance()
        f = Flow(size, weight, cap, done, fid=self._next_fid)
        self._next_fid += 1
        self.flows[f.fid] = f
        bisect.insort(self._order, (f.theta, f.fid))
        self._caps += cap
        self._weights += weight
        self._rebalance()
        if f.capped is None:  # past the capped prefix and the old one: it runs at the level
            self._place(f, False)

    def _remove(self, f: Flow) -> None:
        del self.flows[f.fid]
        i = bisect.bisect_left(self._order, (f.theta, f.fid))
        del self._order[i]
        self._caps -= f.cap
        self._weights -= f.weight
        if i < self._capped_n:
            self._capped_n -= 1
        if not self.flows:  # drop the rounding that the sums gathered
            self._caps = self._weights = 0.0
        self.bytes_sent += f.size

    def _top(self, heap: list[tuple[float, int, int]]) -> tuple[float, Flow] | None:
        while heap:
            key, fid, ver = heap[0]
            f = self.flows.get(fid)
            if f is not None and f.ver == ver:
                return key, f
            heapq.heappop(heap)
        return None

    def schedule(self) -> None:
        """Schedule this link's next completion (the event is void if the link changes first)."""
        ends = []
        top = self._top(self._cheap)
        if top is not None:
            ends.append(top[0])
        top = self._top(self._uheap)
        if top is not None:
            ends.append(self._updated + (top[0] - self.virtual) / self.level)
        if ends:
            version = self._version
            self.sim.at(min(ends), lambda: self._complete(version))

    def _complete(self, version: int) -> None:
        if version != self._version:
            return
        self._advance()
        finished = []
        for heap, clock in ((self._cheap, self.sim.now), (self._uheap, self.virtual)):
            while (top := self._top(heap)) is not None:
                key, f = top
                if key > clock and self._remaining(f) > 1e-9 * f.size + 1e-3:
                    break
                heapq.heappop(heap)
                finished.append(f)
        for f in finished:
            self._remove(f)
        self._rebalance()
        for f in sorted(finished, key=lambda f: f.fid):
            f.done(self.sim.now)


# --- scenarios ---------------------------------------------------------------


@dataclass
class Outcome:
    """What one scenario's rollout did: when each node's pods were warm, and the bytes moved."""

    scenario: str
    warm: list[float] = field(default_factory=list)  # per pod, sorted
    node_warm: list[float] = field(default_factory=list)  # per node, in the nodes' order
    created: list[float] = field(default_factory=list)  # per pod, sorted
    registry_bytes: float = 0.0  # out of the registry (to nodes and to mirrors)
    mirror_bytes: float = 0.0  # out of the mirrors, to nodes
    peer_bytes: float = 0.0  # between nodes
    delivered_bytes: float = 0.0  # into nodes, from any source
    events: int = 0
    wall_s: float = 0.0

    def at(self, pct: float) -> float:
        """The time until ``pct`` percent of the pods are warm."""
        k = max(1, math.ceil(pct / 100 * len(self.warm)))
        return self.warm[k - 1]

    def summary(self) -> dict[str, Any]:
        """The scenario's figures, as ``--json`` prints them."""
        return {
            "scenario": self.scenario,
            **{f"warm_{q}_s": round(self.at(q), 3) for q in QUANTILES},
            "registry_bytes": round(self.registry_bytes),
            "mirror_bytes": round(self.mirror_bytes),
            "peer_bytes": round(self.peer_bytes),
            "delivered_bytes": round(self.delivered_bytes),
            "events": self.events,
            "wall_s": round(self.wall_s, 3),
        }


class Rollout:
    """The parts every scenario shares: the nodes, the registry, and recording warm pods."""

    def __init__(self, p: Params, nodes: Sequence[Node], name: str) -> None:
        self.p = p
        self.nodes = nodes
        self.sim = Sim()
        self.registry = Link(self.sim, p.registry_gbps * GBIT)
        self.out = Outcome(name, node_warm=[math.nan] * len(nodes))
        k = p.pods_per_node
        self.out.created = sorted(t for node in nodes for t in [node.start] * k)
        self.layer_bytes = p.artifact_bytes / p.layers

    def filled(self, n: int, t: float) -> None:
        """Node ``n`` holds the whole artifact at ``t``: its pods restore from it."""
        warm = t + restore_seconds(self.p, self.nodes[n])
        self.out.node_warm[n] = warm
        self.out.warm.extend([warm] * self.p.pods_per_node)

    def finish(self) -> Outcome:
        """Run the rollout to its end and return its outcome."""
        for n, node in enumerate(self.nodes):
            self.sim.at(node.start, functools.partial(self.begin, n))
        self.sim.run()
        self.out.warm.sort()
        self.out.registry_bytes = self.registry.bytes_sent
        self.out.events = self.sim.events
        return self.out

    def begin(self, n: int) -> None:
        """Node ``n``'s pods are created."""
        raise NotImplementedError


class Direct(Rollout):
    """Every pod pulls the whole artifact from the registry."""

    def begin(self, n: int) -> None:
        k = self.p.pods_per_node
        size = self.p.artifact_bytes * k

        def done(t: float) -> None:
            self.out.delivered_bytes += size
            self.filled(n, t)

        # The node's pods pull alike and end together: one flow of k pods' weight.
        self.registry.add(size, k, self.nodes[n].nic, done)


class NodeStore(Rollout):
    """One pull per node from the registry; the node's pods restore from the node store."""

    def begin(self, n: int) -> None:
        size = self.p.artifact_bytes

        def done(t: float) -> None:
            self.out.delivered_bytes += size
            self.filled(n, t)

        self.registry.add(size, 1, self.nodes[n].nic, done)


class Mirror(Rollout):
    """One pull per node, layer by layer, through pull-through caches (store and forward)."""

    def __init__(self, p: Params, nodes: Sequence[Node], name: str) -> None:
        super().__init__(p, nodes, name)
        self.links = [Link(self.sim, p.mirror_gbps * GBIT) for _ in range(p.mirrors)]
        self.holds: list[set[int]] = [set() for _ in range(p.mirrors)]
        self.fetching: list[dict[int, list[int]]] = [{} for _ in range(p.mirrors)]

    def begin(self, n: int) -> None:
        self.request(n, 0)

    def request(self, n: int, layer: int) -> None:
        """Node ``n`` asks its mirror for ``layer``."""
        m = n % self.p.mirrors
        if layer in self.holds[m]:
            self.serve(m, n, layer)
        elif layer in self.fetching[m]:
            self.fetching[m][layer].append(n)
        else:
            self.fetching[m][layer] = [n]
            cap = self.p.mirror_gbps * GBIT
            self.registry.add(self.layer_bytes, 1, cap, lambda t: self.pulled(m, layer))

    def pulled(self, m: int, layer: int) -> None:
        """Mirror ``m`` holds ``layer``: serve everyone who asked for it."""
        self.holds[m].add(layer)
        for n in self.fetching[m].pop(layer):
            self.serve(m, n, layer)

    def serve(self, m: int, n: int, layer: int) -> None:
        """Send ``layer`` from mirror ``m`` to node ``n``."""

        def done(t: float) -> None:
            self.out.delivered_bytes += self.layer_bytes
            if layer + 1 < self.p.layers:
                self.request(n, layer + 1)
            else:
                self.filled(n, t)

        self.links[m].add(self.layer_bytes, 1, self.nodes[n].nic, done)

    def finish(self) -> Outcome:
        out = super().finish()
        out.mirror_bytes = sum(link.bytes_sent for link in self.links)
        return out


class P2P(Rollout):
    """One pull per node through a swarm: holders serve one peer at a time at NIC rate."""

    def __init__(self, p: Params, nodes: Sequence[Node], name: str) -> None:
        super().__init__(p, nodes, name)
        count, layers = len(nodes), p.layers
        self.has = [[False] * layers for _ in range(count)]
        self.missing = [layers] * count
        self.holders = [0] * layers
        self.from_origin = [0] * layers  # registry downloads of each layer running
        self.origin_active = 0
        self.downloading = [False] * count
        self.uploading = [False] * count
        self.waiting = [False] * count
        self.started = [False] * count
        self.idle: list[deque[int]] = [deque() for _ in range(layers)]  # holders free to upload
        self.wanting: list[deque[int]] = [deque() for _ in range(layers)]  # waiting, lacking it
        self.queue: deque[int] = deque()  # waiting nodes, first come first served

    def begin(self, n: int) -> None:
        self.started[n] = True
        self.fetch(n)

    def _rarest(self, layers: list[int]) -> list[int]:
        return sorted(layers, key=lambda j: (self.holders[j], j))

    def _free_holder(self, j: int) -> int | None:
        q = self.idle[j]
        while q:
            s = q.popleft()
            if not self.uploading[s] and self.has[s][j]:
                return s
        return None

    def _waiting_for(self, j: int) -> int | None:
        q = self.wanting[j]
        while q:
            w = q.popleft()
            if self.waiting[w] and not self.has[w][j]:
                return w
        return None

    def fetch(self, n: int) -> None:
        """Node ``n`` is free to download: from a free peer, else the registry, else wait."""
        if self.downloading[n] or self.waiting[n] or not self.missing[n]:
            return
        lacking = [j for j in range(self.p.layers) if not self.has[n][j]]
        for j in self._rarest(lacking):
            s = self._free_holder(j)
            if s is not None:
                self.transfer(s, n, j)
                return
        if self.origin_active < self.p.p2p_origin_slots:
            j = min(lacking, key=lambda j: (self.holders[j] + self.from_origin[j], j))
            self.origin_active += 1
            self.from_origin[j] += 1
            self.downloading[n] = True
            cap = self.nodes[n].nic
            self.registry.add(self.layer_bytes, 1, cap, lambda t: self.from_registry(n, j))
            return
        self.waiting[n] = True
        for j in lacking:
            self.wanting[j].append(n)
        self.queue.append(n)

    def transfer(self, s: int, n: int, j: int) -> None:
        """Peer ``s`` sends layer ``j`` to ``n`` at the lower of their NIC rates."""
        self.uploading[s] = True
        self.downloading[n] = True
        self.waiting[n] = False
        rate = min(self.nodes[s].nic, self.nodes[n].nic)
        self.sim.at(self.sim.now + self.layer_bytes / rate, lambda: self.from_peer(s, n, j))

    def offer(self, s: int) -> None:
        """Node ``s`` is free to upload: to a waiting node that lacks one of its layers."""
        if self.uploading[s] or not self.started[s]:
            return
        held = [j for j in range(self.p.layers) if self.has[s][j]]
        for j in self._rarest(held):
            w = self._waiting_for(j)
            if w is not None:
                self.transfer(s, w, j)
                return
        for j in held:
            self.idle[j].append(s)

    def _received(self, n: int, j: int) -> None:
        self.downloading[n] = False
        self.has[n][j] = True
        self.missing[n] -= 1
        self.holders[j] += 1
        self.out.delivered_bytes += self.layer_bytes
        if not self.missing[n]:
            self.filled(n, self.sim.now)

    def from_peer(self, s: int, n: int, j: int) -> None:
        """Layer ``j`` arrived at ``n`` from peer ``s``."""
        self.uploading[s] = False
        self.out.peer_bytes += self.layer_bytes
        self._received(n, j)
        self.offer(s)
        self.offer(n)
        self.fetch(n)

    def from_registry(self, n: int, j: int) -> None:
        """Layer ``j`` arrived at ``n`` from the registry: a registry slot is free."""
        self.origin_active -= 1
        self.from_origin[j] -= 1
        self._received(n, j)
        self.offer(n)
        self.fetch(n)
        while self.queue and self.origin_active < self.p.p2p_origin_slots:
            w = self.queue.popleft()
            if self.waiting[w]:
                self.waiting[w] = False
                self.fetch(w)


KINDS: dict[str, type[Rollout]] = {
    "direct": Direct,
    "node-store": NodeStore,
    "mirror": Mirror,
    "p2p": P2P,
}


def simulate(p: Params, scenario: str, nodes: Sequence[Node] | None = None) -> Outcome:
    """Run one scenario of the rollout ``p`` (bounded first) and return its outcome."""
    p.check()
    if scenario not in KINDS:
        raise ValueError(f"unknown scenario {scenario!r}: expected one of {', '.join(SCENARIOS)}")
    t0 = time.perf_counter()
    out = KINDS[scenario](p, draw_nodes(p) if nodes is None else nodes, scenario).finish()
    out.wall_s = time.perf_counter() - t0
    return out


def simulate_all(p: Params, scenarios: Sequence[str] = SCENARIOS) -> list[Outcome]:
    """Run each scenario on the same nodes."""
    nodes = draw_nodes(p.check())
    return [simulate(p, s, nodes) for s in scenarios]


# --- calibration: a real restore from a local layout, through the library -------


def calibrate(runs: int = 5) -> dict[str, float]:
    """Measure ``artifactd``'s restore from a local OCI layout here: rates for the model.

    Three generic-family artifacts are harvested into one layout each: one
    file (the fixed cost), 2,000 files of 4 KiB (the cost per file) and 4
    incompressible files of 16 MiB (the cost per byte). Each is restored
    ``runs`` times through the library (plan, then install), each time into a
    fresh target; the fastest of each gives the three figures (on a shared
    machine the other runs measure the neighbours).
    """
    fp = probe_fingerprint(gpu_arch="sm_90a", use_nvml=False)
    shapes = {"one": (1, 4096), "small": (2_000, 4096), "large": (4, 16 << 20)}
    best: dict[str, float] = {}
    work = Path(tempfile.mkdtemp(prefix="artifactd-bench-fleet-"))
    try:
        for name, (count, size) in shapes.items():
            tree = work / name / "tree"
            for i in range(count):
                sub = tree / f"{i // 200:02x}"
                sub.mkdir(parents=True, exist_ok=True)
                (sub / f"k{i:05d}.cubin").write_bytes(random.randbytes(size))
            environ = {var: str(work / "absent") for var in CACHE_ENV_VARS}
            environ |= {ENV_GENERIC_DIR: str(tree), "HOME": str(work / "home")}
            environ["TMPDIR"] = str(work / "tmp")
            (work / "tmp").mkdir(exist_ok=True)
            store = open_store(f"oci:{work / name / 'store'}", create=True)
            harvest(store, fp, families=["generic"], environ=environ)
            times = []
            for r in range(runs):
                target = work / name / f"target-{r}"
                t0 = time.perf_counter()
                plan = plan_restore(StoreSource(store), fp, target, trust=UNSAFE_NO_VERIFICATION)
                restore(plan, StoreSource(store))
                times.append(time.perf_counter() - t0)
            best[name] = min(times)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    # t = overhead + files * per_file + bytes * per_byte, for the small and large trees.
    overhead = best["one"]
    (f1, b1), (f2, b2) = (2_000, 2_000 * 4096), (4, 4 * (16 << 20))
    t1, t2 = best["small"] - overhead, best["large"] - overhead
    det = f1 * b2 - f2 * b1
    per_file = max((t1 * b2 - t2 * b1) / det, 1e-8)
    per_byte = max((f1 * t2 - f2 * t1) / det, 1e-12)
    figures = {
        "restore_overhead_s": round(overhead, 4),
        "restore_files_per_s": round(1 / per_file),
        "restore_mibps": round(1 / per_byte / MIB),
    }
    # A machine slower or faster than the ranges allow gets their nearest end.
    return {k: min(max(v, RANGES[k].lo), RANGES[k].hi) for k, v in figures.items()}


# --- the command line --------------------------------------------------------


def parse(argv: Sequence[str] | None = None) -> tuple[Params, argparse.Namespace]:
    """Read the options into bounded ``Params`` (exit 2 with the range on a bad value)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    defaults = Params()
    for name, rng in RANGES.items():
        parser.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            type=str,
            default=None,
            metavar="N",
            help=f"{MEANINGS[name]}: {rng.describe()} (default {getattr(defaults, name):g})",
        )
    parser.add_argument("--calibrate", action="store_true", help="measure the restore rates here")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="which, comma-separated")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--plot", type=Path, metavar="DIR", help="one PNG per scenario in DIR")
    args = parser.parse_args(argv)
    values: dict[str, Any] = {}
    for name, rng in RANGES.items():
        text = getattr(args, name)
        if text is None:
            continue
        value = rng.read(text)
        if value is None:
            parser.error(f"--{name.replace('_', '-')}: expected {rng.describe()}, got {text!r}")
        values[name] = value
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown or not scenarios or len(scenarios) > len(SCENARIOS):
        parser.error(f"--scenarios: expected some of {','.join(SCENARIOS)}, got {args.scenarios!r}")
    args.scenarios = list(dict.fromkeys(scenarios))
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401, PLC0415  # lazy: optional (the bench extra)
        except ImportError:
            parser.error(
                "--plot needs matplotlib, which is not installed: "
                "pip install 'artifactd[bench]' (or pip install matplotlib)"
            )
    return replace(defaults, **values), args


def fmt_bytes(n: float) -> str:
    """``12.0 TB``: bytes in decimal units."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def fmt_time(s: float) -> str:
    """``1 h 02 min``, ``5 min 07 s``, ``42.1 s``."""
    if s >= 3600:
        return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"
    if s >= 60:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    return f"{s:.1f} s"


def table(p: Params, outcomes: Sequence[Outcome]) -> list[str]:
    """The report: one line of inputs, then one row per scenario."""
    lines = [
        f"{p.nodes} nodes x {p.pods_per_node} pods, {p.gb:g} GB in {p.layers} layers and "
        f"{p.files} files; registry {p.registry_gbps:g} Gbit/s, NIC {p.nic_gbps:g} Gbit/s, "
        f"disk {p.disk_mibps:g} MiB/s; {p.mirrors} mirrors at {p.mirror_gbps:g} Gbit/s; "
        f"P2P {p.p2p_origin_slots} registry downloads at once; ramp {p.ramp:g} s, "
        f"jitter {p.jitter:g}, seed {p.seed}; restore {p.restore_mibps:g} MiB/s, "
        f"{p.restore_files_per_s:g} files/s, +{p.restore_overhead_s:g} s",
        f"{'scenario':10} {'50% warm':>12} {'95% warm':>12} {'100% warm':>12} "
        f"{'from registry':>14} {'sim s':>6}",
    ]
    for o in outcomes:
        lines.append(
            f"{o.scenario:10} {fmt_time(o.at(50)):>12} {fmt_time(o.at(95)):>12} "
            f"{fmt_time(o.at(100)):>12} {fmt_bytes(o.registry_bytes):>14} {o.wall_s:6.2f}"
        )
    return lines


def plot(p: Params, outcomes: Sequence[Outcome], folder: Path) -> list[Path]:
    """Draw each scenario's fraction of pods warm over time, one PNG each."""
    # lazy: matplotlib is optional (the bench extra); --plot alone needs it
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for o in outcomes:
        fig, ax = plt.subplots(figsize=(7, 4))
        n = len(o.warm)
        fractions = [(i + 1) / n for i in range(n)]
        ax.step(o.created, fractions, where="post", linestyle="--", label="created")
        ax.step(o.warm, fractions, where="post", label="warm")
        ax.legend(loc="lower right")
        for q in QUANTILES:
            ax.axvline(o.at(q), linestyle=":", linewidth=0.8, color="grey")
        ax.set_xlabel("seconds since the rollout began")
        ax.set_ylabel("fraction of pods")
        ax.set_ylim(0, 1.02)
        ax.set_title(
            f"{o.scenario}: {p.nodes} nodes x {p.pods_per_node} pods, {p.gb:g} GB; "
            f"registry out {fmt_bytes(o.registry_bytes)}",
            fontsize=9,
        )
        path = folder / f"fleet-{o.scenario}.png"
        fig.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(fig)
        paths.append(path)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, simulate every scenario asked for, and print the table or the JSON document."""
    p, args = parse(argv)
    calibrated = None
    if args.calibrate:
        calibrated = calibrate()
        p = replace(
            p,
            restore_mibps=calibrated["restore_mibps"],
            restore_files_per_s=calibrated["restore_files_per_s"],
            restore_overhead_s=calibrated["restore_overhead_s"],
        )
    outcomes = simulate_all(p, args.scenarios)
    plots = plot(p, outcomes, args.plot) if args.plot is not None else []
    if args.json:
        doc = {
            "schema_version": 1,
            "params": asdict(p),
            "calibrated": calibrated,
            "scenarios": [o.summary() for o in outcomes],
            "plots": [str(path) for path in plots],
        }
        print(json.dumps(doc, indent=2))
    else:
        print("\n".join(table(p, outcomes)))
        for path in plots:
            print(f"plot: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
