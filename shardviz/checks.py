"""Findings: what is wrong with a plan, or costly, and how to fix it.

``run_checks(analysis)`` returns the engine's refusals (``Layout.errors``, SV001-SV008), the
checks below (SV1xx) and the memory check (``check_memory``, SV201), errors first. Every code is
stable: tests, users and the widget grep for them. ``fixes.fix_plan(analysis, finding)`` turns a
finding's fix into a new plan when the fix is a change of plan.

Below ``analysis`` in the layers: every check reads the analysis it is given and never imports
``Analysis``; SV201 prices its fixes with ``analysis.what_if(...)``: their peak, and the time each
costs from the fixed analysis' ``a.step``.

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
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from .finding import Finding
from .fixes import split_unit
from .format import format_bytes, format_duration, worst_rank
from .fsdp import MIN_TORCH, Layout, local_rows, parse_version, supports_grouped_call, supports_ignored_params
from .plan import checkpoint_preset
from .presets import find_blocks

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
def check_unsynchronised(analysis) -> list[Finding]:
    lay, tree = analysis.layout, analysis.tree
    out = []
    world = analysis.mesh.world
    ignored = [p for p in tree.params if lay.param_status[p.index] == "ignored" and p.requires_grad]
    loose = [p for p in tree.params if lay.param_status[p.index] == "unmanaged" and p.requires_grad]
    frozen = [p for p in tree.params if lay.param_status[p.index] == "unmanaged" and not p.requires_grad]
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


def check_root_only(analysis) -> list[Finding]:
    plan, lay = analysis.plan, analysis.layout
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
    )]


def check_dominant_unit(analysis) -> list[Finding]:
    """One call's unsharded parameters dominate a rank's peak: most of it, and far above every other call."""
    lay = analysis.layout
    numbers = lay.unit_numbers
    if len(numbers) < 2:
        return []  # a single call is SV105's business (or has no alternative)
    sizes = sorted(n["padded_unsharded_bytes"] for n in numbers)
    biggest, second = sizes[-1], sizes[-2]
    if biggest == 0 or biggest <= 2 * second:
        return []
    peak = int(analysis.memory["peak"].max())
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
                if split_unit(analysis, ul) is not None else
                "it cannot be split without breaking a shared parameter or a module apart: shard over more "
                "ranks, or use a lower param_dtype",
            ))
    return out


def check_padding(analysis) -> list[Finding]:
    lay, tree, shard = analysis.layout, analysis.tree, analysis.mesh.shard
    if shard == 1:
        return []
    allocated = waste = 0
    worst = []
    for p in tree.params:
        if lay.param_status[p.index] != "sharded":
            continue
        padded = lay.padded_shard_numel(p.index) * shard
        allocated += padded * p.itemsize
        extra = (padded - p.numel) * p.itemsize
        waste += extra
        if extra:
            worst.append((extra, p.fqn))
    if allocated == 0 or waste <= PADDING_WASTE * allocated:
        return []
    worst.sort(key=lambda x: (-x[0], x[1]))
    return [Finding(
        "SV107", "warning",
        f"padding is {waste / allocated:.1%} of what the ranks allocate for shards ({format_bytes(waste / shard)} per rank): "
        f"fully_shard pads dim 0 of each parameter to a multiple of {shard} ranks",
        **_first([f for _, f in worst]),
        fix="use a shard size that divides the first dimension of the largest padded parameters, or keep tiny "
        "parameters (LoRA, norms) out of the sharded groups (ignored, or a mesh with fewer ranks)",
    )]


def check_empty_shards(analysis) -> list[Finding]:
    lay, tree, shard = analysis.layout, analysis.tree, analysis.mesh.shard
    hit = []
    for p in tree.params:
        if lay.param_status[p.index] != "sharded" or not p.shape:
            continue
        if local_rows(p.shape[0], shard, shard - 1) == 0:
            hit.append(p)
    if not hit:
        return []
    fewer = sum(1 for p in hit if p.shape[0] < shard)
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


def check_all_ignored_units(analysis) -> list[Finding]:
    lay, tree = analysis.layout, analysis.tree
    ignored = {tree.param_index[f] for f in analysis.plan.ignored}
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


def check_mixed_optimizer_groups(analysis) -> list[Finding]:
    """Sharded parameters are DTensors, whole ones plain tensors; torch's foreach optimizer kernels
    (the default for accelerator tensors) raise "got mixed torch.Tensor and DTensor" on one group
    holding both (checked against torch in tests/test_mixed_optimizer.py)."""
    lay, tree = analysis.layout, analysis.tree
    trainable = [p for p in tree.params if p.requires_grad]
    sharded = [p for p in trainable if lay.param_status[p.index] == "sharded"]
    whole = [p for p in trainable if lay.param_status[p.index] != "sharded"]
    if not sharded or not whole:
        return []
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


def _keeps_cache(analysis) -> bool:
    """The step is a Hugging Face forward run with ``use_cache=True`` (``Analysis.use_cache``: the
    training's, else the config's unless the plan checkpoints)."""
    return bool(getattr(analysis, "use_cache", False))


def selective_with_cache(analysis) -> list[Finding]:
    """SV113 as an error: modules checkpointed selectively in a step that keeps the key/value cache.
    The recomputation updates the cache again, so it runs other ops than the forward did, and torch's
    selective checkpointing raises in backward (checked: tests/test_activation_truth.py). The plan is
    then priced without the cache (``Analysis._measured_step``)."""
    selective = analysis.plan.checkpoint.selective
    if not selective or not _keeps_cache(analysis):
        return []
    return [Finding(
        "SV113", "error",
        f"{_plural(len(selective), 'module')} checkpointed selectively with use_cache=True: the recomputation in "
        "backward fills the key/value cache again, and torch's selective checkpointing raises ('... invocation "
        "index ... encountered during backward but not found in storage'); priced with use_cache=False",
        **_first(selective), fix=USE_CACHE_FIX,
    )]


def _cache_refused(analysis) -> list[Finding]:
    """SV113 as an error: torch cannot run the plan with the cache the training asks for (its
    checkpointed recomputation fails), so the numbers are those of the step without it."""
    return [Finding(
        "SV113", "error",
        f"use_cache=True with this plan's checkpointing is a step torch cannot run: {analysis.cache_refused[:400]}; "
        "priced with use_cache=False",
        **_first(analysis.plan.checkpoint), fix=USE_CACHE_FIX,
    )]


def check_use_cache(analysis) -> list[Finding]:
    """SV113: the step runs with ``use_cache=True`` (the config's, without checkpointing, or the
    training's): each training forward also fills a key/value cache holding every layer's keys and
    values until the output is dropped. The predicted peak counts it; with a batch, the finding says
    how many bytes ``use_cache=False`` saves (the same analysis measured without the cache). Without
    a batch there is nothing to price: a warning only when modules are checkpointed (the cache keeps
    what checkpointing frees). An error when torch cannot run the plan with the cache (selective
    checkpointing, a recomputation that fails): the plan is priced without it."""
    if not _keeps_cache(analysis):
        return []
    refusal = selective_with_cache(analysis)
    if refusal or not (analysis.training.with_activations and analysis.model is not None):
        return refusal or ([Finding(
            "SV113", "warning",
            f"{_plural(len(analysis.plan.checkpoint), 'module')} are checkpointed with use_cache=True: each "
            "training forward also fills a key/value cache that keeps every layer's keys and "
            "values alive until the loss (give Training(batch_size=...) to have it measured and priced)",
            **_first(analysis.plan.checkpoint), fix=USE_CACHE_FIX,
        )] if analysis.plan.checkpoint else [])
    peak = int(analysis.memory["peak"].max())
    if analysis.cache_refused:
        return _cache_refused(analysis)
    try:
        without = int(analysis.without_kv_cache().memory["peak"].max())
    except Exception as exc:  # noqa: BLE001 - a what-if never crashes the analysis: it becomes the finding's words
        return [Finding("SV113", "warning", "the step keeps a key/value cache (use_cache=True); the step without it "
                        f"could not be priced ({type(exc).__name__}: {str(exc)[:200]})", fix=USE_CACHE_FIX)]
    if without >= peak:
        return []
    ckpt = (f" ({_plural(len(analysis.plan.checkpoint), 'module')} checkpointed: the cache keeps what they would free)"
            if analysis.plan.checkpoint else "")
    return [Finding(
        "SV113", "warning",
        "the step runs with use_cache=True: each training forward also fills a key/value cache that keeps "
        f"every layer's keys and values alive until the output is dropped{ckpt}; the predicted peak "
        f"({format_bytes(peak)}) counts it, use_cache=False saves {format_bytes(peak - without)} "
        f"({peak - without:,} bytes) on the worst rank (peak {format_bytes(without)})",
        **_first(analysis.plan.checkpoint), fix=USE_CACHE_FIX,
    )]


#: The checkpointing SV201 tries, most first (a policy is tried only when the one before it fits:
#: it checkpoints fewer blocks, so it holds more). ``sv.search`` tries the same ones (``search.CHECKPOINTS``).
CHECKPOINT_FIXES = ("blocks", "every 2", "every 3")


class MemoryFix(NamedTuple):
    """A change that brings the peak under the usable memory (``Mesh.fit``): what to do, the new peak, and what it
    costs in time (``a.step`` of the changed analysis): ``step_time_s`` for the same tokens per rank
    as the plan's own step, ``cost_s`` its difference from the plan's own; None without a step time
    (no device or no micro-batch). ``hardware``: the fix adds ranks rather than time."""

    text: str
    peak: int
    step_time_s: float | None = None
    cost_s: float | None = None
    hardware: bool = False
    failed: str | None = None  # the what-if could not be analysed: why (peak is then None)


def _priced(analysis, text: str, micro_batches: int = 1, hardware: bool = False, **change) -> MemoryFix:
    """``text``'s change tried with ``analyze`` (``what_if``): its peak, and its step time from
    ``a.step`` (``micro_batches`` steps of the smaller micro-batch make the plan's own tokens).
    A what-if that fails is a fix with ``failed`` set: it never crashes the analysis."""
    try:
        a = analysis.what_if(**change)
        peak = int(a.memory["peak"].max())
        new, own = a.step.get("step_time_s"), analysis.step.get("step_time_s")
    except Exception as exc:  # noqa: BLE001 - the finding says it could not be priced instead
        return MemoryFix(text, None, hardware=hardware, failed=f"{type(exc).__name__}: {str(exc)[:200]}")
    if new is None or own is None:
        return MemoryFix(text, peak, hardware=hardware)
    return MemoryFix(text, peak, new * micro_batches, new * micro_batches - own, hardware)


def _every_kth(tree, blocks: list[str], preset: str, covered) -> list[str]:
    """The blocks ``Plan.auto(checkpoint=preset)`` checkpoints (every k-th, counted from 1), less those covered."""
    _, k = checkpoint_preset(preset)
    return [b for i, b in enumerate(blocks) if (i + 1) % k == 0 and b not in covered]


def _fits(analysis, peak: int | None) -> bool:
    """The one fits verdict (``Mesh.fit``: device memory less the reserve); a what-if that failed does not fit."""
    return peak is not None and analysis.mesh.fit(peak).fits


def _checkpoint_fixes(analysis) -> list[MemoryFix]:
    """Every block checkpointed, then every 2nd, every 3rd (``CHECKPOINT_FIXES``) while they fit."""
    tree, plan = analysis.tree, analysis.plan
    blocks = [tree.modules[b].fqn for b in find_blocks(tree)]
    covered = {b for b in blocks if b in plan.checkpoint or any(
        tree.is_inside(tree.module_index[b], tree.module_index[c]) or tree.is_inside(tree.module_index[c], tree.module_index[b])
        for c in plan.checkpoint)}
    out = []
    cache_off = (" (the step then runs with use_cache=False, as Hugging Face's gradient checkpointing does)"
                 if getattr(analysis, "use_cache", False) and analysis.training.use_cache is None else "")
    for preset in CHECKPOINT_FIXES:
        more = _every_kth(tree, blocks, preset, covered)
        if not more:
            continue
        what = {"blocks": "every block", "every 2": "every 2nd block", "every 3": "every 3rd block"}[preset]
        fix = _priced(analysis, f"checkpoint {what} (Plan(checkpoint=[...]) or sv.Plan.auto(model, "
                                f"checkpoint={preset!r}): {len(more)} more){cache_off}", plan=plan.with_checkpoint(more))
        out.append(fix)
        if not _fits(analysis, fix.peak):
            break  # fewer blocks checkpointed hold more: none of the rest fits
    return out


def _batch_fix(analysis) -> list[MemoryFix]:
    """The largest smaller micro-batch (halving) that fits, with accumulation for the same tokens."""
    training = analysis.training
    batch = training.batch_size // 2
    while batch >= 1:
        k = training.batch_size // batch
        accum = {"grad_accum": k * training.grad_accum} if hasattr(training, "grad_accum") else {}
        fix = _priced(analysis, f"a micro-batch of {batch} (Training(batch_size={batch})), with {k} micro-batches "
                                f"per step (gradient accumulation) for the same tokens",
                      micro_batches=1 if accum else k, training=replace(training, batch_size=batch, **accum))
        if _fits(analysis, fix.peak):
            return [fix]
        batch //= 2
    return []


def memory_fixes(analysis) -> list[MemoryFix]:
    """Changes that bring the peak under the usable memory (``Mesh.fit``), cheapest first, each with its new peak
    and the time it costs (``MemoryFix``), each tried with ``analyze`` itself (``Analysis.what_if``).

    The changes are those ``sv.search`` tries, one at a time: shard the LoRA adapters instead of
    ignoring them, the step without the key/value cache (when it keeps one), checkpoint every block / every 2nd / every 3rd (``CHECKPOINT_FIXES``), a smaller
    micro-batch with accumulation, CPU offload; then more ranks (more hardware, always last).
    Cheapest: the smallest ``cost_s`` (the step's seconds for the same tokens, from ``a.step``);
    without a step time (no device or no micro-batch), the order above, fewest blocks checkpointed first.
    """
    plan, training, mesh = analysis.plan, analysis.training, analysis.mesh
    tree = analysis.tree
    out = []
    lora_ignored = [f for f in plan.ignored if tree.param(f).role == "lora"]
    if lora_ignored:
        out.append(_priced(analysis, "shard the LoRA adapters with their blocks instead of ignoring them "
                                     "(sv.Plan.auto(model, lora='sharded'))", plan=plan.without_ignored(lora_ignored)))
    if training.with_activations and getattr(analysis, "use_cache", False) and not analysis.cache_refused:
        out.append(_priced(analysis, "run the step without the key/value cache (Training(use_cache=False), CLI "
                                     "--no-use-cache; model.config.use_cache = False)",
                           training=replace(training, use_cache=False)))
    if training.with_activations:
        out += _checkpoint_fixes(analysis)[::-1]
        if training.batch_size > 1:
            out += _batch_fix(analysis)
    if not training.offload:
        out.append(_priced(analysis, "offload parameters, gradients and optimizer states to the CPU "
                                     "(Training(offload=True); the optimizer step then runs on the host, not timed)",
                           training=replace(training, offload=True)))
    failed = [f for f in out if f.failed]
    out = [f for f in out if _fits(analysis, f.peak)]
    if out and all(f.cost_s is not None for f in out):
        out.sort(key=lambda f: f.cost_s)
    for factor in (2, 4, 8):
        bigger = replace(mesh, shard=mesh.shard * factor)
        fix = _priced(analysis, f"shard over {bigger.shard} ranks instead of {mesh.shard}", hardware=True, mesh=bigger)
        if _fits(analysis, fix.peak):
            out.append(fix)
            break
        failed += [fix] if fix.failed else []
    return out + failed


def _fix_text(fix: MemoryFix) -> str:
    """One fix for the finding: what to do, the new peak, and what it costs per step."""
    if fix.failed:
        return f"{fix.text}: could not be priced ({fix.failed})"
    if fix.cost_s is None:
        return f"{fix.text} (peak {format_bytes(fix.peak)})"
    sign = "+" if fix.cost_s >= 0 else "-"
    per = "per rank" if fix.hardware else "for the same tokens"
    return (f"{fix.text} (peak {format_bytes(fix.peak)}; step {format_duration(fix.step_time_s)} {per}, "
            f"{sign}{format_duration(abs(fix.cost_s))})")


def check_memory(analysis) -> list[Finding]:
    """SV201: the predicted peak of some rank does not fit ``Mesh.device_memory`` less
    ``Mesh.memory_reserve`` (``Mesh.fit``); the fix is the cheapest change that makes it fit
    (``memory_fixes``)."""
    if analysis.mesh.device_memory is None:
        return []
    mem = analysis.memory
    worst = worst_rank(mem)  # a.memory has one row per rank, indexed by rank
    peak = int(mem.at[worst, "peak"])
    fit = analysis.mesh.fit(peak)
    if fit.fits:
        return []
    rank = int(mem.at[worst, "rank"])
    parts = sorted(analysis.peak_breakdown(rank).items(), key=lambda kv: -kv[1])
    top = ", ".join(f"{k} {format_bytes(v)}" for k, v in parts[:4] if v)
    units = sorted(analysis.units.itertuples(index=False), key=lambda r: -r.padded_unsharded_bytes)[:3]
    big = ", ".join(f"{r.unit} ({format_bytes(r.padded_unsharded_bytes)} unsharded)" for r in units)
    phase = mem.at[worst, "peak_phase"]
    where = f" in {phase}" + (f" at {mem.at[worst, 'peak_unit']}" if mem.at[worst, "peak_unit"] else "")
    if mem.at[worst, "peak_module"]:
        where += f" (activations peak in {mem.at[worst, 'peak_module'] or '<root>'})"
    counted = "" if analysis.training.with_activations else " (activations not counted: give Training(batch_size=...))"
    fixes = memory_fixes(analysis)
    failed = [f for f in fixes if f.failed]
    fixes = [f for f in fixes if not f.failed]
    if fixes:
        fix = f"cheapest fix: {_fix_text(fixes[0])}"
        if len(fixes) > 1:
            fix += "; also: " + "; ".join(_fix_text(f) for f in fixes[1:])
    else:
        fix = ("none of: sharding LoRA, checkpointing every block, a smaller micro-batch, CPU offload, 8x the ranks "
               "makes it fit; use a larger device, or sv.search(model, mesh=..., training=...) for combined changes")
    if failed:
        fix += "; not priced: " + "; ".join(_fix_text(f) for f in failed)
    return [Finding(
        "SV201", "error",
        f"peak memory {format_bytes(peak)} on rank {rank}{where} exceeds device_memory "
        f"{fit.text} by {format_bytes(-fit.margin)}{counted}; "
        f"largest contributors: {top}; largest calls: {big}",
        tuple(m for r in units for m in r.modules),
        fix,
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
)


def run_checks(analysis, torch_version=None) -> list[Finding]:
    """Every finding for ``analysis``, errors first.

    ``torch_version``: the release the plan will run on (default: the analysis's ``torch_version``
    attribute if it has one, else the installed torch).
    """
    version = torch_version if torch_version is not None else getattr(analysis, "torch_version", None)
    findings = list(analysis.layout.errors)
    findings += release_findings(analysis.layout, version)
    for check in CHECKS:
        findings += check(analysis)
    findings += check_memory(analysis)
    order = {id(f): i for i, f in enumerate(findings)}
    return sorted(findings, key=lambda f: (SEVERITY_ORDER[f.severity], order[id(f)]))
