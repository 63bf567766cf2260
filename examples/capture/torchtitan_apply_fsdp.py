"""A torchtitan-style ``apply_fsdp`` through ``sv.capture``, unchanged from what a GPU cluster runs.

As torchtitan's ``parallelize_llama`` does: its own ``"cuda"`` mesh, ``torch.cuda.set_device``,
activation checkpointing on every block, a ``MixedPrecisionPolicy(bf16, fp32)`` on each call, the
blocks one call each (the last kept unsharded after forward), ``[norm, output]`` one call, then the
root, and explicit forward prefetch. ``sv.capture`` runs it on a meta copy under the fake process
group on this CPU machine and reads every setting back from torch.

Run: python examples/capture/torchtitan_apply_fsdp.py
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import shardviz as sv


def apply_fsdp(model):
    torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())
    mesh = init_device_mesh("cuda", (dist.get_world_size(),), mesh_dim_names=("dp_shard",))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    inner = model.base_model.model
    layers = inner.model.layers
    for i, block in enumerate(layers):
        layers[i] = checkpoint_wrapper(block)
    for i, block in enumerate(layers):
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=i < len(layers) - 1)
    fully_shard(inner.model.embed_tokens, mesh=mesh, mp_policy=mp)
    fully_shard([inner.model.norm, inner.lm_head], mesh=mesh, mp_policy=mp, reshard_after_forward=False)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    for block, following in zip(layers, layers[1:]):
        block.set_modules_to_forward_prefetch([following])


def main():
    model = sv.zoo.llama3_8b()  # + LoRA, meta device
    plan = sv.capture(apply_fsdp, model, world_size=64)
    print(plan, f"prefetch overrides: {len(plan.prefetch)}")
    analysis = sv.analyze(model, plan, sv.Mesh(64), sv.Training(batch_size=1, seq_len=4096))
    print(analysis.memory[["peak"]].max())
    for finding in analysis.findings:
        print(" ", finding)
    return plan


if __name__ == "__main__":
    main()
