"""``sv.from_trainer``: the plan, mesh and training of a Hugging Face ``Trainer`` (or TRL ``SFTConfig``) run,
read from its ``TrainingArguments`` by transformers' own code.

Nothing of transformers' rules is re-implemented here. A file of fields (YAML or JSON) becomes
``TrainingArguments(**fields)`` (TRL's ``SFTConfig`` when the file has a field only TRL knows), so
transformers' ``__post_init__`` processes ``fsdp`` / ``fsdp_config`` itself (the legacy
``"full_shard auto_wrap"`` string, the ``fsdp_`` prefixes, the list form of
``transformer_layer_cls_to_wrap``) into ``fsdp_plugin_args`` and ``mixed_precision``. As ``Trainer``
does (``create_accelerator_and_postprocess``), accelerate's ``FullyShardedDataParallelPlugin`` is built
from ``fsdp_plugin_args`` and handed to accelerate's FSDP2 preparation (``frameworks.accelerate_prepare``),
run through ``sv.capture``. The one thing bent: transformers' check that this machine can run bf16
(``is_torch_bf16_gpu_available``) answers yes, since the run predicted is on GPUs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import os
import tempfile
from dataclasses import dataclass, replace

from torch import nn

from .capture import as_mesh, run_captured
from . import accelerate_prepare, accelerate_release, config_error, with_findings
from ..plan import Origin, Plan

#: TRL's sequence-length fields, newest first (``max_seq_length`` is TRL < 0.20's name).
SEQ_FIELDS = ("max_length", "max_seq_length")
_MIXED = {"bf16": "bfloat16", "fp16": "float16"}
INSTALL = "pip install 'shardviz[trainer]'"


@dataclass(frozen=True)
class TrainerSetup:
    """What ``sv.from_trainer`` read: the plan accelerate's preparation makes from the arguments, the
    mesh, the ``sv.Training``, ``origins`` (each training field -> where its value came from: the file,
    transformers' or TRL's default, shardviz's default) and ``notes`` (what is read but not priced)."""

    plan: Plan
    mesh: object
    training: object
    origins: dict
    notes: tuple
    arguments: object
    model: object = None


def _read_file(path) -> dict:
    import json

    import yaml

    path = os.fspath(path)
    if not os.path.exists(path):
        raise ValueError(f"trainer config {path!r}: no such file")
    try:
        with open(path, encoding="utf-8") as f:
            body = json.load(f) if path.endswith(".json") else yaml.safe_load(f)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise ValueError(f"trainer config {path!r}: not readable ({' '.join(str(exc).split())})") from None
    if not isinstance(body, dict):
        raise ValueError(f"trainer config {path!r}: expected a mapping of TrainingArguments fields")
    return body


def _arguments_class(fields: dict):
    """``TrainingArguments``, or TRL's ``SFTConfig`` when a field is one only TRL knows."""
    from transformers import TrainingArguments

    known = {f.name for f in dataclasses.fields(TrainingArguments)}
    extra = sorted(set(fields) - known)
    if not extra:
        return TrainingArguments
    try:
        from trl import SFTConfig
    except ImportError:
        raise ValueError(f"trainer config: {', '.join(extra)} {'is' if len(extra) == 1 else 'are'} not "
                         f"TrainingArguments fields; if they are TRL's, install TRL: {INSTALL}") from None
    return SFTConfig


def _bad_field(label: str, exc: Exception, cls, fields: dict) -> ValueError:
    """transformers' / TRL's refusal of the fields, naming the key and the closest valid one."""
    import re

    said = " ".join(str(exc).split())
    unexpected = re.search(r"unexpected keyword argument '([^']+)'", said)
    if unexpected:
        key = unexpected.group(1)
        near = difflib.get_close_matches(key, [f.name for f in dataclasses.fields(cls)], n=1, cutoff=0.6)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        return ValueError(f"trainer config {label}: {key} is not one of {cls.__name__}'s fields{hint}")
    fsdp = fields.get("fsdp_config") if isinstance(fields.get("fsdp_config"), dict) else {}
    named = [f"fsdp_config.{k}" for k, v in fsdp.items() if isinstance(v, str) and v and v in said]
    named += [k for k, v in fields.items() if k != "fsdp_config" and isinstance(v, str) and v and v in said]
    key = f"{named[0]} is {(fsdp | fields).get(named[0].removeprefix('fsdp_config.'))!r}: " if named else ""
    return ValueError(f"trainer config {label}: {key}{cls.__name__} refuses it: {said}")


class _SeenConfig(dict):
    """The ``fsdp_config`` mapping, recording which keys transformers' processing reads (``get``, ``[]``,
    ``in``, ``setdefault``): a key the user gave that it never reads has no effect on the run."""

    def __init__(self, body: dict):
        super().__init__(body)
        self.given = {k.removeprefix("fsdp_"): k for k in body}
        self.read = set()

    def get(self, key, *default):
        self.read.add(key)
        return super().get(key, *default)

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.read.add(key)
        return super().__contains__(key)

    def setdefault(self, key, *default):
        self.read.add(key)
        return super().setdefault(key, *default)


def unread_fsdp_keys(args) -> list[str]:
    """The ``fsdp_config`` keys, as the file wrote them, that transformers' processing never read."""
    seen = args.fsdp_config
    if not isinstance(seen, _SeenConfig):
        return []
    return [written for key, written in seen.given.items() if key not in seen.read]


@contextlib.contextmanager
def _kept_environ():
    """``TrainingArguments`` sets ``FSDP_CPU_RAM_EFFICIENT_LOADING`` (and the like): restored after."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def training_arguments(fields: dict, label: str = "fields"):
    """``TrainingArguments(**fields)`` (or TRL's ``SFTConfig``), ``output_dir`` a temporary folder."""
    import transformers.training_args as ta

    cls = _arguments_class(fields)
    if isinstance(fields.get("fsdp_config"), dict):
        fields = {**fields, "fsdp_config": _SeenConfig(fields["fsdp_config"])}
    check = ta.is_torch_bf16_gpu_available
    with tempfile.TemporaryDirectory() as tmp, _kept_environ():
        ta.is_torch_bf16_gpu_available = lambda: True  # the predicted run is on GPUs, not on this machine
        try:
            return cls(**{"output_dir": tmp, "report_to": "none", **fields})
        except (TypeError, ValueError) as exc:
            raise _bad_field(label, exc, cls, fields) from None
        finally:
            ta.is_torch_bf16_gpu_available = check


def trainer_prepare(model: nn.Module, plugin_args: dict, env: dict) -> nn.Module:
    """As ``Trainer`` does: ``FullyShardedDataParallelPlugin(**args.fsdp_plugin_args)``, given to
    accelerate (which then sets ``ACCELERATE_USE_FSDP``), then accelerate's FSDP2 preparation."""
    from accelerate.utils import FullyShardedDataParallelPlugin

    os.environ.update(env)
    return accelerate_prepare(model, env, FullyShardedDataParallelPlugin(**plugin_args))


def _training(args, fields: dict | None, source: str):
    """(``sv.Training``, origins): micro-batch, accumulation, sequence, precision from the arguments."""
    from ..run.training import DEFAULT_TRAINING

    said = (lambda k: source) if fields is None else (lambda k: source if k in fields else None)
    default = "TRL's default" if type(args).__module__.startswith("trl") else "transformers' default"
    origins = {"batch_size": f"per_device_train_batch_size={args.per_device_train_batch_size} "
                             f"({said('per_device_train_batch_size') or default})",
               "grad_accum": f"gradient_accumulation_steps={args.gradient_accumulation_steps} "
                             f"({said('gradient_accumulation_steps') or default})"}
    seq_field = next((k for k in SEQ_FIELDS if getattr(args, k, None) is not None), None)
    seq_len = getattr(args, seq_field) if seq_field else DEFAULT_TRAINING.seq_len
    origins["seq_len"] = (f"{seq_field}={seq_len} ({said(seq_field) or default})" if seq_field else
                          f"{seq_len} (shardviz's default: TrainingArguments has no sequence length)")
    mixed = args.mixed_precision
    precision = [k for k in ("bf16", "fp16") if (fields or {}).get(k) or (fields is None and getattr(args, k))]
    origins["precision"] = (f"mixed_precision={mixed} ({', '.join(precision)}=True {source})" if precision
                            else f"mixed_precision={mixed} (transformers' default: fp32)")
    dtype = _MIXED.get(mixed)
    training = replace(DEFAULT_TRAINING, batch_size=args.per_device_train_batch_size, seq_len=seq_len,
                       grad_accum=args.gradient_accumulation_steps, param_dtype=dtype,
                       reduce_dtype=DEFAULT_TRAINING.reduce_dtype if dtype else None)
    return training, origins


def _notes(args, fields: dict | None, source: str) -> tuple:
    """What the arguments say that the plan and the training do not price."""
    notes = []
    if getattr(args, "activation_checkpointing", False):
        given = [k for k in ("activation_checkpointing", "gradient_checkpointing") if k in (fields or {})]
        where = (f"{given[0]}=True {source}" if given else "activation_checkpointing=True "
                 + ("(TRL's default)" if type(args).__module__.startswith("trl") else f"({source})"))
        kwargs = hf_checkpointing_kwargs(args)
        notes.append(f"{where}: Hugging Face's checkpointing inside each decoder layer's forward "
                     f"(use_reentrant={kwargs.get('use_reentrant', False)}), priced as those layers checkpointed "
                     "(the layers the model's own activation_checkpointing_enable switches on)")
        if kwargs.get("offload"):
            notes.append("activation_checkpointing_kwargs.offload=True is NOT priced: saved inputs counted on the GPU")
        if (args.fsdp_plugin_args or {}).get("activation_checkpointing"):
            notes.append("transformers' Trainer raises at start-up when both fsdp_config.activation_checkpointing and "
                         "activation_checkpointing are True (Trainer.create_accelerator_and_postprocess): set "
                         "activation_checkpointing: false")
    unread = unread_fsdp_keys(args)
    if unread:
        import transformers

        read = sorted(args.fsdp_config.read - {"xla", "xla_fsdp_v2", "xla_fsdp_grad_ckpt", "xla_fsdp_settings"})
        notes.append(f"fsdp_config {', '.join(unread)}: not read by transformers {transformers.__version__}'s "
                     f"TrainingArguments, so no effect on the run (the keys it reads: {', '.join(read)})")
    if getattr(args, "parallelism_config", None) is not None:
        notes.append("parallelism_config is not read: the mesh is the world size given")
    return tuple(notes)


def hf_checkpointing_kwargs(args) -> dict:
    """The Trainer's ``activation_checkpointing_kwargs`` (``gradient_checkpointing_kwargs``), as a dict."""
    import json

    kwargs = getattr(args, "activation_checkpointing_kwargs", None) or getattr(args, "gradient_checkpointing_kwargs", None)
    return dict(json.loads(kwargs) if isinstance(kwargs, str) else kwargs or {})


def _with_hf_checkpointing(plan: Plan, args, model: nn.Module) -> Plan:
    """As ``Trainer`` does with ``activation_checkpointing=True``: the model's own enable function, here on a
    meta copy; the layers it switches on are priced checkpointed (``hf_checkpointing``)."""
    from .hf_checkpointing import in_forward_checkpointed, priced_with

    if not getattr(args, "activation_checkpointing", False):
        return plan
    kwargs = hf_checkpointing_kwargs(args)
    every, offload = kwargs.pop("every_n_layers", 1), kwargs.pop("offload", False)
    return priced_with(plan, in_forward_checkpointed(model, kwargs, every, offload))


def trl_script_fields(fields: dict) -> tuple[dict, dict]:
    """(TRL ``ModelConfig`` fields, the rest): ``trl sft --config`` reads one YAML into ``ScriptArguments``,
    ``SFTConfig`` and ``ModelConfig`` (``TrlParser``); ``ScriptArguments``' dataset fields are dropped."""
    try:
        from trl import ModelConfig, ScriptArguments
    except ImportError:
        return {}, fields
    model_keys = {f.name for f in dataclasses.fields(ModelConfig)}
    script_keys = {f.name for f in dataclasses.fields(ScriptArguments)}
    return ({k: v for k, v in fields.items() if k in model_keys},
            {k: v for k, v in fields.items() if k not in model_keys | script_keys})


def trl_model(model_part: dict, label: str):
    """The model TRL's ``ModelConfig`` names (``model_name_or_path``: a local config.json or folder), on meta,
    with the peft config TRL's own ``get_peft_config`` makes of ``use_peft`` / ``lora_*``. (model, origin text)."""
    from trl import ModelConfig
    from trl.trainer.utils import get_peft_config

    from ..model.load import load_model

    margs = ModelConfig(**model_part)
    path = margs.model_name_or_path
    if path is None:
        raise ValueError(f"trainer config {label}: no model: give MODEL or model_name_or_path (a local config.json)")
    if not os.path.exists(path):
        raise ValueError(f"trainer config {label}: model_name_or_path {path!r} is not a local path; shardviz "
                         "downloads nothing: point it at the model's config.json (or its folder)")
    dtype = margs.dtype if margs.dtype not in (None, "auto") else None
    model = load_model(path, dtype=dtype)
    peft_config = get_peft_config(margs)
    text = f"model_name_or_path={path}"
    if peft_config is not None:
        from peft import get_peft_model

        model = get_peft_model(model, peft_config)
        text += (f", use_peft: LoRA r={peft_config.r} alpha={peft_config.lora_alpha} "
                 f"targets={peft_config.target_modules} (TRL's get_peft_config)")
    return model, f"{text} (from {label})"


def _source(args_or_path):
    """(arguments, the fields the file gave or None for an arguments object, label, TRL ModelConfig fields)."""
    from transformers import TrainingArguments

    if isinstance(args_or_path, TrainingArguments):
        return args_or_path, None, type(args_or_path).__name__, {}
    if isinstance(args_or_path, (str, os.PathLike)):
        model_part, fields = trl_script_fields(_read_file(args_or_path))
        label = os.path.basename(os.fspath(args_or_path))
        return training_arguments(fields, label), fields, label, model_part
    if isinstance(args_or_path, dict):
        model_part, fields = trl_script_fields(dict(args_or_path))
        return training_arguments(fields), fields, "fields", model_part
    raise ValueError(f"from_trainer: expected TrainingArguments, SFTConfig, a YAML/JSON path or a mapping of "
                     f"their fields, got {type(args_or_path).__name__}")


def from_trainer(args_or_path, model: nn.Module | None = None, world_size: int | None = None,
                 mesh=None) -> TrainerSetup:
    """``sv.from_trainer``: the plan accelerate's FSDP2 preparation makes from these Trainer arguments
    (transformers' own processing of ``fsdp`` / ``fsdp_config``; see the module docstring), the mesh of
    ``world_size`` ranks, and the ``sv.Training`` the arguments give, with where each value came from."""
    release = accelerate_release()
    args, fields, label, model_part = _source(args_or_path)
    model_origin = "the model given" + (" (over model_name_or_path)" if model_part.get("model_name_or_path") else "")
    if model is None:
        if not model_part:
            raise ValueError("from_trainer needs the model: TrainingArguments do not name one (TRL's "
                             "model_name_or_path does)")
        model, model_origin = trl_model(model_part, label)
    if not hasattr(args, "fsdp_plugin_args"):
        import transformers

        raise ImportError(f"from_trainer reads transformers 5's TrainingArguments.fsdp_plugin_args; transformers "
                          f"{transformers.__version__} has none. Install it with: {INSTALL}")
    if not args.fsdp_plugin_args:
        raise ValueError(f"trainer config {label}: fsdp is not set, so the Trainer does not use FSDP "
                         "(set fsdp: true and fsdp_config.fsdp_version: 2)")
    version = args.fsdp_plugin_args.get("fsdp_version", 2)
    if version != 2:
        raise ValueError(f"trainer config {label}: fsdp_config.version is {version}; shardviz models FSDP2 "
                         "(fully_shard): set fsdp_config.fsdp_version: 2")
    mesh = as_mesh(world_size, mesh)
    env = {"ACCELERATE_USE_FSDP": "true", "ACCELERATE_MIXED_PRECISION": args.mixed_precision}
    import transformers

    cap = run_captured(trainer_prepare, model, (dict(args.fsdp_plugin_args), env), mesh=mesh,
                       fn_name=f"accelerate {release}")
    origin = Origin("trainer", label, f"transformers {transformers.__version__}, accelerate {release}")
    plan = cap.plan(origin)
    if cap.error is not None:  # the Trainer would stop at start-up: no plan to price
        body = {"fsdp_config": {k: ",".join(v) if isinstance(v, list) else v
                                for k, v in ((fields or {}).get("fsdp_config") or args.fsdp_config or {}).items()}}
        raise config_error(label, cap.error.message, body, model, release, env, plan, cap.error,
                           kind="trainer config")
    from ..checks.origin_checks import capture_findings

    found = capture_findings(model, plan, {**env, "FSDP_AUTO_WRAP_POLICY": args.fsdp_plugin_args.get("auto_wrap_policy")})
    training, origins = _training(args, fields, f"from {label}")
    origins["plan"] = f"fsdp_config of {label}, through transformers {transformers.__version__} and accelerate {release}"
    plan = _with_hf_checkpointing(with_findings(plan, found), args, model)
    origins["model"] = model_origin
    return TrainerSetup(plan, mesh, training, origins, _notes(args, fields, f"from {label}"), args, model)
