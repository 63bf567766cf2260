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
from dataclasses import replace

from torch import nn

from .capture import as_mesh, run_captured
from . import FrameworkSetup, accelerate_prepare, accelerate_release, config_error, with_findings
from ..finding import Finding
from ..plan import Origin, Plan

#: TRL's sequence-length fields, newest first (``max_seq_length`` is TRL < 0.20's name).
SEQ_FIELDS = ("max_length", "max_seq_length")
_MIXED = {"bf16": "bfloat16", "fp16": "float16"}
INSTALL = "pip install 'shardviz[trainer]'"


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


#: TRL's trainers (``trl sft|dpo|kto|grpo|rloo --config``) and their configs, in the order a file is matched
TRL_TRAINERS = {"sft": "SFTConfig", "dpo": "DPOConfig", "kto": "KTOConfig", "grpo": "GRPOConfig", "rloo": "RLOOConfig"}


def _arguments_class(fields: dict, trainer: str | None = None):
    """``TrainingArguments``; TRL's config of ``trainer`` ("sft", "dpo", ...); else, when a field is one only
    TRL knows, the first of TRL's configs (``TRL_TRAINERS``' order) that has every field of the file."""
    from transformers import TrainingArguments

    if trainer is None:
        known = {f.name for f in dataclasses.fields(TrainingArguments)}
        extra = sorted(set(fields) - known)
        if not extra:
            return TrainingArguments
    elif trainer not in TRL_TRAINERS:
        raise ValueError(f"trainer {trainer!r}: expected one of TRL's trainers {', '.join(TRL_TRAINERS)}")
    try:
        import trl
    except ImportError:
        what = f"trainer {trainer!r} is TRL's" if trainer else (f"{', '.join(extra)} {'is' if len(extra) == 1 else 'are'} "
                                                                 "not TrainingArguments fields; if they are TRL's")
        raise ValueError(f"trainer config: {what}, install TRL: {INSTALL}") from None
    if trainer is not None:
        return getattr(trl, TRL_TRAINERS[trainer])
    for name in TRL_TRAINERS.values():
        cls = getattr(trl, name)
        if set(fields) <= {f.name for f in dataclasses.fields(cls)}:
            return cls
    return trl.SFTConfig  # its refusal names the field


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


def training_arguments(fields: dict, label: str = "fields", trainer: str | None = None):
    """``TrainingArguments(**fields)`` (or TRL's config: ``_arguments_class``), ``output_dir`` a temporary folder."""
    import transformers.training_args as ta

    cls = _arguments_class(fields, trainer)
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


#: TRL's configs whose trainers build a reference model and shard it with ``trl.models.utils.prepare_fsdp``
REFERENCE_CONFIGS = ("DPOConfig", "KTOConfig", "GRPOConfig", "RLOOConfig")


def reference_kept(args, model: nn.Module) -> str | None:
    """Why TRL's trainer for these arguments keeps a reference model through training (the keys that make it),
    or None. TRL 1.16's ``__init__`` test, with accelerate's ``is_peft_model`` as TRL calls it: a peft model is
    its own reference (adapters disabled); DPO and KTO free it after ``precompute_ref_log_probs``; GRPO and RLOO
    build none with ``beta: 0.0``."""
    from accelerate.utils import is_peft_model

    name = type(args).__name__
    if name not in REFERENCE_CONFIGS or is_peft_model(model):
        return None
    if name in ("DPOConfig", "KTOConfig"):
        return None if args.precompute_ref_log_probs else "precompute_ref_log_probs=False, no peft adapter"
    return None if args.beta == 0.0 else f"beta={args.beta}, no peft adapter"


def trl_reference_prepare(model: nn.Module, plugin_args: dict, env: dict) -> nn.Module:
    """TRL's ``prepare_fsdp`` of the reference model, with the Trainer's accelerate plugin (``trainer_prepare``'s)."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    from trl.models.utils import prepare_fsdp

    from . import accelerator_for

    os.environ.update(env)
    return prepare_fsdp(model, accelerator_for(env, FullyShardedDataParallelPlugin(**plugin_args)))


def reference_model(args, model: nn.Module, mesh, env: dict, label: str) -> tuple[dict, list]:
    """({"reference model": its plan}, [SV313]) when TRL keeps a reference model (``reference_kept``), else ({}, []):
    the plan is what TRL's own ``prepare_fsdp`` does to a meta copy of the model (the reference is built from the
    same checkpoint, in the model's dtype), through ``sv.capture``."""
    why = reference_kept(args, model)
    if why is None:
        return {}, []
    import torch
    import trl

    cap = run_captured(trl_reference_prepare, model, (dict(args.fsdp_plugin_args), env), mesh=mesh,
                       fn_name=f"trl {trl.__version__} prepare_fsdp")
    plan = cap.plan(Origin("trainer", f"{label}: reference model", f"trl {trl.__version__}"))
    cast = next((u.param_dtype for u in plan.units if "" in u.modules and u.param_dtype), None)
    whole = sum(p.numel() * (getattr(torch, cast) if cast else p.dtype).itemsize for p in model.parameters())
    kept = sum(p.numel() * p.dtype.itemsize for p in model.parameters()) // mesh.world
    from ..format import format_bytes

    kind = type(args).__name__.removesuffix("Config")
    said = (f"TRL's {kind}Trainer keeps a reference model ({why}) and shards it with its own prepare_fsdp: "
            f"{len(plan.units)} fully_shard call{'s' * (len(plan.units) != 1)} on the root, so each of its forwards "
            f"gathers the whole model at once ({format_bytes(whole)} per rank) beside "
            f"{format_bytes(kept)} of shards kept; neither is in this plan's peak")
    fix = ("set use_peft: true (the adapter-disabled model is the reference)"
           + (" or precompute_ref_log_probs: true (it is freed before training)" if kind in ("DPO", "KTO")
              else " or beta: 0.0 (no KL term, no reference model)"))
    return {"reference model": plan}, [Finding("SV313", "warning", said, fix=fix)]


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


def _findings(args, fields: dict | None, source: str) -> list[Finding]:
    """What the arguments say that the plan and the training do not price, in the Trainer's keys (SV314, SV315)."""
    found = []
    kwargs = hf_checkpointing_kwargs(args)
    if getattr(args, "activation_checkpointing", False) and kwargs.get("offload"):
        found.append(Finding("SV315", "info", "activation_checkpointing_kwargs.offload=True is NOT priced: the "
                             "checkpointed layers' saved inputs are counted on the GPU"))
    if getattr(args, "activation_checkpointing", False) and (args.fsdp_plugin_args or {}).get("activation_checkpointing"):
        found.append(Finding("SV314", "warning", "transformers' Trainer raises at start-up when both "
                             "fsdp_config.activation_checkpointing and activation_checkpointing are True "
                             "(Trainer.create_accelerator_and_postprocess)", fix="set activation_checkpointing: false "
                             "(fsdp_config.activation_checkpointing already checkpoints the layers)"))
    unread = unread_fsdp_keys(args)
    if unread:
        import transformers

        read = sorted(args.fsdp_config.read - {"xla", "xla_fsdp_v2", "xla_fsdp_grad_ckpt", "xla_fsdp_settings"})
        near = {k: difflib.get_close_matches(k.removeprefix("fsdp_"), read, n=1, cutoff=0.5) for k in unread}
        fix = "; ".join(f"{k} -> {v[0]}" for k, v in near.items() if v)
        found.append(Finding("SV314", "warning", f"fsdp_config {', '.join(unread)}: not read by transformers "
                             f"{transformers.__version__}'s TrainingArguments, so no effect on the run (the keys it "
                             f"reads: {', '.join(read)})", fix="in fsdp_config, use the keys TrainingArguments reads"
                             + (f" ({fix})" if fix else "")))
    if getattr(args, "parallelism_config", None) is not None:
        found.append(Finding("SV315", "info", "parallelism_config is not read: the mesh is the world size given",
                             fix="give the mesh to shardviz: sv.Mesh(shard=..., replicate=...) / --replicate"))
    return found


def hf_checkpointing_kwargs(args) -> dict:
    """The Trainer's ``activation_checkpointing_kwargs`` (``gradient_checkpointing_kwargs``), as a dict."""
    import json

    kwargs = getattr(args, "activation_checkpointing_kwargs", None) or getattr(args, "gradient_checkpointing_kwargs", None)
    return dict(json.loads(kwargs) if isinstance(kwargs, str) else kwargs or {})


def _with_hf_checkpointing(plan: Plan, args, fields: dict | None, source: str, model: nn.Module) -> tuple[Plan, list]:
    """As ``Trainer`` does with ``activation_checkpointing=True``: the model's own enable function, here on a
    meta copy; the layers it switches on are priced checkpointed, and SV310 says with which ``use_reentrant``."""
    from .hf_checkpointing import priced_in_forward

    if not getattr(args, "activation_checkpointing", False):
        return plan, []
    fields = fields or {}
    given = [k for k in ("activation_checkpointing", "gradient_checkpointing") if k in fields]
    trl_default = type(args).__module__.startswith("trl")
    where = (f"{given[0]}=True {source}" if given else "activation_checkpointing=True "
             + ("(TRL's default)" if trl_default else f"({source})"))
    key = next((k for k in ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs") if k in fields),
               "gradient_checkpointing_kwargs")
    kwargs = hf_checkpointing_kwargs(args)
    import transformers

    whose = f"{key} {source}" if "use_reentrant" in (fields.get(key) or {}) else f"transformers {transformers.__version__}'s default"
    every, offload = kwargs.pop("every_n_layers", 1), kwargs.pop("offload", False)
    plan, finding = priced_in_forward(plan, model, kwargs, f"{where}; use_reentrant: {whose}", key, every, offload)
    return plan, [finding]


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


def _listed(targets):
    """peft's target_modules as the user wrote them: a set (peft makes one of a list) sorted, so runs print alike."""
    return sorted(targets) if isinstance(targets, (set, frozenset)) else targets


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
                 f"targets={_listed(peft_config.target_modules)} (TRL's get_peft_config)")
    return model, f"{text} (from {label})"


def _source(args_or_path, trainer: str | None = None):
    """(arguments, the fields the file gave or None for an arguments object, label, TRL ModelConfig fields)."""
    from transformers import TrainingArguments

    if isinstance(args_or_path, TrainingArguments):
        return args_or_path, None, type(args_or_path).__name__, {}
    if isinstance(args_or_path, (str, os.PathLike)):
        model_part, fields = trl_script_fields(_read_file(args_or_path))
        label = os.path.basename(os.fspath(args_or_path))
        return training_arguments(fields, label, trainer), fields, label, model_part
    if isinstance(args_or_path, dict):
        model_part, fields = trl_script_fields(dict(args_or_path))
        return training_arguments(fields, trainer=trainer), fields, "fields", model_part
    raise ValueError(f"from_trainer: expected TrainingArguments, SFTConfig, a YAML/JSON path or a mapping of "
                     f"their fields, got {type(args_or_path).__name__}")


def from_trainer(args_or_path, model: nn.Module | None = None, world_size: int | None = None,
                 mesh=None, trainer: str | None = None) -> FrameworkSetup:
    """``sv.from_trainer``: the plan accelerate's FSDP2 preparation makes from these Trainer arguments
    (transformers' own processing of ``fsdp`` / ``fsdp_config``; see the module docstring), the mesh of
    ``world_size`` ranks, and the ``sv.Training`` the arguments give, with where each value came from.
    ``trainer``: TRL's trainer the file is for ("sft", "dpo", "kto", "grpo", "rloo"; ``trl dpo --config``),
    else the first whose config has every field of the file (``TrainingArguments`` when all are its)."""
    release = accelerate_release()
    args, fields, label, model_part = _source(args_or_path, trainer)
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

    found = capture_findings(model, plan, {**env, "FSDP_AUTO_WRAP_POLICY": args.fsdp_plugin_args.get("auto_wrap_policy")},
                             cap.cast, f"accelerate {release}")
    training, origins = _training(args, fields, f"from {label}")
    origins["plan"] = f"fsdp_config of {label}, through transformers {transformers.__version__} and accelerate {release}"
    plan, checkpointing = _with_hf_checkpointing(plan, args, fields, f"from {label}", model)
    others, reference = reference_model(args, model, mesh, env, label)
    found += checkpointing + reference + _findings(args, fields, f"from {label}")
    origins["model"] = model_origin
    return FrameworkSetup("trainer", model, with_findings(plan, found), mesh, training, origins, args, others)


def trainer_fields(config: dict, arguments_class) -> dict:
    """The Trainer's ``fsdp`` / ``fsdp_config`` (and ``bf16`` / ``fp16``) fields that say what the accelerate
    config ``config`` (``frameworks.accelerate_config``) says, in the keys ``_process_fsdp_args`` reads."""
    acc = config["fsdp_config"]
    fsdp = {"version": 2, "auto_wrap_policy": acc["fsdp_auto_wrap_policy"], "cpu_offload": acc["fsdp_offload_params"],
            "reshard_after_forward": acc["fsdp_reshard_after_forward"],
            "activation_checkpointing": acc["fsdp_activation_checkpointing"]}  # the keys that decide the calls
    if "fsdp_transformer_layer_cls_to_wrap" in acc:
        fsdp["transformer_layer_cls_to_wrap"] = acc["fsdp_transformer_layer_cls_to_wrap"].split(",")
    names = {f.name for f in dataclasses.fields(arguments_class)}
    # HF's in-forward checkpointing off (TRL's configs default it on): fsdp_config's checkpoints the layers
    hf_checkpointing = "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
    # both precision fields said: TRL's configs default bf16 on
    return {"fsdp": True, "fsdp_config": fsdp, hf_checkpointing: False,
            **{key: config["mixed_precision"] == key for key in _MIXED}}


def to_trainer(model: nn.Module, plan: Plan, world_size: int = 8, trainer: str | None = "sft") -> tuple[str, list[str]]:
    """(YAML, what it cannot say): the Trainer fields (``fsdp``, ``fsdp_config``, precision) closest to ``plan``,
    for ``trl sft --config`` (``trainer``: TRL's trainer whose config checks them; None: ``TrainingArguments``,
    also when TRL is not installed). Checked by reading the fields back with ``from_trainer`` (transformers'
    and accelerate's own code) and comparing the calls; an empty list: they give exactly ``plan``."""
    import yaml

    from . import accelerate_config, plan_differences
    from ..model.tree import as_tree

    try:
        cls = _arguments_class({}, trainer)
    except ValueError:  # TRL not installed: TrainingArguments' fields, which TRL's configs extend
        trainer = None
        cls = _arguments_class({}, None)
    fields = trainer_fields(accelerate_config(as_tree(model), plan), cls)
    setup = from_trainer(fields, model, world_size=world_size, trainer=trainer)
    cannot = plan_differences(plan, setup.plan)
    head = [f"# {cls.__name__} fields for the plan {plan.name or '(unnamed)'}: merge them into the file you give "
            f"{'trl ' + trainer + ' --config' if trainer else 'TrainingArguments'}; checked with "
            f"{setup.plan.origin.release}: " + ("it makes exactly these fully_shard calls." if not cannot else
                                                "it cannot say:")]
    head += [f"#  - {line}" for line in cannot]
    return "\n".join(head) + "\n" + yaml.safe_dump(fields, sort_keys=False), cannot
