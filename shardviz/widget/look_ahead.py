"""The Inspector's look-ahead: what the next edit likely needs, measured while the user reads the
numbers (on the worker, ``background.BackgroundPush.price_and_look_ahead``), into the measurement
caches, so that the edit itself finds its step measured and Suggest its rows."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

from ..activations import measure_cache, stop
from ..analysis import analyze


def next_edits(st) -> list[tuple[str, object]]:
    """The likely next edits of ``st`` (an ``InspectorState``) that need a new measurement, most
    likely first, as (what, a function of ``st`` returning its (plan, mesh, training)): the same
    plain functions the edits call (``plan_actions``, ``setup_actions``), so that what is measured
    ahead is exactly what the edit then asks for. Last, Suggest's search itself (``suggest.search_ahead``,
    kept for the click: its function returns None; it needs seconds, the edits before it one each);
    before the measured steps that need less likely edits, TP 2's local copy of the model (cheap, and
    kept for every TP 2 step after it: its function returns None too).
    Without a micro-batch nothing is measured."""
    from . import plan_actions, setup_actions, suggest

    if not st.training.with_activations:
        return []
    plan, mesh, tr = st.plan, st.mesh, st.training
    blocks = st.blocks()
    presets = [(f"preset {key}", lambda key=key: (plan_actions.preset_keeping_checkpointing(st, key)[0].plan, mesh, tr))
               for key in plan_actions.PRESETS if key in ("ignored", "sharded", "separate")]
    rows, both = [], []
    if len(blocks) > 1:  # block 1 stands for any block but the first: they share the measured copy's variants
        rows.append(("one block's checkpoint", lambda: (plan_actions.toggle_checkpoint(st, blocks[1]), mesh, tr)))
        if plan_actions.lora_params(st.tree, blocks[1]):  # a new variant of the block: a new measurement
            rows.append(("one block's LoRA", lambda: (plan_actions.toggle_lora(st, blocks[1]), mesh, tr)))

            def checkpoint_then_lora():  # two edits of one block in a row: a third variant of it
                checkpointed = SimpleNamespace(tree=st.tree, plan=plan_actions.toggle_checkpoint(st, blocks[1]))
                return plan_actions.toggle_lora(checkpointed, blocks[1]), mesh, tr
            both.append(("one block's checkpoint, then its LoRA", checkpoint_then_lora))
    # first the LoRA layouts compared (the question the tool is for), unless the user is editing single
    # blocks: then the next edit is likely another block's
    out = rows + presets if plan_actions.blocks_differ(st) else presets + rows
    tp2 = None
    if mesh.tensor == 1 and mesh.world % (mesh.replicate * 2) == 0:
        def tp2():
            edit = setup_actions.tensor_edit(st, 2)
            return edit.plan or plan, edit.mesh, tr

        def tp2_model():  # a fifth of a second at 70B, once per model: every later TP 2 step (any plan) reuses it
            analyze(st.tree, *tp2(), strict=False, torch_version=st.torch_version).measured_model  # noqa: B018
        out.append(("TP 2's local model", tp2_model))
    if len(blocks) > 1:
        out.append(("every block's checkpoint", lambda: (plan_actions.checkpoint_blocks(st, not plan.checkpoint), mesh, tr)))
    out += both
    other = "float32" if tr.param_dtype == "bfloat16" else "bfloat16"
    out.append((f"param dtype {other}", lambda: (plan, mesh, setup_actions.training_edit(st, param_dtype=other).training)))
    if tr.seq_len >= 2:
        out.append(("half the sequence", lambda: (plan, mesh, setup_actions.training_edit(st, seq_len=tr.seq_len // 2).training)))
    if tp2 is not None:
        out.append(("TP 2", tp2))
    if mesh.device_memory is not None:  # last, Suggest's search (seconds at 70B), kept for its click
        def search():
            suggest.search_ahead(st)  # None: nothing left for look_ahead to analyse
        out.append(("Suggest's search", search))
    return out


def look_ahead(st, rev: int | None = None, findings: bool = True, measuring=None) -> list[str]:
    """Measure what ``next_edits`` need into the caches (the activations per layout, TP's local
    model), then (``findings``) their findings' what-ifs; stops when the state moves on from ``rev``
    (the worker is cancelled then anyway). Returns what it measured. A failure is left to the edit.
    ``measuring(inputs)``: a context around each step measured (``Worker.measuring_ahead``: an edit
    that needs that very step lets it finish)."""
    done: list[str] = []
    with measure_cache.ahead():  # a step another thread needs ends it here (measure_cache.one_step)
        done = _look_ahead(st, rev, findings, measuring)
    return done


def _look_ahead(st, rev, findings, measuring) -> list[str]:
    done, analyses = [], []
    for what, edit in next_edits(st):
        stop.check()
        if rev is not None and st.revision != rev:
            return done
        try:
            inputs = edit()
            if inputs is None:  # the edit ran its own work (TP 2's local model, Suggest's search)
                done.append(what)
                continue
            plan, mesh, training = inputs
            with measuring(inputs) if measuring else contextlib.nullcontext(), measure_cache.ahead(may_park=True):
                a = analyze(st.tree, plan, mesh, training, strict=False, torch_version=st.torch_version)
                a.measure_ahead()  # the cache keeps the step; no cached property's lock held: it may be set aside
        except Exception:  # noqa: BLE001 - the edit, if made, says why
            continue
        done.append(what)
        analyses.append(a)
    for a in analyses if findings else ():
        stop.check()
        if rev is not None and st.revision != rev:
            break
        try:
            a.findings  # noqa: B018 - SV201's what-ifs measure their steps: the cache keeps them
        except Exception:  # noqa: BLE001
            continue
    return done
