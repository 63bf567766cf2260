"""Layouts side by side (``compare``) and against world size (``sweep``).

Every number is read from ``analyze`` (one analysis per layout and mesh, on one cached tree),
so a comparison can never disagree with the analyses it is made of. Without ``training`` both
assume ``display.DEFAULT_TRAINING``, as the Inspector and the report do, and say so in their charts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import pandas as pd

from .views import display
from .analysis import Analysis, analyze
from .format import byte_unit, fmt
from .run.mesh import worst_rank
from .run.mesh import Mesh
from .plan import as_plan
from .model.tree import as_tree
from .views.display import DEFAULT_TRAINING

MEMORY_PARTS = ("params", "grads", "optimizer")
#: What ``Sweep.figure(y=...)`` plots besides memory and traffic: axis title, scale.
STEP_METRICS = {"tokens_per_s": ("tokens/s per rank", 1), "step_time_s": ("step time (s)", 1), "mfu": ("MFU (%)", 100)}


def summarize(a: Analysis) -> dict:
    """One row of numbers for an analysis: memory on the worst rank, traffic per step, findings."""
    mem, comm = a.memory, a.comm
    rank = worst_rank(mem)
    worst = mem.set_index("rank").loc[rank]
    row = {part: int(worst[part]) for part in MEMORY_PARTS}
    row["activations"] = int(worst["activations"])  # alive at the peak (0 without Training.batch_size)
    row["peak"] = int(worst["peak"])
    row["peak_rank"] = rank
    row["reserved_peak"] = int(mem["reserved_peak"].max())  # what the caching allocator holds (step.reserved)
    fit = a.fit  # the one verdict (devices.memory_fit): the same words as the report's, the CLI's, the Inspector's
    row["judged_peak"] = None if fit is None else fit.judged
    row["fits"] = None if fit is None else bool(fit.fits)
    row["verdict"] = None if fit is None else fit.verdict  # fits | tight | over
    row["margin"] = None if fit is None else fit.margin
    row["bytes_per_step"] = int((comm["bytes"] * comm["count"]).sum()) if len(comm) else 0
    row["sent_bytes_per_rank"] = int((comm["sent_bytes"] * comm["count"]).sum()) if len(comm) else 0
    row["collectives_per_step"] = int(comm["count"].sum()) if len(comm) else 0
    for kind in ("all_gather", "reduce_scatter", "all_reduce"):
        row[f"n_{kind}"] = int(comm.loc[comm.collective == kind, "count"].sum()) if len(comm) else 0
    row["time_per_step_s"] = comm.attrs.get("time_per_step_s", float("nan"))
    step = a.step  # None figures without a device or a micro-batch (a.step.reason)
    row["step_time_s"], row["tokens_per_s"], row["mfu"] = step.step_time_s, step.tokens_per_s, step.mfu
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
    def training(self):
        """The training every layout is analysed with (``compare`` gives them all the same)."""
        return next(iter(self.analyses.values())).training if self.analyses else DEFAULT_TRAINING

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
        rows = [{"layout": name, **display.peak_breakdown(a)} for name, a in self.analyses.items()]
        return pd.DataFrame(rows, columns=["layout", *display.PEAK_PARTS]).set_index("layout")

    @property
    def formatted(self) -> pd.DataFrame:
        """``table`` for reading (``sv.fmt``): human headers, bytes with units, "fits" as yes / no /
        "no limit set", the time per step as seconds or "no bandwidth given"."""
        return fmt(self.table)

    def memory_payload(self) -> dict:
        """The memory chart's data with one bar per layout: each layout's worst-rank bar of
        ``display.memory_payload`` (``display.worst_bar``), labelled with the layout's name."""
        mesh = next(iter(self.analyses.values())).mesh if self.analyses else Mesh(1)
        bars = []
        for i, (name, a) in enumerate(self.analyses.items()):
            bars.append({**display.worst_bar(a), "first": i, "last": i, "label": str(name)})
        top = max((bar["peak"] for bar in bars), default=0)
        # the verdict drawn is the worst layout's own (a.fit), the one its row and the report show
        worst = max(self.analyses.values(), key=lambda a: a.fit.judged if a.fit else 0, default=None)
        return {"available": True, "categories": display.categories(), "bars": bars, "limit": mesh.usable_memory,
                "limit_text": mesh.limit_text, "max_peak": top, "use": display.limit_use(worst.fit if worst else None),
                "n_ranks": len(bars),
                "training": display.training_text(self.training),
                "by_layout": True}  # one bar per layout: the chart notes each one's peak

    def chart(self):
        """The memory chart of the layouts, drawn like the Inspector's (SVG, follows JupyterLab's theme)."""
        from .views.chart import chart

        return chart("memory", self.memory_payload(), title=self.chart_title())

    def chart_title(self) -> str:
        """The layouts chart's title, with the training it assumes."""
        return f"Memory on the busiest rank, by layout ({display.training_text(self.training)})"

    def figure(self):
        """Stacked peak of the busiest rank by kind (the one breakdown), and bytes per step, one bar
        per layout; each chart in its own unit (KiB / MiB / GiB)."""
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        t, b = self.table, self.breakdown
        mdiv, munit = byte_unit(float(t["peak"].max()) if len(t) else 0.0)
        tdiv, tunit = byte_unit(float(t["bytes_per_step"].max()) if len(t) else 0.0)
        mesh = next(iter(self.analyses.values())).mesh
        limit = mesh.usable_memory
        mem_title = f"Memory on the busiest rank ({munit})"
        if limit and limit > 4 * float(t["peak"].max()):
            mem_title += f"; {mesh.limit_text} is off the scale"
        fig = make_subplots(rows=1, cols=2, subplot_titles=(mem_title, f"Traffic per step ({tunit})"))
        names = list(t.index)
        for part in display.PEAK_PARTS:
            fig.add_trace(go.Bar(name=part, x=names, y=b[part] / mdiv), row=1, col=1)
        fig.add_trace(go.Bar(name="bytes per step", x=names, y=t["bytes_per_step"] / tdiv, showlegend=True), row=1, col=2)
        if limit and limit <= 4 * float(t["peak"].max()):
            fig.add_hline(y=limit / mdiv, line_dash="dash", annotation_text=mesh.limit_text, row=1, col=1)
        fig.update_layout(barmode="stack", height=420, legend_orientation="h", title=display.training_text(self.training),
                          paper_bgcolor="rgba(0,0,0,0)", plot_bgcolor="rgba(0,0,0,0)")
        return fig

    def __repr__(self) -> str:
        return f"<shardviz.Comparison of {list(self.analyses)}>"


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
    """Analyse every plan on the same model and mesh: ``compare(m, {"LoRA ignored": p1, "LoRA sharded": p2})``.

    Without ``training``: ``display.DEFAULT_TRAINING`` (AdamW, bf16 parameters, fp32 reduction)."""
    tree = as_tree(model)
    mesh = mesh or Mesh(8)
    training = DEFAULT_TRAINING if training is None else training
    return Comparison({name: analyze(tree, plan, mesh, training, strict=False) for name, plan in _named_plans(plans).items()})


class Sweep:
    """Per-rank memory and traffic against world size, one line per layout."""

    def __init__(self, table: pd.DataFrame, mesh: Mesh, training=DEFAULT_TRAINING):
        self.table, self.mesh, self.training = table, mesh, training

    @property
    def device_memory(self) -> int | None:
        return self.mesh.device_memory

    def first_fit(self) -> dict:
        """For each layout, the smallest world size whose peak fits (None if none does)."""
        out = {}
        for layout, rows in self.table.groupby("layout", sort=False):
            fits = rows[rows.fits == True]  # noqa: E712 - None means unknown
            out[layout] = int(fits.world.min()) if len(fits) else None
        return out

    def lines_payload(self, metric: str = "peak") -> dict:
        """One line per layout of ``metric`` ("peak" or "sent_bytes_per_rank") against world size."""
        peak = metric == "peak"
        t = self.table
        # the peak drawn is the one the verdict judges (Mesh.fit, once per row), so the lines and the words agree
        fits = [self.mesh.fit(int(p), int(r)) for p, r in zip(t["peak"], t["reserved_peak"])] if peak else []
        drawn = t.assign(y=[f.judged if f is not None else int(p) for f, p in zip(fits, t["peak"])] if peak else t[metric])
        series = [{"name": str(layout), "x": [int(x) for x in rows.world], "y": [int(y) for y in rows.y]}
                  for layout, rows in drawn.groupby("layout", sort=False)]
        limit = self.mesh.usable_memory if peak else None
        judged = [f for f in fits if f is not None]
        use = display.limit_use(max(judged, key=lambda f: f.judged)) if judged else None  # the worst row's verdict
        what = "Peak memory per rank" if peak else "Bytes sent per rank per step"
        return {"title": f"{what} ({display.training_text(self.training)})",
                "x_label": "world size (ranks)", "series": series, "limit": limit,
                "limit_text": self.mesh.limit_text if limit else None, "use": use}

    def chart(self, metric: str = "peak"):
        """The sweep drawn like the Inspector's charts (SVG, follows JupyterLab's theme)."""
        from .views.chart import chart

        return chart("lines", self.lines_payload(metric))

    def figure(self, y: str | None = None):
        """Peak memory and bytes sent per rank against world size; ``y="tokens_per_s"`` (or
        "step_time_s", "mfu"): that column of ``table`` instead (needs ``Mesh(device=...)`` and a
        micro-batch, else the points are missing)."""
        if y is not None:
            return self._metric_figure(y)
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        pdiv, punit = byte_unit(float(self.table.peak.max()) if len(self.table) else 0.0)
        sdiv, sunit = byte_unit(float(self.table.sent_bytes_per_rank.max()) if len(self.table) else 0.0)
        limit = self.mesh.usable_memory
        on_scale = limit and limit <= 4 * float(self.table.peak.max())
        title = f"Peak memory per rank ({punit})" + (f"; {self.mesh.limit_text} is off the scale" if limit and not on_scale else "")
        fig = make_subplots(rows=1, cols=2, subplot_titles=(title, f"Bytes sent per rank per step ({sunit})"))
        for i, (layout, rows) in enumerate(self.table.groupby("layout", sort=False)):
            color = f"hsl({(i * 137) % 360},60%,45%)"
            fig.add_trace(go.Scatter(x=rows.world, y=rows.peak / pdiv, name=layout, mode="lines+markers",
                                     line_color=color, legendgroup=layout), row=1, col=1)
            fig.add_trace(go.Scatter(x=rows.world, y=rows.sent_bytes_per_rank / sdiv, name=layout, mode="lines+markers",
                                     line_color=color, legendgroup=layout, showlegend=False), row=1, col=2)
        if on_scale:
            fig.add_hline(y=limit / pdiv, line_dash="dash", annotation_text=self.mesh.limit_text, row=1, col=1)
        fig.update_xaxes(type="log", title_text="world size", dtick=0.30103)
        fig.update_layout(height=420, legend_orientation="h", title=display.training_text(self.training))
        return fig

    def _metric_figure(self, y: str):
        import plotly.graph_objects as go

        if y not in STEP_METRICS:
            raise ValueError(f"Sweep.figure: y={y!r}: expected one of {list(STEP_METRICS)}")
        fig = go.Figure()
        for i, (layout, rows) in enumerate(self.table.groupby("layout", sort=False)):
            values = [None if v is None else float(v) * STEP_METRICS[y][1] for v in rows[y]]
            fig.add_trace(go.Scatter(x=rows.world, y=values, name=layout, mode="lines+markers",
                                     line_color=f"hsl({(i * 137) % 360},60%,45%)"))
        fig.update_xaxes(type="log", title_text="world size", dtick=0.30103)
        fig.update_layout(height=420, legend_orientation="h", yaxis_title=STEP_METRICS[y][0],
                          title=display.training_text(self.training))
        return fig

    def __repr__(self) -> str:
        return f"<shardviz.Sweep {self.table.layout.nunique()} layouts x {self.table.world.nunique()} world sizes>"


def sweep(model, plans, world_sizes=(8, 16, 32, 64, 128, 256, 512), *, replicate: int = 1,
          mesh: Mesh | None = None, training=None, tensor: int = 1) -> Sweep:
    """Analyse every plan at every world size (``shard = world // (replicate x tensor)``; ``tensor``:
    the tensor-parallel degree, a plan's ``tensor_parallel`` then applied on it).

    ``mesh`` (optional) supplies device memory, ranks per node and bandwidths for every point.
    Without ``training``: ``display.DEFAULT_TRAINING``.
    """
    tree = as_tree(model)
    base = mesh or Mesh(1)
    training = DEFAULT_TRAINING if training is None else training
    rows = []
    for name, plan in _named_plans(plans).items():
        for world in world_sizes:
            if world % (replicate * tensor):
                raise ValueError(f"world size {world} is not a multiple of replicate={replicate} x tensor={tensor}")
            point = replace(base, shard=world // (replicate * tensor), replicate=replicate, tensor=tensor)
            rows.append({"layout": name, "world": world, **({"tensor": tensor} if tensor > 1 else {}),
                         **summarize(analyze(tree, plan, point, training, strict=False))})
    return Sweep(pd.DataFrame(rows), base, training)
