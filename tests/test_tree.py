"""The one-pass walk (``ModelTree``) against torch's own traversals and peft's own adapter layers.

The reference below is the slow, obvious way: ``named_modules`` / ``named_parameters`` for names
and identity, and a second pass over peft's ``BaseTunerLayer`` modules for the adapter parameters.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import shardviz as sv
from shardviz import zoo

from handmade import handmade_cases


def reference(model: nn.Module):
    from peft.tuners.tuners_utils import BaseTunerLayer

    modules = [(name, type(m).__name__) for name, m in model.named_modules()]
    names: dict[int, list[str]] = {}
    objs: dict[int, nn.Parameter] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
        objs[id(p)] = p
    lora: set[int] = set()
    for m in model.modules():
        if isinstance(m, BaseTunerLayer):
            for attr in m.adapter_layer_names:
                holder = getattr(m, attr, None)
                if isinstance(holder, nn.Module):
                    lora.update(id(p) for p in holder.parameters())
    params = [
        (tuple(names[i]), tuple(objs[i].shape), objs[i].dtype, objs[i].requires_grad,
         "lora" if (i in lora if lora else any("lora_" in n for n in names[i])) else "base")
        for i in names
    ]
    buffers = {name: sum(b.numel() * b.element_size() for b in m.buffers(recurse=False))
               for name, m in model.named_modules()}
    return modules, params, buffers


def walked(tree: sv.ModelTree):
    modules = [(m.fqn, m.type_name) for m in tree.modules]
    params = [(p.fqns, p.shape, p.dtype, p.requires_grad, p.role) for p in tree.params]
    buffers = {m.fqn: m.buffer_bytes for m in tree.modules}
    return modules, params, buffers


def dora_two_adapters():
    from peft import LoraConfig, get_peft_model

    model = zoo.tiny_llama_lora(lora=False)
    model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], use_dora=True,
                                             modules_to_save=["lm_head"]))
    model.add_adapter("second", LoraConfig(r=2, target_modules=["o_proj"]))
    return model


def embedding_lora():
    from peft import LoraConfig, get_peft_model

    return get_peft_model(zoo.tiny_llama_lora(lora=False), LoraConfig(r=4, target_modules=["embed_tokens", "q_proj"]))


CASES = [(name, factory) for name, factory, _ in handmade_cases()] + [
    ("tiny_llama_lora", zoo.tiny_llama_lora),
    ("dora+modules_to_save+2 adapters", dora_two_adapters),
    ("embedding lora", embedding_lora),
]


@pytest.mark.parametrize("name,factory", CASES, ids=[c[0] for c in CASES])
def test_walk_equals_torch_and_peft(name, factory):
    model = factory()
    tree = sv.ModelTree(model)
    assert walked(tree) == reference(model)
    # the structure the engine relies on: preorder ranges, parents, every alias indexed
    for m in tree.modules:
        assert all(tree.is_inside(c, m.index) for c in m.children)
        assert m.subtree_end == max([m.index + 1] + [tree.modules[c].subtree_end for c in m.children])
    for p in tree.params:
        for n in p.fqns:
            assert tree.param_index[n] == p.index
            owner = n.rpartition(".")[0]
            assert tree.module_index[owner] in p.owners


def test_roles_follow_peft_not_names():
    """DoRA's magnitude vectors and embedding adapters are adapter parameters; modules_to_save copies are not."""
    tree = sv.ModelTree(dora_two_adapters())
    roles = {p.fqn: p.role for p in tree.params}
    assert any("lora_magnitude_vector" in n and r == "lora" for n, r in roles.items())
    assert any(".second." in n and r == "lora" for n, r in roles.items())
    saved = [n for n in roles if "modules_to_save" in n]
    assert saved and all(roles[n] == "base" for n in saved)
    tree = sv.ModelTree(embedding_lora())
    assert {p.role for p in tree.params if "lora_embedding" in p.fqn} == {"lora"}


def test_tied_parameter_is_one_entry_with_both_names():
    from handmade import Tied

    tree = sv.ModelTree(Tied())
    p = tree.param("head.weight")
    assert p.fqns == ("embed.weight", "head.weight") and len(p.owners) == 2


def test_module_reached_twice_is_walked_once():
    shared = nn.Linear(2, 2)
    model = nn.Sequential(shared, nn.ReLU(), shared)
    tree = sv.ModelTree(model)
    assert tree.n_modules == 3 and tree.module("0").aliases == ("2",) and tree.module_index["2"] == 1
    # its parameters are one entry each, with every name torch gives them
    names = [p.fqns for p in tree.params]
    torch_names = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    assert len(names) == 2 and {n for fqns in names for n in fqns} == torch_names
    assert [fqns[0] for fqns in names] == ["0.weight", "0.bias"]


def test_walk_on_meta_allocates_nothing():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(1 << 16, 1 << 16), nn.LayerNorm(1 << 16))
    tree = sv.ModelTree(model)
    assert tree.params[0].nbytes == 4 << 32
