"""One verdict everywhere (issue 35): the CLI's headline and terminal lines, ``a.fit``, SV201, the
report's headline and its table give one verdict and one margin, for the two runs where they used to
disagree (the headline judged the allocated peak, the rest the reserved one)."""

from __future__ import annotations

import html
import json
from dataclasses import replace

import pytest

import shardviz as sv
from shardviz.cli import main
from shardviz.views.display import DEFAULT_TRAINING
from shardviz.format import format_bytes

QWEN_7B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
           "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4, "vocab_size": 152064,
           "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
           "tie_word_embeddings": False, "torch_dtype": "bfloat16", "hidden_act": "silu"}  # Qwen2.5-7B's card


def qwen(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN_7B))
    return str(path), sv.load_model(str(path)), ("H100", 8, 4096)


def llama(tmp_path):
    return "zoo:llama3_8b", sv.zoo.llama3_8b(), ("A100-40GB", 9, 2048)


@pytest.mark.parametrize("case", [qwen, llama], ids=["qwen2.5-7b-full-8xH100", "llama3.1-8b-lora-A100-40GB-batch9"])
def test_cli_report_and_api_give_one_verdict_and_one_margin(case, tmp_path, capsys):
    name, model, (device, batch, seq) = case(tmp_path)
    out_html = tmp_path / "r.html"
    code = main(["report", name, "--world-size", "8", "--device", device, "--batch-size", str(batch), "--seq-len",
                 str(seq), "--checkpoint", "blocks", "-o", str(out_html)])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 0
    a = sv.analyze(model, sv.Plan.auto(model, checkpoint="blocks"), sv.Mesh(8, device=device),
                   replace(DEFAULT_TRAINING, batch_size=batch, seq_len=seq))
    fit = a.fit
    assert fit.verdict != "fits" and fit.allocated < fit.usable - fit.safety, "the premise: allocated alone would fit"
    assert fit.judged == int(a.memory.reserved_peak.max()) and fit.margin == fit.usable - fit.judged
    assert f"verdict: {fit.headline} on rank 0" in out  # the CLI headline
    sv201 = [f for f in a.findings if f.code == "SV201"]
    assert sv201 and sv201[0].message.startswith(fit.headline) and f"SV201: {fit.headline}" in out
    page = out_html.read_text()
    assert html.escape(f"{fit.headline} on rank 0") in page  # the report's headline
    if "Layouts compared" in page:  # a LoRA model: the table of layouts gives this plan's margin, the verdict's
        assert f">{format_bytes(fit.margin)}<" in page and f">{format_bytes(fit.judged)}<" in page
    assert "fits: " not in out.split("verdict: ")[1].split(" step ")[0]  # no other verdict word in the headline
