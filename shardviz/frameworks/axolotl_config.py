"""``sv.from_axolotl``: the model, plan, mesh and training of an axolotl run, read from its YAML by
axolotl's own code.

Nothing of axolotl's rules is re-implemented here. The YAML goes through axolotl's validated config
(``axolotl.utils.config.validate_config``: its pydantic schema, with the GPU capabilities of the run
predicted, then ``normalize_config``). The model is the ``base_model``'s config (a local config.json or
folder, read by axolotl's ``load_model_config``) built on meta in the config's ``torch_dtype``, its
adapter made by axolotl's own ``load_lora``. The FSDP2 plan is accelerate's preparation as axolotl runs
it: axolotl's ``setup_fsdp_envs`` exports the ``FSDP_*`` variables, and ``Accelerator._prepare_fsdp2``'s
steps run (``frameworks.accelerate_prepare``) with axolotl's own ``fsdp2_prepare_model`` in place of
accelerate's, as ``patch_accelerate_fsdp2`` puts it (its extra ``fully_shard`` calls on every LoRA
``lora_A`` / ``lora_B``, its fp32-norm units), through ``sv.capture``. ``gradient_checkpointing: true``
is Hugging Face's in-forward checkpointing (``hf_checkpointing``; axolotl defaults it to reentrant).

axolotl pins its whole stack (accelerate, transformers, peft, trl, torchao, ...), so it runs in its own
environment (``scripts/setup.sh --axolotl``: axolotl with ``--no-deps`` plus the pins its config and
FSDP2 modules import). This registry has axolotl up to 0.19.0; 0.20 and 0.21 are not installable here.
"""

from __future__ import annotations

import os
from dataclasses import replace

from torch import nn

from .capture import as_mesh, run_captured
from . import FrameworkSetup, with_findings
from ..finding import Finding
from ..model.quant import quant_kind
from ..plan import Origin, Plan

INSTALL = "scripts/setup.sh --axolotl (axolotl==0.19.0 --no-deps with its pins, in their own venv)"


def axolotl_release() -> str:
    try:
        from importlib import metadata

        version = metadata.version("axolotl")
        from axolotl.utils.config import validate_config  # noqa: F401 - its schema and its pins import here
    except metadata.PackageNotFoundError:
        raise ImportError(f"from_axolotl runs axolotl's own config and FSDP2 preparation; axolotl is not installed. "
                          f"Install it with: {INSTALL}") from None
    except ImportError as exc:
        raise ImportError(f"axolotl does not import here ({exc}); it pins its stack: {INSTALL}") from None
    return version


def read_config(path, world: int):
    """(axolotl's validated, normalized config of the YAML, for ``world`` GPUs with bf16 (the run predicted),
    the YAML's own mapping)."""
    import torch
    import yaml
    from axolotl.utils.config import normalize_config, validate_config
    from axolotl.utils.dict import DictDefault

    path = os.fspath(path)
    label = os.path.basename(path)
    if not os.path.exists(path):
        raise ValueError(f"axolotl config {path!r}: no such file")
    with open(path, encoding="utf-8") as f:
        body = yaml.safe_load(f)
    if not isinstance(body, dict):
        raise ValueError(f"axolotl config {label}: expected a mapping of axolotl keys")
    base = str(body.get("base_model", ""))
    if base and not os.path.exists(base):
        raise ValueError(f"axolotl config {label}: base_model {base!r} is not a local path; shardviz downloads "
                         "nothing: point base_model at the model's config.json (or its folder)")
    capabilities = {"bf16": True, "fp8": False, "n_gpu": world, "n_node": 1, "compute_capability": "sm_90"}
    try:
        cfg = validate_config(DictDefault(body), capabilities=capabilities,
                              env_capabilities={"torch_version": torch.__version__.split("+")[0]})
        normalize_config(cfg)
    except Exception as exc:  # noqa: BLE001 - pydantic's ValidationError, axolotl's ValueErrors
        said = " ".join(str(exc).split())
        raise ValueError(f"axolotl config {label}: axolotl refuses it: {said[:800]}") from None
    return cfg, body


def quantization_config(cfg):
    """The ``BitsAndBytesConfig`` axolotl's ``ModelLoader._set_quantization_config`` gives ``from_pretrained`` for
    the file (``adapter: qlora`` + ``load_in_4bit``: nf4, double quantization, storage ``bfloat16``; ``load_in_8bit``
    with ``lora``; a ``quantization_config`` in the model's config.json), None when it quantizes nothing or with a
    method shardviz does not build (GPTQ, AWQ, ...: SV315 says so)."""
    if not (cfg.load_in_4bit or cfg.load_in_8bit or cfg.adapter == "qlora"):
        return None
    from axolotl.loaders.model import ModelLoader

    loader = ModelLoader(cfg, tokenizer=None)
    loader._set_quantization_config()
    config = loader.model_kwargs.get("quantization_config")
    return config if getattr(config, "load_in_4bit", False) or getattr(config, "load_in_8bit", False) else None


def quantization_said(model: nn.Module) -> str:
    """How the base was quantized, as bitsandbytes holds it: the weights converted, their kind and storage."""
    weights = [p for p in model.parameters() if quant_kind(p)]
    kinds = sorted({quant_kind(p) for p in weights})
    state = getattr(weights[0], "quant_state", None)
    nested = " double-quantized" if getattr(state, "nested", False) else ""
    return f"{len(weights)} linears {'/'.join(kinds)}{nested}, stored as {str(weights[0].dtype).removeprefix('torch.')}"


def build_model(cfg):
    """The base model on meta in the config's dtype (axolotl's ``load_model_config``), with axolotl's adapter."""
    import torch
    from axolotl.loaders.utils import load_model_config
    from transformers import AutoModelForCausalLM

    config = load_model_config(cfg)
    dtype = cfg.torch_dtype or torch.bfloat16
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    quantization = quantization_config(cfg)
    if quantization is not None:  # from_pretrained(quantization_config=...) quantizes the bf16 checkpoint as it loads
        from ..model.quant import quantize_on_meta

        quantize_on_meta(model, quantization, pre_quantized=False, dtype=dtype)
    if cfg.adapter in ("lora", "qlora"):
        from axolotl.loaders.adapter import load_lora

        model, _ = load_lora(model, cfg)
    return model


def axolotl_prepare(model: nn.Module, env: dict) -> nn.Module:
    """``Accelerator._prepare_fsdp2``'s steps with axolotl's ``fsdp2_prepare_model`` (``patch_accelerate_fsdp2``)."""
    from accelerate.utils import fsdp_utils
    from axolotl.monkeypatch.accelerate import fsdp2 as ax

    from . import accelerate_prepare

    saved = fsdp_utils.fsdp2_prepare_model, ax.fsdp2_load_full_state_dict
    fsdp_utils.fsdp2_prepare_model = ax.fsdp2_prepare_model
    ax.fsdp2_load_full_state_dict = lambda *args, **kwargs: None  # weights: a meta copy has none
    try:
        return accelerate_prepare(model, env)
    finally:
        fsdp_utils.fsdp2_prepare_model, ax.fsdp2_load_full_state_dict = saved


def fsdp_env(cfg) -> dict:
    """The environment axolotl's ``setup_fsdp_envs`` exports, plus the mixed precision its Trainer gives accelerate."""
    from axolotl.utils.trainer import setup_fsdp_envs

    saved = dict(os.environ)
    try:
        setup_fsdp_envs(cfg)
        env = {k: v for k, v in os.environ.items() if saved.get(k) != v}
    finally:
        os.environ.clear()
        os.environ.update(saved)
    env["ACCELERATE_MIXED_PRECISION"] = "bf16" if cfg.bf16 else "fp16" if cfg.fp16 else "no"
    return env


def _training(cfg, label: str):
    from ..run.training import DEFAULT_TRAINING

    origins = {"batch_size": f"micro_batch_size={cfg.micro_batch_size} ({label})",
               "grad_accum": f"gradient_accumulation_steps={cfg.gradient_accumulation_steps} ({label})",
               "seq_len": f"sequence_len={cfg.sequence_len} ({label}; sample_packing={bool(cfg.sample_packing)})"}
    dtype = "bfloat16" if cfg.bf16 else "float16" if cfg.fp16 else None
    origins["precision"] = f"bf16={cfg.bf16} fp16={cfg.fp16} torch_dtype={cfg.torch_dtype} ({label})"
    optimizer = str(cfg.optimizer or "adamw_torch")
    fused = "fused" in optimizer
    origins["optimizer"] = f"optimizer={optimizer} -> adamw{' (fused)' if fused else ''}"
    training = replace(DEFAULT_TRAINING, batch_size=int(cfg.micro_batch_size or 1), seq_len=int(cfg.sequence_len or 2048),
                       grad_accum=int(cfg.gradient_accumulation_steps or 1), param_dtype=dtype,
                       reduce_dtype=DEFAULT_TRAINING.reduce_dtype if dtype else None, fused=fused,
                       offload=bool((cfg.fsdp_config or {}).get("offload_params")))
    return training, origins


def _findings(cfg, plan: Plan, release: str, quantized: int) -> list[Finding]:
    """What axolotl's own code did that the numbers do not say, in its keys (SV312, SV315)."""
    found = []
    lora_units = [u for u in plan.units if any(".lora_A." in m or ".lora_B." in m for m in u.modules)]
    if lora_units:
        names = tuple(u.name for u in lora_units)
        found.append(Finding(
            "SV312", "info", f"axolotl {release}'s fsdp2_prepare_model gives every LoRA lora_A / lora_B its own "
            f"fully_shard call: {len(lora_units)} of the {len(plan.units)} calls (accelerate's gives none), each with "
            "its own all-gather and reduce-scatter per micro-batch", names[:3],
            fix="no axolotl key turns them off (it shards each LoraLayer's adapters whenever fsdp_config."
                "auto_wrap_policy is set); fewer lora_target_modules make fewer calls", n_fqns=len(names), all_fqns=names))
    if cfg.sample_packing:
        found.append(Finding("SV315", "info", "sample_packing=True: one sequence_len row of packed samples; the "
                             "packed attention mask is not priced (the step is measured causal)"))
    if (cfg.load_in_4bit or cfg.load_in_8bit) and not quantized:
        found.append(Finding("SV315", "warning", f"load_in_{'4' if cfg.load_in_4bit else '8'}bit: the model priced "
                             "has no quantized weights (the MODEL given, or a quantization shardviz does not build): "
                             "its base is priced unquantized", fix="give no MODEL, so base_model is loaded as axolotl "
                             "loads it (or add --load-in-4bit / --load-in-8bit)"))
    return found


def _with_checkpointing(plan: Plan, model: nn.Module, cfg, body: dict, label: str) -> tuple[Plan, list]:
    """``gradient_checkpointing: true``: Hugging Face's in-forward checkpointing, as axolotl enables it (SV310)."""
    from .hf_checkpointing import priced_in_forward

    if not cfg.gradient_checkpointing:
        return plan, []
    given = "use_reentrant" in (body.get("gradient_checkpointing_kwargs") or {})
    whose = (f"gradient_checkpointing_kwargs ({label})" if given else
             "axolotl's normalize_config: the file sets no gradient_checkpointing_kwargs")
    plan, finding = priced_in_forward(plan, model, dict(cfg.gradient_checkpointing_kwargs or {}),
                                      f"gradient_checkpointing=True ({label}); use_reentrant: {whose}",
                                      "gradient_checkpointing_kwargs")
    return plan, [finding]


def from_axolotl(path, model: nn.Module | None = None, world_size: int | None = None, mesh=None) -> FrameworkSetup:
    """``sv.from_axolotl``: see the module docstring. ``model`` given: it wins over ``base_model``."""
    release = axolotl_release()
    mesh = as_mesh(world_size, mesh)
    label = os.path.basename(os.fspath(path))
    cfg, body = read_config(path, mesh.world)
    if not cfg.fsdp_config or str(cfg.fsdp_version or (cfg.fsdp_config or {}).get("fsdp_version")) != "2":
        raise ValueError(f"axolotl config {label}: no fsdp_config with fsdp_version: 2 (shardviz models FSDP2)")
    origins = {"model": "the MODEL given (over base_model)" if model is not None else
               f"base_model={cfg.base_model}, adapter={cfg.adapter} r={cfg.lora_r} alpha={cfg.lora_alpha} "
               f"targets={cfg.lora_target_modules} (axolotl's load_lora)"}
    if model is None:
        model = build_model(cfg)
    quantized = sum(1 for p in model.parameters() if quant_kind(p))
    if quantized:
        origins["model"] += f"; {quantization_said(model)} (axolotl's ModelLoader quantization_config)"
    env = fsdp_env(cfg)
    import accelerate

    cap = run_captured(axolotl_prepare, model, (env,), mesh=mesh, fn_name=f"axolotl {release}")
    plan = cap.plan(Origin("axolotl", label, f"axolotl {release}, accelerate {accelerate.__version__}"))
    if cap.error is not None:
        raise ValueError(f"axolotl config {label}: axolotl's FSDP2 preparation raised: {cap.error.message}")
    from ..checks.origin_checks import capture_findings

    found = capture_findings(model, plan, env, cap.cast)  # SV303, SV305; SV306 only where axolotl's casts
    plan, checkpointing = _with_checkpointing(plan, model, cfg, body, label)
    training, more = _training(cfg, label)
    origins |= more
    origins["plan"] = f"fsdp_config of {label} through axolotl {release}'s fsdp2_prepare_model"
    found += checkpointing + _findings(cfg, plan, release, quantized)
    return FrameworkSetup("axolotl", model, with_findings(plan, found), mesh, training, origins, cfg)


#: the accelerate keys that decide the calls; the block's others (state_dict_type, ...) stay the user's
CALL_KEYS = ("fsdp_version", "fsdp_auto_wrap_policy", "fsdp_transformer_layer_cls_to_wrap", "fsdp_offload_params",
             "fsdp_reshard_after_forward", "fsdp_activation_checkpointing")


def axolotl_block(config: dict, given: dict | None = None) -> dict:
    """axolotl's ``fsdp_config`` block (its ``FSDPConfig`` keys: accelerate's without the ``fsdp_`` prefix) saying
    what the accelerate config ``config`` (``frameworks.accelerate_config``) says of the calls, over the
    block ``given`` (the user's; its other keys kept)."""
    name = lambda k: k if k == "fsdp_version" else k.removeprefix("fsdp_")  # noqa: E731
    said = {name(k): v for k, v in config["fsdp_config"].items() if k in CALL_KEYS}
    kept = {k: v for k, v in (given or {}).items() if name(k if k.startswith("fsdp_") else "fsdp_" + k) not in said}
    return {**said, **kept}


def _lora_lines(cannot: list[str]) -> list[str]:
    """``plan_differences``' lines, those about axolotl's own calls on lora_A / lora_B said once (SV312)."""
    lora = [c for c in cannot if c.startswith("no call on ") and (".lora_A." in c or ".lora_B." in c)]
    rest = [c for c in cannot if c not in lora]
    if lora:
        rest.insert(0, f"no call on the {len(lora)} lora_A / lora_B modules: axolotl makes one on each (SV312), and "
                       "no key turns them off")
    return rest


def to_axolotl(path, plan: Plan, model: nn.Module | None = None, world_size: int = 8) -> tuple[str, list[str]]:
    """(YAML, what it cannot say): the axolotl YAML at ``path`` with its ``fsdp_config`` block's keys that decide
    the calls set to say ``plan`` (every layer checkpointed: the file's ``gradient_checkpointing: true`` where it
    has it, else the block's ``activation_checkpointing``).
    Checked by reading it back with ``from_axolotl`` (axolotl's validated config and its own
    ``fsdp2_prepare_model``) and comparing the calls; an empty list: axolotl makes exactly ``plan``."""
    import tempfile

    import yaml

    from . import accelerate_config, plan_differences
    from ..model.tree import as_tree

    label = os.path.basename(os.fspath(path))
    cfg, body = read_config(path, world_size)
    built = model if model is not None else build_model(cfg)
    block = axolotl_block(accelerate_config(as_tree(built), plan), body.get("fsdp_config"))
    out = {**body, "fsdp_config": block}
    out.pop("fsdp_version", None)  # the block says it
    if block["activation_checkpointing"] and body.get("gradient_checkpointing"):
        block["activation_checkpointing"] = False  # as the file says it: HF's in-forward checkpointing of every layer
    elif body.get("gradient_checkpointing"):
        out["gradient_checkpointing"] = False  # the plan checkpoints no layer (or not every one: said below)
    text = yaml.safe_dump(out, sort_keys=False)
    with tempfile.TemporaryDirectory() as tmp:
        exported = os.path.join(tmp, label)
        with open(exported, "w", encoding="utf-8") as f:
            f.write(text)
        setup = from_axolotl(exported, built, world_size=world_size)
    cannot = _lora_lines(plan_differences(plan, setup.plan, "axolotl"))
    head = [f"# {label} with the fsdp_config block for the plan {plan.name or '(unnamed)'}; checked with "
            f"{setup.plan.origin.release}: " + ("it makes exactly these fully_shard calls." if not cannot else
                                                "it cannot say:")]
    return "\n".join(head + [f"#  - {line}" for line in cannot]) + "\n" + text, cannot
