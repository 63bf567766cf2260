"""The results: the step's timeline of events, the numbers around each module and where the step
peaks (read off the full model's timeline: ``event_index``, ``module_stats``), the profile."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import NamedTuple

from . import stop
from .opcost import frozen

WRAPPED = "_checkpoint_wrapped_module"


def strip_wrapper(fqn: str) -> str:
    """``fqn`` without ``checkpoint_wrapper``'s inner name: the module as the user's model names it."""
    if WRAPPED not in fqn:
        return fqn
    return ".".join(p for p in fqn.split(".") if p != WRAPPED)


class ModuleEvent(NamedTuple):
    """One module event of the step.

    kind: pre_fw, post_fw, pre_bw, post_bw, pre_rc/post_rc (forward recomputed in backward by
        checkpointing), gap (a block's inputs released after its forward).
    key: the module: its FQN in the full model's timeline; in the reduced copy's, a FQN outside the
        block lists or ``(list index, representative index, path inside the block)``.
    phase: ``"fw"`` or ``"bw"``.
    level: activation bytes alive at the event (a change of level while splicing).
    peak: highest level since the previous event (a change against the previous level while splicing).
    flops: FLOPs of the operations since the previous event (``FlopCounterMode``'s count).
    cost: those operations' FLOPs, bytes and kernels in ``opcost`` buckets (None: none ran).
    """

    kind: str
    key: object
    phase: str
    level: int
    peak: int
    flops: int = 0
    cost: dict | None = None


class Timeline(Sequence):
    """A profile's events kept as one tuple per field: read like a list of ``ModuleEvent``s.

    Why columns: a profile is kept for the plans analysed on it, and an Inspector session keeps a
    hundred or more (each edit and its look-ahead measure some). As lists of named tuples, 70B's
    13k events each were a million objects every full collection of the cyclic collector walked
    (0.5-1 s that no edit could interrupt). Tuples of strings, ints and ``opcost.frozen`` costs are
    objects the collector stops tracking once it has seen them (a dict inside would keep them tracked)."""

    __slots__ = ("kinds", "keys", "phases", "levels", "peaks", "flops", "costs")

    def __init__(self, kinds, keys, phases, levels, peaks, flops, costs):
        """Seven equal-length columns (``splice`` builds them): no event made."""
        self.kinds, self.keys, self.phases, self.levels, self.peaks, self.flops = map(
            tuple, (kinds, keys, phases, levels, peaks, flops))
        # each position of a block reuses its representative's cost dicts: one frozen tuple per dict
        # (13k events at 70B, about a thousand distinct costs)
        made: dict[int, tuple | None] = {}
        self.costs = tuple(made[id(c)] if id(c) in made else made.setdefault(id(c), frozen(c)) for c in costs)

    def __len__(self) -> int:
        return len(self.kinds)

    def __getitem__(self, j):
        if isinstance(j, slice):
            return [self[i] for i in range(*j.indices(len(self)))]
        return ModuleEvent(self.kinds[j], self.keys[j], self.phases[j], self.levels[j], self.peaks[j],
                           self.flops[j], self.costs[j])

    def __iter__(self):
        return map(ModuleEvent, self.kinds, self.keys, self.phases, self.levels, self.peaks, self.flops, self.costs)

    def __eq__(self, other) -> bool:
        return list(self) == list(other) if isinstance(other, (Timeline, list)) else NotImplemented

    def __repr__(self) -> str:
        return f"Timeline({len(self)} events)"


class Rows(Mapping):
    """fqn -> a row (``ModuleActivations``, ``flops.ModuleFlops``) of a kept profile, each kept as a
    plain tuple and made into its type when read: objects the collector stops tracking (``Timeline``)."""

    __slots__ = ("_make", "_rows")

    def __init__(self, make, rows: dict[str, tuple]):
        self._make, self._rows = make, rows

    def __getitem__(self, fqn: str):
        return self._make(*self._rows[fqn])

    def __iter__(self):
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def __repr__(self) -> str:
        return f"Rows({self._make.__name__}, {len(self)} modules)"


@dataclass(frozen=True)
class ModuleActivations:
    """Activation bytes (activations + temporaries + step inputs, all ranks alike) around one module
    in the full model's step. ``None`` where the event does not happen (a module never called, a
    backward that never reaches it).

    pre_fw / post_fw: level when the module's forward starts / returns (first call / last call).
    peak_fw: highest level while its forward runs.
    pre_bw: level when its backward starts (the first gradient of one of its outputs is ready).
    peak_bw: highest level during its backward (recomputation of checkpointed modules included).
    post_bw: level when the gradients of all its inputs are computed; ``None`` when none of its
        inputs requires grad (torch then only marks it at the very end of backward).
    saved: bytes its forward leaves allocated until its backward: its saved tensors and outputs,
        less (for the repeated blocks) the inputs released right after it.
    saved_plain / saved_checkpointed: ``saved`` if the module is not / is wrapped in
        ``checkpoint_wrapper``; measured for the repeated blocks (``None`` elsewhere, except that a
        module the plan checkpoints has ``saved_checkpointed == saved``).
    checkpointed: the module is wrapped in ``checkpoint_wrapper`` in this measurement.
    """

    fqn: str
    pre_fw: int | None
    post_fw: int | None
    peak_fw: int | None
    pre_bw: int | None
    peak_bw: int | None
    post_bw: int | None
    saved: int | None
    saved_plain: int | None = None
    saved_checkpointed: int | None = None
    checkpointed: bool = False


_BYTE_COLUMNS = ("saved", "saved_plain", "saved_checkpointed", "pre_fw", "post_fw", "peak_fw",
                 "pre_bw", "peak_bw", "post_bw")


@dataclass
class ActivationProfile:
    """Activation memory of the full model's training step (see the package docstring).

    peak: ``(bytes, phase, module_fqn)``: the highest activation level of the step, whether it
        happens in ``"forward"`` or ``"backward"``, and the innermost module running then
        (``""`` = the root, e.g. the loss).
    timeline: the full model's events (``ModuleEvent``: kind, fqn, phase, level, peak since the previous
        event), in order.
    attention: the attention kernels torch ran (aten op names), e.g.
        ``_scaled_dot_product_flash_attention_for_cpu``.
    assumptions: notes on what the numbers assume (MoE routing, kernels).
    module_flops: fqn -> ``ModuleFlops`` (forward, backward, recompute) of the module's own
        operations, counted by torch's ``FlopCounterMode`` in the same pass (``""``: the root and
        whatever ran outside every module, e.g. the loss).
    """

    batch_size: int
    seq_len: int
    param_dtype: str | None
    peak: tuple[int, str, str]
    modules: Mapping[str, ModuleActivations]  # ``Rows``
    blocks: list[str]
    timeline: Timeline = field(repr=False)
    attention: tuple[str, ...] = ()
    assumptions: tuple[str, ...] = ()
    measured_blocks: int = 0  # block copies the reduced model ran
    module_flops: dict = field(default_factory=dict, repr=False)
    module_costs: dict = field(default_factory=dict, repr=False)  # fqn -> (forward, backward, recompute) opcost
    _types: dict[str, str] = field(default_factory=dict, repr=False)
    _depths: dict[str, int] = field(default_factory=dict, repr=False)

    @property
    def peak_bytes(self) -> int:
        return self.peak[0]

    @property
    def flops(self) -> int:
        """FLOPs of the step (one micro-batch on one rank), recomputation included."""
        return sum(sum(f) for f in self.module_flops.values())

    @property
    def model_flops(self) -> int:
        """FLOPs of the step without the recomputation of checkpointed modules."""
        return sum(f.forward + f.backward for f in self.module_flops.values())

    def with_note(self, note: str) -> "ActivationProfile":
        """The profile with ``note`` added to its assumptions. One copy per note, kept with this
        profile: every plan analysed on it gets the same copy, so what a plan reads of it
        (``run_order``, ``flop_index``, ``cost_index``) is derived once, not once per plan."""
        noted = self._noted.get(note)
        if noted is None:
            noted = self._noted[note] = replace(self, assumptions=self.assumptions + (note,))
        return noted

    @cached_property
    def _noted(self) -> dict[str, "ActivationProfile"]:
        return {}

    @cached_property
    def unit_sums(self) -> dict:
        """(what, the calls' names and modules) -> the per-call sums ``flops.unit_flops`` and
        ``flops.op_costs_per_call`` made of this profile: a plan with the same calls reads them again."""
        return {}

    @cached_property
    def run_order(self) -> tuple[str, ...]:
        """Module names in the order the step first entered them (its ``pre_fw`` events): once per
        profile, every plan analysed with it reads the same order (``step.walk``)."""
        tl = self.timeline
        return tuple(dict.fromkeys(key for kind, key in zip(tl.kinds, tl.keys) if kind == "pre_fw"))

    @cached_property
    def flop_index(self):
        """``flops.FlopIndex``: FLOPs per subtree and each module's first forward, for every plan."""
        from .flops import flop_index

        return flop_index(self)

    @cached_property
    def cost_index(self) -> dict:
        """``flops.cost_subtrees``: the ``opcost`` costs per subtree, for every plan."""
        from .flops import cost_subtrees

        return cost_subtrees(self)

    def at(self, fqn: str) -> ModuleActivations:
        """The numbers around module ``fqn`` (``""`` = the root); KeyError if it never ran."""
        fqn = strip_wrapper(fqn)
        if fqn not in self.modules:
            raise KeyError(f"module {fqn!r} did not run in the measured step")
        return self.modules[fqn]

    def table(self, modules=None):
        """A pandas DataFrame, one row per module: the root, every block, the modules outside the
        blocks no deeper than them (embeddings, final norm, head), or the given ``modules`` FQNs
        (e.g. a plan's units; a list entry stands for a group, reported by its first module)."""
        import pandas as pd

        names = self._default_rows() if modules is None else [_first_fqn(m) for m in modules]
        blocks = set(self.blocks)
        rows = []
        for f in names:
            a = self.modules.get(f)
            row = {"fqn": f, "type": self._types.get(f, ""), "block": f in blocks}
            for k in ("checkpointed",) + _BYTE_COLUMNS:
                row[k] = getattr(a, k) if a is not None else None
            rows.append(row)
        df = pd.DataFrame(rows)
        for k in _BYTE_COLUMNS:
            if k in df:
                df[k] = df[k].astype("Int64")
        return df

    def _default_rows(self) -> list[str]:
        """The root, the blocks, and the modules outside them no deeper than they are."""
        block_depth = max((self._depths.get(b, 1) for b in self.blocks), default=1)
        in_block = tuple(b + "." for b in self.blocks)
        return [f for f in self.modules if f == "" or f in self.blocks
                or (self._depths.get(f, 99) <= block_depth and not f.startswith(in_block)
                    and self._types.get(f) != "ModuleList")]


def _first_fqn(m) -> str:
    """A table row's module: an ``sv.Unit``'s modules, a group's first module, or the FQN itself."""
    m = getattr(m, "modules", m)
    if isinstance(m, (list, tuple)):
        m = m[0] if m else ""
    return strip_wrapper(m)


# ---------------------------------------------------------------------------
# The numbers around each module, read off the full model's timeline
# ---------------------------------------------------------------------------
def event_index(timeline: Timeline) -> dict[str, dict[str, int]]:
    """fqn -> {event kind: index} (first pre-forward/backward, last post-forward/backward/gap) and
    ``"last"``: the module's last event."""
    idx: dict[str, dict[str, int]] = {}
    for j, (kind, key) in enumerate(zip(timeline.kinds, timeline.keys)):
        d = idx.get(key)
        if d is None:
            d = idx[key] = {}
        if kind == "pre_fw" or kind == "pre_bw":
            if kind not in d:
                d[kind] = j
        elif kind == "post_fw" or kind == "post_bw" or kind == "gap":
            d[kind] = j
        d["last"] = j
    return idx


def last_in_subtree(idx: dict[str, dict[str, int]]) -> dict[str, int]:
    """fqn -> the last event of its subtree: the end of a module's backward when torch never marks it."""
    out: dict[str, int] = {}
    for fqn, d in idx.items():
        last, anc = d["last"], fqn
        # up to the first ancestor that has a later event: every ancestor above it has one too
        while out.get(anc, -1) < last:
            out[anc] = last
            if not anc:
                break
            anc = anc.rpartition(".")[0]
    return out


def module_spans(idx, ends) -> list[tuple[int, int, str]]:
    """(first event, last event, fqn) of every module's forward and of its backward."""
    spans = []
    for fqn, d in idx.items():
        if "pre_fw" in d and "post_fw" in d:
            spans.append((d["pre_fw"], d["post_fw"], fqn))
        if "pre_bw" in d:
            spans.append((d["pre_bw"], backward_end(fqn, d, ends), fqn))
    return spans


def backward_end(fqn: str, d: dict[str, int], ends: dict[str, int]) -> int:
    return d["post_bw"] if "post_bw" in d else ends.get(fqn, d["pre_bw"])


class _Levels:
    """The timeline's levels and peaks as arrays, and the highest level over a span of events."""

    def __init__(self, timeline: Timeline):
        import numpy as np

        self.levels = np.array(timeline.levels, dtype=np.int64)
        self.peaks = np.array(timeline.peaks, dtype=np.int64)

    def at(self, j: int | None) -> int | None:
        return int(self.levels[j]) if j is not None else None

    def span_max(self, a: int, b: int) -> int | None:
        """Highest level from event a (its level, not the peak before it) to event b."""
        if b < a:
            return None
        top = int(self.levels[a])
        return max(top, int(self.peaks[a + 1:b + 1].max())) if b > a else top


def _module_row(fqn, d, lv: _Levels, ends, checkpointed, block_saved) -> tuple:
    """``ModuleActivations``'s fields, in order."""
    pf, qf, pb = d.get("pre_fw"), d.get("post_fw"), d.get("pre_bw")
    pre_fw, post_fw = lv.at(pf), lv.at(qf)
    peak_fw = lv.span_max(pf, qf) if pf is not None and qf is not None else None
    peak_bw = lv.span_max(pb, backward_end(fqn, d, ends)) if pb is not None else None
    saved = None
    if pre_fw is not None and post_fw is not None:
        g = d.get("gap")  # a block: its inputs released after it count against it
        saved = (lv.at(g) if g is not None and g > qf else post_fw) - pre_fw
    plain, ckpt = block_saved.get(fqn, (None, None))
    is_ck = fqn in checkpointed
    if is_ck and ckpt is None:
        ckpt = saved
    return (fqn, pre_fw, post_fw, peak_fw, lv.at(pb), peak_bw, lv.at(d.get("post_bw")), saved, plain, ckpt, is_ck)


def module_stats(timeline: Timeline, idx, ends, checkpointed: set[str], block_saved: dict[str, tuple]):
    """(``Rows`` fqn -> ModuleActivations, (peak bytes, phase, innermost module running then)); ``idx``
    and ``ends``: ``event_index`` and ``last_in_subtree`` of the timeline."""
    stop.check()  # pure Python at 70B (tenths of a second): the Inspector's next edit stops it here
    lv = _Levels(timeline)
    out = Rows(ModuleActivations, {fqn: _module_row(fqn, d, lv, ends, checkpointed, block_saved) for fqn, d in idx.items()})
    n = len(timeline)
    if not n:
        return out, (0, "forward", "")
    j = int(lv.peaks.argmax())
    phase = "backward" if timeline.phases[j] == "bw" else "forward"
    return out, (int(lv.peaks[j]), phase, innermost(module_spans(idx, ends), j))


def innermost(spans, j: int) -> str:
    """The innermost module running between events j-1 and j (``""``: the root)."""
    best, where = None, ""
    for a, b, fqn in spans:
        if a <= max(j - 1, 0) and j <= b and (best is None or b - a < best):
            best, where = b - a, fqn
    return where
