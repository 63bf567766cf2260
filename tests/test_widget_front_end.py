"""The Inspector's shipped front end: its files, the one message schema both halves check, and
``sv.Inspector``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from torch import nn

import shardviz as sv
import shardviz.widget
from shardviz.widget import Inspector, InspectorState
from shardviz.widget import bundle
from widget_helpers import front_end_source


def test_front_end_files_ship_and_fetch_nothing():
    here = Path(sv.__file__).parent / "widget"
    # every file of front/ is a module of the bundle, each once, each under 600 lines, each saying
    # what it holds; only the entry has anywidget's `export default`
    mods = bundle.modules()
    names = [m.path.name for m in mods]
    assert sorted(names[1:]) == sorted(p.name for p in (here / "front").glob("*.js")) and names[0] == "charts.js"
    assert names[-1] == "inspector.js" and len(set(names)) == len(names)
    assert not (here / "inspector.esm.js").exists()
    for m in mods:
        assert m.text.startswith("// ") and len(m.text.splitlines()) <= 600, m.name
        assert bool(re.search(r"^export default", m.text, re.MULTILINE)) == (m.path == bundle.ENTRY), m.name
    esm = front_end_source()
    css = (here / "inspector.css").read_text()
    assert "export default" in esm and "function render" in esm
    assert esm.rstrip().endswith("export default { render };")
    # no imports left in the bundle, no URLs: nothing is fetched at run time (no CDN)
    assert not re.search(r"^\s*import\s", esm, re.MULTILINE)
    assert not re.search(r"\bimport\(", esm)
    assert not re.search(r"^\s*export\s+(?!default)", esm, re.MULTILINE)
    charts = (here / "charts.js").read_text()
    assert not re.search(r"^\s*(import|export)\s", charts, re.MULTILINE)  # also a classic <script> (the report)
    urls = re.findall(r"https?://[^\s\"')]+", esm + css)
    assert urls == ["http://www.w3.org/2000/svg"]  # the SVG namespace name, never fetched
    assert "@import" not in css and "url(" not in css
    assert "--jp-layout-color0" in css  # follows JupyterLab's theme
    assert Inspector(nn.Linear(2, 2), mesh=sv.Mesh(shard=2))._esm == esm


def test_every_front_end_module_imports_what_it_uses():
    """Issue 36: the front end was eleven files sharing top-level names in a fixed order. Each is now
    an ES module: it imports each name it uses from another module, and the bundle refuses a module
    that does not (or imports what is not exported, or declares a name another declares)."""
    mods = {m.path.name: m for m in bundle.modules()}
    assert mods["tree.js"].imports and mods["inspector.js"].imports  # real imports, read from the files
    assert "buildRow" in mods["tree_rows.js"].exported and "render" not in mods["inspector.js"].exported
    assert all(re.search(r'^import \{[^}]+\} from "\.\.?/', m.text, re.MULTILINE) for n, m in mods.items() if n != "charts.js")


def _write(tmp_path, files: dict[str, str]) -> Path:
    (tmp_path / "front").mkdir()
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return tmp_path / "front" / "main.js"


@pytest.mark.parametrize("files, message", [
    # a name of another module used without importing it (the old shared-globals style)
    ({"front/main.js": 'import { a } from "./a.js";\nfunction render() { return a() + b(); }\nexport default { render };\n',
      "front/a.js": "export function a() { return 1; }\nexport function b() { return 2; }\n"}, "uses b (front/a.js) without importing"),
    # importing what the module does not export
    ({"front/main.js": 'import { c } from "./a.js";\nfunction render() { return c(); }\nexport default { render };\n',
      "front/a.js": "export function a() { return 1; }\nfunction c() { return 3; }\n"}, "does not export them"),
    # two modules declaring one top-level name: one scope in the bundle
    ({"front/main.js": 'import { a } from "./a.js";\nconst x = 1;\nfunction render() { return a(x); }\nexport default { render };\n',
      "front/a.js": "const x = 2;\nexport function a(v) { return v + x; }\n"}, "both declare 'x'"),
    # a module that is not there, and a package (npm) import
    ({"front/main.js": 'import { a } from "./nope.js";\nexport default { render: a };\n'}, "does not exist"),
    ({"front/main.js": 'import { a } from "lodash";\nexport default { render: a };\n'}, "only the front end's own files"),
])
def test_bundle_refuses_a_module_that_does_not_say_what_it_uses(tmp_path, files, message):
    entry = _write(tmp_path, files)
    with pytest.raises(bundle.ModuleError, match=re.escape(message)):
        bundle.modules(entry)


def test_bundle_runs_as_one_module_under_node(tmp_path):
    """The bundle of two modules and a classic script (charts.js's kind) runs: imports resolved,
    locals that shadow another module's name left alone."""
    import shutil
    import subprocess

    if shutil.which("node") is None:
        pytest.skip("node is not installed")
    entry = _write(tmp_path, {
        "lib.js": "const K = 40;\nfunction h(x) { return x + K; }\n",
        "front/a.js": 'import { h } from "../lib.js";\nexport function two() { return h(2) - 40; }\n',
        "front/main.js": ('import { h } from "../lib.js";\nimport { two } from "./a.js";\n'
                          "function render() { const K = (s) => s; return K(h(two())); }\nexport default { render };\n"),
    })
    (tmp_path / "b.mjs").write_text(bundle.bundle(entry) + "\nconsole.log(JSON.stringify(render()));\n")
    out = subprocess.run(["node", str(tmp_path / "b.mjs")], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.strip() == "42"


def test_hot_reload_rebuilds_the_bundle_on_save(tmp_path):
    """ANYWIDGET_HMR=1: anywidget watches the file _esm names; a save of any module rebuilds it."""
    import time

    entry = _write(tmp_path, {"front/main.js": 'import { a } from "./a.js";\nfunction render() { return a; }\nexport default { render };\n',
                              "front/a.js": "export const a = 1;\n"})
    out = bundle.dev_bundle_path(entry, poll_s=0.05)
    assert "const a = 1;" in out.read_text()
    time.sleep(0.05)
    (tmp_path / "front" / "a.js").write_text("export const a = 2;\n")
    deadline = time.monotonic() + 10
    while "const a = 2;" not in out.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "const a = 2;" in out.read_text()


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
        assert hasattr(InspectorState, name) or name in ("set_tab", "set_torch_version", "cancel", "apply_fix"), name
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


def test_one_number_style_in_the_front_end_and_in_python():
    """Issue 37: one column mixed "8,192", "131.1 k", "67.37 mn" and "70.76 bn", and "8 us" with
    "15.4 µs". The front end's one formatter, ``fmt`` (charts.js), writes every number as
    shardviz/format.py does, run under node against the Python functions."""
    import json
    import shutil
    import subprocess

    from shardviz.format import format_bytes, format_count, format_duration, format_large_count, format_percent, format_rate

    if shutil.which("node") is None:
        pytest.skip("node is not installed")
    cases = {
        "bytes": ([0, 512, 1536, 123_456_789, 19.34 * 2**30, 263.6 * 2**30, 3 * 2**40], format_bytes),
        "count": ([0, 8192, 131_072, 67_371_008, 70_553_706_496, 1_234_567_890_123], format_large_count),
        "int": ([0, 999, 8192, 1_412, 70_553_706_496], format_count),
        # a rate is rounded: the card said "784" tokens/s where the step line said "785" (8192 / 10.442 s)
        "rate": ([0, 784.52, 784.5, 1128.1, 5449.5, 123_456.7], format_rate),
        "seconds": ([0, 4e-6, 1.54e-5, 2.7e-4, 0.0123, 0.25, 3.58, 23.6], format_duration),
        "percent": ([0, 0.0004, 0.054, 0.281, 0.54, 1.0], format_percent),
    }
    src = (Path(sv.__file__).parent / "widget" / "charts.js").read_text()
    fmt_src = src[src.index("function fmt(v, kind)"):src.index("const fmtBytes")]
    calls = [[kind, v] for kind, (values, _) in cases.items() for v in values]
    script = fmt_src + f"console.log(JSON.stringify({json.dumps(calls)}.map(([k, v]) => fmt(v, k))));"
    js = json.loads(subprocess.run(["node", "-e", script], capture_output=True, text=True, timeout=60, check=True).stdout)
    py = [cases[kind][1](v) for kind, v in calls]
    assert js == py, [(c, a, b) for c, a, b in zip(calls, js, py) if a != b]
    # the old shortened counts are gone from every file the front end ships
    esm = front_end_source()
    assert not re.search(r"\b(bn|mn|tn)`", esm)


def test_the_root_has_one_name():
    """The tree's root read "(root)", its tooltip "(root)", the findings and the charts "<root>"."""
    from shardviz.format import ROOT_NAME

    ins = Inspector(nn.Sequential(nn.Linear(2, 2)), mesh=sv.Mesh(shard=2))
    order, rows = ins.controller.rows()
    assert rows[order[0]]["name"] == ROOT_NAME == "<root>"
    assert "(root)" not in front_end_source()
