"""The Inspector's plan file reads both versions and keeps what a version-2 file records of the run
(the mesh and training ``shardviz plan search`` wrote) through the Inspector's later saves."""

from __future__ import annotations

import json

import shardviz as sv
from shardviz import zoo
from shardviz.cost.setup import read_setup, setup_obj
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
