"""What a user reads in the Inspector (issue 11), checked without a browser: each label is made of
numbers computed in Python, and each test would have caught the misleading label it names.
The same labels are read in the page by tests/browser/test_inspector_labels.py."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import shardviz as sv
from shardviz import zoo
from shardviz.views import display
from shardviz.widget import Inspector, InspectorState
from shardviz.widget.controller import DEFAULT_TRAINING, plan_changes
from widget_helpers import L0, MESH, Q0


def test_findings_count_what_is_left_not_what_is_listed(model, monkeypatch):
    """ "1120 trainable parameters are ignored ... and 46 more": the "more" must count every name
    beyond the ones shown, not the 50 names the finding keeps."""
    import shardviz.checks

    monkeypatch.setattr(shardviz.checks, "MAX_FQNS", 5)  # the tiny model has 28 LoRA parameters
    st = InspectorState(model, plan=sv.Plan.auto(model, lora="ignored"), mesh=MESH)
    f = next(f for f in st.findings if f["code"] == "SV102")
    n_lora = sum(p.role == "lora" for p in st.tree.params)
    assert len(f["fqns"]) == 5 and f["n_fqns"] == n_lora
    assert f"{n_lora} trainable parameters" in f["message"]
    # every finding that lists names carries how many there are in all
    for f in sv.analyze(model, sv.Plan.auto(model, lora="ignored"), MESH).findings:
        assert f.n_fqns >= len(f.fqns)
    empty = sv.analyze(model, sv.Plan.auto(model, lora="sharded"), sv.Mesh(64)).findings
    sv108 = next(f for f in empty if f.code == "SV108")
    assert len(sv108.fqns) == 5 and sv108.n_fqns > 5


def test_edited_plan_says_so_and_matching_a_preset_takes_its_name(model, tmp_path):
    path = tmp_path / "plan.json"
    ins = Inspector(model, mesh=MESH, plan_path=path)
    ins.controller.apply_preset("ignored")
    assert ins.plan.name == "auto (LoRA ignored)"
    ins.controller.unignore_lora("")  # every LoRA parameter back: that is the "sharded" preset, and says so
    assert ins.plan == sv.Plan.auto(model, lora="sharded")
    assert ins.plan.name == "auto (LoRA sharded)"
    assert "LoRA ignored" not in ins.summary["plan_name"]
    ins.controller.make_unit(Q0)
    ins.controller.remove_unit(L0)
    ins.controller.ignore([Q0 + ".lora_A.default.weight"])
    assert ins.plan.name == "auto (LoRA sharded), edited: 3 changes"
    assert ins.summary["plan_name"] == ins.plan.name
    assert json.loads(path.read_text())["name"] == ins.plan.name  # the saved plan carries it
    assert "auto (LoRA sharded), edited: 3 changes" in ins.controller.export_code()  # and the export header
    ins.controller.undo()
    assert ins.plan.name == "auto (LoRA sharded), edited: 2 changes"
    ins.controller.make_unit(L0)  # undoes the removal by hand: one change left
    assert ins.plan.name == "auto (LoRA sharded), edited: 1 change"
    assert plan_changes(sv.Plan.auto(model), ins.plan) == 1


def test_a_custom_plan_keeps_its_name_with_the_edit_count(model):
    st = InspectorState(model, plan=sv.Plan([L0, ""], name="mine"), mesh=MESH)
    st.make_unit(Q0)
    assert st.plan.name == "mine, edited: 1 change"
    st.remove_unit(Q0)
    assert st.plan.name == "mine"


def test_default_training_is_the_comparison_tables(model):
    import re
    from pathlib import Path

    table = (Path(__file__).parents[1] / "benchmarks" / "bench_table.py").read_text()
    assert 'TRAINING = sv.Training(optimizer="adamw", param_dtype="bfloat16", reduce_dtype="float32")' in table
    st = InspectorState(model, mesh=MESH)
    assert st.training == DEFAULT_TRAINING == sv.Training(optimizer="adamw", param_dtype="bfloat16", reduce_dtype="float32")
    assert re.search(r"AdamW, `MixedPrecisionPolicy\(param_dtype=bf16, reduce_dtype=fp32\)`",
                     (Path(__file__).parents[1] / "docs" / "comparison.md").read_text())


def test_peak_uses_is_computed_in_python_and_only_red_when_over(model):
    st = InspectorState(model, mesh=sv.Mesh(shard=4, device_memory="80GiB"))
    use = st.memory["use"]
    assert not use["over"] and use["percent_text"] == "<0.1%"
    # the limit is the usable memory: device memory less the reserve (Mesh.memory_reserve, 1 GiB by default)
    assert use["text"].startswith("fits: reserved peak ") and "of 79.00 GiB usable, " in use["text"]
    assert use["limit_text"] == "79.00 GiB usable (80.00 GiB − 1.00 GiB reserve)"
    st.set_mesh(device_memory=1024**2, memory_reserve=0)
    use = st.memory["use"]
    assert use["fraction"] == use["judged"] / 1024**2 and use["judged"] >= st.memory["max_peak"]  # the judged peak
    st.set_mesh(device_memory=1024)
    assert st.memory["use"]["over"] and "does not fit" in st.memory["use"]["text"]


def test_filter_with_no_match_says_so(model):
    ins = Inspector(model, mesh=MESH)
    ins.handle_action("set_filter", {"text": "no_such_module", "status": "", "role": ""})
    msg = [m for m in ins._outbox if m["type"] == "rows"][-1]
    assert msg["filtering"] and msg["matches"] == 0
    ins.handle_action("set_filter", {"text": "lora_B"})
    msg = [m for m in ins._outbox if m["type"] == "rows"][-1]
    assert msg["matches"] > 0


def test_save_answers_the_absolute_path(model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ins = Inspector(model, mesh=MESH)
    ack = ins.handle_action("save_code", {"path": "fsdp_plan.py"})
    assert ack["ok"] and ack["path"] == str(tmp_path / "fsdp_plan.py")


def test_modules_without_parameters_offer_no_unit(model):
    st = InspectorState(model, mesh=MESH)
    st.reveal(Q0 + ".lora_A.default.weight")
    _order, rows = st.rows()
    by = {r["fqn"]: r for r in rows.values() if r["kind"] == "module"}
    for empty in ("lora_dropout", "lora_embedding_A", "lora_embedding_B"):
        assert by[f"{Q0}.{empty}"]["can_unit"] is False
    assert by[f"{Q0}.lora_A"]["can_unit"] is True


def test_tied_embedding_counted_once_in_subtree_sizes():
    """T5: the shared embedding is tied into the encoder and the decoder; encoder + decoder must not
    exceed the whole model."""
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_heads=2)
    with torch.device("meta"):
        t5 = T5ForConditionalGeneration(cfg)
    st = InspectorState(t5, mesh=MESH)
    numel = st.view.static.numel
    idx = st.tree.module_index
    total = sum(p.numel for p in st.tree.params)
    assert numel[0] == total
    children = [c for c in st.tree.modules[0].children]
    assert sum(numel[c] for c in children) == total
    assert numel[idx["encoder"]] + numel[idx["decoder"]] < total
    st.reveal("decoder.embed_tokens")
    row = next(r for r in st.rows()[1].values() if r.get("fqn") == "decoder.embed_tokens")
    assert row["numel"] == 0 and row["tied_numel"] == 64 * 16


def test_chart_labels_keep_the_end_that_names_the_module():
    names = ["base_model.model.model.layers.1", "base_model.model.model.layers.10",
             "[base_model.model.model.norm, base_model.model.lm_head]", None, ""]
    got = display.short_labels(names)
    assert got[:2] == ["model.layers.1", "model.layers.10"]
    assert got[2] == "[model.norm, lm_head]"
    assert got[3] == "(outside FSDP)"
    long = display.short_labels(["a.very_long_module_name.layers.11.mlp.down_proj", "b.x"], width=24)
    assert long[0] == "…layers.11.mlp.down_proj" and not long[0].startswith("…_")
    # only blocks among the names (Qwen3-MoE's largest calls): the chart read "0", "1", ... for them
    blocks = display.short_labels([f"base_model.model.model.layers.{i}" for i in range(3)])
    assert blocks == ["layers.0", "layers.1", "layers.2"]
    assert display.short_labels(["m.layers.0.mlp.experts.1", "m.layers.0.mlp.experts.2"]) == ["experts.1", "experts.2"]


def test_traffic_payload_has_labels_and_names(model):
    st = InspectorState(model, mesh=MESH)
    for u in st.traffic["by_unit"]:
        if u["unit"].startswith("[") or u["unit"] == "<root>":
            continue
        assert u["unit"].endswith(u["label"].lstrip("…")), u  # the end of the name, whole parts


def test_a_module_with_no_parameters_at_all():
    st = InspectorState(nn.Sequential(nn.Linear(2, 2), nn.ReLU()), mesh=sv.Mesh(shard=2))
    rows = st.rows()[1]
    st.expand("m0")
    rows = {r["fqn"]: r for r in st.rows()[1].values()}
    assert rows["1"]["can_unit"] is False and rows["0"]["can_unit"] is True


def test_the_history_carries_the_base_and_the_edits_not_the_name(model):
    # a user's name that merely contains ", edited" is a base like any other: never cut at it
    st = InspectorState(model, plan=sv.Plan([L0, ""], name="mine, edited by hand"), mesh=MESH)
    st.make_unit(Q0)
    assert st.plan.name == "mine, edited by hand, edited: 1 change"
    assert st.current.base == "mine, edited by hand" and len(st.current.edits) == 1
    st.remove_unit(Q0)
    assert st.plan.name == "mine, edited by hand" and st.current.edits == ()
    st.apply_preset("root-only")
    st.make_unit(Q0)
    assert st.plan.name == "root only, edited: 1 change"
    assert st.current.base == "root only" and sum(e.weight for e in st.current.edits) == 1


def test_a_restored_plan_file_counts_on_from_its_edits(model, tmp_path):
    path = tmp_path / "plan.json"
    st = InspectorState(model, mesh=MESH, plan_path=path)
    st.make_unit(Q0)
    st.remove_unit(L0)
    assert st.plan.name == "auto (LoRA sharded), edited: 2 changes"
    assert json.loads(path.read_text())["edited"] == {"base": "auto (LoRA sharded)", "edits": 2}  # as data
    again = InspectorState(model, mesh=MESH, plan_path=path)
    assert again.plan == st.plan and again.plan.name == st.plan.name
    assert again.current.base == "auto (LoRA sharded)"
    again.ignore([Q0 + ".lora_A.default.weight"])
    assert again.plan.name == "auto (LoRA sharded), edited: 3 changes"
    other = InspectorState(model, mesh=MESH)
    other.set_plan(again.plan)  # another Inspector's plan counts on too: the count goes with the plan
    other.ignore([Q0 + ".lora_B.default.weight"])
    assert other.plan.name == "auto (LoRA sharded), edited: 4 changes"


def test_a_name_is_never_parsed_for_a_base(model):
    """A user's plan whose name merely reads like an Inspector's ("..., edited: 5 changes") is a base
    like any other: no count is read out of the name (issue 25; it was parsed before)."""
    mine = sv.Plan([L0, ""], name="auto (LoRA sharded), edited: 5 changes")
    st = InspectorState(model, plan=mine, mesh=MESH)
    assert st.current.base == mine.name and st.current.edits == ()
    st.make_unit(Q0)
    assert st.plan.name == "auto (LoRA sharded), edited: 5 changes, edited: 1 change"
    st.remove_unit(Q0)
    assert st.plan.name == mine.name


def test_every_preset_is_a_known_base(model):
    st = InspectorState(model, mesh=MESH)
    st.apply_preset("root-only")
    assert st.plan.name == "root only"
    st.make_unit(L0)
    assert st.plan.name == "root only, edited: 1 change"
    st.remove_unit(L0)
    st.remove_unit("")
    assert st.plan.name == "no calls"  # equal to a preset: its name


def test_batch_size_brings_activations_into_the_chart_and_the_moment_of_the_peak(model):
    ins = Inspector(model, mesh=MESH)
    assert ins.memory["bars"][0]["parts"]["activations"] == 0  # no batch: model state only
    assert ins.handle_action("set_training", {"batch_size": 2, "seq_len": 64})["ok"]
    a = sv.analyze(model, ins.plan, MESH, ins.training)
    parts = ins.memory["bars"][0]["parts"]
    assert parts == display.peak_breakdown(a, ins.memory["bars"][0]["first"])
    assert parts["activations"] > 0 and sum(parts.values()) == ins.memory["bars"][0]["peak"]
    worst = ins.memory["worst"]
    row = a.memory.loc[a.memory["peak"].idxmax()]
    assert (worst["phase"], worst["unit"]) == (row["peak_phase"], row["peak_unit"])
    assert worst["activations"] == int(row["activations"])
    # checkpointing every block: the chart follows analyze of the checkpointed plan
    assert ins.handle_action("checkpoint_blocks", {"on": True})["ok"]
    b = sv.analyze(model, ins.plan, MESH, ins.training)
    assert ins.plan.checkpoint and ins.memory["bars"][0]["parts"] == display.peak_breakdown(b, ins.memory["bars"][0]["first"])


@pytest.mark.parametrize("mesh", [sv.Mesh(shard=1, replicate=64, device="H100"), sv.Mesh(shard=4, replicate=2, device="H100"),
                                  sv.Mesh(shard=8, device="H100")], ids=str)
def test_the_timeline_shows_every_collective_of_the_traffic_table(mesh):
    """Issue 24: on HSDP 64 x 1 the timeline drew zero-length all-gathers and no all-reduce while
    the traffic table had the all-reduces; its call labels became bare numbers ("0", not "layers.0")."""
    from collections import Counter

    model = zoo.tiny_llama_lora()
    ins = Inspector(model, mesh=mesh, training=sv.Training(batch_size=1, seq_len=32))
    a = ins.analysis
    tl = ins.timeline
    drawn = Counter(e["kind"] for e in tl["events"] if e["kind"] in ("all_gather", "reduce_scatter", "all_reduce"))
    table = a.comm[a.comm.unit.notna()].groupby("collective")["count"].sum()
    assert drawn == Counter({k: int(v) for k, v in table.items()}), (drawn, table)
    assert all(e["end_s"] > e["start_s"] for e in tl["events"])
    assert all(not label.isdigit() for label in tl["labels"].values())


def test_the_summary_names_the_model_as_the_report_and_the_export_do(model):
    """The summary line said "PeftModelForCausalLM" (the peft wrapper's class) where the header card,
    the report and the export say "LlamaForCausalLM + LoRA" (issue 37: one model name)."""
    from shardviz.model.tree import model_name

    ins = Inspector(model, mesh=MESH, training=sv.Training(batch_size=1, seq_len=16))
    ins.pushes.worker.wait(60)
    name = model_name(ins.controller.tree)
    assert name == "LlamaForCausalLM + LoRA"
    assert ins.summary["model"] == name == ins.summary["card"]["model"]
    assert f"on {name}; mesh" in ins.controller.export_code().splitlines()[0]


def test_a_model_without_a_tensor_parallel_plan_is_named_as_itself_not_as_its_peft_wrapper():
    """TP 2 on a model with no plan of its own: the message named "PeftModel", which every peft
    model is; the user's model is the one without a plan."""
    from peft import LoraConfig, get_peft_model

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    st = InspectorState(get_peft_model(Net(), LoraConfig(r=2, target_modules=["0", "1"])), mesh=sv.Mesh(4))
    with pytest.raises(ValueError, match=r"^Net \+ LoRA has no tensor-parallel plan of its own"):
        st.set_tensor(2)
