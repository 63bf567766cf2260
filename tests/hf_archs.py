"""Hugging Face architectures built on the meta device from their default configs, made small.

``build(model_type, lora=False)`` returns ``(model, note)`` or raises ``Unbuildable`` with the reason
transformers gave. Nothing is downloaded: the config class's defaults are the starting point, the
layer counts are cut down (keeping every layer kind of a hybrid layer list), and the model is built
under ``torch.device("meta")`` through the first of the ``AutoModelFor...`` mappings that knows the
type. Used by ``tests/test_hf_archs.py``.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings

import torch
from torch import nn

#: Attributes that count layers, in the configs of transformers 5.
LAYER_KEYS = (
    "num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers", "decoder_layers",
    "num_decoder_layers", "num_encoder_layers",
)
#: How many layers a plain (not hybrid) stack keeps: two, so the block list is still a list.
MIN_LAYERS = 2
#: The most layers a hybrid stack keeps (its layer-kind list may need more to show every kind).
MAX_LAYERS = 8


class Unbuildable(Exception):
    """transformers itself cannot build this type offline from its default config."""


def _sub_configs(cfg):
    from transformers import PretrainedConfig

    for value in list(vars(cfg).values()):
        if isinstance(value, PretrainedConfig):
            yield value


def _shrink(cfg, seen=None) -> None:
    """Cut the layer counts of ``cfg`` and its sub-configs, keeping every kind of a layer-kind list."""
    seen = seen if seen is not None else set()
    if id(cfg) in seen:
        return
    seen.add(id(cfg))
    for key in LAYER_KEYS:
        n = getattr(cfg, key, None)
        if not isinstance(n, int) or isinstance(n, bool) or n <= MIN_LAYERS:
            continue
        # A per-layer list of kinds (layer_types, ...) of length n: keep the shortest prefix that still
        # holds every kind, so a hybrid stack stays hybrid. A list of layer indices (Mllama's
        # cross_attention_layers, full_attn_idxs, ...): keep up to the first listed layer and one more.
        keep = MIN_LAYERS
        kinds, indices = [], []
        for k, v in vars(cfg).items():
            if k == key or not isinstance(v, (list, tuple)) or not v:
                continue
            if all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < n for x in v) and any(
                    w in k for w in ("layer", "idx", "ids", "indices")):
                indices.append((k, v))
                keep = max(keep, min(v) + 2)
            elif len(v) == n and all(isinstance(x, (str, bool)) for x in v):
                kinds.append((k, v))
                vals = [str(x) for x in v]
                keep = max(keep, max(vals.index(x) for x in set(vals)) + 1)
        if any(w in k for k in vars(cfg) for w in ("period", "offset", "every", "interval", "frequency", "ratio")):
            keep = max(keep, MAX_LAYERS)  # a hybrid pattern given by a period: keep a few periods' worth
        keep = min(keep, n)
        try:
            setattr(cfg, key, keep)
            for name, values in kinds:
                setattr(cfg, name, type(values)(values[:keep]))
            for name, values in indices:
                setattr(cfg, name, type(values)(x for x in values if x < keep))
        except Exception:  # noqa: BLE001 - a validating config refuses (Funnel): keep its default
            with contextlib.suppress(Exception):
                setattr(cfg, key, n)
            for name, values in kinds + indices:
                with contextlib.suppress(Exception):
                    setattr(cfg, name, values)
    for sub in _sub_configs(cfg):
        _shrink(sub, seen)


def model_class(model_type: str):
    """The first of the AutoModelFor... mappings (causal LM, seq2seq, base model) that knows the type."""
    from transformers.models.auto import modeling_auto as ma

    for mapping in ("MODEL_FOR_CAUSAL_LM_MAPPING", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING", "MODEL_MAPPING"):
        names = getattr(ma, mapping + "_NAMES")
        if model_type in names:
            return getattr(ma, mapping), mapping
    return None, None


def candidate_types() -> list[str]:
    """Every model type of ``CONFIG_MAPPING`` that one of the auto model mappings can build."""
    from transformers import CONFIG_MAPPING

    return [t for t in CONFIG_MAPPING.keys() if model_class(t)[0] is not None]


@contextlib.contextmanager
def _quiet():
    logger = logging.getLogger("transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def build(model_type: str, lora: bool = False) -> nn.Module:
    """The model of ``model_type`` on meta (LoRA on every linear layer with ``lora``)."""
    from transformers import CONFIG_MAPPING

    mapping, _ = model_class(model_type)
    if mapping is None:
        raise Unbuildable("no AutoModel mapping")
    with _quiet():
        try:
            cfg = CONFIG_MAPPING[model_type]()
            _shrink(cfg)
            cls = mapping[type(cfg)]
            if isinstance(cls, (list, tuple)):
                cls = cls[0]
            with torch.device("meta"):
                model = cls._from_config(cfg)
        except Exception as exc:  # noqa: BLE001 - transformers cannot build it offline: recorded, skipped
            raise Unbuildable(f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}") from None
        if not any(True for _ in model.parameters()):
            raise Unbuildable("no parameters")
        if lora:
            model = add_lora(model)
    return model


def add_lora(model: nn.Module) -> nn.Module:
    """peft LoRA on every linear layer; when peft refuses "all-linear", on every nn.Linear by name."""
    from peft import LoraConfig, get_peft_model

    with _quiet():
        return _add_lora(model, LoraConfig, get_peft_model)


def _add_lora(model, LoraConfig, get_peft_model):
    try:
        return get_peft_model(model, LoraConfig(r=4, target_modules="all-linear"))
    except Exception:  # noqa: BLE001 - peft refuses all-linear on some models (no linear outside the head, ...)
        names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear) and n})
        if not names:
            raise Unbuildable("no nn.Linear for LoRA") from None
        try:
            return get_peft_model(model, LoraConfig(r=4, target_modules=names))
        except Exception as exc:  # noqa: BLE001
            raise Unbuildable(f"peft refuses: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}") from None


#: Named in issue 9: the architectures that got no usable plan before (hybrid layer lists, one
#: shared layer group, 0-dim parameters, a ModuleList of ModuleLists), always in the sample.
ISSUE_TYPES = (
    "albert", "blip", "blt", "clap", "clip", "fsmt", "funnel", "jamba", "mllama", "olmo_hybrid",
    "owlvit", "wavlm", "zamba", "zamba2",
)


def sample_types(n: int) -> list[str]:
    """The issue's types plus an even stride over ``candidate_types()``: ``n`` types, deterministic."""
    every = candidate_types()
    chosen = [t for t in ISSUE_TYPES if t in every]
    rest = [t for t in every if t not in chosen]
    want = max(0, n - len(chosen))
    step = max(1, len(rest) / want) if want else len(rest) + 1
    chosen += [rest[int(i * step)] for i in range(want) if int(i * step) < len(rest)]
    return chosen


def check(model: nn.Module, mesh, ranks) -> list[str]:
    """What goes wrong for a new user: Plan.auto, strict analyze, verify, export compiles."""
    import shardviz as sv

    problems = []
    tree = sv.ModelTree(model)
    try:
        plan = sv.Plan.auto(tree)
        sv.analyze(tree, plan, mesh)  # strict: raises PlanError on anything torch refuses
    except Exception as exc:  # noqa: BLE001 - recorded for the report
        return [f"auto/analyze: {type(exc).__name__}: {str(exc)[:300]}"]
    diff = sv.verify(model, plan, mesh=mesh, ranks=ranks)
    if not diff.empty:
        problems.append(f"verify: {len(diff)} disagreements, e.g. {diff.head(3).to_dict('records')}")
    try:
        code = sv.export_code(model, plan, mesh=mesh)
        compile(code, "<export>", "exec")
    except Exception as exc:  # noqa: BLE001
        problems.append(f"export: {type(exc).__name__}: {str(exc)[:300]}")
    return problems
