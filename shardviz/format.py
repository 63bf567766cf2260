"""How shardviz writes numbers for people: one function per kind of number, used by every view.

Bottom layer: imports nothing from shardviz, so the engine, the findings and every view can use it.
"""
from __future__ import annotations

import math
import re

import pandas as pd

#: The root module's name wherever a name is shown (its fqn is ""): one spelling, never "(root)".
ROOT_NAME = "<root>"
_BYTE_UNITS = (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024))
# What a typed size may end with: decimal (k, kb, g, gb ...) and binary (kib, gib ...) units.
_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4,
               "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
               "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4}


def parse_size(value, field: str) -> int:
    """A size -> bytes, the one reading of sizes for the API, the command line and the widget:
    a number (``80e9``) is bytes; text with a unit is that unit ("80GB" = 80e9, "80GiB" = 80 x 2**30,
    "512 MiB", "1.5TiB"); text that is a bare number is GiB ("40" = 40 GiB, as a person typing a
    device's memory means it). Anything else is a ValueError naming ``field``."""
    if isinstance(value, bool):
        raise ValueError(f"{field} must be a size in bytes, got {value!r}")
    if isinstance(value, (int, float)):
        return int(value)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*", str(value))
    if not match or match.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"{field}={value!r}: expected a size such as '80GiB', '80GB' or 80 (GiB)")
    unit = match.group(2).lower() or "gib"  # a bare number typed as text: GiB
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


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


def format_rate(v) -> str:
    """A rate, tokens/s: ``784.52`` -> ``"785"`` (rounded half up, as charts.js's ``Math.round``;
    thousands separated), on every surface."""
    return f"{math.floor(v + 0.5):,}"


def format_plural(n, word: str, plural: str | None = None) -> str:
    """``(1, "call")`` -> ``"1 call"``, ``(2, "call")`` -> ``"2 calls"`` (thousands separated)."""
    return f"{int(n):,} {word if int(n) == 1 else plural or word + 's'}"


def format_large_count(n) -> str:
    """``70_553_706_496`` -> ``"70.55 billion"``; below a million, ``format_count``'s digits."""
    n = int(n)
    for div, name in ((10**12, "trillion"), (10**9, "billion"), (10**6, "million")):
        if abs(n) >= div:
            return f"{n / div:.2f} {name}"
    return format_count(n)


def format_duration(s) -> str:
    """A step's part: ``1.234`` -> ``"1.234 s"``, ``0.0123`` -> ``"12.30 ms"``, ``4e-6`` -> ``"4.0 µs"``."""
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "–"
    if s >= 0.1 or s == 0:
        return f"{s:.3f} s"
    return f"{s * 1e3:.2f} ms" if s >= 1e-4 else f"{s * 1e6:.1f} µs"


def format_percent(fraction: float) -> str:
    """``0.0004`` -> ``"<0.1%"``, ``0.054`` -> ``"5.4%"``, ``0.54`` -> ``"54%"``."""
    pct = 100 * fraction
    if 0 < pct < 0.1:
        return "<0.1%"
    return f"{pct:.1f}%" if pct < 10 else f"{pct:.0f}%"


def format_kind(kind: str) -> str:
    """A collective, a timeline lane or an event kind as every chart names it: one spelling of a
    collective ("all-gather", "reduce-scatter", "all-reduce"), other kinds in words ("ignored all-reduce")."""
    words = str(kind)
    for name in ("all_gather", "reduce_scatter", "all_reduce"):
        words = words.replace(name, name.replace("_", "-"))
    return words.replace("_", " ")


def format_shape(shape) -> str:
    """``(128256, 8192)`` -> ``"128,256 × 8,192"``; a 0-dim shape is ``"scalar"``."""
    dims = tuple(shape)
    return " × ".join(format_count(d) for d in dims) if dims else "scalar"


def _missing(v) -> bool:
    if v is None or v is pd.NA:
        return True
    return isinstance(v, float) and math.isnan(v)


#: Every column of shardviz's tables (``a.memory``, ``a.comm``, ``a.units``, ``a.params``,
#: ``a.activations``, ``compare(...).table``, ``sweep(...).table``): the header a person reads and
#: the kind of value, which says how ``format_value`` writes it. A data table, not logic.
COLUMNS = {
    # a.memory
    "rank": ("rank", "int"), "replica": ("replica", "int"), "shard": ("shard", "int"),
    "params": ("parameters", "bytes"), "params_sharded": ("sharded parameters", "bytes"),
    "params_whole": ("whole parameters", "bytes"), "buffers": ("buffers", "bytes"), "grads": ("gradients", "bytes"),
    "quant_state": ("quantization state (whole)", "bytes"),
    "grads_sharded": ("sharded gradients", "bytes"), "grads_whole": ("whole gradients", "bytes"),
    "optimizer": ("optimizer states", "bytes"), "state": ("model state", "bytes"), "activations": ("activations", "bytes"),
    "peak": ("peak", "bytes"), "peak_phase": ("peak in phase", "text"), "peak_unit": ("peak in call", "name"),
    "peak_module": ("peak in module", "name"), "peak_transient": ("short-lived at peak", "bytes"),
    "reserved_peak": ("reserved peak (caching allocator)", "bytes"),
    "cpu_params": ("CPU parameters", "bytes"), "cpu_grads": ("CPU gradients", "bytes"),
    "cpu_optimizer": ("CPU optimizer states", "bytes"), "cpu_peak": ("CPU peak", "bytes"),
    # a.comm
    "unit": ("call", "name"), "collective": ("collective", "text"), "phase": ("phase", "text"), "group": ("group", "text"),
    "group_size": ("ranks in group", "int"), "count": ("count per step", "count"), "dtype": ("dtype", "text"),
    "bytes": ("size", "bytes"), "sent_bytes": ("sent per rank", "bytes"), "time_s": ("time", "seconds"),
    # a.units
    "modules": ("modules", "names"), "order": ("order", "int"), "is_root": ("root", "bool"),
    "reshard_after_forward": ("reshard after forward", "text"), "n_params": ("parameters", "count"),
    "numel": ("elements", "count"), "trainable_numel": ("trainable elements", "count"),
    "unsharded_bytes": ("unsharded", "bytes"), "padded_unsharded_bytes": ("unsharded, padded", "bytes"),
    "padded_shard_bytes": ("shard per rank, padded", "bytes"),
    # a.params
    "fqn": ("name", "name"), "aliases": ("also named", "names"), "shape": ("shape", "shape"),
    "requires_grad": ("trainable", "bool"), "role": ("role", "text"), "status": ("status", "text"),
    "shard_shape": ("shard shape", "shape"), "shard_bytes": ("shard per rank", "bytes"),
    "padding_numel": ("padding elements", "count"),
    # a.activations
    "type": ("module type", "text"), "block": ("block", "bool"), "checkpointed": ("checkpointed", "bool"),
    "saved": ("saved for backward", "bytes"), "saved_plain": ("saved, plain", "bytes"),
    "saved_checkpointed": ("saved, checkpointed", "bytes"), "pre_fw": ("before forward", "bytes"),
    "post_fw": ("after forward", "bytes"), "peak_fw": ("forward peak", "bytes"), "pre_bw": ("before backward", "bytes"),
    "peak_bw": ("backward peak", "bytes"), "post_bw": ("after backward", "bytes"),
    # compare / sweep
    "layout": ("layout", "text"), "world": ("ranks", "int"), "peak_rank": ("worst rank", "int"), "fits": ("fits", "fits"),
    "margin": ("margin (usable − judged peak)", "bytes"), "judged_peak": ("judged peak", "bytes"), "verdict": ("verdict", "text"),
    "bytes_per_step": ("moved per step", "bytes"), "sent_bytes_per_rank": ("sent per rank per step", "bytes"),
    "collectives_per_step": ("collectives per step", "count"), "n_all_gather": ("all-gathers", "count"),
    "n_reduce_scatter": ("reduce-scatters", "count"), "n_all_reduce": ("all-reduces", "count"),
    "time_per_step_s": ("comm time per step", "seconds"), "errors": ("errors", "count"),
    "step_time_s": ("step time", "duration"), "tokens_per_s": ("tokens/s per rank", "rate"), "mfu": ("MFU", "percent"),
    # a.time
    "forward_s": ("forward", "duration"), "backward_s": ("backward", "duration"),
    "recompute_s": ("recompute", "duration"), "all_gather_forward_s": ("all-gather, forward", "duration"),
    "all_gather_backward_s": ("all-gather, backward", "duration"), "reduce_scatter_s": ("reduce-scatter", "duration"),
    "all_reduce_s": ("all-reduce", "duration"), "exposed_comm_s": ("exposed communication", "duration"),
    "warnings": ("warnings", "count"), "findings": ("findings", "codes"),
}
#: What a missing value reads as, per kind (a number torch cannot give without more input).
#: What every display labels the work outside every fully_shard call (no FSDP unit).
OUTSIDE_FSDP = "(outside FSDP)"

MISSING = {"fits": "no limit set", "seconds": "no bandwidth given", "codes": "none"}


def format_value(kind: str, v) -> str:
    """One cell of a table for reading, by the kind of its column (``COLUMNS``)."""
    if _missing(v) or (kind == "codes" and v == ""):
        return MISSING.get(kind, "–")
    if kind == "bytes":
        return format_bytes(v)
    if kind == "count":
        return format_count(v)
    if kind in ("seconds", "duration"):  # one spelling of a time, from µs to s
        return format_duration(v)
    if kind == "rate":
        return format_rate(v)
    if kind == "percent":
        return format_percent(v)
    if kind == "shape":
        return format_shape(v)
    if kind in ("bool", "fits"):
        return "yes" if v else "no"
    if kind == "names":
        return ", ".join(map(str, v))
    if kind == "text" and isinstance(v, bool):
        return "yes" if v else "no"
    return str(v)


def column_kind(table: pd.DataFrame, col) -> str:
    """The kind of a column: from ``COLUMNS``, else counts for whole numbers and text for the rest."""
    if col in COLUMNS:
        return COLUMNS[col][1]
    return "count" if pd.api.types.is_integer_dtype(table[col]) else "text"


def fmt(table) -> pd.DataFrame:
    """Any shardviz table for reading: ``sv.fmt(a.memory)``, ``sv.fmt(a.comm)``, ``sv.fmt(c.table)``,
    ``sv.fmt(a.peak_breakdown())``. Human headers; bytes with units, counts with thousands
    separators, shapes as "8,192 × 128", seconds, yes / no. Numbers never wrap inside (their spaces
    are non-breaking). The raw tables stay as they are, for code."""
    if isinstance(table, dict):  # a.peak_breakdown(): the parts of the peak, bytes each
        total = sum(table.values())
        table = pd.DataFrame({"part": list(table), "bytes": list(table.values())}).set_index("part")
        table["share"] = [format_percent(v / total) if total else "–" for v in table["bytes"]]
    out = pd.DataFrame(index=table.index.copy())
    for col in table.columns:
        kind = column_kind(table, col)
        number = kind in ("bytes", "count", "seconds", "duration", "rate", "shape")
        out[COLUMNS.get(col, (col,))[0]] = [
            format_value(kind, v).replace(" ", "\u00a0") if number and not _missing(v) else format_value(kind, v)
            for v in table[col]]
    if table.index.name in COLUMNS:
        out.index.name = COLUMNS[table.index.name][0]
    return out
