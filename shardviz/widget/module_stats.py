"""Per-module numbers of the Inspector's tree: sizes (once per tree) and badges (once per layout).

- ``StaticStats`` (per tree): numpy arrays over modules and parameters, and per-module sums that
  do not depend on the plan (elements, parameter counts, LoRA counts). Tied parameters are counted
  once per subtree.
- ``ModuleStats`` (per layout, one O(modules + parameters) sweep): for every module the unique
  parameters under it by status, the bytes each rank allocates for them, and one status
  signature (all in one call / all ignored / all unmanaged / mixed), from which its badge follows.
"""

from __future__ import annotations

import itertools

import numpy as np

from ..step.params import tree_arrays
from ..fsdp import Layout
from ..model.tree import ModelTree

# Status codes of one parameter; a sharded parameter's code is SHARDED + its unit index.
IGNORED, UNMANAGED, SHARDED = 1, 2, 10
NONE_SIG, MIXED_SIG = -2, -1


def short_unit_name(plan_unit) -> str:
    """A compact label for a call: the last two name parts ("layers.3"), '<root>', or '[a, b]'."""
    def one(m: str) -> str:
        if m == "":
            return "<root>"
        parts = m.split(".")
        return ".".join(parts[-2:]) if len(parts) > 1 and parts[-1].isdigit() else parts[-1]

    labels = [one(m) for m in plan_unit.modules]
    return labels[0] if len(labels) == 1 else "[" + ", ".join(labels) + "]"



class StaticStats:
    """Per-tree arrays and per-module numbers that do not depend on the plan (computed once)."""

    def __init__(self, tree: ModelTree):
        self.tree = tree
        n = tree.n_modules
        self.parent = np.array([m.parent for m in tree.modules], dtype=np.int64)
        depth = np.array([m.depth for m in tree.modules], dtype=np.int64)
        # modules level by level, deepest first: a bottom-up sweep is one numpy call per level
        self.levels = [np.nonzero(depth == d)[0] for d in range(int(depth.max(initial=0)), 0, -1)]
        params = tree.params
        self.owner0 = np.array([p.owners[0] for p in params], dtype=np.int64)
        # tied parameters: +v at every further owner, -v at the common ancestor of consecutive owners
        extra_p, extra_m, extra_s = [], [], []
        all_p, all_m = [], []
        for p in params:
            for o in p.owners:
                all_p.append(p.index)
                all_m.append(o)
            if len(p.owners) > 1:
                owners = sorted(p.owners)
                for o in owners[1:]:
                    extra_p.append(p.index), extra_m.append(o), extra_s.append(1)
                for a, b in itertools.pairwise(owners):
                    extra_p.append(p.index), extra_m.append(_lca(tree, a, b)), extra_s.append(-1)
        self.extra_p = np.array(extra_p, dtype=np.int64)
        self.extra_m = np.array(extra_m, dtype=np.int64)
        self.extra_s = np.array(extra_s, dtype=np.int64)
        self.all_p = np.array(all_p, dtype=np.int64)
        self.all_m = np.array(all_m, dtype=np.int64)
        self.n = n
        self.numel_p = np.array([p.numel for p in params], dtype=np.int64)
        self.lora_p = np.array([p.role == "lora" for p in params], dtype=bool)
        train = np.array([p.requires_grad for p in params], dtype=bool)
        # sizes count a tied parameter once, under its first owner: children never add up to
        # more than their parent (T5's shared embedding is not in both the encoder and decoder)
        self.numel = self.accumulate(self.numel_p, once=True).tolist()
        self.tied_numel = (self.accumulate(self.numel_p) - np.asarray(self.numel, dtype=np.int64)).tolist()
        self.n_params = self.accumulate(np.ones(len(params), dtype=np.int64)).tolist()
        self.n_lora = self.accumulate(self.lora_p.astype(np.int64)).tolist()
        self.trainable = self.accumulate(np.where(train, self.numel_p, 0)).tolist()
        self.by_type: dict[str, list[int]] = {}
        for info in tree.modules:
            self.by_type.setdefault(info.type_name, []).append(info.index)

    def accumulate(self, values: np.ndarray, once: bool = False) -> np.ndarray:
        """Per module: the sum of ``values`` over the unique parameters anywhere under it
        (``once``: a tied parameter only under its first owner)."""
        values = np.asarray(values, dtype=np.int64)
        acc = np.zeros(self.n, dtype=np.int64)
        np.add.at(acc, self.owner0, values)
        if self.extra_p.size and not once:
            np.add.at(acc, self.extra_m, self.extra_s * values[self.extra_p])
        parent = self.parent
        for level in self.levels:
            np.add.at(acc, parent[level], acc[level])
        return acc

    def signature(self, codes: np.ndarray) -> np.ndarray:
        """Per module: the one code shared by every parameter under it, NONE_SIG or MIXED_SIG."""
        big = np.iinfo(np.int64).max
        lo = np.full(self.n, big, dtype=np.int64)
        hi = np.full(self.n, -1, dtype=np.int64)
        if self.all_p.size:
            np.minimum.at(lo, self.all_m, codes[self.all_p])
            np.maximum.at(hi, self.all_m, codes[self.all_p])
        parent = self.parent
        for level in self.levels:
            np.minimum.at(lo, parent[level], lo[level])
            np.maximum.at(hi, parent[level], hi[level])
        return np.where(hi < 0, NONE_SIG, np.where(lo == hi, lo, MIXED_SIG))


def _lca(tree: ModelTree, a: int, b: int) -> int:
    while not tree.is_inside(b, a):
        a = tree.modules[a].parent
    return a


class ModuleStats:
    """Per-module numbers for one layout (one plan on one mesh): a few numpy sweeps."""

    def __init__(self, tree: ModelTree, layout: Layout, static: StaticStats):
        self.tree, self.layout, self.static = tree, layout, static
        status = layout.param_status
        punit = layout.param_unit_array
        sharded = layout.sharded
        ignored = np.fromiter((s == "ignored" for s in status), dtype=bool, count=len(status))
        codes = np.where(sharded, SHARDED + punit, np.where(ignored, IGNORED, UNMANAGED))
        # each parameter as the layout holds it: on a 2-D mesh its tensor-parallel local shape (the
        # layout's own tree), not the model's (before, the tree showed a TP rank twice its bytes)
        local = tree_arrays(layout.tree)
        rank_bytes = np.where(sharded, local.padded(layout.mesh.shard), local.numel) * local.itemsize
        self.codes = codes.tolist()
        self.rank_bytes = static.accumulate(rank_bytes, once=True).tolist()
        self.n_ignored = static.accumulate(ignored.astype(np.int64)).tolist()
        self.n_sharded = static.accumulate(sharded.astype(np.int64)).tolist()
        self.lora_ignored = static.accumulate((ignored & static.lora_p).astype(np.int64)).tolist()
        self.sig = static.signature(codes).tolist()
        own = [-1] * tree.n_modules
        for ul in layout.units:
            for m in ul.modules:
                own[m] = ul.index
        self.own_unit = own
        self.checkpointed = frozenset(tree.module_index[f] for f in layout.plan.checkpoint if f in tree.module_index)
        self.tp_styles = tp_style_names(tree, layout)  # module -> its tensor-parallel style (a 2-D mesh only)

    def badge(self, m: int, static: StaticStats | None = None) -> dict:
        """The module's status badge: unit / in X / ignored / unmanaged / mixed."""
        static = static or self.static
        lay = self.layout
        own = self.own_unit[m]
        n = static.n_params[m]
        if own >= 0:
            unit = lay.units[own].unit
            label = "unit" if not unit.is_grouped else f"unit · group of {len(unit.modules)}"
            return {"kind": "unit", "label": label,
                    "title": f"its own fully_shard call {unit.name}. {self.counts_text(m, static)}"}
        sig = self.sig[m]
        enclosing = lay.module_unit[m]
        if n == 0 or sig == NONE_SIG:
            if enclosing >= 0:
                u = lay.units[enclosing].unit
                return {"kind": "in", "label": f"in {short_unit_name(u)}", "title": f"no parameters; inside call {u.name}"}
            return {"kind": "unmanaged", "label": "unmanaged", "title": "no parameters; under no fully_shard call"}
        if sig == MIXED_SIG:
            return {"kind": "mixed", "label": "mixed", "title": self.counts_text(m, static)}
        if sig == IGNORED:
            return {"kind": "ignored", "label": "ignored", "title": self.counts_text(m, static)}
        if sig == UNMANAGED:
            return {"kind": "unmanaged", "label": "unmanaged", "title": self.counts_text(m, static)}
        u = lay.units[sig - SHARDED].unit
        return {"kind": "in", "label": f"in {short_unit_name(u)}",
                "title": f"inside call {u.name}. {self.counts_text(m, static)}"}

    def counts_text(self, m: int, static: StaticStats | None = None) -> str:
        static = static or self.static
        n, sh, ig = static.n_params[m], self.n_sharded[m], self.n_ignored[m]
        parts = [f"{n} parameters: {sh} sharded", f"{ig} ignored", f"{n - sh - ig} unmanaged"]
        if self.sig[m] == MIXED_SIG and sh:
            # calls that shard something here: those opened inside this subtree, and the enclosing one
            end = self.tree.modules[m].subtree_end
            units = [ul.index for ul in self.layout.units if ul.params and any(m <= x < end for x in ul.modules)]
            enclosing = self.layout.module_unit[m]
            if enclosing >= 0 and enclosing not in units and sh > sum(len(self.layout.units[u].params) for u in units):
                units.insert(0, enclosing)
            if len(units) > 1:
                names = [self.layout.units[u].unit.name for u in units[:4]]
                more = f" and {len(units) - 4} more" if len(units) > 4 else ""
                parts.append(f"sharded by {len(units)} calls ({', '.join(names)}{more})")
        return ", ".join(parts)

    def lora_state(self, m: int, static: StaticStats | None = None) -> str | None:
        static = static or self.static
        total = static.n_lora[m]
        if not total:
            return None
        ign = self.lora_ignored[m]
        return "ignored" if ign == total else ("kept" if ign == 0 else "partly ignored")


def tp_style_names(tree: ModelTree, layout: Layout) -> dict[int, str]:
    """Each module the plan's tensor-parallel entries name -> its style's name, on a mesh with a tensor dim."""
    if layout.mesh.tensor == 1 or not layout.plan.tensor_parallel:
        return {}
    from ..tp import resolve

    modules, params = resolve(tree, layout.plan.tensor_parallel)  # the model's own tree: the Inspector's
    out = {m: style.style for m, (_, style) in modules.items()}
    for p, (_, style) in params.items():  # a parameter's own entry shows on its module
        out.setdefault(tree.params[p].owners[0], style.style)
    return out
