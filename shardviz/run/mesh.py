"""``sv.Mesh``: the ranks a run trains on (the HSDP split, the tensor dimension, the device) and how
its memory is judged: ``DeviceLimits``, the fits verdict every surface reads (``Mesh.fit``, built on
``devices.memory_fit``), and ``worst_rank``, the rank that verdict judges.

One home for the run's setup (``shardviz.run``): this module, ``training`` (``sv.Training`` and the
one default), ``devices`` (the device table, the reserve and the verdict's arithmetic) and ``setup``
(the plan file's JSON of both).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from .devices import (
    MEMORY_RESERVE_BYTES,
    SAFETY_MARGIN,
    Device,
    Efficiency,
    MemoryFit,
    allocator_text,
    check_fit_settings,
    limit_text,
    memory_fit,
    mesh_defaults,
    usable_memory,
)
from ..format import format_plural, parse_size


def worst_rank(memory: pd.DataFrame) -> int:
    """The rank with the highest peak in a memory table (``a.memory``); the first such rank on a tie."""
    return int(memory["rank"].iloc[int(memory["peak"].to_numpy().argmax())])


class DeviceLimits:
    """What ``run.Mesh`` judges memory with, from its ``device_memory``, ``memory_reserve``,
    ``safety_margin``, ``expandable_segments`` and ``judge`` fields."""

    def fit(self, peak: int, reserved: int, cpu_peak: int = 0) -> MemoryFit | None:
        """``memory_fit`` of the allocated ``peak`` and the caching allocator's ``reserved`` peak,
        judged on the reserved one unless ``judge="allocated"``; None without ``device_memory``.
        Both are required: a verdict always knows the figure it judges. ``cpu_peak``: the worst rank's
        host RAM under CPU offload (``a.memory.cpu_peak``), times the ranks of a node (``host_ranks``)
        judged against ``host_memory``."""
        ranks = self.host_ranks
        return memory_fit(peak, reserved, self.device_memory, self.memory_reserve, self.safety_margin, self.judge,
                          allocator_text(self.expandable_segments), int(cpu_peak) * ranks, self.host_memory, ranks)

    @property
    def host_ranks(self) -> int:
        """The ranks one node's host RAM serves: ``ranks_per_node``, or the whole world when smaller."""
        return min(self.ranks_per_node, self.world)

    @property
    def usable_memory(self) -> int | None:
        """``device_memory`` less ``memory_reserve``: the limit every fits verdict draws and uses."""
        return None if self.device_memory is None else usable_memory(self.device_memory, self.memory_reserve)

    @property
    def limit_text(self) -> str | None:
        """The limit in words: "79.00 GiB usable (80.00 GiB − 1.00 GiB reserve)"."""
        return None if self.device_memory is None else limit_text(self.device_memory, self.memory_reserve)


def parse_bytes(value) -> int | None:
    """80e9, "80GB" or "80GiB" -> bytes (None stays None)."""
    return None if value is None else parse_size(value, "device_memory")


@dataclass(frozen=True)
class Mesh(DeviceLimits):
    """The data-parallel mesh: ``shard`` ranks per FSDP group, ``replicate`` copies (HSDP when > 1).

    Global rank r sits at (r // shard, r % shard), as ``init_device_mesh(..., (replicate, shard))`` lays it out.
    Bandwidths (GB/s per rank, one direction) are optional and only feed the time estimate.
    ``device`` (a name from ``shardviz.run.devices.DEVICES`` or an ``sv.Device``) fills
    ``device_memory``, the bandwidths and ``ranks_per_node`` (its GPUs per node) where they are not
    given; fields given explicitly win over the device's row. Without a device: 8 ranks per node.
    ``efficiency`` (an ``sv.Efficiency``): the fractions of the device's peaks a step achieves, for
    the step time (None: ``devices.default_efficiency(device)``, measured where known).
    ``memory_reserve`` (bytes or a size, default ``devices.MEMORY_RESERVE_BYTES`` = 1 GiB for the
    CUDA context and NCCL's buffers, 0 allowed): kept out of ``device_memory`` by every fits
    verdict (``fit(peak)``; docs/step-time.md, "Memory reserve").
    ``nics_per_node`` / ``nic_gbps``: a node's NICs and GB/s each (default one per GPU at ``inter_node_gbps``).
    ``safety_margin``, ``expandable_segments``, ``judge``, ``host_memory`` (one node's host RAM, judged
    under CPU offload): how ``fit(peak, reserved, cpu_peak)`` judges (``run.DeviceLimits``).
    """

    shard: int
    replicate: int = 1
    device_memory: int | str | None = None
    ranks_per_node: int | None = None
    intra_node_gbps: float | None = None
    inter_node_gbps: float | None = None
    device: str | Device | None = None
    efficiency: Efficiency | None = None
    memory_reserve: int | str = MEMORY_RESERVE_BYTES
    nics_per_node: int | None = None
    nic_gbps: float | None = None
    safety_margin: float | int | str = SAFETY_MARGIN
    expandable_segments: bool = False
    judge: str = "reserved"
    tensor: int = 1
    host_memory: int | str | None = None

    def __post_init__(self):
        self._fill_from_device()
        if self.efficiency is not None and not isinstance(self.efficiency, Efficiency):
            raise ValueError(f"Mesh.efficiency must be an sv.Efficiency(matmul=..., collective_bus=..., hbm=...), "
                             f"got {self.efficiency!r}")
        for key in ("shard", "replicate", "ranks_per_node", "tensor"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Mesh.{key} must be a positive int, got {value!r}")
        object.__setattr__(self, "device_memory", parse_bytes(self.device_memory))
        reserve = parse_size(self.memory_reserve, "Mesh.memory_reserve")
        if reserve < 0:
            raise ValueError(f"Mesh.memory_reserve must be >= 0 bytes, got {self.memory_reserve!r}")
        object.__setattr__(self, "memory_reserve", reserve)
        check_fit_settings(self.safety_margin, self.expandable_segments, self.judge)

    @property
    def node_network_gbps(self) -> float | None:
        return None if self.nic_gbps is None else self.nics_per_node * self.nic_gbps  # all of a node's NICs

    def _fill_from_device(self) -> None:
        """The device's figures where the fields are None, then the NICs (``devices.mesh_defaults``)."""
        for key, value in mesh_defaults(self).items():
            object.__setattr__(self, key, value)

    @property
    def world(self) -> int:
        return self.shard * self.replicate * self.tensor

    @property
    def is_hsdp(self) -> bool:
        return self.replicate > 1

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.replicate, self.shard, self.tensor) if self.tensor > 1 else (self.replicate, self.shard) if self.is_hsdp else (self.shard,)

    def coords(self, rank: int) -> tuple[int, int]:
        """(replicate, shard) index of a global rank; ``tensor`` is innermost (rank % T), as torchtitan's dp_replicate, dp_shard, tp."""
        if not 0 <= rank < self.world:
            raise ValueError(f"rank {rank} is outside the mesh of {self.world} ranks")
        return divmod(rank // self.tensor, self.shard)

    def __str__(self) -> str:
        dp = f"HSDP {self.replicate}x{self.shard}" if self.is_hsdp else f"FSDP {format_plural(self.shard, 'rank')}"
        return dp + (f" x TP {self.tensor}" if self.tensor > 1 else "")
