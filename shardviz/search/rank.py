"""The search's step numbers and reasons: ``step_numbers`` (``a.step``), the parts of the step a
plan spends its time on (``time_parts``), the order of the rows (``ranked``: step time, with
differences under 1 % a tie decided by the margin, then the simpler plan), each row's ``why``
against the row above it in % of the step, and the table of them (``table``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from ..analysis import Analysis
from ..format import format_bytes, format_duration, format_percent, format_plural, format_rate
from ..run.mesh import Mesh

if TYPE_CHECKING:
    from .rows import Measured, Row
    from .space import Space



# ---------------------------------------------------------------------------
# Step time: a.step (the step model of step/timing.py), or the collectives when there is no device
# ---------------------------------------------------------------------------
def step_numbers(a: Analysis) -> dict:
    """step_time_s (one optimizer step, every micro-batch), tokens_per_s (per rank) and
    mfu from ``a.step``; None with ``reason`` when ``a.step`` has no time (no device, no micro-batch);
    tensor_comm_s: the tensor-parallel collectives on the critical path. The search's only read of ``a.step``."""
    step = a.step
    tp = {"tensor_comm_s": step.tensor_comm_s}
    if step.step_time_s is None:
        return {"step_time_s": None, "tokens_per_s": None, "mfu": None, "reason": step.reason, **tp}
    # a.step counts the accumulation itself (Training.grad_accum)
    return {"step_time_s": float(step.step_time_s), "tokens_per_s": float(step.tokens_per_s),
            "mfu": float(step.mfu), "reason": None, **tp}


def _where(kind: str, mesh: Mesh) -> str:
    if kind == "all-reduces":
        return f"across {mesh.replicate} replicas"
    return f"at {format_plural(mesh.shard, 'rank')}" if not mesh.is_hsdp else f"in shard groups of {format_plural(mesh.shard, 'rank')}"


def time_parts(a: Analysis, grad_accum: int = 1) -> dict:
    """Seconds per step by what takes them, from the step model's schedule: compute-stream work by
    kind, communication only where the compute stream waits for it (exposed). What ``why`` names
    when a plan is slower than the one above it (``_label`` writes a part for a row). Without a
    step time: the collectives one after another (``a.comm``)."""
    sched = a.step_time.schedule
    out: dict = {}
    if sched is None:
        c = a.comm
        if len(c):
            out["collectives (one after another, a.comm)"] = float((c["time_s"] * c["count"]).sum())
        return out
    labels = {"forward": "compute", "backward": "compute", "optimizer": "the optimizer step",
              "recompute": "recomputation", "h2d": "CPU offload copies", "d2h": "CPU offload copies",
              "ignored_all_reduce": "the ignored parameters' all-reduce"}
    for e in sched.timeline():
        sec = e["end_s"] - e["start_s"] if e["stream"] == "compute" else e["exposed_s"]
        if sec > 0:
            label = labels.get(e["kind"]) or f"exposed {e['kind'].replace('_', '-')}s"
            out[label] = out.get(label, 0.0) + sec * grad_accum
    return out


def _label(part: str, r: Measured) -> str:
    """A part of the step as ``why`` says it for row ``r`` (its blocks, its group sizes)."""
    if part == "recomputation":
        return f"recomputation of {r.recompute} blocks"
    if part == "the ignored parameters' all-reduce":
        return f"{part} over {r.mesh.world} ranks"
    if part.startswith("exposed "):
        return f"{part} {_where(part.split()[-1], r.mesh)}"
    return part


# ---------------------------------------------------------------------------
# Ranking
# ---------------------------------------------------------------------------
#: Step times within this fraction of each other are a tie. The step model's checks against
#: published runs are off by -11 % to +4 % (mean |error| 3.3 %; docs/step-time.md, "Calibration and
#: checking are kept apart"): a difference under 1 % between two plans is below what it can tell,
#: so the search does not rank on it but on what it can tell: the margin, then the simpler plan.
STEP_TIME_TIE = 0.01

#: In a tie on step time, margins within this fraction of the usable memory are equal: the reserved
#: peak a margin is taken from is within -1.3 % and +0.3 % of the published peaks it was checked on
#: (docs/cost-model.md, "Reserved memory"), so a few hundred MiB more to spare does not outweigh a
#: simpler plan.
MARGIN_TIE = 0.01

#: A tight plan (inside the safety margin, ``devices.memory_fit``) is ranked as if this much slower:
#: the search does not pick it over a plan keeping the margin within 2 % of its step time.
TIGHT_PENALTY = 0.02

#: LoRA layouts, the simplest first: in their block's call, left out of FSDP, in calls of their own.
LORA_ORDER = {"sharded": 0, "ignored": 1, "separate": 2}
TIE_TEXT = f"{100 * STEP_TIME_TIE:g} %"


def ranked(rows: list[Row], limit: int) -> list[Row]:
    """``rows`` best first, as a person would choose (``limit``: the usable memory):

    1. The plans that fit and were analysed, by step time (``a.step``; without a device, the
       collectives' seconds), a tight plan's counted ``TIGHT_PENALTY`` (2 %) higher.
    2. Step times within ``STEP_TIME_TIE`` (1 %, below what the step model can tell) are a tie:
       the fastest plan left and every plan within 1 % of it form a group (``tie_groups``); the
       groups follow in time, so a plan ranks below another for its time only when it is more than
       1 % slower than the fastest of the other's group.
    3. In a group (``_decided``): a plan keeping the safety margin before a tight one; a plan
       without CPU offload before one with it (offload only buys memory, for host-device copies
       and a host optimizer step: a person reaches for it when nothing without it ties, as the
       pruning's ``Rule.OFFLOAD_NEEDLESS`` does); then the larger margin (usable - judged peak),
       margins within ``MARGIN_TIE`` (1 % of the usable memory) of the largest left being
       equal; then the simpler plan (``simpler``): fewer ``fully_shard`` calls, FSDP before
       HSDP, no tensor parallelism before it, LoRA sharded before ignored before separate, fewer
       blocks recomputed; then the faster; then the search's order. Without a step time, less
       recomputation comes first (the collectives' seconds do not see it).
    4. Then the plans that fit unanalysed (CPU offload where the same plan without it fits); then
       the plans over, by how much (analysed before pruned), without offload first.

    So a tight plan never comes before a plan keeping the margin within 2 % of its step time (the
    penalty), nor before one in its tie group (the margin decides there): it is picked only when
    every plan keeping the margin is slower by more than that. ``sv.search``, ``shardviz plan
    search`` and the Inspector's Suggest tab all show this order."""
    fitting = [r for r in rows if r.fits and r.analysed]
    rest = sorted((r for r in rows if not (r.fits and r.analysed)), key=_rest_key(limit))
    return [r for group in tie_groups(fitting) for r in _decided(group, limit)] + rest


def _ranked_seconds(r: Measured) -> float:
    t = _seconds(r)
    return t * (1 + TIGHT_PENALTY) if r.verdict == "tight" else t


def tie_groups(fitting: list[Measured]) -> list[list[Measured]]:
    """The plans that fit cut into ties, fastest first: the fastest left (its time as ``ranked``
    counts it, a tight plan's higher) and every plan within ``STEP_TIME_TIE`` of it."""
    left, groups = sorted(fitting, key=_ranked_seconds), []
    while left:
        cut = _ranked_seconds(left[0]) * (1 + STEP_TIME_TIE)
        n = next((i for i, r in enumerate(left) if _ranked_seconds(r) > cut), len(left))
        groups.append(left[:n])
        left = left[n:]
    return groups


def simpler(r: Measured) -> tuple:
    """The simpler plan sorts first: fewer calls, FSDP, no TP, LoRA sharded, less recomputation, 4-bit
    weights sharded (a storage the run's param_dtype keeps) before replicated."""
    c = r.candidate
    return (r.calls, c.replicate > 1, c.tensor > 1, LORA_ORDER.get(c.lora, 0), r.recompute, c.quant == "replicated")


def _untimed_recompute(r: Measured) -> int:
    return r.recompute if r.step_time_s is None else 0


def _decided(group: list[Measured], limit: int) -> list[Measured]:
    """One tie on step time in order: keeping the margin, no offload, the larger margin (within
    ``MARGIN_TIE`` of the largest left: equal), the simpler plan, the faster."""
    level = lambda r: (_untimed_recompute(r), r.verdict == "tight", bool(r.candidate.offload))  # noqa: E731
    left, out = sorted(group, key=lambda r: (*level(r), -r.margin)), []
    while left:
        head = left[0]
        n = next((i for i, r in enumerate(left)
                  if level(r) != level(head) or r.margin < head.margin - MARGIN_TIE * limit), len(left))
        out += sorted(left[:n], key=lambda r: (*simpler(r), _ranked_seconds(r)))
        left = left[n:]
    return out


def _rest_key(limit: int):
    def key(r: Row):
        if r.fits:
            return (0, 0, False)
        over = (r.peak if r.peak is not None else 1 << 62) - limit
        return (1 if r.analysed else 2, over, bool(r.candidate.offload))
    return key


def tie_positions(rows: list[Row]) -> dict[int, tuple[int, float]]:
    """``id(row)`` of each analysed row that fits -> (its tie group, the seconds of the group's fastest)."""
    out = {}
    for i, group in enumerate(tie_groups([r for r in rows if r.fits and r.analysed])):
        for r in group:
            out[id(r)] = (i, _seconds(group[0]))
    return out


# ---------------------------------------------------------------------------
# The reasons, in % of the step
# ---------------------------------------------------------------------------
def pct(fraction: float) -> str:
    """A share of a step time: "0.03 %", "2.6 %", "12 %" (its sign is the sentence's)."""
    p = 100 * abs(fraction)
    if p >= 10:
        return f"{p:.0f} %"
    if p >= 1:
        return f"{p:.1f} %"
    return f"{p:.2f} %" if p >= 0.01 or p == 0 else "<0.01 %"


def _faster_words(d: float, timed: bool) -> str:
    if timed:
        return f"{pct(d)} {'slower' if d >= 0 else 'faster'}"
    return f"{pct(d)} {'more' if d >= 0 else 'less'} time in collectives"


def _tie_reason(r: Measured, above: Measured, limit: int, other: str = "the row above") -> str:
    """What puts ``above`` before ``r`` in a tie on step time, from ``r``'s side (after "with")."""
    if r.verdict == "tight" and above.verdict == "fits":
        return f"{format_bytes(r.margin)} to spare, inside the safety margin ({other} keeps it)"
    if _untimed_recompute(r) > _untimed_recompute(above):
        return f"{r.recompute} blocks recomputed ({other} {above.recompute})"
    if r.candidate.offload and not above.candidate.offload:
        return f"CPU offload ({other} fits without it)"
    dm = above.margin - r.margin
    if dm > MARGIN_TIE * limit:
        return f"{format_bytes(dm)} less to spare"
    words = {0: f"{format_plural(r.calls, 'fully_shard call')} ({other} {above.calls})",
             1: f"HSDP {r.mesh.replicate}x{r.mesh.shard} ({other}: {'HSDP' if above.candidate.replicate > 1 else 'FSDP'})",
             2: f"TP {r.candidate.tensor} ({other}: none)", 3: f"LoRA {r.candidate.lora} ({other}: LoRA {above.candidate.lora})",
             4: f"{r.recompute} blocks recomputed ({other} {above.recompute})",
             5: f"4-bit weights replicated ({other}: sharded)"}
    mine, theirs = simpler(r), simpler(above)
    which = next((i for i in range(len(mine)) if mine[i] != theirs[i]), None)
    similar = "as much to spare" if dm == 0 else f"about as much to spare ({format_bytes(abs(dm))} {'less' if dm > 0 else 'more'})"
    if which is None:
        return f"{similar}, equal on every other count (listed in search order)"
    return f"{similar} and {words[which]}"


def _slower_because(r: Measured, above: Measured, limit: int, tie: tuple | None) -> str:
    """Why a fitting row is below the fitting row above it. In a tie (``tie``: (same group, the
    seconds of its group's fastest)): the difference in % and what decided it, e.g. "0.03 % faster
    (a tie: within 1 %), with 29.30 GiB less to spare". Else the part of the step (``time_parts``)
    that grew most, in % of the row above's step, e.g. "2.6 % slower: recomputation of 16 blocks +6.3 %"."""
    timed = r.step_time_s is not None and above.step_time_s is not None
    t, t_above = _seconds(r), _seconds(above)
    d = (t - t_above) / t_above if t_above else 0.0
    same, lead_s = tie if tie is not None else (False, t_above)
    if same:
        return f"{_faster_words(d, timed)} (a tie: within {TIE_TEXT}), with {_tie_reason(r, above, limit)}"
    noise = 1e-9 + 1e-6 * t_above
    deltas = {k: r.parts.get(k, 0.0) - above.parts.get(k, 0.0) for k in set(r.parts) | set(above.parts)}
    grown = sorted(((sec, label) for label, sec in deltas.items() if sec > noise), reverse=True)[:2]
    share = lambda sec: pct(sec / t_above) if t_above else format_duration(sec)  # noqa: E731
    reasons = ", ".join(f"{_label(label, r)} +{share(sec)}" for sec, label in grown) or "slower collectives"
    shrunk = sorted((sec, label) for label, sec in deltas.items() if sec < -noise)[:1]
    if shrunk and grown and grown[0][0] > t - t_above + noise:  # the growth is partly paid back elsewhere: say where
        reasons += "; " + ", ".join(f"{_label(label, r)} -{share(-sec)}" for sec, label in shrunk)
    head = _faster_words(d, timed)
    if d < STEP_TIME_TIE and lead_s:  # next to the row above, but beyond the tie with the fastest of its group
        head += f" ({pct((t - lead_s) / lead_s)} behind the fastest plan above: beyond the {TIE_TEXT} tie)"
    return f"{head}: {reasons}" + ("" if timed else f" (no step time: {r.untimed})")


def _tight_words(r: Measured) -> str:
    return (f"tight: {format_bytes(r.margin)} to spare (reserved peak {format_bytes(r.reserved_peak)}), "
            f"inside the {format_bytes(r.safety)} safety margin")


def _why(r: Row, above: Measured | None, limit: int, usable_text: str, tie: tuple | None = None) -> str:
    """``limit``: the usable memory (device memory less the reserve), ``usable_text`` it in words;
    ``tie``: (``r`` in the tie group of ``above``, the seconds of the fastest of ``r``'s group).
    Over and tight are judged on the reserved peak (``devices.memory_fit``). The top row's
    comparison with a faster plan is ``best_note``'s."""
    if not r.analysed:
        return r.why
    if not r.fits and r.host_over and r.margin >= 0:  # the device holds it, the host does not
        return f"over the host: {r.host_text}"
    if not r.fits:
        judged = limit - r.margin
        held = f" (reserved peak {format_bytes(judged)})" if judged != r.peak else ""
        return f"over {usable_text} by {format_bytes(judged - limit)}{held}"
    if r.host:  # CPU offload: the host's part of the verdict, judged or said to be unjudged
        return f"{_why_fitting(r, above, limit, tie)}; {r.host_text}"
    return _why_fitting(r, above, limit, tie)


def _why_fitting(r: Measured, above: Measured | None, limit: int, tie: tuple | None) -> str:
    tight = r.verdict == "tight"
    if above is None:
        return "fastest that fits" + (f", but {_tight_words(r)}: no plan keeping the margin is within "
                                      f"{100 * TIGHT_PENALTY:g} % of its step time" if tight else "")
    if not tight:
        return _slower_because(r, above, limit, tie)
    t, t_above = _seconds(r), _seconds(above)
    if t < t_above and above.verdict == "fits":
        return (f"{_tight_words(r)}; {pct((t_above - t) / t_above)} faster than the row above, which keeps the "
                f"margin: a tight plan counts as {100 * TIGHT_PENALTY:g} % slower, and in a tie (within "
                f"{TIE_TEXT}) the plan keeping the margin goes first")
    return f"{_tight_words(r)}; {_slower_because(r, above, limit, tie)}"


def _seconds(r: Measured) -> float:
    return r.step_time_s if r.step_time_s is not None and r.step_time_s == r.step_time_s else r.comm_s


def best_note(rows: list[Row], name, limit: int) -> str:
    """The top row against the faster plans that fit, when it is not the fastest (``name(candidate)``:
    a row's name): the fastest tight plan it is picked over (it keeps the margin), and the fastest
    plan keeping the margin it ties with (within ``STEP_TIME_TIE``), with what decided the tie."""
    if not rows or not rows[0].fits or not rows[0].analysed:
        return ""
    best, out = rows[0], []
    fitting = [r for r in rows[1:] if r.fits and r.analysed and _seconds(r) < _seconds(best)]
    tight = [r for r in fitting if r.verdict == "tight"]
    kept = [r for r in fitting if r.verdict == best.verdict]
    if kept:
        r = min(kept, key=_seconds)
        out.append(f"a tie with the fastest plan {'keeping the margin' if tight and best.verdict == 'fits' else 'that fits'}: {name(r.candidate)} is "
                   f"{pct((_seconds(best) - _seconds(r)) / _seconds(r))} faster (within {TIE_TEXT}), with "
                   f"{_tie_reason(r, best, limit, other='this plan')}")
    if tight and best.verdict == "fits":
        r = min(tight, key=_seconds)
        out.append(f"keeps the {format_bytes(best.safety)} safety margin ({format_bytes(best.margin)} to spare); "
                   f"{name(r.candidate)} is {pct((_seconds(best) - _seconds(r)) / _seconds(r))} faster but {_tight_words(r)}")
    return "; ".join(out)


# ---------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------
COLUMNS = ["name", "fits", "verdict", "peak", "reserved_peak", "judged_peak", "margin", "step_time_s", "tokens_per_s", "mfu", "why", "lora",
           "checkpoint", "reshard_after_forward", "replicate", "shard", "offload", "batch_size", "grad_accum", "analysed",
           "use_cache", "quant", "host"]


def table(rows: list[Row], space: Space) -> pd.DataFrame:
    """``Search.table``: one line per row (ranked), named, with its ``why`` against the fitting row
    above it (a ``tensor`` column when tensor degrees were searched)."""
    world, vary, tp = space.mesh.world, space.training.global_batch is not None, space.tensors != (1,)
    records, above, ties = [], None, tie_positions(rows)
    name_of = lambda c: c.name(world, space.has_lora, vary, space.quant_words)  # noqa: E731
    for r in rows:
        tie = (ties[id(r)][0] == ties[id(above)][0], ties[id(r)][1]) if above is not None and id(r) in ties else None
        c, why = r.candidate, _why(r, above if r.fits else None, space.limit, space.usable_text, tie)
        if above is None and r.fits and r.analysed:  # the top row: against the faster plans it was picked over
            note = best_note(rows, name_of, space.limit)
            why = note + (f"; {r.host_text}" if r.host else "") if note else why
        if r.fits and r.analysed:
            above = r
        name = name_of(c)
        if r.analysed and r.cache_refused:
            name += ", priced with use_cache=False (torch cannot run it with the cache)"
        if c.tensor > 1 and r.analysed and r.tensor_comm_s:
            why += tp_words(c.tensor, r.tensor_comm_s, r.step_time_s)
        numbers = dict.fromkeys(("reserved_peak", "judged_peak", "margin", "step_time_s", "tokens_per_s", "mfu"))
        if r.analysed:
            numbers = {k: getattr(r, k) for k in numbers}
        records.append({
            "name": name, "fits": bool(r.fits), "verdict": r.verdict if r.analysed else "fits" if r.fits else "over",
            "peak": r.peak, **numbers, "why": why,
            "lora": c.lora if space.has_lora else None, "checkpoint": c.checkpoint,
            "reshard_after_forward": c.reshard_after_forward, "replicate": c.replicate, "shard": world // (c.replicate * c.tensor),
            "offload": c.offload, "batch_size": c.batch_size, "grad_accum": c.grad_accum, "analysed": r.analysed,
            "use_cache": r.use_cache if r.analysed else space.cache_of(c),
            "quant": c.quant, "host": r.host if r.analysed and r.host else None,
            **({"tensor": c.tensor} if tp else {}),
        })
    return pd.DataFrame(records, columns=COLUMNS + (["tensor"] if tp else []))


def tp_words(tensor: int, tensor_comm_s: float, step_s: float | None) -> str:
    """Why a tensor degree wins or loses, in the row's words: what TP costs on the critical path."""
    share = f" ({100 * tensor_comm_s / step_s:.0f} % of the step)" if step_s else ""
    return (f"; TP {tensor}: model state and activations split {tensor} ways, for {format_duration(tensor_comm_s)} "
            f"of TP collectives on the critical path{share}")


# ---------------------------------------------------------------------------
# The choice in words
# ---------------------------------------------------------------------------
def explain(table, limit_text: str, note: str = "", assumed: str = "") -> str:
    """What ``sv.search`` chose and why, in sentences, every number read from its ``table``;
    ``assumed``: what the fits verdict assumes (``MemoryFit.assumed``)."""
    if not len(table) or not table.fits.iloc[0]:
        return f"Nothing fits. {note}".strip()
    best = table.iloc[0]
    timed = best.step_time_s == best.step_time_s and best.step_time_s is not None
    when = (f", a step of {format_duration(best.step_time_s)} ({format_rate(best.tokens_per_s)} tokens/s per rank, "
            f"MFU {format_percent(best.mfu)})" if timed else "")
    tight = " (tight: inside the safety margin)" if best.get("verdict") == "tight" else ""
    reserved = (f" (reserved {format_bytes(best.reserved_peak)})" if best.get("reserved_peak") == best.get("reserved_peak")
                and best.get("reserved_peak") is not None else "")
    out = [f"Run {best['name']}: peak {format_bytes(best.peak)}{reserved} of {limit_text}, "
           f"{format_bytes(best.margin)} to spare{tight}{when}."]
    if best.get("host") == best.get("host") and best.get("host"):  # offloaded: the host's part, as judged
        out.append(f"With CPU offload, {str(best.why)[str(best.why).index('host RAM'):]}.")
    if assumed:
        out.append(f"Fits means: {assumed}.")
    fit = table[table.fits & table.analysed]
    if len(fit) > 1:
        first = ("the fastest" if str(best.why).startswith("fastest that fits") else
                 f"the first (step times within {TIE_TEXT} are a tie, decided by the larger margin, then the simpler plan)")
        out.append(f"It is {first} of {len(fit)} plans that fit; the next, {fit['name'].iloc[1]}, is {fit.why.iloc[1]}.")
    plain = table[table.analysed & table.checkpoint.isna()]
    if best.checkpoint is not None and best.checkpoint == best.checkpoint:
        if len(plain) and not plain.fits.any():
            out.append(f"Checkpointing is needed: without it the leanest plan, {plain['name'].iloc[0]}, is "
                       f"{plain.why.iloc[0]}.")
        elif not len(plain):
            out.append("Checkpointing is needed: no plan without it could fit (pruned before measuring).")
    refused = table.why.astype(str).str.startswith("torch would refuse")
    over = int((~table.fits & ~refused).sum())
    if over:
        out.append(f"{over} of {len(table)} plans do not fit.")
    if refused.any():  # not counted as "do not fit": torch would not run them at all
        out.append(f"{format_plural(int(refused.sum()), 'plan')} torch would refuse (see its row's why).")
    return " ".join(out)
