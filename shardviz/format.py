"""How shardviz writes numbers for people: one function per kind of number, used by every view.

Bottom layer: imports nothing from shardviz, so the engine, the findings and every view can use it.
"""
from __future__ import annotations

import math

import pandas as pd

_BYTE_UNITS = (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024))


def format_bytes(n: float) -> str:
    """``1536`` -> ``"1.50 KiB"``: binary units, two decimals (whole bytes below 1 KiB)."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


def byte_unit(max_bytes: float) -> tuple[int, str]:
    """The one unit of a chart or a column, picked for its largest value: ``(divisor, name)``
    (KiB / MiB / GiB / TiB; never "0.0005 GiB")."""
    for name, div in _BYTE_UNITS:
        if max_bytes >= div:
            return div, name
    return 1, "B"


def format_count(n) -> str:
    """``1234567`` -> ``"1,234,567"``: whole numbers with thousands separators."""
    return f"{int(n):,}"


def format_seconds(s) -> str:
    """``0.5523`` -> ``"0.552 s"``; "–" when there is no number (no bandwidth given)."""
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "–"
    return f"{s:.3f} s"


def format_percent(fraction: float) -> str:
    """``0.0004`` -> ``"<0.1%"``, ``0.054`` -> ``"5.4%"``, ``0.54`` -> ``"54%"``."""
    pct = 100 * fraction
    if 0 < pct < 0.1:
        return "<0.1%"
    return f"{pct:.1f}%" if pct < 10 else f"{pct:.0f}%"


def worst_rank(memory: pd.DataFrame) -> int:
    """The rank with the highest peak in a memory table (``a.memory``); the first such rank on a tie."""
    return int(memory["rank"].iloc[int(memory["peak"].to_numpy().argmax())])
