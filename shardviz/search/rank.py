"""The search's step numbers and reasons: ``step_numbers`` (``a.step``), the parts of the step a
plan spends its time on (``time_parts``), the order of the rows (``_rank_key``), each row's
``why`` against the row above it, and the table of them (``table``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from ..analysis import Analysis
from ..format import format_bytes, format_duration, format_plural
from ..fsdp import Mesh

if TYPE_CHECKING:
    from .rows import Measured, Row
    from .space import Space



# ---------------------------------------------------------------------------
# Step time: a.step (the step model of steptime.py), or the collectives when there is no device
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
# Ranking and the reasons
# ---------------------------------------------------------------------------
#: A tight plan (inside the safety margin, ``devices.memory_fit``) is ranked as if this much slower:
#: the search does not pick it over a plan keeping the margin within 2 % of its step time.
TIGHT_PENALTY = 0.02


def _rank_key(limit: int):
    """Fitting plans by step time (without one: by the collectives' seconds, then recomputation),
    a tight one's time counted ``TIGHT_PENALTY`` higher; ties to less recomputation, no offload,
    fewer calls, the larger margin; then the plans over."""
    def key(r: Row):
        c = r.candidate
        if r.fits and r.analysed:
            t = r.step_time_s if r.step_time_s is not None else r.comm_s
            if r.verdict == "tight":
                t *= 1 + TIGHT_PENALTY
            return (0, float(f"{t:.6g}"), r.recompute, c.offload, r.calls, r.peak)
        if r.fits:
            return (1, 0.0, 0, 0, 0, 0)
        over = (r.peak if r.peak is not None else 1 << 62) - limit
        return (2 if r.analysed else 3, over, 0, c.offload, 0, 0)
    return key


def ranked(rows: list[Row], limit: int) -> list[Row]:
    """``rows`` best first (``_rank_key``); ties keep their order (the search's, ``pruning_order``)."""
    return sorted(rows, key=_rank_key(limit))


def _slower_because(r: Measured, above: Measured) -> str:
    """What costs a fitting row its time against the fitting row above it: the part of the step
    (``time_parts``) that grew most, e.g. "0.41 s slower: recomputation of 80 blocks (+0.39 s)"."""
    timed = r.step_time_s is not None and above.step_time_s is not None
    t, t_above = (r.step_time_s, above.step_time_s) if timed else (r.comm_s, above.comm_s)
    dt = t - t_above
    deltas = {k: r.parts.get(k, 0.0) - above.parts.get(k, 0.0) for k in set(r.parts) | set(above.parts)}
    tie = _tie(t_above)
    if dt <= tie:
        return "as fast; " + _tie_reason(r, above)
    grown = sorted(((sec, label) for label, sec in deltas.items() if sec > tie), reverse=True)[:2]
    reasons = ", ".join(f"{_label(label, r)} +{format_duration(sec)}" for sec, label in grown) or "slower collectives"
    shrunk = sorted((sec, label) for label, sec in deltas.items() if sec < -tie)[:1]
    if shrunk and grown and grown[0][0] > dt + tie:  # the growth is partly paid back elsewhere: say where
        reasons += "; " + ", ".join(f"{_label(label, r)} -{format_duration(-sec)}" for sec, label in shrunk)
    if not timed:
        return f"{format_duration(dt)} more collectives (no step time: {r.untimed}): {reasons}"
    return f"{format_duration(dt)} slower: {reasons}"


def _tie_reason(r: Measured, above: Measured) -> str:
    if r.recompute > above.recompute:
        return f"recomputes {r.recompute} blocks (the row above {above.recompute})"
    if r.candidate.offload and not above.candidate.offload:
        return "CPU offload copies every parameter and gradient between host and device"
    if r.calls > above.calls:
        return f"{r.calls} fully_shard calls (the row above {above.calls}): more collectives to launch"
    if r.peak > above.peak:
        return f"peak {format_bytes(r.peak - above.peak)} higher"
    return "equal on every count (listed in search order)"


def _tight_words(r: Measured) -> str:
    return (f"tight: {format_bytes(r.margin)} to spare (reserved peak {format_bytes(r.reserved_peak)}), "
            f"inside the {format_bytes(r.safety)} safety margin")


def _why(r: Row, above: Measured | None, limit: int, usable_text: str) -> str:
    """``limit``: the usable memory (device memory less the reserve), ``usable_text`` it in words.
    Over and tight are judged on the reserved peak (``devices.memory_fit``)."""
    if not r.analysed:
        return r.why
    if not r.fits:
        judged = limit - r.margin
        held = f" (reserved peak {format_bytes(judged)})" if judged != r.peak else ""
        return f"over {usable_text} by {format_bytes(judged - limit)}{held}"
    tight = r.verdict == "tight"
    if above is None:
        return "fastest that fits" + (f", but {_tight_words(r)}: no plan keeping the margin is within "
                                      f"{100 * TIGHT_PENALTY:g} % of its step time" if tight else "")
    if not tight:
        return _slower_because(r, above)
    t, t_above = _seconds(r), _seconds(above)
    if t < t_above - _tie(t_above) and above.verdict == "fits":
        return (f"{_tight_words(r)}; {format_duration(t_above - t)} faster than the row above, which keeps the "
                f"margin: a tight plan is picked only when no plan keeping it is within {100 * TIGHT_PENALTY:g} % "
                "of its step time")
    return f"{_tight_words(r)}; {_slower_because(r, above)}"


def _tie(t: float) -> float:
    return 1e-9 + 1e-6 * t


def _seconds(r: Measured) -> float:
    return r.step_time_s if r.step_time_s is not None and r.step_time_s == r.step_time_s else r.comm_s


def kept_margin_note(rows: list[Row], name) -> str:
    """The best row keeps the safety margin while a faster plan is tight: say so (its ``why``);
    ``name(candidate)``: a row's name."""
    if not rows or not rows[0].fits or not rows[0].analysed or rows[0].verdict != "fits":
        return ""
    best = rows[0]
    faster = [r for r in rows[1:] if r.analysed and r.verdict == "tight" and _seconds(r) < _seconds(best) - _tie(_seconds(best))]
    if not faster:
        return ""
    r = min(faster, key=_seconds)
    return (f"keeps the {format_bytes(best.safety)} safety margin ({format_bytes(best.margin)} to spare); "
            f"{name(r.candidate)} is {format_duration(_seconds(best) - _seconds(r))} faster but {_tight_words(r)}")




# ---------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------
COLUMNS = ["name", "fits", "verdict", "peak", "reserved_peak", "judged_peak", "margin", "step_time_s", "tokens_per_s", "mfu", "why", "lora",
           "checkpoint", "reshard_after_forward", "replicate", "shard", "offload", "batch_size", "grad_accum", "analysed",
           "use_cache"]


def table(rows: list[Row], space: Space) -> pd.DataFrame:
    """``Search.table``: one line per row (ranked), named, with its ``why`` against the fitting row
    above it (a ``tensor`` column when tensor degrees were searched)."""
    world, vary, tp = space.mesh.world, space.training.global_batch is not None, space.tensors != (1,)
    records, above = [], None
    for r in rows:
        c, why = r.candidate, _why(r, above if r.fits else None, space.limit, space.usable_text)
        if r.fits and r.analysed:
            above = r
        name = c.name(world, space.has_lora, vary)
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
    when = (f", a step of {format_duration(best.step_time_s)} ({best.tokens_per_s:,.0f} tokens/s per rank, "
            f"MFU {100 * best.mfu:.1f}%)" if timed else "")
    tight = " (tight: inside the safety margin)" if best.get("verdict") == "tight" else ""
    reserved = (f" (reserved {format_bytes(best.reserved_peak)})" if best.get("reserved_peak") == best.get("reserved_peak")
                and best.get("reserved_peak") is not None else "")
    out = [f"Run {best['name']}: peak {format_bytes(best.peak)}{reserved} of {limit_text}, "
           f"{format_bytes(best.margin)} to spare{tight}{when}."]
    if assumed:
        out.append(f"Fits means: {assumed}.")
    fit = table[table.fits & table.analysed]
    if len(fit) > 1:
        out.append(f"It is the fastest of {len(fit)} plans that fit; the next, {fit['name'].iloc[1]}, is {fit.why.iloc[1]}.")
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
