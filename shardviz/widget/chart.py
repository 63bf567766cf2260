"""``shardviz.widget.Chart``: the one-chart notebook widget of ``shardviz/chart.py`` (made there,
so that ``compare`` reaches it without importing the widget package)."""

from __future__ import annotations

from ..chart import chart_class

Chart = chart_class()
