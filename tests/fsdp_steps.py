"""One real FSDP2 step of a model under a plan, on torch's fake process group, with
``FSDPParamGroup`` methods wrapped to record what torch does (the truth tests of the step's hooks)."""

from __future__ import annotations

from typing import Callable

import shardviz as sv
from shardviz import zoo
from shardviz.export.oracle import apply_plan, device_mesh, fake_process_group

WORLD = 4


def recorded_step(model, plan: sv.Plan, wrappers: dict[str, Callable], world: int = WORLD) -> dict:
    """Shards ``model`` under ``plan``, runs a warm-up step (lazy init), then one step with each
    ``FSDPParamGroup`` method ``name`` replaced by ``wrappers[name](original, label_of)``
    (``label_of(group)``: the plan call whose group it is). Returns each call's ``FSDPState``."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    with fake_process_group(0, world):
        apply_plan(model, plan, device_mesh(sv.Mesh(world)), training=sv.Training())
        states = {u.name: fully_shard.state(model.get_submodule(u.modules[0])) for u in plan.units}
        labels = {id(g): name for name, s in states.items() for g in s._fsdp_param_groups}
        ids = zoo.tiny_batch()["input_ids"]
        saved = {name: getattr(FSDPParamGroup, name) for name in wrappers}
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()  # lazy init
        for name, wrap in wrappers.items():
            setattr(FSDPParamGroup, name, wrap(saved[name], lambda group: labels[id(group)]))
        try:
            model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        finally:
            for name, fn in saved.items():
                setattr(FSDPParamGroup, name, fn)
    return states
