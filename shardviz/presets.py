"""``sv.auto_plan`` (``sv.Plan.auto``): the per-block layout that torchtitan and torchtune use, found from the tree.

Above ``fsdp`` in the layers: calls that would share a parameter are found with ``Layout`` (the
engine's ownership rule) and joined into one call."""

from __future__ import annotations

import weakref
from dataclasses import replace
from typing import NamedTuple

from .checkpointing import SELECTIVE, CheckpointPreset, parse_checkpoint
from .fsdp import Layout
from .run.mesh import Mesh
from .plan import LORA_OPTIONS, Plan, Unit, closest_hint
from .tp.tp_presets import preset as tp_preset
from .model.tree import ModelTree, as_tree, children_with_params, subtree_numel


def find_blocks(tree: ModelTree, min_share: float = 0.05) -> list[int]:
    """The repeated blocks: the children of every outermost ModuleList that holds at least
    ``min_share`` of the parameters (Llama's layers; an encoder's and a decoder's layers; not the
    experts inside a block). One block is enough (a 1-layer model), and the blocks may differ in
    class: a hybrid stack (attention, Mamba, cross-attention layers) is still the list to shard,
    one call per layer, as torchtitan does. A child that is itself a bare ModuleList/ModuleDict
    (Funnel's ``encoder.blocks.0``) is opened, since ``fully_shard`` refuses such a container;
    a child without parameters gets no call. When no list reaches ``min_share`` (BLT, where hash
    embeddings hold 95 % of the parameters), every outermost list is taken."""
    numel = subtree_numel(tree)
    blocks: list[int] = []
    lists: list[int] = []

    def add(module: int) -> None:
        info = tree.modules[module]
        if numel[module] == 0:
            return
        if info.bare_container:
            for child in info.children:
                add(child)
        else:
            blocks.append(module)

    for info in tree.modules:  # preorder: an outer list is seen before the lists inside it
        if info.type_name != "ModuleList" or not info.children or info.index == 0:
            continue
        if any(tree.is_inside(info.index, outer) for outer in lists):
            continue
        if numel[info.index] >= min_share * max(numel[0], 1):
            lists.append(info.index)
            for child in info.children:
                add(child)
    if not blocks and min_share > 0:  # every list is small next to the rest (BLT's hash embeddings): take them all
        return find_blocks(tree, 0.0)
    return blocks


def _topmost_without(tree: ModelTree, module: int, avoid: list[int]) -> int:
    """Climb from ``module`` while the parent does not contain any module in ``avoid``, is not the
    root (the root has its own call) and is not a bare container (``fully_shard`` refuses one)."""
    while True:
        parent = tree.modules[module].parent
        if parent <= 0 or tree.modules[parent].bare_container or any(tree.is_inside(a, parent) for a in avoid):
            return module
        module = parent


def auto_plan(model, lora: str = "sharded", checkpoint: str | CheckpointPreset | None = None,
              tensor_parallel=None) -> Plan:
    """``sv.Plan.auto`` / ``sv.auto_plan``: the per-block preset: every repeated block, the embeddings,
    [final norm, lm_head], the root (``model``: an ``nn.Module`` or a ``ModelTree``).

    ``lora``: "sharded" keeps LoRA in its block's call; "ignored" lists every LoRA
    parameter in ``ignored``; "separate" gives each LoRA adapter module its own call.
    ``checkpoint``: None; "blocks" wraps every block in ``checkpoint_wrapper``; "every k"
    (``"every 2"``, ...) every k-th block, as torchtitan's "selective layer" option does
    (its 1-based block counter: blocks k-1, 2k-1, ... counting from 0); "selective" every
    block with the "selective" policy (torchtitan's "selective op"); or a ``CheckpointPreset``.
    ``tensor_parallel``: None; True: the model's own plan (what transformers'
    ``from_pretrained(tp_plan="auto")`` applies); "torchtitan": torchtitan's Llama-family plan
    (``shardviz.tp``); or a mapping module FQN -> style.
    """
    if lora not in LORA_OPTIONS:
        raise ValueError(f"lora={lora!r}: expected one of {LORA_OPTIONS}")
    parse_checkpoint(checkpoint)  # a bad value fails before the walk
    tree = as_tree(model)
    plan, blocks = _auto_calls(tree, lora)
    plan = checkpointed(plan, blocks, lora, checkpoint, tree)
    if tensor_parallel is None or tensor_parallel is False:
        return plan
    return plan.with_tensor_parallel(tp_preset(tree, tensor_parallel))


def _auto_calls(tree: ModelTree, lora: str) -> tuple[Plan, list[str]]:
    """``Plan.auto``'s calls and ignored parameters (no checkpointing), and its blocks' FQNs."""
    if tree.modules[0].bare_container:  # a ModuleList as the model: no root call, one per child
        blocks = children_with_params(tree, 0)
    else:
        blocks = find_blocks(tree)
    embeds, head = _embeddings_and_head(tree, blocks)
    fqn = lambda m: tree.modules[m].fqn  # noqa: E731
    units: list = [fqn(b) for b in blocks]
    ignored: list[str] = []
    if lora == "separate":
        adapters = dict.fromkeys(p.owners[0] for p in tree.params if p.role == "lora")
        units = [fqn(a) for a in adapters] + units
    elif lora == "ignored":
        ignored = [p.fqn for p in tree.params if p.role == "lora"]
    # fully_shard refuses 0-dim parameters (SV002): keep them out of FSDP (CLIP's logit_scale).
    ignored += [p.fqn for p in tree.params if not p.shape and p.fqn not in ignored]
    for group in (embeds, head):
        if group:
            units.append(fqn(group[0]) if len(group) == 1 else [fqn(m) for m in group])
    if not tree.modules[0].bare_container:
        units.append(Unit(""))
    return _join_shared_calls(tree, Plan(units, ignored, name=auto_name(tree, lora))), [fqn(b) for b in blocks]


def auto_name(tree: ModelTree, lora: str, *more: str) -> str:
    """ "auto (LoRA sharded, blocks checkpointed)"; a model without LoRA is not named after it: "auto"."""
    has_lora = any(p.role == "lora" for p in tree.params)
    parts = ([f"LoRA {lora}"] if has_lora else []) + list(more)
    return f"auto ({', '.join(parts)})" if parts else "auto"


def _embeddings_and_head(tree: ModelTree, blocks: list[int]) -> tuple[list[int], list[int]]:
    """The modules outside the blocks: the embeddings, and the head (final norm, lm_head; tied
    embeddings join it, since a parameter may not be split across two calls)."""
    inside = {m for b in blocks for m in range(b, tree.modules[b].subtree_end)}  # tree.is_inside of any block
    in_block = inside.__contains__
    # Embeddings: Embedding modules outside the blocks, climbed as far as they stay apart.
    embed_modules = [
        m.index for m in tree.modules if "Embedding" in m.type_name and m.params and not in_block(m.index)
        and m.index != 0 and not m.bare_container and all(tree.params[p].role == "base" for p in m.params)
    ]
    embeds = list(dict.fromkeys(_topmost_without(tree, e, blocks) for e in embed_modules))
    # The head: every other module outside the blocks that holds base parameters.
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
    head_params = {p for h in head for p in tree.subtree_params(h)}
    tied = [e for e in embeds if head_params & set(tree.subtree_params(e))]
    return [e for e in embeds if e not in tied], sorted(head + tied)


def _join_shared_calls(tree: ModelTree, plan: Plan) -> Plan:
    """Blocks that share parameters (Zamba's shared transformer reached from several hybrid layers)
    would each make their own sharded copy (SV001): put them in one call."""
    for _ in range(len(plan.units)):
        shared = [f for f in Layout(tree, plan, Mesh(1)).errors if f.code == "SV001"]
        if not shared:
            break
        joined = join_calls(tree, plan, shared[0].fqns)
        if joined == plan:
            break
        plan = joined
    return plan


def checkpointed(plan: Plan, blocks: list[str], lora: str, checkpoint: str | CheckpointPreset | None,
                 tree: ModelTree) -> Plan:
    """``plan`` with the blocks checkpointed as ``Plan.auto(checkpoint=...)`` says: every block in
    full ("blocks"), every k-th in full ("every k": torchtitan's selective layer option counts
    blocks from 1 and wraps those where count % k == 0), every block selectively ("selective")."""
    preset = parse_checkpoint(checkpoint)
    if preset is None:
        return plan
    what = ("blocks" if preset.every == 1 else preset.which_blocks) + " checkpointed" + (
        " selectively" if preset.policy is SELECTIVE else "")
    return Plan(plan.units, plan.ignored, auto_name(tree, lora, what), preset.chosen(blocks))


def join_calls(tree: ModelTree, plan: Plan, param_fqns) -> Plan:
    """One call for parameter names now reached by several calls: a call nested inside another is
    dropped (the outer one takes its parameters), the rest are grouped into one ``fully_shard([...])``."""
    lay = Layout(tree, plan, Mesh(1))
    calls = sorted({lay.enclosing_unit(f) for f in param_fqns} - {-1})
    if len(calls) < 2:
        return plan
    mods = {u: [tree.module_index[m] for m in plan.units[u].modules] for u in calls}
    inner = {u for u in calls for v in calls if u != v and all(
        any(tree.is_inside(m, o) for o in mods[v]) for m in mods[u])}
    keep = [u for u in calls if u not in inner]
    joined = [m for u in keep for m in plan.units[u].modules]
    merged = replace(plan.units[keep[0]], modules=joined)
    units = [merged if i == keep[0] else u for i, u in enumerate(plan.units) if i not in calls or i == keep[0]]
    return plan.with_units(units)


#: The checkpointing presets a plan is recognised by ("every k" stands for k = 2, torchtitan's default).
NAMED_CHECKPOINTS = (None, "blocks", "every 2", "selective")


class Preset(NamedTuple):
    """One preset: ``key`` is how the Inspector's menu and ``apply_preset`` name it, ``label`` what
    the menu shows, ``lora`` the ``Plan.auto(lora=...)`` it is (the CLI's ``--lora``, the
    search's ``Candidate.lora``), None for the two plans that are not ``Plan.auto``. An auto
    preset's key is its ``lora``: one spelling in the widget, the CLI, ``Plan.auto`` and the search."""

    key: str
    label: str
    lora: str | None = None


#: The one registry of presets: the Inspector's menu, its plan names and the export's read it; its
#: ``lora`` values are ``plan.LORA_OPTIONS`` (what ``Plan.auto``, the CLI's --lora and the search take).
PRESETS = (
    Preset("sharded", "auto, LoRA sharded: in its block's call", "sharded"),
    Preset("ignored", "auto, LoRA ignored", "ignored"),
    Preset("separate", "auto, LoRA separate: a call per adapter", "separate"),
    Preset("root-only", "root only"),
    Preset("no-calls", "no calls"),
)
assert tuple(p.lora for p in PRESETS if p.lora) == LORA_OPTIONS
assert all(p.key == p.lora for p in PRESETS if p.lora)


def preset_plan(tree: ModelTree, key: str, checkpoint: str | None = None) -> Plan:
    """The plan of preset ``key`` (``PRESETS``) for this model; ``checkpoint`` as ``Plan.auto``'s."""
    preset = next((p for p in PRESETS if p.key == key), None)
    if preset is None:
        raise ValueError(f"preset {key!r}: expected one of {[p.key for p in PRESETS]}")
    if preset.lora is not None:
        return auto_plan(tree, preset.lora, checkpoint)
    return Plan([""] if key == "root-only" else [], name=preset.label)


_PRESETS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # tree -> {(key, checkpoint): Plan}


def _preset_variants(tree: ModelTree) -> dict[tuple[str, str | None], Plan]:
    """Every preset of this model with each of ``NAMED_CHECKPOINTS`` (the two plans that are not
    ``Plan.auto`` without checkpointing only). Computed once per tree."""
    if tree not in _PRESETS:
        out = {}
        for preset in PRESETS:
            if preset.lora is None:
                out[preset.key, None] = preset_plan(tree, preset.key)
                continue
            try:
                plan, blocks = _auto_calls(tree, preset.lora)  # once per preset: checkpointing only wraps it
            except ValueError:  # a model no per-block preset fits (calls that cannot go bottom-up)
                continue
            out.update({(preset.key, c): checkpointed(plan, blocks, preset.lora, c, tree) for c in NAMED_CHECKPOINTS})
        _PRESETS[tree] = out
    return _PRESETS[tree]


def preset_plans(tree: ModelTree, checkpoints=NAMED_CHECKPOINTS) -> dict[str, Plan]:
    """Every preset of this model by its name, with each of ``checkpoints``: ``Plan.auto`` for each
    LoRA option, then the root alone and no calls."""
    variants = _preset_variants(tree)
    plans = [plan for c in checkpoints for p in PRESETS if p.lora
             if (plan := variants.get((p.key, c))) is not None and (c is None or plan.checkpoint)]
    return {plan.name: plan for plan in plans + [variants[p.key, None] for p in PRESETS if not p.lora]}


def preset_key(tree: ModelTree, plan: Plan) -> str:
    """The key of the preset ``plan`` is (with any of ``NAMED_CHECKPOINTS``: a preset keeps the
    checkpointing, and any tensor-parallel entries: the mesh's tensor dim runs them, a preset applied
    keeps them), compared as plans, not by name; "" for any other plan."""
    fsdp_part = plan.with_tensor_parallel(()) if plan.tensor_parallel else plan
    return next((key for (key, _), preset in _preset_variants(tree).items() if preset == fsdp_part), "")


def named_plan(tree: ModelTree, plan: Plan) -> Plan:
    """``plan`` under the name it goes by everywhere (widget, export, CLI): a preset's name when it
    equals that preset (its own name when that is one of them: without LoRA the three LoRA options are one
    plan), else its own name."""
    presets = preset_plans(tree)
    if presets.get(plan.name) == plan:
        return plan
    for name, preset in presets.items():
        if preset == plan:
            return plan.renamed(name)
    return plan


def blocks_without_calls(tree: ModelTree, plan: Plan) -> list[str]:
    """The repeated blocks (``find_blocks``) with no ``fully_shard`` call on them or inside them while
    a sibling in the same list has one: the call above gathers them (the root's, at worst). A plan
    made for a model with fewer layers (28 for Qwen2.5-7B) on one with more (Llama-3.1-8B's 32)
    leaves exactly these."""
    tree = as_tree(tree)
    called = [tree.module_index[m] for u in plan.units for m in u.modules if m in tree.module_index]
    groups: dict[int, list[int]] = {}
    for b in find_blocks(tree):
        groups.setdefault(tree.modules[b].parent, []).append(b)
    out = []
    for blocks in groups.values():
        own = [b for b in blocks if any(c == b or tree.is_inside(c, b) for c in called)]
        if own:
            out += [tree.modules[b].fqn for b in blocks if b not in own]
    return out


def _listed(names: list[str], n: int = 4) -> str:
    shown = ", ".join(repr(x) for x in names[:n])
    return shown + (f" and {len(names) - n} more" if len(names) > n else "")


def plan_mismatch(tree: ModelTree, plan: Plan) -> list[str]:
    """What makes ``plan`` (a plan file) another model's, in sentences: every unit, ignored, checkpoint
    and prefetch name this model does not have, and the blocks its units miss (``blocks_without_calls``);
    [] when it matches."""
    tree = as_tree(tree)
    out = []
    modules = [m for u in plan.units for m in u.modules if m not in tree.module_index]
    for field, names in (("units", modules), ("ignored", [p for p in plan.ignored if p not in tree.param_index]),
                         ("checkpoint", [c for c in plan.checkpoint if c not in tree.module_index]),
                         ("prefetch", [n for m, _, t in plan.prefetch for n in (m, *t) if n not in tree.module_index])):
        if names:
            what = ("parameter" if field == "ignored" else "module") + ("s" if len(names) > 1 else "")
            known = tree.param_index if field == "ignored" else tree.module_index
            out.append(f"{field}: no {what} named {_listed(names)} in {tree.root_type}"
                       f"{' (' + str(len(names)) + ' in all)' if len(names) > 4 else ''}.{closest_hint(names[0], known)}")
    missed = blocks_without_calls(tree, plan)
    if missed:
        parent = tree.modules[tree.modules[tree.module_index[missed[0]]].parent].fqn
        total = len(tree.modules[tree.module_index[parent]].children)
        above = _call_above(tree, plan, tree.module_index[missed[0]])
        fate = ("the root call (fully_shard(model)) would gather them" if above == ""
                else f"the call on {above!r} would gather them" if above is not None
                else "no call would shard them: every rank would hold them whole")
        out.append(f"its units miss {len(missed)} of the {total} blocks of {parent!r} ({_listed(missed)}): they have "
                   f"no fully_shard call of their own while their siblings do, so {fate}; was the plan made for a "
                   f"model with {total - len(missed)} layers?")
    return out


def _call_above(tree: ModelTree, plan: Plan, module: int) -> str | None:
    """The module of the innermost call holding ``module`` ("" for the root), or None when no call does."""
    while module >= 0:
        fqn = tree.modules[module].fqn
        if plan.unit_of(fqn) is not None:
            return fqn
        module = tree.modules[module].parent
    return None
