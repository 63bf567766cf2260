"""The header card's "apply" (issue 37): the top finding's fix, where it is a change of plan, applied as
one undo step, the plan ``sv.fix_plan`` gives; a fix that is not a plan change gets no button."""

from __future__ import annotations

from torch import nn

import shardviz as sv
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
