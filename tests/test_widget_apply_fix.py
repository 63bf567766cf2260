"""The header card's "apply" (issue 37): the top finding's fix, where it is a change of plan, applied as
one undo step, the plan ``sv.fix_plan`` gives; SV201's cheapest fix, the change of plan, mesh or
training it priced; a fix that is words only gets no button."""

from __future__ import annotations

from torch import nn

import shardviz as sv
from shardviz.format import format_duration
from shardviz.widget import Inspector


def model():
    return nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 8))


def test_apply_fix_is_fix_plan_as_one_undo_step():
    m = model()
    plan = sv.Plan(["0", "1"])  # the last layer in no call: torch's root call must take it
    ins = Inspector(m, plan=plan, mesh=sv.Mesh(shard=4, device_memory="80GiB"), background=False)
    top = ins.summary["card"]["finding"]  # the card's top finding (display.header_card)
    a = sv.analyze(m, plan, mesh=ins.mesh, training=ins.training)
    finding = next(f for f in a.findings if f.code == top["code"])
    want = sv.fix_plan(a, finding)
    assert want is not None and top["applies"] is True
    ack = ins.handle_action("apply_fix", {"code": top["code"]})
    assert ack["ok"], ack
    assert ins.plan.units == want.units and ins.plan.ignored == want.ignored
    assert top["code"] not in {f["code"] for f in ins.findings}
    assert ins.summary["plan_name"].endswith(f"{top['code']} fixed")  # the plan says what it is
    ins.handle_action("undo", {})
    assert ins.plan.units == plan.units


def test_apply_fix_refuses_a_code_not_found_and_names_it():
    ins = Inspector(model(), plan=sv.Plan.auto(model()), mesh=sv.Mesh(shard=4), background=False)
    ack = ins.handle_action("apply_fix", {"code": "SV999"})
    assert not ack["ok"] and "SV999" in ack["error"]


def _sv201(ins):
    top = ins.summary["card"]["finding"]
    assert top["code"] == "SV201" and top["applies"] is True, top
    return top, next(f for f in ins.analysis.findings if f.code == "SV201")


def test_a_model_over_the_device_applies_sv201s_cheapest_fix_and_gets_what_it_priced():
    """70B-shaped fit questions, Llama-3-8B + LoRA on 8 x A100-40GB, 2 x 8192: "does not fit" and the
    card had no "apply", its line repeating the verdict. Now its line is the cheapest fix and what it
    gives, and applying it gives exactly that: the fit's words and the step time of the analysis after it."""
    from shardviz import zoo

    m = zoo.llama3_8b()
    ins = Inspector(m, mesh=sv.Mesh(shard=8, device="A100-40GB"), training=sv.Training(batch_size=2, seq_len=8192),
                    background=False)
    assert ins.analysis.fit.verdict == "over"
    top, finding = _sv201(ins)
    assert top["headline"] == f"fix: {finding.change.words}" and finding.fix.startswith("cheapest fix: checkpoint")
    assert sv.fix_plan(ins.analysis, finding) == finding.change.kwargs["plan"]  # the public API agrees
    before = ins.plan
    ack = ins.handle_action("apply_fix", {"code": "SV201"})
    assert ack["ok"], ack
    after = ins.analysis
    assert after.plan.checkpoint == finding.change.kwargs["plan"].checkpoint and after.fit.fits
    # what the card promised is what the applied plan gives (one verdict, one step time)
    assert f"{after.fit.word}, {after.fit.spare_text}" in finding.change.words
    assert format_duration(after.step.step_time_s) in finding.change.words
    assert "SV201" not in {f["code"] for f in ins.findings if f["severity"] == "error"}
    ins.handle_action("undo", {})
    assert ins.plan == before and ins.analysis.fit.verdict == "over"


def test_sv201s_cheapest_fix_that_is_a_smaller_micro_batch_is_applied_to_the_training():
    from shardviz import zoo

    m = zoo.llama3_8b()
    training = sv.Training(batch_size=8, seq_len=8192)
    ins = Inspector(m, plan=sv.Plan.auto(m, checkpoint="blocks"), mesh=sv.Mesh(shard=8, device="A100-40GB"),
                    training=training, background=False)
    _, finding = _sv201(ins)
    assert set(finding.change.kwargs) == {"training"} and sv.fix_plan(ins.analysis, finding) is None
    want = finding.change.kwargs["training"]
    assert ins.handle_action("apply_fix", {"code": "SV201"})["ok"]
    assert ins.training == want and want.batch_size * want.grad_accum == 8  # the same sequences per step
    assert ins.analysis.fit.fits and f"{ins.analysis.fit.spare_text}" in finding.change.words
    ins.handle_action("undo", {})
    assert ins.training == training
