"""One training step as FSDP2 schedules it: a compute stream, communication streams, overlap.

A pure model with explicit inputs (each call's ``Call`` with its seconds, in forward order); see docs/step-time.md.
It mirrors torch 2.13 (``torch/distributed/fsdp/_fully_shard``):

- streams (``_fsdp_param_group.FSDPCommContext``): compute on the default stream; all-gather
  (with its copy-in), reduce-scatter and all-reduce (HSDP) on their own streams;
- forward (``FSDPParamGroup.pre_forward``): a unit's all-gather is issued by its pre-forward hook,
  which the CPU reaches while the GPU still computes the previous unit (implicit prefetch);
  explicit ``set_modules_to_forward_prefetch`` targets are issued by the same hook
  (``FSDPState._pre_forward``); compute waits for its unit's all-gather (``wait_for_unshard``);
- backward (``pre_backward``, ``_backward_prefetch``): a unit's own all-gather if it was not
  prefetched, then the next unit in reverse post-forward order is prefetched (one ahead, or the
  explicit ``set_modules_to_backward_prefetch`` list); ``reshard_after_forward=False`` units
  need no backward all-gather (``unshard`` returns when already unsharded);
- ``post_backward``: the compute stream first waits for the previous reduce-scatter still in
  flight (``reduce_scatter_states``, ``max_input_buffers = 1``), then the unit's reduce-scatter
  waits for the compute stream (``foreach_reduce``: ``reduce_scatter_stream.wait_stream``), so
  each reduce-scatter overlaps the next unit's backward; HSDP's all-reduce follows its
  reduce-scatter on the all-reduce stream; CPU offload copies the gradient shard to the host after;
- end of backward (``_root_post_backward_final_callback``, ``finalize_backward``): the compute
  stream waits for every reduction; then the one all-reduce of ignored parameters' gradients
  (the exported code's, exposed) and the optimizer step.

The root call (the one on the whole model) encloses every other unit: its all-gather is issued
first, its forward compute (norm, LM head) runs after the blocks, its backward compute before
theirs, and its post-backward (reduce-scatter) comes last.

The order of the hooks is the one walk ``step_events`` (shared with the bytes model,
``simulation``, and built on ``step.calls``' hook rules: the default backward prefetch target, the
final callback's post-backwards); this module folds it into seconds (docs/step-rules.md).

Assumption (documented): the CPU runs one unit ahead of the GPU in forward and reaches each
backward hook as the GPU gets there; collectives on different communicators (HSDP's all-reduce,
a separate reduce-scatter group) do not slow each other.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

from ..activations import stop
from ..run.devices import DEFAULT_EFFICIENCY, Device, Efficiency
from .calls import OUTSIDE, SECONDS_FIELDS, Call, ParamState
from .events import Group, Hook, step_events

COMPUTE, ALL_GATHER, REDUCE_SCATTER, ALL_REDUCE = "compute", "all_gather", "reduce_scatter", "all_reduce"
STREAMS = (COMPUTE, ALL_GATHER, REDUCE_SCATTER, ALL_REDUCE)


def _check_seconds(owner: str, name: str, value, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{owner}.{name} must be seconds >= 0, got {value!r}")


def check_seconds(call: Call, owner: str | None = None) -> None:
    """A call's seconds (``SECONDS_FIELDS``) are finite and >= 0 (``reduce_scatter_s`` and
    ``all_reduce_s`` may be None: no such collective); its name a string."""
    owner = owner or f"Call({call.name!r})"
    if not isinstance(call.name, str):
        raise ValueError(f"{owner}.name must be a string, got {call.name!r}")
    for name in SECONDS_FIELDS:
        _check_seconds(owner, name, getattr(call, name), name in ("reduce_scatter_s", "all_reduce_s"))


def timed(name: str, *, reshard_after_forward: bool = True, backward_hook: bool = True,
          backward_gather_own_group: bool = False, **seconds) -> Call:
    """One ``fully_shard`` call's ``Call`` made by hand from its seconds (``Call.forward_s``, ...: per
    rank, one micro-batch), for ``schedule_step`` to lay out under its assumptions (``_calls``).

    ``reduce_scatter_s=None`` (the default): the call has no gradient (no reduce-scatter);
    ``all_reduce_s=None``: no HSDP all-reduce. ``h2d_s`` / ``d2h_s``: CPU offload's copies.
    ``reshard_after_forward=False``: no backward all-gather (``Call.after_forward`` unsharded).
    ``backward_hook=False``: the call's output needs no gradient (a frozen embedding that runs
    first), so torch registers no pre-backward for it (``Call.out_grad``): it computes nothing in
    backward, an all-gather prefetched for it is dropped, its post-backward runs at the end of backward.
    ``backward_gather_own_group=True``: the backward all-gather goes over the post-forward group
    (an int ``reshard_after_forward``: ``ParamState.POST_FORWARD_SHARD``), not the communicator the
    reduce-scatters use."""
    owner = f"timed({name!r})"
    unknown = sorted(set(seconds) - set(SECONDS_FIELDS))
    if unknown:
        raise ValueError(f"{owner}: no such seconds {unknown}; the seconds are {', '.join(SECONDS_FIELDS)}")
    for key, value in (("reshard_after_forward", reshard_after_forward), ("backward_hook", backward_hook),
                       ("backward_gather_own_group", backward_gather_own_group)):
        if not isinstance(value, bool):
            raise ValueError(f"{owner}.{key} must be a bool, got {value!r}")
    after = (ParamState.UNSHARDED if not reshard_after_forward else
             ParamState.POST_FORWARD_SHARD if backward_gather_own_group else ParamState.SHARDED)
    call = Call(OUTSIDE, 0, (), (), backward_hook, True, 0, after, name=name, **seconds)
    check_seconds(call, owner)
    return call._replace(reduces=call.reduce_scatter_s is not None or call.all_reduce_s is not None)


@dataclass(frozen=True)
class StepExtras:
    """What a step does besides the units: the all-reduce of ignored parameters' gradients after
    backward (None: there is none) and the optimizer step (``optimizer_seconds``)."""

    ignored_all_reduce_s: float | None = None
    optimizer_s: float = 0.0

    def __post_init__(self):
        _check_seconds("StepExtras", "ignored_all_reduce_s", self.ignored_all_reduce_s, optional=True)
        _check_seconds("StepExtras", "optimizer_s", self.optimizer_s)


class Event(NamedTuple):
    """One bar of the timeline: ``exposed_s`` is how long the compute stream waited on it.
    (A NamedTuple: a 70B step has hundreds of events, made on every change of plan.)"""

    stream: str
    unit: str | None
    kind: str
    phase: str
    start_s: float
    end_s: float
    exposed_s: float = 0.0

    @property
    def exposed(self) -> bool:
        return self.exposed_s > 0

    def as_dict(self) -> dict:
        return {"stream": self.stream, "unit": self.unit, "kind": self.kind, "phase": self.phase,
                "start_s": self.start_s, "end_s": self.end_s, "exposed": self.exposed, "exposed_s": self.exposed_s}


@dataclass(frozen=True)
class Schedule:
    """The model's answer: events on their streams, the order the CPU issues them, the step."""

    units: tuple[Call, ...]
    events: tuple[Event, ...]
    issue_order: tuple[tuple[str, str | None], ...]
    step_time_s: float
    exposed_comm_s: float
    compute_s: float

    @property
    def step(self) -> dict:
        return {"step_time_s": self.step_time_s, "exposed_comm_s": self.exposed_comm_s, "compute_s": self.compute_s}

    def rows(self) -> list[dict]:
        """One row per unit (root first, then forward order): seconds as the model used them."""
        exposed: dict = {}
        for e in self.events:
            exposed[e.unit] = exposed.get(e.unit, 0.0) + e.exposed_s
        issued = {(e.unit, e.kind, e.phase) for e in self.events}
        return [{
            "unit": u.name, "forward_s": u.forward_s, "backward_s": u.backward_s, "recompute_s": u.recompute_s,
            "all_gather_forward_s": u.all_gather_forward_s,
            "all_gather_backward_s": u.all_gather_backward_s if (u.name, ALL_GATHER, "backward") in issued else 0.0,
            "reduce_scatter_s": u.reduce_scatter_s or 0.0, "all_reduce_s": u.all_reduce_s or 0.0,
            "exposed_comm_s": exposed.get(u.name, 0.0),
        } for u in self.units]

    def table(self):
        """``rows()`` as a pandas DataFrame (what ``a.time`` shows)."""
        import pandas as pd

        return pd.DataFrame(self.rows())

    def timeline(self) -> list[dict]:
        """The events as plain dicts, in start order: the payload a chart draws."""
        return [e.as_dict() for e in sorted(self.events, key=lambda e: (e.start_s, STREAMS.index(e.stream)))]


@dataclass
class _Bar:
    stream: str
    unit: str | None
    kind: str
    phase: str
    start_s: float
    end_s: float
    exposed_s: float = 0.0


@dataclass
class _Simulator:
    """Folds the hooks (``step_events``) into seconds; keeps each stream's next free time."""

    now: float = 0.0  # the compute stream's next free time
    free: dict = field(default_factory=lambda: {s: 0.0 for s in STREAMS})
    bars: list = field(default_factory=list)
    issued: list = field(default_factory=list)
    gathers: dict = field(default_factory=dict)  # (unit, phase) -> its all-gather bar
    pending_rs: _Bar | None = None
    reductions: list = field(default_factory=list)
    shared_group: bool = True  # all-gathers and reduce-scatters share one communicator (torch's default)
    group_free: float = 0.0  # that communicator's next free time

    def comm(self, stream: str, unit: Call | None, kind: str, phase: str, ready: float, seconds: float,
             shard_group: bool = False) -> _Bar:
        """A bar on ``stream`` from ``ready``; ``shard_group``: a collective of the shard group's
        communicator, which runs one collective at a time in issue order."""
        shared = shard_group and self.shared_group
        start = max(ready, self.free[stream], self.group_free if shared else 0.0)
        bar = _Bar(stream, unit.name if unit else None, kind, phase, start, start + seconds)
        self.free[stream] = bar.end_s
        if shared:
            self.group_free = bar.end_s
        self.bars.append(bar)
        self.issued.append((kind, bar.unit))
        return bar

    def compute(self, unit: Call | None, kind: str, phase: str, seconds: float) -> float:
        start = self.now
        if seconds > 0:
            self.bars.append(_Bar(COMPUTE, unit.name if unit else None, kind, phase, start, start + seconds))
        self.now = start + seconds
        return start

    def wait(self, *bars: _Bar | None) -> None:
        """The compute stream waits for ``bars``; each second it idles is exposed on the bar it waits for."""
        for bar in sorted((b for b in bars if b is not None), key=lambda b: b.end_s):
            if bar.end_s > self.now:
                bar.exposed_s += bar.end_s - self.now
                self.now = bar.end_s

    def all_gather(self, unit: Call, phase: str, issue_at: float, group: Group = Group.SHARD) -> None:
        """``FSDPParamGroup.unshard``: one all-gather ``step_events`` decided (a call unsharded or
        already prefetched issues none), with its host-to-device copy under CPU offload."""
        ready = issue_at
        if unit.h2d_s > 0:
            ready = self.comm(ALL_GATHER, unit, "h2d", phase, issue_at, unit.h2d_s).end_s
        seconds = unit.all_gather_forward_s if phase == "forward" else unit.all_gather_backward_s
        shard_group = phase == "forward" or group is Group.SHARD
        self.gathers[(unit.name, phase)] = self.comm(ALL_GATHER, unit, ALL_GATHER, phase, ready, seconds, shard_group)

    def issue(self, every: list[Call], gathers, phase: str, issue_at: float) -> None:
        for gather in gathers:
            self.all_gather(every[gather.call], phase, issue_at, gather.group)


def _prefetch_lists(every: list[Call], lists: dict, phase: str) -> dict:
    """An explicit prefetch list by unit name -> by index in ``every`` (what ``step_events`` takes)."""
    index = {u.name: j for j, u in enumerate(every)}
    out = {}
    for owner, names in lists.items():
        for name in (owner, *names):
            if name not in index:
                raise ValueError(f"{phase}_prefetch of unit {owner!r} names {name!r}, which is not a unit")
        out[index[owner]] = tuple(index[n] for n in names)
    return out


def _forward(sim: _Simulator, every: list[Call], events) -> None:
    """Folds the forward hooks: a pre-forward issues its call's all-gather, the compute stream
    waits for it, then the explicit targets' (``event.prefetches``); the call computes until its
    post-forward (the root's own compute, norm and LM head, at its post-forward, after the blocks)."""
    previous_start = 0.0
    for event in events:
        unit = every[event.call]
        if event.kind is Hook.PRE_FORWARD:
            issue_at = previous_start  # the CPU is one unit ahead: this hook runs while the GPU computes the previous unit
            sim.issue(every, event.gathers, "forward", issue_at)
            sim.wait(sim.gathers.get((unit.name, "forward")))
            sim.issued.append(("forward", unit.name))  # FSDPParamGroup.pre_forward has returned
            sim.issue(every, event.prefetches, "forward", issue_at)
            previous_start = sim.now  # the call's compute starts here
        elif event.kind is Hook.POST_FORWARD:
            sim.compute(unit, "forward", "forward", unit.forward_s)


def _pre_backward(sim: _Simulator, every: list[Call], event) -> None:
    """``FSDPState._pre_backward``: the group's pre-backward (its own all-gather, the wait, the
    default prefetch: ``event.gathers``), then an explicit list's (``event.prefetches``)."""
    unit = every[event.call]
    issue_at = sim.now  # runs as the GPU reaches this unit
    own = event.own_gather()
    sim.issue(every, own, "backward", issue_at)
    sim.wait(sim.gathers.get((unit.name, "backward")))
    sim.issue(every, event.gathers[len(own):], "backward", issue_at)  # the default prefetch
    sim.issued.append(("backward", unit.name))
    sim.issue(every, event.prefetches, "backward", issue_at)


def _post_backward(sim: _Simulator, unit: Call, reduce: bool) -> None:
    """``FSDPParamGroup.post_backward``: the reductions, when ``step_events`` says it reduces."""
    sim.wait(sim.pending_rs)  # the previous reduce-scatter still in flight (one input buffer kept)
    sim.pending_rs = None
    if not reduce:
        return
    if unit.reduce_scatter_s is not None:
        last = sim.comm(REDUCE_SCATTER, unit, REDUCE_SCATTER, "backward", sim.now, unit.reduce_scatter_s, True)
        sim.pending_rs = last
    if unit.all_reduce_s is not None:  # HSDP; alone when the shard groups are of 1 rank (no reduce-scatter)
        start = last.end_s if unit.reduce_scatter_s is not None else sim.now
        last = sim.comm(ALL_REDUCE, unit, ALL_REDUCE, "backward", start, unit.all_reduce_s)
    if unit.d2h_s > 0:
        last = sim.comm(last.stream, unit, "d2h", "backward", last.end_s, unit.d2h_s)
    sim.reductions.append(last)


def _backward(sim: _Simulator, every: list[Call], events) -> None:
    """Folds the backward hooks: each pre-backward (own all-gather, the default prefetch, the
    recomputation, the backward compute), each post-backward (its reductions), those the root's
    final callback runs, then ``finalize_backward``: the compute stream waits for every reduction."""
    for event in events:
        if event.kind is Hook.PRE_BACKWARD:
            unit = every[event.call]
            _pre_backward(sim, every, event)
            if unit.recompute_s > 0:
                sim.issued.append(("recompute", unit.name))
                sim.compute(unit, "recompute", "backward", unit.recompute_s)
            sim.compute(unit, "backward", "backward", unit.backward_s)
        elif event.kind is Hook.POST_BACKWARD:
            _post_backward(sim, every[event.call], event.reduce)
    sim.wait(sim.pending_rs, *sim.reductions)  # finalize_backward: every reduction is done


def _calls(every: list[Call], root: Call | None) -> list[Call]:
    """Rows made by hand (``timed``) placed as ``step_events`` walks them, under the schedule's
    assumptions: no call nested in another but the root, whose forward begins first and ends last;
    every input but the root's needs a gradient (docs/step-rules.md, "What the seconds model simplifies")."""
    end = (2 * len(every),)
    return [u._replace(unit=j, first=j, pre_forward=(-1,) if u is root else (2 * j,),
                       post_forward=end if u is root else (2 * j + 1,), in_grad=u is not root, root=0)
            for j, u in enumerate(every)]


def _step_end(sim: _Simulator, extras: StepExtras) -> None:
    if extras.ignored_all_reduce_s is not None:
        bar = sim.comm(ALL_REDUCE, None, "ignored_all_reduce", "backward", sim.now, extras.ignored_all_reduce_s)
        sim.wait(bar)
    if extras.optimizer_s > 0:
        sim.issued.append(("optimizer", None))
        sim.compute(None, "optimizer", "step", extras.optimizer_s)


def _check_units(units, root) -> list[Call]:
    units = list(units)
    everything = units + ([root] if root is not None else [])
    for u in everything:
        if not isinstance(u, Call):
            raise ValueError(f"units must be Call rows (schedule.timed makes one by hand), got {u!r}")
        check_seconds(u)
    duplicates = sorted(n for n, k in Counter(u.name for u in everything).items() if k > 1)  # one pass: ~450 calls at 70B
    if duplicates:
        raise ValueError(f"units: {duplicates} appear more than once")
    return units


def schedule_step(units, *, root: Call | None = None, extras: StepExtras | None = None,
                  forward_prefetch: dict | None = None, backward_prefetch: dict | None = None,
                  separate_reduce_scatter_group: bool = False, sync: bool = True, placed: bool = False) -> Schedule:
    """Simulate one step. ``units``: the calls under the root, in forward order; ``root``: the call
    on the whole model, if any. ``forward_prefetch`` / ``backward_prefetch``: unit name -> names
    of the units its hook prefetches, when the plan sets them (torch's explicit prefetch).
    ``separate_reduce_scatter_group``: the reduce-scatters have a communicator of their own
    (``set_separate_reduce_scatter_group``), so they overlap the all-gathers. ``sync=False``: a
    micro-batch under ``set_requires_gradient_sync(False)``: no reduction (nor its host copy).
    Each unit is its call's ``Call`` with its seconds. ``placed``: the calls hold where the layout
    places their hooks (``calls.build_calls``: nesting, contexts, which hooks torch registers; as
    ``step.timing`` passes them); False: rows made by hand (``timed``), laid out under the
    schedule's assumptions (``_calls``)."""
    units = _check_units(units, root)
    extras = extras if extras is not None else StepExtras()
    every = ([root] if root is not None else []) + units
    sim = _Simulator(shared_group=not separate_reduce_scatter_group)
    walk = every if placed else _calls(every, root)
    events = step_events(walk, forward_prefetch=_prefetch_lists(every, forward_prefetch or {}, "forward"),
                         backward_prefetch=_prefetch_lists(every, backward_prefetch or {}, "backward"), sync=sync)
    stop.check()  # between the stages (tens of ms each at 70B): the Inspector's next edit stops it here
    _forward(sim, every, events.forward)
    stop.check()
    _backward(sim, every, events.backward)
    _step_end(sim, extras)
    events = tuple(Event(b.stream, b.unit, b.kind, b.phase, b.start_s, b.end_s, b.exposed_s) for b in sim.bars)
    compute_s = sum(e.end_s - e.start_s for e in events if e.stream == COMPUTE)
    return Schedule(tuple(every), events, tuple(sim.issued), sim.now, sum(e.exposed_s for e in events), compute_s)


# ---------------------------------------------------------------------------
# The optimizer step's seconds (a collective's: collectives.py; an op's: timing.op_seconds)
# ---------------------------------------------------------------------------
def optimizer_seconds(bytes_moved: float, device: Device, efficiency: Efficiency = DEFAULT_EFFICIENCY) -> float:
    """The optimizer step is memory-bound: bytes read and written / (HBM GB/s x ``efficiency.hbm``)."""
    _check_seconds("optimizer_seconds", "bytes_moved", bytes_moved)
    return float(bytes_moved) / (device.hbm_gbps * 1e9 * efficiency.hbm)


def host_optimizer_seconds(params: float, efficiency: Efficiency = DEFAULT_EFFICIENCY) -> float:
    """CPU offload's optimizer step on the host: ``params`` trainable elements of one rank at
    ``efficiency.host_adamw_gparams_per_s`` (docs/step-time.md, "Host time")."""
    _check_seconds("host_optimizer_seconds", "params", params)
    return float(params) / (efficiency.host_adamw_gparams_per_s * 1e9)
