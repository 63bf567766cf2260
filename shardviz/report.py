"""A standalone HTML report: one file, every script inlined, no network request when opened.

The charts are the Inspector's own (``widget/charts.js`` drawing ``widget/views.py``'s payloads:
the same data drawn the same way, light or dark after the reader's system), then the findings,
the tables and the exported code, all read from one ``Analysis`` (and ``compare`` for the
layouts side by side).
"""

from __future__ import annotations

import html
import json
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from .analysis import Analysis, analyze
from .highlight import python_html
from .cost import format_bytes
from .fsdp import Mesh

WIDGET = Path(__file__).parent / "widget"

_CSS = """
:root { color-scheme: light dark; --fg:#1f2328; --bg:#fff; --muted:#59636e; --line:#d1d9e0; --err:#cf222e; --warn:#9a6700; --info:#0969da;
  --jp-layout-color0:#fff; --jp-layout-color1:#fff; --jp-layout-color2:#eee; --jp-ui-font-color0:#000; --jp-ui-font-color1:rgba(0,0,0,.87);
  --jp-ui-font-color2:rgba(0,0,0,.54); --jp-border-color1:#bdbdbd; --jp-border-color2:#e0e0e0; }
@media (prefers-color-scheme: dark) { :root { --fg:#e6edf3; --bg:#0d1117; --muted:#9198a1; --line:#3d444d; --err:#ff7b72; --warn:#d29922; --info:#58a6ff;
  --jp-layout-color0:#0d1117; --jp-layout-color1:#161b22; --jp-layout-color2:#21262d; --jp-ui-font-color0:#fff; --jp-ui-font-color1:rgba(255,255,255,.87);
  --jp-ui-font-color2:rgba(255,255,255,.6); --jp-border-color1:#3d444d; --jp-border-color2:#30363d; } }
body { font: 14px/1.45 system-ui, sans-serif; color: var(--fg); background: var(--bg); margin: 2rem auto; max-width: 1200px; padding: 0 1rem; }
h1 { margin-bottom: .2rem } .sub { color: var(--muted) }
.scroll { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; margin: .5rem 0 1.5rem; font-size: 13px; }
th, td { border-bottom: 1px solid var(--line); padding: .25rem .6rem; text-align: right; }
th:first-child, td:first-child { text-align: left; overflow-wrap: anywhere; }
.finding { border-left: 4px solid var(--info); padding: .3rem .8rem; margin: .5rem 0; }
.finding.error { border-color: var(--err) } .finding.warning { border-color: var(--warn) }
.code { font-weight: 600 } .fix { color: var(--muted) }
pre { overflow-x: auto; padding: 1rem; border: 1px solid var(--line); border-radius: 6px; font-size: 12px; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(420px, 1fr)); gap: 1.5rem; margin: 1rem 0; }
.note { color: var(--muted); font-size: 12px; }
"""

_DRAW = """
for (const el of document.querySelectorAll(".sv-report-chart")) {
  const data = JSON.parse(el.querySelector("script").textContent);
  const box = h("div", {});
  el.append(box);
  drawChart(box, el.dataset.kind, data, el.dataset.title || undefined);
}
"""


# The memory columns the report shows (activations once the cost model gives them for a batch size).


# The memory columns the report shows (activations once the cost model gives them for a batch size).
MEMORY_COLUMNS = ("rank", "params", "grads", "optimizer", "activations", "peak", "peak_phase", "peak_unit")


def _table(df: pd.DataFrame, byte_columns=()) -> str:
    shown = df.copy()
    for col in byte_columns:
        if col in shown:
            shown[col] = shown[col].map(format_bytes)
    shown = shown.astype(object).where(pd.notna(shown), "–")
    return '<div class="scroll">' + shown.to_html(index=False, border=0, escape=True, na_rep="–") + "</div>"


def _highlight(code: str) -> str:
    # the Inspector's highlighter and CSS classes (inspector.css is inlined below)
    return f'<pre class="sv-code"><code>{python_html(code)}</code></pre>'


def short_names(names) -> list[str]:
    """Call names for tables and charts: the prefix every call shares dropped, the end kept, and
    "(outside FSDP)" for the collectives FSDP does not issue (``views.short_labels``)."""
    from .widget.views import short_labels

    return short_labels(names, width=60)


def _chart(kind: str, payload: dict, title: str | None = None) -> str:
    data = json.dumps(payload, default=str).replace("</", "<\\/")
    t = f' data-title="{html.escape(title)}"' if title else ""
    return (f'<div class="sv-inspector sv-embedded sv-report-chart" data-kind="{kind}"{t}>'
            f'<script type="application/json">{data}</script></div>')


def memory_figure(a: Analysis):
    """The memory chart as a plotly figure (the Inspector's payload: ranks with the same numbers share a bar)."""
    from .widget import views

    return views.memory_figure(views.memory_payload(a))


def comm_figure(a: Analysis):
    """The traffic chart as a plotly figure (the Inspector's payload)."""
    from .widget import views

    return views.traffic_figure(views.traffic_payload(a))


def render_report(model, plan, mesh: Mesh | None = None, training=None, *, torch_version=None,
                  title: str | None = None, compare_with: dict | None = None) -> str:
    """The whole report as one HTML string (see ``write_report`` for a file).

    ``model``: an nn.Module or a ``ModelTree``; it is walked once and every section reads that tree."""
    from .codegen import export_code
    from .widget import views

    mesh = mesh or Mesh(8)
    a = analyze(model, plan, mesh, training, strict=False, torch_version=torch_version)
    title = title or f"shardviz report: {a.tree.root_type}"
    charts = [_chart("memory", views.memory_payload(a)), _chart("traffic", views.traffic_payload(a))]
    comparison_html = ""
    if compare_with:
        from .compare import compare

        c = compare(a.tree, compare_with, mesh=mesh, training=training)
        charts.append(_chart("memory", c.memory_payload(), "Memory on the busiest rank, by layout"))
        comparison_html = "<h2>Layouts compared</h2>" + _table(c.formatted.reset_index())
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
    comm = a.comm[["unit", "collective", "phase", "count", "bytes", "sent_bytes"]].copy()
    comm["unit"] = short_names(comm["unit"].tolist())
    units = a.units.drop(columns=["modules"])
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    training_text = _training_text(a.training)
    script = (WIDGET / "charts.js").read_text() + _DRAW
    css = _CSS + (WIDGET / "inspector.css").read_text()
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; font-src data:">
<title>{html.escape(title)}</title><style>{css}</style></head><body>
<h1>{html.escape(title)}</h1>
<p class="sub">{html.escape(a.summary())}. Plan: {html.escape(a.plan.name or "custom")}. Training: {html.escape(training_text)}. Generated {stamp}.</p>
<h2>Findings</h2>{finding_html}
<h2>Memory and traffic</h2><div class="charts">{"".join(charts)}</div>
<h3>Memory per rank (worst ranks first)</h3>
{_table(mem.sort_values("peak", ascending=False).head(16)[[c for c in MEMORY_COLUMNS if c in mem.columns]],
        byte_columns=("params", "grads", "optimizer", "activations", "peak"))}
<h3>Collectives per step</h3>
<p class="note">Calls named without the prefix they all share; "(outside FSDP)": the all-reduce the exported code issues for parameters FSDP leaves alone.</p>
{_table(comm, byte_columns=("bytes", "sent_bytes"))}
{comparison_html}
<h2>fully_shard calls (bottom-up)</h2>
{_table(units, byte_columns=("unsharded_bytes", "padded_unsharded_bytes", "padded_shard_bytes"))}
<h2>Exported code</h2>{code_html}
<h2>Parameters</h2>
{_table(a.params[["fqn", "shape", "dtype", "role", "status", "unit", "shard_shape", "shard_bytes"]], byte_columns=("shard_bytes",))}
<script>{script}</script>
</body></html>
"""


def _training_text(tr) -> str:
    from .widget.views import training_text

    return training_text(tr)


def write_report(path, model, plan, mesh: Mesh | None = None, training=None, **kwargs) -> str:
    """Render the report and write it atomically to ``path``; returns the path."""
    from .files import write_text_atomic

    write_text_atomic(path, render_report(model, plan, mesh, training, **kwargs))
    return str(path)
