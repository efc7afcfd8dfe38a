"""`plan` on any file: one line naming the file, exit 2, memory bounded by the read cap.

Each file here crashed `plan` with a traceback, read without end, or printed nothing useful
("bad input"). The daemon never reads files; these are the offline command's inputs.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from kuberay_scaler.cli import offline
from kuberay_scaler.cli.capture import PODS_FILE, RAY_STATE_FILE, RAYCLUSTER_FILE
from kuberay_scaler.cli.main import main
from tests.factories import SAMPLES

ROOT = Path(__file__).resolve().parents[3]
GOOD_RC = SAMPLES / "ray-cluster.tpu-v4-multihost.yaml"
RC_HEAD = '{"kind":"RayCluster","metadata":{"name":"rc"},"spec":{"workerGroupSpecs":'


def _big_int() -> str:
    return RC_HEAD + '[{"groupName":"g","replicas":' + "1" * 4301 + "}]}}"


def _surrogate() -> str:
    return '{"kind":"RayCluster","metadata":{"name":"\\ud800"},"spec":{"workerGroupSpecs":[]}}'


def _deep(depth: int) -> str:
    return RC_HEAD + "[" + '{"a":' * depth + "1" + "}" * depth + "]}}"


def _aliases() -> str:
    # "Billion laughs": a few hundred bytes that expand to 10^9 values.
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join(['*a' + str(i - 1)] * 10)}]" for i in range(1, 9)]
    return "\n".join([*lines, "kind: RayCluster", "spec: {workerGroupSpecs: *a8}", ""])


# name -> (which input, file text)
HOSTILE: dict[str, tuple[str, str]] = {
    "4301-digit int": ("raycluster", _big_int()),
    "4301-digit int in YAML": ("raycluster", "kind: RayCluster\nspec: {x: " + "1" * 4301 + "}\n"),
    "lone surrogate": ("raycluster", _surrogate()),
    "lone surrogate in YAML": ("raycluster", 'kind: RayCluster\nmetadata: {name: "\\ud800"}\n'),
    "metadata null": ("raycluster", "kind: RayCluster\nmetadata: null\nspec: {}\n"),
    "annotations not a map": (
        "raycluster",
        "kind: RayCluster\nmetadata: {name: x, annotations: 3}\nspec: {}\n",
    ),
    "labels not strings": (
        "raycluster",
        "kind: RayCluster\nmetadata: {name: x, labels: {a: [1]}}\nspec: {}\n",
    ),
    "JSON depth 1000": ("raycluster", "[" * 1000 + "]" * 1000),
    "JSON depth 900 inside the spec": ("raycluster", _deep(900)),
    "YAML depth 1000": ("raycluster", "[" * 1000 + "]" * 1000 + "\n# yaml"),
    "YAML aliases": ("raycluster", _aliases()),
    "binary": ("raycluster", "\x00\x01\x02"),
    "empty pods file": ("pods", ""),
    "null pods file": ("pods", "null\n"),
    "pods JSON null": ("pods", "null"),
    "pods depth 1000": ("pods", "[" * 1000 + "]" * 1000),
    "pod metadata null": ("pods", '{"kind":"PodList","items":[{"kind":"Pod","metadata":null}]}'),
    "ray state depth 1000": ("ray-state", "[" * 1000 + "]" * 1000),
    "ray state surrogate": ("ray-state", '{"clusterResourceState":{"clusterId":"\\ud800"}}'),
}


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "input.txt"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    return path


def _plan_args(which: str, path: Path) -> list[str]:
    if which == "raycluster":
        return ["--raycluster", str(path)]
    return ["--raycluster", str(GOOD_RC), f"--{which}", str(path)]


def _assert_one_line_naming(err: str, path: Path | str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err[-2000:]
    assert lines[0].startswith("kuberay-scaler plan: ")
    assert str(path) in lines[0]
    assert len(lines[0]) < 400


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_file_is_one_line_naming_it_and_exit_2(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    which, text = HOSTILE[name]
    path = _write(tmp_path, text)

    code = main(["plan", *_plan_args(which, path)])

    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    _assert_one_line_naming(err, path)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_file_in_a_capture_directory_is_one_line_naming_it(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    which, text = HOSTILE[name]
    files = {"raycluster": RAYCLUSTER_FILE, "pods": PODS_FILE, "ray-state": RAY_STATE_FILE}
    (tmp_path / RAYCLUSTER_FILE).write_bytes(GOOD_RC.read_bytes())
    (tmp_path / PODS_FILE).write_text('{"kind":"PodList","items":[]}')
    (tmp_path / RAY_STATE_FILE).write_text('{"clusterResourceState":{}}')
    bad = tmp_path / files[which]
    bad.write_bytes(text.encode("utf-8", "surrogatepass"))

    code = main(["plan", "--capture", str(tmp_path)])

    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    _assert_one_line_naming(err, bad)


def test_a_file_above_the_read_cap_is_refused_without_reading_it_all(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(offline, "MAX_INPUT_BYTES", 1000)
    path = _write(tmp_path, "kind: RayCluster\nspec: {}\n" + "#" * 2000 + "\n")
    reads: list[int] = []
    real_open: Callable[..., object] = open

    class Counting:
        def __init__(self, inner: object) -> None:
            self.inner = inner

        def read(self, size: int = -1) -> bytes:
            reads.append(size)
            return self.inner.read(size)  # type: ignore[attr-defined, no-any-return]

        def __enter__(self) -> Counting:
            return self

        def __exit__(self, *_: object) -> None:
            self.inner.__exit__(*_)  # type: ignore[attr-defined]

    monkeypatch.setattr("builtins.open", lambda *a, **k: Counting(real_open(*a, **k)))

    code = main(["plan", "--raycluster", str(path)])

    _, err = capsys.readouterr()
    assert code == 2
    _assert_one_line_naming(err, path)
    assert "1000 bytes" in err
    assert reads and all(0 < size <= 1001 for size in reads)


def _limited_memory() -> None:
    # 4 GiB of address space: /dev/zero read to the end dies in MemoryError well before that.
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def _run(args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT)}
    return subprocess.run(  # type: ignore[call-overload, no-any-return]
        [sys.executable, "-m", "kuberay_scaler", "plan", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_limited_memory,
        **kwargs,
    )


def test_dev_zero_is_refused_at_the_read_cap_in_bounded_memory() -> None:
    done = _run(["--raycluster", "/dev/zero"])

    assert done.returncode == 2, done.stderr[-2000:]
    _assert_one_line_naming(done.stderr, "/dev/zero")
    assert done.stdout == ""


def test_an_empty_standard_input_is_one_line() -> None:
    done = _run(["--raycluster", "-"], stdin=subprocess.DEVNULL)

    assert done.returncode == 2, done.stderr[-2000:]
    _assert_one_line_naming(done.stderr, "standard input")


def test_standard_input_closed_at_the_descriptor_is_one_line() -> None:
    script = (
        "import os, sys; os.close(0); sys.stdin = None;"
        "from kuberay_scaler.cli.main import main; sys.exit(main(['plan', '--raycluster', '-']))"
    )
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode == 2, done.stderr[-2000:]
    _assert_one_line_naming(done.stderr, "standard input")


def test_a_directory_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "--raycluster", str(GOOD_RC), "--pods", str(tmp_path)])

    _, err = capsys.readouterr()
    assert code == 2
    _assert_one_line_naming(err, tmp_path)


def test_a_closed_standard_output_is_one_line_and_not_success() -> None:
    """With `>&-` Python sets sys.stdout to None and print() drops the plan: exit 0, nothing."""
    script = (
        "import os, sys; os.close(1); sys.stdout = None;"
        "from kuberay_scaler.cli.main import main;"
        f"sys.exit(main(['plan', '--raycluster', {str(GOOD_RC)!r}]))"
    )
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
    )

    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "kuberay-scaler plan: cannot write the result: standard output is closed"
    ]
