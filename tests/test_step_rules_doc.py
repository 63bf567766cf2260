"""docs/step-rules.md maps each FSDP2 hook rule to its one function: every name its table gives
(``module.function``, ``Class.attribute``, or a bare name of a module or class the row already named)
resolves in shardviz, so the table cannot point at code that was renamed or deleted."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "step-rules.md"
MODULES = ("step.events", "step.schedule", "step.timing", "fsdp", "step.simulation", "step.calls",
           "step.reserved", "step.levels", "step.model", "step.rank_state")


def _rows() -> list[tuple[str, list[str]]]:
    rows = []
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) < 4 or cells[1] in ("rule", "---") or not cells[2]:
            continue
        names = [re.sub(r"\(.*", "", n) for n in re.findall(r"`([^`]+)`", cells[2])]
        rows.append((cells[1], [n for n in names if re.fullmatch(r"[A-Za-z_][\w.]*", n)]))
    return rows


def _attribute(owner, path: list[str]) -> bool:
    for part in path:
        fields = getattr(owner, "__dataclass_fields__", {}) if isinstance(owner, type) else {}
        if part in fields and not hasattr(owner, part):
            owner = fields[part]
            continue
        if not hasattr(owner, part):
            return False
        owner = getattr(owner, part)
    return True


def _resolves(name: str, seen: list) -> bool:
    parts = name.split(".")
    for k in range(len(parts), 0, -1):  # the longest module prefix, then attributes
        try:
            module = importlib.import_module("shardviz." + ".".join(parts[:k]))
        except ImportError:
            continue
        seen.append(module)
        return _attribute(module, parts[k:])
    for owner in seen[::-1] + [importlib.import_module("shardviz." + m) for m in MODULES]:
        if _attribute(owner, parts):
            if len(parts) > 1:  # a class the row names: its next bare names are its methods
                seen.append(getattr(owner, parts[0]))
            return True
    return False


ROWS = _rows()


def test_the_table_has_its_rules():
    assert len(ROWS) >= 15
    assert all(names for _, names in ROWS)


@pytest.mark.parametrize("rule,names", ROWS, ids=[r[:50] for r, _ in ROWS])
def test_every_function_the_table_names_exists(rule, names):
    seen: list = []
    assert [n for n in names if n not in ("sync", "pending_rs", "wait") and not _resolves(n, seen)] == []
