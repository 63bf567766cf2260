"""Memory per rank and communication per step, from the layout, mirroring torch 2.13's FSDP2 buffers.

Every quantity names the torch code it mirrors (``torch/distributed/fsdp/_fully_shard``); the
formulas and their sources are written out in ``docs/cost-model.md``. Nothing here touches the
model: per-parameter numbers come from the ``ModelTree`` once (cached per tree, as numpy arrays),
then everything is summed per ``fully_shard`` call, so a widget toggle costs O(calls), not
O(parameters). Ranks differ only by their shard coordinate (later coordinates may hold fewer rows
of an unevenly sharded parameter, but the padded buffers are allocated everywhere); the per-rank
columns are computed for the ``shard`` coordinates at once and tiled over the replicas.

Vocabulary used in the tables:
- *sharded* parameters: managed by a ``fully_shard`` call (a padded shard on every rank);
- *whole* parameters: ignored (``ignored_params``) or unmanaged (under no call): every rank holds
  the full tensor, FSDP never all-gathers nor reduces them.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .format import format_bytes, worst_rank  # noqa: F401  (format_bytes: callers still import it from here)
from .fsdp import local_rows_table, padded_shard_numel
from .plan import DTYPE_NAMES, Unit

# ---------------------------------------------------------------------------
# Training: optimizer and the policies fully_shard is called with
# ---------------------------------------------------------------------------
OPTIMIZERS = {"adamw": 2, "adam": 2, "sgd": 0, "sgd_momentum": 1}
_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}


def _itemsize(name: str) -> int:
    if name not in _ITEMSIZE:
        import torch

        _ITEMSIZE[name] = getattr(torch, name).itemsize
    return _ITEMSIZE[name]


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
        option overrides them per call).
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
        ``out.loss`` if present, else the sum of the output.
    global_batch: sequences per optimizer step over all data-parallel ranks (``sv.search`` then
        tries every micro-batch and accumulation that give it); None: not fixed.
    """

    optimizer: str | int = "adamw"
    optimizer_dtype: str | None = None
    param_dtype: str | None = None
    reduce_dtype: str | None = None
    offload: bool = False
    sync_outside_fsdp: bool = True
    foreach: bool | None = None
    fused: bool = False
    capturable: bool = False
    batch_size: int | None = None
    seq_len: int = 2048
    example_inputs: object = None
    global_batch: int | None = None

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
        return Unit(unit.modules, unit.reshard_after_forward,
                    changes.get("param_dtype", unit.param_dtype),
                    changes.get("reduce_dtype", unit.reduce_dtype),
                    changes.get("offload", unit.offload))


# ---------------------------------------------------------------------------
# Per-tree arrays (computed once per ModelTree, reused by every analysis of it)
# ---------------------------------------------------------------------------
_DTYPE_CODES: dict = {}


def _dtype_code(dtype) -> int:
    name = str(dtype).replace("torch.", "")
    if name not in _DTYPE_CODES:
        _DTYPE_CODES[name] = len(_DTYPE_CODES)
    return _DTYPE_CODES[name]


def _code_names() -> list[str]:
    names = [""] * len(_DTYPE_CODES)
    for name, c in _DTYPE_CODES.items():
        names[c] = name
    return names


@dataclass
class _TreeArrays:
    numel: np.ndarray
    dim0: np.ndarray
    itemsize: np.ndarray
    dtype: np.ndarray  # dtype codes
    is_float: np.ndarray
    trainable: np.ndarray
    owner: np.ndarray  # preorder index of the first module that registers it
    buffer_bytes: int
    first_trainable: int  # preorder index of the first module holding a trainable parameter


_TREE_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _tree_arrays(tree) -> _TreeArrays:
    cached = _TREE_CACHE.get(tree)
    if cached is not None:
        return cached
    params = tree.params
    numel = np.array([p.numel for p in params], dtype=np.int64)
    dim0 = np.array([p.shape[0] if p.shape else 1 for p in params], dtype=np.int64)
    itemsize = np.array([p.itemsize for p in params], dtype=np.int64)
    dtype = np.array([_dtype_code(p.dtype) for p in params], dtype=np.int64)
    is_float = np.array([p.dtype.is_floating_point for p in params], dtype=bool)
    trainable = np.array([p.requires_grad for p in params], dtype=bool)
    owner = np.array([p.owners[0] if p.owners else 0 for p in params], dtype=np.int64)
    buffers = sum(m.buffer_bytes for m in tree.modules)  # one entry per module, aliases included once
    first = int(owner[trainable].min()) if trainable.any() else tree.n_modules
    arrays = _TreeArrays(numel, dim0, itemsize, dtype, is_float, trainable, owner, buffers, first)
    _TREE_CACHE[tree] = arrays
    return arrays


def _promote(names: list[str]) -> str:
    """torch.promote_types over dtype names (the exported averager's common dtype)."""
    import torch

    out = getattr(torch, names[0])
    for name in names[1:]:
        out = torch.promote_types(out, getattr(torch, name))
    return str(out).replace("torch.", "")


def _per_coord_sum(dim0: np.ndarray, row_bytes: np.ndarray, shard: int) -> np.ndarray:
    """sum_i local_rows(dim0_i, c) * row_bytes_i for every shard coordinate c (grouped by dim0)."""
    if dim0.size == 0:
        return np.zeros(shard, dtype=np.int64)
    uniq, inverse = np.unique(dim0, return_inverse=True)
    weights = np.bincount(inverse, weights=row_bytes, minlength=uniq.size)
    return np.rint(weights @ local_rows_table(uniq, shard)).astype(np.int64)


def _per_coord_max(dim0: np.ndarray, row_bytes: np.ndarray, shard: int) -> np.ndarray:
    """max_i local_rows(dim0_i, c) * row_bytes_i for every shard coordinate c."""
    if dim0.size == 0:
        return np.zeros(shard, dtype=np.int64)
    pairs = np.unique(np.stack([dim0, row_bytes.astype(np.int64)], axis=1), axis=0)
    return (local_rows_table(pairs[:, 0], shard) * pairs[:, 1:2]).max(axis=0)


# ---------------------------------------------------------------------------
# The cost model of one analysis
# ---------------------------------------------------------------------------
# ---------------------------------------------------------------------------
# One fully_shard call, and what a moment of the step holds
# ---------------------------------------------------------------------------
@dataclass
class Group:
    """One ``fully_shard`` call that manages parameters (one ``FSDPParamGroup``), in bytes per rank."""

    unit: int  # index in plan.units
    name: str
    reshard: bool | int  # effective reshard_after_forward (an int: the post-forward group size)
    offload: bool
    gather: int  # all-gather output, also the unsharded parameters (padded, param dtype)
    staged: int  # all-gather input staged before the collective
    gather_dtype: str  # one dtype, or uint8 when the inputs differ
    trainable: bool
    reduce_dtype: str
    rs_input: int  # reduce-scatter input (padded, reduce dtype, the whole group's)
    rs_output: int  # reduce-scatter output: this rank's slice
    sharded_grads: int  # padded, original dtype
    cast: bool  # reduce dtype differs from the original: the sharded gradients are a new buffer
    unsharded_grads: int  # what autograd computes for the unsharded parameters (unpadded, param dtype)
    whole_grads: int  # gradients of trainable whole parameters under this call
    first: int  # preorder index of its first module
    pre_key: tuple  # forward position of its pre-forward (first module entered)
    post_key: tuple  # forward position of its post-forward (last module left)
    out_grad: bool  # gets a pre-backward hook: its output needs a gradient
    in_grad: bool  # its post-backward runs in backward (else in the root's final callback)
    ctx: int  # the root call whose communication context it shares
    modules: tuple[int, ...]  # its modules (tree indices)
    # (forward position, unsharded grad bytes, whole grad bytes) per module that owns its
    # parameters, when other calls are nested inside it (their backward runs in between) or when
    # activations are counted (each module's backward has its own level); None: all at once
    grads_at: tuple | None = None


@dataclass
class Alive:
    """What one moment of the step holds on top of the resident state (bytes per rank)."""

    unsharded_params: int = 0  # all-gathered copies (and post-forward shards)
    communication_buffers: int = 0  # all-gather inputs/outputs, reduce-scatter buffers, all-reduce buffers
    gradients: int = 0  # sharded, whole and unsharded gradients alive
    activations: int = 0  # saved for backward, and the step's inputs
    temporaries: int = 0  # autograd temporaries, averaging copies, optimizer step temporaries

    def total(self) -> int:
        return (self.unsharded_params + self.communication_buffers + self.gradients + self.activations
                + self.temporaries)


@dataclass
class Moment:
    """The largest moment of forward + backward: its phase, the call running, what it holds."""

    phase: str  # "forward" | "backward"
    group: int | None  # index into CostModel.groups
    alive: Alive
    module: str | None = None  # where the activations peak, when they are counted


#: The one breakdown of a rank's peak that every view draws (``Analysis.peak_breakdown``).
BREAKDOWN = ("sharded params", "whole params", "buffers", "optimizer states", "gradients", "unsharded params",
             "communication buffers", "activations", "temporaries")


class NoActivations:
    """Activations not counted (``Training.batch_size`` is None): every level is 0."""

    def after_backward(self, module):
        return 0, None

    def enter(self, phase, modules):
        return 0, None

    def during(self, phase, modules):
        return 0, None

    def leave(self, phase, modules):
        return 0, None


class ActivationLevels:
    """Activation bytes around each call of the step, read from a measured ``ActivationProfile``.

    A call's pre-forward runs when its first module starts, its post-forward when its last module
    returns; its pre-backward when the last module's backward starts, its post-backward when the
    first module's ends. ``during``: the highest level while any of its modules runs (the
    root, module 0, stands for the whole forward or backward: the loss included).
    Returns ``(bytes, module)``: the level and the module it was read at.
    """

    def __init__(self, profile, tree):
        self.profile, self.tree = profile, tree
        self.end = profile.timeline[-1][3] if profile.timeline else 0  # what is left after backward

    def _stats(self, m: int):
        return self.profile.modules.get(self.tree.modules[m].fqn)

    def _read(self, m: int, field: str):
        stats = self._stats(m)
        value = getattr(stats, field) if stats is not None else None
        return value, self.tree.modules[m].fqn

    def enter(self, phase, modules):
        m = min(modules) if phase == "forward" else self._last(modules)
        value, fqn = self._read(m, "pre_fw" if phase == "forward" else "pre_bw")
        return (value or 0), fqn

    def leave(self, phase, modules):
        m = self._last(modules) if phase == "forward" else min(modules)
        value, fqn = self._read(m, "post_fw" if phase == "forward" else "post_bw")
        return (self.end if value is None and phase == "backward" else value or 0), fqn

    def after_backward(self, module: int):
        """The level when ``module``'s backward is done (when its backward does not end on its own
        inputs, the level when it started)."""
        stats = self._stats(module)
        if stats is None:
            return 0, None
        value = stats.post_bw if stats.post_bw is not None else stats.pre_bw
        return (value or 0), self.tree.modules[module].fqn

    def during(self, phase, modules):
        field = "peak_fw" if phase == "forward" else "peak_bw"
        if modules == (0,):  # the whole step: where the measured peak of this phase is
            bytes_, peak_phase, fqn = self.profile.peak
            if peak_phase == phase:
                return bytes_, fqn
        best = (0, None)
        for m in modules:
            value, fqn = self._read(m, field)
            if value is not None and value > best[0]:
                best = (value, fqn)
        return best

    def _last(self, modules):
        tree = self.tree
        return max(modules, key=lambda m: (tree.modules[m].subtree_end, -tree.modules[m].depth))


class StepSimulation:
    """One training step of FSDP2, event by event, in the order torch runs its hooks.

    Forward: ``pre_forward`` / ``post_forward`` per call in module order; backward: ``pre_backward``
    (with the backward prefetch), the gradients, ``post_backward`` in reverse module order, then the
    root's final callback and the exported code's gradient averaging. Each handler records the
    moments where memory can peak with ``observe``; the optimizer step is ``CostModel``'s (its
    size differs by rank). ``peak``: the transient bytes (on top of the resident state) of the
    largest moment, and ``moment`` what it holds.
    """

    def __init__(self, model: "CostModel", activations):
        self.m = model
        self.groups = model.groups
        self.act = activations
        self.S, self.R = model.S, model.R
        n = len(self.groups)
        self.peak = -1
        self.moment: Moment | None = None
        self.comm: list[tuple] = []  # (group, collective, phase, process group, group size, count)
        self.state = [0] * n  # 0 sharded, 1 unsharded, 2 post-forward shard
        self.held = 0  # unsharded parameters (and post-forward shards) alive
        # forward: the last all-gather output of each root's communication context
        self.ag_states: dict[int, int] = {}
        self.ag_state = 0
        # backward
        self.pending = [0] * n  # prefetched all-gather outputs not yet copied out
        self.is_pending = [False] * n
        self.pend = 0
        self.rs_hold = 0  # the last reduce-scatter input, kept until the next post-backward
        self.grads = 0  # sharded and whole gradients resident so far
        self.ug_live = [0] * n  # unsharded gradients computed, waiting for their post-backward
        self.ug_alive = 0

    # -- bookkeeping ----------------------------------------------------------------------------
    def observe(self, phase: str, k, *, act=(0, None), **alive) -> None:
        level, module = act
        moment = Alive(activations=level, **alive)
        x = moment.total()
        if x > self.peak:
            self.peak = x
            self.moment = Moment(phase, k, moment, module)

    def modules(self, k) -> tuple[int, ...]:
        return self.groups[k].modules

    # -- forward ----------------------------------------------------------------------------------
    def pre_forward(self, k: int) -> None:
        """``FSDPParamGroup.pre_forward``: unshard() (all-gather), then wait_for_unshard() (copy-out)."""
        g = self.groups[k]
        ag = g.gather if self.S > 1 else 0
        act = self.act.enter("forward", g.modules)
        self.observe("forward", k, act=act, unsharded_params=self.held,
                     communication_buffers=self.ag_state + ag + g.staged)
        self.ag_state -= self.ag_states.get(g.ctx, 0)  # the previous all-gather output is freed after this copy-out
        self.observe("forward", k, act=act, unsharded_params=self.held + g.gather,
                     communication_buffers=self.ag_state + ag)
        if self.S > 1:
            self.comm.append((k, "all_gather", "forward", "shard", self.S, 1))
        self.held += g.gather
        self.ag_states[g.ctx] = ag
        self.ag_state += ag
        self.state[k] = 1
        # the call's own forward: its activations and temporaries while it is unsharded
        self.observe("forward", k, act=self.act.during("forward", g.modules), unsharded_params=self.held,
                     communication_buffers=self.ag_state)

    def post_forward(self, k: int) -> None:
        """``FSDPParamGroup.post_forward``: reshard() (to the smaller post-forward mesh for an int)."""
        g = self.groups[k]
        if g.reshard is True:
            self.held -= g.gather
            self.state[k] = 0
        elif g.reshard is not False:
            shard = g.gather // g.reshard
            self.observe("forward", k, act=self.act.leave("forward", g.modules),
                         unsharded_params=self.held + shard, communication_buffers=self.ag_state)
            self.held += shard - g.gather
            self.state[k] = 2

    def root_post_forward(self, ctx: int) -> None:
        """``FSDPState._post_forward`` of a root: frees its context's last all-gather output."""
        self.ag_state -= self.ag_states.pop(ctx, 0)

    def forward(self) -> None:
        groups = self.groups
        events = sorted([(g.pre_key, 1, k) for k, g in enumerate(groups)]
                        + [(g.post_key, 0, k) for k, g in enumerate(groups)]
                        + [(key, 0, len(groups) + r) for key, r in self.m.root_posts])
        for _, is_pre, k in events:
            if k >= len(groups):
                self.root_post_forward(k - len(groups))
            elif is_pre:
                self.pre_forward(k)
            else:
                self.post_forward(k)
        # the step's largest forward moment may fall outside every call (the loss of a plan
        # without a root call): the activations' own peak with what is held then
        self.observe("forward", None, act=self.act.during("forward", (0,)), unsharded_params=self.held,
                     communication_buffers=self.ag_state)

    # -- backward ---------------------------------------------------------------------------------
    def backward_alive(self, **extra) -> dict:
        return dict(unsharded_params=self.held, communication_buffers=self.pend + self.rs_hold,
                    gradients=self.grads + self.ug_alive, **extra)

    def unshard(self, k: int, act) -> None:
        """``FSDPParamGroup.unshard`` in backward: an all-gather unless unsharded or already prefetched
        (``act``: the activations of the call whose pre-backward issues it)."""
        g = self.groups[k]
        if self.state[k] == 1 or self.is_pending[k]:
            return
        size = self.S if self.state[k] == 0 else g.reshard
        self.is_pending[k] = True
        if size > 1:
            self.pending[k] = g.gather
            self.pend += g.gather
            alive = self.backward_alive()
            alive["communication_buffers"] += g.staged
            self.observe("backward", k, act=act, **alive)
            self.comm.append((k, "all_gather", "backward", "shard" if self.state[k] == 0 else "post_forward", size, 1))

    def pre_backward(self, k: int, prev: int) -> None:
        """``FSDPState._pre_backward``: unshard (a no-op if prefetched), copy out, prefetch ``prev``."""
        g = self.groups[k]
        act = self.act.enter("backward", g.modules)
        self.unshard(k, act)
        if self.is_pending[k]:
            alive = self.backward_alive()
            alive["unsharded_params"] += g.gather
            self.observe("backward", k, act=act, **alive)
            shard = g.gather // g.reshard if self.state[k] == 2 else 0
            self.pend -= self.pending[k]
            self.pending[k] = 0
            self.is_pending[k] = False
            self.held += g.gather - shard
            self.state[k] = 1
        if prev >= 0:  # FSDPParamGroup._backward_prefetch: the previous call in post-forward order
            self.unshard(prev, act)
        # its backward starts (a checkpointed module recomputes its forward first), no gradient yet
        self.observe("backward", k, act=self.act.during("backward", g.modules), **self.backward_alive())
        if g.grads_at is None:
            self.gradients(k, g.unsharded_grads, g.whole_grads)

    def gradients(self, k: int, unsharded: int, whole: int, module: int | None = None) -> None:
        """Autograd computes (part of) a call's gradients while it is unsharded: those of the
        parameters ``module`` owns during that module's backward, or all of them at once."""
        if module is None:  # the call's backward at once: its peak with all its gradients
            self.ug_live[k] += unsharded
            self.ug_alive += unsharded
            self.grads += whole
            self.observe("backward", k, act=self.act.during("backward", self.groups[k].modules), **self.backward_alive())
            return
        # the module's backward runs (its highest level) before its parameters' gradients are
        # accumulated; then they are, at the level its backward leaves
        self.observe("backward", k, act=self.act.during("backward", (module,)), **self.backward_alive())
        self.ug_live[k] += unsharded
        self.ug_alive += unsharded
        self.grads += whole
        self.observe("backward", k, act=self.act.after_backward(module), **self.backward_alive())

    def post_backward(self, k: int) -> None:
        """``FSDPParamGroup.post_backward``: reshard, then reduce-scatter (and all-reduce on HSDP)."""
        g = self.groups[k]
        if self.state[k] == 1:
            self.held -= g.gather
        elif self.state[k] == 2:
            self.held -= g.gather // g.reshard
        self.state[k] = 0
        self.rs_hold = 0  # the previous reduce-scatter input is waited on and dropped first
        ug, self.ug_live[k] = self.ug_live[k], 0
        if not g.trainable:
            self.ug_alive -= ug
            return
        act = self.act.leave("backward", g.modules)
        self.observe("backward", k, act=act, unsharded_params=self.held, communication_buffers=self.pend + g.rs_input,
                     gradients=self.grads + self.ug_alive)
        self.ug_alive -= ug
        device_grads = 0 if g.offload else g.sharded_grads
        extra = device_grads if g.cast else 0
        self.observe("backward", k, act=act, unsharded_params=self.held,
                     communication_buffers=self.pend + g.rs_input + g.rs_output,
                     gradients=self.grads + self.ug_alive + extra)
        if self.S > 1:
            self.comm.append((k, "reduce_scatter", "backward", "shard", self.S, 1))
        if self.R > 1:
            self.comm.append((k, "all_reduce", "backward", "replicate", self.R, 1))
        self.grads += device_grads
        self.rs_hold = g.rs_input

    def backward(self) -> None:
        groups, n = self.groups, len(self.groups)
        # the call before each in its context's post-forward order (comm_ctx.post_forward_order)
        order = sorted(range(n), key=lambda k: groups[k].post_key)
        prev, last_in_ctx = [-1] * n, {}
        for k in order:
            prev[k] = last_in_ctx.get(groups[k].ctx, -1)
            last_in_ctx[groups[k].ctx] = k
        # Reverse module order: a call's pre-backward where its forward ended, its gradients where
        # their modules ran, its post-backward where its forward began; a nested call's backward
        # runs inside its parent's
        events = []
        for k, g in enumerate(groups):
            if not g.out_grad:
                continue  # no pre-backward hook: nothing after it needed a gradient
            events.append((g.post_key, 0, k, None))
            for position, unsharded, whole in g.grads_at or ():
                events.append(((position, 2, 0), 1, k, (unsharded, whole, position)))
            if g.in_grad:
                events.append((g.pre_key, 2, k, None))
        events.sort(key=lambda e: (e[0], -e[1]), reverse=True)
        self.observe("backward", None, act=self.act.during("backward", (0,)), **self.backward_alive())
        for _, kind, k, amounts in events:
            if kind == 0:
                self.pre_backward(k, prev[k])
            elif kind == 1:
                self.gradients(k, *amounts)
            else:
                self.post_backward(k)
        self.grads += self.m.unmanaged_grads
        # FSDPState._root_post_backward_final_callback: post_backward for every call not done yet,
        # in the root's named_modules order
        for k in sorted((k for k, g in enumerate(groups) if not (g.out_grad and g.in_grad)),
                        key=lambda k: groups[k].first):
            self.post_backward(k)
        sync = self.m.sync
        if sync is not None:  # the exported averager's callback runs after FSDP's final callback
            self.observe("backward", None, unsharded_params=self.held, gradients=self.grads,
                         communication_buffers=sync["bytes"], temporaries=sync["temporaries"])

    def run(self) -> "StepSimulation":
        self.forward()
        self.backward()
        return self


# ---------------------------------------------------------------------------
# The cost model of one analysis
# ---------------------------------------------------------------------------
@dataclass
class _Sharded:
    """Per sharded parameter (numpy arrays aligned on ``index``), what the cost model needs."""

    index: np.ndarray  # tree parameter indices
    unit: np.ndarray  # owning call (plan unit index)
    numel: np.ndarray
    dim0: np.ndarray
    row: np.ndarray  # elements per dim-0 row
    padded: np.ndarray  # padded shard elements every rank allocates
    itemsize: np.ndarray  # original dtype
    dtype: np.ndarray  # original dtype code
    pd_itemsize: np.ndarray  # param dtype (what is gathered)
    pd_dtype: np.ndarray
    cast: np.ndarray  # gathered in another dtype than its own
    trainable: np.ndarray
    offload: np.ndarray


class CostModel:
    """Everything ``a.memory`` and ``a.comm`` need, computed once per analysis.

    ``groups``: one ``Group`` per ``fully_shard`` call with parameters, in plan order; resident
    state (``params_sharded``, ``params_whole``, ``buffers``, gradients, optimizer states per
    shard coordinate); ``step``: the simulated forward + backward (``StepSimulation``).
    """

    def __init__(self, analysis):
        self.analysis = analysis
        tree, lay, mesh, training = analysis.tree, analysis.layout, analysis.mesh, analysis.training
        self.training = training
        self.S, self.R = mesh.shard, mesh.replicate
        self.arrays = _tree_arrays(tree)
        self.policies = [training.unit_defaults(ul.unit) for ul in lay.units]
        self.sh = self._sharded_params()
        self._whole_params()
        self.groups = self._groups()
        self._resident()
        self._optimizer()
        self.sync = self._gradient_averaging()
        self.step = StepSimulation(self, analysis.activation_levels()).run()

    # -- parameters -----------------------------------------------------------------------------
    def _sharded_params(self) -> _Sharded:
        """The padded shard of every sharded parameter (``FSDPParam._init_sharded_param``) and the
        dtype it is gathered in (``FSDPParam.init_dtype_attrs``)."""
        lay, arr, S = self.analysis.layout, self.arrays, self.S
        punit = np.asarray(lay.param_unit, dtype=np.int64)
        sharded = (punit >= 0) & np.fromiter((s == "sharded" for s in lay.param_status), dtype=bool, count=punit.size)
        idx = np.nonzero(sharded)[0]
        u = punit[idx]
        pol = self.policies
        pd_code = np.array([_dtype_code(p.param_dtype) if p.param_dtype else -1 for p in pol] + [-1], dtype=np.int64)
        pd_size = np.array([_ITEMSIZE[p.param_dtype] if p.param_dtype else 0 for p in pol] + [0], dtype=np.int64)
        offload = np.array([p.offload for p in pol] + [False], dtype=bool)
        numel, dim0, isz, dcode = arr.numel[idx], arr.dim0[idx], arr.itemsize[idx], arr.dtype[idx]
        row = np.where(dim0 > 0, numel // np.maximum(dim0, 1), 0)
        # the policy's param dtype, unless it equals the original or the parameter is not floating point
        cast = (pd_code[u] >= 0) & arr.is_float[idx] & (pd_code[u] != dcode)
        return _Sharded(idx, u, numel, dim0, row, padded_shard_numel(dim0, row, S), isz, dcode,
                        np.where(cast, pd_size[u], isz), np.where(cast, pd_code[u], dcode), cast,
                        arr.trainable[idx], offload[u])

    def _whole_params(self) -> None:
        """Ignored and unmanaged parameters: every rank holds them whole; FSDP never touches them."""
        lay, arr = self.analysis.layout, self.arrays
        n_units = len(lay.units)
        whole = np.ones(arr.numel.size, dtype=bool)
        whole[self.sh.index] = False
        widx = np.nonzero(whole)[0]
        self.w_index = widx
        self.w_bytes = arr.numel[widx] * arr.itemsize[widx]
        self.w_train = arr.trainable[widx]
        self.params_whole = int(self.w_bytes.sum())
        self.grads_whole = int(self.w_bytes[self.w_train].sum())
        would = np.asarray(lay.would_be_unit, dtype=np.int64)[widx]
        slot = np.where(would >= 0, would, n_units)[self.w_train]
        per_unit = np.rint(np.bincount(slot, weights=self.w_bytes[self.w_train], minlength=n_units + 1)).astype(np.int64)
        self.whole_grads_per_unit = per_unit[:n_units]
        self.unmanaged_grads = int(per_unit[n_units])  # under no call: computed outside every call

    # -- one Group per call ------------------------------------------------------------------------
    def _groups(self) -> list[Group]:
        lay, sh, S = self.analysis.layout, self.sh, self.S
        modules = self.analysis.tree.modules
        n_units = len(lay.units)
        u = sh.unit

        def per_unit(weights):
            return np.rint(np.bincount(u, weights=weights, minlength=n_units)).astype(np.int64)

        n_params = np.bincount(u, minlength=n_units)
        gather = per_unit(sh.padded * sh.pd_itemsize) * S
        # all-gather inputs staged before the collective: the foreach copy into param dtype
        # (_get_param_all_gather_inputs), or the host-to-device copy of an offloaded shard
        has_policy = np.array([p.param_dtype is not None for p in self.policies] + [False])[u]
        staged = per_unit(np.where(sh.offload, sh.padded * sh.itemsize + np.where(sh.cast, sh.padded * sh.pd_itemsize, 0),
                                   np.where(has_policy, sh.padded * sh.pd_itemsize, 0)))
        tr = sh.trainable.astype(np.float64)
        padded_trainable = per_unit(sh.padded * tr)
        unsharded_grads = per_unit(sh.numel * sh.pd_itemsize * tr)
        has_train = per_unit(tr) > 0
        n_codes = max(len(_DTYPE_CODES), 1)

        def codes(mask, dcodes):
            return np.bincount(u[mask] * n_codes + dcodes[mask], minlength=n_units * n_codes).reshape(n_units, n_codes)

        everything = np.ones(u.size, dtype=bool)
        gathered_codes = codes(everything, sh.pd_dtype) > 0  # one all-gather dtype, or uint8 (foreach_all_gather)
        trained_orig = codes(sh.trainable, sh.dtype).argmax(axis=1)
        trained_pd = codes(sh.trainable, sh.pd_dtype).argmax(axis=1)
        names = _code_names()
        first_trainable = self.arrays.first_trainable
        root_of = self._roots(lay, modules)
        nested = self._gradient_positions(lay, modules)
        groups = []
        for ul in lay.units:
            i = ul.index
            if not n_params[i]:
                continue  # a call with no parameters has no group, no buffers, no collectives
            pol = self.policies[i]
            trainable = bool(has_train[i])
            if trainable:
                orig = names[trained_orig[i]]
                # FSDPParam.init_dtype_attrs drops reduce_dtype equal to param_dtype; foreach_reduce
                # then reduces in the gradient's dtype, the param dtype
                rd = pol.reduce_dtype if (pol.reduce_dtype and pol.reduce_dtype != pol.param_dtype) else names[trained_pd[i]]
                ro = int(padded_trainable[i]) * _itemsize(rd)
                grad = int(padded_trainable[i]) * _itemsize(orig)
            else:
                orig = rd = ""
                ro = grad = 0
            ms = [modules[m] for m in ul.modules]
            first = min(ms, key=lambda m: m.index)
            last = max(ms, key=lambda m: (m.subtree_end, -m.depth))
            groups.append(Group(
                unit=i, name=ul.unit.name, reshard=ul.reshard_after_forward, offload=pol.offload,
                gather=int(gather[i]), staged=int(staged[i]),
                gather_dtype=names[gathered_codes[i].argmax()] if gathered_codes[i].sum() == 1 else "uint8",
                trainable=trainable, reduce_dtype=rd, rs_input=ro * S, rs_output=ro, sharded_grads=grad,
                cast=trainable and rd != orig, unsharded_grads=int(unsharded_grads[i]),
                whole_grads=int(self.whole_grads_per_unit[i]), first=first.index,
                pre_key=(first.index, 1, 0), post_key=(last.subtree_end, 0, -last.depth),
                # autograd: a call's output needs a gradient when a trainable parameter ran before it
                # ends (FSDPState._register_pre_backward_hook), its input when one ran before it starts
                # (FSDPParamGroup._register_post_backward_hook); module order stands in for data flow
                out_grad=first_trainable < last.subtree_end, in_grad=first_trainable < first.index,
                ctx=root_of[i], modules=tuple(ul.modules), grads_at=nested.get(i),
            ))
        return groups

    def _gradient_positions(self, lay, modules) -> dict[int, tuple]:
        """Per call, its gradients by the module that owns the parameters, where backward needs
        to see them appear one module at a time: in a call with other calls nested inside it
        (their backward runs in between), and in every call when activations are counted (each
        gradient appears while its module's backward runs, at that module's activation level)."""
        arr, sh = self.arrays, self.sh
        if self.training.with_activations:
            calls = None  # every call
        else:
            calls = set()
            for ul in lay.units:
                for m in ul.modules:
                    parent = modules[m].parent
                    outer = lay.module_unit[parent] if parent >= 0 else -1
                    if outer >= 0 and outer != ul.index:
                        calls.add(outer)
            if not calls:
                return {}
        # (call, owning module) -> unsharded gradient bytes, whole gradient bytes
        trained = sh.trainable
        w_unit = np.asarray(lay.would_be_unit, dtype=np.int64)[self.w_index][self.w_train]
        units = np.concatenate([sh.unit[trained], w_unit])
        owners = np.concatenate([arr.owner[sh.index[trained]], arr.owner[self.w_index[self.w_train]]])
        ug = np.concatenate([(sh.numel * sh.pd_itemsize)[trained], np.zeros(w_unit.size, dtype=np.int64)])
        wg = np.concatenate([np.zeros(int(trained.sum()), dtype=np.int64), self.w_bytes[self.w_train]])
        keep = units >= 0
        if calls is not None:
            keep &= np.isin(units, list(calls))
        if not keep.any():
            return {}
        pairs, inverse = np.unique(np.stack([units[keep], owners[keep]], axis=1), axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        ug_at = np.rint(np.bincount(inverse, weights=ug[keep], minlength=len(pairs))).astype(np.int64)
        wg_at = np.rint(np.bincount(inverse, weights=wg[keep], minlength=len(pairs))).astype(np.int64)
        out: dict[int, list] = {}
        for (u, position), a, b in zip(pairs.tolist(), ug_at.tolist(), wg_at.tolist()):
            out.setdefault(u, []).append((position, a, b))
        return {u: tuple(v) for u, v in out.items()}

    def _roots(self, lay, modules) -> list[int]:
        """The root call above each call (itself for a root), and the root calls' post-forward keys.

        Each FSDP root has its own communication context (``FSDPState._lazy_init`` shares one
        ``FSDPCommContext`` with the states below it): a plan without a root call has several."""
        owner = lay.module_unit
        root_of = [-1] * len(lay.units)
        self.root_posts = []
        for ul in lay.units:
            chain, u = [], ul.index
            while root_of[u] < 0:
                chain.append(u)
                parent = modules[min(lay.units[u].modules)].parent
                up = owner[parent] if parent >= 0 else -1
                if up < 0 or up == u:
                    root_of[u] = u
                    break
                u = up
            for c in chain:
                root_of[c] = root_of[u]
            if ul.is_root:
                last = max((modules[m] for m in ul.modules), key=lambda m: (m.subtree_end, -m.depth))
                self.root_posts.append(((last.subtree_end, 0, -last.depth), ul.index))
        return root_of

    # -- resident state -------------------------------------------------------------------------
    def _resident(self) -> None:
        sh, S = self.sh, self.S
        device = ~sh.offload
        self.params_sharded = int((sh.padded * sh.itemsize)[device].sum())
        self.cpu_params = int((sh.padded * sh.itemsize)[sh.offload].sum())
        self.buffers = self.arrays.buffer_bytes
        self.grads_sharded = int(sum(g.sharded_grads for g in self.groups if not g.offload))
        self.grads_dev = self.grads_sharded + self.grads_whole
        # offloaded gradients are copied to the CPU without padding (foreach_reduce: .to("cpu"))
        t_off = sh.trainable & sh.offload
        self.cpu_grads = _per_coord_sum(sh.dim0[t_off], (sh.row * sh.itemsize)[t_off], S)

    def _optimizer(self) -> None:
        """Optimizer states per shard coordinate, and the temporaries of ``optimizer.step()``."""
        sh, S, training, arr = self.sh, self.S, self.training, self.arrays
        n_states, opt_dtype = training.n_states, training.optimizer_dtype
        row_state = sh.row * (_ITEMSIZE[opt_dtype] if opt_dtype else sh.itemsize)  # one state row
        t_dev, t_off = sh.trainable & ~sh.offload, sh.trainable & sh.offload
        # zeros_like(DTensor) allocates the local (unpadded) rows of this coordinate
        dev_state = _per_coord_sum(sh.dim0[t_dev], row_state[t_dev], S)
        off_state = _per_coord_sum(sh.dim0[t_off], row_state[t_off], S)
        w_train = self.w_train
        w_state = arr.numel[self.w_index][w_train] * (
            _ITEMSIZE[opt_dtype] if opt_dtype else arr.itemsize[self.w_index][w_train])
        self.opt_whole = n_states * int(w_state.sum())
        # Adam's ``step``: a 0-dim float32 per parameter; on the device with fused/capturable
        # Adam, else on the CPU (torch/optim/adam.py, ``_init_group``)
        steps = 4 * int(sh.trainable.sum() + w_train.sum()) if training.step_scalars else 0
        step_dev = steps if training.step_on_device else 0
        self.step_bytes = steps - step_dev  # on the CPU
        self.opt_dev = n_states * dev_state + step_dev
        self.opt_cpu = n_states * off_state
        zeros = np.zeros(S, dtype=np.int64)
        if training.step_scalars and not training.fused:
            # Adam's foreach path: sqrt(exp_avg_sq) for every parameter of a param group at once
            # (sharded and whole parameters are separate groups: foreach refuses the mix); the
            # per-parameter loop one parameter's worth. The fused kernel allocates none.
            fe_dev = True if training.foreach is None else training.foreach
            fe_cpu = False if training.foreach is None else training.foreach
            if fe_dev:
                self.opt_tmp_dev = np.maximum(dev_state, int(w_state.sum()))
            else:
                self.opt_tmp_dev = np.maximum(_per_coord_max(sh.dim0[t_dev], row_state[t_dev], S), int(w_state.max(initial=0)))
            self.opt_tmp_cpu = off_state if fe_cpu else _per_coord_max(sh.dim0[t_off], row_state[t_off], S)
        else:
            self.opt_tmp_dev = self.opt_tmp_cpu = zeros

    def _gradient_averaging(self) -> dict | None:
        """The exported code averages the gradients FSDP leaves alone in ONE flattened all-reduce at
        the end of backward (codegen's averager): every gradient in the promoted dtype, then one
        "has a gradient" flag per parameter."""
        training, arr = self.training, self.arrays
        if not (training.sync_outside_fsdp and self.S * self.R > 1 and self.w_train.any()):
            return None
        names = _code_names()
        codes = arr.dtype[self.w_index][self.w_train].tolist()
        common = _promote(sorted({names[c] for c in codes}))
        size = _itemsize(common)
        numel = arr.numel[self.w_index][self.w_train]
        converted = int((numel * size)[np.array([names[c] != common for c in codes])].sum())
        return {
            "dtype": common,
            "bytes": (int(numel.sum()) + len(codes)) * size,
            "temporaries": converted + int((numel * size).max()),  # converted copies + one averaged slice
        }

    # -- the peak -------------------------------------------------------------------------------
    @property
    def resident(self) -> int:
        return self.params_sharded + self.params_whole + self.buffers

    def _in_optimizer_step(self) -> np.ndarray:
        """Per shard coordinate: the peak is in ``optimizer.step()`` rather than forward/backward."""
        step = self.resident + self.grads_dev + self.opt_tmp_dev
        return step > self.resident + self.step.peak

    def breakdown(self, coord: int) -> dict[str, int]:
        """What is alive at the peak of shard coordinate ``coord``, by ``BREAKDOWN`` kind; sums to the peak."""
        opt = int(self.opt_dev[coord] + self.opt_whole)
        out = dict.fromkeys(BREAKDOWN, 0)
        out.update({"sharded params": self.params_sharded, "whole params": self.params_whole,
                    "buffers": self.buffers, "optimizer states": opt})
        moment = self.step.moment
        if moment is None or self._in_optimizer_step()[coord]:
            out["gradients"] = self.grads_dev
            out["temporaries"] = int(self.opt_tmp_dev[coord])
        else:
            alive = moment.alive
            out.update({"gradients": alive.gradients, "unsharded params": alive.unsharded_params,
                        "communication buffers": alive.communication_buffers, "activations": alive.activations,
                        "temporaries": alive.temporaries})
        return {k: int(v) for k, v in out.items()}

    # -- tables ----------------------------------------------------------------------------------
    def memory(self) -> pd.DataFrame:
        S, R = self.S, self.R
        opt_dev = self.opt_dev + self.opt_whole
        resident = self.resident
        moment = self.step.moment
        fb = resident + max(self.step.peak, 0) + opt_dev
        step = resident + self.grads_dev + opt_dev + self.opt_tmp_dev
        in_step = self._in_optimizer_step() | (moment is None)
        alive = moment.alive if moment is not None else Alive()
        transient = alive.total() - alive.gradients
        group_name = self.groups[moment.group].name if moment is not None and moment.group is not None else None
        cpu_opt = self.opt_cpu + self.step_bytes
        W = S * R

        def tile(a):
            return np.tile(a, R) if R > 1 else a

        def per_rank(value):
            return np.full(W, value)

        return pd.DataFrame({
            "rank": np.arange(W),
            "replica": np.repeat(np.arange(R), S),
            "shard": np.tile(np.arange(S), R),
            "params": per_rank(self.params_sharded + self.params_whole),
            "params_sharded": per_rank(self.params_sharded),
            "params_whole": per_rank(self.params_whole),
            "buffers": per_rank(self.buffers),
            "grads": per_rank(self.grads_dev),
            "grads_sharded": per_rank(self.grads_sharded),
            "grads_whole": per_rank(self.grads_whole),
            "optimizer": tile(opt_dev),
            "state": tile(resident + self.grads_dev + opt_dev),
            "activations": tile(np.where(in_step, 0, alive.activations)),
            "peak": tile(np.where(in_step, step, fb)),
            "peak_phase": tile(np.where(in_step, "optimizer", moment.phase if moment else "optimizer")),
            "peak_unit": pd.Series(tile(np.where(in_step, None, group_name)), dtype=object),
            "peak_module": pd.Series(tile(np.where(in_step, None, moment.module if moment else None)), dtype=object),
            "peak_transient": tile(np.where(in_step, self.opt_tmp_dev, transient)),
            "cpu_params": per_rank(self.cpu_params),
            "cpu_grads": tile(self.cpu_grads),
            "cpu_optimizer": tile(cpu_opt),
            "cpu_peak": tile(self.cpu_params + self.cpu_grads + cpu_opt + self.opt_tmp_cpu),
        })

    def comm(self) -> pd.DataFrame:
        mesh, groups = self.analysis.mesh, self.groups
        rows = []
        for k, collective, phase, group, size, count in self.step.comm:
            g = groups[k]
            nbytes = {"all_gather": g.gather, "reduce_scatter": g.rs_input, "all_reduce": g.rs_output}[collective]
            dtype = g.gather_dtype if collective == "all_gather" else g.reduce_dtype
            rows.append((g.name, collective, phase, group, size, count, dtype, nbytes))
        if self.sync is not None:
            rows.append((None, "all_reduce", "backward", "world", self.S * self.R, 1, self.sync["dtype"], self.sync["bytes"]))
        unit, kinds, phase, group, gsize, count, dtype, size = (list(c) for c in zip(*rows)) if rows else ([],) * 8
        n = np.asarray(gsize, dtype=np.int64)
        b = np.asarray(size, dtype=np.int64)
        is_ar = np.asarray([c == "all_reduce" for c in kinds], dtype=bool)
        # ring algorithm: all-gather / reduce-scatter send (n-1)/n of the full buffer per rank,
        # all-reduce (reduce-scatter + all-gather) twice that
        sent = (np.where(is_ar, 2, 1) * b * (n - 1)) // np.maximum(n, 1)
        bw = {(g, s): _group_bandwidth(mesh, g, s) for g, s in set(zip(group, gsize))}
        time_s = sent / (np.array([bw[(g, s)] for g, s in zip(group, gsize)], dtype=float) * 1e9) if len(group) else np.zeros(0)
        df = pd.DataFrame({"unit": pd.Series(unit, dtype=object), "collective": kinds, "phase": phase, "group": group,
                           "group_size": n, "count": np.asarray(count, dtype=np.int64), "dtype": dtype, "bytes": b,
                           "sent_bytes": sent, "time_s": time_s})
        # bytes, sent_bytes and time_s are per call; a step issues each row ``count`` times
        total = float((time_s * df["count"].to_numpy()).sum()) if len(df) else 0.0
        df.attrs["time_per_step_s"] = total  # NaN when a bandwidth it needs is unknown
        return df


def _group_bandwidth(mesh, group: str, size: int) -> float:
    """GB/s of the slowest link a ring over this process group crosses (NaN when unknown)."""
    rpn = mesh.ranks_per_node
    if group == "shard":
        intra = mesh.shard <= rpn and rpn % mesh.shard == 0
    elif group == "post_forward":
        intra = size <= rpn and rpn % size == 0
    elif group == "replicate":
        intra = mesh.world <= rpn
    else:  # world
        intra = mesh.world <= rpn
    bw = mesh.intra_node_gbps if intra else mesh.inter_node_gbps
    return float("nan") if bw is None else float(bw)


_MODEL_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def cost_model(analysis) -> CostModel:
    model = _MODEL_CACHE.get(analysis)
    if model is None:
        model = CostModel(analysis)
        _MODEL_CACHE[analysis] = model
    return model


def memory_table(analysis) -> pd.DataFrame:
    """One row per rank, bytes: see ``docs/cost-model.md`` for every column."""
    return cost_model(analysis).memory()


def comm_table(analysis) -> pd.DataFrame:
    """One row per collective per call per step: see ``docs/cost-model.md``."""
    return cost_model(analysis).comm()


def peak_breakdown(analysis, rank: int | None = None) -> dict[str, int]:
    """What is alive at ``rank``'s peak (default: the worst rank), by ``BREAKDOWN`` kind, in bytes.

    The one breakdown every view draws: its values sum to ``a.memory.peak`` of that rank."""
    mem = analysis.memory
    if rank is None:
        rank = worst_rank(mem)
    _, coord = analysis.mesh.coords(rank)
    return cost_model(analysis).breakdown(coord)
