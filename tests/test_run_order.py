"""``activations.measure.read_run_order``: the run order read from a forward alone is the one a whole measured step
gives (``measure_activations(...).run_order``, what ``Analysis.run_order`` read before), on
architectures whose copies differ: a plain stack (llama), a seq2seq model with two block lists (bart),
an MoE (mixtral, balanced routing), GPT-2, and Zamba (hybrid Mamba/attention layers sharing one
transformer; at 12 layers, as at its default 76, the cache's step cannot run on the reduced copy, so
the slow way steps the whole model and the fast way reads the copy without the cache)."""

import pytest
import torch

import shardviz as sv
from hf_archs import build
from transformers import AutoModelForCausalLM, ZambaConfig
from shardviz.activations import clear_cache, config_use_cache, measure_activations
from shardviz.activations import read_run_order


def zamba(layers: int = 12):
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(ZambaConfig(num_hidden_layers=layers))


@pytest.mark.parametrize("model_type", ["llama", "bart", "mixtral", "gpt2",
                                        pytest.param("zamba", marks=pytest.mark.slow)])  # its whole step: ~20 s
def test_the_forward_reads_the_order_a_whole_step_gives(model_type):
    model = zamba() if model_type == "zamba" else build(model_type)
    clear_cache()
    fast = read_run_order(model, 32)
    clear_cache()
    slow = measure_activations(model, 1, 32).run_order
    assert fast == slow
    assert len(fast) > 10


def test_zamba_reads_its_order_from_the_copy_without_the_cache(monkeypatch):
    """Zamba's config keeps a cache, whose step cannot run on the reduced copy: the order comes from
    the copy without the cache (the second attempt), never from the whole model."""
    from shardviz.activations import measure as order

    model = zamba()
    assert config_use_cache(model)
    tried = []
    real = order._order_of

    def spy(model, tree, request, reduce, toggles):
        tried.append((request.use_cache, reduce))
        return real(model, tree, request, reduce, toggles)

    monkeypatch.setattr(order, "_order_of", spy)
    clear_cache()
    read_run_order(model, 32)
    assert tried == [(True, True), (False, True)]


def test_analyze_without_activations_orders_its_walk_by_the_forward():
    model = zamba(8)
    clear_cache()
    a = sv.analyze(model, sv.Plan.auto(model), sv.Mesh(4))
    assert a.run_order is not None and a.run_order == read_run_order(model, 32)
    assert torch.isfinite(torch.tensor(float(a.memory["peak"].max())))
