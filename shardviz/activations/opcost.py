"""What each op of the measured step costs a GPU: its FLOPs, the bytes it reads and writes, one
kernel launch; kept in buckets a device's roofline times (docs/step-time.md, "Per-op time").

The recorder sees every op as the model issues it (fake tensors know their sizes): a view moves
nothing and launches nothing; any other op reads its tensor arguments and writes its outputs. The
FLOPs are ``FlopCounterMode``'s count of the op (zero for the memory-bound ones: casts, dropout,
norms, softmax, the loss). A cost is a dict ``bucket -> (flops, bytes, kernels)`` whose buckets
group ops of one kind, a similar arithmetic intensity and a similar size, so that the roofline of
a bucket's sums is the sum of its ops' rooflines to within the bucket's width (a factor 2).
"""

from __future__ import annotations

import math

MATMUL, ATTENTION, MEMORY = 0, 1, 2  # the kind of an op: it has FLOPs / it is an SDPA kernel / it has none
_VIEWS: dict = {}  # aten op -> True when it only aliases its input (no kernel)
_FREE = ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "_local_scalar_dense",
         "lift_fresh", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "set_", "resize_",
         "_unsafe_view", "_reshape_alias", "alias")


def is_view(func) -> bool:
    """The op returns aliases of its inputs without writing them (view, transpose, expand, detach):
    torch launches no kernel for it."""
    found = _VIEWS.get(func)
    if found is None:
        returns = func._schema.returns
        found = bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)
        found = found or func._opname in _FREE or func.namespace != "aten"  # prim.device & co: no kernel
        _VIEWS[func] = found
    return found


def tensor_bytes(tensors) -> int:
    """Bytes of the tensors' elements (what a kernel reading or writing them moves)."""
    return sum(t.numel() * t.element_size() for t in tensors)


def bucket(kind: int, flops: int, nbytes: int) -> int:
    """The bucket of one op: its kind, log2 of its FLOPs per byte, log2 of its bytes."""
    size = min(max(int(math.log2(nbytes)) if nbytes > 0 else 0, 0), 63)
    intensity = 0
    if flops > 0:
        intensity = min(max(int(math.log2(flops / nbytes)) + 1 if nbytes > 0 else 40, 0), 40)
    return (kind * 64 + intensity) * 64 + size


def kind_of(key: int) -> int:
    return key // (64 * 64)


def add_op(cost: dict, key: int, flops: int, nbytes: int) -> None:
    """Count one op into ``cost`` (in place)."""
    f, b, n = cost.get(key, (0, 0, 0))
    cost[key] = (f + flops, b + nbytes, n + 1)


def frozen(cost: dict | None) -> tuple | None:
    """A cost to keep (in a profile): its ``(bucket, (flops, bytes, kernels))`` pairs as a tuple.
    The cyclic collector stops tracking a tuple of plain values, but walks a dict held in a tuple
    or a dict for as long as it lives (``profile.Timeline``). Every function here reads both forms."""
    if not cost:
        return None
    return tuple(cost.items()) if isinstance(cost, dict) else cost


def _items(cost):
    return cost.items() if isinstance(cost, dict) else cost


def combined(*costs) -> dict | None:
    """The sum of some costs (None entries skipped; buckets that cancel dropped: a unit's sum may
    be built as its subtree less its children in either order); None when all are."""
    out: dict | None = None
    for c in costs:
        if not c:
            continue
        if out is None:
            out = dict(c)
            continue
        for key, (f, b, n) in _items(c):
            f0, b0, n0 = out.get(key, (0, 0, 0))
            total = (f0 + f, b0 + b, n0 + n)
            if any(total):
                out[key] = total
            else:
                out.pop(key, None)
    return out


def accumulate(total: dict, cost) -> dict:
    """``cost`` added into ``total`` in place (costs of ops are never negative: no bucket cancels);
    ``total`` returned. Summing many costs into one: ``combined`` would copy the sum each time."""
    if cost:
        for key, (f, b, n) in _items(cost):
            f0, b0, n0 = total.get(key, (0, 0, 0))
            total[key] = (f0 + f, b0 + b, n0 + n)
    return total


def difference(a: dict | None, b: dict | None) -> dict | None:
    """``a`` less ``b`` (integer sums: exact); buckets left empty are dropped."""
    if not b:
        return a
    out = dict(a or {})
    for key, (f, by, n) in _items(b):
        f0, b0, n0 = out.get(key, (0, 0, 0))
        left = (f0 - f, b0 - by, n0 - n)
        if any(left):
            out[key] = left
        else:
            out.pop(key, None)
    return out


def totals(cost: dict | None) -> tuple[int, int, int]:
    """(FLOPs, bytes, kernels) of a cost."""
    if not cost:
        return (0, 0, 0)
    return tuple(sum(v[i] for _, v in _items(cost)) for i in range(3))


def seconds(cost: dict | None, *, matmul_flops_per_s: float, attention_flops_per_s: float,
            bytes_per_s: float, launch_s: float, memory_traffic: float = 1.0) -> float:
    """The roofline of every bucket, summed: each op takes the longest of its FLOPs at the
    achieved FLOP/s of its kind, its bytes at the achieved memory bandwidth, and one kernel launch.
    ``memory_traffic``: the share of the memory-bound ops' bytes and launches left after a compiler
    fuses them (1: eager)."""
    if not cost:
        return 0.0
    total = 0.0
    for key, (f, b, n) in _items(cost):
        kind = kind_of(key)
        if kind == MEMORY:
            total += memory_traffic * max(b / bytes_per_s, n * launch_s)
            continue
        rate = attention_flops_per_s if kind == ATTENTION else matmul_flops_per_s
        total += max(f / rate, b / bytes_per_s, n * launch_s)
    return total


def flop_only(flops: float) -> dict:
    """A cost of ``flops`` in large matmuls and nothing else (a unit whose FLOPs are given, not measured)."""
    return {bucket(MATMUL, 1, 0): (int(flops), 0, 0)} if flops else {}
