"""sv.capture: the user's own sharding function, run on a meta copy under the fake group, read back.

The truth for the calls is what torch holds after the same function runs directly on a meta copy
(``capture_truth.torch_calls``), and what torch holds after shardviz's oracle applies the captured plan.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

import shardviz as sv
from shardviz.export.oracle import apply_plan, device_mesh, fake_process_group, meta_copy

sys.path.insert(0, os.path.dirname(__file__))
from capture_truth import checkpointed, torch_calls  # noqa: E402
from torch_truth import tiny_lora  # noqa: E402

WORLD = 8
TOUCHED = 0  # a module global the hostile function rebinds (capture puts the function's globals back)


def inner(model):
    return model.base_model.model.model


def cluster_fsdp(model):
    """Written for a GPU cluster: its own "cuda" mesh, set_device, model.to("cuda"), blocks checkpointed,
    a MixedPrecisionPolicy per call, an int reshard, offload and explicit prefetch."""
    torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())
    mesh = init_device_mesh("cuda", (dist.get_world_size(),))
    model.to(f"cuda:{torch.cuda.current_device()}")
    layers = inner(model).layers
    for i, layer in enumerate(layers):
        layers[i] = checkpoint_wrapper(layer)
    for i, layer in enumerate(layers):
        fully_shard(layer, mesh=mesh, mp_policy=MixedPrecisionPolicy(torch.bfloat16, torch.float32),
                    reshard_after_forward=i < len(layers) - 1)
    fully_shard(inner(model).embed_tokens, mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float16),
                offload_policy=CPUOffloadPolicy())
    fully_shard([inner(model).norm, model.base_model.model.lm_head], mesh=mesh, reshard_after_forward=4)
    fully_shard(model, mesh=mesh)
    layers[0].set_modules_to_forward_prefetch([layers[1]])
    layers[1].set_modules_to_backward_prefetch([layers[0]])


def run_directly(fn, model):
    """The function itself on a meta copy under the fake group: what torch holds afterwards."""
    from shardviz.frameworks.capture import _cluster_on_cpu, run_captured  # noqa: F401  (the same CPU patches)

    cap = type("C", (), {"calls": [], "library": ()})()
    with fake_process_group(0, WORLD):
        copy_ = meta_copy(model)
        with _cluster_on_cpu(WORLD, 0, cap):
            fn(copy_)
        return torch_calls(copy_), checkpointed(copy_), copy_


def applied(model, plan):
    with fake_process_group(0, WORLD):
        copy_ = meta_copy(model)
        apply_plan(copy_, plan, device_mesh(sv.Mesh(WORLD)))
        return torch_calls(copy_), checkpointed(copy_)


def test_every_setting_of_a_cluster_function_comes_back():
    model = tiny_lora()
    plan = sv.capture(cluster_fsdp, model, world_size=WORLD)
    b = "base_model.model.model."
    assert plan.unit_of(b + "layers.0") == sv.Unit(b + "layers.0", True, "bfloat16", "float32")
    assert plan.unit_of(b + "layers.1") == sv.Unit(b + "layers.1", False, "bfloat16", "float32")
    assert plan.unit_of(b + "embed_tokens") == sv.Unit(b + "embed_tokens", None, "float16", None, offload=True)
    assert plan.unit_of("base_model.model.lm_head") == sv.Unit([b + "norm", "base_model.model.lm_head"], 4)
    assert plan.unit_of("") == sv.Unit("")
    assert plan.checkpoint == (b + "layers.0", b + "layers.1")
    assert plan.prefetch == ((b + "layers.0", "forward", (b + "layers.1",)), (b + "layers.1", "backward", (b + "layers.0",)))
    assert plan.name == "captured: test_capture.cluster_fsdp"
    sites = dict(plan.origin.call_sites)
    assert sites["<root>"].startswith("test_capture.py:") and "fully_shard(model" in sites["<root>"]
    calls, wrapped, _ = run_directly(cluster_fsdp, model)
    assert applied(model, plan) == (calls, wrapped)
    assert sv.Plan.from_json(plan.to_json()) == plan and sv.Plan.from_json(plan.to_json()).prefetch == plan.prefetch
    assert sv.Plan.from_json(plan.to_json()).origin == plan.origin
    assert "SV309" in {f.code for f in sv.analyze(model, plan, sv.Mesh(WORLD)).findings}  # prefetch: not modelled


def layer_one_fix(model):
    """The seed's "layer 1" fix: fully_shard on every module with direct parameters whose name has no
    "lora", and no root call."""
    for name, module in list(model.named_modules()):
        if "lora" not in name and any(True for _ in module.parameters(recurse=False)):
            fully_shard(module)


def tied_peft():
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                         tie_word_embeddings=True))
    return get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))


def test_layer_one_fix_on_a_tied_peft_model():
    model = tied_peft()
    plan = sv.capture(layer_one_fix, model, world_size=WORLD)
    calls, _, sharded = run_directly(layer_one_fix, model)
    assert {frozenset(u.modules) for u in plan.units} == {c[0] for c in calls}
    assert applied(model, plan)[0] == calls
    head, embed = "base_model.model.lm_head", "base_model.model.model.embed_tokens"
    # torch made two sharded copies of the one tied weight, and a step runs
    assert sharded.get_submodule(head).weight is not sharded.get_submodule(embed).weight
    real = tied_peft()
    with fake_process_group(0, WORLD):
        layer_one_fix(real)
        ids = torch.randint(0, 128, (2, 8))
        real(input_ids=ids, labels=ids).loss.backward()
    findings = sv.analyze(model, plan, sv.Mesh(WORLD), strict=False).findings
    by_code = {f.code: f for f in findings}
    assert {head + ".weight", embed + ".weight"} <= set(by_code["SV001"].all_fqns)
    assert "copies train apart" in by_code["SV001"].message  # no root call: torch runs it (seen above)
    assert "test_capture.py:" in by_code["SV001"].fix  # the line of the user's call
    lora = {n for n, p in model.named_parameters() if "lora_" in n}
    assert set(by_code["SV103"].all_fqns) == lora
    assert "fully_shard(model)" in by_code["SV103"].fix


def raises_halfway(model):
    global TOUCHED
    TOUCHED += 1
    os.environ["SHARDVIZ_HOSTILE"] = "1"
    torch.set_default_dtype(torch.float64)
    fully_shard(inner(model).layers[0])
    raise RuntimeError("out of patience")


def shards_a_tensor(model):
    fully_shard(inner(model).layers[0])
    fully_shard(inner(model).norm.weight)


def shards_twice(model):
    fully_shard(inner(model).layers[0])
    fully_shard(inner(model).layers[0])


def ignores_lora(model):
    lora = {p for n, p in model.named_parameters() if "lora_" in n}
    fully_shard(inner(model).layers[0], ignored_params=lora)
    fully_shard(model, ignored_params=lora)


@pytest.mark.parametrize("fn, says", [
    (raises_halfway, "out of patience"),
    (shards_a_tensor, "nn.Module"),
    (shards_twice, "applied to a module once"),
])
def test_hostile_function_gives_a_finding_and_leaves_everything_as_it_was(fn, says):
    model = tiny_lora()
    params = {n: (id(p), p.device, p.dtype) for n, p in model.named_parameters()}
    hooks = [(m._forward_hooks.copy(), m._forward_pre_hooks.copy(), type(m)) for m in model.modules()]
    env, dtype, count = dict(os.environ), torch.get_default_dtype(), TOUCHED
    plan = sv.capture(fn, model, world_size=WORLD)
    raised = [f for f in plan.origin.findings if f.code == "SV301"]
    assert raised and says in raised[0].message and "test_capture.py:" in raised[0].message
    assert [u.modules for u in plan.units] == [("base_model.model.model.layers.0",)]  # the plan so far
    assert {n: (id(p), p.device, p.dtype) for n, p in model.named_parameters()} == params
    assert [(m._forward_hooks, m._forward_pre_hooks, type(m)) for m in model.modules()] == hooks
    assert dict(os.environ) == env and torch.get_default_dtype() == dtype and TOUCHED == count
    assert not dist.is_initialized()
    assert "SV301" in {f.code for f in sv.analyze(model, plan, sv.Mesh(WORLD)).findings}


def test_ignored_params_on_a_2_6_target_stop_the_plan_there():
    model = tiny_lora()
    now = sv.capture(ignores_lora, model, world_size=WORLD)
    lora = {n for n, _ in model.named_parameters() if "lora_" in n}
    assert set(now.ignored) == lora and len(now.units) == 2
    old = sv.capture(ignores_lora, model, world_size=WORLD, torch_version="2.6")
    raised = [f for f in old.origin.findings if f.code == "SV301"]
    assert raised and "2.4-2.6" in raised[0].message and "test_capture.py:" in raised[0].message
    assert old.units == () and old.ignored == ()


def test_an_sv_mesh_argument_becomes_the_device_mesh():
    def apply_fsdp(model, mesh):
        for layer in inner(model).layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)

    mesh = sv.Mesh(shard=4, replicate=2)
    plan = sv.capture(apply_fsdp, tiny_lora(), mesh, mesh=mesh)
    assert len(plan.units) == 3 and plan.unit_of("") is not None


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="world_size"):
        sv.capture(layer_one_fix, tiny_lora())
    with pytest.raises(ValueError, match="nn.Module"):
        sv.capture(layer_one_fix, "not a model", world_size=2)
    with pytest.raises(ValueError, match="function"):
        sv.capture("apply_fsdp", tiny_lora(), world_size=2)


def test_a_policy_shardviz_does_not_model_is_named():
    from functools import partial

    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    def save_matmuls(ctx, op, *args, **kwargs):
        from torch.utils.checkpoint import CheckpointPolicy

        return CheckpointPolicy.MUST_SAVE if op == torch.ops.aten.mm.default else CheckpointPolicy.PREFER_RECOMPUTE

    def apply(model):
        layers = inner(model).layers
        for i, layer in enumerate(layers):
            layers[i] = checkpoint_wrapper(layer, context_fn=partial(create_selective_checkpoint_contexts, save_matmuls))
            fully_shard(layers[i])
        fully_shard(model)

    plan = sv.capture(apply, tiny_lora(), world_size=WORLD)
    named = dict(plan.origin.checkpoint_policies)
    assert named["base_model.model.model.layers.0"] == "create_selective_checkpoint_contexts"
    assert plan.checkpoint.policy("base_model.model.model.layers.0") == "full"
    assert "SV302" in {f.code for f in plan.origin.findings}


def test_checkpointing_children_instead_of_the_layer():
    def apply(model):
        for layer in inner(model).layers:
            layer.mlp = checkpoint_wrapper(layer.mlp)
            fully_shard(layer)
        fully_shard(model)

    plan = sv.capture(apply, tiny_lora(), world_size=WORLD)
    found = {f.code: f for f in plan.origin.findings}
    assert "SV305" in found and "base_model.model.model.layers.0.mlp" in found["SV305"].all_fqns
    assert "SV303" not in found


def test_json_without_capture_fields_is_still_version_1():
    plan = sv.Plan.auto(tiny_lora())
    assert plan.to_dict()["version"] == 1 and sv.Plan.from_json(plan.to_json()) == plan


def test_apply_activation_checkpointing_and_the_exported_selective_policy():
    """torch's apply_activation_checkpointing (full) on the blocks, shardviz's exported selective policy on one
    MLP: both come back with their policy, and the plan applied by the oracle wraps the same modules."""
    from functools import partial

    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    from shardviz.export_runtime import _checkpoint_wrapped, _selective_checkpoint_context

    def apply(model):
        layers = inner(model).layers
        layers[0].mlp = _checkpoint_wrapped(layers[0].mlp, _selective_checkpoint_context)
        apply_activation_checkpointing(model, checkpoint_wrapper_fn=partial(checkpoint_wrapper),
                                       check_fn=lambda m: isinstance(m, LlamaDecoderLayer) and m is layers[1])
        for layer in layers:
            fully_shard(layer)
        fully_shard(model)

    model = tiny_lora()
    plan = sv.capture(apply, model, world_size=WORLD)
    b = "base_model.model.model.layers."
    assert dict(plan.checkpoint.items()) == {b + "0.mlp": "selective", b + "1": "full"}
    calls, wrapped, _ = run_directly(apply, model)
    assert applied(model, plan) == (calls, wrapped)


def test_a_users_folder_named_like_a_library_is_still_the_users_code():
    """Only torch's and shardviz's installed folders are library code: a user's project under a
    folder named "shardviz" or "torch" (a clone of this repository, for one) keeps its line in the
    findings (before, any path containing /shardviz/ or /torch/ was skipped, and the line was lost)."""
    import sys
    import traceback

    from shardviz.frameworks.capture import user_line

    users = traceback.FrameSummary("/home/u/shardviz/torch/train.py", 7, "main", line="fully_shard(m)")
    assert user_line([users]) == "train.py:7 (fully_shard(m))"
    ours = traceback.FrameSummary(sys.modules["shardviz.frameworks.capture"].__file__, 1, "capture", line="fn(model)")
    assert user_line([users, ours]) == "train.py:7 (fully_shard(m))"  # shardviz's own frame is skipped
