"""``Plan.auto``: the per-block layout that torchtitan and torchtune use, found from the tree."""

from __future__ import annotations

from .plan import Plan, Unit
from .tree import ModelTree


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


def find_blocks(tree: ModelTree, min_share: float = 0.05) -> list[int]:
    """The repeated blocks: children of every outermost ModuleList whose children share one class
    and that holds at least ``min_share`` of the parameters (Llama's layers; an encoder's and a
    decoder's layers; not the experts inside a block)."""
    numel = subtree_numel(tree)
    blocks: list[int] = []
    lists: list[int] = []
    for info in tree.modules:  # preorder: an outer list is seen before the lists inside it
        if info.type_name != "ModuleList" or len(info.children) < 2:
            continue
        if any(tree.is_inside(info.index, outer) for outer in lists):
            continue
        kinds = {tree.modules[c].type_name for c in info.children}
        if len(kinds) == 1 and numel[info.index] >= min_share * max(numel[0], 1):
            lists.append(info.index)
            blocks.extend(info.children)
    return blocks


def _topmost_without(tree: ModelTree, module: int, avoid: list[int]) -> int:
    """Climb from ``module`` while the parent does not contain any module in ``avoid``."""
    while True:
        parent = tree.modules[module].parent
        if parent < 0 or any(tree.is_inside(a, parent) for a in avoid):
            return module
        module = parent


def auto_plan(tree: ModelTree, lora: str, checkpoint: str | None = None) -> Plan:
    blocks = find_blocks(tree)
    in_block = lambda m: any(tree.is_inside(m, b) for b in blocks)  # noqa: E731

    # Embeddings: Embedding modules outside the blocks, climbed as far as they stay apart.
    embed_modules = [
        m.index for m in tree.modules if "Embedding" in m.type_name and m.params and not in_block(m.index)
        and all(tree.params[p].role == "base" for p in m.params)
    ]
    embeds = list(dict.fromkeys(_topmost_without(tree, e, blocks) for e in embed_modules))

    # The head: every other module outside the blocks that holds base parameters (final norm, lm_head).
    head: list[int] = []
    for p in tree.params:
        if p.role != "base":
            continue
        for owner in p.owners:  # every owner: a tied lm_head owns the embedding's weight too
            if in_block(owner) or owner == 0 or any(tree.is_inside(owner, e) for e in embeds):
                continue
            top = _topmost_without(tree, owner, blocks + embeds)
            if top != 0 and top not in head:
                head.append(top)
    head.sort()

    # A parameter may not be split across two calls: tied embeddings join the head's group.
    head_params = {p for h in head for p in tree.subtree_params(h)}
    tied = [e for e in embeds if head_params & set(tree.subtree_params(e))]
    if tied:
        head = sorted(head + tied)
        embeds = [e for e in embeds if e not in tied]

    fqn = lambda m: tree.modules[m].fqn  # noqa: E731
    units: list = [fqn(b) for b in blocks]
    ignored: list[str] = []
    if lora == "separate":
        adapters = dict.fromkeys(tree.params[p].owners[0] for p in range(len(tree.params)) if tree.params[p].role == "lora")
        units = [fqn(a) for a in adapters] + units
    elif lora == "ignored":
        ignored = [p.fqn for p in tree.params if p.role == "lora"]
    if embeds:
        units.append(fqn(embeds[0]) if len(embeds) == 1 else [fqn(e) for e in embeds])
    if head:
        units.append(fqn(head[0]) if len(head) == 1 else [fqn(h) for h in head])
    units.append(Unit(""))
    wrapped = [fqn(b) for b in blocks] if checkpoint == "blocks" else []
    label = f"auto (LoRA {lora}" + (", blocks checkpointed)" if wrapped else ")")
    return Plan(units, ignored, name=label, checkpoint=wrapped)
