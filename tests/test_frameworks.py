"""Plan.from_accelerate against accelerate's own FSDP2 preparation, run in the test under the fake group.

For each architecture x config: accelerate's preparation (its launcher's environment, its plugin, its
``fsdp2_apply_ac`` / ``fsdp2_prepare_model``) runs here on a meta copy; what torch then holds
(``capture_truth.torch_calls``) must equal what torch holds after shardviz's oracle applies the
captured plan on another copy: the same calls and module sets, parameters, reshard, dtypes, offload.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

import shardviz as sv
from shardviz.frameworks import AccelerateConfigError, _config_path, accelerate_prepare, launch_env
from shardviz.export.oracle import apply_plan, device_mesh, fake_process_group, meta_copy

sys.path.insert(0, os.path.dirname(__file__))
from capture_truth import KeptEnviron, checkpointed, torch_calls  # noqa: E402
from torch_truth import fake_run, memory_mismatches, tiny_gpt2, tiny_lora, tiny_llama, tiny_mixtral  # noqa: E402

pytest.importorskip("accelerate")
WORLD = 4


def tied_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        return LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                            tie_word_embeddings=True))


ARCHS = {"llama_lora": tiny_lora, "llama_tied": tied_llama, "mixtral_moe": tiny_mixtral, "gpt2_tied": tiny_gpt2}
CONFIGS = {
    "transformer_bf16": {"fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "mixed_precision": "bf16"},
    "transformer_ac_fp32": {"fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_activation_checkpointing": True,
                            "mixed_precision": "no"},
    "size_based": {"fsdp_auto_wrap_policy": "SIZE_BASED_WRAP", "fsdp_min_num_params": 20000, "mixed_precision": "bf16"},
    "no_wrap": {"fsdp_auto_wrap_policy": "NO_WRAP", "mixed_precision": "no"},
    "offload_no_reshard": {"fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_offload_params": True,
                           "fsdp_reshard_after_forward": False, "mixed_precision": "bf16"},
}
# the truth runs accelerate on real meta tensors, outside capture: it cannot load weights into them
for _config in CONFIGS.values():
    _config["fsdp_cpu_ram_efficient_loading"] = False
FAST = [("llama_tied", "transformer_bf16"), ("llama_lora", "size_based"), ("mixtral_moe", "no_wrap"), ("gpt2_tied", "transformer_ac_fp32")]


def accelerate_truth(model, config):
    """torch's record after accelerate's own preparation of a meta copy (and the captured plan)."""
    with _config_path(config, WORLD) as path:
        env = launch_env(path, WORLD)
    with KeptEnviron(), fake_process_group(0, WORLD):
        prepared = meta_copy(model)
        try:
            prepared = accelerate_prepare(prepared, env)
        except ValueError as exc:  # accelerate's SIZE_BASED_WRAP reaches the layers' ModuleList: torch refuses it
            return torch_calls(prepared), checkpointed(prepared), str(exc)
        return torch_calls(prepared), checkpointed(prepared), None


def shardviz_applies(model, plan):
    with fake_process_group(0, WORLD):
        copy_ = meta_copy(model)
        apply_plan(copy_, plan, device_mesh(sv.Mesh(WORLD)))
        return torch_calls(copy_), checkpointed(copy_)


CASES = [pytest.param(a, c, marks=[] if (a, c) in FAST else [pytest.mark.slow], id=f"{a}-{c}")
         for a in ARCHS for c in CONFIGS]


@pytest.mark.parametrize("arch, config", CASES)
def test_accelerate_plan_reproduced_exactly(arch, config):
    model = ARCHS[arch]()
    calls, wrapped, error = accelerate_truth(model, CONFIGS[config])
    try:
        plan, refused = sv.Plan.from_accelerate(model, CONFIGS[config], world_size=WORLD), None
    except AccelerateConfigError as exc:  # accelerate launch would stop: refused, with the calls made until then
        plan, refused = exc.plan, exc
    assert shardviz_applies(model, plan) == (calls, wrapped)  # the calls torch made, up to an error
    assert bool(refused) == bool(error)
    if error:  # the refusal names accelerate's line, torch's refusal and the YAML key to change
        raised = refused.finding
        assert "fsdp_utils.py" in raised.message and error.splitlines()[0] in raised.message
        assert "ModuleList" in raised.message or "container" in raised.message
        assert refused.key == "fsdp_config.fsdp_min_num_params" and "fsdp_min_num_params is 20000" in str(refused)
        assert error.splitlines()[0] in str(refused)
    assert plan.name.startswith("accelerate ") and plan.origin.release.startswith("accelerate ")
    if config == "no_wrap":
        assert "SV303" in {f.code for f in plan.origin.findings}


def test_plan_says_which_release_and_the_user_model_is_untouched(tmp_path):
    import accelerate
    import yaml

    model = tied_llama()
    before = {n: (id(p), p.dtype) for n, p in model.named_parameters()}
    path = tmp_path / "fsdp.yaml"
    path.write_text(yaml.safe_dump({"distributed_type": "FSDP", "mixed_precision": "bf16", "num_processes": 8,
                                    "fsdp_config": {"fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                                                    "fsdp_cpu_ram_efficient_loading": True}}))
    env = dict(os.environ)
    plan = sv.Plan.from_accelerate(model, str(path), world_size=8)
    assert plan.name == f"accelerate {'.'.join(accelerate.__version__.split('.')[:2])}: fsdp.yaml"
    assert {n: (id(p), p.dtype) for n, p in model.named_parameters()} == before
    assert dict(os.environ) == env and not torch.distributed.is_initialized()
    # the tied embedding and head share one call with the final norm, kept unsharded after forward
    tail = plan.unit_of("lm_head")
    assert set(tail.modules) == {"model.norm", "model.embed_tokens", "lm_head"} and tail.reshard_after_forward is False
    a = sv.analyze(model, plan, sv.Mesh(8))
    bf16 = [f for f in a.findings if f.code == "SV304"]
    assert bf16 and "FullyShardedDataParallelPlugin" in bf16[0].fix and "more per step" in bf16[0].message
    assert sv.Plan.from_json(plan.to_json()) == plan and sv.Plan.from_json(plan.to_json()).origin == plan.origin


def test_hsdp_from_parallelism_config():
    cfg = {"distributed_type": "FSDP", "mixed_precision": "no", "num_processes": 8,
           "fsdp_config": {"fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP"},
           "parallelism_config": {"parallelism_config_dp_replicate_size": 2, "parallelism_config_dp_shard_size": 4}}
    plan = sv.Plan.from_accelerate(tiny_lora(), cfg, world_size=8)
    hsdp = [f for f in plan.origin.findings if f.code == "SV307"]
    assert hsdp and "sv.Mesh(shard=4, replicate=2)" in hsdp[0].fix


#: configs accelerate's preparation raises on: the key to blame, its value and the valid value nearest it
BAD_CONFIGS = [
    ({"fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WARP"}, "fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WARP",
     "TRANSFORMER_BASED_WRAP"),
    ({"fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_transformer_layer_cls_to_wrap": "LlamaLayer"},
     "fsdp_transformer_layer_cls_to_wrap", "LlamaLayer", "LlamaDecoderLayer"),
    ({"fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_reshard_after_forward": "FULL_SHARD"},
     "fsdp_reshard_after_forward", "FULL_SHARD", "true"),
]


@pytest.mark.parametrize("config, key, value, closest", BAD_CONFIGS, ids=[c[1] for c in BAD_CONFIGS])
def test_a_config_accelerate_refuses_is_refused_naming_the_key(config, key, value, closest):
    """accelerate launch would stop at start-up: no plan (not a 0-call one), an error naming the key,
    its value and the closest valid value; accelerate's own message and line kept."""
    with pytest.raises(AccelerateConfigError) as info:
        sv.Plan.from_accelerate(tiny_lora(), config, world_size=WORLD)
    exc = info.value
    assert (exc.key, exc.value, exc.closest) == (f"fsdp_config.{key}", value, closest)
    assert f"fsdp_config.{key} is {value!r}" in str(exc) and closest in str(exc)
    assert exc.finding.code == "SV301" and exc.finding.message.split(" raised ")[1].split(" at ")[0] in str(exc)
    assert exc.plan.units == ()  # what accelerate had done: nothing


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="no such file"):
        sv.Plan.from_accelerate(tiny_lora(), "/nonexistent/fsdp.yaml", world_size=4)
    with pytest.raises(ValueError, match="fsdp_version"):
        sv.Plan.from_accelerate(tiny_lora(), {"fsdp_version": 1}, world_size=4)


def truth_of_the_model_accelerate_sharded(training):
    """(analysis of the captured plan, FSDPMemTracker's truth on the real model accelerate's own preparation
    sharded): fp32 and no weight loading, so accelerate casts and loads nothing."""
    config = {"fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "mixed_precision": "no",
              "fsdp_cpu_ram_efficient_loading": False}
    model = tiny_lora()
    plan = sv.Plan.from_accelerate(model, config, world_size=WORLD)
    with _config_path(config, WORLD) as path:
        env = launch_env(path, WORLD)
    mesh = sv.Mesh(WORLD)
    with KeptEnviron():
        truth = fake_run(tiny_lora, plan, mesh, training, 0, apply=lambda m, dmesh: accelerate_prepare(m, env))
    return sv.analyze(model, plan, mesh, training), truth


def test_memory_equals_torch_on_the_model_accelerate_sharded():
    """Params, grads and optimizer states to the byte against FSDPMemTracker."""
    # accelerate's "mixed_precision: no": torch runs without mp_policy, so the training says the same
    analysis, truth = truth_of_the_model_accelerate_sharded(sv.Training(param_dtype=None, reduce_dtype=None))
    assert not memory_mismatches(analysis, truth, exact_peak=False)


def test_without_accelerate_the_error_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "accelerate", None)
    with pytest.raises(ImportError, match=r"shardviz\[accelerate\]"):
        sv.Plan.from_accelerate(tiny_llama(), {"fsdp_auto_wrap_policy": "NO_WRAP"}, world_size=4)


@pytest.mark.slow
def test_peak_with_activations_within_the_documented_error():
    """The same model accelerate sharded, now with a batch: the model state to the byte and the peak
    with activations within docs/activations.md's 1 %."""
    # accelerate's "mixed_precision: no": no mp_policy in torch's run, none in the training
    analysis, truth = truth_of_the_model_accelerate_sharded(sv.Training(batch_size=2, seq_len=256, param_dtype=None,
                                                                        reduce_dtype=None))
    row = analysis.memory.iloc[0]
    assert row.activations > 0
    assert not [m for m in memory_mismatches(analysis, truth, exact_peak=False) if "peak" not in m]
    predicted, torch_peak = int(row.peak + row.cpu_optimizer), truth.peak_snap["Total"]
    assert abs(predicted / torch_peak - 1) <= 0.01, (predicted, torch_peak, analysis.peak_breakdown(0), truth.peak_snap)


UPCAST = """
import json, sys, torch
sys.path.insert(0, "tests")
import accelerate
import shardviz as sv
from shardviz.export.oracle import fake_process_group, meta_copy
from shardviz.frameworks import accelerate_prepare
from capture_truth import KeptEnviron
from torch_truth import tiny_llama
model = tiny_llama(dtype=torch.bfloat16)  # every parameter trainable, in bf16
config = {"fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "mixed_precision": "bf16"}
plan = sv.from_accelerate(model, config, world_size=4)
with KeptEnviron(), fake_process_group(0, 4):  # accelerate's preparation outside capture: torch's dtypes after it
    prepared = accelerate_prepare(meta_copy(model), {"ACCELERATE_USE_FSDP": "true", "ACCELERATE_MIXED_PRECISION": "bf16",
                                                    "FSDP_VERSION": "2", "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP"})
    fp32 = sum(1 for p in prepared.parameters() if p.requires_grad and p.dtype == torch.float32)
print(json.dumps({"accelerate": accelerate.__version__, "fp32_after": fp32,
                  "sv306": [[f.message, f.n_fqns] for f in plan.origin.findings if f.code == "SV306"]}))
"""


def upcast_seen(python: str) -> dict:
    import json
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([python, "-c", UPCAST], capture_output=True, text=True, timeout=600, cwd=root,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_sv306_says_what_accelerate_did_to_bf16_trainable_parameters():
    """A bf16 model trained whole with mixed_precision bf16: accelerate 1.16's preparation casts every trainable
    parameter to fp32 (and logs it through a logger that needs accelerate's state: the stand-in logs it without),
    and SV306 counts the parameters torch holds in fp32 after accelerate's own preparation."""
    out = upcast_seen(sys.executable)
    (message, n), = out["sv306"]
    assert n == out["fp32_after"] > 0 and f"accelerate {out['accelerate']} casts {n} trainable" in message


@pytest.mark.slow
def test_sv306_says_accelerate_113_casts_nothing():
    """accelerate 1.13 (axolotl's venv) logs the upcast but rebinds a local ``param`` (accelerate issue 3979):
    torch holds no fp32 parameter after its preparation, and SV306 says the parameters stay bf16."""
    from framework_venv import framework_python

    out = upcast_seen(framework_python("axolotl"))
    assert out["accelerate"] == "1.13.0" and out["fp32_after"] == 0
    (message, n), = out["sv306"]
    assert n > 0 and "casts none" in message and "stay bfloat16" in message
