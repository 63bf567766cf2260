"""Tensor-parallel presets: the model's own plan (what ``from_pretrained(tp_plan="auto")`` applies),
torchtitan's Llama-family plan, and the styles derived for peft's LoRA layers under them.

LoRA under tensor parallelism (peft's ``lora.Linear``: ``base_layer`` + ``lora_A`` / ``lora_B``):
the base layer keeps the style the plan gives the module; under a column-wise base, ``lora_B`` is
column-wise too (its output is the base's output shard) and ``lora_A`` stays whole; under a
row-wise base, ``lora_A`` is row-wise (it reads the base's sharded input; its r-wide output is
all-reduced) and ``lora_B`` stays whole. torch's ``parallelize_module`` only takes ``nn.Linear`` and
``nn.Embedding``, and transformers' ``apply_tensor_parallelism`` needs the transformers model at the
root, so on a peft model the plan is written in torch's styles (``TO_TORCH``); a transformers
style torch has no counterpart for (``packed_colwise``, ``moe_tp_experts``, ...) is refused.
"""

from __future__ import annotations

from . import TensorParallel, TPStyle, key_pattern, resolve
from ..model.tree import ModelTree, base_model, model_name


def model_plan(tree: ModelTree) -> dict[str, str]:
    """The model's own plan, what ``from_pretrained(tp_plan="auto")`` applies (transformers 5.24
    ``init_parallel_plans``: the CausalLM's ``_tp_plan``, ``config.base_model_tp_plan`` under the
    base model's prefix, ``embed_tokens`` vocab-sharded); under a peft wrapper, its base model's
    names under ``base_model.model.``."""
    model = tree.model
    base = base_model(model)
    prefix = "base_model.model." if base is not model else ""  # a peft wrapper's names of the base model's
    plan = {prefix + k: v for k, v in (getattr(base, "tp_plan", None) or {}).items()} if base is not None else {}
    if not plan:
        raise ValueError(f"{model_name(tree)} has no tensor-parallel plan of its own (no config.base_model_tp_plan): "
                         "give Plan.tensor_parallel explicitly, or tensor_parallel='torchtitan' for a Llama-family model")
    return plan


# torchtitan's Llama-family apply_tp (torchtitan/models/llama3/infra/parallelize.py), in the module
# names of transformers' Llama: tok_embeddings -> embed_tokens, attention.wq -> self_attn.q_proj, ...
_TITAN_TOP = {
    "model.embed_tokens": {"style": "RowwiseParallel", "input_layouts": "Replicate()", "output_layouts": "Shard(1)"},
    "model.norm": {"style": "SequenceParallel"},
    "lm_head": {"style": "ColwiseParallel", "input_layouts": "Shard(1)", "output_layouts": "Shard(-1)",
                "use_local_output": False},  # loss parallel
}
_TITAN_BLOCK = {
    "input_layernorm": {"style": "SequenceParallel"},
    "self_attn": {"style": "PrepareModuleInput", "input_layouts": "Shard(1)", "desired_input_layouts": "Replicate()"},
    "self_attn.q_proj": "ColwiseParallel", "self_attn.k_proj": "ColwiseParallel", "self_attn.v_proj": "ColwiseParallel",
    "self_attn.o_proj": {"style": "RowwiseParallel", "output_layouts": "Shard(1)"},
    "post_attention_layernorm": {"style": "SequenceParallel"},
    "mlp": {"style": "PrepareModuleInput", "input_layouts": "Shard(1)", "desired_input_layouts": "Replicate()"},
    "mlp.gate_proj": "ColwiseParallel", "mlp.down_proj": {"style": "RowwiseParallel", "output_layouts": "Shard(1)"},
    "mlp.up_proj": "ColwiseParallel",
}


def torchtitan_plan(tree: ModelTree) -> dict:
    """torchtitan's plan (sequence-parallel norms, sharded embedding and output, loss parallel) on a
    model with the Llama shape; ValueError naming what is missing otherwise."""
    prefix = "base_model.model." if "base_model.model.model" in tree.module_index else ""
    plan = {prefix + k: v for k, v in _TITAN_TOP.items()}
    plan.update({f"{prefix}model.layers.*.{k}": v for k, v in _TITAN_BLOCK.items()})
    for key in plan:
        if not any(key_pattern(key).match(fqn) for fqn in tree.module_index):
            raise ValueError(f"tensor_parallel='torchtitan' is torchtitan's Llama-family plan; {model_name(tree)} has no "
                             f"module {key!r} (that shape: model.embed_tokens, model.layers.*.self_attn.q_proj, "
                             "... mlp.gate_proj, model.norm, lm_head)")
    return plan


def preset(tree: ModelTree, tensor_parallel) -> dict:
    """``Plan.auto``'s ``tensor_parallel``: True (the model's own plan), "torchtitan", or a mapping."""
    if tensor_parallel is True:
        return with_lora(tree, model_plan(tree))
    if tensor_parallel == "torchtitan":
        return with_lora(tree, torchtitan_plan(tree))
    if hasattr(tensor_parallel, "items"):
        return dict(tensor_parallel.items())
    raise ValueError(f"tensor_parallel={tensor_parallel!r}: expected None, True (the model's own plan), "
                     "'torchtitan' or a mapping module FQN -> style")




# transformers' names -> the torch style that does the same to the parameters and activations
TO_TORCH = {
    "colwise": {"style": "ColwiseParallel"},
    "colwise_gather_output": {"style": "ColwiseParallel", "output_layouts": "Replicate()"},
    "colwise_rep": {"style": "ColwiseParallel", "output_layouts": "Replicate()"},
    "rowwise": {"style": "RowwiseParallel"},
    "rowwise_rep": {"style": "RowwiseParallel", "input_layouts": "Replicate()"},
    "rowwise_split_input": {"style": "RowwiseParallel", "input_layouts": "Replicate()"},
    "embedding_rowwise": {"style": "RowwiseParallel", "input_layouts": "Replicate()"},
    "embedding_colwise": {"style": "ColwiseParallel"},
    "sequence_parallel": {"style": "SequenceParallel"},
}


def _is_lora_layer(tree: ModelTree, fqn: str) -> bool:
    return f"{fqn}.base_layer" in tree.module_index and f"{fqn}.lora_A" in tree.module_index


def _as_torch(key: str, style: TPStyle) -> TPStyle:
    if style.is_torch:
        return style
    if style.style not in TO_TORCH:
        raise ValueError(f"tensor_parallel[{key!r}]: transformers' {style.style!r} has no torch style, and on a peft model "
                         "the plan runs through torch's parallelize_module (transformers' apply_tensor_parallelism needs "
                         "its own model at the root): torch cannot run it")
    return TPStyle.from_obj(TO_TORCH[style.style], f"tensor_parallel[{key!r}]")


def lora_styles(base: TPStyle) -> dict[str, TPStyle]:
    """The styles of ``base_layer``, ``lora_A.*`` and ``lora_B.*`` under a LoRA layer given ``base``."""
    out = {"base_layer": base}
    if base.style == "ColwiseParallel":  # lora_B writes the base's output shard; its input stays whole
        out["lora_B.*"] = TPStyle("ColwiseParallel", output_layouts=base.output_layouts)
    elif base.style == "RowwiseParallel":  # lora_A reads the base's input shard; its r outputs are summed
        out["lora_A.*"] = TPStyle("RowwiseParallel", input_layouts=base.input_layouts)
    else:
        raise ValueError(f"{base.style} on a LoRA layer: only column- and row-wise bases have LoRA styles derived")
    return out


def with_lora(tree: ModelTree, entries: dict) -> dict:
    """``entries`` for a model with peft adapters: in torch's styles, each LoRA layer's entry split
    into its base layer's and its adapters' (``lora_styles``); unchanged for a model without."""
    if not any(_is_lora_layer(tree, fqn) for fqn in tree.module_index) and not tree.root_type.startswith("Peft"):
        return entries
    tp = TensorParallel(entries)
    modules, _ = resolve(tree, tp)
    lora_keys = {key for key in tp.keys() if any(key_pattern(key).match(f) and _is_lora_layer(tree, f)
                                                 for f, _ in modules.values())}
    out = {}
    for key, style in tp.items():
        style = _as_torch(key, style)
        if key not in lora_keys:
            out[key] = style
            continue
        for name, derived in lora_styles(style).items():
            out[f"{key}.{name}"] = derived
    return {k: s.to_obj() for k, s in out.items()}
