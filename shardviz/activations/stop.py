"""Stopping a measurement from another thread, at a point where torch's state is consistent.

The Inspector's worker thread measures steps while the user edits; a new edit stops it. An
exception injected into a thread (``PyThreadState_SetAsyncExc``) fires at any bytecode, also inside
a ``finally`` that restores a patched torch function or inside a callback torch's C++ makes, and
once killed the kernel (``pybind11::error_already_set``). Here the thread is only asked to stop
(``request``); it raises ``Stopped`` itself at its next check (``check``): each operation the
measurement dispatches (an exception from a dispatch mode is one torch expects and unwinds), and
between the worker's own stages.
"""

from __future__ import annotations

import threading

#: the threads asked to stop (their ``threading.get_ident()``)
_ASKED: set[int] = set()
#: those of them asked only to stop a step measured ahead of need (``request(by_step=True)``)
_BY_STEP: set[int] = set()
#: threads told to wait at their step's next operation (``park``), each until its Event is set
_PARKED: dict[int, threading.Event] = {}
#: the longest a parked step waits before it goes on by itself: while it waits, its patches of module
#: functions and torch's global module hooks stay in place for the whole process (an edit's numbers
#: from a kept step take a tenth of a second, and a step the edit needs stops it at once)
PARK_S = 1.0
#: threads to stop once the step they measure is kept (``stop_after_step``)
_AFTER_STEP: set[int] = set()


class Stopped(BaseException):
    """Raised by ``check`` in a thread asked to stop: a ``BaseException``, which no ``except
    Exception`` in the analysis (a what-if that fails becomes a finding's words) swallows."""


def request(ident: int, by_step: bool = False) -> None:
    """Ask the thread ``ident`` to stop at its next ``check`` (a parked one wakes to do so).
    ``by_step``: only its work ahead of need, for a step another thread needs (``measure_cache.ahead``
    ends there, and the thread goes on with the rest of its job)."""
    if by_step and ident not in _ASKED:
        _BY_STEP.add(ident)
    elif not by_step:
        _BY_STEP.discard(ident)
    _ASKED.add(ident)
    unpark(ident)


def asked_by_step() -> bool:
    """Whether this thread was asked to stop only its work ahead of need (``request(by_step=True)``)."""
    return threading.get_ident() in _BY_STEP


def forget(ident: int) -> None:
    """The thread ``ident`` has ended (or stopped): a new thread may reuse its ident."""
    _ASKED.discard(ident)
    _BY_STEP.discard(ident)
    _AFTER_STEP.discard(ident)
    unpark(ident)


def park(ident: int) -> None:
    """Have the thread ``ident`` wait at its step's next operation (``pause``) until ``unpark``: a
    step measured ahead of need, set aside while an edit has the CPU (``measure_cache.set_aside``)."""
    _PARKED.setdefault(ident, threading.Event())


def unpark(ident: int) -> None:
    event = _PARKED.pop(ident, None)
    if event is not None:
        event.set()


def pause() -> None:
    """At each operation of a step (the recorder): wait here while this thread is parked, at most
    ``PARK_S`` seconds."""
    if _PARKED:
        ident = threading.get_ident()
        event = _PARKED.get(ident)
        if event is not None and not event.wait(PARK_S):
            unpark(ident)


def stop_after_step(ident: int) -> None:
    """Ask the thread ``ident`` to stop once the step it measures is kept (``step_ended``)."""
    _AFTER_STEP.add(ident)


def step_ended() -> None:
    """This thread's step has ended: asked to stop after it, it stops at its next ``check``."""
    ident = threading.get_ident()
    if ident in _AFTER_STEP:
        _AFTER_STEP.discard(ident)
        request(ident)


def check() -> None:
    """Raise ``Stopped`` if this thread was asked to stop (an empty set: one truth test)."""
    if requested():
        raise Stopped


def requested() -> bool:
    """Whether this thread was asked to stop (``check`` without the raise: where a raise cannot be made)."""
    return bool(_ASKED) and threading.get_ident() in _ASKED
