"""Small real bitsandbytes 4-bit models for the QLoRA tests: a tiny Llama saved to disk, loaded back by
transformers' own ``from_pretrained(..., quantization_config=BitsAndBytesConfig(...))`` on the CPU
(bitsandbytes' CPU backend quantizes for real), and the ``config.json`` it saves, which ``sv.load_model``
reads. The hidden size (96) and intermediate size (200) give block counts that are not multiples of the
nested 256-block of double quantization, and packed rows that divide unevenly over some meshes."""

from __future__ import annotations

import json

import torch

LLAMA = dict(hidden_size=96, intermediate_size=200, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=128, max_position_embeddings=256)
ADAPTER = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": "all-linear",
           "task_type": "CAUSAL_LM"}


def bnb_config(quant_type="nf4", storage="bfloat16", double_quant=False):
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=quant_type, bnb_4bit_quant_storage=getattr(torch, storage),
                              bnb_4bit_use_double_quant=double_quant, bnb_4bit_compute_dtype=torch.bfloat16)


def save_llama(folder) -> None:
    """A tiny bf16 Llama checkpoint in ``folder`` (seed 0)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**LLAMA)).to(torch.bfloat16).save_pretrained(folder)


def quantized(folder, config, adapter: bool = False):
    """The checkpoint in ``folder`` loaded by transformers with ``config`` (quantized on the CPU), with
    peft's LoRA on every linear layer when ``adapter``."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, quantization_config=config, device_map="cpu")
    # from_pretrained returns it in eval mode, where bitsandbytes' CPU forward repacks the weight for its
    # inference kernel; the step trained is in train mode
    model.train()
    if adapter:
        from peft import LoraConfig, get_peft_model

        torch.manual_seed(1)
        model = get_peft_model(model, LoraConfig(**{k: v for k, v in ADAPTER.items() if k != "peft_type"}))
    return model


def quantized_files(tmp_path, config):
    """(the real quantized model, the folder its ``save_pretrained`` wrote: config.json with its
    ``quantization_config``, and an ``adapter_config.json`` for LoRA on every linear layer)."""
    base = tmp_path / "base"
    save_llama(base)
    model = quantized(base, config)
    out = tmp_path / "quantized"
    model.config.save_pretrained(out)
    (out / "adapter_config.json").write_text(json.dumps(ADAPTER))
    return model, out


def quant_state_storage_bytes(model) -> int:
    """What every rank keeps of the quantization state: the storages of each ``Linear4bit``'s
    ``quant_state`` tensors (and its nested state's), each storage once, as torch allocated them."""
    import bitsandbytes as bnb

    seen, total = set(), 0
    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            state = module.weight.quant_state if getattr(module.weight, "quant_state", None) is not None else module.quant_state
            while state is not None:
                for t in vars(state).values():
                    if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in seen:
                        seen.add(t.untyped_storage().data_ptr())
                        total += t.untyped_storage().nbytes()
                state = state.state2
    return total


# ---------------------------------------------------------------------------
# torchao NF4 (torchtune's QLoRA: FrozenNF4Linear's weight is ``to_nf4(weight)``)
# ---------------------------------------------------------------------------
# hidden 256 and 4 key/value heads: every projection has a multiple of 4 x 16,384 elements, so its
# quantization factors (one per 64 x 256 elements) split over 2 and 4 ranks; 8 ranks do not split
# the 4-factor ones (finding SV128)
NF4_LLAMA = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                 vocab_size=128, max_position_embeddings=256)


def nf4_llama(adapter: bool = True, scaler_block_size: int = 256, seed: int = 0, device: str = "cpu"):
    """A tiny bf16 Llama whose decoder linears hold torchao ``NF4Tensor`` weights (quantized for real,
    as torchtune's ``FrozenNF4Linear`` does; ``device="meta"``: ``to_nf4`` of meta weights, nothing
    quantized, as benchmarks/bench_qlora.py builds 405B), with peft's LoRA on every linear layer when ``adapter``."""
    from torch import nn
    from torchao.quantization import to_nf4
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(LlamaConfig(**NF4_LLAMA)).to(torch.bfloat16)
    for module in model.model.layers.modules():
        if isinstance(module, nn.Linear):
            module.weight = nn.Parameter(to_nf4(module.weight.detach(), scaler_block_size=scaler_block_size),
                                         requires_grad=False)
    if adapter:
        from peft import LoraConfig, get_peft_model

        torch.manual_seed(1)
        model = get_peft_model(model, LoraConfig(**{k: v for k, v in ADAPTER.items() if k != "peft_type"}))
    return model


def float8_llama(seed: int = 0):
    """A tiny fp32 Llama whose decoder linears are torchao ``Float8Linear`` with float8 all-gather
    (``enable_fsdp_float8_all_gather``, tensorwise; ``emulate``: the CPU has no float8 matmul)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**{**NF4_LLAMA, "hidden_size": 128, "intermediate_size": 256}))
    config = Float8LinearConfig(enable_fsdp_float8_all_gather=True, emulate=True)
    return convert_to_float8_training(model, config=config, module_filter_fn=lambda mod, fqn: "layers" in fqn)
