"""Layouts side by side (``compare``) and against world size (``sweep``).

Every number is read from ``analyze`` (one analysis per layout and mesh, on one cached tree),
so a comparison can never disagree with the analyses it is made of.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import pandas as pd

from .analysis import Analysis, analyze
from .fsdp import Mesh
from .plan import as_plan
from .tree import as_tree

MEMORY_PARTS = ("params", "grads", "optimizer")


def summarize(a: Analysis) -> dict:
    """One row of numbers for an analysis: memory on the worst rank, traffic per step, findings."""
    mem, comm = a.memory, a.comm
    worst = int(mem["peak"].idxmax())
    row = {part: int(mem.at[worst, part]) for part in MEMORY_PARTS}
    row["activations"] = int(mem.at[worst, "activations"])  # alive at the peak (0 without Training.batch_size)
    row["peak"] = int(mem.at[worst, "peak"])
    row["peak_rank"] = int(mem.at[worst, "rank"])
    row["fits"] = None if a.mesh.device_memory is None else bool(row["peak"] <= a.mesh.device_memory)
    row["bytes_per_step"] = int((comm["bytes"] * comm["count"]).sum()) if len(comm) else 0
    row["sent_bytes_per_rank"] = int((comm["sent_bytes"] * comm["count"]).sum()) if len(comm) else 0
    row["collectives_per_step"] = int(comm["count"].sum()) if len(comm) else 0
    for kind in ("all_gather", "reduce_scatter", "all_reduce"):
        row[f"n_{kind}"] = int(comm.loc[comm.collective == kind, "count"].sum()) if len(comm) else 0
    row["time_per_step_s"] = comm.attrs.get("time_per_step_s", float("nan"))
    findings = a.findings
    row["errors"] = sum(f.severity == "error" for f in findings)
    row["warnings"] = sum(f.severity == "warning" for f in findings)
    row["findings"] = ", ".join(sorted({f.code for f in findings}))
    return row


class Comparison:
    """``analyses[name]`` for each layout; ``table``, ``figure()`` and ``diff(a, b)``."""

    def __init__(self, analyses: Mapping[str, Analysis]):
        self.analyses = dict(analyses)

    @property
    def table(self) -> pd.DataFrame:
        rows = [{"layout": name, **summarize(a)} for name, a in self.analyses.items()]
        return pd.DataFrame(rows).set_index("layout")

    def diff(self, a: str, b: str) -> pd.DataFrame:
        """Parameters whose status or owning call differs between layouts ``a`` and ``b``."""
        for name in (a, b):
            if name not in self.analyses:
                raise ValueError(f"no layout named {name!r}; layouts: {list(self.analyses)}")
        if a == b:
            return pd.DataFrame(columns=["fqn", f"status ({a})", f"unit ({a})"])
        left = self.analyses[a].params.set_index("fqn")[["status", "unit"]]
        right = self.analyses[b].params.set_index("fqn")[["status", "unit"]]
        both = left.join(right, lsuffix=f" ({a})", rsuffix=f" ({b})")
        same_status = both[f"status ({a})"] == both[f"status ({b})"]
        same_unit = both[f"unit ({a})"].fillna("") == both[f"unit ({b})"].fillna("")
        return both[~(same_status & same_unit)].reset_index()

    @property
    def breakdown(self) -> pd.DataFrame:
        """The peak of each layout's busiest rank by kind (``Analysis.peak_breakdown``, the same
        breakdown the Inspector and the report draw); each row sums to the table's ``peak``."""
        from .widget.views import PEAK_PARTS, peak_breakdown

        rows = [{"layout": name, **peak_breakdown(a)} for name, a in self.analyses.items()]
        return pd.DataFrame(rows, columns=["layout", *PEAK_PARTS]).set_index("layout")

    @property
    def formatted(self) -> pd.DataFrame:
        """``table`` for reading: bytes with units, "fits" as yes / no / "no limit set", the time
        per step as seconds or "no bandwidth given" (the report shows this table)."""
        return format_table(self.table)

    def memory_payload(self) -> dict:
        """The memory chart's data with one bar per layout (the Inspector's format: ``views.memory_payload``)."""
        from .widget.views import PART_HELP, PEAK_PARTS, limit_use, training_text

        t, b = self.table, self.breakdown
        limit = next(iter(self.analyses.values())).mesh.device_memory if self.analyses else None
        bars = []
        for i, name in enumerate(t.index):
            a = self.analyses[name]
            mem = a.memory
            worst = int(mem["peak"].idxmax())
            bars.append({"first": i, "last": i, "label": str(name), "parts": {k: int(b.at[name, k]) for k in PEAK_PARTS},
                         "peak": int(t.at[name, "peak"]), "phase": str(mem.at[worst, "peak_phase"]),
                         "unit": mem.at[worst, "peak_unit"] if isinstance(mem.at[worst, "peak_unit"], str) else None,
                         "module": None, "params": int(t.at[name, "params"]), "grads": int(t.at[name, "grads"]),
                         "optimizer": int(t.at[name, "optimizer"])})
        top = max((bar["peak"] for bar in bars), default=0)
        return {"available": True, "categories": [{"key": k, "label": k, "help": PART_HELP[k]} for k in PEAK_PARTS],
                "bars": bars, "limit": limit, "max_peak": top, "use": limit_use(top, limit), "n_ranks": len(bars),
                # one bar per layout: the chart notes each one's peak, and the training they all assume
                "by_layout": True, "training": training_text(next(iter(self.analyses.values())).training) if self.analyses else ""}

    def chart(self):
        """The memory chart of the layouts, drawn like the Inspector's (SVG, follows JupyterLab's theme)."""
        from .widget.chart import Chart

        return Chart("memory", self.memory_payload(), title="Memory on the busiest rank, by layout")

    def figure(self):
        """Stacked peak of the busiest rank by kind (the one breakdown), and bytes per step, one bar
        per layout; each chart in its own unit (KiB / MiB / GiB)."""
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        from .widget.views import PEAK_PARTS

        t, b = self.table, self.breakdown
        mdiv, munit = _scale(float(t["peak"].max()) if len(t) else 0.0)
        tdiv, tunit = _scale(float(t["bytes_per_step"].max()) if len(t) else 0.0)
        limit = next(iter(self.analyses.values())).mesh.device_memory
        mem_title = f"Memory on the busiest rank ({munit})"
        if limit and limit > 4 * float(t["peak"].max()):
            mem_title += f"; device {_fmt(limit)} is off the scale"
        fig = make_subplots(rows=1, cols=2, subplot_titles=(mem_title, f"Traffic per step ({tunit})"))
        names = list(t.index)
        for part in PEAK_PARTS:
            fig.add_trace(go.Bar(name=part, x=names, y=b[part] / mdiv), row=1, col=1)
        fig.add_trace(go.Bar(name="bytes per step", x=names, y=t["bytes_per_step"] / tdiv, showlegend=True), row=1, col=2)
        if limit and limit <= 4 * float(t["peak"].max()):
            fig.add_hline(y=limit / mdiv, line_dash="dash", annotation_text="device memory", row=1, col=1)
        fig.update_layout(barmode="stack", height=420, legend_orientation="h",
                          paper_bgcolor="rgba(0,0,0,0)", plot_bgcolor="rgba(0,0,0,0)")
        return fig

    def __repr__(self) -> str:
        return f"<shardviz.Comparison of {list(self.analyses)}>"


def _scale(max_bytes: float) -> tuple[float, str]:
    """The unit that keeps the largest value of one chart readable (never "500μ GiB")."""
    for div, name in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if max_bytes >= div:
            return div, name
    return 1, "B"


def _fmt(n) -> str:
    from .cost import format_bytes

    return format_bytes(n)


BYTE_COLUMNS = ("params", "grads", "optimizer", "peak", "bytes_per_step", "sent_bytes_per_rank")


def format_table(table: pd.DataFrame) -> pd.DataFrame:
    """A comparison or sweep table for reading: bytes with units; ``fits`` as "yes" / "no" /
    "no limit set"; ``time_per_step_s`` as seconds or "no bandwidth given"."""
    import math

    out = table.copy()
    for col in BYTE_COLUMNS:
        if col in out:
            out[col] = out[col].map(_fmt)
    if "fits" in out:
        out["fits"] = out["fits"].map(lambda v: "no limit set" if v is None or (isinstance(v, float) and math.isnan(v))
                                      else ("yes" if v else "no"))
    if "time_per_step_s" in out:
        out["time_per_step_s"] = out["time_per_step_s"].map(
            lambda v: "no bandwidth given" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f} s")
    if "findings" in out:
        out["findings"] = out["findings"].map(lambda v: v or "none")
    return out


def _named_plans(plans) -> dict:
    if isinstance(plans, Mapping):
        return {str(k): as_plan(v) for k, v in plans.items()}
    if isinstance(plans, Sequence) and not isinstance(plans, str):
        out = {}
        for i, p in enumerate(plans):
            plan = as_plan(p)
            out[plan.name or f"plan {i}"] = plan
        return out
    raise ValueError("plans must be a mapping {name: Plan} or a list of Plans")


def compare(model, plans, mesh: Mesh | None = None, training=None) -> Comparison:
    """Analyse every plan on the same model and mesh: ``compare(m, {"LoRA ignored": p1, "LoRA sharded": p2})``."""
    tree = as_tree(model)
    mesh = mesh or Mesh(8)
    return Comparison({name: analyze(tree, plan, mesh, training, strict=False) for name, plan in _named_plans(plans).items()})


class Sweep:
    """Per-rank memory and traffic against world size, one line per layout."""

    def __init__(self, table: pd.DataFrame, device_memory: int | None):
        self.table, self.device_memory = table, device_memory

    def first_fit(self) -> dict:
        """For each layout, the smallest world size whose peak fits (None if none does)."""
        out = {}
        for layout, rows in self.table.groupby("layout", sort=False):
            fits = rows[rows.fits == True]  # noqa: E712 - None means unknown
            out[layout] = int(fits.world.min()) if len(fits) else None
        return out

    def lines_payload(self, metric: str = "peak") -> dict:
        """One line per layout of ``metric`` ("peak" or "sent_bytes_per_rank") against world size."""
        from .widget.views import limit_use

        series = [{"name": str(layout), "x": [int(x) for x in rows.world], "y": [int(y) for y in rows[metric]]}
                  for layout, rows in self.table.groupby("layout", sort=False)]
        peak = metric == "peak"
        limit = self.device_memory if peak else None
        top = max((y for q in series for y in q["y"]), default=0)
        use = limit_use(top, limit)
        return {"title": "Peak memory per rank" if peak else "Bytes sent per rank per step",
                "x_label": "world size (ranks)", "series": series, "limit": limit,
                "limit_text": f"device {_fmt(limit)}" if limit else None, "use": use}

    def chart(self, metric: str = "peak"):
        """The sweep drawn like the Inspector's charts (SVG, follows JupyterLab's theme)."""
        from .widget.chart import Chart

        return Chart("lines", self.lines_payload(metric))

    def figure(self):
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        pdiv, punit = _scale(float(self.table.peak.max()) if len(self.table) else 0.0)
        sdiv, sunit = _scale(float(self.table.sent_bytes_per_rank.max()) if len(self.table) else 0.0)
        limit = self.device_memory
        on_scale = limit and limit <= 4 * float(self.table.peak.max())
        title = f"Peak memory per rank ({punit})" + (f"; device {_fmt(limit)} is off the scale" if limit and not on_scale else "")
        fig = make_subplots(rows=1, cols=2, subplot_titles=(title, f"Bytes sent per rank per step ({sunit})"))
        for i, (layout, rows) in enumerate(self.table.groupby("layout", sort=False)):
            color = f"hsl({(i * 137) % 360},60%,45%)"
            fig.add_trace(go.Scatter(x=rows.world, y=rows.peak / pdiv, name=layout, mode="lines+markers",
                                     line_color=color, legendgroup=layout), row=1, col=1)
            fig.add_trace(go.Scatter(x=rows.world, y=rows.sent_bytes_per_rank / sdiv, name=layout, mode="lines+markers",
                                     line_color=color, legendgroup=layout, showlegend=False), row=1, col=2)
        if on_scale:
            fig.add_hline(y=limit / pdiv, line_dash="dash", annotation_text="device memory", row=1, col=1)
        fig.update_xaxes(type="log", title_text="world size", dtick=0.30103)
        fig.update_layout(height=420, legend_orientation="h")
        return fig

    def __repr__(self) -> str:
        return f"<shardviz.Sweep {self.table.layout.nunique()} layouts x {self.table.world.nunique()} world sizes>"


def sweep(model, plans, world_sizes=(8, 16, 32, 64, 128, 256, 512), *, replicate: int = 1,
          mesh: Mesh | None = None, training=None) -> Sweep:
    """Analyse every plan at every world size (``shard = world // replicate``).

    ``mesh`` (optional) supplies device memory, ranks per node and bandwidths for every point.
    """
    tree = as_tree(model)
    base = mesh or Mesh(1)
    rows = []
    for name, plan in _named_plans(plans).items():
        for world in world_sizes:
            if world % replicate:
                raise ValueError(f"world size {world} is not a multiple of replicate={replicate}")
            point = replace(base, shard=world // replicate, replicate=replicate)
            rows.append({"layout": name, "world": world, **summarize(analyze(tree, plan, point, training, strict=False))})
    return Sweep(pd.DataFrame(rows), base.device_memory)
