"""``sv.analyze``: tree + plan + mesh (+ training) -> tables. Computed lazily, never touching the model.

The pipeline, one stage after the other (each computed on first use, once):

1. the tree (``tree.ModelTree``; with a tensor dim, its TP-local shapes: ``tp.local_tree``);
2. the plan (``plan.Plan``: the ``fully_shard`` calls, ignored parameters, checkpointing);
3. the layout (``fsdp.Layout``: what each call holds, per rank): ``params``, ``units``;
4. the activation profile (one training step run by torch: ``activations.measure_activations``):
   ``activation_profile``, ``activations``, ``flops``;
5. the step in bytes (``cost.cost_model``): ``memory``, ``fit``, ``comm``;
6. the step in seconds (``step.timing.step_time`` of the stages ``step_inputs`` hands it): ``time``,
   ``step``, ``timeline()``;
7. the findings (``checks.findings_of`` the analysis read as ``check_inputs.AnalysisView``).
"""

from __future__ import annotations

from dataclasses import replace
from functools import cached_property

import numpy as np
import pandas as pd
from torch import nn

from .activations import (FLOP_COLUMNS, MeasuredStep, StepCache, measure_activations, read_run_order,
                          selective_cache_refusal, step_cache, unit_flops)
from .checks.check_inputs import Priced, reduce_scatter_sent
from .checks import findings_of, without_what_ifs
from .step import (NoActivations, activation_levels, calls_with_nested_calls, comm_table, cost_model,
                   memory_table)
from .step import peak_breakdown as peak_breakdown_of
from .step.collectives import Collectives, step_collectives
from .step.params import tree_arrays
from .run.mesh import worst_rank
from .run.training import DEFAULT_TRAINING
from .finding import Finding
from .fsdp import Layout, parse_version
from .run.mesh import Mesh
from .plan import Plan, as_plan
from .presets import auto_plan
from .step.timing import StepInputs, StepSummary, StepTime, efficiency_for, timeline_figure, timeline_payload
from .step.timing import step_time as time_the_step
from .tp import cached_local_model, local_tree, tensor_collectives
from .model.tree import ModelTree, as_tree


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


class Analysis:
    """What a plan does on a mesh: the stages of the module docstring, each built on first
    access. Tables are pandas DataFrames."""

    # -- 1-3. the tree, the plan, the layout ---------------------------------------------------
    def __init__(self, tree: ModelTree, plan: Plan, mesh: Mesh, training=None, torch_version=None, model=None):
        # with a tensor dim, the FSDP rules run on the TP-local tree (shardviz.tp): every parameter
        # at its parallelize_module local shape; full_tree keeps the model's own shapes
        self.full_tree, self.tp_placements = tree, {}
        if mesh.tensor > 1 and plan.tensor_parallel:
            tree, self.tp_placements = local_tree(tree, plan.tensor_parallel, mesh.tensor)
        self.tree, self.plan, self.mesh = tree, plan, mesh
        # The release the plan will run on: the findings follow it (None: the installed torch).
        self.torch_version = torch_version
        self.training = training if training is not None else DEFAULT_TRAINING  # == Training()
        self.layout = Layout(tree, plan, mesh)
        # the module itself, held only when it is run: to measure activations, or to see the order its
        # modules run in when calls are nested (their gradients interleave by it, step.walk)
        self.model = (model if model is not None else tree.model) if self._runs_a_step() else None

    def _runs_a_step(self) -> bool:
        return self.training.with_activations or bool(calls_with_nested_calls(self.layout))

    def what_if(self, plan: Plan | None = None, mesh: Mesh | None = None, training=None) -> "Analysis":
        """The same model with another plan, mesh or training (the memory check prices its fixes so)."""
        return Analysis(self.full_tree, plan or self.plan, mesh or self.mesh, training or self.training,
                        self.torch_version, self.model)

    def without_kv_cache(self) -> "Analysis":
        """The same analysis, the step run with ``use_cache=False`` (SV113 prices the key/value
        cache a Hugging Face config keeps so)."""
        return self.what_if(training=replace(self.training, use_cache=False))

    # -- 3. the layout's tables: what each fully_shard call holds, per parameter and per call ----
    def local_shape(self, fqn: str, rank: int) -> tuple[int, ...]:
        return self.layout.local_shape(fqn, rank)

    def unit_label(self, unit_index: int) -> str | None:
        return None if unit_index < 0 else self.plan.units[unit_index].name

    @cached_property
    def params(self) -> pd.DataFrame:
        """One row per parameter, built a column at a time from the tree's arrays (1,843 rows on 70B)."""
        lay, params, shard = self.layout, self.tree.params, self.mesh.shard
        arr, sharded = tree_arrays(self.tree), lay.sharded
        padded = arr.padded(shard)  # the padded shard elements of each parameter, were it sharded
        table = pd.DataFrame({
            "fqn": [p.fqn for p in params],
            "aliases": [p.fqns[1:] for p in params],
            "shape": [p.shape for p in params],
            "dtype": [_dtype_name(p.dtype) for p in params],
            "numel": [p.numel for p in params],
            "bytes": [p.nbytes for p in params],
            "requires_grad": [p.requires_grad for p in params],
            "role": [p.role for p in params],
            "status": lay.param_status,
            # None (not NaN) for "no owning call", as the API promises
            "unit": pd.Series([self.unit_label(u) for u in lay.param_unit], dtype=object),
            "shard_shape": [lay.shard_shape(p.index) if s else p.shape for p, s in zip(params, sharded.tolist())],
            "shard_bytes": np.where(sharded, padded, arr.numel) * arr.itemsize,
            "padding_numel": np.where(sharded, padded * shard - arr.numel, 0),
        })
        if self.tp_placements:  # a 2-D mesh: shape, numel and bytes are one tensor rank's; the model's shape beside
            table.insert(3, "full_shape", [p.shape for p in self.full_tree.params])
            table.insert(4, "tp_placement", [self.tp_placements.get(p.index) for p in self.tree.params])
        return table

    @cached_property
    def units(self) -> pd.DataFrame:
        lay, rows = self.layout, []
        for ul, numbers in zip(lay.units, lay.unit_numbers):
            rows.append({
                "unit": ul.unit.name,
                "modules": list(ul.unit.modules),
                "order": ul.order,
                "is_root": ul.is_root,
                "reshard_after_forward": ul.reshard_after_forward,
                **numbers,
            })
        columns = ["unit", "modules", "order", "is_root", "reshard_after_forward", "n_params", "numel",
                   "trainable_numel", "unsharded_bytes", "padded_unsharded_bytes", "padded_shard_bytes"]
        return pd.DataFrame(rows, columns=columns).sort_values("order", ignore_index=True)

    # -- 4. the activation profile: one training step measured by torch --------------------------
    @cached_property
    def cache(self) -> StepCache:
        """The step's key/value-cache decision (``activations.step_cache``): its ``use_cache`` and why."""
        return step_cache(self.tree.model, self.training, bool(self.plan.checkpoint))

    @property
    def use_cache(self) -> bool:
        """The ``use_cache`` the training step runs with (``Training.step_use_cache``): the
        training's, else the config's, off with checkpointing (Hugging Face's rule)."""
        return self.cache.use_cache

    @cached_property
    def measured_step(self) -> MeasuredStep | None:
        """The activation stage (``activations.MeasuredStep``): the step measured by torch and, when
        torch cannot run it with the cache asked for, why it was measured without; None without
        ``Training.batch_size``. The profiles are cached across analyses (in ``activations``' one cache)."""
        if not self.training.with_activations:
            return None
        return self._measure(self.training.batch_size, self.training.seq_len)

    def measure_ahead(self) -> None:
        """The step measured into the activations' one cache, as ``measured_step`` measures it, but
        outside every cached property (the widget's look-ahead: an edit lets its measurement run on,
        and in Python 3.11 a ``cached_property`` holds one lock for every instance while it computes)."""
        if self.training.with_activations:
            self._measure(self.training.batch_size, self.training.seq_len)

    @property
    def activation_profile(self):
        """The step's activations measured by torch (``activations.measure_activations``), or None
        without ``Training.batch_size``."""
        measured = self.measured_step
        return None if measured is None else measured.profile

    @property
    def measures(self) -> bool:
        """A live model runs the step, so activations can be measured (the findings read it)."""
        return self.model is not None

    @property
    def cache_refused(self) -> str | None:
        """Why the step was priced without the key/value cache the training asks for (torch cannot
        run the plan with it); None: priced as asked (or no step measured)."""
        measured = self.measured_step
        return None if measured is None else measured.cache_refused

    def _live_model(self):
        if self.model is None:
            raise ValueError("Training(batch_size=...) measures activations by running the model, which no longer "
                             "exists: pass the nn.Module (or a ModelTree of a live module) to analyze")
        return self.model

    @property
    def measured_model(self):
        """The module whose step is measured: the model, or with tensor parallelism one tensor rank's
        local copy of it (its local parameters, the gathers its styles do; made once per degree)."""
        model = self._live_model()  # none left: the error that says so
        return self._tp_local_model if self.tp_placements else model

    def _measure(self, batch_size: int, seq_len: int) -> MeasuredStep:
        model, tree, lay, t = self.measured_model, self.tree, self.layout, self.training
        if self.tp_placements:
            tree = None  # the local copy's own walk
        # parameters FSDP leaves whole keep their dtype under mixed precision: only then do they matter
        whole = frozenset(f for p in self.tree.params if lay.param_status[p.index] != "sharded" for f in p.fqns) \
            if t.param_dtype else frozenset()
        measure = lambda use_cache: measure_activations(  # noqa: E731
            model, batch_size, seq_len, param_dtype=t.param_dtype, whole_params=whole, checkpoint=self.plan.checkpoint,
            example_inputs=t.example_inputs, tree=tree, use_cache=use_cache)
        refused = None
        if self.use_cache and (refusal := selective_cache_refusal(self.plan.checkpoint, True)):
            refused = refusal  # torch raises in that step's backward: there is no such step
        elif self.use_cache:
            try:
                return MeasuredStep(self._with_cache_note(measure(True)))
            except ValueError as exc:  # the cache's step fails in torch (or cannot be measured): try without it
                if not self.plan.checkpoint:
                    raise
                refused = f"the step with use_cache=True cannot be measured: {exc}"
        return MeasuredStep(self._with_cache_note(measure(False), refused), refused)

    def _with_cache_note(self, profile, refused: str | None = None):
        """The profile with the ``use_cache`` it was measured with, and why, in its assumptions."""
        if refused:
            note = (f"use_cache=False: torch cannot run this plan with the key/value cache, priced without it "
                    f"({refused[:300]})")
        elif self.cache.why is None:
            return profile
        else:
            note = self.cache.why
        return profile.with_note(note)

    @cached_property
    def _tp_local_model(self):
        return cached_local_model(self.model, self.full_tree, self.tp_placements, self.plan.tensor_parallel, self.mesh.tensor)

    @cached_property
    def run_order(self) -> tuple[str, ...] | None:
        """Module names in the order a training step first runs them, when one is measured: with
        activations, or (a step of batch 1) when calls are nested; None: registration order."""

        profile = self.activation_profile
        if profile is None and self.model is not None:
            try:  # the order does not depend on dtypes or checkpointing: one small forward serves every plan
                return read_run_order(self._live_model(), min(self.training.seq_len, 32),
                                      example_inputs=self.training.example_inputs, tree=self.full_tree)
            except Exception:  # a model this cannot run keeps registration order (docs/cost-model.md, Limits)
                return None
        return None if profile is None else profile.run_order

    @cached_property
    def activations(self) -> pd.DataFrame:
        """Saved-for-backward bytes per call and per block, with and without checkpointing (the
        columns of ``ActivationProfile.table``); empty without ``Training.batch_size``."""
        profile = self.activation_profile
        if profile is None:
            return pd.DataFrame(columns=["fqn", "type", "block", "checkpointed", "saved", "saved_plain",
                                         "saved_checkpointed"])
        names = list(dict.fromkeys([u.modules for u in self.plan.units] + [(b,) for b in profile.blocks]))
        return profile.table(names)

    @cached_property
    def flops(self) -> pd.DataFrame:
        """FLOPs of one training step on one rank (one micro-batch), counted by torch's
        ``FlopCounterMode`` in the pass that measures the activations: one row per call in forward
        order with its modules' own FLOPs (a nested call's are its own): unit, forward_flops,
        backward_flops, recompute_flops (checkpointed modules' forward again in backward); a last
        row with unit None for what runs outside every call, if anything. Empty without
        ``Training.batch_size``: there is no step to count."""
        profile = self.activation_profile
        rows = unit_flops(profile, self.plan.units) if profile is not None else []
        return pd.DataFrame(rows, columns=FLOP_COLUMNS)

    @property
    def flop_totals(self) -> dict[str, int]:
        """``flops``: the step's FLOPs (one rank, one micro-batch) with recomputation,
        ``model_flops``: without it; zeros without ``Training.batch_size``."""
        profile = self.activation_profile
        if profile is None:
            return {"flops": 0, "model_flops": 0}
        return {"flops": profile.flops, "model_flops": profile.model_flops}

    def activation_levels(self):
        """Activation bytes around every call of the step (zero without ``Training.batch_size``)."""
        if not self.training.with_activations:
            return NoActivations()
        return activation_levels(self.activation_profile, self.tree)

    # -- 5. the step in bytes: memory per rank and traffic (cost.CostModel) ----------------------
    @cached_property
    def costs(self):
        """The cost model (``cost.CostModel``): built once, from the layout and the activation levels."""
        return cost_model(self.tree, self.layout, self.mesh, self.training, self.activation_levels(), self.run_order)

    @cached_property
    def memory(self) -> pd.DataFrame:
        return memory_table(self.costs)

    @property
    def fit(self):
        """The fits verdict of the worst rank (``Mesh.fit`` -> ``devices.memory_fit``): its allocated
        peak judged on the caching allocator's reserved peak (``memory.reserved_peak``) under the
        mesh's allocator setting and safety margin, and when anything is offloaded the host RAM of a
        node (the worst rank's ``memory.cpu_peak`` x ``Mesh.host_ranks``) against ``Mesh.host_memory``;
        None without device memory."""
        mem = self.memory
        offloaded = int(mem["cpu_params"].max()) > 0  # without offload cpu_peak holds only Adam's CPU step scalars
        return self.mesh.fit(int(mem["peak"].max()), int(mem["reserved_peak"].max()),
                             int(mem["cpu_peak"].max()) if offloaded else 0)

    def peak_breakdown(self, rank: int | None = None) -> dict[str, int]:
        """What is alive at the peak of ``rank`` (default: the worst rank), in bytes, by kind:
        sharded params, whole params, buffers, optimizer states, gradients, unsharded params,
        communication buffers, activations, temporaries. The values sum to ``memory.peak``."""
        return peak_breakdown_of(self.costs, worst_rank(self.memory) if rank is None else rank)

    @cached_property
    def comm(self) -> pd.DataFrame:
        table = comm_table(self.costs, self.collectives)
        if self.tp_placements and not self.training.with_activations:
            table.attrs["tensor_parallel"] = ("the tensor-parallel collectives move activations: give "
                                              "Training(batch_size=..., seq_len=...) to count them")
        return table

    @cached_property
    def collectives(self) -> Collectives:
        """Every collective of the step, priced once at the stack's efficiency: ``comm`` shows them,
        the step time schedules them (``step.collectives``)."""
        return step_collectives(self.costs, self._tensor_rows(), efficiency_for(self.tree, self.mesh))

    def _tensor_rows(self) -> list[tuple]:
        """The TP collectives as ``step_collectives`` rows: (call index, collective, phase, group,
        group size, dtype, bytes), one per module and kind, each issued once a micro-batch; a
        checkpointed module's forward ones again in backward (its recompute). None without a tensor
        dim or a micro-batch (their size is its)."""
        t = self.training
        if not self.tp_placements or not t.with_activations:
            return []
        dtype = t.param_dtype or _dtype_name(next(p.dtype for p in self.full_tree.params if p.dtype.is_floating_point))
        itemsize = {"float32": 4, "float64": 8}.get(dtype, 2)
        tokens, lay, rows = t.batch_size * t.seq_len, self.layout, []
        checkpointed = [self.tree.module_index[c] for c in self.plan.checkpoint]
        for fqn, collective, phase, width in tensor_collectives(self.full_tree, self.plan.tensor_parallel):
            m = self.tree.module_index[fqn]
            elements = -width if width < 0 else tokens * width  # < 0: a parameter gradient's elements
            row = (lay.module_unit[m], collective, phase, "tensor", self.mesh.tensor, dtype, elements * itemsize)
            rows.append(row)
            if phase == "forward" and any(self.tree.is_inside(m, c) for c in checkpointed):
                rows.append(row[:2] + ("backward",) + row[3:])
        return rows

    # -- 6. the step in seconds: FSDP2's schedule (steptime) --------------------------------------
    @property
    def step_inputs(self) -> StepInputs:
        """The stages the step time reads (``step.timing.StepInputs``), the costly ones as functions
        computed on first call. Made on each read, not kept: kept, its functions would close a cycle
        (analysis -> inputs -> function -> analysis), and an analysis dropped (a search prices
        dozens) would wait, with its ~10,000 objects (schedule events, collectives, calls), for the
        cyclic gc instead of being freed at once (issue 37)."""
        return StepInputs(self.layout, self.training, flops=lambda: self.flops, profile=lambda: self.activation_profile,
                          collectives=lambda: self.collectives, calls=lambda: self.costs.calls,
                          memory=lambda: self.memory)

    @cached_property
    def step_time(self) -> StepTime:
        """The step as FSDP2 schedules it (``step.timing.StepTime``), computed once: ``time``, ``step``
        and ``timeline()`` read it. Needs ``Mesh(device=...)`` and ``Training(batch_size=...)``."""
        return time_the_step(self.step_inputs)

    @property
    def time(self) -> pd.DataFrame:
        """One row per call (the root first, then forward order), seconds per rank of the micro-batch
        that reduces: forward, backward, recompute, all-gathers, reduce-scatter, all-reduce, and the
        exposed communication (the compute stream waiting on it). Empty, with ``attrs["reason"]``,
        without a device or a micro-batch."""
        return self.step_time.table

    @property
    def step(self) -> StepSummary:
        """The step's figures (``step.timing.StepSummary``): step_time_s (one optimizer step, every
        micro-batch), tokens_per_s (per rank), mfu, hfu, exposed_comm_s, compute_s, flops and
        model_flops (per rank, one micro-batch), grad_accum, step_time_sync_every_s (reducing on every
        micro-batch), device, dtype; ``reason`` (and None figures) when there is no step to time
        (docs/step-time.md)."""
        return self.step_time.step

    def timeline(self):
        """The step as a plotly figure: compute and communication streams, unit by unit, exposed
        communication in red (``step.timing.timeline_payload``, the payload the report and the Inspector draw)."""
        return timeline_figure(timeline_payload(self.step_time))

    # -- 7. findings -----------------------------------------------------------------------------
    @cached_property
    def findings(self) -> list[Finding]:
        """Every finding, errors first: the engine's refusals, the plan checks, memory (``checks.findings_of``
        the analysis read as ``check_inputs.AnalysisView``)."""
        return findings_of(self)

    @property
    def first_findings(self) -> list[Finding]:
        """``findings`` once computed; before, the findings without their what-ifs
        (``checks.without_what_ifs``): the checks' own time, with SV201's fixes, SV113's and SV304's
        figures marked ``pending``. The Inspector shows them first, then ``findings``."""
        return self.findings if "findings" in self.__dict__ else self._findings_without_what_ifs

    @cached_property
    def _findings_without_what_ifs(self) -> list[Finding]:
        return findings_of(without_what_ifs(self))

    def price(self, plan: Plan | None = None, mesh: Mesh | None = None, training=None, *, timed: bool = False,
              traffic: bool = False) -> Priced:
        """This model with another plan, mesh or training, priced (``check_inputs.Priced``): its peaks;
        ``timed``: its step time; ``traffic``: its reduce-scatter bytes. The findings' what-ifs."""
        variant = Analysis(self.full_tree, plan or self.plan, mesh or self.mesh, training or self.training,
                           self.torch_version, self.model)
        memory = variant.memory
        return Priced(int(memory["peak"].max()), int(memory["reserved_peak"].max()),
                      variant.step.step_time_s if timed else None,
                      reduce_scatter_sent(variant.comm) if traffic else None)

    @property
    def errors(self) -> list[Finding]:
        return list(self.layout.errors)

    def summary(self) -> str:
        counts = self.params["status"].value_counts().to_dict()
        return (
            f"{self.tree.root_type} on {self.mesh}: {len(self.plan.units)} fully_shard calls, "
            f"{len(self.tree.params)} parameters: "
            + ", ".join(f"{counts.get(s, 0)} {s}" for s in Layout.STATUS)
        )

    def __repr__(self) -> str:
        return f"<shardviz.Analysis {self.summary()}>"


def analyze(model, plan=None, mesh: Mesh | None = None, training=None, *, strict: bool = True,
            torch_version=None) -> Analysis:
    """Apply the FSDP2 rules of ``plan`` to ``model`` (an nn.Module or a ModelTree) on ``mesh``.

    ``strict``: raise ``PlanError`` (a ValueError) when torch itself would refuse the plan;
    with ``strict=False`` those reasons are in ``findings`` instead (the widget uses this).
    ``torch_version``: the release the plan will run on ("2.6", ...); ``findings`` follow it
    (SV101 for ``ignored`` before 2.7, SV110 for a grouped call before 2.5). Default: the installed torch.
    ``training``: an ``sv.Training``; None: ``sv.Training()``, the one default every entry point
    assumes (AdamW, bf16 parameters, fp32 reduction; ``run.training.DEFAULT_TRAINING``).
    """
    tree = as_tree(model)
    plan = as_plan(plan) if plan is not None else auto_plan(tree)
    mesh = mesh if mesh is not None else Mesh(shard=8)
    if not isinstance(mesh, Mesh):
        raise ValueError(f"mesh must be a shardviz.Mesh, got {type(mesh).__name__}")
    if torch_version is not None:
        parse_version(torch_version)  # a bad version string fails here, not in the findings
    result = Analysis(tree, plan, mesh, training, torch_version, model=model if isinstance(model, nn.Module) else None)
    if strict:
        result.layout.raise_for_errors()
    return result
