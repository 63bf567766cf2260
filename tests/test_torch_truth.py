"""The harness in ``torch_truth.py`` fails where it should: every c10d op a step issues is logged,
and a kind the prediction does not have is a mismatch."""

from __future__ import annotations

import torch
import torch.distributed as dist

import shardviz as sv
from torch_truth import comm_mismatches, fake_run, tiny_lora

FSDP4 = sv.Mesh(shard=4)


def lora_that_broadcasts():
    """The tiny Llama + LoRA whose every forward also broadcasts 16 float32 values from rank 0."""
    model = tiny_lora()
    model.register_forward_pre_hook(lambda *_: dist.broadcast(torch.zeros(16), src=0))
    return model


def test_a_collective_shardviz_does_not_model_is_a_mismatch():
    model = tiny_lora()
    plan = sv.Plan.auto(model, lora="sharded")
    analysis = sv.analyze(model, plan, FSDP4, sv.Training())
    assert not comm_mismatches(analysis, fake_run(tiny_lora, plan, FSDP4, sv.Training(), 0))
    truth = fake_run(lora_that_broadcasts, plan, FSDP4, sv.Training(), 0)
    broadcasts = [c for c in truth.collectives if c["collective"] == "broadcast_"]
    assert [(c["phase"], c["group_size"], c["dtype"], c["bytes"]) for c in broadcasts] == [("forward", 4, "float32", 64)]
    problems = comm_mismatches(analysis, truth)
    assert any("'broadcast_', a kind the prediction does not have" in p for p in problems), problems
