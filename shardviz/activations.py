"""Activation memory of one training step, measured by torch itself on fake tensors.

What it answers: how many bytes of activations (tensors saved for backward, temporaries, the
step's inputs, gradients of activations during backward) are alive at every module boundary of a
forward+backward step at ``batch_size`` x ``seq_len``, with or without activation checkpointing,
in the dtypes the parameters compute in. Parameters, parameter gradients, buffers and optimizer
states are NOT counted: the cost model knows them exactly.

How (no formula, torch is the measurement):

1. A *reduced copy* of the model is built without touching the user's model: every repeated
   block list (``presets.find_blocks``) is replaced by a short ``nn.ModuleList`` holding one copy
   per *variant* - a variant is (block kind, which of its submodules are checkpointed), a kind is
   (class, parameter names/shapes/compute dtypes/requires_grad). The list always starts with a
   copy of the variant of position 0 (the first block sees an input that may not require grad:
   frozen embeddings), then one *steady* copy of every variant, always including the plain and
   the fully checkpointed one of every kind (so toggling block-level checkpointing reuses the
   measurement). Parameters are fresh fake tensors (``FakeTensorMode``: no memory, no values),
   cast to the dtype they compute in (``param_dtype`` for parameters FSDP shards, their own for
   ``whole_params``). Checkpointed modules are wrapped in torch's ``checkpoint_wrapper``
   (non-reentrant), as the exported code does before ``fully_shard``.
2. One real forward+backward of that copy runs under ``FakeTensorMode`` and torch's
   ``MemTracker`` (``torch.distributed._tools.mem_tracker``), which categorises every storage
   (parameter, buffer, gradient, activation, temporary). We keep a timeline of module events
   (pre/post forward, pre/post backward, recomputation) with the activation level (activation +
   temporary + other bytes) at each and the highest level reached since the previous event.
3. The timeline is spliced into the full model's: each block position gets the event run of its
   variant's representative (position 0 the first copy's), levels being additive. A block's run
   includes the release of its inputs right after its forward (the caller drops the previous
   hidden state unless someone saved it), so runs do not depend on their neighbours.

The step is the user's ordinary one: Hugging Face models ``loss = model(input_ids=ids,
labels=ids, use_cache=False).loss`` (seq2seq: HF derives ``decoder_input_ids`` from the labels),
the output object dropped, ``loss.backward()``; other modules ``example_inputs(batch, seq) ->
(args, kwargs)``, loss = ``out.loss`` if present else the sum of the output's floating tensors.
The model copy is put in train mode. See ``docs/activations.md`` for the assumptions (attention
kernel, MoE routing).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import itertools
import math
import threading
import weakref
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import nn

from .presets import find_blocks
from .tree import ModelTree, as_tree

__all__ = ["ActivationProfile", "ModuleActivations", "clear_cache", "measure_activations"]

_WRAPPED = "_checkpoint_wrapped_module"
_PHASES = ("pre_fw", "post_fw", "pre_bw", "post_bw", "pre_rc", "post_rc", "gap")


# ---------------------------------------------------------------------------
# Public results
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ModuleActivations:
    """Activation bytes (activations + temporaries + step inputs, all ranks alike) around one module
    in the full model's step. ``None`` where the event does not happen (a module never called, a
    backward that never reaches it).

    pre_fw / post_fw: level when the module's forward starts / returns (first call / last call).
    peak_fw: highest level while its forward runs.
    pre_bw: level when its backward starts (the first gradient of one of its outputs is ready).
    peak_bw: highest level during its backward (recomputation of checkpointed modules included).
    post_bw: level when the gradients of all its inputs are computed; ``None`` when none of its
        inputs requires grad (torch then only marks it at the very end of backward).
    saved: bytes its forward leaves allocated until its backward: its saved tensors and outputs,
        less (for the repeated blocks) the inputs released right after it.
    saved_plain / saved_checkpointed: ``saved`` if the module is not / is wrapped in
        ``checkpoint_wrapper``; measured for the repeated blocks (``None`` elsewhere, except that a
        module the plan checkpoints has ``saved_checkpointed == saved``).
    checkpointed: the module is wrapped in ``checkpoint_wrapper`` in this measurement.
    """

    fqn: str
    pre_fw: int | None
    post_fw: int | None
    peak_fw: int | None
    pre_bw: int | None
    peak_bw: int | None
    post_bw: int | None
    saved: int | None
    saved_plain: int | None = None
    saved_checkpointed: int | None = None
    checkpointed: bool = False


@dataclass
class ActivationProfile:
    """Activation memory of the full model's training step (see the module docstring).

    peak: ``(bytes, phase, module_fqn)``: the highest activation level of the step, whether it
        happens in ``"forward"`` or ``"backward"``, and the innermost module running then
        (``""`` = the root, e.g. the loss).
    timeline: the full model's events ``(event, fqn, phase, level, peak_since_previous)``, in
        order; ``event`` is one of pre_fw, post_fw, pre_bw, post_bw, pre_rc/post_rc (forward
        recomputed in backward by checkpointing), gap (a block's inputs released after it).
    attention: the attention kernels torch ran (aten op names), e.g.
        ``_scaled_dot_product_flash_attention_for_cpu``.
    assumptions: notes on what the numbers assume (MoE routing, kernels).
    """

    batch_size: int
    seq_len: int
    param_dtype: str | None
    peak: tuple[int, str, str]
    modules: dict[str, ModuleActivations]
    blocks: list[str]
    timeline: list[tuple[str, str, str, int, int]] = field(repr=False)
    attention: tuple[str, ...] = ()
    assumptions: tuple[str, ...] = ()
    measured_blocks: int = 0  # block copies the reduced model ran
    _types: dict[str, str] = field(default_factory=dict, repr=False)
    _depths: dict[str, int] = field(default_factory=dict, repr=False)

    @property
    def peak_bytes(self) -> int:
        return self.peak[0]

    def at(self, fqn: str) -> ModuleActivations:
        """The numbers around module ``fqn`` (``""`` = the root); KeyError if it never ran."""
        fqn = _strip_wrapper(fqn)
        if fqn not in self.modules:
            raise KeyError(f"module {fqn!r} did not run in the measured step")
        return self.modules[fqn]

    def table(self, modules=None):
        """A pandas DataFrame, one row per module: the root, every block, the modules outside the
        blocks no deeper than them (embeddings, final norm, head), or the given ``modules`` FQNs
        (e.g. a plan's units; a list entry stands for a group, reported by its first module)."""
        import pandas as pd

        if modules is None:
            block_depth = max((self._depths.get(b, 1) for b in self.blocks), default=1)
            in_block = tuple(b + "." for b in self.blocks)
            names = [f for f in self.modules if f == "" or f in self.blocks
                     or (self._depths.get(f, 99) <= block_depth and not f.startswith(in_block)
                         and self._types.get(f) != "ModuleList")]
        else:
            names = []
            for m in modules:
                m = getattr(m, "modules", m)  # an sv.Unit
                if isinstance(m, (list, tuple)):
                    m = m[0] if m else ""
                names.append(_strip_wrapper(m))
        blocks = set(self.blocks)
        rows = []
        for f in names:
            a = self.modules.get(f)
            row = {"fqn": f, "type": self._types.get(f, ""), "block": f in blocks}
            for k in ("checkpointed", "saved", "saved_plain", "saved_checkpointed",
                      "pre_fw", "post_fw", "peak_fw", "pre_bw", "peak_bw", "post_bw"):
                row[k] = getattr(a, k) if a is not None else None
            rows.append(row)
        df = pd.DataFrame(rows)
        for k in ("saved", "saved_plain", "saved_checkpointed", "pre_fw", "post_fw", "peak_fw",
                  "pre_bw", "peak_bw", "post_bw"):
            if k in df:
                df[k] = df[k].astype("Int64")
        return df


def _strip_wrapper(fqn: str) -> str:
    if _WRAPPED not in fqn:
        return fqn
    parts = [p for p in fqn.split(".") if p != _WRAPPED]
    return ".".join(parts)


# ---------------------------------------------------------------------------
# The tracker: MemTracker's categorisation, our own light timeline
# ---------------------------------------------------------------------------
def _recorder_class():
    from torch.distributed._tools.common_utils import get_untyped_storages
    from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType
    from torch.utils._pytree import tree_flatten

    act_kinds = (_MemRefType.ACT, _MemRefType.TEMP, _MemRefType.OTH)
    attention_ops = {
        "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_attention_math", "_scaled_dot_product_fused_attention_overrideable",
        "_flash_attention_forward", "_efficient_attention_forward",
    }

    class Recorder(MemTracker):
        """``MemTracker`` whose module hooks append to a flat timeline instead of deep-copying
        per-module snapshots, and whose per-op peak update is O(1)."""

        def __init__(self, keys: dict[int, object], block_keys: set):
            super().__init__()
            self.keys = keys  # id(module) -> key
            self.block_keys = block_keys
            self.events: list[list] = []  # [event, key, phase, level, peak_since_previous]
            self.attention: dict[str, int] = {}
            self._seg_peak = 0
            self._inputs: dict[object, set[int]] = {}
            self._pending = None  # [key, winfo ids, freed bytes] after a block's forward

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
            return sum(snap[k] for snap in self._curr_mem_snap.values() for k in act_kinds)

        def _update_peak_stats(self, peak_state) -> None:
            lvl = self.level()
            self._seg_peak = max(self._seg_peak, lvl)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func._opname
            if name in attention_ops:
                self.attention[name] = self.attention.get(name, 0) + 1
            return super().__torch_dispatch__(func, types, args, kwargs)

        def _delete_callback(self, winfo, w_st) -> None:
            super()._delete_callback(winfo, w_st)
            pending = self._pending
            if pending is not None and id(winfo) in pending[1]:
                pending[2] += winfo.mem_consumed

        def _event(self, kind: str, key) -> None:
            lvl = self.level()
            phase = "bw" if self._mod_tracker.is_bw else "fw"
            if self._pending is not None:
                pkey, _, freed = self._pending
                self._pending = None
                before = self.events[-1][3]
                self.events.append(["gap", pkey, "fw", before - freed, before])
            self.events.append([kind, key, phase, lvl, max(self._seg_peak, lvl)])
            self._seg_peak = lvl

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
            if self._mod_tracker.is_bw:
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
                self._pending = [key, self._inputs.get(key, set()), 0]

        def _pre_bw_hook(self, module, args) -> None:
            key = self.keys.get(id(module)) if module is not None else None
            if key is not None:
                self._event("pre_bw", key)

        def _post_bw_hook(self, module, args) -> None:
            # Called without arguments by ModTracker's end-of-backward callback for modules none of
            # whose inputs require grad: not a point in time of the module's backward.
            key = self.keys.get(id(module)) if module is not None else None
            if key is not None and args:
                self._event("post_bw", key)

    return Recorder


# ---------------------------------------------------------------------------
# MoE: data-dependent routing under fake tensors
# ---------------------------------------------------------------------------
def _moe_shape(model: nn.Module):
    """(n_experts, top_k) from a Hugging Face config, or None."""
    cfg = getattr(model, "config", None)
    if cfg is None:
        return None
    n = top = None
    for name in ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"):
        v = getattr(cfg, name, None)
        if isinstance(v, int) and v > 1:
            n = v
            break
    for name in ("num_experts_per_tok", "moe_topk", "top_k", "num_selected_experts"):
        v = getattr(cfg, name, None)
        if isinstance(v, int) and v > 0:
            top = v
            break
    if n is None:
        return None
    return n, top


def _routing_mode(moe):
    """A dispatch mode that answers the data-dependent ops fake tensors cannot (``nonzero``,
    ``item``) under *balanced routing*: every expert receives ``tokens * top_k / n_experts`` rows.

    nonzero(mask): a mask of ``n_experts`` (or ``n_experts + 1``: the sentinel slot) elements is
    "which experts are hit": all of them; any other mask (e.g. one expert's (top_k, tokens) slice
    of the one-hot routing) holds ``numel / n_experts`` ones. ``item()`` of a boolean: False (e.g.
    "is this the sentinel expert"); of a number: 0.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    n_experts = moe[0] if moe else None
    aten = torch.ops.aten
    nonzero_ops = {aten.nonzero.default, aten.nonzero_static.default}
    grouped_mm = getattr(aten, "_grouped_mm", None)
    grouped_mm = grouped_mm.default if grouped_mm is not None else None

    class BalancedRouting(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in nonzero_ops or func is aten.argwhere.default:
                x = args[0]
                numel = x.numel()
                if n_experts is None:
                    rows = numel  # outside MoE: the conservative bound, every element selected
                elif numel in (n_experts, n_experts + 1):
                    rows = n_experts
                else:
                    rows = math.ceil(numel / n_experts)
                return torch.empty((rows, x.dim()), dtype=torch.long, device=x.device)
            if func is grouped_mm and not (args[0].dtype == args[1].dtype == torch.bfloat16):
                # torch's meta kernel only sizes bf16 grouped_mm; CPU runs other dtypes: same shapes
                a, b = args[0], args[1]
                offs = args[2] if len(args) > 2 else kwargs.get("offs")
                if a.dim() == 2:
                    size = [offs.size(0), a.size(0), b.size(1)] if b.dim() == 2 else [a.size(0), b.size(-1)]
                else:
                    size = [a.size(1), b.size(1)] if b.dim() == 2 else [a.size(0), a.size(1), b.size(-1)]
                return torch.empty(size, dtype=kwargs.get("out_dtype") or a.dtype, device=a.device)
            if func is aten._local_scalar_dense.default:
                x = args[0]
                return False if x.dtype == torch.bool else 0
            return func(*args, **kwargs)

    return BalancedRouting()


# ---------------------------------------------------------------------------
# Building the reduced copy
# ---------------------------------------------------------------------------
def _dtype(value) -> torch.dtype | None:
    if value is None:
        return None
    if isinstance(value, torch.dtype):
        return value
    return getattr(torch, str(value).replace("torch.", ""))


@dataclass
class _ListPlan:
    fqn: str  # the ModuleList
    positions: list[int]  # tree indices of its blocks, in order
    variants: list[tuple]  # variant per position
    reps: list[tuple]  # rep index -> (variant, source tree index)
    pos_rep: list[int]  # position -> rep index


def _plan_lists(tree: ModelTree, blocks: list[int], compute_dtype, checkpoint: set[str]) -> list[_ListPlan]:
    by_list: dict[int, list[int]] = {}
    for b in blocks:
        by_list.setdefault(tree.modules[b].parent, []).append(b)
    plans = []
    for parent, members in by_list.items():
        lst = tree.modules[parent]
        variants, kinds = [], {}
        for b in members:
            info = tree.modules[b]
            prefix = info.fqn + "."
            sig = []
            for p in tree.subtree_params(b):
                pi = tree.params[p]
                name = next((n for n in pi.fqns if n.startswith(prefix)), pi.fqn)
                sig.append((name[len(prefix):], pi.shape, compute_dtype(pi), pi.requires_grad))
            kind = (info.type_name, tuple(sig))
            ck = frozenset("" if c == info.fqn else c[len(prefix):] for c in checkpoint
                           if c == info.fqn or c.startswith(prefix))
            variants.append((kind, ck))
            kinds.setdefault(kind, b)
        reps = [(variants[0], members[0])]
        index: dict[tuple, int] = {}
        wanted = []
        later = {v[0] for v in variants[1:]}  # kinds seen after position 0 (T5: block 0 differs)
        for kind, src in kinds.items():
            if kind in later:
                wanted += [((kind, frozenset()), src), ((kind, frozenset({""})), src)]
        for v, b in zip(variants[1:], members[1:]):
            wanted.append((v, b))
        last = (variants[-1], members[-1])
        for v, src in wanted + [last]:
            if v not in index:
                index[v] = len(reps)
                reps.append((v, src))
        # The last position's variant goes last: the first and last runs of the reduced timeline
        # are then the ones the full model's first and last positions use (see ``_splice``).
        r_last = index[last[0]]
        if r_last != len(reps) - 1:
            moved = reps.pop(r_last)
            reps.append(moved)
            index = {v: i for i, (v, _) in enumerate(reps) if i > 0}
        pos_rep = [0] + [index[v] for v in variants[1:]]
        plans.append(_ListPlan(lst.fqn, members, variants, reps, pos_rep))
    return plans


def _fake_param(p: torch.Tensor, dtype: torch.dtype, fake_mode) -> torch.Tensor:
    with fake_mode:
        t = torch.empty(p.shape, dtype=dtype, device="cpu")
    if isinstance(p, nn.Parameter):
        return nn.Parameter(t, requires_grad=p.requires_grad)
    return t


def _wrap(root: nn.Module, path: str) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        checkpoint_wrapper,
    )

    parent_path, _, name = path.rpartition(".")
    parent = root.get_submodule(parent_path) if parent_path else root
    child = getattr(parent, name)
    setattr(parent, name, checkpoint_wrapper(child))


def _allow_more_layers(reduced: nn.Module, sizes) -> None:
    """Hugging Face models loop over ``self.layers[: config.num_hidden_layers]``: when the reduced
    list is longer than the real one (a 2-layer model measured with 3 copies), raise the layer
    counts of the copy's configs that name the real length."""
    configs = {id(c): c for m in reduced.modules() if (c := getattr(m, "config", None)) is not None}
    for full, reduced_len in sizes:
        if reduced_len <= full:
            continue
        for cfg in configs.values():
            for name, value in list(vars(cfg).items()):
                if "layer" in name and isinstance(value, int) and not isinstance(value, bool) and value == full:
                    setattr(cfg, name, reduced_len)


def _build_copy(model, tree, lists, param_dtype_of, checkpoint_outside, fake_mode):
    """The reduced fake copy, and keys: id(copy module) -> key (a full fqn for modules outside the
    blocks, (list index, rep index, relative path) inside)."""
    memo: dict[int, object] = {}
    list_objs = [model.get_submodule(lp.fqn) for lp in lists]
    skip = {id(m) for m in list_objs}
    # Parameters and buffers outside the block lists (a walk that does not enter the lists).
    stack = [("", model)]
    while stack:
        prefix, mod = stack.pop()
        for pname, p in mod._parameters.items():
            if p is not None and id(p) not in memo:
                memo[id(p)] = _fake_param(p, param_dtype_of(f"{prefix}{pname}", p), fake_mode)
        for b in mod._buffers.values():
            if b is not None and id(b) not in memo:
                memo[id(b)] = _fake_param(b, b.dtype, fake_mode)
        for cname, child in mod._modules.items():
            if child is not None and id(child) not in skip:
                stack.append((f"{prefix}{cname}.", child))
    new_lists = []
    for lp, obj in zip(lists, list_objs):
        copies = []
        for (variant, src) in lp.reps:
            block = tree.modules[src]
            src_mod = model.get_submodule(block.fqn)
            rep_memo: dict[int, object] = {}
            for pname, p in src_mod.named_parameters(remove_duplicate=False):
                if id(p) not in rep_memo:
                    rep_memo[id(p)] = memo.get(id(p)) if id(p) in memo else _fake_param(
                        p, param_dtype_of(f"{block.fqn}.{pname}", p), fake_mode)
            for bname, b in src_mod.named_buffers(remove_duplicate=False):
                if id(b) not in rep_memo:
                    rep_memo[id(b)] = _fake_param(b, b.dtype, fake_mode)
            rep = copy.deepcopy(src_mod, rep_memo)
            for path in sorted(variant[1], key=lambda s: -s.count(".")):
                if path == "":
                    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
                        checkpoint_wrapper,
                    )

                    rep = checkpoint_wrapper(rep)
                else:
                    _wrap(rep, path)
            copies.append(rep)
        new = nn.ModuleList(copies)
        memo[id(obj)] = new
        new_lists.append(new)
    reduced = copy.deepcopy(model, memo)
    _allow_more_layers(reduced, [(len(lp.positions), len(new)) for lp, new in zip(lists, new_lists)])
    for path in sorted(checkpoint_outside, key=lambda s: -s.count(".")):
        _wrap(reduced, path)
    reduced.train()

    keys: dict[int, object] = {}
    list_index = {id(new): i for i, new in enumerate(new_lists)}
    block_keys = set()
    for li, new in enumerate(new_lists):
        for ri, rep in enumerate(new):
            block_keys.add((li, ri, ""))
            for name, mod in rep.named_modules(remove_duplicate=False):
                keys.setdefault(id(mod), (li, ri, _strip_wrapper(name)))
    for name, mod in reduced.named_modules(remove_duplicate=False):
        if id(mod) not in keys and id(mod) not in list_index:
            keys[id(mod)] = _strip_wrapper(name)
    return reduced, keys, block_keys


# ---------------------------------------------------------------------------
# Running the step
# ---------------------------------------------------------------------------
def _hf_config(model):
    cfg = getattr(model, "config", None)
    try:
        from transformers import PretrainedConfig
    except ImportError:  # transformers missing
        return None
    return cfg if isinstance(cfg, PretrainedConfig) else None


def _loss_of(out):
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, dict):
        loss = out.get("loss")
    if isinstance(loss, torch.Tensor):
        return loss
    from torch.utils._pytree import tree_flatten

    tensors = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not tensors:
        raise ValueError("the model's output holds no floating tensor to take a loss from")
    total = tensors[0].sum()
    for t in tensors[1:]:
        total = total + t.sum()
    return total


@contextlib.contextmanager
def _hf_plain_batches():
    """Batches without padding or packing, as a real step sees them.

    transformers decides from the *values* of the position ids and padding mask whether SDPA may
    run with ``is_causal=True`` and no mask (``masking_utils``); it treats fake tensors as tracing
    and then builds a (batch, 1, seq, seq) mask, which also changes the attention kernel. We let
    those checks see no padding mask and no packing: the ordinary training batch."""
    import sys

    mu = sys.modules.get("transformers.masking_utils")
    if mu is None:
        yield
        return
    saved = {}

    def unpadded(fn):
        def inner(padding_mask, *args, **kwargs):
            return fn(None, *args, **kwargs)
        return inner

    for name, make in (("find_packed_sequence_indices", lambda fn: lambda position_ids: None),
                       ("_ignore_causal_mask_sdpa", unpadded),
                       ("_ignore_bidirectional_mask_sdpa", unpadded)):
        fn = getattr(mu, name, None)
        if fn is not None:
            saved[name] = fn
            setattr(mu, name, make(fn))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(mu, name, fn)


@contextlib.contextmanager
def _fake_friendly(recorder=None):
    """Two Python-level spots where fake tensors trip over model code.

    ``module.to(dtype)`` in forward (NLLB-MoE's router casts its classifier): torch swaps fake
    parameters (``_apply``) and fails ("Couldn't swap ...: it has weakref associated with it");
    we replace the copy's parameters that need the cast (new ones are parameters, not
    activations)."""
    orig = nn.Module.to
    from torch.distributed._tools.mem_tracker import _MemRefType

    def to(self, *args, **kwargs):
        device, dtype, _, memory_format = torch._C._nn._parse_to(*args, **kwargs)
        if memory_format is not None or device is not None:
            return orig(self, *args, **kwargs)
        # Convert by replacing the copy's (fake) parameters: torch's swap refuses fake tensors.
        for mod in self.modules():
            for table, kind in ((mod._parameters, _MemRefType.PARAM), (mod._buffers, _MemRefType.BUFFER)):
                for name, t in list(table.items()):
                    if t is None or dtype is None or not t.is_floating_point() or t.dtype == dtype:
                        continue
                    with torch.no_grad():
                        new = t.to(dtype)
                    if isinstance(t, nn.Parameter):
                        new = nn.Parameter(new, requires_grad=t.requires_grad)
                    table[name] = new
                    if recorder is not None:
                        recorder._update_and_maybe_create_winfos(new, kind)
                        if isinstance(new, nn.Parameter) and new.requires_grad:
                            recorder.track_params(mod)  # its gradient is a gradient too (copy only)
        return self

    from torch._subclasses.fake_tensor import FakeTensor

    had_format = "__format__" in vars(FakeTensor)
    orig_format = FakeTensor.__format__

    def fmt(self, spec):
        # f"expert_{idx}" on a 0-dim index (NLLB-MoE picks its expert module so): the value comes
        # from ``item()``, which the routing mode answers (0: experts are identical in size)
        if self.dim() == 0:
            return format(self.item(), spec)
        return orig_format(self, spec)

    nn.Module.to = to
    FakeTensor.__format__ = fmt
    try:
        yield
    finally:
        nn.Module.to = orig
        if had_format:
            FakeTensor.__format__ = orig_format
        else:
            del FakeTensor.__format__


def _run_step(reduced, example_inputs, batch_size, seq_len, is_hf, recorder, routing):
    def forward():
        if example_inputs is not None:
            args, kwargs = example_inputs(batch_size, seq_len)
            return reduced(*args, **(kwargs or {}))
        ids = torch.zeros((batch_size, seq_len), dtype=torch.long)
        return reduced(input_ids=ids, labels=ids, use_cache=False)

    with recorder, _hf_plain_batches(), _fake_friendly(recorder), routing:
        out = forward()
        loss = _loss_of(out)
        del out
        if loss.requires_grad:
            loss.backward()
        del loss


# ---------------------------------------------------------------------------
# Splicing the reduced timeline into the full model's
# ---------------------------------------------------------------------------
def _runs(events, li, phase):
    """For list ``li``: the event index range of each rep's run in ``phase``, the region they
    cover, and the reps in the order they ran.

    Forward: a run starts at the rep's first event and ends where the next one starts. Backward:
    the next rep's first event (whatever module fires it) carries the level change of this rep's
    last operations - it fires the moment this rep has computed its input gradient - so the run
    ends just after it, and after the events at the same instant (no level change: torch fires
    the block's own pre-backward, the previous block's post-backward, ... together). The last run
    ends at its rep's last event that is not a post-backward: a post-backward waits for the
    gradients of all of a module's inputs, and one shared with later code (an encoder output read
    by every decoder block) delays it past the block's own backward."""
    first, last = {}, {}
    for j, ev in enumerate(events):
        key = ev[1]
        if ev[2] != phase or not isinstance(key, tuple) or key[0] != li:
            continue
        r = key[1]
        first.setdefault(r, j)
        if ev[0] != "post_bw":
            last[r] = j
    if not first:
        return None, None, None
    order = sorted(first, key=first.get)
    runs, start = {}, first[order[0]]
    for i, r in enumerate(order):
        if i + 1 == len(order):
            end = last.get(r, first[r]) + 1
        elif phase == "fw":
            end = first[order[i + 1]]
        else:
            end = first[order[i + 1]] + 1
            level = events[end - 1][3]
            while end < len(events) and events[end][3] == level and events[end][4] == level:
                end += 1
        end = max(end, start)
        runs[r] = (start, end)
        start = end
    return runs, (first[order[0]], start), order


def _splice(events, lists):
    """The full model's timeline ``(event, fqn, phase, level, peak_since_previous)``: the reduced
    timeline with each block list's forward and backward regions replaced by one run per position.

    Within a region, the events of the run are renamed to the position; events of the previous
    representative that torch fires inside the next one's run (in backward, a block's post-backward
    fires after the next block's pre-backward) go to the previously processed position; events of
    modules outside the blocks that fall inside a run are kept where the run plays the role it had
    in the reduced model (first or last of the region: ``_plan_lists`` orders the representatives so
    that the first and last positions use them), elsewhere dropped. A dropped event's level change
    is carried to the next event, so levels stay exact."""
    deltas = []
    prev = 0
    for ev in events:
        deltas.append([ev[0], ev[1], ev[2], ev[3] - prev, ev[4] - prev])
        prev = ev[3]
    found = []
    for li, lp in enumerate(lists):
        for phase in ("fw", "bw"):
            runs, span, order = _runs(events, li, phase)
            if runs is not None:
                found.append([span[0], span[1], li, phase, runs, order])
    # A region may end with hook events torch fires late (an identity module on an encoder output:
    # its pre-backward waits for the gradient summed over all decoder blocks) inside the next
    # region: clip it there; those events are then dropped, their level change kept.
    found.sort(key=lambda f: f[0])
    for f, g in itertools.pairwise(found):
        if f[1] > g[0]:
            f[1] = g[0]
            last = f[5][-1]
            f[4][last] = (min(f[4][last][0], g[0]), g[0])
    regions = []
    for start, stop, li, phase, runs, order in found:
        lp = lists[li]
        n = len(lp.positions)
        span = (start, stop)
        positions = list(range(n)) if phase == "fw" else list(range(n - 1, -1, -1))
        out = []
        for i, pos in enumerate(positions):
            r = lp.pos_rep[pos]
            if r not in runs:
                continue
            a, b = runs[r]
            edge = (i == 0 and r == order[0]) or (i == n - 1 and r == order[-1])
            name = f"{lp.fqn}.{pos}"
            prev_name = f"{lp.fqn}.{positions[i - 1]}" if i > 0 else None
            next_name = f"{lp.fqn}.{positions[i + 1]}" if i + 1 < n else None
            run = deltas[a:b]
            if r == order[0] and i > 0:
                # The first run of the region begins with work outside the blocks (in backward:
                # the final norm's backward, carried by the last block's first event; an encoder's:
                # the decoder blocks' late post-backward). Reused at another position, the previous
                # run brought the transition: the events before the rep's first own change carry
                # no change, the outside ones among them go.
                mine = [k for k, ev in enumerate(run) if isinstance(ev[1], tuple) and ev[1][0] == li and ev[1][1] == r]
                lead = next((k for k in mine[1:] if run[k][3] != 0 or run[k][4] != 0), len(run))
                run = [[ev[0], ev[1], ev[2], 0, 0] for ev in run[:lead] if isinstance(ev[1], tuple)] + run[lead:]
            for ev in run:
                key = ev[1]
                if isinstance(key, tuple) and key[0] == li:
                    if key[1] == r:
                        base = name
                    elif key[1] in order and order.index(key[1]) < order.index(r):
                        base = prev_name
                    else:
                        base = next_name
                    fq = None if base is None else (base if key[2] == "" else f"{base}.{key[2]}")
                elif isinstance(key, tuple):  # another list's block inside this run: not expected
                    fq = None
                else:
                    fq = key if edge else None
                out.append([ev[0], fq, ev[2], ev[3], ev[4]])
        regions.append((span[0], span[1], out))
    regions.sort(key=lambda r: r[0])
    result, cursor = [], 0
    for a, b, rep in regions:
        if a < cursor:
            raise RuntimeError("overlapping block runs in the measured timeline")
        result.extend(_rename(deltas[cursor:a], lists))
        result.extend(rep)
        cursor = b
    result.extend(_rename(deltas[cursor:], lists))
    # Deltas back to absolute levels; dropped events (fqn None) carry their change forward.
    timeline, level, carry_peak = [], 0, None
    for ev in result:
        peak = level + ev[4]
        if carry_peak is not None:
            peak = max(peak, carry_peak)
        level += ev[3]
        if ev[1] is None:
            carry_peak = peak
            continue
        carry_peak = None
        timeline.append((ev[0], ev[1], ev[2], level, peak))
    return timeline


def _rename(evs, lists):
    out = []
    for ev in evs:
        key = ev[1]
        if isinstance(key, tuple):  # a block's event outside the regions: not expected, keep the level
            key = None
        out.append([ev[0], key, ev[2], ev[3], ev[4]])
    return out


def _module_stats(timeline, checkpointed: set[str], block_saved: dict[str, tuple]):
    import numpy as np

    n = len(timeline)
    levels = np.fromiter((e[3] for e in timeline), dtype=np.int64, count=n)
    peaks = np.fromiter((e[4] for e in timeline), dtype=np.int64, count=n)
    idx: dict[str, dict[str, int]] = {}
    for j, (ev, fqn, phase, _, _) in enumerate(timeline):
        d = idx.setdefault(fqn, {})
        if ev in ("pre_fw", "pre_bw"):
            d.setdefault(ev, j)
        elif ev in ("post_fw", "post_bw", "gap"):
            d[ev] = j
        d["last"] = j

    def span_max(a, b):
        """Highest level from event a (its level, not the peak before it) to event b."""
        if b < a:
            return None
        top = int(levels[a])
        return max(top, int(peaks[a + 1:b + 1].max())) if b > a else top

    # End of each module's backward when torch never marks it: its subtree's last event.
    last_in_subtree: dict[str, int] = {}
    for fqn, d in idx.items():
        parts = fqn.split(".") if fqn else []
        for k in range(len(parts) + 1):
            anc = ".".join(parts[:k])
            if last_in_subtree.get(anc, -1) < d["last"]:
                last_in_subtree[anc] = d["last"]

    out: dict[str, ModuleActivations] = {}
    spans = []
    for fqn, d in idx.items():
        pf, qf, pb, qb = d.get("pre_fw"), d.get("post_fw"), d.get("pre_bw"), d.get("post_bw")
        pre_fw = int(levels[pf]) if pf is not None else None
        post_fw = int(levels[qf]) if qf is not None else None
        peak_fw = span_max(pf, qf) if pf is not None and qf is not None else None
        pre_bw = int(levels[pb]) if pb is not None else None
        post_bw = int(levels[qb]) if qb is not None else None
        peak_bw = None
        if pb is not None:
            end = qb if qb is not None else last_in_subtree.get(fqn, pb)
            peak_bw = span_max(pb, end)
        saved = None
        if pre_fw is not None and post_fw is not None:
            g = d.get("gap")
            saved = (int(levels[g]) if g is not None and qf is not None and g > qf else post_fw) - pre_fw
        plain, ckpt = block_saved.get(fqn, (None, None))
        is_ck = fqn in checkpointed
        if is_ck and ckpt is None:
            ckpt = saved
        out[fqn] = ModuleActivations(fqn, pre_fw, post_fw, peak_fw, pre_bw, peak_bw, post_bw, saved,
                                     plain, ckpt, is_ck)
        if pf is not None and qf is not None:
            spans.append((pf, qf, fqn))
        if pb is not None:
            spans.append((pb, qb if qb is not None else last_in_subtree.get(fqn, pb), fqn))
    j = int(peaks.argmax()) if n else 0
    best, where = None, ""
    for a, b, fqn in spans:  # innermost module running between events j-1 and j
        if a <= max(j - 1, 0) and j <= b and (best is None or b - a < best):
            best, where = b - a, fqn
    phase = "backward" if n and timeline[j][2] == "bw" else "forward"
    peak = (int(peaks[j]) if n else 0, phase, where)
    return out, peak


# ---------------------------------------------------------------------------
# The entry point, with a cache
# ---------------------------------------------------------------------------
_CACHE: dict = {}  # measurement key -> (model ref, reduced timeline, attention kernels)
_PROFILES: dict = {}  # measurement key + positions + checkpoint set -> (model ref, profile)
_TREES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def clear_cache() -> None:
    _CACHE.clear()
    _PROFILES.clear()


def _measure_reduced(model, tree, lists, param_dtype_of, checkpoint_outside, batch_size, seq_len,
                     example_inputs, is_hf, moe):
    from torch._subclasses import FakeTensorMode

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    reduced, keys, block_keys = _build_copy(model, tree, lists, param_dtype_of, checkpoint_outside, fake_mode)
    recorder = _recorder_class()(keys, block_keys)
    # Categorise the copy's parameters as parameters and their gradients as gradients (not ours).
    handles = recorder.track_params(reduced)
    try:
        with fake_mode:
            _run_step(reduced, example_inputs, batch_size, seq_len, is_hf, recorder, _routing_mode(moe))
    finally:
        for h in handles:
            h.remove()
    return recorder.events, tuple(sorted(recorder.attention))


def measure_activations(model: nn.Module, batch_size: int = 1, seq_len: int = 2048, *,
                        param_dtype=None, whole_params=(), checkpoint=(), example_inputs=None,
                        tree: ModelTree | None = None) -> ActivationProfile:
    """Measure the activation memory of one training step of ``model`` (see the module docstring).

    On a copy with one block per kind; when that copy cannot run (a model whose forward indexes
    per-layer lists by the layer's position, hybrid layer types, ...), on a fake copy of the whole
    model (slower, no extrapolation), which the profile's ``assumptions`` then say. When neither
    runs, a ValueError names the model and torch's error.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"measure_activations needs the nn.Module, got {type(model).__name__}")
    if example_inputs is None and _hf_config(model) is None:
        raise ValueError("not a Hugging Face model: pass example_inputs=(batch, seq) -> (args, kwargs)")
    try:
        return _measure(model, batch_size, seq_len, param_dtype=param_dtype, whole_params=whole_params,
                        checkpoint=checkpoint, example_inputs=example_inputs, tree=tree, reduce=True)
    except (KeyError, ValueError) as exc:
        if str(exc).strip("'\"").startswith(("checkpoint:", "batch_size and seq_len")):
            raise  # the caller's arguments, not the model
        first = exc
    except Exception as exc:  # noqa: BLE001 - the reduced copy failed: measure the whole model
        first = exc
    try:
        profile = _measure(model, batch_size, seq_len, param_dtype=param_dtype, whole_params=whole_params,
                           checkpoint=checkpoint, example_inputs=example_inputs, tree=tree, reduce=False)
    except Exception as exc:  # noqa: BLE001
        raise ValueError(
            f"the activations of {type(model).__name__} could not be measured at batch {batch_size} x {seq_len}: "
            f"{type(first).__name__}: {str(first)[:300]}; pass Training(example_inputs=...) with inputs its forward "
            "accepts, or batch_size=None for the model state alone") from exc
    note = f"measured on the whole model: the one-block-per-kind copy failed ({type(first).__name__}: {str(first)[:120]})"
    return dataclasses.replace(profile, assumptions=profile.assumptions + (note,))


def _measure(model: nn.Module, batch_size: int, seq_len: int, *, param_dtype, whole_params, checkpoint,
             example_inputs, tree, reduce: bool) -> ActivationProfile:
    """``measure_activations`` on a copy with one block per kind (``reduce``) or on the whole model.

    model: the user's module (meta or real; never modified).
    batch_size, seq_len: the step's input shape (``input_ids`` of (batch_size, seq_len)).
    param_dtype: the dtype FSDP computes sharded parameters in (``MixedPrecisionPolicy.param_dtype``,
        e.g. ``"bfloat16"``); None keeps every parameter's own dtype.
    whole_params: FQNs of parameters FSDP does not manage (ignored or unmanaged): they keep their
        own dtype whatever ``param_dtype`` says.
    checkpoint: FQNs of modules wrapped in ``checkpoint_wrapper`` (full activation checkpointing).
    example_inputs: for models that are not Hugging Face ones, ``(batch, seq) -> (args, kwargs)``.
    tree: the ``ModelTree`` of ``model`` if the caller has one (saves walking a big model).

    Cached: the same model, shapes, dtypes and checkpoint variants cost nothing the second time;
    toggling whole-block checkpointing of any block but the first reuses the measurement.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"measure_activations needs the nn.Module, got {type(model).__name__}")
    batch_size, seq_len = int(batch_size), int(seq_len)
    if batch_size < 1 or seq_len < 1:
        raise ValueError("batch_size and seq_len must be >= 1")
    if tree is None:
        tree = _TREES.get(model)
        # A model changed in place (adapters injected, cast, frozen) is walked again.
        if tree is not None and (
                tree.n_modules != sum(1 for _ in model.modules())
                or [(p.dtype, p.requires_grad) for p in tree.params]
                != [(p.dtype, p.requires_grad) for p in model.parameters()]):
            tree = None
        if tree is None:
            tree = as_tree(model)
            _TREES[model] = tree
    pdt = _dtype(param_dtype)
    whole = frozenset(whole_params)
    checkpoint = frozenset(_strip_wrapper(c) for c in checkpoint)
    for c in checkpoint:
        if c not in tree.module_index:
            raise KeyError(f"checkpoint: no module {c!r} in the model")
        if c == "":
            raise ValueError("checkpoint: the root module cannot be checkpoint-wrapped")

    def compute_dtype(pi):
        if pdt is None or not pi.dtype.is_floating_point or any(n in whole for n in pi.fqns):
            return pi.dtype
        return pdt

    def param_dtype_of(fqn, p):
        if pdt is None or not p.is_floating_point() or fqn in whole:
            return p.dtype
        pi = tree.param_index.get(fqn)
        if pi is not None and any(n in whole for n in tree.params[pi].fqns):
            return p.dtype
        return pdt

    listed = find_blocks(tree)  # the repeated blocks, reported either way
    blocks = listed if reduce else []  # the ones cut to one copy per kind
    lists = _plan_lists(tree, blocks, compute_dtype, checkpoint)
    block_prefixes = tuple(tree.modules[b].fqn + "." for b in blocks)
    block_set = {tree.modules[b].fqn for b in blocks}
    outside_ck = frozenset(c for c in checkpoint if c not in block_set and not c.startswith(block_prefixes))
    outside_sig = tuple((pi.fqn, compute_dtype(pi)) for pi in tree.params
                        if not any(n.startswith(block_prefixes) for n in pi.fqns))
    is_hf = _hf_config(model) is not None
    if example_inputs is None and not is_hf:
        raise ValueError("not a Hugging Face model: pass example_inputs=(batch, seq) -> (args, kwargs)")
    moe = _moe_shape(model)

    rep_key = tuple((lp.fqn, tuple(v for v, _ in lp.reps)) for lp in lists)
    key = (id(model), batch_size, seq_len, pdt, rep_key, outside_ck, outside_sig, example_inputs)
    full_key = (key, tuple(tuple(lp.pos_rep) for lp in lists), checkpoint)
    with _LOCK:
        hit = _CACHE.get(key)
        done = _PROFILES.get(full_key)
    if done is not None and done[0]() is model:
        return done[1]
    if hit is not None and hit[0]() is model:
        events, attention = hit[1], hit[2]
    else:
        events, attention = _measure_reduced(model, tree, lists, param_dtype_of, outside_ck, batch_size,
                                             seq_len, example_inputs, is_hf, moe)
        with _LOCK:
            if len(_CACHE) > 64:
                _CACHE.clear()
            _CACHE[key] = (weakref.ref(model), events, attention)

    timeline = _splice(events, lists)
    # Per block: saved bytes with and without checkpointing, from the steady representatives.
    rep_saved = _rep_saved(events, lists)
    block_saved = {}
    for li, lp in enumerate(lists):
        index = {v: r for r, (v, _) in enumerate(lp.reps) if r > 0}
        for pos, v in enumerate(lp.variants):
            kind = v[0]
            plain = rep_saved.get((li, index.get((kind, frozenset()))))
            ckpt = rep_saved.get((li, index.get((kind, frozenset({""})))))
            if pos == 0:  # the first block's own variant is measured as the first copy
                own = rep_saved.get((li, 0))
                if v[1] == frozenset():
                    plain = own
                elif v[1] == frozenset({""}):
                    ckpt = own
            block_saved[f"{lp.fqn}.{pos}"] = (plain, ckpt)
    modules, peak = _module_stats(timeline, set(checkpoint), block_saved)
    assumptions = []
    if moe:
        top = moe[1] if moe[1] else "top_k"
        assumptions.append(f"MoE: balanced routing, each of {moe[0]} experts gets tokens*{top}/{moe[0]} rows "
                           "where the model's code sizes by routing (nonzero/where)")
    if attention:
        assumptions.append("attention kernel: " + ", ".join(attention))
    measured = sum(len(lp.reps) for lp in lists)
    profile = ActivationProfile(
        batch_size=batch_size, seq_len=seq_len, param_dtype=str(pdt).replace("torch.", "") if pdt else None,
        peak=peak, modules=modules, blocks=[tree.modules[b].fqn for b in listed], timeline=timeline,
        attention=attention, assumptions=tuple(assumptions), measured_blocks=measured,
        _types={m.fqn: m.type_name for m in tree.modules}, _depths={m.fqn: m.depth for m in tree.modules},
    )
    with _LOCK:
        if len(_PROFILES) > 64:
            _PROFILES.clear()
        _PROFILES[full_key] = (weakref.ref(model), profile)
    return profile


def _rep_saved(events, lists):
    """(list, rep) -> bytes the rep's forward leaves allocated (level after its inputs' release
    minus level at its first pre-forward)."""
    out = {}
    start = {}
    for ev in events:
        key = ev[1]
        if not isinstance(key, tuple) or key[2] != "" or ev[2] != "fw":
            continue
        k = (key[0], key[1])
        if ev[0] == "pre_fw":
            start.setdefault(k, ev[3])
        elif ev[0] == "gap" and k in start:
            out[k] = ev[3] - start[k]
    return out
