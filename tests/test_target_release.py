"""Findings follow the release the user targets: a 2.4-2.6 target shows SV101 (the seed bug of this
project: ``ignored_params`` before 2.7) in ``analyze``, the report, the widget and the CLI."""

import pytest
import torch

import shardviz as sv
from shardviz.cli import main
from shardviz.report import render_report
from shardviz.widget import Inspector

MESH = sv.Mesh(4)


def has_ignored_params(version: str) -> bool:
    """``fully_shard(ignored_params=...)`` exists from torch 2.7 (pyproject allows torch >= 2.6)."""
    major, minor = (int(x) for x in version.split("+")[0].split(".")[:2])
    return (major, minor) >= (2, 7)


@pytest.fixture(scope="module")
def plan(model):
    return sv.Plan.auto(model, lora="ignored")


def codes(findings):
    return {f.code if hasattr(f, "code") else f["code"] for f in findings}


@pytest.mark.parametrize("version,sv101", [("2.4", True), ("2.5", True), ("2.6", True), ("2.7", False),
                                           ("2.13.0", False),
                                           # no target: the installed torch's release decides
                                           (None, not has_ignored_params(torch.__version__))])
def test_analyze_follows_the_target(model, plan, version, sv101):
    a = sv.analyze(model, plan, MESH, torch_version=version)
    assert ("SV101" in codes(a.findings)) == sv101
    assert a.torch_version == version


@pytest.mark.parametrize("installed", ["2.6.0+cu124", "2.7.1", "2.13.0+cpu"])
def test_no_target_means_the_installed_release(model, plan, installed, monkeypatch):
    """pyproject allows torch >= 2.6: with no target, SV101 appears exactly when the installed
    release lacks ``ignored_params``."""
    monkeypatch.setattr(torch, "__version__", installed)
    a = sv.analyze(model, plan, MESH)
    assert ("SV101" in codes(a.findings)) == (not has_ignored_params(installed))


def test_bad_version_is_refused_at_once(model, plan):
    with pytest.raises(ValueError, match="torch version 'two'"):
        sv.analyze(model, plan, MESH, torch_version="two")


def test_report_shows_sv101_for_a_2_6_target(model, plan):
    assert "SV101" in render_report(model, plan, MESH, torch_version="2.6")
    assert "SV101" not in render_report(model, plan, MESH, torch_version="2.7")


def test_cli_report_shows_sv101_for_a_2_6_target(tmp_path, capsys):
    out = tmp_path / "r.html"
    args = ["report", "zoo:tiny_llama_lora", "--lora", "ignored", "--world-size", "4", "--no-compare", "-o"]
    assert main(args + [str(out), "--torch", "2.6"]) == 0
    assert "SV101" in out.read_text()
    assert main(args + [str(out), "--torch", "2.7", "--force"]) == 0
    assert "SV101" not in out.read_text()


def test_cli_plan_read_and_export_show_sv101_for_a_2_6_target(tmp_path, capsys):
    path = tmp_path / "plan.json"
    assert main(["plan", "write", "zoo:tiny_llama_lora", "--lora", "ignored", "-o", str(path)]) == 0
    capsys.readouterr()
    assert main(["plan", "read", str(path), "--model", "zoo:tiny_llama_lora", "--world-size", "4", "--torch", "2.6"]) == 0
    assert "SV101" in capsys.readouterr().out
    assert main(["export", "zoo:tiny_llama_lora", "--lora", "ignored", "--world-size", "4", "--torch", "2.6",
                 "-o", str(tmp_path / "a.py")]) == 0
    assert "SV101" in capsys.readouterr().err


def test_widget_findings_follow_the_export_target(model, plan):
    installed_sv101 = not has_ignored_params(torch.__version__)
    ins = Inspector(model, plan=plan, mesh=MESH)
    assert ("SV101" in codes(ins.findings)) == installed_sv101
    ins.torch_version = "2.6"  # the export panel's release picker
    assert "SV101" in codes(ins.findings)
    assert ins.findings == ins.controller.findings
    assert ins.summary["findings"]["warning"] == sum(f["severity"] == "warning" for f in ins.findings)
    # An edit keeps the target: the new analysis is made for 2.6 too.
    ins.controller.set_mesh(world=2)
    assert ins.mesh.world == 2 and "SV101" in codes(ins.findings)
    ins.torch_version = ""  # back to the installed torch
    assert ("SV101" in codes(ins.findings)) == installed_sv101
