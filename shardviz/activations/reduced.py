"""The reduced copy: every repeated block list cut to one fake copy per variant (block kind, which of
its submodules are checkpointed), the rest of the model copied with fake parameters in the dtypes
they compute in. The user's model is only read."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from ..checkpointing import FULL, SELECTIVE, CheckpointPolicy
from ..export_runtime import _checkpoint_wrapped, _selective_checkpoint_context
from ..model.quant_torchao import is_nf4
from ..model.tree import ModelTree
from . import stop
from .profile import strip_wrapper

# A variant's checkpointed paths: frozenset of (path inside the block, CheckpointPolicy).
WHOLE_BLOCK = frozenset({("", FULL)})  # a variant whose block itself is checkpointed in full
PLAIN = frozenset()


class DtypePolicy:
    """The dtype a parameter computes in: ``param_dtype`` for floating parameters FSDP shards, its
    own for the ones it leaves whole (any of a shared parameter's names counts)."""

    def __init__(self, tree: ModelTree, param_dtype: torch.dtype | None, whole: frozenset):
        self.tree, self.pdt, self.whole = tree, param_dtype, whole

    def compute_dtype(self, pi) -> torch.dtype:
        if self.pdt is None or not pi.dtype.is_floating_point or any(n in self.whole for n in pi.fqns):
            return pi.dtype
        return self.pdt

    def param_dtype_of(self, fqn: str, p: torch.Tensor) -> torch.dtype:
        if self.pdt is None or not p.is_floating_point() or fqn in self.whole:
            return p.dtype
        pi = self.tree.param_index.get(fqn)
        if pi is not None and any(n in self.whole for n in self.tree.params[pi].fqns):
            return p.dtype
        return self.pdt


def as_dtype(value) -> torch.dtype | None:
    if value is None or isinstance(value, torch.dtype):
        return value
    return getattr(torch, str(value).replace("torch.", ""))


@dataclass
class ListPlan:
    """How one block list is measured: the representatives its copy holds and who stands for whom."""

    fqn: str  # the ModuleList
    positions: list[int]  # tree indices of its blocks, in order
    variants: list[tuple]  # variant per position: (kind, checkpointed (path, policy) inside the block)
    reps: list[tuple]  # rep index -> (variant, source tree index)
    pos_rep: list[int]  # position -> rep index


def _variant(tree: ModelTree, b: int, compute_dtype, checkpoint: dict) -> tuple:
    """(kind, checkpointed (path, policy)) of block ``b``; a kind is (class, parameter
    names/shapes/compute dtypes/requires_grad); ``checkpoint``: fqn -> ``CheckpointPolicy``."""
    info = tree.modules[b]
    prefix = info.fqn + "."
    sig = []
    for p in tree.subtree_params(b):
        pi = tree.params[p]
        name = next((n for n in pi.fqns if n.startswith(prefix)), pi.fqn)
        sig.append((name[len(prefix):], pi.shape, compute_dtype(pi), pi.requires_grad))
    ck = frozenset(("" if c == info.fqn else c[len(prefix):], policy) for c, policy in checkpoint.items()
                   if c == info.fqn or c.startswith(prefix))
    return (info.type_name, tuple(sig)), ck


def _cache_representatives(members: list[int], variants: list[tuple]) -> tuple[list[tuple], list[int]]:
    """The copies of a step that keeps a key/value cache: the plan's variants only, in the order of
    the positions around the first checkpointed one (a checkpointed block keeps the cache alive to
    the end of its backward, so a plain block after it frees its cache at that death, a plain block
    before it in its own backward: ``kvcache``). One copy per (variant, before / at / after it),
    position 0 its own, the last position's last (see ``_representatives``)."""
    star = next((p for p, v in enumerate(variants) if v[1]), None)
    keys = [(v, 0 if star is None or p < star else (1 if p == star else 2)) for p, v in enumerate(variants)]
    reps, index = [(variants[0], members[0])], {}
    for p in range(1, len(variants)):
        if keys[p] not in index:
            index[keys[p]] = len(reps)
            reps.append((variants[p], members[p]))
    if len(variants) > 1 and index[keys[-1]] != len(reps) - 1:
        moved = index[keys[-1]]
        reps.append(reps.pop(moved))
        index = {k: (r - (r > moved) if k != keys[-1] else len(reps) - 1) for k, r in index.items()}
    return reps, [0] + [index[k] for k in keys[1:]]


def _representatives(members: list[int], variants: list[tuple], toggles: bool = True) -> tuple[list[tuple], list[int]]:
    """The copies to run and position -> copy. First the variant of position 0 (the first block
    sees an input that may not require grad: frozen embeddings), then a plain and a fully
    checkpointed copy of every kind seen later (toggling block checkpointing reuses the
    measurement; ``toggles=False``: ``_cache_representatives``), then every other variant; the last position's
    variant goes last, so the first
    and last runs of the reduced timeline are the ones the full model's first and last positions
    use (see ``splice``)."""
    if not toggles:
        return _cache_representatives(members, variants)
    kinds: dict[tuple, int] = {}
    for v, b in zip(variants, members):
        kinds.setdefault(v[0], b)
    later = {v[0] for v in variants[1:]}  # kinds seen after position 0 (T5: block 0 differs)
    wanted = [((kind, ck), src) for kind, src in kinds.items() if kind in later for ck in (PLAIN, WHOLE_BLOCK)]
    wanted += list(zip(variants[1:], members[1:]))
    last = (variants[-1], members[-1])
    reps = [(variants[0], members[0])]
    index: dict[tuple, int] = {}
    for v, src in wanted + [last]:
        if v not in index:
            index[v] = len(reps)
            reps.append((v, src))
    if index[last[0]] != len(reps) - 1:
        reps.append(reps.pop(index[last[0]]))
        index = {v: i for i, (v, _) in enumerate(reps) if i > 0}
    return reps, [0] + [index[v] for v in variants[1:]]


def plan_lists(tree: ModelTree, blocks: list[int], compute_dtype, checkpoint: dict,
               toggles: bool = True) -> list[ListPlan]:
    """One ``ListPlan`` per list holding ``blocks``; ``checkpoint``: fqn -> ``CheckpointPolicy``;
    ``toggles``: also a plain and a checkpointed copy of every kind (``_representatives``)."""
    by_list: dict[int, list[int]] = {}
    for b in blocks:
        by_list.setdefault(tree.modules[b].parent, []).append(b)
    plans = []
    for parent, members in by_list.items():
        variants = [_variant(tree, b, compute_dtype, checkpoint) for b in members]
        reps, pos_rep = _representatives(members, variants, toggles)
        plans.append(ListPlan(tree.modules[parent].fqn, members, variants, reps, pos_rep))
    return plans


def _fake_param(p: torch.Tensor, dtype: torch.dtype, fake_mode) -> torch.Tensor:
    if is_nf4(p):  # a torchao NF4Tensor stays NF4 (FSDP2 ignores param_dtype for it): its own F.linear runs
        return nn.Parameter(_fake_cpu_subclass(p, fake_mode) if p.is_meta else fake_mode.from_tensor(p),
                            requires_grad=False)
    with fake_mode:
        t = torch.empty(p.shape, dtype=dtype, device="cpu")
    if isinstance(p, nn.Parameter):
        return nn.Parameter(t, requires_grad=p.requires_grad)
    return t


def _fake_cpu_subclass(p: torch.Tensor, fake_mode) -> torch.Tensor:
    """A meta tensor subclass (an NF4Tensor built by ``to_nf4`` on meta) rebuilt from fake CPU inner
    tensors of the same shapes and dtypes, so that it meets the fake CPU activations on one device."""
    names, ctx = p.__tensor_flatten__()
    with fake_mode:
        inner = {n: torch.empty_strided(getattr(p, n).shape, getattr(p, n).stride(), dtype=getattr(p, n).dtype,
                                        device="cpu") for n in names}
    return type(p).__tensor_unflatten__(inner, ctx, p.shape, p.stride())


def _wrapped(module: nn.Module, policy: CheckpointPolicy) -> nn.Module:
    """``module`` in the export's own ``checkpoint_wrapper`` (``export_runtime``), full or selective."""
    return _checkpoint_wrapped(module, _selective_checkpoint_context if policy is SELECTIVE else None)


def _wrap(root: nn.Module, path: str, policy: CheckpointPolicy) -> nn.Module:
    """``root`` with its submodule ``path`` (``""``: itself) checkpoint-wrapped with ``policy``."""
    if path == "":
        return _wrapped(root, policy)
    parent_path, _, name = path.rpartition(".")
    parent = root.get_submodule(parent_path) if parent_path else root
    setattr(parent, name, _wrapped(getattr(parent, name), policy))
    return root


def _wrap_all(root: nn.Module, checkpointed) -> nn.Module:
    """``root`` with every (path, policy) of ``checkpointed`` wrapped, innermost first."""
    for path, policy in sorted(checkpointed, key=lambda c: (-c[0].count("."), c)):
        root = _wrap(root, path, policy)
    return root


def _allow_more_layers(reduced: nn.Module, sizes) -> None:
    """Hugging Face models loop over ``self.layers[: config.num_hidden_layers]``: when the reduced
    list is longer than the real one (a 2-layer model measured with 3 copies), raise the layer
    counts of the copy's configs that name the real length."""
    configs = {id(c): c for m in reduced.modules() if (c := getattr(m, "config", None)) is not None}
    for full, reduced_len in sizes:
        if reduced_len <= full:
            continue
        for cfg in configs.values():
            for name, value in list(vars(cfg).items()):
                if "layer" in name and isinstance(value, int) and not isinstance(value, bool) and value == full:
                    setattr(cfg, name, reduced_len)


def _fake_outside(model: nn.Module, skip: set[int], param_dtype_of, fake_mode) -> dict[int, object]:
    """id(tensor) -> fake tensor, for the parameters and buffers outside the block lists (a walk
    that does not enter the modules in ``skip``)."""
    memo: dict[int, object] = {}
    stack = [("", model)]
    while stack:
        prefix, mod = stack.pop()
        for pname, p in mod._parameters.items():
            if p is not None and id(p) not in memo:
                memo[id(p)] = _fake_param(p, param_dtype_of(f"{prefix}{pname}", p), fake_mode)
        for b in mod._buffers.values():
            if b is not None and id(b) not in memo:
                memo[id(b)] = _fake_param(b, b.dtype, fake_mode)
        for cname, child in mod._modules.items():
            if child is not None and id(child) not in skip:
                stack.append((f"{prefix}{cname}.", child))
    return memo


def _rep_copy(model: nn.Module, fqn: str, checkpointed, memo, param_dtype_of, fake_mode) -> nn.Module:
    """A fake copy of block ``fqn`` (parameters shared with the outside stay shared), its
    ``checkpointed`` (path, policy) wrapped, innermost first."""
    src = model.get_submodule(fqn)
    rep_memo: dict[int, object] = {}
    for pname, p in src.named_parameters(remove_duplicate=False):
        if id(p) not in rep_memo:
            rep_memo[id(p)] = memo[id(p)] if id(p) in memo else _fake_param(
                p, param_dtype_of(f"{fqn}.{pname}", p), fake_mode)
    for _, b in src.named_buffers(remove_duplicate=False):
        if id(b) not in rep_memo:
            rep_memo[id(b)] = _fake_param(b, b.dtype, fake_mode)
    return _wrap_all(copy.deepcopy(src, rep_memo), checkpointed)


def _copy_keys(reduced: nn.Module, new_lists: list[nn.ModuleList]) -> tuple[dict[int, object], set]:
    """id(copy module) -> key (a full fqn outside the blocks, (list index, rep index, relative
    path) inside), and the keys of the blocks themselves."""
    keys: dict[int, object] = {}
    block_keys = set()
    for li, new in enumerate(new_lists):
        for ri, rep in enumerate(new):
            block_keys.add((li, ri, ""))
            for name, mod in rep.named_modules(remove_duplicate=False):
                keys.setdefault(id(mod), (li, ri, strip_wrapper(name)))
    lists = {id(new) for new in new_lists}
    for name, mod in reduced.named_modules(remove_duplicate=False):
        if id(mod) not in keys and id(mod) not in lists:
            keys[id(mod)] = strip_wrapper(name)
    return keys, block_keys


def build_copy(model, tree, lists: list[ListPlan], param_dtype_of, checkpoint_outside, fake_mode):
    """The reduced fake copy in train mode, its module keys (``_copy_keys``) and block keys."""
    list_objs = [model.get_submodule(lp.fqn) for lp in lists]
    memo = _fake_outside(model, {id(m) for m in list_objs}, param_dtype_of, fake_mode)
    new_lists = []
    for lp, obj in zip(lists, list_objs):
        reps = []
        for variant, src in lp.reps:
            stop.check()  # a block's copy takes tens of ms at 70B: the Inspector's next edit stops here
            reps.append(_rep_copy(model, tree.modules[src].fqn, variant[1], memo, param_dtype_of, fake_mode))
        new = nn.ModuleList(reps)
        memo[id(obj)] = new
        new_lists.append(new)
    reduced = copy.deepcopy(model, memo)
    _allow_more_layers(reduced, [(len(lp.positions), len(new)) for lp, new in zip(lists, new_lists)])
    _wrap_all(reduced, checkpoint_outside)
    reduced.train()
    keys, block_keys = _copy_keys(reduced, new_lists)
    return reduced, keys, block_keys
