"""The command line's inputs mean what they mean in the widget and the API, its refusals are one line
(exit 2, the field and the closest valid value), and it shows its answers in the terminal."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import shardviz as sv
from shardviz.cli import cli_args
from shardviz import zoo
from shardviz.cli import SHARED_DEFAULTS, build_parser, main
from shardviz.run.devices import DEVICES, device_by_name
from shardviz.format import parse_size
from shardviz.views.display import DEFAULT_TRAINING, library_versions
from shardviz.widget.inputs import parse_device_memory

GiB = 1024**3
ROOT = Path(__file__).resolve().parents[1]


def run(argv, capsys):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("shardviz: error: "), err
    return lines[0]


@pytest.mark.parametrize("text,expected", [("40", 40 * GiB), ("40GiB", 40 * GiB), ("96GB", 96 * 10**9),
                                           ("1.5TiB", int(1.5 * 1024**4)), ("512 MiB", 512 * 1024**2), ("0.5", GiB // 2)])
def test_a_size_is_read_one_way_by_the_api_the_cli_and_the_widget(text, expected):
    assert parse_size(text, "x") == parse_device_memory(text) == sv.Mesh(8, device_memory=text).device_memory == expected
    assert parse_size(expected, "x") == expected  # a number is bytes, as before


def test_a_bare_device_memory_is_gib_on_the_command_line(capsys):
    code, out, _ = run(["report", "zoo:tiny_llama_lora", "--world-size", "8", "--device-memory", "40", "--no-compare",
                        "-o", os.devnull, "--force"], capsys)
    assert code == 0 and "39.00 GiB usable (40.00 GiB − 1.00 GiB reserve)" in " ".join(out.split())


def test_an_alias_and_decimal_units_are_said_as_read(capsys):
    """--device A100 is the 80 GB card and --device-memory 80G is 80e9 bytes: the output says both."""
    code, out, _ = run(["report", "zoo:tiny_llama_lora", "--world-size", "8", "--device", "A100", "--device-memory",
                        "80G", "--no-compare", "-o", os.devnull, "--force"], capsys)
    text = " ".join(out.split())
    assert code == 0 and "--device A100 read as A100-80GB" in text and "--device A100-40GB" in text
    assert f"--device-memory 80G read in decimal units as {80 * 10**9:,} bytes" in text and "write 80GiB" in text
    code, out, _ = run(["report", "zoo:tiny_llama_lora", "--world-size", "8", "--device", "H100", "--device-memory",
                        "80GiB", "--no-compare", "-o", os.devnull, "--force"], capsys)
    assert code == 0 and "note:" not in out  # nothing read two ways: nothing said


@pytest.mark.parametrize("spelling,name", [("H100-80GB", "H100"), ("h100-80gb", "H100"), ("A100 40GB", "A100-40GB"),
                                           ("MI300X", "MI300X"), ("NVIDIA H100 80GB HBM3", "H100"),
                                           ("A100-SXM4-80GB", "A100-80GB"), ("H100 PCIe", "H100-PCIe"),
                                           ("AMD Instinct MI300X", "MI300X"), ("H200-141GB", "H200")])
def test_vendor_spellings_of_a_device(spelling, name):
    assert device_by_name(spelling) is DEVICES[name]


def test_mi300x_has_its_datasheet_figures_and_source():
    d = DEVICES["MI300X"]
    assert d.memory == 192 * GiB and d.bf16_tflops == 1307.4 and "amd.com" in d.source


def test_a_wrong_memory_in_a_device_name_is_refused_with_the_closest(capsys):
    with pytest.raises(ValueError, match="closest: 'H100'"):
        device_by_name("H100-40GB")
    code, _, err = run(["report", "zoo:tiny_llama_lora", "--world-size", "8", "--device", "H10O"], capsys)
    line = one_line(err)
    assert code == 2 and "--device" in line and "closest: 'H100'" in line


@pytest.mark.parametrize("argv,message", [
    (["report", "zoo:tiny_llama_lora", "--world-size", "8", "--device-memory", "lots"], "--device-memory='lots'"),
    (["report", "zoo:tiny_llama_lora", "--world-size", "8", "--replicate", "3"], "not a multiple of --replicate 3"),
    (["report", "zoo:tiny_llama_lora"], "--world-size is required"),
    (["plan", "search", "zoo:tiny_llama_lora", "--world-size", "8", "--device", "h100-80gb", "--optimizer", "adagrad"],
     "expected one of"),
    (["report", "zoo:tiny_llama_lora", "--world-size", "8", "--memory-reserve", "-1GiB"], "--memory-reserve"),
    ([], "a command is required"),
])
def test_every_refusal_is_one_line_and_exit_2(argv, message, capsys):
    code, _, err = run(argv, capsys)
    assert code == 2 and message in one_line(err)


COMMANDS = {  # each command's shortest command line
    "export": ["export", "zoo:tiny_llama_lora"],
    "plan write": ["plan", "write", "zoo:tiny_llama_lora"],
    "plan read": ["plan", "read", "plan.json"],
    "plan search": ["plan", "search", "zoo:tiny_llama_lora", "--world-size", "8"],
    "report": ["report", "zoo:tiny_llama_lora"],
}


def _keys_read(node) -> list:
    """The keys of the ``getattr(args, key)`` calls inside ``node``."""
    return [call.args[1] for call in ast.walk(node) if isinstance(call, ast.Call)
            and getattr(call.func, "id", None) == "getattr" and getattr(call.args[0], "id", None) == "args"]


def fields_cli_args_reads() -> set[str]:
    """Every namespace field cli_args reads: ``args.X``, ``getattr(args, "X")``, and the names a loop
    passes to ``getattr(args, name)`` (a tuple, or a constant of the module such as TRAINING_FLAGS)."""
    tree = ast.parse(Path(cli_args.__file__).read_text(encoding="utf-8"))
    fields = {node.attr for node in ast.walk(tree)
              if isinstance(node, ast.Attribute) and getattr(node.value, "id", None) == "args"}
    fields |= {key.value for key in _keys_read(tree) if isinstance(key, ast.Constant)}
    for loop in ast.walk(tree):
        if isinstance(loop, ast.For):
            bindings = [(loop.target, loop.iter)]
        elif isinstance(loop, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
            bindings = [(g.target, g.iter) for g in loop.generators]
        else:
            continue
        used = {key.id for key in _keys_read(loop) if isinstance(key, ast.Name)}
        for target, names in bindings:
            if getattr(target, "id", None) in used:
                assert isinstance(names, (ast.Name, ast.Tuple)), f"line {names.lineno}: cannot tell the fields read"
                fields |= set(getattr(cli_args, names.id) if isinstance(names, ast.Name) else ast.literal_eval(names))
    return fields


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_carries_the_fields_the_shared_readers_read(command):
    """cli_args reads its fields as plain attributes whatever the command: every command's namespace has
    them all, and a flag not given reads as SHARED_DEFAULTS says, whether the command has the flag or not."""
    fields = fields_cli_args_reads()
    assert {"tensor_parallel", "device_memory", "plan_from", *cli_args.TRAINING_FLAGS} <= fields  # the walk finds them
    args = build_parser().parse_args(COMMANDS[command])
    missing = sorted(f for f in fields if not hasattr(args, f))
    assert not missing, f"{command}: the namespace lacks {missing} (add them to cli.SHARED_DEFAULTS)"
    assert args.func is not None
    given = {"world_size"} if command == "plan search" else set()
    own = {"lora": "sharded"} if command == "plan write" else {}  # plan write's --lora default
    expected = {k: own.get(k, v) for k, v in SHARED_DEFAULTS.items() if k not in given | {"func"}}
    assert {k: getattr(args, k) for k in expected} == expected


def test_version_names_every_library(capsys):
    code, out, _ = run(["--version"], capsys)
    assert code == 0
    for name, version in library_versions().items():
        assert f"{name} {version}" in out
    assert {"shardviz", "torch", "transformers", "peft"} <= set(library_versions())


def test_library_warnings_do_not_reach_the_terminal(tmp_path):
    """transformers warns (its logger) that Phi-3's default eos_token_id is outside a small vocabulary."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "hidden_size": 64,
                                  "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                                  "vocab_size": 256, "pad_token_id": 0}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRANSFORMERS_")} | {"PYTHONPATH": str(ROOT)}
    probe = f"import shardviz as sv; sv.load_model({str(config)!r})"
    plain = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, env=env)
    assert "eos_token_id must be" in plain.stderr  # the premise: transformers does say it
    out = subprocess.run([sys.executable, "-m", "shardviz.cli", "report", str(config), "--world-size", "8", "--no-compare",
                          "-o", str(tmp_path / "r.html")], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    assert "eos_token_id" not in out.stderr + out.stdout
    assert [line for line in out.stderr.splitlines() if not line.startswith("shardviz: ")] == []


def _between_limit() -> int:
    """A device memory between the tiny model's peak with and without checkpointing (torch's own numbers)."""
    m = zoo.tiny_llama_lora()
    training = sv.Training(batch_size=2, seq_len=256, param_dtype="bfloat16", reduce_dtype="float32")
    mesh = sv.Mesh(8, device="H100", memory_reserve=0)
    peaks = [int(sv.analyze(m, sv.Plan.auto(m, checkpoint=c), mesh, training).memory.peak.max()) for c in (None, "blocks")]
    assert training == sv.Training(**{**DEFAULT_TRAINING.__dict__, "batch_size": 2, "seq_len": 256})
    return sum(peaks) // 2


def test_the_terminal_answer_writes_fixes_as_flags(tmp_path, capsys):
    limit = _between_limit()
    code, out, err = run(["report", "zoo:tiny_llama_lora", "--world-size", "8", "--device", "H100", "--device-memory",
                          f"{limit}B", "--memory-reserve", "0", "--batch-size", "2", "--seq-len", "256",
                          "--judge", "allocated", "--safety-margin", "0",  # the tiny model's allocated peaks
                          "-o", tmp_path / "r.html"], capsys)
    assert code == 0
    assert all(len(line) <= 100 for line in out.splitlines())
    text = " ".join(out.split())
    assert "verdict: does not fit: allocated peak" in text and "step " in text and "SV201" in text
    assert re.search(r"fix: cheapest fix: --checkpoint (blocks|'every \d')", text)
    assert "sv.Plan.auto" not in text  # the Python spelling stays in the report and the API
    html = (tmp_path / "r.html").read_text()
    assert "sv.Plan.auto(model, checkpoint=" in html and "does not fit: allocated peak" in html


def test_a_sequence_beyond_the_model_positions_is_flagged(capsys):
    code, out, _ = run(["report", "zoo:tiny_llama_lora", "--world-size", "8", "--batch-size", "1", "--seq-len", "100000",
                        "--no-compare", "-o", os.devnull, "--force"], capsys)
    assert code == 0 and "above this model's max_position_embeddings" in " ".join(out.split())
    code, _, err = run(["export", "zoo:tiny_llama_lora", "--world-size", "8", "--batch-size", "1", "--seq-len", "100000"],
                       capsys)
    assert code == 0 and "warning: sequence length 100,000 is above" in err
    code, _, err = run(["export", "zoo:tiny_llama_lora", "--world-size", "8"], capsys)  # no micro-batch: nothing to say
    assert code == 0 and "max_position_embeddings" not in err


def test_the_report_explains_itself(tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["report", "zoo:tiny_llama_lora", "--lora", "ignored", "--world-size", "8", "--device", "H100",
                 "-o", str(out)]) == 0
    html = out.read_text()
    title = re.search(r"<h1>(.*?)</h1>", html).group(1)
    assert "LlamaForCausalLM (" in title and "parameters" in title and "LoRA r=" in title and "PeftModel" not in title
    assert html.index('class="verdict fits"') < html.index("<h2>")  # the verdict at the top
    assert "of H100" in html and "tokens/s" in html
    for name, version in library_versions().items():
        assert f"{name} {version}" in html
    assert re.search(r'<th class="own">LoRA ignored \(this report\)</th>', html)
    assert html.count('class="own"') > 1 and 'button class="copy"' in html
    code = json.loads(re.search(r'<script type="application/json" id="sv-code-text">(.*?)</script>', html, re.S).group(1))
    model = zoo.tiny_llama_lora()
    assert code == sv.export_code(model, sv.Plan.auto(model, lora="ignored"), mesh=sv.Mesh(8, device="H100"),
                                  training=DEFAULT_TRAINING)


def test_main_called_from_python_leaves_the_process_as_it_was(capsys):
    import warnings

    import transformers

    filters, env = list(warnings.filters), dict(os.environ)
    verbosity = transformers.logging.get_verbosity()
    assert main(["report", "zoo:tiny_llama_lora", "--world-size", "8", "--no-compare", "-o", os.devnull, "--force"]) == 0
    assert main(["report", "zoo:nope", "--world-size", "8"]) == 2
    capsys.readouterr()
    assert list(warnings.filters) == filters and dict(os.environ) == env
    assert transformers.logging.get_verbosity() == verbosity


def test_release_findings_read_as_the_command_line_there(capsys):
    code, _, err = run(["export", "zoo:tiny_llama_lora", "--lora", "ignored", "--world-size", "8", "--torch", "2.6"],
                       capsys)
    line = next(x for x in err.splitlines() if "SV101" in x)
    assert code == 0 and "Fix: shardviz export ... --torch 2.6" in line and "sv.export_code(" not in line
    a = sv.analyze(zoo.tiny_llama_lora(), sv.Plan.auto(zoo.tiny_llama_lora(), lora="ignored"), sv.Mesh(8),
                   torch_version="2.6")
    assert "sv.export_code(model, plan, torch_version='2.6')" in next(f for f in a.findings if f.code == "SV101").fix


def test_the_report_names_what_a_model_is_shaped_after(tmp_path, capsys):
    from shardviz.cli import model_label

    assert model_label("zoo:llama3_70b") == "Llama 3.1 70B" and model_label("zoo:tiny_llama_lora") is None
    folder = tmp_path / "Qwen3-8B"
    folder.mkdir()
    assert model_label(str(folder / "config.json")) == model_label(str(folder)) == "Qwen3-8B"
    code, out, _ = run(["report", "zoo:llama3_8b", "--world-size", "8", "--no-compare", "-o", tmp_path / "r.html"], capsys)
    text = " ".join(out.split())
    assert code == 0 and "model: LlamaForCausalLM (Llama 3.1 8B-shaped: 8.1 B parameters" in text and "+ LoRA r=" in text
    assert "Llama 3.1 8B-shaped" in (tmp_path / "r.html").read_text()
    assert "step time: none without a micro-batch (--batch-size" in text
