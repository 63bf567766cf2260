"""A standalone HTML report: one file, every script inlined, no network request when opened.

Tables, plotly charts (plotly.js embedded once), the findings and the exported code, all read
from one ``Analysis`` (and ``compare`` for the layouts side by side).
"""

from __future__ import annotations

import html
from datetime import datetime, timezone

import pandas as pd

from .analysis import Analysis, analyze
from .cost import format_bytes
from .fsdp import Mesh

_CSS = """
:root { color-scheme: light dark; --fg:#1f2328; --bg:#fff; --muted:#59636e; --line:#d1d9e0; --err:#cf222e; --warn:#9a6700; --info:#0969da; }
@media (prefers-color-scheme: dark) { :root { --fg:#e6edf3; --bg:#0d1117; --muted:#9198a1; --line:#3d444d; --err:#ff7b72; --warn:#d29922; --info:#58a6ff; } }
body { font: 14px/1.45 system-ui, sans-serif; color: var(--fg); background: var(--bg); margin: 2rem auto; max-width: 1200px; padding: 0 1rem; }
h1 { margin-bottom: .2rem } .sub { color: var(--muted) }
table { border-collapse: collapse; margin: .5rem 0 1.5rem; font-size: 13px; }
th, td { border-bottom: 1px solid var(--line); padding: .25rem .6rem; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.finding { border-left: 4px solid var(--info); padding: .3rem .8rem; margin: .5rem 0; }
.finding.error { border-color: var(--err) } .finding.warning { border-color: var(--warn) }
.code { font-weight: 600 } .fix { color: var(--muted) }
pre { overflow-x: auto; padding: 1rem; border: 1px solid var(--line); border-radius: 6px; font-size: 12px; }
.chart { margin: 1rem 0 }
"""


# The memory columns the report shows (activations once the cost model gives them for a batch size).
MEMORY_COLUMNS = ("rank", "params", "grads", "optimizer", "activations", "peak", "peak_phase")


def _table(df: pd.DataFrame, byte_columns=()) -> str:
    shown = df.copy()
    for col in byte_columns:
        if col in shown:
            shown[col] = shown[col].map(format_bytes)
    return shown.to_html(index=False, border=0, escape=True)


def _highlight(code: str) -> str:
    try:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import PythonLexer

        return highlight(code, PythonLexer(), HtmlFormatter(noclasses=True, nowrap=False))
    except ImportError:  # pygments comes with IPython; plain text is fine without it
        return f"<pre>{html.escape(code)}</pre>"


def _scale(max_bytes: float) -> tuple[float, str]:
    """A unit that keeps the largest bar readable."""
    for div, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if max_bytes >= div:
            return div, name
    return 1, "B"


def short_names(names) -> list[str]:
    """Drop the module prefix every call shares (``base_model.model.``), keep the rest."""
    import os

    names = [n if n is not None else "(outside FSDP)" for n in names]
    modules = [m for n in names for m in n.strip("[]").split(", ") if "." in m]
    prefix = os.path.commonprefix(modules) if len(modules) > 1 else ""
    prefix = prefix[: prefix.rfind(".") + 1]
    return [n.replace(prefix, "") if prefix else n for n in names]


def memory_figure(a: Analysis):
    """Stacked memory per rank by category against the device limit (one bar per distinct rank profile)."""
    import plotly.graph_objects as go

    mem = a.memory
    parts = ["params_sharded", "params_whole", "buffers", "grads", "optimizer"]
    shown = mem.drop_duplicates(subset=parts + ["peak"]) if len(mem) > 64 else mem
    ranks = [f"rank {r}" for r in shown["rank"]]
    limit = a.mesh.device_memory
    div, unit = _scale(float(shown["peak"].max()))
    fig = go.Figure()
    for part in parts:
        fig.add_bar(name=part.replace("_", " "), x=ranks, y=shown[part] / div)
    transient = shown["peak"] - shown[parts].sum(axis=1)
    fig.add_bar(name="transient at peak", x=ranks, y=transient / div, marker_pattern_shape="/")
    title = f"Memory per rank ({unit})"
    if limit and limit <= 3 * shown["peak"].max():
        fig.add_hline(y=limit / div, line_dash="dash", annotation_text="device memory")
    elif limit:
        title += f"; device memory {format_bytes(limit)} is off the scale"
    fig.update_layout(barmode="stack", title=title, height=380, legend_orientation="h")
    return fig


def comm_figure(a: Analysis):
    """Bytes per step by call, one bar segment per collective."""
    import plotly.graph_objects as go

    comm = a.comm.copy()
    comm["total"] = comm["bytes"] * comm["count"]
    comm["unit"] = short_names(comm["unit"].tolist())
    per = comm.groupby(["unit", "collective"], sort=False)["total"].sum().unstack(fill_value=0)
    div, unit = _scale(float(per.to_numpy().sum(axis=1).max()) if len(per) else 0.0)
    fig = go.Figure()
    for kind in per.columns:
        fig.add_bar(name=kind, x=list(per.index), y=per[kind] / div)
    fig.update_layout(barmode="stack", title=f"Traffic per step by call ({unit})", height=380, legend_orientation="h")
    return fig


def render_report(model, plan, mesh: Mesh | None = None, training=None, *, torch_version=None,
                  title: str | None = None, compare_with: dict | None = None) -> str:
    """The whole report as one HTML string (see ``write_report`` for a file).

    ``model``: an nn.Module or a ``ModelTree``; it is walked once and every section reads that tree."""
    import plotly.io as pio

    from .codegen import export_code

    mesh = mesh or Mesh(8)
    a = analyze(model, plan, mesh, training, strict=False, torch_version=torch_version)
    title = title or f"shardviz report: {a.tree.root_type}"
    figures = [memory_figure(a), comm_figure(a)]
    comparison_html = ""
    if compare_with:
        from .compare import compare

        c = compare(a.tree, compare_with, mesh=mesh, training=training)
        figures.append(c.figure())
        table = c.table.reset_index()
        comparison_html = "<h2>Layouts compared</h2>" + _table(
            table, byte_columns=("params", "grads", "optimizer", "peak", "bytes_per_step", "sent_bytes_per_rank"))
    charts = "".join(
        f'<div class="chart">{pio.to_html(fig, full_html=False, include_plotlyjs=(i == 0), config={"displaylogo": False})}</div>'
        for i, fig in enumerate(figures)
    )
    findings = a.findings
    finding_html = "".join(
        f'<div class="finding {f.severity}"><span class="code">{html.escape(f.severity)} {html.escape(f.code)}</span> '
        f"{html.escape(f.message)}<div class=\"fix\">Fix: {html.escape(f.fix)}</div></div>"
        for f in findings
    ) or "<p>No findings.</p>"
    try:
        code = export_code(a.tree, plan, mesh=mesh, training=training, torch_version=torch_version)
        code_html = _highlight(code)
    except ValueError as exc:  # a plan torch refuses has no code to export
        code_html = f"<p>No code: {html.escape(str(exc))}</p>"
    mem = a.memory
    comm = a.comm
    units = a.units.drop(columns=["modules"])
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'; img-src data:; font-src data:">
<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>
<h1>{html.escape(title)}</h1>
<p class="sub">{html.escape(a.summary())}. Plan: {html.escape(a.plan.name or "custom")}. Generated {stamp}.</p>
<h2>Findings</h2>{finding_html}
<h2>Memory and traffic</h2>{charts}
<h3>Memory per rank (worst ranks first)</h3>
{_table(mem.sort_values("peak", ascending=False).head(16)[[c for c in MEMORY_COLUMNS if c in mem.columns]],
        byte_columns=("params", "grads", "optimizer", "activations", "peak"))}
<h3>Collectives per step</h3>
{_table(comm[["unit", "collective", "phase", "count", "bytes", "sent_bytes"]], byte_columns=("bytes", "sent_bytes"))}
{comparison_html}
<h2>fully_shard calls (bottom-up)</h2>
{_table(units, byte_columns=("unsharded_bytes", "padded_unsharded_bytes", "padded_shard_bytes"))}
<h2>Exported code</h2>{code_html}
<h2>Parameters</h2>
{_table(a.params[["fqn", "shape", "dtype", "role", "status", "unit", "shard_shape", "shard_bytes"]], byte_columns=("shard_bytes",))}
</body></html>
"""


def write_report(path, model, plan, mesh: Mesh | None = None, training=None, **kwargs) -> str:
    """Render the report and write it atomically to ``path``; returns the path."""
    from .files import write_text_atomic

    write_text_atomic(path, render_report(model, plan, mesh, training, **kwargs))
    return str(path)
