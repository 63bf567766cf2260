"""Every finding: one model/plan that triggers it and one that does not."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import shardviz as sv
from shardviz.checks import DOMINANT_UNIT, PADDING_WASTE, run_checks


# ---------------------------------------------------------------------------
# Small models
# ---------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self, d=8, lora=False):
        super().__init__()
        self.proj = nn.Linear(d, d, bias=False)
        if lora:
            self.lora_A = nn.Linear(d, 2, bias=False)
            self.lora_B = nn.Linear(2, d, bias=False)

    def forward(self, x):
        out = self.proj(x)
        if hasattr(self, "lora_A"):
            out = out + self.lora_B(self.lora_A(x))
        return out


class Net(nn.Module):
    """embed -> blocks -> head; LoRA adapters trainable, base frozen."""

    def __init__(self, n=4, d=8, vocab=16, lora=True, frozen_base=True):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, lora) for _ in range(n))
        self.head = nn.Linear(d, vocab, bias=False)
        if frozen_base:
            for name, p in self.named_parameters():
                p.requires_grad_("lora" in name)


def lora_names(model):
    return [n for n, _ in model.named_parameters() if "lora" in n]


def codes(model, plan, mesh=sv.Mesh(4), torch_version="2.13", **kw):
    a = sv.analyze(model, plan, mesh, strict=False, **kw)
    return [f.code for f in run_checks(a, torch_version=torch_version)]


def per_block(n=4, extra=("embed", "head")):
    return [f"blocks.{i}" for i in range(n)] + list(extra) + [""]


GOOD = sv.Plan(per_block())


def test_a_good_plan_has_no_findings():
    assert codes(Net(lora=False, frozen_base=False), GOOD) == []


def test_every_finding_is_complete():
    model = Net()
    plan = sv.Plan([""], ignored=lora_names(model)[:2])
    a = sv.analyze(model, plan, sv.Mesh(32), strict=False)
    found = run_checks(a, torch_version="2.6")
    assert {f.code for f in found} >= {"SV101", "SV102", "SV105", "SV108"}
    for f in found:
        assert f.code.startswith("SV") and f.severity in ("error", "warning", "info")
        assert len(f.message) > 30 and len(f.fix) > 10
        assert str(f).startswith(f.severity.upper())
    severities = [f.severity for f in found]
    assert severities == sorted(severities, key=("error", "warning", "info").index)


def test_analysis_findings_calls_run_checks():
    model = Net()
    a = sv.analyze(model, sv.Plan([""]), sv.Mesh(4))
    assert "SV105" in [f.code for f in a.findings]


def test_findings_price_their_what_ifs_without_the_analysis(monkeypatch):
    """The checks read the stages they are given (``check_inputs.AnalysisView``); SV201's fixes and SV113 are
    priced with its ``price``, never by calling back into ``Analysis.what_if``."""
    from shardviz import zoo

    model = zoo.tiny_llama_lora()
    mesh = sv.Mesh(4, device="H100", device_memory=2_600_000, memory_reserve=0, judge="allocated")
    a = sv.analyze(model, sv.Plan.auto(model, lora="ignored"), mesh,
                   sv.Training(batch_size=4, seq_len=64, param_dtype=None, reduce_dtype=None))  # the limit is fp32's

    def what_if(self, *args, **kwargs):
        raise AssertionError("a check called Analysis.what_if")

    monkeypatch.setattr(sv.Analysis, "what_if", what_if)
    sv201 = [f for f in a.findings if f.code == "SV201"]
    assert len(sv201) == 1 and sv201[0].fix.startswith("cheapest fix: checkpoint every block")
    assert "step " in sv201[0].fix and "could not be priced" not in sv201[0].fix


# ---------------------------------------------------------------------------
# Engine refusals come through run_checks
# ---------------------------------------------------------------------------
class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.body = nn.Linear(8, 8)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight


def test_sv001_parameter_shared_by_two_calls():
    assert "SV001" in codes(Tied(), sv.Plan(["embed", "head", ""]))
    assert "SV001" not in codes(Tied(), sv.Plan([["embed", "head"], ""]))


class Mixed(nn.Module):
    def __init__(self, trainable16=True):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8).to(torch.bfloat16).requires_grad_(trainable16)


def test_sv003_mixed_trainable_dtypes_in_one_call():
    assert "SV003" in codes(Mixed(), sv.Plan([""]))
    assert "SV003" not in codes(Mixed(trainable16=False), sv.Plan([""]))  # frozen ones may differ
    assert "SV003" not in codes(Mixed(), sv.Plan(["b", ""]))  # one dtype per call


# ---------------------------------------------------------------------------
# Release checks
# ---------------------------------------------------------------------------
def test_sv101_ignored_params_before_2_7():
    model = Net()
    plan = sv.Plan(per_block(), ignored=lora_names(model))
    found = sv.analyze(model, plan, sv.Mesh(4)).findings  # installed torch is >= 2.7 here
    assert "SV101" not in [f.code for f in found]
    for version in ("2.4", "2.5", "2.6"):
        out = run_checks(sv.analyze(model, plan, sv.Mesh(4)), torch_version=version)
        sv101 = [f for f in out if f.code == "SV101"]
        assert len(sv101) == 1
        assert "unexpected keyword argument 'ignored_params'" in sv101[0].message
        assert "hides them" in sv101[0].message  # what the export does instead
        assert f"torch_version={version!r}" in sv101[0].fix
    for version in ("2.7", "2.13.0"):
        assert "SV101" not in codes(model, plan, torch_version=version)
    assert "SV101" not in codes(model, GOOD, torch_version="2.4")  # nothing ignored


def test_sv110_grouped_call_before_2_5():
    plan = sv.Plan([f"blocks.{i}" for i in range(4)] + [["embed", "head"], ""])
    assert "SV110" in codes(Net(), plan, torch_version="2.4")
    assert "SV110" not in codes(Net(), plan, torch_version="2.5")
    assert "SV110" not in codes(Net(), GOOD, torch_version="2.4")


def test_sv111_release_without_fsdp2():
    assert codes(Net(lora=False), GOOD, torch_version="2.3") == ["SV111"]
    assert "SV111" not in codes(Net(), GOOD, torch_version="2.4")


# ---------------------------------------------------------------------------
# Gradient synchronisation
# ---------------------------------------------------------------------------
def test_sv102_trainable_ignored():
    model = Net()
    found = codes(model, sv.Plan(per_block(), ignored=lora_names(model)))
    assert "SV102" in found
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad][:2]
    assert "SV102" not in codes(model, sv.Plan(per_block(), ignored=frozen))


def test_sv102_says_nothing_to_sync_on_one_rank():
    model = Net()
    a = sv.analyze(model, sv.Plan(per_block(), ignored=lora_names(model)), sv.Mesh(1))
    (f,) = [f for f in a.findings if f.code == "SV102"]
    assert "harmless on one rank" in f.message


def test_sv103_trainable_unmanaged_and_sv104_frozen_unmanaged():
    model = Net()
    no_root = sv.Plan([f"blocks.{i}" for i in range(4)])  # embed and head under no call
    assert "SV104" in codes(model, no_root)  # embed/head are frozen
    assert "SV103" not in codes(model, no_root)
    trainable = Net(frozen_base=False)
    assert {"SV103", "SV104"} & set(codes(trainable, no_root)) == {"SV103"}
    assert not {"SV103", "SV104"} & set(codes(trainable, GOOD))


# ---------------------------------------------------------------------------
# Layout quality
# ---------------------------------------------------------------------------
def test_sv105_root_only():
    assert "SV105" in codes(Net(), sv.Plan([""]))
    assert "SV105" not in codes(Net(), GOOD)
    assert "SV105" not in codes(Net(), sv.Plan(["blocks.0"]))  # one call, but not the root


class BigHead(nn.Module):
    def __init__(self, vocab=4096):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(16, 16) for _ in range(4))
        self.embed = nn.Embedding(vocab, 16)
        self.head = nn.Linear(16, vocab, bias=False)


def test_sv106_dominant_call():
    model = BigHead()
    blocks_and_root = sv.Plan([f"blocks.{i}" for i in range(4)] + [""])  # root takes embed + head
    found = sv.analyze(model, blocks_and_root, sv.Mesh(8)).findings
    (f,) = [f for f in found if f.code == "SV106"]
    assert f.fqns == ("",) and "<root>" in f.message
    assert "SV106" not in codes(model, sv.Plan([f"blocks.{i}" for i in range(4)] + ["embed", "head", ""]), sv.Mesh(8))
    assert "SV106" not in codes(Net(), GOOD)  # equal blocks: nothing dominates
    assert 0 < DOMINANT_UNIT < 1


class Padded(nn.Module):
    def __init__(self, rows):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(rows, 64))


def test_sv107_padding_waste():
    assert "SV107" in codes(Padded(9), sv.Plan([""]), sv.Mesh(8))  # 16 rows allocated for 9
    assert "SV107" not in codes(Padded(16), sv.Plan([""]), sv.Mesh(8))
    assert "SV107" not in codes(Padded(161), sv.Plan([""]), sv.Mesh(8))  # 168 for 161: 4 % < threshold
    assert PADDING_WASTE == pytest.approx(0.05)


def test_sv108_empty_shards():
    found = sv.analyze(Padded(3), sv.Plan([""]), sv.Mesh(8)).findings
    (f,) = [f for f in found if f.code == "SV108"]
    assert f.fqns == ("w",) and "5 ranks hold 0 rows" in f.message
    assert "SV108" in codes(Padded(6), sv.Plan([""]), sv.Mesh(4))  # (6,) on 4: 2,2,2,0 rows
    assert "SV108" not in codes(Padded(8), sv.Plan([""]), sv.Mesh(8))
    assert "SV108" not in codes(Padded(3), sv.Plan([""], ignored=["w"]), sv.Mesh(8))  # not sharded


def test_sv109_call_whose_parameters_are_all_ignored():
    model = Net()
    adapters = [f"blocks.{i}.lora_A" for i in range(4)]
    ignored = sv.Plan(adapters + per_block(), ignored=lora_names(model))
    found = codes(model, ignored)
    assert found.count("SV109") == 4
    assert "SV109" not in codes(model, sv.Plan(adapters + per_block()))
    assert "SV109" not in codes(model, sv.Plan(per_block(), ignored=lora_names(model)))


def test_memory_findings_from_the_cost_model_are_included():
    model = BigHead()
    tight = sv.Mesh(8, device_memory=1000)
    assert "SV201" in codes(model, GOOD_BIGHEAD, tight)
    assert "SV201" not in codes(model, GOOD_BIGHEAD, sv.Mesh(8, device_memory="80GB"))


GOOD_BIGHEAD = sv.Plan([f"blocks.{i}" for i in range(4)] + ["embed", "head", ""])


def test_analysis_satisfies_the_view_the_checks_read():
    """The checks read a typed view (``check_inputs.AnalysisView``, a Protocol), not a bag of lambdas:
    every member it declares is the ``Analysis``' own, and ``isinstance`` holds on a real analysis."""
    import typing

    from shardviz.checks.check_inputs import AnalysisView

    members = typing.get_protocol_members(AnalysisView) if hasattr(typing, "get_protocol_members") else (
        {*AnalysisView.__annotations__, *(k for k in vars(AnalysisView) if not k.startswith("_"))})
    a = sv.analyze(sv.zoo.tiny_llama_lora(), None, sv.Mesh(4))
    missing = sorted(m for m in members if not hasattr(sv.Analysis, m) and m not in vars(a))
    assert missing == [] and isinstance(a, AnalysisView)
