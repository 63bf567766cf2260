"""``CostModel``: everything ``a.memory``, ``a.comm`` and ``a.peak_breakdown`` need, built once per
analysis from explicit inputs (the tree, the layout, the mesh, the training, the activation levels),
and its tables: memory per rank (``memory_table``), communication per step (``comm_table``), the
peak's breakdown (``peak_breakdown``).

Ranks differ only by their shard coordinate: per-rank columns are computed for the ``shard``
coordinates and tiled over the replicas. Columns and formulas: ``docs/cost-model.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..activations import stop
from .allocator import cublas_workspace_bytes
from .params import code_names, sharded_params, tree_arrays, whole_params
from .reserved import traced_step
from .simulation import Alive, StepResult
from .rank_state import GradientAveraging, OptimizerState, ResidentState, gradient_averaging, optimizer_state, resident_state
from ..run.mesh import worst_rank
from ..run.training import Training
from .calls import OUTSIDE, Call, build_calls, root_post_forwards
from .collectives import Collectives
from .walk import execution_walk


@dataclass(frozen=True)
class CostModel:
    """``units``: the ``Call`` of each ``fully_shard`` call with parameters, in plan order; the
    resident state and the optimizer states per shard coordinate; ``step``: the simulated
    forward + backward (``step.simulation``)."""

    mesh: object  # run.Mesh
    training: Training
    units: list[Call]
    resident: ResidentState
    optimizer: OptimizerState
    averaging: GradientAveraging | None
    step: StepResult
    replay_inputs: tuple = ()  # what ``reserved_overhead`` replays the step with (``step.reserved``)
    calls: tuple[Call, ...] = ()  # every call, those without parameters included (the schedule reads them too)
    _reserved: dict = field(default_factory=dict, compare=False, repr=False)
    # torchao float8 all-gather weights: precompute_float8_dynamic_scale_for_fsdp's one all-reduce a step
    # of every sharded float8 weight's amax, as (dtype name, bytes); None without such weights
    float8_amax: tuple | None = None

    def reserved_overhead(self, expandable_segments: bool | None = None) -> int:
        """Bytes the caching allocator reserves beyond the bytes tensors hold at the peak, under
        ``expandable_segments`` (None: the mesh's setting): the replay of the step through the
        allocator's rules (``step.reserved``), its reserved peak less its requested peak. The
        mesh's setting was replayed with the step (``cost_model``); the other is replayed here."""
        if expandable_segments is None:
            expandable_segments = self.mesh.expandable_segments
        if expandable_segments not in self._reserved:
            if not self.replay_inputs:
                return 0
            _, self._reserved[expandable_segments] = replayed_step(self.replay_inputs, self.resident, self.optimizer,
                                                                   expandable_segments, self.mesh.device)
        return self._reserved[expandable_segments]

    def in_optimizer_step(self) -> np.ndarray:
        """Per shard coordinate: the peak is in ``optimizer.step()`` rather than forward/backward."""
        resident = self.resident.total
        return resident + self.resident.grads + self.optimizer.step_temporaries > resident + self.step.peak


def cost_model(tree, layout, mesh, training: Training, levels, run_order=None) -> CostModel:
    """The cost model of ``layout`` (``fsdp.Layout`` of ``tree``) on ``mesh``; ``levels``: the
    activation levels of the step (``step.levels``); ``run_order``: module names in the order a
    measured step first ran them (None: registration order, ``step.walk``)."""
    stop.check()  # pure Python at 70B (tenths of a second): the Inspector's next edit stops it here
    S = mesh.shard
    arr = tree_arrays(tree)
    walk = execution_walk(tree, run_order)
    policies = [training.unit_defaults(ul.unit) for ul in layout.units]
    sh = sharded_params(arr, layout, policies, S)
    whole = whole_params(arr, layout, sh)
    calls = build_calls(arr, layout, tree.modules, walk, policies, sh, whole, S, training.with_activations)
    units = [c for c in calls if c.managed]
    averaging = gradient_averaging(training, arr, whole, S * mesh.replicate)
    inputs = (units, root_post_forwards(layout, walk), whole.unmanaged_grads, averaging, levels,
              S, mesh.replicate, training.grad_accum, training.sync_every_microbatch)
    resident, optimizer = resident_state(arr, sh, whole, units, S), optimizer_state(training, arr, sh, whole, S)
    # the step simulated once, its tensors replayed through the caching allocator as it runs (every
    # a.memory shows the reserved peak under the mesh's allocator setting)
    step, overhead = replayed_step(inputs, resident, optimizer, mesh.expandable_segments, mesh.device)
    return CostModel(mesh, training, units, resident, optimizer, averaging, step, inputs, tuple(calls),
                     {mesh.expandable_segments: overhead}, float8_amax(sh))


def float8_amax(sh) -> tuple | None:
    """(dtype, bytes) of ``precompute_float8_dynamic_scale_for_fsdp``'s all-reduce (torchao
    float8/fsdp_utils.py): ``torch.stack(torch._foreach_norm(weights, inf))`` of every sharded float8
    all-gather weight, one amax each in the weight's own dtype, then one all-reduce over the shard group."""
    forced = sh.pd_dtype != sh.grad_dtype  # gathered in float8, computed in the param dtype (cost.params)
    if not forced.any():
        return None
    return code_names()[int(sh.dtype[forced][0])], int(sh.itemsize[forced].sum())


def replayed_step(inputs: tuple, resident: ResidentState, optimizer: OptimizerState, expandable_segments: bool,
                  device) -> tuple[StepResult, int]:
    """The step (``StepSimulation.run``'s result) and the bytes the caching allocator reserves beyond the
    tensors at its peak under ``expandable_segments``, from one run of the step with its tensors
    replayed (``step.reserved.traced_step``) after the resident state."""
    stop.check()  # pure Python at 70B (tenths of a second): the Inspector's next edit stops it here
    resident_bytes = int(resident.total + optimizer.device.max() + optimizer.whole)
    step, alloc = traced_step(*inputs, resident_bytes, int(optimizer.step_temporaries.max()), expandable_segments, device)
    tensors = alloc.peak_requested - cublas_workspace_bytes(device)  # what a.memory.peak counts
    overhead = max(alloc.peak_reserved - tensors, 0)
    alloc.forget()  # its blocks freed now, not left to the cyclic GC (~0.2 ms of its time an analysis)
    return step, overhead


# ---------------------------------------------------------------------------
# The tables
# ---------------------------------------------------------------------------
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
        # allocator setting: the peak plus what its segments hold beyond the tensors (step.reserved)
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


def comm_table(costs: CostModel, collectives: Collectives) -> pd.DataFrame:
    """One row per collective per call per step: see ``docs/cost-model.md``. ``collectives``: the
    step's, priced (``collectives.step_collectives`` of ``costs``, tensor parallelism's included:
    group "tensor"); with a tensor dim the table has a ``dim`` column: "shard" | "replicate" |
    "tensor". ``time_s`` is one call's duration (``collectives.collective_seconds``)."""
    mesh, c = costs.mesh, collectives
    names = [u.name for u in costs.calls]
    group = c.group
    dim = {}  # with a tensor dim, which dim each row's group spans
    if mesh.tensor > 1:
        dims = {"shard": "shard", "post_forward": "shard", "replicate": "replicate", "tensor": "tensor",
                "world": "replicate" if mesh.is_hsdp else "shard"}
        dim["dim"] = _str_column([dims[g] for g in group])
    n = np.asarray(c.group_size, dtype=np.int64)
    count = np.asarray(c.count, dtype=np.int64)
    index = pd.RangeIndex(len(n))
    unit = [None if k == OUTSIDE else names[k] for k in c.call]
    columns = {"unit": _object_column(unit, index), "collective": _str_column(c.collective),
               "phase": _str_column(c.phase),
               "group": _str_column(group), **dim, "group_size": n, "count": count, "dtype": _str_column(c.dtype),
               "bytes": c.nbytes, "sent_bytes": c.sent, "time_s": c.time_s, "latency_s": c.latency_s}
    # every column a new array: the frame may hold them without a copy
    df = pd.DataFrame(columns, index=index, copy=False)
    # bytes, sent_bytes and time_s are per call; a step issues each row ``count`` times
    df.attrs["time_per_step_s"] = float((c.time_s * count).sum())  # NaN when a bandwidth it needs is unknown
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
