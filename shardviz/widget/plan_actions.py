"""The Inspector's plan edits: every change of plan the tree and the Python API offer.

``PlanActions`` is mixed into ``InspectorState``: each public method builds the new (immutable)
plan and hands it to ``self._commit``, which makes it one undo step, or raises ``ValueError`` and
changes nothing. Names are checked against the model first, so an error names the module or
parameter and the closest real name.
"""

from __future__ import annotations

from collections.abc import Iterable

from .. import presets
from ..plan import Plan, Unit, as_plan
from .plan_names import edited_name, renamed

#: The menu's presets, key -> label (``presets.PRESETS``, the one registry).
PRESETS = {p.key: p.label for p in presets.PRESETS}
#: Actions that ``apply_to_many`` / ``apply_to_type`` can repeat over several modules.
BLOCK_ACTIONS = ("make_unit", "remove_unit", "ignore_lora", "unignore_lora", "set_reshard_after_forward",
                 "checkpoint", "uncheckpoint")


class PlanActions:
    """The plan edits of ``InspectorState`` (which provides ``tree``, ``plan``, ``view`` and ``_commit``)."""

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
            g = self.view.folding.run(target)
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
        value = parse_reshard_after_forward(value)
        if self.plan.unit_of(fqn) is None:
            raise ValueError(f"module {fqn!r} is not in any fully_shard call; make it a unit first")
        self._commit(plan=self.plan.with_unit_options(fqn, reshard_after_forward=value))

    def set_unit_options(self, fqn: str, **options) -> None:
        """Any ``sv.Unit`` option of the call containing ``fqn`` (param_dtype, reduce_dtype, offload, ...)."""
        self._module(fqn)
        if "reshard_after_forward" in options:
            options["reshard_after_forward"] = parse_reshard_after_forward(options["reshard_after_forward"])
        if self.plan.unit_of(fqn) is None:
            raise ValueError(f"module {fqn!r} is not in any fully_shard call; make it a unit first")
        self._commit(plan=self.plan.with_unit_options(fqn, **options))

    def _canonical(self, fqns) -> list[str]:
        if isinstance(fqns, str):
            fqns = [fqns]
        return [self.tree.params[self._param(f)].fqn for f in fqns]

    def _drop_ignored(self, plan: Plan, params: set[int]) -> Plan:
        keep = [f for f in plan.ignored if self.tree.param_index[f] not in params]
        return plan._edited(ignored=keep)

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
            value = parse_reshard_after_forward(kw.get("value", kw.get("reshard_after_forward")))
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
        """Replace the plan's calls and ignored parameters with a preset (``PRESETS``; "auto-<lora>"
        is ``Plan.auto``), keeping the current checkpointing: the preset says what to shard, not
        what to recompute. A message says what was kept (undo goes back)."""
        preset = presets.preset_plan(self.tree, name)
        kept = tuple(f for f in self.plan.checkpoint if f not in preset.checkpoint)
        if not kept:
            self._commit(plan=preset, edit=False)
            return
        plan = Plan(preset.units, preset.ignored, preset.name, preset.checkpoint + kept)
        plan = renamed(plan, self.names.match(plan) or edited_name(preset.name, 1))
        what = "every block" if set(plan.checkpoint) == set(self.blocks()) else f"{len(plan.checkpoint)} checkpointed modules"
        self._commit(plan=plan, edit=False, note=f"preset {PRESETS[name]!r} applied; it keeps your checkpointing "
                                                 f"({what}). Undo goes back to the plan before it.")

    def set_plan(self, plan) -> None:
        """Replace the plan (a ``Plan``, JSON text or dict); validated against the model."""
        plan = as_plan(plan)
        plan.validate(self.tree)
        self._commit(plan=plan, edit=False)


def parse_reshard_after_forward(value):
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
