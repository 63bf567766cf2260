"""The Inspector's plan file: saved after every change, restored, and never overwritten when it
is corrupt, for another model, not applicable, or changed by someone else.
"""

from __future__ import annotations

import json

import pytest

import shardviz as sv
from shardviz.widget import Inspector, InspectorState
from widget_helpers import L0, L1, MESH, Q0, saved


def test_plan_file_saved_after_every_change_and_restored(model, tmp_path):
    path = tmp_path / "plan.json"
    st = InspectorState(model, mesh=MESH, plan_path=path)
    assert saved(path) == st.plan  # on disk from the start
    st.remove_unit(L0)
    assert saved(path) == st.plan
    st.ignore_lora(L1)
    assert saved(path) == st.plan
    st.undo()
    assert saved(path) == st.plan
    st.redo()
    current = st.plan
    assert not [p for p in tmp_path.iterdir() if p.name != "plan.json"]  # no temporary files left
    # "kernel crash": a new Inspector on the same path gets every toggle back
    again = InspectorState(model, mesh=MESH, plan_path=path)
    assert again.plan == current
    assert "restored" in again.messages[-1]["text"]
    # the file wins over an explicit starting plan
    third = InspectorState(model, plan=sv.Plan([""]), mesh=MESH, plan_path=path)
    assert third.plan == current


@pytest.mark.parametrize(
    "content, why",
    [
        ("{not json", "not a valid shardviz plan"),
        (json.dumps({"schema": "other"}), "not a valid shardviz plan"),
        (sv.Plan(["model.layers.0"]).to_json(), "does not match this model"),
        (sv.Plan([""], ignored=["x.weight"]).to_json(), "does not match this model"),
    ],
)
def test_corrupt_or_mismatched_plan_file_is_never_overwritten(model, tmp_path, content, why):
    path = tmp_path / "plan.json"
    path.write_text(content)
    st = InspectorState(model, mesh=MESH, plan_path=path)
    assert st.plan == sv.Plan.auto(model)  # started from the default, with a clear message
    assert st.messages[-1]["level"] == "error" and why in st.messages[-1]["text"]
    assert "autosave is OFF" in st.messages[-1]["text"]
    assert st.plan_file_status()["autosave"] is False
    st.remove_unit(L0)
    st.ignore_lora(L1)
    assert path.read_text() == content  # untouched
    st.overwrite_plan_file()  # the explicit decision
    assert saved(path) == st.plan and st.plan_file_status()["autosave"] is True
    st.undo()
    assert saved(path) == st.plan


def test_plan_file_that_cannot_be_applied_is_refused(model, tmp_path):
    # real names, but two grouped calls that each sit inside the other: no bottom-up order
    path = tmp_path / "plan.json"
    content = sv.Plan([[Q0, L1], [L0, L1 + ".self_attn.q_proj"], ""]).to_json()
    path.write_text(content)
    st = InspectorState(model, mesh=MESH, plan_path=path)
    assert st.plan == sv.Plan.auto(model)
    assert "cannot be applied" in st.messages[-1]["text"] and not st.plan_file_status()["autosave"]
    st.remove_unit(L0)
    assert path.read_text() == content


def test_plan_file_changed_by_someone_else_is_not_overwritten(model, tmp_path):
    path = tmp_path / "plan.json"
    st = InspectorState(model, mesh=MESH, plan_path=path)
    other = sv.Plan([""]).to_json()
    path.write_text(other)
    st.remove_unit(L0)
    assert path.read_text() == other
    assert "changed by someone else" in st.messages[-1]["text"]
    assert st.plan_file_status()["autosave"] is False


def test_widget_plan_file_messages(model, tmp_path):
    path = tmp_path / "p.json"
    path.write_text("garbage")
    ins = Inspector(model, mesh=MESH, plan_path=path)
    assert ins.summary["plan_file"]["autosave"] is False
    assert "not a valid shardviz plan" in ins.summary["plan_file"]["problem"]
    ins.handle_action("remove_unit", {"fqn": L0})
    assert path.read_text() == "garbage"
    ins.handle_action("overwrite_plan_file", {})
    assert saved(path) == ins.plan and ins.summary["plan_file"]["autosave"] is True
