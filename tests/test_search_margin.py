"""The safety margin (``Mesh.safety_margin``) in the fits verdict and in the search: a plan inside
it is "tight", not "fits", and the search does not pick a tight plan over one keeping the margin
within 2 % of its step time (``search.rank.TIGHT_PENALTY``). The limits are the tiny Llama + LoRA's
own allocated peaks (``judge="allocated"``: a few-MiB model's reserved peak is its segments).
"""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest

import shardviz as sv
from shardviz.views import display
from shardviz import zoo
from shardviz.run.devices import GiB, SAFETY_MARGIN, memory_fit
from shardviz.search.rank import TIGHT_PENALTY

TRAINING = sv.Training(batch_size=2, seq_len=2048)  # compute-bound enough: HSDP splits within 2 %
MESH = sv.Mesh(8, device="H100", memory_reserve=0, judge="allocated", safety_margin=0.0)


@functools.lru_cache(maxsize=None)
def model():
    return zoo.tiny_llama_lora()


@functools.lru_cache(maxsize=None)
def roomy():
    plain = int(sv.analyze(model(), sv.Plan.auto(model(), lora="sharded"), MESH, TRAINING).memory.peak.max())
    return sv.search(model(), mesh=replace(MESH, device_memory=4 * plain), training=TRAINING, offload=(False,))


def pair():
    """The fastest plan, and a plan holding less that is at most 2 % slower."""
    t = roomy().table
    t = t[t.analysed & t.fits]
    best = t.iloc[0]
    close = t[(t.step_time_s <= best.step_time_s * (1 + TIGHT_PENALTY) * 0.999) & (t.peak < best.peak)]
    assert len(close), "the premise: a plan within 2 % that holds less"
    return best, close.iloc[0]


def test_the_default_margin_is_at_least_5_percent_and_settable():
    assert SAFETY_MARGIN >= 0.05
    mesh = sv.Mesh(8, device="H100")
    fit = mesh.fit(int(mesh.usable_memory * 0.9), int(mesh.usable_memory * 0.97))
    assert fit.fits and fit.verdict == "tight" and fit.safety == int(0.05 * mesh.usable_memory)
    assert "5 % safety margin" in fit.assumed and "tight" in fit.words
    assert sv.Mesh(8, device="H100", safety_margin="1GiB").fit(0, mesh.usable_memory - 2 * GiB).verdict == "fits"
    assert sv.Mesh(8, device="H100", safety_margin="10%").fit(0, int(mesh.usable_memory * 0.92)).verdict == "tight"
    assert memory_fit(80 * GiB, 80 * GiB, 80 * GiB, 0, 0).verdict == "fits"


@pytest.mark.parametrize("bad", [1.5, -0.1, "lots", True, "150%"])
def test_a_bad_margin_is_refused_naming_the_field(bad):
    with pytest.raises(ValueError, match="Mesh.safety_margin"):
        sv.Mesh(8, device="H100", safety_margin=bad)


def test_the_verdict_says_what_it_assumes():
    """The reserved peak is judged, under the allocator setting named, with the margin named."""
    a = sv.analyze(model(), sv.Plan.auto(model()), sv.Mesh(8, device="H100"), TRAINING)
    assert "reserved peak judged" in a.fit.assumed and "no expandable segments" in a.fit.assumed
    b = sv.analyze(model(), sv.Plan.auto(model()), sv.Mesh(8, device="H100", expandable_segments=True), TRAINING)
    assert "expandable_segments:True" in b.fit.assumed and "5 % safety margin" in b.fit.assumed
    assert a.fit.margin == a.mesh.usable_memory - int(a.memory.reserved_peak.max())


def test_a_row_inside_the_margin_says_tight_not_yes():
    """A plan with a few bytes to spare is "tight" in the search's table and in the chart's words."""
    best, _ = pair()
    mesh = replace(MESH, device_memory=int(best.peak) + 1024, safety_margin=0.05)
    s = sv.search(model(), mesh=mesh, training=TRAINING, offload=(False,))
    row = s.table[s.table.name == best["name"]].iloc[0]
    assert row.fits and row.verdict == "tight" and row.margin == 1024
    assert s.formatted().loc[row.name, "fits"] == "tight" and "tight" in row.why
    a = sv.analyze(model(), s.candidate(int(row.name))[0], s.candidate(int(row.name))[1], TRAINING)
    use = display.limit_use(a.fit)
    assert use["verdict"] == "tight" and "inside the" in use["text"] and use["text"].startswith("tight: allocated peak")


def test_the_search_does_not_pick_a_tight_plan_over_one_keeping_the_margin_within_2_percent():
    best, close = pair()
    limit = 4 * int(best.peak)
    margin = limit - (int(best.peak) + int(close.peak)) // 2  # the fastest inside it, the other outside
    s = sv.search(model(), mesh=replace(MESH, device_memory=limit, safety_margin=margin), training=TRAINING,
                  offload=(False,))
    top = s.table.iloc[0]
    assert top.verdict == "fits" and top.step_time_s <= best.step_time_s * (1 + TIGHT_PENALTY)
    assert top["name"] != best["name"]
    tight = s.table[s.table.name == best["name"]].iloc[0]
    assert tight.verdict == "tight" and "faster than the row above, which keeps the margin" in tight.why
    assert "keeps the" in top.why and "faster but tight" in top.why  # names the fastest tight plan


def test_a_tight_plan_is_picked_when_nothing_keeping_the_margin_is_close():
    """With a margin no plan keeps, the fastest plan is still the pick, and its why says tight."""
    best, _ = pair()
    limit = 4 * int(best.peak)
    s = sv.search(model(), mesh=replace(MESH, device_memory=limit, safety_margin=limit - 1), training=TRAINING,
                  offload=(False,))
    top = s.table.iloc[0]
    assert s.fits and top.verdict == "tight" and top["name"] == best["name"]
    assert top.why.startswith("fastest that fits, but tight") and "(tight: inside the safety margin)" in s.explain()


def test_cli_takes_the_margin_and_the_allocator_setting():
    from shardviz.cli import build_parser
    from shardviz.cli.cli_args import allocator_changes as _allocator_changes, resolve_setup

    args = build_parser().parse_args(["plan", "search", "zoo:tiny_llama_lora", "--world-size", "8", "--device", "H100",
                                      "--safety-margin", "10%", "--expandable-segments", "--judge", "allocated"])
    assert _allocator_changes(args) == {"safety_margin": "10%", "judge": "allocated", "expandable_segments": True}
    mesh = resolve_setup(args)[0]
    assert (mesh.judge, mesh.expandable_segments) == ("allocated", True)
    args = build_parser().parse_args(["plan", "search", "zoo:tiny_llama_lora", "--world-size", "8", "--device", "H100",
                                      "--safety-margin", "0.08"])
    assert _allocator_changes(args) == {"safety_margin": 0.08}


def test_compare_and_the_chart_say_tight():
    """compare's row: fits (torch may run it) with verdict tight; the chart's words say the margin."""
    plan = sv.Plan.auto(model(), lora="sharded")
    peak = int(sv.analyze(model(), plan, MESH, TRAINING).memory.peak.max())
    mesh = replace(MESH, device_memory=peak + 4096, safety_margin="1MiB")
    row = sv.compare(model(), {"p": plan}, mesh=mesh, training=TRAINING).table.loc["p"]
    assert row.fits and row.verdict == "tight" and row.margin == 4096
    use = display.memory_payload(sv.analyze(model(), plan, mesh, TRAINING))["use"]
    assert not use["over"] and use["tight"] and use["text"].startswith("tight: ") and "inside the 1.00 MiB safety margin" in use["text"]
