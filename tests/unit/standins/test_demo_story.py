"""The demo prints what happened in the order it happened, in words: pure parts."""

from __future__ import annotations

import io

from kuberay_standins.demo import Printer, daemon_moment, group_change_words
from kuberay_standins.harness import Moment


def test_moments_learnt_late_are_printed_where_they_happened() -> None:
    out = io.StringIO()
    printer = Printer(out, hold_s=1.0)
    printer.moment(Moment(10.0, "patch", "PATCH delete"))  # seen at once (the API server)
    printer.moment(Moment(9.8, "drain", "slice_drained"))  # the daemon's log, a poll later
    printer.moment(Moment(9.7, "plan", "decided"))
    printer.flush(now=10.5)  # nothing is old enough yet
    assert out.getvalue() == ""
    printer.flush(now=11.2)
    kinds = [line.split("]", 1)[1].split()[0] for line in out.getvalue().splitlines()]
    assert kinds == ["plan", "drain", "patch"]


def test_the_daemons_decided_line_is_the_plan_with_its_writes() -> None:
    line = {
        "event": "decided",
        "groups": ["tpu: scale_down 1->0 (remove slice s1)"],
        "writes": [
            "record draining {'tpu': ('s1',)}",
            "drain tpu/s1 (4 hosts, idle termination)",
            "patch (7 ops)",
        ],
    }
    kind, text = daemon_moment(line) or ("", "")
    assert kind == "plan"
    assert text.index("record which") < text.index("drain tpu/s1") < text.index("patch the")
    assert daemon_moment({"event": "decision"}) is None  # said after the patch: not the story


def test_a_drain_line_names_its_group_and_slice() -> None:
    line = {"event": "slice_drained", "group": "tpu", "slice": "s1", "hosts": 4, "reason": "ok"}
    assert daemon_moment(line) == ("drain", "slice_drained: tpu/s1: 4 hosts, ok")


def test_the_decided_line_says_each_change_in_words() -> None:
    line = {
        "event": "decided",
        "groups": [
            "tpu: scale_up 0->1 (add slice(s) for 1× slice reservation)",
            "cpu: clear_workers_to_delete 1->1 (empty workersToDelete (...): all 1 are gone)",
        ],
        "writes": ["record draining {'tpu': ('s1',)}", "patch (5 ops)"],
    }
    _, text = daemon_moment(line) or ("", "")
    assert "tpu: add slice(s), replicas 0 → 1 (add slice(s)" in text
    assert "cpu: replicas stay 1 (empty workersToDelete" in text
    assert "scale_up" not in text and "clear_workers_to_delete" not in text and "->" not in text
    assert text.endswith(
        "writes: record which slices it drains ({'tpu': ('s1',)}) → patch the RayCluster"
    )


def test_an_unknown_change_is_printed_as_the_daemon_wrote_it() -> None:
    assert group_change_words("tpu: something_new 1->2") == "tpu: something_new 1->2"
