"""Folding repeated blocks: runs of numbered sibling modules of one class shown as one tree row.

``layers.0`` ... ``layers.79`` (or ``experts.expert_0`` ...) become one row
"layers.0-79 · 80 x LlamaDecoderLayer". A ``FoldedRun`` is only a display group: it has nothing
to do with ``fully_shard`` units, though the tree offers actions on all its members at once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..model.tree import ModelTree

#: Fewest siblings that fold into one row.
FOLD_MIN = 2

_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def last_name(fqn: str) -> str:
    return fqn.rpartition(".")[2]


@dataclass
class FoldedRun:
    """Numbered siblings of one class shown as one row ("layers.0-79 · 80 x LlamaDecoderLayer")."""

    gid: str
    parent: int
    members: list[int]
    type_name: str
    label: str  # "layers.0-79"


class Folding:
    """Runs of numbered siblings folded into one row each; computed per parent on first use.

    A run's id ("g<parent>_<first member>") is the tree row id the front end sends back."""

    def __init__(self, tree: ModelTree, fold_min: int = FOLD_MIN):
        self.tree, self.fold_min = tree, fold_min
        self.runs: dict[str, FoldedRun] = {}
        self.run_of: dict[int, str] = {}  # member module -> its run id
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
            match = _NUMBERED.match(last_name(first.fqn))
            if match:
                prefix, num = match.group(1), int(match.group(2))
                while j < len(kids):
                    nxt = tree.modules[kids[j]]
                    mm = _NUMBERED.match(last_name(nxt.fqn))
                    if not (mm and mm.group(1) == prefix and int(mm.group(2)) == num + (j - i)
                            and nxt.type_name == first.type_name):
                        break
                    j += 1
            if match and j - i >= self.fold_min:
                members = list(kids[i:j])
                gid = f"g{m}_{kids[i]}"
                parent_name = last_name(tree.modules[m].fqn)
                last_num = int(_NUMBERED.match(last_name(tree.modules[kids[j - 1]].fqn)).group(2))
                label = f"{prefix}{int(match.group(2))}-{last_num}"
                if parent_name:
                    label = f"{parent_name}.{label}"
                self.runs[gid] = FoldedRun(gid, m, members, first.type_name, label)
                for c in members:
                    self.run_of[c] = gid
                out.append(("g", gid))
            else:
                out.extend(("m", c) for c in kids[i:j])
            i = j
        self._items[m] = out
        return out

    def run_containing(self, m: int) -> str | None:
        parent = self.tree.modules[m].parent
        if parent < 0:
            return None
        self.items(parent)
        return self.run_of.get(m)

    def run(self, gid: str) -> FoldedRun:
        if gid not in self.runs:
            parent = int(gid[1:].split("_")[0])
            self.items(parent)
        return self.runs[gid]
