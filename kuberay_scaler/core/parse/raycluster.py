"""RayCluster dict → ClusterSpec. Never raises: a bad group becomes a named Problem."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

from kuberay_scaler.core.model.cluster import (
    INT32_MAX,
    MAX_GROUP_HOSTS,
    MAX_HOSTS_PER_SLICE,
    AutoscalerOptions,
    Budget,
    ClusterSpec,
    ContainerShape,
    Problem,
    SpecWriter,
    UpscalingMode,
    WorkerGroup,
    frozen_map,
    parse_budget,
)
from kuberay_scaler.core.model.labels import (
    ANNOTATION_DISRUPTION_BUDGET,
    ANNOTATION_MAX_PROVISION,
    ANNOTATION_SCALE_DOWN_DELAY,
    DRAINING_ANNOTATION,
)
from kuberay_scaler.core.parse.quantity import parse_amount, resources_json

# Container resources a Ray node reports as a resource of its own name. KubeRay's `ray start`
# adds neuron_cores for AWS Neuron (its customAcceleratorToRayResourceMap); Ray's HPU
# accelerator manager reports Gaudi devices visible in the pod as HPU.
OTHER_ACCELERATORS = {"aws.amazon.com/neuroncore": "neuron_cores", "habana.ai/gaudi": "HPU"}
_MIG = re.compile(r"nvidia\.com/mig-\d+g\.\d+gb")
# managedFields entries read. The API server keeps at most 10 Update entries plus one per applier;
# past this the rest are named in a problem, not read (a file for `plan` can hold anything).
MAX_MANAGED_FIELDS = 1000


class GroupError(ValueError):
    """A field of one worker group is unusable; the message names it."""


def parse_raycluster(obj: object) -> ClusterSpec:
    """Parse a RayCluster as the API server returns it (or as `kubectl get -o yaml` prints it)."""
    if not isinstance(obj, Mapping):
        return _empty(Problem(f"RayCluster is not an object but {type(obj).__name__}"))
    meta = _mapping(obj.get("metadata"))
    spec = _mapping(obj.get("spec"))
    problems: list[Problem] = []
    if not isinstance(obj.get("spec"), Mapping):
        problems.append(Problem("spec is missing or not an object"))
    autoscaler = _autoscaler_options(spec.get("autoscalerOptions"), problems)
    groups, skipped = _groups(spec.get("workerGroupSpecs"), problems)
    annotations = meta.get("annotations")
    record = annotations.get(DRAINING_ANNOTATION) if isinstance(annotations, Mapping) else None
    writers, writer_problems = _spec_writers(meta.get("managedFields"))
    return ClusterSpec(
        name=_str(meta.get("name")),
        namespace=_str(meta.get("namespace")) or "default",
        uid=_str(meta.get("uid")),
        resource_version=_str(meta.get("resourceVersion")),
        in_tree_autoscaling=spec.get("enableInTreeAutoscaling") is True,
        suspended=spec.get("suspend") is True,
        autoscaler=autoscaler,
        groups=tuple(groups),
        problems=(*problems, *writer_problems),
        head_container_name=_head_container_name(spec),
        skipped_groups=tuple(skipped),
        draining=frozen_map(_draining(record)),
        draining_record=record if isinstance(record, str) else None,
        has_annotations=isinstance(annotations, Mapping),
        spec_writers=writers,
    )


def _spec_writers(raw: object) -> tuple[tuple[SpecWriter, ...], tuple[Problem, ...]]:
    """The managers that own part of the spec, newest first (stable among equal times).

    Reads each entry's manager, time and the top-level keys of its FieldsV1, never the field
    sets below them (the bulk of managedFields); at most MAX_MANAGED_FIELDS entries. A malformed
    entry is named in one problem with the count, and the well-formed ones are still read."""
    if raw is None:
        return (), ()
    if not isinstance(raw, list):
        return (), (Problem(f"metadata.managedFields is not a list but {type(raw).__name__}"),)
    writers: list[SpecWriter] = []
    complaints: list[str] = []
    for index, entry in enumerate(raw[:MAX_MANAGED_FIELDS]):
        writer, complaint = _spec_writer(entry)
        if writer is not None:
            writers.append(writer)
        if complaint is not None:
            complaints.append(f"entry {index} {complaint}")
    problems: list[Problem] = []
    if complaints:
        more = f" (and {len(complaints) - 1} more)" if len(complaints) > 1 else ""
        problems.append(Problem(f"metadata.managedFields: {complaints[0]}{more}"))
    if len(raw) > MAX_MANAGED_FIELDS:
        problems.append(
            Problem(
                f"metadata.managedFields has {len(raw)} entries; the first {MAX_MANAGED_FIELDS}"
                " were read for the spec's writers"
            )
        )
    writers.sort(key=lambda w: w.time, reverse=True)
    return tuple(writers), tuple(problems)


def _spec_writer(entry: object) -> tuple[SpecWriter | None, str | None]:
    """One entry: the spec writer it names (None: none), and what is wrong with it (None: ok)."""
    if not isinstance(entry, Mapping):
        return None, f"is not an object but {type(entry).__name__}; ignored"
    fields = entry.get("fieldsV1")
    if fields is not None and not isinstance(fields, Mapping):
        return None, f"fieldsV1 is not an object but {type(fields).__name__}; ignored"
    if fields is None or "f:spec" not in fields:
        return None, None
    manager = entry.get("manager")
    if manager is not None and not isinstance(manager, str):
        return None, f"manager is not a string but {type(manager).__name__}; ignored"
    if not manager:
        return None, None  # names nobody
    time = entry.get("time")
    if time is not None and not isinstance(time, str):
        complaint = f"({manager}) time is not a string but {type(time).__name__}; taken as oldest"
        return SpecWriter(manager, ""), complaint
    return SpecWriter(manager, time or ""), None


def _draining(record: object) -> dict[str, tuple[str, ...]]:
    """Group → slice keys our draining record names; a malformed record names none."""
    if not isinstance(record, str):
        return {}
    try:
        parsed = json.loads(record)
    except ValueError:
        return {}
    if not isinstance(parsed, dict):
        return {}
    return {
        str(group): tuple(str(k) for k in keys)
        for group, keys in parsed.items()
        if isinstance(keys, list)
    }


def _empty(problem: Problem) -> ClusterSpec:
    return ClusterSpec(
        name="",
        namespace="default",
        uid="",
        resource_version="",
        in_tree_autoscaling=False,
        suspended=False,
        autoscaler=AutoscalerOptions(),
        groups=(),
        problems=(problem,),
    )


def _groups(raw: object, problems: list[Problem]) -> tuple[list[WorkerGroup], list[str]]:
    if raw is None:
        return [], []
    if not isinstance(raw, list):
        problems.append(Problem("spec.workerGroupSpecs is not a list"))
        return [], []
    names = Counter(_group_label(item, index) for index, item in enumerate(raw))
    groups: list[WorkerGroup] = []
    skipped: list[str] = []
    for index, item in enumerate(raw):
        label = _group_label(item, index)
        if names[label] > 1:
            problems.append(Problem("group name is used more than once; skipped", label))
            skipped.append(label)
            continue
        try:
            groups.append(parse_group(item, index))
        except GroupError as err:
            problems.append(Problem(f"{err}; skipped", label))
            skipped.append(label)
    return groups, skipped


def _group_label(item: object, index: int) -> str:
    name = item.get("groupName") if isinstance(item, Mapping) else None
    return name if isinstance(name, str) and name else f"workerGroupSpecs[{index}]"


def parse_group(raw: object, index: int) -> WorkerGroup:
    """One workerGroupSpecs entry; raises GroupError naming the first unusable field."""
    if not isinstance(raw, Mapping):
        raise GroupError(f"entry is not an object but {type(raw).__name__}")
    name = raw.get("groupName")
    if not isinstance(name, str) or not name:
        raise GroupError("groupName is missing or not a string")
    replicas_present = "replicas" in raw
    if replicas_present and raw["replicas"] is None:
        raise GroupError("replicas is null")
    replicas = _int_field(raw, "replicas", 0)
    min_replicas = _int_field(raw, "minReplicas", 0)
    max_replicas = _int_field(raw, "maxReplicas", INT32_MAX)
    if min_replicas > max_replicas:
        raise GroupError(f"minReplicas {min_replicas} > maxReplicas {max_replicas}")
    num_of_hosts = _int_field(raw, "numOfHosts", 1)
    if num_of_hosts < 1:
        # KubeRay would create no pods for it; planning slices of zero hosts is meaningless.
        raise GroupError(f"numOfHosts must be at least 1, got {num_of_hosts}")
    _check_sizes(replicas, min_replicas, num_of_hosts)
    idle = raw.get("idleTimeoutSeconds")
    if idle is not None and (not _is_int(idle) or idle < 0):
        raise GroupError(f"idleTimeoutSeconds must be a non-negative integer, got {idle!r}")
    priority = raw.get("priority", 0)
    if not _is_int(priority):
        raise GroupError(f"priority must be an integer, got {priority!r}")
    suspend = raw.get("suspend", False)
    if not isinstance(suspend, bool):
        raise GroupError(f"suspend must be a boolean, got {suspend!r}")
    pod_spec = _mapping(_mapping(raw.get("template")).get("spec"))
    scale_strategy = raw.get("scaleStrategy")
    stored_names = isinstance(scale_strategy, Mapping) and "workersToDelete" in scale_strategy
    ray_start_params = _string_map(raw.get("rayStartParams"), "rayStartParams")
    resources = _string_map(raw.get("resources"), "resources")
    _check_amounts(ray_start_params, resources)
    budget, delay_s = _disruption_rules(_mapping(raw.get("template")))
    return WorkerGroup(
        name=name,
        index=index,
        replicas=replicas,
        replicas_present=replicas_present,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        num_of_hosts=num_of_hosts,
        idle_timeout_s=float(idle) if idle is not None else None,
        priority=int(priority),
        suspend=suspend,
        ray_start_params=ray_start_params,
        resources=resources,
        labels=_string_map(raw.get("labels"), "labels"),
        container=_ray_container(pod_spec),
        node_selector=_string_map(pod_spec.get("nodeSelector"), "template nodeSelector"),
        workers_to_delete=_workers_to_delete(scale_strategy),
        max_provision_s=_max_provision(_mapping(raw.get("template")).get("metadata")),
        disruption_budget=budget,
        scale_down_delay_s=delay_s,
        num_of_hosts_present="numOfHosts" in raw,
        scale_strategy_present=isinstance(scale_strategy, Mapping),
        workers_to_delete_present=stored_names,
        workers_to_delete_null=stored_names and _mapping(scale_strategy)["workersToDelete"] is None,
    )


def _max_provision(meta: object) -> float | None:
    """The group's own provisioning deadline from its template's annotation, if set."""
    raw = _mapping(_mapping(meta).get("annotations")).get(ANNOTATION_MAX_PROVISION)
    if raw is None:
        return None
    try:
        seconds = float(raw)
    except (TypeError, ValueError):
        seconds = float("nan")
    if not math.isfinite(seconds) or seconds <= 0:
        raise GroupError(
            f"annotation {ANNOTATION_MAX_PROVISION} must be positive seconds, got {raw!r}"
        )
    return seconds


def _disruption_rules(template: Mapping[str, Any]) -> tuple[Budget | None, float | None]:
    """The group's disruption budget and scale-down delay from its template's annotations."""
    notes = _mapping(_mapping(template.get("metadata")).get("annotations"))
    budget: Budget | None = None
    delay_s: float | None = None
    raw_budget = notes.get(ANNOTATION_DISRUPTION_BUDGET)
    if raw_budget is not None:
        try:
            budget = parse_budget(str(raw_budget))
        except ValueError as err:
            raise GroupError(f"annotation {ANNOTATION_DISRUPTION_BUDGET}: {err}") from None
    raw_delay = notes.get(ANNOTATION_SCALE_DOWN_DELAY)
    if raw_delay is not None:
        text = str(raw_delay).strip()
        if not (text.isascii() and text.isdigit() and len(text) <= 8):
            raise GroupError(
                f"annotation {ANNOTATION_SCALE_DOWN_DELAY}: {raw_delay!r} is not a whole number"
                " of seconds"
            )
        delay_s = float(text)
    return budget, delay_s


def _check_sizes(replicas: int, min_replicas: int, num_of_hosts: int) -> None:
    # Bounded here so that no plan ever builds millions of hosts (docs/reliability.md).
    if num_of_hosts > MAX_HOSTS_PER_SLICE:
        raise GroupError(f"numOfHosts {num_of_hosts} is more than {MAX_HOSTS_PER_SLICE}")
    for key, count in (("replicas", replicas), ("minReplicas", min_replicas)):
        if count * num_of_hosts > MAX_GROUP_HOSTS:
            raise GroupError(
                f"{key} {count} × numOfHosts {num_of_hosts} is more than {MAX_GROUP_HOSTS} hosts"
            )


def _check_amounts(params: Mapping[str, str], resources: Mapping[str, str]) -> None:
    """Every resource amount the group states is finite and within what Ray can hold."""
    for key in ("num-cpus", "num-gpus", "memory"):
        if key in params:
            try:
                parse_amount(params[key])
            except ValueError as err:
                raise GroupError(f"rayStartParams {key}: {err}") from None
    if params.get("resources"):
        try:
            resources_json(params["resources"])
        except ValueError as err:
            raise GroupError(f"rayStartParams resources: {err}") from None
    for key, raw in resources.items():
        try:
            parse_amount(raw)
        except ValueError as err:
            raise GroupError(f"resources {key}: {err}") from None


def _int_field(raw: Mapping[str, Any], key: str, default: int) -> int:
    value = raw.get(key, default)
    if not _is_int(value):
        raise GroupError(f"{key} must be an integer, got {value!r}")
    if value < 0 and key != "numOfHosts":
        raise GroupError(f"{key} must not be negative, got {value}")
    if value > INT32_MAX:
        raise GroupError(f"{key} {value} exceeds int32")
    return int(value)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _string_map(raw: object, what: str) -> Any:
    if raw is None:
        return frozen_map()
    if not isinstance(raw, Mapping):
        raise GroupError(f"{what} must be a map, got {type(raw).__name__}")
    out: dict[str, str] = {}
    for key, value in raw.items():
        # YAML turns `num-cpus: 1` into an int; KubeRay stores strings, so normalise.
        if not isinstance(key, str) or isinstance(value, Mapping | list) or value is None:
            raise GroupError(f"{what} entry {key!r} is not a string value")
        out[key] = str(value).lower() if isinstance(value, bool) else str(value)
    return frozen_map(out)


def _ray_container(pod_spec: Mapping[str, Any]) -> ContainerShape:
    containers = pod_spec.get("containers")
    if not isinstance(containers, list) or not containers or not isinstance(containers[0], Mapping):
        raise GroupError("template.spec.containers is empty or malformed")
    # KubeRay treats the first container of the template as the Ray container.
    first = containers[0]
    name = first.get("name")
    if not isinstance(name, str) or not name:
        raise GroupError("the Ray container (containers[0]) has no name")
    resources = _mapping(first.get("resources"))
    limits, requests = _mapping(resources.get("limits")), _mapping(resources.get("requests"))
    return ContainerShape(
        name=name,
        cpu=_resource(limits, requests, "cpu"),
        memory_bytes=_resource(limits, requests, "memory"),
        gpu=_gpu(limits, requests),
        tpu=_resource(limits, requests, "google.com/tpu"),
        accelerators=frozen_map(_other_accelerators(limits)),
    )


def _gpu(limits: Mapping[str, Any], requests: Mapping[str, Any]) -> float | None:
    """Ray's rule: the first limit, then request, whose name ends in "gpu" and is above 0.

    That covers nvidia.com/gpu, amd.com/gpu and any vendor spelling it that way. NVIDIA MIG
    devices (nvidia.com/mig-<g>g.<mem>gb) count too: KubeRay's `ray start` passes them as
    --num-gpus, so the node has them even though Ray's autoscaling config does not see them.
    """
    for source in (limits, requests):
        for key, raw in source.items():
            if isinstance(key, str) and (key.endswith("gpu") or _MIG.fullmatch(key)):
                count = _quantity(raw, key)
                if count > 0:
                    return count
    return None


def _other_accelerators(limits: Mapping[str, Any]) -> dict[str, float]:
    """Accelerators a node reports under a resource of their own (KubeRay / Ray's detection)."""
    out: dict[str, float] = {}
    for key, resource in OTHER_ACCELERATORS.items():
        if key in limits:
            count = _quantity(limits[key], key)
            if count > 0:
                out[resource] = count
    return out


def _quantity(raw: object, key: str) -> float:
    try:
        return parse_amount(raw)
    except ValueError as err:
        raise GroupError(f"container resource {key}: {err}") from None


def _resource(limits: Mapping[str, Any], requests: Mapping[str, Any], key: str) -> float | None:
    raw = limits.get(key, requests.get(key))
    if raw is None:
        return None
    try:
        return parse_amount(raw)
    except ValueError as err:
        raise GroupError(f"container resource {key}: {err}") from None


def _workers_to_delete(raw: object) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise GroupError("scaleStrategy must be an object")
    names = raw.get("workersToDelete")
    if names is None:
        return ()
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise GroupError("scaleStrategy.workersToDelete must be a list of pod names")
    return tuple(names)


def _autoscaler_options(raw: object, problems: list[Problem]) -> AutoscalerOptions:
    if raw is not None and not isinstance(raw, Mapping):
        problems.append(Problem("spec.autoscalerOptions is not an object; defaults used"))
    opts = _mapping(raw)
    idle = opts.get("idleTimeoutSeconds")
    if idle is not None and (not _is_int(idle) or idle < 0):
        problems.append(Problem(f"autoscalerOptions.idleTimeoutSeconds {idle!r} ignored"))
        idle = None
    mode_raw = opts.get("upscalingMode", UpscalingMode.DEFAULT.value)
    try:
        mode = UpscalingMode(mode_raw)
    except ValueError:
        problems.append(Problem(f"autoscalerOptions.upscalingMode {mode_raw!r} unknown; Default"))
        mode = UpscalingMode.DEFAULT
    return AutoscalerOptions(
        idle_timeout_s=float(idle) if idle is not None else None, upscaling_mode=mode
    )


def _head_container_name(spec: Mapping[str, Any]) -> str:
    head = _mapping(_mapping(_mapping(spec.get("headGroupSpec")).get("template")).get("spec"))
    containers = head.get("containers")
    if isinstance(containers, list) and containers and isinstance(containers[0], Mapping):
        name = containers[0].get("name")
        if isinstance(name, str) and name:
            return name
    return "ray-head"


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""
