"""sv.from_trainer / --trainer-config against transformers' and accelerate's own code.

The truth: transformers builds ``TrainingArguments`` / TRL's ``SFTConfig`` from the fields (its own
``fsdp`` / ``fsdp_config`` processing into ``fsdp_plugin_args``), accelerate's
``FullyShardedDataParallelPlugin`` is built from them as ``Trainer`` builds it, and accelerate's FSDP2
preparation runs here on a meta copy under the fake group, outside shardviz's capture; what torch then
holds must equal what torch holds after shardviz's oracle applies the plan ``from_trainer`` read. The same
calls must also come from the accelerate YAML that says the same thing (``Plan.from_accelerate``).
"""

from __future__ import annotations

import os
import re
import sys

import pytest
import yaml

import shardviz as sv
from shardviz import zoo
from shardviz.cli import main
from shardviz.frameworks import AccelerateConfigError
from shardviz.export.oracle import apply_plan, device_mesh, fake_process_group, meta_copy
from shardviz.frameworks.trainer_config import trainer_prepare, training_arguments

sys.path.insert(0, os.path.dirname(__file__))
from capture_truth import KeptEnviron, checkpointed, torch_calls  # noqa: E402

pytest.importorskip("accelerate")
pytest.importorskip("transformers")

SFT = {"fsdp": "full_shard auto_wrap", "bf16": True, "activation_checkpointing": False,
       "fsdp_config": {"fsdp_version": 2, "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
                       "activation_checkpointing": True},
       "per_device_train_batch_size": 2, "gradient_accumulation_steps": 8}
# the same run said in accelerate's YAML keys (Plan.from_accelerate, accelerate's launcher)
SFT_AS_ACCELERATE = {"fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_transformer_layer_cls_to_wrap":
                     "LlamaDecoderLayer", "fsdp_activation_checkpointing": True, "mixed_precision": "bf16"}
FP32_STRING = {"fsdp": True, "fsdp_config": {"fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer",
                                             "fsdp_reshard_after_forward": False}}
FP32_AS_ACCELERATE = {"fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_transformer_layer_cls_to_wrap":
                      "LlamaDecoderLayer", "fsdp_reshard_after_forward": False, "mixed_precision": "no"}


def trainer_truth(model, fields, world):
    """torch's record after transformers' arguments -> accelerate's plugin -> accelerate's preparation."""
    args = training_arguments(fields)
    env = {"ACCELERATE_USE_FSDP": "true", "ACCELERATE_MIXED_PRECISION": args.mixed_precision}
    with KeptEnviron(), fake_process_group(0, world):
        prepared = trainer_prepare(meta_copy(model), dict(args.fsdp_plugin_args), env)
        return torch_calls(prepared), checkpointed(prepared)


def shardviz_applies(model, plan, world):
    with fake_process_group(0, world):
        copy_ = meta_copy(model)
        apply_plan(copy_, plan, device_mesh(sv.Mesh(world)))
        return torch_calls(copy_), checkpointed(copy_)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("fields, as_accelerate", [(SFT, SFT_AS_ACCELERATE), (FP32_STRING, FP32_AS_ACCELERATE)],
                         ids=["list_form_ac_bf16", "prefixed_no_reshard_fp32"])
def test_plan_is_the_one_accelerate_prepares_from_the_arguments(world, fields, as_accelerate):
    model = zoo.tiny_llama_lora()
    setup = sv.from_trainer(fields, model, world_size=world)
    calls, wrapped = trainer_truth(model, fields, world)
    assert shardviz_applies(model, setup.plan, world) == (calls, wrapped)
    ac = fields["fsdp_config"].get("activation_checkpointing", False)
    assert sum(".layers." in u.name for u in setup.plan.units) >= 2 and setup.mesh.world == world  # a call per layer
    assert len(setup.plan.checkpoint) == (2 if ac else 0)
    # the accelerate YAML that says the same: the same calls through accelerate's launcher
    assert setup.plan.units == sv.Plan.from_accelerate(model, as_accelerate, world_size=world).units
    assert setup.plan.origin.kind == "trainer" and "transformers" in setup.plan.origin.release


def test_batch_sequence_accumulation_and_precision_read_from_the_file(tmp_path):
    pytest.importorskip("trl")  # max_length is an SFTConfig field
    path = tmp_path / "sft.yaml"
    path.write_text(yaml.safe_dump({**SFT, "max_length": 512}))
    setup = sv.from_trainer(path, zoo.tiny_llama_lora(), world_size=4)
    tr = setup.training
    assert (tr.batch_size, tr.seq_len, tr.grad_accum, tr.param_dtype) == (2, 512, 8, "bfloat16")
    assert type(setup.config).__name__ == "SFTConfig"  # max_length is TRL's field
    assert setup.origins["seq_len"] == "max_length=512 (from sft.yaml)"
    assert setup.origins["batch_size"] == "per_device_train_batch_size=2 (from sft.yaml)"


def test_what_the_file_leaves_out_says_whose_default(tmp_path):
    path = tmp_path / "args.json"
    path.write_text('{"fsdp": true, "fsdp_config": {"transformer_layer_cls_to_wrap": "LlamaDecoderLayer"}}')
    setup = sv.from_trainer(str(path), zoo.tiny_llama_lora(), world_size=2)
    tr = setup.training
    assert (tr.batch_size, tr.grad_accum, tr.seq_len, tr.param_dtype, tr.reduce_dtype) == (8, 1, 2048, None, None)
    assert "transformers' default" in setup.origins["batch_size"]
    assert "shardviz's default" in setup.origins["seq_len"]
    assert "fp32" in setup.origins["precision"]


def test_a_training_arguments_object_is_read_as_given():
    args, model = training_arguments(SFT), zoo.tiny_llama_lora()
    before = [(n, p.device, p.dtype) for n, p in model.named_parameters()]
    setup = sv.from_trainer(args, model, world_size=2)
    assert [(n, p.device, p.dtype) for n, p in model.named_parameters()] == before  # the user's model untouched
    assert not any("FSDP" in type(m).__name__ for m in model.modules())
    assert setup.config is args and setup.framework == "trainer" and setup.training.batch_size == 2 and len(setup.plan.units) == 5


def test_in_forward_checkpointing_is_priced_on_the_layers_transformers_switches_on():
    """TRL's default activation_checkpointing=True: the layers the model's own enable switches on (read on a meta
    copy) are priced checkpointed; the peak against torch is tests/test_hf_checkpointing.py's."""
    pytest.importorskip("trl")  # max_length is an SFTConfig field
    fields = {k: v for k, v in SFT.items() if k != "activation_checkpointing"} | {"max_length": 256}
    model = zoo.tiny_llama_lora()
    setup = sv.from_trainer(fields, model, world_size=2)  # TRL turns it on by default
    said = {f.code: f for f in setup.findings}
    assert "priced as those layers checkpointed" in said["SV310"].message and "TRL's default" in said["SV310"].message
    assert "use_reentrant=False" in said["SV310"].message  # transformers 5's default, read off the layers it switched on
    assert "Trainer raises" in said["SV314"].message and "activation_checkpointing: false" in said["SV314"].fix
    twin = zoo.tiny_llama_lora()
    twin.gradient_checkpointing_enable()  # what Trainer does to the model, done here on a twin
    from transformers.modeling_layers import GradientCheckpointingLayer  # the layers whose forward checkpoints

    switched = {n for n, m in twin.named_modules() if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing}
    assert switched and switched <= set(setup.plan.checkpoint)
    every2 = sv.from_trainer(fields | {"fsdp_config": {**SFT["fsdp_config"], "activation_checkpointing": False},
                                       "activation_checkpointing_kwargs": {"every_n_layers": 2}}, model, world_size=2)
    assert 0 < len(every2.plan.checkpoint) < len(switched)


def test_a_layer_class_the_model_lacks_is_refused_naming_the_key():
    fields = {**SFT, "fsdp_config": {**SFT["fsdp_config"], "transformer_layer_cls_to_wrap": ["LlamaDecoderLayr"]}}
    with pytest.raises(AccelerateConfigError) as info:
        sv.from_trainer(fields, zoo.tiny_llama_lora(), world_size=2)
    assert info.value.key == "fsdp_config.transformer_layer_cls_to_wrap"
    assert info.value.closest == "LlamaDecoderLayer"


@pytest.mark.parametrize("fields, said", [
    ({**SFT, "per_device_batch_size": 4}, "per_device_batch_size is not one of"),
    ({"fsdp": True, "fsdp_config": {"auto_wrap_policy": "LAYER_WRAP"}}, "fsdp_config.auto_wrap_policy is 'LAYER_WRAP'"),
    ({"fsdp": True, "fsdp_config": {"version": 1}}, "fsdp_config.version is 1"),
    ({"per_device_train_batch_size": 2}, "fsdp is not set"),
])
def test_fields_transformers_refuses_are_named(fields, said):
    with pytest.raises(ValueError, match=said):
        sv.from_trainer(fields, zoo.tiny_llama_lora(), world_size=2)


def test_cli_report_reads_the_trainer_config(tmp_path, capsys):
    pytest.importorskip("trl")  # max_length is an SFTConfig field
    path = tmp_path / "sft.yaml"
    path.write_text(yaml.safe_dump({**SFT, "max_length": 128}))
    out = tmp_path / "r.html"
    assert main(["report", "zoo:tiny_llama_lora", "--trainer-config", str(path), "--world-size", "4",
                 "--no-compare", "-o", str(out)]) == 0
    got = capsys.readouterr()
    err = " ".join((got.out + got.err).split())
    assert re.search(r"plan: Trainer: sft.yaml \(\d+ fully_shard calls\)", err), err
    assert "batch 2 × 128 tokens × 8 micro-batches per step" in err
    assert "read: seq_len: max_length=128 (from sft.yaml)" in err


def test_cli_report_shows_the_reference_model_finding(tmp_path, capsys):
    """shardviz report on a DPO config: SV313 among the findings printed, with its fix in TRL's keys."""
    pytest.importorskip("trl")
    path = tmp_path / "dpo.yaml"
    path.write_text(yaml.safe_dump(DPO))
    assert main(["report", "zoo:tiny_llama_lora", "--no-lora", "--trainer-config", str(path), "--world-size", "2", "--no-compare",
                 "-o", str(tmp_path / "r.html")]) == 0
    got = capsys.readouterr()
    said = " ".join((got.out + got.err).split())
    assert "warning SV313: TRL's DPOTrainer keeps a reference model" in said and "precompute_ref_log_probs: true" in said


def test_cli_refuses_a_config_whose_preparation_raises(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**SFT, "fsdp_config": {"transformer_layer_cls_to_wrap": ["LlamaDecoderLayr"]}}))
    assert main(["report", "zoo:tiny_llama_lora", "--trainer-config", str(path), "--world-size", "2",
                 "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert "fsdp_config.transformer_layer_cls_to_wrap" in err and "LlamaDecoderLayer" in err
    assert not (tmp_path / "r.html").exists()


def test_a_fsdp_config_key_transformers_never_reads_is_said():
    fields = {"fsdp": True, "fsdp_config": {"fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer",
                                            "fsdp_offload_params": True}}  # accelerate's key; the Trainer's is cpu_offload
    setup = sv.from_trainer(fields, zoo.tiny_llama_lora(), world_size=2)
    assert not any(u.offload for u in setup.plan.units)  # transformers dropped it: accelerate offloads nothing
    finding = next(f for f in setup.findings if "fsdp_offload_params" in f.message)
    assert finding.code == "SV314" and "not read by transformers" in finding.message and "cpu_offload" in finding.message
    assert "fsdp_offload_params -> cpu_offload" in finding.fix  # the key it reads, named in the fix
    with_cpu_offload = {**fields, "fsdp_config": {"transformer_layer_cls_to_wrap": "LlamaDecoderLayer", "cpu_offload": True}}
    setup = sv.from_trainer(with_cpu_offload, zoo.tiny_llama_lora(), world_size=2)
    assert all(u.offload for u in setup.plan.units) and not setup.findings


def test_trl_model_name_or_path_and_peft_fields_build_the_model():
    """``trl sft --config``'s one YAML: ModelConfig's model_name_or_path (a local config) and use_peft / lora_*
    build the model through TRL's own get_peft_config; ScriptArguments' dataset fields are not Trainer fields."""
    pytest.importorskip("trl")
    tiny = os.path.join(os.path.dirname(__file__), "configs", "axolotl", "tiny_llama")
    fields = {**SFT, "model_name_or_path": tiny, "use_peft": True, "lora_r": 4, "lora_alpha": 8,
              "lora_target_modules": ["q_proj", "v_proj"], "dataset_name": "trl-lib/Capybara"}
    setup = sv.from_trainer(fields, None, world_size=2)
    ranks = {tuple(p.shape) for n, p in setup.model.named_parameters() if "lora_A" in n}
    assert ranks and all(shape[0] == 4 for shape in ranks)
    assert "TRL's get_peft_config" in setup.origins["model"]
    again = sv.from_trainer(SFT, setup.model, world_size=2)  # the same model handed in: the same calls
    assert again.plan.units == setup.plan.units and again.origins["model"] == "the model given"


DPO = {"fsdp": True, "bf16": True, "activation_checkpointing": False, "beta": 0.1,
       "fsdp_config": {"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}, "precompute_ref_log_probs": False}


def test_trls_reference_model_is_the_one_root_call_its_prepare_fsdp_makes():
    """DPO without peft: TRL keeps a reference model and shards it with its own prepare_fsdp (one root call); the
    plan read is what TRL's prepare_fsdp gives torch on a meta copy outside shardviz's capture, and SV313 says it
    in TRL's keys, among the analysis' findings."""
    pytest.importorskip("trl")
    from accelerate.utils import FullyShardedDataParallelPlugin
    from trl.models.utils import prepare_fsdp

    from shardviz.frameworks import accelerator_for

    model = zoo.tiny_llama_lora(lora=False)
    setup = sv.from_trainer(DPO, model, world_size=2)
    assert type(setup.config).__name__ == "DPOConfig"
    args = setup.config
    env = {"ACCELERATE_USE_FSDP": "true", "ACCELERATE_MIXED_PRECISION": args.mixed_precision}
    with KeptEnviron(), fake_process_group(0, 2):
        os.environ.update(env)
        theirs = torch_calls(prepare_fsdp(meta_copy(model), accelerator_for(env, FullyShardedDataParallelPlugin(
            **args.fsdp_plugin_args))))
    reference = setup.others["reference model"]
    assert shardviz_applies(model, reference, 2)[0] == theirs and len(theirs) == 1  # one call: the root
    found = next(f for f in setup.findings if f.code == "SV313")
    assert "DPOTrainer keeps a reference model" in found.message and "precompute_ref_log_probs: true" in found.fix
    a = sv.analyze(model, setup.plan, setup.mesh, setup.training)
    assert "SV313" in {f.code for f in a.findings}


@pytest.mark.parametrize("change", [{"precompute_ref_log_probs": True}, {"peft": True}])
def test_no_reference_model_when_trl_keeps_none(change):
    """precompute_ref_log_probs (freed before training) or a peft model (its own reference): no SV313."""
    pytest.importorskip("trl")
    model = zoo.tiny_llama_lora(lora="peft" in change)
    fields = {**DPO, **{k: v for k, v in change.items() if k != "peft"}}
    setup = sv.from_trainer(fields, model, world_size=2)
    assert not setup.others and "SV313" not in {f.code for f in setup.findings}


def test_reentrant_checkpointing_read_from_the_layers_names_the_key():
    """use_reentrant=True in the file: SV310 is a warning whose fix names gradient_checkpointing_kwargs; the value is
    what the model's own enable gave its layers."""
    fields = {**FP32_STRING, "gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"use_reentrant": True}}
    found = next(f for f in sv.from_trainer(fields, zoo.tiny_llama_lora(), world_size=2).findings if f.code == "SV310")
    assert found.severity == "warning" and "use_reentrant=True" in found.message
    assert found.fix == "set gradient_checkpointing_kwargs: {use_reentrant: false}"


@pytest.mark.parametrize("fields", [SFT, FP32_STRING], ids=["list_form_ac_bf16", "prefixed_no_reshard_fp32"])
def test_export_back_to_trainer_fields_round_trips(tmp_path, fields):
    """to_trainer: a plan the Trainer's own preparation made, written as Trainer fields, read back from the file by
    from_trainer (TRL's SFTConfig where TRL is, as trl sft --config reads it) gives the same calls, and accelerate's
    preparation of the file's fields gives torch what the plan exported gives it."""
    from shardviz.frameworks.trainer_config import to_trainer

    model = zoo.tiny_llama_lora()
    target = sv.from_trainer(fields, model, world_size=2).plan
    text, cannot = to_trainer(model, target, world_size=2)
    assert cannot == [] and "exactly these fully_shard calls" in text
    path = tmp_path / "back.yaml"
    path.write_text(text)
    back = sv.from_trainer(path, model, world_size=2)
    assert back.plan.units == target.units and set(back.plan.checkpoint) == set(target.checkpoint)
    assert trainer_truth(model, yaml.safe_load(text), 2) == shardviz_applies(model, target, 2)
    ignored = [n for n, _ in model.named_parameters() if "lora_A" in n]
    _, cannot = to_trainer(model, target.with_ignored(ignored), world_size=2)  # what no Trainer field says
    assert any("ignored_params" in c for c in cannot)


def test_cli_export_writes_the_trainer_fields(tmp_path, capsys):
    """export --trainer-config ... --trainer-yaml: the plan read from the Trainer's file written back in its fields;
    the same calls (transformers' own reading), said on stderr."""
    path = tmp_path / "args.yaml"
    path.write_text(yaml.safe_dump(FP32_STRING))
    back = tmp_path / "back.yaml"
    assert main(["export", "zoo:tiny_llama_lora", "--trainer-config", str(path), "--world-size", "2", "-q",
                 "-o", str(tmp_path / "fsdp.py"), "--trainer-yaml", str(back)]) == 0
    assert "transformers' Trainer makes exactly these calls from it" in capsys.readouterr().err
    model = zoo.tiny_llama_lora()
    assert sv.from_trainer(back, model, world_size=2).plan.units == sv.from_trainer(path, model, world_size=2).plan.units
    assert main(["export", "zoo:tiny_llama_lora", "--lora", "sharded", "--world-size", "2", "-q",
                 "--axolotl-yaml", str(tmp_path / "ax.yaml")]) == 2
    assert "give it with --axolotl-config" in capsys.readouterr().err
