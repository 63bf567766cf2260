"""The Inspector's "Suggest" panel: ``sv.search`` for the current model, mesh and training, its top
rows as the panel shows them, and one click to apply a row.

Plain functions of ``InspectorState``, whose ``suggest`` and ``apply_suggestion`` call them.
``run_search`` says first how many plans it will try (the panel shows "searching N plans…"
while the search runs), then runs ``sv.search`` on the Inspector's tree. ``suggestion(state, i)``
is row ``i`` as ONE undo step: its plan, and with it the HSDP split and the micro-batch the row
was found with (``Search.candidate``), so that the numbers shown after applying are the row's. Every figure of the panel is formatted here
(``shardviz.format``); the front end only draws the text it is sent.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, replace

from ..activations import stop
from ..format import format_bytes, format_count, format_duration, format_percent, format_plural
from ..plan import Plan
from ..search import Search, count_candidates, search
from .panels import training_text

DEFAULT_TOP = 8
NO_MEMORY = ("Suggest needs the device memory to tell what fits: type it in the device field (e.g. 80GiB), or "
             "give sv.Mesh(..., device='H100') or sv.Mesh(..., device_memory='80GiB').")


def tensor_degrees(mesh) -> tuple[int, ...]:
    """The tensor-parallel degrees the panel searches: none, and the mesh's own when it has one."""
    return tuple(sorted({1, mesh.tensor}))


#: searches kept per Inspector (``InspectorState.searched``): a few meshes and trainings go back and forth
SEARCHES_KEPT = 4


def ahead_key(state) -> tuple:
    """What a search of ``state`` depends on: ``search_key`` and the tensor degrees it tries. Not the
    plan: a search made before plan edits (by the look-ahead, or an earlier click) still answers."""
    return (*search_key(state.mesh, state.training), tensor_degrees(state.mesh))


def search_ahead(state) -> bool:
    """The look-ahead's search (``look_ahead.look_ahead``): the search ``run_search`` would run for
    ``state``, kept for its click, the panel left as it is. Stops at the next edit (``stop.check``
    between candidates). True when a search was run, False when one was kept already or none can run."""
    if state.mesh.device_memory is None or ahead_key(state) in state.searched:
        return False
    _search_and_keep(state, progress=lambda done, total: stop.check())
    return True


def _search_and_keep(state, progress, workers: int = 1) -> FoundPlans:
    """``sv.search`` for the state's model, mesh and training, timed and kept (``state.searched``)."""
    t0 = time.perf_counter()
    mesh, training, key = state.mesh, state.training, ahead_key(state)  # read once: kept under what was searched
    # the rows a search of the same key stopped midway analysed (the look-ahead's, when Suggest is clicked)
    resume = _keep_newest(state.search_parts, key, state.search_parts.get(key, {}))
    found = search(state.tree, mesh, training, tensor=tensor_degrees(mesh), progress=progress, resume=resume,
                   workers=workers)
    state.search_parts.pop(key, None)  # the whole search is kept below
    return _keep_newest(state.searched, key, FoundPlans(found, search_key(mesh, training), time.perf_counter() - t0))


def _keep_newest(table: dict, key, value):
    """``value`` kept under ``key`` as the newest; past ``SEARCHES_KEPT`` the oldest go. Returns ``value``."""
    table.pop(key, None)
    table[key] = value
    while len(table) > SEARCHES_KEPT:
        table.pop(next(iter(table)))
    return value


def search_key(mesh, training) -> tuple:
    """What a search depends on: the mesh (any HSDP x TP split of its world: a row applied keeps
    the suggestions current), the training (with ``global_batch``: any micro-batch; CPU offload
    and the key/value cache are options there)."""
    vary_batch = training.global_batch is not None
    tr = replace(training, offload=False, use_cache=None, **({"batch_size": None, "grad_accum": 1} if vary_batch else {}))
    return replace(mesh, shard=mesh.world, replicate=1, tensor=1), tr


def mesh_words(mesh) -> str:
    """What "HSDP 16x4" means: "16 replicas x 4-rank shard groups" (FSDP: "one shard group of 64 ranks")."""
    if mesh.is_hsdp:
        groups = f"{mesh.shard}-rank shard groups" if mesh.shard > 1 else "no sharding (each rank holds the whole model)"
        return f"{format_plural(mesh.replicate, 'replica')} x {groups}; gradients all-reduced across the replicas"
    return f"one shard group of {format_plural(mesh.shard, 'rank')}"


def _mesh_text(mesh) -> str:
    device = f" of {mesh.device.name}" if mesh.device is not None else ""
    memory = f", {format_bytes(mesh.device_memory)} each" if mesh.device_memory else ", no device memory"
    return f"{mesh}{device}{memory}"


def _batch(tr) -> str:
    return f"{tr.batch_size} x {tr.grad_accum}" if tr.batch_size else "none"


def changes_text(cur_mesh, mesh, cur_tr, tr) -> list[str]:
    """What applying a row changes besides the plan, in words ("HSDP 4x1 (was FSDP 4 ranks)")."""
    out = []
    if (mesh.shard, mesh.replicate, mesh.tensor) != (cur_mesh.shard, cur_mesh.replicate, cur_mesh.tensor):
        out.append(f"mesh {mesh} (was {cur_mesh})")
    if (tr.batch_size, tr.grad_accum) != (cur_tr.batch_size, cur_tr.grad_accum):
        out.append(f"micro-batch x accumulation {_batch(tr)} (was {_batch(cur_tr)})")
    if tr.offload != cur_tr.offload:
        out.append("Training.offload off (the plan's calls offload instead)" if not tr.offload else "Training.offload on")
    return out


@dataclass(frozen=True)
class FoundPlans:
    """The last search the panel ran: what it found, for which mesh and training
    (``search_key``), and how long it took."""

    search: Search
    key: tuple
    seconds: float


def run_search(state, top: int = DEFAULT_TOP) -> Search:
    """Run ``sv.search`` for the state's model, mesh and training; the panel shows its ``top`` rows.

    Raises ``ValueError`` naming what is missing (the device memory) or what the search refused;
    the panel shows the same message (``state.set_suggest_status``)."""
    if int(top) < 1:
        raise ValueError(f"top={top}: show at least 1 plan")
    state.suggest_top = int(top)
    mesh, training = state.mesh, state.training
    ready = state.searched.get(ahead_key(state))  # (none is kept without the device memory)
    if ready is not None:  # searched already (the look-ahead, or a click before plan edits): the same rows
        state.found = ready
        state.set_suggest_status({"state": "done"})
        return ready.search
    try:
        if mesh.device_memory is None:
            raise ValueError(NO_MEMORY)
        n = count_candidates(state.tree, mesh, training, tensor=tensor_degrees(mesh))
    except ValueError as exc:
        state.set_suggest_status({"state": "error", "error": str(exc)})
        raise
    state.set_suggest_status({"state": "running", "n_candidates": n, "done": 0})
    t0 = time.perf_counter()
    shown = [t0]

    def progress(done: int, total: int) -> None:  # at most 5 updates a second: the panel's count moves
        stop.check()  # "cancel" or a new edit stops the search between candidates (activations.stop)
        now = time.perf_counter()
        if now - shown[0] >= 0.2:
            shown[0] = now
            state.set_suggest_status({"state": "running", "n_candidates": total, "done": done,
                                      "elapsed_s": round(now - t0, 1)})

    try:
        state.found = _search_and_keep(state, progress, workers=2)  # on two cores (search.running)
    except Exception as exc:
        state.set_suggest_status({"state": "error", "error": f"the search failed: {type(exc).__name__}: {exc}"})
        raise
    state.set_suggest_status({"state": "done"})  # the rows are sent now
    # then one full collection (the search made none: ``search.running``), while the user reads them, so
    # that the next edit does not pay for it; the look-ahead's search (search_ahead) makes none
    gc.collect()
    return state.found.search


def suggestion(state, index: int) -> tuple[Plan, object, object, str]:
    """Row ``index`` (0: the best) of the last search as (plan, mesh, training, the message that
    says what applying it changes besides the plan); ``ValueError`` when it cannot be applied."""
    if state.found is None:
        raise ValueError("no suggestions yet: run suggest() (the Suggest tab's button) first")
    found = state.found.search
    if state.found.key != search_key(state.mesh, state.training):
        raise ValueError("the suggestions were found for another mesh or training: search again")
    n = len(found.table)
    if not 0 <= int(index) < n:
        raise ValueError(f"suggestion {index}: the search has {n} rows (0 to {n - 1})")
    plan, mesh, training = found.candidate(int(index))
    name = found.table.name.iloc[int(index)]
    plan = plan.renamed(f"search: {name}")  # its tensor-parallel entries too
    # the user's device and links stay
    mesh = replace(state.mesh, shard=mesh.shard, replicate=mesh.replicate, tensor=mesh.tensor)
    also = changes_text(state.mesh, mesh, state.training, training)
    note = (f"suggestion {int(index) + 1} applied: {name}"
            + (f"; also changed: {'; '.join(also)}" if also else "") + ". Undo goes back to the plan before it.")
    return plan, mesh, training, note


def suggestions_payload(state) -> dict:
    """The Suggest panel's data: the search's state, what it is for, what is missing, its rows."""
    out = {**state.suggest_status, "inputs": f"{_mesh_text(state.mesh)} · {training_text(state.training)}",
           "missing": _missing(state), "top": state.suggest_top, "needs_memory": state.mesh.device_memory is None}
    if out["state"] == "running":
        done = out.get("done", 0)
        out["text"] = f"searching {out['n_candidates']} plans…" + (f" {done} tried" if done else "")
    if state.found is not None:
        out.update(search_payload(state.found.search, state.found.seconds, state.suggest_top, state))
        out["stale"] = state.found.key != search_key(state.mesh, state.training)
    return out


def _missing(state) -> list[str]:
    """What the search cannot use: the device memory (no search) and what the step time needs."""
    out = [NO_MEMORY] if state.mesh.device_memory is None else []
    try:
        reason = state.analysis.step.reason
    except Exception as exc:  # noqa: BLE001 - the panel says so rather than break the widget
        reason = f"{type(exc).__name__}: {exc}"
    if reason:
        out.append(f"No step time ({reason}): the plans are ranked by their collectives' seconds per step "
                   "instead (one after another, no compute; under 1 % apart: a tie), then by less recomputation, the "
                   "larger margin, the simpler plan.")
    return out


def search_payload(found: Search, seconds: float, top: int, state) -> dict:
    """The rows of ``found`` the panel shows (its first ``top``), every figure formatted."""
    t = found.table
    rows = [_row(found, i, state) for i in range(min(top, len(t)))]
    return {
        "rows": rows, "n_rows": len(t), "n_candidates": found.n_candidates, "n_analysed": found.n_analysed,
        "summary": (f"{found.n_candidates} plans tried, {found.n_analysed} analysed, in {format_duration(seconds)}; "
                    f"the first {len(rows)} shown, best first"),
        "explain": found.explain(), "note": found.note, "limit_text": found.limit_text,
    }


def _missing_step(row) -> tuple[str, str]:
    """A row without a step time: a short cell text and the reason (from ``a.step``, via the note)."""
    return ("not timed" if row.analysed else "not analysed"), (
        "no step time for this mesh or training (see the note above)" if row.analysed else row.why)


def _row(found: Search, i: int, state) -> dict:
    r = found.table.iloc[i]
    timed = r.step_time_s is not None and r.step_time_s == r.step_time_s
    step_text, step_title = (format_duration(r.step_time_s), "") if timed else _missing_step(r)
    plan, mesh, training = found.candidate(i)
    # the figure the verdict judges (MemoryFit.judged), so peak + to spare = usable, as in the summary
    judged = r.judged_peak if r.analysed else r.peak
    peak = None if judged is None or judged != judged else int(judged)
    return {
        "index": i, "number": str(i + 1), "name": r["name"], "fits": bool(r.fits), "analysed": bool(r.analysed),
        "fits_text": ("tight" if r.verdict == "tight" else "fits") if r.fits else "does not fit",  # Mesh.fit
        "peak": peak, "peak_text": (format_bytes(peak) if r.analysed else f">= {format_bytes(peak)}") if peak is not None
        else "not analysed",
        "margin_text": (f"{format_bytes(abs(r.margin))} {'to spare' if r.margin >= 0 else 'over'}"
                        if r.analysed and r.margin == r.margin else ""),
        "step_time_s": float(r.step_time_s) if timed else None, "step_text": step_text, "step_title": step_title,
        "tokens_text": f"{format_count(round(r.tokens_per_s))} tokens/s" if timed else step_text,
        "mfu_text": f"MFU {format_percent(r.mfu)}" if timed else "",
        "why": r.why,
        "mesh_text": f"{mesh}: {mesh_words(mesh)}",
        "applies": ["plan", *changes_text(state.mesh, replace(state.mesh, shard=mesh.shard, replicate=mesh.replicate),
                                          state.training, training)],
        "current": (plan == state.plan and (mesh.shard, mesh.replicate) == (state.mesh.shard, state.mesh.replicate)
                    and training == state.training),
    }
