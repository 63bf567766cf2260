"""FSDP2's step as one ordered stream of hook events: the one walk of the hooks.

``step_events`` walks the hooks ``fully_shard`` registers once, in the order torch runs them, and
returns typed, immutable events: each call's pre-forward and post-forward, each root's
post-forward, each pre-backward (with the call its default backward prefetch targets), the
gradients autograd computes, each post-backward, and the root's final callback with the
post-backwards it runs. Which hooks run and when is ``hook_rules``'; what a hook does is each
consumer's: ``cost.simulation`` folds the stream into bytes (what each hook allocates and frees,
the all-gathers and reduce-scatters it issues), ``schedule`` into seconds (the all-gathers,
copy-outs, compute and reductions on their streams). See docs/step-rules.md.

A call is anything with the fields of ``cost.units.CallHooks`` that the walk reads: ``first``
(registration order), ``pre_forward`` / ``post_forward`` (positions in the module walk; any
ordered values), ``out_grad``, ``in_grad`` and ``root`` (its communication context).
"""

from __future__ import annotations

from enum import IntEnum
from typing import Callable, Hashable, NamedTuple, Sequence

from .hook_rules import backward_prefetch_targets, final_callback_order, post_backward_in_backward


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
    ``GRADIENTS``, the consumer's part (``cost.units.GradientsAt``); ``prefetch``: for
    ``PRE_BACKWARD``, the call its default backward prefetch targets (-1: none)."""

    position: tuple | None
    kind: Hook
    call: Hashable | None
    gradients: object = None
    prefetch: int = -1

    def backward_order(self):
        """Sort key, descending: backward walks the forward positions in reverse."""
        return self.position, -self.kind


class StepEvents(NamedTuple):
    """The step's hooks: ``forward`` in the order they run, ``backward`` likewise, its final
    callback included (the same every micro-batch: the walk is built once per plan)."""

    forward: tuple[HookEvent, ...]
    backward: tuple[HookEvent, ...]


def forward_events(calls: Sequence, root_posts=()) -> list[HookEvent]:
    """Pre-forward where each call's first module starts, post-forward where its last one returns
    (``FSDPState._pre_forward`` / ``_post_forward``); ``root_posts``: (position, root) of each
    root's own post-forward."""
    events = [HookEvent(c.pre_forward, Hook.PRE_FORWARD, k) for k, c in enumerate(calls)]
    events += [HookEvent(c.post_forward, Hook.POST_FORWARD, k) for k, c in enumerate(calls)]
    events += [HookEvent(p, Hook.ROOT_POST_FORWARD, root) for p, root in root_posts]
    return sorted(events)


def backward_events(calls: Sequence, gradients_of: Callable | None = None) -> list[HookEvent]:
    """Reverse module order: a call's pre-backward where its forward ended (only with a
    pre-backward hook: ``out_grad``), its gradients where their modules ran (``gradients_of(k)``:
    the call's parts, each with a ``position``; none: computed at once by the consumer), its
    post-backward where its forward began (when it runs in backward); a nested call's backward
    runs inside its parent's. Then the root's final callback and the post-backwards it runs."""
    post_forward_order = sorted(range(len(calls)), key=lambda k: calls[k].post_forward)
    before = backward_prefetch_targets(post_forward_order, lambda k: calls[k].root)
    events = []
    for k, c in enumerate(calls):
        if not c.out_grad:
            continue  # no pre-backward hook: nothing after it needed a gradient
        events.append(HookEvent(c.post_forward, Hook.PRE_BACKWARD, k, prefetch=before.get(k, -1)))
        for part in (gradients_of(k) if gradients_of is not None else None) or ():
            events.append(HookEvent(part.position, Hook.GRADIENTS, k, part))
        if post_backward_in_backward(c.out_grad, c.in_grad):
            events.append(HookEvent(c.pre_forward, Hook.POST_BACKWARD, k))
    events.sort(key=HookEvent.backward_order, reverse=True)
    events.append(HookEvent(None, Hook.FINAL_CALLBACK, None))
    registration = sorted(range(len(calls)), key=lambda k: calls[k].first)
    done = [post_backward_in_backward(c.out_grad, c.in_grad) for c in calls]
    events += [HookEvent(None, Hook.POST_BACKWARD, k) for k in final_callback_order(registration, done.__getitem__)]
    return events


def step_events(calls: Sequence, root_posts=(), gradients_of: Callable | None = None) -> StepEvents:
    """The step's one walk of the hooks (see the module docstring)."""
    return StepEvents(tuple(forward_events(calls, root_posts)), tuple(backward_events(calls, gradients_of)))
