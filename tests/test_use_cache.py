"""Issue 24: ``Training(use_cache=...)``: the rule, the knob in the search and SV201, the exported
code, and what-ifs that never crash an analysis."""

from __future__ import annotations

import pytest

import shardviz as sv
from shardviz import zoo

MESH = sv.Mesh(4)
STEP = sv.Training(batch_size=2, seq_len=64)


def test_training_use_cache_is_validated_and_resolved():
    with pytest.raises(ValueError, match="Training.use_cache must be None"):
        sv.Training(use_cache="yes")
    model = zoo.tiny_llama_lora()
    assert model.config.use_cache
    plain, ckpt = sv.Plan.auto(model), sv.Plan.auto(model, checkpoint="blocks")
    resolved = {(p is ckpt, uc): sv.analyze(model, p, MESH, sv.Training(use_cache=uc)).use_cache
                for p in (plain, ckpt) for uc in (None, True, False)}
    assert resolved == {(False, None): True, (False, True): True, (False, False): False,
                        (True, None): False, (True, True): True, (True, False): False}
    model.config.use_cache = False
    assert not sv.analyze(model, plain, MESH).use_cache


def test_the_exported_code_runs_the_step_priced():
    """With checkpointing the step priced keeps no cache: the exported apply_fsdp turns the config's off."""
    model = zoo.tiny_llama_lora()
    line = "model.config.use_cache = False"
    assert line in sv.export_code(model, sv.Plan.auto(model, checkpoint="blocks"), mesh=MESH)
    assert line not in sv.export_code(model, sv.Plan.auto(model), mesh=MESH)
    assert line not in sv.export_code(model, sv.Plan.auto(model, checkpoint="blocks"), mesh=MESH,
                                      training=sv.Training(use_cache=True))
    assert line in sv.export_code(model, sv.Plan.auto(model), mesh=MESH, training=sv.Training(use_cache=False))


def test_the_search_treats_the_cache_as_a_knob():
    model = zoo.tiny_llama_lora()
    s = sv.search(model, mesh=sv.Mesh(2, device_memory="1GiB", memory_reserve=0), training=STEP, offload=(False,))
    t = s.table
    plain = t[t.checkpoint.isna()]
    assert set(plain.use_cache) == {True, False}
    assert plain[~plain.use_cache.astype(bool)].name.str.endswith("use_cache=False").all()
    assert not t[t.checkpoint.notna()].use_cache.astype(bool).any()  # checkpointed: HF's rule, no cache
    # the use_cache=False row is that plan priced without the cache
    row = plain[plain.name.str.endswith("use_cache=False") & plain.analysed].iloc[0]
    i = int(row.name)
    plan, mesh, training = s.candidate(i)
    assert training.use_cache is False
    assert int(sv.analyze(model, plan, mesh, training).memory.peak.max()) == row.peak


def test_a_what_if_that_fails_is_a_line_in_the_finding(monkeypatch):
    """SV201 prices its fixes with what-ifs; one that raises (before issue 24: Gemma-2's checkpointed
    step) is 'not priced' in the fix, and the analysis has its findings."""
    model = zoo.tiny_llama_lora()
    a = sv.analyze(model, sv.Plan.auto(model, lora="ignored"), sv.Mesh(4, device_memory="1MiB", memory_reserve=0), STEP)
    original = sv.Analysis.price

    def price(self, plan=None, mesh=None, training=None, **figures):
        if plan is not None and plan.checkpoint:
            raise RuntimeError("recomputation failed")
        return original(self, plan, mesh, training, **figures)

    monkeypatch.setattr(sv.Analysis, "price", price)
    sv201 = [f for f in a.findings if f.code == "SV201"]
    assert len(sv201) == 1
    assert "could not be priced (RuntimeError: recomputation failed)" in sv201[0].fix


def test_cli_selective_checkpointing_with_the_config_s_cache_answers(tmp_path, capsys):
    """`--checkpoint selective` on a config that keeps use_cache=True was a traceback (torch's
    selective checkpointing cannot run with the cache); now the step runs without it (HF's rule),
    and `--use-cache` asks for it: priced without, SV113 says why."""
    from shardviz import cli

    for extra in ([], ["--use-cache"]):
        target = tmp_path / f"report{len(extra)}.html"
        code = cli.main(["report", "zoo:tiny_llama_lora", "--world-size", "2", "--checkpoint", "selective",
                         "--batch-size", "1", "--seq-len", "64", "--no-compare", "-o", str(target), *extra])
        out, err = capsys.readouterr()
        assert code == 0 and "Traceback" not in out + err, err
        assert ("SV113" in target.read_text()) == bool(extra)


def test_the_cache_refusal_is_part_of_the_measured_step():
    """Why a step was measured without the cache belongs to the activation stage (a frozen
    ``MeasuredStep``), set once when it is measured; the analysis only reads it."""
    import dataclasses

    model = zoo.tiny_llama_lora()
    a = sv.analyze(model, sv.Plan.auto(model, checkpoint="selective"), MESH, sv.Training(batch_size=1, seq_len=16,
                                                                                          use_cache=True))
    assert a.cache_refused and a.cache_refused == a.measured_step.cache_refused
    with pytest.raises(AttributeError):
        a.cache_refused = None
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.measured_step.cache_refused = None
    assert a.cache == sv.activations.step_cache(model, a.training, True) and a.cache.use_cache


def test_plans_on_one_step_share_its_noted_profile():
    """The config's cache adds a note to the measured profile's assumptions. Every plan of that step
    gets one noted copy, so what a plan reads of the profile (its run order, FLOPs and op costs per
    subtree) is derived once: a fresh copy per plan made a.step after a change of plan ~10x slower."""
    model = zoo.tiny_llama_lora()
    plan = sv.Plan.auto(model)
    a = sv.analyze(model, plan, MESH, STEP)
    b = sv.analyze(model, plan.without_unit(plan.units[1].modules[0]), MESH, STEP)
    assert a.cache.why and a.cache.why in a.activation_profile.assumptions
    assert b.activation_profile is a.activation_profile
    a.step, b.step  # noqa: B018 - both read the profile's indexes
    assert b.activation_profile.flop_index is a.activation_profile.flop_index
    other = sv.analyze(model, plan, MESH, sv.Training(batch_size=2, seq_len=64, use_cache=False))
    assert a.cache.why not in other.activation_profile.assumptions
