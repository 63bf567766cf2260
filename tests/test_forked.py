"""Work in a forked copy of the process (``shardviz.forked``), and the Inspector pricing its findings'
what-ifs there while its worker looks ahead (issue 37: two cores, not one).

What is held: the copy's result is the one the parent would compute (the findings, the measured
steps), the parent adopts the steps the copy measured and measures them no more, a new edit kills
the copy, and the copy never writes to the parent's streams."""

from __future__ import annotations

import os
import time
from dataclasses import replace

import pytest

import shardviz as sv
from shardviz import forked, zoo
from shardviz.activations import clear_cache, measure_cache
from shardviz.activations import measure as measure_mod
from shardviz.analysis import Analysis
from shardviz.widget import Inspector, background
from shardviz.widget.controller import InspectorState

pytestmark = pytest.mark.skipif(not forked.available(), reason="fork: Linux only")

TRAINING = sv.Training(param_dtype="bfloat16", reduce_dtype="float32", batch_size=1, seq_len=64)
# the tiny model's allocated peak at 1 x 48 is about 570 KB, 480 KB with every block checkpointed: SV201
# prices its fixes, and checkpointing every block is one that fits (a change of plan)
OVER = sv.Mesh(shard=4, device_memory=520_000, memory_reserve=0, safety_margin=0, judge="allocated")


@pytest.fixture(scope="module")
def model():
    return zoo.tiny_llama_lora()


@pytest.fixture
def inspectors():
    """The Inspectors a test makes, their background work stopped after it: an edit made through the
    controller starts a job, whose look-ahead would fork (and count) in the next test."""
    made = []
    yield made
    for ins in made:
        ins.pushes.ahead = False
        ins.pushes.worker.cancel()


def test_the_copy_computes_from_the_parents_state_and_sends_its_result_back():
    held = {"rows": list(range(100_000))}  # in the copy without being sent to it
    f = forked.Forked(lambda: sum(held["rows"]) + os.getpid())
    assert f.done.wait(60) and f.ok
    assert f.result - f.pid == sum(range(100_000)) and f.pid != os.getpid()


def test_an_exception_in_the_copy_comes_back_as_words():
    def fails():
        raise KeyError("base_model.model.lm_head")

    f = forked.Forked(fails)
    assert f.done.wait(60) and not f.ok and f.result is None
    assert f.error == "KeyError: 'base_model.model.lm_head'"


def test_kill_ends_the_copy_at_once_and_reaps_it():
    f = forked.Forked(lambda: time.sleep(600))
    time.sleep(0.2)
    t0 = time.perf_counter()
    f.kill()
    assert f.done.wait(10) and time.perf_counter() - t0 < 5
    assert not f.ok and f.error == "killed"
    assert f.ended.wait(10)
    with pytest.raises(ChildProcessError):  # reaped: no zombie left
        os.waitpid(f.pid, os.WNOHANG)
    f.kill()  # after the end: nothing (the pid may be another process's by now)


def test_the_copy_never_writes_to_the_parents_streams(capfd):
    def chatty():
        print("from the copy")
        import logging
        import warnings

        warnings.warn("a warning in the copy", stacklevel=1)
        logging.getLogger("shardviz").error("an error logged in the copy")
        return 1

    f = forked.Forked(chatty)
    assert f.done.wait(60) and f.ok and f.result == 1
    out, err = capfd.readouterr()
    assert "copy" not in out and "copy" not in err


def test_the_parent_adopts_the_steps_the_copy_measured(model):
    clear_cache()
    plan = sv.Plan.auto(model, lora="ignored", checkpoint="blocks")
    sv.analyze(model, sv.Plan.auto(model), OVER, TRAINING, strict=False).memory  # noqa: B018 - a cache entry to mark
    at = measure_cache.mark()

    def measured():
        return sv.analyze(model, plan, OVER, TRAINING, strict=False).memory.to_dict(), measure_cache.kept_since(at)

    f = forked.Forked(measured)
    assert f.done.wait(120) and f.ok, f.error
    theirs, kept = f.result
    assert {table for _, table, _ in kept} == {"measurements", "profiles"}
    assert measure_cache.adopt(at, kept) == len(kept)
    runs = []
    real = measure_mod.measure_copy
    measure_mod.measure_copy = lambda *a, **k: runs.append(1) or real(*a, **k)
    try:
        ours = sv.analyze(model, plan, OVER, TRAINING, strict=False).memory.to_dict()
    finally:
        measure_mod.measure_copy = real
    assert runs == [] and ours == theirs  # measured once, in the copy, and the same bytes
    clear_cache()
    assert sv.analyze(model, plan, OVER, TRAINING, strict=False).memory.to_dict() == theirs  # what torch measures here


def reference_analysis(model):
    return InspectorState(model, mesh=OVER, training=replace(TRAINING, seq_len=48)).analysis


def test_the_inspector_prices_its_what_ifs_in_a_copy_and_gets_the_same_findings(model, monkeypatch, inspectors):
    clear_cache()
    reference = InspectorState(model, mesh=OVER, training=replace(TRAINING, seq_len=48)).findings
    assert any(f["code"] == "SV201" and "checkpoint" in f["fix"] for f in reference)
    clear_cache()
    priced_here, copies = [], []
    real_price, real_forked = Analysis.price, forked.Forked
    monkeypatch.setattr(Analysis, "price", lambda self, *a, **k: priced_here.append(1) or real_price(self, *a, **k))
    monkeypatch.setattr(background.forked, "Forked", lambda *a, **k: copies.append(real_forked(*a, **k)) or copies[-1])
    monkeypatch.setattr(background, "look_ahead", lambda st, rev=None, findings=True, measuring=None: [])
    ins = Inspector(model, mesh=OVER, training=TRAINING, background=True)
    inspectors.append(ins)
    assert ins.wait(120)  # the first render priced here: no front end, no look-ahead
    ins.pushes.ahead = True  # as with a front end
    priced_here.clear()
    assert ins.handle_action("set_training", {"seq_len": 48})["ok"]
    assert ins.wait(120) and copies
    assert priced_here == []  # every what-if was priced in the copy
    assert ins.findings == reference
    assert not any(f["pending"] for f in ins.findings) and ins.work["busy"] is False
    # SV201's cheapest fix came back as the change the card applies, as priced here
    here = next(f for f in reference_analysis(model).findings if f.code == "SV201").change
    there = next(f for f in ins.analysis.findings if f.code == "SV201").change
    assert there is not None and there == here and ins.summary["card"]["finding"]["applies"] is True
    # the steps the what-ifs measured came back: taking SV201's fix (every block checkpointed) measures nothing here
    runs = []
    monkeypatch.setattr(measure_mod, "measure_copy", lambda *a, **k: runs.append(1))
    st = ins.controller
    st.checkpoint_blocks(True)
    st.memory  # noqa: B018
    assert runs == []


def test_a_new_edit_kills_the_copy_still_pricing(model, monkeypatch, inspectors):
    clear_cache()
    copies, real_forked = [], forked.Forked
    monkeypatch.setattr(background.forked, "Forked", lambda *a, **k: copies.append(real_forked(*a, **k)) or copies[-1])
    ins = Inspector(model, mesh=OVER, training=TRAINING, background=True)
    inspectors.append(ins)
    assert ins.wait(120)
    ins.pushes.ahead = True
    monkeypatch.setattr(background, "look_ahead", lambda st, rev=None, findings=True, measuring=None: [])
    monkeypatch.setattr(Analysis, "price", lambda self, *a, **k: time.sleep(600))  # in the copy: never done
    assert ins.handle_action("set_training", {"seq_len": 48})["ok"]
    deadline = time.time() + 60
    while not copies and time.time() < deadline:
        time.sleep(0.02)
    pricing = copies[0]
    assert not pricing.done.wait(1) and ins.work["busy"]  # SV201 is being priced, in the copy
    monkeypatch.setattr(Analysis, "price", lambda self, *a, **k: (_ for _ in ()).throw(RuntimeError("not asked")))
    assert ins.handle_action("set_training", {"seq_len": 32})["ok"]
    assert pricing.done.wait(10) and pricing.error == "killed"
    assert ins.wait(120) and ins.controller.training.seq_len == 32


def test_a_copy_forked_while_a_thread_computes_a_cached_property_does_not_wait_for_it(model, monkeypatch):
    """Python 3.11's ``cached_property`` holds one lock per property, across instances, while it
    computes: a copy forked while another thread computed ``Analysis.memory`` inherited that lock held
    and waited forever for its own ``memory`` (seen in a test run)."""
    import threading

    from shardviz import analysis as analysis_mod

    parent, entered, release = os.getpid(), threading.Event(), threading.Event()
    real_costs = analysis_mod.Analysis.costs.func

    def costs(self):
        if os.getpid() == parent:
            entered.set()
            release.wait(60)  # the parent's thread holds the ``memory`` property's lock meanwhile
        return real_costs(self)

    monkeypatch.setattr(analysis_mod.Analysis, "costs", property(costs))
    first = sv.analyze(model, sv.Plan.auto(model), sv.Mesh(shard=4), TRAINING)
    second = sv.analyze(model, sv.Plan.auto(model, lora="ignored"), sv.Mesh(shard=4), TRAINING)
    t = threading.Thread(target=lambda: first.memory)
    t.start()
    assert entered.wait(60)
    f = forked.Forked(lambda: int(second.memory["peak"].max()))
    try:
        assert f.done.wait(60) and f.ok, f.error  # before: never done
    finally:
        release.set()
        t.join(60)
        f.kill()
    assert f.result == int(second.memory["peak"].max())


def test_a_copy_forked_while_a_thread_holds_a_module_lock_does_not_wait_for_it():
    """A module's own lock (the collector's, the measurement cache's) held by another thread at the
    fork is held forever in the copy, unless the copy renews it."""
    import threading

    from shardviz import collector

    held, release = threading.Event(), threading.Event()

    def hold():
        with collector._LOCK:
            held.set()
            release.wait(60)

    t = threading.Thread(target=hold)
    t.start()
    assert held.wait(60)
    f = forked.Forked(lambda: [clear_cache(), collector.quiet().__enter__()] and True)
    try:
        assert f.done.wait(60) and f.ok and f.result is True, f.error  # before: never done
    finally:
        release.set()
        t.join(60)
        f.kill()
