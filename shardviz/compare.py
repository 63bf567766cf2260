"""Layouts side by side (``compare``) and against world size (``sweep``).

Every number is read from ``analyze`` (one analysis per layout and mesh, on one cached tree),
so a comparison can never disagree with the analyses it is made of.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping, Sequence

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

    def figure(self):
        """Stacked memory per rank by category, and bytes per step, one bar per layout."""
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        t = self.table
        fig = make_subplots(rows=1, cols=2, subplot_titles=("Memory on the busiest rank (GiB)", "Traffic per step (GiB)"))
        names = list(t.index)
        for part in MEMORY_PARTS:
            fig.add_trace(go.Bar(name=part, x=names, y=t[part] / 2**30), row=1, col=1)
        fig.add_trace(go.Bar(name="peak (transient included)", x=names, y=(t["peak"] - t[list(MEMORY_PARTS)].sum(axis=1)) / 2**30,
                             marker_pattern_shape="/"), row=1, col=1)
        fig.add_trace(go.Bar(name="bytes per step", x=names, y=t["bytes_per_step"] / 2**30, showlegend=True), row=1, col=2)
        limit = next(iter(self.analyses.values())).mesh.device_memory
        if limit:
            fig.add_hline(y=limit / 2**30, line_dash="dash", annotation_text="device memory", row=1, col=1)
        fig.update_layout(barmode="stack", height=420, legend_orientation="h")
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

    def figure(self):
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        fig = make_subplots(rows=1, cols=2, subplot_titles=("Peak memory per rank (GiB)", "Bytes sent per rank per step (GiB)"))
        for i, (layout, rows) in enumerate(self.table.groupby("layout", sort=False)):
            color = f"hsl({(i * 137) % 360},60%,45%)"
            fig.add_trace(go.Scatter(x=rows.world, y=rows.peak / 2**30, name=layout, mode="lines+markers",
                                     line_color=color, legendgroup=layout), row=1, col=1)
            fig.add_trace(go.Scatter(x=rows.world, y=rows.sent_bytes_per_rank / 2**30, name=layout, mode="lines+markers",
                                     line_color=color, legendgroup=layout, showlegend=False), row=1, col=2)
        if self.device_memory:
            fig.add_hline(y=self.device_memory / 2**30, line_dash="dash", annotation_text="device memory", row=1, col=1)
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
