"""Plan validation, JSON round trips, presets: bad input is named, nothing is changed."""

import copy
import json

import pytest

import shardviz as sv
from handmade import Nested, Odd, Tied


def snapshot(model):
    return {n: (id(p), tuple(p.shape), p.requires_grad, p.device.type) for n, p in model.named_parameters()}


@pytest.mark.parametrize(
    "plan,pattern",
    [
        (lambda: sv.Plan(["a", "bb"]), r"units\[1\]: no module named 'bb'.*Closest existing names: 'b'"),
        (lambda: sv.Plan(["a.weight"]), r"'a.weight' is a parameter; units name modules \(did you mean 'a'"),
        (lambda: sv.Plan([""], ignored=["a.wieght"]), r"ignored: no parameter named 'a.wieght'.*'a.weight'"),
        (lambda: sv.Plan([""], ignored=["a"]), r"'a' is a module; list its parameters \(e.g. 'a.weight'\)"),
    ],
    ids=["unknown-module", "param-as-unit", "unknown-ignored", "module-as-ignored"],
)
def test_bad_names_are_named_and_nothing_changes(plan, pattern):
    model = Odd()
    before = snapshot(model)
    p = plan()
    frozen = copy.deepcopy(p)
    with pytest.raises(ValueError, match=pattern):
        sv.analyze(model, p, sv.Mesh(2))
    assert p == frozen and snapshot(model) == before


def test_module_in_two_units():
    with pytest.raises(ValueError, match=r"module 'a' is in two units \(units\[0\] and units\[1\]\)"):
        sv.Plan(["a", ["b", "a"]])


def test_same_module_under_two_names_in_two_units():
    model = Odd()
    model.alias = model.a  # one module reachable as "a" and "alias"
    with pytest.raises(ValueError, match=r"'alias' is the same module as 'a'"):
        sv.analyze(model, sv.Plan(["a", "alias"]), sv.Mesh(2))


def test_edits_return_new_plans():
    plan = sv.Plan(["a", ""])
    plan2 = plan.with_unit("b").with_ignored(["c.weight"])
    assert plan.units == (sv.Unit("a"), sv.Unit(""))
    assert [u.modules for u in plan2.units] == [("a",), ("",), ("b",)] and plan2.ignored == ("c.weight",)
    assert plan2.without_unit("b").without_ignored(["c.weight"]) == plan
    plan3 = plan.with_unit_options("a", reshard_after_forward=False)
    assert plan3.unit_of("a").reshard_after_forward is False and plan.unit_of("a").reshard_after_forward is None
    with pytest.raises(ValueError, match="'zz' is not in any unit"):
        plan.without_unit("zz")


@pytest.mark.parametrize(
    "kwargs,pattern",
    [
        ({"reshard_after_forward": "yes"}, "reshard_after_forward of unit"),
        ({"reshard_after_forward": 0}, "a divisor of the shard size"),
        ({"param_dtype": "fp8"}, r"param_dtype='fp8'"),
    ],
)
def test_bad_unit_options(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        sv.Unit("a", **kwargs)


def test_json_round_trip():
    plan = sv.Plan(
        ["a", ["b", "c"], sv.Unit("", reshard_after_forward=False, param_dtype="bfloat16", reduce_dtype="float32")],
        ignored=["scale"],
        name="mine",
    )
    text = plan.to_json()
    assert '"version": 1' in text and '"schema": "shardviz.plan"' in text
    again = sv.Plan.from_json(text)
    assert again == plan and again.name == "mine"


def test_what_an_edited_name_counts_travels_as_data():
    """An Inspector's "<base>, edited: N changes" is written with ``Plan.edited`` beside it, so a plan
    read back counts on from the data, not from its name (issue 25)."""
    from shardviz.plan import Edited

    plan = sv.Plan(["a", ""], name="auto (LoRA sharded), edited: 2 changes", edited=Edited("auto (LoRA sharded)", 2))
    obj = json.loads(plan.to_json())
    assert obj["version"] == 2 and obj["edited"] == {"base": "auto (LoRA sharded)", "edits": 2}
    again = sv.Plan.from_json(plan.to_json())
    assert again == plan and again.edited == plan.edited and again.name == plan.name
    assert again.with_ignored(["a.weight"]).edited == plan.edited  # same name, same meaning
    assert again.renamed("mine").edited is None  # another name counts nothing
    assert sv.Plan.from_json(sv.Plan(["a"], name="x, edited: 2 changes").to_json()).edited is None  # never parsed


@pytest.mark.parametrize(
    "text,pattern",
    [
        ("{not json", "not valid JSON"),
        ("[]", "must be an object"),
        ('{"schema": "other", "version": 1}', "field 'schema' must be 'shardviz.plan'"),
        ('{"schema": "shardviz.plan", "version": 99, "units": []}', "field 'version' is 99; this shardviz reads versions 1 and 2"),
        ('{"schema": "shardviz.plan", "version": 1, "units": {}}', "field 'units' must be a list"),
        ('{"schema": "shardviz.plan", "version": 1, "units": [3]}', r"units\[0\]: expected a module FQN"),
        ('{"schema": "shardviz.plan", "version": 1, "units": [{"modules": ["a"], "colour": 1}]}', r"unknown field\(s\) \['colour'\]"),
        ('{"schema": "shardviz.plan", "version": 1, "ignored": [1]}', "field 'ignored' must be a list"),
        ('{"schema": "shardviz.plan", "version": 1, "extra": 1}', r"unknown field\(s\) \['extra'\]"),
        ('{"schema": "shardviz.plan", "version": 1, "edited": {"base": "a", "edits": 1}}', r"unknown field\(s\) \['edited'\]"),
        ('{"schema": "shardviz.plan", "version": 2, "edited": {"base": "a", "edits": -1}}', "field 'edited' must be"),
        ('{"schema": "shardviz.plan", "version": 2, "edited": {"base": "a"}}', "field 'edited' must be"),
    ],
)
def test_json_rejects_what_it_cannot_read(text, pattern):
    with pytest.raises(ValueError, match=pattern):
        sv.Plan.from_json(text)


def test_application_order_is_bottom_up_whatever_the_plan_order():
    a = sv.analyze(Nested(), sv.Plan(["", "outer", "outer.1", "outer.1.0", "last"]), sv.Mesh(2))
    order = list(a.units.unit)
    assert order.index("outer.1.0") < order.index("outer.1") < order.index("outer") < order.index("<root>")


def test_tied_embedding_joins_head_group_in_preset():
    from transformers import LlamaConfig, LlamaForCausalLM

    import torch

    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                                             tie_word_embeddings=True))
    plan = sv.Plan.auto(model)
    names = [u.modules for u in plan.units]
    assert ("model.embed_tokens", "model.norm", "lm_head") in names
    assert names[-1] == ("",) and names[0] == ("model.layers.0",)
    assert sv.verify(model, plan, mesh=sv.Mesh(4)).empty


def test_auto_rejects_unknown_layout():
    with pytest.raises(ValueError, match="lora='whole'"):
        sv.Plan.auto(Tied(), lora="whole")


# -- checkpointing policies (issue 18) -----------------------------------------------------------
def test_checkpoint_mapping_keeps_policies_and_a_list_means_full():
    listed = sv.Plan([""], checkpoint=["a", "b"])
    mapped = sv.Plan([""], checkpoint={"a": "full", "b": "selective"})
    assert listed.checkpoint == ("a", "b") and listed.checkpoint.policies == ("full", "full")
    assert list(mapped.checkpoint) == ["a", "b"] and "b" in mapped.checkpoint and len(mapped.checkpoint) == 2
    assert mapped.checkpoint.policy("b") == "selective" and mapped.checkpoint.selective == ("b",)
    assert mapped.checkpoint != ("a", "b") and mapped != listed  # a policy is part of the plan
    assert sv.Plan([""], checkpoint={"a": "full", "b": "full"}) == listed
    assert len({listed, mapped, sv.Plan([""], checkpoint=("a", "b"))}) == 2  # hashable, equal plans hash alike
    assert copy.deepcopy(mapped) == mapped and copy.deepcopy(mapped).checkpoint.selective == ("b",)


def test_checkpoint_edits_keep_and_change_policies():
    plan = sv.Plan([""], checkpoint={"a": "selective"})
    more = plan.with_checkpoint(["b"])
    assert more.checkpoint.items() == [("a", "selective"), ("b", "full")]
    assert more.with_checkpoint(["a"], policy="full").checkpoint.policy("a") == "full"
    assert more.without_checkpoint(["b"]) == plan and plan.checkpoint.policy("a") == "selective"
    assert sv.Plan(plan.units, plan.ignored, "renamed", plan.checkpoint) == plan  # callers that rebuild keep it


@pytest.mark.parametrize("checkpoint,pattern", [
    ({"a": "partial"}, r"checkpoint\['a'\]: policy 'partial' is not one of \('full', 'selective'\)"),
    ({"a": None}, r"checkpoint\['a'\]: policy None"),
    ([3], "checkpoint entries must be module FQNs"),
])
def test_bad_checkpoint_policies_are_named(checkpoint, pattern):
    with pytest.raises(ValueError, match=pattern):
        sv.Plan([""], checkpoint=checkpoint)


def test_checkpoint_json_writes_a_mapping_only_for_selective():
    full = sv.Plan(["a", ""], checkpoint=["a"])
    assert full.to_dict()["checkpoint"] == ["a"]  # schema v1 as before
    mixed = sv.Plan(["a", "b", ""], checkpoint={"a": "full", "b": "selective"})
    assert mixed.to_dict()["checkpoint"] == {"a": "full", "b": "selective"}
    assert sv.Plan.from_json(mixed.to_json()) == mixed and sv.Plan.from_json(full.to_json()) == full
    old = '{"schema": "shardviz.plan", "version": 1, "units": ["a", ""], "ignored": [], "checkpoint": ["a"]}'
    assert sv.Plan.from_json(old) == full
    bad = '{"schema": "shardviz.plan", "version": 1, "units": [""], "checkpoint": {"a": "some"}}'
    with pytest.raises(ValueError, match=r"plan JSON: field checkpoint\['a'\]: policy 'some'"):
        sv.Plan.from_json(bad)
    with pytest.raises(ValueError, match="field 'checkpoint' must be a list of module FQNs or an object"):
        sv.Plan.from_json('{"schema": "shardviz.plan", "version": 1, "units": [""], "checkpoint": "a"}')


def test_selective_checkpointing_is_measured_and_exported():
    """Issue 18: "selective" is measured (between full checkpointing and none) and exported;
    tests/test_activation_truth.py and tests/test_flops_truth.py check the numbers against torch."""
    from shardviz import zoo

    model = zoo.tiny_llama_lora()
    model.config.use_cache = False  # with the cache, torch's selective checkpointing raises (SV113)
    training = sv.Training(batch_size=1, seq_len=64, param_dtype=None, reduce_dtype=None)
    activations = {ck: int(sv.analyze(model, sv.Plan.auto(model, checkpoint=ck), sv.Mesh(2), training)
                           .memory.activations.max()) for ck in (None, "selective", "blocks")}
    assert activations["blocks"] < activations["selective"] < activations[None]
    plan = sv.Plan.auto(model, checkpoint="selective")
    code = sv.export_code(model, plan, mesh=sv.Mesh(2), torch_version="2.5")
    assert "SELECTIVE = (" in code and "dict.fromkeys(SELECTIVE, _selective_checkpoint_context)" in code
    assert "create_selective_checkpoint_contexts" in code


def test_checkpoint_none_is_nothing_and_junk_is_named():
    """``Plan(checkpoint=None)`` checkpoints nothing, as ``Plan.auto(checkpoint=None)`` does; a value
    that is not a list of names is refused with the field named, not a TypeError."""
    assert sv.Plan(units=["model"], checkpoint=None).checkpoint == ()
    with pytest.raises(ValueError, match="checkpoint must be module FQNs.*5"):
        sv.Plan(units=["model"], checkpoint=5)
