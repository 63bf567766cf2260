"""The Inspector's plan file reads both versions and keeps what a version-2 file records of the run
(the mesh and training ``shardviz plan search`` wrote) through the Inspector's later saves."""

from __future__ import annotations

import json

import shardviz as sv
from shardviz import zoo
from shardviz.run.setup import read_setup, setup_obj
from shardviz.widget.planfile import PlanFile


def test_a_searched_file_keeps_its_mesh_and_training_through_an_edit(tmp_path):
    model = zoo.tiny_llama_lora()
    plan = sv.Plan.auto(model)
    mesh, training = sv.Mesh(4, replicate=2, device="H100"), sv.Training(param_dtype="bfloat16", batch_size=2)
    path = tmp_path / "p.json"
    path.write_text(plan.to_json(setup=setup_obj(mesh, training)))
    file = PlanFile(path)
    loaded = file.load(model)
    assert loaded.plan == plan and read_setup(loaded.plan) == (mesh, training)
    edited = loaded.plan.with_ignored([p for p, _ in model.named_parameters() if "lora_" in p][:1])
    assert edited.setup == {}  # an edit is a new plan; the file still knows its run
    assert file.save(edited)
    back = sv.Plan.from_json(path.read_text())
    assert back == edited and read_setup(back) == (mesh, training)
    assert json.loads(path.read_text())["version"] == 2


def test_a_version_1_file_reads_and_stays_version_1(tmp_path):
    model = zoo.tiny_llama_lora()
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"schema": "shardviz.plan", "version": 1, "name": "", "units": [""], "ignored": []}))
    file = PlanFile(path)
    assert file.load(model).plan == sv.Plan([""])
    assert file.save(sv.Plan.auto(model)) and json.loads(path.read_text())["version"] == 1


def test_a_file_whose_calls_miss_blocks_is_restored_with_an_error_naming_them(tmp_path):
    """A plan made for a shorter model (or an edit that left blocks out): restored, nothing lost, and
    the message names the blocks without a call of their own and the call that would gather them."""
    model = zoo.tiny_llama_lora()
    plan = sv.Plan.auto(model)
    layer1 = next(u.name for u in plan.units if u.name.endswith("layers.1"))
    short = plan.without_unit(layer1) if hasattr(plan, "without_unit") else plan.with_units(
        [u for u in plan.units if u.name != layer1])
    path = tmp_path / "p.json"
    path.write_text(short.to_json())
    loaded = PlanFile(path).load(model)
    assert loaded.plan == short and loaded.level == "error"
    assert "its units miss 1 of the 2 blocks" in loaded.message and repr(layer1) in loaded.message
    assert "root call" in loaded.message


def test_a_file_naming_modules_the_model_lacks_lists_every_one(tmp_path):
    model = zoo.tiny_llama_lora()
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"schema": "shardviz.plan", "version": 1, "name": "", "units": ["a.b", "c.d", ""],
                                "ignored": ["x.weight"]}))
    file = PlanFile(path)
    loaded = file.load(model)
    assert loaded.plan is None and not file.writable
    assert "units: no modules named 'a.b', 'c.d' in" in loaded.message
    assert "ignored: no parameter named 'x.weight'" in loaded.message
