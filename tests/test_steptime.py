"""The step time of an analysis (shardviz.step.timing): a.time, a.step, the timeline payload, the
comparison columns. The schedule's rules are tested on their own in test_schedule.py; here the
wiring: which FLOPs, which collectives, which flags reach the schedule, and what every view shows.

FLOPs are fixed round numbers (``fixed_flops`` below, through a patched ``Analysis.flops``) so the
compute seconds follow from them; the collectives are the ones torch issues in its own step
(``torch_truth.fake_run``); the FLOPs against torch's count are in test_flops_truth.py.
"""

from collections import Counter
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

import shardviz as sv
from shardviz import zoo
from shardviz.step import timing as steptime
from shardviz.activations import opcost
from shardviz.analysis import Analysis
from shardviz.run.devices import Device, Efficiency
from shardviz.format import OUTSIDE_FSDP
from shardviz.step.timing import TIME_COLUMNS, timeline_payload
from torch_truth import fake_run

# 1 TFLOPS bf16, every efficiency 1: a unit's compute seconds are its FLOPs / 1e12
ROUND = Device("round", "80GiB", 1, 1, 1, hbm_gbps=100, intra_node_gbps=10, inter_node_gbps=1)
EXACT = Efficiency(matmul=1.0, collective_bus=1.0, hbm=1.0)
TRAINING = sv.Training(optimizer="adamw", param_dtype="bfloat16", reduce_dtype="float32", batch_size=1, seq_len=32)


def fixed_flops(self) -> pd.DataFrame:
    """Forward 1e9 FLOPs per call in forward order (the root 2e9: norm and head), backward twice,
    recomputation equal to the forward for checkpointed blocks."""
    rows = []
    first = [min(self.tree.module_index[m] for m in u.modules) for u in self.units.itertuples()]
    order = self.units.assign(first=first).sort_values("first")  # module order: forward order for Llama
    for u in order.itertuples():
        f = 2e9 if tuple(u.modules) in (("",), ("base_model.model",)) else 1e9
        ckpt = any(m in (self.plan.checkpoint or {}) for m in u.modules)
        rows.append({"unit": u.unit, "forward_flops": f, "backward_flops": 2 * f, "recompute_flops": f if ckpt else 0.0})
    return pd.DataFrame(rows)


def fixed_costs(inputs: steptime.StepInputs) -> dict:
    """The fixed FLOPs (the patched ``Analysis.flops`` the inputs read) as large matmuls and nothing
    else: a unit's compute seconds are its FLOPs / peak."""
    return {row.unit: {phase: opcost.flop_only(getattr(row, f"{phase}_flops")) for phase in steptime.PHASES}
            for row in inputs.flops().itertuples()}


@pytest.fixture
def flops(monkeypatch):
    monkeypatch.setattr(Analysis, "flops", property(fixed_flops), raising=False)
    monkeypatch.setattr(steptime, "unit_op_costs", fixed_costs)


def analysis(model, lora="sharded", training=TRAINING, no_root=False, **plan_kw):
    mesh = sv.Mesh(4, device=ROUND, efficiency=EXACT)
    plan = sv.Plan.auto(model, lora=lora, **plan_kw)
    if no_root:  # the call enclosing the others is on base_model.model (no call on the whole model)
        plan = sv.Plan([u for u in plan.units if len(u.modules) == 1 and u.modules != ("",)]
                       + [sv.Unit("base_model.model")], plan.ignored)
    return sv.analyze(model, plan, mesh, training)


COLUMN = {("all_gather", "forward"): "all_gather_forward_s", ("all_gather", "backward"): "all_gather_backward_s",
          ("reduce_scatter", "backward"): "reduce_scatter_s", ("all_reduce", "backward"): "all_reduce_s"}


def torch_collective_seconds(a) -> dict:
    """The collectives torch issues in the step (``fully_shard`` under the fake process group, every
    c10d op recorded per call and phase: ``torch_truth.fake_run``), each timed by the ``a.comm`` row
    of its call, kind, phase and bytes (one call's seconds): {(unit, column): seconds}; unit None:
    outside every call."""
    truth = fake_run(zoo.tiny_llama_lora, a.plan, a.mesh, a.training, rank=0)
    assert truth.collectives
    per_call = {(r.unit if isinstance(r.unit, str) else None, r.collective, r.phase, int(r.bytes)): r.time_s
                for r in a.comm.itertuples()}  # no call: None (a.comm's NaN)
    out = {}
    for c in truth.collectives:
        key = (c["unit"], c["collective"], c["phase"], int(c["bytes"]))
        assert key in per_call, f"torch issued {key}, not in a.comm"
        column = (c["unit"], COLUMN[c["collective"], c["phase"]])
        out[column] = out.get(column, 0.0) + per_call[key]
    return out


@pytest.mark.parametrize("lora, plan_kw", [("sharded", {}), ("ignored", {}), ("sharded", {"checkpoint": "blocks"}),
                                           ("sharded", {"no_root": True})])
def test_a_time_holds_the_flops_and_the_collectives_torch_issues(model, flops, lora, plan_kw):
    """``a.time``, per call: the compute seconds of its FLOPs (fixed here, at 1 TFLOPS) and, per
    collective column, the calls torch issues in its own step times one call's seconds; a call torch
    never all-gathers in backward (kept unsharded after forward) shows none. The adapters' all-reduce
    outside every call (ignored LoRA) is the step's exposed ``ignored_all_reduce``."""
    a = analysis(model, lora, **plan_kw)
    assert list(a.time.columns) == TIME_COLUMNS
    time = a.time.set_index("unit")
    for row in fixed_flops(a).itertuples():
        got = time.loc[row.unit, ["forward_s", "backward_s", "recompute_s"]].tolist()
        assert got == pytest.approx([row.forward_flops / 1e12, row.backward_flops / 1e12, row.recompute_flops / 1e12])
    issued = torch_collective_seconds(a)
    for unit in time.index:
        for column in COLUMN.values():
            want = issued.get((unit, column), 0.0)
            assert (time.loc[unit, column] or 0.0) == pytest.approx(want, rel=1e-9), (unit, column)
    outside = [e for e in a.step_time.schedule.events if e.kind == "ignored_all_reduce"]
    assert sum(e.end_s - e.start_s for e in outside) == pytest.approx(issued.get((None, "all_reduce_s"), 0.0))
    assert (lora == "ignored") == bool(outside) and all(e.exposed for e in outside)
    if plan_kw.get("no_root"):
        assert a.time.unit[0] == "base_model.model"
    elif plan_kw:  # both blocks recomputed in backward
        assert a.time.recompute_s.sum() == pytest.approx(2 * 1e9 / 1e12)


def test_mfu_and_hfu_are_palms_utilisations(model, flops):
    """PaLM (Chowdhery et al. 2022, appendix B): MFU is the model's FLOPs per step (forward and
    backward, no recomputation) over the step time at peak; HFU counts the recomputed FLOPs too.
    The FLOPs themselves are torch's count (test_flops_truth.py)."""
    a = analysis(model, checkpoint="blocks")
    f = a.flops
    assert a.step.model_flops == f.forward_flops.sum() + f.backward_flops.sum() < a.step.flops
    tokens = TRAINING.batch_size * TRAINING.seq_len
    assert a.step.tokens_per_s == pytest.approx(tokens / a.step.step_time_s)
    assert a.step.mfu == pytest.approx(a.step.model_flops / (a.step.step_time_s * 1e12))
    assert a.step.hfu == pytest.approx(a.step.flops / (a.step.step_time_s * 1e12)) and a.step.hfu > a.step.mfu
    assert a.step.compute_s + a.step.exposed_comm_s == pytest.approx(a.step.step_time_s)


@pytest.mark.parametrize("lora", ["sharded", "ignored"])
def test_gradient_accumulation_reduces_on_the_last_micro_batch_only(model, flops, lora):
    """k micro-batches: the first k - 1 run without the optimizer step and, unless told to sync every
    micro-batch, without reduce-scatter and all-reduce (torch's no_sync: test_grad_accum.py counts
    the collectives); the last is the one-micro-batch step."""
    one = analysis(model, lora)
    k = 4
    a = one.what_if(training=replace(TRAINING, grad_accum=k))
    last = one.step.step_time_s
    optimizer_s = sum(e.end_s - e.start_s for e in one.step_time.schedule.events if e.kind == "optimizer")
    compute = one.step.compute_s - optimizer_s  # a micro-batch's kernels
    assert a.step.grad_accum == k and a.step.step_time_s == a.step.step_time_sync_last_s
    assert a.step.step_time_sync_every_s == pytest.approx((k - 1) * (last - optimizer_s) + last)
    quiet = (a.step.step_time_s - last) / (k - 1)  # one micro-batch without reductions
    assert compute <= quiet + 1e-15
    if lora == "sharded":  # reduce-scatters no longer run: a quiet micro-batch is shorter
        assert quiet < last - optimizer_s and a.step.step_time_sync_every_s > a.step.step_time_s
    else:  # with ignored LoRA no call reduces: the two are the same
        assert a.step.step_time_sync_every_s == pytest.approx(a.step.step_time_s)
    assert a.step.tokens_per_s == pytest.approx(k * TRAINING.batch_size * TRAINING.seq_len / a.step.step_time_s)
    assert a.step.flops == one.step.flops  # per micro-batch
    synced = one.what_if(training=replace(TRAINING, grad_accum=k, sync_every_microbatch=True))
    assert synced.step.step_time_s == pytest.approx(a.step.step_time_sync_every_s)


def test_without_a_device_or_a_batch_the_step_says_why(model, flops):
    no_device = sv.analyze(model, sv.Plan.auto(model), sv.Mesh(4), TRAINING)
    no_batch = sv.analyze(model, sv.Plan.auto(model), sv.Mesh(4, device="H100"), sv.Training())
    for a, word in ((no_device, "device"), (no_batch, "batch")):
        assert a.step.step_time_s is None and a.step.mfu is None
        assert word in a.step.reason
        assert a.time.empty and list(a.time.columns) == TIME_COLUMNS and word in a.time.attrs["reason"]
        p = timeline_payload(a.step_time)
        assert p == {"available": False, "reason": a.step.reason} == sv.views.display.timeline_payload(a)
        assert "step time:" in sv.views.display.step_text(a.step)


def test_the_step_is_a_frozen_value_of_typed_fields(model, flops):
    """Issue 25: ``a.step`` is a ``StepSummary`` dataclass, not a dict; one value, no later edits."""
    import dataclasses

    a = sv.analyze(model, sv.Plan.auto(model), sv.Mesh(4, device=ROUND, efficiency=EXACT), TRAINING)
    step = a.step
    assert isinstance(step, steptime.StepSummary) and step is a.step_time.step
    assert step.step_time_s > 0 and step.reason is None and step.tensor_comm_s is None  # no tensor dim
    with pytest.raises(dataclasses.FrozenInstanceError):
        step.step_time_s = 0.0
    assert dataclasses.replace(step, reason="x") != step and dataclasses.replace(step) == step


def test_the_step_is_timed_from_its_inputs_without_the_analysis(model, monkeypatch):
    """Issue 25: ``steptime.step_time`` reads the stages it is given (``StepInputs``), never the
    ``Analysis``: the same step from the stages' values once every stage of the analysis raises."""
    a = sv.analyze(model, sv.Plan.auto(model), sv.Mesh(4, device="H100"), replace(TRAINING, grad_accum=2))
    expected = a.step_time
    flops, profile, collectives, calls, memory = a.flops, a.activation_profile, a.collectives, a.costs.calls, a.memory
    inputs = steptime.StepInputs(a.layout, a.training, flops=lambda: flops, profile=lambda: profile,
                                 collectives=lambda: collectives, calls=lambda: calls, memory=lambda: memory)

    def read(self):
        raise AssertionError("the step time read the Analysis")

    for name in ("flops", "activation_profile", "measured_step", "comm", "collectives", "costs", "memory", "step_time",
                 "step_inputs", "time", "step"):
        monkeypatch.setattr(Analysis, name, property(read))
    st = steptime.step_time(inputs)
    assert st == expected and st.step.step_time_s > 0
    assert steptime.timeline_payload(st)["step_time_s"] == expected.schedule.step_time_s


def test_timeline_payload_is_sorted_and_marks_the_exposed_communication(model, flops):
    a = analysis(model, "ignored")
    p = sv.views.display.timeline_payload(a)
    # ignored LoRA: its gradients all-reduced; the base is frozen, so nothing is reduce-scattered
    assert p["available"] and p["streams"] == ["compute", "all_gather", "all_reduce"]
    events = p["events"]
    starts = [e["start_s"] for e in events]
    assert starts == sorted(starts)
    assert all(e["end_s"] >= e["start_s"] >= 0 for e in events)
    assert max(e["end_s"] for e in events) == pytest.approx(p["step_time_s"])
    exposed = [e for e in events if e["exposed"]]
    assert exposed and all(e["exposed_s"] > 0 and e["stream"] != "compute" for e in exposed)
    assert sum(e["exposed_s"] for e in events) == pytest.approx(a.step.exposed_comm_s)
    assert any(e["kind"] == "ignored_all_reduce" and e["exposed"] for e in events)
    # the compute stream never runs two things at once
    compute = [e for e in events if e["stream"] == "compute"]
    assert all(x["end_s"] <= y["start_s"] + 1e-12 for x, y in zip(compute, compute[1:]))
    assert set(p["labels"]) == set(p["units"]) and p["labels"]["base_model.model.model.layers.0"] == "layers.0"
    fig = a.timeline()
    assert any("exposed" in (t.name or "") for t in fig.data)
    assert fig.layout.title.text == p["summary"]


def test_comparison_and_sweep_gain_step_time_tokens_and_mfu(model, flops):
    mesh = sv.Mesh(4, device=ROUND, efficiency=EXACT)
    plans = {x: sv.Plan.auto(model, lora=x) for x in ("ignored", "sharded")}
    c = sv.compare(model, plans, mesh=mesh, training=TRAINING)
    for name, a in c.analyses.items():
        for key in ("step_time_s", "tokens_per_s", "mfu"):
            assert c.table.loc[name, key] == getattr(a.step, key)
    shown = sv.fmt(c.table)
    assert {"step time", "tokens/s per rank", "MFU"} <= set(shown.columns)
    s = sv.sweep(model, plans, world_sizes=[2, 4], mesh=mesh, training=TRAINING)
    assert s.table.tokens_per_s.notna().all()
    fig = s.figure(y="tokens_per_s")
    assert len(fig.data) == 2 and fig.layout.yaxis.title.text == "tokens/s per rank"
    with pytest.raises(ValueError, match="tokens_per_s"):
        s.figure(y="speed")


def test_the_report_states_the_step_and_draws_the_timeline(model, flops):
    from shardviz.report import render_report

    mesh = sv.Mesh(4, device=ROUND, efficiency=EXACT)
    html = render_report(model, sv.Plan.auto(model), mesh, TRAINING)
    a = sv.analyze(model, sv.Plan.auto(model), mesh, TRAINING)
    assert sv.views.display.step_text(a.step).replace("·", "&middot;") in html or sv.views.display.step_text(a.step) in html
    assert 'data-kind="timeline"' in html
    assert "Step time by call" in html and "matmuls at" in html  # a.time and its assumptions
    no_device = render_report(model, sv.Plan.auto(model), sv.Mesh(4), TRAINING)
    assert "Step time by call" not in no_device and "no device" in no_device


def test_mesh_efficiency_must_be_an_efficiency():
    with pytest.raises(ValueError, match="Mesh.efficiency"):
        sv.Mesh(4, device="H100", efficiency=0.5)
    assert sv.Mesh(4, efficiency=Efficiency(matmul=0.4)).efficiency.matmul == 0.4


def test_outside_row_without_a_root_is_timed(model, monkeypatch):
    """FLOPs outside every call (a plan without a root) are a unit of their own, with no collectives."""
    def flops_with_outside(self):
        df = fixed_flops(self)
        return pd.concat([df, pd.DataFrame([{"unit": None, "forward_flops": 5e8, "backward_flops": 1e9,
                                             "recompute_flops": 0.0}])], ignore_index=True)

    monkeypatch.setattr(Analysis, "flops", property(flops_with_outside), raising=False)
    a = analysis(model)
    row = a.time.set_index("unit").loc[OUTSIDE_FSDP]
    assert row.forward_s == pytest.approx(5e8 / 1e12) and row.all_gather_forward_s == 0


def test_the_step_time_reads_one_micro_batch_of_collectives_each_issued_once(model):
    """The seconds model reads the step's collectives directly, one micro-batch's (no count over the
    step divided back): a.comm counts each over the step (``collectives.step_count``), and the
    last micro-batch's schedule holds each all-gather and reduce-scatter of a.comm once."""
    a = analysis(model, training=replace(TRAINING, grad_accum=4))
    comm = a.comm[a.comm.unit.notna()]
    assert set(comm[comm.collective == "all_gather"]["count"]) == {4}
    assert set(comm[comm.collective == "reduce_scatter"]["count"]) == {1}
    sched = a.step_time.schedule
    bars = Counter((e.unit, e.kind, e.phase) for e in sched.events if e.kind in ("all_gather", "reduce_scatter")
                   and e.end_s > e.start_s)
    assert bars == Counter((r.unit, r.collective, r.phase) for r in comm.itertuples())


def test_a_collective_without_a_bandwidth_names_its_call():
    from shardviz.step.collectives import Collectives
    from shardviz.step.timing import call_seconds

    units = sv.Plan(["a", ""]).units
    nan = np.array([float("nan")])
    bad = Collectives([0], ("all_gather",), ("forward",), ("shard",), (4,), ["bfloat16"], np.array([8]), (1,),
                      np.array([6]), nan, np.array([0.0]))
    with pytest.raises(ValueError, match="no bandwidth for the all_gather of 'a' over the shard group"):
        call_seconds(bad, units)


def test_unit_flops_from_the_profile_index_equal_the_sum_module_by_module():
    """``unit_flops`` reads subtree sums cached on the profile (a change of plan walks only its
    calls): the same integers as giving every module's own FLOPs to its nearest call."""
    from shardviz.activations.flops import FLOP_COLUMNS, unit_flops, unit_of

    m = zoo.tiny_llama_lora()
    training = sv.Training(batch_size=1, seq_len=32)
    base = sv.Plan.auto(m, lora="separate", checkpoint="every 2")
    for plan in (base, base.without_unit(base.units[1].modules[0]), sv.Plan(units=[sv.Unit(("",))])):
        profile = sv.analyze(m, plan, sv.Mesh(8), training).activation_profile
        calls = {mod: i for i, u in enumerate(plan.units) for mod in u.modules}
        sums = {i: [0, 0, 0] for i in range(len(plan.units))}
        outside = [0, 0, 0]
        for fqn, f in profile.module_flops.items():
            i = unit_of(fqn, calls)
            row = outside if i is None else sums[i]
            for k, n in enumerate(f):
                row[k] += n
        rows = unit_flops(profile, plan.units)
        want = {plan.units[i].name: tuple(v) for i, v in sums.items()}
        if any(outside):
            want[None] = tuple(outside)
        assert {r["unit"]: tuple(r[c] for c in FLOP_COLUMNS[1:]) for r in rows} == want


# ---------------------------------------------------------------------------
# Per-op time (issue 27): each op's FLOPs, bytes and kernel, timed by its roofline
# ---------------------------------------------------------------------------
H100_EAGER = Efficiency.for_stack("torchtitan-eager", "H100")


def test_op_costs_hold_torchs_flop_count_and_the_memory_bound_kernels(model):
    a = sv.analyze(model, sv.Plan.auto(model, checkpoint="blocks"), sv.Mesh(4, device="H100"), TRAINING)
    costs = steptime.unit_op_costs(a.step_inputs)
    f = a.flops
    for phase in steptime.PHASES:
        assert sum(opcost.totals(c[phase])[0] for c in costs.values()) == f[f"{phase}_flops"].sum()
    memory = [v for c in costs.values() for cost in c.values() if cost for k, v in dict(cost).items()
              if opcost.kind_of(k) == opcost.MEMORY]
    assert memory and all(fl == 0 and n > 0 for fl, _, n in memory)  # norms, casts, the loss: no FLOPs, kernels
    assert sum(b for _, b, _ in memory) > 0
    assert a.step.mfu < H100_EAGER.matmul  # the memory-bound kernels take time: MFU is an output


def test_a_unit_is_the_roofline_of_its_ops():
    mm = opcost.bucket(opcost.MATMUL, 2 * 10**12, 10**9)
    small = opcost.bucket(opcost.MATMUL, 10**6, 10**6)
    mem = opcost.bucket(opcost.MEMORY, 0, 10**9)
    cost = {mm: (2 * 10**12, 10**9, 1), small: (10**6, 10**6, 1), mem: (0, 10**9, 1)}
    rates = dict(matmul_flops_per_s=1e12, attention_flops_per_s=5e11, bytes_per_s=1e9, launch_s=1e-3)
    # the big matmul is compute-bound (2 s), the small one launch-bound (1 ms), the copy memory-bound (1 s)
    assert opcost.seconds(cost, **rates) == pytest.approx(2 + 1e-3 + 1)
    assert opcost.seconds(cost, **rates, memory_traffic=0.5) == pytest.approx(2 + 1e-3 + 0.5)
    assert opcost.seconds(None, **rates) == 0.0


def test_lora_dropout_costs_time_but_no_flops():
    """The HF + peft stack: an adapter's dropout is a memory-bound kernel per projection."""
    from peft import LoraConfig, get_peft_model

    def lora(dropout):
        base = zoo.tiny_llama_lora(lora=False)
        return get_peft_model(base, LoraConfig(r=8, lora_alpha=16, lora_dropout=dropout, task_type="CAUSAL_LM",
                                               target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))

    steps = [sv.analyze(m, sv.Plan.auto(m), sv.Mesh(4, device="H100"), TRAINING).step for m in (lora(0.0), lora(0.1))]
    assert steps[0].flops == steps[1].flops
    assert steps[1].compute_s > steps[0].compute_s


def test_every_kernel_takes_at_least_the_floor(model):
    slow = replace(H100_EAGER, kernel_us=1000.0)
    a = sv.analyze(model, sv.Plan.auto(model), sv.Mesh(4, device="H100", efficiency=slow), TRAINING)
    kernels = sum(opcost.totals(cost)[2] for c in steptime.unit_op_costs(a.step_inputs).values() for cost in c.values())
    assert a.step.compute_s >= kernels * 1e-3


def test_the_default_efficiency_is_the_preset_of_the_models_stack(model):
    a = sv.analyze(model, sv.Plan.auto(model), sv.Mesh(4, device="H100"), TRAINING)
    assert steptime.stack_for(a.tree) == "hf-peft"
    assert steptime.efficiency_for(a.tree, a.mesh) == Efficiency.for_stack("hf-peft", "H100")
    plain = zoo.tiny_llama_lora(lora=False)
    assert steptime.stack_for(sv.analyze(plain, sv.Plan.auto(plain), sv.Mesh(4), TRAINING).tree) == "hf"
    assert any("stack hf-peft" in n for n in a.step_time.assumptions)
    assert any("links:" in n for n in a.step_time.assumptions)


def test_the_offloaded_optimizer_step_is_the_host_adamw(model):
    from shardviz.step.schedule import host_optimizer_seconds

    training = replace(TRAINING, offload=True)
    a = sv.analyze(model, sv.Plan.auto(model), sv.Mesh(4, device="H100"), training)
    trainable = sum(p.numel for p in a.tree.params if p.requires_grad)
    assert steptime.host_step_params(a.step_inputs) == pytest.approx(trainable / 4, rel=0.05)  # padding aside
    opt = [e for e in a.step_time.schedule.events if e.kind == "optimizer"]
    assert len(opt) == 1
    assert opt[0].end_s - opt[0].start_s == pytest.approx(
        host_optimizer_seconds(steptime.host_step_params(a.step_inputs), steptime.efficiency_for(a.tree, a.mesh)))
    assert any("host's AdamW" in n for n in a.step_time.assumptions)


@pytest.mark.slow
def test_llama3_8b_lora_search_offloads_only_where_the_host_time_pays():
    """Issue 27, "CPU offload looks free": the host's AdamW and the PCIe copies are timed. On 2 x RTX
    4090 (24 GB) the plans that fit without offload must recompute blocks; offloading avoids that,
    its host time included, and wins. On 8 x H100 a plan fits without offload and wins; an offloaded
    twin is analysed only where the plan without offload does not fit (else it only adds host time)."""
    model = zoo.llama3_8b(lora=True)
    model.config.use_cache = False
    training = sv.Training(optimizer="adamw", param_dtype="bfloat16", reduce_dtype="float32", batch_size=1,
                           seq_len=4096)
    small = sv.search(model, sv.Mesh(2, device="RTX-4090"), training)
    table = small.table
    assert table.offload.iloc[0] and table.fits.iloc[0]
    plan, mesh, chosen = small.candidate(0)
    a = sv.analyze(model, plan, mesh, chosen)
    sched = a.step_time.schedule
    host = sum(e.end_s - e.start_s for e in sched.events if e.kind in ("h2d", "d2h", "optimizer"))
    assert host > 0.05 * a.step.step_time_s  # the host time is a real share of the step
    not_offloaded = table[(~table.offload) & table.fits & table.analysed]
    assert len(not_offloaded) and not_offloaded.step_time_s.min() > a.step.step_time_s
    big = sv.search(model, sv.Mesh(8, device="H100"), training).table
    assert not big.offload.iloc[0]
    # an offloaded plan is analysed only where its twin without offload does not fit (the margin included)
    fits_by_name = dict(zip(big.name, big.fits))
    for name in big[big.offload & big.analysed].name:
        assert not fits_by_name.get(name.replace(", CPU offload", ""), False), name
    assert any("step times assume stack hf-peft" in n for n in small.note.split("; "))


def test_offload_has_one_price_however_it_is_set(model):
    """Issue 35, "CPU offload has two homes": a plan whose every call carries ``sv.Unit(offload=True)``
    (what the search builds) and the same plan under ``Training(offload=True)`` are one run: the
    host's AdamW, the same copies, the same device and host memory."""
    mesh = sv.Mesh(4, device="H100")
    plan = sv.Plan.auto(model, checkpoint="blocks")
    by_training = sv.analyze(model, plan, mesh, replace(TRAINING, offload=True))
    units = plan.with_units([sv.Unit(u.modules, u.reshard_after_forward, u.param_dtype, u.reduce_dtype, True)
                             for u in plan.units])
    by_units = sv.analyze(model, units, mesh, TRAINING)
    assert steptime.host_step_params(by_units.step_inputs) > 0
    assert by_units.step == by_training.step
    pd.testing.assert_frame_equal(by_units.time, by_training.time)
    pd.testing.assert_frame_equal(by_units.memory, by_training.memory)
    assert "cpu_peak" in by_units.memory and by_units.memory.cpu_peak.max() > 0
    kinds = lambda a: [(e.kind, e.end_s - e.start_s) for e in a.step_time.schedule.events]  # noqa: E731
    assert kinds(by_units) == kinds(by_training)
    assert by_units.step_time.assumptions == by_training.step_time.assumptions


@pytest.mark.parametrize("mesh", [sv.Mesh(64, device="H100"), sv.Mesh(shard=8, replicate=2, device="H100")],
                         ids=["fsdp64", "hsdp8x2"])
def test_a_collective_has_one_duration_in_comm_and_time(model, mesh):
    """Issue 35, "a collective has two durations": ``a.comm.time_s`` (one call) x ``count``, summed
    per call and collective, is what ``a.time`` shows, the timeline draws and ``time_per_step_s``
    totals: the latency and the bus efficiency are in ``time_s``, nowhere else."""
    a = sv.analyze(model, sv.Plan.auto(model, checkpoint="blocks"), mesh, TRAINING)
    comm = a.comm.assign(seconds=a.comm.time_s * a.comm["count"])
    assert (comm.time_s > comm.latency_s).all()
    column = {("all_gather", "forward"): "all_gather_forward_s", ("all_gather", "backward"): "all_gather_backward_s",
              ("reduce_scatter", "backward"): "reduce_scatter_s", ("all_reduce", "backward"): "all_reduce_s"}
    sums = comm[comm.unit.notna()].groupby(["unit", "collective", "phase"]).seconds.sum()
    time = a.time.set_index("unit")
    assert len(sums) and (mesh.replicate == 1 or "all_reduce" in set(comm.collective))
    for (unit, collective, phase), seconds in sums.items():
        assert time.loc[unit, column[collective, phase]] == pytest.approx(seconds, rel=1e-12), (unit, collective, phase)
    drawn = {}
    for e in timeline_payload(a.step_time)["events"]:
        if e["kind"] in ("all_gather", "reduce_scatter", "all_reduce"):
            key = (e["unit"], e["kind"], e["phase"])
            drawn[key] = drawn.get(key, 0.0) + e["end_s"] - e["start_s"]
    for key, seconds in drawn.items():
        assert seconds == pytest.approx(sums[key], rel=1e-9), key
    assert comm.attrs["time_per_step_s"] == pytest.approx(float(comm.seconds.sum()))


def test_the_timeline_draws_no_empty_lane(model, flops):
    """Issue 37: the all-reduce lane was drawn empty for every FSDP plan. A lane is drawn where its
    stream has events: LoRA sharded on FSDP has no all-reduce, LoRA ignored has (its gradients')."""
    sharded = sv.views.display.timeline_payload(analysis(model, "sharded"))
    assert sharded["streams"] == ["compute", "all_gather", "reduce_scatter"]
    assert {e["stream"] for e in sharded["events"]} == set(sharded["streams"])


def test_every_chart_spells_a_collective_one_way(model, flops):
    """Issue 37: "all_gather ×68" on one chart, lane "all-gather" on another, legend "all gather" on a
    third. The payloads carry ``format.format_kind``'s names; the SVG charts (charts.js) and the
    plotly figures (``a.timeline()``, ``traffic_figure``) show those and nothing else."""
    from shardviz.format import format_kind

    spelled = {}
    for lora in ("sharded", "ignored"):  # reduce-scatters; the ignored LoRA gradients' all-reduce
        a = analysis(model, lora)
        tl, tr = sv.views.display.timeline_payload(a), sv.views.display.traffic_payload(a)
        assert tr["names"] == {c: format_kind(c) for c in tr["collectives"]}
        assert all(tl["names"][c] == tr["names"][c] for c in tr["collectives"] if c in tl["names"])
        spelled |= tr["names"]
        timeline, traffic = a.timeline(), sv.views.display.traffic_figure(tr)
        shown = {t.name for f in (timeline, traffic) for t in f.data if t.name} | {y for t in timeline.data for y in t.y}
        shown |= {x for t in traffic.data[:1] for x in t.x}
        assert shown and not any("_" in n or n in ("all gather", "reduce scatter", "all reduce") for n in shown), shown
    assert spelled == {"all_gather": "all-gather", "reduce_scatter": "reduce-scatter", "all_reduce": "all-reduce"}
