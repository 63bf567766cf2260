"""The Inspector's plan edits: every change of plan the tree and the Python API offer.

Each edit is a plain function of the Inspector's state (``InspectorState``: its ``tree``, current
``plan``, ``view`` and ``blocks()``) that returns the new, immutable plan; it changes nothing.
``InspectorState`` makes the returned plan current as one undo step. Names are checked against the
model first, so an error (``ValueError``) names the module or parameter and the closest real name.
``apply_to_many`` repeats a ``BlockAction`` over many modules: the action is a type, not a string.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from enum import Enum

from .. import presets
from ..model.tree import model_name
from ..plan import Plan, Unit, as_plan, closest_hint
from .plan_names import NamedPlan

#: The menu's presets, key -> label (``presets.PRESETS``, the one registry).
PRESETS = {p.key: p.label for p in presets.PRESETS}


class BlockAction(Enum):
    """What ``apply_to_many`` / ``apply_to_type`` can repeat over several modules (the value is the
    name the front end sends)."""

    MAKE_UNIT = "make_unit"
    REMOVE_UNIT = "remove_unit"
    IGNORE_LORA = "ignore_lora"
    UNIGNORE_LORA = "unignore_lora"
    SET_RESHARD_AFTER_FORWARD = "set_reshard_after_forward"
    CHECKPOINT = "checkpoint"
    UNCHECKPOINT = "uncheckpoint"

    @classmethod
    def parse(cls, action) -> BlockAction:
        """A ``BlockAction`` or its name ("make_unit"); ``ValueError`` listing the names otherwise."""
        if isinstance(action, cls):
            return action
        try:
            return cls(action)
        except ValueError:
            raise ValueError(f"action {action!r}: expected one of {tuple(a.value for a in cls)}") from None


#: The names of ``BlockAction`` (kept for callers that list them).
BLOCK_ACTIONS = tuple(a.value for a in BlockAction)


# ------------------------------------------------------------------------------------
# names
# ------------------------------------------------------------------------------------
def module_index(tree, fqn: str) -> int:
    if fqn not in tree.module_index:
        hint = f" {fqn!r} is a parameter." if fqn in tree.param_index else closest_hint(fqn, tree.module_index)
        raise ValueError(f"no module named {fqn!r} in {tree.root_type}.{hint}")
    return tree.module_index[fqn]


def param_index(tree, fqn: str) -> int:
    if fqn not in tree.param_index:
        hint = (f" {fqn!r} is a module; use ignore_lora or list its parameters." if fqn in tree.module_index
                else closest_hint(fqn, tree.param_index))
        raise ValueError(f"no parameter named {fqn!r} in {tree.root_type}.{hint}")
    return tree.param_index[fqn]


def module_fqns(state, target) -> list[str]:
    """A module FQN, a row id ("m12"), a group id ("g3_4") or a list of those -> module FQNs."""
    tree = state.tree
    if isinstance(target, (list, tuple)):
        return [f for t in target for f in module_fqns(state, t)]
    if isinstance(target, str) and target.startswith("g") and "_" in target and target not in tree.module_index:
        return [tree.modules[m].fqn for m in state.view.folding.run(target).members]
    if isinstance(target, str) and target.startswith("m") and target[1:].isdigit() and target not in tree.module_index:
        return [tree.modules[int(target[1:])].fqn]
    module_index(tree, target)
    return [target]


def _not_in_a_call(plan: Plan, fqn: str) -> None:
    if plan.unit_of(fqn) is not None:
        raise ValueError(f"module {fqn!r} is already in a fully_shard call ({plan.unit_of(fqn).name})")


def _in_a_call(plan: Plan, fqn: str) -> None:
    if plan.unit_of(fqn) is None:
        raise ValueError(f"module {fqn!r} is not in any fully_shard call; make it a unit first")


# ------------------------------------------------------------------------------------
# calls
# ------------------------------------------------------------------------------------
def make_unit(state, fqn: str, **options) -> Plan:
    """Module ``fqn`` in its own ``fully_shard`` call (``options``: ``sv.Unit`` keywords)."""
    module_index(state.tree, fqn)
    _not_in_a_call(state.plan, fqn)
    return state.plan.with_unit(Unit(fqn, **options))


def make_group_unit(state, fqns: Iterable[str], **options) -> Plan:
    """One grouped call ``fully_shard([a, b, ...])``."""
    fqns = list(fqns)
    for f in fqns:
        module_index(state.tree, f)
        _not_in_a_call(state.plan, f)
    return state.plan.with_unit(Unit(tuple(fqns), **options))


def remove_unit(state, fqn: str) -> Plan:
    """Without the call that contains module ``fqn`` (the whole group if it is grouped)."""
    module_index(state.tree, fqn)
    return state.plan.without_unit(fqn)


def toggle_unit(state, fqn: str) -> Plan:
    return make_unit(state, fqn) if state.plan.unit_of(fqn) is None else remove_unit(state, fqn)


def set_unit_options(state, fqn: str, **options) -> Plan:
    """Any ``sv.Unit`` option of the call containing ``fqn`` (param_dtype, reduce_dtype, offload,
    reshard_after_forward: None for torch's default, a bool or an int)."""
    module_index(state.tree, fqn)
    if "reshard_after_forward" in options:
        options["reshard_after_forward"] = parse_reshard_after_forward(options["reshard_after_forward"])
    _in_a_call(state.plan, fqn)
    return state.plan.with_unit_options(fqn, **options)


# ------------------------------------------------------------------------------------
# ignored parameters
# ------------------------------------------------------------------------------------
def _canonical(tree, fqns) -> list[str]:
    return [tree.params[param_index(tree, f)].fqn for f in ([fqns] if isinstance(fqns, str) else fqns)]


def _drop_ignored(tree, plan: Plan, params: set[int]) -> Plan:
    return plan.without_ignored([f for f in plan.ignored if tree.param_index[f] in params])


def _add_ignored(tree, plan: Plan, names: list[str]) -> Plan:
    have = tree.param_indices(plan.ignored)
    return plan.with_ignored([f for f in names if tree.param_index[f] not in have])


def ignore(state, fqns) -> Plan:
    """These parameters kept out of FSDP (``ignored_params``)."""
    return _add_ignored(state.tree, state.plan, _canonical(state.tree, fqns))


def unignore(state, fqns) -> Plan:
    """These parameters given back to FSDP (every alias of a tied parameter)."""
    tree = state.tree
    return _drop_ignored(tree, state.plan, tree.param_indices(_canonical(tree, fqns)))


def toggle_ignored(state, fqn: str) -> Plan:
    tree = state.tree
    p = param_index(tree, fqn)
    ignored = p in tree.param_indices(state.plan.ignored)
    return unignore(state, [fqn]) if ignored else ignore(state, [fqn])


def lora_params(tree, module_fqn: str = "") -> list[str]:
    """Canonical FQNs of the LoRA parameters under a module (the whole model by default)."""
    m = module_index(tree, module_fqn)
    return [tree.params[p].fqn for p in tree.subtree_params(m) if tree.params[p].role == "lora"]


def _lora_plan(tree, plan: Plan, modules: list[str], ignore: bool) -> Plan:
    params = [f for m in modules for f in lora_params(tree, m)]
    if ignore:
        return _add_ignored(tree, plan, params)
    return _drop_ignored(tree, plan, {tree.param_index[f] for f in params})


def _lora_under(state, module_fqn: str, ignore: bool) -> Plan:
    if not lora_params(state.tree, module_fqn):
        raise ValueError(f"no LoRA parameters under {module_fqn or '<root>'!r}")
    return _lora_plan(state.tree, state.plan, [module_fqn], ignore)


def ignore_lora(state, module_fqn: str = "") -> Plan:
    """Every LoRA parameter under ``module_fqn`` ignored."""
    return _lora_under(state, module_fqn, True)


def unignore_lora(state, module_fqn: str = "") -> Plan:
    """Every LoRA parameter under ``module_fqn`` given back to FSDP."""
    return _lora_under(state, module_fqn, False)


def toggle_lora(state, module_fqn: str) -> Plan:
    """What a row's LoRA button does: give them back to FSDP when every one is ignored, else ignore them."""
    tree = state.tree
    ignored = tree.param_indices(state.plan.ignored)
    every = all(tree.param_index[f] in ignored for f in lora_params(tree, module_fqn))
    return _lora_under(state, module_fqn, not every)


# ------------------------------------------------------------------------------------
# activation checkpointing
# ------------------------------------------------------------------------------------
def _module_names(state, fqns) -> list[str]:
    fqns = [fqns] if isinstance(fqns, str) else list(fqns)
    for f in fqns:
        module_index(state.tree, f)
    return fqns


def checkpoint(state, fqns) -> Plan:
    """These modules in ``checkpoint_wrapper`` (their activations are recomputed in backward)."""
    fqns = _module_names(state, fqns)
    return state.plan.with_checkpoint([f for f in fqns if f not in state.plan.checkpoint])


def uncheckpoint(state, fqns) -> Plan:
    return state.plan.without_checkpoint(_module_names(state, fqns))


def toggle_checkpoint(state, fqn: str) -> Plan:
    return uncheckpoint(state, [fqn]) if fqn in state.plan.checkpoint else checkpoint(state, [fqn])


def repeated_blocks(tree) -> tuple[str, ...]:
    """The repeated blocks ``Plan.auto(model, checkpoint="blocks")`` checkpoints."""
    return Plan.auto(tree, checkpoint="blocks").checkpoint


def blocks_differ(state) -> bool:
    """Whether the plan treats the repeated blocks differently: some checkpointed and some not, or
    some blocks' LoRA ignored and others' not (the user is editing single blocks)."""
    plan, tree, blocks = state.plan, state.tree, state.blocks()
    if 0 < sum(b in plan.checkpoint for b in blocks) < len(blocks):
        return True
    ignored = tree.param_indices(plan.ignored)
    return len({any(tree.param_index[f] in ignored for f in lora_params(tree, b)) for b in blocks}) > 1


def checkpoint_blocks(state, on: bool = True) -> Plan:
    """Every repeated block checkpointed (``on``), or none of them."""
    blocks = state.blocks()
    if not blocks:
        raise ValueError(f"{model_name(state.tree)} has no repeated blocks to checkpoint")
    plan = state.plan
    if not on:
        return plan.without_checkpoint(blocks)
    # a module inside a block, or a block's ancestor, cannot be checkpointed as well
    keep = [f for f in plan.checkpoint if not any(f.startswith(b + ".") or b.startswith(f + ".") for b in blocks)]
    return plan.without_checkpoint([f for f in plan.checkpoint if f not in keep]).with_checkpoint(
        [b for b in blocks if b not in plan.checkpoint])


# ------------------------------------------------------------------------------------
# one action over many modules
# ------------------------------------------------------------------------------------
def _make_units(tree, plan: Plan, fqns: list[str], kw: dict) -> Plan:
    for f in fqns:
        if plan.unit_of(f) is None:
            plan = plan.with_unit(Unit(f, **kw))
    return plan


def _remove_units(tree, plan: Plan, fqns: list[str], kw: dict) -> Plan:
    for f in fqns:
        if plan.unit_of(f) is not None:
            plan = plan.without_unit(f)
    return plan


def _set_reshard(tree, plan: Plan, fqns: list[str], kw: dict) -> Plan:
    value = parse_reshard_after_forward(kw.get("value", kw.get("reshard_after_forward")))
    for f in fqns:
        if plan.unit_of(f) is not None:
            plan = plan.with_unit_options(f, reshard_after_forward=value)
    return plan


#: Each ``BlockAction`` as a function (tree, plan, module fqns, keywords) -> plan; a module where
#: the action is a no-op (already a unit, ...) is skipped.
_ON_MANY: dict[BlockAction, Callable[[object, Plan, list[str], dict], Plan]] = {
    BlockAction.MAKE_UNIT: _make_units,
    BlockAction.REMOVE_UNIT: _remove_units,
    BlockAction.IGNORE_LORA: lambda tree, plan, fqns, kw: _lora_plan(tree, plan, fqns, True),
    BlockAction.UNIGNORE_LORA: lambda tree, plan, fqns, kw: _lora_plan(tree, plan, fqns, False),
    BlockAction.SET_RESHARD_AFTER_FORWARD: _set_reshard,
    BlockAction.CHECKPOINT: lambda tree, plan, fqns, kw: plan.with_checkpoint([f for f in fqns if f not in plan.checkpoint]),
    BlockAction.UNCHECKPOINT: lambda tree, plan, fqns, kw: plan.without_checkpoint(fqns),
}


def apply_to_many(state, targets, action: BlockAction | str, **kw) -> Plan:
    """One block action over many modules. ``targets``: module FQNs, row ids or a folded group id
    ("layers.0-79" rows); ``action``: a ``BlockAction`` (or its name)."""
    action = BlockAction.parse(action)
    return _ON_MANY[action](state.tree, state.plan, module_fqns(state, targets), kw)


def apply_to_type(state, type_or_fqn: str, action: BlockAction | str, within: str = "", **kw) -> Plan:
    """A block action on every module of one class (given by name or by one of its FQNs)."""
    tree = state.tree
    type_name = tree.module(type_or_fqn).type_name if type_or_fqn in tree.module_index else type_or_fqn
    mods = state.view.static.by_type.get(type_name)
    if not mods:
        raise ValueError(f"no module of type {type_name!r} in {tree.root_type}")
    root = module_index(tree, within)
    return apply_to_many(state, [tree.modules[m].fqn for m in mods if tree.is_inside(m, root)], action, **kw)


# ------------------------------------------------------------------------------------
# whole plans
# ------------------------------------------------------------------------------------
def preset_keeping_checkpointing(state, name: str) -> tuple[NamedPlan, str | None]:
    """Preset ``name`` (``PRESETS``) in place of the plan's calls and ignored parameters, keeping the
    current checkpointing, each module with its own policy (the preset says what to shard, not what
    to recompute), and the tensor-parallel entries (the mesh's tensor dim runs them); named (one edit
    of the preset when checkpointing was kept), and the message that says what was kept (None when nothing was)."""
    preset = presets.preset_plan(state.tree, name)
    if state.plan.tensor_parallel:  # what the mesh's tensor dim runs: a preset says only what FSDP shards
        preset = preset.with_tensor_parallel(state.plan.tensor_parallel)
    current = state.plan.checkpoint
    kept = tuple(f for f in current if f not in preset.checkpoint)
    if not kept:
        return state.names.arrived(preset), None
    named = state.names.from_preset(preset, preset.with_checkpoint({f: current.policy(f) for f in kept}))  # each its own policy
    plan = named.plan
    what = "every block" if set(plan.checkpoint) == set(state.blocks()) else f"{len(plan.checkpoint)} checkpointed modules"
    return named, (f"preset {PRESETS[name]!r} applied; it keeps your checkpointing ({what}). "
                  "Undo goes back to the plan before it.")


def validated_plan(tree, plan) -> Plan:
    """A ``Plan``, JSON text or dict, validated against the model."""
    plan = as_plan(plan)
    plan.validate(tree)
    return plan


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


def finding_fix(state, code: str) -> dict:
    """What applying a finding's fix changes, as ``_commit``'s arguments (``fixes.fix_change``: a plan,
    or the mesh or training SV201's cheapest fix priced), its plan named "<plan>, SVxxx fixed";
    ``ValueError`` when the current plan has no such finding or its fix is words only."""
    from ..checks.fixes import fix_change

    found = [f for f in state.analysis.findings if f.code == code]
    if not found:
        raise ValueError(f"finding {code!r}: the current plan has no such finding")
    change = fix_change(state.analysis, found[0])
    if change is None:
        raise ValueError(f"finding {code}: its fix is not a change of plan, mesh or training ({found[0].fix[:120]})")
    if "plan" in change:
        change["plan"] = replace(change["plan"], name=f"{state.plan.name or 'custom plan'}, {code} fixed")
    return change
