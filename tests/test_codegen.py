"""``sv.export_code``: what the exported module says, and what it does under a fake process group.

The fake process group makes collectives no-ops but shapes and placements real, so every check
here runs in-process in well under a second per case. Real collectives (the gradient average,
the broadcast, the match with a single-process reference) are in test_codegen_torchrun.py.
"""

from __future__ import annotations

import ast

import black
import pytest
import torch
from torch import nn

import shardviz as sv
from shardviz import zoo
from shardviz.finding import PlanError
from shardviz.export.oracle import device_mesh, fake_process_group
from exported_code import apply_under_fake_pg, fully_shard_targets, imports_of, layout_mismatches, load_exported, tiny_plans

VERSIONS = ("2.4", "2.5", "2.6", "2.7", "2.8", "2.13", None)


def fresh():
    return zoo.tiny_llama_lora()


# ---------------------------------------------------------------------------
# The text of the export
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("version", VERSIONS)
def test_export_is_black_formatted_python_with_a_header(model, version):
    plan = tiny_plans(model)["ignored-ungrouped" if version == "2.4" else "ignored"]
    code = sv.export_code(model, plan, mesh=sv.Mesh(8), torch_version=version)
    ast.parse(code)
    assert black.format_str(code, mode=black.Mode()) == code
    first = code.splitlines()[0]
    assert first.startswith("# shardviz export: plan ")
    head = " ".join(line[2:] for line in code.splitlines()[:6] if line.startswith("#"))
    assert repr(plan.name) in head
    assert "FSDP 8 ranks" in head
    assert (f"target torch {version}" if version else "release detected when it runs") in head
    assert "import shardviz" not in code and "from shardviz" not in code  # self-contained


@pytest.mark.parametrize("version", ["2.4", "2.5", "2.6", "2.7", "2.13"])
def test_import_path_and_keywords_follow_the_release(model, version):
    plan = tiny_plans(model)["ignored-ungrouped"]
    code = sv.export_code(model, plan, mesh=sv.Mesh(4), torch_version=version)
    imports = imports_of(code)
    release = tuple(int(x) for x in version.split("."))
    path = "torch.distributed.fsdp" if release >= (2, 6) else "torch.distributed._composable.fsdp"
    assert f"{path}:fully_shard" in imports
    assert [i for i in imports if i.endswith(":fully_shard")] == [f"{path}:fully_shard"]
    dtensor = "torch.distributed.tensor" if release >= (2, 5) else "torch.distributed._tensor"
    assert f"{dtensor}:DTensor" in imports
    calls = [n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "fully_shard"]
    keywords = {k.arg for c in calls for k in c.keywords}
    if release >= (2, 7):
        assert "ignored_params" in keywords and "_hidden_from_fully_shard" not in code
    else:
        constants = {n.value for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Constant)}
        assert "ignored_params" not in keywords and "ignored_params" not in constants
        assert "with _hidden_from_fully_shard(model, ignored):" in code
    assert f"if _RELEASE < {min(max(release, (2, 4)), (2, 7))!r}:" in code  # refuses an older torch


def test_detecting_export_has_every_path(model):
    code = sv.export_code(model, tiny_plans(model)["ignored"], mesh=sv.Mesh(4), torch_version=None)
    imports = imports_of(code)
    assert "torch.distributed.fsdp:fully_shard" in imports
    assert "torch.distributed._composable.fsdp:fully_shard" in imports
    assert "_accepts_ignored_params()" in code and "_hidden_from_fully_shard" in code
    assert "if _RELEASE < (2, 5):" in code  # the grouped [norm, lm_head] call needs 2.5


def test_no_ignored_parameters_no_keep_out_machinery(model):
    code = sv.export_code(model, tiny_plans(model)["sharded"], mesh=sv.Mesh(4), torch_version=None)
    assert "IGNORED" not in code and "_hidden_from_fully_shard" not in code and "keep_out" not in code


def test_modules_addressed_by_literals_bottom_up(model):
    plan = tiny_plans(model)["ignored"]
    code = sv.export_code(model, plan, mesh=sv.Mesh(4), torch_version="2.13")
    tree = ast.parse(code)
    # a name is a string literal, or the variable of a loop over a tuple of string literals
    loop_names = {n.target.id for n in ast.walk(tree) if isinstance(n, ast.For) and isinstance(n.iter, ast.Tuple)
                  and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in n.iter.elts)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "get_submodule":
            (arg,) = node.args
            assert (isinstance(arg, ast.Constant) and isinstance(arg.value, str)) or getattr(arg, "id", None) in loop_names
    targets = fully_shard_targets(code)
    layout = sv.analyze(model, plan, sv.Mesh(4)).layout
    assert targets == [plan.units[u].modules for u in layout.order]
    assert targets[-1] == ("",)  # the root last


def test_unit_options_and_training_defaults(model):
    layers = [f"base_model.model.model.layers.{i}" for i in range(2)]
    plan = sv.Plan([sv.Unit(layers[0], reshard_after_forward=False, param_dtype="bfloat16"),
                    sv.Unit(layers[1], offload=True), sv.Unit("", reshard_after_forward=True)])
    code = sv.export_code(model, plan, mesh=sv.Mesh(4), training=sv.Training(reduce_dtype="float32"),
                          torch_version="2.6")
    flat = "".join(code.split())
    assert "reshard_after_forward=False" in flat
    assert "mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,reduce_dtype=torch.float32)" in flat
    assert "offload_policy=CPUOffloadPolicy()" in flat
    assert "torch.distributed.fsdp:MixedPrecisionPolicy" in imports_of(code)
    plain = sv.export_code(model, sv.Plan.auto(model), mesh=sv.Mesh(4), torch_version="2.6")
    assert "MixedPrecisionPolicy" not in plain and "reshard_after_forward" not in plain


def test_hsdp_mesh(model):
    code = sv.export_code(model, tiny_plans(model)["ignored"], mesh=sv.Mesh(shard=2, replicate=2))
    assert "MESH_SHAPE = (2, 2)" in code and 'MESH_DIM_NAMES = ("replicate", "shard")' in code


# ---------------------------------------------------------------------------
# Refusals
# ---------------------------------------------------------------------------
class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight


def test_refuses_what_torch_would_refuse(model):
    with pytest.raises(PlanError, match="SV001"):
        sv.export_code(Tied(), sv.Plan(["embed", "head", ""]), mesh=sv.Mesh(2))
    with pytest.raises(PlanError, match="SV110"):
        sv.export_code(model, tiny_plans(model)["ignored"], mesh=sv.Mesh(2), torch_version="2.4")
    with pytest.raises(ValueError, match="FSDP2"):
        sv.export_code(model, tiny_plans(model)["ignored"], mesh=sv.Mesh(2), torch_version="2.3")
    with pytest.raises(ValueError, match="torch version"):
        sv.export_code(model, tiny_plans(model)["ignored"], mesh=sv.Mesh(2), torch_version="banana")
    with pytest.raises(ValueError, match="Mesh"):
        sv.export_code(model, tiny_plans(model)["ignored"], mesh=(2,))


def test_exported_code_refuses_an_older_torch(model, monkeypatch):
    code = sv.export_code(model, tiny_plans(model)["ignored"], mesh=sv.Mesh(2), torch_version="2.7")
    monkeypatch.setattr(torch, "__version__", "2.6.0+cu124")
    with pytest.raises(ImportError, match=r"needs torch >= 2.7; installed: torch 2.6.0"):
        load_exported(code)


def test_importing_the_export_does_nothing(model):
    import torch.distributed as dist

    code = sv.export_code(model, tiny_plans(model)["ignored"], mesh=sv.Mesh(2))
    module = load_exported(code)
    assert callable(module.apply_fsdp) and not dist.is_initialized()
    assert all(p.device.type == "cpu" and not hasattr(p, "_local_tensor") for p in model.parameters())


# ---------------------------------------------------------------------------
# Applying it (fake process group): the prediction holds on every rank, for every release
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("layout", ["ignored", "sharded"])
def test_applied_layout_matches_prediction(version, layout):
    model = fresh()
    plans = tiny_plans(model)
    plan = plans["ignored-ungrouped" if version == "2.4" and layout == "ignored" else layout]
    if version == "2.4" and layout == "sharded":
        plan = sv.Plan([m for u in plan.units for m in u.modules])
    for mesh, rank in ((sv.Mesh(4), 3), (sv.Mesh(shard=2, replicate=2), 2)):
        model = fresh()
        analysis = sv.analyze(model, plan, mesh)
        code = sv.export_code(model, plan, mesh=mesh, torch_version=version)
        before = [n for n, _ in model.named_parameters(remove_duplicate=False)]
        mismatches = apply_under_fake_pg(code, model, mesh, rank,
                                         lambda m, _: layout_mismatches(m, analysis, rank))  # noqa: B023 - called at once
        assert mismatches == []
        assert [n for n, _ in model.named_parameters(remove_duplicate=False)] == before


def test_applied_like_torch_oracle(model):
    """Same DTensors and local shapes as shardviz's own oracle (torch's fully_shard with ignored_params)."""
    from shardviz.export.oracle import torch_layout

    plan = tiny_plans(model)["ignored"]
    mesh = sv.Mesh(4)
    oracle = torch_layout(model, plan, mesh, rank=3)
    model = fresh()  # the shared fixture stays unsharded: the export is applied to a fresh copy

    def read(m, _):
        from torch.distributed.tensor import DTensor

        return {n: (isinstance(p, DTensor), tuple(p.to_local().shape) if isinstance(p, DTensor) else tuple(p.shape))
                for n, p in m.named_parameters(remove_duplicate=False)}

    got = apply_under_fake_pg(sv.export_code(model, plan, mesh=mesh, torch_version="2.6"), model, mesh, 3, read)
    want = {r.fqn: (r.status == "sharded", tuple(r.local_shape)) for r in oracle.itertuples()}
    assert got == want


# ---------------------------------------------------------------------------
# The gradient average of parameters FSDP does not shard (collectives are no-ops here, so the
# "average" of one rank's gradient is that gradient / world: enough to check the bookkeeping)
# ---------------------------------------------------------------------------
class TwoBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.frozen = nn.Linear(4, 4).requires_grad_(False)

    def forward(self, x, use_b=True):
        y = self.frozen(self.a(x))
        return {"out": y + self.b(x) if use_b else y}


class CountingDist:
    def __init__(self, dist):
        self._dist, self.all_reduces, self.broadcasts = dist, 0, 0

    def all_reduce(self, *a, **k):
        self.all_reduces += 1
        return self._dist.all_reduce(*a, **k)

    def broadcast(self, *a, **k):
        self.broadcasts += 1
        return self._dist.broadcast(*a, **k)

    def __getattr__(self, name):
        return getattr(self._dist, name)


def test_one_flattened_all_reduce_per_backward_and_none_stays_none():
    model = TwoBranch()
    mesh = sv.Mesh(4)
    code = sv.export_code(model, sv.Plan([]), mesh=mesh, torch_version=None)  # nothing sharded: all unmanaged

    def run(m, module):
        counter = CountingDist(module.dist)
        module.dist = counter
        x = torch.randn(3, 4)
        raw = {}
        for name, p in m.named_parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(lambda p, name=name: raw.__setitem__(name, p.grad.clone()))
        m(x, use_b=False)["out"].sum().backward()
        assert counter.all_reduces == 1
        assert m.b.weight.grad is None and m.b.bias.grad is None  # no rank had a gradient: stays None
        torch.testing.assert_close(m.a.weight.grad, raw["a.weight"] / 4)  # sum over ranks / 4
        assert m.frozen.weight.grad is None
        m.zero_grad()
        m(x)["out"].sum().backward()
        assert counter.all_reduces == 2  # one per backward, whatever the number of parameters
        torch.testing.assert_close(m.b.weight.grad, raw["b.weight"] / 4)
        return counter

    apply_under_fake_pg(code, model, mesh, 1, run)


def test_trainable_unsharded_parameters_broadcast_once():
    model = fresh()
    plan = tiny_plans(model)["ignored"]

    # the broadcast happens inside apply_fsdp: count it by patching the module before
    module = load_exported(sv.export_code(model, plan, mesh=sv.Mesh(4)))
    counter = CountingDist(module.dist)
    module.dist = counter
    with fake_process_group(1, 4):
        module.apply_fsdp(model, device_mesh(sv.Mesh(4)))
    assert counter.broadcasts == 1
    sharded = fresh()
    module = load_exported(sv.export_code(sharded, tiny_plans(sharded)["sharded"], mesh=sv.Mesh(4)))
    counter = CountingDist(module.dist)
    module.dist = counter
    with fake_process_group(1, 4):
        module.apply_fsdp(sharded, device_mesh(sv.Mesh(4)))
    assert counter.broadcasts == 0  # nothing outside FSDP is trainable: no broadcast, no hooks


def test_a_training_step_runs_after_apply():
    """Forward, backward and an optimizer step go through (values are meaningless under the fake group)."""
    model = fresh()
    plan = tiny_plans(model)["ignored"]

    def step(m, module):
        opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-3)
        loss = m(**zoo.tiny_batch()).loss
        loss.backward()
        lora = [p for n, p in m.named_parameters() if "lora_B" in n]
        assert all(p.grad is not None for p in lora)
        opt.step()
        opt.zero_grad()

    apply_under_fake_pg(sv.export_code(model, plan, mesh=sv.Mesh(2), torch_version=None), model, sv.Mesh(2), 0, step)


def test_grad_average_on_a_mesh_smaller_than_the_world():
    """A 2-D data-parallel mesh inside a larger world (e.g. beside tensor parallelism): the sum runs
    over each mesh dimension in turn, then divides by the mesh size."""
    from torch.distributed.device_mesh import DeviceMesh

    model = TwoBranch()
    mesh = sv.Mesh(shard=2, replicate=2)
    module = load_exported(sv.export_code(model, sv.Plan([]), mesh=mesh))
    counter = CountingDist(module.dist)
    module.dist = counter
    with fake_process_group(0, 8):
        dmesh = DeviceMesh("cpu", torch.arange(4).view(2, 2), mesh_dim_names=("replicate", "shard"))
        module.apply_fsdp(model, dmesh)
        assert counter.broadcasts == 2  # one per mesh dimension
        raw = model.a.weight.detach().clone()
        model(torch.randn(3, 4))["out"].sum().backward()
        assert counter.all_reduces == 2
        x = torch.randn(3, 4)
        model.zero_grad()
        out = model(x)["out"].sum()
        (expected,) = torch.autograd.grad(model(x)["out"].sum(), model.b.weight)
        out.backward()
        torch.testing.assert_close(model.b.weight.grad, expected / 4)
        assert torch.equal(model.a.weight.detach(), raw)


# ---------------------------------------------------------------------------
# Activation checkpointing (plan.checkpoint)
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("version", ["2.4", "2.6", "2.13", None])
@pytest.mark.parametrize("layout", ["ignored", "separate"])
def test_checkpointed_plan_wraps_then_shards_the_wrappers(version, layout):
    """checkpoint_wrapper first, fully_shard on the wrapper; units inside a wrapped block (separate
    LoRA) are found although wrapping renamed their paths; placements equal the prediction."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
    from torch.distributed.fsdp import FSDPModule

    model = fresh()
    plan = sv.Plan.auto(model, lora=layout, checkpoint="blocks")
    if version == "2.4":
        plan = sv.Plan([m for u in plan.units for m in u.modules], plan.ignored, checkpoint=plan.checkpoint)
    mesh = sv.Mesh(4)
    analysis = sv.analyze(model, plan, mesh)
    code = sv.export_code(model, plan, mesh=mesh, torch_version=version)
    assert "_apply_checkpointing(model, CHECKPOINT)" in code

    def check(m, _):
        for name in plan.checkpoint:
            wrapper = m.get_submodule(name)
            assert isinstance(wrapper, CheckpointWrapper) and isinstance(wrapper, FSDPModule), name
        renamed = nn.Module()
        renamed.named_parameters = lambda remove_duplicate=True: (
            (n.replace("._checkpoint_wrapped_module", ""), p) for n, p in m.named_parameters(remove_duplicate=False))
        return layout_mismatches(renamed, analysis, 3)

    assert apply_under_fake_pg(code, model, mesh, 3, check) == []


def test_checkpoint_names_are_checked():
    model = fresh()
    plan = sv.Plan.auto(model, lora="sharded").with_checkpoint(["base_model.model.model.layerz.0"])
    with pytest.raises(ValueError, match="checkpoint: no module named 'base_model.model.model.layerz.0'"):
        sv.export_code(model, plan)
