"""torchao NF4 weights (``torchao.quantization.NF4Tensor``, torchtune's ``FrozenNF4Linear``) read as they are.

What FSDP2 does with one (torchao 0.18 ``quantization/quantize_/workflows/nf4/nf4_tensor.py``):

- ``fully_shard`` chunks it on dim 0 (``aten.split``), which splits each of its three inner tensors
  (``_INNER_TENSOR_NAMES_FOR_SHARDING``): ``quantized_data`` uint8 (two 4-bit codes a byte, numel/2),
  ``quantized_scalers`` int8 (one per ``block_size`` elements, 64), ``quantization_factor`` in the
  weight's dtype (one per ``block_size * scaler_block_size``, 16,384). Each inner numel must divide by
  the world size and ``narrow`` only works as a no-op: there is no padding, an uneven split raises.
- ``scaler_mean`` (0-dim) and the 16-entry ``nf4`` code table are shared by every chunk and by the
  all-gathered weight: every rank keeps them whole, nothing gathers them.
- ``fsdp_pre_all_gather`` returns the three inner shards; their dtypes differ, so FSDP2 gathers the whole
  call through one uint8 buffer (``_get_all_gather_input_metadatas``). ``fsdp_post_all_gather`` ignores
  ``param_dtype``: the unsharded weight stays NF4 (its inner tensors, the bytes gathered).
- ``F.linear`` on it runs ``LinearNF4``: the weight dequantized to the input's dtype in forward, and
  again in backward (``get_original_weight``); only the NF4 weight is saved.

The tree reads an NF4 weight as one uint8 tensor of its three inner tensors' bytes (what FSDP2 shards
and gathers) plus the bytes every rank keeps whole. Duck-typed on those attributes: torchao is never
imported here.
"""

from __future__ import annotations

import math

INSTALL_TORCHAO = "pip install 'shardviz[torchao]'"  # torchao>=0.18 (pure-Python NF4 and float8 parts)
#: the inner tensors ``fully_shard`` splits and all-gathers, in ``fsdp_pre_all_gather``'s order
SHARDED_PARTS = ("quantized_scalers", "quantization_factor", "quantized_data")
WHOLE_PARTS = ("scaler_mean", "nf4")


def float8_gather_dtype(param):
    """The float8 dtype a torchao ``WeightWithDynamicFloat8CastTensor`` (``Float8Linear`` with
    ``enable_fsdp_float8_all_gather``, tensorwise) is all-gathered in, else None. Its
    ``fsdp_pre_all_gather`` casts the shard (its ``_tensor``, the master weight in its own dtype) to
    float8 and gathers only ``_data``, 1 byte per element, whatever the call's ``param_dtype``; the
    unsharded weight is that float8 data. The scale is computed by an all-reduce of the amax, one per
    weight per gather, or once a step for all of them by ``precompute_float8_dynamic_scale_for_fsdp``
    (functional collectives, not in ``a.comm``)."""
    d = getattr(param, "__dict__", {})
    if "_tensor" in d and "_linear_mm_config" in d and "_dtype" in d and "_precomputed_scale" in d:
        return d["_dtype"]
    return None


def is_nf4(param) -> bool:
    """A torchao ``NF4Tensor`` (or a copy of its layout): the inner tensors FSDP2 shards, and the block sizes."""
    d = getattr(param, "__dict__", {})
    return all(k in d for k in SHARDED_PARTS + WHOLE_PARTS) and "scaler_block_size" in d and "block_size" in d


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


def nf4_sharded_bytes(param) -> int:
    """Bytes of the three inner tensors FSDP2 shards and all-gathers (uint8), summed."""
    return sum(_nbytes(param.__dict__[k]) for k in SHARDED_PARTS)


def nf4_whole_bytes(param) -> int:
    """Bytes every rank keeps whole: ``scaler_mean`` and the ``nf4`` code table."""
    return sum(_nbytes(param.__dict__[k]) for k in WHOLE_PARTS)


def nf4_layout(param) -> tuple[tuple[int, ...], tuple[int, ...], int, int]:
    """(the dequantized shape, the inner tensors' numels in ``SHARDED_PARTS`` order, block_size,
    scaler_block_size)."""
    d = param.__dict__
    return (tuple(param.shape), tuple(int(d[k].numel()) for k in SHARDED_PARTS), int(d["block_size"]),
            int(d["scaler_block_size"]))


def nf4_split_problem(shape: tuple[int, ...], parts: tuple[int, ...], world: int) -> str | None:
    """Why torchao cannot split this NF4 weight in ``world`` chunks on dim 0 (``nf4_split``: every inner
    numel divisible by the number of chunks, no padding), or None when it can."""
    if world <= 1:
        return None
    if len(shape) != 2:
        return f"it is {len(shape)}-D (NF4Tensor's all-gather supports 2-D weights only)"
    if shape[0] % world:
        return f"dim 0 ({shape[0]}) is not divisible by {world} (an NF4Tensor cannot be padded)"
    bad = [f"{name} has {n:,} elements" for name, n in zip(SHARDED_PARTS, parts) if n % world]
    return f"{', '.join(bad)}, not divisible by {world}" if bad else None


def working_scaler_block_size(numels: list[int], block_size: int, world: int, current: int = 256) -> int | None:
    """The ``scaler_block_size`` closest to ``current`` with which every weight of ``numels`` elements
    quantizes (its block count divisible by it) and splits over ``world`` ranks (its scaler-block count
    divisible by ``world``), as torchtune's fix for 70B on 8 GPUs chose 200 (PRs 1987, 1994); None when
    none does."""
    blocks = [n // block_size for n in numels]
    common = 0
    for b in blocks:
        common = math.gcd(common, b)
    candidates = [s for s in range(1, common + 1) if common % s == 0 and all((b // s) % world == 0 for b in blocks)]
    return min(candidates, key=lambda s: (abs(s - current), -s)) if candidates else None
