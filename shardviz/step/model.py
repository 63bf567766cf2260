"""``CostModel``: everything ``a.memory``, ``a.comm`` and ``a.peak_breakdown`` need, built once per
analysis from explicit inputs (the tree, the layout, the mesh, the training, the activation levels)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..activations import stop
from .allocator import cublas_workspace_bytes
from .params import code_names, sharded_params, tree_arrays, whole_params
from .reserved import traced_step
from .simulation import StepResult
from .rank_state import GradientAveraging, OptimizerState, ResidentState, gradient_averaging, optimizer_state, resident_state
from ..run.training import Training
from .calls import Call, build_calls, root_post_forwards
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
