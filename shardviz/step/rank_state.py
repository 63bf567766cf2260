"""What every rank keeps between steps (parameters, buffers, gradients, optimizer states), the
optimizer step's temporaries, and the exported code's gradient averaging. Per shard coordinate
where ranks differ (numpy arrays of ``shard`` entries)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .params import ShardedParams, TreeArrays, WholeParams, code_names, per_coord_max, per_coord_sum, promote
from ..run.training import Training, itemsize
from .calls import Call


@dataclass(frozen=True)
class ResidentState:
    params_sharded: int  # padded shards on the device
    params_whole: int
    buffers: int
    grads_sharded: int  # on the device
    grads_whole: int
    cpu_params: int  # offloaded shards
    cpu_grads: np.ndarray  # per shard coordinate: offloaded gradients, without padding
    # bitsandbytes' quant_state of every Params4bit (absmax, code tables): not a parameter, so FSDP2
    # neither shards nor gathers nor offloads it; every rank keeps it whole on the device
    quant_state: int = 0

    @property
    def grads(self) -> int:
        """Gradients on the device."""
        return self.grads_sharded + self.grads_whole

    @property
    def total(self) -> int:
        """Parameters and buffers on the device."""
        return self.params_sharded + self.params_whole + self.buffers + self.quant_state


def resident_state(arr: TreeArrays, sh: ShardedParams, whole: WholeParams, units: list[Call],
                   shard: int) -> ResidentState:
    device = ~sh.offload
    t_off = sh.trainable & sh.offload
    return ResidentState(
        params_sharded=int((sh.padded * sh.itemsize)[device].sum()),
        params_whole=whole.params,
        buffers=arr.buffer_bytes,
        grads_sharded=int(sum(u.sharded_grads for u in units if not u.offload)),
        grads_whole=whole.grads,
        cpu_params=int((sh.padded * sh.itemsize)[sh.offload].sum()),
        # offloaded gradients are copied to the CPU without padding (foreach_reduce: .to("cpu"))
        cpu_grads=per_coord_sum(arr, sh.index[t_off], (sh.row * sh.itemsize)[t_off], shard),
        quant_state=arr.quant_state_bytes,
    )


@dataclass(frozen=True)
class OptimizerState:
    """Optimizer states per shard coordinate, and the temporaries of ``optimizer.step()``."""

    device: np.ndarray  # states of sharded parameters on the device (+ Adam's step scalars there)
    whole: int  # states of trainable whole parameters
    cpu: np.ndarray  # states of offloaded parameters
    cpu_steps: int  # Adam's step scalars on the CPU
    step_temporaries: np.ndarray  # on the device, during optimizer.step()
    cpu_step_temporaries: np.ndarray


def _state_rows(training: Training, arr: TreeArrays, sh: ShardedParams, whole: WholeParams):
    """Bytes of one state row per sharded parameter, one state per trainable whole parameter."""
    opt_dtype = training.optimizer_dtype
    row_state = sh.row * (itemsize(opt_dtype) if opt_dtype else sh.itemsize)
    w = whole.index[whole.trainable]
    w_state = arr.numel[w] * (itemsize(opt_dtype) if opt_dtype else arr.itemsize[w])
    return row_state, w_state


def optimizer_state(training: Training, arr: TreeArrays, sh: ShardedParams, whole: WholeParams,
                    shard: int) -> OptimizerState:
    n_states = training.n_states
    row_state, w_state = _state_rows(training, arr, sh, whole)
    t_dev, t_off = sh.trainable & ~sh.offload, sh.trainable & sh.offload
    # zeros_like(DTensor) allocates the local (unpadded) rows of this coordinate
    dev_state = per_coord_sum(arr, sh.index[t_dev], row_state[t_dev], shard)
    off_state = per_coord_sum(arr, sh.index[t_off], row_state[t_off], shard)
    # Adam's ``step``: a 0-dim float32 per parameter; on the device with fused/capturable
    # Adam, else on the CPU (torch/optim/adam.py, ``_init_group``)
    steps = 4 * int(sh.trainable.sum() + whole.trainable.sum()) if training.step_scalars else 0
    step_dev = steps if training.step_on_device else 0
    zeros = np.zeros(shard, dtype=np.int64)
    tmp_dev = tmp_cpu = zeros
    if training.step_scalars and not training.fused:
        # Adam's foreach path: sqrt(exp_avg_sq) for every parameter of a param group at once
        # (sharded and whole parameters are separate groups: foreach refuses the mix); the
        # per-parameter loop one parameter's worth. The fused kernel allocates none.
        fe_dev = True if training.foreach is None else training.foreach
        fe_cpu = False if training.foreach is None else training.foreach
        if fe_dev:
            tmp_dev = np.maximum(dev_state, int(w_state.sum()))
        else:
            tmp_dev = np.maximum(per_coord_max(sh.dim0[t_dev], row_state[t_dev], shard), int(w_state.max(initial=0)))
        tmp_cpu = off_state if fe_cpu else per_coord_max(sh.dim0[t_off], row_state[t_off], shard)
    return OptimizerState(device=n_states * dev_state + step_dev, whole=n_states * int(w_state.sum()),
                          cpu=n_states * off_state, cpu_steps=steps - step_dev,
                          step_temporaries=tmp_dev, cpu_step_temporaries=tmp_cpu)


@dataclass(frozen=True)
class GradientAveraging:
    """The exported code's one flattened all-reduce of the gradients FSDP leaves alone."""

    dtype: str  # the promoted dtype of every gradient
    bytes: int  # the flat buffer: every gradient, then one "has a gradient" flag per parameter
    temporaries: int  # converted copies + one averaged slice


def gradient_averaging(training: Training, arr: TreeArrays, whole: WholeParams, world: int) -> GradientAveraging | None:
    """The exported code averages the gradients FSDP leaves alone in ONE flattened all-reduce at
    the end of backward (codegen's averager); None when it does not run."""
    if not (training.sync_outside_fsdp and world > 1 and whole.trainable.any()):
        return None
    names = code_names()
    w = whole.index[whole.trainable]
    codes = arr.dtype[w].tolist()
    common = promote(sorted({names[c] for c in codes}))
    size = itemsize(common)
    numel = arr.numel[w]
    converted = int((numel * size)[np.array([names[c] != common for c in codes])].sum())
    return GradientAveraging(common, (int(numel.sum()) + len(codes)) * size, converted + int((numel * size).max()))
