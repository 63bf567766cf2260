"""``FSDPMemTracker`` as the truth harness uses it (``torch_truth.run_step``).

- ``state_tracker``: the tracker, plus the peak of state memory (everything but activations,
  temporaries and inputs) after every op; its module instrumentation registers the tracker's
  wrappers as FSDP registers its own hooks (a grouped call keeps one group hook) and restores
  FSDP's hooks afterwards.
- ``see_post_forward_shards``: files the post-forward shards of an int ``reshard_after_forward``.
- ``unsharded_params``, ``unsharded_storages``: FSDP internals the harness files itself.
"""

from __future__ import annotations

import contextlib

from torch import nn


def state_tracker(model, optimizer):
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker, _FSDPRefType as R, _FSDPState
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.utils.weak import WeakIdKeyDictionary

    state_kinds = (R.SHARDED_PARAM, R.UNSHARDED_PARAM, R.BUFFER, R.SHARDED_GRAD, R.UNSHARDED_GRAD,
                   R.ALL_GATHER, R.REDUCE_SCATTER, R.OPT)

    class StateTracker(FSDPMemTracker):
        def __init__(self, mod, optm):
            # FSDPMemTracker.__init__ minus its assertion that ``mod`` is an FSDP module: the
            # instrumentation walks ``mod.modules()``, so a plan with several FSDP roots (no call
            # on the model itself) is tracked the same way
            MemTracker.__init__(self)
            self._root_mod, self._optm = mod, optm
            self._fsdp_mod_to_saved_methods = WeakIdKeyDictionary()
            self._fsdp_state = _FSDPState.PRE_FW
            self._ref_class = R
            self.state_peak: dict = {}
            self.state_peak_snap: dict = {}

        def _instrument_fsdp_module(self):
            _instrument_keeping_groups(self, R)

        def _deregister_module_and_optimizer_hooks(self):
            _restore_hooks(self)

        def _update_peak_stats(self, peak_state):
            super()._update_peak_stats(peak_state)
            for dev, snap in self._curr_mem_snap.items():
                x = sum(snap.get(k, 0) for k in state_kinds)
                if x > self.state_peak.get(dev, 0):
                    self.state_peak[dev] = x
                    self.state_peak_snap[dev] = {str(k.value) if hasattr(k, "value") else k: v for k, v in snap.items()}

    return StateTracker(model, optimizer), R


def _fsdp_states(root: nn.Module) -> list[tuple]:
    """(FSDP state, its first module) of every call with parameters under ``root``, once each."""
    from torch.distributed.fsdp import FSDPModule

    out, seen = [], set()
    for module in root.modules():
        if isinstance(module, FSDPModule):
            state = module._get_fsdp_state()
            if state._fsdp_param_group is not None and id(state) not in seen:
                seen.add(id(state))
                out.append((state, module))
    return out


def _forward_hooks(state, pre, post):
    """Register ``pre``/``post`` as FSDP does (``FSDPState.__init__``): on the module, or for a
    grouped call once for the group (pre-forward at its first module, post-forward when its
    last module returns)."""
    from torch.distributed.fsdp._fully_shard._fsdp_state import _register_group_forward_hooks

    modules = state._modules
    if len(modules) == 1:
        state._pre_forward_hook_handle = modules[0].register_forward_pre_hook(pre, prepend=True, with_kwargs=True)
        state._post_forward_hook_handle = modules[0].register_forward_hook(post, prepend=False)
    else:
        handle = _register_group_forward_hooks(modules, pre, post, state._modules_to_run_forward,
                                               state._cast_output_dtype)
        state._pre_forward_hook_handle = state._post_forward_hook_handle = handle


def _instrument_keeping_groups(tracker, R):
    """``FSDPMemTracker._instrument_fsdp_module`` with the same wrappers, registered as FSDP
    registers its own hooks. The tracker's version puts a full pre/post-forward hook on every
    module of a grouped call, so the tracked step would not be the step torch runs: the group is
    all-gathered and resharded once per module, and its post-backward fires after its last
    module's backward instead of where torch's own hooks put it."""
    from torch.distributed._tools.fsdp2_mem_tracker import _SavedFSDPMethods

    for state, module in _fsdp_states(tracker._root_mod):
        group = state._fsdp_param_group
        state._pre_forward_hook_handle.remove()
        state._post_forward_hook_handle.remove()
        tracker._instrument_fsdp_sharded_params_grads(group)
        _forward_hooks(state, tracker._fsdp_state_pre_forward(module, state._pre_forward),
                       tracker._fsdp_state_post_forward(module, state._post_forward))
        tracker._fsdp_mod_to_saved_methods[module] = _SavedFSDPMethods(group.pre_backward, group.post_backward)
        group.pre_backward = tracker._fsdp_param_group_pre_backward(module, group.pre_backward)
        group.post_backward = _filing_accumulated_grads(tracker, R, group,
                                                        tracker._fsdp_param_group_post_backward(module, group.post_backward))
    for buffer in tracker._root_mod.buffers():
        tracker._update_and_maybe_create_winfos(buffer, R.BUFFER)


def _filing_accumulated_grads(tracker, R, group, post_backward):
    """Without gradient sync, ``post_backward`` keeps the unsharded gradients cast to the reduce
    dtype (``FSDPParam.unsharded_accumulated_grad``), which the tracker leaves under Temp: file them
    as the unsharded gradients they are."""

    def inner(*args, **kwargs):
        post_backward(*args, **kwargs)
        for fsdp_param in group.fsdp_params:
            if fsdp_param.unsharded_accumulated_grad is not None:
                tracker._update_and_maybe_create_winfos(fsdp_param.unsharded_accumulated_grad, R.UNSHARDED_GRAD)

    return inner


def _restore_hooks(tracker):
    """Undo ``_instrument_keeping_groups``: FSDP's own hooks back, grouped calls grouped."""
    for module, saved in tracker._fsdp_mod_to_saved_methods.items():
        state = module._get_fsdp_state()
        state._pre_forward_hook_handle.remove()
        state._post_forward_hook_handle.remove()
        _forward_hooks(state, state._pre_forward, state._post_forward)
        state._fsdp_param_group.pre_backward = saved.pre_backward
        state._fsdp_param_group.post_backward = saved.post_backward
    tracker._fsdp_mod_to_saved_methods.clear()
    if tracker._optimizer_hook_handles is not None:
        for handle in tracker._optimizer_hook_handles:
            handle.remove()
        tracker._optimizer_hook_handles = None


@contextlib.contextmanager
def see_post_forward_shards(tracker, R):
    """An int ``reshard_after_forward`` keeps a clone of the all-gather output's slice after
    forward (``FSDPParam.to_sharded_post_forward``); the tracker leaves that clone under
    Activation. Categorise it as the (smaller-world) sharded parameter it is."""
    from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam

    orig = FSDPParam.to_sharded_post_forward

    def inner(self):
        orig(self)
        tracker._update_and_maybe_create_winfos(self._sharded_post_forward_param_data, R.SHARDED_PARAM)

    FSDPParam.to_sharded_post_forward = inner
    try:
        yield
    finally:
        FSDPParam.to_sharded_post_forward = orig


def unsharded_params(model: nn.Module) -> list:
    """The unsharded parameters of every trainable ``FSDPParam`` (what autograd accumulates into)."""
    from torch.distributed.fsdp._fully_shard._fsdp_state import _get_module_fsdp_state

    out, seen = [], set()
    for module in model.modules():
        state = _get_module_fsdp_state(module)
        for group in getattr(state, "_fsdp_param_groups", ()) if state is not None else ():
            for fp in group.fsdp_params:
                if id(fp) not in seen and fp.sharded_param.requires_grad:
                    seen.add(id(fp))
                    out.append(fp._unsharded_param)
    return out


def unsharded_storages(model: nn.Module) -> list:
    """The storages every call's unsharded parameters live in (``FSDPParam.all_gather_outputs``),
    allocated and freed in place each step. The tracker files them in its pre-forward wrapper,
    after ``_pre_forward`` returns: in the first forward it tracks, the copy-out into them, while
    the previous call's all-gather output is still held, would go unseen."""
    from torch.distributed.fsdp._fully_shard._fsdp_state import _get_module_fsdp_state

    out, seen = [], set()
    for module in model.modules():
        state = _get_module_fsdp_state(module)
        for group in getattr(state, "_fsdp_param_groups", ()) if state is not None else ():
            for fp in group.fsdp_params:
                if id(fp) not in seen:
                    seen.add(id(fp))
                    out.extend(fp.all_gather_outputs)
    return out
