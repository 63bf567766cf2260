"""shardviz.checkpointing: checkpoint policies and Plan.auto's presets as types, one parser of the
spellings users type (issue 25)."""

import json

import pytest
from torch import nn

import shardviz as sv
from shardviz.checkpointing import (FULL, PRESET_SPELLINGS, SELECTIVE, CheckpointPolicy, CheckpointPreset,
                                    parse_checkpoint)


def test_a_policy_is_its_spelling_in_equality_hashing_printing_and_json():
    assert CheckpointPolicy("selective") is SELECTIVE and FULL == "full"
    assert {FULL: 1, "full": 2} == {"full": 2}  # one key: a policy hashes as the string it equals
    assert frozenset({("", "full")}) == frozenset({("", FULL)})
    assert f"{SELECTIVE}" == str(SELECTIVE) == "selective" and json.dumps({"a": FULL}) == '{"a": "full"}'


def test_a_plan_stores_policies_as_types_whatever_it_was_given():
    plan = sv.Plan([""], checkpoint={"a": "full", "b": "selective"})
    assert plan.checkpoint.policies == (FULL, SELECTIVE)
    assert all(type(p) is CheckpointPolicy for p in plan.checkpoint.policies)
    assert type(sv.Plan.from_json(plan.to_json()).checkpoint.policy("b")) is CheckpointPolicy
    assert repr(plan.checkpoint) == "Checkpoints({'a': 'full', 'b': 'selective'})"


@pytest.mark.parametrize("spelling,preset", [
    (None, None), ("blocks", CheckpointPreset(FULL, 1)), ("every 3", CheckpointPreset(FULL, 3)),
    ("selective", CheckpointPreset(SELECTIVE, 1)),
])
def test_every_spelling_parses_to_one_preset_and_back(spelling, preset):
    assert parse_checkpoint(spelling) == preset
    assert parse_checkpoint(preset) == preset  # a preset is taken as it is
    if preset is not None:
        assert preset.spelling == spelling and str(preset) == spelling


@pytest.mark.parametrize("bad", ["layers", "every", "every 2 blocks", 2, ["blocks"]])
def test_bad_spellings_name_the_value_and_the_accepted_ones(bad):
    with pytest.raises(ValueError) as info:
        parse_checkpoint(bad)
    assert repr(bad) in str(info.value)
    assert all(repr(s).strip("'") in str(info.value) for s in PRESET_SPELLINGS if s)


@pytest.mark.parametrize("kwargs", [{"every": 0}, {"every": True}, {"policy": "partial"},
                                    {"policy": SELECTIVE, "every": 2}])
def test_a_preset_that_no_spelling_means_is_refused(kwargs):
    with pytest.raises(ValueError, match="CheckpointPreset"):
        CheckpointPreset(**kwargs)


class Stack(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(n)])
        self.head = nn.Linear(8, 2)


def test_plan_auto_takes_a_preset_as_its_spelling():
    model = Stack(5)
    for spelling in ("blocks", "every 2", "selective"):
        preset = parse_checkpoint(spelling)
        by_type, by_word = sv.Plan.auto(model, checkpoint=preset), sv.Plan.auto(model, checkpoint=spelling)
        assert by_type == by_word and by_type.name == by_word.name
    blocks = [f"layers.{i}" for i in range(5)]
    assert list(sv.Plan.auto(model, checkpoint="every 2").checkpoint) == list(CheckpointPreset(FULL, 2).chosen(blocks))
    assert CheckpointPreset(FULL, 2).chosen(blocks) == {"layers.1": FULL, "layers.3": FULL}
    assert CheckpointPreset(FULL, 3).which_blocks == "every 3rd block"
