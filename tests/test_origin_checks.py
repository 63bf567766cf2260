"""The findings about where a plan came from (``origin_checks``)."""

from __future__ import annotations

import torch

from shardviz import zoo
from shardviz.checks.origin_checks import upcast_trainable
from shardviz.model.tree import as_tree

ENV = {"ACCELERATE_MIXED_PRECISION": "bf16"}


def test_sv306_names_only_trainable_parameters_that_are_not_fp32():
    """accelerate's upcast touches trainable parameters that are not float32; fp32 LoRA is left alone."""
    model = zoo.tiny_llama_lora()
    assert upcast_trainable(as_tree(model), ENV) == []  # every trainable parameter is already fp32
    model.to(torch.bfloat16)
    found = upcast_trainable(as_tree(model), ENV)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert found and found[0].code == "SV306" and found[0].n_fqns == len(trainable)
    assert upcast_trainable(as_tree(model), {"ACCELERATE_MIXED_PRECISION": "no"}) == []
