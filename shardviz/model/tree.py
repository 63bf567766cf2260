"""Walk an ``nn.Module`` once into flat, read-only arrays.

Everything downstream (plans, the FSDP2 rules, costs, the widget) reads this
snapshot instead of the live module, so a toggle never walks the model again
and nothing we do can touch the user's parameters.

Parameters are identified by object identity (never ``data_ptr``: every meta
tensor has data_ptr 0), so a tied parameter is one entry with all its names.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from .quant import quant_kind, quant_state_bytes
from .quant_fp8 import FP8_DTYPES as FP8
from .quant_torchao import float8_gather_dtype, is_nf4, nf4_layout, nf4_sharded_bytes

LORA_NAME_MARKERS = ("lora_", "lora.")


@dataclass(frozen=True)
class ParamInfo:
    index: int
    fqns: tuple[str, ...]  # every name under which the parameter is reachable
    shape: tuple[int, ...]
    dtype: torch.dtype
    requires_grad: bool
    role: str  # "base" or "lora"
    owners: tuple[int, ...]  # modules that register it directly (recurse=False)
    contiguous: bool = True  # fully_shard raises NotImplementedError on a non-contiguous parameter
    # A bitsandbytes Params4bit: "nf4" / "fp4" (shape and dtype above are its packed data's, what FSDP2
    # shards and gathers), and the bytes of its quant_state, which is no parameter: every rank keeps it whole.
    # A torchao NF4Tensor (quant "nf4 (torchao)"): shape (bytes,) uint8, its three inner tensors' bytes
    # (what FSDP2 splits on dim 0 and gathers through one uint8 buffer); quant_state_bytes its scaler_mean
    # and code table; dequantized_shape its logical shape, quant_parts the inner numels (quant_torchao).
    quant: str | None = None
    quant_state_bytes: int = 0
    dequantized_shape: tuple[int, ...] = ()
    quant_parts: tuple[int, ...] = ()
    # torchao float8 all-gather (WeightWithDynamicFloat8CastTensor): the dtype FSDP2 gathers it in,
    # whatever param_dtype says; None for every other parameter
    gather_dtype: torch.dtype | None = None
    # Derived once here: analyses read them for every parameter on every toggle.
    numel: int = field(init=False)
    itemsize: int = field(init=False)
    nbytes: int = field(init=False)
    row_numel: int = field(init=False)  # elements per dim-0 row

    def __post_init__(self):
        numel = math.prod(self.shape)
        object.__setattr__(self, "numel", numel)
        object.__setattr__(self, "itemsize", self.dtype.itemsize)
        object.__setattr__(self, "nbytes", numel * self.dtype.itemsize)
        object.__setattr__(self, "row_numel", math.prod(self.shape[1:]))

    @property
    def fqn(self) -> str:
        return self.fqns[0]

    @property
    def gets_gradient(self) -> bool:
        """Whether the step gives it a gradient: ``requires_grad``, except quantized weights (bitsandbytes
        4/8-bit, torchao NF4, fp8 blocks), whose kernels give the packed data none whatever requires_grad
        says (torch allocates and reduce-scatters nothing for them: tests/test_adapter_checks.py, SV125).
        torchao float8 training weights (``gather_dtype`` set) are trained."""
        return self.requires_grad and not (self.gather_dtype is None and (self.quant is not None or self.dtype in FP8))


@dataclass
class ModuleInfo:
    index: int  # position in DFS preorder
    fqn: str
    type_name: str
    parent: int  # -1 for the root
    depth: int
    children: list[int] = field(default_factory=list)
    params: tuple[int, ...] = ()  # parameters registered directly on this module, in order
    buffer_bytes: int = 0
    n_buffers: int = 0
    subtree_end: int = 0  # preorder index one past the last descendant
    aliases: tuple[str, ...] = ()  # other names of a module reachable along two paths
    # A ModuleList / ModuleDict that keeps nn.Module's forward: fully_shard refuses it as a call.
    bare_container: bool = False


def _tuner_layer_type():
    """peft's base class of adapter layers, or None without peft (roles then come from names)."""
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer
    except Exception:  # peft missing or broken: fall back to names
        return None
    return BaseTunerLayer


def base_model(model):
    """The model under a peft wrapper (``PeftModel.get_base_model``: its own class, forward and
    config), else ``model`` itself."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def peft_configs(model) -> dict:
    """A peft model's adapter configs by adapter name (``PeftModel.peft_config``); {} for any other module."""
    configs = getattr(model, "peft_config", None)
    return configs if isinstance(configs, dict) else {}


def model_name(tree) -> str:
    """The model's one name on every surface: its class under any peft wrapper ("LlamaForCausalLM"),
    with "+ LoRA" when an adapter wraps it; ``model_text`` says the rest."""
    model = tree.model
    name = type(base_model(model)).__name__ if model is not None else tree.root_type
    return name + (" + LoRA" if model is not None and peft_configs(model) else "")


def _looks_like_lora(name: str) -> bool:
    return any(marker in part for part in name.split(".") for marker in LORA_NAME_MARKERS)


class _Walk:
    """The one-pass, meta-safe walk of an ``nn.Module``: modules in DFS preorder, unique parameters.

    One iterative DFS over ``_modules`` / ``_parameters`` / ``_buffers`` (no named_modules, no second
    pass for peft): children in registration order, as torch's own traversal; a module reached twice
    is walked once, like fully_shard's ``_get_managed_modules``, and recorded as an alias.
    """

    def __init__(self, modules: list[ModuleInfo], module_index: dict[str, int]):
        self.modules = modules
        self.module_index = module_index
        self.tuner_type = _tuner_layer_type()
        self.lora_ids: set[int] = set()  # ids of parameters held by peft's adapter layers
        self.param_slot: dict[int, int] = {}  # id(param) -> index
        self.param_names: list[list[str]] = []
        self.param_owners: list[list[int]] = []
        self.param_objs: list[nn.Parameter] = []  # keeps ids valid during the walk
        self.module_slot: dict[int, int] = {}  # id(module) -> index
        self.shared_again: list[tuple[str, int]] = []  # (other name, module index) of a module reached twice
        self.is_tuner: dict[type, bool] = {}  # isinstance on peft's ABC is slow: once per class
        self.bare: dict[type, bool] = {}  # per class: a ModuleList / ModuleDict without a forward of its own

    def run(self, model: nn.Module) -> None:
        """Walk ``model``. ``in_adapter``: the module is one of peft's adapter holders (``lora_A``,
        ``lora_B``, ``lora_embedding_A``, DoRA's ``lora_magnitude_vector``, ...) or lies below one,
        so every parameter it registers is an adapter parameter."""
        stack: list[tuple[nn.Module, str, int, int, bool]] = [(model, "", -1, 0, False)]
        pop, push = stack.pop, stack.append
        module_slot, add_module, holders_of, tuner_type = self.module_slot, self._add_module, self._holders, self.tuner_type
        while stack:
            module, fqn, parent, depth, in_adapter = pop()
            seen = module_slot.get(id(module))
            if seen is not None:
                self._reached_again(fqn, seen)
                continue
            prefix = fqn + "." if fqn else ""
            index = add_module(module, fqn, prefix, parent, depth, in_adapter)
            kids = module._modules
            if not kids:
                continue
            holders = () if in_adapter or tuner_type is None else holders_of(module)
            for name, child in reversed(kids.items()):
                if child is not None:
                    push((child, prefix + name, index, depth + 1, in_adapter or name in holders))

    def _reached_again(self, fqn: str, index: int) -> None:
        info = self.modules[index]
        info.aliases = info.aliases + (fqn,)
        self.module_index[fqn] = index
        self.shared_again.append((fqn, index))

    def _add_module(self, module: nn.Module, fqn: str, prefix: str, parent: int, depth: int, in_adapter: bool) -> int:
        """Record ``module`` (its parameters and buffers) at the next preorder index and return it."""
        modules = self.modules
        index = len(modules)
        self.module_slot[id(module)] = index
        own = self._own_params(module._parameters, prefix, index, in_adapter)
        buffer_bytes, n_buffers = _buffer_stats(module._buffers) if module._buffers else (0, 0)
        cls = type(module)
        container = self.bare.get(cls)
        if container is None:
            container = self.bare[cls] = issubclass(cls, (nn.ModuleList, nn.ModuleDict)) and cls.forward is nn.Module.forward
        modules.append(ModuleInfo(index, fqn, cls.__name__, parent, depth, [], own, buffer_bytes, n_buffers,
                                  bare_container=container))
        self.module_index[fqn] = index
        if parent >= 0:
            modules[parent].children.append(index)
        return index

    def _own_params(self, registered: dict, prefix: str, index: int, in_adapter: bool) -> tuple[int, ...]:
        """Slots of the parameters module ``index`` registers directly; a parameter met before
        (tied) gains the name, and the module as an owner."""
        own: list[int] = []
        param_slot, param_names, param_owners = self.param_slot, self.param_names, self.param_owners
        for pname, p in registered.items():
            if p is None:
                continue
            slot = param_slot.get(id(p))
            if slot is None:
                slot = param_slot[id(p)] = len(self.param_objs)
                self.param_objs.append(p)
                param_names.append([prefix + pname])
                param_owners.append([index])
                own.append(slot)
            else:
                param_names[slot].append(prefix + pname)
                if index not in param_owners[slot]:
                    param_owners[slot].append(index)
                    own.append(slot)
            if in_adapter:
                self.lora_ids.add(id(p))
        return tuple(own)

    def _holders(self, module: nn.Module):
        """Names of ``module``'s children that hold adapter weights, when it is one of peft's layers."""
        cls = type(module)
        tuner = self.is_tuner.get(cls)
        if tuner is None:
            tuner = self.is_tuner[cls] = issubclass(cls, self.tuner_type)
        return _adapter_holders(module, self.lora_ids) if tuner else ()

    def alias_subtrees(self) -> None:
        """A module reached along a second path (Zamba's shared block): its whole subtree, modules and
        parameters, is reachable under that name too, as named_parameters(remove_duplicate=False) lists.
        Needs the subtree extents."""
        modules, param_names = self.modules, self.param_names
        for alias, index in self.shared_again:
            base = modules[index].fqn
            for m in range(index, modules[index].subtree_end):
                info = modules[m]
                if m != index:
                    self.module_index.setdefault(alias + info.fqn[len(base):], m)
                for slot in info.params:
                    names = param_names[slot]
                    for name in list(names):
                        if name.startswith(base + ".") and alias + name[len(base):] not in names:
                            names.append(alias + name[len(base):])

    def params(self, param_index: dict[str, int]) -> list[ParamInfo]:
        """The unique parameters, each with its role, every name entered in ``param_index``.

        Roles come from peft's adapter layers when the walk met any, else from names."""
        by_names = self.tuner_type is None or not self.lora_ids
        lora_ids, param_names, param_owners = self.lora_ids, self.param_names, self.param_owners
        out = []
        for slot, p in enumerate(self.param_objs):
            names = tuple(param_names[slot])
            if by_names:
                role = "lora" if any(_looks_like_lora(n) for n in names) else "base"
            else:
                role = "lora" if id(p) in lora_ids else "base"
            kind = quant_kind(p) if type(p) is not nn.Parameter else None
            shape, dtype, extra = tuple(p.shape), p.dtype, {}
            if kind and is_nf4(p):
                shape, dtype = (nf4_sharded_bytes(p),), torch.uint8
                extra = dict(zip(("dequantized_shape", "quant_parts"), nf4_layout(p)[:2]))
            elif type(p) is not nn.Parameter and float8_gather_dtype(p) is not None:
                extra = {"gather_dtype": float8_gather_dtype(p)}
            out.append(ParamInfo(slot, names, shape, dtype, bool(p.requires_grad), role,
                                 tuple(param_owners[slot]), contiguous=bool(p.is_contiguous()),
                                 quant=kind, quant_state_bytes=quant_state_bytes(p) if kind else 0, **extra))
            for n in names:
                param_index[n] = slot
        return out


def _buffer_stats(buffers: dict) -> tuple[int, int]:
    """(bytes, count) of a module's registered, non-None buffers."""
    nbytes = count = 0
    for b in buffers.values():
        if b is not None:
            count += 1
            nbytes += b.numel() * b.element_size()
    return nbytes, count


def _set_subtree_ends(modules: list[ModuleInfo]) -> None:
    """With preorder numbering a subtree is a contiguous range ending where the last child's subtree ends."""
    for info in reversed(modules):
        info.subtree_end = modules[info.children[-1]].subtree_end if info.children else info.index + 1


def _adapter_holders(layer, lora_ids: set[int]) -> frozenset[str]:
    """Names of ``layer``'s child modules that hold adapter weights (peft's ``adapter_layer_names``).

    A holder that is not a registered child (a plain dict of parameters) has its parameters'
    ids added to ``lora_ids`` directly."""
    names = []
    for attr in getattr(layer, "adapter_layer_names", ()):
        if attr in layer._modules:
            names.append(attr)
            continue
        holder = getattr(layer, attr, None)
        if isinstance(holder, nn.Module):
            lora_ids.update(id(p) for p in holder.parameters())
        elif isinstance(holder, dict):
            lora_ids.update(id(p) for p in holder.values() if isinstance(p, torch.Tensor))
    return frozenset(names)


class ModelTree:
    """A snapshot of a module tree: modules in DFS preorder, unique parameters."""

    def __init__(self, model: nn.Module):
        if not isinstance(model, nn.Module):
            raise TypeError(f"expected an nn.Module, got {type(model).__name__}")
        self.root_type = type(model).__name__
        self._model = weakref.ref(model)  # activations are measured by running it (never kept alive here)
        self.modules: list[ModuleInfo] = []
        self.module_index: dict[str, int] = {}
        self.param_index: dict[str, int] = {}  # every alias -> parameter index
        walk = _Walk(self.modules, self.module_index)
        walk.run(model)
        self.parents = [info.parent for info in self.modules]
        _set_subtree_ends(self.modules)
        walk.alias_subtrees()
        self.params: list[ParamInfo] = walk.params(self.param_index)

    @property
    def model(self) -> nn.Module | None:
        """The module this snapshot was taken of, while it exists."""
        return self._model()

    # -- lookups -----------------------------------------------------------
    def module(self, fqn: str) -> ModuleInfo:
        return self.modules[self.module_index[fqn]]

    def param(self, fqn: str) -> ParamInfo:
        return self.params[self.param_index[fqn]]

    def param_indices(self, fqns) -> set[int]:
        """The indices of the parameters named ``fqns`` (any of a shared parameter's names): e.g. a
        plan's ``ignored``, which names each parameter by one of its names."""
        return {self.param_index[f] for f in fqns}

    def is_inside(self, inner: int, outer: int) -> bool:
        """True when module ``inner`` is ``outer`` or one of its descendants."""
        return outer <= inner < self.modules[outer].subtree_end

    def subtree_params(self, module: int) -> list[int]:
        """Unique parameters anywhere under ``module`` (itself included)."""
        seen: dict[int, None] = {}
        for m in range(module, self.modules[module].subtree_end):
            for p in self.modules[m].params:
                seen.setdefault(p, None)
        return list(seen)

    @property
    def n_modules(self) -> int:
        return len(self.modules)

    def __repr__(self) -> str:
        return f"ModelTree({self.root_type}: {len(self.modules)} modules, {len(self.params)} parameters)"


def subtree_numel(tree: ModelTree) -> list[int]:
    """Parameter elements under each module, each unique parameter counted where it first appears."""
    own = [0] * tree.n_modules
    for p in tree.params:
        own[p.owners[0]] += p.numel
    total = own[:]
    for info in reversed(tree.modules):
        if info.parent >= 0:
            total[info.parent] += total[info.index]
    return total


def children_with_params(tree: ModelTree, module: int) -> list[int]:
    """Children of ``module`` that hold parameters, a bare ModuleList/ModuleDict opened: what a call may
    take (``fully_shard`` refuses a container without forward, ``_fsdp_init._validate_module``)."""
    numel = subtree_numel(tree)
    out: list[int] = []

    def add(m: int) -> None:
        if numel[m] == 0 and not tree.modules[m].params:
            return
        if tree.modules[m].bare_container:
            for c in tree.modules[m].children:
                add(c)
        else:
            out.append(m)

    for c in tree.modules[module].children:
        add(c)
    return out


@dataclass(frozen=True)
class TreeIndex:
    """What every layout of one tree reads (``fsdp.Layout``), as arrays: computed once per tree
    (``tree_index``), so that a change of plan does not walk the parameters again."""

    subtree_end: np.ndarray  # per module (preorder): one past its last descendant
    depth: np.ndarray  # per module
    parent: np.ndarray  # per module (-1: the root)
    single: np.ndarray  # parameters with one name (the common case)
    single_owner: np.ndarray  # the module that registers each of them
    several_names: tuple[int, ...]  # tied parameters, or under a module reached along several paths
    scalars: tuple[int, ...]  # 0-dim parameters (SV002)
    non_contiguous: tuple[int, ...]  # SV008
    trainable: np.ndarray  # per parameter: requires_grad
    dtype_code: np.ndarray  # per parameter: its dtype's position in ``dtypes``
    dtypes: tuple  # the tree's parameter dtypes (SV003 compares them per call)
    trained_dtypes: int  # how many of them the trainable parameters have (SV003 needs two)
    numel: np.ndarray  # per parameter: elements
    itemsize: np.ndarray  # per parameter: bytes per element
    dim0: np.ndarray  # per parameter: rows on dim 0 (1 for a 0-dim parameter)
    row: np.ndarray  # per parameter: elements per dim-0 row


_TREE_INDEX: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def tree_index(tree: ModelTree) -> TreeIndex:
    """The tree's ``TreeIndex``, built on first use and kept while the tree lives."""
    index = _TREE_INDEX.get(tree)
    if index is None:
        params = tree.params
        single = [p.index for p in params if len(p.fqns) == 1]
        dtypes = tuple(dict.fromkeys(p.dtype for p in params))
        code = {d: i for i, d in enumerate(dtypes)}
        numel = np.array([p.numel for p in params], dtype=np.int64)
        dim0 = np.array([p.shape[0] if p.shape else 1 for p in params], dtype=np.int64)
        index = _TREE_INDEX[tree] = TreeIndex(
            np.array([m.subtree_end for m in tree.modules], dtype=np.int64),
            np.array([m.depth for m in tree.modules], dtype=np.int64),
            np.array(tree.parents, dtype=np.int64),
            np.array(single, dtype=np.int64),
            np.array([params[p].owners[0] for p in single], dtype=np.int64),
            tuple(p.index for p in params if len(p.fqns) > 1),
            tuple(p.index for p in params if len(p.shape) == 0),
            tuple(p.index for p in params if not p.contiguous),
            np.array([p.requires_grad for p in params], dtype=bool),
            np.array([code[p.dtype] for p in params], dtype=np.int64), dtypes,
            len({p.dtype for p in params if p.requires_grad}), numel,
            np.array([p.itemsize for p in params], dtype=np.int64), dim0,
            np.where(dim0 > 0, numel // np.maximum(dim0, 1), 0))
    return index


def as_tree(model_or_tree) -> ModelTree:
    return model_or_tree if isinstance(model_or_tree, ModelTree) else ModelTree(model_or_tree)
