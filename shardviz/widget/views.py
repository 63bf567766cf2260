"""What the Inspector's charts and lists show, as plain JSON-able data, straight from ``Analysis``.

The widget never computes a number of its own: every value here is read from ``a.memory``,
``a.comm`` and ``a.findings`` of the current analysis (so a test can compare it with
``sv.analyze`` for the same plan). The plotly figures for the Python API are built from the
same payloads.
"""

from __future__ import annotations

import math

from ..cost import BREAKDOWN

# The one breakdown of a rank's peak (``Analysis.peak_breakdown``): its keys, bottom to top of the
# stacked bar; together they sum exactly to the ``peak`` column of ``a.memory``. The widget, the
# report and ``compare`` all draw these, in this order, with these labels.
PEAK_PARTS = BREAKDOWN
PART_HELP = {
    "sharded params": "each rank's padded shards of the parameters fully_shard manages",
    "whole params": "ignored and unmanaged parameters: every rank holds them whole",
    "buffers": "module buffers (never sharded)",
    "optimizer states": "optimizer states of the trainable parameters this rank holds",
    "gradients": "gradients alive at the moment of the peak",
    "unsharded params": "parameters all-gathered for the call that runs at the peak",
    "communication buffers": "all-gather / reduce-scatter buffers alive at the peak",
    "activations": "activations saved for backward at the peak (needs a batch size)",
    "temporaries": "short-lived tensors of the step at the peak",
}
MAX_UNITS_SHOWN = 24
COLLECTIVES_ORDER = ("all_gather", "reduce_scatter", "all_reduce")
OUTSIDE_FSDP = "(outside FSDP)"


def _int(x) -> int:
    try:
        return int(x)
    except (TypeError, ValueError):
        return 0


def _column(table, name, default=0) -> list:
    if name in table.columns:
        return table[name].tolist()
    return [default] * len(table)


def peak_breakdown(analysis, rank: int | None = None) -> dict:
    """Bytes at the peak of ``rank`` (default: the worst rank) by ``PEAK_PARTS``; sums to its peak
    (``Analysis.peak_breakdown``, computed once in the cost model)."""
    return analysis.peak_breakdown(rank)


def limit_use(peak: int | None, limit: int | None) -> dict | None:
    """How much of the device the peak uses: the number and its words, computed here once."""
    if not limit or peak is None:
        return None
    frac = peak / limit
    pct = 100 * frac
    text = "<0.1%" if 0 < pct < 0.1 else f"{pct:.1f}%" if pct < 10 else f"{pct:.0f}%"
    return {"fraction": frac, "percent_text": text, "over": peak > limit,
            "text": f"peak uses {text} of {_fmt_bytes(limit)} per device" + (" — does not fit" if peak > limit else "")}


def _fmt_bytes(n) -> str:
    from ..cost import format_bytes

    return format_bytes(n)


def memory_payload(analysis) -> dict:
    """Per-rank memory at the peak, stacked by ``PEAK_PARTS``; identical consecutive ranks share a bar.

    Each bar's parts are ``peak_breakdown(analysis, rank)`` of its first rank: they sum exactly
    to the table's ``peak``.
    """
    mesh = analysis.mesh
    try:
        table = analysis.memory
    except Exception as exc:  # noqa: BLE001 - the widget shows why instead of breaking
        return {"available": False, "reason": f"no memory estimate: {type(exc).__name__}: {exc}", "bars": [],
                "categories": [], "limit": mesh.device_memory, "max_peak": None, "worst_rank": None,
                "use": None}
    ranks = [int(r) for r in _column(table, "rank")]
    peak = [int(x) for x in _column(table, "peak")]
    params = [int(x) for x in _column(table, "params")]
    grads = [int(x) for x in _column(table, "grads")]
    optimizer = [int(x) for x in _column(table, "optimizer")]
    phase = [None if x is None else str(x) for x in _column(table, "peak_phase", None)]
    unit = [x if isinstance(x, str) else None for x in _column(table, "peak_unit", None)]
    # where the activations peak ("" is the root module)
    module = [("<root>" if x == "" else x) if isinstance(x, str) else None for x in _column(table, "peak_module", None)]
    keycols = [c for c in ("params_sharded", "params_whole", "buffers", "grads", "optimizer", "peak",
                           "peak_transient", "activations") if c in table.columns]
    keys = list(zip(*[table[c].tolist() for c in keycols], phase, unit, module))
    bars: list[dict] = []
    last_key = None
    cache: dict = {}
    for i, rank in enumerate(ranks):
        key = keys[i]
        if bars and key == last_key and bars[-1]["last"] == rank - 1:
            bars[-1]["last"] = rank
            continue
        last_key = key
        if key not in cache:
            cache[key] = peak_breakdown(analysis, rank)
        bars.append({
            "first": rank, "last": rank,
            "parts": dict(cache[key]),
            "peak": peak[i], "phase": phase[i], "unit": unit[i], "module": module[i],
            "params": params[i], "grads": grads[i], "optimizer": optimizer[i],
        })
    for b in bars:
        b["label"] = f"rank {b['first']}" if b["first"] == b["last"] else f"ranks {b['first']}-{b['last']}"
    worst = max(range(len(peak)), key=peak.__getitem__) if peak else 0
    max_peak = max(peak) if peak else 0
    return {
        "available": True,
        "categories": [{"key": k, "label": k, "help": PART_HELP[k]} for k in PEAK_PARTS],
        "bars": bars,
        "limit": mesh.device_memory,
        "max_peak": max_peak,
        "worst_rank": ranks[worst] if ranks else 0,
        "worst": {"rank": ranks[worst] if ranks else 0, "phase": phase[worst] if ranks else None,
                  "unit": unit[worst] if ranks else None, "module": module[worst] if ranks else None,
                  "activations": _int(table["activations"].iloc[worst]) if "activations" in table.columns and ranks else None},
        "use": limit_use(max_peak, mesh.device_memory),
        "n_ranks": len(ranks),
    }


def training_text(tr) -> str:
    """ "AdamW · bf16 params · fp32 reduce · batch 1 × 2048" - what the numbers assume."""
    names = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", None: "model dtype"}
    opt = str(getattr(tr, "optimizer", ""))
    parts = [{"adamw": "AdamW", "adam": "Adam", "sgd": "SGD", "sgd_momentum": "SGD+momentum"}.get(opt, opt)]
    parts.append(f"{names.get(getattr(tr, 'param_dtype', None), getattr(tr, 'param_dtype', None))} params")
    parts.append(f"{names.get(getattr(tr, 'reduce_dtype', None), getattr(tr, 'reduce_dtype', None))} reduce")
    if getattr(tr, "offload", False):
        parts.append("CPU offload")
    bs = getattr(tr, "batch_size", None)
    parts.append(f"batch {bs} × {tr.seq_len} tokens" if bs else "no batch (model state only)")
    return " · ".join(parts)


def short_labels(names, width: int = 30) -> list[str]:
    """Chart labels for call names: drop the dotted prefix they all share, then keep the end that
    names the module (whole name parts, "…" in front) when still longer than ``width``."""
    import os

    names = [OUTSIDE_FSDP if n is None else str(n) for n in names]
    mods = [m for n in names if n != OUTSIDE_FSDP and not n.startswith("<") for m in n.strip("[]").split(", ") if "." in m]
    prefix = os.path.commonprefix(mods) if len(mods) > 1 else ""
    prefix = prefix[: prefix.rfind(".") + 1]
    out = []
    for n in names:
        if n == OUTSIDE_FSDP:
            out.append(n)
            continue
        if n.startswith("[") and n.endswith("]"):
            parts = [m[len(prefix):] if prefix and m.startswith(prefix) else m for m in n[1:-1].split(", ")]
            label = "[" + ", ".join(parts) + "]"
        else:
            label = n[len(prefix):] if prefix and n.startswith(prefix) else n
        label = label or "<root>"
        if len(label) > width:
            pieces = label.split(".")
            kept = pieces[-1]
            for piece in reversed(pieces[:-1]):
                if len(kept) + len(piece) + 2 > width:
                    break
                kept = f"{piece}.{kept}"
            label = "…" + kept if len(kept) + 1 <= width else "…" + kept[-(width - 1):]
        out.append(label)
    return out


def traffic_payload(analysis) -> dict:
    """Bytes per step by collective and by call, from ``a.comm``.

    ``bytes``: the collective's buffer (what ``torch.distributed`` is handed); ``sent``: what each
    rank puts on the wire (``sent_bytes``, ring algorithm). The chart plots ``sent``.
    """
    try:
        df = analysis.comm
    except Exception as exc:  # noqa: BLE001 - the widget shows why instead of breaking
        return {"available": False, "reason": f"no traffic estimate: {type(exc).__name__}: {exc}",
                "by_collective": [], "by_unit": [], "collectives": []}
    col = "sent_bytes" if "sent_bytes" in df.columns else "bytes"
    by_coll: dict[str, dict] = {}
    by_unit: dict[str, dict] = {}
    for coll, name, nbytes, sent, count in zip(
        _column(df, "collective", ""), _column(df, "unit", None), _column(df, "bytes"), _column(df, col),
        _column(df, "count"),
    ):
        coll = str(coll)
        nbytes, sent, count = _int(nbytes), _int(sent), _int(count)
        c = by_coll.setdefault(coll, {"collective": coll, "bytes": 0, "sent": 0, "count": 0})
        c["bytes"] += nbytes
        c["sent"] += sent
        c["count"] += count
        name = OUTSIDE_FSDP if name is None or (isinstance(name, float) and math.isnan(name)) else str(name)
        u = by_unit.get(name)
        if u is None:
            u = by_unit[name] = {"unit": name, "values": {}, "total": 0, "count": 0}
        u["values"][coll] = u["values"].get(coll, 0) + sent
        u["total"] += sent
        u["count"] += count
    colls = sorted(by_coll, key=lambda c: (COLLECTIVES_ORDER.index(c) if c in COLLECTIVES_ORDER else 99, c))
    units = sorted(by_unit.values(), key=lambda u: -u["total"])
    shown, rest = units[:MAX_UNITS_SHOWN], units[MAX_UNITS_SHOWN:]
    if rest:
        other = {"unit": f"{len(rest)} more calls", "values": {}, "total": 0, "count": 0, "other": True}
        for u in rest:
            for k, v in u["values"].items():
                other["values"][k] = other["values"].get(k, 0) + v
            other["total"] += u["total"]
            other["count"] += u["count"]
        shown.append(other)
    for u, label in zip(units[:MAX_UNITS_SHOWN], short_labels([u["unit"] for u in units[:MAX_UNITS_SHOWN]])):
        u["label"] = label
    if rest:
        shown[-1]["label"] = shown[-1]["unit"]
    mesh = analysis.mesh
    time_s = df.attrs.get("time_per_step_s") if hasattr(df, "attrs") else None
    if mesh.intra_node_gbps is None and mesh.inter_node_gbps is None:
        time_s = None  # no bandwidth given: no time estimate
    if isinstance(time_s, float) and math.isnan(time_s):
        time_s = None
    return {
        "available": True,
        "metric": col,
        "collectives": colls,
        "by_collective": [by_coll[c] for c in colls],
        "by_unit": shown,
        "n_units": len(units),
        "total_sent": sum(c["sent"] for c in by_coll.values()),
        "total_bytes": sum(c["bytes"] for c in by_coll.values()),
        "time_s": time_s,
    }


def findings_payload(analysis) -> list[dict]:
    """``a.findings`` for the front end. ``n_fqns``: how many names the finding is about in all
    (``Finding.n_fqns``; ``fqns`` lists the first of them)."""
    try:
        findings = analysis.findings
    except Exception as exc:  # noqa: BLE001 - say so in the list rather than break the widget
        return [{"code": "SV000", "severity": "error", "message": f"the checks failed: {type(exc).__name__}: {exc}",
                 "fqns": [], "n_fqns": 0, "fix": ""}]
    out = []
    for f in findings:
        out.append({
            "code": f.code,
            "severity": f.severity,
            "message": f.message,
            "fqns": list(f.fqns[:50]),
            "n_fqns": f.n_fqns,
            "fix": f.fix,
        })
    return out


#: The A vs B table, top to bottom: (key of ``Comparison.table``, label, "bytes" or "count", group).
COMPARISON_ROWS = (
    ("params", "parameters", "bytes", "memory"),
    ("grads", "gradients", "bytes", "memory"),
    ("optimizer", "optimizer states", "bytes", "memory"),
    ("peak", "peak", "bytes", "memory"),
    ("bytes_per_step", "collective bytes per step", "bytes", "traffic"),
    ("sent_bytes_per_rank", "sent per rank per step", "bytes", "traffic"),
    ("collectives_per_step", "collectives per step", "count", "collectives"),
    ("n_all_gather", "all_gather", "count", "collectives"),
    ("n_reduce_scatter", "reduce_scatter", "count", "collectives"),
    ("n_all_reduce", "all_reduce", "count", "collectives"),
    ("errors", "errors", "count", "findings"),
    ("warnings", "warnings", "count", "findings"),
)
MAX_DIFF_SHOWN = 100


def _describe(snap) -> dict:
    plan = snap.plan
    return {"plan_name": plan.name or "", "n_units": len(plan.units), "n_ignored": len(plan.ignored),
            "mesh": str(snap.mesh), "training": repr(snap.training)}


def _text(x) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else str(x)


def comparison_payload(comparison, pinned=None, current=None) -> dict:
    """The A vs B view: ``comparison.table`` rows for "A" and "B", and ``comparison.diff("A", "B")``
    (the first ``MAX_DIFF_SHOWN`` parameters, with the total). ``{"pinned": False}`` without a pin."""
    if comparison is None:
        return {"pinned": False}
    out = {"pinned": True, "a": _describe(pinned), "b": _describe(current),
           "same_mesh": pinned.mesh == current.mesh, "same_training": pinned.training == current.training}
    try:
        table = comparison.table
        diff = comparison.diff("A", "B")
    except Exception as exc:  # noqa: BLE001 - the widget shows why instead of breaking
        out.update(available=False, reason=f"no comparison: {type(exc).__name__}: {exc}", rows=[], diff=[], n_diff=0)
        return out
    rows = []
    for key, label, kind, group in COMPARISON_ROWS:
        a, b = _int(table.at["A", key]), _int(table.at["B", key])
        rows.append({"key": key, "label": label, "kind": kind, "group": group, "a": a, "b": b, "delta": b - a})
    out["rows"] = rows
    out["peak_rank"] = {"a": _int(table.at["A", "peak_rank"]), "b": _int(table.at["B", "peak_rank"])}
    out["limit"] = {"a": pinned.mesh.device_memory, "b": current.mesh.device_memory}
    out["findings"] = {"a": _text(table.at["A", "findings"]), "b": _text(table.at["B", "findings"])}
    shown = diff.head(MAX_DIFF_SHOWN)
    out["diff"] = [
        {"fqn": str(f), "status_a": _text(sa), "unit_a": _text(ua), "status_b": _text(sb), "unit_b": _text(ub)}
        for f, sa, ua, sb, ub in zip(shown["fqn"], shown["status (A)"], shown["unit (A)"], shown["status (B)"], shown["unit (B)"])
    ]
    out["n_diff"] = len(diff)
    out["available"] = True
    return out


# ---------------------------------------------------------------------------
# plotly figures for the Python API (the notebook front end draws the same data as SVG)
# ---------------------------------------------------------------------------
_COLORS = ("#4c78a8", "#72b7b2", "#9d755d", "#f58518", "#e45756", "#b279a2", "#54a24b", "#eeca3b")
GIB = 1024**3


def _unit(max_bytes: float) -> tuple[float, str]:
    """One unit per chart, picked for its largest value (KiB / MiB / GiB / TiB; never "500μ GiB")."""
    for div, name in ((1024**4, "TiB"), (GIB, "GiB"), (1024**2, "MiB"), (1024, "KiB")):
        if max_bytes >= div:
            return div, name
    return 1, "B"


def memory_figure(payload: dict):
    """The memory chart as a plotly figure: the same payload, parts, order and limit rule as the SVG."""
    import plotly.graph_objects as go

    fig = go.Figure()
    bars = payload.get("bars", [])
    div, unit = _unit(float(payload.get("max_peak") or 0))
    labels = [b["label"] for b in bars]
    for i, cat in enumerate(payload.get("categories", [])):
        fig.add_bar(
            name=cat["label"], x=labels, y=[b["parts"][cat["key"]] / div for b in bars],
            marker_color=_COLORS[i % len(_COLORS)],
            customdata=[b["parts"][cat["key"]] for b in bars],
            hovertemplate="%{x}: %{y:.2f} " + unit + " (%{customdata:,} B)<extra>" + cat["label"] + "</extra>",
        )
    limit = payload.get("limit")
    title = "Memory per rank at the peak"
    if limit and limit <= 4 * float(payload.get("max_peak") or 0):
        over = bool((payload.get("use") or {}).get("over"))
        fig.add_hline(y=limit / div, line_dash="dash", line_color="#d62728" if over else "#888",
                      annotation_text=(payload.get("use") or {}).get("text", "device memory"))
    elif limit and payload.get("use"):
        title += f" ({payload['use']['text']})"  # far above the bars: named, not drawn
    fig.update_layout(barmode="stack", yaxis_title=f"{unit} per rank", title=title,
                      legend_orientation="h", margin={"t": 40, "l": 50, "r": 10, "b": 40},
                      paper_bgcolor="rgba(0,0,0,0)", plot_bgcolor="rgba(0,0,0,0)")
    return fig


def traffic_figure(payload: dict):
    """The traffic chart as a plotly figure (the SVG's payload: labels shortened in Python)."""
    from plotly.subplots import make_subplots

    colls = payload.get("collectives", [])
    units = payload.get("by_unit", [])
    div, unit = _unit(float(max([c["sent"] for c in payload.get("by_collective", [])] or [0])))
    fig = make_subplots(rows=1, cols=2, column_widths=[0.3, 0.7],
                        subplot_titles=("by collective", "by fully_shard call"))
    fig.add_bar(x=colls, y=[c["sent"] / div for c in payload.get("by_collective", [])], showlegend=False,
                marker_color=[_COLORS[i % len(_COLORS)] for i in range(len(colls))], row=1, col=1)
    for i, coll in enumerate(colls):
        fig.add_bar(name=coll, y=[u.get("label", u["unit"]) for u in units], x=[u["values"].get(coll, 0) / div for u in units],
                    orientation="h", marker_color=_COLORS[i % len(_COLORS)], customdata=[u["unit"] for u in units],
                    hovertemplate="%{customdata}: %{x:.2f} " + unit + "<extra>" + coll + "</extra>", row=1, col=2)
    fig.update_layout(barmode="stack", title=f"Traffic per step ({unit} sent per rank)",
                      margin={"t": 60, "l": 10, "r": 10, "b": 40},
                      paper_bgcolor="rgba(0,0,0,0)", plot_bgcolor="rgba(0,0,0,0)")
    fig.update_yaxes(autorange="reversed", row=1, col=2)
    return fig
