"""Issue 35, "the search's rows are analyze's numbers": a row of ``sv.search`` re-analysed with
``sv.analyze`` (its plan, mesh and training from ``Search.candidate``) gives every figure the row
shows; and an offloaded row (its calls carry ``sv.Unit(offload=True)``) is priced as the same plan
with ``Training(offload=True)``.

The limit is made from torch's own numbers (the tiny Llama + LoRA's peaks), never typed: between
the blocks-checkpointed peak and a quarter below it, where the search reaches for CPU offload,
HSDP splits, tensor parallelism and gradient accumulation."""

from __future__ import annotations

import functools
import math
from dataclasses import replace

import pytest

import shardviz as sv
from shardviz import zoo

ALLOCATED = {"memory_reserve": 0, "judge": "allocated", "safety_margin": 0.0}
MESH = sv.Mesh(8, device="H100", ranks_per_node=4, **ALLOCATED)
TRAINING = sv.Training(batch_size=1, seq_len=128, global_batch=16)
NUMBERS = ("step_time_s", "tokens_per_s", "mfu", "peak", "reserved_peak", "margin")


@functools.lru_cache(maxsize=None)
def model():
    return zoo.tiny_llama_lora()


@functools.lru_cache(maxsize=None)
def tight():
    m, one = model(), replace(TRAINING, global_batch=None)
    peak = lambda plan: int(sv.analyze(m, plan, MESH, one).memory.peak.max())  # noqa: E731
    plain, blocks = peak(sv.Plan.auto(m, lora="sharded")), peak(sv.Plan.auto(m, lora="sharded", checkpoint="blocks"))
    return sv.search(m, replace(MESH, device_memory=blocks - (plain - blocks) // 4), TRAINING, tensor=(1, 2))


def shown(a) -> dict:
    """What a search row shows, read from the analysis."""
    return {"step_time_s": a.step.step_time_s, "tokens_per_s": a.step.tokens_per_s, "mfu": a.step.mfu,
            "peak": int(a.memory.peak.max()), "reserved_peak": int(a.memory.reserved_peak.max()),
            "margin": a.fit.margin, "verdict": a.fit.verdict, "fits": a.fit.fits}


def chosen_rows(table) -> list[int]:
    """The first analysed rows, and the first analysed row of each kind the issue names."""
    analysed = table[table.analysed]
    kinds = [analysed.offload, analysed.replicate > 1, analysed.get("tensor", analysed.replicate * 0) > 1,
             analysed.grad_accum > 1, ~analysed.offload]
    picked = list(analysed.index[:4])
    for kind in kinds:
        assert kind.any(), "the space should hold offload, HSDP, TP and accumulation rows"
        picked.append(analysed.index[kind.to_numpy()][0])
    return sorted(set(picked))


def test_search_rows_are_analyze_numbers():
    s = tight()
    table = s.table
    for i in chosen_rows(table):
        plan, mesh, training = s.candidate(i)
        a = sv.analyze(model(), plan, mesh, training)
        row, want = table.loc[i], shown(a)
        for key in NUMBERS:
            assert row[key] == pytest.approx(want[key], rel=1e-12), (row["name"], key)
        assert (row["verdict"], bool(row["fits"])) == (want["verdict"], want["fits"]), row["name"]
        assert not any(isinstance(row[k], float) and math.isnan(row[k]) for k in NUMBERS)


def test_an_offload_row_is_the_plan_with_training_offload():
    """The search offloads by the calls (``sv.Unit(offload=True)``); the same plan without it on the
    calls and with ``Training(offload=True)`` is one run with one price."""
    s = tight()
    table = s.table
    i = table.index[(table.analysed & table.offload).to_numpy()][0]
    plan, mesh, training = s.candidate(i)
    assert all(u.offload for u in plan.units) and not training.offload
    other = plan.with_units([sv.Unit(u.modules, u.reshard_after_forward, u.param_dtype, u.reduce_dtype, False)
                             for u in plan.units])
    by_units, by_training = sv.analyze(model(), plan, mesh, training), sv.analyze(model(), other, mesh,
                                                                                  replace(training, offload=True))
    assert shown(by_units) == shown(by_training)
    assert table.loc[i, "step_time_s"] == pytest.approx(by_training.step.step_time_s, rel=1e-12)
    cpu = [c for c in by_units.memory.columns if c.startswith("cpu")]
    assert cpu and by_units.memory[cpu].equals(by_training.memory[cpu])
    host = lambda a: [e for e in a.step_time.schedule.events if e.kind == "optimizer"]  # noqa: E731
    assert [(e.start_s, e.end_s) for e in host(by_units)] == [(e.start_s, e.end_s) for e in host(by_training)]
