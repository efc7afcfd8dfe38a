"""What we tell Ray (ReportAutoscalingState) from a plan: infeasible demand, truthful pending lines.

Issue 12 items 5 and 6. The plans come from the real planner on API-shaped input.
"""

from __future__ import annotations

from kuberay_scaler.adapters.ray_gcs.report import build_autoscaling_state
from kuberay_scaler.core.model.ray import GangStrategy, TaskDemand
from kuberay_scaler.loop.report import report_from_plan
from tests.factories import (
    NOW,
    bundle,
    cluster,
    cpu_nodes,
    gang,
    group,
    plan_of,
    pod,
    selector_bundle,
    state,
    tasks,
)

NOW_S = int(NOW.timestamp())


def _rc(**kw: object) -> dict[str, object]:
    return cluster(group("cpu", max_replicas=2, **kw))  # type: ignore[arg-type]


def test_infeasible_tasks_gangs_and_constraints_are_reported_in_rays_shapes() -> None:
    ray = state(
        tasks=[tasks({"GPU": 8}, 3), tasks({"CPU": 1}, 1)],
        gangs=[gang(GangStrategy.STRICT_PACK, bundle({"CPU": 1}), bundle({"TPU": 4}))],
        constraint=[tasks({"custom": 2}, 2)],
    )
    result = plan_of(_rc(), ray=ray)
    msg = build_autoscaling_state(report_from_plan(result, NOW_S))
    # One request per task, as Ray ungroups counts; the feasible CPU task is not among them.
    assert [dict(r.resources_bundle) for r in msg.infeasible_resource_requests] == [
        {"GPU": 8.0}
    ] * 3
    (pg,) = msg.infeasible_gang_resource_requests
    assert [dict(r.resources_bundle) for r in pg.requests] == [{"CPU": 1.0}, {"TPU": 4.0}]
    (floor,) = msg.infeasible_cluster_resource_constraints
    ((request, count),) = [
        (dict(r.request.resources_bundle), r.count) for r in floor.resource_requests
    ]
    assert (request, count) == ({"custom": 2.0}, 2)


def test_label_selectors_of_infeasible_demand_are_sent_back() -> None:
    pinned = selector_bundle({"CPU": 1}, {"zone": "mars"})
    ray = state(tasks=[TaskDemand(bundle=pinned, count=2)])
    result = plan_of(_rc(), ray=ray)
    msg = build_autoscaling_state(report_from_plan(result, NOW_S))
    assert len(msg.infeasible_resource_requests) == 2
    (selector,) = msg.infeasible_resource_requests[0].label_selectors
    (constraint,) = selector.label_constraints
    assert (constraint.label_key, list(constraint.label_values)) == ("zone", ["mars"])


def test_demand_waiting_at_max_replicas_is_not_called_infeasible() -> None:
    rc = _rc(replicas=2)
    pods = [pod("cpu-0", "cpu"), pod("cpu-1", "cpu")]
    nodes = cpu_nodes(["cpu-0", "cpu-1"], free_cpu=0)
    result = plan_of(rc, pods, state(nodes, [tasks({"CPU": 4}, 5)]))
    msg = build_autoscaling_state(report_from_plan(result, NOW_S))
    assert not msg.infeasible_resource_requests
    assert not msg.infeasible_gang_resource_requests


def test_running_pod_without_a_ray_node_is_launching_with_the_reason() -> None:
    rc = _rc(replicas=1)
    result = plan_of(rc, [pod("cpu-0", "cpu", running_for_s=40)], state())
    msg = build_autoscaling_state(report_from_plan(result, NOW_S))
    (line,) = msg.pending_instances
    assert line.instance_id == "cpu-0"
    assert line.details == "launching: pod running, Ray node not joined for 40 s"
    assert not msg.pending_instance_requests  # the pod exists: not counted twice


def test_pending_pod_says_what_it_waits_for() -> None:
    rc = _rc(replicas=1)
    result = plan_of(rc, [pod("cpu-0", "cpu", phase="Pending")], state())
    (line,) = build_autoscaling_state(report_from_plan(result, NOW_S)).pending_instances
    assert line.details.startswith("launching: pod ")
    assert "containercreating" in line.details.lower()


def test_dry_run_never_reports_a_launch_it_did_not_ask_for() -> None:
    result = plan_of(_rc(), ray=state(tasks=[tasks({"CPU": 8}, 2)]))
    assert result.group("cpu").target == 2  # type: ignore[union-attr]
    written = build_autoscaling_state(report_from_plan(result, NOW_S))
    assert len(written.pending_instance_requests) == 2
    dry = build_autoscaling_state(report_from_plan(result, NOW_S, launches_asked=False))
    assert not dry.pending_instance_requests


def test_dry_run_still_reports_replicas_asked_for_earlier() -> None:
    # replicas 1 in the spec and no pod yet: that launch was asked for (by whoever wrote it).
    result = plan_of(_rc(replicas=1), ray=state())
    dry = build_autoscaling_state(report_from_plan(result, NOW_S, launches_asked=False))
    assert [r.ray_node_type_name for r in dry.pending_instance_requests] == ["cpu"]
