"""The one cache of measured steps: per model (weakly), the tree its profiles were made with, the
profiles by request, the measurements of a copy by what the copy ran.

A forked copy of the process (``shardviz.forked``: the Inspector prices its findings there) measures
into its own copy of this cache; ``mark`` / ``kept_since`` / ``adopt`` bring what it kept back, so
that the parent never measures the same step again. While the two measure at once (the search on
two cores), ``shared_between`` / ``measure_once`` give each step to one of them, the other reads it.

Within one process, threads measure one step at a time (``one_step``): a step patches module-level
functions while it runs (``patches``, ``kvcache``), which two steps at once would share. A thread
that needs the step another is measuring waits for it rather than measuring it again; one that
needs another step stops a measurement made ahead of need (``ahead``: the Inspector's look-ahead),
else waits for it. A fork waits for the step in progress (``forked.FORK_GUARDS``): the copy would
inherit its patches half applied.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from torch import nn

from .. import forked
from ..model.tree import ModelTree, as_tree
from . import stop
from .kvcache import KVRelease
from .profile import ModuleEvent


@dataclass(frozen=True)
class Measurement:
    """What one run of a (reduced) copy recorded."""

    events: list[ModuleEvent]
    attention: tuple[str, ...]
    kv_release: KVRelease | None = None  # the key/value cache's death, when the step keeps one


@dataclass
class ModelEntry:
    tree: ModelTree
    profiles: dict = field(default_factory=dict)  # measure._Request -> ActivationProfile
    measurements: dict = field(default_factory=dict)  # measurement key -> Measurement
    orders: dict = field(default_factory=dict)  # measure._Request -> run order read from a forward


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> ModelEntry
_LOCK = threading.Lock()
_MAX_ENTRIES = 64


def clear_cache() -> None:
    with _LOCK:
        _CACHE.clear()


def _changed_in_place(model: nn.Module, tree: ModelTree) -> bool:
    """Adapters injected, cast, frozen since ``tree`` was walked."""
    return (tree.n_modules != sum(1 for _ in model.modules())
            or [(p.dtype, p.requires_grad) for p in tree.params]
            != [(p.dtype, p.requires_grad) for p in model.parameters()])


def _same_model(a: ModelTree, b: ModelTree) -> bool:
    """Two walks of one model that saw it in the same state (its profiles hold for both)."""
    return a.n_modules == b.n_modules and [(p.fqn, p.shape, p.dtype, p.requires_grad) for p in a.params] \
        == [(p.fqn, p.shape, p.dtype, p.requires_grad) for p in b.params]


def entry_of(model: nn.Module, tree: ModelTree | None) -> ModelEntry:
    """The model's cache entry, for ``tree`` (the caller's) or a walk that still matches the model.
    A tree of another state of the model drops the profiles; measurements stay (their keys say
    what the copy ran)."""
    with _LOCK:
        entry = _CACHE.get(model)
    if entry is None:
        entry = ModelEntry(tree if tree is not None else as_tree(model))
    elif tree is not None and tree is not entry.tree and not _same_model(tree, entry.tree):
        entry = ModelEntry(tree, measurements=entry.measurements)
    elif tree is None and _changed_in_place(model, entry.tree):
        entry = ModelEntry(as_tree(model), measurements=entry.measurements)
    with _LOCK:
        _CACHE[model] = entry
    return entry


def remember(table: dict, key, value) -> None:
    """Keep ``value``; past ``_MAX_ENTRIES``, the least recently used entry goes (not all of them: the
    plans an Inspector session goes back to, by undo, stay measured however long it runs)."""
    with _LOCK:
        table.pop(key, None)
        while len(table) >= _MAX_ENTRIES:
            del table[next(iter(table))]
        table[key] = value


def recall(table: dict, key):
    """The entry kept under ``key`` (None: none), now the most recently used (``remember``)."""
    with _LOCK:
        value = table.pop(key, None)
        if value is not None:
            table[key] = value
    return value


def peek(table: dict, key):
    """The entry kept under ``key`` (None: none), its place left as it is."""
    with _LOCK:
        return table.get(key)


# ---------------------------------------------------------------------------
# What a forked copy kept, brought back
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Mark:
    """What the cache held when a copy of the process was forked: per model (by ``id``, the same in
    the copy), the model (weakly), the tree of its entry and the keys it held."""

    models: dict  # id(model) -> (weakref to the model, its entry's tree, measurement keys, profile keys)


def mark() -> Mark:
    with _LOCK:
        return Mark({id(m): (weakref.ref(m), e.tree, set(e.measurements), set(e.profiles)) for m, e in _CACHE.items()})


def kept_since(at: Mark) -> list[tuple[int, str, bytes]]:
    """In the forked copy: what its cache kept since ``at``, for the models marked, as (id(model),
    "measurements" or "profiles", the pickled (key, value)); an entry that cannot be pickled (a
    request holding the user's ``example_inputs`` function) is left out."""
    out = []
    with _LOCK:
        entries = [(id(m), e) for m, e in _CACHE.items() if id(m) in at.models]
    for mid, entry in entries:
        _, _, measured, profiled = at.models[mid]
        for table, known in (("measurements", measured), ("profiles", profiled)):
            for key, value in list(getattr(entry, table).items()):
                if key not in known:
                    try:
                        out.append((mid, table, pickle.dumps((key, value), protocol=pickle.HIGHEST_PROTOCOL)))
                    except Exception:  # noqa: BLE001 - not picklable: the parent measures it if asked
                        continue
    return out


def adopt(at: Mark, kept: list[tuple[int, str, bytes]]) -> int:
    """In the parent: keep what the forked copy kept (``kept_since``), for the models still alive;
    profiles only where the model's entry still has the tree they were made with. Returns how many."""
    n = 0
    for mid, table, data in kept:
        ref, tree, _, _ = at.models[mid]
        model = ref()
        if model is None:
            continue
        with _LOCK:
            entry = _CACHE.get(model)
        if entry is None or (table == "profiles" and entry.tree is not tree):
            continue
        key, value = pickle.loads(data)
        remember(getattr(entry, table), key, value)
        n += 1
    return n


# ---------------------------------------------------------------------------
# Two processes measuring at once: each step measured by one
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class _Shared:
    folder: str  # both processes see it: ``<hash>.claim`` (the one measuring), ``<hash>`` (its measurement)
    peer_alive: Callable[[], bool]


_SHARED: _Shared | None = None


@contextmanager
def shared_between(folder: str, peer_alive: Callable[[], bool]) -> Iterator[None]:
    """In each of two processes forked from one (``search.running``'s two cores): ``measure_once``
    measures a step in one of them only, through ``folder``; ``peer_alive()``: whether the other
    still runs (a step it claimed and will never send is measured here)."""
    global _SHARED
    _SHARED = _Shared(folder, peer_alive)
    try:
        yield
    finally:
        _SHARED = None


def measure_once(key, measure: Callable[[], Measurement]) -> Measurement:
    """``measure()`` (the step under ``key``), or, between two processes (``shared_between``), the
    other's measurement of it, waited for while the other makes it: the first to create the claim
    file measures (``O_EXCL``: one wins) and writes the result apart, then renames it into place (never
    read half-written), or an empty file if it failed (the other then measures, and meets the error itself)."""
    shared = _SHARED
    try:
        path = None if shared is None else os.path.join(
            shared.folder, hashlib.sha1(pickle.dumps(key, protocol=pickle.HIGHEST_PROTOCOL)).hexdigest())
    except Exception:  # noqa: BLE001 - a key that cannot be pickled: measured here
        path = None
    if path is None:
        return measure()
    try:
        os.close(os.open(path + ".claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        theirs = _wait_for(path, shared.peer_alive)
        return theirs if theirs is not None else measure()
    data = b""
    try:
        measurement = measure()
        data = pickle.dumps(measurement, protocol=pickle.HIGHEST_PROTOCOL)
        return measurement
    finally:
        with open(path + ".part", "wb") as f:
            f.write(data)
        os.rename(path + ".part", path)


def _wait_for(path: str, peer_alive: Callable[[], bool]) -> Measurement | None:
    """The other process's measurement at ``path`` once it is there; None if it failed or ended first."""
    while not os.path.exists(path):
        if not peer_alive() and not os.path.exists(path):
            return None
        stop.check()  # the Inspector's next edit stops the wait as it stops a measurement
        time.sleep(0.005)
    with open(path, "rb") as f:
        data = f.read()
    return pickle.loads(data) if data else None


# ---------------------------------------------------------------------------
# One step at a time in this process
# ---------------------------------------------------------------------------
@dataclass
class _Running:
    key: object  # what the step measures (``measure._measurement_key``, or a run order's request)
    ident: int  # the thread measuring it
    ahead: bool  # measured ahead of need: a thread that needs another step stops it
    may_park: bool = False  # measured holding no lock another thread may wait for (``set_aside``)
    done: threading.Event = field(default_factory=threading.Event)


_STEP_LOCK = threading.Lock()  # guards _RUNNING (a fork holds it: no step starts meanwhile)
_RUNNING: _Running | None = None
_AHEAD = threading.local()  # .on: this thread measures ahead of need (``ahead``); .may_park (``ahead(may_park=True)``)


@contextmanager
def ahead(may_park: bool = False) -> Iterator[None]:
    """Around work that measures steps before anyone needs them (the Inspector's look-ahead): a
    thread that needs another step stops such a measurement instead of waiting for it, and the work
    ends here, quietly (the rest of the thread's job goes on). ``may_park``: the steps are measured
    holding no lock that another thread may wait for (in Python 3.11, a ``cached_property`` holds one
    for every instance of its class), so they may be set aside (``set_aside``)."""
    before = getattr(_AHEAD, "on", False), getattr(_AHEAD, "may_park", False)
    _AHEAD.on, _AHEAD.may_park = True, may_park
    try:
        yield
    except stop.Stopped:
        if before[0] or not stop.asked_by_step():
            raise  # stopped as a whole (an edit, cancel), or an outer ``ahead`` ends
    finally:
        _AHEAD.on, _AHEAD.may_park = before
        if not before[0] and stop.asked_by_step():  # met (or come too late): the thread may measure again
            stop.forget(threading.get_ident())


def one_step(key, table: dict | None, measure: Callable[[], object]):
    """``measure()``, the step under ``key``, once no other thread measures a step; kept in ``table``
    (None: not kept). When another thread is measuring this very step, its result (``recall``) once
    it is done; when it measures another step ahead of need and this one is needed, it is stopped
    first (``stop.request``: it raises at its next operation and unwinds its patches)."""
    global _RUNNING
    me = threading.get_ident()
    while True:
        with _STEP_LOCK:
            running = _RUNNING
            if running is None or running.ident == me:  # free (or a step inside this thread's own)
                mine = _RUNNING = running or _Running(key, me, getattr(_AHEAD, "on", False),
                                                      getattr(_AHEAD, "may_park", False))
                break
        if running.key != key and running.ahead and not getattr(_AHEAD, "on", False):
            with _STEP_LOCK:
                if _RUNNING is running:  # still measuring it (never a request that outlives the step's work)
                    stop.request(running.ident, by_step=True)
        _wait_for_step(running)
        if table is not None and running.key == key and (kept := recall(table, key)) is not None:
            return kept  # measured by the other thread (if it failed or stopped, measured here)
    try:
        value = measure()
        if table is not None:
            remember(table, key, value)
        return value
    finally:
        if mine is not running:  # the outermost step of this thread ends
            with _STEP_LOCK:
                _RUNNING = None
            stop.step_ended()
            mine.done.set()


def _wait_for_step(running: _Running) -> None:
    """Until the step ``running`` ends: set aside (``set_aside``), it goes on now that it is waited for;
    the Inspector's next edit stops this wait as it stops a measurement."""
    stop.unpark(running.ident)
    while not running.done.wait(0.005):
        stop.check()


def set_aside(ident: int) -> bool:
    """If the thread ``ident`` is measuring a step ahead of need: park it (it waits at its next
    operation, its patches applied) until a thread waits for it (``one_step``, a fork), then stop
    it once the step is kept, and say True; else False. An edit sets aside its widget's look-ahead so,
    rather than throw away a step half measured that the next edits likely need too."""
    with _STEP_LOCK:
        running = _RUNNING
        if running is None or running.ident != ident or not (running.ahead and running.may_park):
            return False
        stop.park(ident)
        stop.stop_after_step(ident)
    return True


@contextmanager
def _no_step_running() -> Iterator[None]:
    """While a fork is made: no step in progress, none started (``forked.FORK_GUARDS``)."""
    me = threading.get_ident()
    while True:
        _STEP_LOCK.acquire()
        running = _RUNNING
        if running is None or running.ident == me:
            break
        _STEP_LOCK.release()
        _wait_for_step(running)
    try:
        yield
    finally:
        _STEP_LOCK.release()  # in the copy ``forked`` renews the lock; _RUNNING is None there (or its own thread's)


forked.FORK_GUARDS.append(_no_step_running)
