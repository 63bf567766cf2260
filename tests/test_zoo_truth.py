"""verify finds zero disagreements on every zoo model x layout x mesh (first, middle, last rank).

The big models cost torch seconds per rank (fully_shard makes world-size chunks per parameter),
so they run a reduced mesh set and are marked slow; see the MATRIX table.
"""

import functools

import pytest

import shardviz as sv
from shardviz import zoo
from shardviz.presets import PRESETS, preset_plan

ALL_MESHES = [sv.Mesh(1), sv.Mesh(2), sv.Mesh(3), sv.Mesh(8), sv.Mesh(64), sv.Mesh(4, replicate=2)]
WIDE = [sv.Mesh(64), sv.Mesh(4, replicate=2)]
LAYOUTS = [p.key for p in PRESETS]  # Plan.auto's three LoRA options, the root alone, no calls

# model -> (meshes, layouts, slow)
MATRIX = {
    "tiny_llama_lora": (ALL_MESHES, LAYOUTS, False),
    "llama3_8b": (ALL_MESHES, LAYOUTS, True),
    "qwen3_moe_30b_a3b": (ALL_MESHES, LAYOUTS, True),
    "llama3_70b": (WIDE, LAYOUTS, True),
    "llama3_405b": (WIDE, LAYOUTS, True),
    zoo.LARGEST_MOE: ([sv.Mesh(8)], ["sharded", "ignored"], True),
}


@functools.lru_cache(maxsize=1)
def model(name):
    return zoo.build(name, lora=True)


def plan_for(m, layout):
    return preset_plan(sv.ModelTree(m), layout)


def cases():
    for name, (meshes, layouts, slow) in MATRIX.items():
        for layout in layouts:
            for mesh in meshes:
                marks = [pytest.mark.slow] if slow else []
                yield pytest.param(name, layout, mesh, marks=marks, id=f"{name}-{layout}-{mesh}")


@pytest.mark.parametrize("name,layout,mesh", list(cases()))
def test_verify_zoo(name, layout, mesh):
    m = model(name)
    diff = sv.verify(m, plan_for(m, layout), mesh=mesh)
    assert diff.empty, diff.head(20).to_string()


@pytest.mark.parametrize("name", [n for n in zoo.NAMES if n != zoo.LARGEST_MOE])
def test_auto_plan_shapes(name):
    """Per-block preset: one call per block, then embeddings, [norm, lm_head], root; LoRA handled per layout."""
    m = model(name)
    tree = sv.ModelTree(m)
    sharded, ignored, separate = (sv.Plan.auto(tree, lora=x) for x in ("sharded", "ignored", "separate"))
    n_layers = zoo.load_config(name.replace("_lora", "") if name != "tiny_llama_lora" else "tiny_llama").num_hidden_layers
    blocks = [u for u in sharded.units if u.modules[0].split(".")[-2:-1] == ["layers"]]
    assert len(blocks) == n_layers
    assert sharded.units[-1].modules == ("",)
    lora = {p.fqn for p in tree.params if p.role == "lora"}
    assert set(ignored.ignored) == lora and not sharded.ignored
    a = sv.analyze(tree, separate, sv.Mesh(8))
    owners = a.params[a.params.role == "lora"].unit
    assert all(".lora_" in u for u in owners)  # every adapter in a call of its own
    assert len(set(owners)) == len(lora)
