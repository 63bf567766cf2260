"""The key/value cache of a step that keeps it (``use_cache=True``), in the reduced copy.

Hugging Face's cache is one object every block writes into (``Cache.update(keys, values,
layer_idx)``), alive until the forward's output is dropped, or longer: a checkpointed block takes it
as an input, so it lives until the last checkpointed block's backward (whose recomputation appends to
it again). Two things keep the reduced copy's block runs per block:

- every representative writes into a cache layer of its own (the copies of a block share its
  ``layer_idx``): ``Cache.update`` is routed to a fresh layer of the same type per (representative,
  layer), so a run's level changes are its own block's;
- the cache's death frees, at one moment, what every block left in it (and what the checkpointed
  blocks' saved inputs held with it, as GPT-2's): the bytes freed then, in that interval between two
  events, are recorded per representative that allocated them (``KVRelease``; the running block's
  own storages other than its cache stay in its run), and ``splice`` frees every position's share at
  that moment of the full model's timeline instead of the copy's.

Nothing here changes what a step computes: a run without a cache never calls ``Cache.update``.
"""

from __future__ import annotations

import copy
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass(frozen=True)
class KVRelease:
    """The cache's death in the copy's timeline: the event whose interval saw it, and the bytes it
    freed per representative ((list index, rep index); None: a cache layer written outside the blocks)."""

    event: int
    freed: dict = field(default_factory=dict)

    def in_copy(self) -> int:
        return sum(self.freed.values())

    def in_model(self, lists) -> int:
        """What the same death frees in the full model: every position's representative's share."""
        total = self.freed.get(None, 0)
        for li, lp in enumerate(lists):
            total += sum(self.freed.get((li, r), 0) for r in lp.pos_rep)
        return total


_NOT_CACHED = object()


def _empty_dynamic(layer) -> bool:
    """A layer that grows by concatenation (``update`` replaces its tensors) and holds nothing yet."""
    from transformers.cache_utils import DynamicLayer

    return isinstance(layer, DynamicLayer) and not getattr(layer, "is_initialized", False)


class CacheTracker:
    """Routes every representative's cache writes to a layer of its own and watches the cache die.
    ``block()`` answers the representative running now ((list, rep) or None); the recorder calls
    ``freed`` for every storage it sees freed and ``event`` at every event."""

    def __init__(self, block):
        self.block = block
        self._slots: dict[tuple, int] = {}  # (id(cache), rep, layer_idx) -> the layer written
        self._seen: set[int] = set()  # id(cache) of the caches written
        self._owner: dict[int, object] = {}  # id(storage's winfo) -> rep, for the storages caches hold
        self._made_by: dict[int, object] = {}  # id(storage's winfo) -> the rep running when it was allocated
        self._refs: list = []  # weak references to the caches (their callbacks mark the death)
        self._dying = False
        self.release: KVRelease | None = None
        self._freed: dict = {}

    def _slot(self, cache, layer_idx: int) -> int:
        """The layer the running copy writes for ``layer_idx``: a fresh one of the same type (a
        shallow copy of the model's own layer, which no copy writes: still empty), or the model's own
        outside the blocks, or where that layer is not an empty key/value one (states written by
        other methods, a static cache)."""
        rep = self.block()
        key = (id(cache), rep, layer_idx)
        if rep is None or key in self._slots:
            return self._slots.get(key, layer_idx)
        if cache.layer_class_to_replicate is not None:
            fresh = cache.layer_class_to_replicate()
        elif layer_idx < len(cache.layers) and _empty_dynamic(cache.layers[layer_idx]):
            fresh = copy.copy(cache.layers[layer_idx])
        else:
            self._slots[key] = layer_idx
            return layer_idx
        cache.layers.append(fresh)
        self._slots[key] = len(cache.layers) - 1
        return self._slots[key]

    def _first_sight(self, cache) -> None:
        if id(cache) not in self._seen:
            self._seen.add(id(cache))
            self._refs.append(weakref.ref(cache, self._died))

    def _died(self, _ref) -> None:
        self._dying = True

    def wrote(self, cache, slot: int, winfo_of) -> None:
        """After a write: the storages the written layer holds now belong to the running block."""
        layer = cache.layers[slot]
        rep = self.block()
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            for winfo in winfo_of(t):
                self._owner[id(winfo)] = rep

    def allocated(self, winfo) -> None:
        rep = self.block()
        if rep is not None:
            self._made_by.setdefault(id(winfo), rep)

    def freed(self, winfo) -> None:
        """A storage freed: counted for the interval if the cache held it, or another block made it."""
        cached = self._owner.pop(id(winfo), _NOT_CACHED)
        made_by = self._made_by.pop(id(winfo), None)
        rep = cached if cached is not _NOT_CACHED else made_by
        if cached is _NOT_CACHED and (made_by is None or made_by == self.block()):
            return
        self._freed[rep] = self._freed.get(rep, 0) + winfo.mem_consumed

    def event(self, index: int) -> None:
        """An event at ``index``: a death since the previous event is in its interval."""
        if self._dying and self._freed and self.release is None:
            self.release = KVRelease(index, dict(self._freed))
        self._dying = False
        self._freed = {}

    @contextmanager
    def routing(self, winfo_of):
        """``Cache.update`` routed per representative while the step runs (no-op without transformers)."""
        try:
            from transformers.cache_utils import Cache
        except ImportError:
            yield
            return
        original = Cache.update
        tracker = self

        def update(cache, key_states, value_states, layer_idx, *args, **kwargs):
            tracker._first_sight(cache)
            slot = tracker._slot(cache, layer_idx)
            out = original(cache, key_states, value_states, slot, *args, **kwargs)
            tracker.wrote(cache, slot, winfo_of)
            return out

        Cache.update = update
        try:
            yield
        finally:
            Cache.update = original
