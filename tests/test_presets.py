"""``Plan.auto`` always gives a plan that strict ``analyze`` and torch's ``fully_shard`` accept: small
models with the shapes issue 9 found in transformers (the HF sweep itself is ``test_hf_archs.py``)."""

import pytest
import torch
from torch import nn

import shardviz as sv

MESHES = (sv.Mesh(4), sv.Mesh(3, replicate=2))


class Attn(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.q = nn.Linear(d, d)
        self.o = nn.Linear(d, d)


class Mamba(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.in_proj = nn.Linear(d, 2 * d)
        self.A_log = nn.Parameter(torch.zeros(d))


class Decoder(nn.Module):
    """embed -> layers -> norm -> head, the layers given."""

    def __init__(self, layers, d=8, vocab=20):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(layers)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)


class SharedBlock(nn.Module):
    """Zamba: one shared attention block reached from several hybrid layers."""

    def __init__(self, shared, d=8):
        super().__init__()
        self.mamba = Mamba(d)
        self.shared = shared


class Clip(nn.Module):
    """Two towers and a 0-dim ``logit_scale``, which fully_shard refuses to shard."""

    def __init__(self):
        super().__init__()
        self.text = Decoder([Attn() for _ in range(2)])
        self.vision = nn.ModuleList([Attn() for _ in range(2)])
        self.logit_scale = nn.Parameter(torch.tensor(2.6592))


def zamba():
    shared = Attn()
    return Decoder([Mamba(), SharedBlock(shared), Mamba(), SharedBlock(shared)])


MODELS = {
    "issue-repro": lambda: nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 4)),
    "one-layer": lambda: Decoder([Attn()]),
    "hybrid": lambda: Decoder([Attn(), Mamba(), Mamba(), Attn()]),
    "shared-block": zamba,
    "logit-scale": Clip,
    "tied": lambda: _tied(Decoder([Attn(), Attn()])),
    "leaf-root": lambda: nn.Linear(4, 4),
    "modulelist-root": lambda: nn.ModuleList([Attn(), nn.ModuleList([Mamba(), nn.ReLU()]), nn.Dropout()]),
    "moduledict-root": lambda: nn.ModuleDict({"text": Decoder([Attn()]), "vision": Attn()}),
}


def _tied(model):
    model.head.weight = model.embed.weight
    return model


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("lora", ["sharded", "ignored", "separate"])
def test_auto_plan_is_accepted_by_analyze_and_torch(name, lora):
    model = MODELS[name]()
    plan = sv.Plan.auto(model, lora=lora)
    for mesh in MESHES:
        sv.analyze(model, plan, mesh)  # strict: raises PlanError on anything torch refuses
        assert sv.verify(model, plan, mesh=mesh, ranks=[mesh.world - 1]).empty


def test_every_layer_of_a_hybrid_or_one_layer_stack_is_a_call():
    for layers in ([Attn()], [Attn(), Mamba(), Mamba(), Attn()]):
        model = Decoder(layers)
        units = {m for u in sv.Plan.auto(model).units for m in u.modules}
        assert {f"layers.{i}" for i in range(len(layers))} <= units
        assert "" in units


def test_root_is_one_call_when_no_block_list_qualifies():
    plan = sv.Plan.auto(nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 4)))
    assert [u.modules for u in plan.units] == [("0",), ("1",), ("",)]


def test_blocks_sharing_a_module_are_one_call():
    plan = sv.Plan.auto(zamba())
    assert ("layers.1", "layers.3") in [u.modules for u in plan.units]


def test_zero_dim_parameters_are_ignored():
    plan = sv.Plan.auto(Clip())
    assert plan.ignored == ("logit_scale",)
    a = sv.analyze(Clip(), plan, sv.Mesh(4))
    assert a.params.set_index("fqn").at["logit_scale", "status"] == "ignored"
    assert "SV002" not in {f.code for f in a.findings}


def test_a_container_model_gets_no_root_call():
    """torch refuses fully_shard on a ModuleList/ModuleDict without forward, the model itself included."""
    plan = sv.Plan.auto(MODELS["modulelist-root"]())
    assert [u.modules for u in plan.units] == [("0",), ("1.0",)]


# -- checkpoint presets (issue 18) -----------------------------------------------------------------
def test_every_k_checkpoints_blocks_as_torchtitan_counts_them():
    """torchtitan's selective layer option counts blocks from 1 and wraps those where count % k == 0."""
    model = Decoder([Attn() for _ in range(6)])
    names = lambda c: list(sv.Plan.auto(model, checkpoint=c).checkpoint)  # noqa: E731
    assert names("blocks") == [f"layers.{i}" for i in range(6)] == names("every 1")
    assert names("every 2") == ["layers.1", "layers.3", "layers.5"]
    assert names("every 3") == ["layers.2", "layers.5"]
    assert names("every 7") == []
    plan = sv.Plan.auto(model, checkpoint="every 2")
    assert plan.name == "auto (every 2nd block checkpointed)"  # no LoRA in this model: not named after it
    assert set(plan.checkpoint.policies) == {"full"}
    sel = sv.Plan.auto(model, checkpoint="selective")
    assert sel.checkpoint.items() == [(f"layers.{i}", "selective") for i in range(6)]
    assert sel.name == "auto (blocks checkpointed selectively)"


@pytest.mark.parametrize("bad,pattern", [
    ("every 0", "k in 'every k' must be a positive int.*got '0'"),
    ("every x", "k in 'every k' must be a positive int.*got 'x'"),
    ("every -2", "got '-2'"),
    ("layers", r"checkpoint='layers': expected None, 'blocks', 'every k'"),
    (2, "checkpoint=2: expected"),
])
def test_checkpoint_preset_junk_is_named(bad, pattern):
    with pytest.raises(ValueError, match=pattern):
        sv.Plan.auto(Decoder([Attn()]), checkpoint=bad)


def test_the_cli_takes_the_same_checkpoint_presets(capsys):
    from shardviz.cli import main

    assert main(["plan", "write", "zoo:tiny_llama_lora", "--checkpoint", "every 2"]) == 0
    plan = sv.Plan.from_json(capsys.readouterr().out)
    assert list(plan.checkpoint) == ["base_model.model.model.layers.1"] and "every 2nd block" in plan.name
    assert main(["plan", "write", "zoo:tiny_llama_lora", "--checkpoint", "every x"]) == 2
    assert "k in 'every k' must be a positive int" in capsys.readouterr().err
