"""Activation checkpointing as values: the policy of one checkpointed module (``CheckpointPolicy``)
and ``Plan.auto``'s presets (``CheckpointPreset``: which blocks, with which policy), each with the
one parser of the spellings users type (the CLI's ``--checkpoint``, ``Plan.auto(checkpoint=...)``,
a plan file, the widget, the search).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class CheckpointPolicy(str, Enum):
    """How a checkpointed module recomputes in backward. ``FULL``: torch's ``checkpoint_wrapper``
    (its whole forward again); ``SELECTIVE``: op-level selective checkpointing inside the wrapper
    (torchtitan's "selective op": matmuls and attention saved, the rest recomputed).

    A member equals, hashes and prints as its spelling ("full", "selective"), so a plan's JSON and
    the strings users give keep working."""

    FULL = "full"
    SELECTIVE = "selective"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    def __hash__(self) -> int:
        return hash(self.value)  # as the spelling it equals: mixed keys stay one key

    @classmethod
    def parse(cls, value, where: str) -> "CheckpointPolicy":
        """``value`` ("full", "selective" or a member) as a policy; ``where`` names it in the error."""
        if isinstance(value, str):
            try:
                return cls(value)
            except ValueError:
                pass
        raise ValueError(f"{where}: policy {value!r} is not one of {POLICY_SPELLINGS}")


POLICY_SPELLINGS = tuple(p.value for p in CheckpointPolicy)
FULL, SELECTIVE = CheckpointPolicy.FULL, CheckpointPolicy.SELECTIVE

#: What ``Plan.auto(checkpoint=...)`` and ``--checkpoint`` accept ("every k": "every 2", "every 3", ...).
PRESET_SPELLINGS = (None, "blocks", "every k", "selective")
_EXPECTED = "expected None, 'blocks', 'every k' (k a positive int, e.g. 'every 2') or 'selective'"


@dataclass(frozen=True)
class CheckpointPreset:
    """Every ``every``-th repeated block (counted from 1, as torchtitan's "selective layer" option
    counts them) wrapped with ``policy``. Spelled "blocks" (every block, full), "every k" (every
    k-th block, full) and "selective" (every block, selective)."""

    policy: CheckpointPolicy = FULL
    every: int = 1

    def __post_init__(self):
        CheckpointPolicy.parse(self.policy, "CheckpointPreset")
        if not isinstance(self.every, int) or isinstance(self.every, bool) or self.every < 1:
            raise ValueError(f"CheckpointPreset: every={self.every!r} must be a positive int")
        if self.policy is SELECTIVE and self.every != 1:
            raise ValueError(f"CheckpointPreset: the selective policy checkpoints every block, got every={self.every}")

    @property
    def spelling(self) -> str:
        """What a user types for it: "blocks", "every k" or "selective"."""
        if self.policy is SELECTIVE:
            return "selective"
        return "blocks" if self.every == 1 else f"every {self.every}"

    def __str__(self) -> str:
        return self.spelling

    def chosen(self, blocks: list[str]) -> dict[str, CheckpointPolicy]:
        """The blocks (in order) this preset checkpoints, each with its policy."""
        return {b: self.policy for i, b in enumerate(blocks) if (i + 1) % self.every == 0}

    @property
    def which_blocks(self) -> str:
        """"every block", "every 2nd block", ...: the blocks it checkpoints, in words."""
        return "every block" if self.every == 1 else f"every {ordinal(self.every)} block"


def parse_checkpoint(value) -> CheckpointPreset | None:
    """``Plan.auto``'s ``checkpoint`` (a spelling of ``PRESET_SPELLINGS`` or a ``CheckpointPreset``)
    as a preset; None: no checkpointing. Bad input names the value and the accepted spellings."""
    if value is None or isinstance(value, CheckpointPreset):
        return value
    if not isinstance(value, str):
        raise ValueError(f"checkpoint={value!r}: {_EXPECTED}")
    if value == "blocks":
        return CheckpointPreset(FULL)
    if value == "selective":
        return CheckpointPreset(SELECTIVE)
    words = value.split()
    if len(words) == 2 and words[0] == "every":
        if not words[1].isdigit() or int(words[1]) < 1:
            raise ValueError(f"checkpoint={value!r}: k in 'every k' must be a positive int "
                             "(checkpoint every k-th block, torchtitan's selective layer option); "
                             f"got {words[1]!r}")
        return CheckpointPreset(FULL, int(words[1]))
    raise ValueError(f"checkpoint={value!r}: {_EXPECTED}")


def ordinal(k: int) -> str:
    """2 -> "2nd", 11 -> "11th"."""
    return f"{k}{'th' if 10 <= k % 100 < 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10, 'th')}"
