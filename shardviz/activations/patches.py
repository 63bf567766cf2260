"""Where fake tensors trip over model code: data-dependent MoE routing, transformers' value checks on
the batch, ``module.to(dtype)`` in forward, f-strings of 0-dim tensors, BLT's entropy patching. Each
patch is scoped to one measured step."""

from __future__ import annotations

import contextlib
import math
import sys
import weakref

import torch
from torch import nn


def moe_shape(model: nn.Module):
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


def _balanced_nonzero(x: torch.Tensor, n_experts: int | None) -> torch.Tensor:
    """nonzero(mask) under balanced routing: a mask of ``n_experts`` (or ``n_experts + 1``: the
    sentinel slot) elements is "which experts are hit": all of them; any other mask (e.g. one
    expert's (top_k, tokens) slice of the one-hot routing) holds ``numel / n_experts`` ones."""
    numel = x.numel()
    if n_experts is None:
        rows = numel  # outside MoE: the conservative bound, every element selected
    elif numel in (n_experts, n_experts + 1):
        rows = n_experts
    else:
        rows = math.ceil(numel / n_experts)
    return torch.empty((rows, x.dim()), dtype=torch.long, device=x.device)


def _grouped_mm_shape(args, kwargs) -> torch.Tensor:
    """``_grouped_mm``'s output: torch's meta kernel only sizes bf16, CPU runs other dtypes."""
    a, b = args[0], args[1]
    offs = args[2] if len(args) > 2 else kwargs.get("offs")
    if a.dim() == 2:
        size = [offs.size(0), a.size(0), b.size(1)] if b.dim() == 2 else [a.size(0), b.size(-1)]
    else:
        size = [a.size(1), b.size(1)] if b.dim() == 2 else [a.size(0), a.size(1), b.size(-1)]
    return torch.empty(size, dtype=kwargs.get("out_dtype") or a.dtype, device=a.device)


def balanced_routing(moe):
    """``run(func, args, kwargs)``: the op, or the answer to the data-dependent ops fake tensors
    cannot run (``nonzero``, ``item``) under *balanced routing*: every expert receives
    ``tokens * top_k / n_experts`` rows. ``item()`` of a boolean: False (e.g. "is this the sentinel
    expert"); of a number: 0. The FLOP counter runs its ops with it (``flops.flop_counter``): it
    counts what this answers.
    """
    n_experts = moe[0] if moe else None
    aten = torch.ops.aten
    nonzero_ops = {aten.nonzero.default, aten.nonzero_static.default, aten.argwhere.default}
    grouped_mm = getattr(aten, "_grouped_mm", None)
    grouped_mm = grouped_mm.default if grouped_mm is not None else None
    scalar = aten._local_scalar_dense.default

    def run(func, args, kwargs):
        if func in nonzero_ops:
            return _balanced_nonzero(args[0], n_experts)
        if func is grouped_mm and not (args[0].dtype == args[1].dtype == torch.bfloat16):
            return _grouped_mm_shape(args, kwargs)
        if func is scalar:
            return False if args[0].dtype == torch.bool else 0
        return func(*args, **kwargs)

    return run


@contextlib.contextmanager
def hf_plain_batches():
    """Batches without padding or packing, as a real step sees them.

    transformers decides from the *values* of the position ids and padding mask whether SDPA may
    run with ``is_causal=True`` and no mask (``masking_utils``); it treats fake tensors as tracing
    and then builds a (batch, 1, seq, seq) mask, which also changes the attention kernel. We let
    those checks see no padding mask and no packing: the ordinary training batch."""
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


def _cast_in_place(module: nn.Module, dtype: torch.dtype, recorder) -> None:
    """``module.to(dtype)`` by replacing the copy's (fake) parameters and buffers: torch's swap
    refuses fake tensors. The new ones are parameters and buffers to the recorder, not activations."""
    from torch.distributed._tools.mem_tracker import _MemRefType

    for mod in module.modules():
        for table, kind in ((mod._parameters, _MemRefType.PARAM), (mod._buffers, _MemRefType.BUFFER)):
            for name, t in list(table.items()):
                if t is None or not t.is_floating_point() or t.dtype == dtype:
                    continue
                with torch.no_grad():
                    new = t.to(dtype)
                if isinstance(t, nn.Parameter):
                    new = nn.Parameter(new, requires_grad=t.requires_grad)
                table[name] = new
                if recorder is not None:
                    recorder.track_tensor(new, kind)
                    if isinstance(new, nn.Parameter) and new.requires_grad:
                        recorder.track_params(mod)  # its gradient is a gradient too (copy only)


@contextlib.contextmanager
def fake_friendly(recorder=None):
    """Python-level spots where fake tensors trip over model code (and bitsandbytes' 4-bit linears,
    ``bnb_4bit_reference``).

    ``module.to(dtype)`` in forward (NLLB-MoE's router casts its classifier): torch swaps fake
    parameters (``_apply``) and fails ("Couldn't swap ...: it has weakref associated with it");
    we replace the copy's parameters that need the cast. ``f"expert_{idx}"`` on a 0-dim index
    (NLLB-MoE picks its expert module so): formatted from ``item()``, which the balanced routing
    answers (0: experts are identical in size)."""
    from torch._subclasses.fake_tensor import FakeTensor

    orig = nn.Module.to
    had_format = "__format__" in vars(FakeTensor)
    orig_format = FakeTensor.__format__

    def to(self, *args, **kwargs):
        device, dtype, _, memory_format = torch._C._nn._parse_to(*args, **kwargs)
        if memory_format is not None or device is not None:
            return orig(self, *args, **kwargs)
        if dtype is not None:
            _cast_in_place(self, dtype, recorder)
        return self

    def fmt(self, spec):
        if self.dim() == 0:
            return format(self.item(), spec)
        return orig_format(self, spec)

    nn.Module.to = to
    FakeTensor.__format__ = fmt
    try:
        with _blt_worst_case_patches(), _no_distribution_value_checks(), bnb_4bit_reference():
            yield
    finally:
        nn.Module.to = orig
        if had_format:
            FakeTensor.__format__ = orig_format
        else:
            del FakeTensor.__format__


@contextlib.contextmanager
def _no_distribution_value_checks():
    """``torch.distributions`` checks its parameters' values (``Categorical(logits=...)``, BLT's
    entropy): fake tensors have none."""
    from torch.distributions import Distribution

    saved = Distribution._validate_args
    Distribution.set_default_validate_args(False)
    try:
        yield
    finally:
        Distribution.set_default_validate_args(saved)


def _real_valued(fn, fake_like, real_args):
    """``fn(*real_args())`` on real tensors (every mode off, fake tensors' included), returned as an
    uninitialised tensor of its shape made under the step's modes (the recorder sees it allocated),
    and its real values."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes(), unset_fake_temporarily():
        real = fn(*real_args())
    return fake_like.new_empty(real.shape, dtype=real.dtype), real


@contextlib.contextmanager
def _blt_worst_case_patches():
    """BLT cuts the bytes into patches where its entropy model's next-byte entropy exceeds a
    threshold: the global transformer's length depends on values fake tensors lack. We take the
    worst case, every entropy above the threshold (every byte starts a patch, as an untrained
    entropy model does), and run transformers' own patch-length functions on real small tensors
    (batch x seq integers) of those values."""
    blt = sys.modules.get("transformers.models.blt.modeling_blt")
    if blt is None:
        yield
        return
    values: dict[int, tuple] = {}  # id(a fake patch-length tensor) -> (a weak reference to it, its real values)
    orig_lengths, orig_process = blt.BltPatcher.patch_lengths_from_entropies, blt.process_patch_lengths

    def lengths(entropies, sequence_length, patch_size=None, threshold=None):
        def worst():
            return torch.full(entropies.shape, math.inf), sequence_length, patch_size, threshold

        fake, real = _real_valued(orig_lengths, entropies, worst)
        values[id(fake)] = (weakref.ref(fake), real)  # weak: the step frees it when the model does
        return fake

    def process(patch_lengths, max_patch_length):
        known = values.get(id(patch_lengths), (lambda: None, None))
        if max_patch_length is None or known[0]() is not patch_lengths:
            return orig_process(patch_lengths, max_patch_length)
        fake, real = _real_valued(orig_process, patch_lengths, lambda: (known[1], max_patch_length))
        values[id(fake)] = (weakref.ref(fake), real)
        return fake

    blt.BltPatcher.patch_lengths_from_entropies = staticmethod(lengths)
    blt.process_patch_lengths = process
    try:
        yield
    finally:
        blt.BltPatcher.patch_lengths_from_entropies = staticmethod(orig_lengths)
        blt.process_patch_lengths = orig_process


# bitsandbytes 0.50 (backends/cuda/ops.py, the gemm_4bit kernel): above this many rows of input the CUDA
# kernel dequantizes the whole weight and calls F.linear (``_dequant_linear_fallback``); at or below it a
# fused kernel reads the packed weight directly
BNB_FUSED_MAX_ROWS = 1536


def _dequant_linear():
    """``bitsandbytes.autograd._functions.MatMul4Bit`` as its allocations go: forward, the weight
    dequantized (``quant_state.shape`` in the input's dtype) when the CUDA kernel falls back to
    dequantize + F.linear (more than ``BNB_FUSED_MAX_ROWS`` rows); only the packed weight is saved;
    backward, ``matmul(grad_output, dequantize_4bit(B))``: the dequantized weight again, one linear at a time."""

    class DequantLinear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, packed, bias, shape):
            ctx.shape = tuple(shape)
            ctx.save_for_backward(packed)
            rows = x.numel() // max(x.shape[-1], 1)
            if rows > BNB_FUSED_MAX_ROWS:
                weight = torch.empty(ctx.shape, dtype=x.dtype, device=x.device)  # F.dequantize_4bit's output
                return torch.nn.functional.linear(x, weight, bias)
            out = torch.empty((*x.shape[:-1], ctx.shape[0]), dtype=x.dtype, device=x.device)  # the fused kernel's
            return out if bias is None else out + bias

        @staticmethod
        def backward(ctx, grad):
            weight = torch.empty(ctx.shape, dtype=grad.dtype, device=grad.device)  # dequantize_4bit(B, state)
            grad_bias = grad.sum(0) if ctx.needs_input_grad[2] else None
            return torch.matmul(grad, weight) if ctx.needs_input_grad[0] else None, None, grad_bias, None

    return DequantLinear


@contextlib.contextmanager
def bnb_4bit_reference():
    """bitsandbytes' ``Linear4bit.forward`` replaced, while a step is measured, by what it allocates
    (``_dequant_linear``): on the fake copy its weight is a plain parameter of packed data, which
    bitsandbytes' own forward would wrap back into a ``Params4bit`` (impossible on a fake tensor), and its
    ``gemm_4bit`` fake kernel hides the dequantized weight. Nothing is patched without bitsandbytes loaded."""
    bnb = sys.modules.get("bitsandbytes")
    cls = getattr(getattr(bnb, "nn", None), "Linear4bit", None)
    if cls is None:
        yield
        return
    orig, fn = cls.forward, _dequant_linear()

    def forward(self, x):
        state = getattr(self.weight, "quant_state", None) or getattr(self, "quant_state", None)
        if state is None:
            return orig(self, x)
        dtype = x.dtype
        x = x.to(self.compute_dtype) if self.compute_dtype is not None else x
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return fn.apply(x, self.weight, bias, state.shape).to(dtype)

    cls.forward = forward
    try:
        yield
    finally:
        cls.forward = orig
