"""A zoo of real model trees to plan FSDP2 ``fully_shard`` against.

Why a zoo: a sharding plan is only as believable as the module tree it was
made for, so these are the genuine transformers classes (real module names,
real nesting, real peft LoRA wrappers), not look-alikes.

* ``tiny_llama_lora`` is small enough to run and train on a CPU in seconds,
  so a plan can be executed end to end in tests.
* The big ones (Llama 3.1 8B / 70B / 405B, Qwen3-30B-A3B, NLLB-MoE 54B) are
  built on the ``meta`` device from configs shipped in ``shardviz/configs``:
  shapes and dtypes are exact, no byte of weight is allocated, and nothing is
  fetched from the Hugging Face Hub (the configs are written out by hand).

Why two MoE models: transformers 5.x fuses the experts of every modern
decoder MoE (Qwen3-MoE, Mixtral, DeepSeek, ...) into 3-D parameters, so
Qwen3-30B-A3B has only ~4,000 modules even with LoRA. NLLB-MoE (like Switch
Transformers) still keeps one ``nn.Module`` per expert, which gives ~43,000
modules with LoRA: the stress test for anything that walks the module tree.

Every builder returns a fresh ``nn.Module`` (callers shard it in place, so
nothing is cached) and the same call always gives the same tree.
"""

from __future__ import annotations

import json
import warnings
from importlib import resources

import torch
from torch import nn

from .libraries import MODEL_BASE, import_quietly

#: Builders in the order a CLI should list them; ``build("zoo:<name>")`` works too.
NAMES = (
    "tiny_llama_lora",
    "llama3_8b",
    "llama3_70b",
    "llama3_405b",
    "qwen3_moe_30b_a3b",
    "nllb_moe_54b",
)

# The zoo's largest model by module count (one module per expert): benchmarks and scale tests use it.
LARGEST_MOE = "nllb_moe_54b"

# Decoder-only models are causal LMs; NLLB is an encoder-decoder translator.
_TASKS = {
    "llama3_8b": "CAUSAL_LM",
    "llama3_70b": "CAUSAL_LM",
    "llama3_405b": "CAUSAL_LM",
    "qwen3_moe_30b_a3b": "CAUSAL_LM",
    "nllb_moe_54b": "SEQ_2_SEQ_LM",
}


def load_config(name: str):
    """The transformers config for ``shardviz/configs/<name>.json``.

    Read with importlib.resources so it works from a wheel or a zip; keys
    starting with ``_`` are our comments, not config fields.
    """
    from transformers import CONFIG_MAPPING

    text = (resources.files("shardviz") / "configs" / f"{name}.json").read_text()
    d = {k: v for k, v in json.loads(text).items() if not k.startswith("_")}
    return CONFIG_MAPPING[d.pop("model_type")].from_dict(d)


def _auto_class(task: str):
    import transformers

    import_quietly(MODEL_BASE)  # what it imports says things that are not the caller's (``shardviz.libraries``)
    return {
        "CAUSAL_LM": transformers.AutoModelForCausalLM,
        "SEQ_2_SEQ_LM": transformers.AutoModelForSeq2SeqLM,
    }[task]


def _add_lora(model: nn.Module, task: str, **lora_kwargs) -> nn.Module:
    """Wrap ``model`` with peft LoRA (base frozen, adapters trainable).

    Two warnings are about peft's own internals, not the caller's code, so
    they are silenced: a deprecated transformers property peft reads on every
    call, and (for fused MoE experts) the rank/alpha pattern peft itself adds
    for ``gate_up_proj``, which it applies and then reports as "unmatched".
    """
    import_quietly("peft")  # its imports' messages (torchao's CUDA kernels...) are not the caller's (``libraries``)
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(task_type=task, lora_dropout=0.0, **lora_kwargs)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
        warnings.filterwarnings("ignore", message=r".*_pattern keys did not match.*gate_up_proj")
        return get_peft_model(model, config)


def _meta_model(name: str, lora: bool) -> nn.Module:
    """Build config ``name`` on the meta device, optionally with LoRA r=16.

    Both steps run inside ``torch.device("meta")``: peft creates its LoRA
    weights on the CPU and moves them to the base layer's device afterwards,
    so outside the context a 405B model would allocate (and randomly
    initialise) 2.5 GB of adapters first. The base dtype comes from the
    config (bf16); peft keeps LoRA weights in fp32 (its autocast_adapter_dtype
    default), as in real LoRA fine-tuning.
    """
    task = _TASKS[name]
    config = load_config(name)
    with torch.device("meta"):
        model = _auto_class(task).from_config(config)
        if lora:
            # "all-linear": every nn.Linear except the output head, plus
            # (peft 0.21) the fused 3-D expert and router weights of MoE layers.
            model = _add_lora(model, task, r=16, lora_alpha=32, target_modules="all-linear")
    return model


def llama3_8b(lora: bool = True) -> nn.Module:
    """Llama 3.1 8B on meta (same shapes as Llama 3 8B), 8,030,261,248 base params."""
    return _meta_model("llama3_8b", lora)


def llama3_70b(lora: bool = True) -> nn.Module:
    """Llama 3.1 70B on meta (same shapes as Llama 3 70B), 70,553,706,496 base params."""
    return _meta_model("llama3_70b", lora)


def llama3_405b(lora: bool = True) -> nn.Module:
    """Llama 3.1 405B on meta, 405,853,388,800 base params (126 layers)."""
    return _meta_model("llama3_405b", lora)


def qwen3_moe_30b_a3b(lora: bool = True) -> nn.Module:
    """Qwen3-30B-A3B on meta, 30,532,122,624 base params.

    128 experts per layer, but fused by transformers 5.x into two 3-D
    parameters per layer, so the tree is small (peft adds per-expert LoRA
    on those parameters through ``ParamWrapper``).
    """
    return _meta_model("qwen3_moe_30b_a3b", lora)


def nllb_moe_54b(lora: bool = True) -> nn.Module:
    """NLLB-MoE 54.5B on meta: 12 MoE layers x 128 experts, one module each.

    The largest real model whose transformers implementation has a module per
    expert: 8,582 modules bare, ~43,000 with LoRA on every linear layer
    (including the expert and router layers).
    """
    return _meta_model("nllb_moe_54b", lora)


def tiny_llama_lora(seed: int = 0, lora: bool = True) -> nn.Module:
    """A tiny real LlamaForCausalLM on CPU in float32, with LoRA r=8.

    hidden 64, intermediate 128, 2 layers, 4 heads (2 kv), vocab 128, untied
    embeddings, LoRA on q/k/v/o/gate/up/down. peft's default init (lora_B = 0)
    is kept, so the adapted model starts equal to the base one and still
    trains: lora_B gets a non-zero gradient on the first step.

    Deterministic: weights depend on ``seed`` only. The global RNG is forked,
    so building a model does not disturb the caller's random stream.
    """
    config = load_config("tiny_llama")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _auto_class("CAUSAL_LM").from_config(config)
        if lora:
            targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
            model = _add_lora(model, "CAUSAL_LM", r=8, lora_alpha=16, target_modules=targets)
    return model


def tiny_batch(seed: int = 0, batch: int = 2, seq: int = 16) -> dict[str, torch.Tensor]:
    """Random tokens for ``tiny_llama_lora``: ``input_ids`` and ``labels``.

    Labels equal the inputs; the model shifts them for next-token loss. Uses a
    private generator so the batch depends on ``seed`` alone.
    """
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 128, (batch, seq), generator=g)
    return {"input_ids": ids, "labels": ids.clone()}


_BUILDERS = {
    "tiny_llama_lora": tiny_llama_lora,
    "llama3_8b": llama3_8b,
    "llama3_70b": llama3_70b,
    "llama3_405b": llama3_405b,
    "qwen3_moe_30b_a3b": qwen3_moe_30b_a3b,
    "nllb_moe_54b": nllb_moe_54b,
}
assert tuple(_BUILDERS) == NAMES


def build(name: str, lora: bool = True) -> nn.Module:
    """Build zoo model ``name`` (a ``zoo:`` prefix, as the CLI writes it, is allowed)."""
    key = name.removeprefix("zoo:")
    if key not in _BUILDERS:
        raise ValueError(f"unknown zoo model {name!r}; valid names: {', '.join(NAMES)}")
    return _BUILDERS[key](lora=lora)


def describe(names=NAMES, lora: bool = True) -> list[dict]:
    """One row per model: name, params, trainable params, modules.

    Builds each model (the MoE ones take ~10 s), so pass ``names`` to limit it.
    """
    rows = []
    for name in names:
        model = build(name, lora=lora)
        params = list(model.parameters())
        rows.append(
            {
                "name": name,
                "params": sum(p.numel() for p in params),
                "trainable": sum(p.numel() for p in params if p.requires_grad),
                "modules": sum(1 for _ in model.modules()),
            }
        )
    return rows
