"""GPU health decisions from Xid events."""

from __future__ import annotations

from memslice.plugin.gpu.health import DEFAULT_IGNORED_XIDS, HealthBook


def test_critical_xid_marks_unhealthy_and_ignored_ones_do_not():
    book = HealthBook(["a", "b"], DEFAULT_IGNORED_XIDS, 0)
    assert not book.on_xid("a", 13, 1.0)  # application error
    assert book.on_xid("a", 79, 1.0)       # fallen off the bus
    assert not book.on_xid("a", 48, 2.0)   # already unhealthy: no change
    assert book.snapshot() == {"a": False, "b": True}
    assert not book.on_xid("unknown", 79, 1.0)


def test_recovery_after_quiet_period_only_if_nvml_answers():
    book = HealthBook(["a", "b"], frozenset(), 10)
    book.on_xid("a", 79, 0.0)
    book.on_xid("b", 79, 5.0)
    assert book.recover(9.0, lambda u: True) == []
    assert book.recover(12.0, lambda u: u != "a") == []   # a still silent in NVML, b not due yet
    assert book.recover(15.0, lambda u: True) == ["a", "b"]
    assert book.snapshot() == {"a": True, "b": True}


def test_no_recovery_when_disabled():
    book = HealthBook(["a"], frozenset(), 0)
    book.on_xid("a", 79, 0.0)
    assert book.recover(1e9, lambda u: True) == [] and not book.healthy("a")
