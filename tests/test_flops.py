"""``activations.flops``' per-call sums (``unit_flops``, ``op_costs_per_call``): kept with the profile
for the calls they were made for, so the plans a search prices with the same calls (HSDP splits,
reshard and offload options) share one sum, and it is the sum made afresh. Torch's FLOP counts
themselves: test_flops_truth.py."""

from __future__ import annotations

from dataclasses import replace

import shardviz as sv
from shardviz import zoo
from shardviz.activations import op_costs_per_call, unit_flops

TRAINING = sv.Training(batch_size=1, seq_len=64)


def test_plans_with_the_same_calls_share_one_sum_and_it_is_the_fresh_sum():
    model = zoo.tiny_llama_lora()
    plan = sv.Plan.auto(model)
    mesh = sv.Mesh(4, device="H100")
    a = sv.analyze(model, plan, mesh, TRAINING)
    b = sv.analyze(model, plan, replace(mesh, shard=2, replicate=2), TRAINING)
    assert a.step.step_time_s and b.step.step_time_s  # both read the flops and op costs per call
    profile = a.activation_profile
    assert b.activation_profile is profile
    assert len(profile.unit_sums) == 2  # the FLOPs and the op costs of these calls, once for both meshes
    fresh = replace(profile)  # the same profile, nothing kept
    assert not fresh.unit_sums
    assert unit_flops(profile, plan.units) == unit_flops(fresh, plan.units)
    assert op_costs_per_call(profile, plan.units) == op_costs_per_call(fresh, plan.units)
    other = sv.Plan.auto(model, lora="separate")  # other calls: a sum of their own
    assert unit_flops(profile, other.units) == unit_flops(replace(profile), other.units) != unit_flops(fresh, plan.units)
    assert len(profile.unit_sums) == 3
