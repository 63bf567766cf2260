"""FSDP2's hook rules, one function each: which call is a root, which hooks a call gets, which call
a hook prefetches, which post-backwards the root's final callback runs.

``step_events``, the one walk of the hooks that both models of the step fold (``step.simulation``
in bytes, ``schedule`` in seconds), calls them; so do ``step.calls`` and ``step.timing``, which build
their inputs. Each cites the torch 2.13 code it
mirrors (``torch/distributed/fsdp/_fully_shard``); the table is in ``docs/step-rules.md``.
Positions are whatever orders the hooks of one pass (``step.calls.Position`` in the module walk).
"""

from __future__ import annotations

from typing import Hashable, Iterable, Sequence


def roots(layout) -> list[int]:
    """The root call above each call of ``layout`` (itself for a root), by plan unit index.

    ``FSDPState._lazy_init``: the first state to run forward is a root and shares one
    ``FSDPCommContext`` with every state below it; a call under no other call is a root
    (``fsdp.Layout`` sets ``is_root``), and a plan without a call on the whole model has several."""
    outer = layout.outer_call  # per call, the call around its first module
    root_of = [-1] * len(layout.units)
    for ul in layout.units:
        chain, u = [], ul.index
        while root_of[u] < 0:
            chain.append(u)
            up = outer[u]
            if up < 0 or up == u:
                root_of[u] = u
                break
            u = up
        for c in chain:
            root_of[c] = root_of[u]
    return root_of


def enclosing_root(layout) -> int | None:
    """The one root call every call sits under (one communication context), on one module; None
    when the plan has several roots. Its forward runs first and ends last: the schedule runs its own
    compute (norm, LM head) after every other call's."""
    root_of = roots(layout)
    if not root_of or len(set(root_of)) != 1:
        return None
    root = root_of[0]
    return root if len(layout.units[root].modules) == 1 else None


def output_needs_grad(trainable_from, post_forward) -> bool:
    """The call gets a pre-backward hook: its output needs a gradient, which it does when a
    trainable parameter ran before the call ended (``FSDPState._post_forward`` ->
    ``_register_pre_backward_hook`` hooks only outputs that require grad). Without it the call
    computes nothing in backward and its post-backward waits for the final callback.
    The order modules run stands in for data flow."""
    return trainable_from < post_forward


def input_needs_grad(trainable_from, pre_forward) -> bool:
    """The call's post-backward runs in backward: its input needs a gradient, which it does when a
    trainable parameter ran before the call started (``FSDPParamGroup._register_post_backward_hook``
    hooks only inputs that require grad; else ``_root_post_backward_final_callback`` runs it)."""
    return trainable_from < pre_forward


def backward_prefetch_targets(post_forward_order: Sequence[Hashable], context_of=None) -> dict:
    """The call each call's pre-backward prefetches by default (none: absent): the one before it in
    its context's post-forward order (``FSDPParamGroup._backward_prefetch``:
    ``comm_ctx.post_forward_order[curr_index - 1]``, with ``_record_post_forward`` appending each
    call as its forward ends). ``context_of``: call -> its root context (None: one context). An
    explicit ``set_modules_to_backward_prefetch`` list replaces it (``FSDPState._pre_backward``)."""
    before, last_in_context = {}, {}
    for call in post_forward_order:
        context = context_of(call) if context_of is not None else None
        if context in last_in_context:
            before[call] = last_in_context[context]
        last_in_context[context] = call
    return before


def post_backward_in_backward(out_grad: bool, in_grad: bool) -> bool:
    """Autograd runs the call's post-backward during backward: only with both hooks registered
    (``output_needs_grad`` and ``input_needs_grad``)."""
    return out_grad and in_grad


def final_callback_order(registration_order: Iterable, done) -> list:
    """The calls whose post-backward the root's final callback runs, in the order it runs them:
    those backward did not reach (``done(call)`` False), in registration order
    (``FSDPState._root_post_backward_final_callback`` walks ``_state_ctx.all_states``, which
    ``_lazy_init`` fills from the root's ``named_modules()``)."""
    return [call for call in registration_order if not done(call)]
