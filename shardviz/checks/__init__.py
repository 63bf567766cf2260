"""Findings: what is wrong with a plan, or costly, and how to fix it.

``run_checks(analysis)`` returns the engine's refusals (``Layout.errors``, SV001-SV008), the
checks below (SV1xx) and the memory check (``check_memory``, SV201), errors first. Every code is
stable: tests, users and the widget grep for them. ``fixes.fix_plan(analysis, finding)`` turns a
finding's fix into a new plan when the fix is a change of plan.

Below ``analysis`` in the layers: every check reads the analysis through its typed view
(``check_inputs.AnalysisView``, a Protocol: the layout, the training, the key/value-cache decision, the
memory table, ...), never the ``Analysis`` class; the what-ifs (SV113, SV201's fixes, SV304) go through its
``price`` (``check_inputs.Priced``: the variant's peak, and its step time or traffic when asked).

| code  | severity | what |
|-------|----------|------|
| SV101 | warning  | ignored parameters, target release has no ``ignored_params`` (< 2.7) |
| SV102 | warning  | trainable parameters ignored: gradients never reduced by FSDP |
| SV103 | warning  | trainable parameters under no ``fully_shard`` call: no gradient sync |
| SV104 | info     | frozen parameters under no call: held whole on every rank |
| SV105 | warning  | the root is the only call: the whole model is all-gathered at once |
| SV106 | warning  | one call's unsharded size dominates the parameter peak |
| SV107 | warning  | padding waste above ``PADDING_WASTE`` of the per-rank shard bytes |
| SV108 | info     | parameters with rows for fewer ranks than the mesh: empty shards |
| SV109 | warning  | a call on modules all of whose parameters are ignored: it shards nothing |
| SV110 | error    | a grouped call ``fully_shard([a, b])`` on a release before 2.5 |
| SV111 | error    | a target release before 2.4 has no ``fully_shard`` |
| SV112 | warning  | trainable parameters both sharded (DTensor) and whole (Tensor): one foreach optimizer group fails |
| SV113 | warning / error | the step runs with ``use_cache=True`` (a key/value cache per layer; the config's without checkpointing, ``Training(use_cache=...)``): the bytes ``use_cache=False`` saves; an error when torch cannot run the plan with the cache (selective checkpointing, a failing recomputation): priced without it |
| SV120-SV125, SV128, SV129 | | an adapter's target_modules that miss this model's projections; a float32 config; quantized weights priced unquantized; a 4-bit storage dtype FSDP2 would cast; uint8 storage that accelerate replicates; quantized weights left trainable; torchao NF4 weights fully_shard cannot split; float8 weights a param_dtype casts (``adapter_checks``) |
| SV202 | info | a plan that fits with reserved − allocated above 10 % of the usable memory: priced with ``expandable_segments:True`` (``allocator_checks``; an over or tight plan is SV201's, which prices it among its fixes) |
"""

from __future__ import annotations


from dataclasses import replace

import numpy as np

from ..activations import selective_cache_refusal
from .adapter_checks import (check_adapter_targets, check_fp8_cast, check_fp32_config, check_nf4_split, check_quant_storage, check_quantized,
                             check_trainable_quantized, check_uint8_storage)
from .allocator_checks import check_reserved_gap
from .check_inputs import AnalysisView, WhatIfPending, without_what_ifs  # noqa: F401 - without_what_ifs: importable here
from ..finding import Finding
from .memory_checks import CHECKPOINT_FIXES, MemoryFix, check_memory, memory_fixes  # noqa: F401 - SV201, importable here
from .fixes import split_unit
from ..format import format_bytes
from ..fsdp import MIN_TORCH, Layout, local_rows, parse_version, shard_rows, supports_grouped_call, supports_ignored_params
from ..model.tree import tree_index
from .origin_checks import check_origin, in_user_terms

#: SV107 fires when padding is more than this fraction of the bytes each rank allocates for shards.
PADDING_WASTE = 0.05
#: SV106 fires when the largest call is more than twice as large as any other and, gathered (all-gather
#: buffer + unsharded copies: twice its unsharded bytes), is more than this fraction of a rank's peak.
DOMINANT_UNIT = 0.5
#: How many parameter names a finding lists at most.
MAX_FQNS = 50

SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


def _installed_torch() -> str:
    import torch

    return torch.__version__


def _first(names) -> dict:
    """The ``fqns``, ``n_fqns`` and ``all_fqns`` of a finding about ``names``: the first ``MAX_FQNS``, how many in all, and all of them."""
    names = list(names)
    return {"fqns": names[:MAX_FQNS], "n_fqns": len(names), "all_fqns": names}


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


# ---------------------------------------------------------------------------
# Release checks (also used by codegen to refuse what the target cannot run)
# ---------------------------------------------------------------------------
def release_findings(layout: Layout, torch_version=None) -> list[Finding]:
    """What the target release (default: the installed torch) cannot do with this plan."""
    version = torch_version if torch_version is not None else _installed_torch()
    release = parse_version(version)
    label = f"{release[0]}.{release[1]}"
    out: list[Finding] = []
    if release < MIN_TORCH:
        out.append(Finding(
            "SV111", "error",
            f"torch {label} has no fully_shard: FSDP2 arrived in torch {MIN_TORCH[0]}.{MIN_TORCH[1]}",
            (), "upgrade to torch >= 2.4 (2.7+ for ignored_params)",
        ))
        return out
    plan = layout.plan
    if plan.ignored and not supports_ignored_params(label):
        out.append(Finding(
            "SV101", "warning",
            f"torch {label} has no `ignored_params` (added in 2.7): passing it raises "
            "\"TypeError: fully_shard() got an unexpected keyword argument 'ignored_params'\". "
            f"sv.export_code for torch {label} keeps the {_plural(len(plan.ignored), 'ignored parameter')} out "
            "without it: it hides them from fully_shard during the calls (their module slots set to None, "
            "then the same parameters put back), and averages their gradients itself",
            **_first(plan.ignored),
            fix=f"use the code from sv.export_code(model, plan, torch_version={label!r}) "
            f"(CLI: shardviz export ... --torch {label}), or torch_version=None to detect the release at run time; "
            "do not pass ignored_params yourself before torch 2.7",
            flags=f"shardviz export ... --torch {label} writes code that runs there (do not pass ignored_params "
                  "yourself before torch 2.7)",
        ))
    if not supports_grouped_call(label):
        grouped = [u for u in plan.units if u.is_grouped]
        if grouped:
            out.append(Finding(
                "SV110", "error",
                f"torch {label} cannot group modules in one call (fully_shard([a, b]) arrived in 2.5); "
                f"this plan has {_plural(len(grouped), 'grouped call')}: {', '.join(u.name for u in grouped)}",
                tuple(m for u in grouped for m in u.modules),
                "target torch >= 2.5, or give each module its own unit (a tied parameter then needs the "
                "enclosing module as the unit)",
            ))
    return out


# ---------------------------------------------------------------------------
# Plan checks
# ---------------------------------------------------------------------------
def check_unsynchronised(inputs: AnalysisView) -> list[Finding]:
    lay, tree = inputs.layout, inputs.tree
    out = []
    world = inputs.mesh.world
    status, trainable = lay.status_code, tree_index(tree).trainable  # arrays: a change of plan reads no ParamInfo

    def params(mask) -> list:
        return [tree.params[p] for p in np.nonzero(mask)[0].tolist()]

    ignored = params((status == 1) & trainable)
    loose = params((status == 2) & trainable)
    frozen = params((status == 2) & ~trainable)
    tail = (
        f"so each of the {world} ranks would train its own copy unless their gradients are averaged"
        if world > 1 else "(harmless on one rank, but each rank would train its own copy on more)"
    )
    if ignored:
        out.append(Finding(
            "SV102", "warning",
            f"{_plural(len(ignored), 'trainable parameter')} ({sum(p.numel for p in ignored):,} elements) "
            f"are ignored: FSDP never reduces their gradients, {tail}",
            **_first([p.fqn for p in ignored]),
            fix="use the code from sv.export_code, which broadcasts them once and averages their gradients in one "
            "all-reduce per step; or all-reduce them yourself (torch's own test pairs ignored_params with DDP); "
            "or let FSDP shard them (drop them from ignored; not 0-dim ones, which fully_shard refuses)",
        ))
    if loose:
        out.append(Finding(
            "SV103", "warning",
            f"{_plural(len(loose), 'trainable parameter')} ({sum(p.numel for p in loose):,} elements) are under "
            f"no fully_shard call: nothing synchronises their gradients, {tail}",
            **_first([p.fqn for p in loose]),
            fix="add the root module \"\" as the last unit (it takes every leftover parameter), or use the code "
            "from sv.export_code, which averages their gradients in one all-reduce per step",
        ))
    if frozen:
        out.append(Finding(
            "SV104", "info",
            f"{_plural(len(frozen), 'frozen parameter')} ({format_bytes(sum(p.nbytes for p in frozen))}) are under no "
            "fully_shard call: every rank holds them whole, and fully_shard does not move them to the device",
            **_first([p.fqn for p in frozen]),
            fix="add the root module \"\" as the last unit so FSDP shards them",
        ))
    return out


def check_root_only(inputs: AnalysisView) -> list[Finding]:
    plan, lay = inputs.plan, inputs.layout
    if len(plan.units) != 1 or plan.units[0].modules != ("",):
        return []
    size = lay.unit_numbers[0]["unsharded_bytes"]
    return [Finding(
        "SV105", "warning",
        f"the root is the only fully_shard call: the whole model ({format_bytes(size)} of parameters) is all-gathered at "
        "once in forward and backward, so each rank's peak holds every parameter unsharded and nothing overlaps "
        "communication with compute",
        ("",),
        "add a unit per repeated block (sv.Plan.auto(model) does), keeping the root as the last call",
        flags="--lora sharded (a fully_shard call per block, the root last)",
    )]


def check_dominant_unit(inputs: AnalysisView) -> list[Finding]:
    """One call's unsharded parameters dominate a rank's peak: most of it, and far above every other call."""
    lay = inputs.layout
    numbers = lay.unit_numbers
    if len(numbers) < 2:
        return []  # a single call is SV105's business (or has no alternative)
    sizes = sorted(n["padded_unsharded_bytes"] for n in numbers)
    biggest, second = sizes[-1], sizes[-2]
    if biggest == 0 or biggest <= 2 * second:
        return []
    peak = int(inputs.memory["peak"].max())
    out = []
    for ul, n in zip(lay.units, numbers):
        size = n["padded_unsharded_bytes"]
        if size != biggest:
            continue
        # While a call is gathered a rank holds its all-gather output and the unsharded parameters
        # copied out of it: twice its unsharded size (one group = one all-gather).
        share = min(1.0, 2 * size / peak) if peak else 1.0
        if share > DOMINANT_UNIT:
            out.append(Finding(
                "SV106", "warning",
                f"call {ul.unit.name} is {format_bytes(size)} unsharded; while it is gathered (all-gather buffer plus "
                f"unsharded copies) it makes up {share:.0%} of the peak per rank ({format_bytes(peak)}); the next largest "
                f"call is {format_bytes(second)}",
                ul.unit.modules,
                "split it: give its largest submodules (embeddings, [norm, lm_head], blocks) their own units, "
                "keeping modules that share a parameter in one call (sv.fix_plan does)"
                if split_unit(inputs.layout, ul) is not None else
                "it cannot be split without breaking a shared parameter or a module apart: shard over more "
                "ranks, or use a lower param_dtype",
            ))
    return out


def check_padding(inputs: AnalysisView) -> list[Finding]:
    lay, tree, shard = inputs.layout, inputs.tree, inputs.mesh.shard
    if shard == 1:
        return []
    index = tree_index(tree)
    sharded = np.nonzero(lay.sharded)[0]
    padded = lay.padded_numel[sharded] * shard * index.itemsize[sharded]
    extra = padded - index.numel[sharded] * index.itemsize[sharded]
    allocated, waste = int(padded.sum()), int(extra.sum())
    if allocated == 0 or waste <= PADDING_WASTE * allocated:
        return []
    worst = [(e, tree.params[p].fqn) for e, p in zip(extra.tolist(), sharded.tolist()) if e]
    worst.sort(key=lambda x: (-x[0], x[1]))
    return [Finding(
        "SV107", "warning",
        f"padding is {waste / allocated:.1%} of what the ranks allocate for shards ({format_bytes(waste / shard)} per rank): "
        f"fully_shard pads dim 0 of each parameter to a multiple of {shard} ranks",
        **_first([f for _, f in worst]),
        fix="use a shard size that divides the first dimension of the largest padded parameters, or keep tiny "
        "parameters (LoRA, norms) out of the sharded groups (ignored, or a mesh with fewer ranks)",
    )]


def check_empty_shards(inputs: AnalysisView) -> list[Finding]:
    lay, tree, shard = inputs.layout, inputs.tree, inputs.mesh.shard
    index = tree_index(tree)
    # the last coordinate gets no rows: local_rows(dim0, shard, shard - 1) == 0 (0-dim parameters have none to split)
    last_empty = index.dim0 - (shard - 1) * shard_rows(index.dim0, shard) <= 0
    hit = np.nonzero(lay.sharded & last_empty)[0]
    hit = hit[np.isin(hit, index.scalars, invert=True)]
    if not hit.size:
        return []
    fewer = int((index.dim0[hit] < shard).sum())
    hit = [tree.params[p] for p in hit.tolist()]
    example = hit[0]
    empty = sum(1 for c in range(shard) if local_rows(example.shape[0], shard, c) == 0)
    return [Finding(
        "SV108", "info",
        f"{_plural(len(hit), 'sharded parameter')} leave some of the {shard} ranks an empty shard "
        f"({fewer} have fewer rows than ranks); e.g. {example.fqn!r} {example.shape}: {empty} ranks hold 0 rows "
        f"yet allocate {lay.shard_shape(example.index)[0]} padded rows",
        **_first([p.fqn for p in hit]),
        fix="usually nothing to do: each such parameter costs at most one padded row per rank, counted in the "
        "memory table; a shard size no larger than their first dimension avoids it (HSDP: fewer ranks per "
        "shard group, more replicas)",
    )]


def check_all_ignored_units(inputs: AnalysisView) -> list[Finding]:
    lay, tree = inputs.layout, inputs.tree
    ignored = tree.param_indices(inputs.plan.ignored)
    if not ignored:  # no call can have every parameter ignored (1.4 ms a plan at 70B)
        return []
    out = []
    for ul in lay.units:
        params = {p for m in ul.modules for p in tree.subtree_params(m)}
        if params and params <= ignored:
            out.append(Finding(
                "SV109", "warning",
                f"every parameter under call {ul.unit.name} is ignored ({_plural(len(params), 'parameter')}): "
                "the call shards nothing and only adds FSDP hooks",
                ul.unit.modules,
                "drop the unit, or drop its parameters from ignored to shard them",
            ))
    return out


def check_mixed_optimizer_groups(inputs: AnalysisView) -> list[Finding]:
    """Sharded parameters are DTensors, whole ones plain tensors; torch's foreach optimizer kernels
    (the default for accelerator tensors) raise "got mixed torch.Tensor and DTensor" on one group
    holding both (checked against torch in tests/test_mixed_optimizer.py)."""
    lay, tree = inputs.layout, inputs.tree
    trainable = tree_index(tree).trainable
    sharded, whole = np.nonzero(trainable & lay.sharded)[0], np.nonzero(trainable & ~lay.sharded)[0]
    if not sharded.size or not whole.size:
        return []
    sharded, whole = [tree.params[p] for p in sharded.tolist()], [tree.params[p] for p in whole.tolist()]
    return [Finding(
        "SV112", "warning",
        f"trainable parameters of both kinds: {_plural(len(sharded), 'sharded parameter')} (DTensor) and "
        f"{_plural(len(whole), 'whole parameter')} (plain Tensor); an optimizer with one group over all of them "
        "raises 'got mixed torch.Tensor and DTensor' at step() with foreach kernels (torch's default on GPU)",
        **_first([p.fqn for p in whole]),
        fix="build the optimizer from optimizer_param_groups(model), which the exported code defines "
        "(one group of DTensors, one of plain tensors), or pass foreach=False",
    )]


USE_CACHE_FIX = ("Training(use_cache=False) (CLI: --no-use-cache); in the training script set "
                 "model.config.use_cache = False (or pass use_cache=False to the forward)")


def selective_with_cache(checkpoint, use_cache: bool) -> list[Finding]:
    """SV113 as an error: modules checkpointed selectively (``checkpoint``: a ``Plan.checkpoint``) in
    a step that keeps the key/value cache (``use_cache``). The recomputation updates the cache again,
    so it runs other ops than the forward did, and torch's selective checkpointing raises in backward
    (checked: tests/test_activation_truth.py). The analysis then measures the step without the cache."""
    refusal = selective_cache_refusal(checkpoint, use_cache)  # the cache decision's rule (activations.step_cache)
    if refusal is None:
        return []
    return [Finding("SV113", "error", refusal, **_first(checkpoint.selective), fix=USE_CACHE_FIX)]


def _cache_refused(inputs: AnalysisView) -> list[Finding]:
    """SV113 as an error: torch cannot run the plan with the cache the training asks for (its
    checkpointed recomputation fails), so the numbers are those of the step without it."""
    return [Finding(
        "SV113", "error",
        f"use_cache=True with this plan's checkpointing is a step torch cannot run: {inputs.cache_refused[:400]}; "
        "priced with use_cache=False",
        **_first(inputs.plan.checkpoint), fix=USE_CACHE_FIX,
    )]


def check_use_cache(inputs: AnalysisView) -> list[Finding]:
    """SV113: the step runs with ``use_cache=True`` (the config's, without checkpointing, or the
    training's): each training forward also fills a key/value cache holding every layer's keys and
    values until the output is dropped. The predicted peak counts it; with a batch, the finding says
    how many bytes ``use_cache=False`` saves (the same analysis measured without the cache). Without
    a batch there is nothing to price: a warning only when modules are checkpointed (the cache keeps
    what checkpointing frees). An error when torch cannot run the plan with the cache (selective
    checkpointing, a recomputation that fails): the plan is priced without it."""
    if not inputs.cache.use_cache:  # the step's decision (activations.step_cache)
        return []
    refusal = selective_with_cache(inputs.plan.checkpoint, True)
    if refusal or not (inputs.training.with_activations and inputs.measures):
        return refusal or ([Finding(
            "SV113", "warning",
            f"{_plural(len(inputs.plan.checkpoint), 'module')} are checkpointed with use_cache=True: each "
            "training forward also fills a key/value cache that keeps every layer's keys and "
            "values alive until the loss (give Training(batch_size=...) to have it measured and priced)",
            **_first(inputs.plan.checkpoint), fix=USE_CACHE_FIX,
        )] if inputs.plan.checkpoint else [])
    peak = int(inputs.memory["peak"].max())
    if inputs.cache_refused:
        return _cache_refused(inputs)
    try:
        without = inputs.price(training=replace(inputs.training, use_cache=False)).peak
    except WhatIfPending:
        return [Finding("SV113", "warning", "the step runs with use_cache=True: each training forward also fills a "
                        "key/value cache that keeps every layer's keys and values alive until the output is dropped; "
                        f"the predicted peak ({format_bytes(peak)}) counts it; what use_cache=False saves is being priced",
                        **_first(inputs.plan.checkpoint), fix=USE_CACHE_FIX, pending=True)]
    except Exception as exc:  # noqa: BLE001 - a what-if never crashes the analysis: it becomes the finding's words
        return [Finding("SV113", "warning", "the step keeps a key/value cache (use_cache=True); the step without it "
                        f"could not be priced ({type(exc).__name__}: {str(exc)[:200]})", fix=USE_CACHE_FIX)]
    if without >= peak:
        return []
    ckpt = (f" ({_plural(len(inputs.plan.checkpoint), 'module')} checkpointed: the cache keeps what they would free)"
            if inputs.plan.checkpoint else "")
    return [Finding(
        "SV113", "warning",
        "the step runs with use_cache=True: each training forward also fills a key/value cache that keeps "
        f"every layer's keys and values alive until the output is dropped{ckpt}; the predicted peak "
        f"({format_bytes(peak)}) counts it, use_cache=False saves {format_bytes(peak - without)} "
        f"({peak - without:,} bytes) on the worst rank (peak {format_bytes(without)})",
        **_first(inputs.plan.checkpoint), fix=USE_CACHE_FIX,
    )]


CHECKS = (
    check_unsynchronised,
    check_mixed_optimizer_groups,
    check_root_only,
    check_dominant_unit,
    check_padding,
    check_empty_shards,
    check_all_ignored_units,
    check_use_cache,
    check_adapter_targets,
    check_fp32_config,
    check_quantized,
    check_quant_storage,
    check_nf4_split,
    check_fp8_cast,
    check_uint8_storage,
    check_trainable_quantized,
)


def run_checks(analysis, torch_version=None) -> list[Finding]:
    """Every finding for ``analysis``, errors first (``findings_of`` the analysis, read as an ``AnalysisView``).

    ``torch_version``: the release the plan will run on (default: the analysis's ``torch_version``,
    else the installed torch).
    """
    return findings_of(analysis, torch_version)


def findings_of(inputs: AnalysisView, torch_version=None) -> list[Finding]:
    """Every finding for the analysis ``inputs`` reads as its typed view (``check_inputs.AnalysisView``),
    errors first; ``torch_version``: the release judged (default: the view's)."""
    findings = list(inputs.layout.errors)
    findings += release_findings(inputs.layout, torch_version if torch_version is not None else inputs.torch_version)
    for check in CHECKS:
        findings += check(inputs)
    findings += check_memory(inputs)
    findings += check_reserved_gap(inputs)  # SV202
    findings = in_user_terms(findings + check_origin(inputs), inputs.plan)  # captured plans (SV3xx)
    order = {id(f): i for i, f in enumerate(findings)}
    return sorted(findings, key=lambda f: (SEVERITY_ORDER[f.severity], order[id(f)]))
