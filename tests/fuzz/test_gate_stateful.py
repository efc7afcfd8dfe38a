"""The deletion gate's invariant over random observation sequences × every deletion path
(hypothesis stateful).

A small world (a 2-host group and a 1-host group, their pods and Ray nodes) moves at random:
time passes, nodes turn busy, idle, DEAD or vanish, pods fail, GCS replies come partial or
from a restarted GCS, maxReplicas drops (surplus and preemption), slices break (replacement),
the daemon is killed right after its draining record (restart adoption). Between moves the
daemon decides (`decide`, its real liveness tracker and memory), drains are answered as Ray
answers them from the world's truth (idle termination refused for a host with work; preemption
accepted), `after_drains` builds the patch, and KubeRay deletes what it names.

On every write: each pod newly named in workersToDelete satisfies the gate's rule judged from
the test's own record of the world (not the daemon's code): every Ray node of it (a) had its
drain accepted in this execution, or (b) is DEAD, or no reply the daemon got showed it for the
whole grace; or (c) it never had a node and is not Running; or (d) its slice's preemption
deadline passed. And no path disagrees with the gate (nothing blocked) -- except where the world
moved while a host answered its drain late (a raylet replaced by a new one that takes
work, a pod recreated under its name): the gate judges the read made after every drain answered
(`LastRead`), so the evidence is newer than every drain answer, and such a pod is never named.
`FUZZ_EXAMPLES` sets the number of runs (`make test`: 200; `make fuzz`: 5000). At 60, a mutation
making the gate's own grace check pass every absent host was found in 2 of 10 seeded runs; at 200
in 7 of 10. A mutation making the gate ignore the read after the drains fails it at 200.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any

import jsonpatch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kuberay_scaler.core.decision import (
    Decision,
    Drain,
    DrainResults,
    LastRead,
    Observation,
    after_drains,
    decide,
    drains_to_send,
)
from kuberay_scaler.core.liveness import LivenessTracker
from kuberay_scaler.core.model.plan import Memory
from kuberay_scaler.core.model.ray import NodeStatus, RayNode, RayObservation, RayState
from kuberay_scaler.core.parse.pods import parse_pods
from kuberay_scaler.core.parse.raycluster import parse_raycluster
from kuberay_scaler.core.patch.ops import ops_json
from kuberay_scaler.core.planner.deadlines import Deadlines
from kuberay_scaler.core.planner.gate import quiet
from kuberay_scaler.core.planner.policy import Policy
from tests.factories import NOW, cluster, group, head_node, node, node_id_of, pod

EXAMPLES = max(1, int(os.environ.get("FUZZ_EXAMPLES", "200")))
COVERED: Counter[str] = Counter()  # pods named, by the gate clause that let them go
GRACE_S = 120.0
MONO_AT_NOW = 10_000.0  # the daemon's monotonic reading when the wall clock reads NOW
POLICY = Policy(
    deadlines=Deadlines(
        idle_timeout_override_s=60,
        max_provision_s=300,
        missing_node_grace_s=GRACE_S,
        replace_backoff_s=30,
        preempt_deadline_s=90,
        broken_busy_max_s=200,
    )
)
GROUPS = {"duo": 2, "solo": 1}  # group → hosts per slice
STATES = ("idle", "busy", "dead", "absent", "draining")


@dataclass
class Host:
    group: str
    replica: str
    index: int
    phase: str = "Running"
    ray: str = "idle"  # idle, busy, dead, absent, draining (drained: no work left)
    idle_since: float = 0.0  # world time
    generation: int = 0  # a new raylet on the pod gets a new node id
    incarnation: int = 0  # the pod recreated under its name gets a new uid

    @property
    def uid(self) -> str:
        return f"u-{self.name}#{self.incarnation}"

    @property
    def name(self) -> str:
        return f"{self.replica}-{self.index}"

    def node_id(self) -> str:
        return node_id_of(f"{self.name}#{self.generation}")


@dataclass
class Seen:
    """The test's own record of what the daemon was shown (for the invariant)."""

    last_entry: dict[str, float] = field(default_factory=dict)  # pod → last reply with it
    ever_node: set[str] = field(default_factory=set)  # pods a reply showed alive
    first_running: dict[str, float] = field(default_factory=dict)  # as the daemon saw pods
    deadlines: dict[str, datetime] = field(default_factory=dict)  # slice → preemption deadline


class GateMachine(RuleBasedStateMachine):
    @initialize(
        replicas=st.integers(1, 3),
        solo=st.integers(1, 3),
        busy=st.booleans(),
        limit=st.integers(0, 4),
    )
    def start(self, replicas: int, solo: int, busy: bool = False, limit: int = 4) -> None:
        self.t = 0.0
        self.epoch = 1
        self.rc = cluster(
            group("duo", replicas=replicas, max_replicas=limit, hosts=2),
            group("solo", replicas=solo, max_replicas=4),
        )
        self.rc["metadata"]["uid"] = "uid-1"
        self.hosts: dict[str, Host] = {}
        self.serial = 0
        for name, count in (("duo", replicas), ("solo", solo)):
            for _ in range(count):
                self._new_slice(name, phase="Running", ray="busy" if busy else "idle")
        self._restart_daemon()
        self.partial: set[str] = set()

    # --- the world moves ---------------------------------------------------------------------

    @rule(seconds=st.sampled_from([1, 5, 20, 61, 130, 250]))
    def time_passes(self, seconds: float) -> None:
        self.t += seconds

    @rule(data=st.data(), state=st.sampled_from(STATES))
    def a_node_changes(self, data: st.DataObject, state: str) -> None:
        if not self.hosts:
            return
        host = self.hosts[data.draw(st.sampled_from(sorted(self.hosts)))]
        if host.phase != "Running":
            return
        if state == "idle" and host.ray != "idle":
            host.idle_since = self.t
        if host.ray in ("dead", "absent") and state not in ("dead", "absent"):
            host.generation += 1  # a raylet that comes back is a new node
        host.ray = state

    @rule(data=st.data())
    def a_pod_fails(self, data: st.DataObject) -> None:
        if self.hosts:
            host = self.hosts[data.draw(st.sampled_from(sorted(self.hosts)))]
            host.phase = "Failed"

    @rule(data=st.data())
    def the_next_reply_is_partial(self, data: st.DataObject) -> None:
        if self.hosts:
            self.partial = set(data.draw(st.sets(st.sampled_from(sorted(self.hosts)))))

    @rule()
    def the_gcs_restarts(self) -> None:
        self.epoch += 1

    @rule(name=st.sampled_from(sorted(GROUPS)), limit=st.integers(0, 4))
    def max_replicas_changes(self, name: str, limit: int) -> None:
        for g in self.rc["spec"]["workerGroupSpecs"]:
            if g["groupName"] == name:
                g["maxReplicas"] = limit
                g["minReplicas"] = min(g.get("minReplicas", 0), limit)

    @rule()
    def pods_come_up(self) -> None:
        for host in self.hosts.values():
            if host.phase == "Pending":
                host.phase, host.ray, host.idle_since = "Running", "idle", self.t

    # --- the daemon ----------------------------------------------------------------------------

    @rule(
        kill_after_record=st.booleans(),
        meanwhile=st.sampled_from(["nothing", "raylet replaced", "pod recreated"]),
        data=st.data(),
    )
    def the_daemon_reconciles(
        self, kill_after_record: bool, meanwhile: str = "nothing", data: Any = None
    ) -> None:
        decision = self._decide()
        planned = {h.name: h.uid for h in self.hosts.values()}
        assert not decision.blocked, f"a planner path disagreed with the gate: {decision.blocked}"
        if decision.error or not decision.writes:
            return
        base = self.rc
        if decision.record is not None:
            base = jsonpatch.apply_patch(self.rc, ops_json(decision.record.ops))
            self.rc = base
            if kill_after_record:
                self._restart_daemon()
                return
        fresh = self._truth()  # the read right before draining
        sent, not_sent = drains_to_send(decision, fresh, "c")
        accepted, refused = self._answer_drains(sent)
        moved = self._meanwhile(decision, meanwhile, data) if sent else None
        last = LastRead(self._truth(), {h.name: h.uid for h in self.hosts.values()})
        results = DrainResults(
            accepted=frozenset(accepted),
            refused=MappingProxyType(refused),
            not_sent=MappingProxyType(not_sent),
            fresh=fresh,
            base=parse_raycluster(base),
            last=last,
        )
        writes = after_drains(decision, results)
        if moved is None:
            assert not writes.blocked, f"a path disagreed with the gate: {writes.blocked}"
        else:
            assert {b.pod for b in writes.blocked} <= {moved}, writes.blocked
        for d in writes.drains:
            self._preempt(d.slice_key, d.deadline_ms, d.node_ids)
        if writes.patch is None:
            self.memory = replace(self.memory, **_carried(writes.plan.memory))
            return
        after = jsonpatch.apply_patch(base, ops_json(writes.patch.ops))
        self._check_named(base, after, accepted, planned)
        self.rc = after
        self.memory = replace(writes.plan.memory, awaiting_write={}, draining={})
        self._kuberay_acts()

    @invariant()
    def targets_within_bounds(self) -> None:
        if not hasattr(self, "rc"):
            return
        for g in self.rc["spec"]["workerGroupSpecs"]:
            assert g.get("replicas", 0) >= 0

    @precondition(lambda self: hasattr(self, "rc"))
    @rule()
    def the_daemon_restarts(self) -> None:
        self._restart_daemon()

    # --- helpers -------------------------------------------------------------------------------

    def _new_slice(self, name: str, *, phase: str = "Pending", ray: str = "absent") -> None:
        self.serial += 1
        replica = f"{name}-{self.serial}"
        for i in range(GROUPS[name]):
            host = Host(name, replica, i, phase=phase, ray=ray, idle_since=self.t)
            self.hosts[host.name] = host

    def _restart_daemon(self) -> None:
        self.tracker = LivenessTracker(grace_s=GRACE_S, stale_after_s=10_000)
        self.memory = Memory()
        self.seen = Seen(deadlines=getattr(self, "seen", Seen()).deadlines)

    def _now(self) -> datetime:
        return NOW + timedelta(seconds=self.t)

    def _mono(self) -> float:
        """The daemon's monotonic reading: far from the wall clock's number, as a real one."""
        return MONO_AT_NOW + self.t

    def _pods(self) -> list[dict[str, Any]]:
        return [
            pod(
                h.name,
                h.group,
                replica=h.replica if GROUPS[h.group] > 1 else None,
                host_index=h.index if GROUPS[h.group] > 1 else None,
                phase=h.phase,
                uid=h.uid,
            )
            for h in self.hosts.values()
        ]

    def _ray_node(self, h: Host) -> RayNode | None:
        if h.ray == "absent" or h.phase == "Pending":
            return None
        busy = h.ray == "busy"
        idle_s = None if busy or h.ray == "draining" else max(0.0, self.t - h.idle_since)
        made = node(
            h.name,
            group_name=h.group,
            resources={"CPU": 8},
            available={"CPU": 0 if busy else 8},
            idle_s=idle_s,
            dead=h.ray == "dead" or h.phase == "Failed",
            draining=h.ray == "draining",
        )
        # Stamped on the monotonic clock, as the daemon stamps replies (app.py).
        on_mono = int((self._mono() - (idle_s or 0)) * 1000)
        since = None if made.idle_since_ms is None else on_mono
        return replace(made, node_id=h.node_id(), idle_since_ms=since)

    def _truth(self) -> RayState:
        nodes = [head_node(), *(n for h in self.hosts.values() if (n := self._ray_node(h)))]
        return RayState(nodes=tuple(nodes), tasks=(), gangs=(), constraint=())

    def _decide(self) -> Decision:
        truth = self._truth()
        shown = RayState(
            nodes=tuple(n for n in truth.nodes if n.instance_id not in self.partial),
            tasks=(),
            gangs=(),
            constraint=(),
        )
        self.partial = set()
        mono = self._mono()
        alive = [n.instance_id for n in shown.nodes if n.alive]
        self.tracker.observe_ray(mono, ("c", self.epoch), alive)
        for n in shown.nodes:
            self.seen.last_entry[n.instance_id] = self.t
            if n.alive:
                self.seen.ever_node.add(n.instance_id)
        spec = parse_raycluster(self.rc)
        hosts, problems = parse_pods(self._pods(), spec)
        self.tracker.observe_pods(mono, hosts)
        for h in hosts:
            if h.phase.value == "running":
                self.seen.first_running.setdefault(h.pod_name, self.t)
        observed = Observation(
            spec=spec,
            hosts=hosts,
            pod_problems=problems,
            gcs=RayObservation(shown, 0.0, cluster_id="c", epoch=self.epoch),
            clock=self.tracker.clock(mono),
        )
        decision = decide(observed, self.memory, POLICY, self._now(), mono_s=mono)
        self.memory = replace(self.memory, broken_busy_since=decision.plan.memory.broken_busy_since)
        return decision

    def _answer_drains(
        self, drains: tuple[Drain, ...]
    ) -> tuple[set[str], dict[tuple[str, str], str]]:
        """As Ray answers: idle termination refused for a node with work; preemption taken."""
        by_id = {n.node_id: n for n in self._truth().nodes}
        accepted: set[str] = set()
        refused: dict[tuple[str, str], str] = {}
        for d in drains:
            if d.preempt:
                self._preempt(d.slice_key, d.deadline_ms, d.node_ids)
                continue
            took = [
                n for n in d.node_ids if n not in by_id or quiet(by_id[n]) or not by_id[n].alive
            ]
            accepted.update(took)
            if len(took) < len(d.node_ids):
                refused[(d.group, d.slice_key)] = "busy"
            for h in self.hosts.values():  # an accepted idle-termination drain: raylet exits
                if h.node_id() in took:
                    h.ray = "dead"
        return accepted, refused

    def _meanwhile(self, decision: Decision, what: str, data: Any) -> str | None:
        """While a host answers its drain late, a pod the plan deletes changes: its raylet is
        replaced by a new one that takes work, or the pod is recreated under its name (its new
        raylet not joined yet). Returns the pod changed."""
        named = sorted({p for g in decision.plan.groups for x in g.deletions for p in x.pods})
        running = [p for p in named if p in self.hosts and self.hosts[p].phase == "Running"]
        if what == "nothing" or not running:
            return None
        host = self.hosts[data.draw(st.sampled_from(running))]
        if what == "raylet replaced":
            host.generation += 1
            host.ray = "busy"
        else:
            host.incarnation += 1
            host.ray = "absent"
        return host.name

    def _preempt(self, slice_key: str, deadline_ms: int, node_ids: tuple[str, ...]) -> None:
        deadline = datetime.fromtimestamp(deadline_ms / 1000, NOW.tzinfo)
        self.seen.deadlines.setdefault(slice_key, deadline)
        for h in self.hosts.values():
            if h.node_id() in node_ids and h.ray == "idle":
                h.ray = "draining"

    def _check_named(
        self, before: Any, after: Any, accepted: set[str], planned: dict[str, str]
    ) -> None:
        for name in _named(after) - _named(before):
            h = self.hosts.get(name)
            if h is None:
                continue
            assert planned.get(name) == h.uid, f"{name} recreated during the drains, then named"
            COVERED[self._rule(h, accepted)] += 1
            assert self._may_delete(h, accepted), (
                f"{name} deleted: phase {h.phase}, ray {h.ray}, t={self.t},"
                f" last seen {self.seen.last_entry.get(name)}, ever {name in self.seen.ever_node}"
            )

    def _may_delete(self, h: Host, accepted: set[str]) -> bool:
        deadline = self.seen.deadlines.get(h.replica if GROUPS[h.group] > 1 else h.name)
        if deadline is not None and deadline <= self._now():
            return True  # (d)
        if h.ray == "absent" or h.phase == "Pending":
            if h.name not in self.seen.ever_node and h.phase != "Running":
                return True  # (c)
            since = max(
                self.seen.last_entry.get(h.name, -1e9), self.seen.first_running.get(h.name, self.t)
            )
            return self.t - since >= GRACE_S  # (b), absent
        if h.ray == "dead" or h.phase == "Failed":
            return True  # (b): DEAD (or its raylet exited on an accepted drain)
        return h.node_id() in accepted  # (a)

    def _rule(self, h: Host, accepted: set[str]) -> str:
        """Which of the gate's clauses let the pod go (for the coverage line)."""
        deadline = self.seen.deadlines.get(h.replica if GROUPS[h.group] > 1 else h.name)
        if deadline is not None and deadline <= self._now():
            return "d-deadline"
        if h.node_id() in accepted:
            return "a-drained"
        if h.ray == "dead" or h.phase == "Failed":
            return "b-dead"
        return "b/c-absent"

    def _kuberay_acts(self) -> None:
        """KubeRay deletes the pods named and creates slices up to replicas."""
        for g in self.rc["spec"]["workerGroupSpecs"]:
            doomed = set((g.get("scaleStrategy") or {}).get("workersToDelete") or [])
            for name in doomed:
                self.hosts.pop(name, None)
            live = {h.replica for h in self.hosts.values() if h.group == g["groupName"]}
            for _ in range(max(0, min(g.get("replicas", 0), g["maxReplicas"]) - len(live))):
                self._new_slice(g["groupName"])


def _named(rc: Any) -> set[str]:
    return {
        n
        for g in rc["spec"]["workerGroupSpecs"]
        for n in (g.get("scaleStrategy") or {}).get("workersToDelete") or []
    }


def _carried(memory: Memory) -> dict[str, Any]:
    return {"preempting": memory.preempting, "refused": memory.refused}


GateMachine.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    print_blob=True,
)
test_the_gate_holds_over_random_observation_sequences = GateMachine.TestCase


def test_world_helpers_make_what_they_say() -> None:
    """The machine's own helpers: a busy host's node is RUNNING, a drained one DRAINING."""
    m = GateMachine()
    m.start(replicas=1, solo=1)
    duo = next(h for h in m.hosts.values() if h.group == "duo")
    duo.ray = "busy"
    assert m._ray_node(duo) is not None and m._ray_node(duo).status is NodeStatus.RUNNING  # type: ignore[union-attr]
    duo.ray = "draining"
    assert quiet(m._ray_node(duo))  # type: ignore[arg-type]


def coverage() -> str:
    """The line `make fuzz` prints: how often each clause of the gate let a pod go."""
    if not COVERED:
        return ""
    parts = ", ".join(f"{k} {v}" for k, v in sorted(COVERED.items()))
    return f"deletion gate (stateful): pods named by clause: {parts}"
