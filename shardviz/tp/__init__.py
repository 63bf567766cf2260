"""The tensor-parallel rules, next to fsdp.py's: what a ``Plan.tensor_parallel`` style does to each parameter.

A plan maps module FQNs (``*`` matching one name segment, e.g. ``model.layers.*.mlp.up_proj``) or
parameter FQNs to a style: torch's ``parallelize_module`` classes or the names transformers'
``ALL_PARALLEL_STYLES`` registers (5.24, ``transformers/distributed/tensor_parallel.py``). What each
style does to the parameters of the module it names, as the sources do it:

- torch ``ColwiseParallel`` (``_partition_linear_fn`` / ``_partition_embedding_fn``): a Linear's
  weight and bias ``Shard(0)``, an Embedding's weight ``Shard(1)``; other modules: NotImplementedError.
- torch ``RowwiseParallel``: a Linear's weight ``Shard(1)``, bias ``Replicate()``; an Embedding's
  weight ``Shard(0)``.
- torch ``SequenceParallel``: every parameter under the module ``Replicate()``;
  ``PrepareModuleInput`` / ``PrepareModuleOutput``: none (they only move activations).
- transformers ``colwise`` (and ``colwise_gather_output``, ``colwise_rep``): each of the module's
  own parameters ``Shard(ndim - 2)`` (a bias: its only dim); ``rowwise`` (``rowwise_rep``,
  ``rowwise_split_input``): ``Shard(-1)``, a bias ``Replicate()``; ``embedding_rowwise`` /
  ``embedding_colwise``: ``Shard(0)`` / ``Shard(1)``; ``packed_colwise``: ``_StridedShard(ndim - 2,
  split_factor=2)`` (1-D: ``Shard(-1)``); ``packed_rowwise``: ``_StridedShard(-1, 2)`` (1-D:
  ``Replicate()``); ``sequence_parallel``: ``Replicate()``; the rest (``moe_tp_experts``,
  ``replicated_with_grad_allreduce``, ``all_reduce``, ...): the parameters stay plain tensors.

FSDP2 then shards the TP-local tensor on dim 0 over the data-parallel ranks (``FSDPParam``: a
DTensor's ``_local_tensor``), so every rank holds ``chunk(chunk(p, T, tp_dim)[t], S, 0)[s]``: the
engine runs the FSDP rules on the *TP-local tree* (``local_tree``). Placements: FSDP's
``_StridedShard(0, sf=T)`` over TP's ``Shard(0)``, else ``Shard(0)``, then the TP placement.
"""

from __future__ import annotations

import copy
import difflib
import functools
import math
import re
import threading
import weakref
from dataclasses import dataclass, replace

from torch import nn

from ..model.copying import copy_modules
from ..model.tree import ModelTree, model_name

MESH_DIM_NAMES = ("dp_replicate", "dp_shard", "tp")
LAYOUT_RE = re.compile(r"^(Replicate\(\)|Shard\((-?\d+)\))$")
TORCH_STYLES = ("ColwiseParallel", "RowwiseParallel", "SequenceParallel", "PrepareModuleInput", "PrepareModuleOutput")
# transformers 5.24 ALL_PARALLEL_STYLES -> (how it shards a parameter, the attribute its forward needs)
HF_STYLES = {
    "colwise": ("colwise", "out_features"), "colwise_gather_output": ("colwise", "out_features"),
    "colwise_rep": ("colwise", "out_features"), "rowwise": ("rowwise", "in_features"),
    "rowwise_split_input": ("rowwise", "in_features"), "rowwise_rep": ("rowwise", "in_features"),
    "embedding_rowwise": ("shard0", None), "embedding_colwise": ("shard1", None),
    "packed_colwise": ("packed_colwise", None), "packed_rowwise": ("packed_rowwise", None),
    "sequence_parallel": ("replicate", None), "replicated_with_grad_allreduce": (None, None),
    "mla_kv_a_proj": (None, None), "all_reduce": (None, None), "moe_tp_experts": (None, None),
    "moe_identity_expert": (None, None), "local_params": (None, None), "replicate": (None, None),
}
STYLE_FIELDS = ("style", "input_layouts", "output_layouts", "use_local_output", "desired_input_layouts",
                "desired_output_layouts", "sequence_dim")
#: a torch style's layout options, in the order its constructor call is written
LAYOUT_FIELDS = ("input_layouts", "output_layouts", "desired_input_layouts", "desired_output_layouts")


def _layout(value, where: str) -> str | None:
    if value is None:
        return None
    if type(value).__name__ in ("Replicate", "Shard"):
        value = "Replicate()" if type(value).__name__ == "Replicate" else f"Shard({value.dim})"
    if not isinstance(value, str) or not LAYOUT_RE.match(value.replace(" ", "").replace("dim=", "")):
        raise ValueError(f"{where}: layout {value!r} is not 'Replicate()' or 'Shard(d)'")
    return value.replace(" ", "").replace("dim=", "")


@dataclass(frozen=True)
class TPStyle:
    """One style: a torch class name (with its options, layouts as "Shard(1)" / "Replicate()") or
    a transformers style name (no options)."""

    style: str
    input_layouts: str | None = None
    output_layouts: str | None = None
    use_local_output: bool | None = None
    desired_input_layouts: str | None = None
    desired_output_layouts: str | None = None
    sequence_dim: int | None = None

    @property
    def is_torch(self) -> bool:
        return self.style in TORCH_STYLES

    def _given(self, keys) -> dict:
        """The options among ``keys`` that are set, in that order."""
        return {k: value for k in keys if (value := getattr(self, k)) is not None}

    def torch_kwargs(self) -> dict:
        """The options given, as torch's style constructor takes them (layouts as text; the layouts
        first): what the exported code writes and the oracle builds."""
        return self._given(LAYOUT_FIELDS + ("use_local_output", "sequence_dim"))

    def to_obj(self):
        options = self._given(STYLE_FIELDS[1:])
        return {"style": self.style, **options} if options else self.style

    @classmethod
    def from_obj(cls, obj, where: str) -> "TPStyle":
        if isinstance(obj, TPStyle):
            return obj
        if not isinstance(obj, (str, dict)):
            obj = _torch_style_obj(obj, where)
        if isinstance(obj, str):
            obj = {"style": obj}
        unknown = set(obj) - set(STYLE_FIELDS)
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {sorted(unknown)}; a style takes {list(STYLE_FIELDS)}")
        style = obj.get("style")
        if style not in TORCH_STYLES and style not in HF_STYLES:
            raise ValueError(f"{where}: unknown tensor-parallel style {style!r}; torch's are {list(TORCH_STYLES)}, "
                             f"transformers' {list(HF_STYLES)}.{_closest(str(style), TORCH_STYLES + tuple(HF_STYLES))}")
        if style in HF_STYLES and len(obj) > 1:
            raise ValueError(f"{where}: transformers style {style!r} takes no options (it is one registered object)")
        layouts = {k: _layout(obj.get(k), f"{where}.{k}") for k in LAYOUT_FIELDS}
        local = obj.get("use_local_output")
        if local is not None and not isinstance(local, bool):
            raise ValueError(f"{where}.use_local_output must be a bool, got {local!r}")
        return cls(style, use_local_output=local, sequence_dim=obj.get("sequence_dim"), **layouts)


def _torch_style_obj(obj, where: str) -> dict:
    """A torch ParallelStyle instance -> its fields (what the plan stores)."""
    name = type(obj).__name__
    if name not in TORCH_STYLES:
        raise ValueError(f"{where}: expected a style name, a mapping or one of torch's {list(TORCH_STYLES)}, got {obj!r}")
    out = {"style": name}
    for key in STYLE_FIELDS[1:]:
        value = getattr(obj, key, None)
        if isinstance(value, (tuple, list)):
            if len(value) != 1:
                raise ValueError(f"{where}.{key}: one layout per style is supported, got {value!r}")
            value = value[0]
        if value is not None:
            out[key] = _layout(value, f"{where}.{key}") if key in LAYOUT_FIELDS else value
    return out


class TensorParallel(tuple):
    """A plan's tensor-parallel entries: (name or pattern, TPStyle) pairs, read like a dict."""

    def __new__(cls, entries=()):
        if isinstance(entries, TensorParallel):
            return entries
        pairs = entries.items() if hasattr(entries, "items") else entries
        merged: dict[str, TPStyle] = {}
        for name, style in pairs:
            if not isinstance(name, str):
                raise ValueError(f"tensor_parallel keys must be module or parameter FQNs (str), got {name!r}")
            merged[name] = TPStyle.from_obj(style, f"tensor_parallel[{name!r}]")
        return super().__new__(cls, tuple(merged.items()))

    def items(self):
        return list(tuple.__iter__(self))

    def keys(self):
        return [k for k, _ in self.items()]

    def __getitem__(self, key):
        if isinstance(key, str):
            return dict(self.items())[key]
        return tuple.__getitem__(self, key)

    def __contains__(self, key):
        return key in self.keys()

    def to_obj(self) -> dict:
        return {k: s.to_obj() for k, s in self.items()}

    def __reduce__(self):
        return (TensorParallel, (self.to_obj(),))


# ---------------------------------------------------------------------------
# Matching names
# ---------------------------------------------------------------------------
def _closest(name: str, candidates) -> str:
    matches = difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.5)
    return f" Closest: {', '.join(repr(m) for m in matches)}." if matches else ""


@functools.lru_cache(maxsize=4096)
def key_pattern(key: str) -> re.Pattern:
    """A tensor-parallel key (a module FQN, ``*`` for one name part: ``layers.*.mlp``) as a regex (made
    once per key: a TP edit at 70B asks for the same few keys about 2,800 times)."""
    return re.compile("^" + r"\.".join("[^.]+" if part == "*" else re.escape(part) for part in key.split(".")) + "$")


#: per tree, what a TP edit looked up again and again (1.6 s at 70B): "parts", its module and parameter
#: names by number of parts (a key of k parts names only names of k parts: 486k regex matches); "modules",
#: its live modules by name (``get_submodule`` walks from the root); (TP plan, degree): its local tree
_PER_TREE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_TREE_LOCK = threading.Lock()  # not _LOCAL_LOCK: that one is held while a local model is made


def _per_tree(tree: ModelTree, key, make=None):
    """``tree``'s cached value for ``key``, made by ``make()`` (under the lock: quick makers only) if missing."""
    with _TREE_LOCK:
        cache = _PER_TREE.setdefault(tree, {})
        if key not in cache and make is not None:
            cache[key] = make()
        return cache.get(key)


def _by_parts(names: dict[str, int]) -> dict[int, list[tuple[str, int]]]:
    out: dict[int, list[tuple[str, int]]] = {}
    for fqn, i in names.items():
        out.setdefault(fqn.count(".") + 1 if fqn else 0, []).append((fqn, i))
    return out


def resolve(tree: ModelTree, tp: TensorParallel) -> tuple[dict[int, tuple[str, TPStyle]], dict[int, tuple[str, TPStyle]]]:
    """{module index: (fqn, style)} and {parameter index: (fqn, style)} the entries name, the later
    entry winning; ValueError for an entry that matches nothing (with the closest names)."""
    modules: dict[int, tuple[str, TPStyle]] = {}
    params: dict[int, tuple[str, TPStyle]] = {}
    for key, style in tp.items():
        pattern, hits, parts = key_pattern(key), 0, key.count(".") + 1 if key else 0
        names = _per_tree(tree, "parts", lambda: (_by_parts(tree.module_index), _by_parts(tree.param_index)))
        module_names, param_names = names[0].get(parts, []), names[1].get(parts, [])
        for fqn, m in module_names:
            if pattern.match(fqn):
                modules[m], hits = (fqn, style), hits + 1
        for fqn, p in param_names:
            if pattern.match(fqn):
                if style.is_torch:
                    raise ValueError(f"tensor_parallel[{key!r}] names a parameter; torch's parallelize_module "
                                     f"takes modules (did you mean {fqn.rpartition('.')[0]!r}?)")
                params[p], hits = (fqn, style), hits + 1
        if not hits:
            generic = sorted({re.sub(r"\.\d+(\.|$)", r".*\1", n) for n in tree.module_index})
            raise ValueError(f"tensor_parallel[{key!r}] matches no module or parameter of {tree.root_type}."
                             f"{_closest(key, generic)}")
    return modules, params


# ---------------------------------------------------------------------------
# What a style does to one parameter
# ---------------------------------------------------------------------------
def _torch_placement(style: TPStyle, type_name: str, local: str, fqn: str, module=None) -> tuple:
    if style.style in ("PrepareModuleInput", "PrepareModuleOutput"):
        return ()
    if style.style == "SequenceParallel":
        return ("Replicate",)
    kind = "Linear" if type_name == "Linear" else "Embedding" if type_name == "Embedding" else None
    if kind is None or (module is not None and not isinstance(module, (nn.Linear, nn.Embedding))):
        raise ValueError(f"tensor_parallel: {style.style} on {fqn!r} ({type(module).__module__.split('.')[0] + '.' if module is not None else ''}"
                         f"{type_name}): torch's parallelize_module raises NotImplementedError, it only shards nn.Linear "
                         "and nn.Embedding; use SequenceParallel for a norm, name the Linear/Embedding modules inside "
                         "it, or for a peft LoRA layer let Plan.auto(model, tensor_parallel=...) derive base_layer/lora_A/lora_B")
    colwise = style.style == "ColwiseParallel"
    if kind == "Embedding":
        return ("Shard", 1 if colwise else 0)
    if colwise:
        return ("Shard", 0)
    return ("Shard", 1) if local == "weight" else ("Replicate",)


def _hf_placement(style: TPStyle, local: str, ndim: int) -> tuple:
    how = HF_STYLES[style.style][0]
    if how is None:
        return ()
    if how == "replicate" or (how == "packed_rowwise" and ndim == 1) or (how == "rowwise" and local == "bias"):
        return ("Replicate",)
    dim = {"colwise": max(ndim - 2, 0), "rowwise": ndim - 1, "shard0": 0, "shard1": 1,
           "packed_colwise": max(ndim - 2, 0), "packed_rowwise": ndim - 1}[how]
    strided = how.startswith("packed") and ndim > 1
    return ("_StridedShard", dim, 2) if strided else ("Shard", dim)


def param_placements(tree: ModelTree, tp: TensorParallel) -> dict[int, tuple]:
    """{parameter index: TP placement}: ("Shard", d), ("_StridedShard", d, split), ("Replicate",);
    a parameter absent stays a plain tensor. Raises ValueError for a style torch refuses."""
    modules, params = resolve(tree, tp)
    out: dict[int, tuple] = {}
    for m, (fqn, style) in sorted(modules.items()):
        info = tree.modules[m]
        if style.is_torch:
            if style.style in ("ColwiseParallel", "RowwiseParallel"):  # refused even with no parameter of its own
                _torch_placement(style, info.type_name, "weight", fqn, _module(tree, fqn))
            scope = tree.subtree_params(m) if style.style == "SequenceParallel" else info.params
            for p in scope:
                local = tree.params[p].fqn.rpartition(".")[2]
                placement = _torch_placement(style, info.type_name, local, fqn, _module(tree, fqn))
                if placement:
                    out[p] = placement
            continue
        need = HF_STYLES[style.style][1]
        if need and not _has_attr(tree, fqn, need):
            raise ValueError(f"tensor_parallel[{fqn!r}]: transformers' {style.style!r} needs a module with "
                             f"`{need}` ({info.type_name} has none): it shards linear layers")
        for p in info.params:  # transformers: a module's style shards its own parameters
            placement = _hf_placement(style, tree.params[p].fqn.rpartition(".")[2], len(tree.params[p].shape))
            if placement:
                out[p] = placement
    for p, (fqn, style) in params.items():  # a parameter's own entry wins over its module's
        placement = _hf_placement(style, fqn.rpartition(".")[2], len(tree.params[p].shape))
        out.pop(p, None)
        if placement:
            out[p] = placement
    return out


def _module(tree: ModelTree, fqn: str):
    if tree.model is None:
        return None
    return _per_tree(tree, "modules", lambda: dict(tree.model.named_modules(remove_duplicate=False)))[fqn]


def _has_attr(tree: ModelTree, fqn: str, attr: str) -> bool:
    if tree.model is None:
        return tree.module(fqn).type_name == "Linear"
    return hasattr(_module(tree, fqn), attr)


# ---------------------------------------------------------------------------
# Divisibility and the TP-local tree
# ---------------------------------------------------------------------------
def nearest_tensor_degree(sizes, tensor: int) -> int:
    """The degree closest to ``tensor`` (the smaller on a tie) that divides every size."""
    g = 0
    for s in sizes:
        g = math.gcd(g, int(s))
    divisors = [d for d in range(1, g + 1) if g % d == 0] or [1]
    return min(divisors, key=lambda d: (abs(d - tensor), d))


def _text_config(tree: ModelTree):
    """The model's transformers config of its text part (a multimodal config's ``text_config``); None
    for a module without one (its widths are then unknown)."""
    config = getattr(tree.model, "config", None)
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _head_counts(tree: ModelTree) -> dict[str, int]:
    config = _text_config(tree)
    out = {}
    for key in ("num_attention_heads", "num_key_value_heads"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            out[key] = value
    return out


def check_divisible(tree: ModelTree, placements: dict[int, tuple], tensor: int) -> None:
    """Every sharded dim, and the model's attention heads when q/k/v are sharded, divide by ``tensor``."""
    sizes = []
    for p, placement in sorted(placements.items()):
        if placement[0] == "Replicate":
            continue
        info = tree.params[p]
        dim = placement[1] % len(info.shape)
        unit = tensor * (placement[2] if placement[0] == "_StridedShard" else 1)
        sizes.append(info.shape[dim] // (unit // tensor))
        if info.shape[dim] % unit:
            good = nearest_tensor_degree(sizes, tensor)
            raise ValueError(f"tensor_parallel: parameter {info.fqn!r} {info.shape}: dim {dim} ({info.shape[dim]}) "
                             f"does not divide into {unit} equal parts for tensor={tensor}; nearest tensor degree "
                             f"that works: {good}")
    if any(p[0] != "Replicate" for p in placements.values()):
        for key, heads in _head_counts(tree).items():
            if heads % tensor:
                raise ValueError(f"tensor_parallel: {model_name(tree)} has {key}={heads}, which does not divide by "
                                 f"tensor={tensor}: each rank must hold whole heads; nearest tensor degree that works: "
                                 f"{nearest_tensor_degree(sizes + [heads], tensor)}")


def local_shape(shape: tuple[int, ...], placement: tuple | None, tensor: int) -> tuple[int, ...]:
    """The TP-local shape (``DTensor.to_local().shape``) of a parameter: its sharded dim over T."""
    if not placement or placement[0] == "Replicate":
        return shape
    dim = placement[1] % len(shape)
    return shape[:dim] + (shape[dim] // tensor,) + shape[dim + 1:]


def fsdp_placements(placement: tuple | None, tensor: int, hsdp: bool) -> tuple[tuple, ...]:
    """``p.placements`` after TP then ``fully_shard`` on the dp mesh, as specs like ``placement``:
    FSDP's ``_StridedShard(0, sf=T)`` over TP's ``Shard(0)``, else ``Shard(0)``; then TP's own."""
    dp = ("_StridedShard", 0, tensor) if placement and placement[:2] == ("Shard", 0) else ("Shard", 0)
    return ((("Replicate",),) if hsdp else ()) + (dp,) + ((placement,) if placement else ())


def local_tree(tree: ModelTree, tp: TensorParallel, tensor: int) -> tuple[ModelTree, dict[int, tuple]]:
    """A copy of ``tree`` whose parameters have their TP-local shapes, and the placements: made once per
    tree, TP plan and degree (every analysis of one 2-D layout reads it), never changed once made."""
    key = (tuple(tp), int(tensor))
    found = _per_tree(tree, key)
    if found is not None:
        return found
    placements = param_placements(tree, tp)
    check_divisible(tree, placements, tensor)
    out = copy.copy(tree)
    out.params = [replace(p, shape=local_shape(p.shape, placements.get(p.index), tensor)) for p in tree.params]
    out.full_tree = tree
    return _per_tree(tree, key, lambda: (out, placements))


# ---------------------------------------------------------------------------
# The TP-local model activations are measured on
# ---------------------------------------------------------------------------
_GATHERING = {"colwise_gather_output", "colwise_rep", "embedding_colwise"}


def gathers_output(style: TPStyle, type_name: str) -> bool:
    """Whether the style all-gathers the module's sharded last dim into its output."""
    if not style.is_torch:
        return style.style in _GATHERING
    if style.style != "ColwiseParallel":
        return False
    out = style.output_layouts or ("Replicate()" if type_name == "Embedding" else "Shard(-1)")
    return out == "Replicate()"


#: One tensor rank's copy per (model, TP plan, degree), kept while the model lives: a new copy is a
#: new model to ``measure_activations``, whose cache is per model, so every analysis of the same 2-D
#: layout (each what-if of the findings, each edit back to it) would deep-copy 70B's 6,600 modules
#: and measure its step again. The copy is never changed once made (its forward hooks are its own).
_LOCAL_MODELS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCAL_LOCK = threading.Lock()
_LOCAL_KEEP = 4  # layouts kept per model (TP 2, 4, 8 and one other plan)


def cached_local_model(model, tree: ModelTree, placements: dict[int, tuple], tp: TensorParallel, tensor: int):
    """``local_model``, made once per (model, ``tp``, ``tensor``): the placements follow from them and
    the model's tree, so the same key is the same copy (and its measured steps are reused)."""
    key = (tuple(tp), int(tensor))
    with _LOCAL_LOCK:
        kept = _LOCAL_MODELS.setdefault(model, {})
        out = kept.get(key)
        if out is None:
            out = local_model(model, tree, placements, tp, tensor)
            kept[key] = out
            while len(kept) > _LOCAL_KEEP:
                del kept[next(iter(kept))]
        return out


def local_model(model, tree: ModelTree, placements: dict[int, tuple], tp: TensorParallel, tensor: int):
    """A meta copy of ``model`` holding one tensor rank's parameters (what its forward computes on):
    TP-local shapes, Linear/Embedding sizes to match, and the output all-gathers put back where a
    style gathers. The user's model is untouched."""
    import torch
    from torch import nn

    memo: dict[int, object] = {}
    for fqn, p in model.named_parameters(remove_duplicate=False):
        if id(p) not in memo:
            shape = local_shape(tuple(p.shape), placements.get(tree.param_index[fqn]), tensor)
            memo[id(p)] = nn.Parameter(torch.empty(shape, dtype=p.dtype, device="meta"), requires_grad=p.requires_grad)
    for b in model.buffers():
        memo[id(b)] = torch.empty_like(b, device="meta")
    out = copy_modules(model, memo)
    for module in out.modules():
        if isinstance(module, nn.Linear):
            module.out_features, module.in_features = module.weight.shape
        elif isinstance(module, nn.Embedding):
            module.num_embeddings, module.embedding_dim = module.weight.shape
    modules, _ = resolve(tree, tp)
    for m, (fqn, style) in modules.items():
        module = out.get_submodule(fqn)
        # a DTensor output (use_local_output=False, e.g. loss parallel's logits) shows the code after
        # it the global shape: gathered here too (its memory then counts the full tensor)
        dtensor_out = style.style == "ColwiseParallel" and style.use_local_output is False
        if gathers_output(style, tree.modules[m].type_name) or dtensor_out:
            module.register_forward_hook(lambda mod, args, y: torch.cat([y] * tensor, dim=-1))
        if not hasattr(model, "config"):  # a transformers model reads positions off the embedding's output
            _sequence_hooks(module, style, tensor)  # length: its sequence cannot be cut there (not modelled)
    return out


def _sequence_hooks(module, style: TPStyle, tensor: int) -> None:
    """Sequence parallelism on one tensor rank: an output to ``Shard(1)`` keeps 1/T of the sequence
    (a reduce-scatter's fresh tensor), an input from ``Shard(1)`` to ``Replicate()`` is gathered back
    to the whole sequence (an all-gather); between them modules run on the rank's part."""
    import torch

    if (style.output_layouts or "").startswith("Shard(1"):
        module.register_forward_hook(lambda mod, args, y: y[:, : y.shape[1] // tensor].clone())
    gathers = style.style in ("PrepareModuleInput", "ColwiseParallel") and (style.input_layouts or "").startswith("Shard(1")
    if not gathers or (style.style == "PrepareModuleInput" and not (style.desired_input_layouts or "").startswith("Replicate")):
        return

    def gather(mod, args, kwargs):
        if args:
            return (torch.cat([args[0]] * tensor, dim=1), *args[1:]), kwargs
        key = next(iter(kwargs))  # a module called by keyword (transformers' attention: hidden_states=)
        return args, {**kwargs, key: torch.cat([kwargs[key]] * tensor, dim=1)}

    module.register_forward_pre_hook(gather, with_kwargs=True)


# ---------------------------------------------------------------------------
# The tensor-parallel collectives of one micro-batch
# ---------------------------------------------------------------------------
def _widths(tree: ModelTree, fqn: str) -> tuple[int, int]:
    """(input width, output width) of a Linear or Embedding (its full, not TP-local, sizes)."""
    module = tree.model.get_submodule(fqn) if tree.model is not None else None
    if hasattr(module, "in_features"):
        return module.in_features, module.out_features
    if hasattr(module, "embedding_dim"):
        return module.embedding_dim, module.embedding_dim
    first = next((m for m in module.modules() if isinstance(m, nn.Linear)), None) if module is not None else None
    return (first.in_features, first.in_features) if first is not None else (0, 0)  # PrepareModuleInput: its input


def _torch_style_collectives(style: TPStyle, type_name: str, width_in: int, width_out: int,
                             dtensor_input: bool = False) -> list[tuple]:
    """(collective, phase, elements per token) of one torch style, as DTensor redistributes:
    Partial -> Replicate an all-reduce, Partial -> Shard(1) a reduce-scatter, Shard(1) ->
    Replicate an all-gather; a backward does the reverse of each forward move. ``dtensor_input``:
    a PrepareModuleInput around it hands it a DTensor, whose partial gradient that one reduces."""
    out = []
    seq_in = style.input_layouts is not None and style.input_layouts.startswith("Shard(1")
    if style.style == "ColwiseParallel" and type_name != "Embedding":
        if seq_in:
            out += [("all_gather", "forward", width_in), ("reduce_scatter", "backward", width_in)]
        elif not dtensor_input:
            out.append(("all_reduce", "backward", width_in))
        if gathers_output(style, type_name):
            out.append(("all_gather", "forward", width_out))
    elif style.style == "ColwiseParallel":  # Embedding: hidden-sharded lookups gathered
        if gathers_output(style, type_name):
            out.append(("all_gather", "forward", width_out))
    elif style.style == "RowwiseParallel":
        if (style.output_layouts or "Replicate()").startswith("Shard(1"):
            out += [("reduce_scatter", "forward", width_out), ("all_gather", "backward", width_out)]
        else:
            out.append(("all_reduce", "forward", width_out))
    elif style.style == "PrepareModuleInput" and seq_in and (style.desired_input_layouts or "").startswith("Replicate"):
        out += [("all_gather", "forward", width_in), ("reduce_scatter", "backward", width_in)]
    return out


_HF_COLLECTIVES = {  # transformers 5.24's styles in training (grad enabled): see the module docstring
    "colwise": [("all_reduce", "backward", "in")],
    "packed_colwise": [("all_reduce", "backward", "in")],
    "colwise_gather_output": [("all_gather", "forward", "out"), ("all_reduce", "backward", "in")],
    "colwise_rep": [("all_gather", "forward", "out"), ("all_reduce", "backward", "in")],
    "rowwise": [("all_reduce", "forward", "out")], "rowwise_rep": [("all_reduce", "forward", "out")],
    "rowwise_split_input": [("all_reduce", "forward", "out")],
    "embedding_rowwise": [("all_reduce", "forward", "out")], "embedding_colwise": [("all_gather", "forward", "out")],
    "all_reduce": [("all_reduce", "forward", "out")],
    # moe_tp_experts: the experts' summed output forward; hidden states and routing weights backward
    "moe_tp_experts": [("all_reduce", "forward", "hidden"), ("all_reduce", "backward", "hidden"),
                       ("all_reduce", "backward", "top_k")],
}


#: styles whose replicated parameters get partial gradients, all-reduced in backward: torch's
#: SequenceParallel (the Replicate DTensor's gradient from Shard(1) activations), transformers'
#: sequence_parallel and replicated_with_grad_allreduce (a post-accumulate-grad dist.all_reduce)
_GRAD_ALL_REDUCE = ("SequenceParallel", "sequence_parallel", "replicated_with_grad_allreduce")


def _moe_widths(tree: ModelTree) -> dict[str, int]:
    config = _text_config(tree)
    return {"hidden": getattr(config, "hidden_size", 0), "top_k": getattr(config, "num_experts_per_tok", 0)}


def _gets_dtensor(tree: ModelTree, modules: dict, m: int) -> bool:
    """Whether an enclosing PrepareModuleInput (use_local_output False, torch's default) passes
    module ``m`` a DTensor input."""
    parent = tree.modules[m].parent
    while parent >= 0:
        entry = modules.get(parent)
        if entry is not None and entry[1].style == "PrepareModuleInput":
            return entry[1].use_local_output is not True
        parent = tree.modules[parent].parent
    return False


def tensor_collectives(tree: ModelTree, tp: TensorParallel) -> list[tuple]:
    """(module fqn, collective, phase, elements per token) of every TP collective one micro-batch's
    forward and backward issue, in module order. Bytes = elements x tokens x the activation dtype
    (an all-gather: its output; a reduce-scatter: its input; an all-reduce: the tensor); a
    negative count is a parameter gradient's elements, whatever the tokens."""
    modules, _ = resolve(tree, tp)
    out = []
    for m, (fqn, style) in sorted(modules.items()):
        type_name = tree.modules[m].type_name
        width_in, width_out = _widths(tree, fqn)
        if style.style in _GRAD_ALL_REDUCE:  # replicated parameters fed sharded activations: partial gradients
            params = tree.subtree_params(m) if style.is_torch else tree.modules[m].params
            out += [(fqn, "all_reduce", "backward", -tree.params[p].numel) for p in params if tree.params[p].requires_grad]
        if style.is_torch:
            rows = _torch_style_collectives(style, type_name, width_in, width_out, _gets_dtensor(tree, modules, m))
        else:
            extra = _moe_widths(tree) if style.style == "moe_tp_experts" else {}
            sizes = {"in": width_in, "out": width_out, **extra}
            rows = [(c, ph, sizes[w]) for c, ph, w in _HF_COLLECTIVES.get(style.style, [])]
        out += [(fqn, c, ph, n) for c, ph, n in rows if n]
    return out
