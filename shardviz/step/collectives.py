"""The one place a collective's seconds are computed: the link it runs on (bandwidth), NCCL's ring
latency, the stack's bus efficiency. ``a.comm`` (``model.comm_table``: ``time_s``), ``a.time`` and
the timeline (``timing``, from the step's collectives directly), the traffic chart and the search
all read these durations (docs/step-time.md, "The links").

A collective of the step is one of the bytes model's ``simulation.Collective`` (FSDP2's, keyed by
the call's index), the exported gradient averager's all-reduce (``OUTSIDE`` every call) or a
tensor-parallel one (``Analysis``' tensor rows); each runs once per micro-batch, and
``step_count`` says how many times a step issues it.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..run.devices import DEFAULT_EFFICIENCY, Efficiency
from .calls import OUTSIDE

#: what ``price`` and ``comm_table`` read of a collective: its kind, process group and size, its bytes
KINDS = ("all_gather", "reduce_scatter", "all_reduce")


def collective_seconds(sent_bytes, gbps, latency_s=0.0, efficiency: Efficiency = DEFAULT_EFFICIENCY):
    """The one duration of a collective call, wherever it is read (``a.comm.time_s``, ``a.time``, the
    timeline, the traffic chart, the search): its ring latency (alpha) plus the bytes each rank sends
    at ``efficiency.collective_bus`` of the link's GB/s (n / beta). Scalars or numpy arrays; an
    unknown bandwidth (NaN) gives NaN."""
    return latency_s + sent_bytes / (gbps * 1e9 * efficiency.collective_bus)


def nodes_crossed(mesh, group: str, size: int) -> int:
    """How many nodes a ring over this process group visits (1: it stays inside one node)."""
    rpn = mesh.ranks_per_node
    t = mesh.tensor  # innermost: a tensor group's ranks are consecutive, a shard group's T apart
    if group in ("tensor", "shard", "post_forward"):
        span = {"tensor": t, "shard": mesh.shard * t, "post_forward": size * t}[group]  # consecutive ranks covered
        return 1 if span <= rpn and rpn % span == 0 else min(size, -(-span // rpn))
    # replicate (one rank of every shard group) and world: spread over the nodes the whole mesh tiles
    return 1 if mesh.world <= rpn else min(size, -(-mesh.world // rpn))


def group_bandwidth(mesh, group: str, size: int) -> float:
    """GB/s per rank of a ring over this process group (NaN when unknown). Inside a node: the
    intra-node link. Across nodes NCCL runs one ring per NIC (channels), each leaving a node through
    its own NIC, so the ranks a group has on each node share the node's network bandwidth
    (``Mesh.node_network_gbps``, their share of the node's GPUs), and a ring over them is never
    faster than the intra-node link it also crosses (docs/step-time.md, "The links")."""
    nodes = nodes_crossed(mesh, group, size)
    if nodes == 1:
        return float("nan") if mesh.intra_node_gbps is None else float(mesh.intra_node_gbps)
    if mesh.inter_node_gbps is None:
        return float("nan")
    per_node = max(1, min(mesh.ranks_per_node, -(-size // nodes)))  # the group's ranks on one node
    network = mesh.node_network_gbps * per_node / mesh.ranks_per_node
    if per_node == 1 or mesh.intra_node_gbps is None:
        return float(network)
    return float(min(network, mesh.intra_node_gbps))


# NCCL's own latency model of a ring, Simple protocol (src/graph/tuning.cc, ncclTunerConstantsDefaults
# and ncclTopoTuneModel): a base of 8.4 us, 3.4 us per step over NVLink, 14 us per step over the
# network; n - 1 steps for an all-gather or reduce-scatter (nodes - 1 of them across nodes), twice
# that for an all-reduce.
RING_BASE_US, RING_NVLINK_STEP_US, RING_NET_STEP_US = 8.4, 3.4, 14.0


def ring_latency_s(collective: str, size: int, nodes: int) -> float:
    """Seconds a ring ``collective`` over ``size`` ranks spanning ``nodes`` nodes takes before any
    byte counts (alpha of alpha + n / beta); 0 for a group of one."""
    if size <= 1:
        return 0.0
    twice = 2 if collective == "all_reduce" else 1
    steps, net = twice * (size - 1), twice * (nodes - 1)
    return (RING_BASE_US + (steps - net) * RING_NVLINK_STEP_US + net * RING_NET_STEP_US) * 1e-6


def collective_efficiency(mesh, efficiency: Efficiency | None = None) -> Efficiency:
    """The efficiency a collective's bus runs at: the stack's (``timing.efficiency_for``), else the
    mesh's, else the default."""
    return efficiency or mesh.efficiency or DEFAULT_EFFICIENCY


def price(mesh, kinds, groups, sizes, nbytes, efficiency: Efficiency | None = None):
    """Per collective (``kinds``, ``groups``, ``sizes`` and ``nbytes``, one entry each): the bytes
    each rank sends, its seconds (``collective_seconds``) and its latency, as numpy arrays. Each
    distinct ring (kind, group, size) is priced once: a step has a few and hundreds of collectives.
    Ring algorithm: an all-gather or reduce-scatter sends (n-1)/n of the full buffer per rank, an
    all-reduce (reduce-scatter + all-gather) twice that."""
    rings: dict[tuple, int] = {}
    ring = np.array([rings.setdefault(key, len(rings)) for key in zip(kinds, groups, sizes)], dtype=np.int64)
    twice = np.array([2 if c == "all_reduce" else 1 for c, _, _ in rings], dtype=np.int64)
    bw = np.array([group_bandwidth(mesh, g, s) for _, g, s in rings], dtype=float)
    latency = np.array([ring_latency_s(c, s, nodes_crossed(mesh, g, s)) for c, g, s in rings], dtype=float)
    n = np.asarray(sizes, dtype=np.int64)
    b = np.asarray(nbytes, dtype=np.int64)
    sent = (twice[ring] * b * (n - 1)) // np.maximum(n, 1)
    return sent, collective_seconds(sent, bw[ring], latency[ring], collective_efficiency(mesh, efficiency)), latency[ring]


def step_count(collective: str, fsdp: bool, grad_accum: int, sync_every: bool) -> int:
    """How many times one optimizer step issues a collective that each micro-batch issues once:
    FSDP's reduce-scatters and HSDP all-reduces only in the micro-batches that reduce (the last,
    or every one with ``sync_every``: ``set_requires_gradient_sync``), everything else (all-gathers,
    the averager of ignored gradients, tensor parallelism's) in every micro-batch."""
    if fsdp and collective != "all_gather":
        return grad_accum if sync_every else 1
    return grad_accum


class Collectives(NamedTuple):
    """Every collective of one micro-batch that reduces, priced once, as columns in issue order:
    FSDP2's (the bytes model's ``StepResult.collectives``), then the exported averager's all-reduce
    of ignored gradients (``OUTSIDE`` every call), then tensor parallelism's. ``count``: how many
    times the step issues each (``step_count``); ``sent``, ``time_s``, ``latency_s``: ``price``'s,
    for one issue. ``comm_table`` shows them; ``timing`` schedules them, one micro-batch at a time."""

    call: list  # the call's index in plan.units (OUTSIDE: the averager)
    collective: tuple
    phase: tuple
    group: tuple
    group_size: tuple
    dtype: list
    nbytes: np.ndarray
    count: tuple
    sent: np.ndarray
    time_s: np.ndarray
    latency_s: np.ndarray


def _moved(calls) -> tuple[np.ndarray, np.ndarray]:
    """Per kind of collective (``KINDS``) and call index: the bytes it moves, and their dtype."""
    nbytes = np.array([[c.gather for c in calls], [c.rs_input for c in calls], [c.rs_output for c in calls]],
                      dtype=np.int64)
    dtypes = np.array([[c.gather_dtype for c in calls], [c.reduce_dtype for c in calls], [c.reduce_dtype for c in calls]],
                      dtype=object)
    return nbytes, dtypes


def _averager_rows(costs) -> list[tuple]:
    """The exported gradient averager's all-reduce as a (call, collective, phase, group, size,
    dtype, bytes) row (none without it): it runs at the end of every backward, each micro-batch's."""
    avg = costs.averaging
    if avg is None:
        return []
    return [(OUTSIDE, "all_reduce", "backward", "world", costs.mesh.world // costs.mesh.tensor, avg.dtype, avg.bytes)]


def _float8_rows(costs) -> list[tuple]:
    """torchao's ``precompute_float8_dynamic_scale_for_fsdp`` after each optimizer step (the export's
    ``after_optimizer_step``): one all-reduce of every float8 weight's amax, as an ``_averager_rows`` row."""
    if costs.float8_amax is None:
        return []
    dtype, nbytes = costs.float8_amax
    return [(OUTSIDE, "all_reduce", "optimizer", "shard", costs.mesh.shard, dtype, nbytes)]


def step_collectives(costs, tensor_rows=(), efficiency: Efficiency | None = None) -> Collectives:
    """The ``Collectives`` of ``costs`` (a ``model.CostModel``). ``tensor_rows``: tensor
    parallelism's, (call index, collective, phase, "tensor", group size, dtype, bytes) each, once per
    micro-batch; ``efficiency``: the stack's (``collective_efficiency``)."""
    fsdp = costs.step.collectives
    call, kinds, phase, group, gsize = zip(*fsdp) if fsdp else ((),) * 5
    nbytes, dtypes = _moved(costs.calls)
    code = np.array([KINDS.index(c) for c in kinds], dtype=np.int64)
    at = np.array(call, dtype=np.int64)
    dtype, moved, call = dtypes[code, at].tolist(), nbytes[code, at], list(call)
    t = costs.training
    count = tuple(step_count(c, True, t.grad_accum, t.sync_every_microbatch) for c in kinds)
    extra = [*_averager_rows(costs), *_float8_rows(costs), *tensor_rows]
    if extra:
        e_call, e_kinds, e_phase, e_group, e_gsize, e_dtype, e_bytes = zip(*extra)
        call += e_call
        moved = np.concatenate([moved, e_bytes])
        kinds, phase, group, gsize = kinds + e_kinds, phase + e_phase, group + e_group, gsize + e_gsize
        dtype += e_dtype
        # the optimizer phase's (float8 amax) runs once a step, the others once per micro-batch
        count += tuple(1 if p == "optimizer" else step_count(c, False, t.grad_accum, t.sync_every_microbatch)
                       for c, p in zip(e_kinds, e_phase))
    sent, time_s, latency = price(costs.mesh, kinds, group, gsize, moved, efficiency)
    return Collectives(call, kinds, phase, group, gsize, dtype, moved, count, sent, time_s, latency)
