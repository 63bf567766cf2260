"""SV201: the predicted peak against the device, and the cheapest change that makes it fit.

``check_memory(inputs)`` judges the worst rank's peak with the one fits verdict (``Analysis.fit``:
the caching allocator's reserved peak against device memory less the reserve, with the safety
margin); when it is over or tight, ``memory_fixes`` tries the changes ``sv.search`` tries, one at a
time, each priced with ``AnalysisView.price`` (its peak and its step time) and written both in Python
and as CLI flags. A what-if that fails is a fix marked ``failed``, said in the finding, never raised.
Called by ``checks.findings_of``; it reads the stages it is given (``check_inputs.AnalysisView``), never the analysis.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from .check_inputs import AnalysisView, WhatIfPending, worst_peak
from ..finding import Change, Finding
from ..format import format_bytes, format_duration
from ..run.mesh import worst_rank
from ..checkpointing import parse_checkpoint
from ..presets import find_blocks


#: The checkpointing SV201 tries, most first (a policy is tried only when the one before it fits:
#: it checkpoints fewer blocks, so it holds more). ``sv.search`` tries the same ones (``search.CHECKPOINTS``).
CHECKPOINT_FIXES = ("blocks", "every 2", "every 3")


class MemoryFix(NamedTuple):
    """A change that brings the peak under the usable memory (``Mesh.fit``): what to do, the new peak, and what it
    costs in time (the changed step's ``Priced.step_time_s``): ``step_time_s`` for the same tokens per rank
    as the plan's own step, ``cost_s`` its difference from the plan's own; None without a step time
    (no device or no micro-batch). ``hardware``: the fix adds ranks rather than time."""

    text: str
    peak: int
    step_time_s: float | None = None
    cost_s: float | None = None
    hardware: bool = False
    reserved: int | None = None  # the caching allocator's reserved peak, what the verdict judges
    flags: str = ""  # the same change as command-line flags ("--checkpoint blocks"); "" when there is none
    failed: str | None = None  # the what-if could not be analysed: why (peak is then None)
    what: str = ""  # the change in a few words ("checkpoint every block"): the Inspector's card
    change: dict | None = None  # the analysis' arguments it replaces (plan=, mesh=, training=), as priced


def _priced(inputs: AnalysisView, text: str, what: str, micro_batches: int = 1, hardware: bool = False, flags: str = "",
            **change) -> MemoryFix:
    """``text``'s change priced (``AnalysisView.price``): its peak, and its step time
    (``micro_batches`` steps of the smaller micro-batch make the plan's own tokens); ``what``: the
    change in a few words. A what-if that fails is a fix with ``failed`` set: it never crashes the analysis."""
    try:
        priced = inputs.price(**change, timed=True)
        peak, reserved = priced.peak, priced.reserved_peak
        new, own = priced.step_time_s, inputs.step.step_time_s
    except WhatIfPending:
        raise  # the finding says its fixes are being priced (check_memory)
    except Exception as exc:  # noqa: BLE001 - the finding says it could not be priced instead
        return MemoryFix(text, None, hardware=hardware, flags=flags, failed=f"{type(exc).__name__}: {str(exc)[:200]}",
                         what=what, change=change)
    if new is None or own is None:
        return MemoryFix(text, peak, hardware=hardware, reserved=reserved, flags=flags, what=what, change=change)
    return MemoryFix(text, peak, new * micro_batches, new * micro_batches - own, hardware, reserved, flags,
                     what=what, change=change)


def _every_kth(tree, blocks: list[str], preset: str, covered) -> list[str]:
    """The blocks ``Plan.auto(checkpoint=preset)`` checkpoints (every k-th, counted from 1), less those covered."""
    return [b for b in parse_checkpoint(preset).chosen(blocks) if b not in covered]


def _fits(inputs: AnalysisView, fix: MemoryFix) -> bool:
    """The one fits verdict (``Mesh.fit``: device memory less the reserve, judged on the reserved
    peak): the fix keeps the safety margin, or at least fits when the plan itself is over; a what-if
    that failed does not fit."""
    if fix.peak is None:
        return False
    fit = inputs.mesh.fit(fix.peak, fix.reserved)
    return fit.verdict == "fits" or (fit.fits and not inputs.fit.fits)


def _checkpoint_fixes(inputs: AnalysisView) -> list[MemoryFix]:
    """Every block checkpointed, then every 2nd, every 3rd (``CHECKPOINT_FIXES``) while they fit."""
    tree, plan = inputs.tree, inputs.plan
    blocks = [tree.modules[b].fqn for b in find_blocks(tree)]
    covered = {b for b in blocks if b in plan.checkpoint or any(
        tree.is_inside(tree.module_index[b], tree.module_index[c]) or tree.is_inside(tree.module_index[c], tree.module_index[b])
        for c in plan.checkpoint)}
    out = []
    cache_off = (" (the step then runs with use_cache=False, as Hugging Face's gradient checkpointing does)"
                 if inputs.cache.use_cache and inputs.training.use_cache is None else "")
    for preset in CHECKPOINT_FIXES:
        more = _every_kth(tree, blocks, preset, covered)
        if not more:
            continue
        what = parse_checkpoint(preset).which_blocks
        fix = _priced(inputs, f"checkpoint {what} (Plan(checkpoint=[...]) or sv.Plan.auto(model, "
                                f"checkpoint={preset!r}): {len(more)} more){cache_off}", f"checkpoint {what}",
                      plan=plan.with_checkpoint(more),
                      flags=f"--checkpoint {preset}" if " " not in preset else f"--checkpoint '{preset}'")
        out.append(fix)
        if not _fits(inputs, fix):
            break  # fewer blocks checkpointed hold more: none of the rest fits
    return out


def _micro_batches(batch: int) -> list[int]:
    """The micro-batches that make ``batch`` sequences exactly, largest first: its divisors below it
    (9 -> 3, 1; never 4 x 2, which trains 8)."""
    return [b for b in range(batch // 2, 0, -1) if batch % b == 0]


def _batch_fix(inputs: AnalysisView) -> list[MemoryFix]:
    """The largest smaller micro-batch that fits, accumulated to the same sequences per step
    (``Training.grad_accum``: reduce-scatter on the last micro-batch only, as the exported
    ``train_step`` does), found by bisection over ``_micro_batches`` (a smaller micro-batch holds less)."""
    training = inputs.training
    sizes = _micro_batches(training.batch_size)
    best, lo, hi = None, 0, len(sizes) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        batch = sizes[mid]
        k = training.batch_size // batch * training.grad_accum
        fix = _priced(inputs, f"a micro-batch of {batch} with {k} micro-batches per step (Training(batch_size={batch}, "
                              f"grad_accum={k})): the same {training.batch_size * training.grad_accum} sequences per "
                              "step, gradients reduce-scattered on the last micro-batch only, as the exported train_step does",
                      f"{k} micro-batches of {batch} per step", training=replace(training, batch_size=batch, grad_accum=k),
                      flags=f"--batch-size {batch} --grad-accum {k}")
        if _fits(inputs, fix):
            best, hi = fix, mid - 1  # a larger micro-batch may fit too
        else:
            lo = mid + 1
    return [best] if best is not None else []


def _expandable_fix(inputs: AnalysisView) -> list[MemoryFix]:
    """``expandable_segments:True``: the same step, the reserved peak of the other allocator setting
    (``CostModel.reserved_overhead``, no new analysis), at no cost in time."""
    mesh = inputs.mesh
    if mesh.expandable_segments or mesh.judge != "reserved":
        return []
    peak = worst_peak(inputs)
    own = inputs.step.step_time_s
    return [MemoryFix("set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (sv.Mesh(expandable_segments=True); "
                      "the exported code then sets it)", peak, own, None if own is None else 0.0,
                      reserved=peak + inputs.costs.reserved_overhead(True), flags="--expandable-segments",
                      what="expandable_segments:True", change={"mesh": replace(mesh, expandable_segments=True)})]


def memory_fixes(inputs: AnalysisView) -> list[MemoryFix]:
    """Changes that bring the peak under the usable memory (``Mesh.fit``), cheapest first, each with its new peak
    and the time it costs (``MemoryFix``), each priced as the analysis prices its own step (``AnalysisView.price``).

    The changes are those ``sv.search`` tries, one at a time: shard the LoRA adapters instead of
    ignoring them, the step without the key/value cache (when it keeps one), checkpoint every block / every 2nd / every 3rd (``CHECKPOINT_FIXES``), a smaller
    micro-batch with accumulation, CPU offload; then more ranks (more hardware, always last).
    Cheapest: the smallest ``cost_s`` (the step's seconds for the same tokens, ``Priced.step_time_s``);
    without a step time (no device or no micro-batch), the order above, fewest blocks checkpointed first.
    """
    plan, training, mesh = inputs.plan, inputs.training, inputs.mesh
    tree = inputs.tree
    out = _expandable_fix(inputs)
    lora_ignored = [f for f in plan.ignored if tree.param(f).role == "lora"]
    if lora_ignored:
        out.append(_priced(inputs, "shard the LoRA adapters with their blocks instead of ignoring them "
                                     "(sv.Plan.auto(model, lora='sharded'))", "shard the LoRA adapters",
                           plan=plan.without_ignored(lora_ignored),
                           flags="--lora sharded"))
    if training.with_activations and inputs.cache.use_cache and not inputs.cache_refused:
        out.append(_priced(inputs, "run the step without the key/value cache (Training(use_cache=False), CLI "
                                     "--no-use-cache; model.config.use_cache = False)", "no key/value cache",
                           training=replace(training, use_cache=False), flags="--no-use-cache"))
    if training.with_activations:
        out += _checkpoint_fixes(inputs)[::-1]
        if training.batch_size > 1:
            out += _batch_fix(inputs)
    if not training.offload:
        out.append(_priced(inputs, "offload parameters, gradients and optimizer states to the CPU "
                                     "(Training(offload=True); the optimizer step then runs on the host: its time is the host AdamW's)",
                           "CPU offload", training=replace(training, offload=True), flags="--offload"))
    failed = [f for f in out if f.failed]
    out = [f for f in out if _fits(inputs, f)]
    if out and all(f.cost_s is not None for f in out):
        out.sort(key=lambda f: f.cost_s)
    for factor in (2, 4, 8):
        bigger = replace(mesh, shard=mesh.shard * factor)
        fix = _priced(inputs, f"shard over {bigger.shard} ranks instead of {mesh.shard}", f"{bigger.shard} ranks",
                      hardware=True, mesh=bigger,
                      flags=f"--world-size {bigger.world}")
        if _fits(inputs, fix):
            out.append(fix)
            break
        failed += [fix] if fix.failed else []
    return out + failed


#: SV201's fix while its what-ifs are priced (``check_inputs.without_what_ifs``: the Inspector's first findings)
PENDING_FIXES = ("the fixes are being priced: each what-if (checkpointing, a smaller micro-batch, offload, more "
                 "ranks) is analysed as this step is")


def _fix_text(fix: MemoryFix, cli: bool = False) -> str:
    """One fix for the finding: what to do (``cli``: as flags where it has them), the new peak, and
    what it costs per step; a what-if that failed says so."""
    text = fix.flags if cli and fix.flags else fix.text
    if fix.failed:
        return f"{text}: could not be priced ({fix.failed})"
    held = f"peak {format_bytes(fix.peak)}" + (f", reserved {format_bytes(fix.reserved)}" if fix.reserved else "")
    if fix.cost_s is None:
        return f"{text} ({held})"
    per = "per rank" if fix.hardware else "for the same tokens"
    return f"{text} ({held}; step {format_duration(fix.step_time_s)} {per}, {_cost_text(fix.cost_s)})"


def _cost_text(cost_s: float) -> str:
    """What a fix adds to the step (or saves): "+3.180 s", "-12.30 ms"."""
    return f"{'+' if cost_s >= 0 else '-'}{format_duration(abs(cost_s))}"


def _change(inputs: AnalysisView, fix: MemoryFix) -> Change | None:
    """The cheapest fix as the change the Inspector's card applies, with its outcome in a line:
    "checkpoint every block: fits, 32.45 GiB to spare; step 10.442 s (+3.180 s)" (the one verdict's
    words, ``Mesh.fit``); None for a fix that is no change of the analysis' arguments."""
    if not fix.change or fix.peak is None:
        return None
    fit = inputs.mesh.fit(fix.peak, fix.reserved)
    words = f"{fix.what}: {fit.word}, {fit.spare_text}"
    if fix.step_time_s is not None and fix.cost_s is not None:
        words += f"; step {format_duration(fix.step_time_s)} ({_cost_text(fix.cost_s)})"
    return Change(words, dict(fix.change))


def _largest_calls(inputs: AnalysisView) -> tuple[list, dict]:
    """The three calls whose unsharded parameters are largest as the step holds them: the bytes of
    their forward all-gather (in the call's ``param_dtype``, as torch gathers them), or their
    stored bytes when a call gathers nothing (one rank, or no mixed precision to read)."""
    comm = inputs.comm
    ag = comm[(comm["collective"] == "all_gather") & (comm["phase"] == "forward") & (comm["group"] == "shard")]
    gathered = {str(u): int(b) for u, b in zip(ag["unit"], ag["bytes"])}
    rows = list(inputs.units.itertuples(index=False))
    sizes = {r.unit: gathered.get(str(r.unit), int(r.padded_unsharded_bytes)) for r in rows}
    return sorted(rows, key=lambda r: -sizes[r.unit])[:3], sizes


def _host_finding(inputs: AnalysisView, fit) -> Finding:
    """SV201 for the host: what CPU offload keeps in a node's host RAM (``a.memory``'s cpu columns,
    the worst rank's), over ``Mesh.host_memory``; the fixes are the host's, not the device's."""
    mem = inputs.memory
    row = mem.loc[mem["cpu_peak"].idxmax()]
    kinds = {"offloaded params": row["cpu_params"], "offloaded grads": row["cpu_grads"],
             "optimizer states": row["cpu_optimizer"]}
    kinds["optimizer step temporaries"] = row["cpu_peak"] - sum(kinds.values())
    top = ", ".join(f"{k} {format_bytes(int(v))}" for k, v in kinds.items() if v)
    fix = (f"give each node at least {format_bytes(fit.host)} of host RAM (sv.Mesh(host_memory=...), --host-memory), "
           "put fewer ranks on a node (sv.Mesh(ranks_per_node=...)), or offload less: keep on the device what fits "
           f"there (Training(offload=False), or sv.Unit(offload=True) on fewer calls; the device has {fit.spare_text})")
    return Finding("SV201", "error", f"{fit.headline} (rank {int(row['rank'])}'s host RAM: {top})", (), fix)


def check_memory(inputs: AnalysisView) -> list[Finding]:
    """SV201: the predicted peak of some rank does not fit ``Mesh.device_memory`` less
    ``Mesh.memory_reserve`` (``Analysis.fit``: judged on the caching allocator's reserved peak),
    an error; or it fits inside the safety margin ("tight"), a warning. The fix is the cheapest
    change that makes it fit (``memory_fixes``). When anything is offloaded and a node's host RAM
    (``MemoryFit.host``) is over ``Mesh.host_memory`` while the device holds the step, an error
    naming host RAM, with the host's fixes (``_host_finding``)."""
    if inputs.mesh.device_memory is None:
        return []
    mem = inputs.memory
    worst = worst_rank(mem)  # a.memory has one row per rank, indexed by rank
    fit = inputs.fit
    if fit.verdict == "fits":
        return []
    if fit.margin >= 0 and fit.host_over:  # the device holds the step, a node's host RAM does not
        return [_host_finding(inputs, fit)]
    rank = int(mem.at[worst, "rank"])
    parts = sorted(inputs.peak_breakdown(rank).items(), key=lambda kv: -kv[1])
    top = ", ".join(f"{k} {format_bytes(v)}" for k, v in parts[:4] if v)
    units, gathered = _largest_calls(inputs)
    big = ", ".join(f"{r.unit} ({format_bytes(gathered[r.unit])} unsharded)" for r in units)
    phase = mem.at[worst, "peak_phase"]
    where = f" in {phase}" + (f" at {mem.at[worst, 'peak_unit']}" if mem.at[worst, "peak_unit"] else "")
    if mem.at[worst, "peak_module"]:
        where += f" (activations peak in {mem.at[worst, 'peak_module'] or '<root>'})"
    counted = "" if inputs.training.with_activations else " (activations not counted: give Training(batch_size=...))"
    # the one verdict's own words (devices.MemoryFit.headline), as the CLI, the report and the Inspector show them
    verdict = f"{fit.headline} on rank {rank}{where} (device_memory {fit.text}; {fit.assumed})"
    message = f"{verdict}{counted}; largest contributors: {top}; largest calls: {big}"
    fqns = tuple(m for r in units for m in r.modules)
    severity = "warning" if fit.tight else "error"
    try:  # a tight plan runs: only the fix that costs no analysis (the allocator setting) is tried
        fixes = [f for f in _expandable_fix(inputs) if _fits(inputs, f)] if fit.tight else memory_fixes(inputs)
    except WhatIfPending:
        return [Finding("SV201", severity, message, fqns, PENDING_FIXES, pending=True)]
    failed = [f for f in fixes if f.failed]
    fixes = [f for f in fixes if not f.failed]
    flags, change = "", None
    if fixes:
        change = _change(inputs, fixes[0])
        fix = f"cheapest fix: {_fix_text(fixes[0])}"
        flags = f"cheapest fix: {_fix_text(fixes[0], cli=True)}"
        if len(fixes) > 1:
            fix += "; also: " + "; ".join(_fix_text(f) for f in fixes[1:])
            flags += "; also: " + "; ".join(_fix_text(f, cli=True) for f in fixes[1:])
    elif fit.tight:
        fix = (f"free {format_bytes(fit.safety - fit.margin)} more to keep the safety margin: sv.search(model, "
               "mesh=..., training=...) ranks the plans that keep it")
    else:
        fix = ("none of: sharding LoRA, checkpointing every block, a smaller micro-batch, CPU offload, 8x the ranks "
               "makes it fit; use a larger device, or sv.search(model, mesh=..., training=...) for combined changes")
    if failed:
        fix += "; not priced: " + "; ".join(_fix_text(f) for f in failed)
        if flags:
            flags += "; not priced: " + "; ".join(_fix_text(f, cli=True) for f in failed)
    return [Finding("SV201", severity, message, fqns, fix, flags=flags, change=change)]
