"""The configuration a newcomer reads is the one the code has: `run --help` and the README's
table are both made from the settings model."""

from __future__ import annotations

from pathlib import Path

import pytest

from kuberay_scaler.cli.main import config_rows, config_table, main
from kuberay_scaler.runtime.settings import _known_names

README = Path(__file__).resolve().parents[3] / "README.md"


def test_every_setting_is_documented_once() -> None:
    names = [row[0] for row in config_rows()]
    assert len(names) == len(set(names))
    aliases = {"KUBECONFIG"}  # read as a fallback of KUBERAY_SCALER_KUBECONFIG, named there
    assert set(names) == _known_names() - aliases
    assert {row[0]: row[1] for row in config_rows()}["RAY_CLUSTER_NAME"] == "required"
    for name, _, _, meaning in config_rows():
        assert meaning and name not in meaning, f"{name}: a meaning that repeats the name"


def test_the_readme_table_is_the_generated_one() -> None:
    table = config_table()
    assert table in README.read_text(), (
        "README.md's configuration table is out of date; replace it with the output of\n"
        "  .venv/bin/python -c 'from kuberay_scaler.cli.main import config_table; "
        "print(config_table())'\n\n" + table
    )


def test_run_help_lists_the_environment(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["run", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "check-config" in out
    for name, *_ in config_rows():
        assert name in out
