"""What the Inspector's charts and lists show, as plain JSON-able data, straight from ``Analysis``.

The widget never computes a number of its own: every value here is read from ``a.memory``,
``a.comm`` and ``a.findings`` of the current analysis (so a test can compare it with
``sv.analyze`` for the same plan). The plotly figures for the Python API are built from the
same payloads.
"""

from __future__ import annotations

import math

# Memory categories of the stacked bar, bottom to top; together they sum to the "peak" column.
# key -> (label, how it is read from a row of ``a.memory``)
MEMORY_CATEGORIES = (
    ("params_sharded", "sharded params"),
    ("params_whole", "whole params (ignored / unmanaged)"),
    ("buffers", "buffers"),
    ("optimizer", "optimizer states"),
    ("grads_at_peak", "gradients at the peak"),
    ("peak_transient", "transient (unsharded params, collective buffers, step temporaries)"),
)
MAX_UNITS_SHOWN = 24
COLLECTIVES_ORDER = ("all_gather", "reduce_scatter", "all_reduce")


def _int(x) -> int:
    try:
        return int(x)
    except (TypeError, ValueError):
        return 0


def _column(table, name, default=0) -> list:
    if name in table.columns:
        return table[name].tolist()
    return [default] * len(table)


def memory_payload(analysis) -> dict:
    """Per-rank memory at the peak, stacked by category; identical consecutive ranks share a bar.

    The categories sum exactly to the table's ``peak``: sharded and whole parameters, buffers and
    optimizer states as the table gives them, ``peak_transient`` (what exists only around the
    peak: unsharded parameters, collective buffers, step temporaries) and the gradients alive at
    the peak (the rest).
    """
    mesh = analysis.mesh
    try:
        table = analysis.memory
    except Exception as exc:  # noqa: BLE001 - the widget shows why instead of breaking
        return {"available": False, "reason": f"no memory estimate: {type(exc).__name__}: {exc}", "bars": [],
                "categories": [], "limit": mesh.device_memory, "max_peak": None, "worst_rank": None}
    ranks = [int(r) for r in _column(table, "rank")]
    peak = [int(x) for x in _column(table, "peak")]
    if "params_sharded" in table.columns:
        sharded = [int(x) for x in _column(table, "params_sharded")]
        whole = [int(x) for x in _column(table, "params_whole")]
    else:
        sharded, whole = [int(x) for x in _column(table, "params")], [0] * len(table)
    buffers = [int(x) for x in _column(table, "buffers")]
    optimizer = [int(x) for x in _column(table, "optimizer")]
    transient = [int(x) for x in _column(table, "peak_transient")]
    params = [int(x) for x in _column(table, "params")]
    grads = [int(x) for x in _column(table, "grads")]
    phase = [None if x is None else str(x) for x in _column(table, "peak_phase", None)]
    unit = [x if isinstance(x, str) else None for x in _column(table, "peak_unit", None)]
    bars: list[dict] = []
    last_key = None
    for i, rank in enumerate(ranks):
        rest = peak[i] - sharded[i] - whole[i] - buffers[i] - optimizer[i] - transient[i]
        tr = transient[i] if rest >= 0 else max(transient[i] + rest, 0)  # keep the bar honest
        parts = (sharded[i], whole[i], buffers[i], optimizer[i], max(rest, 0), tr)
        key = (parts, peak[i], phase[i], unit[i])
        if bars and key == last_key and bars[-1]["last"] == rank - 1:
            bars[-1]["last"] = rank
            continue
        last_key = key
        bars.append({
            "first": rank, "last": rank,
            "parts": dict(zip((k for k, _ in MEMORY_CATEGORIES), parts)),
            "peak": peak[i], "phase": phase[i], "unit": unit[i],
            "params": params[i], "grads": grads[i], "optimizer": optimizer[i],
        })
    for b in bars:
        b["label"] = f"rank {b['first']}" if b["first"] == b["last"] else f"ranks {b['first']}-{b['last']}"
    worst = max(range(len(peak)), key=peak.__getitem__) if peak else 0
    return {
        "available": True,
        "categories": [{"key": k, "label": label} for k, label in MEMORY_CATEGORIES],
        "bars": bars,
        "limit": mesh.device_memory,
        "max_peak": max(peak) if peak else 0,
        "worst_rank": ranks[worst] if ranks else 0,
        "n_ranks": len(ranks),
    }


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
        name = "(outside FSDP)" if name is None or (isinstance(name, float) and math.isnan(name)) else str(name)
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
            "n_fqns": len(f.fqns),
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
    out["n_diff"] = int(len(diff))
    out["available"] = True
    return out


# ---------------------------------------------------------------------------
# plotly figures for the Python API (the notebook front end draws the same data as SVG)
# ---------------------------------------------------------------------------
_COLORS = ("#4c78a8", "#72b7b2", "#9d755d", "#f58518", "#e45756", "#b279a2", "#54a24b", "#eeca3b")
GIB = 1024**3


def memory_figure(payload: dict):
    import plotly.graph_objects as go

    fig = go.Figure()
    labels = [b["label"] for b in payload.get("bars", [])]
    for i, cat in enumerate(payload.get("categories", [])):
        fig.add_bar(
            name=cat["label"], x=labels, y=[b["parts"][cat["key"]] / GIB for b in payload["bars"]],
            marker_color=_COLORS[i % len(_COLORS)],
            customdata=[b["parts"][cat["key"]] for b in payload["bars"]],
            hovertemplate="%{x}: %{y:.2f} GiB (%{customdata:,} B)<extra>" + cat["label"] + "</extra>",
        )
    if payload.get("limit"):
        fig.add_hline(y=payload["limit"] / GIB, line_dash="dash", line_color="#d62728",
                      annotation_text=f"device memory {payload['limit'] / GIB:.1f} GiB")
    fig.update_layout(barmode="stack", yaxis_title="GiB per rank at the peak", title="Memory per rank",
                      legend_orientation="h", margin=dict(t=40, l=50, r=10, b=40))
    return fig


def traffic_figure(payload: dict):
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, column_widths=[0.3, 0.7],
                        subplot_titles=("by collective", "by fully_shard call"))
    colls = payload.get("collectives", [])
    fig.add_bar(x=colls, y=[c["sent"] / GIB for c in payload.get("by_collective", [])], showlegend=False,
                marker_color=[_COLORS[i % len(_COLORS)] for i in range(len(colls))], row=1, col=1)
    units = payload.get("by_unit", [])
    for i, coll in enumerate(colls):
        fig.add_bar(name=coll, y=[u["unit"] for u in units], x=[u["values"].get(coll, 0) / GIB for u in units],
                    orientation="h", marker_color=_COLORS[i % len(_COLORS)], row=1, col=2)
    fig.update_layout(barmode="stack", title="Traffic per step (GiB sent per rank)",
                      margin=dict(t=60, l=10, r=10, b=40))
    fig.update_yaxes(autorange="reversed", row=1, col=2)
    return fig
