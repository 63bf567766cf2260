"""The Inspector's plan names: an edited plan says what it was edited from, and how many edits.

A plan equal to a known plan (a preset, with or without its blocks checkpointed, or a plan the
user started from or set) takes that plan's name, the name ``Plan.auto`` and the CLI give it.
Any other plan is "<base>, edited: N changes", where N counts the user's edits: each action
("checkpoint all blocks", "ignore LoRA" under a block, one toggle) is one edit however many
entries it touches, and an edit whose every entry is back as in the base no longer counts.
The name travels with the plan: the summary, the plan file and the exported code.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from ..plan import Plan
from ..presets import preset_plans
from ..tree import ModelTree

EDITED = ", edited"


class Edit(NamedTuple):
    """One user action on the plan: the plan entries it changed, and how many edits it stands for
    (more than one only for edits carried over from a plan file or a preset change)."""

    entries: frozenset
    weight: int = 1


def plan_entries(plan: Plan) -> dict:
    """A plan as entries: each call (by its modules), each ignored parameter, each checkpointed module."""
    out: dict = {("unit", u.modules): u for u in plan.units}
    out.update({("ignored", f): True for f in plan.ignored})
    out.update({("checkpoint", f): True for f in plan.checkpoint})
    return out


def changed_entries(a: Plan, b: Plan) -> frozenset:
    """The entries added, removed or changed between plans ``a`` and ``b`` (order does not matter)."""
    ea, eb = plan_entries(a), plan_entries(b)
    return frozenset(k for k in ea.keys() | eb.keys() if ea.get(k) != eb.get(k))


def plan_changes(a: Plan, b: Plan) -> int:
    """How many entries differ between ``a`` and ``b``: each call added, removed or with other
    options, each parameter ignored or given back, each module checkpointed or not."""
    return len(changed_entries(a, b))


def edit_count(base: Plan, plan: Plan, edits: tuple[Edit, ...]) -> int:
    """The user's edits that still make ``plan`` differ from ``base``."""
    diff = changed_entries(base, plan)
    return sum(e.weight for e in edits if e.entries & diff)


def edited_name(base: str, n: int) -> str:
    return f"{base}, edited: {n} change{'' if n == 1 else 's'}" if n else base


class PlanNames:
    """Named plans an edit is measured from: the presets (built once) and the user's own."""

    def __init__(self, tree: ModelTree):
        self.tree = tree
        self.bases: dict[str, Plan] = {}
        self._presets: dict[str, Plan] | None = None

    def remember(self, plan: Plan) -> None:
        """A plan the user started from or set: later edits are named after it."""
        if plan.name and EDITED not in plan.name:
            self.bases[plan.name] = plan

    def known(self) -> dict[str, Plan]:
        if self._presets is None:
            self._presets = preset_plans(self.tree, (None, "blocks"))  # what the tree's menus make
        return {**self._presets, **self.bases}

    def match(self, plan: Plan) -> str | None:
        """The name of a known plan equal to ``plan`` (same entries), if any."""
        return next((name for name, p in self.known().items() if name and not changed_entries(p, plan)), None)

    def after_edit(self, plan: Plan, current: Plan, edits: tuple[Edit, ...]) -> tuple[Plan, tuple[Edit, ...]]:
        """``plan``, made by one user action on ``current`` (edited ``edits`` times since its base),
        with its name, and the edits that now lead to it."""
        name = self.match(plan)
        if name is not None:
            return renamed(plan, name), ()
        edits = edits + (Edit(changed_entries(current, plan)),)
        base = base_name(current.name)
        ref = self.known().get(base)
        if ref is None:
            return renamed(plan, f"{base or 'custom plan'}, edited"), edits
        return renamed(plan, edited_name(base, edit_count(ref, plan, edits))), edits

    def carried_edits(self, plan: Plan) -> tuple[Edit, ...]:
        """For a plan that arrives named (a plan file, ``set_plan``, a preset that kept the
        checkpointing): what it differs in from its base, as the edits its name counts."""
        ref = self.known().get(base_name(plan.name))
        diff = changed_entries(ref, plan) if ref is not None else frozenset()
        if not diff:
            return ()
        counted = re.search(r"edited: (\d+) change", plan.name)
        return (Edit(diff, int(counted.group(1)) if counted else 1),)


def base_name(name: str) -> str:
    """The name a plan was edited from: "auto (LoRA sharded), edited: 3 changes" -> "auto (LoRA sharded)"."""
    return name.split(EDITED, 1)[0] if name else ""


def renamed(plan: Plan, name: str) -> Plan:
    return plan if plan.name == name else Plan(  # a captured plan keeps its origin and prefetch
        plan.units, plan.ignored, name, plan.checkpoint, prefetch=plan.prefetch, origin=plan.origin)
