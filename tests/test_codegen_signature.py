"""The bug this project was born from, reproduced and cured.

``fully_shard(..., ignored_params=lora)`` raises ``TypeError`` on torch 2.4-2.6, which have no
such keyword. Here a stand-in ``fully_shard`` carries each of those releases' exact signature
(keyword-only arguments, nothing else) and forwards to the installed torch's real one. The
naive call raises the very ``TypeError`` users hit; the code exported for 2.4, 2.5 and 2.6 (and
the detecting export, which reads the signature) runs against it and keeps every LoRA parameter
whole: the same ``Parameter`` objects, in the same slots, never handed to ``fully_shard``.

The technique (hide the parameters' slots during the calls) rests on one fact of every FSDP2
release: ``_get_managed_states`` collects parameters with ``module.named_parameters(recurse=False)``,
which skips ``None`` slots. The stand-in checks it directly: it records every parameter the real
call could see and asserts no LoRA parameter is among them.
"""

from __future__ import annotations

import inspect

import pytest
import torch.distributed._composable.fsdp as composable_fsdp
import torch.distributed.fsdp as public_fsdp
from torch.distributed.fsdp import MixedPrecisionPolicy, OffloadPolicy
from torch.distributed.fsdp import fully_shard as real_fully_shard
from torch.distributed.tensor import DTensor

import shardviz as sv
from shardviz import zoo
from shardviz.export.oracle import device_mesh, fake_process_group
from exported_code import layout_mismatches, load_exported, tiny_plans

ERROR = "fully_shard() got an unexpected keyword argument 'ignored_params'"


def make_standin(release: str, seen: list):
    """A ``fully_shard`` with the keyword-only signature of ``release``, forwarding to the real one."""
    if release == "2.6":
        def fully_shard(module, *, mesh=None, reshard_after_forward=True, shard_placement_fn=None,
                        mp_policy=MixedPrecisionPolicy(), offload_policy=OffloadPolicy()):
            return forward(module, mesh, reshard_after_forward, mp_policy, offload_policy, shard_placement_fn)
    else:  # 2.4 and 2.5 (2.5 accepts a list of modules; same keywords)
        def fully_shard(module, *, mesh=None, reshard_after_forward=True,
                        mp_policy=MixedPrecisionPolicy(), offload_policy=OffloadPolicy()):
            if release == "2.4" and isinstance(module, list):
                raise TypeError("torch 2.4 fully_shard takes one module")
            return forward(module, mesh, reshard_after_forward, mp_policy, offload_policy, None)

    def forward(module, mesh, rar, mp, offload, placement_fn):
        modules = module if isinstance(module, list) else [module]
        seen.append([p for m in modules for p in m.parameters()])  # what this call can reach
        return real_fully_shard(module, mesh=mesh, reshard_after_forward=rar, mp_policy=mp,
                                offload_policy=offload, shard_placement_fn=placement_fn)

    # torch's is a module-level function: make the error name it the same way (Python >= 3.11
    # prints the code object's qualified name)
    fully_shard.__qualname__ = "fully_shard"
    if hasattr(fully_shard.__code__, "co_qualname"):
        fully_shard.__code__ = fully_shard.__code__.replace(co_qualname="fully_shard")
    return fully_shard


@pytest.fixture
def standin(monkeypatch):
    """Install a stand-in at both import paths; returns (install(release), calls seen)."""
    seen: list = []

    def install(release):
        fn = make_standin(release, seen)
        monkeypatch.setattr(public_fsdp, "fully_shard", fn)
        monkeypatch.setattr(composable_fsdp, "fully_shard", fn)
        return fn

    return install, seen


@pytest.mark.parametrize("release", ["2.4", "2.5", "2.6"])
def test_naive_call_raises_the_type_error(standin, release):
    install, _ = standin
    fully_shard = install(release)
    assert "ignored_params" not in inspect.signature(fully_shard).parameters
    model = zoo.tiny_llama_lora()
    lora = {p for n, p in model.named_parameters() if "lora_" in n}
    with fake_process_group(0, 2):
        mesh = device_mesh(sv.Mesh(2))
        with pytest.raises(TypeError) as info:
            fully_shard(model, mesh=mesh, ignored_params=lora)
    assert str(info.value) == ERROR


@pytest.mark.parametrize("release,target", [("2.4", "2.4"), ("2.5", "2.5"), ("2.6", "2.6"),
                                            ("2.4", None), ("2.6", None)])
@pytest.mark.parametrize("mesh,rank", [(sv.Mesh(4), 3), (sv.Mesh(shard=2, replicate=2), 1)])
def test_exported_code_keeps_lora_whole_without_ignored_params(standin, release, target, mesh, rank):
    install, seen = standin
    install(release)
    model = zoo.tiny_llama_lora()
    plans = tiny_plans(model)
    plan = plans["ignored-ungrouped"] if release == "2.4" else plans["ignored"]
    analysis = sv.analyze(model, plan, mesh)
    code = sv.export_code(model, plan, mesh=mesh, torch_version=target)
    module = load_exported(code)
    assert module.fully_shard is public_fsdp.fully_shard  # the stand-in, not torch's

    ignored_ids = {id(model.get_parameter(f)) for f in plan.ignored}
    lora_slots = [(m, n, p) for m in model.modules() for n, p in m._parameters.items()
                  if p is not None and id(p) in ignored_ids]
    assert len(lora_slots) == len(plan.ignored) == 28
    names_before = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    with fake_process_group(rank, mesh.world):
        module.apply_fsdp(model, device_mesh(mesh))
        assert layout_mismatches(model, analysis, rank) == []
        # never reachable by any call, and still the very same objects in the very same slots
        assert len(seen) == len(plan.units)
        assert all(id(p) not in ignored_ids for call in seen for p in call)
        for m, n, p in lora_slots:
            assert m._parameters[n] is p and not isinstance(p, DTensor)
        assert [n for n, _ in model.named_parameters(remove_duplicate=False)] == names_before
        base = [p for n, p in model.named_parameters() if "lora_" not in n]
        assert base and all(isinstance(p, DTensor) for p in base)


def test_code_for_2_7_would_hit_the_same_error(standin):
    """Why the release matters: code that passes ignored_params fails on the 2.6 signature."""
    install, _ = standin
    install("2.6")
    model = zoo.tiny_llama_lora()
    code = sv.export_code(model, tiny_plans(model)["ignored"], mesh=sv.Mesh(2), torch_version="2.7")
    module = load_exported(code)
    with fake_process_group(0, 2), pytest.raises(TypeError, match=r"unexpected keyword argument 'ignored_params'"):
        module.apply_fsdp(model, device_mesh(sv.Mesh(2)))


def test_hidden_slots_are_restored_when_a_call_fails(standin):
    install, _ = standin
    install("2.6")
    model = zoo.tiny_llama_lora()
    plan = tiny_plans(model)["ignored"]
    code = sv.export_code(model, plan, mesh=sv.Mesh(2), torch_version="2.6")
    module = load_exported(code)
    before = dict(model.named_parameters())

    def boom(*args, **kwargs):
        raise RuntimeError("boom")

    module.fully_shard = boom
    with fake_process_group(0, 2), pytest.raises(RuntimeError, match="boom"):
        module.apply_fsdp(model, device_mesh(sv.Mesh(2)))
    assert dict(model.named_parameters()) == before
