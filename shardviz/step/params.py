"""Per-parameter numbers the cost model sums: once per ``ModelTree`` (cached), then per layout.

*Sharded* parameters are managed by a ``fully_shard`` call (a padded shard on every rank); *whole*
parameters are ignored (``ignored_params``) or unmanaged (under no call): every rank holds them.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import numpy as np

from ..fsdp import local_rows_table, padded_shard_numel
from ..model.tree import tree_index
from ..run.training import itemsize

# dtype name -> a small int, so that numpy can count dtypes per call
_DTYPE_CODES: dict = {}


def dtype_code(dtype) -> int:
    name = str(dtype).replace("torch.", "")
    if name not in _DTYPE_CODES:
        _DTYPE_CODES[name] = len(_DTYPE_CODES)
    return _DTYPE_CODES[name]


def code_names() -> list[str]:
    """dtype names indexed by their code."""
    names = [""] * len(_DTYPE_CODES)
    for name, c in _DTYPE_CODES.items():
        names[c] = name
    return names


def n_dtype_codes() -> int:
    return max(len(_DTYPE_CODES), 1)


@dataclass(frozen=True)
class TreeArrays:
    """One entry per tree parameter (numpy arrays), and the module buffers."""

    numel: np.ndarray
    dim0: np.ndarray
    itemsize: np.ndarray
    dtype: np.ndarray  # dtype codes
    is_float: np.ndarray
    trainable: np.ndarray
    owner: np.ndarray  # preorder index of the first module that registers it
    buffer_bytes: int
    quant_state_bytes: int  # bitsandbytes quant_state of every Params4bit: no parameter, whole on every rank
    dim0_values: np.ndarray  # the distinct dim0 values, sorted
    dim0_group: np.ndarray  # per parameter: its dim0's index in dim0_values
    row: np.ndarray  # elements per dim-0 row
    gather_code: np.ndarray  # per parameter: the dtype code it is always gathered in (torchao float8), else -1
    gather_size: np.ndarray  # and that dtype's itemsize (0 without)
    _local_rows: dict = field(default_factory=dict, compare=False, repr=False)  # shard -> local_rows(shard)
    _padded: dict = field(default_factory=dict, compare=False, repr=False)  # shard -> padded(shard)

    def local_rows(self, shard: int) -> np.ndarray:
        """``local_rows_table`` of ``dim0_values`` on ``shard`` coordinates, computed once per tree and shard."""
        if shard not in self._local_rows:
            self._local_rows[shard] = local_rows_table(self.dim0_values, shard)
        return self._local_rows[shard]

    def padded(self, shard: int) -> np.ndarray:
        """Per parameter: the padded shard elements every rank allocates on ``shard`` coordinates
        (``padded_shard_numel``), computed once per tree and shard."""
        if shard not in self._padded:
            self._padded[shard] = padded_shard_numel(self.dim0, self.row, shard)
        return self._padded[shard]


_TREE_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def tree_arrays(tree) -> TreeArrays:
    """The tree's parameters as arrays, computed once per tree and reused by every analysis of it."""
    cached = _TREE_CACHE.get(tree)
    if cached is not None:
        return cached
    params, index = tree.params, tree_index(tree)
    numel, dim0, sizes, row = index.numel, index.dim0, index.itemsize, index.row
    dtype = np.array([dtype_code(p.dtype) for p in params], dtype=np.int64)
    is_float = np.array([p.dtype.is_floating_point for p in params], dtype=bool)
    # what gets a gradient: requires_grad less quantized weights (SV125); fsdp.Layout's rules read requires_grad
    trainable = np.array([p.gets_gradient for p in params], dtype=bool)
    owner = np.array([p.owners[0] if p.owners else 0 for p in params], dtype=np.int64)
    buffers = sum(m.buffer_bytes for m in tree.modules)  # one entry per module, aliases included once
    dim0_values, dim0_group = np.unique(dim0, return_inverse=True)
    quant_state = sum(p.quant_state_bytes for p in params)
    gather_code = np.array([dtype_code(p.gather_dtype) if p.gather_dtype is not None else -1 for p in params], dtype=np.int64)
    gather_size = np.array([p.gather_dtype.itemsize if p.gather_dtype is not None else 0 for p in params], dtype=np.int64)
    arrays = TreeArrays(numel, dim0, sizes, dtype, is_float, trainable, owner, buffers, quant_state, dim0_values,
                        dim0_group.reshape(-1), row, gather_code, gather_size)
    _TREE_CACHE[tree] = arrays
    return arrays


def promote(names: list[str]) -> str:
    """torch.promote_types over dtype names (the exported averager's common dtype)."""
    import torch

    out = getattr(torch, names[0])
    for name in names[1:]:
        out = torch.promote_types(out, getattr(torch, name))
    return str(out).replace("torch.", "")


def per_coord_sum(arr: TreeArrays, index: np.ndarray, row_bytes: np.ndarray, shard: int) -> np.ndarray:
    """sum_i local_rows(dim0_i, c) * row_bytes_i for every shard coordinate c, over the tree
    parameters ``index`` (grouped by dim0: the tree's few distinct values, ``TreeArrays.local_rows``)."""
    if index.size == 0:  # the common case of the offloaded ones
        return np.zeros(shard, dtype=np.int64)
    weights = np.bincount(arr.dim0_group[index], weights=row_bytes, minlength=arr.dim0_values.size)
    return np.rint(weights @ arr.local_rows(shard)).astype(np.int64)


def per_coord_max(dim0: np.ndarray, row_bytes: np.ndarray, shard: int) -> np.ndarray:
    """max_i local_rows(dim0_i, c) * row_bytes_i for every shard coordinate c."""
    if dim0.size == 0:
        return np.zeros(shard, dtype=np.int64)
    pairs = np.unique(np.stack([dim0, row_bytes.astype(np.int64)], axis=1), axis=0)
    return (local_rows_table(pairs[:, 0], shard) * pairs[:, 1:2]).max(axis=0)


def sum_per_unit(unit: np.ndarray, weights, n_units: int) -> np.ndarray:
    """Integer sums of ``weights`` by unit index (``unit`` in ``[0, n_units)``)."""
    return np.rint(np.bincount(unit, weights=weights, minlength=n_units)).astype(np.int64)


@dataclass(frozen=True)
class ShardedParams:
    """Per sharded parameter (numpy arrays aligned on ``index``), what the cost model needs."""

    index: np.ndarray  # tree parameter indices
    unit: np.ndarray  # owning call (plan unit index)
    numel: np.ndarray
    dim0: np.ndarray
    row: np.ndarray  # elements per dim-0 row
    padded: np.ndarray  # padded shard elements every rank allocates
    itemsize: np.ndarray  # original dtype
    dtype: np.ndarray  # original dtype code
    pd_itemsize: np.ndarray  # param dtype (what is gathered)
    pd_dtype: np.ndarray
    cast: np.ndarray  # gathered in another dtype than its own
    has_policy: np.ndarray  # its call's policy sets a param dtype (the all-gather input is a copy in it)
    trainable: np.ndarray
    offload: np.ndarray
    grad_itemsize: np.ndarray  # the unsharded gradient's dtype: the param dtype, or its own without a policy
    grad_dtype: np.ndarray  # (a torchao float8 weight gathers in float8 but computes its gradient in this)


def sharded_params(arr: TreeArrays, layout, policies, shard: int) -> ShardedParams:
    """The padded shard of every sharded parameter (``FSDPParam._init_sharded_param``) and the
    dtype it is gathered in (``FSDPParam.init_dtype_attrs``). ``policies``: one ``Unit`` per
    plan unit with the training's defaults filled in."""
    idx = np.nonzero(layout.sharded)[0]  # Layout gives ignored parameters no call: these are the "sharded" ones
    u = layout.param_unit_array[idx]
    pd_code = np.array([dtype_code(p.param_dtype) if p.param_dtype else -1 for p in policies] + [-1], dtype=np.int64)
    pd_size = np.array([itemsize(p.param_dtype) if p.param_dtype else 0 for p in policies] + [0], dtype=np.int64)
    offload = np.array([p.offload for p in policies] + [False], dtype=bool)
    isz, dcode, policy = arr.itemsize[idx], arr.dtype[idx], pd_code[u]
    # the policy's param dtype, unless it equals the original or the parameter is not floating point
    cast = (policy >= 0) & arr.is_float[idx] & (policy != dcode)
    grad_isz, grad_dcode = np.where(cast, pd_size[u], isz), np.where(cast, policy, dcode)
    # torchao float8 all-gather: its fsdp_pre_all_gather casts the shard to float8 whatever the policy says
    # (a staged copy), and the unsharded weight is that float8 data; its gradient is in the dtype above
    forced = arr.gather_code[idx] >= 0
    pd_isz, pd_dcode = np.where(forced, arr.gather_size[idx], grad_isz), np.where(forced, arr.gather_code[idx], grad_dcode)
    return ShardedParams(idx, u, arr.numel[idx], arr.dim0[idx], arr.row[idx], arr.padded(shard)[idx], isz, dcode,
                         pd_isz, pd_dcode, cast, (policy >= 0) | forced, arr.trainable[idx], offload[u], grad_isz,
                         grad_dcode)


@dataclass(frozen=True)
class WholeParams:
    """Ignored and unmanaged parameters: every rank holds them whole; FSDP never touches them."""

    index: np.ndarray  # tree parameter indices
    nbytes: np.ndarray  # per parameter
    trainable: np.ndarray  # per parameter
    unit: np.ndarray  # per parameter: the call it sits under (plan unit index; -1: none)
    params: int  # bytes of all of them
    grads: int  # bytes of the trainable ones' gradients
    grads_per_unit: np.ndarray  # gradient bytes of trainable ones under each call (ignored there)
    unmanaged_grads: int  # gradient bytes of trainable ones under no call: computed outside every call


def whole_params(arr: TreeArrays, layout, sharded: ShardedParams) -> WholeParams:
    n_units = len(layout.units)
    whole = np.ones(arr.numel.size, dtype=bool)
    whole[sharded.index] = False
    idx = np.nonzero(whole)[0]
    nbytes = arr.numel[idx] * arr.itemsize[idx]
    trainable = arr.trainable[idx]
    would = layout.would_be_unit[idx]
    slot = np.where(would >= 0, would, n_units)[trainable]
    per_unit = sum_per_unit(slot, nbytes[trainable], n_units + 1)
    return WholeParams(idx, nbytes, trainable, would, int(nbytes.sum()), int(nbytes[trainable].sum()),
                       per_unit[:n_units], int(per_unit[n_units]))


def unsharded_bytes(tree, layout, training) -> int:
    """Bytes of every call's parameters unsharded at once (unpadded, in the dtype each is gathered
    in): what a plan with ``reshard_after_forward=False`` on every call holds when forward ends,
    since each call reshards only after its backward. A floor of that plan's peak on any mesh."""
    policies = [training.unit_defaults(ul.unit) for ul in layout.units]
    sh = sharded_params(tree_arrays(tree), layout, policies, 1)
    return int((sh.numel * sh.pd_itemsize).sum())
