"""The tables of a ``CostModel``: memory per rank, communication per step, the peak's breakdown.

Ranks differ only by their shard coordinate: per-rank columns are computed for the ``shard``
coordinates and tiled over the replicas. Columns and formulas: ``docs/cost-model.md``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..devices import DEFAULT_EFFICIENCY, Efficiency, collective_seconds
from ..run.mesh import worst_rank
from .model import CostModel
from .simulation import Alive

#: The one breakdown of a rank's peak that every view draws (``Analysis.peak_breakdown``).
BREAKDOWN = ("sharded params", "whole params", "buffers", "optimizer states", "gradients", "unsharded params",
             "communication buffers", "activations", "temporaries")


def _peak_columns(costs: CostModel) -> dict:
    """Per shard coordinate: the peak, where it is, and what it holds beyond the state."""
    res, opt = costs.resident, costs.optimizer
    opt_dev = opt.device + opt.whole
    moment = costs.step.moment
    forward_backward = res.total + max(costs.step.peak, 0) + opt_dev
    step = res.total + res.grads + opt_dev + opt.step_temporaries
    in_step = costs.in_optimizer_step() | (moment is None)
    alive = moment.alive if moment is not None else Alive()
    unit_name = costs.units[moment.unit].name if moment is not None and moment.unit is not None else None
    return {
        "activations": np.where(in_step, 0, alive.activations),
        "peak": np.where(in_step, step, forward_backward),
        "peak_phase": np.where(in_step, "optimizer", moment.phase if moment else "optimizer"),
        "peak_unit": np.where(in_step, None, unit_name),
        "peak_module": np.where(in_step, None, moment.module if moment else None),
        "peak_transient": np.where(in_step, opt.step_temporaries, alive.total() - alive.gradients),
    }


def memory_table(costs: CostModel) -> pd.DataFrame:
    """One row per rank, bytes: see ``docs/cost-model.md`` for every column."""
    S, R = costs.mesh.shard, costs.mesh.replicate
    res, opt = costs.resident, costs.optimizer
    opt_dev = opt.device + opt.whole
    cpu_opt = opt.cpu + opt.cpu_steps
    peak = _peak_columns(costs)
    W = S * R

    def tile(a):
        return np.tile(a, R) if R > 1 else a

    def per_rank(value):
        return np.full(W, value)

    index = pd.RangeIndex(W)  # given, so that pandas need not align the object columns' Series to one
    return per_global_rank(pd.DataFrame({
        "rank": np.arange(W),
        "replica": np.repeat(np.arange(R), S),
        "shard": np.tile(np.arange(S), R),
        "params": per_rank(res.params_sharded + res.params_whole),
        "params_sharded": per_rank(res.params_sharded),
        "params_whole": per_rank(res.params_whole),
        "buffers": per_rank(res.buffers),
        "quant_state": per_rank(res.quant_state),
        "grads": per_rank(res.grads),
        "grads_sharded": per_rank(res.grads_sharded),
        "grads_whole": per_rank(res.grads_whole),
        "optimizer": tile(opt_dev),
        "state": tile(res.total + res.grads + opt_dev),
        "activations": tile(peak["activations"]),
        "peak": tile(peak["peak"]),
        "peak_phase": tile(peak["peak_phase"]),
        "peak_unit": _object_column(tile(peak["peak_unit"]), index),
        "peak_module": _object_column(tile(peak["peak_module"]), index),
        "peak_transient": tile(peak["peak_transient"]),
        # the caching allocator's reserved peak (torch.cuda.max_memory_reserved) under the mesh's
        # allocator setting: the peak plus what its segments hold beyond the tensors (cost.reserved)
        "reserved_peak": tile(peak["peak"] + costs.reserved_overhead()),
        "cpu_params": per_rank(res.cpu_params),
        "cpu_grads": tile(res.cpu_grads),
        "cpu_optimizer": tile(cpu_opt),
        "cpu_peak": tile(res.cpu_params + res.cpu_grads + cpu_opt + opt.cpu_step_temporaries),
    }, index=index), costs.mesh.tensor)


def per_global_rank(table: pd.DataFrame, tensor: int) -> pd.DataFrame:
    """The data-parallel ranks' rows, each once per tensor rank (innermost: global rank r is data-parallel
    rank r // T); every tensor rank holds the same bytes, the TP-local shapes dividing evenly (shardviz.tp)."""
    if tensor == 1:
        return table
    out = table.iloc[np.repeat(np.arange(len(table)), tensor)].reset_index(drop=True)
    out.insert(3, "tensor", np.tile(np.arange(tensor), len(table)))
    out["rank"] = np.arange(len(out))
    return out


#: comm_table's columns before ``dim``, and the kinds of collective in the order ``_moved`` stacks them
ROW_FIELDS = ("unit", "collective", "phase", "group", "group_size", "count", "dtype", "bytes")
KINDS = ("all_gather", "reduce_scatter", "all_reduce")


def _moved(costs: CostModel) -> tuple[np.ndarray, np.ndarray]:
    """Per kind of collective (``KINDS``) and call: the bytes it moves, and their dtype."""
    units = costs.units
    nbytes = np.array([[u.gather for u in units], [u.rs_input for u in units], [u.rs_output for u in units]],
                      dtype=np.int64)
    dtypes = np.array([[u.gather_dtype for u in units], [u.reduce_dtype for u in units], [u.reduce_dtype for u in units]],
                      dtype=object)
    return nbytes, dtypes


def _collective_columns(costs: CostModel, extra: list[tuple]) -> tuple[dict, np.ndarray, list[tuple]]:
    """``ROW_FIELDS`` as columns: one entry per collective the step issues, then one per ``extra`` row
    (``ROW_FIELDS`` tuples); each entry's ring and the rings, the few distinct (collective, group,
    size), each priced once. The call of an FSDP collective and its kind, read once per ring, pick
    what it moves (``_moved``)."""
    collectives = costs.step.collectives
    call, kinds, phase, group, gsize, count = zip(*collectives) if collectives else ((),) * 6
    rings: dict[tuple, int] = {}
    ring = [rings.setdefault(key, len(rings)) for key in zip(kinds, group, gsize)]
    code = np.array([KINDS.index(c) for c, _, _ in rings], dtype=np.int64)[ring]  # the rings so far are FSDP's
    call = np.array(call, dtype=np.int64)
    nbytes, dtypes = _moved(costs)
    names = np.array([u.name for u in costs.units], dtype=object)
    unit, dtype, moved = names[call], dtypes[code, call].tolist(), nbytes[code, call]
    if extra:
        e_unit, e_kinds, e_phase, e_group, e_gsize, e_count, e_dtype, e_bytes = zip(*extra)
        ring += [rings.setdefault(key, len(rings)) for key in zip(e_kinds, e_group, e_gsize)]
        unit, moved = np.concatenate([unit, np.array(e_unit, dtype=object)]), np.concatenate([moved, e_bytes])
        kinds, phase, group, gsize, count = kinds + e_kinds, phase + e_phase, group + e_group, gsize + e_gsize, count + e_count
        dtype += e_dtype
    columns = dict(zip(ROW_FIELDS, (unit, kinds, phase, group, gsize, count, dtype, moved)))
    return columns, np.array(ring, dtype=np.int64), list(rings)


def _averager_rows(costs: CostModel) -> list[tuple]:
    """The exported gradient averager's all-reduce as a ``ROW_FIELDS`` row (none without it): it
    runs at the end of every backward, each micro-batch's."""
    avg = costs.averaging
    if avg is None:
        return []
    return [(None, "all_reduce", "backward", "world", costs.mesh.world // costs.mesh.tensor, costs.training.grad_accum,
             avg.dtype, avg.bytes)]


def comm_table(costs: CostModel, tensor_rows=(), efficiency: Efficiency | None = None) -> pd.DataFrame:
    """One row per collective per call per step: see ``docs/cost-model.md``. ``tensor_rows``: the
    tensor-parallel ones (``tp.tensor_collectives``, group "tensor"), after FSDP's; with a tensor
    dim the table has a ``dim`` column: "shard" | "replicate" | "tensor". ``efficiency``: the
    stack's (``steptime.efficiency_for``), whose ``collective_bus`` every call's ``time_s`` (the
    one duration, ``devices.collective_seconds``) runs at; None: the mesh's, else the default."""
    mesh = costs.mesh
    cols, ring, rings = _collective_columns(costs, [*_averager_rows(costs), *tensor_rows])
    group, gsize = cols["group"], cols["group_size"]
    twice = np.array([2 if c == "all_reduce" else 1 for c, _, _ in rings], dtype=np.int64)
    bw = np.array([_group_bandwidth(mesh, g, s) for _, g, s in rings], dtype=float)
    latency = np.array([ring_latency_s(c, s, _nodes_crossed(mesh, g, s)) for c, g, s in rings], dtype=float)
    n = np.asarray(gsize, dtype=np.int64)
    b = cols["bytes"]
    count = np.asarray(cols["count"], dtype=np.int64)
    # ring algorithm: all-gather / reduce-scatter send (n-1)/n of the full buffer per rank,
    # all-reduce (reduce-scatter + all-gather) twice that
    sent = (twice[ring] * b * (n - 1)) // np.maximum(n, 1)
    eff = efficiency or costs.mesh.efficiency or DEFAULT_EFFICIENCY
    time_s = collective_seconds(sent, bw[ring], latency[ring], eff)
    dim = {}  # with a tensor dim, which dim each row's group spans
    if mesh.tensor > 1:
        dims = {"shard": "shard", "post_forward": "shard", "replicate": "replicate", "tensor": "tensor",
                "world": "replicate" if mesh.is_hsdp else "shard"}
        dim["dim"] = _str_column([dims[g] for g in group])
    index = pd.RangeIndex(len(n))
    columns = {"unit": _object_column(cols["unit"], index), "collective": _str_column(cols["collective"]),
               "phase": _str_column(cols["phase"]),
               "group": _str_column(group), **dim, "group_size": n, "count": count, "dtype": _str_column(cols["dtype"]),
               "bytes": b, "sent_bytes": sent, "time_s": time_s, "latency_s": latency[ring]}
    # every column a new array: the frame may hold them without a copy
    df = pd.DataFrame(columns, index=index, copy=False)
    # bytes, sent_bytes and time_s are per call; a step issues each row ``count`` times
    df.attrs["time_per_step_s"] = float((time_s * count).sum())  # NaN when a bandwidth it needs is unknown
    return df


#: The dtype pandas' constructor infers for a column of str, read once from pandas itself: "str"
#: (``StringDtype(na_value=nan)``) on pandas 3, object on pandas 2; the tables keep it on either.
STR_DTYPE = pd.DataFrame({"s": ["a"]})["s"].dtype


def _str_column(values):
    """A column of str with the dtype pandas would infer (``STR_DTYPE``), built without the
    inference, which is most of a small frame's construction; an empty one stays as it is (pandas
    makes that float64)."""
    return pd.array(values, dtype=STR_DTYPE) if len(values) else values


def _object_column(values, index: pd.Index) -> pd.Series:
    """A column of str and None kept as objects (pandas would infer str, None becoming NaN), on
    the frame's own ``index``, so that the frame need not align it."""
    return pd.Series(values, dtype=object, index=index)


def _nodes_crossed(mesh, group: str, size: int) -> int:
    """How many nodes a ring over this process group visits (1: it stays inside one node)."""
    rpn = mesh.ranks_per_node
    t = mesh.tensor  # innermost: a tensor group's ranks are consecutive, a shard group's T apart
    if group in ("tensor", "shard", "post_forward"):
        span = {"tensor": t, "shard": mesh.shard * t, "post_forward": size * t}[group]  # consecutive ranks covered
        return 1 if span <= rpn and rpn % span == 0 else min(size, -(-span // rpn))
    # replicate (one rank of every shard group) and world: spread over the nodes the whole mesh tiles
    return 1 if mesh.world <= rpn else min(size, -(-mesh.world // rpn))


def _group_bandwidth(mesh, group: str, size: int) -> float:
    """GB/s per rank of a ring over this process group (NaN when unknown). Inside a node: the
    intra-node link. Across nodes NCCL runs one ring per NIC (channels), each leaving a node through
    its own NIC, so the ranks a group has on each node share the node's network bandwidth
    (``Mesh.node_network_gbps``, their share of the node's GPUs), and a ring over them is never
    faster than the intra-node link it also crosses (docs/step-time.md, "The links")."""
    nodes = _nodes_crossed(mesh, group, size)
    if nodes == 1:
        return float("nan") if mesh.intra_node_gbps is None else float(mesh.intra_node_gbps)
    if mesh.inter_node_gbps is None:
        return float("nan")
    per_node = max(1, min(mesh.ranks_per_node, -(-size // nodes)))  # the group's ranks on one node
    network = mesh.node_network_gbps * per_node / mesh.ranks_per_node
    if per_node == 1 or mesh.intra_node_gbps is None:
        return float(network)
    return float(min(network, mesh.intra_node_gbps))


# NCCL's own latency model of a ring, Simple protocol (src/graph/tuning.cc, ncclTunerConstantsDefaults
# and ncclTopoTuneModel): a base of 8.4 us, 3.4 us per step over NVLink, 14 us per step over the
# network; n - 1 steps for an all-gather or reduce-scatter (nodes - 1 of them across nodes), twice
# that for an all-reduce.
RING_BASE_US, RING_NVLINK_STEP_US, RING_NET_STEP_US = 8.4, 3.4, 14.0


def ring_latency_s(collective: str, size: int, nodes: int) -> float:
    """Seconds a ring ``collective`` over ``size`` ranks spanning ``nodes`` nodes takes before any
    byte counts (alpha of alpha + n / beta); 0 for a group of one."""
    if size <= 1:
        return 0.0
    twice = 2 if collective == "all_reduce" else 1
    steps, net = twice * (size - 1), twice * (nodes - 1)
    return (RING_BASE_US + (steps - net) * RING_NVLINK_STEP_US + net * RING_NET_STEP_US) * 1e-6


def peak_breakdown(costs: CostModel, rank: int | None = None) -> dict[str, int]:
    """What is alive at ``rank``'s peak (default: the worst rank), by ``BREAKDOWN`` kind, in bytes.

    The one breakdown every view draws: its values sum to ``a.memory.peak`` of that rank."""
    if rank is None:
        rank = worst_rank(memory_table(costs))
    _, coord = costs.mesh.coords(rank)
    res = costs.resident
    opt = int(costs.optimizer.device[coord] + costs.optimizer.whole)
    out = dict.fromkeys(BREAKDOWN, 0)
    out.update({"sharded params": res.params_sharded, "whole params": res.params_whole,
                "buffers": res.buffers + res.quant_state, "optimizer states": opt})  # quant_state: held as a buffer is
    moment = costs.step.moment
    if moment is None or costs.in_optimizer_step()[coord]:
        out["gradients"] = res.grads
        out["temporaries"] = int(costs.optimizer.step_temporaries[coord])
    else:
        alive = moment.alive
        out.update({"gradients": alive.gradients, "unsharded params": alive.unsharded_params,
                    "communication buffers": alive.communication_buffers, "activations": alive.activations,
                    "temporaries": alive.temporaries})
    return {k: int(v) for k, v in out.items()}
