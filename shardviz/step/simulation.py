"""One training step of FSDP2, event by event, in the order torch runs its hooks (bytes per rank).

Forward: ``pre_forward`` / ``post_forward`` per call in module order; backward: ``pre_backward``
(with the backward prefetch), the gradients, ``post_backward`` in reverse module order, then the
root's final callback and the exported code's gradient averaging. The optimizer step is not here:
its size differs by rank (``step.model``). The hooks and their order are the one walk
``step_events`` (built on ``step.calls``' hook rules, shared with ``schedule``); this module folds it into bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from ..activations import stop
from .events import GROUP_NAMES, POST_FORWARD_SHARD, SHARD_GROUP, SHARDED, UNSHARDED, Gather, Hook, step_events
from .calls import Call


@dataclass(frozen=True)
class Alive:
    """What one moment of the step holds on top of the resident state (bytes per rank)."""

    unsharded_params: int = 0  # all-gathered copies (and post-forward shards)
    communication_buffers: int = 0  # all-gather inputs/outputs, reduce-scatter buffers, all-reduce buffers
    gradients: int = 0  # sharded, whole and unsharded gradients alive
    activations: int = 0  # saved for backward, and the step's inputs
    temporaries: int = 0  # autograd temporaries, averaging copies, optimizer step temporaries

    def total(self) -> int:
        return (self.unsharded_params + self.communication_buffers + self.gradients + self.activations
                + self.temporaries)


@dataclass(frozen=True)
class Moment:
    """The largest moment of forward + backward: its phase, the call running, what it holds."""

    phase: str  # "forward" | "backward"
    unit: int | None  # index into CostModel.units
    alive: Alive
    module: str | None = None  # where the activations peak, when they are counted


class Collective(NamedTuple):
    """One collective a micro-batch issues, once (``collectives.step_count``: how many times a step
    does; ``collectives.price``: its seconds)."""

    unit: int  # the call's index in plan.units
    collective: str  # all_gather | reduce_scatter | all_reduce
    phase: str
    group: str  # shard | post_forward | replicate
    group_size: int


# built positionally by ``_make``: a NamedTuple's own constructor is a Python-level ``__new__``, three
# times slower (a step issues ~250 collectives a plan)
new_collective = Collective._make


class Microbatch(NamedTuple):
    """One kind of micro-batch of a step (``Training.grad_accum``)."""

    first: bool  # the first after zero_grad(): no gradient exists yet
    sync: bool  # its backward reduce-scatters (set_requires_gradient_sync(True))


def microbatches(grad_accum: int, sync_every: bool) -> list[Microbatch]:
    """The distinct micro-batches of one step: the first, one standing for the middle ones (they
    start from the same state), the last, which syncs."""
    kinds = [Microbatch(True, grad_accum == 1 or sync_every)]
    if grad_accum > 2:
        kinds.append(Microbatch(False, sync_every))
    if grad_accum > 1:
        kinds.append(Microbatch(False, True))
    return kinds


@dataclass(frozen=True)
class StepResult:
    peak: int  # transient bytes (on top of the resident state) of the largest moment; -1: none
    moment: Moment | None
    collectives: tuple[Collective, ...]  # the last micro-batch's (the one that reduces), each issued once


@dataclass
class Held:
    """What the step holds beyond the resident state at the current event (bytes per rank)."""

    unsharded_params: int = 0  # all-gathered parameters and post-forward shards
    # forward: each root context's last all-gather output, freed by the next copy-out (implicit prefetch)
    last_gather_of_context: dict[int, int] = field(default_factory=dict)
    forward_gathers: int = 0  # their sum
    # backward: all-gather outputs issued (or prefetched) and not yet copied out, per call (``prefetch``)
    prefetched: dict[int, int] = field(default_factory=dict)
    prefetched_bytes: int = 0  # their sum, kept as they change (it is read at every backward moment)
    reduce_scatter_input: int = 0  # the last one, kept until the next post-backward
    # every gradient alive: sharded, whole and unsharded (those of the two dicts below), one sum
    # (it is read at every moment)
    gradients: int = 0
    unsharded_grads_of: dict[int, int] = field(default_factory=dict)  # per call, computed in this backward
    # per call, kept from earlier micro-batches without gradient sync (Training.grad_accum)
    accumulated_grads_of: dict[int, int] = field(default_factory=dict)

    def prefetch(self, k: int, nbytes: int) -> None:
        """Call ``k``'s all-gather output, ``nbytes``, is issued (0: none, over a group of one rank)."""
        self.prefetched_bytes += nbytes - self.prefetched.get(k, 0)
        self.prefetched[k] = nbytes

    def copy_out(self, k: int) -> None:
        """Call ``k``'s all-gather output is copied out (its bytes move to ``unsharded_params``)."""
        self.prefetched_bytes -= self.prefetched.pop(k)

    def add_unsharded_grads(self, k: int, nbytes: int) -> None:
        self.unsharded_grads_of[k] = self.unsharded_grads_of.get(k, 0) + nbytes
        self.gradients += nbytes

    def end_backward(self) -> None:
        """``FSDPState._root_post_backward_final_callback``: the last reduce-scatter input and
        prefetched all-gathers nobody copied out are dropped (``finalize_backward``)."""
        self.reduce_scatter_input = 0
        self.prefetched.clear()
        self.prefetched_bytes = 0


class StepSimulation:
    """Runs the step's hooks; each records the moments where memory can peak with ``observe``.

    ``root_posts``: (post-forward position, plan unit index) of every root call;
    ``unmanaged_grads``: gradients computed outside every call; ``averaging``: the exported code's
    gradient averaging (``step.rank_state.GradientAveraging``) or None; ``levels``: activation levels
    (``step.levels``); ``tensors``: an option that replays each hook's tensors
    (``reserved.TensorReplay``: the caching allocator), called at each hook, or None."""

    def __init__(self, units: list[Call], root_posts, unmanaged_grads: int, averaging, levels,
                 shard: int, replicate: int, grad_accum: int = 1, sync_every: bool = False, tensors=None):
        self.units = units
        self.tensors = tensors
        self.grad_accum, self.sync_every = grad_accum, sync_every
        self.mb = Microbatch(True, True)
        self.root_posts = root_posts
        self.unmanaged_grads = unmanaged_grads
        self.averaging = averaging
        self.act = levels
        self.S, self.R = shard, replicate
        self.peak = -1
        self.moment: Moment | None = None
        self.act_level = 0  # the activations of the latest moment observed
        self.collectives: list[Collective] = []
        self.state = [SHARDED] * len(units)
        self.held = Held()
        # the one walk of the hooks: one for the micro-batches that sync, one for those that do not
        # (each call's gradients by a list's __getitem__: no Python call per call)
        grads_at = [u.grads_at for u in units]
        self.walks = {sync: step_events(units, root_posts, grads_at.__getitem__, sync=sync)
                      for sync in {mb.sync for mb in microbatches(grad_accum, sync_every)}}
        self.events = self.walks[True]

    def run(self) -> StepResult:
        for mb in microbatches(self.grad_accum, self.sync_every):
            self.mb, self.collectives, self.events = mb, [], self.walks[mb.sync]
            stop.check()  # tens of ms a phase at 70B: the Inspector's next edit stops the replay here
            self.forward()
            stop.check()
            self.backward()
        return StepResult(self.peak, self.moment, tuple(self.collectives))

    def observe(self, phase: str, k, *, act=(0, None), unsharded_params: int = 0, communication_buffers: int = 0,
                gradients: int = 0, temporaries: int = 0) -> None:
        """A moment where memory can peak: ``act``, the activations (level, module), and the rest of
        ``Alive``'s fields by name (named parameters, not ``**alive``: no dict per moment)."""
        level, module = act
        # Alive.total(), without building one for every moment (a search runs ~5,000 a plan)
        x = level + unsharded_params + communication_buffers + gradients + temporaries
        if x > self.peak:
            self.peak = x
            self.moment = Moment(phase, k, Alive(unsharded_params, communication_buffers, gradients, level, temporaries),
                                 module)
        if level != self.act_level:  # most moments hold the activations of the one before
            self.at_level(level)

    def at_level(self, level: int) -> None:
        """A moment holds ``level`` bytes of activations, unlike the one before (``step.reserved``
        replays their tensors from there: the replay then holds ``act_level``)."""
        if self.tensors is not None:
            self.tensors.at_level(self, level)
        else:
            self.act_level = level

    # -- forward ----------------------------------------------------------------------------------
    def forward(self) -> None:
        # an Enum member costs ~100 ns to look up (Python 3.11): read once a walk, not at every event
        pre_forward, post_forward = Hook.PRE_FORWARD, Hook.POST_FORWARD
        check = stop.check  # at each call: the replay of a step with a thousand calls takes 0.1-0.3 s
        for event in self.events.forward:
            if event.kind == pre_forward:
                check()
                self.pre_forward(event.call, event.gathers + event.prefetches)
            elif event.kind == post_forward:
                self.post_forward(event.call)
            else:
                self.root_post_forward(event.call)
        # the step's largest forward moment may fall outside every call (the loss of a plan
        # without a root call): the activations' own peak with what is held then
        h = self.held
        self.observe("forward", None, act=self.act.during("forward", (0,)), unsharded_params=h.unsharded_params,
                     communication_buffers=h.forward_gathers, gradients=h.gradients)

    def pre_forward(self, k: int, gathers: tuple[Gather, ...]) -> None:
        """``FSDPParamGroup.pre_forward``: unshard() (all-gather), then wait_for_unshard() (copy-out).
        ``gathers``: the hook's all-gathers (``step_events``), its own call's: this model takes no
        explicit forward prefetch, so each call gathers at its own pre-forward."""
        if gathers != ((k, SHARD_GROUP),):  # (Gather(k, Group.SHARD),), without building one: a Gather is its tuple
            raise ValueError(f"the bytes model takes no explicit forward prefetch (call {k}: {gathers})")
        if self.tensors is not None:
            self.tensors.pre_forward(self, k)
        u, h = self.units[k], self.held
        ag = u.gather if self.S > 1 else 0
        act = self.act.enter("forward", u.modules)
        self.observe("forward", k, act=act, unsharded_params=h.unsharded_params,
                     communication_buffers=h.forward_gathers + ag + u.staged, gradients=h.gradients)
        # copy-out; the previous all-gather output of this context is freed after it (wait_for_unshard
        # drops comm_ctx.all_gather_state first, but its local prev_all_gather_state holds it until it returns)
        self.observe("forward", k, act=act, unsharded_params=h.unsharded_params + u.gather,
                     communication_buffers=h.forward_gathers + ag, gradients=h.gradients)
        h.forward_gathers -= h.last_gather_of_context.get(u.root, 0)
        if self.S > 1:
            self.collectives.append(new_collective((u.unit, "all_gather", "forward", "shard", self.S)))
        h.unsharded_params += u.gather
        h.last_gather_of_context[u.root] = ag
        h.forward_gathers += ag
        self.state[k] = UNSHARDED
        # the call's own forward: its activations and temporaries while it is unsharded. The root's
        # stand for the whole forward, whose peak comes after the next call frees this all-gather
        # output: observed at the root's post-forward instead
        own = act if u.modules == (0,) else self.act.during("forward", u.modules)
        self.observe("forward", k, act=own, unsharded_params=h.unsharded_params,
                     communication_buffers=h.forward_gathers, gradients=h.gradients)

    def post_forward(self, k: int) -> None:
        """``FSDPParamGroup.post_forward``: reshard() (to the smaller post-forward mesh for an int)."""
        u, h = self.units[k], self.held
        if u.reshard_after_forward is True:
            h.unsharded_params -= u.gather
            self.state[k] = SHARDED
        elif u.reshard_after_forward is not False:
            shard = u.gather // u.reshard_after_forward
            self.observe("forward", k, act=self.act.leave("forward", u.modules),
                         unsharded_params=h.unsharded_params + shard, communication_buffers=h.forward_gathers,
                         gradients=h.gradients)
            h.unsharded_params += shard - u.gather
            self.state[k] = POST_FORWARD_SHARD
        if self.tensors is not None:
            self.tensors.post_forward(self, k)

    def root_post_forward(self, root: int) -> None:
        """``FSDPState._post_forward`` of a root: frees its context's last all-gather output."""
        h = self.held
        if any(u.unit == root and u.modules == (0,) for u in self.units):  # the whole forward's peak (the loss), its context's last all-gather output still held
            self.observe("forward", None, act=self.act.during("forward", (0,)), unsharded_params=h.unsharded_params,
                         communication_buffers=h.forward_gathers, gradients=h.gradients)
        h.forward_gathers -= h.last_gather_of_context.pop(root, 0)
        if self.tensors is not None:
            self.tensors.root_post_forward(self, root)

    # -- backward ---------------------------------------------------------------------------------
    def observe_backward(self, k, act, params: int = 0, buffers: int = 0) -> None:
        """A backward moment: what is held, with ``params`` more unsharded parameters and ``buffers``
        more communication buffers."""
        h = self.held
        self.observe("backward", k, act=act, unsharded_params=h.unsharded_params + params,
                     communication_buffers=h.prefetched_bytes + h.reduce_scatter_input + buffers,
                     gradients=h.gradients)

    def backward(self) -> None:
        self.observe_backward(None, self.act.during("backward", (0,)))
        pre_backward, gradients, post_backward = Hook.PRE_BACKWARD, Hook.GRADIENTS, Hook.POST_BACKWARD  # as in forward
        check = stop.check  # as in forward
        for event in self.events.backward:
            if event.kind == pre_backward:
                check()
                self.pre_backward(event.call, event.own_gather(), event.prefetch_gathers())
            elif event.kind == gradients:
                part = event.gradients
                self.gradients(event.call, part.unsharded, part.whole, part.module, part.span)
            elif event.kind == post_backward:
                self.post_backward(event.call, event.reduce)
            elif self.mb.first:  # the final callback starts; later micro-batches accumulate into them in place
                self.held.gradients += self.unmanaged_grads
        self.held.end_backward()
        if self.averaging is not None:  # the exported averager's callback runs after FSDP's final callback
            self.observe("backward", None, unsharded_params=self.held.unsharded_params, gradients=self.held.gradients,
                         communication_buffers=self.averaging.bytes, temporaries=self.averaging.temporaries)
        if self.tensors is not None:
            self.tensors.end_backward(self)

    def unshard(self, gather: Gather, act) -> None:
        """``FSDPParamGroup.unshard`` in backward, one all-gather ``step_events`` decided (``act``:
        the activations of the call whose pre-backward issues it); none over a group of one rank."""
        k, h = gather.call, self.held
        u = self.units[k]
        size = self.S if gather.group is SHARD_GROUP else u.reshard_after_forward
        h.prefetch(k, u.gather if size > 1 else 0)
        if size > 1:
            self.observe_backward(k, act, buffers=u.staged)
            self.collectives.append(new_collective((u.unit, "all_gather", "backward", GROUP_NAMES[gather.group], size)))
        if self.tensors is not None:
            self.tensors.unshard(self, gather)

    def pre_backward(self, k: int, own: tuple[Gather, ...], prefetches: tuple[Gather, ...]) -> None:
        """``FSDPState._pre_backward``: unshard (``own``: the call's all-gather, none if unsharded
        or prefetched), copy out, then the ``prefetches`` (``HookEvent.own_gather``,
        ``prefetch_gathers``)."""
        u, h = self.units[k], self.held
        act = self.act.enter("backward", u.modules)
        for gather in own:
            self.unshard(gather, act)
        if k in h.prefetched:
            self.copy_out(k, act)
        for gather in prefetches:  # FSDPParamGroup._backward_prefetch (or the explicit list)
            self.unshard(gather, act)
        # its backward starts (a checkpointed module recomputes its forward first), no gradient yet
        self.observe_backward(k, self.act.during("backward", u.modules))
        if u.grads_at is None:
            self.gradients(k, u.unsharded_grads, u.whole_grads)

    def copy_out(self, k: int, act) -> None:
        """``FSDPParamGroup.wait_for_unshard`` in backward: call ``k``'s all-gather output becomes its
        unsharded parameters (a post-forward shard is freed)."""
        if self.tensors is not None:
            self.tensors.copy_out(self, k, act)
        u, h = self.units[k], self.held
        self.observe_backward(k, act, params=u.gather)
        shard = u.gather // u.reshard_after_forward if self.state[k] is POST_FORWARD_SHARD else 0
        h.copy_out(k)
        h.unsharded_params += u.gather - shard
        self.state[k] = UNSHARDED

    def gradients(self, k: int, unsharded: int, whole: int, module: int | None = None, span=()) -> tuple[int, int]:
        """Autograd computes (part of) a call's gradients while it is unsharded: those of the
        parameters ``module`` owns during that module's backward (``span``: with the modules whose
        backward runs just before it, ``GradientsAt.span``), or all of them at once. Returns the bytes
        it allocates (``new_gradients``)."""
        h, tensors = self.held, self.tensors
        if tensors is not None:
            tensors.before_gradients(self, k, module, span)
        unsharded, whole = self.new_gradients(k, unsharded, whole)
        if module is None:  # the call's backward at once: its peak with all its gradients
            h.add_unsharded_grads(k, unsharded)
            h.gradients += whole
            self.observe_backward(k, self.act.during("backward", self.units[k].modules))
        else:
            # the module's backward runs (its highest level) before its parameters' gradients are
            # accumulated; then they are, at the level its backward leaves
            self.observe_backward(k, self.act.during("backward", span or (module,)))
            h.add_unsharded_grads(k, unsharded)
            h.gradients += whole
            self.observe_backward(k, self.act.after_backward(module))
        if tensors is not None:
            tensors.gradients(self, k, unsharded, whole)
        return unsharded, whole

    def new_gradients(self, k: int, unsharded: int, whole: int) -> tuple[int, int]:
        """The gradient bytes a backward allocates. After the first micro-batch, autograd adds into
        gradients that exist (whole ones, and unsharded ones kept without sync): the new gradient
        is an autograd temporary then, not counted. Kept ones converted to the reduce dtype are no
        longer the parameters' ``.grad``: autograd allocates a fresh one."""
        if self.mb.first:
            return unsharded, whole
        kept = not self.sync_every and not self.units[k].converts_grads
        return (0 if kept else unsharded), 0

    def reshard_after_backward(self, k: int) -> None:
        u, h = self.units[k], self.held
        if self.state[k] is UNSHARDED:
            h.unsharded_params -= u.gather
        elif self.state[k] is POST_FORWARD_SHARD:
            h.unsharded_params -= u.gather // u.reshard_after_forward
        self.state[k] = SHARDED

    def keep_gradients(self, k: int) -> None:
        """``post_backward`` without gradient sync: reshard, keep the unsharded gradients (cast to
        the reduce dtype: ``to_accumulated_grad_if_needed``, or added into those already cast:
        ``accumulate_unsharded_grad_if_needed``)."""
        u, h = self.units[k], self.held
        self.reshard_after_backward(k)
        fresh = h.unsharded_grads_of.pop(k, 0)
        if not u.converts_grads:
            h.accumulated_grads_of[k] = h.accumulated_grads_of.get(k, 0) + fresh
            return
        if k not in h.accumulated_grads_of:  # the cast copy, while the gradients it copies exist
            h.accumulated_grads_of[k] = u.accumulated_grads
            h.gradients += u.accumulated_grads
            self.observe_backward(k, self.act.leave("backward", u.modules))
        h.gradients -= fresh

    def post_backward(self, k: int, reduce: bool) -> None:
        """``FSDPParamGroup.post_backward``: reshard, then (``reduce``, ``step_events``) reduce-scatter
        (and all-reduce on HSDP)."""
        self.reshard_and_reduce(k, reduce)
        if self.tensors is not None:
            self.tensors.post_backward(self, k, reduce)

    def reshard_and_reduce(self, k: int, reduce: bool) -> None:
        """``post_backward``'s bytes: reshard; keep the gradients without sync, else reduce them."""
        u, h = self.units[k], self.held
        if not self.mb.sync:
            self.keep_gradients(k)
            return
        self.reshard_after_backward(k)
        h.reduce_scatter_input = 0  # the previous reduce-scatter input is waited on and dropped first
        fresh = h.unsharded_grads_of.pop(k, 0)
        if u.converts_grads and k in h.accumulated_grads_of:  # added into the kept ones, then freed
            h.gradients -= fresh
            fresh = 0
        ug = fresh + h.accumulated_grads_of.pop(k, 0)
        if not reduce:  # no trainable parameter
            h.gradients -= ug
            return
        act = self.act.leave("backward", u.modules)
        self.observe("backward", k, act=act, unsharded_params=h.unsharded_params,
                     communication_buffers=h.prefetched_bytes + u.rs_input, gradients=h.gradients)
        h.gradients -= ug
        device_grads = 0 if u.offload else u.sharded_grads
        cast_copy = device_grads if u.cast else 0
        self.observe("backward", k, act=act, unsharded_params=h.unsharded_params,
                     communication_buffers=h.prefetched_bytes + u.rs_input + u.rs_output,
                     gradients=h.gradients + cast_copy)
        if self.S > 1:
            self.collectives.append(new_collective((u.unit, "reduce_scatter", "backward", "shard", self.S)))
        if self.R > 1:
            self.collectives.append(new_collective((u.unit, "all_reduce", "backward", "replicate", self.R)))
        if self.mb.first or not self.sync_every:  # else foreach_reduce adds into the sharded gradients
            h.gradients += device_grads
        h.reduce_scatter_input = u.rs_input
