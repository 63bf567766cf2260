"""The runtime helpers every ``sv.export_code`` module carries, as a real, importable, tested module.

``export_code`` copies the source of the definitions it needs into the exported file (so the code
users paste into their training scripts needs only torch, never shardviz); the tests import this
module and exercise each helper directly. Rules for this file: plain torch only; every definition
is a top-level function or class, black-formatted (it is pasted as is); the module-level names
used here (``contextlib``, ``torch``, ``dist``, ``DTensor``) are those the exported module imports,
and ``SYNC_EVERY_MICROBATCH`` one of the constants it writes.
"""

import contextlib

import torch
import torch.distributed as dist

try:  # torch.distributed.tensor is public from 2.5; 2.4 has torch.distributed._tensor
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover - torch 2.4
    from torch.distributed._tensor import DTensor

# An export that accumulates gradients writes the plan's own value of this constant (``train_step``).
SYNC_EVERY_MICROBATCH = False


@contextlib.contextmanager
def _hidden_from_fully_shard(model, params):
    """Keep ``params`` out of ``fully_shard`` on a release without ``ignored_params``.

    ``fully_shard`` collects what it shards with ``module.named_parameters(recurse=False)``
    on each module it manages, which skips slots holding ``None``. Each slot holding one of
    these parameters is set to ``None`` for the duration of the calls, then the same
    ``Parameter`` object goes back into the same slot (order, identity and ties kept).
    """
    ids = {id(p) for p in params}
    slots = []
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None and id(param) in ids:
                slots.append((module, name, param))
    for module, name, _ in slots:
        module._parameters[name] = None
    try:
        yield
    finally:
        for module, name, param in slots:
            module._parameters[name] = param


def _sac_save_ops():
    """The ops whose outputs torchtitan's "selective op" checkpointing saves (``_op_sac_save_list``,
    torchtitan/models/llama3/infra/parallelize.py), those this torch release has; plus the CPU
    flash-attention kernel, the CPU's counterpart of the CUDA kernels listed (CUDA never runs it).
    """
    aten = torch.ops.aten
    names = [
        (aten, "mm"),
        (aten, "_scaled_dot_product_efficient_attention"),
        (aten, "_scaled_dot_product_flash_attention"),
        (aten, "_scaled_dot_product_cudnn_attention"),
        (aten, "_scaled_dot_product_attention_math"),
        (aten, "_scaled_dot_product_fused_attention_overrideable"),
        (aten, "_scaled_dot_product_flash_attention_for_cpu"),
        (torch.ops._c10d_functional, "reduce_scatter_tensor"),
        (aten, "max"),
    ]
    ops = set()
    for namespace, name in names:
        packet = getattr(namespace, name, None)
        if packet is not None:
            ops.add(packet.default)
    flex = getattr(getattr(torch, "_higher_order_ops", None), "flex_attention", None)
    if flex is not None:
        ops.add(flex)
    return ops


def _selective_checkpoint_context():
    """``context_fn`` of a selectively checkpointed module: torchtitan's "selective op" policy
    (``_apply_op_sac`` in torchtitan/distributed/activation_checkpoint.py). The outputs of the ops
    in ``_sac_save_ops`` are saved, except every second ``mm`` (counted per call, in forward and
    in recomputation alike); every other op is recomputed in backward."""
    from torch.utils.checkpoint import (
        CheckpointPolicy,
        create_selective_checkpoint_contexts,
    )

    save = _sac_save_ops()
    mm = torch.ops.aten.mm.default
    mm_count = {"forward": 0, "recompute": 0}

    def policy(ctx, func, *args, **kwargs):
        if (
            func == torch.ops.aten._to_copy.default
            and "cuda" in str(args[0].device)
            and str(kwargs.get("device")) == "cpu"
        ):
            return CheckpointPolicy.MUST_SAVE  # offloading to the CPU
        mode = "recompute" if ctx.is_recompute else "forward"
        if func == mm:
            mm_count[mode] += 1
        if func in save and not (func == mm and mm_count[mode] % 2 == 0):
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def _checkpoint_wrapped(module, context_fn=None):
    """``module`` in torch's ``checkpoint_wrapper`` (non-reentrant): full activation checkpointing,
    or with ``context_fn=_selective_checkpoint_context`` selective (what it does not save is
    recomputed in backward)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        checkpoint_wrapper,
    )

    if context_fn is None:
        return checkpoint_wrapper(module, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
    return checkpoint_wrapper(
        module, checkpoint_impl=CheckpointImpl.NO_REENTRANT, context_fn=context_fn
    )


def _apply_checkpointing(model, names, context_fns=None):
    """Wrap each named module in torch's ``checkpoint_wrapper`` (``_checkpoint_wrapped``), in
    place: full activation checkpointing, or selective for a name ``context_fns`` maps to
    ``_selective_checkpoint_context``.

    Wrapping renames everything below a module (``<name>._checkpoint_wrapped_module.<rest>``), so
    every module and its parent are resolved first, then wrapped. Returns ``{name: wrapper}``:
    ``fully_shard`` is applied to the wrapper, as torchtitan does.
    """
    context_fns = context_fns or {}
    targets = []
    for name in names:
        parent_name, _, attr = name.rpartition(".")
        targets.append(
            (name, model.get_submodule(parent_name), attr, model.get_submodule(name))
        )
    wrappers = {}
    for name, parent, attr, module in targets:
        wrapper = _checkpoint_wrapped(module, context_fns.get(name))
        parent.register_module(attr, wrapper)
        wrappers[name] = wrapper
    return wrappers


def _mesh_device(mesh):
    if mesh.device_type == "cpu":
        return torch.device("cpu")
    return torch.device(
        mesh.device_type, getattr(torch, mesh.device_type).current_device()
    )


def _dp_groups(mesh):
    """Groups whose successive sums cover every data-parallel rank of ``mesh`` (None: the world)."""
    if mesh.ndim == 1:
        return [mesh.get_group()]
    if mesh.size() == dist.get_world_size():
        return [None]
    return [mesh.get_group(dim) for dim in range(mesh.ndim)]


def _common_dtype(tensors):
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


@torch.no_grad()
def _broadcast(params, mesh, groups):
    """Make ``params`` equal on every rank: one flattened broadcast from the mesh's first rank per group."""
    flat = torch.cat([p.detach().reshape(-1).to(_common_dtype(params)) for p in params])
    for group in groups:
        src = (
            int(mesh.mesh.flatten()[0])
            if group is None
            else dist.get_global_rank(group, 0)
        )
        dist.broadcast(flat, src=src, group=group)
    offset = 0
    for p in params:
        p.copy_(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()


class _GradAverager:
    """Averages the gradients of trainable parameters FSDP does not reduce, once per backward.

    Every such parameter's post-accumulate-grad hook, and a hook on the root's outputs, queue one
    callback on the autograd engine; it runs when the backward pass ends and does ONE flattened
    all-reduce (sum, then divide by the number of data-parallel ranks). A trailing count of the ranks
    that had each gradient travels in the same buffer: a parameter with no gradient on any rank keeps
    ``grad=None``; one missing on some ranks counts as zero there.
    """

    def __init__(self, params, groups, world):
        self.params, self.groups, self.world = params, groups, world
        self.queued = False

    def on_forward(self, module, args, output):
        self.queued = False
        if torch.is_grad_enabled():
            for t in _tensors(output):
                if t.requires_grad:
                    t.register_hook(self.queue)
                    break

    def queue(self, *_):
        if not self.queued:
            self.queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self.average)

    @torch.no_grad()
    def average(self):
        self.queued = False
        params = self.params
        dtype = _common_dtype(params)
        parts = [
            (p.grad if p.grad is not None else torch.zeros_like(p))
            .reshape(-1)
            .to(dtype)
            for p in params
        ]
        has = torch.tensor(
            [p.grad is not None for p in params], dtype=dtype, device=params[0].device
        )
        flat = torch.cat(parts + [has])
        for group in self.groups:
            dist.all_reduce(flat, group=group)
        offset, n = 0, flat.numel() - len(params)
        for i, p in enumerate(params):
            if flat[n + i] > 0:
                mean = (flat[offset : offset + p.numel()] / self.world).view_as(p)
                if p.grad is None:
                    p.grad = mean.to(p.dtype)
                else:
                    p.grad.copy_(mean)
            offset += p.numel()


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors(value)


def optimizer_param_groups(model):
    """The trainable parameters as optimizer param groups: sharded ones (DTensor) apart from whole
    ones (plain tensors). One group holding both fails in torch's foreach kernels (the default on GPU)
    with "got mixed torch.Tensor and DTensor"."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    sharded = [p for p in trainable if isinstance(p, DTensor)]
    whole = [p for p in trainable if not isinstance(p, DTensor)]
    return [{"params": group} for group in (sharded, whole) if group]


def _replicate_unsharded(model, mesh):
    """Parameters FSDP left whole: move them to the mesh's device (FSDP does not move ignored ones),
    make the trainable ones equal on every rank and average their gradients every backward.
    """
    device = _mesh_device(mesh)
    whole = [p for p in model.parameters() if not isinstance(p, DTensor)]
    for p in whole:
        if p.device != device and p.device.type != "meta":
            with torch.no_grad():
                p.data = p.data.to(device)
    for module in model.modules():
        for name, buf in module._buffers.items():
            if buf is not None and buf.device != device and buf.device.type != "meta":
                module._buffers[name] = buf.to(device)
    trainable = [p for p in whole if p.requires_grad]
    if not trainable:
        return
    groups = _dp_groups(mesh)
    # Parameters still on the meta device (deferred init) cannot be broadcast: initialise them
    # identically on every rank (same seed) after to_empty(); their gradients are averaged anyway.
    materialised = [p for p in trainable if p.device.type != "meta"]
    if materialised:
        _broadcast(materialised, mesh, groups)
    averager = _GradAverager(trainable, groups, mesh.size())
    for p in trainable:
        p.register_post_accumulate_grad_hook(averager.queue)
    model.register_forward_hook(averager.on_forward)


def train_step(model, optimizer, micro_batches, loss_fn):
    """One optimizer step over ``micro_batches`` with FSDP2 gradient accumulation.

    ``loss_fn(model, batch)`` returns one micro-batch's loss. FSDP reduce-scatters only on the last
    micro-batch (``set_requires_gradient_sync(False)`` before the others, unless
    ``SYNC_EVERY_MICROBATCH``): the unsharded gradients stay alive until then, as shardviz's peak
    counts. Each loss is divided by the number of micro-batches, so the step equals one big batch.
    Returns the summed loss (detached).
    """
    micro_batches = list(micro_batches)
    fsdp_modules = [
        m for m in model.modules() if hasattr(m, "set_requires_gradient_sync")
    ]
    total = 0.0
    for i, batch in enumerate(micro_batches):
        sync = SYNC_EVERY_MICROBATCH or i == len(micro_batches) - 1
        for module in fsdp_modules:
            module.set_requires_gradient_sync(sync, recurse=False)
        loss = loss_fn(model, batch) / len(micro_batches)
        loss.backward()
        total += float(loss.detach())
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total
