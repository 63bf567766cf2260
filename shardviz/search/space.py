"""What every candidate of one search shares (``Space``): the model, the mesh, the training, the
tensor degrees searched and the device limit, and how a ``Candidate`` becomes the Plan, Mesh and
Training that ``analyze`` takes. Built once per search and never changed (it remembers each
preset's plan, computed once)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

from ..activations import step_cache
from ..step import unsharded_bytes
from ..analysis import Analysis, analyze
from ..run.training import Training
from ..run import devices
from ..run.mesh import Mesh
from ..plan import Plan, Unit
from ..presets import auto_plan
from ..model.tree import ModelTree
from .candidates import Candidate, quant_words


@dataclass(frozen=True, eq=False)
class Space:
    """One search's model, mesh, training and options; ``plan`` / ``mesh_for`` / ``training_for``
    turn a candidate into what ``analyze`` takes."""

    tree: ModelTree
    mesh: Mesh
    training: Training
    tensors: tuple[int, ...] = (1,)  # the tensor degrees searched (search(..., tensor=...))
    tp_entries: dict = field(default_factory=dict)  # the model's own TP plan, when a degree > 1 is searched
    lean_offload: bool = True  # whether the leanest options offload (search(..., offload=...) allows it)
    _auto: dict = field(default_factory=dict, repr=False)  # (lora, checkpoint, tensor) -> Plan.auto
    _caches: dict = field(default_factory=dict, repr=False)  # (lora, checkpoint, tensor, batch, accum, use_cache) -> cache_of
    _state_peaks: dict = field(default_factory=dict, repr=False)  # (lora, tensor, quant) -> state_peak
    _unsharded: dict = field(default_factory=dict, repr=False)  # (lora, tensor, quant) -> unsharded

    @cached_property
    def limit(self) -> int:
        """Device memory less the reserve: what every verdict here uses."""
        return self.mesh.usable_memory

    @cached_property
    def usable_text(self) -> str:
        return devices.usable_text(self.mesh.device_memory, self.mesh.memory_reserve)  # "79.00 GiB usable"

    @cached_property
    def has_lora(self) -> bool:
        return any(p.role == "lora" for p in self.tree.params)

    @cached_property
    def quant_fqns(self) -> tuple[str, ...]:
        """The bitsandbytes 4-bit weights (packed ``Params4bit``): the storage knob's parameters."""
        return tuple(p.fqn for p in self.tree.params if p.quant)

    @cached_property
    def quant_words(self) -> dict[str, str]:
        """The storage knob's options named by what the model has: its quantized kinds and storage dtypes."""
        quant = [p for p in self.tree.params if p.quant]
        return quant_words([p.quant for p in quant], [p.dtype for p in quant])

    @property
    def has_quant(self) -> bool:
        return bool(self.quant_fqns)

    def plan(self, c: Candidate) -> Plan:
        plan = self._plan(c)
        return plan.with_ignored(self.quant_fqns) if c.quant == "replicated" else plan

    def _auto_plan(self, c: Candidate) -> Plan:
        """``Plan.auto`` for ``c``'s layout, checkpointing and tensor degree (computed once): its
        calls before ``c``'s reshard and offload options, its checkpointing as ``c``'s."""
        key = (c.lora, c.checkpoint, c.tensor)
        if key not in self._auto:
            auto = auto_plan(self.tree, lora=c.lora, checkpoint=c.checkpoint)
            self._auto[key] = auto.with_tensor_parallel(self.tp_entries) if c.tensor > 1 else auto
        return self._auto[key]

    def _plan(self, c: Candidate) -> Plan:
        auto = self._auto_plan(c)
        if c.reshard_after_forward is None and not c.offload:
            return auto
        units = [Unit(u.modules, u.reshard_after_forward if u.modules == ("",) or c.reshard_after_forward is None else c.reshard_after_forward,
                      u.param_dtype, u.reduce_dtype, u.offload or c.offload) for u in auto.units]
        return auto.with_units(units)

    def mesh_for(self, c: Candidate, world: int | None = None) -> Mesh:
        world = world or self.mesh.world
        return replace(self.mesh, shard=world // (c.replicate * c.tensor), replicate=c.replicate, tensor=c.tensor)

    def training_for(self, c: Candidate, with_batch: bool = True) -> Training:
        kw = {"batch_size": c.batch_size if with_batch else None, "offload": False, "grad_accum": c.grad_accum}
        if c.use_cache is not None:
            kw["use_cache"] = c.use_cache
        return replace(self.training, **kw)

    def analysis(self, c: Candidate, world: int | None = None, with_batch: bool = True) -> Analysis:
        return analyze(self.tree, self.plan(c), self.mesh_for(c, world), self.training_for(c, with_batch))

    def state_peak(self, c: Candidate) -> int:
        """The model-state peak (no activations) of ``c``'s layout, tensor degree and storage with the
        options that hold least (computed once)."""
        key = (c.lora, c.tensor, c.quant)
        if key not in self._state_peaks:
            lean = Candidate(c.lora, None, None, 1, self.lean_offload, tensor=c.tensor, quant=c.quant)
            self._state_peaks[key] = int(self.analysis(lean, with_batch=False).memory.peak.max())
        return self._state_peaks[key]

    def unsharded(self, c: Candidate) -> int:
        """``step.unsharded_bytes`` of the calls of ``c``'s layout, tensor degree and storage (computed once)."""
        key = (c.lora, c.tensor, c.quant)
        if key not in self._unsharded:
            a = self.analysis(Candidate(c.lora, tensor=c.tensor, quant=c.quant), with_batch=False)
            self._unsharded[key] = unsharded_bytes(a.tree, a.layout, self.training)
        return self._unsharded[key]

    def cache_of(self, c: Candidate) -> bool:
        """Whether ``c``'s step keeps the key/value cache (``activations.step_cache``)."""
        # the checkpointing is the auto plan's (reshard, offload and the quantized storage change the
        # calls and the ignored parameters only): no per-candidate plan is built for this
        key = (c.lora, c.checkpoint, c.tensor, c.batch_size, c.grad_accum, c.use_cache)
        if key not in self._caches:
            self._caches[key] = step_cache(self.tree.model, self.training_for(c), bool(self._auto_plan(c).checkpoint)).use_cache
        return self._caches[key]


def tensor_degrees(tree: ModelTree, mesh: Mesh, tensor) -> tuple[tuple[int, ...], dict, list[str]]:
    """The degrees of ``tensor`` that can run, the model's TP plan for them, and the notes on those
    left out (over a node, not dividing the world, or the model's heads or widths)."""
    from ..tp import local_tree
    from ..tp.tp_presets import preset

    kept, notes, entries = [], [], {}
    for t in sorted(set(tensor)):
        why = None if t == 1 else (f"over the {mesh.ranks_per_node} ranks of a node" if t > mesh.ranks_per_node
                                    else f"does not divide {mesh.world} ranks" if mesh.world % t else None)
        if why is None and t > 1:
            try:
                entries = entries or preset(tree, True)
                local_tree(tree, Plan(tensor_parallel=entries).tensor_parallel, t)
            except ValueError as exc:
                why = str(exc)
        if why is None:
            kept.append(t)
        else:
            notes.append(f"tensor parallelism over {t} ranks left out: {why}")
    return tuple(kept) or (1,), entries, notes
