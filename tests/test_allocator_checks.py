"""SV202 (``allocator_checks``): the reserved peak far above the allocated one, priced with
``expandable_segments:True``. Every figure is read from the analysis (``a.memory``, ``a.fit``) of
the same plan, never typed: the finding must say what the analysis of the other setting says."""

from __future__ import annotations

import functools

import pytest

import shardviz as sv
from shardviz import zoo
from shardviz.checks.allocator_checks import RESERVED_GAP
from shardviz.format import format_bytes


@functools.lru_cache(maxsize=None)
def _model():
    return zoo.tiny_llama_lora()


def _analysis(usable: int | None, expandable: bool = False):
    m = _model()
    mesh = sv.Mesh(8, device_memory=usable, memory_reserve=0, expandable_segments=expandable)
    return sv.analyze(m, sv.Plan.auto(m, checkpoint="blocks"), mesh, sv.Training(batch_size=8, seq_len=2048))


@functools.lru_cache(maxsize=None)
def _peaks():
    mem = _analysis(None).memory
    grown = _analysis(None, True).memory
    return int(mem.peak.max()), int(mem.reserved_peak.max()), int(grown.reserved_peak.max())


def _sv202(a):
    return [f for f in a.findings if f.code == "SV202"]


def test_a_large_gap_is_said_with_the_expandable_price():
    peak, reserved, grown = _peaks()
    usable = int((reserved - peak) / RESERVED_GAP) // 2  # the gap is twice the threshold; the plan fits
    assert reserved + 0.05 * usable < usable
    a = _analysis(usable)
    assert a.fit.verdict == "fits"
    (f,) = _sv202(a)
    assert f.severity == "info"
    assert format_bytes(reserved) in f.message and format_bytes(peak) in f.message
    assert format_bytes(grown) in f.message and format_bytes(reserved - grown) in f.message
    assert "Mesh(expandable_segments=True)" in f.fix and f.fix_for("cli") == "--expandable-segments"


def test_a_gap_that_decides_the_verdict_is_sv201s_to_say():
    """Over or tight only for the cache: SV201 says it and prices --expandable-segments; no second finding."""
    peak, reserved, grown = _peaks()
    usable = (int(peak / 0.9) + reserved) // 2  # the allocated peak keeps the 5 % margin, the reserved does not
    a = _analysis(usable)
    assert a.fit.verdict != "fits"
    assert not _sv202(a)
    (sv201,) = [f for f in a.findings if f.code == "SV201"]
    assert "--expandable-segments" in sv201.flags and f"reserved {format_bytes(grown)}" in sv201.flags


@pytest.mark.parametrize("case", ["small gap", "already expandable", "no device"])
def test_no_finding_when_the_gap_is_small_assumed_away_or_unjudged(case):
    peak, reserved, _ = _peaks()
    usable = {"small gap": int((reserved - peak) / RESERVED_GAP) * 2, "already expandable": reserved * 4,
              "no device": None}[case]
    assert not _sv202(_analysis(usable, expandable=case == "already expandable"))
