"""The run's setup, in one home: ``Mesh`` (the ranks, the device, the memory verdict), ``Training``
(optimizer, precision, micro-batch; ``DEFAULT_TRAINING``, the one default every entry point assumes),
the device table and the plan file's JSON of a mesh and a training (``setup``).

Below ``fsdp`` (which lays a plan out on a ``Mesh``) and above ``plan`` (a ``Training`` reads a
``Unit``'s mixed-precision options)."""

from .mesh import DeviceLimits, Mesh, worst_rank

__all__ = ["DeviceLimits", "Mesh", "worst_rank"]
