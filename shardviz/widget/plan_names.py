"""The Inspector's plan names: an edited plan says what it was edited from, and how many edits.

A plan equal to a known plan (a preset, with or without its blocks checkpointed, or a plan the
user started from or set) takes that plan's name, the name ``Plan.auto`` and the CLI give it.
Any other plan is "<base>, edited: N changes", where N counts the user's edits: each action
("checkpoint all blocks", "ignore LoRA" under a block, one toggle) is one edit however many
entries it touches, and an edit whose every entry is back as in the base no longer counts.
The history carries the base and the edits (``NamedPlan``); the name is written from them and
never read back. What the name counts travels with it as data (``Plan.edited``: the base and the
count, in the plan file too), so a plan that arrives from outside (a plan file, ``set_plan``)
counts on from its edits. The name travels with the plan: the summary, the plan file and the
exported code.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from ..plan import Edited, Plan
from ..presets import preset_plans
from ..model.tree import ModelTree

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


def edited_plan(plan: Plan, base: str, n: int) -> Plan:
    """``plan`` named "<base>, edited: N changes", with what the name counts (``Plan.edited``)."""
    if not n:
        return plan.renamed(base)
    return plan.renamed(f"{base}, edited: {n} change{'' if n == 1 else 's'}", Edited(base, n))


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
            return NamedPlan(plan.renamed(name), name)
        edits = current.edits + (Edit(changed_entries(current.plan, plan)),)
        ref = self.known().get(current.base) if current.base else None
        if ref is None:  # nothing to count from: the name says edited, the data keeps the edits made
            return NamedPlan(plan.renamed(f"{current.base or 'custom plan'}, edited",
                                     Edited(current.base, sum(e.weight for e in edits))), current.base, edits)
        diff = changed_entries(ref, plan)  # an edit whose every entry is back as in the base no longer counts
        return NamedPlan(edited_plan(plan, current.base, sum(e.weight for e in edits if e.entries & diff)),
                         current.base, edits)

    def from_preset(self, preset: Plan, plan: Plan) -> NamedPlan:
        """``plan``: preset ``preset`` with something kept from the plan it replaces (the
        checkpointing), one edit of the preset unless it equals a known plan."""
        name = self.match(plan)
        if name is not None:
            return NamedPlan(plan.renamed(name), name)
        return NamedPlan(edited_plan(plan, preset.name, 1), preset.name, (Edit(changed_entries(preset, plan)),))

    def arrived(self, plan: Plan) -> NamedPlan:
        """A plan that replaces the current one (the start, ``set_plan``, a preset, a suggestion),
        keeping its own name: one an Inspector named after its edits (``plan.edited``: a plan file,
        another Inspector's plan) counts on from them, any other named plan becomes a base of later
        edits. The name itself is never parsed: a user's "x, edited: 2 changes" is a name like any other."""
        if plan.edited is not None:
            base, count = plan.edited
            ref = self.known().get(base) if base else None
            diff = changed_entries(ref, plan) if ref is not None else frozenset()
            return NamedPlan(plan, base, (Edit(diff, count),) if diff else ())
        if plan.name:
            self.bases[plan.name] = plan
        return NamedPlan(plan, plan.name)


def shown_name(name: str | None, mesh) -> str:
    """The plan's name as the Inspector shows it beside ``mesh``: a Suggest row's name says the mesh
    it was found for ("search: ..., HSDP 16x4"); once the mesh is another, the name says so instead of
    naming a mesh the numbers are no longer for ("..., HSDP 16x4 (found for that mesh; now FSDP 48)")."""
    name = name or ""
    if not name.startswith("search: "):
        return name
    dp = mesh.shard * mesh.replicate
    words = (f"HSDP {mesh.replicate}x{mesh.shard}" if mesh.replicate > 1 else f"FSDP {dp}") + (
        f" x TP {mesh.tensor}" if mesh.tensor > 1 else "")
    if re.search(rf"(^|, ){re.escape(words)}(,|$| )", name[len("search: "):]):
        return name
    return f"{name} (found for that mesh; now {words})"
