"""``shardviz report`` on each framework's own file for Llama-3.1 8B and 70B, as a user runs it, with no hand
translation: a TRL SFT config (``examples/frameworks/trl_sft_llama3_*.yaml``), an axolotl YAML
(``examples/frameworks/axolotl_lora_llama3_*.yaml``) and torchtune's own shipped recipes (``llama3_1/8B_lora``,
``llama3_1/70B_lora``, named as ``tune run --config`` takes them). The batch, sequence, accumulation and LoRA
rank the report prints are the file's (read here from the file), the model is the one the file names, and the
number of ``fully_shard`` calls is one per decoder layer of that model plus the root, plus axolotl's own call on
every ``lora_A`` / ``lora_B`` of the file's targets, plus at most the embedding and head. Each runs in its
framework's interpreter (axolotl and torchtune: their own venvs, ``tests/framework_venv.py``). That the calls
are the ones the framework's preparation makes is held against torch call by call in
``test_trainer_config.py``, ``test_axolotl_config.py`` and ``test_torchtune_config.py``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from framework_venv import framework_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples", "frameworks")


def report(python: str, *argv: str, tmp_path) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (ROOT, os.environ.get("PYTHONPATH"))))}
    done = subprocess.run([python, "-m", "shardviz.cli", "report", *argv, "--world-size", "8",
                           "-o", str(tmp_path / "r.html")], capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "r.html").stat().st_size > 0
    return " ".join((done.stdout + done.stderr).split())  # the report's lines unwrapped


def calls(said: str) -> int:
    return int(re.search(r"\((\d+) fully_shard calls\)", said).group(1))


def layers(config_json: str) -> int:
    with open(os.path.join(ROOT, config_json), encoding="utf-8") as f:
        return json.load(f)["num_hidden_layers"]


def example(name: str) -> tuple[str, dict]:
    path = os.path.join(EXAMPLES, name)
    with open(path, encoding="utf-8") as f:
        return path, yaml.safe_load(f)


@pytest.mark.slow
@pytest.mark.parametrize("size", ["8b", "70b"])
def test_report_on_a_trl_sft_config(size, tmp_path):
    path, body = example(f"trl_sft_llama3_{size}.yaml")
    said = report(sys.executable, "--trainer-config", path, tmp_path=tmp_path)
    name = os.path.basename(path)
    assert f"per_device_train_batch_size={body['per_device_train_batch_size']} (from {name})" in said
    assert f"max_length={body['max_length']} (from {name})" in said
    assert f"gradient_accumulation_steps={body['gradient_accumulation_steps']} (from {name})" in said
    assert f"LoRA r={body['lora_r']} alpha={body['lora_alpha']}" in said
    assert f"model_name_or_path={body['model_name_or_path']}" in said
    n = layers(body["model_name_or_path"])
    assert 0 <= calls(said) - (n + 1) <= 2, said  # a call per LlamaDecoderLayer (the file's class), the root
    assert f"checkpointing inside the forward of {n} LlamaDecoderLayer layers" in said  # activation_checkpointing


@pytest.mark.slow
@pytest.mark.parametrize("size", ["8b", "70b"])
def test_report_on_an_axolotl_yaml(size, tmp_path):
    path, body = example(f"axolotl_lora_llama3_{size}.yaml")
    said = report(framework_python("axolotl"), "--axolotl-config", path, tmp_path=tmp_path)
    name = os.path.basename(path)
    assert f"micro_batch_size={body['micro_batch_size']} ({name})" in said
    assert f"sequence_len={body['sequence_len']} ({name}; sample_packing={body['sample_packing']})" in said
    assert f"gradient_accumulation_steps={body['gradient_accumulation_steps']} ({name})" in said
    assert f"adapter={body['adapter']} r={body['lora_r']} alpha={body['lora_alpha']}" in said
    n = layers(body["base_model"])
    adapters = 2 * len(body["lora_target_modules"]) * n  # axolotl's own call on each lora_A and lora_B (SV312)
    assert 0 <= calls(said) - adapters - (n + 1) <= 2, said
    assert f"SV312: axolotl 0.19.0's fsdp2_prepare_model gives every LoRA lora_A / lora_B its own fully_shard " \
           f"call: {adapters} of the {calls(said)} calls" in said


TORCHTUNE_LAYERS = """
import sys, torch
from torchtune import config
from shardviz.frameworks.torchtune_config import read_recipe, recipe_file
with torch.device("meta"):
    model = config.instantiate(read_recipe(sys.argv[1]).model)
print(recipe_file(sys.argv[1]), len(model.layers))
"""


def torchtune_recipe(name: str) -> tuple[dict, int]:
    """The config torchtune ships under ``name`` (found by torchtune's registry in its venv, read here) and the
    number of layers its model builder makes (torch's count, on meta)."""
    done = subprocess.run([framework_python("torchtune"), "-c", TORCHTUNE_LAYERS, name], capture_output=True,
                          text=True, timeout=600, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr[-3000:]
    path, n = done.stdout.strip().splitlines()[-1].rsplit(" ", 1)
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f), int(n)


@pytest.mark.slow
@pytest.mark.parametrize("name, overrides", [("llama3_1/8B_lora", ()), ("llama3_1/70B_lora", ("tokenizer.max_seq_len=4096",))])
def test_report_on_a_torchtune_recipe(name, overrides, tmp_path):
    body, n = torchtune_recipe(name)
    said = report(framework_python("torchtune"), "--torchtune-config", name, *overrides, tmp_path=tmp_path)
    model = body["model"]
    assert f"batch_size={body['batch_size']} (recipe)" in said
    assert f"gradient_accumulation_steps={body['gradient_accumulation_steps']} (recipe)" in said
    assert f"lora_rank={model['lora_rank']} lora_alpha={model['lora_alpha']}" in said
    if overrides:
        assert "tokenizer.max_seq_len=4096 (override" in said
    else:  # the recipe leaves the sequence to the longest sample: shardviz's default, and the report says so
        assert body["tokenizer"]["max_seq_len"] is None and "shardviz's default: tokenizer.max_seq_len is null" in said
    assert f"model._component_={model['_component_']}" in said
    assert calls(said) == n + 1 + len(body.get("custom_sharded_layers") or ()), said  # shard_model: layers, custom, root
