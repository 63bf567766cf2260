"""The Inspector's A vs B view without a browser: pin, change, compare with ``sv.compare``, unpin.

Every number of the view is checked against ``sv.compare`` / ``sv.analyze`` run afresh (a new
tree) on the two plans, never against the widget's own arithmetic.
"""

from __future__ import annotations


import shardviz as sv
from shardviz.widget import Inspector, panels
from shardviz.widget.protocol import ACTIONS as FRONT_END_ACTIONS
from shardviz.widget.controller import DEFAULT_TRAINING  # the Inspector's training when none is given
from widget_helpers import L0, L1, MESH, Q0


def assert_view_equals_compare(model, view: dict, plan_a, plan_b, mesh=MESH, training=DEFAULT_TRAINING):
    """The view's table and diff equal ``sv.compare`` of the two plans (fresh tree) and ``sv.analyze``."""
    cmp = sv.compare(model, {"A": plan_a, "B": plan_b}, mesh=mesh, training=training)
    table = cmp.table
    assert view["pinned"] and view["available"]
    keys = [r["key"] for r in view["rows"]]
    assert keys == [k for k, *_ in panels.COMPARISON_ROWS]
    for r in view["rows"]:  # no device memory: no judged peak, shown as 0
        assert r["a"] == int(table.at["A", r["key"]] or 0), r
        assert r["b"] == int(table.at["B", r["key"]] or 0), r
        assert r["delta"] == r["b"] - r["a"]
    assert view["n_changed"] == sum(r["delta"] != 0 for r in view["rows"])
    # the same numbers straight from sv.analyze
    for side, plan in (("a", plan_a), ("b", plan_b)):
        a = sv.analyze(model, plan, mesh, training, strict=False)
        got = {r["key"]: r[side] for r in view["rows"]}
        mem = a.memory
        worst = int(mem["peak"].idxmax())
        assert got["peak"] == int(mem["peak"].max())
        assert (got["params"], got["grads"], got["optimizer"]) == tuple(int(mem.at[worst, k]) for k in ("params", "grads", "optimizer"))
        comm = a.comm
        assert got["bytes_per_step"] == int((comm["bytes"] * comm["count"]).sum())
        assert got["collectives_per_step"] == int(comm["count"].sum())
        assert got["errors"] == sum(f.severity == "error" for f in a.findings)
        assert got["warnings"] == sum(f.severity == "warning" for f in a.findings)
        assert got["judged_peak"] == (a.fit.judged if a.fit is not None else 0)
    diff = cmp.diff("A", "B")
    assert view["n_diff"] == len(diff)
    assert [d["fqn"] for d in view["diff"]] == list(diff["fqn"])[: panels.MAX_DIFF_SHOWN]
    return cmp


def test_nothing_pinned(st):
    assert st.pinned is None
    assert st.comparison == {"pinned": False}
    assert st.pinned_comparison() is None
    assert st.unpin() is False


def test_pin_change_a_unit_compare_and_unpin(model, st):
    a_plan = st.plan
    st.pin()
    assert st.pinned.plan == a_plan
    same = st.comparison  # nothing changed yet: A == B
    assert_view_equals_compare(model, same, a_plan, a_plan)
    assert same["n_diff"] == 0 and all(r["delta"] == 0 for r in same["rows"])

    st.remove_unit(L0)  # layers.0's parameters move to the root's call
    b_plan = st.plan
    view = st.comparison
    cmp = assert_view_equals_compare(model, view, a_plan, b_plan)
    moved = {p.fqn for p in sv.ModelTree(model).params if p.fqn.startswith(L0 + ".")}
    assert {d["fqn"] for d in view["diff"]} == moved
    for d in view["diff"]:
        assert (d["status_a"], d["unit_a"]) == ("sharded", L0)
        assert d["unit_b"] != L0
    assert set(cmp.diff("A", "B")["fqn"]) == moved
    assert view["a"]["n_units"] == len(a_plan.units) and view["b"]["n_units"] == len(b_plan.units)
    assert view["same_mesh"] and view["same_training"]

    # the view follows every later change; A stays
    st.ignore_lora(L1)
    c_plan = st.plan
    view2 = st.comparison
    assert_view_equals_compare(model, view2, a_plan, c_plan)
    lora1 = {p for p in st.lora_params(L1)}
    assert {d["fqn"] for d in view2["diff"]} == moved | lora1
    assert all(d["status_b"] == "ignored" for d in view2["diff"] if d["fqn"] in lora1)

    # pinning is not a plan change: undo moves B back, A stays pinned
    assert st.undo()
    assert st.plan == b_plan and st.pinned.plan == a_plan
    assert_view_equals_compare(model, st.comparison, a_plan, b_plan)
    st.undo()
    assert st.plan == a_plan
    assert st.comparison["n_diff"] == 0

    assert st.unpin() is True
    assert st.pinned is None and st.comparison == {"pinned": False}


def test_repin_replaces_a(model, st):
    st.pin()
    st.make_unit(Q0)
    st.pin()  # A is now the plan with q_proj's own call
    assert st.comparison["n_diff"] == 0
    st.remove_unit(Q0)
    view = st.comparison
    assert_view_equals_compare(model, view, sv.Plan.auto(model).with_unit(Q0), sv.Plan.auto(model))
    q0 = {p.fqn for p in sv.ModelTree(model).params if p.fqn.startswith(Q0 + ".")}
    assert {d["fqn"] for d in view["diff"]} == q0


def test_mesh_change_after_pin(model, st):
    """A keeps its mesh; B's numbers are those of the new mesh (compare cannot mix meshes, analyze can)."""
    st.pin()
    st.set_mesh(world=8)
    view = st.comparison
    assert not view["same_mesh"] and view["b"]["mesh"] == str(st.mesh)
    a = sv.analyze(model, st.pinned.plan, MESH, DEFAULT_TRAINING, strict=False)
    b = sv.analyze(model, st.plan, st.mesh, DEFAULT_TRAINING, strict=False)
    got = {r["key"]: (r["a"], r["b"]) for r in view["rows"]}
    assert got["peak"] == (int(a.memory["peak"].max()), int(b.memory["peak"].max()))
    assert got["params"][0] != got["params"][1]  # sharded 8 ways instead of 4
    assert view["n_diff"] == 0  # same plan: no parameter changes status or call


def test_diff_is_capped_for_display(model, st, monkeypatch):
    monkeypatch.setattr(panels, "MAX_DIFF_SHOWN", 3)
    st.pin()
    st.apply_preset("ignored")
    view = st.comparison
    n = len(sv.compare(model, {"A": sv.Plan.auto(model), "B": st.plan}, mesh=MESH).diff("A", "B"))
    assert n > 3 and view["n_diff"] == n and len(view["diff"]) == 3


def test_widget_pin_and_unpin_actions(model):
    ins = Inspector(model, mesh=MESH)
    assert "pin" in FRONT_END_ACTIONS and "unpin" in FRONT_END_ACTIONS
    assert ins.comparison["pinned"] is False
    assert ins.handle_action("pin", {})["ok"]
    assert ins.comparison["pinned"] and ins.comparison["n_diff"] == 0
    assert ins.summary["pinned"] is True
    a_plan = ins.plan
    assert ins.handle_action("ignore_lora", {"module_fqn": L0})["ok"]
    shown = ins.comparison
    assert shown["revision"] == ins.controller.revision
    assert_view_equals_compare(model, shown, a_plan, ins.plan)
    assert {d["fqn"] for d in shown["diff"]} == set(ins.controller.lora_params(L0))
    assert ins.controller.pinned.plan == a_plan and ins.controller.comparison == {k: v for k, v in shown.items() if k != "revision"}
    assert ins.handle_action("unpin", {})["ok"]
    assert ins.comparison["pinned"] is False and ins.summary["pinned"] is False
    assert not ins.handle_action("pin", {"fqn": L0})["ok"]  # pin takes no argument


def test_diff_names_fit_a_narrow_table(model, st):
    """The diff lists each parameter without the prefix all listed names share, and each side as the
    tree's badges say it ("sharded in layers.0"); the full names stay for hover and reveal."""
    st.pin()
    st.ignore_lora(L0)
    for d in st.comparison["diff"]:
        assert d["fqn"].startswith(L0 + ".") and d["fqn"] == f"{L0}.{d['fqn_short']}"
        assert (d["where_a"], d["where_b"]) == ("sharded in layers.0", "ignored")


def test_compare_chart_notes_every_layout_and_its_training(model):
    """sv.compare(...).chart(): one bar per layout, so the chart notes each layout's peak (not only the
    worst one's) and says which training the numbers assume."""
    cmp = sv.compare(model, {f"LoRA {x}": sv.Plan.auto(model, lora=x) for x in ("ignored", "sharded")}, mesh=MESH,
                     training=DEFAULT_TRAINING)
    payload = cmp.memory_payload()
    assert payload["by_layout"] is True and [b["label"] for b in payload["bars"]] == ["LoRA ignored", "LoRA sharded"]
    assert payload["training"] == panels.training_text(DEFAULT_TRAINING) == "AdamW · bf16 params · fp32 reduce · no batch (model state only)"
