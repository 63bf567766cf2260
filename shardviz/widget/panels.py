"""The Inspector's own payloads: the findings list and the A vs B view, as plain JSON-able data.

What the widget shares with the report and ``compare`` (the memory and traffic charts, their
plotly figures, the training text) lives one layer down in ``shardviz/views/display.py``; the names the
Inspector reads through this module are re-exported here so it has one place to read payloads from.
"""

from __future__ import annotations

import math
import os
import time
import traceback

from ..export.oracle import verify
from ..format import format_bytes
from ..finding import TITLES
from .plan_names import shown_name
from ..views.display import int_or_zero, memory_figure, memory_payload, timeline_payload, traffic_figure, traffic_payload, training_text

__all__ = ["COMPARISON_ROWS", "MAX_DIFF_SHOWN", "comparison_payload", "findings_payload", "memory_figure",
           "memory_payload", "timeline_payload", "traffic_figure", "traffic_payload", "training_text"]


def findings_payload(analysis, first: bool = False) -> list[dict]:
    """``a.findings`` for the front end (``first``: ``a.first_findings``, the what-ifs not priced yet,
    those findings ``pending``). ``n_fqns``: how many names the finding is about in all
    (``Finding.n_fqns``; ``fqns`` lists the first of them)."""
    try:
        findings = analysis.first_findings if first else analysis.findings
    except Exception as exc:  # noqa: BLE001 - say so in the list rather than break the widget
        return [{"code": "SV000", "severity": "error", "message": f"the checks failed: {type(exc).__name__}: {exc}",
                 "fqns": [], "n_fqns": 0, "fix": ""}]
    out = []
    for f in findings:
        out.append({
            "code": f.code,
            "title": TITLES.get(f.code, ""),  # every code explained where it is shown
            "severity": f.severity,
            "message": f.message,
            "fqns": list(f.fqns[:50]),
            "n_fqns": f.n_fqns,
            "fix": f.fix,
            "pending": f.pending,  # being priced: the front end marks it as updating
        })
    return out


#: The A vs B table, top to bottom: (key of ``Comparison.table``, label, "bytes" or "count", group).
COMPARISON_ROWS = (
    ("params", "parameters", "bytes", "memory"),
    ("grads", "gradients", "bytes", "memory"),
    ("optimizer", "optimizer states", "bytes", "memory"),
    ("peak", "allocated peak", "bytes", "memory"),
    ("judged_peak", "judged peak", "bytes", "memory"),
    ("bytes_per_step", "moved per step", "bytes", "traffic"),  # format.COLUMNS' name, as the report and compare say
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
    return {"plan_name": shown_name(plan.name, snap.mesh), "n_units": len(plan.units), "n_ignored": len(plan.ignored),
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
        out.update(available=False, reason=f"no comparison: {type(exc).__name__}: {exc}", rows=[], diff=[], n_diff=0,
                   n_changed=0)
        return out
    rows = []
    for key, label, kind, group in COMPARISON_ROWS:
        a, b = int_or_zero(table.at["A", key]), int_or_zero(table.at["B", key])
        rows.append({"key": key, "label": label, "kind": kind, "group": group, "a": a, "b": b, "delta": b - a})
    out["rows"] = rows
    out["n_changed"] = sum(r["delta"] != 0 for r in rows)  # figures that differ: the tab counts them with the params
    verdicts = {k: table.at[k, "verdict"] for k in ("A", "B")}
    out["verdict"] = {k.lower(): ({"over": "does not fit"}.get(v, v) if isinstance(v, str) else "no device memory")
                      for k, v in verdicts.items()}
    out["peak_rank"] = {"a": int_or_zero(table.at["A", "peak_rank"]), "b": int_or_zero(table.at["B", "peak_rank"])}
    out["limit"] = {"a": pinned.mesh.usable_memory, "b": current.mesh.usable_memory}  # less the reserve
    out["limit_text"] = {"a": pinned.mesh.limit_text, "b": current.mesh.limit_text}
    out["findings"] = {"a": _text(table.at["A", "findings"]), "b": _text(table.at["B", "findings"])}
    shown = diff.head(MAX_DIFF_SHOWN)
    out["diff"] = [
        {"fqn": str(f), "status_a": _text(sa), "unit_a": _text(ua), "status_b": _text(sb), "unit_b": _text(ub)}
        for f, sa, ua, sb, ub in zip(shown["fqn"], shown["status (A)"], shown["unit (A)"], shown["status (B)"], shown["unit (B)"])
    ]
    out["n_diff"] = len(diff)
    out["available"] = True
    return out


def host_ram_text(analysis) -> str:
    """The host RAM CPU offload needs: the worst rank's ``cpu_peak`` (``a.memory``), and per node
    (``Mesh.host_ranks`` of them), judged as the one verdict judges it (``MemoryFit.host_limit_text``)."""
    try:
        cpu = int(analysis.memory["cpu_peak"].max())
        fit = analysis.fit
    except Exception:  # noqa: BLE001 - no memory estimate: nothing to say
        return ""
    if cpu <= 0:
        return ""
    per_node = analysis.mesh.host_ranks
    judged = fit.host_limit_text if fit is not None else ""
    return f"host RAM {format_bytes(cpu)} per rank, {format_bytes(cpu * per_node)} per node of {per_node} ranks{judged}"


def verify_payload(model, plan, mesh, training) -> dict:
    """``sv.verify`` (torch's real ``fully_shard`` on a meta copy) as the Inspector's verify panel shows it:
    torch's refusal is an answer to show, with who raised it (``raised_by``)."""
    t0 = time.perf_counter()
    try:
        df = verify(model, plan, mesh=mesh, training=training)
    except Exception as exc:  # noqa: BLE001 - torch's refusal is the answer to show
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "rows": [], "n": 0, "raised_by": raised_by(exc)}
    else:
        rows = df.head(50).astype(str).to_dict("records")
        result = {"ok": len(df) == 0, "error": None, "rows": rows, "n": len(df)}
    return {**result, "seconds": round(time.perf_counter() - t0, 2), "plan_json": plan.to_json(indent=None)}


def raised_by(exc: BaseException) -> str:
    """"torch" when the exception was raised inside torch (a refusal of the plan), else "shardviz"
    (the verification itself failed: the message must not blame torch)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return "torch" if frames and f"{os.sep}torch{os.sep}" in frames[-1].filename else "shardviz"


def shortened_diff(payload: dict) -> dict:
    """The A vs B diff with names a narrow table can show: each parameter without the dotted
    prefix every listed name shares ("self_attn.q_proj.lora_A.default.weight"), and each side
    as "sharded in layers.0"; the full names stay for the tooltip and for reveal."""
    diff = payload.get("diff") or []
    if not diff:
        return payload
    parts = [d["fqn"].split(".") for d in diff]
    k = 0
    while all(len(p) > k + 3 for p in parts) and len({p[k] for p in parts}) == 1:
        k += 1  # a shared part, and every name keeps at least its last three
    for d, p in zip(diff, parts):
        d["fqn_short"] = ".".join(p[k:])
        for side in ("a", "b"):
            unit = d[f"unit_{side}"]
            d[f"where_{side}"] = d[f"status_{side}"] + (f" in {short_unit_label(unit)}" if unit else "")
    return payload


def short_unit_label(name: str) -> str:
    """A call's name as the tree's badges show it: "layers.0" for "base_model.model.model.layers.0"."""
    if not name or name.startswith("["):
        return name or "<root>"
    parts = name.split(".")
    return ".".join(parts[-2:]) if len(parts) > 1 and parts[-1].isdigit() else parts[-1]
