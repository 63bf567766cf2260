"""``shardviz/export_runtime.py``, the helpers every exported module carries, imported and tested directly.

``export_code`` pastes their source into each export; the first test checks it is pasted verbatim,
so what is tested here is what runs in users' training scripts.
"""

from __future__ import annotations

import ast
import contextlib
import copy
from pathlib import Path

import black
import pytest
import torch
import torch.distributed as dist
from torch import nn

import shardviz as sv
from shardviz.export import codegen
from shardviz import export_runtime as rt, zoo

SOURCE = Path(rt.__file__).read_text()
DEFINITIONS = [n.name for n in ast.parse(SOURCE).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]


@contextlib.contextmanager
def single_rank_gloo():
    """A real one-rank gloo group: collectives run (and are identities), nothing is launched."""
    assert not dist.is_initialized()
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_every_helper_is_pasted_verbatim_into_exports():
    assert black.format_str(SOURCE, mode=black.Mode()) == SOURCE  # the export is black-formatted too
    assert set(DEFINITIONS) == set(codegen.RUNTIME_ALWAYS) | {codegen.RUNTIME_HIDE, codegen.RUNTIME_CHECKPOINT,
                                                              codegen.RUNTIME_CHECKPOINT_WRAP, *codegen.RUNTIME_SELECTIVE,
                                                              codegen.RUNTIME_ACCUMULATE}
    model = zoo.tiny_llama_lora()
    blocks = sv.Plan.auto(model, lora="ignored", checkpoint="blocks").checkpoint
    plan = sv.Plan.auto(model, lora="ignored").with_checkpoint({blocks[0]: "full", blocks[1]: "selective"})
    everything = sv.export_code(model, plan, mesh=sv.Mesh(2), training=sv.Training(grad_accum=2), torch_version="2.6")
    plain = sv.export_code(model, sv.Plan.auto(model, lora="sharded"), mesh=sv.Mesh(2), torch_version="2.7")
    for name in DEFINITIONS:
        assert codegen.runtime_source([name]) in everything, name
    assert codegen.RUNTIME_HIDE not in plain and codegen.RUNTIME_CHECKPOINT not in plain  # only what is needed
    full_only = sv.export_code(model, sv.Plan.auto(model, checkpoint="blocks"), mesh=sv.Mesh(2), torch_version="2.7")
    assert codegen.RUNTIME_CHECKPOINT in full_only
    assert not any(f"def {n}(" in full_only for n in codegen.RUNTIME_SELECTIVE)
    imports = [n for n in ast.walk(ast.parse(everything)) if isinstance(n, (ast.Import, ast.ImportFrom))]
    modules = {a.name for n in imports if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module for n in imports if isinstance(n, ast.ImportFrom)}
    assert {m.split(".")[0] for m in modules} <= {"contextlib", "re", "torch", "inspect"}, modules  # torch only


def test_hidden_from_fully_shard_restores_the_same_objects_in_order():
    model = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 2))
    keep = [model[0].bias, model[1].weight]
    before = [(m, list(m._parameters.items())) for m in model.modules()]
    with rt._hidden_from_fully_shard(model, keep):
        assert model[0].bias is None and model[1].weight is None
        assert [n for n, _ in model.named_parameters()] == ["0.weight", "1.bias"]
    assert [(m, list(m._parameters.items())) for m in model.modules()] == before
    with pytest.raises(RuntimeError), rt._hidden_from_fully_shard(model, keep):
        raise RuntimeError("fully_shard failed")
    assert [(m, list(m._parameters.items())) for m in model.modules()] == before


def test_apply_checkpointing_recomputes_and_keeps_gradients():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    model = zoo.tiny_llama_lora()
    reference = copy.deepcopy(model)
    names = ["base_model.model.model.layers.0", "base_model.model.model.layers.1"]
    inner = model.get_submodule(names[0] + ".mlp")  # resolved before wrapping; its path changes
    calls = []
    inner.register_forward_pre_hook(lambda *_: calls.append(1))
    wrappers = rt._apply_checkpointing(model, names)

    assert list(wrappers) == names
    for name in names:
        assert isinstance(model.get_submodule(name), CheckpointWrapper) and model.get_submodule(name) is wrappers[name]
    assert model.get_submodule(names[0] + "._checkpoint_wrapped_module.mlp") is inner
    # same parameters, same objects, only renamed below the wrapped blocks
    strip = lambda n: n.replace("._checkpoint_wrapped_module", "")  # noqa: E731
    assert [strip(n) for n, _ in model.named_parameters()] == [n for n, _ in reference.named_parameters()]

    model.train()
    reference.train()
    batch = zoo.tiny_batch(seed=3)
    model(**batch).loss.backward()
    assert len(calls) == 2  # forward, then recomputed in backward
    reference(**batch).loss.backward()
    got = {strip(n): p.grad for n, p in model.named_parameters() if p.requires_grad}
    for n, p in reference.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(got[n], p.grad, rtol=0, atol=0)


def test_selective_checkpointing_saves_every_other_mm_and_recomputes_the_rest(monkeypatch):
    """torchtitan's selective op policy: in a block, the 1st, 3rd, ... ``mm`` outputs are saved, the
    2nd, 4th, ... recomputed, as is every op outside the save list; the gradients those of the
    plain model."""
    import torch.utils.checkpoint as tc
    from torch.utils.checkpoint import CheckpointPolicy

    model = zoo.tiny_llama_lora()
    reference = copy.deepcopy(model)
    names = ["base_model.model.model.layers.0", "base_model.model.model.layers.1"]
    decisions = {"forward": [], "recompute": []}
    original = tc.create_selective_checkpoint_contexts

    def recording(policy):
        def spy(ctx, func, *args, **kwargs):
            out = policy(ctx, func, *args, **kwargs)
            decisions["recompute" if ctx.is_recompute else "forward"].append((func, out))
            return out

        return original(spy)

    monkeypatch.setattr(tc, "create_selective_checkpoint_contexts", recording)
    rt._apply_checkpointing(model, names, dict.fromkeys(names[1:], rt._selective_checkpoint_context))
    model.train()
    reference.train()
    batch = zoo.tiny_batch(seed=3)
    # use_cache=False: with the config's use_cache=True, the key/value cache grows again in the
    # recomputation and torch raises (see test_activation_truth.py, use_cache)
    model(**batch, use_cache=False).loss.backward()
    reference(**batch, use_cache=False).loss.backward()
    strip = lambda n: n.replace("._checkpoint_wrapped_module", "")  # noqa: E731
    got = {strip(n): p.grad for n, p in model.named_parameters() if p.requires_grad}
    for n, p in reference.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(got[n], p.grad)
    mm = torch.ops.aten.mm.default
    mms = [d for f, d in decisions["forward"] if f == mm]
    assert len(mms) >= 4 and mms[0::2] == [CheckpointPolicy.MUST_SAVE] * len(mms[0::2])
    assert mms[1::2] == [CheckpointPolicy.PREFER_RECOMPUTE] * len(mms[1::2])
    assert all(d == CheckpointPolicy.PREFER_RECOMPUTE for f, d in decisions["forward"] if f not in rt._sac_save_ops())
    # recent torch replays the forward's decisions in the recomputation without asking the policy again
    recomputed = [d for f, d in decisions["recompute"] if f == mm]
    assert recomputed == mms[: len(recomputed)]


def test_tensors_and_common_dtype():
    a, b, c = torch.ones(1), torch.zeros(2, dtype=torch.bfloat16), torch.ones(3, dtype=torch.float64)
    assert list(rt._tensors({"x": [a, (b, "s")], "y": None, "z": c})) == [a, b, c]
    assert rt._common_dtype([b, a]) == torch.float32 and rt._common_dtype([a, c, b]) == torch.float64


def test_optimizer_param_groups_separates_dtensors():
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    from shardviz.export.oracle import device_mesh, fake_process_group

    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    model[1].requires_grad_(False)
    assert rt.optimizer_param_groups(model) == [{"params": [model[0].weight, model[0].bias]}]
    with fake_process_group(0, 2):
        mesh = device_mesh(sv.Mesh(2))
        model[0].weight = nn.Parameter(distribute_tensor(model[0].weight.detach(), mesh, [Shard(0)]))
        groups = rt.optimizer_param_groups(model)
    assert [len(g["params"]) for g in groups] == [1, 1]
    assert isinstance(groups[0]["params"][0], DTensor) and not isinstance(groups[1]["params"][0], DTensor)


def test_grad_averager_one_flat_all_reduce_divides_by_world():
    model = nn.ModuleDict({"a": nn.Linear(3, 2), "b": nn.Linear(3, 2).to(torch.float64)})
    params = list(model.parameters())
    with single_rank_gloo():
        averager = rt._GradAverager(params, [None], world=4)
        for p in params:
            p.register_post_accumulate_grad_hook(averager.queue)
        x = torch.randn(5, 3)
        model["a"](x).sum().backward()
        expected = x.sum(0).expand(2, 3) / 4  # d(sum)/dW = column sums of x, averaged over 4 "ranks"
        torch.testing.assert_close(model["a"].weight.grad, expected)
        assert model["b"].weight.grad is None  # no rank had one: stays None
        assert model["a"].weight.grad.dtype == torch.float32


def test_broadcast_keeps_values_and_dtypes():
    params = [torch.randn(3), torch.randn(2, 2, dtype=torch.float64), torch.randn(4, dtype=torch.bfloat16)]
    before = [p.clone() for p in params]
    with single_rank_gloo():
        mesh = torch.distributed.device_mesh.init_device_mesh("cpu", (1,))
        rt._broadcast(params, mesh, rt._dp_groups(mesh))
    for p, q in zip(params, before):
        assert p.dtype == q.dtype and torch.equal(p, q)
