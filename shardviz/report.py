"""A standalone HTML report: one file, every script inlined, no network request when opened.

The charts are the Inspector's own (``widget/charts.js`` drawing ``display.py``'s payloads:
the same data drawn the same way, light or dark after the reader's system), then the findings,
the tables and the exported code, all read from one ``Analysis`` (and ``compare`` for the
layouts side by side). Tables read like the notebook's ``sv.fmt``: human headers
(``format.COLUMNS``), numbers with units, call and parameter names without the prefix they
share (the full name on hover); long tables and long code open on demand (``<details>``).
"""

from __future__ import annotations

import html
import json
import re
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from .views import display
from .analysis import analyze
from .finding import TITLES
from .format import COLUMNS, column_kind, format_bytes, format_count, format_value
from .views.highlight import python_html
from .run.mesh import Mesh

WIDGET = Path(__file__).parent / "widget"
#: A table longer than this, or code longer than ``FOLD_CODE_LINES``, opens on demand.
FOLD_ROWS = 30
FOLD_CODE_LINES = 120
MEMORY_ROWS_SHOWN = 16

_CSS = """
:root { color-scheme: light dark; --fg:#1f2328; --bg:#fff; --muted:#59636e; --line:#d1d9e0; --err:#cf222e; --warn:#9a6700; --info:#0969da;
  --jp-layout-color0:#fff; --jp-layout-color1:#fff; --jp-layout-color2:#eee; --jp-ui-font-color0:#000; --jp-ui-font-color1:rgba(0,0,0,.87);
  --jp-ui-font-color2:rgba(0,0,0,.54); --jp-border-color1:#bdbdbd; --jp-border-color2:#e0e0e0; }
@media (prefers-color-scheme: dark) { :root { --fg:#e6edf3; --bg:#0d1117; --muted:#9198a1; --line:#3d444d; --err:#ff7b72; --warn:#d29922; --info:#58a6ff;
  --jp-layout-color0:#0d1117; --jp-layout-color1:#161b22; --jp-layout-color2:#21262d; --jp-ui-font-color0:#fff; --jp-ui-font-color1:rgba(255,255,255,.87);
  --jp-ui-font-color2:rgba(255,255,255,.6); --jp-border-color1:#3d444d; --jp-border-color2:#30363d; } }
body { font: 14px/1.45 system-ui, sans-serif; color: var(--fg); background: var(--bg); margin: 2rem auto; max-width: 1200px; padding: 0 1rem; }
h1 { margin-bottom: .2rem } .sub, .step { color: var(--muted) }
.scroll { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; margin: .5rem 0 1.5rem; font-size: 13px; }
th, td { border-bottom: 1px solid var(--line); padding: .25rem .6rem; text-align: right; vertical-align: top;
  white-space: nowrap; overflow-wrap: normal; word-break: normal; }
th { white-space: normal; font-weight: 600; }
th:first-child, td:first-child, td.name, th.row { text-align: left; }
td.name { white-space: normal; }
details { margin: .5rem 0 1rem; } summary { cursor: pointer; color: var(--info); }
details details { margin: .2rem 0 .2rem 1rem; } details details summary { color: var(--fg); }
.finding { border-left: 4px solid var(--info); padding: .3rem .8rem; margin: .5rem 0; }
.finding.error { border-color: var(--err) } .finding.warning { border-color: var(--warn) }
.code { font-weight: 600 } .fix { color: var(--muted) }
pre { overflow-x: auto; max-width: 100%; box-sizing: border-box; padding: 1rem; border: 1px solid var(--line); border-radius: 6px; font-size: 12px; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(420px, 1fr)); gap: 1.5rem; margin: 1rem 0; }
.note { color: var(--muted); font-size: 12px; }
.verdict { font-size: 16px; font-weight: 600; padding: .4rem .8rem; border-left: 4px solid var(--info); margin: .6rem 0; }
.verdict.fits { border-color: #1a7f37 } .verdict.over { border-color: var(--err) } .verdict.tight { border-color: #b8860b }
th.own, td.own { background: color-mix(in srgb, var(--info) 12%, transparent); }
.card { border: 1px solid var(--line); border-radius: 6px; padding: .2rem .8rem .6rem; margin: .6rem 0; }
.card-bar { height: 10px; background: var(--line); border-radius: 5px; overflow: hidden; margin: .3rem 0; }
.card-fill { height: 100%; background: #1a7f37; } .card-fill.tight { background: #b8860b } .card-fill.over { background: var(--err) }
.card-bar-text, .card-figures { margin: .2rem 0; } .card-finding { margin: .3rem 0; }
.copy { font: inherit; font-size: 12px; padding: .15rem .6rem; margin: 0 0 .4rem; cursor: pointer; border: 1px solid var(--line);
  border-radius: 4px; background: var(--bg); color: var(--fg); }
"""

_DRAW = """
for (const el of document.querySelectorAll(".sv-report-chart")) {
  const data = JSON.parse(el.querySelector("script").textContent);
  const box = h("div", {});
  el.append(box);
  drawChart(box, el.dataset.kind, data, el.dataset.title || undefined);
}
for (const button of document.querySelectorAll("button.copy")) {
  button.addEventListener("click", async () => {
    const text = JSON.parse(document.getElementById(button.dataset.source).textContent);
    try { await navigator.clipboard.writeText(text); }
    catch (e) {  // no clipboard API (an old browser, a file:// page that is not a secure context)
      const area = Object.assign(document.createElement("textarea"), {value: text});
      document.body.append(area); area.select(); document.execCommand("copy"); area.remove();
    }
    button.textContent = "Copied";
    setTimeout(() => { button.textContent = "Copy code"; }, 1500);
  });
}
"""

# The memory columns the report shows, one row per group of ranks with the same numbers.
MEMORY_COLUMNS = ("params", "grads", "optimizer", "activations", "peak")
COMM_COLUMNS = ("unit", "collective", "phase", "count", "bytes", "sent_bytes")
PARAM_COLUMNS = ("fqn", "shape", "dtype", "role", "status", "shard_shape", "shard_bytes")


def _esc(x) -> str:
    return html.escape(str(x))


def _breakable(name: str) -> str:
    """A dotted name that may wrap after its dots, never inside a part."""
    return "<wbr>".join(_esc(part) for part in re.split(r"(?<=\.)", name))


def _header(col, headers: dict) -> str:
    return headers.get(col) or COLUMNS.get(col, (col,))[0]


def html_table(df: pd.DataFrame, headers: dict | None = None) -> str:
    """A shardviz table as HTML: human headers, every value written by ``format.format_value``;
    call and parameter names shortened (``display.short_labels``) with the full name on hover."""
    headers = headers or {}
    columns = []
    for col in df.columns:
        kind = column_kind(df, col)
        values = df[col].tolist()
        if kind == "name":
            full = [display.OUTSIDE_FSDP if v is None or (isinstance(v, float) and v != v) else str(v) for v in values]
            short = display.short_labels(full, width=60)
            columns.append([f'<td class="name" title="{_esc(f)}">{_breakable(t)}</td>' for f, t in zip(full, short)])
        else:
            columns.append([f"<td>{_esc(format_value(kind, v))}</td>" for v in values])
    head = "".join(f"<th>{_esc(_header(c, headers))}</th>" for c in df.columns)
    body = "".join(f"<tr>{''.join(cells)}</tr>" for cells in zip(*columns)) if columns else ""
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _folded(summary: str, inner: str, open_: bool = False) -> str:
    return f"<details{' open' if open_ else ''}><summary>{summary}</summary>{inner}</details>"


def _table_or_fold(df: pd.DataFrame, what: str, headers: dict | None = None) -> str:
    """The table itself when short; folded behind "N rows of <what>" when longer than ``FOLD_ROWS``."""
    table = html_table(df, headers)
    if len(df) <= FOLD_ROWS:
        return table
    return _folded(f"{_esc(format_count(len(df)))} {_esc(what)}", table)


def _peak_at(bar: dict, calls: list[str]) -> str:
    """"backward of layers.3": the phase of the peak and the call (or module) running then, named
    without the prefix the model's calls share."""
    where = bar["unit"] or bar["module"]
    if not where:
        return bar["phase"] or "–"
    return f"{bar['phase']} of {display.short_labels([*calls, where], width=40)[-1]}"


def memory_section(a, payload: dict) -> str:
    """One row per group of ranks with the same numbers (the chart's bars), worst first."""
    mem = a.memory.set_index("rank")
    bars = sorted(payload.get("bars", []), key=lambda b: -b["peak"])
    rows = pd.DataFrame([{"ranks": b["label"], **{c: mem.at[b["first"], c] for c in MEMORY_COLUMNS if c in mem.columns},
                          "peak_at": _peak_at(b, a.units["unit"].tolist())} for b in bars])
    headers = {"ranks": "ranks", "peak_at": "peak in"}
    shown = html_table(rows.head(MEMORY_ROWS_SHOWN), headers)
    if len(rows) > MEMORY_ROWS_SHOWN:
        shown += _folded(f"all {format_count(len(rows))} groups of ranks (open)", html_table(rows, headers))
    profile = a.activation_profile  # what the measured step assumed: attention, use_cache, ... (issue 24)
    notes = "".join(f'<p class="note">{_esc(n)}</p>' for n in (profile.assumptions if profile is not None else ()))
    return "<h3>Memory per rank (worst ranks first; ranks with the same numbers share a row)</h3>" + shown + notes


def traffic_section(a, traffic: dict) -> str:
    """Totals by collective, then every collective of every call (folded when long)."""
    by_coll = pd.DataFrame(traffic.get("by_collective", []), columns=["collective", "count", "bytes", "sent"])
    by_coll = by_coll.rename(columns={"sent": "sent_bytes"})
    # one name per number: the total is "moved per step" here as in the layouts compared (format.COLUMNS)
    totals = html_table(by_coll, {"count": "calls per step", "bytes": COLUMNS["bytes_per_step"][0],
                                  "sent_bytes": COLUMNS["sent_bytes_per_rank"][0]})
    comm = a.comm[list(COMM_COLUMNS)]
    note = ('<p class="note">Calls named without the prefix they all share (hover for the full name); "(outside FSDP)": '
            "the all-reduce the exported code issues for parameters FSDP leaves alone.</p>")
    return ("<h3>Collectives per step</h3>" + totals + note
            + _table_or_fold(comm, "collectives, one row per call and phase (open)"))


def comparison_section(c, own: str | None = None) -> str:
    """The layouts side by side: one row per measure, one column per layout (fits any width); the
    column ``own`` (the report's own plan) marked."""
    table = c.table
    mark = [' class="own"' if name == own else "" for name in table.index]
    head = "<th></th>" + "".join(f"<th{m}>{_esc(name)}{' (this report)' if m else ''}</th>" for name, m in zip(table.index, mark))
    rows = []
    for col in table.columns:
        kind = column_kind(table, col)
        cells = "".join(f"<td{m}>{_esc(format_value(kind, v))}</td>" for v, m in zip(table[col], mark))
        rows.append(f'<tr><th class="row">{_esc(_header(col, {}))}</th>{cells}</tr>')
    mine = " The column marked (this report) is this report's own plan." if own is not None else ""
    note = f'<p class="note">Each layout\'s busiest rank; training: {_esc(display.training_text(c.training))}.{mine}</p>'
    return (f"<h2>Layouts compared</h2>{note}<div class=\"scroll\"><table><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table></div>")


def time_section(a) -> str:
    """Seconds per call of the step (``a.time``) and what they rest on; nothing without a step time."""
    if a.step.step_time_s is None:
        return ""
    notes = "".join(f'<p class="note">{_esc(n)}</p>' for n in a.step_time.assumptions)
    return ("<h2>Step time by call</h2>" + f'<p class="note">{_esc(display.step_text(a.step))}</p>' + notes
            + _table_or_fold(a.time, "calls timed (open)"))


def units_section(a) -> str:
    units = a.units.drop(columns=["modules"])
    return "<h2>fully_shard calls (bottom-up)</h2>" + _table_or_fold(units, "fully_shard calls (open)")


def _param_groups(a):
    """(summary, parameters) per call in the units' order, then the ignored and unmanaged ones."""
    params = a.params[list(PARAM_COLUMNS) + ["unit"]]
    names = display.short_labels(a.units["unit"].tolist(), width=60)
    for row, name in zip(a.units.itertuples(index=False), names):
        rows = params[params["unit"] == row.unit]
        yield (f"{_esc(name)}: {format_count(row.n_params)} parameters, shard per rank "
               f"{_esc(format_value('bytes', row.padded_shard_bytes))} (padded)", rows)
    for status in ("ignored", "unmanaged"):
        rows = params[params["status"] == status]
        if len(rows):
            yield f"{status}: {format_count(len(rows))} parameters, whole on every rank", rows


def params_section(a) -> str:
    """Every parameter, grouped by the call that owns it; each group opens on demand."""
    groups = "".join(_folded(summary, html_table(rows.drop(columns=["unit"]), {"fqn": "parameter"}))
                     for summary, rows in _param_groups(a))
    counts = a.params["status"].value_counts()
    summary = (f"{format_count(len(a.params))} parameters: "
               + ", ".join(f"{format_count(counts.get(s, 0))} {s}" for s in ("sharded", "ignored", "unmanaged"))
               + " (open, then a call)")
    return "<h2>Parameters, by fully_shard call</h2>" + _folded(summary, groups)


def code_section(a, plan, mesh, training, torch_version) -> str:
    from .export.codegen import export_code

    try:
        code = export_code(a.tree, plan, mesh=mesh, training=training, torch_version=torch_version)
    except ValueError as exc:  # a plan torch refuses has no code to export
        return f"<h2>Exported code</h2><p>No code: {_esc(exc)}</p>"
    n = len(code.splitlines())
    body = _highlight(code)
    if n > FOLD_CODE_LINES:
        body = _folded(f"apply_fsdp: {format_count(n)} lines (open)", body)
    data = json.dumps(code).replace("</", "<\\/")  # JSON: the code back exactly, whatever it holds
    source = f'<script type="application/json" id="sv-code-text">{data}</script>'
    button = '<button class="copy" type="button" data-source="sv-code-text">Copy code</button>'
    return "<h2>Exported code</h2>" + button + body + source


def findings_section(findings) -> str:
    return "<h2>Findings</h2>" + ("".join(
        f'<div class="finding {f.severity}"><span class="code">{_esc(f.severity)} {_esc(f.code)}</span> '
        f'<span class="title">({_esc(TITLES.get(f.code, ""))})</span> '
        f"{_esc(f.message)}" + (f"<div class=\"fix\">Fix: {_esc(f.fix)}</div>" if f.fix else "") + "</div>"
        for f in findings
    ) or "<p>No findings.</p>")


def codes_section(body: str) -> str:
    """Every finding code the report shows (in the findings, the layouts compared), with its title
    (``finding.TITLES``): no code left unexplained."""
    codes = sorted(set(re.findall(r"\bSV\d{3}\b", body)))
    if not codes:
        return ""
    items = "".join(f"<li><b>{_esc(c)}</b>: {_esc(TITLES.get(c, 'no title: report it'))}</li>" for c in codes)
    return f"<h2>Finding codes</h2><ul class=\"codes\">{items}</ul>"


def verdict_section(a, findings=None) -> str:
    """The answer first, as the Inspector's header card (``display.header_card``, the same dict): the
    verdict in words and colour, one bar of the judged peak against the usable memory with the
    margin, step time, tokens/s, MFU, and the top finding; then the mesh and device."""
    card = display.header_card(a, findings)
    kind = card["verdict"] or ""  # fits | tight | over: the colour of the one verdict
    use = card["use"]
    bar = ""
    if use is not None and use["usable"]:
        share = min(1.0, use["judged"] / use["usable"])
        bar = (f'<div class="card-bar" title="{_esc(use["text"])}"><div class="card-fill {kind}" '
               f'style="width:{100 * share:.1f}%"></div></div>'
               f'<p class="card-bar-text">{_esc(use["judged_name"])} {_esc(format_bytes(use["judged"]))} of '
               f'{_esc(use["limit_text"])} · {_esc(use["spare_text"])}</p>')
    figures = " · ".join(x for x in (f"step {card['step_text']}" if card["step_time_s"] is not None else
                                     f"step time: {card['untimed']}", card["tokens_text"], card["mfu_text"]) if x)
    top = card["finding"]
    finding = "<p class=\"card-finding\">No findings.</p>" if findings is not None and top is None else ""
    if top is not None:
        # its first clause, as the Inspector's card shows it; the whole message on hover and in the findings below
        finding = (f'<p class="card-finding {top["severity"]}" title="{_esc(top["message"])}"><b>{_esc(top["code"])}</b> '
                   f'({_esc(top["title"])}): {_esc(top["headline"])}'
                   + (f" <i>Fix: {_esc(top['fix'])}</i>" if top["fix"] and not top["headline_is_fix"] else "") + "</p>")
    device = a.mesh.device.name if a.mesh.device is not None else "no device named (--device)"
    word, text = card["verdict_word"], card["verdict_text"]
    rest = text[len(word):] if text.startswith(word) else f": {text}"  # the headline starts with its word: bold once
    return (f'<div class="card"><p class="verdict {kind}"><b class="word">{_esc(word)}</b>'
            f'{_esc(rest)}</p>{bar}<p class="card-figures">{_esc(figures)}</p>{finding}</div>'
            f'<p class="step">{_esc(a.mesh)} of {_esc(device)}; {_esc(display.step_text(a.step))}</p>')


def _highlight(code: str) -> str:
    # the Inspector's highlighter and CSS classes (inspector.css is inlined below)
    return f'<pre class="sv-code"><code>{python_html(code)}</code></pre>'


def _chart(kind: str, payload: dict, title: str | None = None) -> str:
    data = json.dumps(payload, default=str).replace("</", "<\\/")
    t = f' data-title="{html.escape(title)}"' if title else ""
    return (f'<div class="sv-inspector sv-embedded sv-report-chart" data-kind="{kind}"{t}>'
            f'<script type="application/json">{data}</script></div>')


def _training_line(training, plan=None) -> str:
    text = display.training_text(training, plan)
    if training == display.DEFAULT_TRAINING:
        text += " (shardviz's default, as in the Inspector and sv.compare)"
    return text


def _own_layout(plan, compare_with: dict) -> tuple[dict, str]:
    """The layouts to compare with the report's own plan among them: its name there (added as
    "this plan" when it is none of them)."""
    own = next((name for name, p in compare_with.items() if p == plan), None)
    if own is None:
        own = "this plan"
        compare_with = {own: plan, **compare_with}
    return compare_with, own


def render_report(model, plan, mesh: Mesh | None = None, training=None, *, torch_version=None,
                  title: str | None = None, compare_with: dict | None = None, analysis=None,
                  model_label: str | None = None) -> str:
    """The whole report as one HTML string (see ``write_report`` for a file).

    ``model``: an nn.Module or a ``ModelTree``; it is walked once and every section reads that tree.
    Without ``training``: ``display.DEFAULT_TRAINING``, as the Inspector and ``compare`` assume.
    ``analysis``: the ``analyze`` of these very arguments when the caller has it (not analysed twice);
    ``model_label``: what the model is shaped after ("Llama 3.1 70B"), for the title."""
    mesh = mesh or Mesh(8)
    training = display.DEFAULT_TRAINING if training is None else training
    a = analysis or analyze(model, plan, mesh, training, strict=False, torch_version=torch_version)
    title = title or f"shardviz report: {display.model_text(a.tree, model_label)}"
    memory, traffic, timeline = display.memory_payload(a), display.traffic_payload(a), display.timeline_payload(a)
    charts = [_chart("memory", memory), _chart("traffic", traffic)]
    comparison_html = ""
    if compare_with:
        from .compare import compare

        layouts, own = _own_layout(a.plan, compare_with)
        c = compare(a.tree, layouts, mesh=mesh, training=training)
        charts.append(_chart("memory", c.memory_payload(), c.chart_title()))
        comparison_html = comparison_section(c, own)
    charts.append(_chart("timeline", timeline))
    body_codes = findings_section(a.findings) + comparison_html
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    script = (WIDGET / "charts.js").read_text() + _DRAW
    css = _CSS + (WIDGET / "inspector.css").read_text()
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; font-src data:">
<title>{_esc(title)}</title><style>{css}</style></head><body>
<h1>{_esc(title)}</h1>
{verdict_section(a, a.findings)}
<p class="sub">{_esc(_layout_line(a))}. Plan: {_esc(a.plan.name or "custom")}. Training: {_esc(_training_line(a.training, a.plan))}.
Generated {stamp}; measured with {_esc(display.versions_text())}.</p>
{findings_section(a.findings)}
<h2>Memory, traffic and step time</h2><div class="charts">{"".join(charts)}</div>
{memory_section(a, memory)}
{traffic_section(a, traffic)}
{time_section(a)}
{comparison_html}
{units_section(a)}
{code_section(a, plan, mesh, training, torch_version)}
{params_section(a)}
<!--sv-finding-codes-->
<script>{script}</script>
</body></html>
"""
    return page.replace("<!--sv-finding-codes-->", codes_section(body_codes), 1)


def _layout_line(a) -> str:
    """What the analysis is, without naming the model again (the title names it, once):
    "FSDP 64 ranks: 83 fully_shard calls, 1,204 parameters: 1,204 sharded, 0 ignored, 0 unmanaged"."""
    counts = a.params["status"].value_counts().to_dict()
    return (f"{a.mesh}: {format_count(len(a.plan.units))} fully_shard calls, {format_count(len(a.tree.params))} "
            "parameters: " + ", ".join(f"{format_count(counts.get(s, 0))} {s}" for s in ("sharded", "ignored", "unmanaged")))


def write_report(path, model, plan, mesh: Mesh | None = None, training=None, **kwargs) -> str:
    """Render the report and write it atomically to ``path``; returns the path."""
    from .files import write_text_atomic

    write_text_atomic(path, render_report(model, plan, mesh, training, **kwargs))
    return str(path)
