"""The Inspector's plan names: an edited plan says what it was edited from, and how many edits.

A plan equal to a known plan (a preset, with or without its blocks checkpointed, or a plan the
user started from or set) takes that plan's name, the name ``Plan.auto`` and the CLI give it.
Any other plan is "<base>, edited: N changes", where N counts the user's edits: each action
("checkpoint all blocks", "ignore LoRA" under a block, one toggle) is one edit however many
entries it touches, and an edit whose every entry is back as in the base no longer counts.
The history carries the base and the edits (``NamedPlan``); the name is written from them and
never read back, except from a plan that arrives from outside (a plan file, ``set_plan``).
The name travels with the plan: the summary, the plan file and the exported code.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from ..plan import Plan
from ..presets import preset_plans
from ..tree import ModelTree

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


def edited_name(base: str, n: int) -> str:
    return f"{base}, edited: {n} change{'' if n == 1 else 's'}" if n else base


def read_edited_name(name: str) -> tuple[str, int] | None:
    """(base, N) of a name ``edited_name`` wrote, else None. Only for a plan that arrives from outside
    the Inspector's history (a plan file, ``set_plan``): the history carries both explicitly."""
    found = re.fullmatch(r"(.*), edited(?:: (\d+) changes?)?", name or "")
    return (found.group(1), int(found.group(2) or 1)) if found else None


class NamedPlan(NamedTuple):
    """A plan with its name, the known plan its edits count from ("" when none: an unnamed custom
    plan), and the user's edits since then: what the Inspector's history carries."""

    plan: Plan
    base: str = ""
    edits: tuple[Edit, ...] = ()


class PlanNames:
    """Named plans an edit is measured from: the presets (built once) and the user's own."""

    def __init__(self, tree: ModelTree):
        self.tree = tree
        self.bases: dict[str, Plan] = {}
        self._presets: dict[str, Plan] | None = None

    def known(self) -> dict[str, Plan]:
        if self._presets is None:
            self._presets = preset_plans(self.tree, (None, "blocks"))  # what the tree's menus make
        return {**self._presets, **self.bases}

    def match(self, plan: Plan) -> str | None:
        """The name of a known plan equal to ``plan`` (same entries), if any."""
        return next((name for name, p in self.known().items() if name and not changed_entries(p, plan)), None)

    def after_edit(self, plan: Plan, current: NamedPlan) -> NamedPlan:
        """``plan``, made by one user action on ``current``, with its name and the edits that now
        lead to it from ``current``'s base."""
        name = self.match(plan)
        if name is not None:
            return NamedPlan(renamed(plan, name), name)
        edits = current.edits + (Edit(changed_entries(current.plan, plan)),)
        ref = self.known().get(current.base) if current.base else None
        if ref is None:
            return NamedPlan(renamed(plan, f"{current.base or 'custom plan'}, edited"), current.base, edits)
        diff = changed_entries(ref, plan)  # an edit whose every entry is back as in the base no longer counts
        return NamedPlan(renamed(plan, edited_name(current.base, sum(e.weight for e in edits if e.entries & diff))),
                         current.base, edits)

    def from_preset(self, preset: Plan, plan: Plan) -> NamedPlan:
        """``plan``: preset ``preset`` with something kept from the plan it replaces (the
        checkpointing), one edit of the preset unless it equals a known plan."""
        name = self.match(plan)
        if name is not None:
            return NamedPlan(renamed(plan, name), name)
        return NamedPlan(renamed(plan, edited_name(preset.name, 1)), preset.name, (Edit(changed_entries(preset, plan)),))

    def arrived(self, plan: Plan) -> NamedPlan:
        """A plan that replaces the current one (the start, ``set_plan``, a preset, a suggestion),
        keeping its own name: a named plan becomes a base of later edits, and one an Inspector
        named after its edits (a plan file) counts on from them."""
        edited = read_edited_name(plan.name)
        ref = self.known().get(edited[0]) if edited else None
        if edited and ref is not None:
            diff = changed_entries(ref, plan)
            return NamedPlan(plan, edited[0], (Edit(diff, edited[1]),) if diff else ())
        if plan.name and not edited:
            self.bases[plan.name] = plan
        return NamedPlan(plan, edited[0] if edited else plan.name)


def renamed(plan: Plan, name: str) -> Plan:
    return plan if plan.name == name else Plan(  # a captured plan keeps its origin and prefetch
        plan.units, plan.ignored, name, plan.checkpoint, prefetch=plan.prefetch, origin=plan.origin)
