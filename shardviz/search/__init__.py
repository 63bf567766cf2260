"""``sv.search``: the fastest plan that fits, among the plans a user would otherwise try by hand.

Candidates (``candidates.py``): LoRA ignored / sharded / separate (when the model has LoRA);
checkpointing of every block, every 2nd, every 3rd, selective (torchtitan's op policy), none;
``reshard_after_forward`` as torch sets it, ``False``, or an int (one node's ranks) when the shard
group spans nodes; every HSDP split of the world size; CPU offload; for a model with bitsandbytes
4-bit weights, their storage (bf16: FSDP2 shards the packed data; uint8: accelerate keeps them whole on
every rank, as ``ignored_params``: ``Candidate.quant``); and, with
``Training(global_batch=...)``, every micro-batch and accumulation that give that batch. The
key/value cache is a knob too: where a plan's step keeps it (``Training.step_use_cache``: the
config's ``use_cache=True`` without checkpointing), the same plan with ``use_cache=False`` is a
candidate of its own (it holds less). A plan torch cannot run with the cache is priced without it,
its name says so.

Every candidate that could fit is analysed by ``analyze`` (``running.py``): activations are
measured by torch once per LoRA layout x checkpointing x micro-batch (the analysis' profile
cache), and shared by every mesh, reshard and offload option. Candidates that cannot fit are not
analysed (pruned), each with its reason (``pruning.py``: the model state alone is over, the
activations alone are, a plan holding less is, the same plan on fewer replicas is, the unsharded
parameters kept after forward are, or a smaller micro-batch fits with no plan). The pruned set
does not depend on the order of the candidates.

An offloaded plan's verdict includes the host (``MemoryFit.host``: the worst rank's host RAM times the
ranks of a node, judged against ``Mesh.host_memory``): its row says the host's part (the ``host``
column: bytes per node), and a plan the device holds but the host does not is over, its ``why`` says so.

The plans that fit are ranked (``rank.py``, ``ranked``) by ``a.step.step_time_s`` (the step model,
``step/timing.py``: the mesh needs a ``device``), differences under 1 % of the step being ties
(``STEP_TIME_TIE``, below what the step model can tell), decided by keeping the safety margin, no
CPU offload, the larger margin, then the simpler plan (fewer calls; FSDP before HSDP; LoRA sharded
before ignored before separate): ``rank.ranked``. ``why`` says a plan's difference to the one above it in % of the step: the
tie and what decided it, or the parts of the step that make it slower (recomputation, exposed
collectives, offload copies, the optimizer).
Without a device there is no step time: the search says so in ``note`` and ranks by the
collectives' seconds instead.
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from ..run.training import Training
from ..run.training import DEFAULT_TRAINING
from ..format import format_bytes, format_percent, format_rate
from ..run.mesh import Mesh
from ..plan import Plan
from ..model.tree import ModelTree, as_tree
from .candidates import CHECKPOINTS, Candidate, candidates
from .rank import COLUMNS, explain, ranked, step_numbers, table
from .rows import Measured, Pruned, Row, Rule
from .running import run, what_would_fit
from .space import Space, tensor_degrees

__all__ = ["CHECKPOINTS", "COLUMNS", "Candidate", "Measured", "Pruned", "Row", "Rule", "Search", "count_candidates",
           "search", "step_numbers"]

DEFAULT_GBPS = (450.0, 50.0)  # inside a node / across nodes when the mesh gives none (the README's table)


def search(model, mesh: Mesh, training: Training | None = None, *, offload=(False, True), tensor=(1,),
           progress=None, resume: dict | None = None, workers: int = 1) -> Search:
    """The fastest plan that fits: every candidate (see the module's docstring) analysed or pruned.

    ``tensor``: the tensor-parallel degrees to try, e.g. ``(1, 2, 4, 8)``: each with the model's own
    TP plan, within a node (a degree over the ranks per node, or one the model's heads or widths do
    not divide, is left out and the note says why).
    ``mesh``: the world size, device memory (required: what "fits" means), ranks per node and
    bandwidths (the README table's 450 / 50 GB/s when absent); ``training``: the optimizer, dtypes
    and micro-batch (default ``DEFAULT_TRAINING``: AdamW, bf16 parameters, fp32 reduction, as every
    view and command assumes); with ``global_batch`` the micro-batch and accumulation are searched too.
    ``progress``: called as ``progress(done, total)`` after each candidate (the Inspector's Suggest
    shows it while the search runs).
    ``resume``: a dict the search fills with each analysed plan's row; given again to a search of
    the same model and arguments (one stopped midway: the Inspector's look-ahead, cancelled by the
    Suggest click), the plans it holds are not analysed again. The rows are the same either way.
    ``workers=2``: the plans are analysed by this process and a forked copy of it, on two cores
    (Linux; ``SHARDVIZ_FORK=0`` turns it off); the rows are the same (``running.run``).
    """
    space, notes = _space(model, mesh, training, offload, tensor)
    cands = candidates(space, offload)
    rows, n_analysed = run(space, cands, progress, resume, workers)
    rows = ranked(rows, space.limit)
    untimed = next((r.untimed for r in rows if r.analysed and r.untimed), None)
    if untimed:
        notes.append(f"no step time ({untimed}): the plans that fit are ranked by their collectives' seconds per "
                     "step instead (a.comm, one after another, no compute; differences under 1 % are ties), then less "
                     "recomputation, the larger margin, the simpler plan; step_time_s and tokens_per_s are empty")
    nothing = ""
    if rows and not rows[0].fits:
        nothing, tries = what_would_fit(space, rows)
        n_analysed += tries
    return Search(rows, space, "; ".join(([nothing] if nothing else []) + notes), len(cands), n_analysed, nothing)


def count_candidates(model, mesh: Mesh, training: Training | None = None, *, offload=(False, True), tensor=(1,)) -> int:
    """How many plans ``search`` with these arguments tries (analysed or pruned), without analysing
    any: what a caller shows while the search runs. Raises what ``search`` raises for bad input."""
    space, _ = _space(model, mesh, training, offload, tensor)
    return len(candidates(space, offload))


class Search:
    """What ``sv.search`` found. ``table``: one row per plan, best first; ``best``: the plan to run
    (None when nothing fits), ``best_mesh`` (the HSDP split), ``best_training`` (the micro-batch
    chosen with ``Training(global_batch=...)``, or offloading turned off; else None) and
    ``best_grad_accum``; ``note``: what the search assumed, or why nothing fits; ``rows``: the typed
    rows (``Measured`` / ``Pruned``) in the table's order."""

    def __init__(self, rows: list[Row], space: Space, note: str, n_candidates: int, n_analysed: int,
                 nothing_fits: str = ""):
        self.rows, self._space = rows, space
        self.note, self.n_candidates, self.n_analysed = note, n_candidates, n_analysed
        self.device_memory, self.usable_memory = space.mesh.device_memory, space.limit
        self.limit_text = space.mesh.limit_text
        self.table = table(rows, space)
        if nothing_fits:
            self.table.loc[0, "why"] = f"{nothing_fits}. This row: {self.table.loc[0, 'why']}"

    @property
    def fits(self) -> bool:
        return bool(len(self.table)) and bool(self.table.fits.iloc[0])

    def candidate(self, i: int = 0) -> tuple[Plan, Mesh, Training]:
        """Row ``i``'s plan, mesh and training, ready for ``sv.analyze``."""
        c = self.rows[i].candidate
        return self._space.plan(c), self._space.mesh_for(c), self._space.training_for(c)

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
        chosen = self._space.training.global_batch is not None  # the micro-batch was searched: say which
        return training if chosen or training != self._space.training else None

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
            # the judged peak beside its margin (judged + margin = usable); a pruned row: its allocated lower bound
            "judged_peak": [size(j) if a else (">= " + size(p) if p is not None and p == p else "")
                            for p, j, a in zip(t.peak, t.judged_peak, t.analysed)],
            "margin": t.margin.map(size), "step_time_s": t.step_time_s.map(lambda v: "" if v is None or v != v else f"{v:.3g}"),
            "tokens_per_s": t.tokens_per_s.map(lambda v: "" if v is None or v != v else format_rate(v)),
            "mfu": t.mfu.map(lambda v: "" if v is None or v != v else format_percent(v)), "why": t.why})

    def explain(self) -> str:
        """What was chosen and why, in sentences (the notebook and the CLI print it)."""
        return explain(self.table, self.limit_text, self.note if not self.fits else "",
                       self._space.mesh.fit(0, 0).assumed)

    def figure(self):
        """Peak against step time of every analysed plan, the device memory drawn across."""
        import plotly.graph_objects as go

        t = self.table[self.table.analysed]
        fig = go.Figure()
        for fits, rows in t.groupby("fits"):
            fig.add_trace(go.Scatter(x=rows.step_time_s, y=rows.judged_peak / 2**30, mode="markers", text=rows.name,
                                     name="fits" if fits else "does not fit",
                                     hovertemplate="%{text}<br>%{x:.3f} s, %{y:.2f} GiB<extra></extra>"))
        fig.add_hline(y=self.usable_memory / 2**30, line_dash="dash", annotation_text=self.limit_text)
        fig.update_layout(xaxis_title="step time (s)", yaxis_title="judged peak per rank (GiB)", height=420,
                          legend_orientation="h")
        return fig

    def __repr__(self) -> str:
        best = self.table.name.iloc[0] if self.fits else "nothing fits"
        return f"<shardviz.Search {self.n_candidates} plans, {self.n_analysed} analyses: {best}>"


def _space(model, mesh: Mesh, training: Training | None, offload, tensor) -> tuple[Space, list[str]]:
    """The search's ``Space`` and the notes on what it assumed (links, efficiencies, tensor degrees)."""
    tree, mesh, training, notes = _inputs(model, mesh, training)
    tensors, tp_entries, tp_notes = tensor_degrees(tree, mesh, tensor)
    return Space(tree, mesh, training, tensors, tp_entries, lean_offload=any(offload)), notes + tp_notes


def _inputs(model, mesh: Mesh, training: Training | None) -> tuple[ModelTree, Mesh, Training, list[str]]:
    """The search's tree, mesh (bandwidths filled in), training and the notes on what it assumed;
    ValueError naming the field that is missing or of the wrong kind."""
    if not isinstance(mesh, Mesh):
        raise ValueError(f"search: mesh must be a shardviz.Mesh, got {type(mesh).__name__}")
    if mesh.device_memory is None:
        raise ValueError("search: Mesh.device_memory is needed to tell what fits, e.g. sv.Mesh(64, device_memory='80GiB')")
    training = training if training is not None else DEFAULT_TRAINING  # the one default (run.training)
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
        from ..step.timing import efficiency_for

        notes.append("step times assume " + efficiency_for(tree, mesh).describe())
    return tree, mesh, training, notes
