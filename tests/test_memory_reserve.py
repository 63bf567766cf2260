"""The fits verdict keeps the memory reserve (CUDA context + NCCL buffers, docs/step-time.md):
one function (``devices.memory_fit``, through ``Mesh.fit``) decides, and every view says so.

The peaks are the tiny Llama + LoRA's own, measured by torch (a few MiB, so its reserve is a
quarter of its peak rather than 1 GiB); the device memory is set between the usable memory and
the total, where only the reserve makes the difference.
"""

from __future__ import annotations

import functools

import pytest

import shardviz as sv
from shardviz.views import display
from shardviz import zoo
from shardviz.run.devices import MEMORY_RESERVE_BYTES, GiB, memory_fit

TRAINING = sv.Training(batch_size=2, seq_len=64)


@functools.lru_cache(maxsize=None)
def setting():
    """(model, plan, its judged peak on 8 ranks, a mesh whose memory is that peak + half its reserve).
    The verdict judges the caching allocator's reserved peak (``a.memory.reserved_peak``); the
    safety margin is 0 here, so only the reserve makes the difference."""
    m = zoo.tiny_llama_lora()
    plan = sv.Plan.auto(m, lora="sharded")
    peak = int(sv.analyze(m, plan, sv.Mesh(8, device="H100"), TRAINING).memory.reserved_peak.max())
    reserve = peak // 4
    mesh = sv.Mesh(8, device="H100", device_memory=peak + reserve // 2, memory_reserve=reserve, safety_margin=0)
    assert mesh.usable_memory < peak <= mesh.device_memory  # the premise
    return m, plan, peak, mesh


def test_the_reserve_comes_from_one_place_and_a_user_may_set_it():
    assert sv.Mesh(8, device="H100").memory_reserve == MEMORY_RESERVE_BYTES == GiB
    assert sv.Mesh(8, device="H100").usable_memory == 79 * GiB
    assert sv.Mesh(8, device="H100", memory_reserve="2GiB").usable_memory == 78 * GiB
    assert sv.Mesh(8, device="H100", memory_reserve=0).usable_memory == 80 * GiB
    assert sv.Mesh(8).usable_memory is None and sv.Mesh(8).fit(1, 1) is None
    fit = sv.Mesh(8, device="H100").fit(79 * GiB - 5, 79 * GiB + 1)
    assert fit == memory_fit(79 * GiB - 5, 79 * GiB + 1, 80 * GiB, allocator=fit.assumed.split(", ")[1])
    assert not fit.fits and fit.margin == -1 and fit.judged == 79 * GiB + 1 and fit.judged_name == "reserved peak"
    assert fit.text == "79.00 GiB usable (80.00 GiB − 1.00 GiB reserve)"
    assert sv.Mesh(8, device="H100").fit(78 * GiB, 79 * GiB).fits


@pytest.mark.parametrize("bad", [-1, "-1GiB", "lots", True])
def test_a_bad_reserve_is_refused_naming_the_field(bad):
    with pytest.raises(ValueError, match="Mesh.memory_reserve"):
        sv.Mesh(8, device="H100", memory_reserve=bad)


def test_compare_table_says_it_does_not_fit():
    m, plan, peak, mesh = setting()
    row = sv.compare(m, {"p": plan}, mesh=mesh, training=TRAINING).table.loc["p"]
    assert row.reserved_peak == peak and not row.fits and row.margin == mesh.usable_memory - peak < 0
    assert sv.compare(m, {"p": plan}, mesh=sv.Mesh(8, device_memory=mesh.device_memory, memory_reserve=0, safety_margin=0),
                      training=TRAINING).table.loc["p"].fits


def test_views_payload_draws_the_usable_memory_and_says_the_reserve():
    m, plan, peak, mesh = setting()
    payload = display.memory_payload(sv.analyze(m, plan, mesh, TRAINING))
    assert payload["limit"] == mesh.usable_memory and payload["limit_text"] == mesh.limit_text
    use = payload["use"]
    reserve = sv.format.format_bytes(mesh.memory_reserve)
    assert use["over"] and use["margin"] < 0 and f"− {reserve} reserve" in use["limit_text"]
    assert use["text"].startswith("does not fit: reserved peak")


def test_a_reserve_as_large_as_the_device_leaves_nothing_and_says_so():
    """A device smaller than its reserve (a user typing "200KiB"): nothing is usable; the chart still
    draws the limit (at 0, not skipped as no limit) and its words say why, short enough for the label."""
    m, plan, peak, _ = setting()
    mesh = sv.Mesh(8, device_memory="200KiB")  # the default 1 GiB reserve
    payload = display.memory_payload(sv.analyze(m, plan, mesh, TRAINING))
    assert payload["limit"] == 0 and payload["use"]["over"]
    assert payload["use"]["text"].startswith("does not fit: the 1.00 GiB reserve leaves nothing of 200.00 KiB for the reserved peak")


def test_sv201_counts_the_reserve():
    m, plan, peak, mesh = setting()
    a = sv.analyze(m, plan, mesh, TRAINING)
    found = [f for f in a.findings if f.code == "SV201"]
    assert found and found[0].message.startswith(a.fit.headline) and f"device_memory {mesh.limit_text}" in found[0].message
    assert not [f for f in sv.analyze(m, plan, sv.Mesh(8, device="H100", device_memory=mesh.device_memory,
                                                       memory_reserve=0, safety_margin=0), TRAINING).findings
                if f.code == "SV201"]


def test_search_row_between_usable_and_total_does_not_fit():
    m, plan, peak, mesh = setting()
    s = sv.search(m, mesh=mesh, training=TRAINING, offload=(False,))
    t = s.table[s.table.analysed]
    assert (t.fits == (t.reserved_peak <= mesh.usable_memory)).all()
    assert (t.margin == mesh.usable_memory - t.reserved_peak).all()
    between = t[(t.reserved_peak > mesh.usable_memory) & (t.reserved_peak <= mesh.device_memory)]
    assert len(between) and not between.fits.any()
    assert between.why.str.contains(f"over {sv.format.format_bytes(mesh.usable_memory)} usable by ").all()
