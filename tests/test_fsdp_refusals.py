"""Every refusal of torch's ``fully_shard`` the engine models, each pinned against torch itself.

Each test builds a plan torch refuses, checks that ``analyze`` names the code, the offending module
or parameter and a fix, that torch raises on the same plan (real ``fully_shard``, fake process
group), and that the engine's fix is a plan both accept.
"""

import pytest
import torch
from torch import nn

import shardviz as sv
from handmade import Stages
from shardviz.export.oracle import apply_plan, device_mesh, fake_process_group, meta_copy

MESH = sv.Mesh(4)


def torch_applies(model, plan, mesh=MESH):
    """Apply ``plan`` with torch's fully_shard on a meta copy (raises what torch raises)."""
    with fake_process_group(0, mesh.world):
        apply_plan(meta_copy(model), plan, device_mesh(mesh))


class ListWithForward(nn.ModuleList):
    def forward(self, x):
        for m in self:
            x = m(x)
        return x


@pytest.mark.parametrize("unit,children", [
    ("blocks.0", ["blocks.0.0", "blocks.0.1"]),
    ("blocks", ["blocks.0.0", "blocks.0.1", "blocks.1.0", "blocks.1.1"]),  # the children are containers too
    ("heads", ["heads.a", "heads.b"]),
])
def test_bare_container_refused_like_torch(unit, children):
    model, plan = Stages(), sv.Plan([unit, ""])
    with pytest.raises(sv.PlanError, match="SV007") as exc:
        sv.analyze(model, plan, MESH)
    (finding,) = exc.value.findings
    assert finding.fqns == (unit,) and repr(unit) in finding.message
    with pytest.raises(ValueError, match="containers that do not implement forward"):
        torch_applies(model, plan)
    # The fix the finding names: one unit per child; torch accepts it and verify agrees.
    assert all(repr(c) in finding.fix for c in children)
    fixed = sv.fix_plan(sv.analyze(model, plan, MESH, strict=False), finding)
    assert {m for u in fixed.units for m in u.modules} == set(children) | {""}
    assert not sv.analyze(model, fixed, MESH).errors
    torch_applies(model, fixed)
    assert sv.verify(model, fixed, mesh=MESH).empty


def test_container_with_forward_and_grouped_containers_are_accepted_like_torch():
    model = Stages()
    model.blocks[0] = ListWithForward([nn.Linear(4, 4), nn.Linear(4, 4)])
    for plan in (sv.Plan(["blocks.0", ""]), sv.Plan([["blocks.1", "heads"], ""])):
        assert not sv.analyze(model, plan, MESH).errors
        torch_applies(model, plan)
        assert sv.verify(model, plan, mesh=MESH).empty


def test_non_contiguous_parameter_refused_like_torch():
    model = Stages()
    model.blocks[1][0].weight = nn.Parameter(torch.empty(6, 4).t())  # (4, 6) with strides (1, 4)
    plan = sv.Plan(["blocks.1.0", ""])
    with pytest.raises(sv.PlanError, match="SV008") as exc:
        sv.analyze(model, plan, MESH)
    assert exc.value.findings[0].fqns == ("blocks.1.0.weight",)
    with pytest.raises(NotImplementedError, match="non-contiguous"):
        torch_applies(model, plan)
    # Ignored, it is never sharded: both accept.
    ignored = sv.Plan(["blocks.1.0", ""], ignored=["blocks.1.0.weight"])
    assert not sv.analyze(model, ignored, MESH).errors
    torch_applies(model, ignored)
    assert sv.verify(model, ignored, mesh=MESH).empty


def test_auto_plan_never_picks_a_bare_container():
    model = Stages()
    plan = sv.Plan.auto(model)
    tree = sv.ModelTree(model)
    assert not any(tree.module(m).bare_container for u in plan.units if not u.is_grouped for m in u.modules)
    assert {"blocks.0.0", "blocks.0.1", "blocks.1.0", "blocks.1.1"} <= {m for u in plan.units for m in u.modules}
    assert not sv.analyze(model, plan, MESH).errors
    torch_applies(model, plan)
    assert sv.verify(model, plan, mesh=MESH).empty


class SharedModule(nn.Module):
    """Zamba: the same module object reached from two blocks (not only a tied parameter)."""

    def __init__(self):
        super().__init__()
        shared = nn.Linear(4, 4)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(4, 4), shared) for _ in range(2)])


def test_module_reached_by_two_calls_refused_like_torch():
    model, plan = SharedModule(), sv.Plan(["blocks.0", "blocks.1", ""])
    tree = sv.ModelTree(model)
    assert tree.param("blocks.0.1.weight").fqns == ("blocks.0.1.weight", "blocks.1.1.weight")
    assert set(tree.param_index) == {n for n, _ in model.named_parameters(remove_duplicate=False)}
    with pytest.raises(sv.PlanError, match="SV001.*second fully_shard call"):
        sv.analyze(model, plan, MESH)
    with pytest.raises(RuntimeError, match="overlapping meshes"):
        torch_applies(model, plan)
    # One call for both blocks, or the shared module as its own call: both accepted, verify agrees.
    for fixed in (sv.Plan([["blocks.0", "blocks.1"], ""]), sv.Plan(["blocks.0.1", "blocks.0", "blocks.1", ""])):
        assert not sv.analyze(model, fixed, MESH).errors
        torch_applies(model, fixed)
        assert sv.verify(model, fixed, mesh=MESH).empty
