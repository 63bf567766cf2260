"""The Inspector's mesh and training edits: plain functions of its state (``InspectorState``: its
``tree``, ``plan``, ``mesh`` and ``training``) that return the new values and change nothing.

Each returns a ``SetupEdit`` of (plan, mesh, training), None where that part stays; ``InspectorState``
makes it current as one undo step. A bad value raises ``ValueError`` naming the field.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

from ..run.mesh import Mesh
from ..plan import Plan


class SetupEdit(NamedTuple):
    plan: Plan | None = None
    mesh: Mesh | None = None
    training: Any = None


def mesh_edit(state, world: int | None = None, replicate: int | None = None, device_memory=...,
              shard: int | None = None, **fields) -> SetupEdit:
    """The mesh with ``world`` ranks in all, ``replicate`` HSDP copies (shard = world / replicate);
    ``device_memory``: bytes, "80GiB", or None for no limit. Other ``sv.Mesh`` fields pass through."""
    cur = state.mesh
    replicate = cur.replicate if replicate is None else int(replicate)
    tensor = int(fields.pop("tensor", cur.tensor))
    if tensor != cur.tensor:
        return tensor_edit(state, tensor, world)
    if shard is None:
        world = cur.world if world is None else int(world)
        if world < 1:
            raise ValueError(f"world size {world}: give the number of ranks, 1 or more")
        if replicate < 1:
            raise ValueError(f"HSDP replicate {replicate}: give the number of copies, 1 or more (1: plain FSDP)")
        if world % (replicate * tensor):
            raise ValueError(f"world size {world} is not a multiple of HSDP replicate {replicate}"
                             + (f" x TP {tensor}" if tensor > 1 else ""))
        shard = world // (replicate * tensor)
    changes = dict(shard=int(shard), replicate=replicate, **fields)
    if device_memory is not ...:
        changes["device_memory"] = device_memory
    return SetupEdit(mesh=dataclasses.replace(cur, **changes))


def tensor_edit(state, tensor: int, world: int | None = None) -> SetupEdit:
    """The tensor-parallel degree (the world kept): with T > 1 and a plan without tensor-parallel
    entries, the model's own plan is added; T = 1 keeps the entries, unused."""
    from ..tp.tp_presets import preset

    cur, tensor = state.mesh, int(tensor)
    world = cur.world if world is None else int(world)
    if tensor < 1 or world % (cur.replicate * tensor):
        raise ValueError(f"TP {tensor}: give a divisor of world size {world} / HSDP replicate {cur.replicate}")
    plan = None
    if tensor > 1 and not state.plan.tensor_parallel:
        plan = state.plan.with_tensor_parallel(preset(state.tree, True))
    return SetupEdit(plan, dataclasses.replace(cur, shard=world // (cur.replicate * tensor), tensor=tensor))


def training_edit(state, **fields) -> SetupEdit:
    """``sv.Training`` with these fields changed (optimizer, param_dtype, reduce_dtype, offload, ...)."""
    cur = state.training
    if not dataclasses.is_dataclass(cur):
        raise ValueError("the training object is not a dataclass; pass a new sv.Training instead")
    names = {f.name for f in dataclasses.fields(cur)}
    unknown = set(fields) - names
    if unknown:
        raise ValueError(f"Training has no field(s) {sorted(unknown)}; fields: {sorted(names)}")
    return SetupEdit(training=dataclasses.replace(cur, **fields))


def offload_edit(state, on: bool, **fields) -> SetupEdit:
    """CPU offload on (``Training.offload``) or off: off also for the plan's calls that offload (a
    Suggest row offloads by its calls); ``fields``: other training fields."""
    plan = state.plan
    fields["offload"] = bool(on)
    if on or not any(u.offload for u in plan.units):
        return training_edit(state, **fields)
    units = [dataclasses.replace(u, offload=False) for u in plan.units]
    return SetupEdit(plan.with_units(units), training=training_edit(state, **fields).training)
