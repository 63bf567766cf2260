"""The schedule against torch: the ORDER in which a real FSDP2 step issues its hooks and collectives.

A real training step of the tiny Llama with LoRA (``zoo.tiny_llama_lora``) runs under torch's fake
process group (world 4). We record, in the order the CPU runs them:
- every c10d collective (``_allgather_base_``, ``_reduce_scatter_base_``, ``allreduce_``), labelled
  with the FSDP call whose ``unshard`` / ``post_backward`` issued it;
- ``("forward", unit)`` when a call's pre-forward returns (its compute starts);
- ``("backward", unit)`` when a call's pre-backward returns;
- ``("recompute", unit)`` when a checkpointed block's forward runs again during backward.
That sequence (not wall times) must equal ``Schedule.issue_order`` of the model given the same plan,
for eight cases: the default plan, reshard_after_forward=False, LoRA ignored, checkpointed blocks,
blocks + root, HSDP 2x2, and torch's explicit forward / backward prefetch.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist
from torch import nn

import shardviz as sv
from shardviz import zoo
from shardviz.export.oracle import apply_plan, device_mesh, fake_process_group
from shardviz.step.calls import Call
from shardviz.step.schedule import schedule_step, timed

WORLD = 4


def _group_labels(model: nn.Module, plan: sv.Plan) -> dict:
    from torch.distributed.fsdp import fully_shard

    labels = {}
    for unit in plan.units:
        module = model.get_submodule(unit.modules[0])
        state = fully_shard.state(module) if hasattr(fully_shard, "state") else module._get_fsdp_state()
        for group in state._fsdp_param_groups:
            labels[id(group)] = unit.name
    return labels


@contextlib.contextmanager
def _hooks_recorded(labels: dict, log: list):
    """Wrap FSDPParamGroup's hooks: which call is issuing, and when its compute starts."""
    from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    current: list = [None]
    saved = {name: getattr(FSDPParamGroup, name) for name in ("unshard", "post_backward", "pre_forward", "pre_backward")}

    def labelled(fn):
        def inner(self, *args, **kwargs):
            old, current[0] = current[0], labels.get(id(self), "?")
            try:
                return fn(self, *args, **kwargs)
            finally:
                current[0] = old
        return inner

    def marked(fn, kind, state):
        def inner(self, *args, **kwargs):
            first = self._training_state != state  # a grouped call enters once per module; a hook may fire twice
            out = fn(self, *args, **kwargs)
            if first:
                log.append((kind, labels.get(id(self), "?")))
            return out
        return inner

    FSDPParamGroup.unshard = labelled(saved["unshard"])
    FSDPParamGroup.post_backward = labelled(saved["post_backward"])
    FSDPParamGroup.pre_forward = marked(saved["pre_forward"], "forward", TrainingState.FORWARD)
    FSDPParamGroup.pre_backward = marked(saved["pre_backward"], "backward", TrainingState.PRE_BACKWARD)
    try:
        yield current
    finally:
        for name, fn in saved.items():
            setattr(FSDPParamGroup, name, fn)


def _collectives(current: list, log: list):
    from torch.utils._python_dispatch import TorchDispatchMode

    c10d = torch.ops.c10d
    kinds = {c10d._allgather_base_.default: "all_gather", c10d._reduce_scatter_base_.default: "reduce_scatter",
             c10d.allreduce_.default: "all_reduce"}

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in kinds:
                log.append((kinds[func], current[0]))
            return func(*args, **(kwargs or {}))

    return Recorder()


def _recompute_marks(model: nn.Module, plan: sv.Plan, phase: list, log: list) -> list:
    """A forward pre-hook on each checkpointed block: during backward its forward is the recomputation."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    handles = []
    for unit in plan.units:
        module = model.get_submodule(unit.modules[0])
        if isinstance(module, CheckpointWrapper):
            inner = module._checkpoint_wrapped_module
            handles.append(inner.register_forward_pre_hook(
                lambda *_, name=unit.name: log.append(("recompute", name)) if phase[0] == "backward" else None))
    return handles


def _set_prefetch(model: nn.Module, prefetch: dict) -> None:
    """torch's explicit prefetch: ``{"forward": {owner: [targets]}, "backward": {...}}`` (module FQNs)."""
    for owner, targets in prefetch.get("forward", {}).items():
        model.get_submodule(owner).set_modules_to_forward_prefetch([model.get_submodule(t) for t in targets])
    for owner, targets in prefetch.get("backward", {}).items():
        model.get_submodule(owner).set_modules_to_backward_prefetch([model.get_submodule(t) for t in targets])


def torch_issue_order(plan: sv.Plan, mesh: sv.Mesh = sv.Mesh(WORLD), prefetch: dict | None = None) -> list[tuple[str, str]]:
    """One real step (after a warm-up step) of the tiny Llama + LoRA under ``plan`` on ``mesh``."""
    model = zoo.tiny_llama_lora()
    with fake_process_group(0, mesh.world):
        apply_plan(model, plan, device_mesh(mesh), training=sv.Training())
        _set_prefetch(model, prefetch or {})
        ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
        labels = _group_labels(model, plan)
        log: list = []
        phase = ["forward"]
        handles = _recompute_marks(model, plan, phase, log)

        def step():
            phase[0] = "forward"
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            phase[0] = "backward"
            loss.backward()

        step()  # lazy init
        log.clear()
        with _hooks_recorded(labels, log) as current, _collectives(current, log):
            step()
        for h in handles:
            h.remove()
    assert dist.is_initialized() is False
    return log


def model_issue_order(model: nn.Module, plan: sv.Plan, mesh: sv.Mesh = sv.Mesh(WORLD),
                      prefetch: dict | None = None) -> list[tuple[str, str]]:
    """The same step as the model sees it: the plan's calls that manage parameters, in forward order."""
    a = sv.analyze(model, plan, mesh)
    order = {name: i for i, (name, _) in enumerate(model.named_modules())}
    sharded = a.params[a.params.status == "sharded"]
    units = sorted((u for u in plan.units if (sharded.unit == u.name).any()), key=lambda u: order[u.modules[0]])
    rows = [_unit_time(model, plan, sharded, u, mesh.is_hsdp) for u in units]
    # a call on the whole model that manages parameters encloses the others (the model's ``root``)
    root = next((r for r, u in zip(rows, units) if u.modules == ("",)), None)
    prefetch = prefetch or {}  # single-module units: a unit's name is its module's FQN
    return list(schedule_step([r for r in rows if r is not root], root=root, forward_prefetch=prefetch.get("forward"),
                              backward_prefetch=prefetch.get("backward")).issue_order)


def _unit_time(model: nn.Module, plan: sv.Plan, sharded, unit, hsdp: bool) -> Call:
    """Ones for every figure: only the order matters here. What the plan decides: reshard after
    forward, gradients (reduce-scatter), a pre-backward (the output needs a gradient), recomputation."""
    has_grads = bool(sharded[sharded.unit == unit.name].requires_grad.any())
    first = model.get_submodule(unit.modules[0])
    frozen_input_side = isinstance(first, nn.Embedding) and not has_grads
    reshard = unit.reshard_after_forward if unit.reshard_after_forward is not None else unit.modules != ("",)
    return timed(unit.name, forward_s=1, backward_s=1, recompute_s=1 if unit.modules[0] in plan.checkpoint else 0,
                 all_gather_forward_s=1, all_gather_backward_s=1, reduce_scatter_s=1 if has_grads else None,
                 all_reduce_s=1 if has_grads and hsdp else None,
                 reshard_after_forward=bool(reshard), backward_hook=not frozen_input_side)


def _plans():
    model = zoo.tiny_llama_lora()
    default = sv.Plan.auto(model, lora="sharded")
    keep = sv.Plan(units=[sv.Unit(u.modules, reshard_after_forward=False) for u in default.units],
                   ignored=list(default.ignored))
    return {
        "default": default,
        "reshard_after_forward=False": keep,
        "LoRA ignored": sv.Plan.auto(model, lora="ignored"),
        "checkpointed blocks": sv.Plan.auto(model, lora="sharded", checkpoint="blocks"),
        # torchtune's layout: the blocks, then the root takes embedding, norm and LM head
        "blocks + root": sv.Plan(units=["base_model.model.model.layers.0", "base_model.model.model.layers.1", ""]),
        "HSDP 2x2": default,
    }


MESHES = {"HSDP 2x2": sv.Mesh(shard=2, replicate=2)}
_L = "base_model.model.model."
PREFETCH = {
    "explicit forward prefetch": {"forward": {_L + "embed_tokens": [_L + "layers.0", _L + "layers.1"]}},
    "explicit backward prefetch": {"backward": {_L + "layers.1": [_L + "layers.0", _L + "embed_tokens"]}},
}
PLANS = _plans()
PLANS.update({name: PLANS["default"] for name in PREFETCH})


@pytest.mark.parametrize("name", list(PLANS))
def test_the_model_issues_hooks_and_collectives_in_torch_order(name):
    plan, mesh, prefetch = PLANS[name], MESHES.get(name, sv.Mesh(WORLD)), PREFETCH.get(name)
    truth = torch_issue_order(plan, mesh, prefetch)
    predicted = model_issue_order(zoo.tiny_llama_lora(), plan, mesh, prefetch)
    assert predicted == truth, "\n".join(f"{p!s:60} {t!s}" for p, t in zip(predicted + [None] * len(truth), truth))


def test_the_recorded_orders_show_the_rules():
    """What the sequences contain, read off torch's: prefetch one ahead, no backward all-gather
    without resharding, no reduce-scatter when LoRA is ignored, recomputation after pre-backward."""
    default = torch_issue_order(PLANS["default"])
    layer0, layer1 = "base_model.model.model.layers.0", "base_model.model.model.layers.1"
    # backward: layer 1's pre-backward prefetches layer 0 before layer 1 computes
    i = default.index(("backward", layer1))
    assert default[i - 1] == ("all_gather", layer0)
    keep = torch_issue_order(PLANS["reshard_after_forward=False"])
    assert not [k for k in keep[keep.index(("backward", layer1)) - 2:] if k[0] == "all_gather"]
    ignored = torch_issue_order(PLANS["LoRA ignored"])
    assert not [k for k in ignored if k[0] == "reduce_scatter"]
    ckpt = torch_issue_order(PLANS["checkpointed blocks"])
    assert ckpt.index(("recompute", layer1)) == ckpt.index(("backward", layer1)) + 1
    hsdp = torch_issue_order(PLANS["HSDP 2x2"], MESHES["HSDP 2x2"])
    i = hsdp.index(("reduce_scatter", layer1))
    assert hsdp[i + 1] == ("all_reduce", layer1)


_LAYOUTS = {
    "a call nested in a block's": [_L + "layers.0.self_attn", _L + "layers.0", _L + "layers.1", ""],
    "no call on the whole model": [_L + "layers.0", _L + "layers.1"],
    "the embedding in a call of its own": [_L + "embed_tokens", _L + "layers.0", _L + "layers.1", ""],
}


@pytest.mark.parametrize("name", list(_LAYOUTS))
def test_the_analysis_schedule_walks_the_layouts_calls_in_torch_order(name):
    """The step time of an analysis walks the calls where the layout places them (nesting, one
    context per root, which hooks torch registers): the order it issues hooks and collectives is
    torch's, for layouts the schedule's own assumptions (``step.schedule._calls``) do not hold for."""
    plan = sv.Plan(units=_LAYOUTS[name])
    truth = torch_issue_order(plan)
    a = sv.analyze(zoo.tiny_llama_lora(), plan, sv.Mesh(WORLD, device="H100"), sv.Training(batch_size=2, seq_len=16))
    grouped = {name for _, name in truth}
    predicted = [(kind, unit) for kind, unit in a.step_time.schedule.issue_order
                 if unit in grouped and kind in ("forward", "backward", "all_gather", "reduce_scatter", "all_reduce")]
    assert predicted == truth, "\n".join(f"{p!s:60} {t!s}" for p, t in zip(predicted + [None] * len(truth), truth))
