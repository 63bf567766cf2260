"""SV112 and the exported optimizer_param_groups, against torch's own foreach optimizer."""

import pytest
import torch

import shardviz as sv
from handmade import Odd
from exported_code import load_exported
from shardviz.export.oracle import device_mesh, fake_process_group

MIXED = sv.Plan(["a", ""], ignored=["b.weight", "b.bias"])  # a and c sharded, b whole: all trainable


def codes(model, plan):
    return {f.code for f in sv.analyze(model, plan, sv.Mesh(2)).findings}


def test_finding_fires_only_for_mixed_trainable_kinds():
    assert "SV112" in codes(Odd(), MIXED)
    assert "SV112" not in codes(Odd(), sv.Plan(["a", ""]))  # all sharded
    frozen_rest = Odd()
    for name, p in frozen_rest.named_parameters():
        p.requires_grad_(name.startswith("b."))
    assert "SV112" not in codes(frozen_rest, MIXED)  # the only trainable ones are whole


def test_param_groups_let_a_foreach_optimizer_step():
    model = Odd()
    exported = load_exported(sv.export_code(model, MIXED, mesh=sv.Mesh(2)))
    with fake_process_group(0, 2):
        exported.apply_fsdp(model, device_mesh(sv.Mesh(2)))
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        # torch refuses one group that holds both kinds ...
        with pytest.raises(RuntimeError, match="mixed torch.Tensor and DTensor"):
            torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], foreach=True).step()
        # ... and steps with the groups the export builds
        groups = exported.optimizer_param_groups(model)
        assert len(groups) == 2
        torch.optim.AdamW(groups, foreach=True).step()
