"""The ``shardviz`` command line: export, plan write/read, refusals, atomic writes."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import shardviz as sv
from shardviz import cli
from shardviz.views.display import DEFAULT_TRAINING

FACTORY = '''
import torch
from torch import nn


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
        self.head = nn.Linear(8, 4)


def make():
    return Small()


def not_a_module():
    return 42


def broken():
    raise RuntimeError("no weights here")


instance = Small()
'''


@pytest.fixture
def factory(tmp_path, monkeypatch):
    (tmp_path / "mymodels.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "mymodels"
    sys.modules.pop("mymodels", None)


def run(argv, capsys):
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("shardviz: error: ")
    return lines[0]


# ---------------------------------------------------------------------------
# export
# ---------------------------------------------------------------------------
def test_export_zoo_model_to_file(tmp_path, capsys):
    target = tmp_path / "apply_fsdp.py"
    code, out, err = run(["export", "zoo:tiny_llama_lora", "--lora", "ignored", "--world-size", "8",
                          "--replicate", "2", "--torch", "2.6", "-o", str(target)], capsys)
    assert code == 0 and out == ""
    text = target.read_text()
    ast.parse(text)
    assert "mesh HSDP 2x4" in text.splitlines()[0] + text.splitlines()[1]
    assert "from torch.distributed.fsdp import fully_shard" in text
    assert "SV101" in err and "SV102" in err  # what the user should know, on stderr
    assert f"wrote {target}" in err
    from shardviz import zoo

    model = zoo.tiny_llama_lora()
    expected = sv.export_code(model, sv.Plan.auto(model, lora="ignored"), mesh=sv.Mesh(shard=4, replicate=2),
                              training=DEFAULT_TRAINING, torch_version="2.6")
    assert text == expected  # the one default training (bf16 parameters, fp32 reduction), as the report's
    assert "training: AdamW · bf16 params · fp32 reduce" in err and "shardviz's default" in err


def test_export_to_stdout_from_a_factory(factory, capsys):
    code, out, err = run(["export", f"{factory}:make", "--world-size", "2", "-q"], capsys)
    assert code == 0 and err == ""
    assert "def apply_fsdp(model, mesh=None):" in out
    assert '"layers.0",' in out and "for name in (" in out and "model.get_submodule(name)," in out  # the blocks, one loop
    assert "MixedPrecisionPolicy(" in out  # the one default training: bf16 parameters, fp32 reduction
    code, out, _ = run(["export", f"{factory}:instance", "--world-size", "2", "-q"], capsys)
    assert code == 0 and "apply_fsdp" in out  # an nn.Module attribute works too


def test_export_with_a_plan_file(tmp_path, factory, capsys):
    plan = sv.Plan(["layers.0", "layers.1", "layers.2", ""], ignored=["head.weight"], name="mine")
    (tmp_path / "plan.json").write_text(plan.to_json())
    code, out, _ = run(["export", f"{factory}:make", "--plan", "plan.json", "--world-size", "4", "--torch", "2.7",
                        "-q"], capsys)
    assert code == 0
    assert "plan 'mine'" in out and "ignored_params=ignored" in out and '"head.weight",' in out


def test_refuses_to_overwrite_without_force(tmp_path, factory, capsys):
    target = tmp_path / "out.py"
    target.write_text("keep me")
    argv = ["export", f"{factory}:make", "--world-size", "2", "-o", str(target), "-q"]
    code, out, err = run(argv, capsys)
    assert code == 2 and target.read_text() == "keep me"
    assert "exists; pass --force" in one_line_error(err)
    code, _, _ = run(argv + ["--force"], capsys)
    assert code == 0 and "apply_fsdp" in target.read_text()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.py")] == []  # no temp left


def test_write_is_atomic_and_never_clobbers(tmp_path):
    target = tmp_path / "f.txt"
    cli.write_atomic(str(target), "one", force=False)
    assert target.read_text() == "one" and oct(target.stat().st_mode & 0o777) == "0o644"
    with pytest.raises(cli.CliError, match="exists"):
        cli.write_atomic(str(target), "two", force=False)
    # a reader never sees a partial file while it is replaced
    big = "x" * 2_000_000
    seen = set()
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            seen.add(len(target.read_text()))

    thread = threading.Thread(target=reader)
    thread.start()
    for text in (big, "one", big):
        cli.write_atomic(str(target), text, force=True)
    stop.set()
    thread.join()
    assert seen <= {3, len(big)}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]


@pytest.mark.parametrize("argv,reason", [
    (["export", "zoo:nope", "--world-size", "8"], "unknown zoo model"),
    (["export", "nomodule_xyz:make", "--world-size", "8"], "cannot import"),
    (["export", "mymodels:missing", "--world-size", "8"], "has no attribute"),
    (["export", "mymodels:not_a_module", "--world-size", "8"], "returned int"),
    (["export", "mymodels:broken", "--world-size", "8"], "raised RuntimeError"),
    (["export", "mymodels", "--world-size", "8"], "expected zoo:NAME, path/to/config.json or package.module:factory"),
    (["export", "mymodels:make", "--world-size", "8", "--replicate", "3"], "not a multiple"),
    (["export", "mymodels:make", "--world-size", "0"], "must be positive"),
    (["export", "mymodels:make", "--world-size", "eight"], "invalid int value"),
    (["export", "mymodels:make"], "--world-size"),
    (["export", "mymodels:make", "--world-size", "2", "--torch", "2.3"], "needs torch >= 2.4"),
    (["export", "mymodels:make", "--world-size", "2", "--torch", "latest"], "torch version"),
    (["export", "mymodels:make", "--world-size", "2", "--lora", "weird"], "invalid choice"),
    (["export", "mymodels:make", "--world-size", "2", "--plan", "missing.json"], "cannot read plan"),
    (["export", "mymodels:make", "--world-size", "2", "--plan", "bad.json"], "not valid JSON"),
    (["export", "mymodels:make", "--world-size", "2", "--plan", "other.json"], "no module named"),
    (["export", "mymodels:make", "--world-size", "2", "-o", "nodir/out.py"], "does not exist"),
    (["frobnicate"], "invalid choice"),
    ([], "required"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, factory, capsys, argv, reason):
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "other.json").write_text(sv.Plan(["decoder.0"]).to_json())
    code, out, err = run(argv, capsys)
    assert code == 2 and out == ""
    assert reason in one_line_error(err)
    assert not (tmp_path / "nodir").exists()


def test_plan_torch_would_refuse_exits_1(tmp_path, capsys):
    from shardviz import zoo

    grouped = sv.Plan.auto(zoo.tiny_llama_lora(), lora="ignored")
    (tmp_path / "p.json").write_text(grouped.to_json())
    target = tmp_path / "out.py"
    code, out, err = run(["export", "zoo:tiny_llama_lora", "--plan", str(tmp_path / "p.json"), "--world-size", "2",
                          "--torch", "2.4", "-o", str(target)], capsys)
    assert code == 1 and not target.exists()
    assert "SV110" in err and "nothing written" in err


# ---------------------------------------------------------------------------
# plan write / read
# ---------------------------------------------------------------------------
def test_plan_write_then_read(tmp_path, factory, capsys):
    code, _, err = run(["plan", "write", f"{factory}:make", "--lora", "ignored", "-o", "plan.json"], capsys)
    assert code == 0 and "wrote plan.json" in err
    plan = sv.Plan.from_json((tmp_path / "plan.json").read_text())
    assert [u.modules for u in plan.units][-1] == ("",)
    code, _, err = run(["plan", "write", f"{factory}:make", "-o", "plan.json"], capsys)
    assert code == 2 and "exists" in one_line_error(err)
    code, out, _ = run(["plan", "read", "plan.json"], capsys)
    assert code == 0 and out.startswith("plan auto: 5 fully_shard calls")  # a model without LoRA: not named after it
    assert "fully_shard layers.0" in out
    code, out, _ = run(["plan", "read", "plan.json", "--model", f"{factory}:make", "--world-size", "4"], capsys)
    assert code == 0 and "Small on FSDP 4 ranks" in out


def test_plan_read_reports_findings_and_errors(tmp_path, factory, capsys):
    (tmp_path / "root.json").write_text(sv.Plan([""]).to_json())
    code, out, _ = run(["plan", "read", "root.json", "--model", f"{factory}:make", "--world-size", "4"], capsys)
    assert code == 0 and "SV105" in out
    (tmp_path / "grouped.json").write_text(sv.Plan([["layers.0", "layers.1"]]).to_json())
    code, out, _ = run(["plan", "read", "grouped.json", "--model", f"{factory}:make", "--world-size", "4"], capsys)
    assert code == 1 and "SV004" in out
    code, _, err = run(["plan", "read", "root.json", "--model", f"{factory}:make"], capsys)
    assert code == 2 and "--world-size" in one_line_error(err)


def test_plan_to_stdout(factory, capsys):
    code, out, _ = run(["plan", "write", f"{factory}:make"], capsys)
    assert code == 0 and json.loads(out)["schema"] == "shardviz.plan"


def test_console_script_entry_point(tmp_path):
    """``python -m shardviz.cli`` (what the ``shardviz`` script calls) exits with main's code."""
    proc = subprocess.run([sys.executable, "-m", "shardviz.cli", "export", "zoo:nope", "--world-size", "2"],
                          capture_output=True, text=True, cwd=tmp_path, env=dict(os.environ))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    # the `shardviz` script an install writes calls the entry point pyproject.toml declares
    import tomllib

    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    module, _, attr = tomllib.loads(pyproject.read_text())["project"]["scripts"]["shardviz"].partition(":")
    proc = subprocess.run([sys.executable, "-c", f"import sys; from {module} import {attr}; sys.exit({attr}())", "--help"],
                          capture_output=True, text=True, cwd=tmp_path, env=dict(os.environ))
    assert proc.returncode == 0 and "export" in proc.stdout, proc.stderr
