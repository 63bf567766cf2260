"""Activation bytes around each call of the step, read from a measured ``ActivationProfile``.

``Analysis`` builds them (``activations`` measures the profile) and passes them to the cost
model; without ``Training.batch_size`` every level is 0 (``NoActivations``).
"""

from __future__ import annotations

import weakref


class NoActivations:
    """Activations not counted (``Training.batch_size`` is None): every level is 0."""

    tree = None  # no measured step, so no module's level to read (``ActivationLevels.tree``)

    def after_backward(self, module):
        return 0, None

    def enter(self, phase, modules):
        return 0, None

    def during(self, phase, modules):
        return 0, None

    def leave(self, phase, modules):
        return 0, None


class ActivationLevels:
    """Activation bytes around each call of the step, read from a measured ``ActivationProfile``.

    A call's pre-forward runs when its first module starts, its post-forward when its last module
    returns; its pre-backward when the last module's backward starts, its post-backward when the
    first module's ends. ``during``: the highest level while any of its modules runs (the
    root, module 0, stands for the whole forward or backward: the loss included).
    Returns ``(bytes, module)``: the level and the module it was read at. Each reading is worked
    out once and kept: the profile never changes, and every plan of one step reads the same ones
    (``activation_levels``).
    """

    def __init__(self, profile, tree):
        self.profile, self.tree = profile, tree
        self.end = profile.timeline[-1][3] if profile.timeline else 0  # what is left after backward
        self._kept: dict[tuple, tuple] = {}  # (reading, phase or module, modules) -> (bytes, module)

    def _once(self, key: tuple, read):
        value = self._kept.get(key)
        if value is None:
            value = self._kept[key] = read(*key[1:])
        return value

    def enter(self, phase, modules):
        return self._once(("enter", phase, modules), self._enter)

    def leave(self, phase, modules):
        return self._once(("leave", phase, modules), self._leave)

    def after_backward(self, module: int):
        return self._once(("after_backward", module), self._after_backward)

    def during(self, phase, modules):
        return self._once(("during", phase, modules), self._during)

    def _stats(self, m: int):
        return self.profile.modules.get(self.tree.modules[m].fqn)

    def _read(self, m: int, field: str):
        stats = self._stats(m)
        value = getattr(stats, field) if stats is not None else None
        return value, self.tree.modules[m].fqn

    def _enter(self, phase, modules):
        m = min(modules) if phase == "forward" else self._last(modules)
        value, fqn = self._read(m, "pre_fw" if phase == "forward" else "pre_bw")
        return (value or 0), fqn

    def _leave(self, phase, modules):
        m = self._last(modules) if phase == "forward" else min(modules)
        value, fqn = self._read(m, "post_fw" if phase == "forward" else "post_bw")
        return (self.end if value is None and phase == "backward" else value or 0), fqn

    def _after_backward(self, module: int):
        """The level when ``module``'s backward is done (when its backward does not end on its own
        inputs, the level when it started)."""
        stats = self._stats(module)
        if stats is None:
            return 0, None
        value = stats.post_bw if stats.post_bw is not None else stats.pre_bw
        return (value or 0), self.tree.modules[module].fqn

    def _during(self, phase, modules):
        field = "peak_fw" if phase == "forward" else "peak_bw"
        if modules == (0,):  # the whole step: where the measured peak of this phase is
            bytes_, peak_phase, fqn = self.profile.peak
            if peak_phase == phase:
                return bytes_, fqn
        best = (0, None)
        for m in modules:
            value, fqn = self._read(m, field)
            if value is not None and value > best[0]:
                best = (value, fqn)
        return best

    def _last(self, modules):
        tree = self.tree
        return max(modules, key=lambda m: (tree.modules[m].subtree_end, -tree.modules[m].depth))


# tree -> (the latest profile read on it, its ActivationLevels): kept while the tree lives
_LEVELS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def activation_levels(profile, tree) -> ActivationLevels:
    """The ``ActivationLevels`` of ``profile`` on ``tree``, one per tree for its latest profile: the
    plans of one step share its readings (a change of plan with activations reads ~6,000)."""
    kept = _LEVELS.get(tree)
    if kept is None or kept[0] is not profile:
        kept = _LEVELS[tree] = (profile, ActivationLevels(profile, tree))
    return kept[1]
