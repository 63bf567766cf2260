"""Findings about the files a model was built from (``sv.load_model``'s config and adapters):

| code  | severity | what |
|-------|----------|------|
| SV120 | warning  | an adapter's ``target_modules`` list names projections this model does not have, so it adapts only some of them (fused ``qkv_proj`` / ``gate_up_proj``) |
| SV121 | warning / info | the config declares ``torch_dtype: float32``: every weight in fp32, twice bf16's bytes |
| SV122 | error    | quantized weights shardviz does not price (torchao float8 / affine tensors, GPTQ / AWQ configs, an unpacked ``Params4bit``): priced as the unquantized dtype. bitsandbytes 4-bit and 8-bit, fp8 block configs and torchao ``NF4Tensor`` are priced exactly |
| SV123 | error    | a ``Params4bit`` whose floating storage dtype differs from its call's ``param_dtype``: FSDP2 casts the packed bits |
| SV124 | warning  | ``Params4bit`` stored as uint8: accelerate ignores them (replicated); what bf16 storage saves |
| SV125 | error    | quantized weights (``Params4bit``, ``Int8Params``, torchao ``NF4Tensor``, fp8) left trainable (``requires_grad=True``): FSDP2 and the optimizer treat them as trained, the kernels give them no gradient |
| SV129 | error    | float8 weights (an fp8 config's ``FP8Linear``) in a call whose ``param_dtype`` differs: FSDP2 casts them, gathers 2 bytes per element and ``FP8Linear`` then skips its scales |
| SV128 | error    | a torchao ``NF4Tensor`` that ``fully_shard`` cannot split over the mesh (an inner tensor's numel not divisible by the shard size, no padding); the ``scaler_block_size`` that works |

Below ``checks`` in the layers (``run_checks`` calls them); they read ``inputs.tree.model``, the
peft config on it, its Hugging Face config and ``load.source_of`` (the files ``load_model`` read),
nothing else. Quantized parameter classes are recognised by their module and name
(``QUANTIZED_TENSOR_MODULES``, ``QUANTIZED_TENSOR_CLASSES``): bitsandbytes and torchao are never imported here.
"""

from __future__ import annotations

import weakref

import numpy as np
import torch

from .check_inputs import AnalysisView
from ..finding import Finding
from ..format import format_bytes
from ..model.load import source_of
from ..presets import find_blocks
from ..model.quant import INSTALL, bnb_4bit_config, bnb_8bit_config, bnb_available, priced_config, quant_kind
from ..model.quant_fp8 import FP8_DTYPES, carries_fp8
from ..model.quant_torchao import SHARDED_PARTS, float8_gather_dtype, nf4_split_problem, working_scaler_block_size
from ..model.tree import ModelTree, peft_configs, tree_index
from ..step.params import tree_arrays


# tree -> what these checks read of its model, found once per tree: they depend on the model alone,
# and a change of plan must not walk ``named_modules`` again (issue 36: 20 ms a plan at 70B)
_PROJECTIONS: "weakref.WeakKeyDictionary[ModelTree, dict[str, bool]]" = weakref.WeakKeyDictionary()
_QUANTIZED: "weakref.WeakKeyDictionary[ModelTree, tuple]" = weakref.WeakKeyDictionary()


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


def check_adapter_targets(inputs: AnalysisView) -> list[Finding]:
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


def check_fp32_config(inputs: AnalysisView) -> list[Finding]:
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


def _unpriced(inputs: AnalysisView) -> tuple[dict[str, list[str]], dict | None]:
    """Quantized parameters shardviz does not price (by class: any quantized class but a bitsandbytes
    ``Params4bit`` holding packed data, which the tree reads as it is), and the ``quantization_config``
    when it is not a bitsandbytes 4-bit one that the model carries as ``Params4bit`` (else None).
    They depend on the model alone: read once per tree (a change of plan walks no module)."""
    found = _QUANTIZED.get(inputs.tree)
    if found is None:
        found = _QUANTIZED[inputs.tree] = _walk_unpriced(inputs.tree.model)
    return found


def _walk_unpriced(model) -> tuple[dict[str, list[str]], dict | None]:
    priced = {id(p) for p in model.parameters() if quant_kind(p) or float8_gather_dtype(p) is not None}
    typed: dict[str, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        kind = quantized_tensor_type(param)
        if kind and id(param) not in priced:
            typed.setdefault(kind, []).append(name)
    qc = quantization_config(model)
    if qc is not None and _is_priced(qc) and (priced or carries_fp8(model)):
        qc = None
    return typed, qc


def check_quantized(inputs: AnalysisView) -> list[Finding]:
    """SV122: quantized weights shardviz does not price (torchao float8 / affine tensors, GPTQ or AWQ configs,
    a ``Params4bit`` not yet quantized, a bitsandbytes config without bitsandbytes installed): they
    are priced at the unquantized dtype, so memory, traffic and the verdict are not those of the run.
    bitsandbytes 4-bit weights (``Params4bit`` with packed data, ``sv.load_model`` on a 4-bit config) are
    priced exactly and raise nothing here."""
    model = inputs.tree.model
    if model is None:
        return []
    typed, qc = _unpriced(inputs)
    if not typed and qc is None:
        return []
    base = [p for p in inputs.tree.params if not p.requires_grad and not p.quant] or inputs.tree.params
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
    fix = ("read the figures as an unquantized model's until quantized pricing lands (sv.load_model on "
           "the config without 'quantization_config' prices the unquantized model on purpose)")
    if qc is not None and (_is_bnb_4bit(qc) or _is_bnb_8bit(qc)) and not bnb_available():
        fix = f"install bitsandbytes ({INSTALL}): sv.load_model then builds the quantized weights on meta, priced to the byte"
    elif any(k.endswith("Params4bit") for k in typed):
        fix = ("quantize the weights first (Linear4bit.to(device), or sv.load_model on a config with a bitsandbytes "
               "4-bit 'quantization_config', which packs them on meta): a Params4bit of packed data is priced exactly")
    return [Finding(
        "SV122", "error",
        f"quantized weights: {'; '.join(parts)}. shardviz does not price these quantized weights yet: {priced}, so the "
        "memory, the traffic and the verdict are not those of this run",
        tuple(names[:50]), fix=fix, n_fqns=len(names), all_fqns=tuple(names))]


def _is_bnb_8bit(qc: dict) -> bool:
    try:
        return bnb_8bit_config(qc) is not None
    except Exception:  # noqa: BLE001 - a config transformers refuses
        return False


def _is_priced(qc: dict) -> bool:
    try:
        return priced_config(qc) is not None
    except Exception:  # noqa: BLE001 - a config transformers refuses: not one shardviz prices
        return False


def _is_bnb_4bit(qc: dict) -> bool:
    try:
        return bnb_4bit_config(qc) is not None
    except Exception:  # noqa: BLE001 - a config transformers refuses: not one shardviz prices
        return False


def _storage(p) -> str:
    return str(p.dtype).replace("torch.", "")


def check_quant_storage(inputs: AnalysisView) -> list[Finding]:
    """SV123: a ``Params4bit`` whose storage dtype is floating point, sharded by a call whose
    ``param_dtype`` differs: FSDP2 casts the sharded parameter to ``param_dtype`` before the all-gather
    (``FSDPParam.init_dtype_attrs`` clamps only equal or non-floating dtypes), so the packed 4-bit codes
    are converted as numbers and the dequantized weights are garbage: training runs and learns nothing."""
    layout, training = inputs.layout, inputs.training
    bad: dict[tuple[str, str], list[str]] = {}
    for p in inputs.tree.params:
        if not p.quant or not p.dtype.is_floating_point or not layout.sharded[p.index]:
            continue
        unit = layout.units[int(layout.param_unit_array[p.index])].unit
        pd = training.unit_defaults(unit).param_dtype
        if pd is not None and str(pd).replace("torch.", "") != _storage(p):
            bad.setdefault((_storage(p), str(pd).replace("torch.", "")), []).append(p.fqn)
    out = []
    for (storage, pd), names in bad.items():
        out.append(Finding(
            "SV123", "error",
            f"{len(names):,} bitsandbytes 4-bit weights store their packed codes as {storage} "
            f"(bnb_4bit_quant_storage) but their fully_shard call casts parameters to param_dtype={pd}: FSDP2 "
            f"converts the packed bits as {storage} numbers before the all-gather, so every dequantized weight is "
            "garbage and training breaks silently",
            tuple(names[:50]), fix=f"set \"bnb_4bit_quant_storage\": \"{pd}\" in the quantization_config (the storage "
            f"must equal param_dtype), or MixedPrecisionPolicy(param_dtype=torch.{storage})",
            n_fqns=len(names), all_fqns=tuple(names), flags=f"--quant-storage {pd}"))
    return out


def check_uint8_storage(inputs: AnalysisView) -> list[Finding]:
    """SV124: ``Params4bit`` stored as uint8 (bitsandbytes' default). accelerate's FSDP2 preparation
    (``fsdp2_prepare_model``, accelerate/utils/fsdp_utils.py) puts every frozen non-floating
    ``Params4bit`` into ``ignored_params``, so each rank holds all of them whole; with a floating
    storage dtype (bf16) they are sharded like any parameter. Says what bf16 storage saves per rank."""
    packed = [p for p in inputs.tree.params if p.quant and p.dtype == torch.uint8 and not p.dequantized_shape]
    if not packed:
        return []
    whole = sum(p.nbytes for p in packed)
    shard = inputs.mesh.shard
    sharded = sum(-(-p.shape[0] // 2 // shard) * 2 * p.row_numel for p in packed)  # bf16 rows, padded to the mesh
    names = [p.fqn for p in packed]
    return [Finding(
        "SV124", "warning",
        f"{len(packed):,} bitsandbytes 4-bit weights are stored as uint8 (bnb_4bit_quant_storage's default): "
        f"accelerate's FSDP2 preparation puts them in ignored_params, so every rank holds them whole "
        f"({format_bytes(whole)} per rank); stored as bfloat16 they are sharded over {shard} ranks "
        f"(about {format_bytes(sharded)} per rank, {format_bytes(whole - sharded)} less)",
        tuple(names[:50]), fix="set \"bnb_4bit_quant_storage\": \"bfloat16\" in the quantization_config (and a "
        "param_dtype of bfloat16 in the mixed-precision policy)",
        n_fqns=len(names), all_fqns=tuple(names), flags="--quant-storage bfloat16")]


def check_trainable_quantized(inputs: AnalysisView) -> list[Finding]:
    """SV125: quantized weights with ``requires_grad=True`` (a bitsandbytes ``Params4bit`` with a floating
    storage dtype, a torchao ``NF4Tensor``, fp8 weights; integer tensors cannot require grad). FSDP2 and
    the optimizer take them as trained parameters, but the kernels that read them (bitsandbytes'
    ``dequantize_4bit`` / ``gemm_4bit``, torchao's ``LinearNF4``) give the packed weight no gradient:
    under ``fully_shard`` torch allocates and reduce-scatters none for them (tests/test_adapter_checks.py).
    With adapters of another dtype the call mixes trainable dtypes and FSDP2 asserts at the first forward
    (SV003); in every case the run is not the QLoRA step meant. The figures price what torch allocates: no
    gradient and no optimizer state for them (``ParamInfo.gets_gradient``). torchao float8 training weights
    (``Float8Linear``'s master weights) are meant to train and are not counted."""
    tree = inputs.tree
    bad = [tree.params[p] for p in np.nonzero(tree_index(tree).trainable & ~tree_arrays(tree).trainable)[0].tolist()]
    if not bad:
        return []
    names = [p.fqn for p in bad]
    return [Finding(
        "SV125", "error",
        f"{len(bad):,} quantized weights require gradients ({names[0]}"
        f"{f' and {len(bad) - 1:,} more' if len(bad) > 1 else ''}: "
        f"{', '.join(sorted({p.quant or str(p.dtype).replace('torch.', '') for p in bad}))}): FSDP2 and the "
        "optimizer treat them as trained, but bitsandbytes' and torchao's kernels give the packed weights no "
        "gradient, so nothing trains them; a call that also holds adapters of another dtype fails at the first "
        "forward (mixed trainable dtypes); the figures here price them as torch runs them, with no gradient and "
        "no optimizer state",
        tuple(names[:50]), fix="freeze the quantized base before wrapping: model.requires_grad_(False) on it (or "
        "param.requires_grad_(False) for each weight named), or peft's prepare_model_for_kbit_training(model) "
        "before get_peft_model, which freezes every base parameter and leaves only the adapters trainable",
        n_fqns=len(names), all_fqns=tuple(names))]


def check_nf4_split(inputs: AnalysisView) -> list[Finding]:
    """SV128: torchao ``NF4Tensor`` weights that ``fully_shard`` cannot split over the shard dimension:
    torchao's ``nf4_split`` asserts every inner tensor's numel divides by the number of chunks and an
    NF4 weight cannot be padded, so the run fails at ``fully_shard`` (torchtune's Llama 70B QLoRA on
    8 GPUs, fixed by ``scaler_block_size=200``: torchtune PRs 1987 and 1994). The fix names the
    ``scaler_block_size`` closest to torchao's 256 that quantizes and splits every NF4 weight."""
    layout, shard = inputs.layout, inputs.mesh.shard
    nf4 = [p for p in inputs.tree.params if p.dequantized_shape]
    bad = [(p, why) for p in nf4 if layout.sharded[p.index]
           and (why := nf4_split_problem(p.dequantized_shape, p.quant_parts, shard)) is not None]
    if not bad:
        return []
    block = inputs.tree.model is not None and _nf4_block_size(inputs.tree.model)
    numels = [int(np.prod(p.dequantized_shape)) for p in nf4]
    works = working_scaler_block_size(numels, block, shard) if block else None
    only_factor = all(p.dequantized_shape[0] % shard == 0 and len(p.dequantized_shape) == 2
                      and all(n % shard == 0 for k, n in zip(SHARDED_PARTS, p.quant_parts) if k != "quantization_factor")
                      for p, _ in bad)
    names = [p.fqn for p, _ in bad]
    if works is not None and only_factor:
        fix = (f"quantize with scaler_block_size={works} (to_nf4(weight, scaler_block_size={works}); torchtune's "
               f"FrozenNF4Linear / linear_nf4 take it): every NF4 weight then splits over {shard} ranks")
    else:
        fix = (f"shard over a mesh size that divides every NF4 weight's inner tensors, or keep these weights out "
               f"of FSDP (ignored_params){f'; scaler_block_size={works} fixes the quantization factors' if works else ''}")
    return [Finding(
        "SV128", "error",
        f"{len(bad):,} torchao NF4 weights cannot be sharded over {shard} ranks: {names[0]}: {bad[0][1]}. "
        "torchao splits an NF4Tensor's inner tensors (quantized_data, quantized_scalers, quantization_factor) "
        "on dim 0 without padding, so fully_shard raises",
        tuple(names[:50]), fix=fix, n_fqns=len(names), all_fqns=tuple(names))]


def _nf4_block_size(model) -> int | None:
    """The ``block_size`` of the model's first torchao NF4 weight."""
    from ..model.quant_torchao import is_nf4

    for p in model.parameters():
        if is_nf4(p):
            return int(p.__dict__["block_size"])
    return None


def check_fp8_cast(inputs: AnalysisView) -> list[Finding]:
    """SV129: float8 weights (``FP8Linear``'s, from an fp8 ``quantization_config``) sharded by a call whose
    ``param_dtype`` differs. FSDP2 casts every floating parameter of the call to ``param_dtype`` before
    the all-gather (measured: a bf16 policy gathers them as bf16), so each gathers 2 bytes per element
    instead of 1, and transformers' ``FP8Linear.forward`` sees a weight wider than one byte and runs
    ``F.linear`` on it without its ``weight_scale_inv``: the outputs are wrong and nothing fails."""
    layout, training, index = inputs.layout, inputs.training, tree_index(inputs.tree)
    bad: dict[str, list[str]] = {}
    fp8 = np.isin(index.dtype_code, [c for c, d in enumerate(index.dtypes) if d in FP8_DTYPES])
    for i in np.nonzero(fp8 & layout.sharded)[0].tolist():
        p = inputs.tree.params[i]
        unit = layout.units[int(layout.param_unit_array[p.index])].unit
        pd = training.unit_defaults(unit).param_dtype
        if pd is not None and str(pd).replace("torch.", "") != _storage(p):
            bad.setdefault(str(pd).replace("torch.", ""), []).append(p.fqn)
    return [Finding(
        "SV129", "error",
        f"{len(names):,} float8 weights are sharded by calls that cast parameters to param_dtype={pd}: FSDP2 "
        f"gathers them as {pd} (twice their bytes) and transformers' FP8Linear, given a {pd} weight, multiplies "
        "by it without its weight_scale_inv: the outputs are wrong and training runs on",
        tuple(names[:50]), fix="no param_dtype in the MixedPrecisionPolicy of the calls that hold float8 weights "
        "(sv.Training(param_dtype=None)), or load the checkpoint dequantized (FineGrainedFP8Config(dequantize=True))",
        n_fqns=len(names), all_fqns=tuple(names)) for pd, names in bad.items()]
