"""The `ray start` command KubeRay writes into a Ray container, and reading it back.

Written from KubeRay's rules (ray-operator `controllers/ray/common/pod.go`, v1.6:
`generateRayStartCommand`, `addWellKnownAcceleratorResources`, `convertParamMap`), not from the
daemon's code, so the stand-ins size their Ray hosts the way a real pod would be sized:

- `num-cpus`: rayStartParams, else the container's CPU limit, else its request, rounded up to a
  whole number (resource.Quantity.Value());
- `memory`: rayStartParams, else the memory limit in bytes (rounded up);
- `num-gpus`: rayStartParams, else the first limit (sorted by name) whose name ends in "gpu";
- the first custom accelerator limit (sorted: `aws.amazon.com/neuroncore` → `neuron_cores`,
  `google.com/tpu` → `TPU`) is added to the `resources` JSON unless one is there already;
- flags sorted by name, `--name=value`; "true" becomes a bare `--name`, "false" is dropped
  (except `log-color` and `include-dashboard`, which keep their value); `block` is always on.

The container gets `command: ["/bin/bash", "-lc", "--"]` and `args: ["ulimit -n 65536; ray start
..."]`, unless its own command or args already mention "ray start".
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

ACCELERATORS = {"aws.amazon.com/neuroncore": "neuron_cores", "google.com/tpu": "TPU"}
_VALUE_FLAGS = ("log-color", "include-dashboard")
_SUFFIXES = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}
_QUANTITY = re.compile(
    r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$"
)


def quantity(value: object) -> Decimal | None:
    """A Kubernetes resource.Quantity as a number (None when it does not parse)."""
    text = str(value).strip()
    match = _QUANTITY.match(text)
    if not match:
        return None
    number, exponent, suffix = match.groups()
    try:
        base = Decimal(number)
        return base * Decimal(f"1{exponent}") if exponent else base * _SUFFIXES[suffix or ""]
    except InvalidOperation:
        return None


def _whole(value: Decimal) -> int:
    """resource.Quantity.Value(): rounded up to an integer."""
    return math.ceil(value)


def _nonzero(limits: Mapping[str, Any], key: str) -> Decimal | None:
    amount = quantity(limits[key]) if key in limits else None
    return amount if amount else None


def start_params(
    node_type: str, ray_start_params: Mapping[str, str], resources: Mapping[str, Any]
) -> dict[str, str]:  # node_type kept for KubeRay's signature; head and worker differ only later
    """rayStartParams completed from the Ray container's resources, as KubeRay completes them."""
    params = {str(k): str(v) for k, v in ray_start_params.items()}
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    if "num-cpus" not in params:
        cpu = _nonzero(limits, "cpu") or _nonzero(requests, "cpu")
        if cpu is not None:
            params["num-cpus"] = str(_whole(cpu))
    if "memory" not in params:
        memory = _nonzero(limits, "memory")
        if memory is not None:
            params["memory"] = str(_whole(memory))
    _add_accelerators(params, limits)
    params["block"] = "true"
    return params


def _add_accelerators(params: dict[str, str], limits: Mapping[str, Any]) -> None:
    custom = _resources_of(params)
    has_custom = any(name in custom for name in ACCELERATORS.values())
    for key in sorted(limits):
        amount = _nonzero(limits, key)
        if amount is None:
            continue
        if "num-gpus" not in params and key.endswith("gpu"):
            params["num-gpus"] = str(_whole(amount))
        if not has_custom and key in ACCELERATORS:
            custom.setdefault(ACCELERATORS[key], float(amount))
            params["resources"] = f"'{json.dumps(custom, separators=(',', ':'))}'"
            has_custom = True


def _resources_of(params: Mapping[str, str]) -> dict[str, float]:
    text = params.get("resources")
    if text is None:
        return {}
    loaded = json.loads(text.strip("'\"` "))
    return {str(k): float(v) for k, v in loaded.items()}


def render(node_type: str, params: Mapping[str, str]) -> str:
    """`ray start [--head] --k=v ...` with KubeRay's flag rules."""
    flags = []
    for name in sorted(params):
        value = params[name]
        if value.lower() in ("true", "false") and name not in _VALUE_FLAGS:
            if value.lower() == "true":
                flags.append(f"--{name}")
        else:
            flags.append(f"--{name}={value}")
    head = "--head " if node_type == "head" else ""
    return f"ray start {head}{' '.join(flags)}"


def set_container_command(
    container: dict[str, Any], node_type: str, params: Mapping[str, str], head_address: str
) -> None:
    """Write the command into the Ray container the way KubeRay's BuildPod does."""
    own = " ".join([*(container.get("command") or []), *(container.get("args") or [])])
    if "ray start" in own:
        return
    full = start_params(node_type, params, container.get("resources") or {})
    if node_type == "worker":
        full.setdefault("address", head_address)
    generated = f"ulimit -n 65536; {render(node_type, full)}"
    container["command"] = ["/bin/bash", "-lc", "--"]
    container["args"] = [f"{own} && {generated}" if own else generated]


@dataclass(frozen=True)
class RayStartFlags:
    """What a `ray start` line asks for."""

    head: bool = False
    num_cpus: int | None = None
    num_gpus: int | None = None
    memory: int | None = None
    resources: dict[str, float] = field(default_factory=dict)
    other: dict[str, str] = field(default_factory=dict)


def parse_command(line: str) -> RayStartFlags:
    """The flags of the `ray start` in a container's shell line (raises ValueError if none)."""
    words = shlex.split(line.replace(";", " ; ").replace("&&", " && "))
    try:
        at = next(i for i in range(len(words) - 1) if words[i] == "ray" and words[i + 1] == "start")
    except StopIteration:
        raise ValueError(f"no `ray start` in {line!r}") from None
    flags: dict[str, str] = {}
    head = False
    for word in words[at + 2 :]:
        if word in (";", "&&"):
            break
        name, _, value = word.removeprefix("--").partition("=")
        if name == "head":
            head = True
        flags[name] = value if _ else "true"
    resources = json.loads(flags.pop("resources", "{}").strip("'\"` ") or "{}")
    return RayStartFlags(
        head=head,
        num_cpus=int(flags.pop("num-cpus")) if "num-cpus" in flags else None,
        num_gpus=int(flags.pop("num-gpus")) if "num-gpus" in flags else None,
        memory=int(flags.pop("memory")) if "memory" in flags else None,
        resources={str(k): float(v) for k, v in resources.items()},
        other=flags,
    )


def flags_of_pod(pod: Mapping[str, Any]) -> RayStartFlags:
    """The `ray start` flags of a pod's Ray container (container 0, as in KubeRay)."""
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    ray = containers[0]
    line = " ".join([*(ray.get("command") or []), *(ray.get("args") or [])])
    return parse_command(line)
