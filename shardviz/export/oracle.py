"""Torch as the oracle: apply a plan with the real ``fully_shard`` on a meta copy, fake process group.

``verify`` compares what torch did with what ``analyze`` predicts. The user's model is never
touched: we deep-copy it with every parameter and buffer swapped for a meta tensor first, so
even a model with real weights costs no memory.
"""

from __future__ import annotations

import contextlib
import copy
import heapq
import sys
from dataclasses import replace
from typing import Iterator

import pandas as pd
import torch
from torch import nn

from ..activations.profile import strip_wrapper
from ..checkpointing import FULL, SELECTIVE, CheckpointPolicy
from ..analysis import analyze
from ..run.mesh import Mesh
from ..plan import Plan, as_plan
from ..tp import LAYOUT_FIELDS


def meta_copy(model: nn.Module) -> nn.Module:
    """A deep copy whose parameters and buffers live on the meta device (ties kept)."""
    memo: dict[int, object] = {}
    for p in model.parameters():
        memo[id(p)] = nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
    for b in model.buffers():
        memo[id(b)] = torch.empty_like(b, device="meta")
    # Hooks, class and attributes are copied; tensors come from the memo.
    return copy.deepcopy(model, memo)


@contextlib.contextmanager
def fake_process_group(rank: int, world: int) -> Iterator[None]:
    """torch's fake backend: collectives are no-ops, shapes and placements are real."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("a process group is already initialised; verify needs its own fake one")
    # init_process_group wraps sys.excepthook to prefix every later traceback with "[rank<r>]: "
    # (distributed_c10d.py, _distributed_excepthook) and destroy_process_group never undoes it:
    # each verify would add one more prefix to the user's tracebacks
    hook = sys.excepthook
    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()
        sys.excepthook = hook
        _clear_dtensor_caches()


def _clear_dtensor_caches() -> None:
    """DTensor caches sharding decisions by spec, and a spec's mesh compares equal across process
    groups: a later fake group would reuse the last one's (torch then cannot resolve its name)."""
    from torch.distributed.tensor._redistribute import _gen_transform_infos
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    _clear_sharding_prop_cache()  # the Python cache and the C++ fast path's
    _gen_transform_infos.cache_clear()


def device_mesh(mesh: Mesh):
    from torch.distributed.device_mesh import init_device_mesh

    if mesh.tensor > 1:
        from ..tp import MESH_DIM_NAMES

        return init_device_mesh("cpu", mesh.shape, mesh_dim_names=MESH_DIM_NAMES)
    if mesh.is_hsdp:
        return init_device_mesh("cpu", mesh.shape, mesh_dim_names=("replicate", "shard"))
    return init_device_mesh("cpu", mesh.shape, mesh_dim_names=("shard",))


def data_parallel_mesh(dmesh):
    """The mesh fully_shard takes: the whole one, or without its "tp" dim (torchtitan's apply_fsdp:
    ``mesh["dp_shard"]``, HSDP ``mesh["dp_replicate", "dp_shard"]``)."""
    names = dmesh.mesh_dim_names or ()
    if "tp" not in names:
        return dmesh
    return dmesh["dp_shard"] if dmesh["dp_replicate"].size() == 1 else dmesh["dp_replicate", "dp_shard"]


def torch_style(style):
    """A ``tp.TPStyle`` of torch's as torch's own ``ParallelStyle`` object."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor import parallel as tp_mod

    def layout(text):
        return Replicate() if text.startswith("Replicate") else Shard(int(text[6:-1]))

    kwargs = {k: layout(v) if k in LAYOUT_FIELDS else v for k, v in style.torch_kwargs().items()}
    return getattr(tp_mod, style.style)(**kwargs)


def torch_placements(specs) -> tuple[str, ...]:
    """``tp`` placement specs -> what torch prints for them (``str`` of its placement objects)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    def one(spec):
        if spec[0] == "Replicate":
            return Replicate()
        return Shard(spec[1]) if spec[0] == "Shard" else _StridedShard(spec[1], split_factor=spec[2])

    return tuple(str(one(s)) for s in specs)


def apply_tensor_parallel(model: nn.Module, plan: Plan, tp_mesh) -> None:
    """torch's ``parallelize_module`` for the plan's torch styles, transformers' own
    ``apply_tensor_parallelism`` (its ``_expand_parallel_plan``) for its names."""
    from torch.distributed.tensor.parallel import parallelize_module

    entries = plan.tensor_parallel.items()
    torch_plan = {k: torch_style(s) for k, s in entries if s.is_torch}
    if torch_plan:
        parallelize_module(model, tp_mesh, torch_plan)
    hf_plan = {k: s.style for k, s in entries if not s.is_torch}
    if hf_plan:
        from transformers.distributed.tensor_parallel import apply_tensor_parallelism

        apply_tensor_parallelism(model, tp_mesh, model._expand_parallel_plan(hf_plan))


def fully_shard_kwargs(unit, torch_mod) -> dict:
    """The per-call options of a Unit, as torch objects."""
    kwargs = {}
    if unit.reshard_after_forward is not None:
        kwargs["reshard_after_forward"] = unit.reshard_after_forward
    if unit.param_dtype or unit.reduce_dtype:
        kwargs["mp_policy"] = torch_mod.MixedPrecisionPolicy(
            param_dtype=getattr(torch, unit.param_dtype) if unit.param_dtype else None,
            reduce_dtype=getattr(torch, unit.reduce_dtype) if unit.reduce_dtype else None,
        )
    if unit.offload:
        kwargs["offload_policy"] = torch_mod.CPUOffloadPolicy()
    return kwargs


def apply_checkpointing(model: nn.Module, fqns) -> dict:
    """Wrap each module in torch's ``checkpoint_wrapper`` (full activation checkpointing, or the
    exported selective policy for the modules a ``Plan.checkpoint`` maps to "selective") in its
    parent's slot; returns {fqn: wrapper}. Modules are found before any is wrapped."""
    from ..export_runtime import _checkpoint_wrapped, _selective_checkpoint_context

    pairs = fqns.items() if hasattr(fqns, "items") else [(f, FULL) for f in fqns]
    found = [(f, CheckpointPolicy.parse(p, f"checkpoint[{f!r}]"), model.get_submodule(f.rpartition(".")[0]), f.rpartition(".")[2], model.get_submodule(f))
             for f, p in pairs]
    wrappers = {}
    for fqn, policy, parent, name, module in found:
        wrappers[fqn] = _checkpoint_wrapped(module, _selective_checkpoint_context if policy is SELECTIVE else None)
        parent.register_module(name, wrappers[fqn])
    return wrappers


def bottom_up_order(model: nn.Module, plan: Plan) -> list[int]:
    """Indices of ``plan.units`` in an order torch accepts, found on ``model`` itself (not by the engine).

    A call must come after every call that has a module strictly inside one of its modules: torch's
    DFS stops only at modules that already carry FSDP state. Read from the module objects
    (``module.modules()``), then a topological sort; ties go to the plan's order. Raises ValueError
    when no such order exists (a group with modules both inside and outside another call).
    """
    unit_modules = [[model.get_submodule(m) for m in u.modules] for u in plan.units]
    opened: dict[int, list[int]] = {}  # id(module) -> units it is a module of
    for u, mods in enumerate(unit_modules):
        for m in mods:
            opened.setdefault(id(m), []).append(u)
    before: list[set[int]] = [set() for _ in plan.units]  # unit -> units that must come first
    for u, mods in enumerate(unit_modules):
        for m in mods:
            for d in m.modules():
                if d is m:
                    continue
                for v in opened.get(id(d), ()):
                    if v != u:
                        before[u].add(v)
    # Kahn's algorithm; among the calls that may go next, plan order.
    waiting = [len(b) for b in before]
    after: list[list[int]] = [[] for _ in plan.units]
    for u, deps in enumerate(before):
        for v in deps:
            after[v].append(u)
    ready = [u for u in range(len(plan.units)) if not waiting[u]]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        u = heapq.heappop(ready)
        order.append(u)
        for w in after[u]:
            waiting[w] -= 1
            if not waiting[w]:
                heapq.heappush(ready, w)
    if len(order) < len(plan.units):
        names = [plan.units[u].name for u in range(len(plan.units)) if waiting[u]]
        raise ValueError(f"units {names} cannot be applied bottom-up: a grouped unit has modules both "
                         "inside and outside another unit")
    return order


def apply_plan(model: nn.Module, plan: Plan, mesh, *, training=None, order=None) -> list:
    """Call torch's ``fully_shard`` on ``model`` (in place) for every unit, bottom-up.

    Returns the units in the order applied. Needs an initialised process group and a DeviceMesh.
    ``training`` (a ``sv.Training``) supplies the default mixed precision and offload policies.
    ``order``: the bottom-up order of ``plan.units`` when the caller already has it; otherwise the
    oracle's own (``bottom_up_order``), read from the module objects, not from the engine.
    """
    import torch.distributed.fsdp as torch_fsdp
    from torch.distributed.fsdp import fully_shard

    if order is None:
        order = bottom_up_order(model, plan)
    if "tp" in (mesh.mesh_dim_names or ()):  # torchtitan's order: TP, then checkpointing, then FSDP
        if plan.tensor_parallel:
            apply_tensor_parallel(model, plan, mesh["tp"])
        mesh = data_parallel_mesh(mesh)
    ignored = {model.get_parameter(f) for f in plan.ignored}
    # every module a call names, found before checkpoint_wrapper changes the names below it
    targets = {m: model.get_submodule(m) for unit in plan.units for m in unit.modules}
    wrappers = apply_checkpointing(model, plan.checkpoint)
    applied = []
    for u in order:
        unit = plan.units[u]
        if training is not None:
            unit = training.unit_defaults(unit)
        # a checkpointed module is sharded through its wrapper, as torchtitan does
        modules = [wrappers.get(m, targets[m]) for m in unit.modules]
        target = modules[0] if len(modules) == 1 else modules
        kwargs = fully_shard_kwargs(unit, torch_fsdp)
        if ignored:
            kwargs["ignored_params"] = ignored
        fully_shard(target, mesh=mesh, **kwargs)
        applied.append(unit)
    return applied


def torch_layout(model: nn.Module, plan, mesh: Mesh, rank: int, *, order=None, training=None) -> pd.DataFrame:
    """What torch does on ``rank``: one row per parameter name with status, unit and local shape.

    Everything is read from torch: "sharded" is a DTensor parameter (its unit: the FSDP group
    holding it); a plain parameter is "ignored" when a module on its path carries FSDP state
    (some call reached it and left it alone: only ``ignored_params`` does that), else "unmanaged".
    ``order``, ``training``: as for ``apply_plan`` (default: the oracle's own bottom-up order, no
    training defaults). Parameter names are the user's: checkpoint_wrapper's inner name is left out."""
    from torch.distributed.fsdp import FSDPModule, fully_shard
    from torch.distributed.tensor import DTensor

    plan = as_plan(plan)
    copy_ = meta_copy(model)
    with fake_process_group(rank, mesh.world):
        dmesh = device_mesh(mesh)
        apply_plan(copy_, plan, dmesh, order=order, training=training)
        # the user's names: checkpoint_wrapper adds "_checkpoint_wrapped_module" below what it wraps,
        # and a checkpointed module is sharded through its wrapper (the first module of that name)
        modules: dict[str, nn.Module] = {}
        for name, m in copy_.named_modules(remove_duplicate=False):
            modules.setdefault(strip_wrapper(name), m)
        # Which call's group holds each sharded parameter, read from FSDP's own state.
        group_of: dict[int, str] = {}
        for unit in plan.units:
            state = fully_shard.state(modules[unit.modules[0]])
            group = state._fsdp_param_group
            for fp in group.fsdp_params if group is not None else ():
                group_of[id(fp.sharded_param)] = unit.name
        fsdp_modules = {name for name, m in modules.items() if isinstance(m, FSDPModule)}
        rows = []
        for wrapped_fqn, p in copy_.named_parameters(remove_duplicate=False):
            fqn = strip_wrapper(wrapped_fqn)
            if isinstance(p, DTensor) and p.device_mesh.mesh_dim_names != ("tp",):  # FSDP's (TP's alone: not)
                status, shape = "sharded", tuple(p.to_local().shape)
                placements = tuple(str(x) for x in p.placements)
            else:
                parts = fqn.split(".")[:-1]
                path = [""] + [".".join(parts[: i + 1]) for i in range(len(parts))]
                status = "ignored" if any(m in fsdp_modules for m in path) else "unmanaged"
                shape, placements = tuple((p.to_local() if isinstance(p, DTensor) else p).shape), ()
            rows.append({"fqn": fqn, "status": status, "unit": group_of.get(id(p)), "local_shape": shape,
                         "placements": placements})
    return pd.DataFrame(rows)


def default_ranks(world: int) -> list[int]:
    return sorted({0, world // 2, world - 1})


def verify(model: nn.Module, plan, mesh: Mesh | None = None, ranks=None, training=None) -> pd.DataFrame:
    """Every disagreement between ``analyze`` and torch's ``fully_shard`` (empty when faithful).

    Columns: rank, fqn, field ("status", "unit", "local_shape", "placements"), predicted, torch.
    Any plan ``analyze`` takes: checkpointed (in full or selectively), nested calls, offloaded
    (``Unit(offload=True)`` or ``training``'s ``offload``), HSDP meshes. ``training``: its default
    policies (mixed precision, offload) are passed to every call, as the exported code does. The
    user's model is never touched, and the process is left as it was (no process group, torch's
    traceback prefix removed).
    """
    plan = as_plan(plan)
    mesh = mesh or Mesh(8)
    if training is not None:  # placement does not depend on the micro-batch: nothing is measured
        training = replace(training, batch_size=None, global_batch=None)
    predicted = analyze(model, plan, mesh, training, strict=False)
    from torch.distributed.tensor import Replicate, Shard

    from ..tp import fsdp_placements

    shard_placements = (Replicate(), Shard(0)) if mesh.is_hsdp else (Shard(0),)
    want_placements = tuple(str(x) for x in shard_placements)
    tp_placements = predicted.tp_placements
    rows = []
    order = bottom_up_order(model, plan)  # torch's order, found on the model, not the engine's
    for rank in ranks if ranks is not None else default_ranks(mesh.world):
        actual = torch_layout(model, plan, mesh, rank, order=order, training=training)
        for rec in actual.itertuples(index=False):
            lay = predicted.layout
            p = predicted.tree.param_index[rec.fqn]
            status = lay.param_status[p]
            unit = lay.alias_unit(rec.fqn)
            if status == "sharded" and unit < 0:  # a tied alias left outside every call (SV006)
                status = "unmanaged"
            if status == "ignored" and lay.would_be_unit[p] < 0:
                status = "unmanaged"  # listed as ignored, but no call reaches it: torch cannot tell
            expect = {
                "status": status,
                "unit": predicted.unit_label(unit),
                "local_shape": predicted.local_shape(rec.fqn, rank) if status != "unmanaged" else lay.tree.params[p].shape,
                "placements": (torch_placements(fsdp_placements(tp_placements.get(p), mesh.tensor, mesh.is_hsdp))
                               if mesh.tensor > 1 else want_placements) if status == "sharded" else (),
            }
            got = {"status": rec.status, "unit": None if pd.isna(rec.unit) else rec.unit, "local_shape": rec.local_shape, "placements": rec.placements}
            for key in expect:
                if expect[key] != got[key]:
                    rows.append({"rank": rank, "fqn": rec.fqn, "field": key, "predicted": expect[key], "torch": got[key]})
    return pd.DataFrame(rows, columns=["rank", "fqn", "field", "predicted", "torch"])
