"""The command line on users' own models (config.json + adapter), one walk per command, training options."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

import shardviz as sv
from shardviz import cli
from shardviz.model import tree
from shardviz.format import format_bytes
from shardviz.views.display import DEFAULT_TRAINING

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
T5, T5_DORA = EXAMPLES / "t5-small" / "config.json", EXAMPLES / "t5-small-dora"


def run(argv, capsys):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_export_and_report_on_a_config_path(tmp_path, capsys):
    code, out, err = run(["export", T5, "--adapter", T5_DORA, "--lora", "ignored", "--world-size", 8, "-q"], capsys)
    assert code == 0 and err == "", err
    model = sv.load_model(T5, adapter=T5_DORA)
    assert out == sv.export_code(model, sv.Plan.auto(model, lora="ignored"), mesh=sv.Mesh(8), training=DEFAULT_TRAINING)
    assert "lora_magnitude_vector" in out  # DoRA's parameters are among the ignored ones

    report = tmp_path / "report.html"
    code, _, err = run(["report", T5.parent, "--adapter", T5_DORA / "adapter_config.json", "--world-size", 8,
                        "-o", report], capsys)
    assert code == 0 and "T5ForConditionalGeneration (" in report.read_text()  # the model under peft's wrapper

    code, out, _ = run(["plan", "write", T5, "--dtype", "bfloat16"], capsys)  # no adapter: the bare model
    assert code == 0 and json.loads(out)["ignored"] == []


def test_config_path_errors_are_one_line(tmp_path, capsys):
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"architectures": ["T5ForConditionalGeneration"]}))
    for argv, reason in [
        (["export", bad, "--world-size", 8], f"{bad}: field 'model_type' is missing"),
        (["export", tmp_path / "nope" / "config.json", "--world-size", 8], "no such file"),
        (["export", T5, "--adapter", tmp_path, "--world-size", 8], "no adapter_config.json in folder"),
        (["export", "zoo:tiny_llama_lora", "--adapter", T5_DORA, "--world-size", 8], "--adapter applies to a config.json"),
        (["report", "zoo:tiny_llama_lora", "--seq-len", 128, "--world-size", 8], "--seq-len needs --batch-size"),
        (["report", "zoo:tiny_llama_lora", "--optimizer", "lion", "--world-size", 8], "Training.optimizer='lion'"),
        (["export", "zoo:tiny_llama_lora", "--plan", bad, "--checkpoint", "blocks", "--world-size", 8], "--checkpoint goes with"),
    ]:
        code, out, err = run(argv, capsys)
        lines = err.strip().splitlines()
        assert code == 2 and out == "" and len(lines) == 1 and reason in lines[0], (argv, err)


@pytest.mark.parametrize("argv", [
    ["export", "zoo:tiny_llama_lora", "--lora", "ignored", "--world-size", 8, "--param-dtype", "bfloat16"],
    ["report", "zoo:tiny_llama_lora", "--lora", "ignored", "--world-size", 8],
    ["plan", "write", "zoo:tiny_llama_lora", "--lora", "separate"],
    ["plan", "read", "PLAN", "--model", "zoo:tiny_llama_lora", "--world-size", 8],
], ids=["export", "report", "plan write", "plan read"])
def test_each_command_walks_the_model_once(tmp_path, capsys, monkeypatch, argv):
    (tmp_path / "plan.json").write_text(sv.Plan([""]).to_json())
    argv = [str(tmp_path / "plan.json") if a == "PLAN" else a for a in argv]
    walks = []
    original = tree.ModelTree.__init__

    def counting(self, model):
        walks.append(type(model).__name__)
        original(self, model)

    monkeypatch.setattr(tree.ModelTree, "__init__", counting)
    code, _, err = run(argv + (["-o", tmp_path / "out"] if argv[0] != "plan" else []), capsys)
    assert code == 0, err
    assert walks == ["PeftModelForCausalLM"]


def test_report_training_options_match_analyze(tmp_path, capsys):
    """--optimizer/--param-dtype/--reduce-dtype reproduce the README table's setting from the CLI."""
    from shardviz import zoo

    out = tmp_path / "r.html"
    code, _, err = run(["report", "zoo:tiny_llama_lora", "--lora", "ignored", "--world-size", 4, "--no-compare",
                        "--optimizer", "sgd", "--param-dtype", "bfloat16", "--reduce-dtype", "float32",
                        "-o", out], capsys)
    assert code == 0, err
    text = out.read_text()
    model = zoo.tiny_llama_lora()
    plan = sv.Plan.auto(model, lora="ignored")
    training = sv.Training(optimizer="sgd", param_dtype="bfloat16", reduce_dtype="float32")
    mem = sv.analyze(model, plan, sv.Mesh(4), training).memory
    default = sv.analyze(model, plan, sv.Mesh(4)).memory
    assert mem["optimizer"].max() == 0 and default["optimizer"].max() > 0  # the option changed the answer
    row = mem.sort_values("peak", ascending=False).iloc[0]
    cells = re.findall(r"<td>([^<]*)</td>", text)
    for column in ("params", "grads", "optimizer", "peak"):
        assert format_bytes(row[column]) in cells, column
    plain = html.unescape(re.sub(r"<[^>]+>", "", text))  # the exported code, highlighted
    assert "param_dtype=torch.bfloat16, reduce_dtype=torch.float32" in plain


def test_checkpoint_blocks_reaches_the_plan(capsys):
    code, out, _ = run(["plan", "write", "zoo:tiny_llama_lora", "--checkpoint", "blocks"], capsys)
    assert code == 0
    assert json.loads(out)["checkpoint"] == ["base_model.model.model.layers.0", "base_model.model.model.layers.1"]
