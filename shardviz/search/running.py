"""Running the candidates: each pruned (``pruning.pruned_by``) or analysed into a ``Measured`` row,
in ``pruning.pruning_order`` (``run``); and, when nothing fits, the world size or micro-batch that
would (``what_would_fit``)."""

from __future__ import annotations

from dataclasses import replace
from itertools import groupby

from .. import collector
from ..analysis import Analysis
from ..finding import PlanError
from ..format import format_bytes
from .candidates import Candidate
from .pruning import Evidence, pruned_by, pruning_order, record
from .rank import time_parts, step_numbers
from .rows import Measured, Pruned, Row, Rule
from .space import Space


def run(space: Space, cands: list[Candidate], progress=None, resume: dict | None = None) -> tuple[list[Row], int]:
    """A row for every candidate, in pruning order, and the number of analyses made. A micro-batch
    larger than one with which nothing fits is pruned. ``progress(done, total)`` after each candidate.
    ``resume``: candidate -> (row, activation profile) of the analyses made so far for this space,
    read and filled in (``search``'s argument)."""
    # an analysis's objects die young, what survives is reused: no full collection while the candidates
    # run (a search stopped midway by the next edit, ``activations.stop``, leaves that edit none to pay)
    with collector.quiet():
        return _run(space, cands, progress, {} if resume is None else resume)


def _run(space: Space, cands: list[Candidate], progress, resume: dict) -> tuple[list[Row], int]:
    ev, rows, total = Evidence(), [], len(cands)
    nowhere: int | None = None  # the smallest micro-batch with which nothing fits
    for batch, group in groupby(pruning_order(cands), key=lambda c: c.batch_size):
        if nowhere is not None and batch is not None:
            words = f"over {space.usable_text}: micro-batch {nowhere} fits with no plan"
            rows += [Pruned(c, Rule.MICRO_BATCH, words) for c in group]
            continue
        batch_rows: list[Row] = []
        for c in group:
            batch_rows.append(_evaluate(space, ev, c, resume))
            if progress is not None:
                progress(len(rows) + len(batch_rows), total)
        rows += batch_rows
        if batch is not None and not any(r.fits for r in batch_rows):
            nowhere = batch
    return rows, ev.n_analysed + sum(r.analysed for r in rows)


def _evaluate(space: Space, ev: Evidence, c: Candidate, resume: dict) -> Row:
    pruned = pruned_by(space, ev, c)
    if pruned is not None:
        return pruned
    done = resume.get(c)
    if done is None:
        try:
            a = space.analysis(c)
            done = resume[c] = (measured(space, c, a), a.activation_profile)
        except PlanError as exc:  # refused before any cost was computed: counted with the pruned
            return Pruned(c, Rule.REFUSED, f"torch would refuse it: {exc.findings[0]}")
    record(space, ev, *done)  # the same evidence as when it was analysed: the same pruning after it
    return done[0]


def measured(space: Space, c: Candidate, a: Analysis) -> Measured:
    """``c``'s row from its analysis ``a``: judged on the reserved peak, with the safety margin."""
    fit, step = a.fit, step_numbers(a)
    return Measured(
        c, fits=fit.fits, verdict=fit.verdict, peak=int(a.memory.peak.max()),
        reserved_peak=int(a.memory.reserved_peak.max()), judged_peak=fit.judged, margin=fit.margin, safety=fit.safety,
        step_time_s=step["step_time_s"], tokens_per_s=step["tokens_per_s"], mfu=step["mfu"],
        untimed=step["reason"], tensor_comm_s=step["tensor_comm_s"],
        comm_s=float(a.comm.attrs.get("time_per_step_s", 0.0)) * c.grad_accum, parts=time_parts(a, c.grad_accum),
        recompute=len(a.plan.checkpoint), calls=len(a.plan.units), mesh=a.mesh,
        use_cache=space.cache_of(c) and not a.cache_refused, cache_refused=a.cache_refused,
        host=fit.host, host_over=fit.host_over, host_text=fit.host_text)


# ---------------------------------------------------------------------------
# When nothing fits
# ---------------------------------------------------------------------------
def what_would_fit(space: Space, rows: list[Row], max_factor: int = 64) -> tuple[str, int]:
    """Nothing fits: say so, and name the smallest world size or micro-batch that would (world
    sizes doubling up to ``max_factor`` times the mesh's); and the number of analyses made."""
    batch = min((r.candidate.batch_size for r in rows if r.candidate.batch_size is not None), default=None)
    lean = Candidate("sharded", "blocks" if batch is not None else None, None, 1, True, batch, 1)  # holds least
    world, name = space.mesh.world, lambda c, w: c.name(w, space.has_lora, False, space.quant_words)
    head = f"nothing fits in {space.usable_text} on {world} ranks"
    a = space.analysis(lean)
    act = a.activation_profile.peak[0] if a.activation_profile is not None else 0
    if act > space.limit:  # the activations alone: more ranks do not shrink them
        hints, tries = [f"the activations alone are {format_bytes(act)} ({name(lean, world)}, micro-batch {batch}), "
                        "more ranks do not help"], 1
    else:
        hint, tries = _more_ranks(space, lean, max_factor)
        hints, tries = [hint], tries + 1
    if batch is not None and batch > 1:
        hint, more = _smaller_batch(space, lean)
        hints, tries = hints + [hint], tries + more
    return head + ": " + "; ".join(hints), tries


def _fits(space: Space, c: Candidate, world: int | None = None) -> bool:
    try:
        return space.analysis(c, world).fit.fits
    except PlanError:
        return False


def _smaller_batch(space: Space, lean: Candidate) -> tuple[str, int]:
    b, tries = lean.batch_size // 2, 0
    while b >= 1 and not _fits(space, replace(lean, batch_size=b)):
        b, tries = b // 2, tries + 1
    tries += b >= 1  # the one that fits
    if b < 1:
        return "not even micro-batch 1 fits", tries
    return f"micro-batch {b} fits ({lean.name(space.mesh.world, space.has_lora, False, space.quant_words)})", tries


def _more_ranks(space: Space, lean: Candidate, max_factor: int) -> tuple[str, int]:
    lean = replace(lean, offload=False)  # an offloaded peak hardly shrinks with more ranks: this one does
    world, top, tries = space.mesh.world * 2, space.mesh.world * max_factor, 0
    while world <= top and not _fits(space, lean, world):
        world, tries = world * 2, tries + 1
    tries += world <= top
    if world > top:
        return f"not even {world // 2} ranks fit", tries
    return f"{world} ranks fit ({lean.name(world, space.has_lora, False, space.quant_words)}" + (
        f", micro-batch {lean.batch_size})" if lean.batch_size else ")"), tries
