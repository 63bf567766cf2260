"""FSDP2's step as one ordered stream of hook events: the one walk of the hooks, with the
all-gathers each hook issues.

``step_events`` walks the hooks ``fully_shard`` registers once, in the order torch runs them, and
returns typed, immutable events: each call's pre-forward and post-forward, each root's
post-forward, each pre-backward (with the call its default backward prefetch targets), the
gradients autograd computes, each post-backward, and the root's final callback with the
post-backwards it runs. Each pre-forward and pre-backward carries the all-gathers it issues
(``Gather``): its own call's unless already unsharded or prefetched, then its prefetch targets',
decided once here by each call's parameter state (``ParamState``). Which hooks run and when is
``step.calls``' hook rules'; what a hook costs is each consumer's: ``simulation`` folds the stream into
bytes (what each hook allocates and frees), ``schedule`` into seconds (the all-gathers,
copy-outs, compute and reductions on their streams). See docs/step-rules.md.

A call is one ``calls.Call``: the one record both models walk (the bytes model's from the
layout, ``calls.build_calls``; the seconds model's the same records with their seconds, or rows
made by hand, ``schedule.timed``, laid out under the schedule's assumptions).
"""

from __future__ import annotations

from enum import Enum, IntEnum
from operator import itemgetter
from typing import Callable, Hashable, NamedTuple, Sequence

from .calls import Call, ParamState, backward_prefetch_targets, final_callback_order, post_backward_in_backward


class Group(Enum):
    """The process group an all-gather runs over."""

    SHARD = "shard"  # the shard group (the reduce-scatters' communicator)
    POST_FORWARD = "post_forward"  # the smaller group of an int reshard_after_forward's shard


class Gather(NamedTuple):
    """One all-gather a hook issues: ``FSDPParamGroup.unshard`` of ``call`` over ``group``."""

    call: int
    group: Group


class Hook(IntEnum):
    """The hooks of a step. Forward hooks at one position run in this order (a call's post-forward,
    then a root's, then the next call's pre-forward); backward hooks at one position in this order."""

    POST_FORWARD = 0  # FSDPParamGroup.post_forward: reshard after forward
    ROOT_POST_FORWARD = 1  # FSDPState._post_forward of a root: frees its context's last all-gather output
    PRE_FORWARD = 2  # FSDPParamGroup.pre_forward: unshard, wait_for_unshard
    PRE_BACKWARD = 3  # FSDPState._pre_backward: unshard, wait, the default backward prefetch
    GRADIENTS = 4  # autograd computes (part of) the call's gradients
    POST_BACKWARD = 5  # FSDPParamGroup.post_backward: reshard, reduce-scatter (all-reduce on HSDP)
    FINAL_CALLBACK = 6  # FSDPState._root_post_backward_final_callback starts (its post-backwards follow)


class HookEvent(NamedTuple):
    """One hook of the step. ``call``: the consumer's index of the call (for ``ROOT_POST_FORWARD``
    the root's ``root`` value, its context; None for ``FINAL_CALLBACK``); ``gradients``: for
    ``GRADIENTS``, the consumer's part (``calls.GradientsAt``); ``prefetch``: for
    ``PRE_BACKWARD``, the call its default backward prefetch targets (-1: none). For ``PRE_FORWARD``
    and ``PRE_BACKWARD``, the all-gathers the hook issues, in issue order: ``gathers`` inside the
    group's hook (its own call's, then the default backward prefetch), ``prefetches`` after it
    returns (an explicit prefetch list's, ``FSDPState._pre_forward`` / ``_pre_backward``).
    ``reduce``: for ``POST_BACKWARD``, whether it reduces the call's gradients."""

    position: tuple | None
    kind: Hook
    call: Hashable | None
    gradients: object = None
    prefetch: int = -1
    gathers: tuple[Gather, ...] = ()
    prefetches: tuple[Gather, ...] = ()
    reduce: bool = False  # POST_BACKWARD: it reduce-scatters (all-reduces on HSDP) the call's gradients

    def own_gather(self) -> tuple[Gather, ...]:
        """Of ``gathers``, the call's own all-gather (none when unsharded or already prefetched):
        ``ParamStates.pre_hook`` puts it first."""
        return self.gathers[:1] if self.gathers and self.gathers[0].call == self.call else ()

    def prefetch_gathers(self) -> tuple[Gather, ...]:
        """The hook's prefetches: the default one (inside the group's hook), then an explicit list's."""
        return self.gathers[len(self.own_gather()):] + self.prefetches


# events and all-gathers built positionally by ``_make``: a NamedTuple's own constructor is a Python-level
# ``__new__``, three times slower (~800 events and ~160 all-gathers a plan)
new_event, new_gather = HookEvent._make, Gather._make

# the members read at every hook (here and by the models), as module constants: looking up an Enum member costs
# ~80 ns in Python 3.11, as much as the rest of an unshard
SHARDED, UNSHARDED, POST_FORWARD_SHARD = ParamState.SHARDED, ParamState.UNSHARDED, ParamState.POST_FORWARD_SHARD
SHARD_GROUP, POST_FORWARD_GROUP = Group.SHARD, Group.POST_FORWARD
GROUP_NAMES = {group: group.value for group in Group}  # an Enum's .value is a Python-level property: ~400 ns a read


class StepEvents(NamedTuple):
    """A micro-batch's hooks: ``forward`` in the order they run, ``backward`` likewise, its final
    callback included (the same for every micro-batch that syncs, or that does not)."""

    forward: tuple[HookEvent, ...]
    backward: tuple[HookEvent, ...]


def forward_events(calls: Sequence[Call], root_posts=()) -> list[tuple]:
    """Pre-forward where each call's first module starts, post-forward where its last one returns
    (``FSDPState._pre_forward`` / ``_post_forward``); ``root_posts``: (position, root) of each
    root's own post-forward. Each hook is a tuple of ``HookEvent``'s fields but the all-gathers,
    (position, kind, call, gradients, prefetch, reduce), which ``with_gathers`` decides: a tuple
    rather than an event, so that each event is built once (a record costs a Python call)."""
    hooks = [(c.pre_forward, Hook.PRE_FORWARD, k, None, -1, False) for k, c in enumerate(calls)]
    hooks += [(c.post_forward, Hook.POST_FORWARD, k, None, -1, False) for k, c in enumerate(calls)]
    hooks += [(p, Hook.ROOT_POST_FORWARD, root, None, -1, False) for p, root in root_posts]
    return sorted(hooks)


def backward_events(calls: Sequence[Call], gradients_of: Callable | None = None,
                    sync: bool = True) -> list[tuple]:
    """Reverse module order: a call's pre-backward where its forward ended (only with a
    pre-backward hook: ``out_grad``), its gradients where their modules ran (``gradients_of(k)``:
    the call's parts, each with a ``position``; none: computed at once by the consumer), its
    post-backward where its forward began (when it runs in backward); a nested call's backward
    runs inside its parent's. Then the root's final callback and the post-backwards it runs.
    A post-backward reduces its call's gradients only when the micro-batch syncs (``sync``,
    ``set_requires_gradient_sync``) and the call has some (``FSDPParamGroup.post_backward``).
    Each hook a tuple, as in ``forward_events``."""
    # per-call fields as lists: their __getitem__ is a key without a Python call per call
    post_forward, root, first = [c.post_forward for c in calls], [c.root for c in calls], [c.first for c in calls]
    before = backward_prefetch_targets(sorted(range(len(calls)), key=post_forward.__getitem__), root.__getitem__)
    pre_backward, gradients, post_backward = Hook.PRE_BACKWARD, Hook.GRADIENTS, Hook.POST_BACKWARD  # as in with_gathers
    hooks, done = [], []
    for k, c in enumerate(calls):
        done.append(post_backward_in_backward(c.out_grad, c.in_grad))
        if not c.out_grad:
            continue  # no pre-backward hook: nothing after it needed a gradient
        hooks.append((c.post_forward, pre_backward, k, None, before.get(k, -1), False))
        for part in (gradients_of(k) if gradients_of is not None else None) or ():
            hooks.append((part.position, gradients, k, part, -1, False))
        if done[k]:
            hooks.append((c.pre_forward, post_backward, k, None, -1, sync and c.reduces))
    # backward walks the forward positions in reverse, and at one position the hooks in Hook order: sorted by
    # kind, then (stably) by position, descending (two sorts on C keys, no Python call per hook)
    hooks.sort(key=itemgetter(1))
    hooks.sort(key=itemgetter(0), reverse=True)
    hooks.append((None, Hook.FINAL_CALLBACK, None, None, -1, False))
    registration = sorted(range(len(calls)), key=first.__getitem__)
    hooks += [(None, post_backward, k, None, -1, sync and calls[k].reduces)
              for k in final_callback_order(registration, done.__getitem__)]
    return hooks


class ParamStates:
    """Each call's ``ParamState`` through one micro-batch (every call starts it sharded: each
    post-backward reshards), and the all-gathers issued and not yet copied out."""

    def __init__(self, calls: Sequence[Call]):
        self.state = [ParamState.SHARDED] * len(calls)
        self.issued: set[int] = set()

    def unshard(self, k: int) -> tuple[Gather, ...]:
        """``FSDPParamGroup.unshard``: a no-op when the call is unsharded (``reshard_after_forward=False``
        keeps it so after forward) or its all-gather is already issued (prefetched); a post-forward
        shard gathers over its own, smaller group."""
        state = self.state[k]
        if state is UNSHARDED or k in self.issued:
            return ()
        self.issued.add(k)
        return (new_gather((k, SHARD_GROUP if state is SHARDED else POST_FORWARD_GROUP)),)

    def unshard_all(self, calls) -> tuple[Gather, ...]:
        out = ()
        for k in calls:  # a loop, not a generator: it runs in every pre-forward and pre-backward
            out += self.unshard(k)
        return out

    def pre_hook(self, k: int, default=(), explicit=None) -> tuple[tuple[Gather, ...], tuple[Gather, ...]]:
        """A pre-forward or pre-backward's all-gathers: inside the group's hook the call's own
        unshard, its copy-out and the ``default`` prefetch; after it, the ``explicit`` list's
        (which replaces the default one, ``FSDPState._pre_backward``)."""
        gathers = self.unshard(k)
        # the copy-out (FSDPParamGroup.wait_for_unshard): the all-gather output becomes the unsharded parameters
        self.issued.discard(k)
        self.state[k] = UNSHARDED
        if explicit is None:
            return (gathers + self.unshard_all(default) if default else gathers), ()
        return gathers, (self.unshard_all(explicit) if explicit else ())


def with_gathers(forward: list[tuple], backward: list[tuple], calls: Sequence[Call],
                 forward_prefetch: dict | None = None, backward_prefetch: dict | None = None) -> StepEvents:
    """Each hook as a ``HookEvent``, each pre-forward and pre-backward with the all-gathers it
    issues (each event built once). ``forward_prefetch`` / ``backward_prefetch``: call -> the calls
    an explicit ``set_modules_to_forward_prefetch`` / ``set_modules_to_backward_prefetch`` list
    names; a backward list replaces the default prefetch (``FSDPState._pre_backward``), a forward
    list adds to the implicit one."""
    forward_prefetch, backward_prefetch = forward_prefetch or {}, backward_prefetch or {}
    params = ParamStates(calls)
    # the kinds as locals: looking up an enum member costs as much as the rest of an event's work
    pre_forward, post_forward, pre_backward, post_backward = (Hook.PRE_FORWARD, Hook.POST_FORWARD,
                                                              Hook.PRE_BACKWARD, Hook.POST_BACKWARD)
    out_forward = []
    for position, kind, call, _, _, _ in forward:
        gathers = prefetches = ()
        if kind is pre_forward:
            gathers, prefetches = params.pre_hook(call, (), forward_prefetch.get(call, ()))
        elif kind is post_forward:
            params.state[call] = calls[call].after_forward
        out_forward.append(new_event((position, kind, call, None, -1, gathers, prefetches, False)))
    out_backward = []
    for position, kind, call, part, prefetch, reduce in backward:
        gathers = prefetches = ()
        if kind is pre_backward:
            default = (prefetch,) if prefetch >= 0 else ()
            gathers, prefetches = params.pre_hook(call, default, backward_prefetch.get(call))
        elif kind is post_backward:
            params.state[call] = SHARDED
        out_backward.append(new_event((position, kind, call, part, prefetch, gathers, prefetches, reduce)))
    return StepEvents(tuple(out_forward), tuple(out_backward))


def step_events(calls: Sequence[Call], root_posts=(), gradients_of: Callable | None = None,
                forward_prefetch: dict | None = None, backward_prefetch: dict | None = None,
                sync: bool = True) -> StepEvents:
    """One micro-batch's walk of the hooks, with the all-gathers each issues and the reductions
    (``sync``: the micro-batch reduces; see the module docstring)."""
    return with_gathers(forward_events(calls, root_posts), backward_events(calls, gradients_of, sync), calls,
                        forward_prefetch, backward_prefetch)
