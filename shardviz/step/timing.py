"""The step time of one analysis: FSDP2's schedule (``step/schedule.py``) fed by torch's FLOP count
(the FLOP table), the comm table, the mesh's device and efficiencies, the optimizer step's bytes
and CPU offload's copies. Computed once here; ``Analysis.time``, ``Analysis.step``,
``Analysis.timeline()`` and every view read it (docs/step-time.md, "From an analysis").

It reads the stages it is given (``StepInputs``, built by ``Analysis.step_inputs``), never
the analysis. Without a device (``Mesh(device=...)``) or without a micro-batch
(``Training(batch_size=...)``) there is no step to time: ``a.step.step_time_s`` is None and
``a.step.reason`` says why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from ..activations import opcost, stop
from ..format import OUTSIDE_FSDP, format_duration, format_kind, format_percent, format_rate
from ..run.devices import Device, Efficiency, default_efficiency, stack_of
from ..model.tree import model_name
from .calls import OUTSIDE, Call, ParamState, enclosing_root
from .collectives import Collectives
from .schedule import (COMPUTE, STREAMS, Schedule, StepExtras, host_optimizer_seconds,
                       optimizer_seconds, schedule_step)

if TYPE_CHECKING:
    import pandas as pd

    from ..activations import ActivationProfile
    from ..run.training import Training
    from ..fsdp import Layout
    from ..model.tree import ModelTree

TIME_COLUMNS = ["unit", "forward_s", "backward_s", "recompute_s", "all_gather_forward_s", "all_gather_backward_s",
                "reduce_scatter_s", "all_reduce_s", "exposed_comm_s"]

#: Host <-> device copies of CPU offload (GB/s, one direction, per GPU): the PCIe link of each
#: ``DEVICES`` row (Gen4 x16: 32, Gen5 x16: 64, the datasheets of docs/step-time.md); other devices: 32.
HOST_LINK_GBPS = {"A100-40GB": 32.0, "A100-80GB": 32.0, "H100": 64.0, "H100-PCIe": 64.0, "H200": 64.0,
                  "B200": 64.0, "MI300X": 64.0, "L40S": 32.0, "A10G": 32.0, "RTX-4090": 32.0,
                  "L4": 32.0, "RTX-3090": 32.0, "RTX-3090-NVLink": 32.0}


@dataclass(frozen=True)
class StepInputs:
    """The stages the step time reads. ``layout`` holds the tree (TP-local with a tensor dim), the
    plan and the mesh. The callables return the analysis' stages, each computed once by it on first
    call, so a step without a device or a micro-batch reads none but the FLOPs: ``flops`` (the FLOP
    table, ``Analysis.flops``), ``profile`` (the activation profile, with each op's cost; None
    without a micro-batch), ``collectives`` (the step's collectives, priced once:
    ``collectives.step_collectives``), ``calls`` (every ``Call``, by index: where the layout places
    its hooks) and ``memory`` (the memory table: the optimizer's bytes)."""

    layout: Layout
    training: Training
    flops: Callable[[], pd.DataFrame]
    profile: Callable[[], ActivationProfile | None]
    collectives: Callable[[], Collectives]
    calls: Callable[[], tuple[Call, ...]]
    memory: Callable[[], pd.DataFrame]


@dataclass(frozen=True)
class StepSummary:
    """``a.step``: one optimizer step (every micro-batch) on one rank. Times in seconds,
    ``tokens_per_s`` per rank, ``flops`` and ``model_flops`` (without recomputation) per rank and
    micro-batch. Without a device or a micro-batch the times are None and ``reason`` says why
    (the FLOPs are still there when a micro-batch was measured)."""

    step_time_s: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    hfu: float | None = None
    exposed_comm_s: float | None = None
    compute_s: float | None = None
    flops: float | None = None
    model_flops: float | None = None
    grad_accum: int = 1
    #: the step if every micro-batch reduced (``sync_every_microbatch``) / if only the last one does
    step_time_sync_every_s: float | None = None
    tokens_per_s_sync_every: float | None = None
    step_time_sync_last_s: float | None = None
    tokens_per_s_sync_last: float | None = None
    device: str | None = None
    dtype: str | None = None
    reason: str | None = None
    #: tensor parallelism's collectives (seconds on the compute stream); None without a tensor dim
    tensor_comm_s: float | None = None


@dataclass(frozen=True)
class StepTime:
    """``schedule``: the schedule of the micro-batch that synchronises (the last one), or None;
    ``step``: what ``a.step`` shows; ``assumptions``: what the figures rest on, in words."""

    schedule: Schedule | None
    step: StepSummary
    assumptions: tuple[str, ...] = field(default=())

    @property
    def table(self):
        import pandas as pd

        if self.schedule is None:
            df = pd.DataFrame(columns=TIME_COLUMNS)
        else:
            df = pd.DataFrame(self.schedule.rows(), columns=TIME_COLUMNS)
        df.attrs["reason"] = self.step.reason
        return df


def _unavailable(reason: str, grad_accum: int = 1, flops: dict | None = None) -> StepTime:
    """No step to time; the FLOPs still, when a micro-batch was measured (they need no device)."""
    return StepTime(None, StepSummary(reason=reason, grad_accum=grad_accum, **(flops or {})))


def _measured_flops(inputs: StepInputs) -> dict | None:
    """The step's FLOPs where a micro-batch is measured (a step that cannot be measured has none)."""
    if not inputs.training.with_activations:
        return None
    try:
        totals = _unit_flops(inputs.flops())[2]
    except ValueError:  # the step itself cannot run (PlanError, a model torch cannot measure): no FLOPs either
        return None
    return {"flops": totals["flops"], "model_flops": totals["model_flops"]}


def unit_op_costs(inputs: StepInputs) -> dict:
    """unit name (``OUTSIDE_FSDP`` for what runs outside every call) -> {"forward", "backward",
    "recompute"} ``opcost`` costs of the measured step's ops; a unit measured without them (a
    profile from before op costs) gets its FLOPs as large matmuls."""
    from ..activations import op_costs_per_call

    profile = inputs.profile()
    costs = op_costs_per_call(profile, inputs.layout.plan.units) if profile is not None and profile.module_costs else {}
    out = {}
    for row in inputs.flops().to_dict("records"):
        unit = row["unit"]
        name = OUTSIDE_FSDP if unit is None or (isinstance(unit, float) and math.isnan(unit)) else unit
        measured = costs.get(None if name == OUTSIDE_FSDP else name)
        out[name] = measured or {phase: opcost.flop_only(row[f"{phase}_flops"]) for phase in PHASES}
    return out


PHASES = ("forward", "backward", "recompute")


def stack_for(tree) -> str:
    """The stack the model of ``tree`` most likely trains with (``devices.stack_of``)."""
    from ..activations.measure import hf_config

    model = tree.model
    return stack_of(tree.root_type, model is not None and hf_config(model) is not None)


def efficiency_for(tree, mesh) -> Efficiency:
    """The mesh's ``Efficiency``, else the preset of the model's stack on the mesh's device: what
    every step time of that model on that mesh uses (the analysis, the search's notes)."""
    return mesh.efficiency or default_efficiency(mesh.device, stack_for(tree))


def op_seconds(cost: dict | None, device: Device, eff: Efficiency, dtype: str) -> float:
    """``opcost.seconds`` of a cost on ``device`` at ``eff``: the roofline of every op."""
    peak = device.peak_flops(dtype)
    return opcost.seconds(cost, matmul_flops_per_s=peak * eff.matmul, attention_flops_per_s=peak * eff.attention_fraction,
                          bytes_per_s=device.hbm_gbps * 1e9 * eff.hbm, launch_s=eff.kernel_us * 1e-6,
                          memory_traffic=eff.memory_traffic)


def compute_dtype(training: Training, tree: ModelTree) -> str:
    """The dtype the matmuls run in: the training's ``param_dtype``, else the most common
    parameter dtype (by elements)."""
    if training.param_dtype:
        return training.param_dtype
    counts: dict = {}
    for p in tree.params:
        name = str(p.dtype).replace("torch.", "")
        counts[name] = counts.get(name, 0) + p.numel
    best = max(counts, key=counts.get) if counts else "float32"
    return best if best in ("bfloat16", "float16", "float32") else "float32"


def _unit_flops(table: pd.DataFrame) -> tuple[list[str], dict, dict]:
    """Forward order of the units, FLOPs per unit, and the totals, from the FLOP table."""
    order, flops = [], {}
    columns = [table[c].tolist() for c in ("unit", "forward_flops", "backward_flops", "recompute_flops")]
    for unit, forward, backward, recompute in zip(*columns):
        name = OUTSIDE_FSDP if unit is None or (isinstance(unit, float) and math.isnan(unit)) else unit
        order.append(name)
        flops[name] = {"forward": float(forward), "backward": float(backward), "recompute": float(recompute)}
    totals = {"flops": sum(sum(f.values()) for f in flops.values()),
              "model_flops": sum(f["forward"] + f["backward"] for f in flops.values())}
    return order, flops, totals


def _offload_copies(numbers: dict, eff: Efficiency, device: Device) -> tuple[float, float]:
    """CPU offload: the unit's sharded parameters to the device before each all-gather, its
    gradient shard back to the host after the reduction (bytes over the PCIe link)."""
    gbps = HOST_LINK_GBPS.get(device.name, 32.0) * 1e9 * eff.hbm
    shard = float(numbers["padded_shard_bytes"])
    return shard / gbps, shard * float(numbers["trainable_numel"]) / (float(numbers["numel"]) or 1.0) / gbps


def _offloaded(inputs: StepInputs) -> tuple[set, dict]:
    """The calls CPU offload keeps on the host, and the layout's numbers of each, by call index."""
    layout = inputs.layout
    offloaded = {k for k, u in enumerate(layout.plan.units) if inputs.training.unit_defaults(u).offload}
    numbers = {ul.index: n for ul, n in zip(layout.units, layout.unit_numbers)} if offloaded else {}
    return offloaded, numbers


def host_step_params(inputs: StepInputs) -> float:
    """Trainable elements one rank's host optimizer steps under CPU offload: the trainable share of
    each offloaded call's shard (its padded shard elements x trainable / all elements)."""
    offloaded, numbers = _offloaded(inputs)
    total = 0.0
    for k in offloaded:
        n = numbers[k]
        shard_numel = float(n["padded_shard_bytes"]) / max(float(n["unsharded_bytes"]) / max(float(n["numel"]), 1.0), 1.0)
        total += shard_numel * float(n["trainable_numel"]) / (float(n["numel"]) or 1.0)
    return total


def optimizer_step_seconds(inputs: StepInputs, device: Device, eff: Efficiency) -> tuple[float, float]:
    """The optimizer step's seconds, and the trainable elements the host steps: the offloaded calls'
    shards on the host (the host AdamW, ``host_optimizer_seconds``), every other state on the device
    (memory-bound, ``optimizer_seconds`` of the memory table's device bytes). One price for CPU offload
    however it is set (``Training(offload=True)`` or ``sv.Unit(offload=True)`` on the calls: both reach
    ``Training.unit_defaults``), as torch's one ``optimizer.step()`` steps both kinds of parameter."""
    offloaded, _ = _offloaded(inputs)
    host_params = host_step_params(inputs) if offloaded else 0.0
    device_bytes = optimizer_bytes(inputs.memory())
    seconds = optimizer_seconds(device_bytes, device, eff) if device_bytes else 0.0
    if offloaded:
        seconds += host_optimizer_seconds(host_params, eff)
    return seconds, host_params


def call_seconds(collectives: Collectives, plan_units) -> tuple[dict, float | None]:
    """The collectives of one micro-batch (each issued once: ``Collectives.time_s`` is its one
    duration) -> ({call index: {"all_gather_forward_s", "all_gather_backward_s", "reduce_scatter_s",
    "all_reduce_s", "tensor_forward_s", "tensor_backward_s"}}, seconds of the ignored parameters'
    all-reduce or None), nothing added, so ``a.time`` and ``a.comm`` give one duration per collective."""
    per_call: dict = {}
    ignored = None
    c = collectives
    for call, collective, phase, group, seconds in zip(c.call, c.collective, c.phase, c.group, c.time_s.tolist()):
        if math.isnan(seconds):
            name = None if call == OUTSIDE else plan_units[call].name
            raise ValueError(f"comm table: no bandwidth for the {collective} of {name!r} over the "
                             f"{group} group: give Mesh(device=...) or intra_node_gbps / inter_node_gbps")
        if call == OUTSIDE:  # the exported averager of ignored gradients
            ignored = (ignored or 0.0) + seconds
            continue
        key = f"all_gather_{phase}_s" if collective == "all_gather" else f"{collective}_s"
        if collective == "all_gather" and group == "post_forward":  # its own communicator, not the shard group's
            per_call.setdefault(call, {})["post_forward_gather"] = True
        if group == "tensor":  # tensor parallelism's: blocking, on the compute stream (no async TP)
            key = f"tensor_{phase}_s"
        slot = per_call.setdefault(call, {})
        slot[key] = slot.get(key, 0.0) + seconds
    return per_call, ignored


def _unit_times(inputs: StepInputs, order, costs, comm_s, device, eff, dtype) -> tuple[Call | None, list[Call]]:
    """Each call's ``Call`` with its seconds: the root (the call on the whole model, if any) and the
    others in forward order (``order``: the FLOP table's, by name: the table names its calls), where
    the layout places their hooks. ``comm_s``: ``call_seconds``, by index."""
    plan_units = inputs.layout.plan.units
    index = {u.name: k for k, u in enumerate(plan_units)}
    index[OUTSIDE_FSDP] = OUTSIDE  # the FLOP table's row of what runs outside every call
    offloaded, numbers = _offloaded(inputs)
    calls = inputs.calls()
    root_index = enclosing_root(inputs.layout)
    ordered = [index[n] for n in order]
    root, rows = None, []
    seen = set(ordered)
    for k in ordered + [k for k in range(len(plan_units)) if k not in seen]:
        f, c = costs.get(plan_units[k].name if k != OUTSIDE else OUTSIDE_FSDP, {}), comm_s.get(k, {})
        h2d, d2h = _offload_copies(numbers[k], eff, device) if k in offloaded else (0.0, 0.0)
        call = _outside_call(calls) if k == OUTSIDE else calls[k]
        # its parameters after forward, as the collectives priced say: no backward all-gather
        # (unsharded), one over the post-forward group (a post-forward shard), or over the shard group
        after = (ParamState.UNSHARDED if "all_gather_backward_s" not in c else
                 ParamState.POST_FORWARD_SHARD if c.get("post_forward_gather") else ParamState.SHARDED)
        rs, ar = c.get("reduce_scatter_s"), c.get("all_reduce_s")
        # tensor parallelism's collectives block the compute stream (torch's TP is synchronous):
        # on the critical path, inside the unit's forward and backward
        call = call._replace(
            after_forward=after, reduces=rs is not None or ar is not None,
            forward_s=op_seconds(f.get("forward"), device, eff, dtype) + c.get("tensor_forward_s", 0.0),
            backward_s=op_seconds(f.get("backward"), device, eff, dtype) + c.get("tensor_backward_s", 0.0),
            recompute_s=op_seconds(f.get("recompute"), device, eff, dtype),
            all_gather_forward_s=c.get("all_gather_forward_s", 0.0),
            all_gather_backward_s=c.get("all_gather_backward_s", 0.0),
            reduce_scatter_s=rs, all_reduce_s=ar, h2d_s=h2d, d2h_s=d2h if rs is not None else 0.0)
        if k == root_index:
            root = call
        else:
            rows.append(call)
    return root, rows


def _outside_call(calls) -> Call:
    """What runs outside every call (a plan without a call on the whole model), as the schedule
    times it: after every call's forward, first in backward, in no call's context (no hook of
    its own prefetches or is prefetched)."""
    end = max((c.post_forward[0] for c in calls), default=0)
    return Call(OUTSIDE, max((c.first for c in calls), default=0) + 1, (end + 1,), (end + 2,), True, True, OUTSIDE,
                name=OUTSIDE_FSDP)


def optimizer_bytes(mem: pd.DataFrame) -> int:
    """Bytes the optimizer step reads and writes on the worst rank of the memory table ``mem``: the
    trainable shards (read and written), their gradients (read), the optimizer states (read and written)."""
    worst = int(mem["peak"].to_numpy().argmax())
    return int(3 * int(mem["grads"].to_numpy()[worst]) + 2 * int(mem["optimizer"].to_numpy()[worst]))


def _why_not(inputs: StepInputs) -> str | None:
    if inputs.layout.mesh.device is None:
        return "no device: give sv.Mesh(..., device='H100') (or an sv.Device) to time the step"
    if not inputs.training.with_activations:
        return "no micro-batch: give sv.Training(batch_size=..., seq_len=...) to count the step's FLOPs"
    return None


def step_time(inputs: StepInputs) -> StepTime:
    """The step of these stages as FSDP2 schedules it (see the module docstring)."""
    stop.check()  # pure Python at 70B (tenths of a second): the Inspector's next edit stops it here
    training, tree, mesh = inputs.training, inputs.layout.tree, inputs.layout.mesh
    k = training.grad_accum
    reason = _why_not(inputs)
    if reason:
        return _unavailable(reason, k, _measured_flops(inputs))
    device: Device = mesh.device
    eff = efficiency_for(tree, mesh)
    dtype = compute_dtype(training, tree)
    try:
        comm_s, ignored_s = call_seconds(inputs.collectives(), inputs.layout.plan.units)
    except ValueError as e:
        return _unavailable(str(e), k, _measured_flops(inputs))
    stop.check()  # and between its stages (tens of ms each)
    order, _, totals = _unit_flops(inputs.flops())
    root, units = _unit_times(inputs, order, unit_op_costs(inputs), comm_s, device, eff, dtype)
    opt_s, host_params = optimizer_step_seconds(inputs, device, eff)
    stop.check()
    last = schedule_step(units, root=root, extras=StepExtras(ignored_s, opt_s), placed=True)
    # the exported averager of ignored gradients runs at the end of every backward, synced or not
    quiet = schedule_step(units, root=root, extras=StepExtras(ignored_s, 0.0), sync=False, placed=True) if k > 1 else last
    every = schedule_step(units, root=root, extras=StepExtras(ignored_s, 0.0), placed=True) if k > 1 else last
    sync_last_s = (k - 1) * quiet.step_time_s + last.step_time_s
    every_s = (k - 1) * every.step_time_s + last.step_time_s
    sync_every = training.sync_every_microbatch
    step_s, between = (every_s, every) if sync_every else (sync_last_s, quiet)
    tokens = training.batch_size * training.seq_len * k / mesh.tensor  # a tensor group trains one batch
    peak = device.peak_flops(dtype)
    tensor_s = (k * sum(v for c in comm_s.values() for key, v in c.items() if key.startswith("tensor_"))
                if mesh.tensor > 1 else None)  # only with a tensor dim (tensor=1 unchanged)
    step = StepSummary(
        step_time_s=step_s, tokens_per_s=tokens / step_s,
        mfu=totals["model_flops"] * k / (step_s * peak), hfu=totals["flops"] * k / (step_s * peak),
        exposed_comm_s=(k - 1) * between.exposed_comm_s + last.exposed_comm_s,
        compute_s=(k - 1) * between.compute_s + last.compute_s,
        flops=totals["flops"], model_flops=totals["model_flops"], grad_accum=k,
        step_time_sync_every_s=every_s, tokens_per_s_sync_every=tokens / every_s,
        step_time_sync_last_s=sync_last_s, tokens_per_s_sync_last=tokens / sync_last_s,
        device=device.name, dtype=dtype, tensor_comm_s=tensor_s)
    return StepTime(last, step, _assumptions(inputs, device, eff, dtype, k, sync_every, host_params))


def _assumptions(inputs: StepInputs, device: Device, eff: Efficiency, dtype: str, k: int, sync_every: bool, host_params: float) -> tuple:
    """What every figure of the step rests on, in words: the device, the stack and its
    efficiencies, the links, the host."""
    peak = device.peak_flops(dtype) / 1e12
    mesh = inputs.layout.mesh
    notes = [f"{device.name}: {peak:g} TFLOPS {dtype} peak, HBM {device.hbm_gbps:g} GB/s; each op timed by its roofline "
             f"(FLOPs, bytes read and written, one kernel)",
             eff.describe() + (" (the mesh's own)" if mesh.efficiency else
                               f" (the preset of the stack a {model_name(inputs.layout.tree)} most likely trains with)"),
             f"links: {mesh.intra_node_gbps:g} GB/s per GPU inside a node of {mesh.ranks_per_node}, "
             f"{mesh.node_network_gbps:g} GB/s per node across nodes ({mesh.nics_per_node} NICs x {mesh.nic_gbps:g} GB/s; "
             "a ring spreads over them), plus NCCL's ring latency per call"]
    if host_params:
        notes.append(f"CPU offload: the host's AdamW steps {host_params / 1e9:.3g} B parameters per rank at "
                     f"{eff.host_adamw_gparams_per_s:.3g} B/s; parameters and gradients cross PCIe at "
                     f"{HOST_LINK_GBPS.get(device.name, 32.0):g} GB/s x {eff.hbm:g}")
    if mesh.tensor > 1:
        notes.append(f"tensor parallelism over {mesh.tensor} ranks: its collectives on the compute stream, inside each "
                     "unit's forward and backward (no async TP); FSDP's over the data-parallel ranks on their own streams")
    if k > 1 and not sync_every:
        notes.append(f"{k} micro-batches, the first {k - 1} under set_requires_gradient_sync(False) (no reduction)")
    elif k > 1:
        notes.append(f"{k} micro-batches, each one reducing (sync_every_microbatch)")
    return tuple(notes)


# ---------------------------------------------------------------------------
# The timeline: one payload every view draws (display.timeline_payload: that of an analysis)
# ---------------------------------------------------------------------------
def timeline_payload(st: StepTime) -> dict:
    """The events of step ``st`` as plain data, in start order: the payload ``a.timeline()``, the
    report and the Inspector draw (``display.timeline_payload``). ``available`` False carries the ``reason``."""
    if st.schedule is None:
        return {"available": False, "reason": st.step.reason}
    sched, step = st.schedule, st.step
    # a collective of no bytes (an all-gather in shard groups of 1 rank) takes no time: not drawn
    events = [e for e in sched.timeline() if e["end_s"] > e["start_s"]]
    used = {e["stream"] for e in events}
    k = step.grad_accum
    note = (f"the last of {k} micro-batches (the one that reduces); the step is {step.step_time_s:.3f} s"
            if k > 1 else "")
    streams = [s for s in STREAMS if s == COMPUTE or s in used]
    return {
        # the lanes with something on them (an FSDP step has no all-reduce: no empty lane that reads as one)
        "streams": streams,
        "names": {k: format_kind(k) for k in [*streams, *(e["kind"] for e in events)]},  # lanes and kinds, as drawn
        "available": True, "events": events,
        "step_time_s": sched.step_time_s, "exposed_comm_s": sched.exposed_comm_s, "compute_s": sched.compute_s,
        "summary": step_text(step), "note": note, "assumptions": list(st.assumptions),
        "units": [u.name for u in sched.units], "labels": _short_names([u.name for u in sched.units]),
    }


def _short_names(names: list[str]) -> dict:
    """Unit names without the dotted prefix they all share (``layers.0``, not ``base_model.model.model.layers.0``)."""
    dotted = [n.split(".") for n in names if "." in n and not n.startswith(("[", "<", "("))]
    prefix = 0
    if len(dotted) > 1:
        # "layers.0", never a bare "0": a numbered name keeps its parent
        while all(len(d) > prefix + (2 if d[-1].isdigit() else 1) and d[prefix] == dotted[0][prefix] for d in dotted):
            prefix += 1
    out = {}
    for n in names:
        if n.startswith("["):
            out[n] = "[" + ", ".join(m.split(".")[-1] for m in n.strip("[]").split(", ")) + "]"
        elif "." in n and prefix:
            out[n] = ".".join(n.split(".")[prefix:])
        else:
            out[n] = n
    return out


def step_text(step: StepSummary) -> str:
    """One line: step time, tokens/s per rank, MFU, exposed communication (or why there is none)."""
    if step.step_time_s is None:
        return f"step time: {step.reason}"
    return (f"step {format_duration(step.step_time_s)} · {format_rate(step.tokens_per_s)} tokens/s per rank · "
            f"MFU {format_percent(step.mfu)} · exposed communication {format_duration(step.exposed_comm_s)}"
            f" ({step.device})")


# the chart palette of widget/inspector.css, kind by kind as charts.js's TL_CLASS; red only for the waits
_COLOURS = {"forward": "#4c78a8", "backward": "#f58518", "recompute": "#b279a2", "optimizer": "#54a24b",
            "all_gather": "#72b7b2", "reduce_scatter": "#eeca3b", "all_reduce": "#9d755d",
            "ignored_all_reduce": "#9d755d", "h2d": "#bab0ac", "d2h": "#bab0ac"}


def timeline_figure(payload: dict):
    """``timeline_payload`` as a plotly figure: one lane per stream, a bar per event, the compute
    stream's waits (exposed communication) in red."""
    import plotly.graph_objects as go

    fig = go.Figure()
    if not payload.get("available"):
        fig.add_annotation(text=payload.get("reason", "no step time"), showarrow=False, x=0.5, y=0.5,
                           xref="paper", yref="paper")
        return fig.update_layout(height=200)
    names = payload["names"]
    by_kind: dict = {}
    for e in payload["events"]:
        by_kind.setdefault(e["kind"], []).append(e)
    for kind, evs in by_kind.items():
        fig.add_trace(go.Bar(
            y=[names[e["stream"]] for e in evs], x=[e["end_s"] - e["start_s"] for e in evs],
            base=[e["start_s"] for e in evs], orientation="h", name=names[kind],
            marker_color=_COLOURS.get(kind, "#999"),
            hovertext=[f"{e['unit'] or 'step'} · {names[e['kind']]} ({e['phase']}): {1e3 * (e['end_s'] - e['start_s']):.2f} ms"
                       + (f", compute waits {1e3 * e['exposed_s']:.2f} ms" if e["exposed"] else "") for e in evs],
            hoverinfo="text"))
    waits = [e for e in payload["events"] if e["exposed"]]
    if waits:
        fig.add_trace(go.Bar(y=[names[COMPUTE]] * len(waits), x=[e["exposed_s"] for e in waits],
                             base=[e["end_s"] - e["exposed_s"] for e in waits], orientation="h",
                             name="exposed communication (compute waits)", marker_color="#d62728",
                             marker_pattern_shape="/", hoverinfo="text",
                             hovertext=[f"waits {1e3 * e['exposed_s']:.2f} ms for {names[e['kind']]} of {e['unit']}" for e in waits]))
    fig.update_yaxes(categoryorder="array", categoryarray=[names[s] for s in reversed(payload["streams"])])
    fig.update_layout(barmode="overlay", height=320, title=payload["summary"], xaxis_title="seconds",
                      legend_orientation="h")
    return fig
