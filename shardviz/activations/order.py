"""The order a step first runs the modules in, read from a forward alone.

``Analysis.run_order`` (the walk order of a plan without activations) needs only the modules' first
pre-forward events, all of which fire in the forward: the backward fires none (no module is
checkpointed here, so nothing is recomputed). So the step is cut after its forward: the same copy
(``reduced.build_copy``), the same recorder and FLOP counter (their levels and routing answers decide
which events ``splice`` keeps), the same inputs, no loss and no backward. Order of the attempts:

1. a step of this request already measured (an analysis with activations): its order;
2. the reduced copy with the config's ``use_cache``: the order a whole step would give;
3. the reduced copy without the cache, when the cache's step cannot run on it (Zamba's hybrid
   cache): the modules a forward enters do not depend on the cache (``tests/test_order.py``
   holds it against the whole model's step with the cache);
4. the whole model with the config's ``use_cache`` (slow: every block runs).
"""

from __future__ import annotations

from .flops import flop_counter
from .measure import (_entry, _forward, _quiet_fake_tensor_log, _remember, _request, _DtypePolicy, _LOCK,
                      config_use_cache, hf_config)
from .patches import balanced_routing, fake_friendly, hf_plain_batches, moe_shape
from .reduced import build_copy, plan_lists
from .splice import splice
from ..presets import find_blocks


def _forward_events(model, tree, lists, request, moe) -> tuple[list, object]:
    """The recorder's events of the copy's forward (``measure.measure_copy`` without the backward),
    and the key/value cache's release it saw."""
    from torch._subclasses import FakeTensorMode

    from .recorder import Recorder

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    policy = _DtypePolicy(tree, None, frozenset())
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
    policy = _DtypePolicy(tree, None, frozenset())
    lists = plan_lists(tree, find_blocks(tree) if reduce else [], policy.compute_dtype, request.policies, toggles)
    events, release = _forward_events(model, tree, lists, request, moe_shape(model))
    timeline = splice(events, lists, release)
    return tuple(dict.fromkeys(e.key for e in timeline if e.kind == "pre_fw"))


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
    entry = _entry(model, tree)
    with _LOCK:
        profile = entry.profiles.get(request)
        order = entry.orders.get(request)
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
    _remember(entry.orders, request, order)
    return order
