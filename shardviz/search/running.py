"""Running the candidates: each pruned (``pruning.pruned_by``) or analysed into a ``Measured`` row,
in ``pruning.pruning_order`` (``run``); and, when nothing fits, the world size or micro-batch that
would (``what_would_fit``)."""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
from dataclasses import replace
from itertools import accumulate, groupby

from .. import collector, forked
from ..activations import measure_cache, stop
from ..analysis import Analysis
from ..finding import PlanError
from ..format import format_bytes
from .candidates import Candidate
from .pruning import Evidence, activation_level, pruned_by, pruning_order, record
from .rank import time_parts, step_numbers
from .rows import Measured, Pruned, Row, Rule
from .space import Space


def run(space: Space, cands: list[Candidate], progress=None, resume: dict | None = None,
        workers: int = 1) -> tuple[list[Row], int]:
    """A row for every candidate, in pruning order, and the number of analyses made. A micro-batch
    larger than one with which nothing fits is pruned. ``progress(done, total)`` after each candidate.
    ``resume``: candidate -> (row, activation profile) of the analyses made so far for this space,
    read and filled in (``search``'s argument). ``workers=2``: the analyses first run on two cores
    (``_analyse_on_two_cores``); the rows are those of one."""
    # an analysis's objects die young, what survives is reused: no full collection while the candidates
    # run (a search stopped midway by the next edit, ``activations.stop``, leaves that edit none to pay)
    resume = {} if resume is None else resume
    order = pruning_order(cands)
    with collector.quiet():
        if workers > 1 and len(order) > 1 and len({c.batch_size for c in order}) == 1 and forked.available():
            _analyse_on_two_cores(space, order, progress, resume)
        return _run(space, order, progress, resume)


def _run(space: Space, order: list[Candidate], progress, resume: dict) -> tuple[list[Row], int]:
    ev, rows, total = Evidence(), [], len(order)
    nowhere: int | None = None  # the smallest micro-batch with which nothing fits
    for batch, group in groupby(order, key=lambda c: c.batch_size):
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


_CLAIM = struct.Struct("<I")  # a claim's number (its candidate and twin: ``_analyse_on_two_cores``), read from the pipe
_PIPE_BYTES = 1 << 16  # what a Linux pipe holds by default (pipe(7)): 16,384 positions


def _analyse_on_two_cores(space: Space, order: list[Candidate], progress, resume: dict) -> None:
    """Fill ``resume`` with the analyses of ``order``, made by this process and a forked copy of it
    (``shardviz.forked``: analysing is Python, one core per process). Each takes the next candidate
    from one pipe holding every position in order (a read of 4 bytes is atomic: no lock, and a killed
    copy leaves the pipe whole), with its twin with CPU offload (``pruning_order`` puts it next: it is
    pruned when the one without fits), prunes them with what it analysed itself, else analyses them;
    one claim, after the first level's leads, measures the next level's step ahead (``measure_ahead``).
    A step both need is measured by one of them (``measure_cache.measure_once``, through a folder
    they share), and the copy's analyses and the steps it measured come back (``measure_cache.adopt``). ``run`` then
    goes through ``order`` once more with all of them: the same evidence, so the same rows as one
    process, and what neither analysed (a candidate the copy pruned with evidence this run does not
    have, or all of the copy's share if it failed) is analysed then."""
    starts = [i for i, c in enumerate(order) if not (c.offload and i and order[i - 1] == replace(c, offload=False))]
    # within a level, each layout's first candidate first: the two start on different layouts, whose
    # first candidates measure different steps (each layout keeps its own order: the same pruning)
    first: dict = {}
    for i in starts:
        first.setdefault((activation_level(order[i]), order[i].lora, order[i].tensor), i)
    leads = set(first.values())
    starts.sort(key=lambda i: (activation_level(order[i]), i not in leads, i))
    twins = [i + 1 < len(order) and order[i + 1] == replace(order[i], offload=True) for i in starts]
    taken = list(accumulate(1 + t for t in twins))  # candidates claimed once claim k is: what progress says
    if len(starts) * _CLAIM.size > _PIPE_BYTES:  # more than the pipe holds at once: one core
        return
    _shared_first(space, order)
    # one more claim, number len(starts), once the first level's leads are claimed: measure ahead
    level0 = activation_level(order[starts[0]])
    claims = list(range(len(starts)))
    claims.insert(sum(i in leads and activation_level(order[i]) == level0 for i in starts), len(starts))
    later_leads = [order[i] for i in starts if i in leads and activation_level(order[i]) != level0]
    r, w = os.pipe()
    os.write(w, b"".join(_CLAIM.pack(k) for k in claims))
    os.close(w)  # read to its end, each process sees EOF
    at, folder, parent = measure_cache.mark(), tempfile.mkdtemp(prefix="shardviz-search-"), os.getpid()

    def claim_and_analyse(progress_of=None) -> dict:
        ev, mine = Evidence(), {}
        while len(data := os.read(r, _CLAIM.size)) == _CLAIM.size:
            k, = _CLAIM.unpack(data)
            if k == len(starts):
                measure_ahead(space, ev, later_leads)
                continue
            for c in order[starts[k]:starts[k] + 1 + twins[k]]:
                _evaluate(space, ev, c, resume)
                if c in resume:
                    mine[c] = resume[c]
            if progress_of is not None:
                progress_of(taken[k], len(order))  # claimed in order: as many taken by the two so far
        return mine

    def elsewhere():
        with measure_cache.shared_between(folder, lambda: os.getppid() == parent):
            return claim_and_analyse(), measure_cache.kept_since(at)

    copy = forked.Forked(elsewhere)
    try:
        with measure_cache.shared_between(folder, lambda: not copy.done.is_set()):
            claim_and_analyse(progress)
        while not copy.done.wait(0.02):
            if progress is not None:
                progress(len(order), len(order))  # the caller's chance to stop (the Inspector's cancel)
    finally:
        copy.kill()
        os.close(r)
        shutil.rmtree(folder, ignore_errors=True)
    if copy.ok:
        theirs, kept = copy.result
        measure_cache.adopt(at, kept)
        for c, done in theirs.items():
            resume.setdefault(c, done)


def measure_ahead(space: Space, ev: Evidence, leads: list[Candidate]) -> Candidate | None:
    """Measure the step of the first of ``leads`` (the first candidates of the later levels) that
    ``ev`` does not prune and whose layout and tensor degree fit in an analysis of ``ev``; return it
    (None: no such lead, nothing measured). On two cores the later levels' claims come after every
    claim of the first level: the process first out of claims there measured the step the next
    level needs while the other, needing it too, waited (``measure_cache.measure_once``). Measured
    ahead, it is ready when the level comes. A guess: when the rest of the first level proves the
    later level over the device, it was not needed (one step measured for nothing, on one core)."""
    fits = {(c.lora, c.tensor) for c, fit in ev.fitting.items() if fit}
    for c in leads:
        if (c.lora, c.tensor) in fits and pruned_by(space, ev, c) is None:
            try:
                space.analysis(c).activation_profile  # noqa: B018 - kept (measure_cache), read by the other
            except Exception:  # noqa: BLE001 - a guess: the candidate's own analysis meets the error, if made
                return None
            return c
    return None


def _shared_first(space: Space, order: list[Candidate]) -> None:
    """What both processes would compute for their first candidate of each layout (its model-state
    peak, its calls' unsharded bytes: ``Space`` keeps them), computed here once before the fork; and
    each tensor degree's local copy of the model, with its entry in the measurement cache: the copy's
    steps measured on it come back only for a model the cache held at the fork (``measure_cache.mark``)."""
    for c in {(c.lora, c.tensor, c.quant): c for c in order}.values():
        try:
            space.state_peak(c)
            if any(o.reshard_after_forward not in (None, True) for o in order):
                space.unsharded(c)
            if c.tensor > 1 and c.batch_size is not None:
                measure_cache.entry_of(space.analysis(c).measured_model, None)
        except PlanError:  # raised again where one process would meet it
            pass


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
    fit = a.fit
    stop.check()  # between the analysis's stages too (tens of ms each at 70B): the next edit stops the search here
    step = step_numbers(a)
    stop.check()
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
