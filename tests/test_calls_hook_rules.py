"""FSDP2's hook rules (``shardviz/step/calls.py``) against torch: which calls are roots, and which
calls get a pre-backward, read off a real step of the tiny Llama under the fake process group."""

from __future__ import annotations

import torch

import shardviz as sv
from shardviz import zoo
from shardviz.step.calls import enclosing_root, roots
from fsdp_steps import WORLD, recorded_step

L = "model.layers."


def _only_embedding_trains() -> torch.nn.Module:
    """Every parameter frozen but the embedding: the blocks' outputs still need a gradient (it flows
    through them to the embedding), so torch runs their pre-backwards."""
    model = zoo.tiny_llama_lora(lora=False)
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith("model.embed_tokens"))
    return model


def _torch_step(model, plan: sv.Plan) -> tuple[dict, set]:
    """One real step (after a warm-up): each call's ``_is_root``, and the calls whose pre-backward ran."""
    ran: set = set()

    def pre_backward(saved, label_of):
        def hook(self, *args, **kwargs):
            ran.add(label_of(self))
            return saved(self, *args, **kwargs)
        return hook

    states = recorded_step(model, plan, {"pre_backward": pre_backward})
    return {name: bool(s._is_root) for name, s in states.items()}, ran


def test_calls_get_a_pre_backward_where_torch_runs_one():
    """The blocks hold no trainable parameter, the root's embedding does: the blocks still get a
    pre-backward (``Call.out_grad``), and the step time computes their backward."""
    plan = sv.Plan(units=[L + "0", L + "1", ""])
    _, ran = _torch_step(_only_embedding_trains(), plan)
    a = sv.analyze(_only_embedding_trains(), plan, sv.Mesh(WORLD, device="H100"), sv.Training(batch_size=2, seq_len=16))
    predicted = {u.name for u in a.costs.units if u.out_grad}  # the calls with a parameter group
    assert predicted == ran == {u.name for u in plan.units}
    backward = {unit for kind, unit in a.step_time.schedule.issue_order if kind == "backward"}
    assert backward == ran


def test_a_frozen_call_before_every_trainable_parameter_gets_no_pre_backward():
    """LoRA: the embedding call holds no trainable parameter and runs first; torch runs no
    pre-backward for it."""
    model = zoo.tiny_llama_lora()
    plan = sv.Plan.auto(model, lora="sharded")
    _, ran = _torch_step(zoo.tiny_llama_lora(), plan)
    a = sv.analyze(model, plan, sv.Mesh(WORLD))
    assert {u.name for u in a.costs.units if u.out_grad} == ran  # the calls with a parameter group
    assert any(not u.out_grad for u in a.costs.units)


def test_roots_and_the_enclosing_root_are_torchs():
    """With a call on the whole model it is the one root; without one, every outermost call is a
    root of its own (``FSDPState._lazy_init``) and there is no enclosing root."""
    model = _only_embedding_trains()
    tree = sv.ModelTree(model)
    with_root = sv.Plan(units=[L + "0", L + "1", ""])
    for plan, root in ((with_root, with_root.units[-1].name), (sv.Plan(units=[L + "0", L + "1"]), None)):
        a = sv.analyze(tree, plan, sv.Mesh(WORLD))
        is_root, _ = _torch_step(_only_embedding_trains(), plan)
        root_of = roots(a.layout)
        assert {u.name: root_of[i] == i for i, u in enumerate(plan.units)} == is_root
        found = enclosing_root(a.layout)
        assert (plan.units[found].name if found is not None else None) == root
