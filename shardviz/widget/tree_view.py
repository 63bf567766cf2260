"""What the Inspector's tree shows: folded repeated blocks, per-module badges, visible rows.

Three layers, each cheap at the scale of Llama-70B+LoRA (~6,600 modules, ~1,800 parameters):

- ``Folding`` (per tree, computed lazily per parent): runs of sibling modules of one class whose
  names count up (``layers.0`` ... ``layers.79``, ``experts.expert_0`` ...) become one group row,
  "layers.0-79 · 80 x LlamaDecoderLayer";
- ``ModuleStats`` (per analysis, one O(modules + parameters) sweep): for every module the unique
  parameters under it by status, the bytes each rank allocates for them, and one status signature
  (all in one call / all ignored / all unmanaged / mixed). Tied parameters are counted once per
  subtree;
- ``TreeView`` (per Inspector): which modules and groups are expanded, the filters, and the
  visible rows in order. Only visible rows are ever built, so a toggle costs the size of what is
  on screen, not the size of the model.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass

import numpy as np

from ..fsdp import Layout
from ..tree import ModelTree

#: Fewest siblings that fold into one group row.
FOLD_MIN = 2
#: Most rows a filtered view lists (matches and their ancestors).
MAX_FILTER_ROWS = 2000

STATUS_FILTERS = ("", "unit", "sharded", "ignored", "unmanaged", "mixed")
ROLE_FILTERS = ("", "base", "lora")

_NUMBERED = re.compile(r"^(.*?)(\d+)$")

# Status codes of one parameter; a sharded parameter's code is SHARDED + its unit index.
IGNORED, UNMANAGED, SHARDED = 1, 2, 10
NONE_SIG, MIXED_SIG = -2, -1


def _last(fqn: str) -> str:
    return fqn.rpartition(".")[2]


def short_unit_name(plan_unit) -> str:
    """A compact label for a call: the last two name parts ("layers.3"), '<root>', or '[a, b]'."""
    def one(m: str) -> str:
        if m == "":
            return "<root>"
        parts = m.split(".")
        return ".".join(parts[-2:]) if len(parts) > 1 and parts[-1].isdigit() else parts[-1]

    labels = [one(m) for m in plan_unit.modules]
    return labels[0] if len(labels) == 1 else "[" + ", ".join(labels) + "]"


@dataclass
class Group:
    gid: str
    parent: int
    members: list[int]
    type_name: str
    label: str  # "layers.0-79"


class Folding:
    """Sibling runs folded into groups; computed per parent on first use."""

    def __init__(self, tree: ModelTree, fold_min: int = FOLD_MIN):
        self.tree, self.fold_min = tree, fold_min
        self.groups: dict[str, Group] = {}
        self.group_of: dict[int, str] = {}  # member module -> its group id
        self._items: dict[int, list[tuple[str, object]]] = {}

    def items(self, m: int) -> list[tuple[str, object]]:
        """Children of module ``m`` as ("m", index) or ("g", gid) entries, in order."""
        cached = self._items.get(m)
        if cached is not None:
            return cached
        tree = self.tree
        kids = tree.modules[m].children
        out: list[tuple[str, object]] = []
        i = 0
        while i < len(kids):
            j = i + 1
            first = tree.modules[kids[i]]
            match = _NUMBERED.match(_last(first.fqn))
            if match:
                prefix, num = match.group(1), int(match.group(2))
                while j < len(kids):
                    nxt = tree.modules[kids[j]]
                    mm = _NUMBERED.match(_last(nxt.fqn))
                    if not (mm and mm.group(1) == prefix and int(mm.group(2)) == num + (j - i)
                            and nxt.type_name == first.type_name):
                        break
                    j += 1
            if match and j - i >= self.fold_min:
                members = list(kids[i:j])
                gid = f"g{m}_{kids[i]}"
                parent_name = _last(tree.modules[m].fqn)
                last_num = int(_NUMBERED.match(_last(tree.modules[kids[j - 1]].fqn)).group(2))
                label = f"{prefix}{int(match.group(2))}-{last_num}"
                if parent_name:
                    label = f"{parent_name}.{label}"
                self.groups[gid] = Group(gid, m, members, first.type_name, label)
                for c in members:
                    self.group_of[c] = gid
                out.append(("g", gid))
            else:
                out.extend(("m", c) for c in kids[i:j])
            i = j
        self._items[m] = out
        return out

    def group_containing(self, m: int) -> str | None:
        parent = self.tree.modules[m].parent
        if parent < 0:
            return None
        self.items(parent)
        return self.group_of.get(m)

    def group(self, gid: str) -> Group:
        if gid not in self.groups:
            parent = int(gid[1:].split("_")[0])
            self.items(parent)
        return self.groups[gid]


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
        self.itemsize_p = np.array([p.itemsize for p in params], dtype=np.int64)
        self.dim0_p = np.array([p.shape[0] if p.shape else 1 for p in params], dtype=np.int64)
        self.rowsize_p = np.where(self.dim0_p > 0, self.numel_p // np.maximum(self.dim0_p, 1), 0)
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
        punit = np.asarray(layout.param_unit, dtype=np.int64)
        sharded = np.fromiter((s == "sharded" for s in status), dtype=bool, count=len(status))
        ignored = np.fromiter((s == "ignored" for s in status), dtype=bool, count=len(status))
        codes = np.where(sharded, SHARDED + punit, np.where(ignored, IGNORED, UNMANAGED))
        s = layout.mesh.shard
        padded = -(-static.dim0_p // s) * static.rowsize_p
        rank_bytes = np.where(sharded, padded, static.numel_p) * static.itemsize_p
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


class TreeView:
    """Expansion, filters and the visible rows of one Inspector."""

    def __init__(self, tree: ModelTree):
        self.tree = tree
        self.folding = Folding(tree)
        self.static = StaticStats(tree)
        self.expanded: set = {0}  # module indices and group ids
        self.filter_text = ""
        self.filter_status = ""
        self.filter_role = ""
        self.rank = 0
        self.truncated = 0  # matches left out of a filtered view
        self.matches = 0  # modules and parameters the filter matches (all of them, shown or not)
        self._filter_cache = None

    # -- expansion ---------------------------------------------------------------------------
    def resolve(self, target) -> object:
        """A row id ("m12", "g3_4", "p5_7"), a module FQN or a group id -> module index or gid."""
        if isinstance(target, int):
            return target
        if isinstance(target, str):
            if target.startswith("m") and target[1:].isdigit():
                return int(target[1:])
            if target.startswith("g") and "_" in target:
                self.folding.group(target)
                return target
            if target in self.tree.module_index:
                return self.tree.module_index[target]
        raise ValueError(f"no module or group {target!r} in the tree")

    def set_expanded(self, target, open_: bool = True) -> None:
        key = self.resolve(target)
        if open_:
            self.expanded.add(key)
        else:
            self.expanded.discard(key)

    def collapse_all(self) -> None:
        self.expanded = {0}

    def expand_to(self, fqn: str) -> str:
        """Open every ancestor (and folded group) of a module or parameter; return its row id."""
        tree = self.tree
        if fqn in tree.module_index:
            m = tree.module_index[fqn]
            row = f"m{m}"
            chain = m if m == 0 else tree.modules[m].parent
            target_is_param = False
        elif fqn in tree.param_index:
            owner = tree.module_index[fqn.rpartition(".")[0]]
            row = f"p{owner}_{tree.param_index[fqn]}"
            chain = owner
            target_is_param = True
        else:
            raise ValueError(f"no module or parameter named {fqn!r}")
        node = chain
        start = tree.module_index[fqn] if not target_is_param else owner
        # the target's own group (it is a member of a folded run)
        gid = self.folding.group_containing(start)
        if gid:
            self.expanded.add(gid)
        while node >= 0:
            self.expanded.add(node)
            gid = self.folding.group_containing(node)
            if gid:
                self.expanded.add(gid)
            node = tree.modules[node].parent
        return row

    # -- filters ---------------------------------------------------------------------------
    @property
    def filtering(self) -> bool:
        return bool(self.filter_text or self.filter_status or self.filter_role)

    def set_filter(self, text=None, status=None, role=None) -> None:
        if text is not None:
            self.filter_text = str(text).strip()
        if status is not None:
            if status not in STATUS_FILTERS:
                raise ValueError(f"status filter {status!r}: expected one of {STATUS_FILTERS}")
            self.filter_status = status
        if role is not None:
            if role not in ROLE_FILTERS:
                raise ValueError(f"role filter {role!r}: expected one of {ROLE_FILTERS}")
            self.filter_role = role

    def _matches(self, stats: ModuleStats) -> tuple[set[int], set[tuple[int, int]]]:
        """Modules and (module, parameter) pairs that match, plus their ancestors (capped)."""
        tree, text = self.tree, self.filter_text.lower()
        status, role = self.filter_status, self.filter_role
        lay = stats.layout
        mods: set[int] = set()
        params: set[tuple[int, int]] = set()
        hits = 0
        limit = MAX_FILTER_ROWS
        self.truncated = 0
        module_status = status in ("unit", "mixed")
        param_status = status in ("sharded", "ignored", "unmanaged")
        for info in tree.modules:
            if not role and not param_status:
                ok = (not text or text in info.fqn.lower()) and (
                    not status
                    or (status == "unit" and stats.own_unit[info.index] >= 0)
                    or (status == "mixed" and stats.sig[info.index] == MIXED_SIG and stats.own_unit[info.index] < 0)
                )
                if ok and info.index != 0:
                    if hits >= limit:
                        self.truncated += 1
                    else:
                        hits += 1
                        self._add_path(info.index, mods)
            if module_status:
                continue
            for p in info.params:
                pi = tree.params[p]
                name = next((f for f in pi.fqns if f.rpartition(".")[0] == info.fqn), pi.fqn)
                if text and text not in name.lower():
                    continue
                if role and pi.role != role:
                    continue
                if param_status and lay.param_status[p] != status:
                    continue
                if hits >= limit:
                    self.truncated += 1
                    continue
                hits += 1
                params.add((info.index, p))
                self._add_path(info.index, mods)
        self.matches = hits + self.truncated
        return mods, params

    def _add_path(self, m: int, mods: set[int]) -> None:
        while m >= 0 and m not in mods:
            mods.add(m)
            m = self.tree.modules[m].parent

    # -- visible rows ----------------------------------------------------------------------
    def visible(self, stats: ModuleStats) -> list[tuple[str, int, object]]:
        """(row id, display depth, payload) for every visible row, in order."""
        out: list[tuple[str, int, object]] = []
        if self.filtering:
            mods, params = self._matches(stats)
            self._walk_filtered(0, 0, mods, params, out)
            return out
        self.truncated = 0
        self._walk(0, 0, out)
        return out

    def _walk(self, m: int, depth: int, out) -> None:
        out.append((f"m{m}", depth, m))
        if m not in self.expanded:
            return
        for p in self.tree.modules[m].params:
            out.append((f"p{m}_{p}", depth + 1, (m, p)))
        for kind, item in self.folding.items(m):
            if kind == "m":
                self._walk(item, depth + 1, out)
            else:
                out.append((item, depth + 1, item))
                if item in self.expanded:
                    for c in self.folding.groups[item].members:
                        self._walk(c, depth + 2, out)

    def _walk_filtered(self, m: int, depth: int, mods: set[int], params: set, out) -> None:
        out.append((f"m{m}", depth, m))
        for p in self.tree.modules[m].params:
            if (m, p) in params:
                out.append((f"p{m}_{p}", depth + 1, (m, p)))
        for c in self.tree.modules[m].children:
            if c in mods:
                self._walk_filtered(c, depth + 1, mods, params, out)

    def in_block(self, m: int) -> bool:
        """Is module ``m`` one of a run of repeated blocks (a folded group), or inside one?"""
        cache = self.__dict__.setdefault("_in_block", {})
        if m not in cache:
            parent = self.tree.modules[m].parent
            cache[m] = parent >= 0 and (self.folding.group_containing(m) is not None or self.in_block(parent))
        return cache[m]

    def expandable(self, m: int) -> bool:
        info = self.tree.modules[m]
        return bool(info.children or info.params)

    # -- row payloads ------------------------------------------------------------------------
    def module_row(self, m: int, depth: int, stats: ModuleStats) -> dict:
        tree, static, lay = self.tree, self.static, stats.layout
        info = tree.modules[m]
        own = stats.own_unit[m]
        row = {
            "kind": "module",
            "depth": depth,
            "name": _last(info.fqn) if info.fqn else "(root)",
            "fqn": info.fqn,
            "type": info.type_name,
            "numel": static.numel[m],
            "tied_numel": static.tied_numel[m],
            "n_params": static.n_params[m],
            "bytes": stats.rank_bytes[m],
            "badge": stats.badge(m, static),
            # a call on a module without parameters does nothing (peft's empty lora_embedding_A/B,
            # lora_dropout): no "+ unit" there
            "can_unit": own >= 0 or static.n_params[m] > 0,
            "checkpointed": m in stats.checkpointed,
            # offered on the repeated blocks and what is inside them (and wherever it is set)
            "can_checkpoint": m in stats.checkpointed or (static.n_params[m] > 0 and self.in_block(m)),
            "open": (m in self.expanded) or self.filtering,
            "expandable": self.expandable(m),
            "is_unit": own >= 0,
            "lora": stats.lora_state(m, static),
            "n_lora": static.n_lora[m],
        }
        if own >= 0:
            ul = lay.units[own]
            row["rar"] = _rar_value(ul.unit.reshard_after_forward)
            row["rar_effective"] = _rar_value(ul.reshard_after_forward)
            row["grouped"] = ul.unit.is_grouped
            row["unit"] = ul.unit.name
        return row

    def group_row(self, gid: str, depth: int, stats: ModuleStats) -> dict:
        g = self.folding.group(gid)
        static = self.static
        members = g.members
        n_units = sum(1 for c in members if stats.own_unit[c] >= 0)
        kinds = [stats.badge(c, static)["kind"] for c in members]
        labels = {stats.badge(c, static)["label"] for c in members}
        if n_units == len(members):
            badge = {"kind": "unit", "label": f"{n_units} units", "title": f"each of the {len(members)} blocks is its own fully_shard call"}
        elif len(set(kinds)) == 1 and len(labels) == 1:
            b = stats.badge(members[0], static)
            badge = {"kind": b["kind"], "label": b["label"], "title": f"all {len(members)} blocks: {b['title']}"}
        else:
            badge = {"kind": "mixed", "label": "mixed", "title": f"{n_units} of {len(members)} blocks are their own unit"}
        n_lora = sum(static.n_lora[c] for c in members)
        lora_ign = sum(stats.lora_ignored[c] for c in members)
        rars = {_rar_value(stats.layout.units[stats.own_unit[c]].unit.reshard_after_forward) for c in members if stats.own_unit[c] >= 0}
        return {
            "kind": "group",
            "depth": depth,
            "name": g.label,
            "label": f"{g.label} · {len(members)} x {g.type_name}",
            "fqn": self.tree.modules[members[0]].fqn,
            "type": g.type_name,
            "count": len(members),
            "numel": sum(static.numel[c] for c in members),
            "n_params": sum(static.n_params[c] for c in members),
            "bytes": sum(stats.rank_bytes[c] for c in members),
            "badge": badge,
            "open": gid in self.expanded,
            "expandable": True,
            "n_units": n_units,
            "lora": None if not n_lora else ("ignored" if lora_ign == n_lora else ("kept" if lora_ign == 0 else "partly ignored")),
            "n_lora": n_lora,
            "rar": rars.pop() if len(rars) == 1 and n_units == len(members) else None,
            "n_checkpointed": sum(1 for c in members if c in stats.checkpointed),
        }

    def param_row(self, m: int, p: int, depth: int, stats: ModuleStats) -> dict:
        tree, lay = self.tree, stats.layout
        pi = tree.params[p]
        prefix = tree.modules[m].fqn
        fqn = next((f for f in pi.fqns if f.rpartition(".")[0] == prefix), pi.fqn)
        status = lay.param_status[p]
        rank = min(self.rank, lay.mesh.world - 1)
        local = lay.local_shape(fqn, rank)
        if status == "sharded":
            shard = lay.shard_shape(p)
            padding = math.prod(shard) - math.prod(local)
            unit = lay.units[lay.param_unit[p]].unit
            badge = {"kind": "sharded", "label": f"sharded · {short_unit_name(unit)}", "title": f"sharded by call {unit.name}"}
        else:
            shard, padding = pi.shape, 0
            if status == "ignored":
                badge = {"kind": "ignored", "label": "ignored", "title": "in the plan's ignored parameters: kept whole on every rank, gradient not reduced by FSDP"}
            else:
                badge = {"kind": "unmanaged", "label": "unmanaged", "title": "under no fully_shard call: a plain tensor on every rank"}
        return {
            "kind": "param",
            "depth": depth,
            "name": _last(fqn),
            "fqn": fqn,
            "canonical": pi.fqn,
            "shape": list(pi.shape),
            "dtype": str(pi.dtype).replace("torch.", ""),
            "numel": pi.numel,
            "trainable": pi.requires_grad,
            "role": pi.role,
            "status": status,
            "badge": badge,
            "local_shape": list(local),
            "shard_shape": list(shard),
            "padding": padding,
            "rank": rank,
            "bytes": (lay.padded_shard_numel(p) * pi.itemsize) if status == "sharded" else pi.nbytes,
            "tied": len(pi.fqns) > 1,
        }

    def rows(self, stats: ModuleStats) -> tuple[list[str], dict[str, dict]]:
        """Visible row ids in order, and each row's payload."""
        order: list[str] = []
        rows: dict[str, dict] = {}
        for rid, depth, payload in self.visible(stats):
            if rid.startswith("m"):
                rows[rid] = self.module_row(payload, depth, stats)
            elif rid.startswith("g"):
                rows[rid] = self.group_row(payload, depth, stats)
            else:
                rows[rid] = self.param_row(payload[0], payload[1], depth, stats)
            order.append(rid)
        return order, rows


def _rar_value(value):
    """reshard_after_forward as JSON: None -> "default", bools and ints as they are."""
    return "default" if value is None else value
