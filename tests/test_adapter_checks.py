"""Findings about the files a model is built from, with real peft on meta models (``sv.load_model``):
SV120 (an adapter's target_modules that miss this model's fused projections), SV121 (a float32
config), and peft's refusal of dropout on transformers 5's fused MoE experts as a clear message."""

from __future__ import annotations

import json

import pytest

import shardviz as sv
from shardviz.cli import main
from shardviz.format import format_bytes

LLAMA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Phi-3-mini's card, shrunk: fused qkv_proj and gate_up_proj
PHI3 = {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256,
        "max_position_embeddings": 512, "pad_token_id": 0, "torch_dtype": "bfloat16"}
LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
         "max_position_embeddings": 512, "torch_dtype": "bfloat16"}
# Qwen3-30B-A3B's card, shrunk: transformers 5 fuses the experts' weights into parameters
QWEN3_MOE = {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64,
             "intermediate_size": 128, "moe_intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "vocab_size": 256,
             "max_position_embeddings": 512, "torch_dtype": "bfloat16"}


def files(tmp_path, config: dict, targets=LLAMA_TARGETS, dropout=0.05, **config_changes):
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**config, **config_changes}))
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": 16, "lora_alpha": 32, "lora_dropout": dropout, "target_modules": targets,
        "task_type": "CAUSAL_LM"}))
    return folder / "config.json", folder / "adapter_config.json"


def findings(model, code):
    a = sv.analyze(model, sv.Plan.auto(model), sv.Mesh(8), sv.Training())
    return [f for f in a.findings if f.code == code]


def test_llama_targets_on_phi3_name_the_fused_projections(tmp_path):
    config, adapter = files(tmp_path, PHI3)
    model = sv.load_model(config, adapter=adapter)
    adapted = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if hasattr(m, "lora_A")}
    assert adapted == {"o_proj", "down_proj"}  # the premise, as peft applied it
    (f,) = findings(model, "SV120")
    assert str(adapter) in f.message and "qkv_proj (fused)" in f.message and "gate_up_proj (fused)" in f.message
    assert "'q_proj'" in f.message and "reaches only down_proj, o_proj" in f.message
    assert "'qkv_proj'" in f.fix and "target_modules" in f.fix


def test_no_sv120_where_the_targets_match_or_are_all_linear(tmp_path):
    config, adapter = files(tmp_path, LLAMA)
    assert findings(sv.load_model(config, adapter=adapter), "SV120") == []
    config, adapter = files(tmp_path, PHI3, targets="all-linear")
    assert findings(sv.load_model(config, adapter=adapter), "SV120") == []
    config, adapter = files(tmp_path, PHI3, targets=["qkv_proj", "o_proj", "gate_up_proj", "down_proj"])
    assert findings(sv.load_model(config, adapter=adapter), "SV120") == []


def test_a_float32_config_says_it_doubles_the_weights(tmp_path):
    config, adapter = files(tmp_path, LLAMA, torch_dtype="float32")
    model = sv.load_model(config, adapter=adapter)
    (f,) = findings(model, "SV121")
    frozen = sum(p.numel() * 4 for p in model.parameters() if not p.requires_grad)
    assert f.severity == "warning" and str(config) in f.message and "'torch_dtype'" in f.message
    assert f"({format_bytes(frozen)})" in f.message
    assert f.fix_for("cli") == "--dtype bfloat16" and "dtype=\"bfloat16\"" in f.fix_for("python")
    # said by the config and overridden, or declared bf16: nothing to say
    assert findings(sv.load_model(config, adapter=adapter, dtype="bfloat16"), "SV121") == []
    config, adapter = files(tmp_path, LLAMA)
    assert findings(sv.load_model(config, adapter=adapter), "SV121") == []
    # full fine-tuning in fp32 master weights is a choice: info
    assert [f.severity for f in findings(sv.load_model(files(tmp_path, LLAMA, torch_dtype="float32")[0]), "SV121")] == ["info"]


def test_dropout_on_fused_moe_experts_is_a_clear_message(tmp_path, capsys):
    config, adapter = files(tmp_path, QWEN3_MOE)
    with pytest.raises(sv.model.load.ModelFileError) as err:
        sv.load_model(config, adapter=adapter)
    text = str(err.value)
    assert text.startswith(str(adapter)) and "field 'lora_dropout' is 0.05" in text
    assert '"lora_dropout": 0.0' in text and "ParamWrapper" in text
    assert main(["report", str(config), "--adapter", str(adapter), "--world-size", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "field 'lora_dropout'" in err
    config, adapter = files(tmp_path, QWEN3_MOE, dropout=0.0)  # what the message says to do works
    assert sv.load_model(config, adapter=adapter) is not None


def test_the_cli_report_shows_sv120(tmp_path, capsys):
    config, adapter = files(tmp_path, PHI3)
    assert main(["report", str(config), "--adapter", str(adapter), "--world-size", "8", "--no-compare",
                 "-o", str(tmp_path / "r.html")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "SV120" in out and "No findings" not in (tmp_path / "r.html").read_text()


# GPTQ and AWQ quantization_configs, as config.json carries them: not built (fp8 blocks and bitsandbytes
# 4-bit / 8-bit are, tests/test_quant_formats_truth.py)
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False}
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm"}


@pytest.mark.parametrize("qc, said", [(GPTQ, "quant_method: 'gptq', bits: 4"), (AWQ, "quant_method: 'awq', bits: 4")],
                         ids=["gptq", "awq"])
def test_a_quantization_config_is_an_error_not_a_silent_price(tmp_path, qc, said):
    config, adapter = files(tmp_path, LLAMA, quantization_config=qc)
    model = sv.load_model(config, adapter=adapter)
    assert sv.model.load.source_of(model).quantization == qc  # load_model remembers it (and transformers keeps it)
    found = findings(model, "SV122")
    assert len(found) == 1 and found[0].severity == "error"
    assert f"{config}: field 'quantization_config' is {{{said}" in found[0].message
    assert "priced as the unquantized dtype (bfloat16)" in found[0].message


def test_no_sv122_without_quantization(tmp_path):
    config, adapter = files(tmp_path, LLAMA)
    assert not findings(sv.load_model(config, adapter=adapter), "SV122")


def test_a_quantized_parameter_class_is_named_without_importing_its_library():
    """A parameter of bitsandbytes' Params4bit class (a stand-in defined here under that module's name)
    that holds no packed data (no quant_state): not priced, so SV122."""
    import torch
    from torch import nn

    params4bit = type("Params4bit", (nn.Parameter,), {"__module__": "bitsandbytes.nn.modules"})
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    model[0].weight = params4bit(torch.zeros(32, 1, dtype=torch.uint8), requires_grad=False)
    found = findings(model, "SV122")
    assert len(found) == 1 and found[0].severity == "error"
    assert "1 parameters are bitsandbytes.nn.modules.Params4bit (e.g. '0.weight')" in found[0].message
    assert found[0].fqns == ("0.weight",) and "quantize the weights first" in found[0].fix


def test_cli_loads_in_4bit_and_says_so(tmp_path, capsys):
    """--load-in-4bit builds the config as bitsandbytes 4-bit (uint8 storage, bitsandbytes' default: SV124);
    --quant-storage bfloat16 shards it; the model line names the quantization."""
    pytest.importorskip("bitsandbytes")
    config, adapter = files(tmp_path, LLAMA)
    args = ["report", str(config), "--adapter", str(adapter), "--world-size", "2", "-o", str(tmp_path / "r.html")]
    assert main([*args, "--load-in-4bit"]) in (0, 1)
    out = " ".join("".join(capsys.readouterr()).split())  # lines wrapped for the terminal
    assert "4-bit nf4 (bitsandbytes, uint8 storage)" in out and "SV124" in out and "SV122" not in out
    assert main([*args, "--load-in-4bit", "--quant-storage", "bfloat16", "--param-dtype", "float32", "--force"]) in (0, 1)
    out = " ".join("".join(capsys.readouterr()).split())  # lines wrapped for the terminal
    assert "bfloat16 storage" in out and "SV123" in out and "SV124" not in out


def _qlora_bf16(folder, trainable: bool):
    """A real bitsandbytes nf4 model (bf16 storage) with bf16 LoRA, its packed weights trainable or not."""
    import torch

    from qlora_models import bnb_config, quantized

    model = quantized(folder, bnb_config("nf4", "bfloat16"), adapter=True)
    for name, p in model.named_parameters():
        if "lora_" in name:
            p.data = p.data.to(torch.bfloat16)
        elif type(p).__name__ == "Params4bit" and trainable:
            p.requires_grad_(True)
    return model


def test_trainable_quantized_weights_are_found_and_torch_gives_them_no_gradient(tmp_path):
    """SV125: Params4bit left with requires_grad=True. Under torch's own fully_shard (fake process group)
    they receive no gradient: the sharded gradients and the reduce-scatters are the frozen model's, and so
    are the figures; the finding names them and the fix in the user's terms."""
    pytest.importorskip("bitsandbytes")
    from qlora_models import save_llama
    from torch_truth import fake_run

    save_llama(tmp_path / "base")
    trained, frozen = (_qlora_bf16(tmp_path / "base", t) for t in (True, False))
    plan, mesh, training = sv.Plan.auto(trained), sv.Mesh(shard=2), sv.Training()
    found = [f for f in sv.analyze(trained, plan, mesh, training).findings if f.code == "SV125"]
    packed = [n for n, p in trained.named_parameters() if type(p).__name__ == "Params4bit"]
    assert len(found) == 1 and found[0].severity == "error" and set(found[0].all_fqns) == set(packed)
    assert packed[0] in found[0].message and "requires_grad_(False)" in found[0].fix
    assert "prepare_model_for_kbit_training" in found[0].fix
    assert not [f for f in sv.analyze(frozen, plan, mesh, training).findings if f.code == "SV125"]

    step = sv.Training(batch_size=1, seq_len=16)
    truths = [fake_run(lambda t=t: _qlora_bf16(tmp_path / "base", t), plan, mesh, step, 0) for t in (True, False)]
    reduced = [sorted(c["bytes"] for c in t.collectives if c["collective"] == "reduce_scatter") for t in truths]
    assert truths[0].sharded_grads == truths[1].sharded_grads > 0 and reduced[0] == reduced[1]
    priced = sv.analyze(trained, plan, mesh, training).memory.grads.iloc[0]
    assert priced == truths[0].sharded_grads  # priced as torch runs it: no gradient for the packed weights
