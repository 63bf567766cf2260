"""The Inspector's start and its plan edits (calls, reshard_after_forward, ignored and LoRA
parameters, one action over many modules, presets, a plan set whole): each checked on the state
it leaves and on the numbers, which must equal ``sv.analyze`` run afresh on the resulting plan.
"""

from __future__ import annotations

import pytest

import shardviz as sv
from shardviz.presets import preset_key
from shardviz.widget import InspectorState, plan_actions
from shardviz.widget.controller import BlockAction, Change
from widget_helpers import EMBED, L0, L1, MESH, Q0, Q0_A, Q0_BASE, assert_numbers_match, fresh, open_and_get, open_path, rows_by_fqn


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


def test_apply_to_type(model, st):
    st.apply_to_type("Linear", "make_unit", within=L0 + ".mlp")
    mlp_linears = [f for f in st.tree.module_index if f.startswith(L0 + ".mlp") and st.tree.module(f).type_name == "Linear"]
    assert mlp_linears and all(st.plan.unit_of(f) is not None for f in mlp_linears)
    assert_numbers_match(model, st)
    st.apply_to_type(L0, "ignore_lora")  # by one FQN of the type: every LlamaDecoderLayer
    assert set(st.plan.ignored) == set(st.lora_params(L0) + st.lora_params(L1))
    with pytest.raises(ValueError, match="no module of type"):
        st.apply_to_type("Conv2d", "make_unit")


@pytest.mark.parametrize("preset", ["sharded", "ignored", "separate", "root-only", "no-calls"])
def test_presets(model, st, preset):
    st.remove_unit(L0)
    st.apply_preset(preset)
    expected = {
        "sharded": sv.Plan.auto(model, lora="sharded"),
        "ignored": sv.Plan.auto(model, lora="ignored"),
        "separate": sv.Plan.auto(model, lora="separate"),
        "root-only": sv.Plan([""]),
        "no-calls": sv.Plan([]),
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


def test_an_edit_is_a_plain_function_of_the_state_that_changes_nothing(st):
    before, steps = st.plan, len(st._history)
    plan = plan_actions.make_unit(st, Q0)
    assert plan.unit_of(Q0) is not None and st.plan is before and len(st._history) == steps
    st.make_unit(Q0)  # the state's method makes that plan current, as one undo step
    assert st.plan.units == plan.units and len(st._history) == steps + 1


def test_apply_to_many_takes_a_block_action(st):
    assert BlockAction.parse("remove_unit") is BlockAction.REMOVE_UNIT
    st.apply_to_many([L0, L1], BlockAction.REMOVE_UNIT)
    assert st.plan.unit_of(L0) is None and st.plan.unit_of(L1) is None
    st.apply_to_many([L0, L1], BlockAction.CHECKPOINT)
    assert st.plan.checkpoint == (L0, L1)
    before = st.plan
    with pytest.raises(ValueError, match="'make_units': expected one of .*'make_unit'"):
        st.apply_to_many([L0], "make_units")
    assert st.plan is before


def test_listeners_hear_what_changed_as_a_change_flag(st):
    heard = []
    st.observe(heard.append)
    st.remove_unit(L0)
    st.expand("base_model")
    st.reveal(Q0_A)
    st.pin()
    st.say("info", "hello")
    assert heard == [Change.STATE, Change.ROWS, Change.ROWS | Change.REVEAL, Change.PIN, Change.MESSAGES]


def test_an_edit_keeps_the_plans_tensor_parallel_entries():
    """A plan with tensor parallelism, edited in the Inspector (a call removed), still
    parallelizes the same modules: the edit changes the call, not the TP plan."""
    from shardviz import zoo

    m = zoo.tiny_llama_lora()
    plan = sv.Plan.auto(m, tensor_parallel=True)
    state = InspectorState(m, plan=plan, mesh=sv.Mesh(shard=2, tensor=2))
    state.remove_unit(plan.units[0].name)
    assert state.plan.tensor_parallel.to_obj() == plan.tensor_parallel.to_obj()
    assert plan.units[0] not in state.plan.units


def test_a_preset_keeps_each_checkpointed_modules_policy(model):
    """The kept checkpointing keeps its policy: a selective block stays selective (before, the kept
    names were re-read as plain names, so every one became "full" while the message said "kept")."""
    st = InspectorState(model, plan=sv.Plan.auto(model, checkpoint="selective"), mesh=MESH)
    before = st.plan.checkpoint
    assert before.selective
    st.apply_preset("ignored")
    assert st.plan.checkpoint == before and st.plan.checkpoint.selective == before.selective
    assert "keeps your checkpointing" in st.messages[-1]["text"]
    assert_numbers_match(model, st)


def test_on_a_tensor_parallel_mesh_a_preset_keeps_the_tensor_parallel_plan(model):
    """On 2 x TP 2 a preset replaces the FSDP calls and keeps the TP entries the mesh runs (before,
    it dropped them: a 2-D mesh left with FSDP alone), and the menu shows the preset the plan is.
    The tree's per-rank bytes are the TP-local shards' (``assert_numbers_match``: before, the
    model's full shapes, about twice a rank's bytes on TP 2)."""
    mesh = sv.Mesh(shard=2, tensor=2)
    st = InspectorState(model, plan=sv.Plan.auto(model, tensor_parallel=True), mesh=mesh)
    tp = st.plan.tensor_parallel
    assert tp and preset_key(st.tree, st.plan) == "sharded"
    st.apply_preset("ignored")
    assert st.plan == sv.Plan.auto(model, lora="ignored", tensor_parallel=True) and st.plan.tensor_parallel == tp
    assert preset_key(st.tree, st.plan) == "ignored"
    assert_numbers_match(model, st)
