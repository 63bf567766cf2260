"""The step's allocations and frees, replayed through the caching allocator (``step.allocator``):
what ``torch.cuda.max_memory_reserved`` would show beside the allocated peak.

``TensorReplay``, an option of the step simulation (``step.simulation``), at each hook allocates and
frees the tensors the hook creates and drops, on the stream FSDP2 uses for them (torch 2.13,
``_fsdp_collectives.py``): all-gather outputs on the all-gather copy-in stream ("ag"), the unsharded
parameters (copy-out), gradients, reduce-scatter inputs and activations on the default stream, the
reduce-scatter outputs (the new sharded gradients) on the reduce-scatter stream ("rs"). The
activations are one block per rise of the measured activation level, freed last-in first-out as
the level falls (forward saves tensors in order, backward frees them in reverse), in the order
the hooks run: a gradient's level leaves out the nested calls' modules that its span covers
(``TensorReplay.own_span``), which were replayed at their own hooks; the step's moments stay
the plain simulation's, so one traced run gives ``a.costs.step`` too. The resident
state (sharded parameters, optimizer states) is allocated first, one block per call.

The reserved peak is ``peak`` + (the replay's reserved peak − its requested peak without the cuBLAS
workspaces): the allocator's rounding, segment sizes, per-stream caches and fragmentation, and
the workspaces cuBLAS allocates through it, on top of the bytes the step's tensors hold.
"""

from __future__ import annotations

import itertools

from .allocator import CachingAllocator, cublas_workspace_bytes
from .simulation import StepResult, StepSimulation


class TensorReplay:
    """The option of ``StepSimulation`` (``tensors=``) that replays each hook's tensors through
    ``allocator``: the simulation calls it at each hook (``sim``: the simulation, whose state it
    reads). It keeps the activations the replay holds in ``sim.act_level`` (the bytes of
    ``act_stack``; -1 until the next moment: a replayed level), so that the simulation's next moment
    reaches ``at_level`` whenever the replay's level differs from the step's."""

    def __init__(self, allocator: CachingAllocator):
        self.alloc = allocator
        self.blocks: dict = {}
        self.grads: dict[int, list] = {}  # per call, the blocks of its unsharded gradients in this backward
        self.act_stack: list = []  # activation blocks, oldest first
        self.context_gather: dict[int, tuple] = {}  # root -> key of its last forward all-gather output
        self.last_rs_input = None
        self.serial = itertools.count()
        self.owners: dict[int, int] | None = None  # module -> the call that manages it (``owner``)
        self.replayed_level: int | None = None  # the next moment's activations in the replay, where they differ

    def own_span(self, sim, k: int, span: tuple) -> tuple:
        """``span`` without the modules of other calls nested in call ``k``: their backward ran
        before these gradients, at their own hooks (replayed there), and its level is gone by now.
        The step simulation counts the span's highest level with these gradients (an upper bound
        of the peak); replayed, that level would be a new allocation at the end of the span (the
        embedding's gradients, after every block's backward: a segment as large as the blocks'
        highest backward level)."""
        tree = sim.act.tree
        if tree is None or len(span) < 2:
            return span
        return tuple(m for m in span if self.owner(sim, m, tree) == k)

    def owner(self, sim, m: int, tree) -> int | None:
        """The call whose parameters' module holds ``m`` most closely (the innermost call around it)."""
        if self.owners is None:
            self.owners = {}
            for j, u in enumerate(sim.units):
                for r in u.modules:
                    self.owners[r] = j
        while m >= 0 and m not in self.owners:
            m = tree.modules[m].parent  # -1 above the root
        return self.owners.get(m)

    # -- the tensors ------------------------------------------------------------------------------
    def take(self, sim, key, size: int, stream: str = "default") -> None:
        if size > 0 and key not in self.blocks:
            self.blocks[key] = self.alloc.malloc(size, stream)

    def drop(self, key) -> None:
        block = self.blocks.pop(key, None)
        if block is not None:
            self.alloc.free(block)

    def drop_all(self, kind: str) -> None:
        for key in [key for key in self.blocks if key[0] == kind]:
            self.drop(key)

    def drop_grads(self, k: int) -> None:
        for block in self.grads.pop(k, ()):
            self.alloc.free(block)

    def at_level(self, sim, level: int) -> None:
        if self.replayed_level is not None:  # this moment replays its own level (``gradients``), not the step's
            level, self.replayed_level = self.replayed_level, None
            sim.act_level = sum(block.requested for block in self.act_stack)
        self.set_activations(sim, int(level))

    def set_activations(self, sim, level: int) -> None:
        """The activations at ``level`` bytes: new ones a block each, the latest freed first."""
        while sim.act_level > level and self.act_stack:
            block = self.act_stack.pop()
            sim.act_level -= block.requested
            self.alloc.free(block)
        if level > sim.act_level:
            self.act_stack.append(self.alloc.malloc(level - sim.act_level))
            sim.act_level = level

    def settle(self, sim, level: int) -> None:
        """Before a hook allocates: the activations fall to ``level`` (the level its moment
        observes) if they are above it. The step simulation observes no moment at a post-forward
        that reshards, so the replay's level is still the previous call's forward peak (its
        transients) when the next call gathers; torch freed those inside that forward, before the
        all-gather and copy-out that follow (DeepSeek-V3 + LoRA, 256 ranks, 1 x 4096, blocks
        checkpointed: the replayed tensors peaked at 91.0 GiB where the step peaks at 76.4)."""
        if self.replayed_level is None and sim.act_level > level:
            self.set_activations(sim, level)

    # -- forward: before the simulation's pre-forward, after its post-forwards ---------------------
    def pre_forward(self, sim, k: int) -> None:
        u = sim.units[k]
        self.settle(sim, int(sim.act.enter("forward", u.modules)[0]))
        if sim.S > 1:
            self.take(sim, ("ag", k), u.gather, "ag")
        self.take(sim, ("param", k), u.gather)  # copy-out into the unsharded parameters
        previous = self.context_gather.pop(u.root, None)
        if previous is not None:
            self.drop(previous)
        self.context_gather[u.root] = ("ag", k)

    def post_forward(self, sim, k: int) -> None:
        u = sim.units[k]
        if u.reshard_after_forward is True:
            self.drop(("param", k))
        elif u.reshard_after_forward is not False:
            self.take(sim, ("post_forward_shard", k), u.gather // u.reshard_after_forward)
            self.drop(("param", k))

    def root_post_forward(self, sim, root: int) -> None:
        previous = self.context_gather.pop(root, None)
        if previous is not None:
            self.drop(previous)

    # -- backward ---------------------------------------------------------------------------------
    def unshard(self, sim, gather) -> None:
        """After the simulation's unshard."""
        if sim.held.prefetched.get(gather.call, 0) > 0:
            self.take(sim, ("ag", gather.call), sim.units[gather.call].gather, "ag")

    def copy_out(self, sim, k: int, act) -> None:
        """Before the simulation's copy-out."""
        self.settle(sim, int(act[0]))
        self.take(sim, ("param", k), sim.units[k].gather)
        self.drop(("post_forward_shard", k))
        self.drop(("ag", k))

    def before_gradients(self, sim, k: int, module, span) -> None:
        own = self.own_span(sim, k, span)
        if module is not None and own != span:  # the step's first moment here counts the whole span, the replay its own
            self.replayed_level = int(sim.act.during("backward", own or (module,))[0])
            sim.act_level = -1  # no level: the next moment reaches at_level, whatever the step's level

    def gradients(self, sim, k: int, new_unsharded: int, new_whole: int) -> None:
        """After the simulation's gradients: the bytes they allocated."""
        if new_unsharded > 0:
            self.grads.setdefault(k, []).append(self.alloc.malloc(new_unsharded))
        if new_whole > 0:  # kept to the optimizer step
            self.alloc.malloc(new_whole)

    def post_backward(self, sim, k: int, reduce: bool) -> None:
        """After the simulation's post-backward."""
        u = sim.units[k]
        self.drop(("param", k))  # resharded
        self.drop(("post_forward_shard", k))
        if not sim.mb.sync:
            if u.converts_grads:
                self.take(sim, ("accumulated", k), u.accumulated_grads)
                self.drop_grads(k)
            return
        if self.last_rs_input is not None:
            self.drop(self.last_rs_input)
        if reduce:
            self.take(sim, ("rs_input", k), u.rs_input)
            self.last_rs_input = ("rs_input", k)
        self.drop_grads(k)
        self.drop(("accumulated", k))
        if reduce:
            key = ("rs_output", k, next(self.serial))
            self.take(sim, key, u.rs_output, "rs")
            if not (u.offload or u.cast) and ("sharded_grad", k) not in self.blocks:
                self.blocks[("sharded_grad", k)] = self.blocks.pop(key)  # the output is the sharded gradient
                return
            if not u.offload and u.cast:  # cast into a new sharded gradient in the post-reduce stream
                self.take(sim, ("sharded_grad", k), u.sharded_grads, "rs")
            self.drop(key)

    def end_backward(self, sim) -> None:
        """After the simulation's backward."""
        if self.last_rs_input is not None:  # finalize_backward drops the last reduce-scatter input
            self.drop(self.last_rs_input)
            self.last_rs_input = None
        self.drop_all("ag")


def traced_step(units, root_posts, unmanaged_grads, averaging, levels, shard, replicate, grad_accum, sync_every,
                resident_bytes: int, step_temporaries: int, expandable_segments: bool,
                device=None) -> tuple[StepResult, CachingAllocator]:
    """The step (``StepSimulation.run``'s result) and the allocator after the resident state (and
    ``device``'s cuBLAS workspaces, ``cublas_workspace_bytes``), that step (forward, backward) and the
    optimizer step's temporaries: its peaks of requested, allocated and reserved bytes."""
    alloc = CachingAllocator(expandable_segments=expandable_segments)
    for _ in range(2 if cublas_workspace_bytes(device) else 0):
        alloc.malloc(cublas_workspace_bytes(device) // 2)
    gathers = sum(u.gather for u in units) or 1
    for u in units:  # the resident state, one block per call in proportion to its parameters
        share = resident_bytes * u.gather // gathers
        if share > 0:
            alloc.malloc(share)
    replay = TensorReplay(alloc)
    sim = StepSimulation(units, root_posts, unmanaged_grads, averaging, levels, shard, replicate,
                         grad_accum, sync_every, tensors=replay)
    step = sim.run()
    replay.set_activations(sim, 0)
    if step_temporaries > 0:
        alloc.free(alloc.malloc(step_temporaries))
    return step, alloc
