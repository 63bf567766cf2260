"""Issue 35, "two default trainings": ``sv.Training()``'s field defaults are the one training every
entry point assumes (``DEFAULT_TRAINING``): ``sv.analyze``, the report, ``compare``, ``search`` and the
Inspector give the same peak for the same fp32 model and plan when no training is given."""

from dataclasses import fields

import pytest
import torch

import shardviz as sv
from shardviz import report, zoo
from shardviz.run.training import DEFAULT_TRAINING
from shardviz.widget.controller import InspectorState


@pytest.fixture(scope="module")
def model():
    m = zoo.tiny_llama_lora(lora=False)
    assert {p.dtype for p in m.parameters()} == {torch.float32}  # mixed precision changes its peak
    return m


def test_training_defaults_are_the_one_default():
    assert sv.Training() == DEFAULT_TRAINING
    assert (sv.Training().param_dtype, sv.Training().reduce_dtype) == ("bfloat16", "float32")
    off = sv.Training(param_dtype=None, reduce_dtype=None)  # explicit None: no MixedPrecisionPolicy
    assert (off.param_dtype, off.reduce_dtype) == (None, None)
    assert {f.name: f.default for f in fields(sv.Training) if f.name.endswith("_dtype")} == {
        "optimizer_dtype": None, "param_dtype": "bfloat16", "reduce_dtype": "float32"}


def test_every_surface_gives_one_peak_without_a_training(model, monkeypatch):
    mesh = sv.Mesh(4, device="H100")
    plain = sv.analyze(model, sv.Plan.auto(model), mesh)
    assert plain.training == DEFAULT_TRAINING
    peak = int(plain.memory.peak.max())
    no_policy = sv.analyze(model, sv.Plan.auto(model), mesh, sv.Training(param_dtype=None, reduce_dtype=None))
    assert int(no_policy.memory.peak.max()) != peak  # the default is felt on an fp32 model

    seen = []
    real = report.analyze
    monkeypatch.setattr(report, "analyze", lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
    report.render_report(model, sv.Plan.auto(model), mesh)
    assert int(seen[0].memory.peak.max()) == peak

    c = sv.compare(model, {"auto": sv.Plan.auto(model)}, mesh=mesh)
    assert int(c.analyses["auto"].memory.peak.max()) == peak
    assert int(c.table.loc["auto", "peak"]) == peak  # the table compare shows

    state = InspectorState(model, sv.Plan.auto(model), mesh)
    assert state.training == DEFAULT_TRAINING
    assert int(state.analysis.memory.peak.max()) == peak

    s = sv.search(model, mesh, offload=(False,))
    plan, row_mesh, chosen = s.candidate(0)
    assert chosen == DEFAULT_TRAINING
    assert int(s.table.peak.iloc[0]) == int(sv.analyze(model, plan, row_mesh).memory.peak.max())
