"""One chart on its own in a notebook, drawn by the Inspector's chart code (``widget/charts.js``):
SVG that follows JupyterLab's light and dark themes, where a plotly figure stays white.

``sv.compare(...).chart()`` and ``sv.sweep(...).chart()`` return one. anywidget is imported when
the first chart is made, so compare and the report never load it.
"""

from __future__ import annotations

import functools
from pathlib import Path

WIDGET_FILES = Path(__file__).parents[1] / "widget"

_RENDER = """
function render({ model, el }) {
  const box = h("div", { class: "sv-inspector sv-embedded sv-chart-widget" });
  const draw = () => drawChart(box, model.get("kind"), model.get("payload"), model.get("title") || undefined);
  model.on("change:payload", draw);
  model.on("change:kind", draw);
  model.on("change:title", draw);
  draw();
  el.append(box);
}
export default { render };
"""


@functools.cache
def chart_class() -> type:
    """The ``Chart`` anywidget class, made (and anywidget imported) on first use."""
    import anywidget
    import traitlets

    class Chart(anywidget.AnyWidget):
        """``Chart(kind, payload)``: kind "memory" (``views.memory_payload`` or
        ``Comparison.memory_payload``), "traffic" (``views.traffic_payload``) or "lines"
        (``Sweep.lines_payload``)."""

        _esm = (WIDGET_FILES / "charts.js").read_text() + "\n" + _RENDER
        _css = (WIDGET_FILES / "inspector.css").read_text()
        kind = traitlets.Unicode("memory").tag(sync=True)
        payload = traitlets.Dict().tag(sync=True)
        title = traitlets.Unicode("").tag(sync=True)

        def __init__(self, kind: str, payload: dict, title: str = "", **kwargs):
            super().__init__(kind=kind, payload=payload, title=title, **kwargs)

    Chart.__module__, Chart.__qualname__ = "shardviz.views.chart", "Chart"
    return Chart


def chart(kind: str, payload: dict, title: str = ""):
    """One chart as a notebook widget: ``kind`` "memory", "traffic" or "lines" and its payload."""
    return chart_class()(kind, payload, title)
