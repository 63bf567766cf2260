"""What ``import shardviz`` and the command line cost: no widget libraries until the widget is used."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WIDGET_LIBS = ("anywidget", "ipywidgets")


def loaded_after(code: str) -> set[str]:
    probe = code + "\nimport sys\nprint(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in %r)))" % (
        WIDGET_LIBS + ("transformers", "peft"),
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    return {m.split(".")[0] for m in out.stdout.split()}


def test_import_shardviz_loads_no_widget_library():
    assert loaded_after("import shardviz as sv; sv.Plan, sv.analyze, sv.load_model, sv.zoo") == set()


def test_cli_help_loads_no_widget_library():
    code = ("import contextlib, io\nfrom shardviz import cli\nwith contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n        cli.main(['report', '--help'])\n    except SystemExit:\n        pass")
    assert loaded_after(code) == set()


def test_inspector_is_there_when_asked_for():
    assert {"anywidget", "ipywidgets"} <= loaded_after("import shardviz as sv; sv.Inspector")


def test_declared_dependencies():
    """torch's floor is what the oracle needs; transformers and peft only in the 'hf' extra."""
    import re

    import pytest

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = {re.split(r"[<>=!\[ ]", d)[0]: d for d in project["dependencies"]}
    assert "transformers" not in deps and "peft" not in deps
    assert deps["torch"] == "torch>=2.6"  # verify calls torch.distributed.fsdp.fully_shard (public from 2.6)
    assert "from torch.distributed.fsdp" in (ROOT / "shardviz" / "export" / "oracle.py").read_text() or \
        "torch.distributed.fsdp as" in (ROOT / "shardviz" / "export" / "oracle.py").read_text()
    hf = {re.split(r"[<>=!\[ ]", d)[0] for d in project["optional-dependencies"]["hf"]}
    assert hf == {"transformers", "peft"}
    assert "ruff" in {re.split(r"[<>=!\[ ]", d)[0] for d in project["optional-dependencies"]["test"]}


def test_package_data_ships_the_front_end():
    """The widget's front end (charts.js, front/*.js, inspector.css) is package data: every file of it
    matches a glob of pyproject's package-data, or the wheel's Inspector would have no front end."""
    from fnmatch import fnmatch

    import pytest

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["shardviz"]
    package = ROOT / "shardviz"
    shipped = [p.relative_to(package).as_posix() for p in (package / "widget").rglob("*") if p.suffix in (".js", ".css")]
    assert "widget/front/inspector.js" in shipped and "widget/inspector.css" in shipped
    assert [f for f in shipped if not any(fnmatch(f, g) and f.count("/") == g.count("/") for g in globs)] == []
