"""Memory per rank and communication per step (placeholder until the cost-model issue lands)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Training:
    """How the model is trained; feeds the cost model."""

    optimizer: str = "adamw"

    def unit_defaults(self, unit):
        """The unit with this training's default policies filled in where the unit sets none."""
        return unit


def memory_table(analysis):
    raise NotImplementedError("memory per rank arrives with the cost model")


def comm_table(analysis):
    raise NotImplementedError("communication per step arrives with the cost model")
