"""``sv.search``: the fastest plan that fits, its reasons, and what to do when nothing fits.

Every device limit here is made from torch's own numbers (a preset's measured peak), never written
by hand: the tiny Llama + LoRA with a micro-batch whose activations dominate, so that the limit bites.
"""

from __future__ import annotations

import functools
import gc
import importlib
import weakref
from dataclasses import fields, replace

import pytest

import shardviz as sv
from shardviz import activations, zoo
from shardviz.format import format_percent, format_rate
from shardviz.search import step_numbers

BATCH, SEQ = 2, 256
# memory_reserve=0: the limits below are the tiny model's own peaks, in bytes (the reserve is tested below);
# judged on those allocated peaks without a safety margin (test_search_margin.py tests the reserved peak
# and the margin: a few-MiB model's reserved peak is its 2 and 20 MiB segments)
ALLOCATED = {"memory_reserve": 0, "judge": "allocated", "safety_margin": 0.0}
MESH = sv.Mesh(8, device="H100", **ALLOCATED)
# no mixed precision (each parameter in its own dtype): the limits below were drawn for it, and the
# command-line test says so with --param-dtype none --reduce-dtype none
TRAINING = sv.Training(batch_size=BATCH, seq_len=SEQ, param_dtype=None, reduce_dtype=None)


@functools.lru_cache(maxsize=None)
def model():
    return zoo.tiny_llama_lora()


def peak(plan, mesh=MESH, training=TRAINING) -> int:
    return int(sv.analyze(model(), plan, mesh, training).memory.peak.max())


@functools.lru_cache(maxsize=None)
def limits() -> dict:
    m = model()
    plain = peak(sv.Plan.auto(m, lora="sharded"))
    blocks = peak(sv.Plan.auto(m, lora="sharded", checkpoint="blocks"))
    assert blocks < plain
    return {"between": (plain + blocks) // 2, "roomy": 4 * plain}


@functools.lru_cache(maxsize=None)
def found(limit: str, training=TRAINING, offload=(False, True), world: int = 8):
    mesh = replace(MESH, shard=world, device_memory=limits()[limit] if limit in limits() else limit)
    return sv.search(model(), mesh=mesh, training=training, offload=offload)


@pytest.mark.parametrize("limit", ["between", "roomy"])
def test_the_best_plan_reanalysed_fits(limit):
    s = found(limit)
    # the fastest, or within 1 % of it and picked for its margin or its simplicity (rank.ranked)
    assert s.fits and s.table.fits.iloc[0] and s.table.why.iloc[0].startswith(("fastest that fits", "a tie with the fastest"))
    a = sv.analyze(model(), s.best, s.best_mesh, s.best_training or TRAINING)
    assert int(a.memory.peak.max()) == s.table.peak.iloc[0] <= s.device_memory
    assert isinstance(s.best, sv.Plan) and s.best.name.startswith("search: ")
    assert sv.Plan.from_json(s.best.to_json()) == s.best


@pytest.mark.parametrize("limit", ["between", "roomy"])
def test_no_preset_that_fits_is_faster_than_the_best(limit):
    s = found(limit)
    best = s.table.step_time_s.iloc[0]
    mesh = replace(s.best_mesh, shard=8, replicate=1)
    checked = 0
    for lora in ("ignored", "sharded", "separate"):
        for checkpoint in (None, "blocks"):
            a = sv.analyze(model(), sv.Plan.auto(model(), lora=lora, checkpoint=checkpoint), mesh, TRAINING)
            if int(a.memory.peak.max()) <= s.device_memory:
                checked += 1
                assert step_numbers(a)["step_time_s"] >= best - 1e-12, (lora, checkpoint)
    assert checked >= 3


def test_when_nothing_fits_without_checkpointing_the_best_checkpoints():
    s = found("between")
    t = s.table
    assert not t[t.checkpoint.isna()].fits.any()  # the premise: no plan without checkpointing fits
    assert s.best.checkpoint and t.checkpoint.iloc[0] is not None
    # and the rows that lose say why: over the limit by how much, or what costs them time
    over = t[~t.fits & t.analysed]
    assert len(over) and over.why.str.match(r"over \d+\.\d\d MiB by \d+\.\d\d [KM]iB").all()
    fitting = t[t.fits].iloc[1:]
    # in % of the step: a tie (within 1 %) and what decided it, or slower by more and what costs the time
    assert fitting.why.str.contains(r"\d % (?:slower|faster) \(a tie: within 1 %\), with |\d % slower: |CPU offload").all()


def test_plans_that_cannot_fit_are_pruned_not_measured():
    s = found("between")
    t = s.table
    assert s.n_candidates >= 100 and s.n_analysed < s.n_candidates
    pruned = t[~t.analysed & ~t.fits]  # cannot fit: the reason, no numbers
    # the config keeps use_cache=True: torch's selective checkpointing raises in that step (SV113, issue 20)
    refused = pruned.why.str.startswith("torch would refuse it")
    assert (pruned[refused].checkpoint == "selective").all() and pruned[refused].why.str.contains("SV113").all()
    pruned = pruned[~refused]
    assert len(pruned) and pruned.why.str.contains(
        "checkpoints less|model state alone|activations alone|unsharded parameters alone|replicas already").all()
    assert pruned.step_time_s.isna().all()
    slower = t[~t.analysed & t.fits]  # fit, but only by adding CPU offload to a plan that fits without it
    assert slower.offload.all() and slower.why.str.contains("without CPU offload, which fits too").all()
    assert (t.index[t.fits & t.analysed].max() < slower.index).all()  # below every analysed fitting plan


def test_the_analyses_of_a_search_are_freed_as_it_goes_not_left_to_the_cyclic_gc(monkeypatch):
    """An analysis the search has read its row from is freed by reference counting the moment it is
    dropped: no cycle keeps it (and its schedule's ~10,000 objects at 70B) for the cyclic gc, whose
    full collections cost ~0.4 s each on a 70B model's 800k tracked objects (issue 37)."""
    space = importlib.import_module("shardviz.search.space")
    made, analysis = [], space.Space.analysis

    def kept(self, *args, **kwargs):
        a = analysis(self, *args, **kwargs)
        made.append(weakref.ref(a))
        return a

    monkeypatch.setattr(space.Space, "analysis", kept)
    mesh = replace(MESH, device_memory=limits()["between"])
    gc.collect()
    gc.disable()
    try:
        s = sv.search(model(), mesh=mesh, training=TRAINING)
        assert s.n_analysed > 10 and len(made) >= s.n_analysed - 3  # the state floors are analyses too
        alive = [r for r in made if r() is not None]
    finally:
        gc.enable()
    assert not alive


def test_two_searches_at_once_leave_full_collections_as_they_were():
    """A search turns full collections off while it runs (``collector.quiet``). Two at once (the
    Inspector's look-ahead and a click, on two threads) may end in either order: the collector's
    thresholds must come back as they were, and stay off while one still runs."""
    from shardviz.collector import quiet

    before = gc.get_threshold()
    first, second = quiet(), quiet()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # the first to start ends first
    assert gc.get_threshold()[2] > before[2]  # the second still runs: still off
    second.__exit__(None, None, None)
    assert gc.get_threshold() == before


def test_plans_that_differ_only_in_mesh_reshard_or_offload_share_one_measurement(monkeypatch):
    """The activations are measured once per LoRA layout x checkpointing x micro-batch x cache, and
    every HSDP split, reshard and offload option of it reads that one measurement (issue 37)."""
    measure = importlib.import_module("shardviz.activations.measure")
    runs, run = [], measure.measure_copy
    monkeypatch.setattr(measure, "measure_copy", lambda *a, **k: runs.append(a[5]) or run(*a, **k))
    activations.clear_cache()
    s = sv.search(model(), mesh=replace(MESH, device_memory=limits()["between"]), training=TRAINING)
    t = s.table[s.table.analysed]
    layouts = {(r.lora, r.checkpoint, r.batch_size, r.use_cache) for r in t.itertuples()}
    assert len(t) > 2 * len(layouts)  # many plans per layout were priced ...
    assert 0 < len(runs) <= len(layouts)  # ... each layout's step measured at most once


def test_each_row_is_typed_and_each_pruned_row_names_its_rule():
    """``Search.rows``: one ``Measured`` or ``Pruned`` per line of the table, in its order; a pruned
    row's ``Rule`` agrees with its words (refused by torch, fits without offload, or over)."""
    from shardviz.search import Measured, Pruned, Rule

    s = found("between")
    assert len(s.rows) == len(s.table)
    for r, (_, line) in zip(s.rows, s.table.iterrows()):
        assert isinstance(r, (Measured, Pruned)) and (r.analysed, r.fits) == (line.analysed, line.fits)
        assert line["name"].startswith(r.candidate.name(8, True, False))
        if isinstance(r, Pruned):
            assert line.why == r.why and line.fits == (r.rule is Rule.OFFLOAD_NEEDLESS)
            assert line.why.startswith("torch would refuse") == (r.rule is Rule.REFUSED)
    rules = {r.rule for r in s.rows if isinstance(r, Pruned)}
    assert Rule.OFFLOAD_NEEDLESS in rules and rules - {Rule.OFFLOAD_NEEDLESS, Rule.REFUSED}  # and plans over


@pytest.mark.parametrize("order", ["reversed", "shuffled"])
def test_pruning_does_not_depend_on_the_order_of_the_candidates(order, monkeypatch):
    """The same candidates given in another order: the same plans analysed, the same pruned with the
    same reasons, the same table (ranking, ties included)."""
    import importlib
    import random

    import pandas as pd

    search_module = importlib.import_module("shardviz.search")  # the package (sv.search is the function)
    given = search_module.candidates

    def reordered(*args, **kwargs):
        cands = given(*args, **kwargs)
        random.Random(0).shuffle(cands) if order == "shuffled" else cands.reverse()
        return cands

    reference = found("between")
    monkeypatch.setattr(search_module, "candidates", reordered)
    s = sv.search(model(), mesh=replace(MESH, shard=8, device_memory=limits()["between"]), training=TRAINING)
    assert s.n_candidates == reference.n_candidates and s.n_analysed == reference.n_analysed
    assert not s.table.analysed.all() and s.table.analysed.any()  # the premise: some are pruned
    pd.testing.assert_frame_equal(s.table, reference.table)


@functools.lru_cache(maxsize=None)
def deep_model():
    """A Llama of 24 small blocks with LoRA, on meta: its parameters, all unsharded at once, are
    more than a step that reshards them holds."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=24, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=256, max_position_embeddings=64,
                      use_cache=False)  # as training sets it: selective checkpointing is then a plan torch runs
    with torch.device("meta"):
        return zoo._add_lora(LlamaForCausalLM(cfg), "CAUSAL_LM", r=8, target_modules="all-linear")


def test_plans_that_keep_unsharded_parameters_are_pruned_only_when_torch_would_not_fit_them():
    """The floor of a plan that does not reshard after forward (``cost.unsharded_bytes``): with a
    device that a resharding plan fills, the search prunes those that keep their unsharded
    parameters, and every one of them, analysed, is indeed over (the analysis agrees with torch's
    tracker, tests/test_cost_truth.py)."""
    m, training = deep_model(), sv.Training(batch_size=1, seq_len=8, param_dtype="bfloat16")
    limit = int(sv.analyze(m, sv.Plan.auto(m, lora="sharded", checkpoint="blocks"), MESH, training).memory.peak.max())
    s = sv.search(m, mesh=replace(MESH, device_memory=limit), training=training, offload=(False,))
    kept = [i for i, why in enumerate(s.table.why) if "unsharded parameters alone" in why]
    assert kept and s.fits
    for i in kept:
        plan, mesh, tr = s.candidate(i)
        assert int(sv.analyze(m, plan, mesh, tr).memory.peak.max()) > limit, s.table.name.iloc[i]


def test_plans_pruned_for_more_replicas_are_indeed_over():
    """A plan over the device on r replicas is pruned on every multiple of r (more replicas, smaller
    shard groups, more per rank): on the 24-block Llama filled by its checkpointed FSDP plan, each
    so pruned, analysed, is over."""
    m, training = deep_model(), sv.Training(batch_size=1, seq_len=8, param_dtype="bfloat16")
    limit = int(sv.analyze(m, sv.Plan.auto(m, lora="sharded", checkpoint="blocks"), MESH, training).memory.peak.max())
    s = sv.search(m, mesh=replace(MESH, device_memory=limit), training=training, offload=(False,))
    more = [i for i, why in enumerate(s.table.why) if "replicas already" in why]
    assert more
    for i in more:
        plan, mesh, tr = s.candidate(i)
        assert int(sv.analyze(m, plan, mesh, tr).memory.peak.max()) > limit, s.table.name.iloc[i]


def test_nothing_fits_names_the_micro_batch_that_would():
    m = model()
    lean = sv.Plan.auto(m, lora="sharded", checkpoint="blocks")
    lean = lean.with_units([sv.Unit(u.modules, offload=True) for u in lean.units])
    one = peak(lean, training=replace(TRAINING, batch_size=1))
    s = found(one, training=replace(TRAINING, batch_size=4))
    assert s.best is None and s.best_training is None and not s.table.fits.any()
    assert s.table.why.iloc[0].startswith(f"nothing fits in {sv.format.format_bytes(one)} on 8 ranks")
    assert "micro-batch 1 fits" in s.table.why.iloc[0] and "micro-batch 1 fits" in s.note


def test_nothing_fits_names_the_world_size_that_would():
    full = zoo.tiny_llama_lora(lora=False)  # every weight trainable: the model state dominates
    state = sv.Training()
    at16 = int(sv.analyze(full, sv.Plan.auto(full), sv.Mesh(16), state).memory.peak.max())
    s = sv.search(full, mesh=sv.Mesh(8, device_memory=at16, **ALLOCATED), training=state, offload=(False,))
    assert s.best is None and "model state alone" in " ".join(s.table.why)
    assert "16 ranks fit" in s.table.why.iloc[0]


def test_global_batch_searches_micro_batch_and_accumulation():
    m = model()
    training = sv.Training(seq_len=SEQ, global_batch=8 * BATCH)  # 2 sequences per rank per step
    s = found("between", training=training)
    assert set(zip(s.table.batch_size, s.table.grad_accum)) == {(1, 2), (2, 1)}
    assert s.fits and s.best_training is not None
    b = s.best_training.batch_size
    assert b * s.best_grad_accum == BATCH == b * s.table.grad_accum.iloc[0]
    a = sv.analyze(m, s.best, s.best_mesh, s.best_training)
    assert int(a.memory.peak.max()) <= s.device_memory


def test_figure_and_formatted_table():
    s = found("between")
    fig = s.figure()
    assert any(shape.type == "line" for shape in fig.layout.shapes)  # the device limit
    assert {tr.name for tr in fig.data} <= {"fits", "does not fit"}
    f = s.formatted()
    assert list(f.columns) == ["name", "fits", "judged_peak", "margin", "step_time_s", "tokens_per_s", "mfu", "why"]
    assert f.fits.iloc[0] == "yes" and f.judged_peak.iloc[0].endswith("iB")


@pytest.mark.parametrize("kwargs,pattern", [
    ({"mesh": sv.Mesh(8)}, r"Mesh.device_memory is needed"),
    ({"mesh": sv.Mesh(8, device_memory="1GiB"), "training": sv.Training(global_batch=12)},
     r"Training.global_batch=12 is not a multiple of the world size 8"),
    ({"mesh": 8}, "mesh must be a shardviz.Mesh"),
])
def test_bad_input_is_named(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        sv.search(model(), **kwargs)


def test_the_model_is_not_changed():
    m = model()
    before = {n: (id(p), p.requires_grad, p.device.type) for n, p in m.named_parameters()}
    found("between")
    assert {n: (id(p), p.requires_grad, p.device.type) for n, p in m.named_parameters()} == before


def test_cli_plan_search_writes_the_best_plan(tmp_path, capsys):
    from shardviz.cli import main

    out = tmp_path / "plan.json"
    limit = f"{limits()['between']}B"  # a bare number is GiB on the command line, as in the widget
    # the same mesh as found()'s (its device times the steps: without it the ranking is another one)
    rc = main(["plan", "search", "zoo:tiny_llama_lora", "--world-size", "8", "--device", "H100", "--device-memory", limit,
               "--memory-reserve", "0", "--judge", "allocated", "--safety-margin", "0",
               "--batch-size", str(BATCH), "--seq-len", str(SEQ), "--param-dtype", "none", "--reduce-dtype", "none",
               "-o", str(out)])  # TRAINING's dtypes: none (the command line's default is DEFAULT_TRAINING's bf16/fp32)
    printed = capsys.readouterr()
    assert rc == 0 and printed.out.startswith("#") and "shardviz: Run LoRA" in printed.err
    assert "It is the fastest of" in printed.err or "It is the first (step times within 1 % are a tie" in printed.err
    plan = sv.Plan.from_json(out.read_text())
    assert plan == found("between").best
    has_devices = "device" in {f.name for f in fields(sv.Mesh)}
    if not has_devices:  # --device is accepted, and refused with a clear error until Mesh(device=...) exists
        assert main(["plan", "search", "zoo:tiny_llama_lora", "--world-size", "8", "--device", "H100"]) == 2
        assert "--device H100: this shardviz has no device table yet" in capsys.readouterr().err
    assert main(["plan", "search", "zoo:tiny_llama_lora", "--world-size", "8"]) == 2
    assert "needs --device or --device-memory" in capsys.readouterr().err


@pytest.mark.slow
def test_llama3_8b_lora_search_fits():
    m = zoo.llama3_8b(lora=True)
    training = sv.Training(optimizer="adamw", param_dtype="bfloat16", reduce_dtype="float32", batch_size=1, seq_len=8192)
    s = sv.search(m, mesh=sv.Mesh(8, device_memory="40GiB"), training=training)
    assert s.fits and s.n_candidates >= 200
    a = sv.analyze(m, s.best, s.best_mesh, s.best_training or training)
    assert int(a.memory.peak.max()) <= s.device_memory


def test_the_reasons_come_from_the_step_model():
    s = found("roomy")
    t = s.table
    assert s.fits and t.step_time_s.notna().all() == t.analysed.all()
    a = sv.analyze(model(), s.best, s.best_mesh, s.best_training or TRAINING)
    assert t.step_time_s.iloc[0] == pytest.approx(a.step.step_time_s)  # a.step itself, not an estimate
    assert t.tokens_per_s.iloc[0] == pytest.approx(a.step.tokens_per_s) and t.mfu.iloc[0] == pytest.approx(a.step.mfu)
    # with room for everything the fastest does not recompute; a checkpointed plan says what it costs
    assert t.checkpoint.isna().iloc[0]
    blocks = len(sv.Plan.auto(model(), checkpoint="blocks").checkpoint)
    fit = t[t.fits & t.analysed]
    assert fit.why.str.contains(rf"\d % slower: recomputation of {blocks} blocks \+\d+(?:\.\d+)? %").any()
    assert fit.why.str.contains(r"\d % slower: .*exposed (?:all-gathers|reduce-scatters)").any()
    assert not fit.why.str.contains(r"\d (?:s|ms|µs) slower").any()  # differences in % of the step, not seconds


def test_without_a_device_the_search_says_how_it_ranks():
    limit = limits()["between"]
    s = sv.search(model(), mesh=sv.Mesh(8, device_memory=limit, **ALLOCATED), training=TRAINING, offload=(False,))
    assert s.fits and "no step time (no device" in s.note and "collectives' seconds" in s.note
    assert s.table.step_time_s.isna().all() and s.table.why.iloc[0] == "fastest that fits"
    a = sv.analyze(model(), s.best, s.best_mesh, TRAINING)
    assert int(a.memory.peak.max()) <= limit


def test_sv201_prices_each_fix_with_the_step_model():
    from shardviz.checks import CHECKPOINT_FIXES, memory_fixes
    from shardviz.search import CHECKPOINTS

    assert CHECKPOINTS[:len(CHECKPOINT_FIXES)] == CHECKPOINT_FIXES  # the search's checkpointing, shared
    limit = limits()["between"]  # nothing fits without checkpointing
    plan = sv.Plan.auto(model(), lora="sharded")
    a = sv.analyze(model(), plan, replace(MESH, device_memory=limit), TRAINING)
    fixes = memory_fixes(a)
    assert fixes and all(f.peak <= limit and f.cost_s is not None for f in fixes)
    plain = [f for f in fixes if not f.hardware]
    assert [f.cost_s for f in plain] == sorted(f.cost_s for f in plain)  # cheapest first, by time
    assert fixes[-1].hardware or not any(f.hardware for f in fixes)  # more ranks last
    ckpt = next(f for f in fixes if f.text.startswith("checkpoint every block"))
    fixed = sv.analyze(model(), plan.with_checkpoint(plan_blocks()), a.mesh, TRAINING)
    assert ckpt.step_time_s == pytest.approx(fixed.step.step_time_s)
    assert ckpt.cost_s == pytest.approx(fixed.step.step_time_s - a.step.step_time_s) and ckpt.cost_s > 0
    finding = next(f for f in a.findings if f.code == "SV201")
    assert finding.fix.startswith("cheapest fix: ") and "for the same tokens, +" in finding.fix


def plan_blocks() -> list[str]:
    return list(sv.Plan.auto(model(), checkpoint="blocks").checkpoint)


def test_explain_says_what_was_chosen_and_why():
    s = found("between")
    text = s.explain()
    best = s.table.iloc[0]
    assert text.startswith(f"Run {best['name']}: peak {sv.format.format_bytes(best.peak)}")
    assert f"{format_rate(best.tokens_per_s)} tokens/s per rank" in text and f"MFU {format_percent(best.mfu)}" in text
    assert "Checkpointing is needed" in text and s.table.why.iloc[1] in text


@pytest.mark.slow
def test_docs_what_should_i_run_table_is_up_to_date():
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("bench_search", root / "benchmarks" / "bench_search.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    doc = (root / "docs" / "search.md").read_text()
    fresh = bench.table_markdown(list(bench.table_rows()))
    assert bench.splice_doc(doc, fresh) == doc, (
        "docs/search.md's What should I run table is stale: run .venv/bin/python benchmarks/bench_search.py --docs")


def test_cli_table_wraps_names_and_says_why_a_row_has_no_numbers():
    """plan search's table (issue 37): a long name wraps onto the next line instead of being cut
    ("…"), and a row without numbers (pruned) says why under it."""
    import re

    from shardviz.cli import search_table

    s = found("between")
    text = search_table(s, len(s.table))
    assert "…" not in text and all(len(line) <= 100 for line in text.splitlines())
    numbered = [i for i, line in enumerate(text.splitlines()) if re.match(r"\d+ ", line)]
    assert len(numbered) == len(s.table)
    lines = text.splitlines()
    for row, at in zip(s.table.itertuples(), numbered):
        block = "\n".join(lines[at:numbered[numbered.index(at) + 1]] if at != numbered[-1] else lines[at:])
        if not row.analysed:
            assert "not analysed: " in block, block
        else:
            assert "GiB" in block or "MiB" in block or "KiB" in block, block
        assert " ".join(block.split()).replace("not analysed:", "").find(" ".join(row.name.split()[:2])) >= 0


def test_no_full_collection_during_a_search(monkeypatch):
    """No full (generation 2) collection while the candidates run (issue 37: one every few analyses
    was 1.5 s of a 70B search), none forced after it (one takes 0.5-1 s in a kernel that measured
    many layouts); the thresholds as they were after it, also when it fails."""
    from shardviz.search import running

    seen, full = [], []
    real = running._evaluate
    fail = [True]

    def evaluate(*args, **kwargs):
        seen.append(gc.get_threshold()[2])
        if fail[0] and len(seen) == 5:
            raise RuntimeError("a candidate failed")
        return real(*args, **kwargs)

    def on_gc(phase, info):
        if phase == "start" and info["generation"] == 2:
            full.append(len(seen))

    monkeypatch.setattr(running, "_evaluate", evaluate)
    before, m = gc.get_threshold(), model()
    gc.callbacks.append(on_gc)
    try:
        with pytest.raises(RuntimeError, match="a candidate failed"):
            sv.search(m, mesh=MESH, training=sv.Training())
        # (before the first candidate, building the candidates, the collector runs as it will)
        assert seen == [1 << 30] * 5 and gc.get_threshold() == before and max(full, default=0) == 0
        fail[0], seen[:], full[:] = False, [], []
        found = sv.search(m, mesh=MESH, training=sv.Training())
        assert len(seen) == found.n_candidates and max(full, default=0) == 0
    finally:
        gc.callbacks.remove(on_gc)
    assert gc.get_threshold() == before


def test_a_model_whose_step_skips_a_block_is_searched():
    """Mllama's language model holds cross-attention layers that run only with an image: the step
    without one never runs layers.3, and the search's bound from one measurement read every block
    (KeyError: "module '...layers.3' did not run in the measured step") and stopped Suggest."""
    from hf_archs import build

    model = build("mllama", lora=True)
    training = sv.Training(batch_size=1, seq_len=32)
    plain = sv.analyze(model, sv.Plan.auto(model), sv.Mesh(shard=4, device="H100"), training=training)
    skipped = [b for b in plain.activation_profile.blocks if b not in plain.activation_profile.modules]
    assert skipped  # the premise: torch's step ran without some block
    found = sv.search(model, sv.Mesh(shard=4, device="H100"), training)
    plan, mesh, tr = found.candidate(0)
    assert int(found.table.iloc[0].peak) == int(sv.analyze(model, plan, mesh, training=tr).memory.peak.max())
