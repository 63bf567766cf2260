"""``sv.search``: the fastest plan that fits, among the plans a user would otherwise try by hand.

Candidates: LoRA ignored / sharded / separate (when the model has LoRA); checkpointing of every
block, every 2nd, every 3rd, selective (torchtitan's op policy), none;
``reshard_after_forward`` as torch sets it, ``False``, or an int (one node's ranks) when the shard
group spans nodes; every HSDP split of the world size; CPU offload; and, with
``Training(global_batch=...)``, every micro-batch and accumulation that give that batch. The
key/value cache is a knob too: where a plan's step keeps it (``Training.step_use_cache``: the
config's ``use_cache=True`` without checkpointing), the same plan with ``use_cache=False`` is a
candidate of its own (tried first: it holds less). A plan torch cannot run with the cache is
priced without it, its name says so.

Every candidate that could fit is analysed by ``analyze``: activations are measured by torch once
per LoRA layout x checkpointing x micro-batch (the analysis' profile cache), and shared by every
mesh, reshard and offload option. Candidates that cannot fit are not analysed (pruned), each with
its reason:

- the model state alone (parameters, gradients, optimizer states, FSDP buffers: ``analyze``
  without a batch) is over the device: activations are never measured for it;
- a plan with every block checkpointed (or one of the partial policies) is already over the device
  on the same layout, mesh and options: the blocks checkpointed with fewer blocks are a subset, so
  more activations are alive at every moment;
- the same plan on fewer replicas (larger shard groups) is already over: more replicas hold more
  per rank;
- without resharding after forward (or resharding to k ranks), the calls' unsharded parameters
  (or 1/k of them), all alive when forward ends, are over the device;
- a micro-batch larger than one with which nothing fits.

The plans that fit are ranked by ``a.step.step_time_s`` (the step model, ``steptime.py``: the
mesh needs a ``device``); ``why`` names the parts of the step that make a plan slower than the one
above it (recomputation, exposed collectives, offload copies, the optimizer). Without a device there
is no step time: the search says so in ``note`` and ranks by the collectives' seconds instead.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pandas as pd

from ..activations import config_use_cache
from ..analysis import Analysis, analyze
from ..cost import Training, unsharded_bytes
from ..cost.training import DEFAULT_TRAINING
from ..devices import usable_text
from ..finding import PlanError
from ..format import format_bytes, format_duration
from ..fsdp import Mesh
from ..plan import Plan, Unit
from ..tree import ModelTree, as_tree
from .candidates import CHECKPOINTS, Candidate, _divisors, candidates  # noqa: F401 - importable here
from .rank import _TRAINING_FIELDS, _rank_key, _time_parts, _why, explain, kept_margin_note, step_numbers

DEFAULT_GBPS = (450.0, 50.0)  # inside a node / across nodes when the mesh gives none (the README's table)
COLUMNS = ["name", "fits", "verdict", "peak", "reserved_peak", "margin", "step_time_s", "tokens_per_s", "mfu", "why", "lora",
           "checkpoint", "reshard_after_forward", "replicate", "shard", "offload", "batch_size", "grad_accum", "analysed",
           "use_cache"]


# ---------------------------------------------------------------------------
# Running the candidates
# ---------------------------------------------------------------------------
class _Runner:
    """Analyses candidates, keeping what prunes the rest."""

    def __init__(self, tree: ModelTree, mesh: Mesh, training: Training):
        self.tree, self.mesh, self.training = tree, mesh, training
        self.limit = mesh.usable_memory  # device memory less the reserve: what every verdict here uses
        self.usable_text = usable_text(mesh.device_memory, mesh.memory_reserve)  # "79.00 GiB usable"
        self.has_lora = any(p.role == "lora" for p in tree.params)
        self.config_keeps = config_use_cache(tree.model)  # the config's use_cache (the cache knob's default)
        self._auto: dict = {}
        self._state: dict = {}
        self._unsharded: dict = {}  # LoRA layout -> cost.unsharded_bytes of its calls
        self.over: dict = {}  # (state key, batch, checkpoint, cache) -> judged peak over the device
        self.act_over: dict = {}  # (lora, batch, checkpoint) -> activations alone over the device
        self.n_analysed = 0
        self.lean_offload = True
        self.fitting: dict = {}  # analysed candidate -> fits
        self._holds_less: dict = {}
        self.tensors: tuple[int, ...] = (1,)  # the tensor degrees searched (search(..., tensor=...))
        self.tp_entries: dict = {}  # the model's own TP plan, when a degree > 1 is searched

    def plan(self, c: Candidate) -> Plan:
        key = (c.lora, c.checkpoint, c.tensor)
        if key not in self._auto:
            self._auto[key] = Plan.auto(self.tree, lora=c.lora, checkpoint=c.checkpoint)
            if c.tensor > 1:
                self._auto[key] = self._auto[key].with_tensor_parallel(self.tp_entries)
        auto = self._auto[key]
        if c.reshard is None and not c.offload:
            return auto
        units = [Unit(u.modules, u.reshard_after_forward if u.modules == ("",) or c.reshard is None else c.reshard,
                      u.param_dtype, u.reduce_dtype, u.offload or c.offload) for u in auto.units]
        return auto.with_units(units)

    def mesh_for(self, c: Candidate, world: int | None = None) -> Mesh:
        world = world or self.mesh.world
        return replace(self.mesh, shard=world // (c.replicate * c.tensor), replicate=c.replicate, tensor=c.tensor)

    def training_for(self, c: Candidate, with_batch: bool = True) -> Training:
        kw = {"batch_size": c.batch_size if with_batch else None, "offload": False}
        if c.use_cache is not None:
            kw["use_cache"] = c.use_cache
        if "grad_accum" in _TRAINING_FIELDS:
            kw["grad_accum"] = c.grad_accum
        return replace(self.training, **kw)

    def analysis(self, c: Candidate, world: int | None = None, with_batch: bool = True) -> Analysis:
        self.n_analysed += 1
        return analyze(self.tree, self.plan(c), self.mesh_for(c, world), self.training_for(c, with_batch))

    def cache_of(self, c: Candidate) -> bool:
        """Whether ``c``'s step keeps the key/value cache (``Training.step_use_cache``)."""
        t = self.training_for(c)
        return t.step_use_cache(self.config_keeps and t.example_inputs is None, bool(self.plan(c).checkpoint))

    def lean_state(self, lora: str, tensor: int = 1) -> int:
        """The model-state peak (no activations) of the layout with the options that hold least."""
        if (lora, tensor) not in self._state:
            lean = Candidate(lora, None, None, 1, self.lean_offload, tensor=tensor)
            self._state[(lora, tensor)] = int(self.analysis(lean, with_batch=False).memory.peak.max())
        return self._state[(lora, tensor)]

    def holds_less(self, strong: str | None, weak: str | None) -> bool:
        """Plans checkpointed as ``strong`` hold fewer activations than as ``weak``: every block
        ``weak`` checkpoints is checkpointed by ``strong`` at least as fully (fewer at every moment),
        or both checkpoint in full and ``strong`` checkpoints at least as many blocks of each kind
        (blocks of one kind save the same bytes: fewer are alive when backward starts, where the
        activations peak)."""
        if (strong, weak) not in self._holds_less:
            self._holds_less[(strong, weak)] = strong != weak and self._compare_checkpoints(strong, weak)
        return self._holds_less[(strong, weak)]

    def _compare_checkpoints(self, strong: str | None, weak: str | None) -> bool:
        a, b = self.plan(Candidate(checkpoint=strong)).checkpoint, self.plan(Candidate(checkpoint=weak)).checkpoint
        if all(n in a and a.policy(n) in ("full", p) for n, p in b.items()):
            return True
        if a.selective or b.selective:
            return False
        kinds = lambda ck: Counter(self.tree.modules[self.tree.module_index[n]].type_name for n in ck)  # noqa: E731
        ka, kb = kinds(a), kinds(b)
        return all(ka[k] >= n for k, n in kb.items())

    def holds_less_than(self, c: Candidate, batch: int | None, ckpt: str | None, cache: bool) -> bool:
        """A plan with micro-batch ``batch``, checkpointing ``ckpt`` and the cache kept or not holds no
        more activations than ``c`` (a step without the cache holds less than one with it)."""
        if (batch or 0) > (c.batch_size or 0) or (cache and not self.cache_of(c)):
            return False
        return ckpt == c.checkpoint or self.holds_less(ckpt, c.checkpoint)

    def bound_others(self, c: Candidate, profile) -> None:
        """From one measurement, the activations other checkpoint presets save for backward at least:
        every block's saved bytes, plain or checkpointed (``saved_plain`` / ``saved_checkpointed``,
        both measured for the repeated blocks), are all alive when backward starts."""
        rows = [profile.at(b) for b in profile.blocks]
        if any(r.saved_plain is None or r.saved_checkpointed is None for r in rows):
            return
        for ckpt in CHECKPOINTS:
            key = ((c.lora, c.tensor), c.batch_size, ckpt, False)  # measured without the cache: a bound with it too
            if ckpt == c.checkpoint or key in self.act_over:
                continue
            plan = self.plan(Candidate(checkpoint=ckpt)).checkpoint
            if plan.selective:
                continue
            saved = sum(r.saved_checkpointed if b in plan else r.saved_plain for b, r in zip(profile.blocks, rows))
            if saved > self.limit:
                self.act_over[key] = (saved, f"at least: every block's saved bytes, measured with {_ckpt_words(c.checkpoint)}")

    def pruned_by(self, c: Candidate) -> str | None:
        """Why ``c`` cannot fit without analysing it, or None."""
        gib, less = self.usable_text, "(checkpoints less: not analysed)"
        cache = self.cache_of(c)
        act = self.act_over.get(((c.lora, c.tensor), c.batch_size, c.checkpoint, cache))
        if act is not None:  # the same activations whatever the mesh and options
            return f"over {gib}: the activations alone are {format_bytes(act[0])} ({act[1]}; not analysed)"
        for (lora, batch, ckpt, cached), (act, how) in self.act_over.items():
            if lora == (c.lora, c.tensor) and self.holds_less_than(c, batch, ckpt, cached):
                return (f"over {gib}: the activations alone are {format_bytes(act)} with {_ckpt_words(ckpt)}, "
                        f"micro-batch {batch} ({how}) {less}")
        for (state, batch, ckpt, cached), peak in self.over.items():
            if state == c.state_key and self.holds_less_than(c, batch, ckpt, cached):
                return f"over {gib}: {format_bytes(peak)} with {_ckpt_words(ckpt)}, micro-batch {batch} {less}"
            if self.fewer_replicas(state, c) and (batch, ckpt, cached) == (c.batch_size, c.checkpoint, cache):
                return (f"over {gib}: {format_bytes(peak)} with {state[2]} replicas already; more replicas shard each "
                        "copy over fewer ranks, so every rank holds more (not analysed)")
        state = self.lean_state(c.lora, c.tensor)
        if state > self.limit:
            return (f"over {gib}: the model state alone is {format_bytes(state)} with the leanest options "
                    "(activations not measured)")
        return self.kept_unsharded(c)

    @staticmethod
    def fewer_replicas(state: tuple, c: Candidate) -> bool:
        """``state`` (a state key) is ``c``'s plan on fewer replicas of larger shard groups: its
        sharded parameters, gradients and optimizer states per rank are a fraction of ``c``'s."""
        lora, reshard, replicate, offload, tensor = state
        return (lora, reshard, offload, tensor) == (c.lora, c.reshard, c.offload, c.tensor) and replicate < c.replicate \
            and c.replicate % replicate == 0

    def kept_unsharded(self, c: Candidate) -> str | None:
        """Without resharding after forward (or resharding to k ranks), every call keeps its
        unsharded parameters (or 1/k of them) from its forward to its backward: all are alive when
        forward ends (``cost.unsharded_bytes``)."""
        if c.reshard is None or c.reshard is True:
            return None
        if (c.lora, c.tensor) not in self._unsharded:
            lean = Candidate(c.lora, tensor=c.tensor)
            a = analyze(self.tree, self.plan(lean), self.mesh_for(lean), self.training_for(lean, with_batch=False))
            self._unsharded[(c.lora, c.tensor)] = unsharded_bytes(a.tree, a.layout, self.training)
        kept = self._unsharded[(c.lora, c.tensor)] // (1 if c.reshard is False else c.reshard)
        if kept <= self.limit:
            return None
        how = "no reshard after forward" if c.reshard is False else f"resharding to {c.reshard} ranks after forward"
        return (f"over {self.usable_text}: with {how}, the calls' unsharded parameters alone are {format_bytes(kept)} "
                "when forward ends (not analysed)")

    def evaluate(self, c: Candidate) -> dict:
        """The candidate's row."""
        if c.offload and self.fitting.get(replace(c, offload=False)):
            return {"analysed": False, "fits": True, "peak": None, "why": (
                "fits, slower than the same plan without CPU offload, which fits too: offloading only lowers the "
                "peak and adds host-device copies (not analysed)")}
        reason = self.pruned_by(c)
        if reason is not None:
            return {"analysed": False, "fits": False, "peak": None, "why": reason}
        try:
            a = self.analysis(c)
            peak, fit = int(a.memory.peak.max()), a.fit  # judged on the reserved peak, with the safety margin
        except PlanError as exc:
            self.n_analysed -= 1  # refused before any cost was computed: counted with the pruned
            return {"analysed": False, "fits": False, "peak": None, "why": f"torch would refuse it: {exc.findings[0]}"}
        fits = self.fitting[c] = fit.fits
        cache = self.cache_of(c) and not a.cache_refused  # what was priced
        if not fits:
            self.over[(c.state_key, c.batch_size, c.checkpoint, cache)] = self.limit - fit.margin
        profile = a.activation_profile
        if profile is not None and profile.peak[0] > self.limit:
            self.act_over[((c.lora, c.tensor), c.batch_size, c.checkpoint, cache)] = (int(profile.peak[0]), "measured")
        if profile is not None:
            self.bound_others(c, profile)
        return {"analysed": True, "fits": fits, "peak": peak, "reserved_peak": int(a.memory.reserved_peak.max()),
                "tensor_comm_s": a.step.tensor_comm_s, "verdict": fit.verdict, "margin": fit.margin, "safety": fit.safety, **step_numbers(a, c.grad_accum),
                "comm_s": float(a.comm.attrs.get("time_per_step_s", 0.0)) * c.grad_accum,
                "parts": _time_parts(a, c.grad_accum), "recompute": len(a.plan.checkpoint), "calls": len(a.plan.units),
                "mesh": a.mesh, "use_cache": cache, "cache_refused": a.cache_refused}


def _ckpt_words(checkpoint: str | None) -> str:
    return {None: "no checkpointing", "blocks": "every block checkpointed",
            "selective": "selective checkpointing"}.get(checkpoint, f"checkpoint={checkpoint!r}")


def _run(runner: _Runner, cands: list[Candidate]) -> list[tuple[Candidate, dict]]:
    """Rows for every candidate; a micro-batch larger than one with which nothing fits is pruned."""
    rows: list = []
    nowhere: int | None = None  # the smallest micro-batch with which nothing fits
    for i, c in enumerate(cands):
        if nowhere is not None and c.batch_size is not None and c.batch_size > nowhere:
            rows.append((c, {"analysed": False, "fits": False, "peak": None,
                             "why": f"over {runner.usable_text}: micro-batch {nowhere} fits with no plan"}))
            continue
        rows.append((c, runner.evaluate(c)))
        last_of_batch = i + 1 == len(cands) or cands[i + 1].batch_size != c.batch_size
        if last_of_batch and c.batch_size is not None and not any(
                r["fits"] for cc, r in rows if cc.batch_size == c.batch_size):
            nowhere = c.batch_size if nowhere is None else nowhere
    return rows


# ---------------------------------------------------------------------------
# When nothing fits
# ---------------------------------------------------------------------------
def _lean(runner: _Runner, batch: int | None) -> Candidate:
    """The candidate with the least memory: LoRA sharded, every block checkpointed, CPU offload."""
    ckpt = "blocks" if batch is not None else None
    return Candidate("sharded", ckpt, None, 1, True, batch, 1)


def _fits(runner: _Runner, c: Candidate, world: int | None = None) -> int | None:
    """The peak of ``c`` (on ``world`` ranks) when it fits, else None."""
    try:
        a = runner.analysis(c, world)
    except PlanError:
        return None
    return int(a.memory.peak.max()) if a.fit.fits else None


def _smaller_batch(runner: _Runner, lean: Candidate) -> str:
    b = lean.batch_size // 2
    while b >= 1 and _fits(runner, replace(lean, batch_size=b)) is None:
        b //= 2
    if b < 1:
        return "not even micro-batch 1 fits"
    return f"micro-batch {b} fits ({lean.name(runner.mesh.world, runner.has_lora, False)})"


def _more_ranks(runner: _Runner, lean: Candidate, max_factor: int) -> str:
    lean = replace(lean, offload=False)  # an offloaded peak hardly shrinks with more ranks: this one does
    world = runner.mesh.world * 2
    while world <= runner.mesh.world * max_factor and _fits(runner, lean, world) is None:
        world *= 2
    if world > runner.mesh.world * max_factor:
        return f"not even {world // 2} ranks fit"
    return f"{world} ranks fit ({lean.name(world, runner.has_lora, False)}" + (
        f", micro-batch {lean.batch_size})" if lean.batch_size else ")")


def what_would_fit(runner: _Runner, rows: list, max_factor: int = 64) -> str:
    """Nothing fits: say so, and name the smallest world size or micro-batch that would (world
    sizes doubling up to ``max_factor`` times the mesh's)."""
    batch = min((c.batch_size for c, _ in rows if c.batch_size is not None), default=None)
    lean = _lean(runner, batch)
    head = f"nothing fits in {runner.usable_text} on {runner.mesh.world} ranks"
    a = runner.analysis(lean)
    act = a.activation_profile.peak[0] if a.activation_profile is not None else 0
    hints = []
    if act > runner.limit:  # the activations alone: more ranks do not shrink them
        hints.append(f"the activations alone are {format_bytes(act)} ({lean.name(runner.mesh.world, runner.has_lora, False)}"
                     f", micro-batch {batch}), more ranks do not help")
    else:
        hints.append(_more_ranks(runner, lean, max_factor))
    if batch is not None and batch > 1:
        hints.append(_smaller_batch(runner, lean))
    return head + ": " + "; ".join(hints)


# ---------------------------------------------------------------------------
# The result
# ---------------------------------------------------------------------------
class Search:
    """What ``sv.search`` found. ``table``: one row per plan, best first; ``best``: the plan to run
    (None when nothing fits), ``best_mesh`` (the HSDP split), ``best_training`` (the micro-batch
    chosen with ``Training(global_batch=...)``, or offloading turned off; else None) and
    ``best_grad_accum``; ``note``: what the search assumed, or why nothing fits."""

    def __init__(self, rows: list, runner: _Runner, note: str, n_candidates: int, nothing_fits: str = ""):
        self._rows, self._runner = rows, runner
        self.note, self.n_candidates, self.n_analysed = note, n_candidates, runner.n_analysed
        self.device_memory, self.usable_memory = runner.mesh.device_memory, runner.limit
        self.limit_text = runner.mesh.limit_text
        world, vary = runner.mesh.world, runner.training.global_batch is not None
        records, above = [], None
        for c, r in rows:
            why = _why(r, above if r["fits"] else None, runner.limit, runner.usable_text)
            if r["fits"] and r["analysed"]:
                above = r
            name = c.name(world, runner.has_lora, vary)
            if r.get("cache_refused"):
                name += ", priced with use_cache=False (torch cannot run it with the cache)"
            records.append({
                "name": name, "fits": bool(r["fits"]),
                "verdict": r.get("verdict", "fits" if r["fits"] else "over"), "peak": r["peak"],
                "reserved_peak": r.get("reserved_peak"), "margin": r.get("margin"),
                "step_time_s": r.get("step_time_s"), "tokens_per_s": r.get("tokens_per_s"), "mfu": r.get("mfu"),
                "why": why,
                "lora": c.lora if runner.has_lora else None, "checkpoint": c.checkpoint,
                "reshard_after_forward": c.reshard, "replicate": c.replicate, "shard": world // (c.replicate * c.tensor),
                "offload": c.offload, "batch_size": c.batch_size, "grad_accum": c.grad_accum, "analysed": r["analysed"],
                "use_cache": r.get("use_cache", runner.cache_of(c)),
                **({"tensor": c.tensor} if runner.tensors != (1,) else {}),
            })
            if c.tensor > 1 and r.get("tensor_comm_s"):
                records[-1]["why"] += tp_words(c.tensor, r["tensor_comm_s"], r.get("step_time_s"))
        self.table = pd.DataFrame(records, columns=COLUMNS + (["tensor"] if runner.tensors != (1,) else []))
        kept_over_tight = kept_margin_note(rows, lambda c: c.name(world, runner.has_lora, vary))
        if kept_over_tight:
            self.table.loc[0, "why"] = f"{self.table.loc[0, 'why']}; {kept_over_tight}"
        if nothing_fits:
            self.table.loc[0, "why"] = f"{nothing_fits}. This row: {self.table.loc[0, 'why']}"

    @property
    def fits(self) -> bool:
        return bool(len(self.table)) and bool(self.table.fits.iloc[0])

    def candidate(self, i: int = 0) -> tuple[Plan, Mesh, Training]:
        """Row ``i``'s plan, mesh and training, ready for ``sv.analyze``."""
        c = self._rows[i][0]
        return self._runner.plan(c), self._runner.mesh_for(c), self._runner.training_for(c)

    @property
    def best(self) -> Plan | None:
        if not self.fits:
            return None
        plan = self.candidate(0)[0]
        return plan.renamed(f"search: {self.table.name.iloc[0]}")  # its tensor-parallel entries go with best_mesh

    @property
    def best_mesh(self) -> Mesh | None:
        return self.candidate(0)[1] if self.fits else None

    @property
    def best_training(self) -> Training | None:
        if not self.fits:
            return None
        training = self.candidate(0)[2]
        chosen = self._runner.training.global_batch is not None  # the micro-batch was searched: say which
        return training if chosen or training != self._runner.training else None

    @property
    def best_grad_accum(self) -> int | None:
        """Micro-batches per optimizer step of the best plan (1 without ``Training.global_batch``)."""
        return int(self.table.grad_accum.iloc[0]) if self.fits else None

    def formatted(self) -> pd.DataFrame:
        """The table with sizes and times written for people (the CLI prints it)."""
        t = self.table
        size = lambda v: "" if v is None or v != v else format_bytes(v)  # noqa: E731
        return pd.DataFrame({
            "name": t.name, "fits": [("tight" if v == "tight" else "yes") if f else "no" for f, v in zip(t.fits, t.verdict)],
            "peak": [("" if a else ">= ") + size(p) if p is not None and p == p else "" for p, a in zip(t.peak, t.analysed)],
            "margin": t.margin.map(size), "step_time_s": t.step_time_s.map(lambda v: "" if v is None or v != v else f"{v:.3g}"),
            "tokens_per_s": t.tokens_per_s.map(lambda v: "" if v is None or v != v else f"{v:,.0f}"),
            "mfu": t.mfu.map(lambda v: "" if v is None or v != v else f"{100 * v:.1f}%"), "why": t.why})

    def explain(self) -> str:
        """What was chosen and why, in sentences (the notebook and the CLI print it)."""
        return explain(self.table, self.limit_text, self.note if not self.fits else "",
                       self._runner.mesh.fit(0, 0).assumed)

    def figure(self):
        """Peak against step time of every analysed plan, the device memory drawn across."""
        import plotly.graph_objects as go

        t = self.table[self.table.analysed]
        fig = go.Figure()
        for fits, rows in t.groupby("fits"):
            fig.add_trace(go.Scatter(x=rows.step_time_s, y=rows.peak / 2**30, mode="markers", text=rows.name,
                                     name="fits" if fits else "does not fit",
                                     hovertemplate="%{text}<br>%{x:.3f} s, %{y:.2f} GiB<extra></extra>"))
        fig.add_hline(y=self.usable_memory / 2**30, line_dash="dash", annotation_text=self.limit_text)
        fig.update_layout(xaxis_title="step time (s)", yaxis_title="peak per rank (GiB)", height=420,
                          legend_orientation="h")
        return fig

    def __repr__(self) -> str:
        best = self.table.name.iloc[0] if self.fits else "nothing fits"
        return f"<shardviz.Search {self.n_candidates} plans, {self.n_analysed} analyses: {best}>"


def tensor_degrees(runner: _Runner, tensor) -> list[str]:
    """Set ``runner.tensors`` to the degrees of ``tensor`` that can run; the notes on those left out."""
    from ..tp import local_tree
    from ..tp_presets import preset

    kept, notes = [], []
    for t in sorted(set(tensor)):
        why = None if t == 1 else (f"over the {runner.mesh.ranks_per_node} ranks of a node" if t > runner.mesh.ranks_per_node
                                    else f"does not divide {runner.mesh.world} ranks" if runner.mesh.world % t else None)
        if why is None and t > 1:
            try:
                runner.tp_entries = runner.tp_entries or preset(runner.tree, True)
                local_tree(runner.tree, Plan(tensor_parallel=runner.tp_entries).tensor_parallel, t)
            except ValueError as exc:
                why = str(exc)
        if why is None:
            kept.append(t)
        else:
            notes.append(f"tensor parallelism over {t} ranks left out: {why}")
    runner.tensors = tuple(kept) or (1,)
    return notes


def tp_words(tensor: int, tensor_comm_s: float, step_s: float | None) -> str:
    """Why a tensor degree wins or loses, in the row's words: what TP costs on the critical path."""
    share = f" ({100 * tensor_comm_s / step_s:.0f} % of the step)" if step_s else ""
    return (f"; TP {tensor}: model state and activations split {tensor} ways, for {format_duration(tensor_comm_s)} "
            f"of TP collectives on the critical path{share}")


def _inputs(model, mesh: Mesh, training: Training | None) -> tuple[ModelTree, Mesh, Training, list[str]]:
    """The search's tree, mesh (bandwidths filled in), training and the notes on what it assumed;
    ValueError naming the field that is missing or of the wrong kind."""
    if not isinstance(mesh, Mesh):
        raise ValueError(f"search: mesh must be a shardviz.Mesh, got {type(mesh).__name__}")
    if mesh.device_memory is None:
        raise ValueError("search: Mesh.device_memory is needed to tell what fits, e.g. sv.Mesh(64, device_memory='80GiB')")
    training = training if training is not None else DEFAULT_TRAINING  # the one default (cost.training)
    if not isinstance(training, Training):
        raise ValueError(f"search: training must be a shardviz.Training, got {type(training).__name__}")
    notes = []
    if mesh.intra_node_gbps is None or mesh.inter_node_gbps is None:
        mesh = replace(mesh, intra_node_gbps=mesh.intra_node_gbps or DEFAULT_GBPS[0],
                       inter_node_gbps=mesh.inter_node_gbps or DEFAULT_GBPS[1])
        notes.append(f"links assumed: {mesh.intra_node_gbps:g} GB/s inside a node of {mesh.ranks_per_node}, "
                     f"{mesh.inter_node_gbps:g} GB/s across nodes")
    tree = as_tree(model)
    if isinstance(model, ModelTree) and training.batch_size is not None and tree.model is None:
        raise ValueError("search: activations are measured by running the model: pass the nn.Module")
    if mesh.device is not None:
        from ..steptime import efficiency_for

        notes.append("step times assume " + efficiency_for(tree, mesh).describe())
    return tree, mesh, training, notes


def count_candidates(model, mesh: Mesh, training: Training | None = None, *, offload=(False, True), tensor=(1,)) -> int:
    """How many plans ``search`` with these arguments tries (analysed or pruned), without analysing
    any: what a caller shows while the search runs. Raises what ``search`` raises for bad input."""
    tree, mesh, training, _ = _inputs(model, mesh, training)
    runner = _Runner(tree, mesh, training)
    tensor_degrees(runner, tensor)
    return len(candidates(runner, offload))


def search(model, mesh: Mesh, training: Training | None = None, *, offload=(False, True), tensor=(1,)) -> Search:
    """The fastest plan that fits: every candidate (see the module's docstring) analysed or pruned.

    ``tensor``: the tensor-parallel degrees to try, e.g. ``(1, 2, 4, 8)``: each with the model's own
    TP plan, within a node (a degree over the ranks per node, or one the model's heads or widths do
    not divide, is left out and the note says why).
    ``mesh``: the world size, device memory (required: what "fits" means), ranks per node and
    bandwidths (the README table's 450 / 50 GB/s when absent); ``training``: the optimizer, dtypes
    and micro-batch (default ``DEFAULT_TRAINING``: AdamW, bf16 parameters, fp32 reduction, as every
    view and command assumes); with ``global_batch`` the micro-batch and accumulation are searched too.
    """
    tree, mesh, training, notes = _inputs(model, mesh, training)
    runner = _Runner(tree, mesh, training)
    runner.lean_offload = any(offload)
    notes += tensor_degrees(runner, tensor)
    cands = candidates(runner, offload)
    rows = sorted(_run(runner, cands), key=_rank_key(runner.limit))
    for c, r in rows:
        r["offload"] = c.offload
    untimed = next((r["reason"] for _, r in rows if r["analysed"] and r.get("reason")), None)
    if untimed:
        notes.append(f"no step time ({untimed}): the plans that fit are ranked by their collectives' seconds per "
                     "step instead (a.comm, one after another, no compute), then less recomputation, then the "
                     "larger margin; step_time_s and tokens_per_s are empty")
    nothing = what_would_fit(runner, rows) if rows and not rows[0][1]["fits"] else ""
    return Search(rows, runner, "; ".join(([nothing] if nothing else []) + notes), len(cands), nothing)
