"""Issue 9 as a new user meets it: many transformers architectures, built on meta from small default
configs, with and without peft LoRA, on FSDP 4 and HSDP 2x3. For every architecture transformers
itself can build: ``Plan.auto`` gives a plan that strict ``analyze`` accepts, torch's ``fully_shard``
agrees with it (``verify`` on the last rank, which holds the emptiest shards), and the exported code
compiles. The types transformers cannot build offline are printed, counted and capped, so a
regression (in shardviz or in the set that builds) shows.

Timing per architecture goes to ``$SHARDVIZ_ARCH_TIMES`` when set (JSON).
"""

import copy
import json
import os
import time

import pytest

import shardviz as sv
from hf_archs import ISSUE_TYPES, Unbuildable, add_lora, build, check, sample_types

N_TYPES = 80  # a deterministic sample of CONFIG_MAPPING (the issue's types first)
MESHES = (sv.Mesh(4), sv.Mesh(3, replicate=2))

# The sets below are pinned for one transformers release (the sample itself follows CONFIG_MAPPING).
# With another release installed the tests skip, saying so: re-pin them from a run's output.
TRANSFORMERS = "5.24.0"
# 75 of the 80 sampled types build (issue 9 asks for 60).
BUILT = frozenset({
    "albert", "arcee", "big_bird", "blip", "blt", "bridgetower",
    "clap", "clip", "clip_vision_model", "cosmos3_edge_vision", "data2vec-audio", "deepseek_v3",
    "doge", "edgetam_video", "encoder-decoder", "exaone", "fastspeech2_conformer_with_hifigan", "fsmt",
    "fun_asr_nano_encoder", "funnel", "git", "glm4v_text", "glm_moe_dsa", "gpt-sw3",
    "gpt2", "granite_docling", "granitemoe_swa", "higgs_audio_v2", "hy_v3", "idefics3",
    "inkling2_vision", "jais2", "jamba", "kosmos-2.5", "levit", "lilt",
    "longformer", "mask2former", "mimo_v2_flash", "minimax_m3_vl", "mixtral", "mllama",
    "modernvbert", "mpt", "muse_spark_text", "nemotron3_5_asr", "neucodec", "olmo_hybrid",
    "omniasr", "owlvit", "paddleocr_vl", "phi3", "poolformer", "prophetnet",
    "qwen2_audio", "qwen3_5_moe_vision", "qwen3_vl_moe", "recurrent_gemma", "rt_detr", "sam3_lite_text",
    "sam_vision_model", "sew-d", "speech_to_text", "swin2sr", "textnet", "trocr",
    "unlimited_ocr", "videomae", "vit_msn", "wav2vec2", "wavlm", "xlm",
    "zamba", "zamba2", "zaya",
})
# What does not build from a small config offline, and the error's type (the rest of it is printed).
UNBUILDABLE = {
    "aya_vision": "ValueError",
    "cohere_compass": "KeyError",
    "detr": "ImportError",
    "gemma3n_vision": "ImportError",
    "pe_audio_video_encoder": "ImportError",
    "poolformer+lora": "no nn.Linear for LoRA",
    "textnet+lora": "no nn.Linear for LoRA",
}


def pinned_release():
    import transformers

    if transformers.__version__ != TRANSFORMERS:
        pytest.skip(f"the built and measured sets are pinned for transformers {TRANSFORMERS}, "
                    f"{transformers.__version__} is installed: re-pin BUILT, UNBUILDABLE and NOT_MEASURABLE")


@pytest.mark.slow
def test_auto_plan_on_hf_architectures():
    pinned_release()
    types = sample_types(N_TYPES)
    built, unbuildable, failures, times = [], {}, {}, {}
    for model_type in types:
        t0 = time.perf_counter()
        base = None
        for lora in (False, True):
            label = f"{model_type}{'+lora' if lora else ''}"
            try:
                # The LoRA model wraps a copy of the one just built (a meta deepcopy is cheaper than a build).
                model = build(model_type) if not lora else add_lora(copy.deepcopy(base))
            except Unbuildable as exc:
                unbuildable[label] = str(exc)
                if not lora:
                    break
                continue
            base = model if not lora else base
            for mesh in MESHES:
                problems = check(model, mesh, ranks=[mesh.world - 1])
                if problems:
                    failures[f"{label} on {mesh}"] = problems
            if not lora:
                built.append(model_type)
        times[model_type] = round(time.perf_counter() - t0, 2)
    if os.environ.get("SHARDVIZ_ARCH_TIMES"):
        with open(os.environ["SHARDVIZ_ARCH_TIMES"], "w") as fh:
            json.dump({"times_s": times, "unbuildable": unbuildable, "built": built}, fh, indent=1)
    slowest = sorted(times.items(), key=lambda kv: -kv[1])[:5]
    print(f"\n{sum(times.values()):.0f} s for {len(types)} types; slowest: {slowest}")
    print(f"{len(built)} of {len(types)} architectures built; not buildable from a small config offline:")
    for label, why in sorted(unbuildable.items()):
        print(f"  {label}: {why}")
    assert not failures, json.dumps(failures, indent=1)[:20000]
    assert set(ISSUE_TYPES) <= set(built), f"issue 9's architectures must build: {set(ISSUE_TYPES) - set(built)}"
    assert set(built) == BUILT, f"newly built: {set(built) - BUILT}; no longer built: {BUILT - set(built)}"
    assert {label: why.split(":")[0] for label, why in unbuildable.items()} == UNBUILDABLE, unbuildable


# Of the 27 causal LMs in the sample, 26 measure with checkpointed blocks (transformers 5.24); GIT
# with a default image (``image_prefix_inputs``), BLT with every byte its own patch (the worst case).
#: The causal LMs of the sample whose step cannot be measured, each for a reason of its own step.
NOT_MEASURABLE: dict[str, str] = {}
#: The causal LMs whose real step with checkpointed blocks fails in torch itself: shardviz says so,
#: naming the module (a correct prediction); without checkpointing they measure.
FAILS_IN_TORCH = {
    # XLM always builds a key/value cache, and recomputing a checkpointed attention block appends to
    # it again (keys twice as long as the mask): torch's real step raises the same RuntimeError
    "xlm": "recomputing the checkpointed transformer.attentions.1",
}


@pytest.mark.slow
def test_activations_on_hf_causal_lms():
    """The peak with activations (Training(batch_size=...)) on every causal LM of the sample that
    builds: a training step runs under FakeTensorMode (one block per kind, or the whole model when
    the forward cannot run on the cut copy); what cannot run says so in one ValueError."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    pinned_release()
    measured, failed, cpu = [], {}, {}
    for model_type in sample_types(N_TYPES):
        if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
            continue
        try:
            model = build(model_type)
        except Unbuildable:
            continue
        # as training with checkpointed blocks sets it (HF's gradient_checkpointing_enable does): with
        # the configs' default use_cache=True, torch's own step fails on 13 of these 27 (the
        # recomputation appends to the key/value cache: masks and saved shapes no longer match;
        # checked on real tensors for trocr, doge, prophetnet, deepseek_v3, blt, recurrent_gemma,
        # granitemoe_swa), and the measurement, which runs that step, fails with it (issue 20)
        if getattr(model.config, "use_cache", None):
            model.config.use_cache = False
        plan = sv.Plan.auto(model, checkpoint="blocks")
        t0 = time.process_time()
        try:
            a = sv.analyze(model, plan, sv.Mesh(4), sv.Training(batch_size=1, seq_len=32))
            assert int(a.memory.activations.max()) > 0
            measured.append(model_type)
        except ValueError as exc:
            assert "could not be measured" in str(exc), (model_type, exc)
            failed[model_type] = str(exc)[:200]
        cpu[model_type] = round(time.process_time() - t0, 2)
    slowest = sorted(cpu.items(), key=lambda kv: -kv[1])[:5]
    # issue 24's target: <= 5 s per architecture (benchmarks/bench_arch_sweep.py times them alone)
    print(f"\n{len(measured)} causal LMs measured; not measurable: {failed}; slowest analyze (CPU s): {slowest}")
    assert len(measured) == 26, measured
    assert set(failed) == set(NOT_MEASURABLE) | set(FAILS_IN_TORCH), failed
    for model_type, why in {**NOT_MEASURABLE, **FAILS_IN_TORCH}.items():
        assert why in failed[model_type], (model_type, failed[model_type])


@pytest.mark.slow
@pytest.mark.parametrize("model_type", sorted(FAILS_IN_TORCH))
def test_what_fails_only_checkpointed_measures_without(model_type):
    """The step torch cannot run checkpointed measures as it runs: without checkpointing."""
    pinned_release()
    model = build(model_type)
    a = sv.analyze(model, sv.Plan.auto(model), sv.Mesh(4), sv.Training(batch_size=1, seq_len=32))
    assert int(a.memory.activations.max()) > 0


@pytest.mark.slow
def test_git_measures_with_an_image():
    """GIT's training step is image + text: given pixel_values, its activations measure."""
    import torch

    model = build("git")
    vision = model.config.vision_config

    def inputs(batch, seq):
        ids = torch.zeros((batch, seq), dtype=torch.long)
        pixels = torch.zeros((batch, vision.num_channels, vision.image_size, vision.image_size))
        return (), {"input_ids": ids, "labels": ids, "pixel_values": pixels, "use_cache": False}

    training = sv.Training(batch_size=1, seq_len=32, example_inputs=inputs)
    a = sv.analyze(model, sv.Plan.auto(model, checkpoint="blocks"), sv.Mesh(4), training)
    assert int(a.memory.activations.max()) > 0
    assert a.flop_totals["flops"] > a.flop_totals["model_flops"] > 0  # checkpointed blocks recompute



def test_a_checkpointed_module_that_does_not_recompute_the_same_is_named():
    """XLM's failure in miniature (no transformers): a block whose forward appends to state it keeps
    (a cache) runs differently when checkpointing recomputes it, in torch's real step as in the
    measured one: the error names the block."""
    import torch
    from torch import nn

    class Cached(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.cache = nn.Linear(8, 8), []

        def forward(self, x):
            self.cache.append(x)  # a recomputation appends again: twice as long as x
            return self.lin(x) * torch.cat(self.cache, dim=1)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([Cached(), Cached()])

        def forward(self, x):
            for b in self.blocks:
                b.cache.clear()
            for b in self.blocks:
                x = b(x)
            return x

    def inputs(batch, seq):
        return (torch.ones(batch, seq, 8),), {}

    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    real = Model()  # torch's own step, blocks checkpointed as the exported code wraps them
    real.blocks = nn.ModuleList([checkpoint_wrapper(b) for b in real.blocks])
    with pytest.raises(torch.utils.checkpoint.CheckpointError):
        real(*inputs(1, 4)[0]).sum().backward()
    model = Model()
    training = sv.Training(batch_size=1, seq_len=4, example_inputs=inputs)
    with pytest.raises(ValueError, match=r"torch's own step fails: recomputing the checkpointed blocks\.1 "):
        sv.analyze(model, sv.Plan.auto(model, checkpoint="blocks"), sv.Mesh(2), training).memory
    assert int(sv.analyze(model, sv.Plan.auto(model), sv.Mesh(2), training).memory.activations.max()) > 0
