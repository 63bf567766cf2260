"""fp8 block-quantized weights as DeepSeek-V3 ships them, built on meta (nothing is quantized).

A ``quantization_config`` of ``{"quant_method": "fp8", "weight_block_size": [128, 128]}`` is what
transformers' ``FineGrainedFP8HfQuantizer`` loads: every converted ``nn.Linear`` becomes
``transformers.integrations.finegrained_fp8.FP8Linear``, whose ``weight`` is a float8_e4m3fn parameter
of the linear's shape and whose ``weight_scale_inv`` is a float32 parameter, one per 128 x 128 block
(``ceil(out / 128) x ceil(in / 128)``). Both are ordinary parameters: FSDP2 shards and all-gathers them
like any other (two dtypes in one call: one uint8 buffer), and a ``param_dtype`` policy casts them.

``fp8_config(qc)`` reads the dict as transformers' ``FineGrainedFP8Config``; ``fp8_on_meta`` runs that
quantizer's own ``preprocess_model`` on a meta model (``dequantize`` off: transformers turns it on when
no GPU is present, which would load bf16 weights instead) and freezes the fp8 weights and their
scales, as a quantized base is trained (LoRA on top).
"""

from __future__ import annotations

import torch

FP8_DTYPES = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
                   if hasattr(torch, n))


def fp8_config(qc: dict | None):
    """transformers' ``FineGrainedFP8Config`` of an fp8 ``quantization_config``, else None."""
    if not isinstance(qc, dict) or qc.get("quant_method") != "fp8":
        return None
    from transformers import FineGrainedFP8Config

    return FineGrainedFP8Config.from_dict(dict(qc))


def fp8_on_meta(model, config, dtype) -> int:
    """Replace ``model``'s linears as transformers' fp8 quantizer does (its ``modules_to_not_convert``:
    the output embedding, ``_keep_in_fp32_modules``, the config's list); each weight a meta float8
    parameter with its meta ``weight_scale_inv``, both frozen. Returns how many linears were converted."""
    from transformers.integrations.finegrained_fp8 import FP8Linear
    from transformers.quantizers.auto import AutoHfQuantizer

    config.dequantize = False
    quantizer = AutoHfQuantizer.from_config(config, pre_quantized=True)
    quantizer.preprocess_model(model, device_map=None, dtype=dtype)
    n = 0
    for module in model.modules():
        if isinstance(module, FP8Linear):
            module.weight.requires_grad_(False)
            if module.weight_scale_inv is not None:
                module.weight_scale_inv.requires_grad_(False)
            n += 1
    return n


def carries_fp8(model) -> bool:
    """Whether ``model`` holds float8 parameters (the structure an fp8 config loads)."""
    return any(p.dtype in FP8_DTYPES for p in model.parameters())
