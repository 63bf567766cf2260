"""The Inspector's shipped front end: its files, the one message schema both halves check, and
``sv.Inspector``.
"""

from __future__ import annotations

import re
from pathlib import Path

from torch import nn

import shardviz as sv
import shardviz.widget
from shardviz.widget import Inspector, InspectorState
from shardviz.widget.inspector import FRONT_FILES
from widget_helpers import front_end_source


def test_front_end_files_ship_and_fetch_nothing():
    here = Path(sv.__file__).parent / "widget"
    # every file of front/ is concatenated, each once, each under 600 lines, each saying what it holds
    assert sorted(p.name for p in (here / "front").glob("*.js")) == sorted(FRONT_FILES)
    assert not (here / "inspector.esm.js").exists()
    for name in FRONT_FILES:
        text = (here / "front" / name).read_text()
        assert text.startswith("// ") and len(text.splitlines()) <= 600, name
        assert ("export default" in text) == (name == FRONT_FILES[-1]), name
    esm = front_end_source()
    css = (here / "inspector.css").read_text()
    assert "export default" in esm and "function render" in esm
    assert esm.rstrip().endswith("export default { render };")
    # no imports, no URLs: nothing is fetched at run time (no CDN)
    assert not re.search(r"^\s*import\s", esm, re.MULTILINE)
    assert not re.search(r"\bimport\(", esm)
    charts = (here / "charts.js").read_text()
    assert not re.search(r"^\s*(import|export)\s", charts, re.MULTILINE)  # also a classic <script> (the report)
    urls = re.findall(r"https?://[^\s\"')]+", esm + css + charts)
    assert urls == ["http://www.w3.org/2000/svg"]  # the SVG namespace name, never fetched
    assert "@import" not in css and "url(" not in css
    assert "--jp-layout-color0" in css  # follows JupyterLab's theme
    charts = (here / "charts.js").read_text()
    assert Inspector(nn.Linear(2, 2), mesh=sv.Mesh(shard=2))._esm == charts + "\n" + esm


def test_protocol_is_defined_once_and_checked_in_python():
    from shardviz.widget import protocol

    assert protocol.check_action("toggle_unit", {"fqn": "x"}) is None
    assert protocol.check_action("nope", {}) == "unknown action 'nope'"
    assert "takes no argument" in protocol.check_action("toggle_unit", {"fqn": "x", "evil": 1})
    assert "needs argument" in protocol.check_action("toggle_unit", {})
    assert "must be int" in protocol.check_action("expand", {"target": "x", "open": 1}) or "must be bool" in protocol.check_action("expand", {"target": "x", "open": 1})
    assert "must be number" in protocol.check_action("set_rank", {"rank": "3"})
    assert protocol.check_action("set_mesh", {"device_gib": None}) is None
    # every action the front end may send is a method of the state or handled by the widget
    for name in protocol.ACTIONS:
        assert hasattr(InspectorState, name) or name in ("set_tab", "set_torch_version", "cancel"), name
    # the front end reads the schema from the trait: no list of names of its own
    esm = front_end_source()
    assert "FRONT_END_ACTIONS" not in esm and 'model.get("protocol")' in esm
    assert "model.set(" not in esm and "save_changes" not in esm  # Python writes every trait


def test_sv_exports_inspector():
    assert sv.Inspector is Inspector


def test_no_glyph_that_needs_an_emoji_font():
    """"⏳" drew an empty box where no emoji font is installed (issue 37): the front end draws its
    spinner in CSS and writes words; no pictograph or dingbat in the files it ships."""
    here = Path(shardviz.widget.__file__).parent
    pictograph = re.compile("[\u2300-\u23ff\u2600-\u27bf\U0001f000-\U0001faff]")
    for path in [here / "charts.js", here / "inspector.css", *sorted((here / "front").glob("*.js"))]:
        found = pictograph.findall(path.read_text())
        assert not found, (path.name, found)
