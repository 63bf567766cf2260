"""A plan file carries its mesh and training: ``plan search -o p.json`` -> ``export --plan p.json``
-> ``report --plan p.json`` give the same plan, mesh, precision and peak with no flag repeated;
a flag given explicitly overrides the file and the output says so. Old (version 1) files still read."""

from __future__ import annotations

import functools
from pathlib import Path
import json
from dataclasses import replace

import pytest

import shardviz as sv
from shardviz import zoo
from shardviz.cli import main
from shardviz.run.setup import read_setup, setup_obj
from shardviz.format import format_bytes
from shardviz.views.display import DEFAULT_TRAINING

WORLD, BATCH, SEQ = 16, 2, 256
SEARCH = ["plan", "search", "zoo:tiny_llama_lora", "--world-size", str(WORLD), "--device", "H100-80GB",
          "--batch-size", str(BATCH), "--seq-len", str(SEQ)]


@functools.lru_cache(maxsize=None)
def searched():
    """What sv.search finds for the same question, from Python (the one default training)."""
    model = zoo.tiny_llama_lora()
    training = replace(DEFAULT_TRAINING, batch_size=BATCH, seq_len=SEQ)
    return model, sv.search(model, mesh=sv.Mesh(WORLD, device="H100"), training=training), training


def run(argv, capsys):
    """Exit code, stdout, stderr; the terminal's lines (wrapped at 100 columns) joined back."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    if out.startswith(("<", "#", "{")):  # HTML, code or JSON: as written
        return code, out, " ".join(err.split())
    assert all(len(line) <= 100 for line in out.splitlines())
    return code, " ".join(out.split()), " ".join(err.split())


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("plan") / "p.json"
    assert main(SEARCH + ["-o", str(path)]) == 0
    return path


def test_the_search_writes_its_mesh_and_training(plan_file):
    _, s, training = searched()
    plan = sv.Plan.from_json(plan_file.read_text())
    mesh, trained = read_setup(plan)
    assert json.loads(plan_file.read_text())["version"] == 2
    assert plan == s.best and mesh == s.best_mesh and trained == (s.best_training or training)
    assert mesh.is_hsdp and mesh.device.name == "H100"  # the HSDP split the search chose, and the device


def test_search_export_report_reproduce_the_same_peak_with_no_flag_repeated(plan_file, tmp_path, capsys):
    model, s, training = searched()
    code, out, err = run(["export", "zoo:tiny_llama_lora", "--plan", plan_file], capsys)
    assert code == 0
    assert out == sv.export_code(model, s.best, mesh=s.best_mesh, training=s.best_training or training)
    assert f"MESH_SHAPE = {s.best_mesh.shape}" in out and "MixedPrecisionPolicy(" in out
    assert f"from {plan_file}" in err

    report = tmp_path / "r.html"
    code, out, err = run(["report", "zoo:tiny_llama_lora", "--plan", plan_file, "-o", report], capsys)
    assert code == 0 and report.exists()
    peak = int(s.table.peak.iloc[0])
    a = sv.analyze(model, s.best, s.best_mesh, s.best_training or training)
    assert int(a.memory.peak.max()) == peak  # torch's number, the search's and the report's: one
    assert f"verdict: {a.fit.headline} on rank 0" in " ".join(out.split())  # the one verdict, on stdout
    assert f"(allocated {format_bytes(peak)})" in " ".join(out.split())
    assert f"mesh: {s.best_mesh} of H100" in out and f"(from {plan_file})" in out
    assert "step " in out and "tokens/s" in out  # the file's device gives the step time
    assert "wrote" in err and "verdict" not in err


def test_a_flag_overrides_the_file_and_says_so(plan_file, capsys):
    code, html, err = run(["report", "zoo:tiny_llama_lora", "--plan", plan_file, "--param-dtype", "none",
                           "--world-size", "8", "--no-compare"], capsys)
    assert code == 0 and html.startswith("<!DOCTYPE html>")  # without -o the HTML is stdout, the answer stderr
    assert f"--param-dtype over the training from {plan_file}" in err and "model dtype params" in err
    assert "--world-size override it" in err and "FSDP 8 ranks of H100" in err


def test_a_version_1_file_still_reads_and_needs_its_mesh(tmp_path, capsys):
    model = zoo.tiny_llama_lora()
    old = tmp_path / "old.json"
    old.write_text(sv.Plan.auto(model).to_json())
    assert json.loads(old.read_text())["version"] == 1  # no setup: written as before
    code, _, err = run(["export", "zoo:tiny_llama_lora", "--plan", old, "-q"], capsys)
    assert code == 2 and "--world-size is required" in err and len(err.strip().splitlines()) == 1
    code, out, _ = run(["export", "zoo:tiny_llama_lora", "--plan", old, "--world-size", "4", "-q"], capsys)
    assert code == 0 and "MESH_SHAPE = (4,)" in out


@pytest.mark.parametrize("mesh,message", [
    ({"shrd": 4}, "'mesh.shrd' is not a Mesh field; closest: 'shard'"),
    ({"shard": 4, "device": "H1OO"}, "closest: 'H100'"),
])
def test_a_bad_setup_in_a_plan_file_is_one_line(tmp_path, capsys, mesh, message):
    obj = json.loads(sv.Plan.auto(zoo.tiny_llama_lora()).to_json(setup={"mesh": mesh}))
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(obj))
    code, _, err = run(["export", "zoo:tiny_llama_lora", "--plan", path], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_setup_round_trips_a_custom_device_and_efficiency():
    mesh = sv.Mesh(4, replicate=2, device=sv.Device("X1", "96GiB", 500, 500, 60, 3000, 400, 40), memory_reserve="2GiB",
                   efficiency=sv.Efficiency(matmul=0.4), intra_node_gbps=300)
    training = sv.Training(optimizer="sgd", param_dtype="bfloat16", offload=True, batch_size=3, seq_len=128)
    plan = sv.Plan(["a", ""], checkpoint={"a": "selective"})
    back = sv.Plan.from_json(plan.to_json(setup=setup_obj(mesh, training)))
    assert back == plan and read_setup(back) == (mesh, training)
    assert read_setup(sv.Plan.from_json(plan.to_json())) == (None, None)
    with pytest.raises(ValueError, match="example_inputs is a function"):
        setup_obj(training=sv.Training(example_inputs=lambda b, s: ((), {})))


def test_sv_search_without_training_assumes_the_one_default():
    """sv.search, like every view and command, starts from DEFAULT_TRAINING (it assumed no mixed
    precision before: a different peak for the same plan than the report's)."""
    model = zoo.tiny_llama_lora()
    mesh = sv.Mesh(8, device="H100")
    s = sv.search(model, mesh=mesh, offload=(False,))
    plan, row_mesh, training = s.candidate(0)
    assert training == DEFAULT_TRAINING
    assert int(sv.analyze(model, plan, row_mesh, DEFAULT_TRAINING).memory.peak.max()) == s.table.peak.iloc[0]


@pytest.fixture
def two_and_four_layers(tmp_path):
    """The tiny Llama config with 2 and with 4 layers (a plan of one applied to the other: Qwen2.5-7B's
    28 layers on Llama-3.1-8B's 32), and the checkpointed preset's plan file of each."""
    config = json.loads((Path(zoo.__file__).parent / "configs" / "tiny_llama.json").read_text())
    files = {}
    for n in (2, 4):
        folder = tmp_path / f"layers{n}"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": n}))
        assert main(["plan", "write", str(folder), "--checkpoint", "blocks", "-o", str(tmp_path / f"p{n}.json")]) == 0
        files[n] = (folder, tmp_path / f"p{n}.json")
    return files


@pytest.mark.parametrize("command", ["report", "export", "plan read"])
def test_a_plan_file_of_a_shorter_model_is_refused_naming_the_blocks_it_misses(two_and_four_layers, capsys, command):
    folder, _ = two_and_four_layers[4]
    _, plan2 = two_and_four_layers[2]
    out = folder / "out"
    argv = (["plan", "read", plan2, "--model", folder] if command == "plan read"
            else [command, folder, "--plan", plan2, "-o", out]) + ["--world-size", 8]
    if command == "plan read":  # it lists what is wrong with a plan: the blocks missed, an error line, exit 1
        code = main([str(a) for a in argv]) + 1
        err = " ".join(capsys.readouterr().out.split())
    else:
        code, _, err = run(argv, capsys)
    assert code == 2 and "verdict" not in err and not out.exists()
    assert "does not match the model: its units miss 2 of the 4 blocks of 'model.layers'" in err
    assert "'model.layers.2', 'model.layers.3'" in err and "the root call (fully_shard(model)) would gather them" in err
    assert "a model with 2 layers?" in err


def test_a_plan_file_of_a_longer_model_names_every_missing_module(two_and_four_layers, capsys):
    folder, _ = two_and_four_layers[2]
    _, plan4 = two_and_four_layers[4]
    code, _, err = run(["report", folder, "--plan", plan4, "--world-size", 8, "-o", folder / "r.html"], capsys)
    assert code == 2 and not (folder / "r.html").exists()
    assert "units: no modules named 'model.layers.2', 'model.layers.3' in LlamaForCausalLM" in err
    assert "checkpoint: no modules named 'model.layers.2', 'model.layers.3'" in err and "Closest existing names" in err
