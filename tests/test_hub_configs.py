"""Issue 24: hub-style configs as users download them (``use_cache: true``, sliding windows, the
models' real sizes; tests/configs/, written from the model cards) with a LoRA adapter (r=16 on the
attention and MLP projections, dropout 0.05) go through ``shardviz report`` and ``shardviz plan
search`` to an answer. Before, a sequence longer than the sliding window failed: checkpointed, the
cache's recomputation fails in torch itself, and the search (every block checkpointed) and the
report (SV201 pricing a checkpointed what-if) raised it. The step is measured on a sequence just
longer than each model's window (the failure needs it)."""

from __future__ import annotations

from pathlib import Path

import pytest

import shardviz as sv
from shardviz import cli
from shardviz.run.training import DEFAULT_TRAINING

CONFIGS = Path(__file__).parent / "configs"
# model folder -> a sequence just past its sliding window (Gemma-3-1B: 512, Phi-3-mini: 2047, Gemma-2-9B: 4096)
SEQ = {"gemma3_1b": 640, "phi3_mini": 2112, "gemma2_9b": 4352}
SLOW = {"phi3_mini", "gemma2_9b"}
SMALL = {"gemma3_1b": "4GiB", "phi3_mini": "16GiB", "gemma2_9b": "40GiB"}  # under the peak without checkpointing  # their blocks at 2-4k tokens take longer to measure


def _params(names=SEQ, slow=SLOW):
    return [pytest.param(n, marks=[pytest.mark.slow] if n in slow else []) for n in names]


def _model_args(name):
    folder = str(CONFIGS / name)
    return [folder, "--adapter", folder, "--batch-size", "1", "--seq-len", str(SEQ[name])]


def _run(argv, capsys):
    code = cli.main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


@pytest.mark.parametrize("name", _params(slow=set(SEQ)))  # 100+ plans each: 15-60 s
def test_plan_search_answers(name, tmp_path, capsys):
    target = tmp_path / "plan.json"
    code, out, err = _run(["plan", "search", *_model_args(name), "--world-size", "2", "--device", "H100",
                           "-o", str(target)], capsys)
    assert code == 0, err
    assert "best:" in err and target.exists()
    assert sv.Plan.from_json(target.read_text()).units


@pytest.mark.parametrize("name", _params())
def test_report_answers_without_checkpointing(name, tmp_path, capsys):
    """No checkpointing, a device too small: SV201 prices checkpointing (a what-if)."""
    target = tmp_path / "report.html"
    code, _, err = _run(["report", *_model_args(name), "--world-size", "2", "--device-memory", SMALL[name],
                         "--no-compare", "-o", str(target)], capsys)
    assert code == 0, err
    html = target.read_text()
    assert "SV201" in html
    assert "attention implementation: " in html and "use_cache=True (the config&#x27;s)" in html  # what was measured


def test_a_plan_torch_cannot_run_with_the_cache_is_priced_without_it():
    """Asked to keep the cache with every block checkpointed, torch's recomputation fails past the
    window: the analysis prices the step without the cache and says why (SV113, the assumptions)."""
    folder = CONFIGS / "gemma3_1b"
    model = sv.load_model(folder, adapter=folder)
    plan = sv.Plan.auto(model, checkpoint="blocks")
    mesh = sv.Mesh(2, device_memory="80GiB")
    asked = sv.analyze(model, plan, mesh, sv.Training(batch_size=1, seq_len=SEQ["gemma3_1b"], use_cache=True))
    without = sv.analyze(model, plan, mesh, sv.Training(batch_size=1, seq_len=SEQ["gemma3_1b"], use_cache=False))
    assert int(asked.memory.peak.max()) == int(without.memory.peak.max())
    sv113 = [f for f in asked.findings if f.code == "SV113"]
    assert [f.severity for f in sv113] == ["error"] and "priced with use_cache=False" in sv113[0].message
    assert any(a.startswith("use_cache=False: torch cannot run") for a in asked.activation_profile.assumptions)
    assert any(a.startswith("attention implementation: sdpa") for a in asked.activation_profile.assumptions)


def test_the_attention_implementation_is_chosen_and_stated():
    folder = CONFIGS / "gemma3_1b"
    default = sv.load_model(folder)
    eager = sv.load_model(folder, attn_implementation="eager")
    assert (default.config._attn_implementation, eager.config._attn_implementation) == ("sdpa", "eager")
    training = sv.Training(batch_size=1, seq_len=64)
    kernels = {}
    for name, model in (("sdpa", default), ("eager", eager)):
        profile = sv.analyze(model, sv.Plan.auto(model), sv.Mesh(2), training).activation_profile
        assert any(a.startswith(f"attention implementation: {name} ") for a in profile.assumptions)
        kernels[name] = profile.attention
    assert kernels["sdpa"] and not kernels["eager"]  # eager runs no fused attention kernel
    with pytest.raises(ValueError, match="attn_implementation='sdpa'.*does not support"):
        sv.load_model(CONFIGS / "gemma2_9b", attn_implementation="sdpa")


def test_cli_use_cache_and_attn_implementation_flags(tmp_path, capsys):
    folder = str(CONFIGS / "gemma3_1b")
    for flag, want in (("--use-cache", True), ("--no-use-cache", False)):
        args = cli.build_parser().parse_args(["report", folder, "--world-size", "2", flag])
        assert cli.make_training(args, DEFAULT_TRAINING).use_cache is want
    args = cli.build_parser().parse_args(["plan", "search", folder, "--world-size", "2"])
    assert args.use_cache is None and args.attn_implementation is None
    code, out, err = _run(["export", folder, "--world-size", "2", "--checkpoint", "blocks", "--attn-implementation",
                           "eager", "-q"], capsys)
    assert code == 0 and "model.config.use_cache = False" in out
    code, _, err = _run(["export", "zoo:tiny_llama_lora", "--world-size", "2", "--attn-implementation", "eager"], capsys)
    assert code == 2 and "--attn-implementation applies to a config.json model" in err
