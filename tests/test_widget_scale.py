"""The Inspector at scale (slow): Llama-3.1-70B + LoRA and the largest MoE open quickly and send
only the rows that are visible.
"""

from __future__ import annotations

import json

import pytest

import shardviz as sv
from shardviz import zoo
from shardviz.widget import Inspector
from shardviz.widget.tree_view import MAX_FILTER_ROWS
from widget_helpers import Wire, group_id, saved


@pytest.mark.slow
def test_llama70b_lora_is_quick_and_sends_little(tmp_path):
    model = zoo.llama3_70b(lora=True)  # speed: benchmarks/bench_widget.py measures it in the browser
    ins = Inspector(model, mesh=sv.Mesh(shard=64), plan_path=tmp_path / "p.json")
    st = ins.controller
    assert st.tree.n_modules > 6000
    wire = Wire(ins)
    ins._on_msg(ins, {"type": "hello"}, [])
    first = wire.msgs("rows")[-1]
    assert len(first["order"]) < 10 and len(json.dumps(first)) < 10_000  # never the whole tree
    for f in ("base_model", "base_model.model", "base_model.model.model", "base_model.model.model.layers"):
        ins.handle_action("expand", {"target": f, "open": True})
    order, rows = st.rows()
    group = next(rows[i] for i in order if i.startswith("g"))
    assert group["label"] == "layers.0-79 · 80 x LlamaDecoderLayer"
    wire.clear()
    for _ in range(3):
        ins.handle_action("toggle_unit", {"fqn": "base_model.model.model.layers.3"})
    assert all(len(m["rows"]) < 20 for m in wire.msgs("rows"))
    assert saved(tmp_path / "p.json") == ins.plan
    a = sv.analyze(st.tree, ins.plan, ins.mesh, ins.training, strict=False)
    assert ins.memory["max_peak"] == int(a.memory["peak"].max())
    ins.handle_action("apply_to_many", {"targets": group_id(st), "action": "ignore_lora"})
    assert len(ins.plan.ignored) == sum(p.role == "lora" for p in st.tree.params
                                        if p.fqn.startswith("base_model.model.model.layers."))


@pytest.mark.slow
def test_largest_moe_opens():
    model = zoo.build(zoo.LARGEST_MOE)
    ins = Inspector(model, mesh=sv.Mesh(shard=64))
    st = ins.controller
    assert st.tree.n_modules > 20_000
    # what the filter must show, from torch's own walk: every module and parameter name holding the
    # text, in preorder (a module, its own parameters, then its children); past the cap, a count
    text = "experts.expert_1"
    matches = []
    for name, module in model.named_modules():
        if name and text in name.lower():
            matches.append(name)
        matches += [f"{name}.{n}" for n, _ in module.named_parameters(recurse=False) if text in f"{name}.{n}".lower()]
    assert len(matches) > MAX_FILTER_ROWS  # the case under test: more matches than the view shows
    wire = Wire(ins)
    ins.handle_action("set_filter", {"text": text})
    order, rows = st.rows()
    shown = [rows[i]["fqn"] for i in order if text in rows[i]["fqn"].lower()]
    assert shown == matches[:MAX_FILTER_ROWS]
    assert st.view.truncated == len(matches) - MAX_FILTER_ROWS
    assert wire.msgs("rows")[-1]["truncated"] == st.view.truncated and ins.summary["truncated"] == st.view.truncated
    st.set_filter(text="")
    expert = next(f for f in st.tree.module_index if f.endswith("experts.expert_5"))
    row = st.reveal(expert)
    assert row in st.rows()[0]
    labels = [r.get("label", "") for r in st.rows()[1].values()]
    assert any("x NllbMoe" in label for label in labels)
