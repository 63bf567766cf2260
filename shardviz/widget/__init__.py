"""The Jupyter widget: ``sv.Inspector(model)``.

- ``state.InspectorState``: every action as a plain Python method (no browser needed): history,
  analysis and views; its plan edits in ``plan_actions``, the plan's name after edits in ``plan_names``,
  what the typed fields accept in ``inputs``;
- ``tree_view``: expansion, filters and the visible rows, over ``folding`` (repeated blocks as one
  row) and ``module_stats`` (per-module sizes, bytes and badges);
- ``views``: the chart and findings payloads, read from ``sv.analyze``, and plotly figures;
- ``planfile``: the atomically saved, restorable plan file;
- ``protocol``: the message schema both halves check;
- ``inspector.Inspector``: one anywidget, controls included (``charts.js`` + ``inspector.esm.js``,
  ``inspector.css``: shipped files, no build step, no network);
- ``chart.Chart``: one chart on its own (``sv.compare(...).chart()``, ``sv.sweep(...).chart()``).
"""

from .chart import Chart
from .inspector import Inspector, InspectorView
from .planfile import PlanFileError
from .state import InspectorState

__all__ = ["Chart", "Inspector", "InspectorState", "InspectorView", "PlanFileError"]
