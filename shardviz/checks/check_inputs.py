"""What the findings read: a typed view of the analysis (``AnalysisView``) and a way to price a variant.

``shardviz.Analysis`` satisfies ``AnalysisView``; ``checks.findings_of`` and every check below it
read only what the view declares (this module sits below ``analysis``, so they cannot import it).
The stages a step costs (memory, traffic, seconds) are the analysis' cached properties, computed
once, on first read, so a check that does not read them costs nothing.
``price`` answers a what-if (another plan, mesh or training: SV113, SV201's fixes, SV304) with the
figures the checks compare (``Priced``), not with an analysis to read further.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import pandas as pd

from ..activations import StepCache
from ..run.training import Training
from ..run.devices import MemoryFit
from ..fsdp import Layout
from ..run.mesh import Mesh
from ..plan import Plan
from ..model.tree import ModelTree


@dataclass(frozen=True)
class Priced:
    """A variant priced as the analysis prices its own step: the worst rank's peak and reserved
    peak; with ``timed``, the step's seconds (``StepSummary.step_time_s``, None without a device or a
    micro-batch); with ``traffic``, the reduce-scatter bytes each rank sends (``reduce_scatter_sent``)."""

    peak: int
    reserved_peak: int
    step_time_s: float | None = None
    reduce_scatter_sent: int | None = None


class WhatIfPending(Exception):
    """Raised by ``price`` on a view whose what-ifs come later (``without_what_ifs``): a check that
    prices one says its finding is being priced (``Finding.pending``) instead of pricing it."""


class PriceVariant(Protocol):
    def __call__(self, plan: Plan | None = None, mesh: Mesh | None = None, training: Training | None = None, *,
                 timed: bool = False, traffic: bool = False) -> Priced: ...


def reduce_scatter_sent(comm: pd.DataFrame) -> int:
    """The reduce-scatter bytes one rank sends per step (the ``comm`` table's)."""
    return int(comm.loc[comm["collective"] == "reduce_scatter", "sent_bytes"].sum())


class StepFigures(Protocol):
    """The step's figure the findings compare (``steptime.StepSummary`` has it)."""

    step_time_s: float | None


class ReservedOverhead(Protocol):
    """The cost model's replay of the step by the allocator (``cost.CostModel``)."""

    def reserved_overhead(self, expandable_segments: bool | None = None) -> int: ...


@runtime_checkable
class AnalysisView(Protocol):
    """What the findings read of an analysis: the typed view ``shardviz.Analysis`` satisfies.

    ``layout`` holds the tree, the plan and the mesh; ``measures``: a live model runs the step
    (activations can be measured); the tables (``memory``, ``units``, ``params``, ``comm``), the
    verdict ``fit``, ``peak_breakdown(rank)``, ``costs.reserved_overhead(expandable)``,
    ``step.step_time_s`` and ``cache_refused`` are the analysis' own, computed once by it on first
    read, so a check that does not read one costs nothing; ``price`` prices a variant
    (``PriceVariant``)."""

    layout: Layout
    tree: ModelTree
    plan: Plan
    mesh: Mesh
    training: Training
    torch_version: str | None
    cache: StepCache

    @property
    def measures(self) -> bool: ...
    @property
    def memory(self) -> pd.DataFrame: ...
    @property
    def units(self) -> pd.DataFrame: ...
    @property
    def params(self) -> pd.DataFrame: ...
    @property
    def comm(self) -> pd.DataFrame: ...
    @property
    def fit(self) -> MemoryFit | None: ...
    @property
    def cache_refused(self) -> str | None: ...
    @property
    def costs(self) -> ReservedOverhead: ...
    @property
    def step(self) -> StepFigures: ...

    def peak_breakdown(self, rank: int | None = None) -> dict[str, int]: ...

    def price(self, plan: Plan | None = None, mesh: Mesh | None = None, training: Training | None = None, *,
              timed: bool = False, traffic: bool = False) -> Priced: ...


class _WithoutWhatIfs:
    """``view`` as it is, but ``price`` raises ``WhatIfPending``: the findings that need no other
    step priced, in the time of the checks alone (the Inspector shows them first, SV201's fixes after)."""

    def __init__(self, view: AnalysisView):
        self._view = view

    def __getattr__(self, name: str):
        return getattr(self._view, name)

    def price(self, *args, **kwargs) -> Priced:
        raise WhatIfPending("the what-ifs are priced after the first findings")


def without_what_ifs(view: AnalysisView) -> AnalysisView:
    """``view`` whose what-ifs are not priced (``WhatIfPending``): for ``findings_of`` to give the
    findings at once, those that need a what-if marked ``pending``."""
    return _WithoutWhatIfs(view)


def worst_peak(view: AnalysisView) -> int:
    """The worst rank's predicted peak (``memory.peak``)."""
    return int(view.memory["peak"].max())
