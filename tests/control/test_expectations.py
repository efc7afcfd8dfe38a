"""Expectations (loop/expectations.py): pending reads only; settle drops what is done."""

from __future__ import annotations

from dataclasses import dataclass

from kuberay_scaler.loop.expectations import Expectations


@dataclass(frozen=True)
class Group:
    replicas: int
    workers_to_delete: tuple[str, ...] = ()


def test_expectation_pending_until_observed_and_asking_changes_nothing() -> None:
    expectations = Expectations(timeout=30)
    expectations.expect("tpu", replicas=2, now=100)
    assert expectations.pending("tpu", Group(1), now=101)
    assert not expectations.pending("tpu", Group(2), now=102)
    assert expectations.groups() == frozenset({"tpu"})  # asking is side-effect free
    assert expectations.pending("tpu", Group(1), now=103)
    expectations.settle({"tpu": Group(2)}, now=104)
    assert expectations.groups() == frozenset()


def test_expectation_checks_workers_to_delete_regardless_of_order() -> None:
    expectations = Expectations(timeout=30)
    expectations.expect("tpu", replicas=1, workers_to_delete=["b", "a"], now=0)
    assert expectations.pending("tpu", Group(1), now=1)
    assert expectations.pending("tpu", Group(1, ("a",)), now=1)
    assert not expectations.pending("tpu", Group(1, ("a", "b")), now=1)


def test_expectation_cleared_list_is_met_by_missing_scale_strategy() -> None:
    expectations = Expectations(timeout=30)
    expectations.expect("tpu", workers_to_delete=[], now=0)
    assert expectations.pending("tpu", Group(3, ("x",)), now=1)
    assert not expectations.pending("tpu", Group(3), now=1)


def test_expectation_times_out_and_is_settled_away() -> None:
    expectations = Expectations(timeout=30)
    expectations.expect("tpu", replicas=5, now=0)
    assert expectations.pending("tpu", Group(1), now=29.9)
    assert not expectations.pending("tpu", Group(1), now=30)
    expectations.settle({"tpu": Group(1)}, now=30)
    assert not expectations.pending("tpu", Group(1), now=1)  # dropped, not re-armed


def test_expectation_for_vanished_group_is_not_pending_and_settled_away() -> None:
    expectations = Expectations(timeout=30)
    expectations.expect("tpu", replicas=5, now=0)
    assert not expectations.pending("tpu", None, now=1)
    expectations.settle({}, now=1)
    assert "tpu" not in expectations.groups()


def test_unknown_group_is_not_pending_and_forget_clears() -> None:
    expectations = Expectations(timeout=30)
    assert not expectations.pending("cpu", Group(1), now=0)
    expectations.expect("a", replicas=1, now=0)
    expectations.expect("b", replicas=1, now=0)
    expectations.forget("a")
    assert expectations.groups() == frozenset({"b"})
    expectations.forget()
    assert expectations.groups() == frozenset()
