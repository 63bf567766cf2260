"""``a.peak_breakdown()`` (the stacked bar of the widget, the report and ``compare``) against
torch: each kind equals the bytes ``FSDPMemTracker`` files under the matching categories at its
state peak, to the byte (``torch_truth.BREAKDOWN_TO_TRACKER`` maps them). A real step on one rank
of an 8-rank fake process group; the peak with activations is checked the same way in
``test_activation_truth.py``."""

from __future__ import annotations

import functools

import pytest

import shardviz as sv
from torch_truth import breakdown_mismatches, fake_run, tiny_lora

FSDP8 = sv.Mesh(shard=8)
HSDP = sv.Mesh(shard=4, replicate=2)


def blocks_with(lora, **options):
    def make(model):
        plan = sv.Plan.auto(model, lora=lora)
        for unit in plan.units:
            if unit.modules[0].split(".")[-2:-1] == ["layers"]:
                plan = plan.with_unit_options(unit.modules[0], **options)
        return plan

    return make


def no_root(model):
    return sv.Plan([m for m, _ in model.named_modules() if m.rsplit(".", 1)[0].endswith("layers") and m[-1].isdigit()])


# name: (plan maker, mesh, training, rank); where each peaks (shardviz and torch agree):
CASES = {
    "lora-sharded": (lambda m: sv.Plan.auto(m, lora="sharded"), FSDP8, sv.Training(), 7),  # backward, layers.0
    "lora-ignored-hsdp": (lambda m: sv.Plan.auto(m, lora="ignored"), HSDP, sv.Training(), 5),  # backward, whole LoRA
    "reshard-false": (blocks_with("sharded", reshard_after_forward=False), FSDP8, sv.Training(), 0),  # forward, head
    "reshard-int": (blocks_with("sharded", reshard_after_forward=4), FSDP8, sv.Training(), 7),  # post-forward shards
    "no-root-call": (no_root, FSDP8, sv.Training(), 0),  # unmanaged parameters whole
    "bf16": (lambda m: sv.Plan.auto(m, lora="sharded"), FSDP8, sv.Training(param_dtype="bfloat16"), 0),
}


@functools.lru_cache(maxsize=None)
def _case(name):
    make_plan, mesh, training, rank = CASES[name]
    model = tiny_lora()
    plan = make_plan(model)
    return plan, mesh, training, rank, sv.analyze(model, plan, mesh, training)


@pytest.mark.parametrize("name", list(CASES))
def test_peak_breakdown_matches_torch(name):
    plan, mesh, training, rank, analysis = _case(name)
    truth = fake_run(tiny_lora, plan, mesh, training, rank)
    problems = breakdown_mismatches(analysis, truth, rank, activations=False, post_forward_shards=name == "reshard-int")
    assert not problems, "\n".join(problems) + f"\npredicted {analysis.peak_breakdown(rank)}\ntorch {truth.state_peak_snap}"
