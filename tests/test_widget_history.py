"""The Inspector's history: mesh and training changes, undo and redo over plan, mesh and training,
and a change that fails (or a plan torch refuses) leaving everything as it was.
"""

from __future__ import annotations

import pytest

import shardviz as sv
from shardviz.widget import panels
from widget_helpers import L0, L1, Q0, assert_numbers_match


def test_mesh_and_training(model, st):
    # memory_reserve=0: the limit is the bytes given (the reserve: test_fits_verdicts_keep_the_reserve)
    st.set_mesh(world=8, replicate=2, device_memory="256KiB", memory_reserve=0)
    assert st.mesh == sv.Mesh(shard=4, replicate=2, device_memory=256 * 1024, memory_reserve=0)
    assert_numbers_match(model, st)
    assert st.memory["limit"] == 256 * 1024
    assert any(f["code"] == "SV201" for f in st.findings)  # the peak does not fit
    with pytest.raises(ValueError, match="not a multiple"):
        st.set_mesh(world=6, replicate=4)
    assert st.mesh.replicate == 2
    st.set_training(optimizer="sgd", param_dtype="bfloat16")
    assert st.training == sv.Training(optimizer="sgd", param_dtype="bfloat16", reduce_dtype="float32")
    assert_numbers_match(model, st)
    with pytest.raises(ValueError, match="no field"):
        st.set_training(learning_rate=1.0)
    st.set_mesh(device_memory=None)
    assert st.mesh.device_memory is None


def test_undo_redo_covers_plan_mesh_and_training(model, st):
    p0, m0, t0 = st.plan, st.mesh, st.training
    st.remove_unit(L0)
    st.set_mesh(world=16)
    st.set_training(optimizer="sgd")
    assert st.undo() and st.training == t0 and st.mesh.world == 16
    assert st.undo() and st.mesh == m0
    assert st.undo() and st.plan == p0
    assert not st.undo()
    assert_numbers_match(model, st)
    assert st.redo() and st.plan.unit_of(L0) is None
    st.make_unit(Q0)  # a new change drops the redo tail
    assert not st.can_redo
    assert_numbers_match(model, st)


def test_failed_action_changes_nothing(model, st):
    st.apply_preset("no-calls")
    st.make_group_unit([Q0, L1])
    before = (st.plan, st.mesh, st.revision, len(st._history))
    with pytest.raises(ValueError, match="no module named"):
        st.make_group_unit([Q0 + "x"])
    # two grouped calls that each sit inside the other cannot be applied bottom-up
    with pytest.raises(ValueError, match="cannot be applied bottom-up"):
        st.make_group_unit([L0, L1 + ".self_attn.q_proj"])
    assert (st.plan, st.mesh, st.revision, len(st._history)) == before


def test_refused_plan_shows_findings_instead_of_raising(model, st):
    st.remove_unit("")  # the [norm, lm_head] group is now a root: torch refuses it
    codes = {f["code"] for f in st.findings}
    assert "SV004" in codes
    assert_numbers_match(model, st)


def test_a_target_release_is_a_new_analysis_the_old_one_unchanged(st):
    old, rev = st.analysis, st.revision
    st.set_torch_version("2.6")
    assert old.torch_version is None  # it was changed in place before
    assert st.analysis is not old and st.analysis.torch_version == "2.6" and st.revision == rev
    assert st.findings == panels.findings_payload(st.analysis)
