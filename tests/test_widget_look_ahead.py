"""The Inspector measures ahead what the next edit likely needs (issue 37): once an edit's findings
are sent, the worker measures the other parameter dtype, half the sequence, a block checkpointed, a
block's LoRA ignored or given back, TP 2 and the LoRA presets into the measurement caches, so that the
edit itself measures nothing and shows its full numbers in milliseconds. What it leaves in the caches
is what torch measures for that state: the numbers after the edit equal a fresh measurement's."""

from __future__ import annotations

import dataclasses
import threading

import pytest

import shardviz as sv
from shardviz import zoo
from shardviz.activations import clear_cache, stop
from shardviz.activations import measure as measure_mod
from shardviz.widget import look_ahead as look_ahead_mod
from shardviz.widget import Inspector, background
from shardviz.widget.controller import InspectorState

MESH = sv.Mesh(shard=4, device="H100")
TRAINING = sv.Training(param_dtype="bfloat16", reduce_dtype="float32", batch_size=1, seq_len=64)


@pytest.fixture(scope="module")
def model():
    return zoo.tiny_llama_lora()


@pytest.fixture
def runs(monkeypatch):
    """Counts the steps torch runs (``measure.measure_copy``)."""
    count = []
    real = measure_mod.measure_copy

    def counted(*args, **kwargs):
        count.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(measure_mod, "measure_copy", counted)
    return count


def fresh_peak(model, st) -> int:
    clear_cache()
    return int(sv.analyze(model, st.plan, st.mesh, st.training, strict=False).memory["peak"].max())


@pytest.mark.parametrize("edit", [
    lambda st: st.set_training(param_dtype="float32"),
    lambda st: st.set_training(seq_len=32),
    lambda st: st.toggle_checkpoint(st.blocks()[1]),
    lambda st: st.ignore_lora(st.blocks()[1]),
    lambda st: st.apply_preset("ignored"),
    lambda st: st.set_tensor(2),
])
def test_after_the_look_ahead_the_edit_measures_nothing(model, runs, edit):
    clear_cache()
    st = InspectorState(model, mesh=MESH, training=TRAINING)
    st.memory  # noqa: B018 - the current state's numbers, as the widget shows them first
    done = look_ahead_mod.look_ahead(st, st.revision, findings=False)
    assert len(done) >= 5, done
    before = len(runs)
    edit(st)
    peak = st.memory["max_peak"]
    assert len(runs) == before  # the step was measured ahead: nothing runs in the edit's path
    assert peak == fresh_peak(model, st)  # and what was kept is what torch measures for this state


def test_after_the_look_ahead_a_block_checkpointed_then_given_its_lora_back_measures_nothing(model, runs):
    """Two edits of one block in a row (checkpoint it, then give its LoRA back to FSDP): a block
    variant the plan had not, which the look-ahead of the state before the first edit measures."""
    clear_cache()
    st = InspectorState(model, mesh=MESH, training=TRAINING)
    st.apply_preset("ignored")
    st.memory  # noqa: B018
    look_ahead_mod.look_ahead(st, st.revision, findings=False)
    before = len(runs)
    st.toggle_checkpoint(st.blocks()[1])
    st.memory  # noqa: B018
    st.unignore_lora(st.blocks()[1])
    peak = st.memory["max_peak"]
    assert len(runs) == before
    assert peak == fresh_peak(model, st)


@pytest.mark.parametrize("edit", [
    lambda st: st.set_training(param_dtype="float32"),
    lambda st: st.ignore_lora(st.blocks()[1]),  # its LoRA computes in float32 now: a new block variant
])
def test_without_the_look_ahead_the_same_edit_measures(model, runs, edit):
    clear_cache()
    st = InspectorState(model, mesh=MESH, training=TRAINING)
    st.memory  # noqa: B018
    before = len(runs)
    edit(st)
    st.memory  # noqa: B018
    assert len(runs) > before  # the premise of the test above: a new dtype is a new measurement


def test_a_tp_layout_is_copied_and_measured_once(model, runs):
    """TP's one-rank copy is kept per (model, TP plan, degree): a second analysis of the same 2-D
    layout (a what-if, an undo back to it) reuses the copy and its measured step."""
    clear_cache()
    plan = sv.Plan.auto(model, tensor_parallel=True)
    mesh = sv.Mesh(shard=2, tensor=2, device="H100")
    a = sv.analyze(model, plan, mesh, TRAINING, strict=False)
    first = a.memory["peak"].max()
    before = len(runs)
    b = sv.analyze(model, plan, mesh, TRAINING, strict=False)
    assert b.memory["peak"].max() == first and len(runs) == before
    assert a._tp_local_model is b._tp_local_model


def test_the_look_ahead_is_idle_work_and_the_next_edit_stops_it(model, monkeypatch):
    """The widget is idle while it looks ahead (``wait`` returns, no spinner), and an edit cancels it."""
    clear_cache()
    started, release = threading.Event(), threading.Event()

    def slow(st, rev=None, findings=True, measuring=None):
        started.set()
        while not release.is_set():
            stop.check()  # as the real look-ahead checks between its steps: the edit's cancel stops it
            release.wait(0.01)

    monkeypatch.setattr(background, "look_ahead", slow)
    ins = Inspector(model, mesh=MESH, training=TRAINING, background=True)
    ins.pushes.ahead = True
    assert started.wait(120) and ins.wait(5)  # the findings are in; the look-ahead runs on
    assert ins.work["busy"] is False and not ins.pushes.worker.busy
    assert ins.handle_action("set_training", {"seq_len": 48})["ok"]  # cancels it, does not wait for it
    assert ins.wait(120) and ins.memory["max_peak"] == fresh_peak(model, ins.controller)
    release.set()


def test_one_inspector_looks_ahead_the_one_used_last(model, monkeypatch):
    """A re-run cell leaves the old Inspector displayed and alive, its look-ahead measuring for an edit
    that will not come (about 20 s of a core after one edit at 70B): the work of another Inspector
    (its first render, an edit) stops it; another's visible work (its findings, Suggest) goes on."""
    clear_cache()
    started, release = threading.Event(), threading.Event()

    def slow(st, rev=None, findings=True, measuring=None):
        started.set()
        while not release.is_set():
            stop.check()
            release.wait(0.01)

    monkeypatch.setattr(background, "look_ahead", slow)
    old = Inspector(model, mesh=MESH, training=TRAINING, background=True)
    old.pushes.ahead = True
    assert started.wait(120) and old.wait(5)
    looking = old.pushes.worker._thread
    assert looking.is_alive()  # looking ahead
    new = Inspector(model, mesh=MESH, training=TRAINING, background=True)  # the cell run again
    assert not looking.is_alive() and not release.is_set()  # stopped, not finished
    assert new.wait(120) and new.memory["max_peak"] == old.memory["max_peak"]
    release.set()


def test_an_edit_sets_aside_the_look_ahead_s_half_measured_step_and_keeps_it(model, monkeypatch):
    """An edit that finds the look-ahead half way through a step (one the next edits likely need)
    sets it aside instead of throwing it away: it waits while the edit's numbers go out, then is
    measured to its end and kept; the edit that needs it later measures nothing."""
    clear_cache()
    runs, started, release = [], threading.Event(), threading.Event()
    real = measure_mod.measure_copy

    def gated(*args, **kwargs):
        request = args[5]
        runs.append((request.seq_len, request.use_cache))
        if request.seq_len == 32:  # the look-ahead's step: held at its start until the edit comes
            started.set()
            while not release.wait(0.005):
                stop.check()
        return real(*args, **kwargs)

    monkeypatch.setattr(measure_mod, "measure_copy", gated)
    ins = Inspector(model, mesh=MESH, training=TRAINING, background=True)
    assert ins.wait(120)
    st = ins.controller
    monkeypatch.setattr(look_ahead_mod, "next_edits", lambda s: [
        ("half the sequence", lambda: (s.plan, s.mesh, dataclasses.replace(s.training, seq_len=32)))])
    ins.pushes.ahead = True
    assert ins.handle_action("set_training", {"seq_len": 48})["ok"]  # measured here; then the look-ahead starts
    assert started.wait(120) and ins.wait(120)
    looking = ins.pushes.worker._thread
    assert ins.handle_action("set_training", {"seq_len": 64})["ok"]  # measured at the first render: nothing to measure
    assert ins.pushes.worker.aside is looking  # set aside, not stopped
    release.set()
    assert ins.wait(120)
    looking.join(60)
    assert not looking.is_alive()  # its step measured and kept, it ended
    assert runs.count((32, True)) == 1
    assert ins.handle_action("set_training", {"seq_len": 32})["ok"]
    assert ins.wait(120)
    assert runs.count((32, True)) == 1, runs  # the step set aside was kept: not measured again
    assert ins.memory["max_peak"] == fresh_peak(model, st)  # and it is what torch measures for the state


def test_after_a_block_edit_the_look_ahead_measures_the_block_edits_first(model, runs):
    """Once the user edits single blocks, another block edit is the likeliest next one: its step is
    measured before the LoRA presets'; in a plan that treats every block alike the presets come first."""
    clear_cache()
    st = InspectorState(model, mesh=MESH, training=TRAINING)
    assert [what for what, _ in look_ahead_mod.next_edits(st)][0].startswith("preset")
    st.toggle_checkpoint(st.blocks()[1])
    st.memory  # noqa: B018
    assert [what for what, _ in look_ahead_mod.next_edits(st)][:2] == ["one block's checkpoint", "one block's LoRA"]
    assert look_ahead_mod.look_ahead(st, st.revision, findings=False)[:2] == ["one block's checkpoint", "one block's LoRA"]
    before = len(runs)
    st.ignore_lora(st.blocks()[1])  # the block both checkpointed and its LoRA ignored: measured ahead
    assert st.memory["max_peak"] and len(runs) == before
    st.apply_preset("ignored")  # every block's LoRA ignored (block 1 still checkpointed)
    assert [what for what, _ in look_ahead_mod.next_edits(st)][0] == "one block's checkpoint"
    st.checkpoint_blocks(False)
    assert [what for what, _ in look_ahead_mod.next_edits(st)][0].startswith("preset")


def test_an_edit_whose_step_the_look_ahead_is_measuring_lets_it_finish(model, monkeypatch):
    """The user makes the edit the look-ahead is measuring at that moment: the edit waits for that
    measurement to end instead of stopping it and measuring the same step again, and meanwhile the
    rows show the edit (the clicked button changes at once) over the last numbers, dimmed. The
    measurement here ends only once the rows have gone out: rows sent after it would leave it to
    the 3 s wait, then the edit would measure the step again."""
    from shardviz.widget import plan_actions

    clear_cache()
    ins = Inspector(model, mesh=MESH, training=TRAINING, background=True)
    assert ins.wait(120)
    target = plan_actions.preset_keeping_checkpointing(ins.controller, "ignored")[0].plan
    worker = ins.pushes.worker
    started, proceed, keys, gated_key = threading.Event(), threading.Event(), [], []
    real = measure_mod.measure_once

    def gated(key, fn):
        def run():
            keys.append(key)
            ahead = worker.ahead_step
            if ahead is not None and ahead[0][0] == target and not started.is_set():
                gated_key.append(key)
                started.set()
                while not proceed.wait(0.01):
                    stop.check()  # a cancel would stop it here, and the edit would measure it again
            return fn()
        return real(key, run)

    monkeypatch.setattr(measure_mod, "measure_once", gated)
    ins.pushes.ahead = True
    assert ins.handle_action("set_training", {"seq_len": 48})["ok"]  # its look-ahead measures preset "ignored" first
    assert started.wait(120)
    shown, rows_plan, header = [], [], []
    push_rows = ins.push_rows

    def rows_then_proceed(*args, **kwargs):  # the rows of the edited plan, sent while the step is measured
        push_rows(*args, **kwargs)
        rows_plan.append(ins.plan)
        header.append((ins.summary["revision"], ins.summary["n_ignored"], ins.summary["pending"]))
        proceed.set()

    monkeypatch.setattr(ins, "push_rows", rows_then_proceed)
    ins.observe(lambda change: shown.append(change["new"]), names="memory")
    assert ins.handle_action("apply_preset", {"name": "ignored"})["ok"]  # waits for the look-ahead's step
    assert rows_plan[0] == target and shown[0]["pending"]  # the rows at once, the numbers still dimmed
    assert header[0] == (ins.controller.revision, len(target.ignored), "activations being measured")  # the header too
    assert ins.plan == target and ins.wait(120)
    assert keys.count(gated_key[0]) == 1  # measured once, by the look-ahead, not again by the edit
    assert ins.memory["max_peak"] == fresh_peak(model, ins.controller)


def test_the_look_ahead_makes_tp2s_local_model_before_the_less_likely_steps(model, monkeypatch):
    """TP 2's local copy of the model (a fifth of a second at 70B) is made early in the look-ahead,
    once: a TP 2 edit that comes before the look-ahead reached its measured step still finds it."""
    from shardviz import tp

    tp._LOCAL_MODELS.pop(model, None)
    st = InspectorState(model, mesh=MESH, training=TRAINING)
    st.memory  # noqa: B018
    names = [what for what, _ in look_ahead_mod.next_edits(st)]
    assert names.index("TP 2's local model") < min(names.index("every block's checkpoint"), names.index("TP 2"))
    assert dict(look_ahead_mod.next_edits(st))["TP 2's local model"]() is None
    made = []
    real = tp.local_model
    monkeypatch.setattr(tp, "local_model", lambda *a, **k: made.append(1) or real(*a, **k))
    st.set_tensor(2)
    assert st.memory and made == []
