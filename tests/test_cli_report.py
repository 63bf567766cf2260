"""shardviz report: one self-contained HTML file, written atomically, never clobbered."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from shardviz.cli import main


def test_report_writes_one_offline_file(tmp_path, capsys):
    out = tmp_path / "report.html"
    rc = main(["report", "zoo:tiny_llama_lora", "--lora", "ignored", "--world-size", "8",
               "--device-memory", "80GiB", "-o", str(out)])
    assert rc == 0 and out.exists()
    text = out.read_text()
    # the Inspector's chart code inlined (charts.js), one JSON payload per chart
    assert "function drawMemory" in text and text.count('<script type="application/json">') >= 3
    assert not re.search(r"<script[^>]*\ssrc=|<link[^>]*\shref=|<img[^>]*\ssrc=\"http", text)  # nothing to fetch
    assert "LoRA separate" in text and "SV102" in text and "get_submodule" in text
    assert "wrote" in capsys.readouterr().err
    # never overwritten without --force; --force replaces it
    assert main(["report", "zoo:tiny_llama_lora", "--world-size", "8", "-o", str(out)]) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert main(["report", "zoo:tiny_llama_lora", "--world-size", "8", "--no-compare", "-o", str(out), "--force"]) == 0
    assert "LoRA separate" not in out.read_text()


@pytest.mark.parametrize("args,message", [
    (["report", "zoo:nope", "--world-size", "8"], "unknown zoo model 'zoo:nope'"),
    (["report", "zoo:tiny_llama_lora", "--world-size", "8", "--device-memory", "lots"], "--device-memory='lots'"),
])
def test_report_bad_input_is_one_line(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_rendering_a_report_loads_no_widget_library():
    """A report (with its layouts compared) renders without anywidget or ipywidgets: the views it
    shares with the Inspector live outside ``shardviz/widget``."""
    code = (
        "import sys, shardviz as sv, shardviz.report as r; from shardviz import zoo\n"
        "m = zoo.tiny_llama_lora()\n"
        "plans = {f'LoRA {x}': sv.Plan.auto(m, lora=x) for x in ('ignored', 'sharded')}\n"
        "html = r.render_report(m, plans['LoRA ignored'], sv.Mesh(8), compare_with=plans)\n"
        "sv.compare(m, plans, mesh=sv.Mesh(8)).memory_payload()\n"
        "assert 'Layouts compared' in html\n"
        "print('anywidget' in sys.modules, 'ipywidgets' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]
