"""analyze and verify never change the user's model: parameters, classes, hooks, buffers."""

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

import shardviz as sv


def tiny_real_lora():
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=64)
    return get_peft_model(LlamaForCausalLM(cfg), LoraConfig(r=4, target_modules="all-linear"))


HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_backward_hooks", "_backward_pre_hooks",
              "_state_dict_hooks", "_load_state_dict_pre_hooks")


def fingerprint(model):
    return {
        "params": [(n, id(p), type(p), p.dtype, p.device.type, p.requires_grad, tuple(p.shape))
                   for n, p in model.named_parameters(remove_duplicate=False)],
        "values": {n: p.detach().clone() for n, p in model.named_parameters()},
        "buffers": [(n, id(b), b.device.type) for n, b in model.named_buffers()],
        "classes": [(n, type(m)) for n, m in model.named_modules(remove_duplicate=False)],
        "hooks": [(n, h, len(getattr(m, h))) for n, m in model.named_modules() for h in HOOK_DICTS],
        "training": [m.training for m in model.modules()],
    }


def assert_same(before, after):
    for key in ("params", "buffers", "classes", "hooks", "training"):
        assert before[key] == after[key], key
    for name, value in before["values"].items():
        assert torch.equal(value, after["values"][name]), name


def test_analyze_and_verify_leave_a_real_model_alone():
    model = tiny_real_lora()
    before = fingerprint(model)
    for layout in ("sharded", "ignored", "separate"):
        plan = sv.Plan.auto(model, lora=layout)
        a = sv.analyze(model, plan, sv.Mesh(4, replicate=2))
        a.params, a.units  # build the tables too
        assert sv.verify(model, plan, mesh=sv.Mesh(4, replicate=2)).empty
    assert_same(before, fingerprint(model))
    assert not torch.distributed.is_initialized()  # the fake group is gone again


def test_failed_analysis_leaves_model_alone():
    model = tiny_real_lora()
    before = fingerprint(model)
    with pytest.raises(ValueError, match="no module named 'nope'"):
        sv.analyze(model, sv.Plan(["nope"]), sv.Mesh(2))
    assert_same(before, fingerprint(model))
