"""The examples in examples/capture/ run, and their functions come back as the calls they make."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

import shardviz as sv

sys.path.insert(0, os.path.dirname(__file__))
from torch_truth import tiny_lora  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "capture"


def load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_torchtune_style_shard_model_is_layers_then_root():
    tune = load("torchtune_shard_model")
    model = tiny_lora()
    plan = sv.capture(tune.shard_model, model, ["base_model.model.model.embed_tokens"], world_size=8, cpu_offload=True)
    names = [u.name for u in plan.units]
    assert names == ["base_model.model.model.layers.1", "base_model.model.model.layers.0",
                     "base_model.model.model.embed_tokens", "<root>"]
    assert all(u.offload and u.param_dtype is None and u.reshard_after_forward is True for u in plan.units)


def test_torchtitan_style_function_comes_back_whole():
    titan = load("torchtitan_apply_fsdp")
    plan = sv.capture(titan.apply_fsdp, tiny_lora(), world_size=8)
    layers = ["base_model.model.model.layers.0", "base_model.model.model.layers.1"]
    assert plan.checkpoint == tuple(layers)
    assert [plan.unit_of(b).reshard_after_forward for b in layers] == [True, False]
    assert all(u.param_dtype == "bfloat16" and u.reduce_dtype == "float32" for u in plan.units)
    assert plan.prefetch == ((layers[0], "forward", (layers[1],)),)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["torchtune_shard_model", "torchtitan_apply_fsdp"])
def test_example_runs(name):
    assert load(name).main().units
