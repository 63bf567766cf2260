"""The Inspector's export and verify: the exported code (saved, highlighted, for a target release)
and ``sv.verify`` run from the widget, whose failure says whether torch or shardviz raised.
"""

from __future__ import annotations

import re

import pytest

import shardviz as sv
from widget_helpers import Q0, front_end_source


def test_export_save_and_overwrite(model, st, tmp_path):
    code = st.export_code()
    assert code == sv.export_code(model, st.plan, mesh=st.mesh, training=st.training)
    assert st.export_code("2.6") == sv.export_code(model, st.plan, mesh=st.mesh, training=st.training, torch_version="2.6")
    path = st.save_code(tmp_path / "plan.py")
    assert path.read_text() == code
    with pytest.raises(FileExistsError):
        st.save_code(path, torch_version="2.6")
    assert path.read_text() == code  # never overwritten without confirmation
    st.save_code(path, torch_version="2.6", overwrite=True)
    assert path.read_text() == st.export_code("2.6")
    st.toggle_unit(Q0)
    assert st.export_code() == sv.export_code(model, st.plan, mesh=st.mesh, training=st.training)
    compile(st.export_code(), "plan.py", "exec")


def test_verify_runs_torch(model, st):
    result = st.verify()
    assert result["ok"] and result["n"] == 0 and result["error"] is None
    assert result["plan_json"] == st.plan.to_json(indent=None)


def test_widget_export_tab_save_and_verify(model, ins, tmp_path):
    assert ins.code.get("stale")  # not computed until the tab is opened
    ins.tab = "export"
    assert ins.code["text"] == sv.export_code(model, ins.plan, mesh=ins.mesh, training=ins.training)
    ins.torch_version = "2.6"
    assert ins.code["text"] == sv.export_code(model, ins.plan, mesh=ins.mesh, training=ins.training, torch_version="2.6")
    target = tmp_path / "out.py"
    ack = ins.handle_action("save_code", {"path": str(target)})
    assert ack["ok"] and target.read_text() == ins.code["text"]
    target.write_text("# mine\n")
    ack = ins.handle_action("save_code", {"path": str(target)})
    assert not ack["ok"] and ack["exists"] and target.read_text() == "# mine\n"
    ack = ins.handle_action("save_code", {"path": str(target), "overwrite": True})
    assert ack["ok"] and target.read_text() == ins.code["text"]
    ins.handle_action("toggle_unit", {"fqn": Q0})  # code follows the plan while the tab is open
    assert ins.code["text"] == sv.export_code(model, ins.plan, mesh=ins.mesh, training=ins.training, torch_version="2.6")
    ins.handle_action("remove_unit", {"fqn": ""})  # torch would refuse: the export says why
    assert ins.code["error"] and "SV004" in ins.code["error"]
    ins.handle_action("undo", {})
    ack = ins.handle_action("verify", {})
    assert ack["ok"] and ins.verify_result["ok"] is True


def test_exported_code_is_highlighted_in_python_once(ins):
    """The export arrives as HTML from the one highlighter (pygments, shardviz/views/highlight.py), with
    its line count: the front end parses nothing, and the report uses the same function."""
    import html

    from shardviz import report
    from shardviz.views.highlight import python_html

    ins.tab = "export"
    code = ins.code
    assert code["html"] == python_html(code["text"]) and code["n_lines"] == len(code["text"].splitlines())
    assert html.unescape(re.sub(r"<[^>]+>", "", code["html"])) == code["text"]  # every character, escaped
    assert code["html"].count('<span class="sv-tok-kw">') > 10
    esm = front_end_source()
    assert "TOKEN_RE" not in esm and "PY_KEYWORDS" not in esm and "c.html" in esm
    assert python_html("def f(): pass") in report._highlight("def f(): pass")


def test_a_failing_verification_does_not_blame_torch(model, ins, monkeypatch):
    """Issue 24: verify's own KeyError on a checkpointed plan read "torch raised KeyError"."""
    from shardviz.widget import panels  # where the verify panel's payload calls sv.verify

    def broken(*args, **kwargs):
        return {}["base_model.model.model.layers.0._checkpoint_wrapped_module"]

    monkeypatch.setattr(panels, "verify", broken)
    result = ins.controller.verify()
    assert not result["ok"] and result["raised_by"] == "shardviz" and result["error"].startswith("KeyError")

    def refused(*args, **kwargs):
        import torch

        torch.nn.Linear(2, 2).get_submodule("nope")  # raised inside torch (nn/modules/module.py)

    monkeypatch.setattr(panels, "verify", refused)
    assert ins.controller.verify()["raised_by"] == "torch"
