"""Settings from the environment KubeRay gives its autoscaler container, plus our own knobs."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import AliasChoices

from kuberay_scaler.runtime.settings import PREFIX, ConfigError, Settings, load_settings

# What KubeRay v1.7 injects into the autoscaler container (common/pod.go), token auth and TLS on.
KUBERAY_ENV = {
    "RAY_CLUSTER_NAME": "raycluster-tpu",
    "RAY_CLUSTER_NAMESPACE": "ml",
    "RAY_HEAD_POD_NAME": "raycluster-tpu-head-x7k2p",
    "KUBERAY_CRD_VER": "v1",
    "KUBERAY_GEN_AUTOSCALER_START_CMD": "ray kuberay-autoscaler --cluster-name ...",
    "RAY_AUTH_MODE": "token",
    "RAY_AUTH_TOKEN": "s3cr3t-token-value",
}


def tls_files(tmp_path: Path) -> dict[str, str]:
    env = {"RAY_USE_TLS": "1"}
    for var, name in (
        ("RAY_TLS_SERVER_CERT", "tls.crt"),
        ("RAY_TLS_SERVER_KEY", "tls.key"),
        ("RAY_TLS_CA_CERT", "ca.crt"),
    ):
        path = tmp_path / name
        path.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
        env[var] = str(path)
    return env


def config_error(env: dict[str, str]) -> str:
    with pytest.raises(ConfigError) as caught:
        load_settings(env)
    return str(caught.value)


def test_reads_what_kuberay_injects(tmp_path: Path) -> None:
    settings = load_settings({**KUBERAY_ENV, **tls_files(tmp_path)})

    assert settings.cluster_name == "raycluster-tpu"
    assert settings.cluster_namespace == "ml"
    assert settings.head_pod_name == "raycluster-tpu-head-x7k2p"
    assert settings.crd_version == "v1"
    assert settings.ray_auth_mode == "token"
    assert settings.ray_auth_token is not None
    assert settings.ray_auth_token.get_secret_value() == "s3cr3t-token-value"
    assert settings.ray_use_tls is True
    assert settings.ray_tls_ca_cert == tmp_path / "ca.crt"
    assert settings.ray_tls_server_cert == tmp_path / "tls.crt"
    assert settings.ray_tls_server_key == tmp_path / "tls.key"


def test_defaults_without_any_variable() -> None:
    settings = load_settings({})

    assert settings.cluster_name == ""
    assert settings.cluster_namespace == "default"
    assert settings.gcs_address == "127.0.0.1:6379"
    assert settings.ray_auth_token is None
    assert settings.ray_use_tls is False
    assert settings.dry_run is False
    assert settings.log_format == "auto"


def test_reads_our_prefixed_knobs() -> None:
    settings = load_settings(
        {
            "KUBERAY_SCALER_GCS_ADDRESS": "127.0.0.10:6379",
            "KUBERAY_SCALER_DRY_RUN": "true",
            "KUBERAY_SCALER_IDLE_TIMEOUT_S": "120",
            "KUBERAY_SCALER_LOG_FORMAT": "json",
            "KUBERAY_SCALER_HTTP_ADDRESS": "",
        }
    )

    assert settings.gcs_address == "127.0.0.10:6379"
    assert settings.dry_run is True
    assert settings.idle_timeout_s == 120.0
    assert settings.log_format == "json"
    assert settings.http_address == ""  # documented: empty disables the HTTP server


@pytest.mark.parametrize(("raw", "expected"), [("1", True), ("0", False), ("true", True)])
def test_ray_use_tls_takes_rays_spelling(raw: str, expected: bool, tmp_path: Path) -> None:
    env = {**tls_files(tmp_path), "RAY_USE_TLS": raw}
    assert load_settings(env).ray_use_tls is expected


def test_an_explicit_mapping_is_the_whole_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERAY_SCALER_DEBOUNCE_S", "5")
    monkeypatch.setenv("RAY_CLUSTER_NAME", "from-process")

    settings = load_settings({})

    assert settings.debounce_s == 0.2
    assert settings.cluster_name == ""


def test_without_a_mapping_reads_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERAY_SCALER_DEBOUNCE_S", "5")
    monkeypatch.setenv("RAY_CLUSTER_NAME", "from-process")
    monkeypatch.setenv("kuberay_scaler_dry_run", "true")  # names match exactly, not in any case

    settings = load_settings()

    assert settings.debounce_s == 5.0
    assert settings.cluster_name == "from-process"
    assert settings.dry_run is False


@pytest.mark.parametrize(
    ("env", "variable", "problem"),
    [
        ({"KUBERAY_SCALER_GCS_POLL_INTERVAL_S": "abc"}, "GCS_POLL_INTERVAL_S", "valid number"),
        (
            {"KUBERAY_SCALER_GCS_POLL_INTERVAL_S": "0"},
            "GCS_POLL_INTERVAL_S",
            "greater than or equal to 0.1",
        ),
        (
            {"KUBERAY_SCALER_DRAIN_DEADLINE_S": "1e300"},
            "DRAIN_DEADLINE_S",
            "less than or equal to 31622400",
        ),
        ({"KUBERAY_SCALER_RESYNC_INTERVAL_S": "inf"}, "RESYNC_INTERVAL_S", "finite"),
        ({"KUBERAY_SCALER_DEBOUNCE_S": "99"}, "DEBOUNCE_S", "less than or equal to 10"),
        ({"KUBERAY_SCALER_GCS_ADDRESS": "nohost"}, "GCS_ADDRESS", "host:port"),
        ({"KUBERAY_SCALER_GCS_ADDRESS": "h:70000"}, "GCS_ADDRESS", "between 1 and 65535"),
        ({"KUBERAY_SCALER_HTTP_ADDRESS": ":8080"}, "HTTP_ADDRESS", "host:port"),
        ({"KUBERAY_SCALER_LOG_FORMAT": "xml"}, "LOG_FORMAT", "'auto', 'json' or 'console'"),
        ({"KUBERAY_SCALER_DRY_RUN": "perhaps"}, "DRY_RUN", "valid boolean"),
        ({"RAY_USE_TLS": "maybe"}, "RAY_USE_TLS", "valid boolean"),
        ({"RAY_CLUSTER_NAME": "Bad_Name"}, "RAY_CLUSTER_NAME", "Kubernetes object name"),
        ({"RAY_CLUSTER_NAMESPACE": "a/b"}, "RAY_CLUSTER_NAMESPACE", "namespace"),
        ({"KUBERAY_CRD_VER": "ray.io/v1"}, "KUBERAY_CRD_VER", "API version"),
        ({"KUBERAY_SCALER_DRYRUN": "true"}, "DRYRUN", "did you mean KUBERAY_SCALER_DRY_RUN"),
        ({"RAY_USE_TLS": "1"}, "RAY_TLS_CA_CERT", "must be set when RAY_USE_TLS is on"),
        ({"RAY_AUTH_MODE": "token"}, "RAY_AUTH_TOKEN", "must be set when RAY_AUTH_MODE is token"),
    ],
)
def test_bad_value_gives_one_line_naming_variable_and_problem(
    env: dict[str, str], variable: str, problem: str
) -> None:
    message = config_error(env)

    assert "\n" not in message
    assert message.startswith("invalid configuration: ")
    assert variable in message
    assert problem in message


def test_missing_tls_file_is_named(tmp_path: Path) -> None:
    env = tls_files(tmp_path)
    env["RAY_TLS_SERVER_KEY"] = str(tmp_path / "absent.key")

    message = config_error(env)

    assert message.startswith("invalid configuration: RAY_TLS_SERVER_KEY: no such file")


def test_several_problems_still_make_one_line() -> None:
    message = config_error(
        {"KUBERAY_SCALER_DEBOUNCE_S": "-1", "KUBERAY_SCALER_GCS_ADDRESS": "x", "RAY_USE_TLS": "?"}
    )

    assert "\n" not in message
    assert message.endswith("and 2 more problem(s)")


def test_the_token_is_never_part_of_an_error() -> None:
    env = {**KUBERAY_ENV, "KUBERAY_SCALER_DEBOUNCE_S": "-1"}

    message = config_error(env)

    assert "s3cr3t-token-value" not in message
    assert "KUBERAY_SCALER_DEBOUNCE_S" in message


def test_masked_shows_env_names_and_hides_the_token(tmp_path: Path) -> None:
    shown = load_settings({**KUBERAY_ENV, **tls_files(tmp_path)}).masked()

    assert shown["RAY_AUTH_TOKEN"] == "********"
    assert "s3cr3t-token-value" not in repr(shown)
    assert shown["RAY_CLUSTER_NAME"] == "raycluster-tpu"
    assert shown["RAY_TLS_CA_CERT"] == str(tmp_path / "ca.crt")
    assert shown["KUBERAY_SCALER_GCS_ADDRESS"] == "127.0.0.1:6379"
    assert set(shown) == {_env_name(name) for name in Settings.model_fields}


def test_token_loses_the_newline_a_secret_file_leaves() -> None:
    token = load_settings({"RAY_AUTH_TOKEN": "abc123\n"}).ray_auth_token

    assert token is not None and token.get_secret_value() == "abc123"


def test_masked_leaves_an_unset_token_empty() -> None:
    assert load_settings({}).masked()["RAY_AUTH_TOKEN"] is None


def _env_name(field: str) -> str:
    alias = Settings.model_fields[field].validation_alias
    assert isinstance(alias, AliasChoices)
    return str(alias.choices[0])


@pytest.mark.parametrize("field", sorted(Settings.model_fields))
def test_every_field_is_documented_and_read_from_a_known_variable(field: str) -> None:
    info = Settings.model_fields[field]
    env = _env_name(field)

    assert info.description and len(info.description) > 15
    assert env.startswith(PREFIX) or env.startswith(("RAY_", "KUBERAY_CRD_VER"))


def test_require_cluster_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="RAY_CLUSTER_NAME"):
        load_settings({}).require_cluster()
    load_settings({"RAY_CLUSTER_NAME": "rc"}).require_cluster()  # no error once set


def test_settings_are_frozen() -> None:
    settings = load_settings({})
    with pytest.raises(ValueError, match="frozen"):
        settings.dry_run = True


def test_http_default_is_ray_autoscaler_metrics_port_not_kuberay_metrics_export() -> None:
    """44217 is Ray's AUTOSCALER_METRIC_PORT; 8080 is KubeRay's metrics-export port for Ray."""
    from ray.autoscaler._private.constants import AUTOSCALER_METRIC_PORT

    settings = load_settings({"RAY_CLUSTER_NAME": "c"})
    assert settings.http_address == f"0.0.0.0:{AUTOSCALER_METRIC_PORT}" == "0.0.0.0:44217"


def _numeric_fields() -> list[str]:
    return sorted(
        name
        for name, info in Settings.model_fields.items()
        if info.annotation in (int, float, int | None, float | None)
    )


@pytest.mark.parametrize("field", _numeric_fields())
@pytest.mark.parametrize("raw", ["1e300", "9223372036854775808", "1e16"])
def test_every_number_has_an_upper_bound_far_from_overflow(field: str, raw: str) -> None:
    """1e300 s as a drain deadline overflowed int64 ms inside every reconcile."""
    env = _env_name(field)
    if Settings.model_fields[field].annotation in (int, int | None):
        raw = raw.replace("1e300", "10" * 160).replace("1e16", "10000000000000000")

    message = config_error({env: raw})

    assert "\n" not in message
    assert message.startswith(f"invalid configuration: {env}: ")


@pytest.mark.parametrize("field", _numeric_fields())
def test_the_documented_maximum_is_accepted_and_fits_int64_milliseconds(field: str) -> None:
    from kuberay_scaler.runtime.settings import upper_bound

    maximum = upper_bound(field)
    settings = load_settings({_env_name(field): str(maximum)})

    assert getattr(settings, field) == maximum
    assert (1_900_000_000 + maximum) * 1000 < 2**63  # an epoch-ms deadline built from it


@pytest.mark.parametrize("field", _numeric_fields())
def test_readme_states_each_numbers_range(field: str) -> None:
    from kuberay_scaler.runtime.settings import range_text

    readme = (Path(__file__).parents[3] / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith(f"| `{_env_name(field)}`"))

    assert f"| {range_text(field)} |" in row


@pytest.mark.parametrize(
    "raw",
    ["abc\ndef", "abc\r\ndef", "tok\u00e9n", "tok\x00en", "a\tb"],
    ids=["newline", "crlf", "non-ascii", "nul", "tab"],
)
def test_a_token_grpc_cannot_send_is_one_line_without_the_token(raw: str) -> None:
    """gRPC metadata is printable ASCII: `run` died with a grpc traceback at the first RPC."""
    message = config_error({"RAY_AUTH_TOKEN": raw})

    assert "\n" not in message
    assert message.startswith("invalid configuration: RAY_AUTH_TOKEN: ")
    assert raw.strip() not in message and "abc" not in message and "tok" not in message
