"""One step measured at a time in the process (``measure_cache.one_step``).

A measurement patches module-level functions (``nn.Module.to``, ``Cache.update``, ...) and registers
torch's global module hooks (MemTracker's ModTracker) while its step runs. The Inspector measures on
its worker thread (the look-ahead, for seconds) while the user runs other cells: two steps at once
used to fail ("The Module hierarchy tracking is wrong") and could leave ``nn.Module.to`` patched for
good. Now a thread that needs a step waits for the one running, reads it when it is the same step,
and stops one made only ahead of need (``measure_cache.ahead``); a fork waits for the step in progress.
"""

from __future__ import annotations

import threading

import pytest
from torch import nn

from shardviz import forked, zoo
from shardviz.activations import clear_cache, measure_activations, measure_cache, stop
from shardviz.activations import measure as measure_mod


@pytest.fixture(scope="module")
def model():
    return zoo.tiny_llama_lora()


def test_two_threads_measuring_at_once_get_what_each_gets_alone(model):
    alone = {s: measure_activations(model, 1, s).peak for s in (32, 48, 64, 80)}
    to = nn.Module.to
    got, errors = [], []

    def measure(seqs):
        for _ in range(4):
            for s in seqs:
                clear_cache()
                try:
                    got.append((s, measure_activations(model, 1, s).peak))
                except Exception as exc:  # noqa: BLE001 - collected: the assertion names it
                    errors.append(f"{type(exc).__name__}: {exc}"[:300])

    other = threading.Thread(target=measure, args=((32, 48),))
    other.start()
    measure((64, 80))
    other.join(300)
    assert errors == []
    assert len(got) == 16 and all(peak == alone[s] for s, peak in got)
    assert nn.Module.to is to  # every patch undone


@pytest.fixture
def gated(monkeypatch):
    """``measure_copy`` counted, and the first run on a thread held at its start until ``release``."""
    runs, started, release = [], threading.Event(), threading.Event()
    real = measure_mod.measure_copy

    def counted(*args, **kwargs):
        runs.append(threading.get_ident())
        if len(runs) == 1:
            started.set()
            while not release.wait(0.005):
                stop.check()  # as the recorder checks at each operation
        return real(*args, **kwargs)

    monkeypatch.setattr(measure_mod, "measure_copy", counted)
    return runs, started, release


def test_a_thread_that_needs_the_step_being_measured_waits_for_it(model, gated):
    runs, started, release = gated
    clear_cache()
    out = {}
    first = threading.Thread(target=lambda: out.setdefault("first", measure_activations(model, 1, 40).peak))
    first.start()
    assert started.wait(60)
    threading.Timer(0.3, release.set).start()
    second = measure_activations(model, 1, 40).peak  # the same step: waits, then reads it
    first.join(60)
    assert second == out["first"]
    assert len(runs) == 1  # measured once, by the first thread


def test_a_step_needed_stops_one_measured_ahead_of_need(model, gated):
    runs, started, release = gated
    clear_cache()
    out = {}

    def look_ahead():
        try:
            with measure_cache.ahead():
                measure_activations(model, 1, 40)
            out["ahead"] = "done"
        except stop.Stopped:
            out["ahead"] = "stopped"

    ahead = threading.Thread(target=look_ahead)
    ahead.start()
    assert started.wait(60)
    needed = measure_activations(model, 1, 56).peak  # another step: the look-ahead's is stopped, not waited for
    ahead.join(60)
    release.set()
    assert out["ahead"] == "done"  # its look-ahead ended there, quietly: the rest of its job goes on
    runs_before = len(runs)
    measure_activations(model, 1, 40)
    assert len(runs) == runs_before + 1  # it was stopped (released only now), nothing kept
    assert needed == measure_activations(model, 1, 56).peak
    stop.check()  # no request left behind for this thread
    clear_cache()
    assert measure_activations(model, 1, 56).peak == needed  # what it measured is what a fresh step gives


def test_a_fork_waits_for_the_step_in_progress(model, gated):
    runs, started, release = gated
    clear_cache()
    other = threading.Thread(target=lambda: measure_activations(model, 1, 40))
    other.start()
    assert started.wait(60)
    threading.Timer(0.3, release.set).start()
    copy = forked.Forked(lambda: nn.Module.to.__qualname__)  # made once the step has ended
    assert release.is_set()
    copy.done.wait(60)
    other.join(60)
    assert copy.ok and copy.result == "Module.to"  # the copy has torch's own, not a measurement's patch


def _ahead_thread(model, seq: int, out: dict) -> threading.Thread:
    """A look-ahead's step on another thread (``ahead(may_park=True)``): "ended" once its look-ahead
    ended (measured, or stopped for a step another thread needed), "stopped" if it was stopped whole."""
    def run():
        try:
            with measure_cache.ahead(may_park=True):
                measure_activations(model, 1, seq)
            out["ahead"] = "ended"
        except stop.Stopped:
            out["ahead"] = "stopped"
        finally:
            stop.forget(threading.get_ident())  # as the Inspector's worker does at a job's end

    return threading.Thread(target=run)


def _set_aside(model, gated) -> tuple[threading.Thread, dict, list]:
    """A look-ahead's step of seq 40 on another thread, set aside (parked) as an edit does, then let
    go of the gate: free to run, it waits at its first operation. Returns the thread, its outcome, the runs."""
    runs, started, release = gated
    clear_cache()
    out = {}
    ahead = _ahead_thread(model, 40, out)
    ahead.start()
    assert started.wait(60)
    assert measure_cache.set_aside(ahead.ident)
    release.set()
    return ahead, out, runs


def test_a_step_set_aside_waits_and_a_thread_that_needs_it_finishes_it(model, gated, monkeypatch):
    """An edit sets aside its look-ahead's half-measured step (parked at its next operation); the step
    goes on once a thread waits for it, is kept, and the thread that set it aside stops after it."""
    monkeypatch.setattr(stop, "PARK_S", 60.0)
    ahead, out, runs = _set_aside(model, gated)
    ahead.join(2)
    assert ahead.is_alive() and "ahead" not in out  # waits
    needed = measure_activations(model, 1, 40).peak  # the same step: it goes on, this thread reads it
    ahead.join(60)
    assert len(runs) == 1 and not ahead.is_alive()
    assert out["ahead"] == "stopped"  # after its step (kept): it looked ahead for a state left behind
    clear_cache()
    assert measure_activations(model, 1, 40).peak == needed


def test_a_step_set_aside_is_stopped_by_another_step_needed(model, gated):
    ahead, out, runs = _set_aside(model, gated)
    needed = measure_activations(model, 1, 56).peak
    ahead.join(60)
    assert out["ahead"] == "stopped" and not ahead.is_alive()  # a job set aside ends whole
    assert len(runs) == 2
    measure_activations(model, 1, 40)
    assert len(runs) == 3  # stopped half way: nothing kept
    clear_cache()
    assert measure_activations(model, 1, 56).peak == needed


def test_only_a_look_ahead_step_measured_holding_no_lock_is_set_aside(model, gated):
    runs, started, release = gated
    clear_cache()
    out = {}

    def findings_ahead():  # the look-ahead's findings: measured inside cached properties, never parked
        with measure_cache.ahead():
            measure_activations(model, 1, 40)
        out["done"] = True

    t = threading.Thread(target=findings_ahead)
    t.start()
    assert started.wait(60)
    assert not measure_cache.set_aside(t.ident)
    assert not measure_cache.set_aside(threading.get_ident())  # nor a thread measuring nothing
    release.set()
    t.join(60)
    assert out["done"]


def test_a_fork_lets_a_step_set_aside_finish_first(model, gated):
    ahead, out, runs = _set_aside(model, gated)
    copy = forked.Forked(lambda: nn.Module.to.__qualname__)
    assert out.get("ahead") in ("stopped", None)  # its step ended before the fork
    copy.done.wait(60)
    ahead.join(60)
    assert copy.ok and copy.result == "Module.to"
    assert len(runs) == 1
    runs_before = len(runs)
    measure_activations(model, 1, 40)  # kept: nothing runs
    assert len(runs) == runs_before


def test_a_step_set_aside_that_no_one_waits_for_goes_on_by_itself(model, gated, monkeypatch):
    """While a step waits, its patches and torch's global module hooks stay in place for the whole
    process: it waits ``stop.PARK_S`` at most, then measures on to its end (kept) and stops."""
    monkeypatch.setattr(stop, "PARK_S", 0.5)
    ahead, out, runs = _set_aside(model, gated)
    ahead.join(60)
    assert out["ahead"] == "stopped" and not ahead.is_alive()
    measure_activations(model, 1, 40)  # kept: nothing runs
    assert len(runs) == 1
    assert nn.Module.to.__qualname__ == "Module.to"
