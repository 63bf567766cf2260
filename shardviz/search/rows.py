"""The search's rows, one per candidate: ``Measured`` when ``analyze`` priced it, ``Pruned`` when a
rule (``Rule``) settled it without an analysis. ``rank.py`` orders them and writes their ``why``;
``Search.table`` shows them."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import ClassVar, Union

from ..run.mesh import Mesh
from .candidates import Candidate


class Rule(Enum):
    """Why a candidate was not analysed (``pruning.py`` applies each)."""

    MODEL_STATE = "the model state alone is over the device"
    ACTIVATIONS = "the activations alone are over the device"
    CHECKPOINTS_LESS = "a plan holding fewer activations is over"
    MORE_REPLICAS = "the same plan on fewer replicas is over"
    UNSHARDED_KEPT = "the unsharded parameters kept after forward are over"
    MICRO_BATCH = "nothing fits with a smaller micro-batch"
    OFFLOAD_NEEDLESS = "the same plan without CPU offload fits"
    REFUSED = "torch would refuse the plan"


@dataclass(frozen=True)
class Pruned:
    """A candidate settled without an analysis: the rule, and ``why`` in words (the table's)."""

    candidate: Candidate
    rule: Rule
    why: str
    fits: bool = False  # only OFFLOAD_NEEDLESS fits (its twin without offload does)
    analysed: ClassVar[bool] = False
    peak: ClassVar[None] = None


@dataclass(frozen=True)
class Measured:
    """A candidate ``analyze`` priced: its verdict, memory, step time, and what the ranking reads."""

    candidate: Candidate
    fits: bool
    verdict: str  # "fits", "tight" or "over" (devices.memory_fit)
    peak: int  # allocated peak of the worst rank
    reserved_peak: int
    judged_peak: int  # the peak the verdict judges (MemoryFit.judged): usable − judged_peak = margin
    margin: int  # usable memory less the judged peak
    safety: int  # the safety margin, in bytes
    step_time_s: float | None  # one optimizer step (None without a device: see ``untimed``)
    tokens_per_s: float | None
    mfu: float | None
    untimed: str | None  # why there is no step time
    tensor_comm_s: float | None  # the tensor-parallel collectives on the critical path
    comm_s: float  # the collectives one after another (the ranking without a step time)
    parts: dict = field(repr=False)  # seconds per step by what takes them (rank.time_parts)
    recompute: int = 0  # blocks recomputed
    calls: int = 0  # fully_shard calls
    mesh: Mesh | None = None
    use_cache: bool = False  # the key/value cache as priced
    cache_refused: bool = False  # torch cannot run the plan with the cache: priced without it
    host: int = 0  # CPU offload's host RAM per node (MemoryFit.host; 0: nothing offloaded)
    host_over: bool = False  # a node's host RAM cannot hold it (MemoryFit.host_over): over whatever the device says
    host_text: str = ""  # the host's part of the verdict in words (MemoryFit.host_text)
    analysed: ClassVar[bool] = True


Row = Union[Measured, Pruned]
