"""The entry point: measure one step (on the reduced copy, else the whole model), with the one cache."""

from __future__ import annotations

import dataclasses
import logging
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from ..checkpointing import FULL, SELECTIVE, CheckpointPolicy
from ..presets import find_blocks
from ..model.tree import ModelTree, base_model, model_name
from . import stop
from .flops import flop_counter, module_sums
from .kernels import attention_note
from .patches import balanced_routing, fake_friendly, hf_plain_batches, moe_shape
from .measure_cache import Measurement, ModelEntry, entry_of, measure_once, one_step, peek, recall, remember
from .profile import ActivationProfile, event_index, last_in_subtree, module_stats, strip_wrapper
from .reduced import DtypePolicy, ListPlan, as_dtype, build_copy, plan_lists
from .splice import block_saved, splice


# ---------------------------------------------------------------------------
# Running the step
# ---------------------------------------------------------------------------
def hf_config(model):
    cfg = getattr(model, "config", None)
    try:
        from transformers import PretrainedConfig
    except ImportError:  # transformers missing
        return None
    return cfg if isinstance(cfg, PretrainedConfig) else None


def image_prefix_inputs(model, batch_size: int) -> dict:
    """``pixel_values`` for a vision-language model that conditions its text on an image prefix (GIT:
    a forward taking ``pixel_values``, a vision config with an image size, no image token placed in
    the text): its training step is image + text, and text alone fails in its own loss. Zeros of
    (batch, channels, size, size) of the vision config, as transformers' model tests build them.
    Models that place image tokens in ``input_ids`` (Llava, Qwen2-VL) measure text-only: {}."""
    import inspect

    cfg = hf_config(model)
    vision = getattr(cfg, "vision_config", None)
    size = getattr(vision, "image_size", None)
    if (size is None or "pixel_values" not in inspect.signature(base_model(model).forward).parameters
            or any(getattr(cfg, k, None) is not None for k in ("image_token_id", "image_token_index"))):
        return {}
    h, w = (size, size) if isinstance(size, int) else tuple(size)
    return {"pixel_values": torch.zeros((batch_size, getattr(vision, "num_channels", 3), h, w))}


def _loss_of(out, request=None):
    own = getattr(request.example_inputs, "loss", None) if request is not None else None
    if callable(own):  # the step's own loss on the output (torchtune's chunked cross-entropy)
        return own(out)
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, dict):
        loss = out.get("loss")
    if isinstance(loss, torch.Tensor):
        return loss
    from torch.utils._pytree import tree_flatten

    tensors = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not tensors:
        raise ValueError("the model's output holds no floating tensor to take a loss from")
    total = tensors[0].sum()
    for t in tensors[1:]:
        total = total + t.sum()
    return total


def config_use_cache(model) -> bool:
    """Whether a Hugging Face model's forward keeps a key/value cache by default (its config's
    ``use_cache``; False for other modules and configs without it)."""
    return bool(getattr(hf_config(model), "use_cache", False))


def _forward(model, request):
    """The forward of the step; its inputs die when it returns, as in a training loop's step."""
    if request.example_inputs is not None:
        args, kwargs = request.example_inputs(request.batch_size, request.seq_len)
        return model(*args, **(kwargs or {}))
    ids = torch.zeros((request.batch_size, request.seq_len), dtype=torch.long)
    return model(input_ids=ids, labels=ids, use_cache=request.use_cache, **image_prefix_inputs(model, request.batch_size))


def _run_step(reduced, request, recorder, counter) -> None:
    """The user's ordinary step: forward, loss, the output dropped, ``loss.backward()``. Modes from
    the first to see an op: the recorder (it sees the ops as the model issues them), the FLOP
    counter (what it decomposes to count stays below the recorder; it runs each op with the
    routing's answer to what fake tensors cannot run, and counts that)."""
    with counter, recorder, hf_plain_batches(), fake_friendly(recorder):
        out = _forward(reduced, request)
        loss = _loss_of(out, request)
        del out
        if loss.requires_grad:
            loss.backward()
        del loss
        recorder.finish()


# ---------------------------------------------------------------------------
# What is asked, and the dtype each parameter computes in
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class _Request:
    """The caller's arguments, normalised: also the key of a profile in the cache."""

    batch_size: int
    seq_len: int
    param_dtype: torch.dtype | None
    whole: frozenset  # parameters FSDP leaves whole: they matter only under a param_dtype
    checkpoint: frozenset  # the checkpointed modules
    example_inputs: object
    selective: frozenset = frozenset()  # those of them checkpointed selectively
    use_cache: bool = False  # a Hugging Face forward's use_cache (its config's unless asked otherwise)

    @property
    def policies(self) -> dict[str, CheckpointPolicy]:
        """Checkpointed module -> its policy."""
        return {c: SELECTIVE if c in self.selective else FULL for c in self.checkpoint}


def _request(batch_size, seq_len, param_dtype, whole_params, checkpoint, example_inputs, use_cache) -> _Request:
    batch_size, seq_len = int(batch_size), int(seq_len)
    if batch_size < 1 or seq_len < 1:
        raise ValueError("batch_size and seq_len must be >= 1")
    pdt = as_dtype(param_dtype)
    whole = frozenset(whole_params) if pdt is not None else frozenset()
    pairs = checkpoint.items() if hasattr(checkpoint, "items") else ((c, FULL) for c in checkpoint)
    policies = {strip_wrapper(c): policy for c, policy in pairs}
    policies = {c: CheckpointPolicy.parse(policy, f"checkpoint[{c!r}]") for c, policy in policies.items()}
    selective = frozenset(c for c, policy in policies.items() if policy is SELECTIVE)
    return _Request(batch_size, seq_len, pdt, whole, frozenset(policies), example_inputs, selective, bool(use_cache))


def _check_checkpoint(checkpoint: frozenset, tree: ModelTree) -> None:
    for c in checkpoint:
        if c == "":
            raise ValueError("checkpoint: the root module cannot be checkpoint-wrapped")
        if c not in tree.module_index:
            raise KeyError(f"checkpoint: no module {c!r} in the model")


# ---------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------
def measure_copy(model, tree, lists, param_dtype_of, checkpoint_outside, request: _Request, moe) -> Measurement:
    """Build the copy (``reduced.build_copy``) and run one step of it under ``FakeTensorMode`` and
    the recorder."""
    from torch._subclasses import FakeTensorMode

    from .recorder import Recorder

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    reduced, keys, block_keys = build_copy(model, tree, lists, param_dtype_of, checkpoint_outside, fake_mode)
    counter = flop_counter(balanced_routing(moe))
    recorder = Recorder(keys, block_keys, counter)
    # Categorise the copy's parameters as parameters and their gradients as gradients (not ours).
    handles = recorder.track_params(reduced)
    try:
        with fake_mode, recorder.kv.routing(recorder.winfos_of):
            _run_step(reduced, request, recorder, counter)
    except Exception as exc:
        module = _recomputing(recorder.events, exc)
        if module is not None and not lists:  # the whole model: the user's own module failed, not the cut copy
            raise RecomputationError(module, exc) from exc
        raise
    finally:
        for h in handles:
            h.remove()
    stop.check()  # asked to stop in backward, it ran the rest bare (recorder): its events must never be kept
    return Measurement(recorder.events, tuple(sorted(recorder.attention)), recorder.kv.release)


class RecomputationError(ValueError):
    """The step failed while backward recomputed checkpointed ``module``: torch's real step fails there too."""

    def __init__(self, module: str, cause: Exception):
        super().__init__(f"{type(cause).__name__}: {str(cause)[:300]}")
        self.module, self.cause = module, cause


def _recomputing(events, exc: Exception) -> str | None:
    """The checkpointed module whose recomputation raised ``exc`` (torch's ``recompute_fn`` on its
    stack, or its check that the recomputed tensors match the saved ones): the outermost module of
    the last recomputation run, or None."""
    import traceback

    from torch.utils.checkpoint import CheckpointError

    if not isinstance(exc, CheckpointError) and not any(
            f.name == "recompute_fn" for f in traceback.extract_tb(exc.__traceback__)):
        return None
    depth, outermost = 0, None
    for e in events:  # the post hooks run even when the forward raises: the run is closed at the end
        if e.kind == "pre_rc":
            outermost = e.key if depth == 0 else outermost
            depth += 1
        elif e.kind == "post_rc":
            depth = max(depth - 1, 0)
    return outermost if isinstance(outermost, str) else None


def _outside_checkpoint(lists: list[ListPlan], tree: ModelTree, checkpoint: dict) -> frozenset:
    """The checkpointed modules outside the cut block lists, (fqn, policy) (the copy wraps them as
    they are)."""
    blocks = {tree.modules[b].fqn for lp in lists for b in lp.positions}
    prefixes = tuple(b + "." for b in blocks)
    return frozenset((c, p) for c, p in checkpoint.items() if c not in blocks and not c.startswith(prefixes))


def _measurement_key(tree: ModelTree, request: _Request, lists, outside_ck, policy: DtypePolicy) -> tuple:
    """What the copy runs: shapes, the representatives of every list, the checkpointed modules and
    compute dtypes outside them, the inputs."""
    prefixes = tuple(tree.modules[b].fqn + "." for lp in lists for b in lp.positions)
    outside_sig = tuple((pi.fqn, policy.compute_dtype(pi)) for pi in tree.params
                        if not any(n.startswith(prefixes) for n in pi.fqns))
    reps = tuple((lp.fqn, tuple(v for v, _ in lp.reps)) for lp in lists)
    return (request.batch_size, request.seq_len, request.param_dtype, reps, outside_ck, outside_sig,
            request.example_inputs, request.use_cache)


def _compute_dtype(tree: ModelTree, param_dtype) -> str:
    """The dtype the step's matmuls and attention run in: the mixed-precision ``param_dtype``, else
    the dtype holding most of the floating parameters."""
    if param_dtype is not None:
        return str(param_dtype).replace("torch.", "")
    sizes: dict[str, int] = {}
    for p in tree.params:
        if p.dtype.is_floating_point:
            key = str(p.dtype).replace("torch.", "")
            sizes[key] = sizes.get(key, 0) + p.numel
    return max(sizes, key=sizes.get) if sizes else "float32"


def _assumptions(moe, attention: tuple[str, ...], model=None, dtype: str = "float32") -> tuple[str, ...]:
    out = []
    impl = getattr(hf_config(model), "_attn_implementation", None)
    if impl:  # what transformers picked for the class (Gemma-2: eager) unless the user chose
        out.append(f"attention implementation: {impl} (the model's config._attn_implementation; choose another "
                   "with sv.load_model(..., attn_implementation=...) or --attn-implementation)")
    if moe:
        top = moe[1] if moe[1] else "top_k"
        out.append(f"MoE: balanced routing, each of {moe[0]} experts gets tokens*{top}/{moe[0]} rows "
                   "where the model's code sizes by routing (nonzero/where)")
    if attention:  # what the GPU runs, not the CPU op measured (kernels.py: the table and its source)
        out.append(attention_note(attention, dtype))
    return tuple(out)


_CACHE_NOTE = {False: (), True: ("use_cache=True: the key/value cache the forward builds is counted, "
                                  "each block's from its forward to the cache's death",)}


def _profile(tree: ModelTree, request: _Request, listed, lists, measurement: Measurement, moe):
    """The full model's profile from a measurement of its copy."""
    # pure Python at 70B (tenths of a second, its stages tens of ms each): the Inspector's next edit
    # stops it between them (nothing shared is written before the profile is returned)
    stop.check()
    timeline = splice(measurement.events, lists, measurement.kv_release)
    stop.check()
    idx = event_index(timeline)
    ends = last_in_subtree(idx)
    stop.check()
    modules, peak = module_stats(timeline, idx, ends, set(request.checkpoint), block_saved(measurement.events, lists))
    stop.check()
    flops, costs = module_sums(timeline, ends)
    stop.check()
    pdt = request.param_dtype
    return ActivationProfile(
        batch_size=request.batch_size, seq_len=request.seq_len,
        param_dtype=str(pdt).replace("torch.", "") if pdt else None,
        peak=peak, modules=modules, blocks=[tree.modules[b].fqn for b in listed], timeline=timeline,
        attention=measurement.attention, assumptions=_assumptions(moe, measurement.attention, tree.model, _compute_dtype(tree, pdt)) + _CACHE_NOTE[request.use_cache],
        measured_blocks=sum(len(lp.reps) for lp in lists), module_flops=flops, module_costs=costs,
        _types={m.fqn: m.type_name for m in tree.modules}, _depths={m.fqn: m.depth for m in tree.modules},
    )


def _measure(model: nn.Module, entry: ModelEntry, request: _Request, *, reduce: bool) -> ActivationProfile:
    """The profile, on a copy with one block per kind (``reduce``) or on the whole model. A
    measurement of the same copy is reused: toggling whole-block checkpointing of any block but
    the first runs nothing."""
    tree = entry.tree
    policy = DtypePolicy(tree, request.param_dtype, request.whole)
    listed = find_blocks(tree)  # the repeated blocks, reported either way
    # a step that keeps a key/value cache runs only the variants the model has (kvcache: a
    # checkpointed copy keeps the cache alive, which a plan without checkpointing does not)
    lists = plan_lists(tree, listed if reduce else [], policy.compute_dtype, request.policies,
                       toggles=not request.use_cache)
    outside_ck = _outside_checkpoint(lists, tree, request.policies)
    key = _measurement_key(tree, request, lists, outside_ck, policy)
    moe = moe_shape(model)
    measurement = recall(entry.measurements, key)
    if measurement is None:  # one step at a time in this process; the same step waited for, not run twice
        measurement = one_step(key, entry.measurements, lambda: measure_once(
            key, lambda: measure_copy(model, tree, lists, policy.param_dtype_of, outside_ck, request, moe)))
    return _profile(tree, request, listed, lists, measurement, moe)


def _cache_hint(request: _Request) -> str:
    """Why a step with the cache and checkpointing may fail in torch itself (issue 20)."""
    if not (request.use_cache and request.checkpoint):
        return ""
    return ("; the step keeps the config's key/value cache (use_cache=True) with checkpointed modules, whose "
            "recomputation appends to it again: many models' real step fails so too, set "
            "model.config.use_cache = False for training")


def _measure_some_copy(model: nn.Module, entry: ModelEntry, request: _Request) -> ActivationProfile:
    """On the reduced copy; when it cannot run (a forward that indexes per-layer lists by position,
    hybrid layer types, ...), on a fake copy of the whole model, which the assumptions then say."""
    with _quiet_fake_tensor_log():
        return _measure_either_copy(model, entry, request)


@contextmanager
def _quiet_fake_tensor_log():
    """FakeTensorMode logs every op that fails with its traceback (``log.exception``) before it
    raises; the failure is ours to report (a step torch cannot run), in one line, not its log."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    disabled, logger.disabled = logger.disabled, True
    try:
        yield
    finally:
        logger.disabled = disabled


def _measure_either_copy(model: nn.Module, entry: ModelEntry, request: _Request) -> ActivationProfile:
    name = model_name(entry.tree)  # the model as every surface names it, not its peft wrapper
    try:
        return _measure(model, entry, request, reduce=True)
    except RecomputationError as exc:
        if request.use_cache:  # the cache's second append: the whole model fails the same way, slower
            raise _recomputation_fails(name, request, exc) from exc.cause
        first = exc
    except Exception as exc:  # noqa: BLE001 - the reduced copy failed: measure the whole model
        first = exc
    try:
        profile = _measure(model, entry, request, reduce=False)
    except RecomputationError as exc:
        raise _recomputation_fails(name, request, exc) from exc.cause
    except Exception as exc:  # noqa: BLE001
        raise ValueError(
            f"the activations of {name} could not be measured at batch {request.batch_size} x "
            f"{request.seq_len}: {type(first).__name__}: {str(first)[:300]}; pass Training(example_inputs=...) "
            f"with inputs its forward accepts, or batch_size=None for the model state alone{_cache_hint(request)}"
        ) from exc
    note = f"measured on the whole model: the one-block-per-kind copy failed ({type(first).__name__}: {str(first)[:120]})"
    return profile.with_note(note)


def _recomputation_fails(name: str, request: _Request, exc: RecomputationError) -> ValueError:
    fix = ("run the step with use_cache=False (Training(use_cache=False), as Hugging Face's own gradient "
           "checkpointing does in training) or leave" if request.use_cache else "leave")
    return ValueError(
        f"the activations of {name} could not be measured at batch {request.batch_size} x "
        f"{request.seq_len}: torch's own step fails: recomputing the checkpointed {exc.module} in backward "
        f"raises {exc}. Its forward does not run the same way twice (it changes state its first run left, "
        f"e.g. a key/value cache it appends to), so checkpoint_wrapper cannot recompute it: {fix} "
        f"{exc.module} (and the blocks of its kind) unwrapped")


def measure_activations(model: nn.Module, batch_size: int = 1, seq_len: int = 2048, *,
                        param_dtype=None, whole_params=(), checkpoint=(), example_inputs=None,
                        tree: ModelTree | None = None, use_cache: bool | None = None) -> ActivationProfile:
    """Measure the activation memory of one training step of ``model`` (see the package docstring).

    model: the user's module (meta or real; never modified).
    batch_size, seq_len: the step's input shape (``input_ids`` of (batch_size, seq_len)).
    param_dtype: the dtype FSDP computes sharded parameters in (``MixedPrecisionPolicy.param_dtype``,
        e.g. ``"bfloat16"``); None keeps every parameter's own dtype.
    whole_params: FQNs of parameters FSDP does not manage (ignored or unmanaged): they keep their
        own dtype whatever ``param_dtype`` says.
    checkpoint: FQNs of modules wrapped in ``checkpoint_wrapper`` (full activation checkpointing),
        or a mapping FQN -> ``"full"`` | ``"selective"`` (a ``Plan.checkpoint``): selective wraps
        with the exported policy (``export_runtime._selective_checkpoint_context``, torchtitan's
        "selective op").
    example_inputs: for models that are not Hugging Face ones, ``(batch, seq) -> (args, kwargs)``.
    tree: the ``ModelTree`` of ``model`` if the caller has one (saves walking a big model).
    use_cache: the ``use_cache`` a Hugging Face model's step passes; None: its config's (the step the
        user runs: with ``use_cache=True`` the forward also keeps a key/value cache of every layer).

    On a copy with one block per kind, else on a fake copy of the whole model (slower, no
    extrapolation), which the profile's ``assumptions`` then say; when neither runs, a ValueError
    names the model and torch's error. Cached: the same model, shapes, dtypes and checkpointing
    cost nothing the second time.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"measure_activations needs the nn.Module, got {type(model).__name__}")
    if example_inputs is None and hf_config(model) is None:
        raise ValueError("not a Hugging Face model: pass example_inputs=(batch, seq) -> (args, kwargs)")
    if use_cache is None:
        use_cache = config_use_cache(model) if example_inputs is None else False
    request = _request(batch_size, seq_len, param_dtype, whole_params, checkpoint, example_inputs, use_cache)
    entry = entry_of(model, tree)
    profile = recall(entry.profiles, request)
    if isinstance(profile, _Failed):  # the same step failed before: fail again at once
        raise ValueError(profile.message)
    if profile is None:
        _check_checkpoint(request.checkpoint, entry.tree)
        try:
            profile = _measure_some_copy(model, entry, request)
        except ValueError as exc:  # remembered: a search tries the same step on many meshes
            remember(entry.profiles, request, _Failed(str(exc)))
            raise
        remember(entry.profiles, request, profile)
    return profile


@dataclasses.dataclass(frozen=True)
class _Failed:
    """A step that could not be measured, remembered with the error's words."""

    message: str


# ---------------------------------------------------------------------------
# The run order alone, from a forward
# ---------------------------------------------------------------------------
# The order a step first runs the modules in, read from a forward alone.
#
# ``Analysis.run_order`` (the walk order of a plan without activations) needs only the modules' first
# pre-forward events, all of which fire in the forward: the backward fires none (no module is
# checkpointed here, so nothing is recomputed). So the step is cut after its forward: the same copy
# (``reduced.build_copy``), the same recorder and FLOP counter (their levels and routing answers decide
# which events ``splice`` keeps), the same inputs, no loss and no backward. Order of the attempts:
#
# 1. a step of this request already measured (an analysis with activations): its order;
# 2. the reduced copy with the config's ``use_cache``: the order a whole step would give;
# 3. the reduced copy without the cache, when the cache's step cannot run on it (Zamba's hybrid
#    cache): the modules a forward enters do not depend on the cache (``tests/test_run_order.py``
#    holds it against the whole model's step with the cache);
# 4. the whole model with the config's ``use_cache`` (slow: every block runs).


def _forward_events(model, tree, lists, request, moe) -> tuple[list, object]:
    """The recorder's events of the copy's forward (``measure.measure_copy`` without the backward),
    and the key/value cache's release it saw."""
    from torch._subclasses import FakeTensorMode

    from .recorder import Recorder

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    policy = DtypePolicy(tree, None, frozenset())
    reduced, keys, block_keys = build_copy(model, tree, lists, policy.param_dtype_of, frozenset(), fake_mode)
    counter = flop_counter(balanced_routing(moe))
    recorder = Recorder(keys, block_keys, counter)
    handles = recorder.track_params(reduced)
    try:
        with fake_mode, recorder.kv.routing(recorder.winfos_of):
            with counter, recorder, hf_plain_batches(), fake_friendly(recorder):
                out = _forward(reduced, request)
                del out
                recorder.finish()
    finally:
        for h in handles:
            h.remove()
    return recorder.events, recorder.kv.release


def _order_of(model, tree, request, reduce: bool, toggles: bool) -> tuple[str, ...]:
    policy = DtypePolicy(tree, None, frozenset())
    lists = plan_lists(tree, find_blocks(tree) if reduce else [], policy.compute_dtype, request.policies, toggles)
    events, release = one_step(("run order", request, reduce, toggles), None,
                               lambda: _forward_events(model, tree, lists, request, moe_shape(model)))
    timeline = splice(events, lists, release)
    return tuple(dict.fromkeys(key for kind, key in zip(timeline.kinds, timeline.keys) if kind == "pre_fw"))


def _attempts(request) -> list[tuple]:
    """(request, reduce, toggles) in the order they are tried (the module docstring's 2-4): the copy
    a step of the request runs (``measure._measure``), then one without the cache holding only the
    plan's variants (no checkpointed copies to toggle to: nothing else enters the order)."""
    tries = [(request, True, not request.use_cache)]
    if request.use_cache:
        plain = _request(request.batch_size, request.seq_len, None, (), (), request.example_inputs, False)
        tries.append((plain, True, False))
    return tries + [(request, False, not request.use_cache)]


def read_run_order(model, seq_len: int, *, example_inputs=None, tree=None) -> tuple[str, ...]:
    """Module names in the order a step of batch 1 x ``seq_len`` first runs them (what
    ``measure_activations(model, 1, seq_len, ...).run_order`` says), read from a forward alone;
    kept per model. Raises what the last attempt raised when no forward runs."""
    if example_inputs is None and hf_config(model) is None:
        raise ValueError("not a Hugging Face model: pass example_inputs=(batch, seq) -> (args, kwargs)")
    use_cache = config_use_cache(model) if example_inputs is None else False
    request = _request(1, seq_len, None, (), (), example_inputs, use_cache)
    entry = entry_of(model, tree)
    profile, order = peek(entry.profiles, request), peek(entry.orders, request)
    if order is None and profile is not None and hasattr(profile, "run_order"):
        order = profile.run_order
    if order is not None:
        return order
    error: Exception | None = None
    with _quiet_fake_tensor_log():
        for attempt, reduce, toggles in _attempts(request):
            try:
                order = _order_of(model, entry.tree, attempt, reduce, toggles)
                break
            except Exception as exc:  # noqa: BLE001 - the next attempt, or raised below
                error = exc
    if order is None:
        raise ValueError(f"no forward of {type(model).__name__} runs: {type(error).__name__}: {str(error)[:300]}")
    remember(entry.orders, request, order)
    return order
