"""How the command line reads its inputs: the model (``zoo:NAME``, a ``config.json``, a factory),
the plan (a preset or a plan file), the mesh and the training (a plan file's, the flags over it, or
``DEFAULT_TRAINING``). Every bad input is a ``CliError``: one line, exit code 2 (``cli.main``).
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path

from torch import nn

from .. import zoo
from ..run.setup import mesh_from_obj, mesh_to_obj, read_setup
from ..run.training import DEFAULT_TRAINING
from ..run.devices import DEVICES
from ..views.display import training_text
from ..format import format_bytes, parse_size
from ..frameworks import plan_from_source
from ..fsdp import MIN_TORCH, parse_version
from ..run.mesh import Mesh
from ..model.load import CONFIG_FILE, import_object, load_model, read_json
from ..plan import Plan
from ..presets import blocks_without_calls, named_plan, plan_mismatch
from ..tp import local_tree
from ..frameworks.trainer_config import from_trainer
from ..frameworks.axolotl_config import from_axolotl
from ..frameworks.torchtune_config import from_torchtune
from ..model.tree import ModelTree


class CliError(Exception):
    """Bad input: printed as one line, exit code 2."""




# ---------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------
def is_config_path(spec: str) -> bool:
    """A ``config.json`` (or the folder holding one) rather than ``zoo:NAME`` / ``package.module:factory``."""
    return spec.endswith(".json") or Path(spec).is_dir() or (os.sep in spec and ":" not in spec)


def model_from_spec(spec: str, lora: bool = True, adapter=None, dtype=None, attn_implementation=None, quantization=None):
    """``zoo:NAME``, a ``config.json`` (+ ``adapter`` paths) or ``package.module:factory`` -> an nn.Module.
    ``quantization``: ``quantization_from_args``'s changes to the config's ``quantization_config``."""
    if adapter and not is_config_path(spec):
        raise CliError(f"--adapter applies to a config.json model, not {spec!r}")
    if dtype and not is_config_path(spec):
        raise CliError(f"--dtype applies to a config.json model, not {spec!r}")
    if attn_implementation and not is_config_path(spec):
        raise CliError(f"--attn-implementation applies to a config.json model, not {spec!r}")
    if quantization and not is_config_path(spec):
        raise CliError(f"--load-in-4bit / --load-in-8bit / --quant-storage apply to a config.json model, not {spec!r}")
    if spec.startswith("zoo:"):
        try:
            return zoo.build(spec, lora=lora)
        except ValueError as exc:
            raise CliError(str(exc)) from None
    if is_config_path(spec):
        try:
            return load_model(spec, adapter=adapter or None, dtype=dtype, attn_implementation=attn_implementation,
                              quantization=_quantization(spec, quantization))
        except (ValueError, ImportError) as exc:
            raise CliError(str(exc)) from None
    return _model_from_factory(spec)


def model_label(spec: str) -> str | None:
    """What the model is shaped after, for the report's title: a zoo model's name from its docstring
    ("Llama 3.1 70B"), a config's folder name ("Qwen3-8B"); None for a factory."""
    if spec.startswith("zoo:"):
        builder = getattr(zoo, spec.removeprefix("zoo:"), None)
        first = ((builder.__doc__ or "").strip().splitlines() or [""])[0]  # None (no such model) has one too
        return first.split(" on meta")[0].strip() or None if " on meta" in first else None  # "Llama 3.1 70B on meta ..."
    if is_config_path(spec):
        path = Path(spec)
        folder = path if path.is_dir() else path.parent
        return folder.resolve().name or None
    return None


def _model_from_factory(spec: str):
    """``package.module:factory`` (or ``:attribute``, an nn.Module) -> an nn.Module; the current folder is importable."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise CliError(f"model {spec!r}: expected zoo:NAME, path/to/config.json or package.module:factory")

    try:
        obj = import_object(module_name, attr, f"model {spec!r}")
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if isinstance(obj, nn.Module):
        return obj
    if not callable(obj):
        raise CliError(f"model {spec!r}: {attr!r} is neither an nn.Module nor a callable")
    try:
        model = obj()
    except Exception as exc:  # noqa: BLE001
        raise CliError(f"model {spec!r}: {attr}() raised {type(exc).__name__}: {exc}") from None
    if not isinstance(model, nn.Module):
        raise CliError(f"model {spec!r}: {attr}() returned {type(model).__name__}, not an nn.Module")
    return model


def make_mesh(world: int | None, replicate: int, tensor: int = 1):
    if world is None:
        raise CliError("--world-size is required")
    if world < 1 or replicate < 1 or tensor < 1:
        raise CliError(f"--world-size {world}, --replicate {replicate} and --tensor-parallel {tensor} must be positive")
    if world % (replicate * tensor):
        raise CliError(f"--world-size {world} is not a multiple of --replicate {replicate} x --tensor-parallel {tensor}")
    return Mesh(shard=world // (replicate * tensor), replicate=replicate, tensor=tensor)


def tensor_degree(args) -> int:
    """--tensor-parallel T (1 when not given)."""
    return args.tensor_parallel or 1


def check_version(version: str | None) -> str | None:
    if version is None:
        return None

    try:
        release = parse_version(version)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if release < MIN_TORCH:
        raise CliError(f"--torch {version}: fully_shard (FSDP2) needs torch >= 2.4")
    return version


def read_plan(path: str):
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot read plan {path!r}: {exc.strerror or exc}") from None
    try:
        return Plan.from_json(text)
    except ValueError as exc:
        raise CliError(f"plan {path!r}: {exc}") from None


def check_plan_file(tree, plan, path: str, gaps: bool = True) -> str | None:
    """A plan file made for another model is refused: every name it has that the model lacks, and
    (``gaps``) the blocks its units miss (``presets.plan_mismatch``). With ``gaps=False`` the missed
    blocks come back as a sentence (None when there are none), for a command that lists findings."""
    problems = plan_mismatch(tree, plan)
    gap = problems.pop() if problems and blocks_without_calls(tree, plan) else None
    if problems or (gap and gaps):
        raise CliError(f"plan {path!r} does not match the model: {'; '.join(problems + [gap] * bool(gaps and gap))}")
    return gap and f"error: plan {path!r} does not match the model: {gap}"


def quantization_from_args(args) -> dict | None:
    """--load-in-4bit (a bitsandbytes nf4 config, as from_pretrained(quantization_config=...) loads it),
    --load-in-8bit (bitsandbytes LLM.int8: BitsAndBytesConfig(load_in_8bit=True)), --quant-storage and
    --double-quant: the quantization_config fields they set (None: the config's own)."""
    out = {}
    if getattr(args, "load_in_8bit", False):
        if getattr(args, "load_in_4bit", False):
            raise CliError("--load-in-8bit and --load-in-4bit: choose one")
        four_bit = [f for f, a in (("--quant-storage", "quant_storage"), ("--quant-type", "quant_type"),
                                   ("--double-quant", "double_quant")) if getattr(args, a, None)]
        if four_bit:
            raise CliError(f"{' / '.join(four_bit)} set a 4-bit quantization_config; --load-in-8bit has no such field "
                           "(drop it, or use --load-in-4bit)")
        return {"quant_method": "bitsandbytes", "load_in_8bit": True}
    if getattr(args, "load_in_4bit", False):
        out.update(quant_method="bitsandbytes", load_in_4bit=True, bnb_4bit_quant_type=args.quant_type or "nf4",
                   bnb_4bit_compute_dtype="bfloat16", bnb_4bit_quant_storage="uint8")
    elif getattr(args, "quant_type", None):
        out["bnb_4bit_quant_type"] = args.quant_type
    if getattr(args, "quant_storage", None):
        out["bnb_4bit_quant_storage"] = args.quant_storage
    if getattr(args, "double_quant", False):
        out["bnb_4bit_use_double_quant"] = True
    return out or None


def _quantization(spec: str, changes: dict | None) -> dict | None:
    """The quantization_config load_model builds: the config's, with ``changes`` (a 4-bit one from
    --load-in-4bit replaces it); None: the config's own."""
    if not changes:
        return None
    if changes.get("load_in_4bit") or changes.get("load_in_8bit"):
        return changes

    declared = read_json(spec, CONFIG_FILE)[1].get("quantization_config")
    if not isinstance(declared, dict) or not declared.get("load_in_4bit"):
        raise CliError(f"--quant-storage / --quant-type / --double-quant change a bitsandbytes 4-bit quantization_config, "
                       f"and {spec} has none: add --load-in-4bit")
    return {**declared, **changes}


def build_model(args):
    """The command's model, walked once: (model, tree). Every later step reads the tree."""
    if getattr(args, "torchtune_config", None):
        return _torchtune_model(args)
    if args.model is None and getattr(args, "trainer_config", None):  # TRL's model_name_or_path names it
        return _trainer_model(args)
    if args.model is None and not getattr(args, "axolotl_config", None):
        raise CliError("MODEL is required (zoo:NAME, a config.json, package.module:factory), or --torchtune-config "
                       "/ --axolotl-config")
    model = None if args.model is None else model_from_spec(
        args.model, lora=not args.no_lora, adapter=args.adapter, dtype=args.dtype,
        attn_implementation=args.attn_implementation, quantization=quantization_from_args(args))
    if getattr(args, "axolotl_config", None):
        model = _axolotl_model(args, model)
    return model, ModelTree(model)


def _trainer_model(args):
    """``--trainer-config`` with no MODEL: TRL's ``model_name_or_path`` (and ``use_peft``/``lora_*``) builds it."""

    args.trainer_setup = _read_framework(args, "--trainer-config", from_trainer, args.trainer_config, None)
    return args.trainer_setup.model, ModelTree(args.trainer_setup.model)


def _read_framework(args, flag: str, reader, *inputs):
    """``reader(*inputs, mesh=...)`` (``from_trainer``, ``from_axolotl``, ``from_torchtune``) on the mesh the
    command's flags give; its refusals (a bad key, the framework not installed) as one-line CLI errors."""
    if args.world_size is None:
        raise CliError(f"--world-size is required with {flag}")
    try:
        return reader(*inputs, mesh=make_mesh(args.world_size, args.replicate or 1, tensor_degree(args)))
    except (ValueError, ImportError) as exc:
        raise CliError(str(exc)) from None


def _axolotl_model(args, model):
    """``--axolotl-config``: axolotl's validated config builds the model (MODEL, given, wins), the plan and the
    training (``args.framework_setup``, read as the framework's setup)."""

    args.framework_setup = _read_framework(args, "--axolotl-config", from_axolotl, args.axolotl_config, model)
    return args.framework_setup.model


def _torchtune_model(args):
    """``--torchtune-config RECIPE.yaml key=value ...``: torchtune's recipe builds the model (and the plan and
    the training: ``args.framework_setup``)."""

    if args.model is not None:
        raise CliError(f"--torchtune-config: the recipe builds its own model (model._component_); drop MODEL "
                       f"{args.model!r} or override the recipe's: model._component_=... / model.lora_rank=...")
    path, *overrides = args.torchtune_config
    args.framework_setup = _read_framework(args, "--torchtune-config", from_torchtune, path, overrides)
    return args.framework_setup.model, ModelTree(args.framework_setup.model)


def build_plan(tree, args, model=None):
    """The command's plan: a preset (--lora), a plan file (--plan), or what the user's framework or
    function makes (--accelerate-config, --plan-from: ``captured_plan``)."""
    checkpoint = args.checkpoint
    if args.framework_setup is not None:
        if args.lora or args.plan or checkpoint:
            raise CliError("--torchtune-config / --axolotl-config give the plan: drop --lora / --plan / --checkpoint")
        return args.framework_setup.plan
    if args.accelerate_config or args.plan_from or args.trainer_config:
        return captured_plan(model, args)
    if args.plan and args.lora:
        raise CliError("give either --lora or --plan, not both")
    if args.plan and checkpoint:
        raise CliError("--checkpoint goes with --lora; a plan file lists its own 'checkpoint' modules")
    if args.plan:
        plan = read_plan(args.plan)
        check_plan_file(tree, plan, args.plan)
    else:
        tensor_parallel = True if tensor_degree(args) > 1 else None  # the model's own TP plan
        try:
            plan = Plan.auto(tree, lora=args.lora or "sharded", checkpoint=checkpoint, tensor_parallel=tensor_parallel)
        except ValueError as exc:
            raise CliError(str(exc)) from None
        if tensor_degree(args) > 1 and plan.tensor_parallel:  # names, styles, divisibility: before any command runs

            if args.world_size is not None:  # export and report: the only commands with --tensor-parallel
                make_mesh(args.world_size, args.replicate or 1, tensor_degree(args))  # the mesh first

            try:
                local_tree(tree, plan.tensor_parallel, tensor_degree(args))
            except ValueError as exc:
                raise CliError(str(exc)) from None
    try:
        plan.validate(tree)
    except ValueError as exc:
        raise CliError(f"plan does not fit the model: {exc}") from None
    return named_plan(tree, plan).with_setup(plan.setup)  # the name the widget and the export give the same plan


def captured_plan(model, args):
    """``--accelerate-config`` / ``--plan-from``: the plan the user's framework or function makes (sv.capture)."""
    given = [f for f in ("lora", "plan", "checkpoint", "accelerate_config", "plan_from", "trainer_config")
             if getattr(args, f)]
    if len(given) > 1:
        raise CliError("give one of --lora, --plan, --accelerate-config, --trainer-config, --plan-from; got "
                       + ", ".join('--' + f.replace('_', '-') for f in given))
    if args.world_size is None:
        raise CliError("--world-size is required with --accelerate-config / --trainer-config / --plan-from")
    try:
        if args.trainer_config and args.trainer_setup is not None:  # read with the model (TRL's model_name_or_path)
            return args.trainer_setup.plan
        if args.trainer_config:  # its training too: resolve_setup reads args.trainer_setup

            args.trainer_setup = from_trainer(args.trainer_config, model, mesh=make_mesh(
                args.world_size, args.replicate or 1, tensor_degree(args)))
            return args.trainer_setup.plan
        return plan_from_source(model, make_mesh(args.world_size, args.replicate or 1, tensor_degree(args)),
                                args.accelerate_config,
                                args.plan_from)
    except (ValueError, ImportError) as exc:
        raise CliError(str(exc)) from None


TRAINING_FLAGS = ("optimizer", "param_dtype", "reduce_dtype", "offload", "batch_size", "seq_len", "global_batch",
                  "grad_accum", "use_cache")


def training_flags(args) -> dict:
    """The training fields given on the command line (``--param-dtype none``: no MixedPrecisionPolicy)."""
    kwargs = {}
    for key in TRAINING_FLAGS:
        value = getattr(args, key)
        if value is None or (value is False and key != "use_cache"):  # --no-use-cache is a value; no --offload is not
            continue
        if key == "optimizer" and str(value).isdigit():
            value = int(value)
        kwargs[key] = None if value == "none" else value
    return kwargs


def make_training(args, base):
    """``sv.Training``: ``base`` (a plan file's, else ``DEFAULT_TRAINING``) with the fields the flags give."""
    kwargs = training_flags(args)
    if "seq_len" in kwargs and "batch_size" not in kwargs and "global_batch" not in kwargs and base.batch_size is None:
        raise CliError("--seq-len needs --batch-size (the micro-batch each rank trains on)")
    try:
        return replace(base, **kwargs)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def resolve_setup(args, plan=None):
    """The command's mesh and training: a plan file's (``plan.setup``), else the flags and
    ``DEFAULT_TRAINING``; a flag given explicitly overrides the file. Returns (mesh, training, notes):
    the notes say where each came from, for the output."""
    try:
        file_mesh, file_training = read_setup(plan)
    except ValueError as exc:
        raise CliError(f"plan {args.plan!r}: {exc}") from None
    source = f"from {args.plan}" if plan is not None and plan.setup else ""
    trainer = args.trainer_setup or args.framework_setup
    if trainer is not None and file_training is None:  # --trainer-config: the run's batch, sequence, precision
        file_training, source = trainer.training, f"from {args.trainer_config or args.axolotl_config or args.torchtune_config[0]}"
    mesh, mesh_flags = _resolve_mesh(args, file_mesh)
    training = make_training(args, file_training or DEFAULT_TRAINING)
    given = [_flag(k) for k in training_flags(args)]
    base = source if file_training else "shardviz's default"
    origin = f"{', '.join(given)} over {'the training ' if file_training else ''}{base}" if given else base
    mesh_origin = ""
    if file_mesh:
        mesh_origin = f" ({source}" + (f"; {', '.join(mesh_flags)} override it)" if mesh_flags else ")")
    notes = [f"training: {training_text(training, plan)} ({origin})", f"mesh: {_mesh_text(mesh)}{mesh_origin}"]
    if trainer is not None:
        notes += [f"read: {key}: {text}" for key, text in trainer.origins.items()]  # its notes: findings SV310-SV315
    return mesh, training, notes + _readings(args, mesh)


def _readings(args, mesh) -> list[str]:
    """How a flag that could be read two ways was read, said where the verdict is: a device name
    that is an alias ("A100" is the 80 GB card) and a size in decimal units ("80G" is 74.51 GiB)."""
    key = lambda name: re.sub(r"[^0-9A-Z]", "", name.upper())  # noqa: E731 - spelling aside
    out = []
    if args.device is not None and mesh.device is not None and key(args.device) != key(mesh.device.name):
        others = [n for n in DEVICES if n != mesh.device.name and key(n).startswith(key(args.device))]
        also = f"; for the other card say --device {' or '.join(others)}" if others else ""
        out.append(f"note: --device {args.device} read as {mesh.device.name} "
                   f"({format_bytes(mesh.device.memory)}){also}")
    for field in ("device_memory", "memory_reserve", "host_memory"):
        text = getattr(args, field)
        decimal = re.fullmatch(r"\s*([0-9.]+)\s*([kmgtKMGT])[bB]?\s*", text) if isinstance(text, str) else None
        if decimal:
            n = parse_size(text, _flag(field))
            binary = f"{decimal.group(1)}{decimal.group(2).upper()}iB"
            out.append(f"note: {_flag(field)} {text} read in decimal units as {n:,} bytes = {format_bytes(n)}; "
                       f"write {binary} for {format_bytes(parse_size(binary, _flag(field)))}")
    return out


def allocator_changes(args) -> dict:
    """--safety-margin, --judge, --expandable-segments as Mesh fields (only those given)."""
    margin = args.safety_margin
    if margin is not None and not margin.strip().endswith("%") and not any(c.isalpha() for c in margin):
        margin = float(margin) if "." in margin or "e" in margin else int(margin)
    changes = {"safety_margin": margin, "judge": args.judge,
               "expandable_segments": True if args.expandable_segments else None}
    return {k: v for k, v in changes.items() if v is not None}


def _mesh_text(mesh) -> str:
    device = f" of {mesh.device.name}" if mesh.device is not None else ""
    limit = f", {mesh.limit_text}" if mesh.device_memory is not None else ", no device memory given"
    return f"{mesh}{device}{limit}"


def _resolve_mesh(args, file_mesh):
    """(mesh, the flags that changed the file's): --world-size/--replicate/--device/--device-memory/
    --memory-reserve over the plan file's mesh."""
    world, replicate, tensor = args.world_size, args.replicate, args.tensor_parallel
    if file_mesh is None:
        if world is None:
            raise CliError("--world-size is required (or a --plan file written by 'plan search', which records its mesh)")
        obj = mesh_to_obj(make_mesh(world, replicate or 1, tensor or 1))
    else:
        obj = mesh_to_obj(file_mesh)
        if world is not None or replicate is not None or tensor is not None:
            mesh = make_mesh(world if world is not None else file_mesh.world, replicate or 1,
                             tensor if tensor is not None else file_mesh.tensor)
            obj.update(shard=mesh.shard, replicate=mesh.replicate, tensor=mesh.tensor)
    changed = [_flag(k) for k in ("world_size", "replicate", "tensor_parallel") if getattr(args, k) is not None]
    device = args.device
    if device is not None:
        obj["device"] = device
        changed.append("--device")
    for key in ("device_memory", "memory_reserve", "host_memory"):
        if getattr(args, key) is not None:
            obj[key] = getattr(args, key)
            changed.append(_flag(key))
    for key, value in allocator_changes(args).items():
        obj[key] = value
        changed.append(_flag(key))
    try:
        return mesh_from_obj(obj), changed if file_mesh is not None else []
    except ValueError as exc:
        raise CliError(str(exc).replace("plan file: field 'mesh': ", "")) from None
