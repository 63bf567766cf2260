"""Inputs of the Inspector that must never fail silently (issue 19), checked without a browser:
a preset keeps the checkpointing, junk device memory is refused with a message, a sequence past the
model's positions is warned about, the plan's name counts the user's edits (and is the name the CLI
gives the same plan), messages clear, and a finding's long list can be opened in the tree.
The same inputs are driven in the page by tests/browser/test_inspector_layout.py."""

from __future__ import annotations

import json

import pytest

import shardviz as sv
from shardviz.cli import main as cli_main
from shardviz.widget import Inspector
from widget_helpers import L0, L1, MESH, Q0


def block_run(ins) -> str:
    ins.controller.reveal(Q0)
    order, rows = ins.controller.rows()
    return next(rid for rid in order if rows[rid]["kind"] == "group")


def test_a_preset_keeps_the_checkpointing(model, ins):
    assert ins.handle_action("checkpoint_blocks", {"on": True})["ok"]
    assert ins.plan.name == sv.Plan.auto(model, checkpoint="blocks").name == "auto (LoRA sharded, blocks checkpointed)"
    peak = ins.summary["peak"]
    assert ins.handle_action("apply_preset", {"name": "ignored"})["ok"]
    want = sv.Plan.auto(model, lora="ignored", checkpoint="blocks")
    assert ins.plan == want and ins.plan.name == want.name  # the name Plan.auto and the CLI give it
    assert set(ins.plan.checkpoint) == {L0, L1} and ins.summary["n_checkpointed"] == 2
    assert "keeps your checkpointing (every block)" in ins.messages[-1]["text"]
    assert ins.handle_action("undo", {})["ok"] and ins.summary["peak"] == peak
    # some modules checkpointed: kept too, and the name says the preset was edited once
    ins.controller.uncheckpoint([L1])
    assert ins.handle_action("apply_preset", {"name": "root-only"})["ok"]
    assert ins.plan.checkpoint == (L0,) and [u.modules for u in ins.plan.units] == [("",)]
    assert ins.plan.name == "root only, edited: 1 change"
    assert ins.controls["preset"] == ""  # an edited plan: choosing any preset in the menu applies it



def test_the_preset_menu_compares_plans_not_names(model, ins):
    """The menu selects the preset a plan equals (presets.preset_key), whatever its name: a plan
    named after a preset but with other calls is no preset, a preset under another name is one."""
    ignored = sv.Plan.auto(model, lora="ignored")
    ins.controller.set_plan(sv.Plan(ignored.units, ignored.ignored, "my plan"))
    assert ins.controls["preset"] == "ignored"
    ins.controller.set_plan(sv.Plan([L0, ""], name=sv.Plan.auto(model).name))
    assert ins.controls["preset"] == "" and ins.controls["presets"][0] == ["", "custom or edited plan"]
    ins.controller.set_plan(sv.Plan.auto(model, lora="separate", checkpoint="every 2"))
    assert ins.controls["preset"] == "separate"  # a preset keeps the checkpointing

def test_junk_device_memory_is_refused_with_a_message(ins):
    for text, want in (("80", 80 * 1024**3), ("80GiB", 80 * 1024**3), ("96 GB", 96 * 10**9), ("", None)):
        assert ins.handle_action("set_mesh", {"device_memory": text})["ok"], text
        assert ins.mesh.device_memory == want, text
    assert ins.handle_action("set_mesh", {"device_memory": "1500MiB"})["ok"]
    assert ins.controls["device_text"] == "1.46 GiB"  # the field shows the size, never "1" GiB
    assert ins.handle_action("set_mesh", {"device_memory": "80GiB"})["ok"] and ins.controls["device_text"] == "80"
    for junk in ("abc", "0", "-3", "80 parsecs"):
        ack = ins.handle_action("set_mesh", {"device_memory": junk})
        assert not ack["ok"] and ack["error"].startswith(f"device memory {junk!r}"), ack
        assert ins.mesh.device_memory == 80 * 1024**3 and ins.controls["device_gib"] == 80  # nothing changed
        assert ins.messages[-1]["level"] == "error" and "leave it empty for no limit" in ins.messages[-1]["text"]
    assert ins.summary["use"] is not None  # the percentage and the verdict stay


def test_a_sequence_past_the_models_positions_is_warned_about(model, ins):
    assert model.config.max_position_embeddings == 256
    assert ins.handle_action("set_training", {"seq_len": 128})["ok"] and ins.controls["seq_len_note"] is None
    assert ins.handle_action("set_training", {"seq_len": 10**9})["ok"]
    note = ins.controls["seq_len_note"]
    assert "1,000,000,000" in note and "max_position_embeddings (256)" in note
    assert Inspector(sv.ModelTree(model), mesh=MESH).controls["seq_len_note"] is None  # no config: nothing to say


def test_the_edit_count_is_the_users_actions(model, ins):
    assert ins.handle_action("ignore_lora", {"module_fqn": L0})["ok"]
    assert len(ins.plan.ignored) == 14 and ins.plan.name == "auto (LoRA sharded), edited: 1 change"  # one action
    assert ins.handle_action("toggle_checkpoint", {"fqn": L0})["ok"]
    assert ins.plan.name == "auto (LoRA sharded), edited: 2 changes"
    assert ins.handle_action("toggle_unit", {"fqn": Q0})["ok"]
    assert ins.plan.name == "auto (LoRA sharded), edited: 3 changes"
    assert ins.handle_action("undo", {})["ok"] and ins.plan.name.endswith("edited: 2 changes")
    assert ins.handle_action("toggle_checkpoint", {"fqn": L0})["ok"]  # back as in the preset: no longer an edit
    assert ins.plan.name == "auto (LoRA sharded), edited: 1 change"
    assert ins.handle_action("apply_to_many", {"targets": block_run(ins), "action": "unignore_lora"})["ok"]
    assert ins.plan.name == "auto (LoRA sharded)"  # equal to the preset again
    # checkpointing every block is one action, and a known plan
    assert ins.handle_action("checkpoint_blocks", {"on": True})["ok"]
    assert ins.plan.name == "auto (LoRA sharded, blocks checkpointed)"
    assert ins.handle_action("toggle_checkpoint", {"fqn": L1})["ok"]
    assert ins.plan.name == "auto (LoRA sharded, blocks checkpointed), edited: 1 change"


def test_the_same_plan_has_the_same_name_in_the_widget_the_export_and_the_cli(model, ins, tmp_path):
    ins.controller.apply_preset("ignored")
    ins.controller.checkpoint_blocks()
    out = tmp_path / "plan.json"
    assert cli_main(["plan", "write", "zoo:tiny_llama_lora", "--lora", "ignored", "--checkpoint", "blocks", "-o", str(out)]) == 0
    cli_plan = sv.Plan.from_json(out.read_text())
    assert cli_plan == ins.plan and cli_plan.name == ins.plan.name == ins.summary["plan_name"]
    assert ins.plan.name in ins.controller.export_code()
    assert json.loads(ins.plan.to_json())["name"] == cli_plan.name


def test_messages_name_the_field_and_clear(ins):
    ack = ins.handle_action("set_mesh", {"world": 0, "replicate": 1})
    assert not ack["ok"] and ack["error"].startswith("world size 0") and "replicate" not in ack["error"]
    ack = ins.handle_action("set_mesh", {"world": 8, "replicate": 0})
    assert not ack["ok"] and ack["error"].startswith("HSDP replicate 0")
    assert [m["level"] for m in ins.messages] == ["error", "error"]
    assert ins.handle_action("set_mesh", {"world": 8, "replicate": 1})["ok"]
    assert ins.messages == []  # a change that happens clears the messages about earlier input
    ins.handle_action("set_rank", {"rank": 99})
    assert ins.messages and ins.handle_action("dismiss_messages", {})["ok"] and ins.messages == []


def test_a_findings_long_list_opens_in_the_tree(model, monkeypatch):
    import shardviz.checks

    monkeypatch.setattr(shardviz.checks, "MAX_FQNS", 5)
    ins = Inspector(model, plan=sv.Plan.auto(model, lora="ignored"), mesh=MESH)
    f = next(f for f in ins.findings if f["code"] == "SV102")
    assert len(f["fqns"]) == 5 and f["n_fqns"] == 28
    assert ins.handle_action("filter_finding", {"code": "SV102"})["ok"]
    _order, rows = ins.controller.rows()
    shown = {r["fqn"] for r in rows.values() if r["kind"] == "param"}
    assert len(shown) == 28 and all(".lora_" in q for q in shown)
    assert ins.controller.view.filter_label == "SV102: 28 names"
    assert ins.handle_action("set_filter", {"text": ""})["ok"] and not ins.controller.view.filtering
    assert not ins.handle_action("filter_finding", {"code": "SV999"})["ok"]


def test_finding_counts_read_as_words(model):
    ins = Inspector(model, plan=sv.Plan.auto(model, lora="ignored"), mesh=MESH)
    counts = ins.summary["findings"]
    words = {k: f"{n} {k}{'' if n == 1 or k == 'info' else 's'}" for k, n in counts.items()}
    assert ins.summary["findings_text"] == {**words, "total": f"{len(ins.findings)} finding{'' if len(ins.findings) == 1 else 's'}"}
    assert ins.summary["findings_text"]["warning"] == "1 warning"


def test_one_count_of_findings_and_plural_words(model):
    """Issue 24: the Findings tab said (2) while the summary said 1 (it counted errors and warnings
    only); "1 calls", "FSDP 1 ranks"; the fix read "fix: cheapest fix: ..."."""
    ins = Inspector(model, plan=sv.Plan([""]), mesh=sv.Mesh(shard=1))
    assert ins.summary["findings_text"]["total"].startswith(f"{len(ins.findings)} finding")  # the tab's count
    assert any(f["severity"] == "info" for f in ins.findings) or len(ins.findings) == sum(ins.summary["findings"].values())
    assert ins.summary["plan_text"].startswith(": 1 call ·") and ins.summary["mesh"] == "FSDP 1 rank"
    assert str(sv.Mesh(shard=8)) == "FSDP 8 ranks"


# -- issue 24: every field validated as the API reads it ---------------------------------------------
def test_a_device_name_in_the_memory_field_is_the_device(model, ins):
    assert ins.handle_action("set_mesh", {"device_memory": "h100"})["ok"]  # as sv.Mesh(device="H100") takes it
    want = sv.Mesh(shard=4, device="H100")
    assert ins.mesh == want and ins.controls["device_text"] == "80"
    assert ins.summary["limit"] == want.usable_memory


def test_clearing_the_memory_of_a_device_is_refused_not_ignored(model):
    ins = Inspector(model, mesh=sv.Mesh(shard=4, device="H100"))
    ack = ins.handle_action("set_mesh", {"device_memory": ""})
    assert not ack["ok"] and "H100 has 80.00 GiB" in ack["error"]
    assert ins.mesh.device_memory == 80 * 1024**3 and ins.controls["device_text"] == "80"  # the field shows it again


@pytest.mark.parametrize(("text", "why"), [("1e99", "far above any device"), ("0.5", "not more than the 1.00 GiB"),
                                           ("512MiB", "not more than the 1.00 GiB")])
def test_device_memory_out_of_range_is_refused(ins, text, why):
    before = ins.mesh
    ack = ins.handle_action("set_mesh", {"device_memory": text})
    assert not ack["ok"] and why in ack["error"] and ack["error"].startswith(f"device memory {text!r}")
    assert ins.mesh == before


@pytest.mark.parametrize(("action", "args", "want"), [
    ("set_rank", {"rank": 2.7}, "rank 2.7: give a whole number (closest: 3)"),
    ("set_rank", {"rank": 9}, "rank 9: give a number from 0 to 3 (closest: 3)"),
    ("set_mesh", {"world": 7.5}, "world size 7.5: give a whole number (closest: 8)"),
    ("set_training", {"batch_size": 2.5}, "batch size 2.5: give a whole number (closest: 2)"),
    ("set_training", {"batch_size": 10**9}, "tokens per rank"),
    ("set_training", {"batch_size": 1, "seq_len": 10**9}, "closest: sequence length 16,777,216"),
    ("set_training", {"seq_len": 0}, "sequence length 0: give a number 1 or more (closest: 1)"),
])
def test_counts_are_whole_and_in_range_never_rounded(ins, action, args, want):
    import time

    before = (ins.mesh, ins.training, ins.controller.view.rank)
    t0 = time.perf_counter()
    ack = ins.handle_action(action, args)
    assert time.perf_counter() - t0 < 1  # refused at once (batch 1e9 ran 16.5 s into an OverflowError)
    assert not ack["ok"] and want in ack["error"], ack["error"]
    assert (ins.mesh, ins.training, ins.controller.view.rank) == before


def test_the_default_sequence_length_is_not_flagged(model):
    ins = Inspector(model, mesh=MESH)  # no training given: the default 2048 is not the user's
    assert ins.training.seq_len > model.config.max_position_embeddings and ins.controls["seq_len_note"] is None
    assert ins.handle_action("set_training", {"seq_len": 4096})["ok"] and ins.controls["seq_len_note"]


@pytest.mark.parametrize(("args", "field"), [
    ({"tensor": 3}, "tensor"),  # 4 ranks: no divisor (was "tensor degree 3")
    ({"tensor": 2.5}, "tensor"),  # (was "tensor parallel 2.5")
    ({"tensor": 0}, "tensor"),
    ({"world": 6, "replicate": 4}, "replicate"),
    ({"device_memory": "-5"}, "device_memory"),  # was read as a device name
    ({"device_memory": "0"}, "device_memory"),
    ({"device_memory": "abc"}, "device_memory"),
])
def test_each_field_has_one_name_in_its_messages_and_is_named_for_highlighting(ins, args, field):
    """Issue 37: the field labelled "TP" was "tensor degree", "tensor parallel" and "tensor_parallel" in
    its messages; the bad field was never highlighted. Each refusal now starts with the field's label
    (inputs.FIELD_NAMES, the label the controls show) and the ack names the field to highlight."""
    from shardviz.widget.inputs import FIELD_NAMES

    ack = ins.handle_action("set_mesh", args)
    assert not ack["ok"] and ack["field"] == field, ack
    assert ack["error"].startswith(FIELD_NAMES[field]), ack["error"]
    other_names = {"tensor degree", "tensor parallel", "tensor_parallel"} - {FIELD_NAMES[field]}
    assert not any(n in ack["error"] for n in other_names), ack["error"]


def test_signed_and_zero_device_memory_say_what_is_wanted(ins):
    """'-5' was read as a device name ("no device named '-5'"); '0' did not say that the size must
    exceed the reserve."""
    minus = ins.handle_action("set_mesh", {"device_memory": "-5"})["error"]
    zero = ins.handle_action("set_mesh", {"device_memory": "0"})["error"]
    assert "never negative" in minus and "more than the 1.00 GiB reserve" in minus and "device named" not in minus
    assert "is not more than the 1.00 GiB" in zero and "give more than 1.00 GiB" in zero
