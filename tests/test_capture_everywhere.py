"""A captured plan goes everywhere a plan goes: the Inspector, compare, the command line, export (with
the accelerate YAML that gives it, checked by running accelerate on that YAML)."""

from __future__ import annotations

import os
import sys

import pytest
import yaml

import shardviz as sv
from shardviz.cli import main

sys.path.insert(0, os.path.dirname(__file__))
from torch_truth import tiny_lora  # noqa: E402

pytest.importorskip("accelerate")
CONFIG = {"fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "mixed_precision": "bf16"}
MY_TRAIN = '''
from torch.distributed.fsdp import fully_shard


def apply_fsdp(model, mesh):
    for layer in model.base_model.model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def apply_fsdp_wrong(model):
    for layer in model.base_model.model.model.layer:
        fully_shard(layer)
    fully_shard(model)
'''


def test_inspector_opens_a_captured_plan_and_edits_start_from_it():
    from shardviz import Inspector

    model = tiny_lora()
    plan = sv.Plan.from_accelerate(model, CONFIG, world_size=8)
    ins = Inspector(model, plan=plan, mesh=sv.Mesh(8))
    assert ins.plan == plan and ins.plan.name.startswith("accelerate 1.")
    ins.controller.toggle_unit("base_model.model.model.layers.0")
    assert ins.plan != plan and ins.plan.name.startswith(plan.name)
    assert ins.plan.origin == plan.origin


def test_compare_takes_captured_plans():
    model = tiny_lora()
    plans = {"accelerate": sv.Plan.from_accelerate(model, CONFIG, world_size=8), "auto": sv.Plan.auto(model)}
    c = sv.compare(model, plans, mesh=sv.Mesh(8))
    table = c.table if hasattr(c, "table") else c
    assert "accelerate" in str(table)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    (tmp_path / "my_train.py").write_text(MY_TRAIN)
    (tmp_path / "fsdp.yaml").write_text(yaml.safe_dump({
        "distributed_type": "FSDP", "mixed_precision": "bf16", "num_processes": 8,
        "fsdp_config": {"fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP"}}))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_cli_report_and_export_read_captured_plans(workdir, capsys):
    model = "zoo:tiny_llama_lora"
    assert main(["report", model, "--accelerate-config", "fsdp.yaml", "--world-size", "8", "-o", "r.html"]) == 0
    assert "accelerate 1." in (workdir / "r.html").read_text()
    assert main(["export", model, "--plan-from", "my_train:apply_fsdp", "--world-size", "8", "-o", "out.py",
                 "--accelerate-yaml", "acc.yaml", "-q"]) == 0
    assert "captured: my_train.apply_fsdp" in (workdir / "out.py").read_text()
    written = (workdir / "acc.yaml").read_text()
    assert "cannot express" in written and "embed_tokens" in written  # accelerate makes calls this plan does not
    assert main(["report", model, "--plan-from", "my_train:apply_fsdp", "--lora", "sharded", "--world-size", "8"]) == 2
    assert "--lora, --plan-from" in capsys.readouterr().err
    assert main(["report", model, "--plan-from", "my_train:nothing", "--world-size", "8"]) == 2
    assert "has no attribute 'nothing'" in capsys.readouterr().err


def test_accelerate_yaml_gives_exactly_the_plan_it_came_from(tmp_path):
    model = tiny_lora()
    plan = sv.Plan.from_accelerate(model, CONFIG, world_size=8)
    text, cannot = plan.to_accelerate(model)
    assert cannot == []
    path = tmp_path / "back.yaml"
    path.write_text(text)
    assert sv.Plan.from_accelerate(model, str(path), world_size=8) == plan


def test_accelerate_yaml_names_what_it_cannot_express():
    model = tiny_lora()
    text, cannot = sv.Plan.auto(model, lora="ignored").to_accelerate(model)
    assert any("kept out of FSDP" in line for line in cannot) and "cannot express" in text


@pytest.mark.parametrize("command", ["report", "export"])
def test_cli_refuses_a_config_accelerate_refuses(workdir, capsys, command):
    """accelerate launch would stop at start-up: exit 2, no verdict, nothing written, the key named
    with its value and the closest valid one."""
    (workdir / "bad.yaml").write_text(yaml.safe_dump({
        "distributed_type": "FSDP", "mixed_precision": "bf16", "num_processes": 8,
        "fsdp_config": {"fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WARP"}}))
    assert main([command, "zoo:tiny_llama_lora", "--accelerate-config", "bad.yaml", "--world-size", "8",
                 "-o", "out"]) == 2
    out = capsys.readouterr()
    assert "fsdp_config.fsdp_auto_wrap_policy is 'TRANSFORMER_BASED_WARP'" in out.err
    assert "did you mean 'TRANSFORMER_BASED_WRAP'?" in out.err
    assert "verdict" not in out.err + out.out and not (workdir / "out").exists()


@pytest.mark.parametrize("command", ["report", "export"])
def test_cli_refuses_a_function_that_raises(workdir, capsys, command):
    assert main([command, "zoo:tiny_llama_lora", "--plan-from", "my_train:apply_fsdp_wrong", "--world-size", "8",
                 "-o", "out"]) == 1
    out = capsys.readouterr()
    assert "SV301" in out.err and "my_train.py:" in out.err and "no attribute 'layer'" in out.err
    assert "verdict" not in out.err + out.out and not (workdir / "out").exists()
