"""Findings about the files a model was built from (``sv.load_model``'s config and adapters):

| code  | severity | what |
|-------|----------|------|
| SV120 | warning  | an adapter's ``target_modules`` list names projections this model does not have, so it adapts only some of them (fused ``qkv_proj`` / ``gate_up_proj``) |
| SV121 | warning / info | the config declares ``torch_dtype: float32``: every weight in fp32, twice bf16's bytes |
| SV122 | error    | quantized weights (a ``quantization_config``; bitsandbytes ``Params4bit`` / ``Int8Params``, torchao ``NF4Tensor`` / float8 tensor subclasses): priced as the unquantized dtype until quantized pricing lands |

Below ``checks`` in the layers (``run_checks`` calls them); they read ``inputs.tree.model``, the
peft config on it, its Hugging Face config and ``load.source_of`` (the files ``load_model`` read),
nothing else. Quantized parameter classes are recognised by their module and name
(``QUANTIZED_TENSOR_MODULES``, ``QUANTIZED_TENSOR_CLASSES``): bitsandbytes and torchao are never imported.
"""

from __future__ import annotations

import weakref

from .check_inputs import CheckInputs
from .finding import Finding
from .format import format_bytes
from .load import source_of
from .presets import find_blocks
from .tree import ModelTree, peft_configs


# tree -> what these checks read of its model, found once per tree: they depend on the model alone,
# and a change of plan must not walk ``named_modules`` again (issue 36: 20 ms a plan at 70B)
_PROJECTIONS: "weakref.WeakKeyDictionary[ModelTree, dict[str, bool]]" = weakref.WeakKeyDictionary()
_QUANTIZED: "weakref.WeakKeyDictionary[ModelTree, dict[str, list[str]]]" = weakref.WeakKeyDictionary()


def _block_projections(tree: ModelTree) -> dict[str, bool]:
    """Leaf name -> adapted? for every linear layer inside the repeated blocks (peft's adapter layers
    count as adapted; the layers inside them, ``base_layer`` and ``lora_A``, are not listed). Once per tree."""
    found = _PROJECTIONS.get(tree)
    if found is None:
        found = _PROJECTIONS[tree] = _walk_projections(tree)
    return found


def _walk_projections(tree: ModelTree) -> dict[str, bool]:
    from torch import nn

    try:
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:
        return {}
    model = tree.model
    out: dict[str, bool] = {}
    for b in find_blocks(tree):
        block = model.get_submodule(tree.modules[b].fqn)
        inside_tuner: list[str] = []
        for name, module in block.named_modules():
            if any(name.startswith(t + ".") for t in inside_tuner):
                continue
            leaf = name.rsplit(".", 1)[-1]
            if isinstance(module, BaseTunerLayer):
                inside_tuner.append(name)
                out[leaf] = True
            elif isinstance(module, nn.Linear) and leaf:
                out[leaf] = out.get(leaf, False)
    return out


def _fused(name: str, stems: set[str]) -> bool:
    """Is ``qkv_proj`` / ``gate_up_proj`` made of the stems of names that matched nothing (q, k, v / gate, up)?"""
    rest = name.removesuffix("_proj").replace("_", "")
    if not rest:
        return False
    ok = [True] + [False] * len(rest)
    for i in range(1, len(rest) + 1):
        ok[i] = any(ok[i - len(s)] and rest[i - len(s):i] == s for s in stems if 0 < len(s) <= i)
    return ok[-1] and rest not in stems


def check_adapter_targets(inputs: CheckInputs) -> list[Finding]:
    """SV120: a ``target_modules`` list some of whose names match no layer of this model, while some
    of the blocks' linear layers go unadapted (Llama's list on Phi-3's fused ``qkv_proj``)."""
    model = inputs.tree.model
    configs = peft_configs(model)
    if not configs:
        return []
    projections = _block_projections(inputs.tree)
    source = source_of(model)
    out = []
    for name, config in configs.items():
        targets = getattr(config, "target_modules", None)
        if not isinstance(targets, (list, set, tuple, frozenset)) or not projections:
            continue
        unmatched = sorted(t for t in targets if t not in projections)
        missed = sorted(p for p, adapted in projections.items() if not adapted)
        if not unmatched or not missed:
            continue
        stems = {t.removesuffix("_proj").replace("_", "") for t in unmatched}
        fused = [p for p in missed if _fused(p, stems)]
        adapted = sorted(p for p, a in projections.items() if a)
        where = f"{source.adapters[name]}" if source is not None and name in source.adapters else f"adapter {name!r}"
        out.append(Finding(
            "SV120", "warning",
            f"{where}: target_modules names {', '.join(map(repr, unmatched))}, which match no layer of this model, "
            f"so the adapter reaches only {', '.join(adapted) or 'nothing'} in each block; not adapted: "
            + ", ".join(f"{p} (fused)" if p in fused else p for p in missed),
            fix=f"add {', '.join(map(repr, fused or missed))} to 'target_modules' in {where} (or use \"all-linear\")",
        ))
    return out


def check_fp32_config(inputs: CheckInputs) -> list[Finding]:
    """SV121: the config file declares float32 weights. With frozen base weights (an adapter) that is
    twice the bytes for nothing (a warning); trained weights in fp32 are a choice (fp32 master weights
    under bf16 compute): said as info."""
    model = inputs.tree.model
    source = source_of(model) if model is not None else None
    if source is None or source.declared_dtype != "float32":
        return []
    params = [p for p in inputs.tree.params if p.dtype.is_floating_point and p.itemsize == 4]
    frozen = [p for p in params if not p.requires_grad]
    total = sum(p.nbytes for p in params)
    severity = "warning" if frozen else "info"
    why = (f"{len(frozen):,} frozen base weights ({format_bytes(sum(p.nbytes for p in frozen))}) are never updated, "
           "so fp32 buys no precision") if frozen else "fp32 master weights are a choice; most hub checkpoints ship bf16"
    return [Finding(
        "SV121", severity,
        f"{source.config_file}: field 'torch_dtype' is \"float32\": the weights take {format_bytes(total)} "
        f"in fp32, twice their bytes in bf16; {why}",
        fix="set \"torch_dtype\": \"bfloat16\" in the config, or sv.load_model(..., dtype=\"bfloat16\")",
        flags="--dtype bfloat16",
    )]


#: Libraries whose parameter classes hold quantized weights (a class defined in one of them, or below it).
QUANTIZED_TENSOR_MODULES = ("bitsandbytes", "torchao")
#: Quantized parameter classes by name, wherever they are defined (vendored copies, subclasses).
QUANTIZED_TENSOR_CLASSES = ("Params4bit", "Int8Params", "NF4Tensor", "Float8Tensor", "Float8TrainingTensor",
                            "AffineQuantizedTensor", "WeightWithDynamicFloat8CastTensor", "LinearActivationQuantizedTensor")


def quantized_tensor_type(param) -> str | None:
    """``bitsandbytes.nn.modules.Params4bit`` when ``param``'s class (or a class it derives from) is a
    quantized tensor type; None otherwise. By name and module only: nothing is imported."""
    for cls in type(param).__mro__:
        module = cls.__module__ or ""
        if cls.__name__ in QUANTIZED_TENSOR_CLASSES or module.split(".")[0] in QUANTIZED_TENSOR_MODULES:
            return f"{module}.{cls.__name__}"
    return None


def quantization_config(model) -> dict | None:
    """The ``quantization_config`` of the config ``load_model`` read, else of the model's Hugging Face
    config (a dict, or transformers' ``QuantizationConfigMixin`` as ``to_dict()``); None without one."""
    source = source_of(model)
    if source is not None and source.quantization is not None:
        return source.quantization
    config = getattr(model, "config", None)
    qc = getattr(config, "quantization_config", None) if config is not None else None
    if qc is None:
        return None
    return qc.to_dict() if hasattr(qc, "to_dict") else dict(qc) if isinstance(qc, dict) else {"quant_method": str(qc)}


def _quant_words(qc: dict) -> str:
    keys = ("quant_method", "load_in_4bit", "load_in_8bit", "bnb_4bit_quant_type", "fmt", "weight_block_size", "bits")
    said = [f"{k}: {qc[k]!r}" for k in keys if qc.get(k) not in (None, False)]
    return "{" + ", ".join(said or [f"{k}: {v!r}" for k, v in list(qc.items())[:3]]) + "}"


def _quantized_params(tree: ModelTree) -> dict[str, list[str]]:
    """Quantized tensor class -> the names of the tree's model's parameters of it; once per tree."""
    typed = _QUANTIZED.get(tree)
    if typed is None:
        typed = {}
        for name, param in tree.model.named_parameters(remove_duplicate=False):
            kind = quantized_tensor_type(param)
            if kind:
                typed.setdefault(kind, []).append(name)
        _QUANTIZED[tree] = typed
    return typed


def check_quantized(inputs: CheckInputs) -> list[Finding]:
    """SV122: the model's weights are quantized (its config's ``quantization_config``, or parameters of a
    quantized tensor class); shardviz prices them at the unquantized dtype, so memory, traffic and the
    verdict are not those of the quantized run. An error until quantized pricing lands."""
    model = inputs.tree.model
    if model is None:
        return []
    typed = _quantized_params(inputs.tree)
    qc = quantization_config(model)
    if not typed and qc is None:
        return []
    base = [p for p in inputs.tree.params if not p.requires_grad] or inputs.tree.params  # the weights quantized
    dtypes = sorted({str(p.dtype).replace("torch.", "") for p in base})
    parts = []
    if qc is not None:
        source = source_of(model)
        where = f"{source.config_file}: field 'quantization_config'" if source is not None else "the model's config.quantization_config"
        parts.append(f"{where} is {_quant_words(qc)}")
    for kind, names in typed.items():
        parts.append(f"{len(names):,} parameters are {kind} (e.g. {names[0]!r})")
    names = [n for group in typed.values() for n in group]
    priced = (f"their bytes are priced as the unquantized dtype ({', '.join(dtypes)})" if not typed else
              "each is priced as a plain tensor of its dtype and shape (its quantization state and FSDP2's handling "
              "of the class are not modelled)")
    return [Finding(
        "SV122", "error",
        f"quantized weights: {'; '.join(parts)}. shardviz does not price quantized weights yet: {priced}, so the "
        "memory, the traffic and the verdict are not those of this run",
        tuple(names[:50]), fix="read the figures as an unquantized model's until quantized pricing lands (sv.load_model on "
        "the config without 'quantization_config' prices the unquantized model on purpose)",
        n_fqns=len(names), all_fqns=tuple(names))]
