"""``sv.Training``: how the model is trained (optimizer, ``fully_shard`` policies, micro-batch)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..plan import DTYPE_NAMES, Unit

OPTIMIZERS = {"adamw": 2, "adam": 2, "sgd": 0, "sgd_momentum": 1}
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}


def itemsize(name: str) -> int:
    if name not in ITEMSIZE:
        import torch

        ITEMSIZE[name] = getattr(torch, name).itemsize
    return ITEMSIZE[name]


@dataclass(frozen=True)
class Training:
    """How the model is trained; feeds the cost model and the policies passed to ``fully_shard``.

    optimizer: ``"adamw"`` / ``"adam"`` (2 states per trainable parameter: ``exp_avg``,
        ``exp_avg_sq``, plus a 0-dim float32 ``step`` tensor that torch keeps on the CPU),
        ``"sgd"`` (no state), ``"sgd_momentum"`` (1 state: ``momentum_buffer``), or an int:
        that many states per trainable parameter.
    optimizer_dtype: dtype of the states; None means each parameter's own dtype (torch's
        ``zeros_like(param)``). With FSDP the sharded parameters keep their original dtype under
        mixed precision, so the states do too.
    param_dtype, reduce_dtype: ``MixedPrecisionPolicy`` defaults for every call (a ``sv.Unit``
        option overrides them per call). By default bf16 parameters and fp32 gradient reduction,
        the one default every entry point assumes (``DEFAULT_TRAINING``); ``param_dtype=None``
        (and ``reduce_dtype=None``) given explicitly: no mixed-precision policy, each parameter
        computes and reduces in its own dtype (torch's ``fully_shard`` without ``mp_policy``).
    offload: ``CPUOffloadPolicy`` for every call (a ``sv.Unit(offload=True)`` turns it on per call).
    sync_outside_fsdp: at the end of backward, average the gradients of trainable parameters
        that FSDP leaves alone (ignored or unmanaged) over all ranks, in one flattened all-reduce,
        as the code ``sv.export_code`` writes does. FSDP does not; without it every rank trains
        its own copy.
    foreach: the optimizer's multi-tensor path (one temporary the size of a param group's states
        in ``step()``); None means torch's default: foreach for device tensors, the
        per-parameter loop for CPU tensors (offload).
    fused, capturable: Adam's fused / capturable implementations keep the ``step`` scalars on
        the device (one float32 per parameter); otherwise torch keeps them on the CPU.
    batch_size, seq_len: the micro-batch each rank trains on. With ``batch_size`` set, the peak
        includes the activations and temporaries of one training step, measured with torch under
        ``FakeTensorMode``; ``None`` keeps the model-state-only peak.
    example_inputs: for models that are not Hugging Face language models, a callable
        ``fn(batch_size, seq_len) -> (args, kwargs)`` giving one micro-batch; the loss is
        ``fn.loss(out)`` when the callable has one (``sv.from_torchtune``: the recipe's loss), else
        ``out.loss`` if present, else the sum of the output.
    global_batch: sequences per optimizer step over all data-parallel ranks (``sv.search`` then
        tries every micro-batch and accumulation that give it); None: not fixed.
    grad_accum: micro-batches per optimizer step (gradient accumulation). FSDP2 skips the
        reduce-scatter on all but the last (``set_requires_gradient_sync(False)``), so every
        call's unsharded gradients stay alive from the first micro-batch's backward until the
        last one's (in the reduce dtype when it differs from the gradients').
    sync_every_microbatch: with ``grad_accum > 1``, reduce-scatter on every micro-batch instead
        (``set_requires_gradient_sync(True)`` throughout): the sharded gradients accumulate, the
        unsharded ones are freed each time, at the cost of one reduce-scatter per micro-batch.
    use_cache: the ``use_cache`` a Hugging Face model's training forward runs with (its key/value
        cache kept through the step, or not). None: the config's, except when the plan checkpoints
        a module: then False, as Hugging Face's own gradient checkpointing does in training
        (transformers 5.24 ``utils/generic.py``, ``merge_with_config_defaults``: "`use_cache=True`
        is incompatible with gradient checkpointing. Setting `use_cache=False`."; the exported code
        sets ``model.config.use_cache = False`` then). ``step_use_cache`` says which.
    """

    optimizer: str | int = "adamw"
    optimizer_dtype: str | None = None
    param_dtype: str | None = "bfloat16"
    reduce_dtype: str | None = "float32"
    offload: bool = False
    sync_outside_fsdp: bool = True
    foreach: bool | None = None
    fused: bool = False
    capturable: bool = False
    batch_size: int | None = None
    seq_len: int = 2048
    example_inputs: object = None
    global_batch: int | None = None
    grad_accum: int = 1
    sync_every_microbatch: bool = False
    use_cache: bool | None = None

    def __post_init__(self):
        opt = self.optimizer
        if isinstance(opt, bool) or not isinstance(opt, (str, int)):
            raise ValueError(f"Training.optimizer must be a name or an int, got {opt!r}")
        if isinstance(opt, str):
            key = opt.lower().replace("-", "_").replace(" ", "_")
            if key not in OPTIMIZERS:
                raise ValueError(f"Training.optimizer={opt!r}: expected one of {sorted(OPTIMIZERS)} or an int")
            object.__setattr__(self, "optimizer", key)
        elif opt < 0:
            raise ValueError(f"Training.optimizer={opt}: the number of states per parameter must be >= 0")
        for key in ("optimizer_dtype", "param_dtype", "reduce_dtype"):
            value = getattr(self, key)
            if value is not None:
                value = str(value).replace("torch.", "")
                if value not in DTYPE_NAMES:
                    raise ValueError(f"Training.{key}={getattr(self, key)!r}: expected one of {DTYPE_NAMES}")
                object.__setattr__(self, key, value)
        object.__setattr__(self, "offload", bool(self.offload))
        object.__setattr__(self, "sync_outside_fsdp", bool(self.sync_outside_fsdp))
        object.__setattr__(self, "fused", bool(self.fused))
        object.__setattr__(self, "capturable", bool(self.capturable))
        for key in ("batch_size", "seq_len", "global_batch"):
            value = getattr(self, key)
            if key != "seq_len" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Training.{key} must be a positive int{' or None' if key != 'seq_len' else ''}, got {value!r}")
        if self.example_inputs is not None and not callable(self.example_inputs):
            raise ValueError("Training.example_inputs must be a callable fn(batch_size, seq_len) -> (args, kwargs)")
        self._check_accumulation()

    def _check_accumulation(self) -> None:
        k = self.grad_accum
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"Training.grad_accum must be an int >= 1 (micro-batches per optimizer step), got {k!r}")
        if not isinstance(self.sync_every_microbatch, bool):
            raise ValueError(f"Training.sync_every_microbatch must be True or False, got {self.sync_every_microbatch!r}")
        if self.use_cache not in (None, True, False):
            raise ValueError(f"Training.use_cache must be None (the config's), True or False, got {self.use_cache!r}")

    def step_use_cache(self, config_keeps: bool, checkpointed: bool) -> bool:
        """The ``use_cache`` the step runs with: this training's, else the config's (``config_keeps``),
        off when the plan checkpoints a module (Hugging Face's rule under gradient checkpointing, see
        ``use_cache``): a checkpointed block's recomputation would append to the cache again."""
        if self.use_cache is not None:
            return self.use_cache
        return bool(config_keeps) and not checkpointed

    @property
    def n_states(self) -> int:
        """Optimizer state tensors per trainable parameter (Adam's ``step`` scalar not counted)."""
        return OPTIMIZERS[self.optimizer] if isinstance(self.optimizer, str) else int(self.optimizer)

    @property
    def step_scalars(self) -> bool:
        """Adam/AdamW keep a 0-dim float32 ``step`` per parameter (see ``step_on_device``)."""
        return self.optimizer in ("adam", "adamw")

    @property
    def step_on_device(self) -> bool:
        """The ``step`` scalars live on the device only with fused or capturable Adam (torch's
        ``_init_group``: ``torch.zeros((), device=p.device)`` then, else a CPU tensor)."""
        return self.step_scalars and (self.fused or self.capturable)

    @property
    def with_activations(self) -> bool:
        return self.batch_size is not None

    def unit_defaults(self, unit: Unit) -> Unit:
        """The unit with this training's default policies filled in where the unit sets none."""
        changes = {}
        if unit.param_dtype is None and self.param_dtype is not None:
            changes["param_dtype"] = self.param_dtype
        if unit.reduce_dtype is None and self.reduce_dtype is not None:
            changes["reduce_dtype"] = self.reduce_dtype
        if self.offload and not unit.offload:
            changes["offload"] = True
        if not changes:
            return unit
        return _filled_unit(unit, changes.get("param_dtype", unit.param_dtype),
                            changes.get("reduce_dtype", unit.reduce_dtype), changes.get("offload", unit.offload))


@lru_cache(maxsize=4096)
def _filled_unit(unit: Unit, param_dtype, reduce_dtype, offload: bool) -> Unit:
    """``unit`` with these policies, built once: a plan's units are shared by every edit of it, and
    the Inspector's training fills each on every change of plan. A cache beside the frozen
    ``Training``, not in it: ``Training(**t.__dict__)`` copies only its fields."""
    return Unit(unit.modules, unit.reshard_after_forward, param_dtype, reduce_dtype, offload)


#: The one training every entry point assumes when none is given: ``sv.analyze``, the Inspector,
#: ``compare``, ``sweep``, ``search``, the report and every command of the command line (each states
#: it): ``Training()``'s own field defaults, AdamW with bf16 parameters and fp32 gradient reduction.
DEFAULT_TRAINING = Training()
