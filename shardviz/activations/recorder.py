"""The tracker: MemTracker's categorisation of every storage, our own light timeline of module events.

Imported only when a step is measured (``torch.distributed._tools`` takes a second to import).
"""

from __future__ import annotations

import warnings
from functools import partial

import torch
from torch import nn
from torch.distributed._tools.common_utils import get_untyped_storages
from torch._guards import active_fake_mode
from torch._subclasses.fake_tensor import _DISPATCH_META_HANDLERS, FakeTensor
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType
from torch.utils._pytree import tree_flatten

from . import opcost, stop
from .kvcache import CacheTracker
from .profile import ModuleEvent

# transformers 5.25 with ``kernels`` installed runs some functions as module instances shared by every
# layer (``kernels``' ``_create_func_module``: ``Func``, outside the model). ModTracker names them all
# "Func" and warns at each nested call that its hierarchy may be wrong; the model's own modules, which
# are what is measured here, are named and timed the same either way (the profile is identical under
# 5.24): the warning would only repeat on every measurement
warnings.filterwarnings("ignore", message="The module hierarchy tracking maybe be messed up")

ACTIVATION_KINDS = (_MemRefType.ACT, _MemRefType.TEMP, _MemRefType.OTH)
ATTENTION_OPS = frozenset({
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_attention_math", "_scaled_dot_product_fused_attention_overrideable",
    "_flash_attention_forward", "_efficient_attention_forward",
})

_DEVICE = torch.ops.prim.device.default


class _PendingRelease:
    """After a block's forward: the storages of its inputs, and the bytes of those freed so far."""

    def __init__(self, key, winfo_ids: set[int]):
        self.key, self.winfo_ids, self.freed = key, winfo_ids, 0


class Recorder(MemTracker):
    """``MemTracker`` whose module hooks append ``ModuleEvent``s to a flat timeline instead of
    deep-copying per-module snapshots, and whose per-op peak update is O(1)."""

    def __init__(self, keys: dict[int, object], block_keys: set, flop_counter=None):
        super().__init__()
        self.flop_counter = flop_counter  # a FlopCounterMode running in the same pass, or None
        self._flops_seen = 0
        self._cost: dict = {}  # opcost buckets of the ops since the previous event
        self.keys = keys  # id(module) -> key
        self.block_keys = block_keys
        self.events: list[ModuleEvent] = []
        self.attention: dict[str, int] = {}
        self._seg_peak = 0
        self._inputs: dict[object, set[int]] = {}
        self._pending: _PendingRelease | None = None
        self.running = None  # (list index, rep index) of the block whose module last started, or None
        self.kv = CacheTracker(lambda: self.running)

    def winfos_of(self, tensor) -> list:
        """MemTracker's records of the storages ``tensor`` uses (none for a non-tensor)."""
        if not isinstance(tensor, torch.Tensor):
            return []
        return [w for st in get_untyped_storages(tensor) if (w := self._WINFO.get(st, (None, None))[0]) is not None]

    def track_tensor(self, tensor: torch.Tensor, kind) -> None:
        """Count ``tensor`` as a ``kind`` (torch's ``_MemRefType``: a parameter, a buffer), not an activation."""
        self._update_and_maybe_create_winfos(tensor, kind)

    def track_params(self, module: nn.Module) -> list:
        """Categorise parameters and buffers, and the gradients of trainable parameters as
        gradients (MemTracker's own helper hooks every parameter, frozen ones included, which
        torch refuses)."""
        handles = []
        for p in module.parameters():
            self._update_and_maybe_create_winfos(p, _MemRefType.PARAM)
            if p.requires_grad:
                hook = partial(self._update_and_maybe_create_winfos, reftype=_MemRefType.GRAD)
                handles.append(p.register_hook(lambda g, hook=hook: hook(g) and None))
                handles.append(p.register_post_accumulate_grad_hook(lambda q, hook=hook: hook(q.grad) and None))
        for b in module.buffers():
            self._update_and_maybe_create_winfos(b, _MemRefType.BUFFER)
        return handles

    def level(self) -> int:
        return sum(snap[k] for snap in self._curr_mem_snap.values() for k in ACTIVATION_KINDS)

    def _update_peak_stats(self, peak_state) -> None:
        self._seg_peak = max(self._seg_peak, self.level())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _DEVICE and len(args) == 1 and isinstance(args[0], FakeTensor):
            return self._device_of(args)
        stop.pause()  # a step set aside waits here until someone needs it (measure_cache.set_aside)
        if torch._C._current_graph_task_id() == -1:  # not in backward: torch's engine terminates on it there
            stop.check()  # the Inspector's next edit stops this measurement here, where torch expects exceptions
        elif stop.requested():  # in backward, asked to stop: its numbers will be dropped, so none is kept
            return func(*args, **(kwargs or {}))  # (no MemTracker, no op cost) up to the next module hook, which raises
        name = func._opname
        attention = name in ATTENTION_OPS
        if attention:
            self.attention[name] = self.attention.get(name, 0) + 1
        if self.flop_counter is None or opcost.is_view(func):
            return super().__torch_dispatch__(func, types, args, kwargs)
        before = self.flop_counter.get_total_flops()
        out = super().__torch_dispatch__(func, types, args, kwargs)
        self._count_op(attention, self.flop_counter.get_total_flops() - before, (args, kwargs), out)
        return out

    def _device_of(self, args) -> torch.device:
        """``tensor.device`` of a fake tensor (most of the ops a step dispatches: 40k of Zamba's 57k),
        answered as ``FakeTensorMode`` answers it (its meta handler), with ``MemTracker``'s per-op
        bookkeeping (no tensor out: the peak update only), without the modes below, which pass it
        through unchanged (no FLOPs, no routing answer): the same numbers, a fifth of the cost."""
        out = _DISPATCH_META_HANDLERS[_DEVICE](args)
        if active_fake_mode() is self._fake_mode_on_entry:
            self._update_peak_stats(None)
        return out

    def _count_op(self, attention: bool, flops: int, inputs, out) -> None:
        """One op into the cost since the previous event: its FLOPs, the bytes of its tensor
        arguments and outputs (``opcost``)."""
        tensors = [t for t in tree_flatten((inputs, out))[0] if isinstance(t, torch.Tensor)]
        nbytes = opcost.tensor_bytes(tensors)
        kind = opcost.ATTENTION if attention else opcost.MATMUL if flops > 0 else opcost.MEMORY
        opcost.add_op(self._cost, opcost.bucket(kind, flops, nbytes), flops, nbytes)

    def _update_and_maybe_create_winfos(self, t, reftype, update_existing=False):
        winfos = super()._update_and_maybe_create_winfos(t, reftype, update_existing)
        for winfo in winfos or ():
            self.kv.allocated(winfo)
        return winfos

    def _delete_callback(self, winfo, w_st) -> None:
        super()._delete_callback(winfo, w_st)
        self.kv.freed(winfo)
        pending = self._pending
        if pending is not None and id(winfo) in pending.winfo_ids:
            pending.freed += winfo.mem_consumed

    def _event(self, kind: str, key) -> None:
        lvl = self.level()
        phase = "bw" if self._mod_tracker.is_bw else "fw"
        self.kv.event(len(self.events) + (self._pending is not None))
        if self._pending is not None:
            pending, self._pending = self._pending, None
            before = self.events[-1].level
            self.events.append(ModuleEvent("gap", pending.key, "fw", before - pending.freed, before))
        self.events.append(ModuleEvent(kind, key, phase, lvl, max(self._seg_peak, lvl), self._flops_since(),
                                 self._cost_since()))
        self._seg_peak = lvl

    def _cost_since(self) -> dict | None:
        cost, self._cost = self._cost or None, {}
        return cost

    def finish(self) -> None:
        """After the step: the FLOPs since the last event (the first block's last weight gradients,
        whose module events torch never fires when its inputs need no gradient) go to that event."""
        if self.events:
            last = self.events[-1]
            self.events[-1] = last._replace(flops=last.flops + self._flops_since(),
                                            cost=opcost.combined(last.cost, self._cost_since()))

    def _flops_since(self) -> int:
        """FLOPs counted since the previous event."""
        if self.flop_counter is None:
            return 0
        total = self.flop_counter.get_total_flops()
        done, self._flops_seen = total - self._flops_seen, total
        return done

    def _winfo_ids(self, args) -> set[int]:
        ids = set()
        for t in tree_flatten(args)[0]:
            if isinstance(t, torch.Tensor):
                for st in get_untyped_storages(t):
                    winfo = self._WINFO.get(st, (None, None))[0]
                    if winfo is not None:
                        ids.add(id(winfo))
        return ids

    def _pre_fw_hook(self, module, inputs) -> None:
        key = self.keys.get(id(module))
        if key is None:
            return
        self.running = key[:2] if isinstance(key, tuple) else None
        if self._mod_tracker.is_bw:  # a checkpointed module's recomputation, inside backward
            stop.check()  # a module's forward pre-hook, in Python: it unwinds as a failing recomputation does
            self._event("pre_rc", key)
            return
        self._event("pre_fw", key)
        if key in self.block_keys and key not in self._inputs:
            self._inputs[key] = self._winfo_ids(inputs)

    def _post_fw_hook(self, module, inputs, outputs) -> None:
        key = self.keys.get(id(module))
        if key is None:
            return
        if self._mod_tracker.is_bw:
            self._event("post_rc", key)
            return
        self._event("post_fw", key)
        if key in self.block_keys:
            self._pending = _PendingRelease(key, self._inputs.get(key, set()))

    def _pre_bw_hook(self, module, args) -> None:
        stop.check()  # a Python hook on a gradient: a raise here unwinds backward as a user hook's does
        key = self.keys.get(id(module)) if module is not None else None
        if key is not None:
            self.running = key[:2] if isinstance(key, tuple) else None
            self._event("pre_bw", key)

    def _post_bw_hook(self, module, args) -> None:
        if not args:  # ModTracker's end-of-backward callback for modules none of whose inputs require
            return  # grad: not a point in time of the module's backward, and no place to raise
        stop.check()  # a hook on a gradient: unwinds as above
        key = self.keys.get(id(module)) if module is not None else None
        if key is not None:
            self._event("post_bw", key)
