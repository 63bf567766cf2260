"""What every view shows (the Inspector, the report, ``compare``): chart payloads as plain JSON-able
data, the words around them, and the plotly figures drawn from the same payloads.

Views layer: above checks and analysis, below compare, report and the widget. No value here is
computed twice: each is read from ``a.memory``, ``a.comm`` and ``Analysis.peak_breakdown`` of one
analysis, so a test can compare it with ``sv.analyze`` for the same plan. Imports neither
anywidget nor ipywidgets (a report renders without them).
"""

from __future__ import annotations

import math
import os

from ..step import BREAKDOWN
from ..format import OUTSIDE_FSDP, byte_unit, format_bytes, format_duration, format_kind, format_percent, format_rate
from ..step import timing
from ..run.mesh import worst_rank
from ..model.tree import base_model, model_name, peft_configs
# the step's words and the timeline's figure (built in steptime, where a.timeline() reads them too)
from ..step.timing import step_text, timeline_figure  # noqa: F401 - re-exported for every view

#: The training every view assumes when none is given (``run.training.DEFAULT_TRAINING``, the one
#: default of every entry point). Each view states it (``training_text``).
from ..run.training import DEFAULT_TRAINING  # noqa: E402,F401 - re-exported for every view

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
# Ranks whose values in these columns (and moment of the peak) agree share one bar.
_SAME_BAR_COLUMNS = ("params_sharded", "params_whole", "buffers", "grads", "optimizer", "peak",
                     "peak_transient", "activations", "reserved_peak")


def int_or_zero(x) -> int:
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


def categories() -> list[dict]:
    """The stacked parts of a memory chart, bottom to top, with the help text each one shows."""
    return [{"key": k, "label": k, "help": PART_HELP[k]} for k in PEAK_PARTS]


def limit_use(fit) -> dict | None:
    """What a chart and a summary say about the verdict (``Mesh.fit`` / ``a.fit``, a
    ``devices.MemoryFit``): the judged peak's share of the usable memory and the verdict's words,
    read from the one verdict, never judged again here. None without a device memory."""
    if fit is None:
        return None
    frac = fit.fraction
    text = format_percent(frac) if frac is not None else "more than 100%"
    return {"fraction": frac, "percent_text": text, "over": not fit.fits, "tight": fit.tight, "verdict": fit.verdict,
            "word": fit.word, "limit_text": fit.text, "usable": fit.usable, "margin": fit.margin, "assumed": fit.assumed,
            "judged": fit.judged, "judged_name": fit.judged_name, "allocated": fit.allocated, "reserved": fit.reserved,
            "spare_text": fit.spare_text, "text": fit.headline,
            # CPU offload's host RAM per node and its limit (0 / None: nothing offloaded / not given)
            "host": fit.host, "host_memory": fit.host_memory, "host_over": fit.host_over, "host_text": fit.host_text}


def _rank_rows(table) -> list[dict]:
    """One dict per row of ``a.memory``: what a bar says about that rank besides its parts."""
    unit = [x if isinstance(x, str) else None for x in _column(table, "peak_unit", None)]
    # where the activations peak ("" is the root module)
    module = [("<root>" if x == "" else x) if isinstance(x, str) else None for x in _column(table, "peak_module", None)]
    phase = [None if x is None else str(x) for x in _column(table, "peak_phase", None)]
    return [{"rank": int(r), "peak": int(pk), "reserved": int(rs), "phase": ph, "unit": u, "module": m,
             "params": int(p), "grads": int(g), "optimizer": int(o)}
            for r, pk, rs, ph, u, m, p, g, o in zip(_column(table, "rank"), _column(table, "peak"),
                                                    _column(table, "reserved_peak"), phase, unit, module,
                                                    _column(table, "params"), _column(table, "grads"),
                                                    _column(table, "optimizer"))]


_BAR_KEYS = ("peak", "reserved", "phase", "unit", "module", "params", "grads", "optimizer")


def _bar(row: dict, parts: dict, mesh=None) -> dict:
    """One bar: the allocated peak stacked by part, with the reserved peak drawn as its cap and the
    verdict of that bar (``Mesh.fit``: the words the summary shows), so drawing and words agree."""
    bar = {"first": row["rank"], "last": row["rank"], "parts": dict(parts)}
    bar.update({k: row[k] for k in _BAR_KEYS})
    fit = None if mesh is None else mesh.fit(row["peak"], row["reserved"])
    bar.update(judged=None if fit is None else fit.judged, verdict=None if fit is None else fit.verdict)
    return bar


def _rank_bars(analysis, table, rows: list[dict]) -> list[dict]:
    """Consecutive ranks with the same numbers share one bar; each bar's parts are the breakdown of
    its first rank (they sum exactly to the table's ``peak``)."""
    keycols = [c for c in _SAME_BAR_COLUMNS if c in table.columns]
    keys = list(zip(*[table[c].tolist() for c in keycols], *[[r[k] for r in rows] for k in ("phase", "unit", "module")]))
    bars: list[dict] = []
    parts_of: dict = {}
    for i, row in enumerate(rows):
        if bars and keys[i] == keys[i - 1] and bars[-1]["last"] == row["rank"] - 1:
            bars[-1]["last"] = row["rank"]
            continue
        if keys[i] not in parts_of:
            parts_of[keys[i]] = peak_breakdown(analysis, row["rank"])
        bars.append(_bar(row, parts_of[keys[i]], analysis.mesh))
    for b in bars:
        b["label"] = f"rank {b['first']}" if b["first"] == b["last"] else f"ranks {b['first']}-{b['last']}"
    return bars


def worst_bar(analysis) -> dict:
    """The bar of the worst rank alone (``run.worst_rank``): what ``compare`` draws per layout."""
    table = analysis.memory
    rank = worst_rank(table)
    row = next(r for r in _rank_rows(table) if r["rank"] == rank)
    return _bar(row, peak_breakdown(analysis, rank), analysis.mesh)


def memory_payload(analysis) -> dict:
    """Per-rank memory at the peak, stacked by ``PEAK_PARTS``; identical consecutive ranks share a bar."""
    mesh = analysis.mesh
    try:
        table = analysis.memory
    except Exception as exc:  # noqa: BLE001 - the widget shows why instead of breaking
        return {"available": False, "reason": f"no memory estimate: {type(exc).__name__}: {exc}", "bars": [],
                "categories": [], "limit": mesh.usable_memory, "limit_text": mesh.limit_text, "max_peak": None, "worst_rank": None,
                "use": None}
    rows = _rank_rows(table)
    worst = next((r for r in rows if r["rank"] == worst_rank(table)), None) if rows else None
    max_peak = worst["peak"] if worst else 0
    acts = _column(table, "activations", None)
    return {
        "available": True,
        "categories": categories(),
        "bars": _rank_bars(analysis, table, rows),
        "limit": mesh.usable_memory,  # where the line is drawn: device memory less the reserve
        "limit_text": mesh.limit_text,
        "max_peak": max_peak,
        "worst_rank": worst["rank"] if worst else 0,
        "worst": {"rank": worst["rank"] if worst else 0,
                  **{k: worst[k] if worst else None for k in ("phase", "unit", "module")},
                  "activations": int_or_zero(acts[rows.index(worst)]) if worst and "activations" in table.columns else None},
        "use": limit_use(analysis.fit),
        "n_ranks": len(rows),
    }


_DTYPE_SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", None: "model dtype"}


def training_text(tr, plan=None) -> str:
    """ "AdamW · bf16 params · fp32 reduce · batch 1 × 2048" - what the numbers assume. With ``plan``:
    what its calls actually use where they set their own policies (a captured accelerate or torchtune
    plan that reduces in bf16, a search row whose calls offload), as the engine prices them."""
    opt = str(tr.optimizer)
    parts = [{"adamw": "AdamW", "adam": "Adam", "sgd": "SGD", "sgd_momentum": "SGD+momentum"}.get(opt, opt)]
    units = [tr.unit_defaults(u) for u in plan.units] if plan is not None else []
    parts.append(_policy_text(tr.param_dtype, [u.param_dtype for u in units], "params"))
    # torch's MixedPrecisionPolicy reduces in param_dtype when reduce_dtype is None
    parts.append(_policy_text(tr.reduce_dtype or tr.param_dtype, [u.reduce_dtype or u.param_dtype for u in units],
                              "reduce"))
    offloaded = sum(1 for u in units if u.offload)
    if tr.offload:
        parts.append("CPU offload")
    elif offloaded:
        parts.append("CPU offload (every call)" if offloaded == len(units) else
                     f"CPU offload ({offloaded} of the plan's {len(units)} calls)")
    bs = tr.batch_size
    accum = f" × {tr.grad_accum} micro-batches per step" if tr.grad_accum > 1 else ""
    parts.append(f"batch {bs} × {tr.seq_len} tokens{accum}" if bs else "no batch (model state only)")
    return " · ".join(parts)


def _policy_text(default, used: list, noun: str) -> str:
    """ "fp32 reduce", or what the calls use instead where they override the training's ``default``:
    "bf16 reduce (the plan's calls)", "fp32 reduce (bf16 in 3 of 5 calls)"."""
    name = lambda d: _DTYPE_SHORT.get(d, d)  # noqa: E731
    own: dict = {}
    for d in used:
        if d != default:
            own[d] = own.get(d, 0) + 1
    if not own:
        return f"{name(default)} {noun}"
    if len(own) == 1 and sum(own.values()) == len(used):
        return f"{name(next(iter(own)))} {noun} (the plan's calls)"
    return f"{name(default)} {noun} (" + ", ".join(f"{name(d)} in {n} of {len(used)} calls" for d, n in own.items()) + ")"


def common_prefix(names) -> str:
    """The dotted prefix (whole name parts) that all dotted module names among ``names`` share, less
    the list's own name when only indices would be left ("layers.0", never "0")."""
    mods = [m for n in names if n != OUTSIDE_FSDP and not n.startswith("<") for m in n.strip("[]").split(", ") if "." in m]
    prefix = os.path.commonprefix(mods) if len(mods) > 1 else ""
    prefix = prefix[: prefix.rfind(".") + 1]
    while prefix and any(m[len(prefix):].split(".")[0].isdigit() for m in mods):
        prefix = prefix[: prefix.rfind(".", 0, len(prefix) - 1) + 1]
    return prefix


def _keep_end(label: str, width: int) -> str:
    """The end of a dotted name that fits ``width`` (whole parts, "…" in front)."""
    pieces = label.split(".")
    kept = pieces[-1]
    for piece in reversed(pieces[:-1]):
        if len(kept) + len(piece) + 2 > width:
            break
        kept = f"{piece}.{kept}"
    return "…" + kept if len(kept) + 1 <= width else "…" + kept[-(width - 1):]


def short_labels(names, width: int = 30) -> list[str]:
    """Chart labels for call names: drop the dotted prefix they all share, then keep the end that
    names the module (whole name parts, "…" in front) when still longer than ``width``."""
    names = [OUTSIDE_FSDP if n is None else str(n) for n in names]
    prefix = common_prefix(names)

    def strip(m: str) -> str:
        return m[len(prefix):] if prefix and m.startswith(prefix) else m

    out = []
    for n in names:
        if n == OUTSIDE_FSDP:
            out.append(n)
            continue
        grouped = n.startswith("[") and n.endswith("]")
        label = ("[" + ", ".join(strip(m) for m in n[1:-1].split(", ")) + "]") if grouped else strip(n)
        label = label or "<root>"
        out.append(_keep_end(label, width) if len(label) > width else label)
    return out


def _traffic_sums(df) -> tuple[dict, dict]:
    """Bytes, bytes sent and counts summed by collective and by call."""
    col = "sent_bytes" if "sent_bytes" in df.columns else "bytes"
    by_coll: dict[str, dict] = {}
    by_unit: dict[str, dict] = {}
    for coll, name, nbytes, sent, count in zip(
        _column(df, "collective", ""), _column(df, "unit", None), _column(df, "bytes"), _column(df, col),
        _column(df, "count"),
    ):
        coll = str(coll)
        nbytes, sent, count = int_or_zero(nbytes), int_or_zero(sent), int_or_zero(count)
        c = by_coll.setdefault(coll, {"collective": coll, "bytes": 0, "sent": 0, "count": 0})
        c["bytes"] += nbytes
        c["sent"] += sent
        c["count"] += count
        name = OUTSIDE_FSDP if name is None or (isinstance(name, float) and math.isnan(name)) else str(name)
        u = by_unit.setdefault(name, {"unit": name, "values": {}, "total": 0, "count": 0})
        u["values"][coll] = u["values"].get(coll, 0) + sent
        u["total"] += sent
        u["count"] += count
    return by_coll, by_unit


def _units_shown(by_unit: dict) -> list[dict]:
    """The ``MAX_UNITS_SHOWN`` calls that send the most, labelled, and one bar for the rest."""
    units = sorted(by_unit.values(), key=lambda u: -u["total"])
    shown, rest = units[:MAX_UNITS_SHOWN], units[MAX_UNITS_SHOWN:]
    for u, label in zip(shown, short_labels([u["unit"] for u in shown])):
        u["label"] = label
    if rest:
        other = {"unit": f"{len(rest)} more calls", "values": {}, "total": 0, "count": 0, "other": True}
        for u in rest:
            for k, v in u["values"].items():
                other["values"][k] = other["values"].get(k, 0) + v
            other["total"] += u["total"]
            other["count"] += u["count"]
        other["label"] = other["unit"]
        shown.append(other)
    return shown


def _time_per_step(df, mesh) -> float | None:
    time_s = df.attrs.get("time_per_step_s")
    if mesh.intra_node_gbps is None and mesh.inter_node_gbps is None:
        return None  # no bandwidth given: no time estimate
    if isinstance(time_s, float) and math.isnan(time_s):
        return None
    return time_s


def timeline_payload(analysis) -> dict:
    """The step's timeline (``step.timing.timeline_payload`` of ``a.step_time``): what the report and
    the Inspector draw."""
    try:
        st = analysis.step_time
    except Exception as exc:  # noqa: BLE001 - a view shows why (a plan torch refuses) instead of breaking
        return {"available": False, "reason": f"no step time: {type(exc).__name__}: {exc}"}
    return timing.timeline_payload(st)


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
    by_coll, by_unit = _traffic_sums(df)
    colls = sorted(by_coll, key=lambda c: (COLLECTIVES_ORDER.index(c) if c in COLLECTIVES_ORDER else 99, c))
    seconds = _time_per_step(df, analysis.mesh)
    return {
        "available": True,
        "metric": "sent_bytes" if "sent_bytes" in df.columns else "bytes",
        "collectives": colls,
        "names": {c: format_kind(c) for c in colls},  # as every chart spells them
        "by_collective": [by_coll[c] for c in colls],
        "by_unit": _units_shown(by_unit),
        "n_units": len(by_unit),
        "total_sent": sum(c["sent"] for c in by_coll.values()),
        "total_bytes": sum(c["bytes"] for c in by_coll.values()),
        "time_s": seconds,
        "time_text": format_duration(seconds) if seconds else "",  # "5.636 s", not "5635.8 ms"
    }


# ---------------------------------------------------------------------------
# plotly figures for the Python API (the notebook front end draws the same data as SVG)
# ---------------------------------------------------------------------------
COLORS = ("#4c78a8", "#72b7b2", "#9d755d", "#f58518", "#e45756", "#b279a2", "#54a24b", "#eeca3b")


def memory_figure(payload: dict):
    """The memory chart as a plotly figure: the same payload, parts, order and limit rule as the SVG."""
    import plotly.graph_objects as go

    fig = go.Figure()
    bars = payload.get("bars", [])
    div, unit = byte_unit(float(payload.get("max_peak") or 0))
    labels = [b["label"] for b in bars]
    for i, cat in enumerate(payload.get("categories", [])):
        fig.add_bar(
            name=cat["label"], x=labels, y=[b["parts"][cat["key"]] / div for b in bars],
            marker_color=COLORS[i % len(COLORS)],
            customdata=[b["parts"][cat["key"]] for b in bars],
            hovertemplate="%{x}: %{y:.2f} " + unit + " (%{customdata:,} B)<extra>" + cat["label"] + "</extra>",
        )
    caps = [max(int(b.get("reserved") or 0) - int(b["peak"]), 0) for b in bars]
    if any(caps):  # the reserved peak as a hollow cap on each stack: the top is what the verdict judges
        fig.add_bar(name="reserved (cap)", x=labels, y=[c / div for c in caps], customdata=[b.get("reserved") for b in bars],
                    marker={"color": "rgba(0,0,0,0)", "line": {"color": "#888", "width": 1.5}},
                    hovertemplate="%{x}: reserved %{customdata:,} B<extra>reserved</extra>")
    limit = payload.get("limit")
    title = "Memory per rank at the peak"
    highest = max([float(payload.get("max_peak") or 0)] + [float(b.get("reserved") or 0) for b in bars])
    if limit is not None and limit <= 4 * highest:  # 0: nothing usable
        over = bool((payload.get("use") or {}).get("over"))
        fig.add_hline(y=limit / div, line_dash="dash", line_color="#d62728" if over else "#888",
                      annotation_text=(payload.get("use") or {}).get("text", "device memory"))
    elif limit is not None and payload.get("use"):
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
    div, unit = byte_unit(float(max([c["sent"] for c in payload.get("by_collective", [])] or [0])))
    fig = make_subplots(rows=1, cols=2, column_widths=[0.3, 0.7],
                        subplot_titles=("by collective", "by fully_shard call"))
    names = payload.get("names", {})  # one per collective (none without a traffic estimate)
    fig.add_bar(x=[names[c] for c in colls], y=[c["sent"] / div for c in payload.get("by_collective", [])], showlegend=False,
                marker_color=[COLORS[i % len(COLORS)] for i in range(len(colls))], row=1, col=1)
    for i, coll in enumerate(colls):
        fig.add_bar(name=names[coll], y=[u.get("label", u["unit"]) for u in units], x=[u["values"].get(coll, 0) / div for u in units],
                    orientation="h", marker_color=COLORS[i % len(COLORS)], customdata=[u["unit"] for u in units],
                    hovertemplate="%{customdata}: %{x:.2f} " + unit + "<extra>" + names[coll] + "</extra>", row=1, col=2)
    fig.update_layout(barmode="stack", title=f"Traffic per step ({unit} sent per rank)",
                      margin={"t": 60, "l": 10, "r": 10, "b": 40},
                      paper_bgcolor="rgba(0,0,0,0)", plot_bgcolor="rgba(0,0,0,0)")
    fig.update_yaxes(autorange="reversed", row=1, col=2)
    return fig


# ---------------------------------------------------------------------------
# What the numbers are about: the model, the verdict, the libraries (report and command line)
# ---------------------------------------------------------------------------
def _count(n: int) -> str:
    """``70_553_706_496`` -> "70.6 B"; "1.2 M", "350 K"."""
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return str(n)


def _adapter_text(model) -> str:
    """" + LoRA r=16" for a peft model (each adapter's type and rank), "" for anything else."""
    configs = peft_configs(model)
    if not configs:
        return ""
    parts = []
    for config in configs.values():
        kind = str(getattr(config.peft_type, "value", config.peft_type) or "adapter")  # a PeftType, or its name
        rank = getattr(config, "r", None)
        parts.append(f"{'LoRA' if kind == 'LORA' else kind}" + (f" r={rank}" if rank is not None else ""))
    return " + " + " + ".join(parts)


def model_text(tree, label: str | None = None) -> str:
    """The model as a person names it: "LlamaForCausalLM (Llama 3.1 70B-shaped: 70.6 B parameters,
    0.2% trainable) + LoRA r=16": the class under any peft wrapper, what it is shaped after
    (``label``: the zoo model's or the config folder's name, when known), the parameters counted once."""
    model = tree.model
    name = type(base_model(model)).__name__ if model is not None else tree.root_type
    total = sum(math.prod(p.dequantized_shape) if p.dequantized_shape else p.nbytes * 2 if p.quant in ("nf4", "fp4")
                else p.numel for p in tree.params)  # bitsandbytes 4-bit: two weights a packed byte
    trainable = sum(p.numel for p in tree.params if p.requires_grad)
    adapter = _adapter_text(model) if model is not None else ""
    share = f", {format_percent(trainable / total)} trainable" if adapter and total else ""
    shaped = f"{label}-shaped: " if label and label != name else ""
    return f"{name} ({shaped}{_count(total)} parameters{share}{_quant_text(tree)}){adapter}"


def _quant_text(tree) -> str:
    """", 4-bit nf4 (bitsandbytes, bfloat16 storage)": the packed weights' kinds and storage dtypes."""
    kinds = sorted({p.quant for p in tree.params if p.quant})
    if not kinds:
        return ""
    if kinds == ["int8"]:
        return ", 8-bit int8 (bitsandbytes)"
    if all(p.dequantized_shape for p in tree.params if p.quant):
        return f", 4-bit {'/'.join(kinds)}"
    storage = sorted({str(p.dtype).replace("torch.", "") for p in tree.params if p.quant in ("nf4", "fp4")})
    return f", 4-bit {'/'.join(kinds)} (bitsandbytes, {'/'.join(storage)} storage)"


def verdict_text(a) -> str:
    """The fits verdict, one line (``a.fit.headline``, the words every surface shows), with the
    worst rank: "does not fit: reserved peak 79.37 GiB exceeds 79.00 GiB usable by 380.00 MiB
    (allocated 68.01 GiB) on rank 0"; without device memory, the peaks alone."""
    rank = worst_rank(a.memory)
    fit = a.fit
    if fit is None:
        peak, reserved = int(a.memory["peak"].max()), int(a.memory["reserved_peak"].max())
        return (f"peak {format_bytes(peak)} allocated, {format_bytes(reserved)} reserved on rank {rank} "
                "(no device memory given: no fits verdict)")
    # with a host part the headline ends on the host's words: the device's worst rank said apart
    return f"{fit.headline}; device peak on rank {rank}" if fit.host else f"{fit.headline} on rank {rank}"


def library_versions() -> dict:
    """The versions the numbers were measured with: shardviz, torch, transformers, peft, accelerate
    (the last three only when installed)."""
    import sys
    from importlib import metadata

    import torch

    # the package's own __version__ (loaded before any of its modules; importing it here would go up the layers)
    out = {"shardviz": sys.modules["shardviz"].__version__, "torch": torch.__version__}
    for name in ("transformers", "peft", "accelerate"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def versions_text() -> str:
    """ "shardviz 0.1.0 · torch 2.13.0 · transformers 5.24.0 · peft 0.21.0 · accelerate 1.15.0" """
    return " · ".join(f"{k} {v}" for k, v in library_versions().items())


def max_positions(model) -> int | None:
    """The model's ``config.max_position_embeddings`` (a peft model's base config too), if it has one."""
    n = getattr(getattr(base_model(model), "config", None), "max_position_embeddings", None)
    return n if isinstance(n, int) and n > 0 else None


def seq_len_note(model, seq_len) -> str | None:
    """A warning when the sequence length is beyond what the model's positions cover."""
    limit = max_positions(model) if model is not None else None
    if limit is None or not seq_len or seq_len <= limit:
        return None
    return (f"sequence length {seq_len:,} is above this model's max_position_embeddings ({limit:,}): "
            "it was not built for sequences this long")


_SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}
HEADLINE_CHARS = 160


def first_clause(message: str, limit: int = HEADLINE_CHARS) -> str:
    """A finding's message to its first ". " or "; " outside parentheses (after 20 characters), cut at
    a word within ``limit`` characters with "…": the card's one or two lines under the verdict (the
    Inspector's and the report's), the whole message on hover and in the findings below."""
    depth = 0
    for i, c in enumerate(message[:-1]):
        if c == "(":
            depth += 1
        elif c == ")":
            depth = max(0, depth - 1)
        elif depth == 0 and i >= 20 and c in ".;" and message[i + 1] == " ":
            message = message[:i + 1]
            break
    if len(message) <= limit:
        return message
    cut = message.rfind(" ", 0, limit)
    return message[:cut if cut > 40 else limit - 1] + "…"


def header_card(a, findings=None) -> dict:
    """The answer first, as the Inspector's header card and the report's top show it: the verdict
    (its word and kind, the one ``a.fit``), the judged peak against the usable memory with the
    margin (``limit_use``), step time, tokens/s and MFU (``a.step``), and the top finding (errors
    first) with its title and whether its fix is a change (``fixes.fix_change``: "apply").
    ``findings``: ``a.findings`` when computed (None: not yet, the card says nothing of them)."""
    from ..finding import TITLES
    from ..checks.fixes import fix_change

    step = a.step
    timed = step.step_time_s is not None
    card = {
        "model": model_name(a.tree),
        "verdict": a.fit.verdict if a.fit is not None else None,
        "verdict_word": a.fit.word if a.fit is not None else "no verdict",
        "verdict_text": verdict_text(a),
        "use": limit_use(a.fit),
        "step_time_s": step.step_time_s, "tokens_per_s": step.tokens_per_s, "mfu": step.mfu,
        "step_text": format_duration(step.step_time_s) if timed else "not timed",
        "tokens_text": f"{format_rate(step.tokens_per_s)} tokens/s per rank" if timed else "",
        "mfu_text": f"MFU {format_percent(step.mfu)}" if timed and step.mfu is not None else "",
        "untimed": None if timed else step.reason,
        "finding": None, "findings_ready": findings is not None,
    }
    if findings:
        top = min(findings, key=lambda f: _SEVERITY_ORDER.get(f.severity, 3))
        try:
            fixable = fix_change(a, top) is not None
        except Exception:  # noqa: BLE001 - the card still shows the finding, without "apply"
            fixable = False
        # a fix priced as a change (SV201's cheapest) is the line: the verdict above already says the problem
        headline = f"fix: {top.change.words}" if top.change is not None else first_clause(top.message)
        card["finding"] = {"code": top.code, "severity": top.severity, "title": TITLES.get(top.code, ""),
                           "message": top.message, "headline": headline, "fix": top.fix,
                           "headline_is_fix": top.change is not None, "applies": fixable, "pending": top.pending}
    return card
