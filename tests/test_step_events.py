"""The one walk of FSDP2's hooks (``shardviz/step/events.py``) against torch: the order the
parameter groups' pre/post-forward and pre/post-backward run in a real step of the tiny Llama
under the fake process group, nested calls and the root's final callback included."""

from __future__ import annotations

import shardviz as sv
from shardviz import zoo
from fsdp_steps import WORLD, recorded_step
from shardviz.step.events import Hook, step_events

L = "model.layers."
HOOKS = {"pre_forward": Hook.PRE_FORWARD, "post_forward": Hook.POST_FORWARD,
         "pre_backward": Hook.PRE_BACKWARD, "post_backward": Hook.POST_BACKWARD}


def _torch_hooks(model, plan: sv.Plan) -> list[tuple[Hook, str]]:
    """The group hooks of one real step (after a warm-up), in the order they ran; a pre-backward
    that returns at once (``FSDPParamGroup.pre_backward`` already in ``PRE_BACKWARD``: the hook
    runs again for the root's second output) is not one."""
    from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState

    ran: list = []

    def recording(name):
        def wrap(saved, label_of):
            def hook(self, *args, **kwargs):
                if not (name == "pre_backward" and self._training_state == TrainingState.PRE_BACKWARD):
                    ran.append((HOOKS[name], label_of(self)))
                return saved(self, *args, **kwargs)
            return hook
        return wrap

    recorded_step(model, plan, {name: recording(name) for name in HOOKS})
    return ran


def test_the_walk_runs_the_hooks_in_torchs_order():
    """A call nested in a block's call, the blocks, the root: the stream's hooks, in order, are
    the ones torch runs (the nested call's backward inside its parent's, the root's post-backward
    in its final callback: its input, the token ids, needs no gradient)."""
    plan = sv.Plan(units=[L + "0.self_attn", L + "0", L + "1", ""])
    a = sv.analyze(zoo.tiny_llama_lora(lora=False), plan, sv.Mesh(WORLD))
    units = a.costs.units
    events = step_events(units, (), lambda k: units[k].grads_at)
    predicted = [(e.kind, units[e.call].name) for e in events.forward + events.backward if e.kind in HOOKS.values()]
    truth = _torch_hooks(zoo.tiny_llama_lora(lora=False), plan)
    assert predicted == truth
    assert truth[-1] == (Hook.POST_BACKWARD, plan.units[-1].name)  # the root's, in its final callback


def _torch_all_gathers(model, plan: sv.Plan) -> list[tuple[str, str, str]]:
    """(phase, call, group) of each all-gather ``FSDPParamGroup.unshard`` issues in one real step
    (after a warm-up): an unshard that returns at once (unsharded, already issued) is not one."""
    from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState
    from torch.distributed.fsdp._fully_shard._fsdp_param import ShardedState

    ran: list = []

    def unshard(saved, label_of):
        def recording(self, *args, **kwargs):
            before, state = self._all_gather_result, self._sharded_state
            out = saved(self, *args, **kwargs)
            if before is None and self._all_gather_result is not None:
                phase = "backward" if self._training_state == TrainingState.PRE_BACKWARD else "forward"
                group = "post_forward" if state == ShardedState.SHARDED_POST_FORWARD else "shard"
                ran.append((phase, label_of(self), group))
            return out
        return recording

    recorded_step(model, plan, {"unshard": unshard})
    return ran


def test_the_walk_issues_the_all_gathers_torch_issues():
    """Each hook's all-gathers in the stream (its own call's unless unsharded or prefetched, the
    default backward prefetch) are the ones torch issues, in order: a nested call, a call kept
    unsharded after forward (no backward all-gather, none prefetched for it), a post-forward shard
    (gathered again over its smaller group), the root."""
    plan = sv.Plan(units=[L + "0.self_attn", L + "0", L + "1", ""])
    plan = plan.with_unit_options(L + "0", reshard_after_forward=False)
    plan = plan.with_unit_options(L + "1", reshard_after_forward=2)
    a = sv.analyze(zoo.tiny_llama_lora(lora=False), plan, sv.Mesh(WORLD))
    units = a.costs.units
    events = step_events(units, (), lambda k: units[k].grads_at)
    phase = {Hook.PRE_FORWARD: "forward", Hook.PRE_BACKWARD: "backward"}
    predicted = [(phase[e.kind], units[g.call].name, g.group.value)
                 for e in events.forward + events.backward for g in e.gathers + e.prefetches]
    truth = _torch_all_gathers(zoo.tiny_llama_lora(lora=False), plan)
    assert predicted == truth
    assert ("backward", L + "0", "shard") not in truth  # kept unsharded after forward
    assert ("backward", L + "1", "post_forward") in truth


def test_a_micro_batch_without_sync_reduces_nothing():
    """``set_requires_gradient_sync(False)``: no post-backward of the stream reduces; with it,
    those of the calls that train do (the tiny Llama's LoRA blocks, not a frozen root)."""
    model = zoo.tiny_llama_lora()
    a = sv.analyze(model, sv.Plan.auto(model), sv.Mesh(WORLD))
    units = a.costs.units
    synced = step_events(units, (), lambda k: units[k].grads_at, sync=True)
    quiet = step_events(units, (), lambda k: units[k].grads_at, sync=False)
    reduce = {units[e.call].name: e.reduce for e in synced.backward if e.kind is Hook.POST_BACKWARD}
    assert reduce == {u.name: u.trainable for u in units}
    assert any(reduce.values()) and not all(reduce.values())
    assert not any(e.reduce for e in quiet.backward)
