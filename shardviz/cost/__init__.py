"""The run's setup the step is priced for: ``Training`` (optimizer, policies, micro-batch) and the
plan file's setup JSON (``setup``). The step itself (memory per rank, communication and time per
step) is ``shardviz.step``.

- ``training``: ``Training`` (optimizer, policies, micro-batch);
- ``setup``: the mesh and training of a plan file, as JSON.
"""

from ..format import format_bytes
from ..run.mesh import worst_rank
from .training import OPTIMIZERS, Training

__all__ = ["OPTIMIZERS", "Training", "format_bytes", "worst_rank"]
