"""A function run in a forked copy of this process, its result read back: work on a second core.

Measuring a step is Python (fake tensors, the recorder's hooks) and holds the GIL, so a second
thread only takes turns with the first. A forked copy runs on a core of its own, starts with
everything the parent holds (the model, the caches, the analysis) without serialising any of it,
and sends back its pickled result through a pipe. The Inspector prices its findings' what-ifs so
while its worker thread measures what the next edit likely needs (``widget.background``).

The copy inherits only the thread that forked it: it never writes to the parent's streams (a
Jupyter kernel's stdout is a socket served by another thread), runs torch on one thread, and ends
with ``os._exit`` (no atexit handler of the parent runs twice). ``kill`` ends it at once; nothing
it held needs cleaning up. Linux only (``available``): elsewhere the callers do the work themselves.
"""

from __future__ import annotations

import functools
import logging
import os
import pickle
import signal
import sys
import threading
import warnings
from collections.abc import Callable
from contextlib import ExitStack


#: context managers entered around each fork: a copy inherits only the forking thread, so what
#: another thread has half done must not be under way (``activations.measure_cache``: a step's patches)
FORK_GUARDS: list[Callable[[], object]] = []


def available() -> bool:
    """Whether work can go to a forked copy here: Linux, and not turned off (``SHARDVIZ_FORK=0``)."""
    return sys.platform == "linux" and hasattr(os, "fork") and os.environ.get("SHARDVIZ_FORK", "1") != "0"


class Forked:
    """``fn()`` run in a forked copy of this process. ``ok`` says whether it returned, ``result``
    is what it returned, ``error`` why not (its exception's words, or "killed"); ``on_done(self)``,
    if given, runs on the reading thread once they are set. ``done`` is set after it, ``ended`` once
    the copy has exited and been reaped."""

    def __init__(self, fn: Callable[[], object], on_done: Callable[[Forked], None] | None = None):
        self.done, self.ended = threading.Event(), threading.Event()
        self.ok, self.result, self.error = False, None, ""
        self._on_done = on_done
        self._reaped = False
        self._lock = threading.Lock()  # kill and reap: a reaped pid may be another process's
        r, w = os.pipe()
        with warnings.catch_warnings(), ExitStack() as guards:  # 3.12+: "multi-threaded, fork() may deadlock": the copy renews ours (_fresh_locks)
            warnings.simplefilter("ignore", DeprecationWarning)
            for guard in FORK_GUARDS:
                guards.enter_context(guard())
            pid = os.fork()
        if pid == 0:
            os.close(r)
            _child(fn, w)  # never returns
        os.close(w)
        self.pid = pid
        threading.Thread(target=self._read, args=(r,), daemon=True, name=f"shardviz fork {pid}").start()

    def _read(self, r: int) -> None:
        with os.fdopen(r, "rb") as f:
            data = f.read()  # to the end: the copy wrote everything and closed it, or was killed
        try:
            self.ok, value = pickle.loads(data)
        except Exception:  # noqa: BLE001 - nothing or half of it: killed (or died)
            self.ok, value = False, "killed"
        if self.ok:
            self.result = value
        else:
            self.error = value
        try:
            if self._on_done is not None:
                self._on_done(self)
        finally:
            self.done.set()  # before the copy is reaped: its exit (freeing its memory) can take 0.1-0.5 s
            self._reap()

    def _reap(self) -> None:
        """Wait for the copy's exit without reaping it (its pid stays its own, so ``kill`` meanwhile
        cannot reach another process), then reap it."""
        os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)
        with self._lock:
            os.waitpid(self.pid, 0)
            self._reaped = True
        self.ended.set()

    def kill(self) -> None:
        """End the copy now (no-op once it has ended)."""
        with self._lock:
            if not self._reaped:
                try:
                    os.kill(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


_LOCK_TYPES = {type(threading.Lock()): threading.Lock, type(threading.RLock()): threading.RLock}


def _fresh_locks() -> None:
    """In the copy: the locks another thread of the parent may have held at the fork, new. Those of
    shardviz's modules (``collector._LOCK``, ``activations.measure_cache._LOCK``), and Python 3.11's
    ``functools.cached_property`` locks: one per property while it computes (a property of one
    class, across all its instances), so a copy forked while a thread computed ``Analysis.memory``
    would wait for it forever."""
    for name, module in list(sys.modules.items()):
        if not name.startswith("shardviz") or module is None:
            continue
        for attr_name, value in list(vars(module).items()):
            if type(value) in _LOCK_TYPES:
                setattr(module, attr_name, _LOCK_TYPES[type(value)]())
            elif isinstance(value, type) and value.__module__ == name:
                for attr in vars(value).values():
                    if isinstance(attr, functools.cached_property) and hasattr(attr, "lock"):  # 3.12+: none
                        attr.lock = threading.RLock()


def _child(fn: Callable[[], object], w: int) -> None:
    try:
        _fresh_locks()
        devnull = open(os.devnull, "w")  # noqa: SIM115 - for the copy's whole life
        sys.stdout = sys.stderr = devnull
        for fd in (1, 2):  # nor holds the parent's output pipes open (a shell waiting on them would wait for it)
            os.dup2(devnull.fileno(), fd)
        logging.disable(logging.CRITICAL)
        import torch

        torch.set_num_threads(1)  # the parent's OpenMP pool is not in the copy
        try:
            payload = (True, fn())
        except BaseException as exc:  # noqa: BLE001 - sent back as words
            payload = (False, f"{type(exc).__name__}: {exc}")
        try:
            data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001
            data = pickle.dumps((False, f"the result could not be pickled: {type(exc).__name__}: {exc}"))
        with os.fdopen(w, "wb") as f:
            f.write(data)  # closed here: the parent reads its end now, while this exits
    finally:
        os._exit(0)
