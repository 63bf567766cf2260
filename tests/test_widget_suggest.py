"""The Inspector's Suggest panel over the widget's protocol, without a browser (issue 18).

The rows are checked against ``sv.search`` run here on the same model, mesh and training (a fresh
tree, never the widget's numbers); an applied row against ``sv.analyze`` of the row's plan, mesh and
training; undo against the state before it.
"""

from __future__ import annotations

import functools

import pytest

import shardviz as sv
from shardviz import zoo
from shardviz.format import format_bytes, format_duration
from shardviz.widget import look_ahead as look_ahead_mod
from shardviz.widget import Inspector
from shardviz.widget import suggest as suggest_module

MESH = sv.Mesh(4, device="H100")
TRAINING = sv.Training(batch_size=2, seq_len=64)
TOP = 5


@functools.lru_cache(maxsize=None)
def model():
    return zoo.tiny_llama_lora()


@functools.lru_cache(maxsize=None)
def reference():
    return sv.search(model(), mesh=MESH, training=TRAINING)


class Recorder:
    """What the front end would see: every ``suggestions`` trait value and every ack, in order."""

    def __init__(self, ins: Inspector):
        self.ins, self.states, self.acks, self.req = ins, [], [], 0
        ins.observe(lambda c: self.states.append(dict(c["new"])), names=["suggestions"])
        ins.send = lambda msg, buffers=None: self.acks.append(msg) if msg.get("type") == "ack" else None

    def action(self, action: str, **args) -> dict:
        self.req += 1
        self.ins._on_msg(self.ins, {"type": "action", "action": action, "args": args, "req": self.req}, [])
        ack = self.acks[-1]
        assert ack["req"] == self.req
        return ack


@pytest.fixture(scope="module")
def searched():
    ins = Inspector(model(), mesh=MESH, training=TRAINING)
    wire = Recorder(ins)
    ack = wire.action("suggest", top=TOP)
    assert ack["ok"], ack
    return ins, wire


def test_rows_equal_sv_search(searched):
    ins, wire = searched
    ref = reference()
    # the front end saw "searching N plans…" before the rows, N being the search's own count
    running = [s for s in wire.states if s.get("state") == "running"]
    assert running and running[0]["text"] == f"searching {ref.n_candidates} plans…"
    assert wire.states[-1]["state"] == "done"
    panel = ins.suggestions
    assert panel["n_candidates"] == ref.n_candidates and panel["n_rows"] == len(ref.table)
    assert panel["missing"] == [] and not panel["stale"]
    assert panel["explain"] == ref.explain()
    rows, t = panel["rows"], ref.table
    assert len(rows) == TOP
    for i, r in enumerate(rows):
        assert r["index"] == i and r["number"] == str(i + 1)
        assert (r["name"], r["fits"], r["why"]) == (t.name.iloc[i], bool(t.fits.iloc[i]), t.why.iloc[i])
        # the judged peak and its margin: they add up to the usable memory, as in the summary
        assert r["peak"] == int(t.judged_peak.iloc[i]) and r["peak_text"] == format_bytes(t.judged_peak.iloc[i])
        assert r["peak"] + int(t.margin.iloc[i]) == ins.mesh.usable_memory
        assert r["step_time_s"] == float(t.step_time_s.iloc[i])
        assert r["step_text"] == format_duration(t.step_time_s.iloc[i])
        assert r["tokens_text"] == f"{round(t.tokens_per_s.iloc[i]):,} tokens/s"


def test_apply_a_row_then_undo_and_redo(searched):
    ins, wire = searched
    ref = reference()
    before = (ins.plan, ins.plan.name, ins.mesh, ins.training)
    k = 1
    assert wire.action("apply_suggestion", index=k)["ok"]
    plan, mesh, training = ref.candidate(k)
    assert ins.plan == plan and ins.plan.name == f"search: {ref.table.name.iloc[k]}"
    assert ins.mesh == mesh and ins.training == training  # the HSDP split came with the plan, in the same step
    a = sv.analyze(model(), plan, mesh, training)
    assert ins.memory["max_peak"] == int(a.memory.peak.max()) == int(ref.table.peak.iloc[k])
    assert ins.summary["peak"] == int(a.memory.peak.max())
    panel = ins.suggestions
    assert [r["current"] for r in panel["rows"]][k] and not panel["stale"]
    if (mesh.shard, mesh.replicate) != (MESH.shard, MESH.replicate):
        assert f"mesh {mesh} (was {MESH})" in ins.controller.messages[-1]["text"]

    assert wire.action("undo")["ok"]
    assert (ins.plan, ins.plan.name, ins.mesh, ins.training) == before
    assert not ins.suggestions["rows"][k]["current"]
    assert wire.action("redo")["ok"]
    assert ins.plan == plan and ins.mesh == mesh
    assert wire.action("undo")["ok"]
    assert (ins.plan, ins.plan.name, ins.mesh, ins.training) == before


def test_apply_is_refused_with_its_reason(searched):
    ins, wire = searched
    bad = wire.action("apply_suggestion", index=len(reference().table))
    assert not bad["ok"] and f"suggestion {len(reference().table)}" in bad["error"]
    fresh = Inspector(model(), mesh=MESH, training=TRAINING)
    first = Recorder(fresh).action("apply_suggestion", index=0)
    assert not first["ok"] and "no suggestions yet" in first["error"]
    # another world size: the rows were for the old one
    assert wire.action("set_mesh", world=8)["ok"]
    assert ins.suggestions["stale"]
    stale = wire.action("apply_suggestion", index=0)
    assert not stale["ok"] and "search again" in stale["error"]
    assert wire.action("undo")["ok"] and not ins.suggestions["stale"]


def test_no_device_memory_names_what_is_missing():
    ins = Inspector(model(), mesh=sv.Mesh(4), training=sv.Training())
    wire = Recorder(ins)
    assert any("device memory" in m for m in ins.suggestions["missing"])  # said before any click
    ack = wire.action("suggest")
    assert not ack["ok"] and "device memory" in ack["error"]
    assert ins.suggestions["state"] == "error" and "device memory" in ins.suggestions["error"]


def test_without_a_device_the_panel_says_there_is_no_step_time():
    mesh = sv.Mesh(4, device_memory="80GiB")
    ins = Inspector(model(), mesh=mesh, training=sv.Training())
    assert Recorder(ins).action("suggest", top=3)["ok"]
    panel = ins.suggestions
    assert any(m.startswith("No step time (no device") and "ranked by their collectives" in m for m in panel["missing"])
    ref = sv.search(model(), mesh=mesh, training=sv.Training())
    assert [r["name"] for r in panel["rows"]] == list(ref.table.name[:3])
    for r in panel["rows"]:
        assert r["step_time_s"] is None and r["step_text"] in ("not timed", "not analysed") and r["tokens_text"]


def test_a_search_that_fails_shows_its_cause(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("the profile went missing")

    monkeypatch.setattr(suggest_module, "search", broken)
    ins = Inspector(model(), mesh=MESH, training=sv.Training())
    ack = Recorder(ins).action("suggest")
    assert not ack["ok"] and "the profile went missing" in ack["error"]
    assert ins.suggestions["error"] == "the search failed: RuntimeError: the profile went missing"


def test_a_row_with_another_micro_batch_applies_it_in_the_same_undo_step():
    training = sv.Training(seq_len=64, global_batch=8, grad_accum=2, batch_size=1)  # 4 ranks: 2 sequences each
    ins = Inspector(model(), mesh=MESH, training=training)
    wire = Recorder(ins)
    assert wire.action("suggest", top=40)["ok"]
    ref = sv.search(model(), mesh=MESH, training=training)
    rows = ins.suggestions["rows"]
    assert [r["name"] for r in rows] == list(ref.table.name[: len(rows)])
    k = next(r["index"] for r in rows if ref.candidate(r["index"])[2].batch_size != training.batch_size)
    assert any(a.startswith("micro-batch x accumulation") for a in rows[k]["applies"])
    before = (ins.plan, ins.mesh, ins.training)
    assert wire.action("apply_suggestion", index=k)["ok"]
    plan, mesh, tr = ref.candidate(k)
    assert (ins.plan, ins.mesh, ins.training) == (plan, mesh, tr)
    assert (tr.batch_size, tr.grad_accum) != (1, 2)
    assert ins.memory["max_peak"] == int(sv.analyze(model(), plan, mesh, tr).memory.peak.max())
    assert not ins.suggestions["stale"]  # another micro-batch of the same global batch: the same search
    assert wire.action("undo")["ok"]
    assert (ins.plan, ins.mesh, ins.training) == before


def test_an_applied_offload_row_sets_the_box_and_unchecking_it_undoes_it():
    """Issue 24: after a Suggest row with CPU offload the box was unchecked, the training line
    omitted offload, and toggling the box left the peak unchanged; the host RAM was never shown."""
    mesh = sv.Mesh(shard=4, device_memory="80GiB")
    ins = Inspector(model(), mesh=mesh)
    plan = sv.Plan([sv.Unit(u.modules, offload=True) for u in ins.plan.units], ins.plan.ignored, "offloaded")
    ins.controller.set_plan(plan)  # as apply_suggestion makes it: the plan's calls offload, Training.offload stays off
    assert not ins.training.offload and ins.controls["offload"] is True
    assert "CPU offload" in ins.summary["training"]
    cpu = int(sv.analyze(model(), ins.plan, mesh, ins.training).memory["cpu_peak"].max())
    assert cpu > 0 and ins.controls["offload_text"].startswith(f"host RAM {format_bytes(cpu)} per rank")
    peak = ins.summary["peak"]
    assert ins.handle_action("set_training", {"offload": False})["ok"]  # the box unchecked
    assert not any(u.offload for u in ins.plan.units) and ins.controls["offload"] is False
    assert ins.summary["peak"] > peak and ins.controls["offload_text"] == ""
    assert ins.summary["peak"] == int(sv.analyze(model(), ins.plan, mesh, ins.training).memory["peak"].max())
    ins.controller.undo()  # one undo step brings the plan's offload back
    assert ins.controls["offload"] is True and ins.summary["peak"] == peak


def test_every_row_says_what_its_mesh_means(searched):
    """Issue 24: "HSDP 16x4" was never explained; "shard groups of 1 ranks"."""
    ins, _wire = searched
    rows = ins.suggestions["rows"]
    for r in rows:
        head, words = r["mesh_text"].split(": ", 1)
        assert (head in r["name"]) if head.startswith("HSDP") else words.startswith("one shard group of"), r
    hsdp = suggest_module.mesh_words(sv.Mesh(shard=4, replicate=16))
    assert hsdp.startswith("16 replicas x 4-rank shard groups")
    assert "no sharding" in suggest_module.mesh_words(sv.Mesh(shard=1, replicate=4))
    assert suggest_module.mesh_words(sv.Mesh(shard=1)) == "one shard group of 1 rank"
    found = reference()
    refused = found.table.why.astype(str).str.startswith("torch would refuse")
    over = int((~found.table.fits & ~refused).sum())
    text = found.explain()
    assert (f"{over} of {len(found.table)} plans do not fit" in text) == bool(over)
    assert ("torch would refuse" in text) == bool(refused.any())


@pytest.mark.slow
def test_on_a_tensor_parallel_mesh_a_row_applies_its_tensor_degree():
    """4 data-parallel ranks x TP 2: the panel searches with and without TP on the same 8 ranks,
    and a row applies its own split of them, its tensor degree and its plan's TP entries (before,
    a row without TP kept the user's tensor degree: 16 ranks, and a TP row lost its TP plan).
    The quick run has the same without a micro-batch (the next test)."""
    tensor_rows_apply_their_degree(sv.Mesh(shard=4, tensor=2, device="H100"), TRAINING)


def test_on_a_tensor_parallel_mesh_a_row_applies_its_tensor_degree_without_a_batch():
    """The test above without a micro-batch: the same search with and without TP (model state only,
    no activations measured per candidate, which takes minutes) and the same rows to apply."""
    tensor_rows_apply_their_degree(sv.Mesh(shard=4, tensor=2, device="H100"), sv.Training())


def tensor_rows_apply_their_degree(mesh, training):
    ins = Inspector(model(), plan=sv.Plan.auto(model(), tensor_parallel=True), mesh=mesh, training=training)
    wire = Recorder(ins)
    assert wire.action("suggest", top=200)["ok"]
    found = ins.controller.found.search
    rows = ins.suggestions["rows"]
    tensors = {r["index"]: found.candidate(r["index"])[1].tensor for r in rows}
    assert set(tensors.values()) == {1, 2}
    for tensor in (1, 2):
        k = next(i for i, t in tensors.items() if t == tensor)
        ack = wire.action("apply_suggestion", index=k)
        assert ack["ok"], ack
        plan, want, _ = found.candidate(k)
        assert (ins.mesh.world, ins.mesh.shard, ins.mesh.replicate, ins.mesh.tensor) == (mesh.world, want.shard,
                                                                                         want.replicate, tensor)
        assert bool(ins.plan.tensor_parallel) == (tensor > 1)
        assert ins.plan.tensor_parallel == plan.tensor_parallel
        assert not ins.suggestions["stale"]  # the same ranks: the next row applies too


def test_a_suggested_plans_name_stops_naming_its_mesh_once_the_mesh_changes(searched):
    """The name "search: ..., HSDP 2x2" stayed after the mesh was set to another (issue 35): the summary
    and the A vs B side then say the mesh it was found for, and the one it now runs on."""
    ins, wire = searched
    ref = reference()
    k = next(i for i, (_, mesh, _) in enumerate(map(ref.candidate, range(len(ref.table)))) if mesh.replicate > 1)
    assert wire.action("apply_suggestion", index=k)["ok"]
    found = ins.plan.name
    assert ins.summary["plan_name"] == found and "HSDP" in found  # on its own mesh: the name as it is
    ins.controller.set_mesh(world=4, replicate=1)
    assert ins.plan.name == found  # the plan is the same plan
    assert ins.summary["plan_name"] == f"{found} (found for that mesh; now FSDP 4)"
    ins.controller.pin()
    assert ins.controller.comparison["b"]["plan_name"] == ins.summary["plan_name"]


def test_no_row_is_blank_without_a_reason(searched):
    """Issue 37: rows 9-20 of the table were blank. Every row of the whole search, as the panel
    would show it, has its name, a step cell and a reason."""
    ins, _ = searched
    found = reference()
    payload = suggest_module.search_payload(found, 1.0, len(found.table), ins.controller)
    assert len(payload["rows"]) == len(found.table) > TOP
    for row in payload["rows"]:
        assert row["name"] and row["step_text"] and row["fits_text"], row
        assert row["why"] or row["index"] == 0, row  # the best row needs no reason to be above the rest


def test_the_search_says_how_far_it_is():
    """``sv.search(progress=...)``: the Suggest panel counts the plans tried while it runs."""
    calls = []
    found = sv.search(model(), mesh=MESH, training=TRAINING, progress=lambda done, n: calls.append((done, n)))
    assert calls and {n for _, n in calls} == {found.n_candidates}
    done = [d for d, _ in calls]
    assert done == sorted(done) and done[-1] <= found.n_candidates
    assert found.table.equals(reference().table)  # the callback changes nothing


def test_the_look_ahead_searches_ahead_and_the_click_finds_its_rows(monkeypatch):
    """Suggest's search runs in the look-ahead (issue 37: compute ahead what the next edit likely
    needs): the click then runs nothing and shows the rows ``sv.search`` gives; a plan edit keeps
    them (a search does not depend on the plan), a new sequence length searches again."""
    from shardviz.widget.controller import InspectorState

    st = InspectorState(model(), mesh=MESH, training=TRAINING)
    st.memory  # noqa: B018
    edits = look_ahead_mod.next_edits(st)
    assert edits[-1][0] == "Suggest's search"  # last: the edits before it need a measurement each, it seconds
    monkeypatch.setattr(look_ahead_mod, "next_edits", lambda st: edits[-1:])  # (the others: test_widget_look_ahead)
    assert look_ahead_mod.look_ahead(st, st.revision, findings=False) == ["Suggest's search"]
    runs = []
    real = suggest_module.search
    monkeypatch.setattr(suggest_module, "search", lambda *a, **k: runs.append(1) or real(*a, **k))
    found = st.suggest(top=TOP)
    assert runs == [] and found.table.equals(reference().table)
    st.apply_preset("ignored")
    assert st.suggest(top=TOP) is found and runs == []
    st.set_training(seq_len=32)
    again = st.suggest(top=TOP)
    assert runs == [1] and again is not found and st.suggest(top=TOP) is again


def _look_ahead_search_stopped_at(done_at: int, monkeypatch):
    """A fresh state whose look-ahead search (``suggest.search_ahead``) was stopped, as an edit stops it
    (``activations.stop``), after ``done_at`` candidates."""
    from shardviz.activations import stop
    from shardviz.widget.controller import InspectorState

    st = InspectorState(model(), mesh=MESH, training=TRAINING)
    st.memory  # noqa: B018
    real = suggest_module.search

    def stopped_midway(*args, progress=None, **kwargs):
        def progress_then_stop(done, total):
            if done == done_at:
                raise stop.Stopped()
            progress(done, total)
        return real(*args, progress=progress_then_stop, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(suggest_module, "search", stopped_midway)
        with pytest.raises(stop.Stopped):
            suggest_module.search_ahead(st)
    return st


def test_a_search_stopped_by_an_edit_keeps_no_rows(monkeypatch):
    """The look-ahead's search stops at the next edit (``activations.stop``) and keeps nothing half done."""
    st = _look_ahead_search_stopped_at(3, monkeypatch)
    assert st.searched == {}


def test_the_click_goes_on_from_where_the_stopped_look_ahead_search_was(monkeypatch):
    """The Suggest click stops the look-ahead's search of the same mesh and training midway (the
    worker runs one job at a time): the click's search analyses none of the plans that one had
    analysed again, and its rows are ``sv.search``'s."""
    import importlib

    expected = reference()  # before counting: sv.search's analyses are not the widget's
    space = importlib.import_module("shardviz.search.space")
    analysed, analysis = [], space.Space.analysis
    monkeypatch.setattr(space.Space, "analysis", lambda self, c, *a, **k: analysed.append(c) or analysis(self, c, *a, **k))
    st = _look_ahead_search_stopped_at(12, monkeypatch)
    parts = dict(st.search_parts[suggest_module.ahead_key(st)])
    assert len(parts) >= 3 and st.searched == {}
    analysed.clear()
    found = st.suggest(top=TOP)
    assert analysed and not set(parts) & set(analysed)
    assert found.table.equals(expected.table) and found.n_analysed == expected.n_analysed
    assert st.search_parts == {}  # done: the whole search is kept instead
