"""The shared views: one formatter per kind of number, ``sv.fmt`` for reading any table, and the
one default training every view assumes when none is given."""

import pandas as pd
import pytest

import shardviz as sv
from shardviz.format import COLUMNS, byte_unit, format_bytes, format_count, format_duration, format_percent, format_shape
from shardviz.run.mesh import worst_rank
from shardviz.views.display import DEFAULT_TRAINING, training_text

NBSP = "\u00a0"


@pytest.fixture(scope="module")
def analysis(model):
    return sv.analyze(model, sv.Plan.auto(model, lora="ignored"), sv.Mesh(8, device_memory="80GiB"), DEFAULT_TRAINING)


def test_one_formatter_per_kind_of_number():
    assert format_bytes(1536) == "1.50 KiB" and format_bytes(512) == "512 B"
    assert byte_unit(3 * 2**30) == (2**30, "GiB") and byte_unit(10) == (1, "B")
    assert format_count(855654400) == "855,654,400"
    assert format_shape((128256, 8192)) == "128,256 × 8,192" and format_shape(()) == "scalar"
    assert format_duration(0.55234) == "0.552 s" and format_duration(float("nan")) == "–"
    assert [format_percent(x) for x in (0.0004, 0.054, 0.54)] == ["<0.1%", "5.4%", "54%"]


def test_fmt_reads_like_the_report_and_leaves_the_raw_table_alone(analysis):
    mem = analysis.memory
    before = mem.copy()
    shown = sv.fmt(mem)
    pd.testing.assert_frame_equal(mem, before)  # the raw columns stay for code
    assert "_" not in "".join(shown.columns)  # human headers
    assert list(shown.columns[:4]) == [COLUMNS[c][0] for c in mem.columns[:4]]
    rank = worst_rank(mem)
    row = shown.iloc[int(mem.index[mem["rank"] == rank][0])]
    assert row["peak"] == format_bytes(mem.loc[mem["rank"] == rank, "peak"].iloc[0]).replace(" ", NBSP)  # never wraps
    units = sv.fmt(analysis.units)
    assert units["elements"].iloc[0] == format_count(analysis.units["numel"].iloc[0]).replace(" ", NBSP)
    params = sv.fmt(analysis.params)
    assert params["shape"].iloc[0] == format_shape(analysis.params["shape"].iloc[0]).replace(" ", NBSP)


def test_fmt_of_the_peak_breakdown_shows_each_part_and_its_share(analysis):
    parts = analysis.peak_breakdown()
    shown = sv.fmt(parts)
    assert list(shown.index) == list(parts) and shown.index.name == "part"
    assert shown.loc["sharded params", "size"] == format_bytes(parts["sharded params"]).replace(" ", NBSP)
    assert shown["share"].str.endswith("%").all()


def test_fmt_of_a_comparison_says_what_is_missing(model):
    c = sv.compare(model, {"A": sv.Plan.auto(model)}, mesh=sv.Mesh(8))
    shown = sv.fmt(c.table)
    assert shown.loc["A", "fits"] == "no limit set" and shown.loc["A", "comm time per step"] == "no bandwidth given"
    assert shown.index.name == "layout" and c.formatted.equals(shown)


def test_one_default_training_in_every_view(model, analysis):
    """The Inspector, compare and the report assume the same training when given none (issue 19:
    8.69 vs 8.71 GiB, 268.49 vs 266.60 GiB for the same plan) and say which."""
    from shardviz.report import render_report
    from shardviz.widget import InspectorState

    plan = sv.Plan.auto(model, lora="ignored")
    mesh = sv.Mesh(8, device_memory="80GiB")
    assert InspectorState(model, plan=plan, mesh=mesh).training == DEFAULT_TRAINING
    c = sv.compare(model, {"LoRA ignored": plan}, mesh=mesh)
    assert c.training == DEFAULT_TRAINING
    assert c.table.loc["LoRA ignored", "peak"] == analysis.memory["peak"].max()
    text = render_report(model, plan, mesh)
    assert f"Training: {training_text(DEFAULT_TRAINING)} (shardviz&#x27;s default" in text
    assert format_bytes(analysis.memory["peak"].max()) in text


def test_the_training_line_says_what_the_plans_calls_use(model):
    """Issue 35: a captured accelerate plan reduces in bf16 (its calls carry their own policy); the
    training line says so instead of the training's "fp32 reduce", and says a call-level offload."""
    pytest.importorskip("accelerate")
    captured = sv.Plan.from_accelerate(model, {"fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                                               "mixed_precision": "bf16"}, world_size=4)
    used = {DEFAULT_TRAINING.unit_defaults(u).reduce_dtype for u in captured.units}
    assert used == {"bfloat16"} != {DEFAULT_TRAINING.reduce_dtype}  # what the engine prices
    text = training_text(DEFAULT_TRAINING, captured)
    assert "bf16 reduce (the plan's calls)" in text and "fp32 reduce" not in text
    assert "fp32 reduce" in training_text(DEFAULT_TRAINING, sv.Plan.auto(model))  # nothing overridden
    units = captured.units
    mixed = captured.with_units([sv.Unit(u.modules, u.reshard_after_forward, None, None if i else "bfloat16", i == 0)
                                 for i, u in enumerate(units)])
    text = training_text(DEFAULT_TRAINING, mixed)
    assert f"bf16 params · fp32 reduce (bf16 in 1 of {len(units)} calls)" in text
    assert f"CPU offload (1 of the plan's {len(units)} calls)" in text
    assert training_text(DEFAULT_TRAINING, mixed.with_units([sv.Unit(u.modules, offload=True) for u in units])
                         ).count("CPU offload (every call)") == 1
    report = sv.analyze(model, captured, sv.Mesh(4))
    from shardviz.report import render_report

    assert "bf16 reduce (the plan&#x27;s calls)" in render_report(model, captured, sv.Mesh(4), analysis=report)
