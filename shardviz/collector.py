"""The cyclic garbage collector while shardviz computes (a search, an Inspector edit, its worker).

An analysis allocates many objects, most of which die young, freed by reference counting; what
survives (profiles, plans) lives on for the next analysis to reuse. With CPython's thresholds (a young
collection per 700 new objects, a full one every hundred young ones) the collector walked the
survivors again and again, and its full collections walked every long-lived object: about 1.5 s of
a 70B search, 0.3 s of one tensor-parallel edit, for almost nothing found. ``quiet`` collects the
young generation every 10,000 new objects and makes no full collection while it holds.
"""

from __future__ import annotations

import gc
import threading
from contextlib import contextmanager

#: new objects between young collections while ``quiet`` holds (CPython's default: 700)
YOUNG = 10_000

_HELD = {"depth": 0, "thresholds": (700, 10, 10)}  # how many ``quiet`` run now; the thresholds they replaced
_LOCK = threading.Lock()


@contextmanager
def quiet():
    """Young collections every ``YOUNG`` new objects and no full collection until it ends (none forced
    at its end either: one takes 0.5-1 s in a kernel that has measured many layouts, which nothing can
    stop). Held on two threads at once (the Inspector's edit and its worker), the thresholds the first
    replaced come back when the last ends."""
    with _LOCK:
        if _HELD["depth"] == 0:
            _HELD["thresholds"] = young, middle, _ = gc.get_threshold()
            gc.set_threshold(max(young, YOUNG), middle, 1 << 30)  # CPython: full after that many middle ones
        _HELD["depth"] += 1
    try:
        yield
    finally:
        with _LOCK:
            _HELD["depth"] -= 1
            if _HELD["depth"] == 0:
                gc.set_threshold(*_HELD["thresholds"])
