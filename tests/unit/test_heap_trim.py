"""``runtime/heap_trim.py``: trims only past its bound, never when off, refuses a negative bound."""

from __future__ import annotations

import pytest

from videokv_node.runtime.heap_trim import HeapTrim, rss_bytes


def test_a_negative_bound_is_refused():
    with pytest.raises(ValueError, match="max_growth_bytes must be >= 0"):
        HeapTrim(-1)


def test_off_never_trims():
    heap = HeapTrim(0)
    grown = bytearray(64 << 20)  # touched: resident
    assert not heap.active and not heap.maybe_trim() and heap.trims == 0
    del grown


def test_trims_once_rss_grew_past_the_bound_and_not_before():
    heap = HeapTrim(128 << 20)  # far above what the test process drifts by between two calls
    if not heap.active:
        pytest.skip("no glibc malloc_trim or no /proc here")
    heap.maybe_trim()  # whatever earlier tests left: the bound is measured from here on
    assert not heap.maybe_trim()  # nothing grew
    before = rss_bytes()
    grown = bytearray(256 << 20)  # touched: resident
    assert rss_bytes() - before > 128 << 20
    trims = heap.trims
    assert heap.maybe_trim() and heap.trims == trims + 1
    assert not heap.maybe_trim()  # the bound is measured from the last trim
    del grown
