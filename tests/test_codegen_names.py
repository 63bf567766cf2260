"""Hostile module names: ModuleDict keys with quotes, backslashes, newlines, unicode, Python
keywords, digits (hypothesis). The exported code must parse, address exactly the intended
modules, and running it must do nothing but apply the plan: the model ends up exactly as
torch's own ``fully_shard`` leaves it when shardviz's oracle applies the same plan."""

from __future__ import annotations

import ast
import keyword

import torch
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from torch import nn

import shardviz as sv
from shardviz.export.oracle import apply_plan, device_mesh, fake_process_group
from exported_code import layout_mismatches, load_exported

NASTY = [
    "0", "7up", "class", "def", "None", "lambda", "import", "quote'", 'dq"', "'''", '"""', "back\\slash",
    "\\n", "new\nline", "tab\t", "ünïcödé", "名前", "🙂", "-dash", "a b", "__init__x", "}{", "#hash",
    "print('pwned')", "__import__('os')", "\x00nul", "\u2028", "'); import os; ('",
]

keys = st.one_of(
    st.sampled_from(NASTY + keyword.kwlist),
    st.text(min_size=1, max_size=10).filter(lambda s: "." not in s),
    st.from_regex(r"[0-9]{1,3}", fullmatch=True),
)


class Leaf(nn.Module):
    def __init__(self, rows):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(rows, 4), requires_grad=False)
        self.adapter = nn.Linear(4, 2, bias=False)  # trainable

    def forward(self, x):
        return x @ self.weight.t()


class Block(nn.Module):
    def __init__(self, inner_key, rows):
        super().__init__()
        self.inner = nn.ModuleDict({inner_key: Leaf(rows)})
        self.norm = nn.LayerNorm(4)


class Root(nn.Module):
    def __init__(self, outer_keys, inner_key):
        super().__init__()
        self.blocks = nn.ModuleDict({k: Block(inner_key, 3 + i) for i, k in enumerate(outer_keys)})
        self.head = nn.Linear(4, 5)


def build(outer_keys, inner_key, seed=0):
    torch.manual_seed(seed)
    return Root(outer_keys, inner_key)


def accepted(outer_keys, inner_key) -> bool:
    try:
        build(outer_keys, inner_key)
    except (KeyError, TypeError, ValueError):
        return False
    return True


def snapshot(model):
    """Everything about the model that applying a plan may change, as plain values."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    params = [(n, isinstance(p, DTensor), tuple(p.to_local().shape if isinstance(p, DTensor) else p.shape),
               p.requires_grad) for n, p in model.named_parameters(remove_duplicate=False)]
    modules = [(n, type(m).__name__, isinstance(m, FSDPModule), sorted(k for k in vars(m) if not k.startswith("_")))
               for n, m in model.named_modules()]
    return params, modules


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(outer=st.lists(keys, min_size=2, max_size=3, unique=True), inner=keys,
       version=st.sampled_from([None, "2.6", "2.7"]), plan_name=st.text(max_size=20))
@example(outer=["class", "quote'\"\\"], inner="0", version="2.6", plan_name="x\n'''\nimport os")
@example(outer=["print('pwned')", "\u2028"], inner="new\nline", version=None, plan_name='"""')
def test_hostile_names(outer, inner, version, plan_name):
    assume(accepted(outer, inner))
    model = build(outer, inner)
    a, b = outer[0], outer[1]
    plan = sv.Plan(
        units=[f"blocks.{a}", f"blocks.{b}.inner.{inner}", ""],
        ignored=[f"blocks.{b}.inner.{inner}.adapter.weight"],
        name=plan_name,
    )
    mesh = sv.Mesh(2)
    code = sv.export_code(model, plan, mesh=mesh, torch_version=version)

    # 1. it parses, and names appear only as string literals handed to get_submodule / IGNORED
    tree = ast.parse(code)
    addressed = [node.args[0].value for node in ast.walk(tree)
                 if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "get_submodule"]
    assert sorted(addressed) == sorted([f"blocks.{a}", f"blocks.{b}.inner.{inner}"])
    ignored = next(node.value for node in ast.walk(tree)
                   if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "IGNORED")
    assert ast.literal_eval(ignored) == plan.ignored
    called = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    assert not called & {"exec", "eval", "__import__", "open", "compile", "print"}

    # 2. running it does exactly what torch's fully_shard does with the same plan
    analysis = sv.analyze(model, plan, mesh)
    module = load_exported(code)
    expected = build(outer, inner)
    with fake_process_group(0, 2):
        dmesh = device_mesh(mesh)
        module.apply_fsdp(model, dmesh)
        assert layout_mismatches(model, analysis, rank=0) == []
        apply_plan(expected, plan, dmesh)
        assert snapshot(model) == snapshot(expected)
        fsdp = {n for n, _, is_fsdp, _ in snapshot(model)[1] if is_fsdp}
        assert fsdp == {"", f"blocks.{a}", f"blocks.{b}.inner.{inner}"}
        # the only additions: one forward hook on the root and a post-accumulate-grad hook on each
        # trainable parameter FSDP leaves whole (the gradient average)
        assert len(model._forward_hooks) == len(expected._forward_hooks) + 1
        for (n, p), (_, q) in zip(model.named_parameters(), expected.named_parameters()):
            assert torch.equal(p.detach().to_local() if hasattr(p, "to_local") else p.detach(),
                               q.detach().to_local() if hasattr(q, "to_local") else q.detach()), n


def test_nasty_list_is_accepted_by_torch():
    """The fixed examples really are module names torch accepts (else the test proves nothing)."""
    ok = [k for k in NASTY if accepted([k, "x"], "y")]
    assert len(ok) >= len(NASTY) - 2
