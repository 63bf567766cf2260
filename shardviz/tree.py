"""Walk an ``nn.Module`` once into flat, read-only arrays.

Everything downstream (plans, the FSDP2 rules, costs, the widget) reads this
snapshot instead of the live module, so a toggle never walks the model again
and nothing we do can touch the user's parameters.

Parameters are identified by object identity (never ``data_ptr``: every meta
tensor has data_ptr 0), so a tied parameter is one entry with all its names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

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


def _lora_param_ids(model: nn.Module) -> set[int] | None:
    """Ids of parameters that peft's own adapter layers hold, or None without peft."""
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer
    except Exception:  # peft missing or broken: fall back to names
        return None
    ids: set[int] = set()
    for module in model.modules():
        if isinstance(module, BaseTunerLayer):
            for attr in getattr(module, "adapter_layer_names", ()):
                holder = getattr(module, attr, None)
                if isinstance(holder, nn.Module):
                    ids.update(id(p) for p in holder.parameters())
                elif isinstance(holder, (nn.ParameterDict, dict)):
                    ids.update(id(p) for p in holder.values())
    return ids


def _looks_like_lora(name: str) -> bool:
    return any(marker in part for part in name.split(".") for marker in LORA_NAME_MARKERS)


class ModelTree:
    """A snapshot of a module tree: modules in DFS preorder, unique parameters."""

    def __init__(self, model: nn.Module):
        if not isinstance(model, nn.Module):
            raise TypeError(f"expected an nn.Module, got {type(model).__name__}")
        self.root_type = type(model).__name__
        self.modules: list[ModuleInfo] = []
        self.params: list[ParamInfo] = []
        self.module_index: dict[str, int] = {}
        self.param_index: dict[str, int] = {}  # every alias -> parameter index

        lora_ids = _lora_param_ids(model)
        param_slot: dict[int, int] = {}  # id(param) -> index
        param_names: list[list[str]] = []
        param_owners: list[list[int]] = []
        param_objs: list[nn.Parameter] = []  # keeps ids valid during the walk
        module_slot: dict[int, int] = {}

        # Iterative DFS in the order torch's own traversal uses (children in
        # registration order); a module reached twice is walked once, like
        # fully_shard's ``_get_managed_modules``.
        stack: list[tuple[nn.Module, str, int, int]] = [(model, "", -1, 0)]
        shared_again: list[tuple[str, int]] = []  # (other name, module index) of a module reached twice
        while stack:
            module, fqn, parent, depth = stack.pop()
            if id(module) in module_slot:
                info = self.modules[module_slot[id(module)]]
                info.aliases = info.aliases + (fqn,)
                self.module_index[fqn] = info.index
                shared_again.append((fqn, info.index))
                continue
            index = len(self.modules)
            module_slot[id(module)] = index
            own: list[int] = []
            for pname, p in module._parameters.items():
                if p is None:
                    continue
                full = f"{fqn}.{pname}" if fqn else pname
                slot = param_slot.get(id(p))
                if slot is None:
                    slot = len(param_objs)
                    param_slot[id(p)] = slot
                    param_objs.append(p)
                    param_names.append([])
                    param_owners.append([])
                param_names[slot].append(full)
                if index not in param_owners[slot]:
                    param_owners[slot].append(index)
                    own.append(slot)
            buffers = [b for b in module._buffers.values() if b is not None]
            info = ModuleInfo(
                index=index,
                fqn=fqn,
                type_name=type(module).__name__,
                parent=parent,
                depth=depth,
                params=tuple(own),
                buffer_bytes=sum(b.numel() * b.element_size() for b in buffers),
                n_buffers=len(buffers),
                bare_container=isinstance(module, (nn.ModuleList, nn.ModuleDict))
                and type(module).forward is nn.Module.forward,
            )
            self.modules.append(info)
            self.module_index[fqn] = index
            if parent >= 0:
                self.modules[parent].children.append(index)
            kids = [(c, f"{fqn}.{n}" if fqn else n) for n, c in module._modules.items() if c is not None]
            for child, cname in reversed(kids):
                stack.append((child, cname, index, depth + 1))

        self.parents = [info.parent for info in self.modules]
        # Subtree extents: with preorder numbering a subtree is a contiguous range.
        for info in reversed(self.modules):
            info.subtree_end = max([info.index + 1] + [self.modules[c].subtree_end for c in info.children])

        # A module reached along a second path (Zamba's shared block): its whole subtree, modules and
        # parameters, is reachable under that name too, as named_parameters(remove_duplicate=False) lists.
        for alias, index in shared_again:
            base = self.modules[index].fqn
            for m in range(index, self.modules[index].subtree_end):
                info = self.modules[m]
                if m != index:
                    self.module_index.setdefault(alias + info.fqn[len(base):], m)
                for slot in info.params:
                    for name in list(param_names[slot]):
                        if name.startswith(base + ".") and alias + name[len(base):] not in param_names[slot]:
                            param_names[slot].append(alias + name[len(base):])

        for slot, p in enumerate(param_objs):
            names = tuple(param_names[slot])
            if lora_ids is not None and lora_ids:
                role = "lora" if id(p) in lora_ids else "base"
            else:
                role = "lora" if any(_looks_like_lora(n) for n in names) else "base"
            self.params.append(
                ParamInfo(
                    index=slot,
                    fqns=names,
                    shape=tuple(p.shape),
                    dtype=p.dtype,
                    requires_grad=bool(p.requires_grad),
                    role=role,
                    owners=tuple(param_owners[slot]),
                    contiguous=bool(p.is_contiguous()),
                )
            )
            for n in names:
                self.param_index[n] = slot

    # -- lookups -----------------------------------------------------------
    def module(self, fqn: str) -> ModuleInfo:
        return self.modules[self.module_index[fqn]]

    def param(self, fqn: str) -> ParamInfo:
        return self.params[self.param_index[fqn]]

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


def as_tree(model_or_tree) -> ModelTree:
    return model_or_tree if isinstance(model_or_tree, ModelTree) else ModelTree(model_or_tree)
