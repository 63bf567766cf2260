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

from .finding import Finding
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
        for key in ("batch_size", "seq_len"):
            value = getattr(self, key)
            if key == "batch_size" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Training.{key} must be a positive int{' or None' if key == 'batch_size' else ''}, got {value!r}")
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


def _local_rows(dim0: np.ndarray, shard: int) -> np.ndarray:
    """rows[i, c]: rows of parameter i that ``torch.chunk`` gives shard coordinate c."""
    rows = -(-dim0 // shard)
    coords = np.arange(shard, dtype=np.int64)
    return np.clip(dim0[:, None] - coords[None, :] * rows[:, None], 0, rows[:, None])


def _per_coord_sum(dim0: np.ndarray, row_bytes: np.ndarray, shard: int) -> np.ndarray:
    """sum_i local_rows(dim0_i, c) * row_bytes_i for every shard coordinate c (grouped by dim0)."""
    if dim0.size == 0:
        return np.zeros(shard, dtype=np.int64)
    uniq, inverse = np.unique(dim0, return_inverse=True)
    weights = np.bincount(inverse, weights=row_bytes, minlength=uniq.size)
    return np.rint(weights @ _local_rows(uniq, shard)).astype(np.int64)


def _per_coord_max(dim0: np.ndarray, row_bytes: np.ndarray, shard: int) -> np.ndarray:
    """max_i local_rows(dim0_i, c) * row_bytes_i for every shard coordinate c."""
    if dim0.size == 0:
        return np.zeros(shard, dtype=np.int64)
    pairs = np.unique(np.stack([dim0, row_bytes.astype(np.int64)], axis=1), axis=0)
    return (_local_rows(pairs[:, 0], shard) * pairs[:, 1:2]).max(axis=0)


# ---------------------------------------------------------------------------
# The cost model of one analysis
# ---------------------------------------------------------------------------
_PART_NAMES = ("unsharded params", "all-gather buffers", "reduce-scatter buffers", "unsharded grads", "gradients",
               "all-reduce buffers")


class CostModel:
    """Everything ``memory_table`` and ``comm_table`` need, computed once per analysis.

    Per ``fully_shard`` call with parameters (one ``FSDPParamGroup``), in bytes per rank:
    ``shard``: padded shards (original dtype); ``gather``: the all-gather output, which is also the
    size of the unsharded parameters (padded, param dtype); ``rs``/``ro``: reduce-scatter input and
    output (trainable parameters only, padded, reduce dtype); ``grad``: sharded gradients (padded,
    original dtype); ``ug``: the unsharded gradients autograd computes (unpadded, param dtype).
    """

    def __init__(self, analysis):
        self.analysis = analysis
        tree, lay, mesh, training = analysis.tree, analysis.layout, analysis.mesh, analysis.training
        self.training = training
        S, R = mesh.shard, mesh.replicate
        self.S, self.R = S, R
        arr = _tree_arrays(tree)
        n_units = len(lay.units)
        policies = [training.unit_defaults(ul.unit) for ul in lay.units]
        labels = [ul.unit.name for ul in lay.units]
        self.labels = labels

        punit = np.asarray(lay.param_unit, dtype=np.int64)
        sharded = (punit >= 0) & np.fromiter((s == "sharded" for s in lay.param_status), dtype=bool, count=punit.size)

        # -- per-unit policies -------------------------------------------------------------
        pd_code = np.array([_dtype_code(p.param_dtype) if p.param_dtype else -1 for p in policies] + [-1], dtype=np.int64)
        pd_size = np.array([_ITEMSIZE[p.param_dtype] if p.param_dtype else 0 for p in policies] + [0], dtype=np.int64)
        offload_u = np.array([p.offload for p in policies] + [False], dtype=bool)

        # -- sharded parameters: the padded shard (FSDPParam._init_sharded_param) -------------
        idx = np.nonzero(sharded)[0]
        u = punit[idx]
        numel, dim0, isz, dcode = arr.numel[idx], arr.dim0[idx], arr.itemsize[idx], arr.dtype[idx]
        rowsize = np.where(dim0 > 0, numel // np.maximum(dim0, 1), 0)
        padded = -(-dim0 // S) * rowsize
        # param dtype: the policy's, unless it equals the original or the parameter is not
        # floating point (FSDPParam.init_dtype_attrs)
        cast = (pd_code[u] >= 0) & arr.is_float[idx] & (pd_code[u] != dcode)
        pd_isz = np.where(cast, pd_size[u], isz)
        pd_dt = np.where(cast, pd_code[u], dcode)
        train = arr.trainable[idx]
        off = offload_u[u]

        def per_unit(weights):
            return np.rint(np.bincount(u, weights=weights, minlength=n_units)).astype(np.int64)

        n_params = np.bincount(u, minlength=n_units)
        gather_b = per_unit(padded * pd_isz) * S
        # all-gather inputs staged before the collective: the foreach copy into param dtype
        # (_get_param_all_gather_inputs), or the host-to-device copy of an offloaded shard
        staged = np.where(off, padded * isz + np.where(cast, padded * pd_isz, 0), np.where(pd_code[u] >= 0, padded * pd_isz, 0))
        copy_b = per_unit(staged)
        tr = train.astype(np.float64)
        pad_train = per_unit(padded * tr)
        ug_b = per_unit(numel * pd_isz * tr)
        has_train = per_unit(tr) > 0
        n_codes = max(len(_DTYPE_CODES), 1)
        # one all-gather dtype, or uint8 bytes when the inputs differ (foreach_all_gather)
        ag_codes = np.bincount(u * n_codes + pd_dt, minlength=n_units * n_codes).reshape(n_units, n_codes) > 0
        ag_kinds = ag_codes.sum(axis=1)
        ag_first = ag_codes.argmax(axis=1)
        t_orig = np.bincount(u[train] * n_codes + dcode[train], minlength=n_units * n_codes).reshape(n_units, n_codes).argmax(axis=1)
        t_pd = np.bincount(u[train] * n_codes + pd_dt[train], minlength=n_units * n_codes).reshape(n_units, n_codes).argmax(axis=1)

        # -- whole parameters (ignored / unmanaged): every rank holds them ------------------------
        widx = np.nonzero(~sharded)[0]
        would = np.asarray(lay.would_be_unit, dtype=np.int64)[widx]
        w_bytes = arr.numel[widx] * arr.itemsize[widx]
        w_train = arr.trainable[widx]
        self.params_whole = int(w_bytes.sum())
        self.grads_whole = int(w_bytes[w_train].sum())
        self.buffers = arr.buffer_bytes
        wg = np.rint(np.bincount(np.where(would >= 0, would, n_units)[w_train], weights=w_bytes[w_train],
                                 minlength=n_units + 1)).astype(np.int64)
        self.unmanaged_grads = int(wg[n_units])

        # -- one entry per group, in plan order ------------------------------------------------------
        names = _code_names()
        modules = tree.modules
        G = self.G = {k: [] for k in ("unit", "name", "rar", "offload", "gather", "copy", "gdtype", "trainable", "rd",
                                      "rs", "ro", "grad", "cast", "ug", "wgrad", "pre", "post", "first", "out_grad",
                                      "in_grad", "ctx")}
        first_trainable = arr.first_trainable
        # Each FSDP root has its own communication context (FSDPState._lazy_init shares one
        # FSDPCommContext with the states below the root): a plan without a root call has several
        root_of = self._roots(lay, modules)
        for ul in lay.units:
            i = ul.index
            if not n_params[i]:
                continue
            pol = policies[i]
            t = bool(has_train[i])
            if t:
                orig_name = names[t_orig[i]]
                # FSDPParam.init_dtype_attrs drops reduce_dtype equal to param_dtype; foreach_reduce
                # then reduces in the gradient's dtype, the param dtype
                rd = pol.reduce_dtype if (pol.reduce_dtype and pol.reduce_dtype != pol.param_dtype) else names[t_pd[i]]
                ro = int(pad_train[i]) * _itemsize(rd)
                grad = int(pad_train[i]) * _itemsize(orig_name)
            else:
                orig_name = rd = ""
                ro = grad = 0
            mods = ul.modules
            if len(mods) == 1:
                first = last = modules[mods[0]]
            else:
                ms = [modules[m] for m in mods]
                first = min(ms, key=lambda m: m.index)
                last = max(ms, key=lambda m: (m.subtree_end, -m.depth))
            G["unit"].append(i)
            G["name"].append(labels[i])
            G["rar"].append(ul.reshard_after_forward)
            G["offload"].append(pol.offload)
            G["gather"].append(int(gather_b[i]))
            G["copy"].append(int(copy_b[i]))
            G["gdtype"].append(names[ag_first[i]] if ag_kinds[i] == 1 else "uint8")
            G["trainable"].append(t)
            G["rd"].append(rd)
            G["rs"].append(ro * S)
            G["ro"].append(ro)
            G["grad"].append(grad)
            G["cast"].append(t and rd != orig_name)
            G["ug"].append(int(ug_b[i]))
            G["wgrad"].append(int(wg[i]))
            G["pre"].append((first.index, 1, 0))
            G["post"].append((last.subtree_end, 0, -last.depth))
            G["first"].append(first.index)
            # autograd: a call's output needs a gradient when a trainable parameter ran before it
            # ends (FSDPState._register_pre_backward_hook), its input when one ran before it starts
            # (FSDPParamGroup._register_post_backward_hook); module order stands in for data flow
            G["out_grad"].append(first_trainable < last.subtree_end)
            G["in_grad"].append(first_trainable < first.index)
            G["ctx"].append(root_of[i])

        # -- resident state per shard coordinate ---------------------------------------------------
        dev = ~off
        self.params_sharded = int((padded * isz)[dev].sum())
        self.cpu_params = int((padded * isz)[off].sum())
        self.grads_sharded = int(sum(g for g, o in zip(G["grad"], G["offload"]) if not o))
        n_states, opt_dtype = training.n_states, training.optimizer_dtype
        row_state = rowsize * (_ITEMSIZE[opt_dtype] if opt_dtype else isz)  # one state row
        t_dev, t_off = train & dev, train & off
        # optimizer states: zeros_like(DTensor) allocates the local (unpadded) rows of this coordinate
        dev_state = _per_coord_sum(dim0[t_dev], row_state[t_dev], S)
        off_state = _per_coord_sum(dim0[t_off], row_state[t_off], S)
        self.opt_dev = n_states * dev_state
        self.opt_cpu = n_states * off_state
        w_state = arr.numel[widx][w_train] * (_ITEMSIZE[opt_dtype] if opt_dtype else arr.itemsize[widx][w_train])
        self.opt_whole = n_states * int(w_state.sum())
        self.step_bytes = 4 * int(train.sum() + w_train.sum()) if training.step_scalars else 0
        # offloaded gradients are copied to the CPU without padding (foreach_reduce: .to("cpu"))
        self.cpu_grads = _per_coord_sum(dim0[t_off], (rowsize * isz)[t_off], S)
        # optimizer.step() temporaries: Adam's sqrt(exp_avg_sq), for all parameters at once (foreach)
        zeros = np.zeros(S, dtype=np.int64)
        if training.step_scalars:
            fe_dev = True if training.foreach is None else training.foreach
            fe_cpu = False if training.foreach is None else training.foreach
            if fe_dev:  # per param group; sharded and whole parameters cannot share one (foreach refuses the mix)
                self.opt_tmp_dev = np.maximum(dev_state, int(w_state.sum()))
            else:
                self.opt_tmp_dev = np.maximum(_per_coord_max(dim0[t_dev], row_state[t_dev], S), int(w_state.max(initial=0)))
            self.opt_tmp_cpu = off_state if fe_cpu else _per_coord_max(dim0[t_off], row_state[t_off], S)
        else:
            self.opt_tmp_dev = self.opt_tmp_cpu = zeros
        # the exported code averages their gradients in ONE flattened all-reduce at the end of
        # backward (codegen._GradAverager): every gradient in the promoted dtype, then one "has a
        # gradient" flag per parameter
        self.sync = None
        if training.sync_outside_fsdp and S * R > 1 and w_train.any():
            names_ = _code_names()
            dts = sorted({names_[c] for c in arr.dtype[widx][w_train].tolist()})
            common = _promote(dts)
            c_size = _itemsize(common)
            w_numel = arr.numel[widx][w_train]
            converted = int((w_numel * c_size)[np.array([names_[c] != common for c in arr.dtype[widx][w_train].tolist()])].sum())
            n_sync = int(w_train.sum())
            self.sync = {
                "dtype": common,
                "bytes": (int(w_numel.sum()) + n_sync) * c_size,
                "temporaries": converted + int((w_numel * c_size).max()),  # converted copies + one averaged slice
            }
        self._simulate()

    def _roots(self, lay, modules) -> list[int]:
        """The root call above each call (itself for a root), and the root calls' post-forward keys."""
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

    # -- one training step, event by event, in the order torch runs its hooks --------------------
    def _simulate(self) -> None:
        S, G = self.S, self.G
        n = len(G["name"])
        gather, copy, rar_l, post_l = G["gather"], G["copy"], G["rar"], G["post"]
        base = self.params_sharded + self.params_whole + self.buffers  # + optimizer states (per rank)
        best = -1
        best_info = None
        comm: list[tuple] = []
        gathered = S > 1

        # ---------------- forward: FSDPParamGroup.pre_forward / post_forward ----------------------
        ctx = G["ctx"]
        events = sorted([(G["pre"][k], 1, k) for k in range(n)] + [(post_l[k], 0, k) for k in range(n)]
                        + [(key, 0, n + r) for key, r in self.root_posts])
        held = 0  # unsharded parameters (and post-forward shards) alive
        # previous all-gather output of each root's context, freed after the next copy-out
        # (implicit prefetch) or by the root's post-forward
        ag_states: dict[int, int] = {}
        ag_state = 0  # their sum
        state = [0] * n  # 0 sharded, 1 unsharded, 2 post-forward shard
        for _, kind, k in events:
            if k >= n:  # a root's post-forward: FSDPState._post_forward frees its context's last all-gather output
                ag_state -= ag_states.pop(k - n, 0)
                continue
            if kind:  # pre-forward: unshard() then wait_for_unshard()
                ag = gather[k] if gathered else 0
                x = base + held + ag_state + ag + copy[k]
                if x > best:
                    best, best_info = x, ("forward", k, (held, ag_state + ag + copy[k], 0, 0, 0))
                ag_state -= ag_states.get(ctx[k], 0)
                x = base + held + ag_state + ag + gather[k]
                if x > best:
                    best, best_info = x, ("forward", k, (held + gather[k], ag_state + ag, 0, 0, 0))
                if gathered:
                    comm.append((k, "all_gather", "forward", "shard", S, 1))
                held += gather[k]
                ag_states[ctx[k]] = ag
                ag_state += ag
                state[k] = 1
            else:  # post-forward: reshard() (to the smaller post-forward mesh for an int)
                rar = rar_l[k]
                if rar is True:
                    held -= gather[k]
                    state[k] = 0
                elif rar is not False:
                    pf = gather[k] // rar
                    x = base + held + ag_state + pf
                    if x > best:
                        best, best_info = x, ("forward", k, (held + pf, ag_state, 0, 0, 0))
                    held += pf - gather[k]
                    state[k] = 2

        # ---------------- backward: pre_backward (+ prefetch), post_backward ------------------------
        order = sorted(range(n), key=post_l.__getitem__)  # comm_ctx.post_forward_order
        prev = [-1] * n  # the call before each in its context's post-forward order
        last_in_ctx: dict[int, int] = {}
        for k in order:
            prev[k] = last_in_ctx.get(ctx[k], -1)
            last_in_ctx[ctx[k]] = k
        pending = [0] * n  # prefetched all-gather outputs not yet copied out
        is_pending = [False] * n
        pend = 0
        rs_hold = 0  # reduce_scatter_states keeps one reduce-scatter input (max_input_buffers=1)
        grads = 0  # gradients resident on the device so far
        ug_held = 0  # unsharded gradients waiting for a deferred post_backward
        trainable, rs_l, ro_l, grad_l, cast_l = G["trainable"], G["rs"], G["ro"], G["grad"], G["cast"]
        offload_l, ug_l, wgrad_l = G["offload"], G["ug"], G["wgrad"]
        R = self.R

        def post_backward(k, ug):
            nonlocal held, rs_hold, grads, best, best_info
            if state[k] == 1:
                held -= gather[k]
            elif state[k] == 2:
                held -= gather[k] // rar_l[k]
            state[k] = 0
            rs_hold = 0  # the previous reduce-scatter input is waited on and dropped first
            if not trainable[k]:
                return
            now = base + held + grads + pend + ug_held
            x = now + ug + rs_l[k]
            if x > best:
                best, best_info = x, ("backward", k, (held, pend, rs_l[k], ug_held + ug, grads))
            dev_grad = 0 if offload_l[k] else grad_l[k]
            extra = dev_grad if cast_l[k] else 0
            x = now + rs_l[k] + ro_l[k] + extra
            if x > best:
                best, best_info = x, ("backward", k, (held, pend, rs_l[k] + ro_l[k], ug_held, grads + extra))
            if S > 1:
                comm.append((k, "reduce_scatter", "backward", "shard", S, 1))
            if R > 1:
                comm.append((k, "all_reduce", "backward", "replicate", R, 1))
            grads += dev_grad
            rs_hold = rs_l[k]

        def unshard(k):
            nonlocal pend, best, best_info
            if state[k] == 1 or is_pending[k]:
                return
            size = S if state[k] == 0 else rar_l[k]
            is_pending[k] = True
            if size > 1:
                pending[k] = gather[k]
                pend += gather[k]
                x = base + held + grads + rs_hold + pend + ug_held + copy[k]
                if x > best:
                    best, best_info = x, ("backward", k, (held, pend + copy[k], rs_hold, ug_held, grads))
                comm.append((k, "all_gather", "backward", "shard" if state[k] == 0 else "post_forward", size, 1))

        deferred = []
        for k in reversed(order):
            if not G["out_grad"][k]:
                continue  # no pre-backward hook: nothing after it needed a gradient
            # pre_backward: unshard (no-op if prefetched) and wait_for_unshard (copy-out)
            unshard(k)
            if is_pending[k]:
                x = base + held + grads + rs_hold + pend + ug_held + gather[k]
                if x > best:
                    best, best_info = x, ("backward", k, (held + gather[k], pend, rs_hold, ug_held, grads))
                pf = gather[k] // rar_l[k] if state[k] == 2 else 0
                pend -= pending[k]
                pending[k] = 0
                is_pending[k] = False
                held += gather[k] - pf
                state[k] = 1
            if prev[k] >= 0:  # FSDPParamGroup._backward_prefetch: the previous call in post-forward order
                unshard(prev[k])
            # autograd computes this call's gradients
            x = base + held + grads + rs_hold + pend + ug_held + ug_l[k] + wgrad_l[k]
            if x > best:
                best, best_info = x, ("backward", k, (held, pend, rs_hold, ug_held + ug_l[k], grads + wgrad_l[k]))
            grads += wgrad_l[k]
            if G["in_grad"][k]:
                post_backward(k, ug_l[k])
            else:
                ug_held += ug_l[k]
                deferred.append(k)
        grads += self.unmanaged_grads
        # FSDPState._root_post_backward_final_callback: post_backward for every group not done yet,
        # in the root's named_modules order
        deferred_set = set(deferred)
        rest = [k for k in range(n) if not (G["out_grad"][k] and G["in_grad"][k])]
        for k in sorted(rest, key=G["first"].__getitem__):
            ug = ug_l[k] if k in deferred_set else 0
            ug_held -= ug
            post_backward(k, ug)
        if self.sync is not None:  # the averager's callback runs after FSDP's final callback
            x = base + held + grads + self.sync["bytes"] + self.sync["temporaries"]
            if x > best:
                best, best_info = x, ("backward", None, (held, 0, 0, 0, grads, self.sync["bytes"] + self.sync["temporaries"]))
        self.fb_peak = best
        self.fb_info = best_info
        self.grads_dev = self.grads_sharded + self.grads_whole

        # ---------------- gradients of whole parameters: one all-reduce over all ranks ------------
        self.sync_rows = []
        if self.sync is not None:
            world = self.S * self.R
            self.sync_rows.append((None, self.sync["dtype"], 1, self.sync["bytes"], world))
        self.comm_events = comm

    # -- tables ----------------------------------------------------------------------------------
    def memory(self) -> pd.DataFrame:
        S, R = self.S, self.R
        opt_dev = self.opt_dev + self.opt_whole
        resident = self.params_sharded + self.params_whole + self.buffers
        fb = self.fb_peak + opt_dev
        step = resident + self.grads_dev + opt_dev + self.opt_tmp_dev
        in_step = step > fb
        phase, k, parts = self.fb_info if self.fb_info else ("forward", None, (0, 0, 0, 0, 0))
        transient = self.fb_peak - resident - parts[4]
        cpu_opt = self.opt_cpu + self.step_bytes
        W = S * R

        def tile(a):
            return np.tile(a, R) if R > 1 else a

        return pd.DataFrame({
            "rank": np.arange(W),
            "replica": np.repeat(np.arange(R), S),
            "shard": np.tile(np.arange(S), R),
            "params": np.full(W, self.params_sharded + self.params_whole),
            "params_sharded": np.full(W, self.params_sharded),
            "params_whole": np.full(W, self.params_whole),
            "buffers": np.full(W, self.buffers),
            "grads": np.full(W, self.grads_dev),
            "grads_sharded": np.full(W, self.grads_sharded),
            "grads_whole": np.full(W, self.grads_whole),
            "optimizer": tile(opt_dev),
            "state": tile(resident + self.grads_dev + opt_dev),
            "peak": tile(np.maximum(fb, step)),
            "peak_phase": tile(np.where(in_step, "optimizer", phase)),
            "peak_unit": pd.Series(tile(np.where(in_step, None, self.G["name"][k] if k is not None else None)), dtype=object),
            "peak_transient": tile(np.where(in_step, self.opt_tmp_dev, transient)),
            "cpu_params": np.full(W, self.cpu_params),
            "cpu_grads": tile(self.cpu_grads),
            "cpu_optimizer": tile(cpu_opt),
            "cpu_peak": tile(self.cpu_params + self.cpu_grads + cpu_opt + self.opt_tmp_cpu),
        })

    def peak_breakdown(self, rank: int = 0) -> dict[str, int]:
        """What is alive at ``rank``'s peak, by kind (bytes), largest first."""
        _, coord = self.analysis.mesh.coords(rank)
        opt = int(self.opt_dev[coord] + self.opt_whole)
        out = {"sharded params": self.params_sharded, "ignored/unmanaged params": self.params_whole,
               "buffers": self.buffers, "optimizer states": opt}
        tmp = int(self.opt_tmp_dev[coord])
        if self.fb_info is None or self.params_sharded + self.params_whole + self.buffers + self.grads_dev + tmp > self.fb_peak:
            out.update({"gradients": self.grads_dev, "optimizer step temporaries": tmp})
        else:
            out.update(zip(_PART_NAMES, self.fb_info[2]))
        return {k: int(v) for k, v in sorted(out.items(), key=lambda kv: -kv[1]) if v}

    def comm(self) -> pd.DataFrame:
        G, mesh = self.G, self.analysis.mesh
        ev = self.comm_events
        ks = [e[0] for e in ev]
        kinds = [e[1] for e in ev]
        unit = [G["name"][k] for k in ks]
        dtype = [G["gdtype"][k] if c == "all_gather" else G["rd"][k] for k, c in zip(ks, kinds)]
        size = [G["gather"][k] if c == "all_gather" else G["rs"][k] if c == "reduce_scatter" else G["ro"][k]
                for k, c in zip(ks, kinds)]
        phase = [e[2] for e in ev]
        group = [e[3] for e in ev]
        gsize = [e[4] for e in ev]
        count = [1] * len(ev)
        for label, dt, c, b, world in self.sync_rows:
            unit.append(label)
            kinds.append("all_reduce")
            phase.append("backward")
            group.append("world")
            gsize.append(world)
            count.append(c)
            dtype.append(dt)
            size.append(b)
        n = np.asarray(gsize, dtype=np.int64)
        b = np.asarray(size, dtype=np.int64)
        is_ar = np.asarray([c == "all_reduce" for c in kinds], dtype=bool)
        # ring algorithm: all-gather / reduce-scatter send (n-1)/n of the full buffer per rank,
        # all-reduce (reduce-scatter + all-gather) twice that
        sent = (np.where(is_ar, 2, 1) * b * (n - 1)) // np.maximum(n, 1)
        bw = {(g, s): _group_bandwidth(mesh, g, s) for g, s in set(zip(group, gsize))}
        time_s = sent / (np.array([bw[(g, s)] for g, s in zip(group, gsize)], dtype=float) * 1e9) if len(group) else np.zeros(0)
        df = pd.DataFrame({"unit": pd.Series(unit, dtype=object), "collective": kinds, "phase": phase, "group": group, "group_size": n,
                           "count": np.asarray(count, dtype=np.int64), "dtype": dtype, "bytes": b,
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


def peak_breakdown(analysis, rank: int = 0) -> dict[str, int]:
    return cost_model(analysis).peak_breakdown(rank)


def format_bytes(n: float) -> str:
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


def memory_findings(analysis) -> list[Finding]:
    """SV201: the predicted peak of some rank does not fit ``Mesh.device_memory``."""
    limit = analysis.mesh.device_memory
    if limit is None:
        return []
    mem = analysis.memory
    worst = int(mem["peak"].idxmax())
    peak = int(mem.at[worst, "peak"])
    if peak <= limit:
        return []
    rank = int(mem.at[worst, "rank"])
    parts = peak_breakdown(analysis, rank)
    top = ", ".join(f"{k} {format_bytes(v)}" for k, v in list(parts.items())[:4])
    units = sorted(analysis.units.itertuples(index=False), key=lambda r: -r.padded_unsharded_bytes)[:3]
    big = ", ".join(f"{r.unit} ({format_bytes(r.padded_unsharded_bytes)} unsharded)" for r in units)
    phase = mem.at[worst, "peak_phase"]
    where = f" in {phase}" + (f" at {mem.at[worst, 'peak_unit']}" if mem.at[worst, "peak_unit"] else "")
    fixes = []
    if parts.get("optimizer states", 0) or parts.get("sharded params", 0):
        fixes.append("shard over more ranks")
    if not analysis.training.offload:
        fixes.append("offload to CPU (Training(offload=True))")
    fixes.append("set reshard_after_forward=True on calls that keep parameters unsharded")
    if not analysis.training.param_dtype:
        fixes.append("use param_dtype='bfloat16'")
    return [Finding(
        "SV201", "error",
        f"peak memory {format_bytes(peak)} on rank {rank}{where} exceeds device_memory "
        f"{format_bytes(limit)} by {format_bytes(peak - limit)} (activations not counted); "
        f"largest contributors: {top}; largest calls: {big}",
        tuple(m for r in units for m in r.modules),
        "; ".join(fixes),
    )]
