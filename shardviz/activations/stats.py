"""The numbers around each module, and where the step peaks, read off the full model's timeline."""

from __future__ import annotations

from . import stop
from .profile import ModuleEvent, ModuleActivations


def event_index(timeline: list[ModuleEvent]) -> dict[str, dict[str, int]]:
    """fqn -> {event kind: index} (first pre-forward/backward, last post-forward/backward/gap) and
    ``"last"``: the module's last event."""
    idx: dict[str, dict[str, int]] = {}
    for j, ev in enumerate(timeline):
        d = idx.setdefault(ev.key, {})
        if ev.kind in ("pre_fw", "pre_bw"):
            d.setdefault(ev.kind, j)
        elif ev.kind in ("post_fw", "post_bw", "gap"):
            d[ev.kind] = j
        d["last"] = j
    return idx


def last_in_subtree(idx: dict[str, dict[str, int]]) -> dict[str, int]:
    """fqn -> the last event of its subtree: the end of a module's backward when torch never marks it."""
    out: dict[str, int] = {}
    for fqn, d in idx.items():
        parts = fqn.split(".") if fqn else []
        for k in range(len(parts) + 1):
            anc = ".".join(parts[:k])
            if out.get(anc, -1) < d["last"]:
                out[anc] = d["last"]
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

    def __init__(self, timeline: list[ModuleEvent]):
        import numpy as np

        n = len(timeline)
        self.levels = np.fromiter((e.level for e in timeline), dtype=np.int64, count=n)
        self.peaks = np.fromiter((e.peak for e in timeline), dtype=np.int64, count=n)

    def at(self, j: int | None) -> int | None:
        return int(self.levels[j]) if j is not None else None

    def span_max(self, a: int, b: int) -> int | None:
        """Highest level from event a (its level, not the peak before it) to event b."""
        if b < a:
            return None
        top = int(self.levels[a])
        return max(top, int(self.peaks[a + 1:b + 1].max())) if b > a else top


def _module_row(fqn, d, lv: _Levels, ends, checkpointed, block_saved) -> ModuleActivations:
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
    return ModuleActivations(fqn, pre_fw, post_fw, peak_fw, lv.at(pb), peak_bw, lv.at(d.get("post_bw")), saved,
                             plain, ckpt, is_ck)


def module_stats(timeline: list[ModuleEvent], idx, ends, checkpointed: set[str], block_saved: dict[str, tuple]):
    """({fqn: ModuleActivations}, (peak bytes, phase, innermost module running then)); ``idx``
    and ``ends``: ``event_index`` and ``last_in_subtree`` of the timeline."""
    stop.check()  # pure Python at 70B (tenths of a second): the Inspector's next edit stops it here
    lv = _Levels(timeline)
    out = {fqn: _module_row(fqn, d, lv, ends, checkpointed, block_saved) for fqn, d in idx.items()}
    n = len(timeline)
    if not n:
        return out, (0, "forward", "")
    j = int(lv.peaks.argmax())
    phase = "backward" if timeline[j].phase == "bw" else "forward"
    return out, (int(lv.peaks[j]), phase, innermost(module_spans(idx, ends), j))


def innermost(spans, j: int) -> str:
    """The innermost module running between events j-1 and j (``""``: the root)."""
    best, where = None, ""
    for a, b, fqn in spans:
        if a <= max(j - 1, 0) and j <= b and (best is None or b - a < best):
            best, where = b - a, fqn
    return where
