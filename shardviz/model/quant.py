"""Quantized weights: built on meta the way transformers loads them, and their bytes read back.

- ``priced_config(qc)``: a ``quantization_config`` (dict) that shardviz prices exactly, as transformers'
  config object: bitsandbytes 4-bit (``bnb_4bit_config``) or 8-bit (``bnb_8bit_config``: ``Linear8bitLt``,
  an int8 ``Int8Params`` plus its per-row fp32 ``SCB``, kept whole), fp8 blocks (``quant_fp8``); None
  for any other. torchao NF4 weights are read as they are (``quant_torchao``).
- ``quantize_on_meta(model, config)``: transformers' own 4-bit quantizer replaces the linears it
  quantizes by ``bnb.nn.Linear4bit`` (its ``modules_to_not_convert``: the output embedding, tied
  weights, ``llm_int8_skip_modules``, the class's ``_keep_in_fp32_modules``), then every
  ``Params4bit`` gets the packed data and the ``QuantState`` bitsandbytes' ``quantize_4bit`` gives,
  as meta tensors from bitsandbytes' own fake kernels: nothing is quantized.
- ``quant_state_tensors(param)`` / ``quant_state_bytes(param)``: the tensors of a ``Params4bit``'s
  ``quant_state`` (not a parameter: every rank keeps it whole, FSDP2 never gathers it).

bitsandbytes is imported only by ``quantize_on_meta`` (``pip install 'shardviz[qlora]'``); reading
bytes is duck-typed on the ``quant_state`` attribute.
"""

from __future__ import annotations

import torch

from .quant_fp8 import fp8_config, fp8_on_meta
from .quant_torchao import is_nf4, nf4_whole_bytes

INSTALL = "pip install 'shardviz[qlora]'"  # bitsandbytes, with its CPU backend
TORCHAO_NF4 = "nf4 (torchao)"
STORAGE_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "uint8": torch.uint8}


def bnb_4bit_config(qc: dict | None):
    """transformers' ``BitsAndBytesConfig`` of a 4-bit bitsandbytes ``quantization_config``, else None
    (8-bit, fp8, torchao, GPTQ, ...: not priced yet, finding SV122 says so)."""
    if not isinstance(qc, dict) or qc.get("quant_method", "bitsandbytes") != "bitsandbytes":
        return None
    if not (qc.get("load_in_4bit") or qc.get("_load_in_4bit")):
        return None
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig.from_dict(dict(qc))


def bnb_8bit_config(qc: dict | None):
    """transformers' ``BitsAndBytesConfig`` of an 8-bit bitsandbytes ``quantization_config``, else None."""
    if not isinstance(qc, dict) or qc.get("quant_method", "bitsandbytes") != "bitsandbytes":
        return None
    if not (qc.get("load_in_8bit") or qc.get("_load_in_8bit")) or qc.get("load_in_4bit") or qc.get("_load_in_4bit"):
        return None
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig.from_dict(dict(qc))


def priced_config(qc: dict | None):
    """transformers' config object of a ``quantization_config`` that ``quantize_on_meta`` builds (bitsandbytes
    4-bit or 8-bit, fp8 block-quantized), else None."""
    return bnb_4bit_config(qc) or bnb_8bit_config(qc) or fp8_config(qc)


def needs_bnb(config) -> bool:
    return bool(getattr(config, "load_in_4bit", False) or getattr(config, "load_in_8bit", False))


def bnb_available() -> bool:
    from importlib.util import find_spec

    return find_spec("bitsandbytes") is not None


def _meta_quant_state(shape, dtype, blocksize: int, quant_type: str, storage, nested: bool):
    """(packed data, ``QuantState``) on meta, of the shapes and dtypes ``bitsandbytes.functional.quantize_4bit``
    gives (bitsandbytes 0.50, functional.py ``quantize_4bit`` and ``quantize_blockwise``; _ops.py's fake
    kernels): data ``((n + 1) // (2 * storage itemsize), 1)`` in the storage dtype; ``absmax`` fp32, one
    per ``blocksize`` (64) elements; the 16-entry fp32 code (``get_4bit_type``). With double quantization
    (``compress_statistics``): ``absmax`` uint8 (``quantize_blockwise(absmax - offset, blocksize=256)``),
    a 0-dim fp32 ``offset``, and a nested state of fp32 absmax per 256 blocks and its own copy of the
    256-entry fp32 dynamic code (``code.to(device, copy=True)``)."""
    import bitsandbytes.functional as F

    weight = torch.empty(shape, dtype=dtype, device="meta")
    packed, absmax = torch.ops.bitsandbytes.quantize_4bit.default(weight, blocksize, quant_type, storage)
    code = F.get_4bit_type(quant_type, device="meta")
    if not nested:
        return packed, F.QuantState(absmax=absmax, shape=weight.shape, dtype=dtype, blocksize=blocksize, code=code,
                                    quant_type=quant_type)
    dynamic = torch.empty(256, dtype=torch.float32, device="meta")  # F.create_dynamic_map(): 256 entries
    qabsmax, absmax2 = torch.ops.bitsandbytes.quantize_blockwise.default(absmax, dynamic, 256)
    state2 = F.QuantState(absmax=absmax2, code=torch.empty_like(dynamic), blocksize=256, dtype=absmax.dtype)
    offset = torch.empty((), dtype=torch.float32, device="meta")
    return packed, F.QuantState(absmax=qabsmax, shape=weight.shape, dtype=dtype, blocksize=blocksize, code=code,
                                quant_type=quant_type, offset=offset, state2=state2)


def quantize_on_meta(model, config, pre_quantized: bool = True, dtype=None) -> int:
    """``model``'s linears replaced as transformers' quantizer for ``config`` does, on meta: bitsandbytes
    4-bit (``_quantize_4bit``), 8-bit (``_quantize_8bit``) or fp8 blocks (``quant_fp8.fp8_on_meta``).
    Returns how many linears were converted."""
    dtype = dtype or getattr(model, "dtype", torch.float32)
    if dtype not in (torch.bfloat16, torch.float16, torch.float32):
        dtype = torch.float32
    if getattr(config, "load_in_4bit", False):
        return _quantize_4bit(model, config, pre_quantized, dtype)
    if getattr(config, "load_in_8bit", False):
        return _quantize_8bit(model, config, pre_quantized, dtype)
    return fp8_on_meta(model, config, dtype)


def _quantize_8bit(model, config, pre_quantized: bool, dtype) -> int:
    """``Linear8bitLt`` as transformers' 8-bit quantizer builds it (``replace_with_bnb_linear``): an int8
    ``Int8Params`` of the linear's shape, and its ``SCB`` (one fp32 absmax per output row, what a
    pre-quantized checkpoint loads into ``weight.SCB``): no parameter, every rank keeps it whole."""
    import bitsandbytes as bnb
    from transformers.quantizers.auto import AutoHfQuantizer

    quantizer = AutoHfQuantizer.from_config(config, pre_quantized=pre_quantized)
    quantizer.preprocess_model(model, device_map=None, dtype=dtype)
    n = 0
    for module in model.modules():
        if isinstance(module, bnb.nn.Linear8bitLt):
            if module.weight.dtype != torch.int8:  # not pre-quantized: what loading the bf16 checkpoint ends with
                module.weight = bnb.nn.Int8Params(torch.empty(module.weight.shape, dtype=torch.int8, device="meta"),
                                                  requires_grad=False, has_fp16_weights=False)
            module.weight.SCB = torch.empty((module.weight.shape[0],), dtype=torch.float32, device="meta")
            n += 1
    return n


def _quantize_4bit(model, config, pre_quantized: bool, dtype) -> int:
    """Replace ``model``'s linears by ``Linear4bit`` as transformers' bitsandbytes 4-bit quantizer does
    (``AutoHfQuantizer.preprocess_model``: ``replace_with_bnb_linear`` minus its modules_to_not_convert),
    each weight a meta ``Params4bit`` of the packed shape with a meta ``QuantState``. ``dtype``: the dtype
    the weights are quantized from (the checkpoint's; default the model's). Returns how many were packed."""
    import bitsandbytes as bnb
    from transformers.quantizers.auto import AutoHfQuantizer

    quantizer = AutoHfQuantizer.from_config(config, pre_quantized=pre_quantized)
    quantizer.preprocess_model(model, device_map=None, dtype=dtype)
    storage = config.bnb_4bit_quant_storage
    if isinstance(storage, str):
        storage = STORAGE_DTYPES[storage.replace("torch.", "")]
    n = 0
    for module in model.modules():
        if not isinstance(module, bnb.nn.Linear4bit):
            continue
        w = module.weight
        packed, state = _meta_quant_state(tuple(w.shape), dtype, w.blocksize, config.bnb_4bit_quant_type, storage,
                                          bool(config.bnb_4bit_use_double_quant))
        module.weight = bnb.nn.Params4bit(packed, requires_grad=False, quant_state=state, blocksize=w.blocksize,
                                          compress_statistics=bool(config.bnb_4bit_use_double_quant),
                                          quant_type=config.bnb_4bit_quant_type, quant_storage=storage,
                                          module=module, bnb_quantized=True)
        module.quant_state = state
        n += 1
    return n


def quant_state_tensors(param) -> list[torch.Tensor]:
    """The tensors of ``param.quant_state`` (bitsandbytes ``QuantState``: ``absmax``, ``code``, ``offset``,
    and its nested ``state2``'s), each once; [] for a parameter without one."""
    d = getattr(param, "__dict__", {})
    state = d.get("quant_state")
    out: dict[int, torch.Tensor] = {}
    if isinstance(d.get("SCB"), torch.Tensor):  # bitsandbytes Int8Params: per-row absmax
        out[id(d["SCB"])] = d["SCB"]
    while state is not None:
        for value in vars(state).values():
            if isinstance(value, torch.Tensor):
                out.setdefault(id(value), value)
        state = getattr(state, "state2", None)
    return list(out.values())


def quant_state_bytes(param) -> int:
    """Bytes of ``param``'s quantization state (0 without one): a torchao ``NF4Tensor``'s ``scaler_mean``
    and code table, which every rank keeps whole."""
    if is_nf4(param):
        return nf4_whole_bytes(param)
    return sum(t.numel() * t.element_size() for t in quant_state_tensors(param))


def quant_kind(param) -> str | None:
    """"nf4" / "fp4" for a bitsandbytes ``Params4bit`` that holds packed data, "int8" for an ``Int8Params``
    with its ``SCB``, "nf4 (torchao)" for a
    torchao ``NF4Tensor``, else None."""
    if is_nf4(param):
        return TORCHAO_NF4
    d = getattr(param, "__dict__", {})
    if isinstance(d.get("SCB"), torch.Tensor) and param.dtype == torch.int8:
        return "int8"
    if d.get("quant_state") is None and not d.get("bnb_quantized"):
        return None
    kind = d.get("quant_type")
    return str(kind) if kind else None


def dequantized(param) -> tuple[tuple[int, ...], torch.dtype] | None:
    """(shape, dtype) of the weight ``param`` dequantizes to (its ``QuantState``), else None."""
    state = getattr(param, "__dict__", {}).get("quant_state")
    if state is None or getattr(state, "shape", None) is None:
        return None
    return tuple(state.shape), state.dtype
