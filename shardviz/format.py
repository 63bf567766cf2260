"""How shardviz writes numbers for people: the one byte formatter every view uses.

Bottom layer: imports nothing from shardviz, so the engine, the findings and every view can use it.
"""
from __future__ import annotations

import pandas as pd


def format_bytes(n: float) -> str:
    """``1536`` -> ``"1.50 KiB"``: binary units, two decimals (whole bytes below 1 KiB)."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


def worst_rank(memory: pd.DataFrame) -> int:
    """The rank with the highest peak in a memory table (``a.memory``); the first such rank on a tie."""
    return int(memory["rank"].iloc[int(memory["peak"].to_numpy().argmax())])
