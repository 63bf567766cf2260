"""The Jupyter widget: ``sv.Inspector(model)``.

- ``controller.InspectorState``: the one state object, every action as a plain Python method (no
  browser needed): history, analysis and views; its plan edits (``plan_actions``) and mesh and
  training edits (``setup_actions``) are plain functions of it, the plan's name after edits in
  ``plan_names``, what the typed fields accept in ``inputs``;
- ``tree_view``: expansion, filters and the visible rows, over ``folding`` (repeated blocks as one
  row) and ``module_stats`` (per-module sizes, bytes and badges);
- ``panels``: the findings and A vs B payloads, read from ``sv.analyze`` (the charts' are ``shardviz.views.display``'s);
- ``planfile``: the atomically saved, restorable plan file;
- ``protocol``: the message schema both halves check;
- ``inspector.Inspector``: one anywidget, controls included (``front/*.js``, one ES module per
  component importing ``charts.js`` and each other, bundled by ``bundle``; ``inspector.css``:
  shipped files, no npm, no network; ``ANYWIDGET_HMR=1`` reloads a saved edit);
- ``Chart`` (made by ``shardviz/views/chart.py``): one chart on its own (``sv.compare(...).chart()``, ``sv.sweep(...).chart()``).
"""

from ..views.chart import chart_class
from .controller import InspectorState
from .inspector import Inspector
from .planfile import PlanFileError

Chart = chart_class()

__all__ = ["Chart", "Inspector", "InspectorState", "PlanFileError"]
