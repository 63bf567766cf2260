"""What the Inspector's tree shows: which rows are open, the filters, and the visible rows.

Built on two cheaper layers, each O(modules + parameters) at worst (Llama-70B+LoRA: ~6,600
modules, ~1,800 parameters): ``folding.py`` (runs of repeated blocks shown as one row) and
``module_stats.py`` (per-module sizes, bytes per rank and badges for one layout). ``TreeView``
(per Inspector) keeps which modules and folded runs are expanded, the filters and the chosen
rank, and builds only the visible rows, so a toggle costs the size of what is on screen, not the
size of the model.
"""

from __future__ import annotations

import math

from ..format import ROOT_NAME
from ..model.tree import ModelTree
from .folding import Folding, last_name
from .module_stats import MIXED_SIG, ModuleStats, StaticStats, short_unit_name

__all__ = ["MAX_FILTER_ROWS", "Folding", "ModuleStats", "StaticStats", "TreeView"]

#: Most rows a filtered view lists (matches and their ancestors).
MAX_FILTER_ROWS = 2000

STATUS_FILTERS = ("", "unit", "sharded", "ignored", "unmanaged", "mixed")
ROLE_FILTERS = ("", "base", "lora")


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
        self.filter_names: frozenset | None = None  # a finding's names (filter_to_names)
        self.filter_label = ""
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
                self.folding.run(target)
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
        gid = self.folding.run_containing(start)
        if gid:
            self.expanded.add(gid)
        while node >= 0:
            self.expanded.add(node)
            gid = self.folding.run_containing(node)
            if gid:
                self.expanded.add(gid)
            node = tree.modules[node].parent
        return row

    # -- filters ---------------------------------------------------------------------------
    @property
    def filtering(self) -> bool:
        return bool(self.filter_text or self.filter_status or self.filter_role or self.filter_names is not None)

    def set_filter(self, text=None, status=None, role=None) -> None:
        """The filter controls (they replace a filter to a finding's names)."""
        if status is not None and status not in STATUS_FILTERS:
            raise ValueError(f"status filter {status!r}: expected one of {STATUS_FILTERS}")
        if role is not None and role not in ROLE_FILTERS:
            raise ValueError(f"role filter {role!r}: expected one of {ROLE_FILTERS}")
        if text is not None:
            self.filter_text = str(text).strip()
        if status is not None:
            self.filter_status = status
        if role is not None:
            self.filter_role = role
        self.filter_names, self.filter_label = None, ""

    def filter_to_names(self, names, label: str) -> None:
        """Show only these modules and parameters (a finding's names), with their ancestors."""
        self.filter_text = self.filter_status = self.filter_role = ""
        self.filter_names, self.filter_label = frozenset(names), label

    def _module_matches(self, m: int, stats: ModuleStats) -> bool:
        info, status = self.tree.modules[m], self.filter_status
        if self.filter_role or status in ("sharded", "ignored", "unmanaged") or m == 0:
            return False  # parameter filters match parameters only
        if self.filter_names is not None and info.fqn not in self.filter_names:
            return False
        if self.filter_text and self.filter_text.lower() not in info.fqn.lower():
            return False
        if status == "unit":
            return stats.own_unit[m] >= 0
        if status == "mixed":
            return stats.sig[m] == MIXED_SIG and stats.own_unit[m] < 0
        return True

    def _param_matches(self, m: int, p: int, stats: ModuleStats) -> bool:
        pi, status = self.tree.params[p], self.filter_status
        if status in ("unit", "mixed"):
            return False  # module filters match modules only
        name = next((f for f in pi.fqns if f.rpartition(".")[0] == self.tree.modules[m].fqn), pi.fqn)
        if self.filter_names is not None and not self.filter_names.intersection(pi.fqns):
            return False
        if self.filter_text and self.filter_text.lower() not in name.lower():
            return False
        if self.filter_role and pi.role != self.filter_role:
            return False
        return not status or stats.layout.param_status[p] == status

    def _matches(self, stats: ModuleStats) -> tuple[set[int], set[tuple[int, int]]]:
        """Modules and (module, parameter) pairs that match, plus their ancestors (capped)."""
        mods: set[int] = set()
        params: set[tuple[int, int]] = set()
        hits = 0
        self.truncated = 0
        for info in self.tree.modules:
            found = [None] if self._module_matches(info.index, stats) else []
            found += [p for p in info.params if self._param_matches(info.index, p, stats)]
            for p in found:
                if hits >= MAX_FILTER_ROWS:
                    self.truncated += 1
                    continue
                hits += 1
                if p is not None:
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
                    for c in self.folding.runs[item].members:
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
            cache[m] = parent >= 0 and (self.folding.run_containing(m) is not None or self.in_block(parent))
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
            "name": last_name(info.fqn) if info.fqn else ROOT_NAME,
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
        if m in stats.tp_styles:
            row["tp"] = stats.tp_styles[m]
        if own >= 0:
            ul = lay.units[own]
            row["reshard_after_forward"] = _reshard_choice(ul.unit.reshard_after_forward)
            row["reshard_after_forward_effective"] = _reshard_choice(ul.reshard_after_forward)
            row["grouped"] = ul.unit.is_grouped
            row["unit"] = ul.unit.name
        return row

    def group_row(self, gid: str, depth: int, stats: ModuleStats) -> dict:
        g = self.folding.run(gid)
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
        reshards = {_reshard_choice(stats.layout.units[stats.own_unit[c]].unit.reshard_after_forward) for c in members if stats.own_unit[c] >= 0}
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
            "reshard_after_forward": reshards.pop() if len(reshards) == 1 and n_units == len(members) else None,
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
            "name": last_name(fqn),
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


def _reshard_choice(value):
    """reshard_after_forward as JSON: None -> "default", bools and ints as they are."""
    return "default" if value is None else value
