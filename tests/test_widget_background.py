"""The Inspector's slow work off the kernel's thread (issue 24): with a micro-batch an edit sends the
model-state numbers at once (marked pending), the worker then sends the full numbers (the measured
activations) and the findings; a new edit or "cancel" stops it. Every number sent is ``sv.analyze``'s."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

import shardviz as sv
from shardviz.activations import stop
from shardviz.widget import Inspector

MESH = sv.Mesh(shard=4, device="H100")
TRAINING = sv.Training(param_dtype="bfloat16", reduce_dtype="float32", batch_size=1, seq_len=64)


@pytest.fixture
def ins(model):
    w = Inspector(model, mesh=MESH, training=TRAINING, background=True)
    assert w.wait(120)
    return w


def peak(model, ins, training) -> int:
    return int(sv.analyze(model, ins.plan, ins.mesh, training, strict=False).memory["peak"].max())


def test_an_edit_sends_the_model_state_then_the_full_numbers(model, ins):
    assert ins.handle_action("set_training", {"seq_len": 96})["ok"]
    first = dict(ins.memory)
    assert first["pending"] and "being measured" in first["pending"] and ins.summary["pending"]
    state_only = dataclasses.replace(ins.training, batch_size=None)
    assert first["max_peak"] == peak(model, ins, state_only)  # the model state, as analyze gives it
    assert ins.wait(120)
    assert not ins.memory.get("pending") and ins.memory["revision"] == first["revision"]
    assert ins.memory["max_peak"] == ins.summary["peak"] == peak(model, ins, ins.training)
    assert not ins.summary["findings_stale"] and ins.work["busy"] is False
    assert ins.findings == [f for f in ins.controller.findings]


def test_a_new_edit_cancels_the_work_of_the_last(model, ins, monkeypatch):
    from shardviz.widget import panels

    started = threading.Event()
    real = panels.findings_payload

    def slow(analysis, first=False):
        if first:  # the first findings (no what-if priced) are quick; the priced ones are slow
            return real(analysis, first)
        started.set()
        for _ in range(600):  # a what-if of 70B: seconds, each operation it measures a check (activations.stop)
            stop.check()
            time.sleep(0.01)
        return real(analysis)

    monkeypatch.setattr(panels, "findings_payload", slow)
    assert ins.handle_action("set_training", {"seq_len": 80})["ok"]
    assert started.wait(60) and ins.work["busy"]
    t0 = time.perf_counter()
    monkeypatch.setattr(panels, "findings_payload", real)
    assert ins.handle_action("set_training", {"param_dtype": "float32"})["ok"]
    assert time.perf_counter() - t0 < 3  # the old job was stopped, not waited for (6 s)
    assert ins.wait(120)
    assert ins.memory["max_peak"] == peak(model, ins, ins.training)
    assert ins.findings == ins.controller.findings and ins.summary["revision"] == ins.controller.revision


def test_cancel_stops_the_work_and_says_so(ins, monkeypatch):
    from shardviz.widget import panels

    started = threading.Event()

    real = panels.findings_payload

    def endless(analysis, first=False):
        if first:
            return real(analysis, first)
        started.set()
        while True:
            stop.check()  # as a measurement checks at each operation it dispatches
            time.sleep(0.01)

    monkeypatch.setattr(panels, "findings_payload", endless)
    assert ins.handle_action("apply_preset", {"name": "ignored"})["ok"]
    assert started.wait(60)
    ack = ins.handle_action("cancel", {})
    assert ack["ok"] and not ins.pushes.worker.busy and ins.work["busy"] is False
    assert "cancelled" in ins.messages[-1]["text"]
    monkeypatch.undo()
    assert ins.handle_action("undo", {})["ok"] and ins.wait(120)  # the widget goes on as before
    assert ins.summary["findings_stale"] is False


def test_suggest_runs_in_the_background_and_can_be_cancelled(ins, monkeypatch):
    import shardviz.widget.suggest as suggest

    started = threading.Event()

    def endless(*args, progress, **kwargs):
        started.set()
        while True:  # a candidate analysed, then the progress callback, where a cancel stops the search
            time.sleep(0.01)
            progress(0, 1)

    monkeypatch.setattr(suggest, "search", endless)
    t0 = time.perf_counter()
    assert ins.handle_action("suggest", {})["ok"]
    assert time.perf_counter() - t0 < 1 and started.wait(60)
    assert ins.suggestions["state"] == "running" and ins.work["label"] == "searching plans"
    assert ins.handle_action("cancel", {})["ok"]
    assert ins.suggestions["state"] == "cancelled" and "cancelled" in ins.suggestions["error"]


def test_without_device_memory_suggest_is_disabled_and_says_why(model):
    ins = Inspector(model, mesh=sv.Mesh(shard=4), background=True)
    assert ins.wait(120)  # the Suggest panel's state is sent with the findings, by the worker
    assert ins.suggestions["needs_memory"] is True
    ack = ins.handle_action("suggest", {})
    assert not ack["ok"] and "needs the device memory" in ack["error"]


def test_the_first_findings_come_before_the_what_ifs_are_priced(model, monkeypatch):
    """Findings are never stale while SV201's what-ifs run: the worker sends the findings that need
    no what-if first (``InspectorState.first_findings``, SV201 marked pending, the card saying so),
    then the priced ones, which replace them."""
    from shardviz.widget import panels

    ins = Inspector(model, mesh=sv.Mesh(shard=4, device_memory="1MiB", memory_reserve=0), training=TRAINING,
                    background=True)
    assert ins.wait(120)
    real, release = panels.findings_payload, threading.Event()

    def held(analysis, first=False):
        if not first:
            assert release.wait(60)  # the what-ifs take seconds at 70B
        return real(analysis, first)

    monkeypatch.setattr(panels, "findings_payload", held)
    assert ins.handle_action("set_training", {"seq_len": 96})["ok"]
    deadline = time.time() + 60
    while ins.summary.get("findings_stale", True) and time.time() < deadline:
        time.sleep(0.05)
    sv201 = next(f for f in ins.findings if f["code"] == "SV201")
    assert sv201["pending"] and ins.summary["findings_pricing"] and ins.work["busy"]
    assert ins.summary["card"]["finding"]["pending"] and ins.summary["revision"] == ins.controller.revision
    release.set()
    assert ins.wait(120)
    assert ins.findings == ins.controller.findings and not any(f["pending"] for f in ins.findings)
    assert not ins.summary["findings_pricing"] and not ins.summary["card"]["finding"]["pending"]
