"""Hugging Face's in-forward activation checkpointing (``model.activation_checkpointing_enable`` /
``gradient_checkpointing_enable``, ``TrainingArguments(activation_checkpointing=True)`` /
``gradient_checkpointing=True``, axolotl's ``gradient_checkpointing: true``), priced as what it is.

It is no wrapper: transformers' ``GradientCheckpointingLayer`` (every decoder layer of its models)
replaces the layer's ``forward`` by one that runs it through ``self._gradient_checkpointing_func``
(``torch.utils.checkpoint.checkpoint`` with the ``use_reentrant`` given, non-reentrant by default),
with FSDP2's hooks left outside. What torch saves is then what a ``checkpoint_wrapper`` around each
such layer saves: the layer's inputs, its forward recomputed in backward. So the plan is priced with
those layers checkpointed ("full"), and which layers they are is read by running the model's own
enable function on a meta copy (``every_n_layers`` included) and reading back which layers it switched
on. ``tests/test_hf_checkpointing.py`` holds the peak against torch's, with the real in-forward
checkpointing, under ``FSDPMemTracker``.
"""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from ..finding import Finding
from ..plan import Plan


def in_forward_checkpointed(model: nn.Module, kwargs: dict | None = None, every_n_layers: int = 1,
                            offload: bool = False) -> tuple[str, ...]:
    """The modules whose ``forward`` the model's own ``activation_checkpointing_enable`` (transformers 5;
    ``gradient_checkpointing_enable`` before) checkpoints, run on a meta copy: the user's model is left as
    it is. ``kwargs``: ``activation_checkpointing_kwargs`` / ``gradient_checkpointing_kwargs``
    (``use_reentrant``)."""
    return switched_on(model, kwargs, every_n_layers, offload)[0]


def switched_on(model: nn.Module, kwargs: dict | None = None, every_n_layers: int = 1,
                offload: bool = False) -> tuple[tuple[str, ...], object]:
    """(the layers ``in_forward_checkpointed`` names, the ``use_reentrant`` their checkpoint function was
    given by the model's own enable: read back from the partial it set on them)."""
    import inspect

    from ..export.oracle import meta_copy

    copy_ = meta_copy(model)
    kwargs = dict(kwargs or {})
    enable = getattr(copy_, "activation_checkpointing_enable", None)
    key = "activation_checkpointing_kwargs"
    if enable is None:
        enable, key = getattr(copy_, "gradient_checkpointing_enable", None), "gradient_checkpointing_kwargs"
    if enable is None:
        raise ValueError(f"gradient_checkpointing: {type(model).__name__} has no activation_checkpointing_enable / "
                         "gradient_checkpointing_enable (not a transformers model): checkpoint its blocks in the "
                         "plan instead (Plan(checkpoint=[...]))")
    extra = {k: v for k, v in (("every_n_layers", every_n_layers), ("offload", offload))
             if k in inspect.signature(enable).parameters}
    enable(**{key: kwargs or None}, **extra)
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer as layer_class
    except ImportError:  # transformers < 4.52: the layers are plain modules with the same two attributes
        layer_class = nn.Module
    names = tuple(n for n, m in copy_.named_modules() if isinstance(m, layer_class)
                  and getattr(m, "gradient_checkpointing", False) is True
                  and callable(getattr(m, "_gradient_checkpointing_func", None)))
    if not names:
        raise ValueError(f"gradient_checkpointing: {type(model).__name__}'s own enable switched no layer on "
                         "(no GradientCheckpointingLayer): nothing is checkpointed")
    func = getattr(copy_.get_submodule(names[0]), "_gradient_checkpointing_func", None)  # transformers sets it
    reentrant = getattr(func, "keywords", {}).get("use_reentrant")
    return tuple(n for n in names if not any(n.startswith(o + ".") for o in names if o != n)), reentrant


def priced_in_forward(plan: Plan, model: nn.Module, kwargs: dict | None, where: str, key: str,
                      every_n_layers: int = 1, offload: bool = False) -> tuple[Plan, Finding]:
    """(``plan`` priced with the layers the model's own enable checkpoints, SV310): the finding says which
    ``use_reentrant`` that enable gave them (``where``: whose value it is), in the framework's ``key``."""
    names, reentrant = switched_on(model, kwargs, every_n_layers, offload)
    cls = type(model.get_submodule(names[0])).__name__
    said = (f"Hugging Face's checkpointing inside the forward of {len(names)} {cls} layers, use_reentrant="
            f"{reentrant} ({where}), priced as those layers checkpointed (torch's peak is the same either way: "
            "tests/test_hf_checkpointing.py)")
    if reentrant is False:
        return priced_with(plan, names), Finding("SV310", "info", said, names[:3], n_fqns=len(names), all_fqns=names)
    said += ("; torch recommends use_reentrant=False: the reentrant variant always recomputes the whole layer in "
             "backward and gives no gradients unless an input requires grad (transformers turns on "
             "enable_input_require_grads for it)")
    fix = f"set {key}: {{use_reentrant: false}}"
    return priced_with(plan, names), Finding("SV310", "warning", said, names[:3], fix=fix, n_fqns=len(names),
                                             all_fqns=names)


def priced_with(plan: Plan, modules) -> Plan:
    """``plan`` with ``modules`` checkpointed (full), beside what it already checkpoints."""
    current = dict(plan.checkpoint.items())
    for name in modules:
        current.setdefault(name, "full")
    return replace(plan, checkpoint=current)
