"""The run's setup, in one home: ``Mesh`` (the ranks, the device, the memory verdict), ``Training``
(optimizer, precision, micro-batch; ``DEFAULT_TRAINING``, the one default every entry point
assumes), the device table (``devices``) and the plan file's JSON of a mesh and a training
(``setup``).

Below ``fsdp`` (which lays a plan out on a ``Mesh``) and above ``plan`` (a ``Training``
reads a ``Unit``'s mixed-precision options)."""

from .devices import Device, Efficiency
from .mesh import DeviceLimits, Mesh, worst_rank
from .training import DEFAULT_TRAINING, Training

__all__ = ["DEFAULT_TRAINING", "Device", "DeviceLimits", "Efficiency", "Mesh", "Training", "worst_rank"]
