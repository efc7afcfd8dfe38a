"""Under CI a skip fails unless the test is marked `ci_may_skip` (tests/ci_required.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
TESTS = """
import pytest

def test_runs():
    assert True

def test_skips_in_its_body():
    pytest.skip("no chromium")

@pytest.mark.skipif(True, reason="no openssl")
def test_skips_by_mark():
    pass

@pytest.mark.ci_may_skip("needs a GPU, CI has none")
def test_allowed_to_skip():
    pytest.skip("no GPU")

@pytest.mark.xfail(reason="known", strict=False)
def test_xfails():
    raise AssertionError
"""


def _run(tmp_path: Path, ci: str | None, body: str = TESTS) -> tuple[int, str]:
    (tmp_path / "test_sample.py").write_text(body)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rfs", "-p", "tests.ci_required",
         "-p", "no:cacheprovider", "-p", "no:randomly", "-p", "no:asyncio", "-c", os.devnull,
         "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path, check=False,
    )  # fmt: skip
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize("ci", [None, "", "0", "false"])
def test_outside_ci_a_skip_is_a_skip(tmp_path: Path, ci: str | None) -> None:
    code, out = _run(tmp_path, ci)
    assert code == 0, out
    assert "1 passed, 3 skipped, 1 xfailed" in out


@pytest.mark.parametrize("ci", ["1", "true"])
def test_under_ci_an_unmarked_skip_fails_and_says_why(tmp_path: Path, ci: str) -> None:
    code, out = _run(tmp_path, ci)
    assert code == 1, out
    # A skip in setup (a skipif mark) reports as an error, one in the body as a failure.
    assert "1 failed, 1 passed, 1 skipped, 1 xfailed, 1 error" in out
    assert "skipped under CI, where this test is required: no chromium" in out
    assert "skipped under CI, where this test is required: no openssl" in out


def test_under_ci_a_module_level_skip_fails(tmp_path: Path) -> None:
    body = 'import pytest\npytest.skip("no Go", allow_module_level=True)\n'
    code, out = _run(tmp_path, "1", body)
    assert code != 0, out
    assert "a whole module skipped under CI" in out and "no Go" in out
