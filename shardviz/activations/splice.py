"""Splicing the reduced copy's timeline into the full model's: each block position gets the event
run of its variant's representative (position 0 the first copy's), levels being additive."""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace

from . import stop
from .kvcache import KVRelease
from .opcost import combined
from .profile import ModuleEvent, Timeline
from .reduced import PLAIN, WHOLE_BLOCK, ListPlan


def _is_block_event(ev: ModuleEvent | tuple, li: int) -> bool:
    return isinstance(ev[1], tuple) and ev[1][0] == li


def _run_ends(events: list[ModuleEvent], li: int, phase: str) -> tuple[dict, dict]:
    """rep -> index of its first event in ``phase``, and of its last one that is not a post-backward."""
    first, last = {}, {}
    for j, ev in enumerate(events):
        if ev.phase != phase or not _is_block_event(ev, li):
            continue
        r = ev.key[1]
        first.setdefault(r, j)
        if ev.kind != "post_bw":
            last[r] = j
    return first, last


def _backward_run_end(events: list[ModuleEvent], next_first: int) -> int:
    """Just after the next rep's first event, and after the events at the same instant."""
    end = next_first + 1
    level = events[end - 1].level
    while end < len(events) and events[end].level == level and events[end].peak == level:
        end += 1
    return end


@dataclass(frozen=True)
class _Region:
    """One block list's forward or backward in the reduced timeline: the event range it covers,
    the event range of each rep's run, and the reps in the order they ran."""

    start: int
    stop: int
    li: int
    phase: str
    runs: dict  # rep -> (start, end)
    order: tuple

    def clipped(self, at: int) -> _Region:
        last = self.order[-1]
        runs = dict(self.runs)
        runs[last] = (min(runs[last][0], at), at)
        return replace(self, stop=at, runs=runs)


def _region(events: list[ModuleEvent], li: int, phase: str) -> _Region | None:
    """List ``li``'s region in ``phase``.

    Forward: a run starts at the rep's first event and ends where the next one starts. Backward:
    the next rep's first event (whatever module fires it) carries the level change of this rep's
    last operations - it fires the moment this rep has computed its input gradient - so the run
    ends just after it, and after the events at the same instant (no level change: torch fires
    the block's own pre-backward, the previous block's post-backward, ... together). The last run
    ends at its rep's last event that is not a post-backward: a post-backward waits for the
    gradients of all of a module's inputs, and one shared with later code (an encoder output read
    by every decoder block) delays it past the block's own backward."""
    first, last = _run_ends(events, li, phase)
    if not first:
        return None
    order = tuple(sorted(first, key=first.get))
    runs, start = {}, first[order[0]]
    for i, r in enumerate(order):
        if i + 1 == len(order):
            end = last.get(r, first[r]) + 1
        elif phase == "fw":
            end = first[order[i + 1]]
        else:
            end = _backward_run_end(events, first[order[i + 1]])
        end = max(end, start)
        runs[r] = (start, end)
        start = end
    return _Region(first[order[0]], start, li, phase, runs, order)


def _regions(events: list[ModuleEvent], lists: list[ListPlan]) -> list[_Region]:
    """Every list's forward and backward region, in timeline order. A region may end with hook
    events torch fires late (an identity module on an encoder output: its pre-backward waits for
    the gradient summed over all decoder blocks) inside the next region: it is clipped there; those
    events are then dropped, their level change kept."""
    found = [r for li in range(len(lists)) for phase in ("fw", "bw")
             if (r := _region(events, li, phase)) is not None]
    found.sort(key=lambda r: r.start)
    for i in range(len(found) - 1):
        if found[i].stop > found[i + 1].start:
            found[i] = found[i].clipped(found[i + 1].start)
    return found


# While splicing, an event is a plain tuple in ``ModuleEvent``'s field order (kind, key, phase,
# level, peak, flops, cost): 13k events at 70B, each made twice; a named tuple costs 3x to make.
_KEY, _LEVEL, _PEAK = 1, 3, 4


def _deltas(events: list[ModuleEvent]) -> list[tuple]:
    """The events with level and peak as changes against the previous event's level."""
    out, prev = [], 0
    for kind, key, phase, level, peak, flops, cost in events:
        out.append((kind, key, phase, level - prev, peak - prev, flops, cost))
        prev = level
    return out


def _without_lead(run: list[tuple], li: int, r: int) -> list[tuple]:
    """A region's first run reused at another position: the first run begins with work outside the
    blocks (in backward: the final norm's backward, carried by the last block's first event; an
    encoder's: the decoder blocks' late post-backward) that the previous run already brought. The
    events before the rep's first own change carry no change, the outside ones among them go."""
    mine = [k for k, ev in enumerate(run) if _is_block_event(ev, li) and ev[_KEY][1] == r]
    lead = next((k for k in mine[1:] if run[k][_LEVEL] != 0 or run[k][_PEAK] != 0), len(run))
    # the outside ones keep their place (key None: dropped when the timeline is made absolute)
    return [(ev[0], ev[_KEY] if isinstance(ev[_KEY], tuple) else None, ev[2], 0, 0, 0, None)
            for ev in run[:lead]] + run[lead:]


def _renamed(run: list[tuple], region: _Region, r: int, names: tuple, edge: bool) -> list[tuple]:
    """The events of rep ``r``'s run with their modules named in the full model (None: dropped).
    names: (this position, the previous processed one, the next one). Events of the previous
    representative that fire inside this run (in backward, a block's post-backward fires after the
    next block's pre-backward) go to the previous position; events of modules outside the blocks
    are kept where the run plays the role it had in the reduced model (first or last of the region)."""
    rank = {rep: i for i, rep in enumerate(region.order)}
    mine = rank[r]
    # the names a run's events take, by the rep and the path inside the block in their key
    named: dict[tuple, str | None] = {}
    out = []
    for kind, key, phase, level, peak, flops, cost in run:
        if type(key) is tuple:
            fqn = named.get(key, False)
            if fqn is False:
                if key[0] != region.li:  # another list's block inside this run: not expected
                    fqn = None
                else:
                    base = names[0] if key[1] == r else names[1] if rank.get(key[1], mine) < mine else names[2]
                    # interned: every kept profile names its events with the same strings
                    fqn = None if base is None else sys.intern(base if key[2] == "" else f"{base}.{key[2]}")
                named[key] = fqn
        else:
            fqn = key if edge else None
        out.append((kind, fqn, phase, level, peak, flops, cost))
    return out


def _region_events(region: _Region, deltas: list[tuple], lp: ListPlan) -> tuple[list[tuple], list[int]]:
    """The region replaced by one run per position (forward in order, backward in reverse), and the
    index in the copy's timeline of each event."""
    n = len(lp.positions)
    positions = list(range(n)) if region.phase == "fw" else list(range(n - 1, -1, -1))
    out, sources = [], []
    for i, pos in enumerate(positions):
        stop.check()  # once a block position (80 at 70B): the next edit does not wait for the whole splice
        r = lp.pos_rep[pos]
        if r not in region.runs:
            continue
        a, b = region.runs[r]
        edge = (i == 0 and r == region.order[0]) or (i == n - 1 and r == region.order[-1])
        names = (f"{lp.fqn}.{pos}",
                 f"{lp.fqn}.{positions[i - 1]}" if i > 0 else None,
                 f"{lp.fqn}.{positions[i + 1]}" if i + 1 < n else None)
        run = deltas[a:b]
        if r == region.order[0] and i > 0:
            run = _without_lead(run, region.li, r)
        out.extend(_renamed(run, region, r, names, edge))
        sources.extend(range(a, b))
    return out, sources


def _outside(evs: list[tuple]) -> list[tuple]:
    """Events outside the regions; a block's event there is not expected: dropped, its level kept."""
    return [ev[:1] + (None,) + ev[2:] if isinstance(ev[_KEY], tuple) else ev for ev in evs]


def _absolute(result: list[tuple]) -> Timeline:
    """Changes back to absolute levels; dropped events (key None) carry their change and their
    FLOPs forward (trailing ones go to the last event)."""
    kinds, keys, phases, levels, peaks, flops, costs = [], [], [], [], [], [], []
    level, carry_peak, carry_flops, carry_cost = 0, None, 0, None
    for j, (kind, key, phase, d_level, d_peak, f, cost) in enumerate(result):
        if not j & 4095:
            stop.check()  # every 4,096 events (about 20,000 at 70B)
        peak = level + d_peak
        if carry_peak is not None:
            peak = max(peak, carry_peak)
        level += d_level
        if key is None:
            carry_peak, carry_flops, carry_cost = peak, carry_flops + f, combined(carry_cost, cost)
            continue
        kinds.append(kind)
        keys.append(key)
        phases.append(phase)
        levels.append(level)
        peaks.append(peak)
        flops.append(f + carry_flops)
        costs.append(combined(cost, carry_cost) if carry_cost else cost)
        carry_peak, carry_flops, carry_cost = None, 0, None
    if (carry_flops or carry_cost) and kinds:
        flops[-1] += carry_flops
        costs[-1] = combined(costs[-1], carry_cost)
    return Timeline(kinds, keys, phases, levels, peaks, flops, costs)


def _cache_kept(events: list[ModuleEvent], release: KVRelease) -> list[ModuleEvent]:
    """The copy's timeline as if its key/value cache never died: from the death on, its bytes stay."""
    freed = release.in_copy()
    out = list(events[:release.event])
    for ev in events[release.event:]:
        out.append(ev._replace(level=ev.level + freed, peak=ev.peak + freed))
    at = out[release.event]
    out[release.event] = at._replace(peak=max(events[release.event].peak, at.level))
    return out


def _cache_dies(result: list[tuple], sources: list[int], release: KVRelease, lists: list[ListPlan]) -> None:
    """The cache's death in the full model's timeline (changes), at the last event made from the
    copy's event that saw it (a block run is reused at every position of its representative; the
    cache dies once, in the last one): every position's share freed."""
    at = max((k for k, j in enumerate(sources) if j == release.event), default=len(result) - 1)
    ev = result[at]
    result[at] = ev[:_LEVEL] + (ev[_LEVEL] - release.in_model(lists),) + ev[_LEVEL + 1:]


def splice(events: list[ModuleEvent], lists: list[ListPlan], release: KVRelease | None = None) -> Timeline:
    """The full model's timeline: the reduced timeline with each block list's forward and backward
    regions replaced by one run per position (a dropped event's level change is carried to the
    next event, so levels stay exact). ``release``: the key/value cache's death in the copy
    (``kvcache``): the cache that every position's block filled dies at that moment instead."""
    stop.check()  # pure Python at 70B (tenths of a second): the Inspector's next edit stops it here
    deltas = _deltas(events if release is None else _cache_kept(events, release))
    result, sources, cursor = [], [], 0
    for region in _regions(events, lists):
        if region.start < cursor:
            raise RuntimeError("overlapping block runs in the measured timeline")
        result.extend(_outside(deltas[cursor:region.start]))
        sources.extend(range(cursor, region.start))
        evs, srcs = _region_events(region, deltas, lists[region.li])
        result.extend(evs)
        sources.extend(srcs)
        cursor = region.stop
    result.extend(_outside(deltas[cursor:]))
    sources.extend(range(cursor, len(deltas)))
    if release is not None and result:
        _cache_dies(result, sources, release, lists)
    return _absolute(result)


def _rep_saved(events: list[ModuleEvent]) -> dict[tuple[int, int], int]:
    """(list, rep) -> bytes the rep's forward leaves allocated (level after its inputs' release
    minus level at its first pre-forward)."""
    out, start = {}, {}
    for ev in events:
        key = ev.key
        if not isinstance(key, tuple) or key[2] != "" or ev.phase != "fw":
            continue
        k = (key[0], key[1])
        if ev.kind == "pre_fw":
            start.setdefault(k, ev.level)
        elif ev.kind == "gap" and k in start:
            out[k] = ev.level - start[k]
    return out


def block_saved(events: list[ModuleEvent], lists: list[ListPlan]) -> dict[str, tuple]:
    """Block fqn -> (saved bytes plain, saved bytes checkpointed), from the steady representatives
    (the first block's own variant from the first copy)."""
    rep_saved = _rep_saved(events)
    out = {}
    for li, lp in enumerate(lists):
        index = {v: r for r, (v, _) in enumerate(lp.reps) if r > 0}
        for pos, (kind, ck) in enumerate(lp.variants):
            plain = rep_saved.get((li, index.get((kind, PLAIN))))
            ckpt = rep_saved.get((li, index.get((kind, WHOLE_BLOCK))))
            if pos == 0 and ck == PLAIN:
                plain = rep_saved.get((li, 0))
            elif pos == 0 and ck == WHOLE_BLOCK:
                ckpt = rep_saved.get((li, 0))
            out[f"{lp.fqn}.{pos}"] = (plain, ckpt)
    return out
