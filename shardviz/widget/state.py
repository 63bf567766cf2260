"""The Inspector's controller: every action as a plain Python method, no browser needed.

``InspectorState`` owns one ``ModelTree`` (built once), the history of immutable states
(plan, mesh, training) for undo/redo, the current ``Analysis`` (``sv.analyze`` on the cached tree,
``strict=False`` so that a plan torch would refuse shows its reasons as findings), the tree view
(expansion, filters, chosen rank) and the plan file. The widget front end only sends these
actions and draws what ``rows()``, ``memory``, ``traffic``, ``findings`` and ``comparison`` return.

``pin()`` keeps the current (plan, mesh, training) and its analysis as "A"; ``comparison`` then
sets A against the current state ("B") with ``sv.Comparison``, updated after every change. Pinning
is view state, like the filters: not an undo step (undo moves B, A stays where it was pinned).

Every change either fully happens or raises ``ValueError`` and changes nothing: the new plan is
analysed before it becomes current.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..analysis import Analysis, analyze
from ..compare import Comparison
from ..files import write_text_atomic
from ..fsdp import Mesh
from ..plan import LORA_LAYOUTS, Plan, Unit, as_plan
from ..tree import ModelTree
from ..views import DEFAULT_TRAINING  # what the Inspector assumes when no training is given
from . import views
from .planfile import PlanFile
from .tree_view import ModuleStats, TreeView

PRESETS = {
    "auto-sharded": "auto: LoRA in its block's call",
    "auto-ignored": "auto: LoRA ignored",
    "auto-separate": "auto: a call per LoRA adapter",
    "root-only": "root only",
    "none": "no calls",
}
HISTORY_LIMIT = 1000
#: Actions that ``apply_to_many`` / ``apply_to_type`` can repeat over several modules.
BLOCK_ACTIONS = ("make_unit", "remove_unit", "ignore_lora", "unignore_lora", "set_reshard_after_forward",
                 "checkpoint", "uncheckpoint")


@dataclass(frozen=True)
class Snapshot:
    plan: Plan
    mesh: Mesh
    training: Any


class InspectorState:
    """Plan, mesh and training being inspected, with undo/redo and an optional plan file."""

    def __init__(self, model, plan=None, mesh: Mesh | None = None, training=None, plan_path=None):
        t0 = time.perf_counter()
        if isinstance(model, ModelTree):
            self.model, self.tree = None, model
        else:
            self.model, self.tree = model, ModelTree(model)
        mesh = mesh if mesh is not None else Mesh(shard=8)
        if not isinstance(mesh, Mesh):
            raise ValueError(f"mesh must be a shardviz.Mesh, got {type(mesh).__name__}")
        training = training if training is not None else DEFAULT_TRAINING
        self.view = TreeView(self.tree)
        self.messages: list[dict] = []  # {level, text}; the widget shows the latest ones
        self.listeners: list[Callable[[set], None]] = []
        self.revision = 0
        self.timings: dict[str, float] = {}
        self._code_cache: dict = {}
        self.verify_result: dict | None = None
        self.last_reveal: str | None = None
        self.torch_version: str | None = None  # the export target; the findings follow it (set_torch_version)
        self.pinned: Snapshot | None = None  # "A" of the A vs B view (see pin())
        self._pinned_analysis: Analysis | None = None

        explicit = as_plan(plan) if plan is not None else None
        self.plan_file = PlanFile(plan_path) if plan_path is not None else None
        restored = None
        if self.plan_file is not None:
            result = self.plan_file.load(self.tree)
            restored = result.plan
            if restored is not None:
                try:  # names that exist can still form a plan torch cannot apply (no bottom-up order)
                    self._analyze(Snapshot(restored, mesh, training))
                except ValueError as exc:
                    restored = None
                    result = self.plan_file._refuse(
                        f"plan file {self.plan_file.path} holds a plan that cannot be applied to this model ({exc})")
            if restored is not None or result.level == "error":
                self._message(result.level, result.message)
        start = restored or explicit or Plan.auto(self.tree)
        self._bases: dict[str, Plan] = {start.name: start} if start.name and EDITED not in start.name else {}
        self._history = [Snapshot(start, mesh, training)]
        self._pos = 0
        self._recompute(self._history[0])  # raises ValueError for an unusable explicit plan
        if self.plan_file is not None and restored is None and self.plan_file.writable:
            self.plan_file.save(start)  # a fresh file: the starting plan is on disk at once
        self.timings["init_s"] = time.perf_counter() - t0

    # ------------------------------------------------------------------------------------
    # current state
    # ------------------------------------------------------------------------------------
    @property
    def current(self) -> Snapshot:
        return self._history[self._pos]

    @property
    def plan(self) -> Plan:
        return self.current.plan

    @property
    def mesh(self) -> Mesh:
        return self.current.mesh

    @property
    def training(self):
        return self.current.training

    @property
    def can_undo(self) -> bool:
        return self._pos > 0

    @property
    def can_redo(self) -> bool:
        return self._pos < len(self._history) - 1

    def observe(self, callback: Callable[[set], None]) -> None:
        """``callback(changed)`` after every change; ``changed`` names what moved:
        "state" (plan/mesh/training: every view), "rows" (tree only), "messages", "verify"."""
        self.listeners.append(callback)

    def _notify(self, changed: set) -> None:
        for cb in list(self.listeners):
            cb(changed)

    def _message(self, level: str, text: str) -> None:
        self.messages.append({"level": level, "text": text, "at": time.time()})
        del self.messages[:-20]

    # ------------------------------------------------------------------------------------
    # recompute
    # ------------------------------------------------------------------------------------
    def _analyze(self, snap: Snapshot) -> Analysis:
        return analyze(self.tree, snap.plan, snap.mesh, snap.training, strict=False,
                       torch_version=getattr(self, "torch_version", None))

    def set_torch_version(self, version: str | None) -> None:
        """The release the exported code targets ("2.6", ...; None or "": the installed torch).
        The findings follow it (SV101: ignored parameters before 2.7; SV110: groups before 2.5)."""
        version = version or None
        if version is not None:
            from ..fsdp import parse_version

            parse_version(version)  # ValueError for a bad string, nothing changed
        if version == self.torch_version:
            return
        self.torch_version = version
        self.analysis.torch_version = version
        self.analysis.__dict__.pop("findings", None)  # a cached_property: recomputed for the new release
        self._derived.pop("findings", None)
        self._notify({"findings"})

    def _recompute(self, snap: Snapshot, analysis: Analysis | None = None) -> None:
        """Make ``analysis`` current; every derived view is rebuilt lazily, on first use."""
        t0 = time.perf_counter()
        self.analysis = analysis if analysis is not None else self._analyze(snap)
        self._derived: dict[str, Any] = {}
        self.revision += 1
        self._code_cache.clear()
        self.verify_result = None
        if self.view.rank >= snap.mesh.world:
            self.view.rank = snap.mesh.world - 1
        self.timings["analyze_s"] = time.perf_counter() - t0

    def _lazy(self, key: str, build):
        if key not in self._derived:
            t0 = time.perf_counter()
            self._derived[key] = build()
            self.timings[f"{key}_s"] = time.perf_counter() - t0
        return self._derived[key]

    @property
    def stats(self) -> ModuleStats:
        """Per-module badges and bytes for the current layout."""
        return self._lazy("stats", lambda: ModuleStats(self.tree, self.analysis.layout, self.view.static))

    @property
    def memory(self) -> dict:
        """The memory chart's data: per-rank bars stacked by category, from ``analysis.memory``."""
        return self._lazy("memory", lambda: views.memory_payload(self.analysis))

    @property
    def traffic(self) -> dict:
        """The traffic chart's data: bytes per step by collective and by call, from ``analysis.comm``."""
        return self._lazy("traffic", lambda: views.traffic_payload(self.analysis))

    @property
    def findings(self) -> list[dict]:
        """``analysis.findings`` as dicts (code, severity, message, fqns, fix)."""
        return self._lazy("findings", lambda: views.findings_payload(self.analysis))

    @property
    def comparison(self) -> dict:
        """The A vs B view's data (``views.comparison_payload``); ``{"pinned": False}`` until ``pin()``."""
        return self._lazy("comparison", lambda: views.comparison_payload(self.pinned_comparison(), self.pinned, self.current))

    def pinned_comparison(self) -> Comparison | None:
        """``sv.Comparison`` of the pinned state ("A") and the current one ("B"); None when nothing is pinned.

        Both analyses are ``sv.analyze(tree, plan, mesh, training, strict=False)`` on the cached tree,
        as ``sv.compare`` makes them, so ``table`` and ``diff("A", "B")`` are exactly compare's.
        """
        if self.pinned is None:
            return None
        return Comparison({"A": self._pinned_analysis, "B": self.analysis})

    # -- the plan's name: an edited plan says so -------------------------------------------
    def _known_plans(self) -> dict[str, Plan]:
        """Named plans an edit is measured from: the presets (computed once) and the plans the
        user started from or set."""
        if not hasattr(self, "_presets"):
            self._presets = {}
            for lora in LORA_LAYOUTS:
                try:
                    p = Plan.auto(self.tree, lora=lora)
                except ValueError:
                    continue
                self._presets[p.name] = p
            for p in (Plan([""], name="root only"), Plan([], name="no calls")):
                self._presets[p.name] = p
        return {**self._presets, **self._bases}

    def _named(self, plan: Plan) -> Plan:
        """``plan`` named after the plan it was edited from: a preset's own name when it equals
        one, else "<base>, edited: N changes" (N: calls added, removed or changed, parameters
        ignored or given back, modules checkpointed or not, counted against the base)."""
        known = self._known_plans()
        for name, p in known.items():
            if name and p == plan:
                return _renamed(plan, name)
        base = base_name(self.plan.name)
        ref = known.get(base)
        if ref is None:
            return _renamed(plan, f"{base or 'custom plan'}, edited")
        n = plan_changes(ref, plan)
        return _renamed(plan, f"{base}, edited: {n} change{'s' if n != 1 else ''}" if n else base)

    def _commit(self, plan: Plan | None = None, mesh: Mesh | None = None, training=None, what: str = "",
                edit: bool = True) -> bool:
        """Make (plan, mesh, training) current as one undo step; False when nothing changed.

        ``edit``: the plan is an edit of the current one (named after its base, see ``_named``);
        False for a plan that replaces it (a preset, ``set_plan``), which keeps its own name."""
        cur = self.current
        if plan is not None:
            if edit:
                plan = self._named(plan)
            elif plan.name:
                self._bases[plan.name] = plan
        snap = Snapshot(plan if plan is not None else cur.plan,
                        mesh if mesh is not None else cur.mesh,
                        training if training is not None else cur.training)
        if snap == cur and snap.plan.name == cur.plan.name:
            return False
        analysis = self._analyze(snap)  # raises ValueError: nothing has changed yet
        del self._history[self._pos + 1:]
        self._history.append(snap)
        if len(self._history) > HISTORY_LIMIT:
            del self._history[0]
        self._pos = len(self._history) - 1
        self._recompute(snap, analysis)
        if snap.plan != cur.plan or snap.plan.name != cur.plan.name:
            self._autosave()
        self._notify({"state"})
        return True

    def _autosave(self) -> None:
        pf = self.plan_file
        if pf is None:
            return
        was_ok = pf.writable
        t0 = time.perf_counter()
        try:
            pf.save(self.plan)
        except OSError as exc:
            self._message("error", f"could not save the plan to {pf.path}: {exc}")
            self._notify({"messages"})
            return
        self.timings["save_s"] = time.perf_counter() - t0
        if was_ok and not pf.writable:
            self._message("error", pf.problem)
            self._notify({"messages"})

    # ------------------------------------------------------------------------------------
    # names
    # ------------------------------------------------------------------------------------
    def _module(self, fqn: str) -> int:
        if fqn not in self.tree.module_index:
            from ..plan import closest_hint

            hint = (f" {fqn!r} is a parameter." if fqn in self.tree.param_index
                    else closest_hint(fqn, self.tree.module_index))
            raise ValueError(f"no module named {fqn!r} in {self.tree.root_type}.{hint}")
        return self.tree.module_index[fqn]

    def _param(self, fqn: str) -> int:
        if fqn not in self.tree.param_index:
            from ..plan import closest_hint

            hint = (f" {fqn!r} is a module; use ignore_lora or list its parameters." if fqn in self.tree.module_index
                    else closest_hint(fqn, self.tree.param_index))
            raise ValueError(f"no parameter named {fqn!r} in {self.tree.root_type}.{hint}")
        return self.tree.param_index[fqn]

    def module_fqns(self, target) -> list[str]:
        """A module FQN, a row id ("m12"), a group id ("g3_4") or a list of those -> module FQNs."""
        if isinstance(target, (list, tuple)):
            out: list[str] = []
            for t in target:
                out.extend(self.module_fqns(t))
            return out
        if isinstance(target, str) and target.startswith("g") and "_" in target and target not in self.tree.module_index:
            g = self.view.folding.group(target)
            return [self.tree.modules[m].fqn for m in g.members]
        if isinstance(target, str) and target.startswith("m") and target[1:].isdigit() and target not in self.tree.module_index:
            return [self.tree.modules[int(target[1:])].fqn]
        self._module(target)
        return [target]

    # ------------------------------------------------------------------------------------
    # plan actions (each one undo step)
    # ------------------------------------------------------------------------------------
    def _with_unit(self, plan: Plan, fqn: str, options: dict) -> Plan:
        self._module(fqn)
        if plan.unit_of(fqn) is not None:
            raise ValueError(f"module {fqn!r} is already in a fully_shard call ({plan.unit_of(fqn).name})")
        return plan.with_unit(Unit(fqn, **options))

    def make_unit(self, fqn: str, **options) -> None:
        """Give module ``fqn`` its own ``fully_shard`` call (``options``: ``sv.Unit`` keywords)."""
        self._commit(plan=self._with_unit(self.plan, fqn, options), what=f"make {fqn} a unit")

    def make_group_unit(self, fqns: Iterable[str], **options) -> None:
        """One grouped call ``fully_shard([a, b, ...])``."""
        fqns = list(fqns)
        for f in fqns:
            self._module(f)
            if self.plan.unit_of(f) is not None:
                raise ValueError(f"module {f!r} is already in a fully_shard call ({self.plan.unit_of(f).name})")
        self._commit(plan=self.plan.with_unit(Unit(tuple(fqns), **options)))

    def remove_unit(self, fqn: str) -> None:
        """Drop the call that contains module ``fqn`` (the whole group if it is grouped)."""
        self._module(fqn)
        self._commit(plan=self.plan.without_unit(fqn))

    def toggle_unit(self, fqn: str) -> None:
        if self.plan.unit_of(fqn) is None:
            self.make_unit(fqn)
        else:
            self.remove_unit(fqn)

    def set_reshard_after_forward(self, fqn: str, value) -> None:
        """``reshard_after_forward`` of the call containing ``fqn``: None (torch's default), bool or int."""
        self._module(fqn)
        value = _parse_rar(value)
        if self.plan.unit_of(fqn) is None:
            raise ValueError(f"module {fqn!r} is not in any fully_shard call; make it a unit first")
        self._commit(plan=self.plan.with_unit_options(fqn, reshard_after_forward=value))

    def set_unit_options(self, fqn: str, **options) -> None:
        """Any ``sv.Unit`` option of the call containing ``fqn`` (param_dtype, reduce_dtype, offload, ...)."""
        self._module(fqn)
        if "reshard_after_forward" in options:
            options["reshard_after_forward"] = _parse_rar(options["reshard_after_forward"])
        if self.plan.unit_of(fqn) is None:
            raise ValueError(f"module {fqn!r} is not in any fully_shard call; make it a unit first")
        self._commit(plan=self.plan.with_unit_options(fqn, **options))

    def _canonical(self, fqns) -> list[str]:
        if isinstance(fqns, str):
            fqns = [fqns]
        return [self.tree.params[self._param(f)].fqn for f in fqns]

    def _drop_ignored(self, plan: Plan, params: set[int]) -> Plan:
        keep = [f for f in plan.ignored if self.tree.param_index[f] not in params]
        return Plan(plan.units, keep, plan.name, plan.checkpoint)

    def ignore(self, fqns) -> None:
        """Keep these parameters out of FSDP (``ignored_params``)."""
        names = self._canonical(fqns)
        have = {self.tree.param_index[f] for f in self.plan.ignored}
        add = [f for f in names if self.tree.param_index[f] not in have]
        self._commit(plan=self.plan.with_ignored(add))

    def unignore(self, fqns) -> None:
        """Give these parameters back to FSDP (every alias of a tied parameter)."""
        names = self._canonical(fqns)
        self._commit(plan=self._drop_ignored(self.plan, {self.tree.param_index[f] for f in names}))

    def toggle_ignored(self, fqn: str) -> None:
        p = self._param(fqn)
        if any(self.tree.param_index[f] == p for f in self.plan.ignored):
            self.unignore([fqn])
        else:
            self.ignore([fqn])

    def lora_params(self, module_fqn: str = "") -> list[str]:
        """Canonical FQNs of the LoRA parameters under a module (the whole model by default)."""
        m = self._module(module_fqn)
        return [self.tree.params[p].fqn for p in self.tree.subtree_params(m) if self.tree.params[p].role == "lora"]

    def _lora_plan(self, plan: Plan, modules: list[str], ignore: bool) -> Plan:
        params: list[str] = []
        for m in modules:
            params.extend(self.lora_params(m))
        if ignore:
            have = {self.tree.param_index[f] for f in plan.ignored}
            return plan.with_ignored([f for f in params if self.tree.param_index[f] not in have])
        return self._drop_ignored(plan, {self.tree.param_index[f] for f in params})

    def ignore_lora(self, module_fqn: str = "") -> None:
        """Ignore every LoRA parameter under ``module_fqn``."""
        if not self.lora_params(module_fqn):
            raise ValueError(f"no LoRA parameters under {module_fqn or '<root>'!r}")
        self._commit(plan=self._lora_plan(self.plan, [module_fqn], True))

    def unignore_lora(self, module_fqn: str = "") -> None:
        """Give every LoRA parameter under ``module_fqn`` back to FSDP."""
        if not self.lora_params(module_fqn):
            raise ValueError(f"no LoRA parameters under {module_fqn or '<root>'!r}")
        self._commit(plan=self._lora_plan(self.plan, [module_fqn], False))

    # -- activation checkpointing ------------------------------------------------------------
    def checkpoint(self, fqns) -> None:
        """Wrap these modules in ``checkpoint_wrapper`` (their activations are recomputed in backward)."""
        fqns = [fqns] if isinstance(fqns, str) else list(fqns)
        for f in fqns:
            self._module(f)
        self._commit(plan=self.plan.with_checkpoint([f for f in fqns if f not in self.plan.checkpoint]))

    def uncheckpoint(self, fqns) -> None:
        fqns = [fqns] if isinstance(fqns, str) else list(fqns)
        for f in fqns:
            self._module(f)
        self._commit(plan=self.plan.without_checkpoint(fqns))

    def toggle_checkpoint(self, fqn: str) -> None:
        if fqn in self.plan.checkpoint:
            self.uncheckpoint([fqn])
        else:
            self.checkpoint([fqn])

    def blocks(self) -> list[str]:
        """The repeated blocks ``Plan.auto(model, checkpoint="blocks")`` checkpoints."""
        if not hasattr(self, "_blocks"):
            self._blocks = list(Plan.auto(self.tree, checkpoint="blocks").checkpoint)
        return self._blocks

    def checkpoint_blocks(self, on: bool = True) -> None:
        """Checkpoint every repeated block (``on``), or none of them; one undo step."""
        blocks = self.blocks()
        if not blocks:
            raise ValueError(f"{self.tree.root_type} has no repeated blocks to checkpoint")
        plan = self.plan
        if on:
            # a module inside a block, or a block's ancestor, cannot be checkpointed as well
            keep = [f for f in plan.checkpoint if not any(f.startswith(b + ".") or b.startswith(f + ".") for b in blocks)]
            plan = plan.without_checkpoint([f for f in plan.checkpoint if f not in keep]).with_checkpoint(
                [b for b in blocks if b not in plan.checkpoint])
        else:
            plan = plan.without_checkpoint(blocks)
        self._commit(plan=plan)

    def apply_to_many(self, targets, action: str, **kw) -> None:
        """Repeat one block action over many modules as ONE undo step.

        ``targets``: module FQNs, row ids or a folded group id ("layers.0-79" rows). ``action``:
        one of ``BLOCK_ACTIONS``; modules where it is a no-op (already a unit, ...) are skipped.
        """
        if action not in BLOCK_ACTIONS:
            raise ValueError(f"action {action!r}: expected one of {BLOCK_ACTIONS}")
        fqns = self.module_fqns(targets)
        plan = self.plan
        if action == "make_unit":
            for f in fqns:
                if plan.unit_of(f) is None:
                    plan = plan.with_unit(Unit(f, **kw))
        elif action == "remove_unit":
            for f in fqns:
                if plan.unit_of(f) is not None:
                    plan = plan.without_unit(f)
        elif action in ("ignore_lora", "unignore_lora"):
            plan = self._lora_plan(plan, fqns, action == "ignore_lora")
        elif action == "checkpoint":
            plan = plan.with_checkpoint([f for f in fqns if f not in plan.checkpoint])
        elif action == "uncheckpoint":
            plan = plan.without_checkpoint(fqns)
        else:
            value = _parse_rar(kw.get("value", kw.get("reshard_after_forward")))
            for f in fqns:
                if plan.unit_of(f) is not None:
                    plan = plan.with_unit_options(f, reshard_after_forward=value)
        self._commit(plan=plan)

    def apply_to_type(self, type_or_fqn: str, action: str, within: str = "", **kw) -> None:
        """Apply a block action to every module of one class (given by name or by one of its FQNs)."""
        type_name = self.tree.module(type_or_fqn).type_name if type_or_fqn in self.tree.module_index else type_or_fqn
        mods = self.view.static.by_type.get(type_name)
        if not mods:
            raise ValueError(f"no module of type {type_name!r} in {self.tree.root_type}")
        root = self._module(within)
        fqns = [self.tree.modules[m].fqn for m in mods if self.tree.is_inside(m, root)]
        self.apply_to_many(fqns, action, **kw)

    def apply_preset(self, name: str) -> None:
        """Replace the plan with a preset (``PRESETS``; "auto-<lora>" is ``Plan.auto``)."""
        if name.startswith("auto-") and name[5:] in LORA_LAYOUTS:
            plan = Plan.auto(self.tree, lora=name[5:])
        elif name == "root-only":
            plan = Plan([""], name="root only")
        elif name == "none":
            plan = Plan([], name="no calls")
        else:
            raise ValueError(f"preset {name!r}: expected one of {list(PRESETS)}")
        self._commit(plan=plan, edit=False)

    def set_plan(self, plan) -> None:
        """Replace the plan (a ``Plan``, JSON text or dict); validated against the model."""
        plan = as_plan(plan)
        plan.validate(self.tree)
        self._commit(plan=plan, edit=False)

    # -- mesh and training ----------------------------------------------------------------
    def set_mesh(self, world: int | None = None, replicate: int | None = None, device_memory=...,
                 shard: int | None = None, **fields) -> None:
        """Change the mesh: ``world`` ranks in all, ``replicate`` HSDP copies (shard = world / replicate).

        ``device_memory``: bytes, "80GiB", or None for no limit. Other ``sv.Mesh`` fields pass through.
        """
        cur = self.mesh
        replicate = cur.replicate if replicate is None else int(replicate)
        if shard is None:
            world = cur.world if world is None else int(world)
            if replicate < 1 or world < 1:
                raise ValueError(f"world={world} and replicate={replicate} must be >= 1")
            if world % replicate:
                raise ValueError(f"world size {world} is not a multiple of the HSDP replicate size {replicate}")
            shard = world // replicate
        changes = dict(shard=int(shard), replicate=replicate, **fields)
        if device_memory is not ...:
            changes["device_memory"] = device_memory
        self._commit(mesh=dataclasses.replace(cur, **changes))

    def set_training(self, **fields) -> None:
        """Change ``sv.Training`` fields (optimizer, param_dtype, reduce_dtype, offload, ...)."""
        cur = self.training
        if dataclasses.is_dataclass(cur):
            names = {f.name for f in dataclasses.fields(cur)}
            unknown = set(fields) - names
            if unknown:
                raise ValueError(f"Training has no field(s) {sorted(unknown)}; fields: {sorted(names)}")
            new = dataclasses.replace(cur, **fields)
        else:
            raise ValueError("the training object is not a dataclass; pass a new sv.Training instead")
        self._commit(training=new)

    # -- history --------------------------------------------------------------------------
    def undo(self) -> bool:
        if not self.can_undo:
            return False
        self._move(self._pos - 1)
        return True

    def redo(self) -> bool:
        if not self.can_redo:
            return False
        self._move(self._pos + 1)
        return True

    def _move(self, pos: int) -> None:
        before = self.current
        self._pos = pos
        self._recompute(self.current)
        if self.current.plan != before.plan or self.current.plan.name != before.plan.name:
            self._autosave()
        self._notify({"state"})

    # ------------------------------------------------------------------------------------
    # view (not undoable)
    # ------------------------------------------------------------------------------------
    def pin(self) -> None:
        """Keep the current plan, mesh and training as "A" (replacing an earlier pin); the current
        state, as it changes from now on, is "B" in ``comparison``."""
        self.pinned = self.current
        self._pinned_analysis = self.analysis
        self._derived.pop("comparison", None)
        self._notify({"pin"})

    def unpin(self) -> bool:
        """Forget "A"; False when nothing was pinned."""
        if self.pinned is None:
            return False
        self.pinned = None
        self._pinned_analysis = None
        self._derived.pop("comparison", None)
        self._notify({"pin"})
        return True

    def expand(self, target, open: bool = True) -> None:
        self.view.set_expanded(target, open)
        self._notify({"rows"})

    def collapse(self, target) -> None:
        self.expand(target, False)

    def collapse_all(self) -> None:
        self.view.collapse_all()
        self._notify({"rows"})

    def set_filter(self, text=None, status=None, role=None) -> None:
        self.view.set_filter(text, status, role)
        self._notify({"rows"})

    def set_rank(self, rank: int) -> None:
        rank = int(rank)
        if not 0 <= rank < self.mesh.world:
            raise ValueError(f"rank {rank} is outside the mesh of {self.mesh.world} ranks")
        self.view.rank = rank
        self._notify({"rows"})

    def reveal(self, fqn: str) -> str:
        """Open the tree down to a module or parameter (clearing filters that hide it); its row id."""
        if self.view.filtering:
            self.view.set_filter("", "", "")
        row = self.view.expand_to(fqn)
        self.last_reveal = row
        self._notify({"rows", "reveal"})
        return row

    def rows(self) -> tuple[list[str], dict[str, dict]]:
        """Visible row ids in order and their payloads (what the tree shows now)."""
        return self.view.rows(self.stats)

    # ------------------------------------------------------------------------------------
    # export and verify
    # ------------------------------------------------------------------------------------
    def export_code(self, torch_version=None) -> str:
        """``sv.export_code`` for the current plan, mesh and training (cached until the next change)."""
        key = ("code", torch_version)
        if key not in self._code_cache:
            from ..codegen import export_code

            self._code_cache[key] = export_code(self.model if self.model is not None else self.tree, self.plan,
                                                mesh=self.mesh, training=self.training, torch_version=torch_version)
        return self._code_cache[key]

    def save_code(self, path, torch_version=None, overwrite: bool = False) -> Path:
        """Write the exported code to ``path``; an existing file needs ``overwrite=True``."""
        path = Path(path).expanduser()
        if path.is_dir():
            raise ValueError(f"{path} is a folder; give a file name such as {path / 'fsdp_plan.py'}")
        if path.exists() and not overwrite:
            raise FileExistsError(f"{path} exists; pass overwrite=True (or confirm in the widget) to replace it")
        write_text_atomic(path, self.export_code(torch_version), parents=True)
        return path.resolve()  # the widget says where the file is, not only its name

    def verify(self) -> dict:
        """Run ``sv.verify``: torch's real ``fully_shard`` on a meta copy, compared with the prediction."""
        if self.model is None:
            raise ValueError("verify needs the nn.Module; this Inspector was built from a ModelTree")
        from .. import verify as sv_verify

        t0 = time.perf_counter()
        plan, mesh = self.plan, self.mesh
        try:
            df = sv_verify(self.model, plan, mesh=mesh)
        except Exception as exc:  # noqa: BLE001 - torch's refusal is the answer to show
            result = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "rows": [], "n": 0}
        else:
            rows = df.head(50).astype(str).to_dict("records")
            result = {"ok": len(df) == 0, "error": None, "rows": rows, "n": len(df)}
        result["seconds"] = round(time.perf_counter() - t0, 2)
        result["revision"] = self.revision
        result["plan_json"] = plan.to_json(indent=None)
        self.verify_result = result
        self._notify({"verify"})
        return result

    # -- plan file -------------------------------------------------------------------------
    def overwrite_plan_file(self) -> None:
        """Replace the plan file with the current plan and switch autosave back on (explicit)."""
        if self.plan_file is None:
            raise ValueError("this Inspector has no plan_path")
        self.plan_file.overwrite(self.plan)
        self._message("info", f"saved the current plan to {self.plan_file.path}; autosave is on")
        self._notify({"messages"})

    def plan_file_status(self) -> dict | None:
        pf = self.plan_file
        if pf is None:
            return None
        return {"path": str(pf.path), "autosave": pf.writable, "problem": pf.problem, "saves": pf.saves}


EDITED = ", edited"


def base_name(name: str) -> str:
    """The name a plan was edited from: "auto (LoRA sharded), edited: 3 changes" -> "auto (LoRA sharded)"."""
    return name.split(EDITED, 1)[0] if name else ""


def _renamed(plan: Plan, name: str) -> Plan:
    return plan if plan.name == name else Plan(plan.units, plan.ignored, name, plan.checkpoint)


def plan_changes(a: Plan, b: Plan) -> int:
    """How many edits turn plan ``a`` into ``b``: each call added, removed or with other options,
    each parameter ignored or given back, each module checkpointed or not."""
    ua = {u.modules: u for u in a.units}
    ub = {u.modules: u for u in b.units}
    n = len(ua.keys() ^ ub.keys()) + sum(1 for k in ua.keys() & ub.keys() if ua[k] != ub[k])
    n += len(set(a.ignored) ^ set(b.ignored))
    n += len(set(a.checkpoint) ^ set(b.checkpoint))
    return n


def _parse_rar(value):
    """'default'/None -> None; 'true'/'false' -> bool; digits -> int."""
    if value is None or value == "default":
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        low = value.strip().lower()
        if low in ("true", "false"):
            return low == "true"
        if low.isdigit():
            return int(low)
    raise ValueError(f"reshard_after_forward={value!r}: expected default, True, False or an int")
