"""The order in which forward enters the modules, which places every hook of the step.

FSDP's hooks fire as modules run, and autograd computes a parameter's gradient where its module
ran, backward in reverse. Registration order is not always execution order: a Llama or Mixtral
decoder layer registers ``self_attn, mlp, input_layernorm, post_attention_layernorm`` and runs
``input_layernorm, self_attn, post_attention_layernorm, mlp``. A ``Walk`` is the module tree in
preorder with each module's children sorted by when they (or, for a container such as a
``ModuleList``, their first descendant) first ran; modules that never ran keep their registration
order, after those that ran: subtrees stay contiguous, so entering and
leaving a module are still two points of one walk.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from functools import cached_property

import numpy as np


@dataclass(frozen=True, eq=False)
class Walk:
    """Per tree module (indexed by its preorder index): where forward enters it, and where its
    subtree ends, in the order modules run. Compared and hashed by identity: one per tree and order
    (``execution_walk``), a key of what depends on it (``units.call_places``)."""

    enter: tuple[int, ...]
    end: tuple[int, ...]  # one past the last descendant
    depth: tuple[int, ...]

    @cached_property
    def enter_array(self) -> np.ndarray:
        return np.asarray(self.enter, dtype=np.int64)

    @cached_property
    def by_position(self) -> tuple[int, ...]:
        """The module forward enters at each position of the walk."""
        out = [0] * len(self.enter)
        for m, position in enumerate(self.enter):
            out[position] = m
        return tuple(out)


def registration_walk(tree) -> Walk:
    """The walk in registration order (``named_modules``): the tree's own preorder."""
    modules = tree.modules
    return Walk(tuple(m.index for m in modules), tuple(m.subtree_end for m in modules), tuple(m.depth for m in modules))


# tree -> {run_order: Walk}: every plan of one model shares its walk (a search analyses dozens)
_WALKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# tree -> (run_order, Walk) last asked for: hashing an order of thousands of names costs more than the
# rest of an analysis' walk, and every plan analysed with one profile passes the same order object
_LAST_WALK: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def execution_walk(tree, run_order) -> Walk:
    """The walk with children sorted by ``run_order`` (module names in the order they first ran,
    as a measured step saw them); None: registration order. Computed once per tree and order."""
    last = _LAST_WALK.get(tree)
    if last is not None and last[0] is run_order:  # held here, so the identity is that order's
        return last[1]
    walks = _WALKS.setdefault(tree, {})
    if run_order not in walks:
        walks[run_order] = registration_walk(tree) if run_order is None else _sorted_walk(tree, run_order)
    _LAST_WALK[tree] = (run_order, walks[run_order])
    return walks[run_order]


def _sorted_walk(tree, run_order) -> Walk:
    modules = tree.modules
    never = len(run_order) + len(modules)
    first_run = [never] * len(modules)
    for rank, fqn in enumerate(run_order):
        m = tree.module_index.get(fqn)
        if m is not None:
            first_run[m] = min(first_run[m], rank)
    for m in reversed(range(1, len(modules))):  # a container that never runs itself (a ModuleList) runs with its first child
        parent = modules[m].parent
        first_run[parent] = min(first_run[parent], first_run[m])
    enter, end = [0] * len(modules), [0] * len(modules)
    position, stack = 0, [(0, False)]
    while stack:
        m, done = stack.pop()
        if done:
            end[m] = position
            continue
        enter[m] = position
        position += 1
        stack.append((m, True))
        children = sorted(modules[m].children, key=lambda c: (first_run[c], c))
        stack.extend((c, False) for c in reversed(children))
    return Walk(tuple(enter), tuple(end), tuple(m.depth for m in modules))
