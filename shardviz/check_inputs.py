"""What the findings read: the stages of an analysis (``CheckInputs``) and a way to price a variant.

``Analysis.check_inputs`` builds one; ``checks.findings_of`` and every check below it read only
this, never the ``Analysis``. The stages a step costs (memory, traffic, seconds) are functions the
analysis computes once, on first call, so a check that does not need them costs nothing.
``price`` answers a what-if (another plan, mesh or training: SV113, SV201's fixes, SV304) with the
figures the checks compare (``Priced``), not with an analysis to read further.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import pandas as pd

from .activations import StepCache
from .cost import Training
from .devices import MemoryFit
from .fsdp import Layout, Mesh
from .plan import Plan
from .tree import ModelTree


@dataclass(frozen=True)
class Priced:
    """A variant priced as the analysis prices its own step: the worst rank's peak and reserved
    peak; with ``timed``, the step's seconds (``StepSummary.step_time_s``, None without a device or a
    micro-batch); with ``traffic``, the reduce-scatter bytes each rank sends (``reduce_scatter_sent``)."""

    peak: int
    reserved_peak: int
    step_time_s: float | None = None
    reduce_scatter_sent: int | None = None


class PriceVariant(Protocol):
    def __call__(self, plan: Plan | None = None, mesh: Mesh | None = None, training: Training | None = None, *,
                 timed: bool = False, traffic: bool = False) -> Priced: ...


def reduce_scatter_sent(comm: pd.DataFrame) -> int:
    """The reduce-scatter bytes one rank sends per step (the ``comm`` table's)."""
    return int(comm.loc[comm["collective"] == "reduce_scatter", "sent_bytes"].sum())


@dataclass(frozen=True)
class CheckInputs:
    """The stages the findings read. ``layout`` holds the tree, the plan and the mesh; ``measures``:
    a live model runs the step (activations can be measured); the callables return the analysis'
    tables and figures (computed once by it): ``memory``, ``units``, ``params``, ``comm``, ``fit``,
    ``peak_breakdown(rank)``, ``reserved_overhead(expandable_segments)``, ``step_time_s`` and
    ``cache_refused`` (``activations.MeasuredStep``); ``price`` prices a variant (``PriceVariant``)."""

    layout: Layout
    training: Training
    torch_version: str | None
    cache: StepCache
    measures: bool
    memory: Callable[[], pd.DataFrame]
    units: Callable[[], pd.DataFrame]
    params: Callable[[], pd.DataFrame]
    comm: Callable[[], pd.DataFrame]
    fit: Callable[[], MemoryFit | None]
    peak_breakdown: Callable[[int], dict[str, int]]
    reserved_overhead: Callable[[bool], int]
    step_time_s: Callable[[], float | None]
    cache_refused: Callable[[], str | None]
    price: PriceVariant

    @property
    def tree(self) -> ModelTree:
        return self.layout.tree

    @property
    def plan(self) -> Plan:
        return self.layout.plan

    @property
    def mesh(self) -> Mesh:
        return self.layout.mesh

    def peak(self) -> int:
        """The worst rank's predicted peak (``memory.peak``)."""
        return int(self.memory()["peak"].max())
