"""torchtune's ``shard_model`` through ``sv.capture``: what its recipes shard, read back from torch.

torchtune 0.6.1 imports torchao at module level and pins torchdata, so it is not installed beside
shardviz here; ``shard_model`` below does what torchtune 0.6.1's ``torchtune.training.shard_model``
does with its default shard condition (``get_shard_conditions``): walking the named modules bottom-up,
a ``fully_shard`` on every ``...layers.<i>`` and on every name in ``custom_sharded_layers``, then the
root, with ``reshard_after_forward`` and ``CPUOffloadPolicy`` for all, and no mixed-precision policy.
With torchtune installed, pass ``torchtune.training.shard_model`` itself (see ``main``).

Run: python examples/capture/torchtune_shard_model.py
"""

from __future__ import annotations

from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

import shardviz as sv


def is_layer_or_named(name: str, names_to_match=None) -> bool:
    """``layers.<i>`` at any depth, or a name the recipe lists (``custom_sharded_layers``)."""
    if names_to_match and name in names_to_match:
        return True
    parts = name.split(".")
    return len(parts) >= 2 and parts[-2] == "layers" and parts[-1].isdigit()


def shard_model(model, custom_sharded_layers=None, *, cpu_offload=False, reshard_after_forward=True):
    kwargs = {"reshard_after_forward": reshard_after_forward}
    if cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    sharded = 0
    for name, module in reversed(list(model.named_modules())):
        if is_layer_or_named(name, custom_sharded_layers):
            fully_shard(module, **kwargs)
            sharded += 1
    if not sharded:
        raise ValueError("No layer modules were sharded")
    fully_shard(model, **kwargs)


def main():
    try:  # torchtune's own, when it is installed
        from torchtune.training import get_shard_conditions
        from torchtune.training import shard_model as tune_shard_model

        def recipe(model):
            conditions = [lambda n, m: get_shard_conditions(n, m, ["base_model.model.model.embed_tokens"])]
            tune_shard_model(model, conditions, cpu_offload=False, reshard_after_forward=True)
    except ImportError:
        def recipe(model):
            shard_model(model, ["base_model.model.model.embed_tokens"])

    model = sv.zoo.llama3_8b()  # + LoRA, meta device
    plan = sv.capture(recipe, model, world_size=8)
    print(plan, "\n", [u.name for u in plan.units][-3:])
    analysis = sv.analyze(model, plan, sv.Mesh(8), sv.Training(param_dtype="bfloat16"))
    for finding in analysis.findings:
        print(" ", finding)
    return plan


if __name__ == "__main__":
    main()
