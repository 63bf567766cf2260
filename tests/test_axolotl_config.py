"""sv.from_axolotl / --axolotl-config against axolotl's own code.

axolotl pins its whole stack, so it runs in its own venv (``scripts/setup.sh --axolotl`` makes
``.venv-axolotl``; ``SHARDVIZ_AXOLOTL_PYTHON`` names another). ``tests/axolotl_truth.py`` runs there:
accelerate's preparation with axolotl's own ``fsdp2_prepare_model`` on a meta copy under the fake process
group, outside shardviz's capture, and torch's record after shardviz's oracle applies the plan read; the two
records must be the same, call by call. What the training says is compared with the YAML.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from framework_venv import framework_python
import yaml

HERE = os.path.dirname(__file__)
ROOT = os.path.dirname(HERE)
TINY = os.path.join("tests", "configs", "axolotl", "tiny_lora.yaml")  # base_model is relative to the repo root
QLORA = os.path.join("tests", "configs", "axolotl", "tiny_qlora.yaml")


def axolotl_python() -> str:
    return framework_python("axolotl")


def run_there(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([axolotl_python(), *argv], capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (ROOT, os.environ.get("PYTHONPATH"))))})


def recipe() -> dict:
    with open(os.path.join(ROOT, TINY), encoding="utf-8") as f:
        return yaml.safe_load(f)


@pytest.mark.slow
def test_plan_is_axolotls_own_preparation_call_by_call():
    done = run_there(os.path.join(HERE, "axolotl_truth.py"), TINY)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    body = recipe()
    with open(os.path.join(ROOT, body["base_model"], "config.json"), encoding="utf-8") as f:
        layers = json.load(f)["num_hidden_layers"]
    assert out["calls_equal"], out
    assert out["n_calls"] == out["units"]
    # axolotl's own units: one per lora_A / lora_B module peft made (torch's count of the modules), the layers
    assert out["lora_units"] == out["lora_modules"] > 0
    assert out["n_calls"] - out["lora_units"] > layers
    assert len(out["checkpoint"]) == layers  # gradient_checkpointing: true, the model's own enable
    t = out["training"]
    assert (t["batch_size"], t["seq_len"], t["grad_accum"]) == (
        body["micro_batch_size"], body["sequence_len"], body["gradient_accumulation_steps"])
    assert t["param_dtype"] == "bfloat16" and t["fused"] and out["lora_r"] == body["lora_r"]
    said = {code: (message, fix) for code, message, fix in out["findings"]}
    assert "its own fully_shard call" in said["SV312"][0] and "lora_target_modules" in said["SV312"][1]
    # axolotl's normalize_config gives gradient_checkpointing_kwargs {use_reentrant: True}: read off the layers
    assert "use_reentrant=True" in said["SV310"][0] and "normalize_config" in said["SV310"][0]
    assert "use_reentrant: false" in said["SV310"][1]
    held = out["torch_held"]  # what torch's FSDP state holds on rank 0 after axolotl's preparation, to the byte
    assert sum(held["sharded"].values()) == out["predicted"]["params_sharded"] and held["quant_state"] == 0


def truth(path: str) -> dict:
    done = run_there(os.path.join(HERE, "axolotl_truth.py"), path)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_qlora_base_is_bitsandbytes_4bit_through_axolotls_own_preparation():
    """``adapter: qlora`` + ``load_in_4bit``: the base is built with the BitsAndBytesConfig axolotl's own
    ModelLoader gives from_pretrained (nf4, double quantization, bf16 storage for FSDP), and axolotl's
    fsdp2_prepare_model shards it: the calls are torch's, call by call, and the bytes torch's FSDP state holds
    on rank 0 (the packed 4-bit shards, the LoRA shards) and the quant_state every 4-bit linear keeps whole are
    shardviz's, to the byte."""
    lora, qlora = truth(TINY), truth(QLORA)
    assert qlora["calls_equal"] and qlora["n_calls"] == lora["n_calls"], qlora  # the same calls, on 4-bit weights
    assert "Params4bit bfloat16" in qlora["params"]  # bnb_4bit_quant_storage: bfloat16, as axolotl sets it
    held = qlora["torch_held"]
    assert sum(held["sharded"].values()) == qlora["predicted"]["params_sharded"]
    assert held["quant_state"] == qlora["predicted"]["quant_state"] > 0 and held["quant_linears"] > 0
    assert qlora["predicted"]["params_sharded"] < lora["predicted"]["params_sharded"]  # the base is 4-bit
    assert "nf4 double-quantized, stored as bfloat16" in qlora["origins"]["model"]
    assert "SV315" not in {code for code, _, _ in qlora["findings"]}  # priced as axolotl loads it, no caveat


@pytest.mark.slow
def test_report_reads_the_axolotl_yaml(tmp_path):
    done = run_there("-m", "shardviz.cli", "report", "--axolotl-config", TINY, "--world-size", "4",
                     "-o", str(tmp_path / "r.html"))
    assert done.returncode == 0, done.stderr[-3000:]
    said = done.stdout + done.stderr
    body = recipe()
    assert f"read: batch_size: micro_batch_size={body['micro_batch_size']} (tiny_lora.yaml)" in said
    assert f"sequence_len={body['sequence_len']}" in said and "plan: axolotl: tiny_lora.yaml" in said
    assert "warning SV310" in said and "gradient_checkpointing_kwargs: {use_reentrant: false}" in " ".join(said.split())


@pytest.mark.slow
def test_export_back_to_axolotls_fsdp_config_round_trips():
    """to_axolotl: the plan axolotl made, written as its fsdp_config block, read back by from_axolotl gives the same
    calls, and axolotl's own preparation of the exported YAML gives torch what the plan exported gives it; a plan
    without axolotl's adapter calls names them as what its keys cannot say."""
    done = run_there(os.path.join(HERE, "axolotl_truth.py"), TINY, "--export")
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["cannot"] == [] and out["units_equal"] and out["checkpoint_equal"] and out["torch_calls_equal"], out
    exported = yaml.safe_load(out["text"])
    assert exported["fsdp_config"]["transformer_layer_cls_to_wrap"] == "LlamaDecoderLayer"
    assert exported["base_model"] == recipe()["base_model"]  # the rest of the user's file kept
    assert exported["gradient_checkpointing"] is True and not exported["fsdp_config"]["activation_checkpointing"]
    assert any("lora_A / lora_B" in c and "SV312" in c for c in out["cannot_auto"]), out["cannot_auto"]


@pytest.mark.slow
def test_cli_export_writes_the_axolotl_yaml(tmp_path):
    back = tmp_path / "back.yaml"
    done = run_there("-m", "shardviz.cli", "export", "--axolotl-config", TINY, "--world-size", "4", "-q",
                     "-o", str(tmp_path / "fsdp.py"), "--axolotl-yaml", str(back))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "axolotl makes exactly these calls from it" in done.stderr
    assert yaml.safe_load(back.read_text())["fsdp_config"]["fsdp_version"] == 2


def test_an_axolotl_yaml_given_as_accelerate_config_says_so(tmp_path, capsys):
    pytest.importorskip("accelerate")
    from shardviz.cli import main

    assert main(["report", "zoo:tiny_llama_lora", "--accelerate-config", os.path.join(ROOT, TINY),
                 "--world-size", "2"]) == 2
    err = capsys.readouterr().err
    assert "this is an axolotl config" in err and "use --axolotl-config" in err


def test_missing_axolotl_says_how_to_install():
    from importlib.util import find_spec

    from shardviz.frameworks.axolotl_config import from_axolotl

    if find_spec("axolotl") is not None:
        pytest.skip("axolotl is installed here")
    with pytest.raises(ImportError, match="scripts/setup.sh --axolotl"):
        from_axolotl(os.path.join(ROOT, TINY), world_size=4)
