"""``sv.search(..., workers=2)``: the analyses made by this process and a forked copy of it, each
claiming the next candidate (and its CPU-offload twin) from one pipe; then one pass over every
candidate with all of them (``search.running``). The Inspector's Suggest click runs it (issue 37:
Suggest within 5 s back to back at 70B).

What is held, against the one-process search as the oracle: the same table, typed rows and
analyses counted; the copy really analysed a share, and the steps it measured are kept here; the
copy failing or being stopped leaves the rows (or the stop) those of one process."""

from __future__ import annotations

import hashlib
import os
import pickle
import time
from dataclasses import replace

import pandas as pd
import pytest

import shardviz as sv
from shardviz import forked, zoo
from shardviz.activations import clear_cache, measure_cache, stop
from shardviz.activations import measure as measure_mod
from shardviz.search import running

pytestmark = pytest.mark.skipif(not forked.available(), reason="fork: Linux only")

MESH = sv.Mesh(8, device="H100", memory_reserve=0, judge="allocated", safety_margin=0.0)
TRAINING = sv.Training(batch_size=2, seq_len=256, param_dtype=None, reduce_dtype=None)


@pytest.fixture(scope="module")
def model():
    return zoo.tiny_llama_lora()


@pytest.fixture(scope="module")
def mesh(model):
    """Device memory between the plain and the all-checkpointed plan's peak: some plans fit, some are
    pruned (by every rule the evidence holds: more replicas, checkpointing less, offload needless)."""
    def peak(ckpt):
        return int(sv.analyze(model, sv.Plan.auto(model, checkpoint=ckpt), MESH, TRAINING).memory.peak.max())
    return replace(MESH, device_memory=(peak(None) + peak("blocks")) // 2)


@pytest.fixture
def copies(monkeypatch):
    """Every copy the search forks."""
    made, real = [], forked.Forked
    monkeypatch.setattr(running.forked, "Forked", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    return made


def _logged(monkeypatch, tmp_path, module, name: str):
    """``module.name`` made to append the pid of the process calling it to a file: calls in the copy
    are seen here. Returns a function reading the pids logged so far."""
    path, real = tmp_path / f"{name}.pids", getattr(module, name)

    def logged(*a, **k):
        with open(path, "a") as f:
            f.write(f"{os.getpid()}\n")
        return real(*a, **k)

    monkeypatch.setattr(module, name, logged)
    return lambda: path.read_text().split() if path.exists() else []


def _steps_measured(monkeypatch, tmp_path):
    """Each step measured (``measure_once`` running its ``measure``), by any process, as "pid key-hash"."""
    path, real = tmp_path / "steps", measure_mod.measure_once

    def measure_once(key, measure):
        def logged():
            digest = hashlib.sha1(pickle.dumps(key, protocol=pickle.HIGHEST_PROTOCOL)).hexdigest()
            with open(path, "a") as f:
                f.write(f"{os.getpid()} {digest}\n")
            return measure()
        return real(key, logged)

    monkeypatch.setattr(measure_mod, "measure_once", measure_once)
    return lambda: [tuple(line.split()) for line in path.read_text().splitlines()] if path.exists() else []


def test_two_cores_give_the_rows_of_one(model, mesh, copies, monkeypatch, tmp_path):
    analysed = _logged(monkeypatch, tmp_path, running, "measured")
    measured = _steps_measured(monkeypatch, tmp_path)
    clear_cache()
    two = sv.search(model, mesh=mesh, training=TRAINING, tensor=(1, 2), workers=2)
    assert len(copies) == 1 and copies[0].ok
    assert {str(copies[0].pid), str(os.getpid())} <= set(analysed())  # both analysed a share
    steps_two = measured()
    # each step measured once, by one of the two (measure_cache.measure_once)
    assert len({key for _, key in steps_two}) == len(steps_two) and len({pid for pid, _ in steps_two}) == 2
    # what the copy measured is kept here: no analysed plan's step is measured again
    for i, r in enumerate(two.rows):
        if r.analysed:
            sv.analyze(model, *two.candidate(i)).memory  # noqa: B018
    assert measured() == steps_two
    clear_cache()
    one = sv.search(model, mesh=mesh, training=TRAINING, tensor=(1, 2))
    assert len(copies) == 1  # workers=1: no copy
    # what one process measures, the two did (they may measure more: a plan one prunes with evidence the
    # other found is analysed there, and the pass over all of them prunes it again)
    assert {key for _, key in measured()[len(steps_two):]} <= {key for _, key in steps_two}
    assert not one.table.analysed.all() and one.table.analysed.any()  # the premise: some are pruned
    assert {r.rule for r in one.rows if not r.analysed} >= {running.Rule.OFFLOAD_NEEDLESS}
    assert (two.n_candidates, two.n_analysed) == (one.n_candidates, one.n_analysed)
    pd.testing.assert_frame_equal(two.table, one.table)
    assert [(type(r), r.candidate, r.fits) for r in two.rows] == [(type(r), r.candidate, r.fits) for r in one.rows]


def test_a_step_both_processes_need_is_measured_once(tmp_path):
    """The first to claim a step measures it; the other waits and reads it (the same value)."""
    calls = tmp_path / "calls"

    def slow():
        with open(calls, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(0.5)
        return {"peak": 123, "by": os.getpid()}

    parent = os.getpid()

    def elsewhere():
        with measure_cache.shared_between(str(tmp_path), lambda: os.getppid() == parent):
            return measure_cache.measure_once(("step", 1), slow)

    copy = forked.Forked(elsewhere)
    with measure_cache.shared_between(str(tmp_path), lambda: not copy.done.is_set()):
        mine = measure_cache.measure_once(("step", 1), slow)
    assert copy.done.wait(30) and copy.ok
    assert copy.result == mine and len(calls.read_text().split()) == 1


def test_a_step_the_other_failed_or_left_is_measured_here(tmp_path):
    def fails():
        raise ValueError("no forward of LlamaForCausalLM runs")

    parent = os.getpid()

    def elsewhere():
        with measure_cache.shared_between(str(tmp_path), lambda: os.getppid() == parent):
            return measure_cache.measure_once(("step", 2), fails)

    copy = forked.Forked(elsewhere)
    assert copy.done.wait(30) and "no forward" in copy.error  # it claimed the step, and failed
    with measure_cache.shared_between(str(tmp_path), lambda: False):
        assert measure_cache.measure_once(("step", 2), lambda: "measured here") == "measured here"
        # claimed by a process that ended without sending it: measured here, no wait
        key = ("step", 3)
        name = hashlib.sha1(pickle.dumps(key, protocol=pickle.HIGHEST_PROTOCOL)).hexdigest()
        (tmp_path / f"{name}.claim").write_text("")
        assert measure_cache.measure_once(key, lambda: "measured here too") == "measured here too"


def test_a_copy_that_fails_leaves_its_share_to_this_process(model, mesh, copies, monkeypatch):
    parent, real = os.getpid(), running._evaluate

    def evaluate(*a):
        if os.getpid() != parent:
            raise RuntimeError("the copy died")
        return real(*a)

    monkeypatch.setattr(running, "_evaluate", evaluate)
    two = sv.search(model, mesh=mesh, training=TRAINING, workers=2)
    assert copies[0].done.wait(10) and "the copy died" in copies[0].error
    one = sv.search(model, mesh=mesh, training=TRAINING)
    pd.testing.assert_frame_equal(two.table, one.table)


def test_a_search_over_micro_batches_runs_in_one_process(model, copies):
    """With ``global_batch`` a micro-batch with which nothing fits prunes every larger one, across
    layouts and degrees: the search stays in one process."""
    training = replace(TRAINING, batch_size=None, global_batch=32)
    s = sv.search(model, mesh=replace(MESH, device_memory="80GiB"), training=training, workers=2)
    assert len(set(s.table.batch_size)) > 1 and copies == []


def test_a_search_stopped_while_the_copy_works_kills_it(model, copies, monkeypatch):
    parent, real = os.getpid(), running._evaluate
    monkeypatch.setattr(running, "_evaluate", lambda *a: time.sleep(600) if os.getpid() != parent else real(*a))

    def progress(done, total):
        if copies and time.time() - t0 > 1:
            raise stop.Stopped

    t0 = time.time()
    with pytest.raises(stop.Stopped):
        sv.search(model, mesh=replace(MESH, device_memory="80GiB"), training=TRAINING, progress=progress, workers=2)
    assert copies[0].done.wait(10) and copies[0].error == "killed"
    assert copies[0].ended.wait(10)


def test_without_fork_two_workers_run_in_one_process(model, mesh, copies, monkeypatch):
    monkeypatch.setenv("SHARDVIZ_FORK", "0")
    s = sv.search(model, mesh=mesh, training=TRAINING, workers=2)
    assert copies == [] and s.table.analysed.any()


def _first_level_and_later_leads(model, mesh):
    """The search's space, its candidates in pruning order, the first level's first candidate
    (LoRA sharded) and the first candidate of each later level and layout (``running.measure_ahead``'s)."""
    from shardviz.search import _space, candidates
    from shardviz.search.pruning import activation_level, pruning_order

    space, _ = _space(model, mesh, TRAINING, (False, True), (1,))
    order = pruning_order(candidates(space))
    level0 = activation_level(order[0])
    later = list({(activation_level(c), c.lora): c for c in order if activation_level(c) != level0}.values())
    return space, order[0], later


def test_measuring_ahead_measures_the_step_a_later_level_needs(model, mesh, monkeypatch, tmp_path):
    """Once the first level's plan of a layout fits, the first later plan of that layout the evidence
    does not prune is measured ahead: its analysis then measures nothing."""
    from shardviz.search.pruning import Evidence, pruned_by

    measured = _steps_measured(monkeypatch, tmp_path)
    clear_cache()
    space, first, later = _first_level_and_later_leads(model, mesh)
    ev = Evidence()
    assert running._evaluate(space, ev, first, {}).fits  # the premise: the first level fits (this mesh)
    before = len(measured())
    ahead = running.measure_ahead(space, ev, later)
    assert ahead is not None and ahead.lora == first.lora and ahead.checkpoint != first.checkpoint
    assert pruned_by(space, ev, ahead) is None
    assert len(measured()) == before + 1  # its step, measured now
    space.analysis(ahead).memory  # noqa: B018
    assert len(measured()) == before + 1  # and not again when its level comes


def test_nothing_is_measured_ahead_for_a_layout_not_known_to_fit(model, mesh, monkeypatch, tmp_path):
    from shardviz.search.pruning import Evidence

    measured = _steps_measured(monkeypatch, tmp_path)
    clear_cache()
    space, first, later = _first_level_and_later_leads(model, mesh)
    assert running.measure_ahead(space, Evidence(), later) is None  # nothing analysed yet: no guess
    small = replace(mesh, device_memory=mesh.device_memory // 4)  # the first level is over this device
    space, first, later = _first_level_and_later_leads(model, small)
    ev = Evidence()
    assert not running._evaluate(space, ev, first, {}).fits
    before = len(measured())
    assert running.measure_ahead(space, ev, later) is None and len(measured()) == before


def test_plan_search_on_the_command_line_runs_on_two_cores(model, mesh, copies, tmp_path, capsys):
    """``shardviz plan search`` analyses on two cores, and writes the plan one process finds."""
    from shardviz.cli import main

    out = tmp_path / "plan.json"
    rc = main(["plan", "search", "zoo:tiny_llama_lora", "--world-size", "8", "--device", "H100",
               "--device-memory", f"{mesh.device_memory}B", "--memory-reserve", "0", "--judge", "allocated",
               "--safety-margin", "0", "--batch-size", str(TRAINING.batch_size), "--seq-len", str(TRAINING.seq_len),
               "--param-dtype", "none", "--reduce-dtype", "none", "-o", str(out)])
    assert rc == 0 and "shardviz: Run LoRA" in capsys.readouterr().err
    assert len(copies) == 1 and copies[0].ok
    assert sv.Plan.from_json(out.read_text()) == sv.search(model, mesh=mesh, training=TRAINING).best


def test_steps_the_copy_measures_on_a_tensor_parallel_copy_come_back(model, mesh, copies, monkeypatch, tmp_path):
    """Every plan at TP 2: each step is measured on one tensor rank's local copy of the model (made once
    per degree). Those the forked copy measured are kept here too: analysing the rows again measures
    nothing. This process analyses nothing while the copy runs (it takes a claim now and then), so the
    copy's steps reach it only as the copy's results."""
    measured = _steps_measured(monkeypatch, tmp_path)
    parent, real = os.getpid(), running._evaluate
    monkeypatch.setattr(running, "_evaluate", lambda *a: time.sleep(0.5) if os.getpid() == parent and not copies[0].done.is_set()
                        else real(*a))
    clear_cache()
    two = sv.search(model, mesh=mesh, training=TRAINING, tensor=(2,), workers=2)
    assert copies[0].ok and set(two.table.tensor) == {2}
    steps = measured()
    assert str(copies[0].pid) in {pid for pid, _ in steps}  # the premise: the copy measured some
    for i, r in enumerate(two.rows):
        if r.analysed:
            sv.analyze(model, *two.candidate(i)).memory  # noqa: B018
    assert measured() == steps
