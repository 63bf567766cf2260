"""Which candidates cannot fit, told without analysing them, each with its ``Rule`` (``pruned_by``).

A candidate is pruned when one that holds no more than it is already over the device:

- the model state alone (parameters, gradients, optimizer states, FSDP buffers: ``analyze``
  without a batch) with the leanest options is over: activations are never measured for it;
- its activations alone, measured (or bounded from below by another checkpointing's
  measurement, ``_bound_others``) on the same layout and micro-batch, are over;
- the same plan checkpointing more blocks (or a smaller micro-batch, or without the key/value
  cache) is over: more activations are alive at every moment;
- the same plan on fewer replicas (larger shard groups) is over: more replicas hold more per rank;
- without resharding after forward (or resharding to k ranks), the calls' unsharded parameters
  (or 1/k of them), all alive when forward ends, are over;
- (``running.run``) a smaller micro-batch fits with no plan.

And a CPU-offloaded plan whose twin without offload fits is not analysed: it fits, and is slower.

What was analysed so far is the ``Evidence``; ``pruning_order`` sorts the candidates so that every
candidate that could prune another comes first: the pruned set is the same whatever order the
candidates are given in.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

from ..format import format_bytes
from ..checkpointing import FULL
from ..plan import LORA_OPTIONS
from .candidates import CHECKPOINTS, Candidate
from .rows import Measured, Pruned, Rule
from .space import Space

_CACHE_ORDER = {False: 0, None: 1, True: 2}  # without the cache first: it holds less
_RESHARD_ORDER = {None: 0, False: 1}  # then resharding to k ranks


def pruning_order(cands: list[Candidate]) -> list[Candidate]:
    """``cands`` with every candidate that holds less before those it can prune: smaller
    micro-batch, more checkpointing, without the cache, fewer replicas, no offload first (then the
    layout, the tensor degree and the reshard, in the order ``candidates`` makes them)."""
    def key(c: Candidate) -> tuple:
        return (*activation_level(c), LORA_OPTIONS.index(c.lora), c.tensor, c.replicate,
                _RESHARD_ORDER.get(c.reshard_after_forward, 2), c.quant == "replicated", c.offload)
    return sorted(cands, key=key)


def activation_level(c: Candidate) -> tuple:
    """Where ``c`` stands in ``pruning_order`` by the activations it holds (micro-batch, checkpointing,
    the cache): within one level, candidates of different LoRA layouts or tensor degrees prune none
    of each other (``Evidence`` is kept per layout and degree)."""
    return (c.batch_size or 0, CHECKPOINTS.index(c.checkpoint), _CACHE_ORDER[c.use_cache])


@dataclass
class Evidence:
    """What the analyses so far proved, and the floors computed on the way: the only state of a run.
    ``record`` adds an analysis; ``pruned_by`` reads it."""

    over: dict = field(default_factory=dict)  # (state key, batch, checkpoint, cache) -> judged peak over the device
    activations: dict = field(default_factory=dict)  # ((lora, tensor), batch, ckpt, cache) -> (bytes, how) over
    fitting: dict = field(default_factory=dict)  # analysed candidate -> fits
    state: dict = field(default_factory=dict)  # (lora, tensor, quant) -> model-state peak with the leanest options
    unsharded: dict = field(default_factory=dict)  # (lora, tensor, quant) -> cost.unsharded_bytes of its calls
    holds_less: dict = field(default_factory=dict)  # (strong, weak) checkpointing -> holds_less

    @property
    def n_analysed(self) -> int:
        """The analyses made for the floors: the model-state ones (``unsharded`` reads only the
        layout of its analysis, no memory table: not counted)."""
        return len(self.state)


def record(space: Space, ev: Evidence, row: Measured, profile) -> None:
    """Keep what the analysed ``row`` (and its activation ``profile``) proves about the others."""
    c = row.candidate
    ev.fitting[c] = row.fits
    if not row.fits and row.margin < 0:  # over the device (a plan over only the host proves nothing of the device)
        ev.over[(c.state_key, c.batch_size, c.checkpoint, row.use_cache)] = space.limit - row.margin
    if profile is None:
        return
    if profile.peak[0] > space.limit:
        ev.activations[((c.lora, c.tensor), c.batch_size, c.checkpoint, row.use_cache)] = (int(profile.peak[0]), "measured")
    _bound_others(space, ev, c, profile)


def pruned_by(space: Space, ev: Evidence, c: Candidate) -> Pruned | None:
    """Why ``c`` need not be analysed, or None."""
    if c.offload and ev.fitting.get(replace(c, offload=False)):
        return Pruned(c, Rule.OFFLOAD_NEEDLESS, "fits, slower than the same plan without CPU offload, which fits too: "
                      "offloading only lowers the peak and adds host-device copies (not analysed)", fits=True)
    return _over_by_evidence(space, ev, c) or _state_over(space, ev, c) or _unsharded_over(space, ev, c)


def _over_by_evidence(space: Space, ev: Evidence, c: Candidate) -> Pruned | None:
    """``c`` holds no less than a plan analysed (or bounded) over the device."""
    gib, less = space.usable_text, "(checkpoints less: not analysed)"
    cache = space.cache_of(c)
    act = ev.activations.get(((c.lora, c.tensor), c.batch_size, c.checkpoint, cache))
    if act is not None:  # the same activations whatever the mesh and options
        return Pruned(c, Rule.ACTIVATIONS, f"over {gib}: the activations alone are {format_bytes(act[0])} "
                      f"({act[1]}; not analysed)")
    for (lora, batch, ckpt, cached), (act, how) in ev.activations.items():
        if lora == (c.lora, c.tensor) and _holds_less_than(space, ev, c, batch, ckpt, cached):
            return Pruned(c, Rule.ACTIVATIONS, f"over {gib}: the activations alone are {format_bytes(act)} with "
                          f"{ckpt_words(ckpt)}, micro-batch {batch} ({how}) {less}")
    for (state, batch, ckpt, cached), peak in ev.over.items():
        if state == c.state_key and _holds_less_than(space, ev, c, batch, ckpt, cached):
            return Pruned(c, Rule.CHECKPOINTS_LESS, f"over {gib}: {format_bytes(peak)} with {ckpt_words(ckpt)}, "
                          f"micro-batch {batch} {less}")
        if _fewer_replicas(state, c) and (batch, ckpt, cached) == (c.batch_size, c.checkpoint, cache):
            return Pruned(c, Rule.MORE_REPLICAS, f"over {gib}: {format_bytes(peak)} with {state[2]} replicas already; "
                          "more replicas shard each copy over fewer ranks, so every rank holds more (not analysed)")
    return None


def _state_over(space: Space, ev: Evidence, c: Candidate) -> Pruned | None:
    """The model-state peak (no activations) of ``c``'s layout with the options that hold least."""
    key = (c.lora, c.tensor, c.quant)
    if key not in ev.state:  # an analysis of this run (counted), made once per space
        ev.state[key] = space.state_peak(c)
    if ev.state[key] <= space.limit:
        return None
    return Pruned(c, Rule.MODEL_STATE, f"over {space.usable_text}: the model state alone is "
                  f"{format_bytes(ev.state[key])} with the leanest options (activations not measured)")


def _unsharded_over(space: Space, ev: Evidence, c: Candidate) -> Pruned | None:
    """Without resharding after forward (or resharding to k ranks), every call keeps its
    unsharded parameters (or 1/k of them) from its forward to its backward: all are alive when
    forward ends (``cost.unsharded_bytes``)."""
    if c.reshard_after_forward is None or c.reshard_after_forward is True:
        return None
    key = (c.lora, c.tensor, c.quant)
    if key not in ev.unsharded:
        ev.unsharded[key] = space.unsharded(c)
    kept = ev.unsharded[key] // (1 if c.reshard_after_forward is False else c.reshard_after_forward)
    if kept <= space.limit:
        return None
    how = "no reshard after forward" if c.reshard_after_forward is False else f"resharding to {c.reshard_after_forward} ranks after forward"
    return Pruned(c, Rule.UNSHARDED_KEPT, f"over {space.usable_text}: with {how}, the calls' unsharded parameters "
                  f"alone are {format_bytes(kept)} when forward ends (not analysed)")


def _fewer_replicas(state: tuple, c: Candidate) -> bool:
    """``state`` (a state key) is ``c``'s plan on fewer replicas of larger shard groups: its
    sharded parameters, gradients and optimizer states per rank are a fraction of ``c``'s."""
    lora, reshard, replicate, offload, tensor, quant = state
    return (lora, reshard, offload, tensor, quant) == (c.lora, c.reshard_after_forward, c.offload, c.tensor, c.quant) \
        and replicate < c.replicate \
        and c.replicate % replicate == 0


def _holds_less_than(space: Space, ev: Evidence, c: Candidate, batch: int | None, ckpt: str | None,
                     cache: bool) -> bool:
    """A plan with micro-batch ``batch``, checkpointing ``ckpt`` and the cache kept or not holds no
    more activations than ``c`` (a step without the cache holds less than one with it)."""
    if (batch or 0) > (c.batch_size or 0) or (cache and not space.cache_of(c)):
        return False
    return ckpt == c.checkpoint or _holds_less(space, ev, ckpt, c.checkpoint)


def _holds_less(space: Space, ev: Evidence, strong: str | None, weak: str | None) -> bool:
    """Plans checkpointed as ``strong`` hold fewer activations than as ``weak``: every block
    ``weak`` checkpoints is checkpointed by ``strong`` at least as fully (fewer at every moment),
    or both checkpoint in full and ``strong`` checkpoints at least as many blocks of each kind
    (blocks of one kind save the same bytes: fewer are alive when backward starts, where the
    activations peak)."""
    if (strong, weak) not in ev.holds_less:
        ev.holds_less[(strong, weak)] = strong != weak and _compare_checkpoints(space, strong, weak)
    return ev.holds_less[(strong, weak)]


def _compare_checkpoints(space: Space, strong: str | None, weak: str | None) -> bool:
    a, b = space.plan(Candidate(checkpoint=strong)).checkpoint, space.plan(Candidate(checkpoint=weak)).checkpoint
    if all(n in a and a.policy(n) in (FULL, p) for n, p in b.items()):
        return True
    if a.selective or b.selective:
        return False
    tree = space.tree
    kinds = lambda ck: Counter(tree.modules[tree.module_index[n]].type_name for n in ck)  # noqa: E731
    ka, kb = kinds(a), kinds(b)
    return all(ka[k] >= n for k, n in kb.items())


def _bound_others(space: Space, ev: Evidence, c: Candidate, profile) -> None:
    """From one measurement, the activations other checkpoint presets save for backward at least:
    every block's saved bytes, plain or checkpointed (``saved_plain`` / ``saved_checkpointed``,
    both measured for the repeated blocks), are all alive when backward starts. A block the step
    never ran (Mllama's cross-attention layers without an image) saves nothing."""
    ran = [b for b in profile.blocks if b in profile.modules]
    rows = [profile.modules[b] for b in ran]
    if any(r.saved_plain is None or r.saved_checkpointed is None for r in rows):
        return
    for ckpt in CHECKPOINTS:
        key = ((c.lora, c.tensor), c.batch_size, ckpt, False)  # measured without the cache: a bound with it too
        if ckpt == c.checkpoint or key in ev.activations:
            continue
        plan = space.plan(Candidate(checkpoint=ckpt)).checkpoint
        if plan.selective:
            continue
        saved = sum(r.saved_checkpointed if b in plan else r.saved_plain for b, r in zip(ran, rows))
        if saved > space.limit:
            ev.activations[key] = (saved, f"at least: every block's saved bytes, measured with {ckpt_words(c.checkpoint)}")


def ckpt_words(checkpoint: str | None) -> str:
    return {None: "no checkpointing", "blocks": "every block checkpointed",
            "selective": "selective checkpointing"}.get(checkpoint, f"checkpoint={checkpoint!r}")
