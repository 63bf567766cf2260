"""The Jupyter widget: ``sv.Inspector(model)``.

- ``state.InspectorState``: every action as a plain Python method (no browser needed);
- ``tree_view``: folding repeated blocks, per-module badges and bytes, the visible rows;
- ``views``: the chart and findings payloads, read from ``sv.analyze``, and plotly figures;
- ``planfile``: the atomically saved, restorable plan file;
- ``inspector.Inspector``: ipywidgets controls + the anywidget front end
  (``inspector.esm.js``, ``inspector.css``: shipped files, no build step, no network).
"""

from .inspector import Inspector, InspectorView
from .planfile import PlanFileError
from .state import InspectorState

__all__ = ["Inspector", "InspectorState", "InspectorView", "PlanFileError"]
