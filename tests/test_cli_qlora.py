"""The command line on a QLoRA model (issue 38): a config.json with a bitsandbytes nf4 quantization_config,
LoRA on every linear. What it prints is held to torch's own ``fully_shard`` on the real quantized model of
the same structure (transformers quantizes it on the CPU; ``torch_truth.fake_run`` under the fake process
group): the allocated peak of the model state, to the byte (the packed 4-bit shards, the quantization state
every rank keeps whole, LoRA's gradients and AdamW states). With ``--offload`` the verdict carries the host:
its RAM per rank and per node, judged against ``--host-memory``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import shardviz as sv
from qlora_models import bnb_config, quant_state_storage_bytes, quantized, quantized_files
from shardviz.cli import main
from shardviz.format import format_bytes, parse_size
from torch_truth import fake_run, memory_mismatches

pytest.importorskip("bitsandbytes")

WORLD = 2


@pytest.mark.parametrize("double_quant", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["plain", "double_quant"])
def test_the_printed_peak_is_torch_s_and_the_host_is_judged_when_offloaded(tmp_path, capsys, double_quant):
    config = bnb_config("nf4", "bfloat16", double_quant)
    real, folder = quantized_files(tmp_path, config)
    model_flags = [str(folder / "config.json"), "--adapter", str(folder / "adapter_config.json")]
    flags = ["report", *model_flags, "--world-size", str(WORLD), "--device-memory", "24GiB", "--no-compare"]
    assert main([*flags, "-o", str(tmp_path / "r.html")]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the terminal wraps at 100 columns
    assert "4-bit nf4 (bitsandbytes, bfloat16 storage)" in out

    # what the command analysed (Plan.auto, shardviz's default training) against torch on the real model
    meta = sv.load_model(folder / "config.json", adapter=folder / "adapter_config.json")
    plan, mesh, training = sv.Plan.auto(meta), sv.Mesh(shard=WORLD), sv.Training()
    a = sv.analyze(meta, plan, mesh, training)
    quant = quant_state_storage_bytes(real)
    for rank in range(WORLD):
        truth = fake_run(lambda: quantized(tmp_path / "base", config, adapter=True), plan, mesh, training, rank)
        # every rank's sharded packed data, whole quantization state, LoRA grads and states, and the peak, to the
        # byte (torch's tracker does not see the quantization state: no parameter, no buffer)
        assert memory_mismatches(a, truth, peak_offset=quant) == []
    assert int(a.memory.quant_state.iloc[0]) == quant > 0
    assert f"(allocated {format_bytes(int(a.memory.peak.max()))})" in out, out  # the peak just held to torch

    # offloaded: the host's part of the one verdict, per rank and per node, judged against --host-memory
    off = sv.analyze(meta, plan, sv.Mesh(shard=WORLD, device_memory="24GiB"), sv.Training(offload=True)).fit
    per_rank = off.host // off.host_ranks
    assert main([*flags, "--offload", "--host-memory", "1GiB", "-o", str(tmp_path / "o.html")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"host RAM {format_bytes(off.host)} per node ({WORLD} ranks x {format_bytes(per_rank)}) of 1.00 GiB" in out
    assert main([*flags, "--offload", "--host-memory", f"{off.host - 1}B", "-o", str(tmp_path / "p.html")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "does not fit: host RAM" in out and "SV201" in out


@pytest.mark.slow
def test_llama_70b_qlora_on_two_24gb_cards_with_and_without_offload(tmp_path, capsys):
    """Issue 38's case: Llama-3.1-70B, nf4 with bf16 storage, LoRA r=64 on every linear, 2 x 24 GB, batch
    1 x 2048, every block checkpointed. Without offload it does not fit, on the quantized bytes (not the
    67 GiB of bf16 shards it once printed); with --offload it fits and the host's RAM is shown and judged."""
    cfg = json.loads((Path(sv.__file__).parent / "configs" / "llama3_70b.json").read_text())
    cfg.pop("_comment")
    cfg["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                                  "bnb_4bit_quant_storage": "bfloat16", "bnb_4bit_compute_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 64,
                                                              "lora_alpha": 16, "target_modules": "all-linear"}))
    flags = ["report", str(tmp_path / "config.json"), "--adapter", str(tmp_path / "adapter_config.json"),
             "--world-size", "2", "--device-memory", "24GiB", "--batch-size", "1", "--seq-len", "2048",
             "--checkpoint", "blocks", "--no-compare"]
    meta = sv.load_model(tmp_path / "config.json", adapter=tmp_path / "adapter_config.json")
    packed = sum(p.numel() * p.element_size() for p in meta.parameters() if type(p).__name__ == "Params4bit")
    assert main([*flags, "-o", str(tmp_path / "r.html")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "4-bit nf4 (bitsandbytes, bfloat16 storage)" in out and "verdict: does not fit" in out
    # each rank's shards hold half the packed data (plus the bf16 embedding, head and norms, and LoRA), not
    # the bf16 weights' bytes (four times the packed data: 67 GiB per rank before issue 38)
    sharded = parse_size(out.split("sharded params ")[1].split(",")[0].replace(" ", ""), "sharded params")
    assert packed // 2 < sharded < packed
    assert main([*flags, "--offload", "--host-memory", "128GiB", "-o", str(tmp_path / "o.html")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "verdict: fits" in out and "per node (2 ranks x" in out and "of 128.00 GiB" in out
