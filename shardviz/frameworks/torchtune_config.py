"""``sv.from_torchtune``: the model, plan, mesh and training of a torchtune distributed recipe run, read
from its recipe YAML (plus ``tune run``'s ``key=value`` overrides) by torchtune's own code.

Nothing of torchtune's rules is re-implemented here. The YAML and the overrides go through torchtune's
own argument parser (``TuneRecipeArgumentParser`` then ``_merge_yaml_and_cli_args``, as ``tune run``
does). The model is ``config.instantiate(cfg.model)`` under ``training.set_default_dtype(dtype)`` on
meta, its adapters made trainable with ``set_trainable_params(model, get_adapter_params(model))``, as
``lora_finetune_distributed._setup_model`` does (``full_finetune_distributed``: everything trainable).
What that recipe then does to the model runs through ``sv.capture``: ``set_activation_checkpointing``
on ``TransformerSelfAttentionLayer`` when ``enable_activation_checkpointing``, then
``training.shard_model`` with ``get_shard_conditions`` (``custom_sharded_layers``),
``fsdp_cpu_offload`` and ``fsdp_reshard_after_forward``. The recipe builds the RoPE caches after
sharding, on the GPU (``m.rope_init()``; torchtune's ``rope_init`` returns early on meta): here they are
built by the same ``rope_init`` on the CPU and moved to meta, so the step runs as the recipe's does. The
step's loss is the recipe's (``config.instantiate(cfg.loss)``; ``CEWithChunkedOutputLoss`` sets the
model's ``num_output_chunks``, so logits come out in chunks and are upcast one chunk at a time).

torchtune 0.6.1 imports torchao at module level and needs a torchao that still has
``torchao.quantization.int4_weight_only`` (0.15 and older); peft 0.21 refuses a torchao older than
0.16 (``peft.import_utils.is_torchao_available`` raises). No torchao satisfies both, so torchtune runs
in its own environment: ``torch==2.13.0 torchtune==0.6.1 torchao==0.15.0`` (``scripts/setup.sh
--torchtune``). ``torchtune_release`` finds the conflict at import and says so.
"""

from __future__ import annotations

import difflib
import os
import warnings
from dataclasses import replace

from torch import nn

from .capture import as_mesh, run_captured
from . import FrameworkSetup, with_findings
from ..finding import Finding
from ..plan import Origin, Plan

INSTALL = "pip install 'shardviz[torchtune]' (torch==2.13.0 torchtune==0.6.1 torchao==0.15.0, in their own venv)"
WORKING_PAIR = "torchtune==0.6.1 with torchao==0.15.0"
_DTYPES = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16"}


def torchao_conflict(torchao_version: str | None, peft_version: str | None) -> str | None:
    """Why torchtune 0.6.1 and peft cannot share this environment's torchao, or None."""
    from packaging.version import Version

    if torchao_version is None:
        return None
    ao = Version(torchao_version.split("+")[0])
    if ao >= Version("0.16"):
        peft = (f", and peft {peft_version} here refuses the torchao<=0.15 torchtune needs: no torchao satisfies "
                "both, so keep peft out of that venv") if peft_version is not None else ""
        return (f"torchao {torchao_version} has no torchao.quantization.int4_weight_only (removed in 0.16), which "
                f"torchtune 0.6.1 imports; use {WORKING_PAIR} in their own venv{peft}")
    if peft_version is not None:
        return (f"torchao {torchao_version} is older than 0.16, which peft {peft_version} requires (its LoRA layers "
                f"raise 'incompatible version of torchao'); torchtune 0.6.1 needs torchao<=0.15: no torchao "
                f"satisfies both. Keep peft out of the torchtune venv ({WORKING_PAIR})")
    return None


def _installed(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def torchtune_release() -> str:
    """torchtune's version, after checking that it imports; a clear error with the pair that works."""
    if _installed("torchtune") is None:
        raise ImportError(f"from_torchtune runs torchtune's own recipe code; torchtune is not installed. "
                          f"Install it with: {INSTALL}")
    torchao, peft = _installed("torchao"), _installed("peft")
    blocking = torchao_conflict(torchao, None)  # torchao too new: torchtune's own import fails
    if blocking:
        raise ImportError(f"torchtune {_installed('torchtune')} cannot import here: {torchao_conflict(torchao, peft)}")
    try:
        import torchtune
        from torchtune import training  # noqa: F401 - the import torchao breaks
    except ImportError as exc:
        raise ImportError(f"torchtune {_installed('torchtune')} does not import ({exc}); the pair that works is "
                          f"{WORKING_PAIR}") from None
    other = torchao_conflict(torchao, peft)  # torchtune runs; peft's LoRA layers in this venv will not
    if other:
        warnings.warn(f"torchtune {torchtune.__version__} imports here, but {other}", stacklevel=2)
    return torchtune.__version__


def recipe_file(path) -> str:
    """``path``, or the file of the config torchtune ships under that name (``llama3_1/70B_lora``), found in
    torchtune's recipe registry as ``tune run ... --config NAME`` finds it (``_cli.run.Run._get_config``)."""
    from torchtune._cli.run import ROOT
    from torchtune._recipe_registry import get_all_recipes

    path = os.fspath(path)
    if os.path.exists(path):
        return path
    for recipe in get_all_recipes():
        for config in recipe.configs:
            if config.name == path:
                return str(ROOT / "recipes" / "configs" / config.file_path)
    names = sorted({c.name for r in get_all_recipes() for c in r.configs})
    close = difflib.get_close_matches(path, names, n=1)
    raise ValueError(f"torchtune config {path!r}: no such file, nor a config torchtune ships"
                     + (f" (did you mean {close[0]!r}?)" if close else " (tune ls lists them)"))


def read_recipe(path, overrides=()):
    """The recipe's config as ``tune run --config path key=value ...`` gives it (torchtune's parser); ``path``: a
    file or the name of a config torchtune ships."""
    from torchtune.config._parse import TuneRecipeArgumentParser
    from torchtune.config._utils import _merge_yaml_and_cli_args

    path = recipe_file(path)
    parser = TuneRecipeArgumentParser(description="shardviz")
    try:
        yaml_args, cli_args = parser.parse_known_args(["--config", path, *overrides])
        return _merge_yaml_and_cli_args(yaml_args, cli_args)
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"torchtune config {os.path.basename(path)}: {exc}") from None
    except SystemExit:
        raise ValueError(f"torchtune config {os.path.basename(path)}: torchtune's parser refused the file or "
                         f"the overrides {list(overrides)}") from None


def _build_rope(model: nn.Module, dtype) -> None:
    """The RoPE caches the recipe builds after sharding (``m.rope_init()`` on its device), built by the same
    ``rope_init`` on the CPU and moved to meta: torchtune's returns early on meta."""
    from torchtune import training

    import torch

    for m in model.modules():
        if hasattr(m, "rope_init") and not getattr(m, "is_cache_built", True):
            with training.set_default_dtype(dtype), torch.device("cpu"):
                m.rope_init()  # plain CPU tensors, as on the recipe's device
            for name, buf in list(m._buffers.items()):
                m._buffers[name] = buf.to("meta")


def build_model(cfg, device: str = "meta"):
    """The recipe's model on meta: its builder, its dtype, its trainable adapters, its RoPE caches and the
    loss's ``num_output_chunks``. Returns (model, loss_fn, dtype). ``device="cpu"``: with real (random)
    weights, as the truth harness trains it."""
    import torch
    from torchtune import config, training
    from torchtune.modules.peft import get_adapter_params, set_trainable_params

    dtype = training.get_dtype(cfg.get("dtype", "bf16"), device=torch.device("cpu"))
    with training.set_default_dtype(dtype), torch.device(device):
        model = config.instantiate(cfg.model)
    adapters = get_adapter_params(model)
    if adapters:  # lora_finetune_distributed; full_finetune_distributed trains everything
        set_trainable_params(model, adapters)
    _build_rope(model, dtype)
    loss_fn = config.instantiate(cfg.loss) if "loss" in cfg else None
    if loss_fn is not None and type(loss_fn).__name__ == "CEWithChunkedOutputLoss":
        model.set_num_output_chunks(loss_fn.num_output_chunks)
    return model, loss_fn, dtype


def recipe_shard(model: nn.Module, enable_activation_checkpointing: bool, custom_sharded_layers,
                 cpu_offload: bool, reshard_after_forward: bool) -> None:
    """What ``lora_finetune_distributed._setup_model`` (and ``full_finetune_distributed``) does to the model
    between building it and loading weights: torchtune's checkpointing, then torchtune's ``shard_model``."""
    from functools import partial

    from torchtune import modules, training

    if enable_activation_checkpointing:
        training.set_activation_checkpointing(model, auto_wrap_policy={modules.TransformerSelfAttentionLayer})
    conditions = [partial(training.get_shard_conditions, names_to_match=custom_sharded_layers)]
    training.shard_model(model=model, shard_conditions=conditions, cpu_offload=cpu_offload,
                         reshard_after_forward=reshard_after_forward)


class RecipeStep:
    """``example_inputs`` of a torchtune step: ``tokens`` (batch, seq) as the recipe's batch gives them,
    and ``loss``: the recipe's loss on the model's (chunked) logits with labels of the same shape."""

    def __init__(self, loss_fn, vocab_size: int):
        self.loss_fn = loss_fn
        self.vocab_size = vocab_size

    def __call__(self, batch_size: int, seq_len: int):
        import torch

        return (), {"tokens": torch.zeros((batch_size, seq_len), dtype=torch.long)}

    def loss(self, out):
        import torch

        first = out[0] if isinstance(out, list) else out
        labels = torch.zeros(first.shape[0], sum(o.shape[1] for o in out) if isinstance(out, list) else first.shape[1],
                             dtype=torch.long)
        if self.loss_fn is None:
            return torch.nn.functional.cross_entropy(first.reshape(-1, first.shape[-1]).float(), labels.reshape(-1))
        if not isinstance(out, list):
            return self.loss_fn(out.reshape(-1, out.shape[-1]), labels.reshape(-1))
        return self.loss_fn(out, labels)


def _said(cfg, key: str, given: set, default_text: str):
    """(value, where it came from) of a top-level key."""
    if key in given:
        return cfg.get(key), "override"
    if key in cfg:
        return cfg.get(key), "recipe"
    return None, default_text


def _seq_len(cfg, given: set):
    """The sequence: ``tokenizer.max_seq_len`` (what the dataset is cut or packed to)."""
    from ..run.training import DEFAULT_TRAINING

    tok = cfg.get("tokenizer") or {}
    seq = tok.get("max_seq_len") if hasattr(tok, "get") else None
    packed = bool((cfg.get("dataset") or {}).get("packed", False)) if hasattr(cfg.get("dataset") or {}, "get") else False
    where = "override" if "tokenizer.max_seq_len" in given else "recipe"
    if seq is None:
        return DEFAULT_TRAINING.seq_len, (f"{DEFAULT_TRAINING.seq_len} (shardviz's default: tokenizer.max_seq_len is "
                                          "null, so each batch is as long as its longest sample)")
    return int(seq), f"tokenizer.max_seq_len={seq} ({where}; dataset.packed={packed})"


def recipe_training(cfg, loss_fn, model, given: set):
    """(``sv.Training``, origins): micro-batch, sequence, accumulation, dtype, offload, optimizer."""
    from ..run.training import DEFAULT_TRAINING

    origins = {}
    batch, where = _said(cfg, "batch_size", given, "shardviz's default")
    batch = int(batch or 1)
    origins["batch_size"] = f"batch_size={batch} ({where})"
    accum, where = _said(cfg, "gradient_accumulation_steps", given, "torchtune's default")
    accum = int(accum or 1)
    origins["grad_accum"] = f"gradient_accumulation_steps={accum} ({where})"
    seq_len, origins["seq_len"] = _seq_len(cfg, given)
    dtype = cfg.get("dtype", "bf16")
    origins["precision"] = (f"dtype={dtype} ({'recipe' if 'dtype' in cfg else 'torchtune default'}): parameters, "
                            "gradients and optimizer states in it; no MixedPrecisionPolicy (shard_model passes none)")
    offload = bool(cfg.get("fsdp_cpu_offload", False))
    origins["offload"] = f"fsdp_cpu_offload={offload} ({'recipe' if 'fsdp_cpu_offload' in cfg else 'default'})"
    opt = cfg.get("optimizer") or {}
    component = str(opt.get("_component_", "")) if hasattr(opt, "get") else ""
    fused = bool(opt.get("fused", False)) if hasattr(opt, "get") else False
    name = "adamw" if component.endswith("AdamW") else "adam" if component.endswith("Adam") else "sgd" \
        if component.endswith("SGD") else DEFAULT_TRAINING.optimizer
    origins["optimizer"] = f"optimizer._component_={component or '-'} fused={fused} -> {name}"
    vocab = getattr(getattr(model, "output", None), "out_features", None) or 0
    training = replace(DEFAULT_TRAINING, batch_size=batch, seq_len=seq_len, grad_accum=accum, param_dtype=None,
                       reduce_dtype=None, optimizer_dtype=None, offload=offload, fused=fused, optimizer=name,
                       example_inputs=RecipeStep(loss_fn, vocab))
    return training, origins


def _findings(cfg, model: nn.Module, plan: Plan, release: str) -> list[Finding]:
    """What torchtune's own code did that the numbers say only in bytes, in the recipe's keys (SV311, SV314, SV315)."""
    found = []
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()})
    policy = any(u.param_dtype or u.reduce_dtype for u in plan.units)
    low = [d for d in dtypes if d in ("bfloat16", "float16")]
    if low and not policy:
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        found.append(Finding(
            "SV311", "info", f"dtype={cfg.get('dtype', 'bf16')}: torchtune {release} builds the model in {low[0]} and "
            f"its shard_model passes no MixedPrecisionPolicy, so the {trainable:,} trainable parameters, their "
            f"gradients and AdamW states are {low[0]} and gradients reduce in {low[0]}: no fp32 master weights "
            "(priced so)", fix="dtype=fp32 (tune run override) for fp32 weights, gradients and states"))
    if cfg.get("enable_activation_offloading", False):
        found.append(Finding("SV315", "warning", "enable_activation_offloading=True is NOT priced: activations are "
                             "counted on the GPU", fix="enable_activation_offloading=False to see the run priced as it is"))
    if cfg.get("compile", False):
        found.append(Finding("SV315", "info", "compile=True is NOT priced: the step is measured eager"))
    if bool((cfg.get("dataset") or {}).get("packed", False)):
        found.append(Finding("SV315", "info", "dataset.packed=True: one sequence of tokenizer.max_seq_len per row; its "
                             "block-causal mask (flex attention on the GPU) is not priced, the step is measured causal"))
    if "fsdp" in cfg:
        found.append(Finding("SV314", "warning", "fsdp: (a block) is read by no torchtune recipe: it has no effect on "
                             "the run", fix="use the recipe's top-level keys: fsdp_cpu_offload, "
                             "fsdp_reshard_after_forward, custom_sharded_layers"))
    return found


def from_torchtune(path, overrides=(), world_size: int | None = None, mesh=None) -> FrameworkSetup:
    """``sv.from_torchtune``: the model a torchtune recipe YAML builds (on meta), the plan its
    ``shard_model`` makes on ``world_size`` ranks, and the ``sv.Training`` the recipe gives, each with
    where it came from. ``overrides``: ``tune run``'s ``key=value`` strings (``batch_size=4``)."""
    release = torchtune_release()
    overrides = list(overrides or ())
    cfg = read_recipe(path, overrides)
    label = os.fspath(path) if not os.path.exists(os.fspath(path)) else os.path.basename(os.fspath(path))
    if "model" not in cfg:
        raise ValueError(f"torchtune config {label}: no model (model._component_ names the builder)")
    try:
        model, loss_fn, _ = build_model(cfg)
    except Exception as exc:  # noqa: BLE001 - torchtune's instantiate raises many kinds
        raise ValueError(f"torchtune config {label}: model: {type(exc).__name__}: {exc}") from None
    mesh = as_mesh(world_size, mesh)
    args = (bool(cfg.get("enable_activation_checkpointing", False)), cfg.get("custom_sharded_layers", None),
            bool(cfg.get("fsdp_cpu_offload", False)), bool(cfg.get("fsdp_reshard_after_forward", True)))
    cap = run_captured(recipe_shard, model, args, mesh=mesh, fn_name=f"torchtune {release}")
    plan = cap.plan(Origin("torchtune", label, f"torchtune {release}"))
    if cap.error is not None:
        raise ValueError(f"torchtune config {label}: the recipe's shard_model raised: {cap.error.message}")
    given = {o.split("=", 1)[0].lstrip("~") for o in overrides}
    training, origins = recipe_training(cfg, loss_fn, model, given)
    lora = " ".join(f"{k}={cfg.model.get(k)}" for k in ("lora_rank", "lora_alpha", "lora_attn_modules",
                                                        "apply_lora_to_mlp", "apply_lora_to_output") if k in cfg.model)
    where = "override" if any(g == "model" or g.startswith("model.") for g in given) else "recipe"
    origins["model"] = f"model._component_={cfg.model.get('_component_')}{' ' + lora if lora else ''} ({where})"
    origins["plan"] = f"{label} through torchtune {release}'s shard_model"
    plan = with_findings(plan, _findings(cfg, model, plan, release))
    return FrameworkSetup("torchtune", model, plan, mesh, training, origins, cfg)


def _is_layer(name: str) -> bool:
    parts = name.split(".")
    return len(parts) >= 2 and parts[-2] == "layers" and parts[-1].isdigit()


def _torchtune_keys(plan: Plan, layers: list[str]) -> tuple[list[str], list[str]]:
    """(``key=value`` overrides, what the keys cannot say) for ``plan`` on a model with these layers."""
    cannot, custom = [], []
    for unit in plan.units:
        if len(unit.modules) > 1:
            cannot.append(f"the grouped call {unit.name}: shard_model calls fully_shard on one module at a time")
        elif unit.modules[0] and not _is_layer(unit.modules[0]):
            custom.append(unit.modules[0])
    if "" not in {m for u in plan.units for m in u.modules}:
        cannot.append("no root call: shard_model always ends with fully_shard(model)")
    missing = [name for name in layers if plan.unit_of(name) is None or plan.unit_of(name).modules != (name,)]
    if missing:
        cannot.append(f"no call of its own on {len(missing)} layers ({missing[0]}, ...): shard_model calls one per layer")
    if {u.param_dtype for u in plan.units} - {None} or {u.reduce_dtype for u in plan.units} - {None}:
        cannot.append("a MixedPrecisionPolicy: torchtune passes none (dtype sets parameters, gradients and states)")
    if plan.ignored:
        cannot.append(f"{len(plan.ignored)} parameters kept out of FSDP (ignored_params): shard_model has no key for them")
    reshard = {u.reshard_after_forward is not False for u in plan.units}
    if len(reshard) > 1:
        cannot.append("reshard_after_forward differing by call: fsdp_reshard_after_forward sets every call")
    offload = {bool(u.offload) for u in plan.units}
    if len(offload) > 1:
        cannot.append("CPU offload on some calls only: fsdp_cpu_offload sets every call")
    checkpointed = set(plan.checkpoint)
    every = bool(layers) and checkpointed == set(layers)
    if checkpointed and not every:
        cannot.append("checkpointing other than every layer: enable_activation_checkpointing wraps each layer")
    keys = [f"enable_activation_checkpointing={every}", f"fsdp_cpu_offload={offload == {True}}",
            f"fsdp_reshard_after_forward={reshard != {False}}",
            f"custom_sharded_layers={custom!r}" if custom else "~custom_sharded_layers"]
    return keys, cannot


def to_torchtune(path, plan: Plan, overrides=(), world_size: int = 8) -> tuple[list[str], list[str]]:
    """(``tune run`` overrides, what they cannot say): the torchtune keys closest to ``plan`` for the recipe at
    ``path``, checked by running torchtune's own ``shard_model`` with them (``from_torchtune``) and comparing
    the calls; an empty list: the keys give exactly ``plan``."""
    base = from_torchtune(path, overrides, world_size=world_size)
    layers = [n for n, _ in base.model.named_modules() if _is_layer(n)]
    keys, cannot = _torchtune_keys(plan, layers)
    if "custom_sharded_layers" not in base.config and "~custom_sharded_layers" in keys:
        keys.remove("~custom_sharded_layers")
    theirs = from_torchtune(path, [*overrides, *keys], world_size=world_size).plan
    resolve = lambda u: replace(u, reshard_after_forward=u.reshard_after_forward is not False)  # noqa: E731
    mine, other = {resolve(u) for u in plan.units}, {resolve(u) for u in theirs.units}
    if not cannot and (mine != other or set(plan.checkpoint) != set(theirs.checkpoint)):
        cannot.append(f"torchtune's shard_model with these keys makes {len(other)} calls, not the plan's {len(mine)}")
    return keys, cannot
