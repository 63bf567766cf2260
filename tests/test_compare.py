"""compare and sweep give exactly the numbers of separate analyze calls."""

import pytest

import shardviz as sv
from shardviz import zoo
from shardviz.compare import summarize
from shardviz.views.display import DEFAULT_TRAINING  # what compare and sweep assume without a training


@pytest.fixture(scope="module")
def model():
    return zoo.llama3_8b(lora=True)


@pytest.fixture(scope="module")
def plans(model):
    return {f"LoRA {x}": sv.Plan.auto(model, lora=x) for x in ("ignored", "sharded", "separate")}


def test_compare_equals_separate_analyses(model, plans):
    mesh = sv.Mesh(8, device_memory="80GiB")
    c = sv.compare(model, plans, mesh=mesh)
    table = c.table
    assert list(table.index) == list(plans)
    for name, plan in plans.items():
        a = sv.analyze(model, plan, mesh, DEFAULT_TRAINING)
        mem, comm = a.memory, a.comm
        row = table.loc[name]
        assert row.peak == mem.peak.max()
        worst = mem.peak.idxmax()
        for part in ("params", "grads", "optimizer"):
            assert row[part] == mem.at[worst, part]
        assert row.bytes_per_step == (comm.bytes * comm["count"]).sum()
        assert row.collectives_per_step == comm["count"].sum()
        assert row.findings == ", ".join(sorted({f.code for f in a.findings}))
    # The layouts really differ where they should: ignored LoRA is whole, hence more param bytes per rank.
    assert table.loc["LoRA ignored", "params"] > table.loc["LoRA sharded", "params"]
    fig = c.figure()
    assert len(fig.data) >= 4
    # the one default training, said in every view of the comparison
    said = "AdamW · bf16 params · fp32 reduce"
    assert c.training == DEFAULT_TRAINING and said in c.chart_title() and said in fig.layout.title.text
    assert c.memory_payload()["training"].startswith(said)


def test_diff_lists_exactly_the_parameters_that_moved(model, plans):
    c = sv.compare(model, plans, mesh=sv.Mesh(8))
    d = c.diff("LoRA ignored", "LoRA sharded")
    lora = set(c.analyses["LoRA sharded"].params.query("role == 'lora'").fqn)
    assert set(d.fqn) == lora
    assert set(d["status (LoRA ignored)"]) == {"ignored"} and set(d["status (LoRA sharded)"]) == {"sharded"}
    assert c.diff("LoRA sharded", "LoRA sharded").empty
    with pytest.raises(ValueError, match="no layout named 'nope'"):
        c.diff("nope", "LoRA sharded")


def test_sweep_equals_separate_analyses(model, plans):
    worlds = [8, 32, 128, 512]
    base = sv.Mesh(1, device_memory="40GiB")
    s = sv.sweep(model, plans, world_sizes=worlds, mesh=base)
    assert len(s.table) == len(plans) * len(worlds)
    for row in s.table.itertuples(index=False):
        a = sv.analyze(model, plans[row.layout], sv.Mesh(row.world, device_memory="40GiB"), DEFAULT_TRAINING)
        expect = summarize(a)
        assert row.peak == expect["peak"] and row.bytes_per_step == expect["bytes_per_step"]
        assert row.fits == (expect["peak"] <= 40 * 2**30)
    # peak per rank falls as the world grows (the shards shrink)
    for layout, rows in s.table.groupby("layout"):
        assert list(rows.peak) == sorted(rows.peak, reverse=True), layout
    first = s.first_fit()
    assert list(first) == list(plans)
    for layout, world in first.items():
        rows = s.table[s.table.layout == layout]
        fitting = [int(w) for w, fits in zip(rows.world, rows.fits) if fits]
        assert world == (min(fitting) if fitting else None), layout
    assert any(world is not None for world in first.values())  # 40 GiB: some layout fits somewhere
    assert len(s.figure().data) == 2 * len(plans)


def test_sweep_hsdp_needs_multiples(model, plans):
    with pytest.raises(ValueError, match="world size 12 is not a multiple of replicate=8"):
        sv.sweep(model, plans, world_sizes=[12], replicate=8)
