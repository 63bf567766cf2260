"""shardviz report: one self-contained HTML file, written atomically, never clobbered."""

import re

import pytest

from shardviz.cli import main


def test_report_writes_one_offline_file(tmp_path, capsys):
    out = tmp_path / "report.html"
    rc = main(["report", "zoo:tiny_llama_lora", "--layout", "ignored", "--world-size", "8",
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
    (["report", "zoo:tiny_llama_lora", "--world-size", "8", "--device-memory", "lots"], "device_memory='lots'"),
])
def test_report_bad_input_is_one_line(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
