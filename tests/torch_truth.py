"""Ground truth from torch itself: run a real training step and measure what FSDP2 holds and sends.

- Memory: ``FSDPMemTracker`` (torch/distributed/_tools/fsdp2_mem_tracker.py). It instruments
  what FSDP manages (sharded/unsharded parameters and gradients, all-gather and reduce-scatter
  buffers, optimizer states). It does not see parameters FSDP leaves alone (ignored or
  unmanaged), so we hand those to it with its own ``_update_and_maybe_create_winfos``,
  categorised as what they are: unsharded parameters, and (by a post-accumulate-grad hook)
  unsharded gradients. The *state peak* is the tracker's highest total after any op with
  activations, temporaries and inputs taken out, taken at every op rather than at the moment
  activations peak. The same goes for the post-forward shards of an int
  ``reshard_after_forward``, which the tracker files under Activation.
- Collectives: a ``TorchDispatchMode`` logs every ``torch.ops.c10d`` op (FSDP2 issues
  ``_allgather_base_``, ``_reduce_scatter_base_``, ``allreduce_``; the same ops ``CommDebugMode``
  counts) and records kind, tensor bytes (all-gather output, reduce-scatter input, all-reduce
  tensor), dtype and the process group's size. Any other c10d op is logged under its own name, a
  kind ``a.comm`` does not have, and ``comm_mismatches`` fails on it. The FSDP call that issued it is read from the ``FSDPParamGroup`` whose
  ``unshard``/``post_backward`` is running.

Works under torch's fake process group (any world size, one process) and under gloo with real
processes (``gloo_run``, forked, so the children skip the imports).

Note: ``FSDPMemTracker`` re-registers forward hooks per module, which breaks grouped calls
(``fully_shard([a, b])`` is then all-gathered and resharded once per module, and its
post-backward fires after its last module's backward, not where torch's hooks put it). The
harness registers the tracker's wrappers as FSDP registers its own hooks
(``truth_tracker``), so the tracked step is the step torch runs, and puts FSDP's
hooks back afterwards. Collectives are still recorded in the step before, with no tracker.
"""

from __future__ import annotations

import contextlib
import os
import socket
import traceback
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

import shardviz as sv
from shardviz.activations.measure import image_prefix_inputs
from shardviz.export.oracle import apply_plan, fake_process_group
from truth_tracker import see_post_forward_shards, state_tracker, unsharded_params, unsharded_storages

SEQ = 16
BATCH = 2


# ---------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------
def tiny_llama(vocab: int = 128, hidden: int = 64, layers: int = 2, dtype=torch.float32, seed: int = 0) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=vocab, max_position_embeddings=256)
    return LlamaForCausalLM(cfg).to(dtype)


def tiny_gpt2(seed: int = 0) -> nn.Module:
    """GPT-2 (tied embeddings, Conv1D projections), fully trainable."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=64,
                                      bos_token_id=0, eos_token_id=0))


def tiny_mixtral(seed: int = 0) -> nn.Module:
    """Mixtral: a sparse MoE block of 4 experts (top 2) per layer, fully trainable."""
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(seed)
    return MixtralForCausalLM(MixtralConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=128, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
        bos_token_id=0, eos_token_id=0, pad_token_id=0))


def tiny_lora(r: int = 8, vocab: int = 128, seed: int = 0, dtype=torch.float32) -> nn.Module:
    """A real tiny Llama with peft LoRA on every linear layer (the zoo's when it exists).

    ``dtype``: of the base model; peft keeps the adapters in float32 either way.
    """
    if (r, vocab, seed, dtype) == (8, 128, 0, torch.float32):
        try:
            from shardviz.zoo import tiny_llama_lora

            return tiny_llama_lora()
        except ImportError:
            pass
    from peft import LoraConfig, get_peft_model

    model = tiny_llama(vocab=vocab, seed=seed, dtype=dtype)
    torch.manual_seed(seed + 1)
    return get_peft_model(model, LoraConfig(r=r, target_modules="all-linear"))


def vocab_of(model: nn.Module) -> int:
    for m in model.modules():
        if isinstance(m, nn.Embedding):
            return m.num_embeddings
    raise ValueError("no embedding in the model")


# ---------------------------------------------------------------------------
# Optimizer as sv.Training describes it
# ---------------------------------------------------------------------------
def make_optimizer(training: sv.Training, model: nn.Module) -> torch.optim.Optimizer:
    """The optimizer ``training`` names, over every trainable parameter.

    Sharded (DTensor) and whole (plain tensor) parameters go in separate param groups: torch's
    foreach kernels refuse a list mixing both ("got mixed torch.Tensor and DTensor"), and foreach
    is torch's default on an accelerator.
    """
    from torch.distributed.tensor import DTensor

    trainable = [p for p in model.parameters() if p.requires_grad]
    sharded = [p for p in trainable if isinstance(p, DTensor)]
    whole = [p for p in trainable if not isinstance(p, DTensor)]
    params = [{"params": group} for group in (sharded, whole) if group]
    foreach = True if training.foreach is None else training.foreach  # predictions assume device tensors
    adam = dict(fused=True) if training.fused else dict(foreach=foreach, capturable=training.capturable)
    if training.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=1e-3, **adam)
    if training.optimizer == "adam":
        return torch.optim.Adam(params, lr=1e-3, **adam)
    if training.optimizer == "sgd":
        return torch.optim.SGD(params, lr=1e-3, foreach=foreach)
    if training.optimizer == "sgd_momentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=foreach)
    raise ValueError(f"no torch optimizer for {training.optimizer!r}")


# ---------------------------------------------------------------------------
# Recording collectives
# ---------------------------------------------------------------------------
_CURRENT: list = [None]  # label of the FSDP call whose unshard/post_backward is running
_PHASE: list = ["forward"]


@contextlib.contextmanager
def _label_fsdp_calls(labels: dict):
    """Wrap FSDPParamGroup.unshard/post_backward so collectives know which call issued them."""
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    orig_unshard, orig_post = FSDPParamGroup.unshard, FSDPParamGroup.post_backward

    def wrap(fn):
        def inner(self, *args, **kwargs):
            old = _CURRENT[0]
            _CURRENT[0] = labels.get(id(self), "?")
            try:
                return fn(self, *args, **kwargs)
            finally:
                _CURRENT[0] = old

        return inner

    FSDPParamGroup.unshard = wrap(orig_unshard)
    FSDPParamGroup.post_backward = wrap(orig_post)
    try:
        yield
    finally:
        FSDPParamGroup.unshard, FSDPParamGroup.post_backward = orig_unshard, orig_post


# c10d op -> (kind as a.comm names it, the argument whose bytes a.comm counts, the process-group argument)
_KNOWN_C10D = {
    "_allgather_base_": ("all_gather", 0, 2),  # (output, input, pg, ...): the output
    "allgather_": ("all_gather", 0, 2),  # ([[outputs]], [inputs], pg, ...)
    "allgather_into_tensor_coalesced_": ("all_gather", 0, 2),  # ([outputs], [inputs], pg, ...)
    "_reduce_scatter_base_": ("reduce_scatter", 1, 2),  # (output, input, pg, op, ...): the input
    "reduce_scatter_": ("reduce_scatter", 1, 2),  # ([outputs], [[inputs]], pg, op, ...)
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1, 2),  # ([outputs], [inputs], pg, op, ...)
    "allreduce_": ("all_reduce", 0, 1),  # ([tensors], pg, op, ...)
    "allreduce_coalesced_": ("all_reduce", 0, 1),  # ([tensors], pg, op, ...)
}


def _tensors(x) -> list:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in _tensors(y)]
    return []


def _group_size(args) -> int | None:
    for a in args:
        if isinstance(a, torch.ScriptObject):
            try:
                return dist.ProcessGroup.unbox(a).size()
            except Exception:  # another script object (a Work, a ReduceOp)
                continue
    return None


def _collective_recorder():
    """Logs every ``torch.ops.c10d`` op a step dispatches, not only the kinds shardviz predicts: a
    kind the prediction lacks (a broadcast, an all-to-all, a barrier) is logged under its op name
    and ``comm_mismatches`` fails on it."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.log: list[dict] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "c10d":
                op = func._schema.name.split("::", 1)[1]
                name, t_arg, pg_arg = _KNOWN_C10D.get(op, (op, 0, None))
                tensors = _tensors(args[t_arg]) if len(args) > t_arg else []
                size = _group_size(args[pg_arg:pg_arg + 1] if pg_arg is not None else args)
                self.log.append({"unit": _CURRENT[0], "collective": name, "phase": _PHASE[0],
                                 "group_size": size if size is not None else 0,
                                 "dtype": str(tensors[0].dtype).replace("torch.", "") if tensors else "",
                                 "bytes": sum(t.numel() * t.element_size() for t in tensors)})
            return func(*args, **(kwargs or {}))

    return Recorder()


# ---------------------------------------------------------------------------
# One measured run
# ---------------------------------------------------------------------------
@dataclass
class StepTruth:
    rank: int
    sharded_params: int = 0  # tracker: Sharded Param
    whole_params: int = 0  # torch: storage bytes of parameters that are not DTensors
    buffers: int = 0  # tracker: Buffer
    sharded_grads: int = 0  # tracker: Sharded Grad after the step
    whole_grads: int = 0  # torch: storage bytes of their gradients
    optimizer: int = 0  # tracker: OptState after the step
    state_peak: int = 0  # tracker: max over ops of everything but activations, temporaries, inputs
    state_peak_snap: dict = field(default_factory=dict)
    peak_snap: dict = field(default_factory=dict)  # tracker's own peak snapshot (its Total: everything)
    collectives: list = field(default_factory=list)
    loss: float = 0.0
    params: dict | None = None  # gloo: every parameter whole (fqn -> float32 numpy array) after the steps


def _unit_labels(model: nn.Module, plan: sv.Plan) -> tuple[dict, dict]:
    """FSDPParamGroup id -> plan unit name, and state id -> name (read from torch's FSDP states)."""
    from torch.distributed.fsdp import fully_shard

    groups, states = {}, {}
    for unit in plan.units:
        state = fully_shard.state(model.get_submodule(unit.modules[0]))
        states[id(state)] = unit.name
        for group in state._fsdp_param_groups:
            groups[id(group)] = unit.name
    return groups, states


def _outside_params(model: nn.Module, state_names: dict) -> list[tuple[str, nn.Parameter, str | None]]:
    """Trainable-or-not parameters torch left as plain tensors, with the FSDP call around them."""
    from torch.distributed.fsdp._fully_shard._fsdp_state import _get_module_fsdp_state
    from torch.distributed.tensor import DTensor

    out, seen = [], set()
    for fqn, p in model.named_parameters():
        # FSDP's own are DTensors on a data-parallel mesh; tensor parallelism's alone ("tp") stay outside FSDP
        if (isinstance(p, DTensor) and p.device_mesh.mesh_dim_names != ("tp",)) or id(p) in seen:
            continue
        seen.add(id(p))
        label, prefix = None, fqn.rpartition(".")[0]
        while True:
            state = _get_module_fsdp_state(model.get_submodule(prefix))
            if state is not None:
                label = state_names.get(id(state))
                break
            if not prefix:
                break
            prefix = prefix.rpartition(".")[0]
        out.append((fqn, p, label))
    return out


def _local(t):
    """A tensor-parallel DTensor's local tensor (what the rank holds); a plain tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def _set_gradient_sync(model: nn.Module, sync: bool) -> None:
    """``set_requires_gradient_sync`` on every FSDP call (a plan may have several roots)."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_requires_gradient_sync(sync, recurse=False)


def exported_apply(model: nn.Module, plan: sv.Plan, mesh: sv.Mesh, training: sv.Training):
    """``apply_fsdp`` of the code ``sv.export_code`` writes for this plan: the same fully_shard calls,
    plus what the export does for parameters FSDP leaves whole (broadcast once, then one
    all-reduce of their gradients per backward)."""
    namespace: dict = {"__name__": "shardviz_exported"}
    exec(compile(sv.export_code(model, plan, mesh=mesh, training=training), "<exported>", "exec"), namespace)
    return namespace["apply_fsdp"]


STEPS = 3  # run_step trains this many steps on one batch


def batch(model: nn.Module, training: sv.Training, seed: int = 1234) -> torch.Tensor:
    """The input ids ``run_step`` trains on (``seed``: 1234, or 1234 + rank with ``own_batch``)."""
    g = torch.Generator().manual_seed(seed)
    shape = (training.batch_size, training.seq_len) if training.with_activations else (BATCH, SEQ)
    return torch.randint(0, vocab_of(model), shape, generator=g)


def run_step(model: nn.Module, plan: sv.Plan, mesh: sv.Mesh, training: sv.Training, rank: int,
             own_batch: bool = False, apply=None, use_cache: bool | None = None,
             fresh_inputs: bool = False, loss_of=None) -> StepTruth:
    """Apply ``plan`` and train: one warm-up step, one under the collective recorder,
    then one under the memory tracker (last: it leaves grouped calls' hooks broken).
    ``own_batch``: every rank trains on its own batch (seed 1234 + rank), else all on one.
    ``fresh_inputs``: each forward gets its own copy of the ids, made inside the tracked step and
    dropped when the forward returns (the step shardviz measures: ``activations.measure._forward``);
    otherwise the ids are made before the tracker starts, which then never sees them (not even as
    Inputs), so a peak in the forward lacks their bytes.

    Needs an initialised process group of ``mesh.world`` ranks (fake or gloo). With
    ``training.sync_outside_fsdp`` the plan is applied by the exported code (``exported_apply``),
    otherwise by the oracle's ``apply_plan``; ``apply(model, device_mesh)`` replaces both (calls
    written by hand; ``plan`` then only names them). ``use_cache``: passed to the forward (None:
    ``Training.step_use_cache``: the config's, off with checkpointing, the step sv prices).
    ``loss_of(model, ids)``: the step's forward and loss for a model that is not a Hugging Face one
    (a torchtune recipe's: ``model(tokens)`` then its loss); default ``model(input_ids=ids, labels=ids).loss``.
    """
    from shardviz.activations import config_use_cache
    from shardviz.export.oracle import device_mesh

    if use_cache is None and config_use_cache(model):  # the step sv prices (Training.step_use_cache)
        use_cache = training.step_use_cache(True, bool(plan.checkpoint))
    dmesh = device_mesh(mesh)
    if apply is not None:
        apply(model, dmesh)
    elif training.sync_outside_fsdp:
        exported_apply(model, plan, mesh, training)(model, dmesh)
    else:
        apply_plan(model, plan, dmesh, training=training)
    optimizer = make_optimizer(training, model)
    group_labels, state_labels = _unit_labels(model, plan)
    outside = _outside_params(model, state_labels)
    ids = batch(model, training, 1234 + rank if own_batch else 1234)
    images = image_prefix_inputs(model, ids.shape[0])  # GIT's step is image + text, as sv measures it
    truth = StepTruth(rank)

    def step(between_microbatches=None):
        k = training.grad_accum  # micro-batches; without sync but on the last unless told otherwise
        for i in range(k):
            _set_gradient_sync(model, training.sync_every_microbatch or i == k - 1)
            if i and between_microbatches is not None:
                between_microbatches()
            _PHASE[0] = "forward"
            # the step the user's config runs: with its use_cache (True by default for causal LMs, a
            # key/value cache kept through the step), what sv measures (docs/activations.md, use_cache)
            inputs = ids.clone() if fresh_inputs else ids
            loss = loss_of(model, inputs) if loss_of is not None else model(
                input_ids=inputs, labels=inputs, **images, **({} if use_cache is None else {"use_cache": use_cache})).loss
            del inputs
            _PHASE[0] = "backward"
            loss.backward()
        _PHASE[0] = "optimizer"
        optimizer.step()
        return float(loss.detach())

    with _label_fsdp_calls(group_labels):
        step()  # lazy init, optimizer states
        optimizer.zero_grad()

        recorder = _collective_recorder()
        with recorder:
            truth.loss = step()
        truth.collectives = recorder.log
        optimizer.zero_grad()

        tracker, R = state_tracker(model, optimizer)
        with tracker, see_post_forward_shards(tracker, R):
            for _, p, _ in outside:  # what FSDPMemTracker does not instrument
                tracker._update_and_maybe_create_winfos(_local(p), R.UNSHARDED_PARAM)
            for t in unsharded_storages(model):  # what it files too late (see truth_tracker.unsharded_storages)
                tracker._update_and_maybe_create_winfos(t, R.UNSHARDED_PARAM)

            def grad_hook(q):
                tracker._update_and_maybe_create_winfos(_local(q.grad), R.UNSHARDED_GRAD)

            hooks = [p.register_post_accumulate_grad_hook(grad_hook) for _, p, _ in outside if p.requires_grad]
            # The tracker files an unsharded gradient under Temp until its call's post-backward; a
            # call with calls nested inside it holds part of them across the nested calls' backward.
            # File each as the gradient it is the moment autograd accumulates it.
            hooks += [p.register_post_accumulate_grad_hook(grad_hook) for p in unsharded_params(model)]
            start = tracker.get_tracker_snapshot("current")
            step(between_microbatches=tracker.reset_mod_stats)  # it refuses a second forward otherwise
            end = tracker.get_tracker_snapshot("current")
        for h in hooks:
            h.remove()
        (dev, s0), = start.items()
        e0 = end[dev]
        truth.sharded_params = s0[R.SHARDED_PARAM]
        truth.buffers = s0[R.BUFFER]
        truth.sharded_grads = e0[R.SHARDED_GRAD]
        truth.optimizer = e0[R.OPT]
        truth.state_peak = tracker.state_peak[dev]
        truth.state_peak_snap = tracker.state_peak_snap[dev]
        truth.peak_snap = {str(k.value) if hasattr(k, "value") else k: v
                           for k, v in tracker.get_tracker_snapshot("peak")[dev].items()}
        truth.whole_params = sum(_local(p).untyped_storage().nbytes() for _, p, _ in outside)
        truth.whole_grads = sum(_local(p.grad).untyped_storage().nbytes() for _, p, _ in outside if p.grad is not None)

    return truth


def fake_run(build, plan: sv.Plan, mesh: sv.Mesh, training: sv.Training, rank: int, apply=None,
             inspect=None, use_cache: bool | None = None, fresh_inputs: bool = False, loss_of=None) -> StepTruth:
    """``run_step`` on one rank of torch's fake process group (collectives are no-ops);
    ``inspect(model)`` runs on the trained model before the process group goes."""
    model = build()
    with fake_process_group(rank, mesh.world):
        truth = run_step(model, plan, mesh, training, rank, apply=apply, use_cache=use_cache,
                         fresh_inputs=fresh_inputs, loss_of=loss_of)
        if inspect is not None:
            inspect(model)
        return truth


# ---------------------------------------------------------------------------
# Real processes, gloo
# ---------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _whole_params(model: nn.Module) -> dict:
    """Every parameter, whole (a collective for DTensors: every rank calls it), as a float32 numpy
    array: a tensor sent through a multiprocessing queue is shared by a file descriptor that dies
    with the worker."""
    # FSDP's own unshard (its all-gather on the process group objects it holds), not
    # DTensor.full_tensor: that resolves the mesh's groups by name, which fails in a worker forked
    # from a pytest process that ran fake-PG tests before ("Could not resolve the process group").
    # The worker ends right after, so nothing is resharded.
    for m in model.modules():
        if hasattr(m, "unshard") and hasattr(m, "reshard"):
            m.unshard()
    return {fqn: p.detach().float().numpy().copy() for fqn, p in model.named_parameters()}


def _gloo_worker(rank, world, port, build, plan, mesh, training, queue):
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=rank, world_size=world)
        try:
            model = build()
            truth = run_step(model, plan, mesh, training, rank, own_batch=True)
            truth.params = _whole_params(model)
        finally:
            dist.destroy_process_group()
        queue.put((rank, truth, None))
    except BaseException:  # report, do not hang the parent
        queue.put((rank, None, traceback.format_exc()))


def gloo_run(build, plan: sv.Plan, mesh: sv.Mesh, training: sv.Training, timeout: float = 300) -> list[StepTruth]:
    """``run_step`` on ``mesh.world`` real processes (forked) talking over gloo, each rank on its own
    batch; one truth per rank, with the parameters the steps left (``reference_params`` is what
    they should be)."""
    import multiprocessing as mp

    if dist.is_initialized():
        raise RuntimeError("a process group is already initialised in the parent")
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_gloo_worker, args=(r, mesh.world, port, build, plan, mesh, training, queue))
             for r in range(mesh.world)]
    for p in procs:
        p.start()
    results, errors = {}, []
    try:
        for _ in procs:
            rank, truth, err = queue.get(timeout=timeout)
            if err:
                errors.append(f"rank {rank}:\n{err}")
            else:
                results[rank] = truth
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    if errors:
        raise RuntimeError("gloo run failed\n" + "\n".join(errors))
    return [results[r] for r in range(mesh.world)]


def reference_params(build, training: sv.Training, world: int) -> dict:
    """One process, no FSDP: ``STEPS`` steps of the same optimizer on the mean of the losses of the
    ``world`` ranks' batches (each rank's own, as ``gloo_run`` gives them), that is on the average
    gradient over all ranks, which FSDP's reduce-scatter, HSDP's all-reduce and the export's
    all-reduce of whole parameters must produce together."""
    model = build()
    optimizer = make_optimizer(training, model)
    batches = [batch(model, training, 1234 + r) for r in range(world)]
    for _ in range(STEPS):
        loss = sum(model(input_ids=ids, labels=ids, use_cache=False).loss for ids in batches) / world
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return {fqn: p.detach().clone() for fqn, p in model.named_parameters()}


# ---------------------------------------------------------------------------
# Comparing a prediction with a truth
# ---------------------------------------------------------------------------
PEAK_TOLERANCE = 0.10


def memory_mismatches(analysis, truth: StepTruth, exact_peak: bool = True, peak_offset: int = 0,
                      peak_slack: int = 0) -> list[str]:
    """Every byte-exact column that differs from torch, and the peak when it is not torch's plus
    exactly ``peak_offset`` bytes (the deviations docs/cost-model.md lists as limits), give or take
    ``peak_slack`` bytes (real processes free collective buffers at varying moments), or with
    ``exact_peak=False`` when it differs by more than ``PEAK_TOLERANCE``.

    On a CPU-only run every tensor lives on the CPU, so the tracker's optimizer states include
    Adam's ``step`` scalars that the prediction files under ``cpu_optimizer``.
    """
    row = analysis.memory.iloc[truth.rank]
    pairs = {
        "params_sharded": (row.params_sharded + row.cpu_params, truth.sharded_params),
        "params_whole": (row.params_whole, truth.whole_params),
        "buffers": (row.buffers, truth.buffers),
        "grads_sharded": (row.grads_sharded, truth.sharded_grads),
        "grads_whole": (row.grads_whole, truth.whole_grads),
        "optimizer": (row.optimizer + row.cpu_optimizer, truth.optimizer),
    }
    out = [f"rank {truth.rank} {k}: predicted {p}, torch {t}" for k, (p, t) in pairs.items() if int(p) != int(t)]
    peak = int(row.peak + row.cpu_optimizer)
    if abs(peak - truth.state_peak - peak_offset) > peak_slack if exact_peak else abs(peak / truth.state_peak - 1) > PEAK_TOLERANCE:
        expected = f" (expected torch's {peak_offset:+d} bytes)" if peak_offset else ""
        out.append(f"rank {truth.rank} peak: predicted {peak}, torch {truth.state_peak}{expected} "
                   f"({peak - truth.state_peak:+d} B, {peak / truth.state_peak - 1:+.1%}); torch at its peak: {truth.state_peak_snap}")
    return out


def _call_key(unit, collective, phase, group_size, dtype, size):
    unit = None if unit is None or unit != unit else unit  # NaN -> None
    return (unit, collective, phase, int(group_size), str(dtype), int(size))


def comm_mismatches(analysis, truth: StepTruth) -> list[str]:
    """Collectives torch issued and ``a.comm`` did not predict, and the reverse (per call: kind,
    phase, process group size, dtype and bytes). ``bytes`` is one call's buffer; rows with
    ``count`` > 1 are compared in total (``bytes * count``)."""
    from collections import Counter

    predicted, predicted_total = Counter(), Counter()
    for r in analysis.comm.itertuples(index=False):
        if r.count == 1:
            predicted[_call_key(r.unit, r.collective, r.phase, r.group_size, r.dtype, r.bytes)] += 1
        else:
            predicted_total[(r.unit, r.collective, r.phase, int(r.group_size), str(r.dtype))] += r.bytes * r.count
    kinds = set(analysis.comm.collective)
    issued = Counter(c["collective"] for c in truth.collectives)
    out = [f"torch issued {n} x {k!r}, a kind the prediction does not have ({sorted(kinds)})"
           for k, n in sorted(issued.items()) if k not in kinds]
    seen, seen_total = Counter(), Counter()
    for c in truth.collectives:
        key = _call_key(c["unit"], c["collective"], c["phase"], c["group_size"], c["dtype"], c["bytes"])
        if predicted[key] > seen[key]:
            seen[key] += 1
        else:
            seen_total[key[:5]] += key[5]
    out += [f"predicted but not issued: {k} x{n - seen[k]}" for k, n in predicted.items() if n > seen[k]]
    for k in set(seen_total) | set(predicted_total):
        if seen_total[k] != predicted_total[k]:
            out.append(f"torch issued {k} totalling {seen_total[k]} bytes, predicted {predicted_total[k]}")
    return out


# ---------------------------------------------------------------------------
# The peak breakdown (a.peak_breakdown(), drawn by the widget, the report and compare) against the
# tracker's categories at its peak
# ---------------------------------------------------------------------------
# shardviz kind(s) -> FSDPMemTracker categories. Whole parameters (ignored or under no call) are
# handed to the tracker as Unsharded Param (see run_step), so they share that category with FSDP's
# unsharded parameters; gradients are sharded or unsharded; FSDP's buffers are the all-gather and
# reduce-scatter ones; CPU-only runs keep Adam's step scalars (cpu_optimizer) with the states.
BREAKDOWN_TO_TRACKER = {
    ("sharded params",): ("Sharded Param",),
    ("whole params", "unsharded params"): ("Unsharded Param",),
    ("buffers",): ("Buffer",),
    ("optimizer states", "cpu optimizer"): ("OptState",),
    ("gradients",): ("Sharded Grad", "Unsharded Grad"),
    ("communication buffers",): ("All Gather", "Reduce Scatter"),
}
ACTIVATION_KINDS = (("activations", "temporaries"), ("Activation", "Temp", "Inputs"))


def breakdown_mismatches(analysis, truth: StepTruth, rank: int, activations: bool, slack: int = 0,
                         post_forward_shards: bool = False) -> list[str]:
    """Each kind of ``analysis.peak_breakdown(rank)`` against the tracker's categories at its peak:
    the state peak's snapshot (``activations=False``: shardviz then has no activations or
    temporaries there) or the peak of everything (``activations=True``: activations and
    temporaries together within ``slack`` bytes, the case's pinned deviation). The harness files an
    int ``reshard_after_forward``'s post-forward shards under Sharded Param, shardviz under
    unsharded params: with ``post_forward_shards`` all parameters are compared together."""
    ours = dict(analysis.peak_breakdown(rank))
    mapped = {k for kinds in (*BREAKDOWN_TO_TRACKER, ACTIVATION_KINDS[0]) for k in kinds} - {"cpu optimizer"}
    assert set(ours) == mapped, f"kinds without a tracker category: {sorted(set(ours) ^ mapped)}"
    row = analysis.memory.iloc[rank]
    assert sum(ours.values()) == int(row.peak)  # the breakdown is the peak
    ours["cpu optimizer"] = int(row.cpu_optimizer)
    snap = truth.peak_snap if activations else truth.state_peak_snap
    pairs = dict(BREAKDOWN_TO_TRACKER)
    if post_forward_shards:
        del pairs[("sharded params",)], pairs[("whole params", "unsharded params")]
        pairs[("sharded params", "whole params", "unsharded params")] = ("Sharded Param", "Unsharded Param")
    out = []
    for kinds, categories in pairs.items():
        p, t = sum(ours[k] for k in kinds), sum(snap.get(c, 0) for c in categories)
        if p != t:
            out.append(f"rank {rank} {' + '.join(kinds)}: predicted {p}, torch {' + '.join(categories)} {t}")
    kinds, categories = ACTIVATION_KINDS
    p = sum(ours[k] for k in kinds)
    if activations:
        t = sum(snap.get(c, 0) for c in categories)
        if p - t != slack:
            out.append(f"rank {rank} activations + temporaries: predicted {p}, torch {t} ({p - t:+d}, pinned {slack:+d})")
    elif p:
        out.append(f"rank {rank}: no batch, yet the breakdown has {p} bytes of activations and temporaries")
    return out
