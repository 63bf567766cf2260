"""One chart on its own in a notebook, drawn by the Inspector's chart code (``charts.js``): SVG that
follows JupyterLab's light and dark themes, where a plotly figure stays white.

``sv.compare(...).chart()`` and ``sv.sweep(...).chart()`` return one.
"""

from __future__ import annotations

from pathlib import Path

import anywidget
import traitlets

HERE = Path(__file__).parent

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


class Chart(anywidget.AnyWidget):
    """``Chart(kind, payload)``: kind "memory" (``views.memory_payload`` or ``Comparison.memory_payload``),
    "traffic" (``views.traffic_payload``) or "lines" (``Sweep.lines_payload``)."""

    _esm = (HERE / "charts.js").read_text() + "\n" + _RENDER
    _css = (HERE / "inspector.css").read_text()
    kind = traitlets.Unicode("memory").tag(sync=True)
    payload = traitlets.Dict().tag(sync=True)
    title = traitlets.Unicode("").tag(sync=True)

    def __init__(self, kind: str, payload: dict, title: str = "", **kwargs):
        super().__init__(kind=kind, payload=payload, title=title, **kwargs)
