"""FSDP2's training step: one ``Call`` record per ``fully_shard`` call, the hooks torch runs, and
the two models that fold them, in bytes (memory per rank, communication per step) and in seconds.

Every quantity names the torch code it mirrors (``torch/distributed/fsdp/_fully_shard``); the
formulas and their sources are written out in ``docs/cost-model.md`` (bytes), ``docs/step-time.md``
(seconds) and ``docs/step-rules.md`` (the hooks). Nothing here touches the model: per-parameter
numbers come from the ``ModelTree`` once (cached per tree, as numpy arrays), then everything is
summed per ``fully_shard`` call, so a widget toggle costs O(calls), not O(parameters).

- ``events``: the step as one ordered stream of hook events, the one walk of the hooks both models fold;
- ``walk``: the order modules run in, which places every hook;
- ``params``: per-parameter arrays, sharded and whole parameters;
- ``calls``: one ``Call`` per ``fully_shard`` call (where its hooks run, which it gets, its buffers in bytes),
  and FSDP2's hook rules, one function each (roots, which hooks a call gets, prefetch targets, the final callback);
- ``rank_state``: resident state, optimizer states, the exported gradient averaging;
- ``levels``: activation levels around each call (``Analysis`` passes them in);
- ``simulation``: the bytes model, the step event by event; ``allocator`` / ``reserved``: the caching
  allocator's reserved bytes, an option of the simulation;
- ``model``: ``CostModel``, all of the above built once, and its tables: ``memory_table``, ``comm_table``,
  ``peak_breakdown``;
- ``collectives``: the one place a collective's seconds are computed (bandwidth, latency, efficiency);
- ``schedule``: the seconds model, the same stream on a compute stream and communication streams;
- ``timing``: the step time of one analysis (``a.step``, ``a.time``, the timeline).
"""

from ..format import format_bytes
from ..run.mesh import worst_rank
from .calls import OUTSIDE, Call, calls_with_nested_calls
from .levels import ActivationLevels, NoActivations, activation_levels
from .model import BREAKDOWN, CostModel, comm_table, cost_model, memory_table, peak_breakdown
from .params import unsharded_bytes

__all__ = ["BREAKDOWN", "OUTSIDE", "ActivationLevels", "Call", "CostModel", "NoActivations", "activation_levels",
           "calls_with_nested_calls", "comm_table", "cost_model", "format_bytes", "memory_table", "peak_breakdown",
           "unsharded_bytes", "worst_rank"]
