"""Memory per rank and communication per step, from the layout, mirroring torch 2.13's FSDP2 buffers.

Every quantity names the torch code it mirrors (``torch/distributed/fsdp/_fully_shard``); the
formulas and their sources are written out in ``docs/cost-model.md``. Nothing here touches the
model: per-parameter numbers come from the ``ModelTree`` once (cached per tree, as numpy arrays),
then everything is summed per ``fully_shard`` call, so a widget toggle costs O(calls), not
O(parameters).

- ``training``: ``Training`` (optimizer, policies, micro-batch);
- ``params``: per-parameter arrays, sharded and whole parameters;
- ``walk``: the order modules run in, which places every hook;
- ``units``: one ``step_events.StepCall`` per call (where its hooks run, which it gets: ``hook_rules``) and one
  ``UnitCost`` per call with parameters;
- ``state``: resident state, optimizer states, the exported gradient averaging;
- ``levels``: activation levels around each call (``Analysis`` passes them in);
- ``simulation``: the step, event by event;
- ``model``: ``CostModel``, all of the above built once;
- ``tables``: ``memory_table``, ``comm_table``, ``peak_breakdown``.
"""

from ..format import format_bytes
from ..run.mesh import worst_rank
from .levels import ActivationLevels, NoActivations, activation_levels
from .model import CostModel, cost_model
from .params import unsharded_bytes
from .tables import BREAKDOWN, comm_table, memory_table, peak_breakdown
from .training import OPTIMIZERS, Training
from .units import UnitCost, calls_with_nested_calls

__all__ = ["BREAKDOWN", "OPTIMIZERS", "ActivationLevels", "CostModel", "NoActivations", "Training", "UnitCost",
           "activation_levels", "calls_with_nested_calls", "comm_table", "cost_model", "format_bytes", "memory_table", "peak_breakdown", "unsharded_bytes", "worst_rank"]
