"""Small hand-built models that exercise one FSDP2 rule each (imported by several tests)."""

import torch
from torch import nn


class Odd(nn.Module):
    """Dim 0 smaller than the world and not divisible by it; a 1-row and a 1-D parameter."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 5)  # weight (5, 3), bias (5,)
        self.b = nn.Linear(10, 6)  # (6, 10)
        self.c = nn.Linear(7, 1)  # (1, 7)
        self.scale = nn.Parameter(torch.ones(2))  # own parameter on a module with children


class Tied(nn.Module):
    """Embedding tied to the output head, as in GPT-2 and small Llamas."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 4)
        self.body = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
        self.norm = nn.LayerNorm(4)
        self.head = nn.Linear(4, 11, bias=False)
        self.head.weight = self.embed.weight


class Nested(nn.Module):
    """Units inside units, buffers, and a module with both own parameters and children."""

    def __init__(self):
        super().__init__()
        self.outer = nn.Sequential(nn.Linear(4, 8), nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8)), nn.Linear(8, 4))
        self.outer.register_parameter("gate", nn.Parameter(torch.zeros(3, 4)))
        self.register_buffer("step", torch.zeros(()))
        self.last = nn.Linear(4, 2)


class MixedFrozen(nn.Module):
    """Frozen parameters of several dtypes next to trainable float32 ones."""

    def __init__(self):
        super().__init__()
        self.frozen16 = nn.Linear(6, 6).to(torch.float16).requires_grad_(False)
        self.frozenbf = nn.Linear(6, 9).to(torch.bfloat16).requires_grad_(False)
        self.frozen64 = nn.Linear(9, 5).to(torch.float64).requires_grad_(False)
        self.train32 = nn.Linear(5, 5)


class WeirdKeys(nn.Module):
    """ModuleDict keys that are not Python identifiers."""

    KEYS = ("0", "with space", "class", "quote'\"", "back\\slash", "ünï", "-dash", "7up")

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleDict({k: nn.Linear(4, 3 + i) for i, k in enumerate(self.KEYS)})


class Stages(nn.Module):
    """Funnel-like: a ModuleList of ModuleLists (``blocks.0`` is a bare container), and a ModuleDict."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.ModuleList([nn.Linear(4, 4) for _ in range(2)]) for _ in range(2)])
        self.heads = nn.ModuleDict({"a": nn.Linear(4, 3), "b": nn.Linear(4, 5)})


def handmade_cases():
    """(name, model factory, list of unit specs) covering every handmade rule."""
    return [
        ("odd-root", Odd, [""]),
        ("odd-leaves", Odd, ["a", "b", "c", ""]),
        ("odd-no-root", Odd, ["a", "c"]),
        ("tied-grouped", Tied, ["body", ["embed", "norm", "head"], ""]),
        ("tied-root", Tied, ["body", ""]),
        ("nested", Nested, ["outer.1.0", "outer.1", "outer", "last", ""]),
        ("nested-grouped", Nested, ["outer.1", ["outer.0", "last"], ""]),
        ("mixed-frozen", MixedFrozen, ["frozen16", "frozenbf", ""]),
        ("weird-keys", WeirdKeys, [f"blocks.{k}" for k in WeirdKeys.KEYS[:4]] + [""]),
    ]
