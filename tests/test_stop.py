"""``activations.stop``: a measurement on another thread stops itself when asked, at an operation it
dispatches, and leaves torch as it was: the same step measured afterwards on this thread gives the
same bytes. (An exception injected at any bytecode instead once killed the kernel; raising from a
dispatch in backward or from a ``tensor.device`` query terminates the process: the recorder checks
only where torch unwinds: a forward's dispatch, a module's hook in backward.)"""

from __future__ import annotations

import threading
import time

import pytest

import shardviz as sv
from shardviz import zoo
from shardviz.activations import stop

MESH = sv.Mesh(4, device="H100")


def peak(model, seq: int) -> int:
    a = sv.analyze(model, sv.Plan.auto(model), MESH, sv.Training(batch_size=1, seq_len=seq))
    return int(a.memory["peak"].max())


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.2, 0.5, 1.0])
def test_a_measurement_asked_to_stop_stops_and_torch_is_left_as_it_was(delay):
    model = zoo.tiny_llama_lora()
    before = peak(model, 64)
    out: dict = {}
    started = threading.Event()

    def job():
        started.set()
        try:
            out["peak"] = peak(model, 80 + int(delay * 100))  # a step not measured yet
        except stop.Stopped:
            out["peak"] = "stopped"

    t = threading.Thread(target=job)
    t.start()
    assert started.wait(10)
    time.sleep(delay)
    stop.request(t.ident)
    t.join(60)
    stop.forget(t.ident)
    assert not t.is_alive()
    if delay == 0.0:
        assert out["peak"] == "stopped"  # asked before its first operation
    elif out["peak"] != "stopped":
        assert out["peak"] == peak(model, 80 + int(delay * 100))
    stop.check()  # this thread was never asked
    assert peak(model, 64) == before


def test_asked_in_backward_it_stops_at_the_next_module_hook(monkeypatch):
    """A raise from a dispatch in backward terminates the process, so a measurement asked to stop there
    runs on without its own bookkeeping (MemTracker's, the op costs: its numbers are dropped) only to
    the next module's backward hook, a Python hook on a gradient, which raises as a user's hook does
    (not the whole rest of the backward: a cancel used to wait 54-137 ms for it at 70B); the same
    step measured afterwards gives the same bytes."""
    from torch.distributed._tools.mem_tracker import MemTracker

    from shardviz.activations import clear_cache
    from shardviz.activations.recorder import Recorder

    model = zoo.tiny_llama_lora()
    clear_cache()
    real_event, real_dispatch = Recorder._event, MemTracker.__torch_dispatch__
    backward_ops = []

    def counting(self, func, *args, **kwargs):
        if self._mod_tracker.is_bw:
            backward_ops.append(func)
        return real_dispatch(self, func, *args, **kwargs)

    monkeypatch.setattr(MemTracker, "__torch_dispatch__", counting)
    expected = peak(model, 72)
    monkeypatch.undo()
    clear_cache()
    asked, bookkept, bare = [], [], []
    real_recorder_dispatch = Recorder.__torch_dispatch__

    def event(self, kind, key):
        if self._mod_tracker.is_bw and not asked:
            asked.append(kind)
            stop.request(threading.get_ident())
        return real_event(self, kind, key)

    def dispatch(self, *args, **kwargs):
        if asked:
            bookkept.append(args[0])
        return real_dispatch(self, *args, **kwargs)

    def recorder_dispatch(self, func, *args, **kwargs):
        if asked:
            bare.append(func)
        return real_recorder_dispatch(self, func, *args, **kwargs)

    monkeypatch.setattr(Recorder, "__torch_dispatch__", recorder_dispatch)
    monkeypatch.setattr(Recorder, "_event", event)
    monkeypatch.setattr(MemTracker, "__torch_dispatch__", dispatch)
    try:
        with pytest.raises(stop.Stopped):
            peak(model, 72)
    finally:
        stop.forget(threading.get_ident())
    assert asked and bookkept == []
    assert len(bare) < len(backward_ops) // 10, (len(bare), len(backward_ops))  # stopped at the next hook
    from shardviz.activations import measure_cache
    assert not any(e.measurements for e in measure_cache._CACHE.values())  # the bare run's events are not kept
    monkeypatch.undo()
    assert peak(model, 72) == expected


@pytest.mark.parametrize("nth", [1, 40])
def test_asked_in_a_checkpointed_backward_it_stops_and_the_step_measures_the_same(monkeypatch, nth):
    """Stopped at the ``nth`` module event of a backward that recomputes every checkpointed block (the
    40th is inside a recomputation, whose module pre-hooks check too): it stops at the next module
    event, the process lives, and the same step measured again gives the same bytes as before."""
    from shardviz.activations import clear_cache, measure_activations
    from shardviz.activations.recorder import Recorder

    model = zoo.tiny_llama_lora()
    blocks = [f"base_model.model.model.layers.{i}" for i in range(len(model.base_model.model.model.layers))]
    clear_cache()
    expected = measure_activations(model, 1, 64, param_dtype="bfloat16", checkpoint=blocks)
    clear_cache()
    real_event, seen = Recorder._event, []

    def event(self, kind, key):
        if self._mod_tracker.is_bw:
            seen.append(kind)
            if len(seen) == nth:
                stop.request(threading.get_ident())
        return real_event(self, kind, key)

    monkeypatch.setattr(Recorder, "_event", event)
    try:
        with pytest.raises(stop.Stopped):
            measure_activations(model, 1, 64, param_dtype="bfloat16", checkpoint=blocks)
    finally:
        stop.forget(threading.get_ident())
    assert len(seen) == nth  # no module event after the stop
    assert nth == 1 or seen[-1] in ("pre_rc", "post_rc")  # asked inside a recomputation
    monkeypatch.undo()
    again = measure_activations(model, 1, 64, param_dtype="bfloat16", checkpoint=blocks)
    assert again.peak == expected.peak and dict(again.modules) == dict(expected.modules)
    assert again.module_flops == expected.module_flops


@pytest.mark.parametrize("stage", ["forward", "step"])
def test_asked_during_a_step_times_stage_it_stops_before_the_next(monkeypatch, stage):
    """The step model and a search row are pure Python, tens of ms a stage at 70B: asked to stop in
    one (the schedule's forward, the row's step time), the next (the schedule's backward, the row's
    breakdown) never starts. Without checks between them a cancel at 70B waited up to 76 ms more."""
    from shardviz.search import running
    from shardviz.step import schedule

    model = zoo.tiny_llama_lora()
    a = sv.analyze(model, sv.Plan.auto(model), MESH, sv.Training(batch_size=1, seq_len=64))
    a.memory  # noqa: B018 - measured first: what is left is the step model
    asked, reached = [], []
    if stage == "forward":
        real = schedule._forward

        def forward(*args, **kwargs):
            real(*args, **kwargs)
            stop.request(threading.get_ident())
            asked.append(1)
        monkeypatch.setattr(schedule, "_forward", forward)
        monkeypatch.setattr(schedule, "_backward", lambda *args, **kwargs: reached.append(1))
        run = lambda: a.step  # noqa: E731
    else:
        real = running.step_numbers

        def step_numbers(analysis):
            out = real(analysis)
            stop.request(threading.get_ident())
            asked.append(1)
            return out
        monkeypatch.setattr(running, "step_numbers", step_numbers)
        monkeypatch.setattr(running, "time_parts", lambda *args, **kwargs: reached.append(1) or {})
        space = type("Space", (), {"cache_of": lambda self, c: False})()
        cand = type("Candidate", (), {"grad_accum": 1})()
        run = lambda: running.measured(space, cand, a)  # noqa: E731
    try:
        with pytest.raises(stop.Stopped):
            run()
    finally:
        stop.forget(threading.get_ident())
    assert asked and not reached
