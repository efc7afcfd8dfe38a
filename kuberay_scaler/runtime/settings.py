"""Configuration from environment variables, validated once at start.

KubeRay injects the `RAY_*` and `KUBERAY_CRD_VER` variables into its autoscaler container; our own
knobs use the `KUBERAY_SCALER_` prefix. Bad values raise `ConfigError` with one line naming the
variable, and the CLI turns that into exit code 2.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import (
    AliasChoices,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from kuberay_scaler.core import defaults as D
from kuberay_scaler.core.model.cluster import parse_budget

PREFIX = "KUBERAY_SCALER_"
# Kubernetes object names: RFC 1123 subdomain (RayCluster) and label (namespace).
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_API_VERSION = re.compile(r"v[1-9][0-9]*((alpha|beta)[1-9][0-9]*)?")


DEFAULT_HTTP_PORT = 44217


class ConfigError(Exception):
    """Invalid configuration; the message is one line meant for the user."""


def _ours(name: str) -> AliasChoices:
    return AliasChoices(PREFIX + name.upper())


# --- Bounds: every number has both ends; new fields use `seconds()` / `count()` -----------------
# Durations reach asyncio timers, aiohttp and gRPC timeouts and epoch-millisecond int64 deadlines
# (DrainNode): 1e300 s overflowed the drain request inside every reconcile. 366 days is far from
# every overflow (epoch ms + 366 d fits int64 until the year 292 million) and above any sane value.
MAX_SECONDS = 366 * 24 * 3600.0
# Counts: at least one, and small enough that "never" is not spelt as a 4,301-digit number.
MAX_COUNT = 10_000


def seconds(
    default: float | None,
    name: str,
    description: str,
    *,
    minimum: float = 0.0,
    inclusive: bool = False,
    maximum: float = MAX_SECONDS,
) -> Any:
    """A duration field read from `KUBERAY_SCALER_<NAME>`: finite, above `minimum` (or equal to
    it when `inclusive`) and at most `maximum` seconds."""
    return Field(
        default=default,
        ge=minimum if inclusive else None,
        gt=None if inclusive else minimum,
        le=maximum,
        validation_alias=_ours(name),
        description=description,
    )


def count(
    default: int, name: str, description: str, *, minimum: int = 1, maximum: int = MAX_COUNT
) -> Any:
    """A count field read from `KUBERAY_SCALER_<NAME>`: an integer in [`minimum`, `maximum`]."""
    return Field(
        default=default,
        ge=minimum,
        le=maximum,
        validation_alias=_ours(name),
        description=description,
    )


def _bounds(field: str) -> tuple[str, float, float]:
    """(">" or ">=", lower, upper) of a numeric field, from its pydantic constraints."""
    low_op, low, high = ">", float("-inf"), float("inf")
    for item in Settings.model_fields[field].metadata:
        if getattr(item, "gt", None) is not None:
            low_op, low = ">", float(item.gt)
        elif getattr(item, "ge", None) is not None:
            low_op, low = ">=", float(item.ge)
        elif getattr(item, "le", None) is not None:
            high = float(item.le)
    return low_op, low, high


def upper_bound(field: str) -> float:
    """The largest value a numeric setting accepts (documented in README's table)."""
    return _bounds(field)[2]


def range_text(field: str) -> str:
    """README's "Range" cell of a numeric setting, e.g. `> 0, <= 31622400`."""
    low_op, low, high = _bounds(field)
    return f"`{low_op} {_number(low)}, <= {_number(high)}`"


def _number(value: float) -> str:
    return str(int(value)) if value.is_integer() else f"{value:g}"


class Settings(BaseSettings):
    """Effective configuration of one kuberay-scaler process.

    Build it with `load_settings`: that is the one reader of the environment, so variable names
    match exactly and an explicit mapping is the whole environment. `Settings()` gives defaults.
    """

    # No inf/nan: every float here is a duration handed to asyncio.
    model_config = SettingsConfigDict(
        frozen=True, extra="ignore", populate_by_name=False, allow_inf_nan=False
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # pydantic-settings would read os.environ (in any case) even under model_validate.
        return (init_settings,)

    # --- Injected by KubeRay into its autoscaler container -------------------------------------
    cluster_name: str = Field(
        default="",
        validation_alias=AliasChoices("RAY_CLUSTER_NAME"),
        description="Name of the RayCluster to scale; `run` will not start without it.",
    )
    cluster_namespace: str = Field(
        default="default",
        validation_alias=AliasChoices("RAY_CLUSTER_NAMESPACE"),
        description="Namespace of that RayCluster.",
    )
    head_pod_name: str | None = Field(
        default=None,
        validation_alias=AliasChoices("RAY_HEAD_POD_NAME"),
        description="The head pod's name, named in logs and Events.",
    )
    crd_version: str = Field(
        default=D.CRD_VERSION,
        validation_alias=AliasChoices("KUBERAY_CRD_VER"),
        description="API version of the ray.io CRDs read and patched.",
    )
    ray_auth_token: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("RAY_AUTH_TOKEN"),
        description="Ray auth token, sent as 'authorization: Bearer' on every GCS call; masked.",
    )
    ray_auth_mode: str | None = Field(
        default=None,
        validation_alias=AliasChoices("RAY_AUTH_MODE"),
        description="Ray's auth mode, as the head has it; 'token' requires RAY_AUTH_TOKEN.",
    )
    ray_use_tls: bool = Field(
        default=False,
        validation_alias=AliasChoices("RAY_USE_TLS"),
        description="Talk TLS to the GCS, with the RAY_TLS_* files.",
    )
    ray_tls_server_cert: Path | None = Field(
        default=None,
        validation_alias=AliasChoices("RAY_TLS_SERVER_CERT"),
        description="Client certificate (PEM) presented to the GCS under TLS.",
    )
    ray_tls_server_key: Path | None = Field(
        default=None,
        validation_alias=AliasChoices("RAY_TLS_SERVER_KEY"),
        description="Private key (PEM) of that client certificate.",
    )
    ray_tls_ca_cert: Path | None = Field(
        default=None,
        validation_alias=AliasChoices("RAY_TLS_CA_CERT"),
        description="CA bundle (PEM) that signed the GCS's certificate.",
    )

    # --- Our own knobs ---------------------------------------------------------------------------
    gcs_address: str = Field(
        default="127.0.0.1:6379",
        validation_alias=_ours("gcs_address"),
        description="host:port of the Ray GCS; from the head pod this is 127.0.0.1:6379.",
    )
    gcs_poll_interval_s: float = seconds(
        D.GCS_POLL_INTERVAL_S,
        "gcs_poll_interval_s",
        "Longest wait between GetClusterResourceState polls. Idle, the poller polls every"
        " 0.4 s while polls are cheap (up to ~1k nodes), 0.6 s apart once a poll costs more"
        " (10k nodes), and further apart only where a poll would take over 5 % of a core;"
        " sooner (down to 0.1 s) while demand is pending or the state just moved.",
        minimum=0.1,
        inclusive=True,
        maximum=60,
    )
    gcs_rpc_timeout_s: float = seconds(
        D.GCS_RPC_TIMEOUT_S,
        "gcs_rpc_timeout_s",
        "Deadline of one GCS RPC.",
        maximum=120,
    )
    gcs_stale_after_s: float = seconds(
        D.GCS_STALE_AFTER_S,
        "gcs_stale_after_s",
        "Demand older than this is unknown: the planner holds and /readyz goes false.",
    )
    kubeconfig: Path | None = Field(
        default=None,
        validation_alias=AliasChoices(PREFIX + "KUBECONFIG", "KUBECONFIG"),
        description="Kubeconfig file; unset means in-cluster service-account credentials.",
    )
    k8s_request_timeout_s: float = seconds(
        D.K8S_REQUEST_TIMEOUT_S,
        "k8s_request_timeout_s",
        "Timeout of one Kubernetes API request (watches use their own timeout).",
        maximum=300,
    )
    watch_silence_timeout_s: float = seconds(
        D.WATCH_SILENCE_TIMEOUT_S,
        "watch_silence_timeout_s",
        "A watch with no event or bookmark for this long is treated as dead.",
        minimum=1.0,
        inclusive=True,
    )
    resync_interval_s: float = seconds(
        D.RESYNC_INTERVAL_S,
        "resync_interval_s",
        "Periodic reconcile when nothing changed.",
        minimum=1.0,
        inclusive=True,
    )
    raycluster_poll_interval_s: float = seconds(
        D.RAYCLUSTER_POLL_INTERVAL_S,
        "raycluster_poll_interval_s",
        "Poll mode (no watch on rayclusters, KubeRay's Role): GET the RayCluster this"
        " often, so spec edits are acted on within seconds; pod events bring a GET sooner"
        " (never two within 1 s).",
        maximum=300,
    )
    debounce_s: float = seconds(
        D.DEBOUNCE_S,
        "debounce_s",
        "Changes arriving within this window are folded into one reconcile.",
        inclusive=True,
        maximum=10,
    )
    dry_run: bool = Field(
        default=False,
        validation_alias=_ours("dry_run"),
        description="Plan, log and expose decisions, but never drain or patch.",
    )
    log_format: Literal["auto", "json", "console"] = Field(
        default="auto",
        validation_alias=_ours("log_format"),
        description="auto = console on a TTY, JSON lines otherwise.",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info",
        validation_alias=_ours("log_level"),
        description="Minimum level of log lines.",
    )
    # Ray's own autoscaler metrics port (AUTOSCALER_METRIC_PORT): scrape configs for Ray's
    # autoscaler keep working, and 8080 stays free for Ray's metrics export in the head pod.
    http_address: str = Field(
        default=f"0.0.0.0:{DEFAULT_HTTP_PORT}",
        validation_alias=_ours("http_address"),
        description="host:port for /healthz, /readyz, /metrics and /debug/plan; empty disables.",
    )
    idle_timeout_s: float | None = seconds(
        None,
        "idle_timeout_s",
        "Overrides every idle timeout from the RayCluster when set.",
    )
    max_provision_time_s: float = seconds(
        D.MAX_PROVISION_TIME_S,
        "max_provision_time_s",
        "A slice not fully up (pods Running, Ray nodes joined) after this is broken.",
    )
    missing_node_grace_s: float = seconds(
        D.MISSING_NODE_GRACE_S,
        "missing_node_grace_s",
        "A Running pod whose Ray node is missing this long makes its slice broken.",
    )
    replace_backoff_s: float = seconds(
        D.REPLACE_BACKOFF_S,
        "replace_backoff_s",
        "First per-group backoff after replacing a broken slice; doubles up to 30 min.",
    )
    write_expectation_timeout_s: float = seconds(
        D.WRITE_EXPECTATION_TIMEOUT_S,
        "write_expectation_timeout_s",
        "After a patch, plan nothing for that group until it is seen, or this passes.",
    )
    drain_deadline_s: float = seconds(
        D.DRAIN_DEADLINE_S,
        "drain_deadline_s",
        "Deadline handed to DrainNode for each host of a slice.",
    )
    preempt_deadline_s: float = seconds(
        D.PREEMPT_DEADLINE_S,
        "preempt_deadline_s",
        "A busy slice above maxReplicas is drained (reason preemption) this long"
        " before it is deleted, so Ray can move its work (Ray's own stops it at once). Raise it"
        ' for more grace (see docs/planner.md, "Above maxReplicas").',
    )
    # --- disruption: cluster-wide defaults; a group's template annotations win ---
    disruption_budget: str = Field(
        default=D.DISRUPTION_BUDGET,
        validation_alias=_ours("disruption_budget"),
        description="Slices of one group that may leave at once by idle scale-down: a count"
        " (10) or a percentage of the group's slices (20%); slices already leaving count. A"
        " group's annotation kuberay-scaler.ray.io/disruption-budget overrides it.",
    )
    scale_down_delay_after_add_s: float = seconds(
        D.SCALE_DOWN_DELAY_AFTER_ADD_S,
        "scale_down_delay_after_add_s",
        "A group that added a slice removes no idle slice for this long (0: off). A group's"
        " annotation kuberay-scaler.ray.io/scale-down-delay-after-add-seconds overrides it.",
        inclusive=True,
    )
    # --- gate: broken but busy is bounded ---
    broken_busy_max_s: float = seconds(
        D.BROKEN_BUSY_MAX_S,
        "broken_busy_max_s",
        "A broken slice with a busy host is kept at most this long, then its live"
        " hosts are drained for preemption and it is replaced whole.",
    )
    # --- group availability: fallback between slice types ---
    unavailable_backoff_s: float = seconds(
        D.UNAVAILABLE_BACKOFF_S,
        "unavailable_backoff_s",
        "A group that cannot get capacity (stockout, quota, unschedulable, image, provisioning"
        " deadline) adds no slice this long, then one slice probes it; each failed probe doubles"
        " the wait.",
    )
    unavailable_max_backoff_s: float = seconds(
        D.UNAVAILABLE_MAX_BACKOFF_S,
        "unavailable_max_backoff_s",
        "The longest an unavailable group waits before its next probe (it wins over a larger"
        " KUBERAY_SCALER_UNAVAILABLE_BACKOFF_S).",
    )
    # --- slice reservations (ray.util.tpu) ---
    reservation_grace_s: float = seconds(
        D.RESERVATION_GRACE_S,
        "reservation_grace_s",
        "Unneeded slices of a group that served slice reservations (ray.util.tpu) are kept this"
        " long after the last one was pending, so the next attempt finds them (Ray gives each"
        " reservation 100 s, a slice takes minutes). 0 turns it off.",
        inclusive=True,
    )
    # --- the loop: health by progress, giving up on a target not served, overrides ---
    unhealthy_after_failures: int = count(
        D.UNHEALTHY_AFTER_FAILURES,
        "unhealthy_after_failures",
        "/healthz fails after this many failed attempts since the loop last achieved what it"
        " planned.",
    )
    unhealthy_after_s: float = seconds(
        D.UNHEALTHY_AFTER_S,
        "unhealthy_after_s",
        "/healthz fails when the loop has had work to do (a write, a drain, demand to serve)"
        " and has not achieved it for this long, or the oldest want of a group (replicas,"
        " deletions) has not shown in the cluster for this long, whatever the cause.",
    )
    give_up_after_s: float = seconds(
        D.GIVE_UP_AFTER_S,
        "give_up_after_s",
        "Exit non-zero when the RayCluster has not existed or been served (404, CRD version not"
        " served, 401/403) for this long; a server that is down never makes it exit.",
    )
    override_backoff_s: float = seconds(
        D.OVERRIDE_BACKOFF_S,
        "override_backoff_s",
        "Another writer reset a group's replicas: leave the group alone this long (doubling"
        " with each override).",
    )
    override_backoff_max_s: float = seconds(
        D.OVERRIDE_BACKOFF_MAX_S,
        "override_backoff_max_s",
        "The longest the override back-off grows to.",
    )
    override_memory_s: float = seconds(
        D.OVERRIDE_MEMORY_S,
        "override_memory_s",
        "An override older than this no longer counts toward the doubling.",
    )
    shutdown_grace_s: float = seconds(
        10.0,
        "shutdown_grace_s",
        "On SIGTERM, how long an in-flight patch may take before we abandon it.",
        maximum=25,
    )

    @field_validator("cluster_name")
    @classmethod
    def _cluster_name(cls, value: str) -> str:
        if value and not _DNS_SUBDOMAIN.fullmatch(value):
            raise ValueError("not a valid Kubernetes object name")
        return value

    @field_validator("disruption_budget")
    @classmethod
    def _budget(cls, value: str) -> str:
        return str(parse_budget(value))  # raises ValueError naming the expected form

    @field_validator("cluster_namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        if not _DNS_LABEL.fullmatch(value):
            raise ValueError("not a valid Kubernetes namespace name")
        return value

    @field_validator("crd_version")
    @classmethod
    def _crd_version(cls, value: str) -> str:
        if not _API_VERSION.fullmatch(value):
            raise ValueError("expected an API version such as v1")
        return value

    @field_validator("gcs_address")
    @classmethod
    def _host_port(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if "@" in host:  # user:password@host: a GCS takes no user info (RAY_AUTH_TOKEN does)
            raise ValueError("expected host:port, without user info (not shown)")
        if not sep or not host or not port.isascii() or not port.isdigit() or len(port) > 5:
            raise ValueError("expected host:port")
        if not 0 < int(port) < 65536:
            raise ValueError("port must be between 1 and 65535")
        return value

    @field_validator("http_address")
    @classmethod
    def _optional_host_port(cls, value: str) -> str:
        return value if value == "" else cls._host_port(value)

    @field_validator("ray_auth_token", mode="before")
    @classmethod
    def _token_text(cls, value: Any) -> Any:
        # A Secret made from a file often ends in a newline; gRPC rejects it in metadata.
        if not isinstance(value, str):
            return value
        token = value.strip()
        # gRPC metadata values are printable ASCII (0x20-0x7E): anything else fails every RPC
        # with a traceback, so refuse it here, without showing it.
        if not all(" " <= char <= "~" for char in token):
            raise ValueError(
                "must be printable ASCII on one line; it holds a newline, control or non-ASCII"
                " character gRPC cannot send"
            )
        return token

    @field_validator("ray_use_tls", mode="before")
    @classmethod
    def _ray_bool(cls, value: Any) -> Any:
        # Ray writes RAY_USE_TLS=1/0; pydantic's bool parser already accepts those and true/false.
        return value.strip() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        # Caught here rather than at the first RPC: the GCS would only say UNAUTHENTICATED.
        if self.ray_auth_mode == "token" and not self.ray_auth_token:
            raise ValueError("RAY_AUTH_TOKEN: must be set when RAY_AUTH_MODE is token")
        if self.ray_use_tls:
            self._check_tls_files()
        return self

    def _check_tls_files(self) -> None:
        # Ray's GCS TLS is mutual: the client needs all three files.
        for env, path in (
            ("RAY_TLS_CA_CERT", self.ray_tls_ca_cert),
            ("RAY_TLS_SERVER_CERT", self.ray_tls_server_cert),
            ("RAY_TLS_SERVER_KEY", self.ray_tls_server_key),
        ):
            if path is None:
                raise ValueError(f"{env}: must be set when RAY_USE_TLS is on")
            if not path.is_file():
                raise ValueError(f"{env}: no such file {str(path)!r}")
            try:
                text = path.read_bytes()
            except OSError as err:
                raise ValueError(f"{env}: cannot read {str(path)!r}: {err.strerror}") from None
            if b"-----BEGIN " not in text:
                raise ValueError(f"{env}: {str(path)!r} is not a PEM file")

    def require_cluster(self) -> None:
        """`run` needs to know which RayCluster it scales."""
        if not self.cluster_name:
            raise ConfigError(
                "invalid configuration: RAY_CLUSTER_NAME: must be set to the RayCluster's name"
            )

    def masked(self) -> dict[str, Any]:
        """Effective settings as env-var name → value, secrets masked; for check-config."""
        shown: dict[str, Any] = {}
        for name, info in type(self).model_fields.items():
            alias = info.validation_alias
            env = alias.choices[0] if isinstance(alias, AliasChoices) else name
            value = getattr(self, name)
            if isinstance(value, SecretStr):
                value = "********" if value.get_secret_value() else ""
            elif isinstance(value, Path):
                value = str(value)
            shown[str(env)] = value
        return shown


def credentials_hint(problem: str, kubeconfig: str | None) -> str:
    """One line: what is wrong with the Kubernetes credentials and which variable to set."""
    if kubeconfig is not None:
        return (
            f"invalid configuration: KUBERAY_SCALER_KUBECONFIG (or KUBECONFIG): {problem};"
            " set it to a readable kubeconfig file"
        )
    return (
        f"no Kubernetes credentials: {problem}; set KUBERAY_SCALER_KUBECONFIG to a kubeconfig"
        " file, or run in a pod with a service account"
    )


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Read settings from `environ` (default: the process environment)."""
    env = os.environ if environ is None else environ
    _reject_unknown(env)
    try:
        return _settings_from_mapping(env)
    except ValidationError as err:
        raise ConfigError(_one_line(err)) from None


def _known_names() -> set[str]:
    return {
        str(choice)
        for info in Settings.model_fields.values()
        if isinstance(info.validation_alias, AliasChoices)
        for choice in info.validation_alias.choices
    }


def _reject_unknown(environ: Mapping[str, str]) -> None:
    # A misspelt knob (say KUBERAY_SCALER_DRYRUN) would otherwise be ignored without a word.
    known = _known_names()
    unknown = sorted(k for k in environ if k.startswith(PREFIX) and k not in known)
    if not unknown:
        return
    close = difflib.get_close_matches(unknown[0], sorted(known), n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    raise ConfigError(f"invalid configuration: {unknown[0]}: unknown setting{hint}")


def _settings_from_mapping(environ: Mapping[str, str]) -> Settings:
    known = _known_names()
    values = {k: v for k, v in environ.items() if k in known}
    return Settings.model_validate(values)


def _one_line(err: ValidationError) -> str:
    first = err.errors()[0]
    problem = str(first["msg"]).removeprefix("Value error, ")
    more = len(err.errors()) - 1
    tail = f"; and {more} more problem(s)" if more else ""
    if not first["loc"]:  # a cross-field check: its message starts with the variable's name
        return f"invalid configuration: {problem}{tail}"
    env = _env_name(str(first["loc"][0]))
    raw = first.get("input")
    shown = f" (got {_clip(raw)})" if isinstance(raw, str) and not _is_secret(env, raw) else ""
    return f"invalid configuration: {env}: {problem}{shown}{tail}"


def _clip(raw: str, limit: int = 40) -> str:
    # The line stays one short line whatever was pasted into the variable.
    return repr(raw) if len(raw) <= limit else f"{raw[:limit]!r}... ({len(raw)} characters)"


def _is_secret(env: str, raw: str) -> bool:
    return "TOKEN" in env or "KEY" in env or "@" in raw  # user:password@host


def _env_name(field: str) -> str:
    if field.isupper():
        return field
    info = Settings.model_fields.get(field)
    if info is not None and isinstance(info.validation_alias, AliasChoices):
        return str(info.validation_alias.choices[0])
    return field
