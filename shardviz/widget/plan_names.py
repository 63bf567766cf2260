"""The Inspector's plan names: an edited plan says what it was edited from.

A plan equal to a preset (or to a plan the user started from or set) takes that plan's name;
any other plan is "<base>, edited: N changes", where the base is the name the current plan
carries. The name travels with the plan: the summary, the plan file and the exported code.
"""

from __future__ import annotations

from ..plan import LORA_LAYOUTS, Plan
from ..tree import ModelTree

EDITED = ", edited"


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
            self._presets = {}
            for lora in LORA_LAYOUTS:
                try:
                    p = Plan.auto(self.tree, lora=lora)
                except ValueError:
                    continue
                self._presets[p.name] = p
            for p in (Plan([""], name="root only"), Plan([], name="no calls")):
                self._presets[p.name] = p
        return {**self._presets, **self.bases}

    def named(self, plan: Plan, current_name: str) -> Plan:
        """``plan`` named after the plan it was edited from: a known plan's own name when it equals
        one, else "<base>, edited: N changes" (N: calls added, removed or changed, parameters
        ignored or given back, modules checkpointed or not, counted against the base)."""
        known = self.known()
        for name, p in known.items():
            if name and p == plan:
                return renamed(plan, name)
        base = base_name(current_name)
        ref = known.get(base)
        if ref is None:
            return renamed(plan, f"{base or 'custom plan'}, edited")
        n = plan_changes(ref, plan)
        return renamed(plan, f"{base}, edited: {n} change{'s' if n != 1 else ''}" if n else base)


def base_name(name: str) -> str:
    """The name a plan was edited from: "auto (LoRA sharded), edited: 3 changes" -> "auto (LoRA sharded)"."""
    return name.split(EDITED, 1)[0] if name else ""


def renamed(plan: Plan, name: str) -> Plan:
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
