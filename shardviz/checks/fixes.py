"""``fix_plan``: a finding's fix applied as a new plan, when the fix is a change of plan.

One function per finding code (``FIXES``); each leaves a plan torch accepts as far as that finding
goes and raises no new error-level finding (``tests/test_fixes.py`` applies every one on the
zoo and handmade models). Below ``checks`` in the layers: SV106's wording asks ``split_unit`` here
whether a split exists.
"""

from __future__ import annotations

from dataclasses import replace

from ..finding import Finding
from ..fsdp import Layout, supports_grouped_call
from ..plan import Plan
from ..presets import auto_plan, join_calls
from ..model.tree import children_with_params


def fix_plan(analysis, finding: Finding):
    """The plan that ``finding.fix`` describes, applied to ``analysis.plan``; None when the fix is not a
    change of plan (another release, mesh or training, or the exported code) or no plan change helps.
    Each fix reads the analysis' layout (its tree, plan and mesh) and target release, nothing else."""
    fix = FIXES.get(finding.code)
    return fix(analysis.layout, finding, analysis.torch_version) if fix is not None else None


def fix_change(analysis, finding: Finding) -> dict | None:
    """The fix as the analysis' arguments it changes (``plan=``, ``mesh=``, ``training=``): the change
    its check priced (``Finding.change``: SV201's cheapest fix), else the plan ``fix_plan`` builds;
    None when the fix is words only. What the Inspector's card offers and applies."""
    if finding.change is not None:
        return dict(finding.change.kwargs)
    plan = fix_plan(analysis, finding)
    return None if plan is None else {"plan": plan}


def _with_root(plan: Plan) -> Plan:
    return plan if plan.unit_of("") is not None else plan.with_unit("")


def _layout(layout: Layout, plan: Plan) -> Layout:
    return Layout(layout.tree, plan, layout.mesh)


def _grouping_allowed(release: str | None) -> bool:
    return release is None or supports_grouped_call(release)


def _ignore_first(layout: Layout, finding: Finding, release):  # SV002, SV008: a refused parameter is kept out of FSDP
    tree = layout.tree
    return layout.plan.with_ignored([tree.params[tree.param_index[f]].fqn for f in finding.fqns[:1]])


def _join_shared(layout: Layout, finding: Finding, release):  # SV001
    joined = join_calls(layout.tree, layout.plan, finding.fqns)
    if not _grouping_allowed(release):
        joined = ungroup(layout.tree, joined)  # no groups before 2.5: the module around them instead
    grouped_roots = [f for f in _layout(layout, joined).errors if f.code == "SV004"]
    return _with_root(joined) if grouped_roots else joined


def _add_root(layout: Layout, finding: Finding, release):  # SV004, SV006, SV103, SV104
    # The root takes every leftover; a tied parameter it now reaches twice goes in one call.
    fixed = _with_root(layout.plan)
    before = {f.fqns for f in layout.errors if f.code == "SV001"}
    for _ in range(len(fixed.units)):
        split = [f for f in _layout(layout, fixed).errors if f.code == "SV001" and f.fqns not in before]
        if not split:
            break
        fixed = join_calls(layout.tree, fixed, split[0].fqns)
    return fixed


def _reshard_true(layout: Layout, finding: Finding, release):  # SV005
    return layout.plan.with_unit_options(finding.fqns[0], reshard_after_forward=True)


def _unit_per_child(layout: Layout, finding: Finding, release):  # SV007
    tree, plan = layout.tree, layout.plan
    unit = plan.unit_of(finding.fqns[0])
    children = [tree.modules[c].fqn for c in children_with_params(tree, tree.module_index[finding.fqns[0]])]
    return plan.with_units([u for u in plan.units if u is not unit] + [replace(unit, modules=[c]) for c in children])


def _ignore_minor_dtypes(layout: Layout, finding: Finding, release):  # SV003: keep the dtype with the most elements
    tree, lay = layout.tree, layout
    ul = lay.units[lay.param_unit[tree.param_index[finding.fqns[0]]]]
    by_dtype: dict = {}
    for p in ul.params:
        info = tree.params[p]
        if info.requires_grad:
            by_dtype.setdefault(info.dtype, []).append(info)
    keep = max(by_dtype, key=lambda d: (sum(i.numel for i in by_dtype[d]), str(d)))
    return layout.plan.with_ignored([i.fqn for d, group in by_dtype.items() if d != keep for i in group])


def _shard_trainable_ignored(layout: Layout, finding: Finding, release):  # SV102 (not 0-dim or strided ones: torch refuses them)
    tree, plan = layout.tree, layout.plan
    ignored = tree.param_indices(plan.ignored)
    back = [tree.params[p].fqn for p in ignored
            if tree.params[p].requires_grad and tree.params[p].shape and tree.params[p].contiguous]
    return plan.without_ignored(back) if back else None


def _per_block(layout: Layout, finding: Finding, release):  # SV105
    plan = layout.plan
    auto = auto_plan(layout.tree, "sharded")
    fixed = plan.with_units(auto.units).with_ignored(auto.ignored)
    return fixed if _grouping_allowed(release) else ungroup(layout.tree, fixed)


def _split_dominant(layout: Layout, finding: Finding, release):  # SV106
    for ul in layout.units:
        if ul.unit.modules == tuple(finding.fqns):
            return split_unit(layout, ul)
    return None


def _drop_unit(layout: Layout, finding: Finding, release):  # SV109
    return layout.plan.without_unit(finding.fqns[0])


def _ungroup_all(layout: Layout, finding: Finding, release):  # SV110
    return ungroup(layout.tree, layout.plan)


def _priced_plan(layout: Layout, finding: Finding, release):  # SV201: its cheapest fix, when that is a plan alone
    change = finding.change
    return change.kwargs["plan"] if change is not None and set(change.kwargs) == {"plan"} else None


FIXES = {
    "SV001": _join_shared,
    "SV002": _ignore_first,
    "SV003": _ignore_minor_dtypes,
    "SV004": _add_root,
    "SV005": _reshard_true,
    "SV006": _add_root,
    "SV007": _unit_per_child,
    "SV008": _ignore_first,
    "SV102": _shard_trainable_ignored,
    "SV103": _add_root,
    "SV104": _add_root,
    "SV105": _per_block,
    "SV106": _split_dominant,
    "SV109": _drop_unit,
    "SV110": _ungroup_all,
    "SV201": _priced_plan,
}


# ---------------------------------------------------------------------------
# Plan surgery the fixes share
# ---------------------------------------------------------------------------
def _movable_parts(tree, ul, candidates: list[int], keep_outer: bool) -> dict[int, list[int]]:
    """The candidates that can leave ``ul``'s call, grouped so that candidates sharing a parameter stay
    together (union-find). A candidate sharing a parameter with the call's own module, or with a module
    outside every candidate, stays where it is."""
    params = {c: set(tree.subtree_params(c)) for c in candidates}
    own = {p for m in ul.modules for p in tree.modules[m].params} if keep_outer else set()
    inside = {p for c in candidates for p in params[c]}
    outside_owned = {p.index for p in tree.params if p.index in inside and any(
        not any(tree.is_inside(o, c) for c in candidates) for o in p.owners)}
    movable = [c for c in candidates if not (params[c] & (own | outside_owned))]
    parent = {c: c for c in movable}

    def find(c):
        while parent[c] != c:
            parent[c] = parent[parent[c]]
            c = parent[c]
        return c

    for i, a in enumerate(movable):
        for b in movable[i + 1:]:
            if params[a] & params[b]:
                parent[find(a)] = find(b)
    groups: dict[int, list[int]] = {}
    for c in movable:
        groups.setdefault(find(c), []).append(c)
    return groups


def split_unit(layout: Layout, ul):
    """``ul``'s call split into calls that keep every shared parameter in one call, or None."""
    tree, plan = layout.tree, layout.plan
    unit = ul.unit
    if unit.is_grouped:
        candidates, keep_outer = list(ul.modules), False
    else:
        have = {tree.module_index[m] for u in plan.units for m in u.modules}
        candidates, keep_outer = [c for c in children_with_params(tree, ul.modules[0]) if c not in have], True
    if len(candidates) < (2 if unit.is_grouped else 1):
        return None
    groups = _movable_parts(tree, ul, candidates, keep_outer)
    moved = {m for g in groups.values() for m in g}
    new = [replace(unit, modules=[tree.modules[m].fqn for m in g]) for g in groups.values()]
    if not unit.is_grouped:
        return plan.with_units(list(plan.units) + new) if new else None
    stay = [m for m in candidates if m not in moved]
    if stay:
        new.append(replace(unit, modules=[tree.modules[m].fqn for m in stay]))
    return plan.with_units([u for u in plan.units if u is not unit] + new) if len(new) >= 2 else None


def _lowest_common_ancestor(tree, modules) -> int:
    path = []
    m = modules[0]
    while m >= 0:
        path.append(m)
        m = tree.modules[m].parent
    for a in path:
        if all(tree.is_inside(m, a) for m in modules):
            return a
    return 0


def ungroup(tree, plan: Plan) -> Plan:
    """Each grouped call replaced by one call on the lowest module that holds all its modules (for a
    release before 2.5); dropped when that module already has a call."""
    units = list(plan.units)
    for unit in [u for u in plan.units if u.is_grouped]:
        top = tree.modules[_lowest_common_ancestor(tree, [tree.module_index[m] for m in unit.modules])].fqn
        units.remove(unit)
        if not any(top in u.modules for u in units):
            units.append(replace(unit, modules=[top]))
    return plan.with_units(units)
