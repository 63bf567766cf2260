"""The Inspector without a browser: every action on the controller and through the widget's messages.

Each action is checked three ways: the state it leaves (plan, mesh, training, history), what the
widget sends to the front end (traits and row messages), and the numbers shown, which must equal
``sv.analyze`` run afresh on the resulting plan.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from torch import nn

import shardviz as sv
from shardviz import zoo
from shardviz import display
from shardviz.widget import Inspector, InspectorState
from shardviz.widget.inspector import FRONT_FILES
from shardviz.widget import panels
from shardviz.widget.tree_view import MAX_FILTER_ROWS, Folding

L0 = "base_model.model.model.layers.0"
L1 = "base_model.model.model.layers.1"
LAYERS = "base_model.model.model.layers"
EMBED = "base_model.model.model.embed_tokens"
Q0 = L0 + ".self_attn.q_proj"
Q0_A = Q0 + ".lora_A.default.weight"
Q0_BASE = Q0 + ".base_layer.weight"
MESH = sv.Mesh(shard=4)


@pytest.fixture(scope="module")
def model():
    return zoo.tiny_llama_lora()


@pytest.fixture
def st(model):
    return InspectorState(model, mesh=MESH)


def fresh(model, st_or_ins):
    """``sv.analyze`` from scratch (a new tree) for the state's current plan, mesh and training."""
    return sv.analyze(model, st_or_ins.plan, st_or_ins.mesh, st_or_ins.training, strict=False)


def assert_numbers_match(model, st):
    """Every number the widget shows equals a fresh ``sv.analyze`` of the same plan."""
    a = fresh(model, st)
    mem = st.memory
    assert mem["available"]
    table = a.memory
    assert mem["max_peak"] == int(table["peak"].max())
    assert mem["n_ranks"] == len(table) == st.mesh.world
    for bar in mem["bars"]:
        for rank in range(bar["first"], bar["last"] + 1):
            row = table[table["rank"] == rank].iloc[0]
            assert bar["peak"] == int(row["peak"])
            assert sum(bar["parts"].values()) == int(row["peak"])  # the stack sums to the peak
            assert bar["parts"] == display.peak_breakdown(a, rank)  # the one breakdown, not a split of its own
            assert list(bar["parts"]) == list(display.PEAK_PARTS)
            assert bar["parts"]["optimizer states"] == int(row["optimizer"])
            assert bar["parts"]["sharded params"] + bar["parts"]["whole params"] == int(row["params"])
    covered = sorted(r for b in mem["bars"] for r in range(b["first"], b["last"] + 1))
    assert covered == list(range(st.mesh.world))
    comm = a.comm
    tr = st.traffic
    for c in tr["by_collective"]:
        sub = comm[comm["collective"] == c["collective"]]
        assert c["sent"] == int(sub["sent_bytes"].sum())
        assert c["bytes"] == int(sub["bytes"].sum())
        assert c["count"] == int(sub["count"].sum())
    assert tr["total_sent"] == int(comm["sent_bytes"].sum())
    for u in tr["by_unit"]:
        if u.get("other"):
            continue
        sub = comm[comm["unit"] == u["unit"]] if u["unit"] != "(outside FSDP)" else comm[comm["unit"].isna()]
        assert u["total"] == int(sub["sent_bytes"].sum())
    assert [(f["code"], f["severity"], f["message"]) for f in st.findings] == [
        (f.code, f.severity, f.message) for f in a.findings
    ]
    # the tree's per-rank bytes of the root: every parameter's padded shard (or whole tensor)
    params = a.params
    assert st.stats.rank_bytes[0] == int(params["shard_bytes"].sum())


def rows_by_fqn(st):
    order, rows = st.rows()
    return {r["fqn"]: r for r in (rows[i] for i in order) if r["kind"] != "group"}, order, rows


def open_path(st, fqn):
    st.reveal(fqn)
    return rows_by_fqn(st)[0]


# ---------------------------------------------------------------------------------------------
# start
# ---------------------------------------------------------------------------------------------
def test_starts_with_auto_plan_and_matches_analyze(model, st):
    assert st.plan == sv.Plan.auto(model)
    # the README table's training (benchmarks/bench_table.py), not the model's dtype
    assert st.mesh == MESH and st.training == sv.Training(optimizer="adamw", param_dtype="bfloat16", reduce_dtype="float32")
    assert not st.can_undo and not st.can_redo
    assert_numbers_match(model, st)


def test_explicit_plan_and_modeltree_input(model):
    plan = sv.Plan([L0, ""])
    st = InspectorState(sv.ModelTree(model), plan=plan, mesh=MESH)
    assert st.plan == plan and st.model is None
    assert_numbers_match(model, st)
    with pytest.raises(ValueError, match="needs the nn.Module"):
        st.verify()


def test_bad_start_plan_is_refused(model):
    with pytest.raises(ValueError, match="no module named"):
        InspectorState(model, plan=sv.Plan(["nope"]), mesh=MESH)


# ---------------------------------------------------------------------------------------------
# plan actions
# ---------------------------------------------------------------------------------------------
def test_make_and_remove_unit(model, st):
    st.remove_unit(L0)
    assert st.plan.unit_of(L0) is None
    assert_numbers_match(model, st)
    st.make_unit(L0, reshard_after_forward=False)
    assert st.plan.unit_of(L0).reshard_after_forward is False
    assert_numbers_match(model, st)
    with pytest.raises(ValueError, match="already in a fully_shard call"):
        st.make_unit(L0)
    with pytest.raises(ValueError, match="no module named"):
        st.make_unit("base_model.model.model.layerz.0")
    with pytest.raises(ValueError, match="is a parameter"):
        st.make_unit(Q0_A)


def test_toggle_unit_changes_memory_like_analyze(model, st):
    before = st.memory["max_peak"]
    st.toggle_unit(Q0)  # a new, smaller call inside the block
    assert st.plan.unit_of(Q0) is not None
    assert_numbers_match(model, st)
    st.toggle_unit(Q0)
    assert st.plan.unit_of(Q0) is None
    assert st.memory["max_peak"] == before


def test_remove_grouped_unit_removes_the_group(model, st):
    norm = "base_model.model.model.norm"
    assert st.plan.unit_of(norm).is_grouped
    st.toggle_unit(norm)
    assert st.plan.unit_of(norm) is None and st.plan.unit_of("base_model.model.lm_head") is None
    st.make_group_unit([norm, "base_model.model.lm_head"])
    assert st.plan.unit_of(norm).modules == (norm, "base_model.model.lm_head")
    assert_numbers_match(model, st)


def test_reshard_after_forward_and_unit_options(model, st):
    st.set_reshard_after_forward(L0, "false")
    assert st.plan.unit_of(L0).reshard_after_forward is False
    st.set_reshard_after_forward(L0, 2)
    assert st.plan.unit_of(L0).reshard_after_forward == 2
    assert_numbers_match(model, st)
    st.set_reshard_after_forward(L0, "default")
    assert st.plan.unit_of(L0).reshard_after_forward is None
    st.set_unit_options(L0, param_dtype="bfloat16")
    assert st.plan.unit_of(L0).param_dtype == "bfloat16"
    assert_numbers_match(model, st)
    with pytest.raises(ValueError, match="not in any fully_shard call"):
        st.set_reshard_after_forward(Q0, True)
    with pytest.raises(ValueError, match="expected default, True, False or an int"):
        st.set_reshard_after_forward(L0, "sometimes")


def test_ignore_unignore_and_toggle(model, st):
    st.ignore([Q0_A])
    assert st.plan.ignored == (Q0_A,)
    a = fresh(model, st)
    assert a.params.set_index("fqn").at[Q0_A, "status"] == "ignored"
    assert_numbers_match(model, st)
    st.ignore([Q0_A])  # already ignored: no new entry, no new history step
    assert st.plan.ignored == (Q0_A,)
    st.toggle_ignored(Q0_A)
    assert st.plan.ignored == ()
    st.toggle_ignored(Q0_BASE)
    assert st.plan.ignored == (Q0_BASE,)
    st.unignore(Q0_BASE)
    assert st.plan.ignored == ()
    with pytest.raises(ValueError, match="is a module"):
        st.ignore([Q0])


def test_ignore_lora_under_a_block(model, st):
    lora = st.lora_params(L0)
    assert lora and all(".lora_" in f for f in lora)
    st.ignore_lora(L0)
    assert set(st.plan.ignored) == set(lora)
    assert not any(f.startswith(L1) for f in st.plan.ignored)
    # badges: the LoRA holders under the block turn "ignored", the block itself "unit"
    rows = open_path(st, Q0_A)
    assert rows[Q0 + ".lora_A"]["badge"]["kind"] == "ignored"
    assert rows[Q0_A]["badge"]["kind"] == "ignored"
    assert rows[Q0]["badge"]["kind"] == "mixed"  # base weight sharded, adapters ignored
    assert rows[Q0]["lora"] == "ignored"
    assert_numbers_match(model, st)
    st.unignore_lora(L0)
    assert st.plan.ignored == ()
    with pytest.raises(ValueError, match="no LoRA parameters"):
        st.ignore_lora(EMBED)


def test_apply_to_folded_group_is_one_undo_step(model, st):
    order, rows = rows_by_fqn(open_and_get(st))[1:]
    gid = next(i for i in order if i.startswith("g"))
    assert rows[gid]["label"] == "layers.0-1 · 2 x LlamaDecoderLayer"
    assert rows[gid]["n_units"] == 2
    steps = len(st._history)
    st.apply_to_many(gid, "ignore_lora")
    assert len(st._history) == steps + 1
    assert set(st.plan.ignored) == set(st.lora_params(L0) + st.lora_params(L1))
    st.apply_to_many(gid, "remove_unit")
    assert st.plan.unit_of(L0) is None and st.plan.unit_of(L1) is None
    st.apply_to_many(gid, "make_unit")
    st.apply_to_many(gid, "set_reshard_after_forward", value=False)
    assert st.plan.unit_of(L1).reshard_after_forward is False
    assert_numbers_match(model, st)
    st.undo()
    assert st.plan.unit_of(L1).reshard_after_forward is None
    with pytest.raises(ValueError, match="expected one of"):
        st.apply_to_many(gid, "explode")


def open_and_get(st):
    st.expand("base_model")
    st.expand("base_model.model")
    st.expand("base_model.model.model")
    st.expand(LAYERS)
    return st


def test_apply_to_type(model, st):
    st.apply_to_type("Linear", "make_unit", within=L0 + ".mlp")
    mlp_linears = [f for f in st.tree.module_index if f.startswith(L0 + ".mlp") and st.tree.module(f).type_name == "Linear"]
    assert mlp_linears and all(st.plan.unit_of(f) is not None for f in mlp_linears)
    assert_numbers_match(model, st)
    st.apply_to_type(L0, "ignore_lora")  # by one FQN of the type: every LlamaDecoderLayer
    assert set(st.plan.ignored) == set(st.lora_params(L0) + st.lora_params(L1))
    with pytest.raises(ValueError, match="no module of type"):
        st.apply_to_type("Conv2d", "make_unit")


@pytest.mark.parametrize("preset", ["auto-sharded", "auto-ignored", "auto-separate", "root-only", "none"])
def test_presets(model, st, preset):
    st.remove_unit(L0)
    st.apply_preset(preset)
    expected = {
        "auto-sharded": sv.Plan.auto(model, lora="sharded"),
        "auto-ignored": sv.Plan.auto(model, lora="ignored"),
        "auto-separate": sv.Plan.auto(model, lora="separate"),
        "root-only": sv.Plan([""]),
        "none": sv.Plan([]),
    }[preset]
    assert st.plan == expected
    assert_numbers_match(model, st)
    with pytest.raises(ValueError, match="expected one of"):
        st.apply_preset("fastest")


def test_set_plan_from_json(model, st):
    plan = sv.Plan([L0, L1, ""], ignored=[Q0_A])
    st.set_plan(plan.to_json())
    assert st.plan == plan
    with pytest.raises(ValueError, match="no parameter named"):
        st.set_plan(sv.Plan([""], ignored=["nope.weight"]))
    assert st.plan == plan  # unchanged after the refusal


def test_mesh_and_training(model, st):
    # memory_reserve=0: the limit is the bytes given (the reserve: test_fits_verdicts_keep_the_reserve)
    st.set_mesh(world=8, replicate=2, device_memory="256KiB", memory_reserve=0)
    assert st.mesh == sv.Mesh(shard=4, replicate=2, device_memory=256 * 1024, memory_reserve=0)
    assert_numbers_match(model, st)
    assert st.memory["limit"] == 256 * 1024
    assert any(f["code"] == "SV201" for f in st.findings)  # the peak does not fit
    with pytest.raises(ValueError, match="not a multiple"):
        st.set_mesh(world=6, replicate=4)
    assert st.mesh.replicate == 2
    st.set_training(optimizer="sgd", param_dtype="bfloat16")
    assert st.training == sv.Training(optimizer="sgd", param_dtype="bfloat16", reduce_dtype="float32")
    assert_numbers_match(model, st)
    with pytest.raises(ValueError, match="no field"):
        st.set_training(learning_rate=1.0)
    st.set_mesh(device_memory=None)
    assert st.mesh.device_memory is None


def test_undo_redo_covers_plan_mesh_and_training(model, st):
    p0, m0, t0 = st.plan, st.mesh, st.training
    st.remove_unit(L0)
    st.set_mesh(world=16)
    st.set_training(optimizer="sgd")
    assert st.undo() and st.training == t0 and st.mesh.world == 16
    assert st.undo() and st.mesh == m0
    assert st.undo() and st.plan == p0
    assert not st.undo()
    assert_numbers_match(model, st)
    assert st.redo() and st.plan.unit_of(L0) is None
    st.make_unit(Q0)  # a new change drops the redo tail
    assert not st.can_redo
    assert_numbers_match(model, st)


def test_failed_action_changes_nothing(model, st):
    st.apply_preset("none")
    st.make_group_unit([Q0, L1])
    before = (st.plan, st.mesh, st.revision, len(st._history))
    with pytest.raises(ValueError, match="no module named"):
        st.make_group_unit([Q0 + "x"])
    # two grouped calls that each sit inside the other cannot be applied bottom-up
    with pytest.raises(ValueError, match="cannot be applied bottom-up"):
        st.make_group_unit([L0, L1 + ".self_attn.q_proj"])
    assert (st.plan, st.mesh, st.revision, len(st._history)) == before


def test_refused_plan_shows_findings_instead_of_raising(model, st):
    st.remove_unit("")  # the [norm, lm_head] group is now a root: torch refuses it
    codes = {f["code"] for f in st.findings}
    assert "SV004" in codes
    assert_numbers_match(model, st)


# ---------------------------------------------------------------------------------------------
# the tree view
# ---------------------------------------------------------------------------------------------
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


def torch_shard(model, plan, mesh, rank, fqn):
    """(padded shard shape, local shape) of parameter ``fqn`` on ``rank``, from torch's own fully_shard."""
    from torch.distributed.fsdp import fully_shard

    from shardviz.oracle import apply_plan, device_mesh, fake_process_group, meta_copy

    copy_ = meta_copy(model)
    with fake_process_group(rank, mesh.world):
        apply_plan(copy_, plan, device_mesh(mesh))
        target = copy_.get_parameter(fqn)
        for unit in plan.units:
            group = fully_shard.state(copy_.get_submodule(unit.modules[0]))._fsdp_param_group
            for fp in group.fsdp_params if group is not None else ():
                if fp.sharded_param is target:
                    return tuple(fp.padded_sharded_param_size), tuple(fp.sharded_size)
    raise AssertionError(f"torch did not shard {fqn}")


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


# ---------------------------------------------------------------------------------------------
# export and verify
# ---------------------------------------------------------------------------------------------
def test_export_save_and_overwrite(model, st, tmp_path):
    code = st.export_code()
    assert code == sv.export_code(model, st.plan, mesh=st.mesh, training=st.training)
    assert st.export_code("2.6") == sv.export_code(model, st.plan, mesh=st.mesh, training=st.training, torch_version="2.6")
    path = st.save_code(tmp_path / "plan.py")
    assert path.read_text() == code
    with pytest.raises(FileExistsError):
        st.save_code(path, torch_version="2.6")
    assert path.read_text() == code  # never overwritten without confirmation
    st.save_code(path, torch_version="2.6", overwrite=True)
    assert path.read_text() == st.export_code("2.6")
    st.toggle_unit(Q0)
    assert st.export_code() == sv.export_code(model, st.plan, mesh=st.mesh, training=st.training)
    compile(st.export_code(), "plan.py", "exec")


def test_verify_runs_torch(model, st):
    result = st.verify()
    assert result["ok"] and result["n"] == 0 and result["error"] is None
    assert result["plan_json"] == st.plan.to_json(indent=None)


# ---------------------------------------------------------------------------------------------
# the plan file
# ---------------------------------------------------------------------------------------------
def saved(path) -> sv.Plan:
    return sv.Plan.from_json(Path(path).read_text())


def test_plan_file_saved_after_every_change_and_restored(model, tmp_path):
    path = tmp_path / "plan.json"
    st = InspectorState(model, mesh=MESH, plan_path=path)
    assert saved(path) == st.plan  # on disk from the start
    st.remove_unit(L0)
    assert saved(path) == st.plan
    st.ignore_lora(L1)
    assert saved(path) == st.plan
    st.undo()
    assert saved(path) == st.plan
    st.redo()
    current = st.plan
    assert not [p for p in tmp_path.iterdir() if p.name != "plan.json"]  # no temporary files left
    # "kernel crash": a new Inspector on the same path gets every toggle back
    again = InspectorState(model, mesh=MESH, plan_path=path)
    assert again.plan == current
    assert "restored" in again.messages[-1]["text"]
    # the file wins over an explicit starting plan
    third = InspectorState(model, plan=sv.Plan([""]), mesh=MESH, plan_path=path)
    assert third.plan == current


@pytest.mark.parametrize(
    "content, why",
    [
        ("{not json", "not a valid shardviz plan"),
        (json.dumps({"schema": "other"}), "not a valid shardviz plan"),
        (sv.Plan(["model.layers.0"]).to_json(), "does not match this model"),
        (sv.Plan([""], ignored=["x.weight"]).to_json(), "does not match this model"),
    ],
)
def test_corrupt_or_mismatched_plan_file_is_never_overwritten(model, tmp_path, content, why):
    path = tmp_path / "plan.json"
    path.write_text(content)
    st = InspectorState(model, mesh=MESH, plan_path=path)
    assert st.plan == sv.Plan.auto(model)  # started from the default, with a clear message
    assert st.messages[-1]["level"] == "error" and why in st.messages[-1]["text"]
    assert "autosave is OFF" in st.messages[-1]["text"]
    assert st.plan_file_status()["autosave"] is False
    st.remove_unit(L0)
    st.ignore_lora(L1)
    assert path.read_text() == content  # untouched
    st.overwrite_plan_file()  # the explicit decision
    assert saved(path) == st.plan and st.plan_file_status()["autosave"] is True
    st.undo()
    assert saved(path) == st.plan


def test_plan_file_that_cannot_be_applied_is_refused(model, tmp_path):
    # real names, but two grouped calls that each sit inside the other: no bottom-up order
    path = tmp_path / "plan.json"
    content = sv.Plan([[Q0, L1], [L0, L1 + ".self_attn.q_proj"], ""]).to_json()
    path.write_text(content)
    st = InspectorState(model, mesh=MESH, plan_path=path)
    assert st.plan == sv.Plan.auto(model)
    assert "cannot be applied" in st.messages[-1]["text"] and not st.plan_file_status()["autosave"]
    st.remove_unit(L0)
    assert path.read_text() == content


def test_plan_file_changed_by_someone_else_is_not_overwritten(model, tmp_path):
    path = tmp_path / "plan.json"
    st = InspectorState(model, mesh=MESH, plan_path=path)
    other = sv.Plan([""]).to_json()
    path.write_text(other)
    st.remove_unit(L0)
    assert path.read_text() == other
    assert "changed by someone else" in st.messages[-1]["text"]
    assert st.plan_file_status()["autosave"] is False


# ---------------------------------------------------------------------------------------------
# the widget: messages to and from the front end
# ---------------------------------------------------------------------------------------------
class Wire:
    """Records what the widget sends: custom messages and trait changes, in order."""

    def __init__(self, ins: Inspector):
        self.log: list[tuple[str, object]] = []
        ins.view.send = lambda msg, buffers=None: self.log.append(("msg", msg))
        ins.view.observe(lambda c: self.log.append(("trait", c["name"])),
                         names=["memory", "traffic", "findings", "summary", "code", "messages", "verify_result"])

    def msgs(self, kind):
        return [m for t, m in self.log if t == "msg" and m["type"] == kind]

    def clear(self):
        self.log.clear()


@pytest.fixture
def ins(model):
    return Inspector(model, mesh=MESH)


def test_widget_initial_traits_equal_analyze(model, ins):
    assert ins.plan == sv.Plan.auto(model)
    assert ins.view.memory["max_peak"] == int(fresh(model, ins).memory["peak"].max())
    assert ins.view.summary["n_units"] == len(ins.plan.units)
    assert ins.view.findings == panels.findings_payload(fresh(model, ins))
    assert_numbers_match(model, ins.controller)


def test_widget_hello_sends_all_visible_rows(ins):
    wire = Wire(ins)
    ins._on_msg(ins.view, {"type": "hello", "req": 0}, [])
    rows = wire.msgs("rows")[-1]
    assert rows["reset"] and rows["order"] == ["m0", "m1"] and set(rows["rows"]) == {"m0", "m1"}
    assert wire.msgs("ack")[-1]["ok"]


def test_widget_toggle_sends_charts_then_changed_rows_then_findings(model, ins):
    wire = Wire(ins)
    for f in ("base_model", "base_model.model", "base_model.model.model"):
        ins.handle_action("expand", {"target": f, "open": True})
    assert fresh(model, ins).findings == []
    wire.clear()
    ack = ins.handle_action("toggle_unit", {"fqn": EMBED}, req=7)
    assert ack == {**ack, "type": "ack", "req": 7, "ok": True, "error": None}
    assert ins.plan.unit_of(EMBED) is None
    names = [x if t == "trait" else x["type"] for t, x in wire.log]
    assert names.index("memory") < names.index("rows") < names.index("ack")
    assert fresh(model, ins).findings == [] and "findings" not in names  # none before or after: not resent
    rows = wire.msgs("rows")[-1]
    emb = f"m{ins.controller.tree.module_index[EMBED]}"
    assert emb in rows["rows"] and rows["rows"][emb]["badge"]["kind"] != "unit"
    assert "order" not in rows  # nothing opened or closed: the order is not resent
    _, all_rows = ins.controller.rows()
    assert len(rows["rows"]) < len(all_rows)  # only what changed
    assert ins.view.memory["max_peak"] == int(fresh(model, ins).memory["peak"].max())
    assert ins.view.memory["revision"] == ins.controller.revision
    assert_numbers_match(model, ins.controller)
    # a change whose findings change: without the root's call torch refuses the [norm, lm_head] group
    before = panels.findings_payload(fresh(model, ins))
    wire.clear()
    ins.handle_action("toggle_unit", {"fqn": ""}, req=8)
    after = panels.findings_payload(fresh(model, ins))
    assert after != before and "SV004" in {f["code"] for f in after}
    names = [x if t == "trait" else x["type"] for t, x in wire.log]
    assert names.index("memory") < names.index("rows") < names.index("findings") < names.index("ack")
    assert ins.view.findings == after


def test_widget_ignore_lora_under_block_changes_badges(model, ins):
    wire = Wire(ins)
    ins.handle_action("reveal", {"fqn": Q0_A})
    reveal = wire.msgs("reveal")[-1]
    assert reveal["id"] in wire.msgs("rows")[-1]["order"]
    assert wire.msgs("rows")[-1]["rows"][reveal["id"]]["fqn"] == Q0_A
    wire.clear()
    ins.handle_action("ignore_lora", {"module_fqn": L0})
    rows = wire.msgs("rows")[-1]["rows"]
    by_fqn = {r["fqn"]: r for r in rows.values()}
    assert by_fqn[Q0_A]["badge"]["kind"] == "ignored"
    assert by_fqn[Q0]["lora"] == "ignored"
    assert ins.view.summary["n_ignored"] == len(ins.controller.lora_params(L0))
    assert_numbers_match(model, ins.controller)


@pytest.mark.parametrize(
    "action, args, check",
    [
        ("make_unit", {"fqn": Q0}, lambda p: p.unit_of(Q0) is not None),
        ("remove_unit", {"fqn": L0}, lambda p: p.unit_of(L0) is None),
        ("set_reshard_after_forward", {"fqn": L0, "value": "true"}, lambda p: p.unit_of(L0).reshard_after_forward is True),
        ("toggle_ignored", {"fqn": Q0_A}, lambda p: p.ignored == (Q0_A,)),
        ("ignore", {"fqns": [Q0_A]}, lambda p: p.ignored == (Q0_A,)),
        ("unignore", {"fqns": [Q0_A]}, lambda p: p.ignored == ()),
        ("unignore_lora", {"module_fqn": L0}, lambda p: p.ignored == ()),
        ("apply_to_type", {"type_or_fqn": "LlamaDecoderLayer", "action": "remove_unit"}, lambda p: p.unit_of(L1) is None),
        ("apply_preset", {"name": "auto-ignored"}, lambda p: len(p.ignored) > 0),
    ],
)
def test_widget_actions(model, ins, action, args, check):
    wire = Wire(ins)
    ack = ins.handle_action(action, args, req=1)
    assert ack["ok"], ack
    assert check(ins.plan)
    assert wire.msgs("ack")[-1]["req"] == 1
    assert ins.view.memory["max_peak"] == int(fresh(model, ins).memory["peak"].max())
    assert ins.view.memory == {**ins.controller.memory, "revision": ins.controller.revision}
    assert ins.view.traffic == {**ins.controller.traffic, "revision": ins.controller.revision}
    assert ins.view.findings == ins.controller.findings
    assert ins.view.summary["revision"] == ins.controller.revision
    assert_numbers_match(model, ins.controller)


def test_widget_view_actions_send_rows(model, ins):
    wire = Wire(ins)
    ins.handle_action("set_filter", {"text": "lora_B", "status": "", "role": ""})
    msg = wire.msgs("rows")[-1]
    params = {r["fqn"] for r in msg["rows"].values() if r["kind"] == "param"}
    assert params == {n for n, _ in model.named_parameters() if "lora_B" in n} and msg["filtering"]
    assert ins.view.summary["filter"]["text"] == "lora_B"
    ins.handle_action("set_filter", {"text": ""})
    assert wire.msgs("rows")[-1]["order"] == ["m0", "m1"]
    ins.handle_action("reveal", {"fqn": EMBED + ".weight"})
    row_id = wire.msgs("reveal")[-1]["id"]
    local = torch_shard(model, ins.plan, ins.mesh, 0, EMBED + ".weight")[1]
    assert wire.msgs("rows")[-1]["rows"][row_id]["local_shape"] == list(local)
    ins.handle_action("set_rank", {"rank": 3})
    assert wire.msgs("rows")[-1]["rows"][row_id]["rank"] == 3  # the param row changed, nothing else
    assert set(wire.msgs("rows")[-1]["rows"]) == {row_id}
    assert not ins.handle_action("set_rank", {"rank": 4})["ok"]
    ins.handle_action("collapse_all", {})
    assert wire.msgs("rows")[-1]["order"] == ["m0", "m1"]
    n = len(wire.msgs("rows"))
    ins.handle_action("expand", {"target": "m1", "open": True})
    assert len(wire.msgs("rows")) == n + 1 and "m2" in wire.msgs("rows")[-1]["order"]


def test_widget_controls_are_actions_and_follow_the_state(model, ins):
    """The controls are drawn by the front end from the ``controls`` trait; every edit is an action
    (no second widget, no sync guard): a refused edit leaves the state and the trait as they were."""
    c = ins.controls
    assert (c["world"], c["replicate"], c["rank"], c["device_gib"]) == (4, 1, 0, None)
    assert (c["param_dtype"], c["reduce_dtype"], c["optimizer"]) == ("bfloat16", "float32", "adamw")
    assert c["batch_size"] is None and not c["can_undo"] and c["raf_choices"] == ["default", "true", "false", "2"]
    ins.handle_action("remove_unit", {"fqn": L0})
    assert ins.controls["can_undo"] and not ins.controls["can_redo"]
    assert ins.handle_action("undo", {})["ok"]
    assert ins.plan.unit_of(L0) is not None and ins.controls["can_redo"]
    assert ins.handle_action("redo", {})["ok"]
    assert ins.plan.unit_of(L0) is None
    assert ins.handle_action("set_mesh", {"world": 8, "replicate": 1, "device_gib": None})["ok"]
    assert ins.mesh.world == 8 and ins.controls["world"] == 8
    assert ins.handle_action("set_mesh", {"world": 8, "replicate": 2})["ok"]
    assert ins.mesh == sv.Mesh(shard=4, replicate=2)
    before = dict(ins.controls)
    ack = ins.handle_action("set_mesh", {"world": 8, "replicate": 3})  # not a multiple: refused
    assert not ack["ok"] and "not a multiple" in ack["error"]
    assert ins.mesh.replicate == 2 and ins.controls == before
    assert "not a multiple" in ins.messages[-1]["text"]
    assert not ins.handle_action("set_mesh", {"device_gib": 0.5})["ok"]  # not more than the 1 GiB reserve
    assert ins.handle_action("set_mesh", {"device_gib": 1.5})["ok"]
    assert ins.mesh.device_memory == 3 * 1024**3 // 2 and ins.controls["device_gib"] == 1.5
    assert ins.handle_action("set_training", {"optimizer": "sgd", "param_dtype": None})["ok"]
    assert ins.training.optimizer == "sgd" and ins.training.param_dtype is None
    assert ins.controls["param_dtype"] == "" and "model dtype params" in ins.summary["training"]
    assert_numbers_match(model, ins.controller)
    ins.controller.undo()  # undo restores the training, and the controls follow
    assert ins.controls["param_dtype"] == "bfloat16" and ins.training.param_dtype == "bfloat16"
    assert ins.handle_action("set_training", {"batch_size": 2, "seq_len": 64})["ok"]
    assert (ins.training.batch_size, ins.training.seq_len) == (2, 64) and ins.controls["batch_size"] == 2
    assert "batch 2 × 64 tokens" in ins.summary["training"]
    assert not ins.handle_action("set_training", {"batch_size": 0})["ok"]
    assert ins.handle_action("set_training", {"batch_size": None})["ok"] and ins.training.batch_size is None
    assert ins.handle_action("set_rank", {"rank": 5})["ok"]
    assert ins.controller.view.rank == 5 and ins.controls["rank"] == 5
    # an edited plan is no preset: the menu says so, and choosing any preset (its base too) applies it
    assert ins.plan.name.startswith("auto (LoRA sharded), edited") and ins.controls["preset"] == ""
    assert ins.controls["presets"][0] == ["", "custom or edited plan"]
    assert ins.handle_action("apply_preset", {"name": "root-only"})["ok"]
    assert ins.plan == sv.Plan([""]) and ins.controls["preset"] == "root-only"


def test_widget_checkpoint_actions(model, ins):
    blocks = ins.controller.blocks()
    assert blocks == [L0, L1] and ins.controls["n_blocks"] == 2
    assert ins.handle_action("toggle_checkpoint", {"fqn": L0})["ok"]
    assert ins.plan.checkpoint == (L0,) and ins.controls["n_blocks_checkpointed"] == 1
    assert ins.handle_action("checkpoint_blocks", {"on": True})["ok"]
    assert set(ins.plan.checkpoint) == set(blocks) and ins.summary["n_checkpointed"] == 2
    _order, rows = ins.controller.rows()
    assert ins.handle_action("checkpoint_blocks", {"on": False})["ok"] and ins.plan.checkpoint == ()
    bad = ins.handle_action("toggle_checkpoint", {"fqn": ""})  # torch cannot wrap the root
    assert not bad["ok"] and "root" in bad["error"]
    ins.controller.reveal(Q0)
    assert ins.handle_action("apply_to_many", {"targets": group_id(ins.controller), "action": "checkpoint"})["ok"]
    assert set(ins.plan.checkpoint) == set(blocks)
    rows = {r["fqn"]: r for r in ins.controller.rows()[1].values() if r["kind"] == "module"}
    assert rows[L0]["checkpointed"] and rows[L0]["can_checkpoint"] and not rows[""]["can_checkpoint"]
    nested = ins.handle_action("toggle_checkpoint", {"fqn": Q0})  # inside a checkpointed block
    assert not nested["ok"] and "inside" in nested["error"]


def test_protocol_is_defined_once_and_checked_in_python():
    from shardviz.widget import protocol

    assert protocol.check_action("toggle_unit", {"fqn": "x"}) is None
    assert protocol.check_action("nope", {}) == "unknown action 'nope'"
    assert "takes no argument" in protocol.check_action("toggle_unit", {"fqn": "x", "evil": 1})
    assert "needs argument" in protocol.check_action("toggle_unit", {})
    assert "must be int" in protocol.check_action("expand", {"target": "x", "open": 1}) or "must be bool" in protocol.check_action("expand", {"target": "x", "open": 1})
    assert "must be number" in protocol.check_action("set_rank", {"rank": "3"})
    assert protocol.check_action("set_mesh", {"device_gib": None}) is None
    # every action the front end may send is a method of the state or handled by the widget
    for name in protocol.ACTIONS:
        assert hasattr(InspectorState, name) or name in ("set_tab", "set_torch_version", "cancel"), name
    # the front end reads the schema from the trait: no list of names of its own
    esm = _front_end()
    assert "FRONT_END_ACTIONS" not in esm and 'model.get("protocol")' in esm
    assert "model.set(" not in esm and "save_changes" not in esm  # Python writes every trait


def test_widget_refuses_unknown_actions_and_arguments(ins):
    wire = Wire(ins)
    assert not ins.handle_action("__init__", {})["ok"]
    assert not ins.handle_action("toggle_unit", {"fqn": L0, "evil": 1})["ok"]
    bad = ins.handle_action("toggle_unit", {"fqn": "nope"})
    assert not bad["ok"] and "no module named" in bad["error"]
    assert ins.view.messages[-1]["level"] == "error"
    ins._on_msg(ins.view, {"type": "mystery", "req": 3}, [])
    assert wire.msgs("ack")[-1] == {"type": "ack", "req": 3, "ok": False, "error": "unknown message type 'mystery'"}


def test_widget_export_tab_save_and_verify(model, ins, tmp_path):
    assert ins.view.code.get("stale")  # not computed until the tab is opened
    ins.view.tab = "export"
    assert ins.view.code["text"] == sv.export_code(model, ins.plan, mesh=ins.mesh, training=ins.training)
    ins.view.torch_version = "2.6"
    assert ins.view.code["text"] == sv.export_code(model, ins.plan, mesh=ins.mesh, training=ins.training, torch_version="2.6")
    target = tmp_path / "out.py"
    ack = ins.handle_action("save_code", {"path": str(target)})
    assert ack["ok"] and target.read_text() == ins.view.code["text"]
    target.write_text("# mine\n")
    ack = ins.handle_action("save_code", {"path": str(target)})
    assert not ack["ok"] and ack["exists"] and target.read_text() == "# mine\n"
    ack = ins.handle_action("save_code", {"path": str(target), "overwrite": True})
    assert ack["ok"] and target.read_text() == ins.view.code["text"]
    ins.handle_action("toggle_unit", {"fqn": Q0})  # code follows the plan while the tab is open
    assert ins.view.code["text"] == sv.export_code(model, ins.plan, mesh=ins.mesh, training=ins.training, torch_version="2.6")
    ins.handle_action("remove_unit", {"fqn": ""})  # torch would refuse: the export says why
    assert ins.view.code["error"] and "SV004" in ins.view.code["error"]
    ins.handle_action("undo", {})
    ack = ins.handle_action("verify", {})
    assert ack["ok"] and ins.view.verify_result["ok"] is True


def test_exported_code_is_highlighted_in_python_once(ins):
    """The export arrives as HTML from the one highlighter (pygments, shardviz/highlight.py), with
    its line count: the front end parses nothing, and the report uses the same function."""
    import html

    from shardviz import report
    from shardviz.highlight import python_html

    ins.view.tab = "export"
    code = ins.view.code
    assert code["html"] == python_html(code["text"]) and code["n_lines"] == len(code["text"].splitlines())
    assert html.unescape(re.sub(r"<[^>]+>", "", code["html"])) == code["text"]  # every character, escaped
    assert code["html"].count('<span class="sv-tok-kw">') > 10
    esm = _front_end()
    assert "TOKEN_RE" not in esm and "PY_KEYWORDS" not in esm and "c.html" in esm
    assert python_html("def f(): pass") in report._highlight("def f(): pass")


def test_widget_plan_file_messages(model, tmp_path):
    path = tmp_path / "p.json"
    path.write_text("garbage")
    ins = Inspector(model, mesh=MESH, plan_path=path)
    assert ins.view.summary["plan_file"]["autosave"] is False
    assert "not a valid shardviz plan" in ins.view.summary["plan_file"]["problem"]
    ins.handle_action("remove_unit", {"fqn": L0})
    assert path.read_text() == "garbage"
    ins.handle_action("overwrite_plan_file", {})
    assert saved(path) == ins.plan and ins.view.summary["plan_file"]["autosave"] is True


def test_python_api_and_figures(model, ins):
    assert ins.controller.can_undo is False
    ins.controller.make_unit(Q0)
    assert ins.plan.unit_of(Q0) is not None and ins.controller.can_undo
    fig = ins.memory_figure()
    bar = ins.controller.memory["bars"][0]
    # the plotly figure stacks the same parts, in a unit picked for the chart (KiB for the tiny model)
    assert [trace.name for trace in fig.data] == list(display.PEAK_PARTS)
    assert fig.layout.yaxis.title.text == "KiB per rank"
    total = sum(trace.y[0] for trace in fig.data) * 1024
    assert total == pytest.approx(bar["peak"])
    tfig = ins.traffic_figure()
    assert len(tfig.data) == 1 + len(ins.controller.traffic["collectives"])
    assert "make_unit" in dir(ins.controller)  # the actions are the state's; the widget forwards none
    with pytest.raises(AttributeError):
        ins.no_such_thing  # noqa: B018


# ---------------------------------------------------------------------------------------------
# the shipped front end
# ---------------------------------------------------------------------------------------------
def _front_end() -> str:
    """The front end's files (widget/front/), in the order inspector.py concatenates them."""
    front = Path(sv.__file__).parent / "widget" / "front"
    return "\n".join((front / name).read_text() for name in FRONT_FILES)


def test_front_end_files_ship_and_fetch_nothing():
    here = Path(sv.__file__).parent / "widget"
    # every file of front/ is concatenated, each once, each under 600 lines, each saying what it holds
    assert sorted(p.name for p in (here / "front").glob("*.js")) == sorted(FRONT_FILES)
    assert not (here / "inspector.esm.js").exists()
    for name in FRONT_FILES:
        text = (here / "front" / name).read_text()
        assert text.startswith("// ") and len(text.splitlines()) <= 600, name
        assert ("export default" in text) == (name == FRONT_FILES[-1]), name
    esm = _front_end()
    css = (here / "inspector.css").read_text()
    assert "export default" in esm and "function render" in esm
    assert esm.rstrip().endswith("export default { render };")
    # no imports, no URLs: nothing is fetched at run time (no CDN)
    assert not re.search(r"^\s*import\s", esm, re.MULTILINE)
    assert not re.search(r"\bimport\(", esm)
    charts = (here / "charts.js").read_text()
    assert not re.search(r"^\s*(import|export)\s", charts, re.MULTILINE)  # also a classic <script> (the report)
    urls = re.findall(r"https?://[^\s\"')]+", esm + css + charts)
    assert urls == ["http://www.w3.org/2000/svg"]  # the SVG namespace name, never fetched
    assert "@import" not in css and "url(" not in css
    assert "--jp-layout-color0" in css  # follows JupyterLab's theme
    charts = (here / "charts.js").read_text()
    assert Inspector(nn.Linear(2, 2), mesh=sv.Mesh(shard=2))._esm == charts + "\n" + esm


def test_sv_exports_inspector():
    assert sv.Inspector is Inspector


# ---------------------------------------------------------------------------------------------
# scale
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_llama70b_lora_is_quick_and_sends_little(tmp_path):
    model = zoo.llama3_70b(lora=True)  # speed: benchmarks/bench_widget.py measures it in the browser
    ins = Inspector(model, mesh=sv.Mesh(shard=64), plan_path=tmp_path / "p.json")
    st = ins.controller
    assert st.tree.n_modules > 6000
    wire = Wire(ins)
    ins._on_msg(ins.view, {"type": "hello"}, [])
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
    assert ins.view.memory["max_peak"] == int(a.memory["peak"].max())
    ins.handle_action("apply_to_many", {"targets": group_id(st), "action": "ignore_lora"})
    assert len(ins.plan.ignored) == sum(p.role == "lora" for p in st.tree.params
                                        if p.fqn.startswith("base_model.model.model.layers."))


def group_id(st):
    order, _ = st.rows()
    return next(i for i in order if i.startswith("g"))


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
    assert wire.msgs("rows")[-1]["truncated"] == st.view.truncated and ins.view.summary["truncated"] == st.view.truncated
    st.set_filter(text="")
    expert = next(f for f in st.tree.module_index if f.endswith("experts.expert_5"))
    row = st.reveal(expert)
    assert row in st.rows()[0]
    labels = [r.get("label", "") for r in st.rows()[1].values()]
    assert any("x NllbMoe" in label for label in labels)


def test_a_failing_cost_model_is_shown_not_raised(model, ins, monkeypatch):
    import shardviz.cost

    def broken(analysis):
        raise RuntimeError("boom")

    monkeypatch.setattr(shardviz.cost, "memory_table", broken)
    ack = ins.handle_action("toggle_unit", {"fqn": Q0}, req=5)
    assert ack["ok"] and ins.plan.unit_of(Q0) is not None
    assert ins.view.memory["available"] is False and "boom" in ins.view.memory["reason"]
    monkeypatch.undo()
    ins.handle_action("undo", {})
    assert ins.view.memory["available"] is True


def test_a_failing_verification_does_not_blame_torch(model, ins, monkeypatch):
    """Issue 24: verify's own KeyError on a checkpointed plan read "torch raised KeyError"."""
    import shardviz

    def broken(*args, **kwargs):
        return {}["base_model.model.model.layers.0._checkpoint_wrapped_module"]

    monkeypatch.setattr(shardviz, "verify", broken)
    result = ins.controller.verify()
    assert not result["ok"] and result["raised_by"] == "shardviz" and result["error"].startswith("KeyError")

    def refused(*args, **kwargs):
        import torch

        torch.nn.Linear(2, 2).get_submodule("nope")  # raised inside torch (nn/modules/module.py)

    monkeypatch.setattr(shardviz, "verify", refused)
    assert ins.controller.verify()["raised_by"] == "torch"
