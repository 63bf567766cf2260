"""``sv.load_model``: the user's own model from its ``config.json`` (and peft ``adapter_config.json``), on meta.

Nothing is downloaded and no weight is allocated: the config is read from disk, the model class is
the one its ``architectures`` field names (``LlamaForCausalLM``, ``T5ForConditionalGeneration``, ...),
built on the ``meta`` device the way ``AutoModelForCausalLM.from_config`` builds it, and each adapter
is applied with peft's own ``get_peft_model`` / ``add_adapter``, so the tree is exactly the one the
user trains (``modules_to_save``, DoRA, several adapters included). Custom code (``auto_map``) is
never run.

Every problem raises ``ModelFileError`` (a ``ValueError``) in one line that names the file and,
where one is to blame, the field.
"""

from __future__ import annotations

import difflib
import json
import warnings
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..libraries import MODEL_BASE, import_quietly

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
CONFIG_FILE = "config.json"
ADAPTER_FILE = "adapter_config.json"
# LoRA inits that read the base weights (meta tensors have none); on meta they are replaced by
# peft's default init, which gives the same shapes.
_DATA_INITS = ("pissa", "olora", "loftq", "eva", "corda", "lora_ga", "orthogonal")


class ModelFileError(ValueError):
    """A config or adapter file that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class Source:
    """The files ``load_model`` built a model from, for findings that name them: the config file,
    the dtype its ``dtype``/``torch_dtype`` field declares ("float32", or None when absent or when
    ``dtype=`` overrode it), each adapter's file by adapter name, and its ``quantization_config``
    (None without one; transformers keeps it on ``model.config`` too)."""

    config_file: Path
    declared_dtype: str | None = None
    adapters: dict = field(default_factory=dict)
    quantization: dict | None = None  # its "quantization_config", or the one load_model was given


_SOURCES: "weakref.WeakKeyDictionary[nn.Module, Source]" = weakref.WeakKeyDictionary()


def source_of(model) -> Source | None:
    """The ``Source`` of a model ``load_model`` built (None for any other model)."""
    try:
        return _SOURCES.get(model)
    except TypeError:  # not weak-referenceable: not ours
        return None


def _declared_dtype(file: Path) -> str | None:
    obj = read_json(file, CONFIG_FILE)[1]
    value = obj.get("dtype", obj.get("torch_dtype"))
    return str(value).replace("torch.", "") if value is not None else None


def _hint(name: str, candidates) -> str:
    matches = difflib.get_close_matches(str(name), list(candidates), n=3, cutoff=0.6)
    return f" Closest: {', '.join(repr(m) for m in matches)}." if matches else ""


def read_json(path, file_name: str) -> tuple[Path, dict]:
    """``path`` (the file, or the folder ``save_pretrained`` wrote it in) -> (file, parsed object)."""
    path = Path(path)
    file = path / file_name if path.is_dir() else path
    if not file.exists():
        where = f"no {file_name} in folder {str(path)!r}" if path.is_dir() else f"{str(file)!r}: no such file"
        raise ModelFileError(where)
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelFileError(f"{file}: cannot read it: {exc}") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelFileError(f"{file}: not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise ModelFileError(f"{file}: expected a JSON object, got {type(obj).__name__}")
    return file, obj


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _dtype(dtype):
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    key = str(dtype).replace("torch.", "")
    if key not in DTYPES:
        raise ValueError(f"dtype={dtype!r}: expected one of {tuple(DTYPES)}")
    return DTYPES[key]


def load_config(path):
    """A transformers config from a ``config.json`` (file or folder), without network access."""
    try:
        import transformers
        from transformers import CONFIG_MAPPING
    except ImportError:
        raise ImportError("sv.load_model needs transformers and peft: pip install 'shardviz[hf]'") from None
    file, obj = read_json(path, CONFIG_FILE)
    model_type = obj.get("model_type")
    if model_type is None:
        raise ModelFileError(f"{file}: field 'model_type' is missing (e.g. \"llama\", \"qwen2\", \"t5\")")
    if model_type not in CONFIG_MAPPING:
        custom = " Its 'auto_map' points to custom code, which shardviz never runs." if "auto_map" in obj else ""
        raise ModelFileError(
            f"{file}: field 'model_type' is {model_type!r}, which transformers {transformers.__version__} "
            f"does not know.{_hint(model_type, CONFIG_MAPPING.keys())}{custom}"
        )
    fields = {k: v for k, v in obj.items() if k != "model_type"}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return file, CONFIG_MAPPING[model_type].from_dict(fields)
    except Exception as exc:  # noqa: BLE001 - transformers' own validation, reported against the file
        raise ModelFileError(f"{file}: {type(exc).__name__}: {_one_line(exc)}") from None


def _model_class(file: Path, obj_config):
    """The class ``architectures`` names, or the causal-LM / seq2seq auto class when the field is absent."""
    import transformers

    import_quietly(MODEL_BASE)  # what it imports says things that are not the caller's (``shardviz.libraries``)
    from transformers import PreTrainedModel

    archs = getattr(obj_config, "architectures", None)
    model_type = obj_config.model_type
    if not archs:
        auto = transformers.AutoModelForSeq2SeqLM if obj_config.is_encoder_decoder else transformers.AutoModelForCausalLM
        mapping = auto._model_mapping
        if type(obj_config) not in mapping:
            raise ModelFileError(
                f"{file}: field 'architectures' is missing and {model_type!r} has no {auto.__name__} head; "
                "name the class, e.g. \"architectures\": [\"...ForSequenceClassification\"]"
            )
        return mapping[type(obj_config)]
    if not isinstance(archs, (list, tuple)) or not all(isinstance(a, str) for a in archs):
        raise ModelFileError(f"{file}: field 'architectures' must be a list of class names, got {archs!r}")
    name = archs[0]
    cls = getattr(transformers, name, None) if name.isidentifier() else None
    if not (isinstance(cls, type) and issubclass(cls, PreTrainedModel)):
        known = [n for n in dir(transformers) if n.endswith(name[-12:])] if len(name) > 12 else dir(transformers)
        raise ModelFileError(
            f"{file}: field 'architectures' names {name!r}, which is not a model class of transformers "
            f"{transformers.__version__}.{_hint(name, known)}"
        )
    config_class = getattr(cls, "config_class", None)
    if config_class is not None and not isinstance(obj_config, config_class):
        raise ModelFileError(
            f"{file}: field 'architectures' names {name!r}, a {getattr(config_class, 'model_type', '?')!r} model, "
            f"but field 'model_type' is {model_type!r}"
        )
    return cls


def _adapters(adapter) -> list[tuple[str, Path]]:
    """``adapter`` as (adapter name, path) pairs: one path -> "default"; a list -> "default", then each
    folder's name (as peft's ``save_pretrained`` lays several adapters out); a dict -> its own names."""
    if adapter is None:
        return []
    if isinstance(adapter, (str, Path)):
        return [("default", Path(adapter))]
    if isinstance(adapter, dict):
        pairs = [(str(k), Path(v)) for k, v in adapter.items()]
    elif isinstance(adapter, (list, tuple)):
        pairs = []
        for i, item in enumerate(adapter):
            path = Path(item)
            folder = path if path.suffix != ".json" else path.parent
            pairs.append(("default" if i == 0 else folder.name, path))
    else:
        raise ValueError(f"adapter must be a path, a list of paths or a dict name -> path, got {type(adapter).__name__}")
    names = [n for n, _ in pairs]
    for n in names:
        if not n or names.count(n) > 1:
            raise ValueError(f"adapter names must be unique and non-empty, got {names}; pass a dict name -> path")
    return pairs


def load_adapter_config(path):
    """A peft config from an ``adapter_config.json`` (file or folder), ready to train (not inference mode)."""
    import dataclasses

    peft = import_quietly("peft")  # its imports' messages are not the caller's (``shardviz.libraries``)
    from peft.mapping import PEFT_TYPE_TO_CONFIG_MAPPING

    file, obj = read_json(path, ADAPTER_FILE)
    peft_type = obj.get("peft_type")
    if peft_type is None:
        raise ModelFileError(f"{file}: field 'peft_type' is missing (e.g. \"LORA\")")
    known = {str(getattr(k, "value", k)): v for k, v in PEFT_TYPE_TO_CONFIG_MAPPING.items()}
    if peft_type not in known:
        raise ModelFileError(
            f"{file}: field 'peft_type' is {peft_type!r}, which peft {peft.__version__} does not know.{_hint(peft_type, known)}"
        )
    config_cls = known[peft_type]
    allowed = {f.name for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise ModelFileError(
            f"{file}: field(s) {unknown} unknown to peft {peft.__version__}'s {config_cls.__name__} "
            f"(written by peft {obj.get('peft_version', '?')}?); remove them or upgrade peft"
        )
    fields = dict(obj, inference_mode=False)  # save_pretrained writes inference_mode=true; the user trains it
    init = fields.get("init_lora_weights")
    if isinstance(init, str) and init.lower().startswith(_DATA_INITS):
        fields["init_lora_weights"] = True
    for key in ("loftq_config", "eva_config", "corda_config"):
        if key in fields and fields[key] not in (None, {}):
            fields[key] = None if key != "loftq_config" else {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return file, config_cls(**fields)
    except Exception as exc:  # noqa: BLE001 - peft's own validation, reported against the file
        raise ModelFileError(f"{file}: {type(exc).__name__}: {_one_line(exc)}") from None


def load_model(config, adapter=None, dtype=None, attn_implementation: str | None = None,
               quantization: dict | None = None) -> nn.Module:
    """The model a Hugging Face ``config.json`` describes, on the meta device, with its peft adapter(s).

    ``config``: a ``config.json`` file or the folder ``save_pretrained`` wrote it in. The class is the
    first of its ``architectures`` (else the causal-LM head, or seq2seq for encoder-decoders).
    ``adapter``: an ``adapter_config.json`` (file or folder), a list of them (the first is
    ``"default"``, the others are named after their folders) or a dict adapter name -> path. Each is
    applied with peft's own ``get_peft_model`` / ``add_adapter``, trainable (``inference_mode``
    false); as peft leaves them, the first adapter is the active one and the only trainable one
    (``model.base_model.set_adapter([...])`` makes several active); inits that read base weights (PiSSA, OLoRA, LoftQ, EVA, CorDA) become peft's default
    init, which gives the same shapes. ``dtype``: the base weights' dtype (default: the config's
    ``dtype``/``torch_dtype``, as ``from_pretrained`` loads the checkpoint; float32 without one).
    ``attn_implementation``: the attention the model runs (``"eager"``, ``"sdpa"``, ``"flex_attention"``,
    ...; transformers' own argument, checked by transformers); default: what transformers picks for the
    class (sdpa where the model supports it, else eager: Gemma-2). The activations are measured with it,
    and the profile's assumptions name it. ``quantization``: a ``quantization_config`` (dict) to load
    with, as ``from_pretrained(..., quantization_config=BitsAndBytesConfig(...))`` (default: the config's
    own; ``{}``: none, the unquantized model). A bitsandbytes 4-bit one (nf4/fp4, any ``bnb_4bit_quant_storage``, double quantization) is
    built as transformers builds it, on meta, each ``Params4bit`` of its packed shape (``shardviz.model.quant``;
    needs bitsandbytes: ``pip install 'shardviz[qlora]'``); so are bitsandbytes 8-bit (``Int8Params`` and
    its ``SCB``) and fp8 blocks (``quant_method: fp8``, DeepSeek-V3's: float8 weights and fp32
    ``weight_scale_inv``, frozen); any other stays unquantized (finding SV122).

    Never touches the network and never runs custom code. Raises ``ModelFileError`` (a
    ``ValueError``) naming the file and the field when something is missing or unknown.
    """
    dtype = _dtype(dtype)
    file, hf_config = load_config(config)
    cls = _model_class(file, hf_config)
    pairs = _adapters(adapter)
    adapter_configs = [(name, *load_adapter_config(path)) for name, path in pairs]  # all read before building
    declared = read_json(file, CONFIG_FILE)[1].get("quantization_config")
    # quantization={} loads the unquantized model the config's checkpoint was quantized from
    quant = (dict(quantization) if quantization is not None else dict(declared) if isinstance(declared, dict) else None) or None
    kwargs = {"dtype": dtype} if dtype is not None else {}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
        # The model has no name_or_path (it was built from a config, not downloaded): not the user's concern.
        warnings.filterwarnings("ignore", message=".*base_model_name_or_path. was renamed.*")
        # peft warns that a tied layer in the adapter (modules_to_save on a tied embedding) may complicate
        # merging or converting the weights later: the model is built as the user trains it, on meta, and
        # shardviz neither merges nor converts, so the warning says nothing about this model's sharding.
        warnings.filterwarnings("ignore", message=".*tie_word_embeddings=True. and a tied layer is part of the adapter.*")
        with torch.device("meta"):
            try:
                model = cls._from_config(hf_config, **kwargs)
            except Exception as exc:  # noqa: BLE001 - e.g. inconsistent sizes in the config
                said = f" with attn_implementation={attn_implementation!r}" if attn_implementation else ""
                raise ModelFileError(f"{file}: building {cls.__name__}{said} failed: {type(exc).__name__}: "
                                     f"{_one_line(exc)}") from None
            _quantize(model, file, quant, pre_quantized=quantization is None)
            for i, (name, adapter_file, peft_config) in enumerate(adapter_configs):
                try:
                    if i == 0:
                        from peft import get_peft_model

                        model = get_peft_model(model, peft_config, adapter_name=name)
                    else:
                        model.add_adapter(name, peft_config)
                except Exception as exc:  # noqa: BLE001 - peft's refusal (e.g. target_modules not found)
                    _refuse_adapter(adapter_file, peft_config, exc)
    _SOURCES[model] = Source(file, _declared_dtype(file) if dtype is None else None,
                             {name: adapter_file for name, adapter_file, _ in adapter_configs}, quant)
    return model


def _quantize(model, file: Path, quant: dict | None, pre_quantized: bool) -> None:
    """Build a bitsandbytes 4-bit or 8-bit, or an fp8 block ``quantization_config`` on meta
    (``quant.quantize_on_meta``); leave any other, or a bitsandbytes one without bitsandbytes installed,
    unquantized (SV122 says so)."""
    from . import quant as q

    try:
        config = q.priced_config(quant)
    except Exception as exc:  # noqa: BLE001 - transformers' own validation, reported against the file
        raise ModelFileError(f"{file}: field 'quantization_config': {type(exc).__name__}: {_one_line(exc)}") from None
    if config is None or (q.needs_bnb(config) and not q.bnb_available()):
        return
    try:
        q.quantize_on_meta(model, config, pre_quantized=pre_quantized)
    except Exception as exc:  # noqa: BLE001 - e.g. a storage dtype bitsandbytes refuses
        raise ModelFileError(f"{file}: field 'quantization_config': building the quantized model failed: "
                             f"{type(exc).__name__}: {_one_line(exc)}") from None


def import_object(module_name: str, attr: str, label: str):
    """``module_name.attr`` (``attr`` may be dotted), the current folder importable; ValueError starting
    with ``label`` when the import or an attribute fails (the CLI's ``package.module:factory`` and
    ``--plan-from module:function``)."""
    import importlib
    import os
    import sys

    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's input
        raise ValueError(f"{label}: cannot import {module_name!r}: {type(exc).__name__}: {exc}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{label}: {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def _refuse_adapter(adapter_file, peft_config, exc: Exception):
    """peft's refusal of an adapter, as a ModelFileError naming the file, the field and what to change."""
    said = str(exc)
    if "ParamWrapper" in said and "lora_dropout" in said:
        import transformers

        raise ModelFileError(
            f"{adapter_file}: field 'lora_dropout' is {peft_config.lora_dropout}, but this adapter reaches the "
            f"fused MoE experts of transformers {transformers.__version__} (their weights are parameters, not "
            "nn.Linear layers; peft adapts them with lora.ParamWrapper, which has no dropout). Set "
            "\"lora_dropout\": 0.0, or leave the experts' projections out of 'target_modules' / 'target_parameters'"
        ) from None
    said = said.lower().replace("_", " ")
    field_ = next((f for f in ("target_modules", "modules_to_save", "layers_to_transform",
                               "target_parameters") if f.replace("_", " ") in said), None)
    where = f" field {field_!r}:" if field_ else ""
    raise ModelFileError(f"{adapter_file}:{where} {type(exc).__name__}: {_one_line(exc)}") from None
