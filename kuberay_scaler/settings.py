"""Configuration from environment variables, validated once at start.

KubeRay injects the `RAY_*` and `KUBERAY_CRD_VER` variables into its autoscaler container; our own
knobs use the `KUBERAY_SCALER_` prefix. Bad values raise `ConfigError` with one line naming the
variable, and the CLI turns that into exit code 2.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

PREFIX = "KUBERAY_SCALER_"


class ConfigError(Exception):
    """Invalid configuration; the message is one line meant for the user."""


def _ours(name: str) -> AliasChoices:
    return AliasChoices(PREFIX + name.upper())


class Settings(BaseSettings):
    """Effective configuration of one kuberay-scaler process."""

    model_config = SettingsConfigDict(frozen=True, extra="ignore", populate_by_name=False)

    # --- Injected by KubeRay into its autoscaler container -------------------------------------
    cluster_name: str = Field(
        default="",
        validation_alias=AliasChoices("RAY_CLUSTER_NAME"),
        description="Name of the RayCluster to scale (RAY_CLUSTER_NAME).",
    )
    cluster_namespace: str = Field(
        default="default",
        validation_alias=AliasChoices("RAY_CLUSTER_NAMESPACE"),
        description="Namespace of the RayCluster (RAY_CLUSTER_NAMESPACE).",
    )
    head_pod_name: str | None = Field(
        default=None,
        validation_alias=AliasChoices("RAY_HEAD_POD_NAME"),
        description="Name of the head pod, for logs and Events (RAY_HEAD_POD_NAME).",
    )
    crd_version: str = Field(
        default="v1",
        validation_alias=AliasChoices("KUBERAY_CRD_VER"),
        description="API version of the ray.io CRDs (KUBERAY_CRD_VER).",
    )
    ray_auth_token: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("RAY_AUTH_TOKEN"),
        description="Token sent as 'authorization: Bearer' to the GCS (RAY_AUTH_TOKEN).",
    )
    ray_use_tls: bool = Field(
        default=False,
        validation_alias=AliasChoices("RAY_USE_TLS"),
        description="Talk TLS to the GCS (RAY_USE_TLS).",
    )
    ray_tls_server_cert: Path | None = Field(
        default=None,
        validation_alias=AliasChoices("RAY_TLS_SERVER_CERT"),
        description="Client certificate for GCS TLS (RAY_TLS_SERVER_CERT).",
    )
    ray_tls_server_key: Path | None = Field(
        default=None,
        validation_alias=AliasChoices("RAY_TLS_SERVER_KEY"),
        description="Client key for GCS TLS (RAY_TLS_SERVER_KEY).",
    )
    ray_tls_ca_cert: Path | None = Field(
        default=None,
        validation_alias=AliasChoices("RAY_TLS_CA_CERT"),
        description="CA bundle that signed the GCS certificate (RAY_TLS_CA_CERT).",
    )

    # --- Our own knobs ---------------------------------------------------------------------------
    gcs_address: str = Field(
        default="127.0.0.1:6379",
        validation_alias=_ours("gcs_address"),
        description="host:port of the Ray GCS; from the head pod this is 127.0.0.1:6379.",
    )
    gcs_poll_interval_s: float = Field(
        default=1.0,
        gt=0,
        le=60,
        validation_alias=_ours("gcs_poll_interval_s"),
        description="Seconds between GetClusterResourceState polls.",
    )
    gcs_rpc_timeout_s: float = Field(
        default=5.0,
        gt=0,
        le=120,
        validation_alias=_ours("gcs_rpc_timeout_s"),
        description="Deadline of one GCS RPC.",
    )
    gcs_stale_after_s: float = Field(
        default=15.0,
        gt=0,
        validation_alias=_ours("gcs_stale_after_s"),
        description="Demand older than this is unknown: the planner holds and /readyz goes false.",
    )
    kubeconfig: Path | None = Field(
        default=None,
        validation_alias=AliasChoices(PREFIX + "KUBECONFIG", "KUBECONFIG"),
        description="Kubeconfig file; unset means in-cluster service-account credentials.",
    )
    k8s_request_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=300,
        validation_alias=_ours("k8s_request_timeout_s"),
        description="Timeout of one Kubernetes API request (watches use their own timeout).",
    )
    watch_silence_timeout_s: float = Field(
        default=120.0,
        gt=0,
        validation_alias=_ours("watch_silence_timeout_s"),
        description="A watch with no event or bookmark for this long is treated as dead.",
    )
    resync_interval_s: float = Field(
        default=30.0,
        gt=0,
        validation_alias=_ours("resync_interval_s"),
        description="Periodic reconcile (and RayCluster GET in poll mode) when nothing changed.",
    )
    debounce_s: float = Field(
        default=0.2,
        ge=0,
        le=10,
        validation_alias=_ours("debounce_s"),
        description="Changes arriving within this window are folded into one reconcile.",
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
    http_address: str = Field(
        default="0.0.0.0:8080",
        validation_alias=_ours("http_address"),
        description="host:port for /healthz, /readyz, /metrics and /debug/plan; empty disables.",
    )
    idle_timeout_s: float | None = Field(
        default=None,
        gt=0,
        validation_alias=_ours("idle_timeout_s"),
        description="Overrides every idle timeout from the RayCluster when set.",
    )
    max_provision_time_s: float = Field(
        default=900.0,
        gt=0,
        validation_alias=_ours("max_provision_time_s"),
        description="A slice not fully up (pods Running, Ray nodes joined) after this is broken.",
    )
    missing_node_grace_s: float = Field(
        default=180.0,
        gt=0,
        validation_alias=_ours("missing_node_grace_s"),
        description="A Running pod whose Ray node is missing this long makes its slice broken.",
    )
    replace_backoff_s: float = Field(
        default=300.0,
        gt=0,
        validation_alias=_ours("replace_backoff_s"),
        description="First per-group backoff after replacing a broken slice; doubles up to 30 min.",
    )
    write_expectation_timeout_s: float = Field(
        default=60.0,
        gt=0,
        validation_alias=_ours("write_expectation_timeout_s"),
        description="After a patch, plan nothing for that group until it is seen, or this passes.",
    )
    drain_deadline_s: float = Field(
        default=30.0,
        gt=0,
        validation_alias=_ours("drain_deadline_s"),
        description="Deadline handed to DrainNode for each host of a slice.",
    )
    shutdown_grace_s: float = Field(
        default=10.0,
        gt=0,
        le=25,
        validation_alias=_ours("shutdown_grace_s"),
        description="On SIGTERM, how long an in-flight patch may take before we abandon it.",
    )

    @field_validator("gcs_address")
    @classmethod
    def _host_port(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("expected host:port")
        return value

    @field_validator("http_address")
    @classmethod
    def _optional_host_port(cls, value: str) -> str:
        return value if value == "" else cls._host_port(value)

    @field_validator("ray_use_tls", mode="before")
    @classmethod
    def _ray_bool(cls, value: Any) -> Any:
        # Ray writes RAY_USE_TLS=1/0; pydantic's bool parser already accepts those and true/false.
        return value.strip() if isinstance(value, str) else value

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


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Read settings from `environ` (default: the process environment)."""
    try:
        if environ is None:
            return Settings()
        return _settings_from_mapping(environ)
    except ValidationError as err:
        raise ConfigError(_one_line(err)) from None


def _settings_from_mapping(environ: Mapping[str, str]) -> Settings:
    known = {
        str(choice)
        for info in Settings.model_fields.values()
        if isinstance(info.validation_alias, AliasChoices)
        for choice in info.validation_alias.choices
    }
    values = {k: v for k, v in environ.items() if k in known}
    # An explicit mapping is the whole environment: the process's own is not consulted.
    return Settings.model_validate(values)


def _one_line(err: ValidationError) -> str:
    first = err.errors()[0]
    field = str(first["loc"][0]) if first["loc"] else "?"
    env = _env_name(field)
    problem = str(first["msg"]).removeprefix("Value error, ")
    raw = first.get("input")
    shown = "" if "TOKEN" in env or isinstance(raw, dict) else f" (got {raw!r})"
    more = len(err.errors()) - 1
    tail = f"; and {more} more problem(s)" if more else ""
    return f"invalid configuration: {env}: {problem}{shown}{tail}"


def _env_name(field: str) -> str:
    if field.isupper():
        return field
    info = Settings.model_fields.get(field)
    if info is not None and isinstance(info.validation_alias, AliasChoices):
        return str(info.validation_alias.choices[0])
    return field
