"""One truth case whose FSDP2 set-up is written by hand here, not by shardviz (neither the oracle's
``apply_plan`` nor ``export_code``): the tiny Llama + LoRA with its adapters kept out of FSDP, one
``fully_shard`` call per block (``ignored_params``: the block's adapters), on the embeddings, on
``[norm, lm_head]`` and on the root; the adapters broadcast once, and their gradients averaged by
one all-reduce per backward. A real step on ranks 0 and 7 of an 8-rank fake process group must
match shardviz's prediction for the same plan: where every parameter lives and its local shape,
the model-state bytes and peak (to the byte), and every collective."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

import shardviz as sv
from torch_truth import comm_mismatches, fake_run, memory_mismatches, tiny_lora

MESH = sv.Mesh(shard=8)
PREFIX = "base_model.model."


def plan_for(model) -> sv.Plan:
    """The plan the hand-written calls below make, spelled out (not Plan.auto)."""
    layers = [f"{PREFIX}model.layers.{i}" for i in range(len(model.base_model.model.model.layers))]
    lora = [n for n, _ in model.named_parameters() if "lora_" in n]
    return sv.Plan(layers + [f"{PREFIX}model.embed_tokens", [f"{PREFIX}model.norm", f"{PREFIX}lm_head"], ""],
                   ignored=lora)


def apply_by_hand(model, mesh):
    from torch.distributed.fsdp import fully_shard

    inner = model.base_model.model
    lora = [p for n, p in model.named_parameters() if "lora_" in n]
    for layer in inner.model.layers:
        fully_shard(layer, mesh=mesh, ignored_params={p for p in layer.parameters() if any(p is q for q in lora)})
    fully_shard(inner.model.embed_tokens, mesh=mesh)
    fully_shard([inner.model.norm, inner.lm_head], mesh=mesh)
    fully_shard(model, mesh=mesh)  # the blocks' calls already keep the adapters out of its reach

    world = dist.get_world_size()
    with torch.no_grad():  # the same adapters on every rank
        flat = torch.cat([p.reshape(-1) for p in lora])
        dist.broadcast(flat, src=0)
        offset = 0
        for p in lora:
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()

    @torch.no_grad()
    def average():
        # one flat all-reduce: every adapter gradient, then one "had a gradient" flag per adapter
        # (the buffer a.comm assumes, the flags let a rank without a gradient count as zero)
        queued[0] = False
        flat = torch.cat([p.grad.reshape(-1) for p in lora] + [torch.ones(len(lora))])
        dist.all_reduce(flat)
        offset = 0
        for p in lora:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p) / world)
            offset += p.numel()

    queued = [False]

    def queue(_):
        if not queued[0]:
            queued[0] = True
            torch.autograd.Variable._execution_engine.queue_callback(average)

    for p in lora:
        p.register_post_accumulate_grad_hook(queue)


@pytest.mark.parametrize("rank", [0, 7])
def test_hand_written_fsdp_matches_prediction(rank):
    model = tiny_lora()
    plan = plan_for(model)
    training = sv.Training(param_dtype=None, reduce_dtype=None)  # AdamW, no mp_policy (as the code above)
    analysis = sv.analyze(model, plan, MESH, training)
    placed = {}

    def placement(trained):
        for fqn, p in trained.named_parameters():
            placed[fqn] = ("sharded", tuple(p.to_local().shape)) if isinstance(p, DTensor) else ("whole", tuple(p.shape))

    truth = fake_run(tiny_lora, plan, MESH, training, rank, apply=apply_by_hand, inspect=placement)
    status = analysis.params.set_index("fqn").status
    predicted = {fqn: ("sharded" if status[fqn] == "sharded" else "whole", tuple(analysis.local_shape(fqn, rank)))
                 for fqn in placed}
    assert predicted == placed
    assert sum(s == "whole" for s, _ in placed.values()) == len(plan.ignored) == 28
    problems = memory_mismatches(analysis, truth) + comm_mismatches(analysis, truth)
    assert not problems, "\n".join(problems)
    kinds = sorted({c["collective"] for c in truth.collectives})
    assert kinds == ["all_gather", "all_reduce"]  # LoRA out of FSDP: no reduce-scatter at all
