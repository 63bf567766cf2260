"""``sv.load_model`` on the shipped example configs (``examples/``): meta, offline, peft's own adapters."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import shardviz as sv
from shardviz.model.load import ModelFileError

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
QWEN, QWEN_LORA = EXAMPLES / "qwen2.5-0.5b", EXAMPLES / "qwen2.5-0.5b-lora"
T5, T5_DORA = EXAMPLES / "t5-small" / "config.json", EXAMPLES / "t5-small-dora" / "adapter_config.json"


def test_config_alone_builds_the_named_class_on_meta(no_network):
    cfg = json.loads((QWEN / "config.json").read_text())
    model = sv.load_model(QWEN)  # a folder, as save_pretrained leaves it
    assert type(model).__name__ == "Qwen2ForCausalLM"
    params = list(model.parameters())
    assert {p.device.type for p in params} == {"meta"}
    assert {p.dtype for p in params} == {torch.bfloat16}  # the config's torch_dtype
    assert len(model.model.layers) == cfg["num_hidden_layers"]
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tie_word_embeddings
    assert model.model.layers[0].mlp.gate_proj.weight.shape == (cfg["intermediate_size"], cfg["hidden_size"])

    t5 = sv.load_model(T5, dtype="float16")  # seq2seq head from 'architectures'; dtype overrides
    assert type(t5).__name__ == "T5ForConditionalGeneration"
    assert {p.dtype for p in t5.parameters()} == {torch.float16}


def test_adapter_is_peft_own_and_trainable(no_network):
    model = sv.load_model(QWEN / "config.json", adapter=QWEN_LORA / "adapter_config.json")
    assert type(model).__name__ == "PeftModelForCausalLM"
    tree = sv.ModelTree(model)
    lora = [p for p in tree.params if p.role == "lora"]
    # 7 target modules x 24 layers x (A, B), trainable although the file says inference_mode=true
    assert len(lora) == 7 * 24 * 2 and all(p.requires_grad for p in lora)
    assert {p.dtype for p in lora} == {torch.float32}  # peft's autocast_adapter_dtype
    saved = [p for p in tree.params if "modules_to_save" in p.fqn]
    assert len(saved) == 1 and saved[0].requires_grad and saved[0].role == "base"
    frozen = [p for p in tree.params if p.role == "base" and "modules_to_save" not in p.fqn]
    assert not any(p.requires_grad for p in frozen)

    t5 = sv.load_model(T5, adapter=T5_DORA)
    names = [n for n, _ in t5.named_parameters()]
    assert any("lora_magnitude_vector" in n for n in names)  # DoRA
    assert type(t5).__name__ == "PeftModelForSeq2SeqLM"
    # torch agrees with the engine on the user's own model
    assert sv.verify(t5, sv.Plan.auto(t5, lora="ignored"), mesh=sv.Mesh(4)).empty


def test_loading_prints_no_warning():
    """peft's tie_word_embeddings warning (a tied embedding in modules_to_save) concerns merging the
    weights later, not this meta model: the user sees nothing (issue 19)."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sv.load_model(QWEN / "config.json", adapter=QWEN_LORA / "adapter_config.json")
    said = [str(w.message) for w in caught if not issubclass(w.category, DeprecationWarning)]
    assert not [s for s in said if "tie_word_embeddings" in s], said


def test_several_adapters(tmp_path):
    second = tmp_path / "narrow"
    second.mkdir()
    cfg = json.loads((QWEN_LORA / "adapter_config.json").read_text())
    cfg.update(r=4, target_modules=["o_proj"], modules_to_save=None)
    (second / "adapter_config.json").write_text(json.dumps(cfg))
    model = sv.load_model(QWEN, adapter=[QWEN_LORA, second])
    assert set(model.peft_config) == {"default", "narrow"}
    names = [n for n, _ in model.named_parameters()]
    assert sum(".lora_A.narrow." in n for n in names) == 24
    # as peft leaves them: the first adapter active and trainable, the others frozen
    trainable = {n.split(".")[-2] for n, p in model.named_parameters() if p.requires_grad and "lora_" in n}
    assert trainable == {"default"} and model.active_adapters == ["default"]
    model = sv.load_model(QWEN, adapter={"a": QWEN_LORA, "b": second})
    assert set(model.peft_config) == {"a", "b"}


def test_files_are_not_changed(tmp_path):
    before = {p: p.read_bytes() for p in EXAMPLES.rglob("*.json")}
    sv.load_model(T5, adapter=T5_DORA)
    assert {p: p.read_bytes() for p in EXAMPLES.rglob("*.json")} == before


def _broken(tmp_path, source: Path, edit) -> Path:
    folder = tmp_path / source.parent.name
    folder.mkdir(exist_ok=True)
    target = folder / source.name
    obj = json.loads(source.read_text())
    text = edit(obj)
    target.write_text(text if isinstance(text, str) else json.dumps(obj))
    return target


def _drop(key):
    return lambda obj: obj.pop(key) and None


def _set(key, value):
    return lambda obj: obj.__setitem__(key, value)


BROKEN_CONFIGS = [
    ("invalid json", lambda obj: '{"model_type": "t5",', "not valid JSON"),
    ("no model_type", _drop("model_type"), "'model_type' is missing"),
    ("unknown model_type", _set("model_type", "t55"), "'model_type' is 't55'"),
    ("unknown class", _set("architectures", ["T5ForConditionalGenerator"]), "'architectures' names 'T5ForConditionalGenerator'"),
    ("class of another model", _set("architectures", ["LlamaForCausalLM"]), "field 'model_type' is 't5'"),
]


@pytest.mark.parametrize("case,edit,reason", BROKEN_CONFIGS, ids=[c[0] for c in BROKEN_CONFIGS])
def test_broken_config_is_one_line_naming_file_and_field(tmp_path, case, edit, reason):
    path = _broken(tmp_path, T5, edit)
    with pytest.raises(ModelFileError) as info:
        sv.load_model(path)
    message = str(info.value)
    assert reason in message and str(path) in message and "\n" not in message, message


BROKEN_ADAPTERS = [
    ("no peft_type", _drop("peft_type"), "'peft_type' is missing"),
    ("unknown peft_type", _set("peft_type", "LORAX"), "'peft_type' is 'LORAX'"),
    ("unknown field", _set("lora_rank", 8), "['lora_rank'] unknown"),
    ("target not in model", _set("target_modules", ["qq"]), "field 'target_modules'"),
]


@pytest.mark.parametrize("case,edit,reason", BROKEN_ADAPTERS, ids=[c[0] for c in BROKEN_ADAPTERS])
def test_broken_adapter_is_one_line_naming_file_and_field(tmp_path, case, edit, reason):
    path = _broken(tmp_path, T5_DORA, edit)
    with pytest.raises(ModelFileError) as info:
        sv.load_model(T5, adapter=path)
    message = str(info.value)
    assert reason in message and str(path) in message and "\n" not in message, message


def test_missing_files(tmp_path):
    with pytest.raises(ModelFileError, match="no config.json in folder"):
        sv.load_model(tmp_path)
    with pytest.raises(ModelFileError, match="nope.json': no such file"):
        sv.load_model(tmp_path / "nope.json")
    shutil.copy(T5, tmp_path / "config.json")
    with pytest.raises(ModelFileError, match="no adapter_config.json in folder"):
        sv.load_model(tmp_path, adapter=tmp_path)
    with pytest.raises(ValueError, match="dtype='int8'"):
        sv.load_model(T5, dtype="int8")
