"""One plan, one name: the export and the command line name a plan after the preset it equals
(``presets.named_plan``), however it was built (issue 19: "the same plan gets the same name")."""

from __future__ import annotations

import shardviz as sv
from shardviz import zoo
from shardviz.cli import main
from shardviz.plan import LORA_OPTIONS
from shardviz.presets import PRESETS, named_plan, preset_plan, preset_plans


def header(code: str) -> str:
    return " ".join(line[2:] for line in code.splitlines()[:6] if line.startswith("#"))


def test_a_plan_equal_to_a_preset_goes_by_the_preset_name(tmp_path, capsys):
    model = zoo.tiny_llama_lora()
    preset = sv.Plan.auto(model, lora="ignored", checkpoint="blocks")
    edited = sv.Plan.auto(model, lora="ignored").with_checkpoint(preset.checkpoint)  # "checkpoint all blocks"
    assert edited == preset and edited.name == "auto (LoRA ignored)" != preset.name
    assert named_plan(sv.ModelTree(model), edited).name == preset.name

    assert repr(preset.name) in header(sv.export_code(model, edited, mesh=sv.Mesh(8)))
    path = tmp_path / "plan.json"
    path.write_text(edited.to_json())
    assert main(["plan", "read", str(path), "--model", "zoo:tiny_llama_lora", "--world-size", "8"]) in (0, 1)
    assert capsys.readouterr().out.startswith(f"plan {preset.name}: ")
    assert main(["export", "zoo:tiny_llama_lora", "--plan", str(path), "--world-size", "8", "-q"]) == 0
    assert repr(preset.name) in header(capsys.readouterr().out)


def test_other_plans_keep_their_own_name():
    model = zoo.tiny_llama_lora()
    tree = sv.ModelTree(model)
    mine = sv.Plan(["base_model.model.model.layers.0", "base_model.model.model.layers.1", ""], name="mine")
    assert named_plan(tree, mine).name == "mine"
    assert "'mine'" in header(sv.export_code(model, mine, mesh=sv.Mesh(8)))
    names = list(preset_plans(tree))
    assert names[:2] == ["auto (LoRA sharded)", "auto (LoRA ignored)"] and names[-2:] == ["root only", "no calls"]


def test_a_preset_key_is_what_the_cli_and_plan_auto_take(tmp_path):
    """One spelling (issue 25): the menu key a user reads in the widget ("ignored") is the ``--lora``
    they type and the ``Plan.auto(lora=...)`` they write."""
    model = zoo.tiny_llama_lora()
    tree = sv.ModelTree(model)
    auto = [p.key for p in PRESETS if p.lora]
    assert auto == list(LORA_OPTIONS)
    for key in auto:
        path = tmp_path / f"{key}.json"
        assert main(["plan", "write", "zoo:tiny_llama_lora", "--lora", key, "-o", str(path)]) == 0
        assert sv.Plan.from_json(path.read_text()) == preset_plan(tree, key) == sv.Plan.auto(model, lora=key)


def test_a_model_without_lora_is_not_named_after_lora():
    """A plain model's auto plan is "auto", not "auto (LoRA sharded)" (three LoRA options, one plan)."""
    plain = zoo.tiny_llama_lora(lora=False)
    assert not any(p.role == "lora" for p in sv.ModelTree(plain).params)
    assert sv.Plan.auto(plain).name == "auto"
    assert sv.Plan.auto(plain, checkpoint="blocks").name == "auto (blocks checkpointed)"
    assert sv.Plan.auto(zoo.tiny_llama_lora(), checkpoint="blocks").name == "auto (LoRA sharded, blocks checkpointed)"
