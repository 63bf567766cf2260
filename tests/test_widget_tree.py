"""The Inspector's module tree: only what is expanded, per-module numbers and badges, per-rank
local shapes (held against torch's own ``fully_shard``), filters, folded repeated blocks, tied parameters.
"""

from __future__ import annotations

import math

import pytest
from torch import nn

import shardviz as sv
from shardviz.widget import InspectorState
from shardviz.widget.tree_view import Folding
from widget_helpers import EMBED, L0, L1, Q0, Q0_A, fresh, open_and_get, open_path, rows_by_fqn, torch_shard


def test_rows_only_what_is_expanded(model, st):
    order, rows = st.rows()
    assert order == ["m0", "m1"]
    assert rows["m0"]["badge"]["kind"] == "unit"
    open_and_get(st)
    order, rows = st.rows()
    assert len(order) < 15  # the two blocks are one folded row
    gid = next(i for i in order if i.startswith("g"))
    st.expand(gid)
    order, _ = st.rows()
    assert f"m{st.tree.module_index[L0]}" in order
    st.collapse(gid)
    assert f"m{st.tree.module_index[L0]}" not in st.rows()[0]
    st.collapse_all()
    assert st.rows()[0] == ["m0", "m1"]


def test_module_rows_numbers_and_badges(model, st):
    a = fresh(model, st)
    rows = open_path(st, Q0_A)
    emb = rows[EMBED]
    assert emb["badge"]["kind"] == "unit" and emb["is_unit"]
    assert emb["numel"] == model.get_submodule(EMBED).weight.numel()
    assert emb["bytes"] == int(a.params.set_index("fqn").at[EMBED + ".weight", "shard_bytes"])
    q = rows[Q0]
    assert q["badge"] == {**q["badge"], "kind": "in", "label": "in layers.0"}
    assert q["n_lora"] == 2 and q["lora"] == "kept"
    st.remove_unit("")
    rows = rows_by_fqn(st)[0]
    assert rows["base_model.model.model.rotary_emb"]["badge"]["kind"] == "unmanaged"
    st.remove_unit(L0)
    rows = rows_by_fqn(st)[0]
    assert rows[Q0]["badge"]["kind"] == "unmanaged"


def test_param_rows_local_shape_and_padding_per_rank(model, st):
    st.set_mesh(world=3)  # 128 rows over 3 ranks: 43, 43, 42 (+1 padding row on rank 2)
    paddings = []
    for rank in range(3):
        st.set_rank(rank)
        padded, local = torch_shard(model, st.plan, st.mesh, rank, EMBED + ".weight")
        row = open_path(st, EMBED + ".weight")[EMBED + ".weight"]
        assert tuple(row["local_shape"]) == local
        assert tuple(row["shard_shape"]) == padded
        assert row["padding"] == math.prod(padded) - math.prod(local)
        paddings.append(row["padding"])
        assert row["dtype"] == "float32" and row["trainable"] is False and row["role"] == "base"
    assert any(paddings)  # the case under test: torch pads a shard
    lora = open_path(st, Q0_A)[Q0_A]
    assert lora["role"] == "lora" and lora["trainable"] is True
    with pytest.raises(ValueError, match="outside the mesh"):
        st.set_rank(3)


def test_filters(model, st):
    st.set_filter(text="q_proj.lora_a")
    order, rows = st.rows()
    params = [rows[i]["fqn"] for i in order if rows[i]["kind"] == "param"]
    assert params == [Q0_A, L1 + ".self_attn.q_proj.lora_A.default.weight"]
    st.set_filter(text="", role="lora", status="")
    order, rows = st.rows()
    assert sum(rows[i]["kind"] == "param" for i in order) == sum(p.role == "lora" for p in st.tree.params)
    st.ignore_lora(L0)
    st.set_filter(role="", status="ignored")
    order, rows = st.rows()
    assert {rows[i]["fqn"] for i in order if rows[i]["kind"] == "param"} == set(st.plan.ignored)
    st.set_filter(status="unit")
    order, rows = st.rows()
    units = {m for u in st.plan.units for m in u.modules} - {""}
    assert {rows[i]["fqn"] for i in order if rows[i]["badge"]["kind"] == "unit"} - {""} == units
    with pytest.raises(ValueError, match="status filter"):
        st.set_filter(status="weird")
    st.reveal(Q0_A)  # reveal clears a filter that would hide the target
    assert not st.view.filtering


def test_reveal_opens_folded_group(model, st):
    row_id = st.reveal(Q0_A)
    order, rows = st.rows()
    assert row_id in order and rows[row_id]["fqn"] == Q0_A
    with pytest.raises(ValueError, match="no module or parameter"):
        st.reveal("nowhere")


def test_folding_numbered_runs():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(2, 2) for _ in range(5)])
            self.experts = nn.ModuleDict({f"expert_{i}": nn.Linear(2, 2) for i in range(3)})
            self.mixed = nn.ModuleList([nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2)])

    tree = sv.ModelTree(Net())
    f = Folding(tree)
    items = f.items(tree.module_index["blocks"])
    assert len(items) == 1 and f.runs[items[0][1]].label == "blocks.0-4"
    assert f.runs[f.items(tree.module_index["experts"])[0][1]].label == "experts.expert_0-2"
    assert all(kind == "m" for kind, _ in f.items(tree.module_index["mixed"]))


def test_tied_parameters_counted_once():
    from handmade import Tied

    model = Tied()
    st = InspectorState(model, plan=sv.Plan([["embed", "head"], ""]), mesh=sv.Mesh(shard=2))
    a = fresh(model, st)
    assert st.stats.rank_bytes[0] == int(a.params["shard_bytes"].sum())
    assert st.view.static.n_params[0] == len(st.tree.params)
    rows = open_path(st, "head.weight")
    # a tied parameter counts once, under its first owner: children never add up to more than the parent
    n = model.head.weight.numel()
    assert rows["head.weight"]["tied"] and rows["head"]["numel"] == 0 and rows["head"]["tied_numel"] == n
    assert rows["embed"]["numel"] == n and rows[""]["numel"] == st.view.static.numel[0]
    st.toggle_ignored("head.weight")  # an alias: the canonical name is stored
    assert st.plan.ignored == ("embed.weight",)
    st.toggle_ignored("head.weight")
    assert st.plan.ignored == ()
