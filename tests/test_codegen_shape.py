"""The shape of an export a person reads (issue 19): calls that share their options written as one
loop, imports only for the releases the code accepts, and the plan's name the same as elsewhere."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import shardviz as sv
from shardviz.export import codegen
from shardviz.export.codegen import LOOP_FROM
from exported_code import apply_under_fake_pg, fully_shard_targets, imports_of, layout_mismatches, tiny_plans

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
MP = sv.Training(param_dtype="bfloat16", reduce_dtype="float32")


@pytest.fixture(scope="module")
def qwen():
    return sv.load_model(EXAMPLES / "qwen2.5-0.5b", adapter=EXAMPLES / "qwen2.5-0.5b-lora")


@pytest.mark.parametrize("checkpoint", [None, "blocks"])
@pytest.mark.parametrize("lora", ["sharded", "ignored"])
def test_blocks_with_the_same_options_are_one_loop(qwen, lora, checkpoint, monkeypatch):
    plan = sv.Plan.auto(qwen, lora=lora, checkpoint=checkpoint)
    code = sv.export_code(qwen, plan, mesh=sv.Mesh(8), training=MP, torch_version="2.6")
    (apply_fsdp,) = [n for n in ast.parse(code).body if isinstance(n, ast.FunctionDef) and n.name == "apply_fsdp"]
    calls = [n for n in ast.walk(apply_fsdp) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "fully_shard"]
    loops = [n for n in ast.walk(apply_fsdp) if isinstance(n, ast.For)]
    assert len(loops) == 1 and len(calls) <= 4  # the 24 blocks in one loop; embeddings, head, root spelled out
    assert len(loops[0].iter.elts) >= 24
    monkeypatch.setattr(codegen, "LOOP_FROM", 10**6)
    unrolled = sv.export_code(qwen, plan, mesh=sv.Mesh(8), training=MP, torch_version="2.6")
    assert len(code.splitlines()) < len(unrolled.splitlines()) - 100  # unrolled: one fully_shard call per block
    order = sv.analyze(qwen, plan, sv.Mesh(8)).layout.order
    assert fully_shard_targets(code) == [plan.units[u].modules for u in order]  # still bottom-up, every call


def test_a_loop_applies_what_the_plan_says():
    model = sv.zoo.tiny_llama_lora()
    layers = [f"base_model.model.model.layers.{i}" for i in range(2)]
    mlps = [f"{layer}.mlp" for layer in layers]
    attn = [f"{layer}.self_attn" for layer in layers]
    plan = sv.Plan(mlps + attn + [sv.Unit(layers[0], reshard_after_forward=False), layers[1], ""])
    code = sv.export_code(model, plan, mesh=sv.Mesh(4), torch_version="2.13")
    assert len(mlps + attn) >= LOOP_FROM and "for name in (" in code
    assert fully_shard_targets(code) == [plan.units[u].modules for u in sv.analyze(model, plan, sv.Mesh(4)).layout.order]
    analysis = sv.analyze(model, plan, sv.Mesh(4))
    assert apply_under_fake_pg(code, model, sv.Mesh(4), 1, lambda m, _: layout_mismatches(m, analysis, 1)) == []


def test_calls_with_other_options_are_not_looped(model):
    layers = [f"base_model.model.model.layers.{i}" for i in range(2)]
    plan = sv.Plan([f"{layers[0]}.mlp", sv.Unit(f"{layers[1]}.mlp", param_dtype="bfloat16"), f"{layers[0]}.self_attn", ""])
    code = sv.export_code(model, plan, mesh=sv.Mesh(4), torch_version="2.13")
    assert "for name in (" not in code


def test_detected_release_carries_no_branch_below_the_target(model):
    grouped = sv.export_code(model, tiny_plans(model)["ignored"], mesh=sv.Mesh(4))  # [norm, lm_head]: 2.5 on
    assert "torch >= 2.5" in grouped.splitlines()[0] + grouped.splitlines()[1]
    assert "if _RELEASE < (2, 5):" in grouped
    assert "torch.distributed._tensor:DTensor" not in imports_of(grouped)  # 2.4's DTensor path
    assert "torch.distributed.tensor:DTensor" in imports_of(grouped)
    assert "torch 2.4" not in grouped
    flat = sv.export_code(model, tiny_plans(model)["ignored-ungrouped"], mesh=sv.Mesh(4))  # 2.4 on: both paths
    assert {"torch.distributed._tensor:DTensor", "torch.distributed.tensor:DTensor"} <= set(imports_of(flat))
