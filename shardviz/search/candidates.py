"""The plans ``sv.search`` tries: one ``Candidate`` per LoRA layout x checkpointing x cache x tensor
degree x HSDP split x reshard x offload x micro-batch, in the order pruning needs (``candidates``).
The ``search.space.Space`` they are given answers which checkpointing each preset gives and
whether a step keeps the key/value cache; ``pruning.pruning_order`` sets the order they run in.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checks import CHECKPOINT_FIXES
from ..run.training import Training
from ..run.mesh import Mesh
from ..plan import LORA_OPTIONS

SHORT_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def quant_words(kinds, dtypes) -> dict[str, str]:
    """The storage knob's words for a model whose quantized weights are of ``kinds`` ("nf4", "int8", ...:
    ``quant.quant_kind``) stored in ``dtypes`` (torch dtypes): each option named by what the model has."""
    storage = "/".join(sorted({SHORT_DTYPES.get(str(d).replace("torch.", ""), str(d).replace("torch.", ""))
                               for d in dtypes}))
    what = f"{'/'.join(sorted(set(kinds)))} ({storage} storage)"
    return {"sharded": f"{what} sharded",
            "replicated": f"{what} replicated (ignored_params, as accelerate does with uint8 storage)"}


QUANT_OPTIONS = ("sharded", "replicated")  # sharded first: it holds less

# Most checkpointed first: a plan is pruned when one that checkpoints more is already over.
CHECKPOINTS = (*CHECKPOINT_FIXES, "selective", None)  # SV201 tries the same (checks.CHECKPOINT_FIXES)


@dataclass(frozen=True)
class Candidate:
    """One plan the search tries: a preset, its options, the mesh split and the micro-batch."""

    lora: str = "sharded"
    checkpoint: str | None = None
    reshard_after_forward: bool | int | None = None  # None: torch's default (True, the root False)
    replicate: int = 1
    offload: bool = False
    batch_size: int | None = None
    grad_accum: int = 1
    use_cache: bool | None = None  # None: the training's (Training.step_use_cache)
    tensor: int = 1  # tensor-parallel degree (the model's own TP plan) inside a node
    # bitsandbytes 4-bit weights (None: the model has none): "sharded" (a floating bnb_4bit_quant_storage,
    # bf16: FSDP2 shards the packed data) or "replicated" (uint8 storage: accelerate's fsdp2_prepare_model
    # puts every Params4bit in ignored_params, each rank holds them whole)
    quant: str | None = None

    def name(self, world: int, has_lora: bool, vary_batch: bool, quant: dict[str, str] | None = None) -> str:
        """``quant``: the storage knob's words for the model (``quant_words``)."""
        parts = [f"LoRA {self.lora}"] if has_lora else []
        parts.append({None: "no checkpointing", "blocks": "checkpoint every block",
                      "selective": "selective checkpointing"}.get(self.checkpoint, f"checkpoint {self.checkpoint}"))
        if self.reshard_after_forward is False:
            parts.append("no reshard after forward")
        elif self.reshard_after_forward is not None:
            parts.append(f"reshard to {self.reshard_after_forward} ranks")
        dp = world // self.tensor
        parts.append((f"HSDP {self.replicate}x{dp // self.replicate}" if self.replicate > 1 else f"FSDP {dp}")
                     + (f" x TP {self.tensor}" if self.tensor > 1 else ""))
        if self.quant:
            parts.append((quant or {}).get(self.quant, f"quantized weights {self.quant}"))
        if self.offload:
            parts.append("CPU offload")
        if vary_batch:
            parts.append(f"micro-batch {self.batch_size} x {self.grad_accum}")
        if self.use_cache is not None:
            parts.append(f"use_cache={self.use_cache}")
        return ", ".join(parts)

    @property
    def state_key(self) -> tuple:
        return (self.lora, self.reshard_after_forward, self.replicate, self.offload, self.tensor, self.quant)


# ---------------------------------------------------------------------------
# The candidates
# ---------------------------------------------------------------------------
def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _micro_batches(mesh: Mesh, training: Training) -> list[tuple[int | None, int]]:
    """(micro-batch, accumulation) pairs, smallest micro-batch first."""
    if training.global_batch is None:
        return [(training.batch_size, training.grad_accum)]
    per_rank, rest = divmod(training.global_batch, mesh.world)
    if rest:
        raise ValueError(f"Training.global_batch={training.global_batch} is not a multiple of the world size "
                         f"{mesh.world}: every rank trains whole sequences")
    return [(b, per_rank // b) for b in _divisors(per_rank)]


def _reshards(mesh: Mesh, replicate: int) -> list[bool | int | None]:
    shard, node = mesh.world // replicate, mesh.ranks_per_node
    return [None, False] + ([node] if shard > node and shard % node == 0 else [])


def _distinct_checkpoints(runner) -> list[str | None]:
    """The checkpoint presets that checkpoint different blocks ("every 3" of 2 blocks is none), in
    the order of ``CHECKPOINTS``; of two that agree, the plainer name stays (none, then blocks)."""
    seen: dict = {}
    for ckpt in (None, "blocks") + tuple(c for c in CHECKPOINTS if c not in (None, "blocks")):
        key = runner.plan(Candidate(checkpoint=ckpt)).checkpoint
        seen.setdefault(key, ckpt)
    return [c for c in CHECKPOINTS if c in seen.values()]


def candidates(runner, offload=(False, True)) -> list[Candidate]:
    """Every candidate, in the order pruning needs: micro-batch, then checkpointing, most first."""
    layouts = LORA_OPTIONS if runner.has_lora else ("sharded",)
    with_batch = runner.training.batch_size is not None or runner.training.global_batch is not None
    checkpoints = _distinct_checkpoints(runner) if with_batch else (None,)
    quants = QUANT_OPTIONS if runner.has_quant else (None,)
    out = []
    for batch, accum in _micro_batches(runner.mesh, runner.training):
        for ckpt in checkpoints:
            # the cache as a knob: without it first (it holds less), where the step would keep it
            caches = (False, None) if with_batch and runner.cache_of(Candidate(checkpoint=ckpt)) else (None,)
            for cache in caches:
                for lora in layouts:
                    for tensor in runner.tensors:
                        for replicate in _divisors(runner.mesh.world // tensor):
                            for reshard in _reshards(runner.mesh, replicate * tensor):
                                out += [Candidate(lora, ckpt, reshard, replicate, off, batch, accum, cache, tensor, q)
                                        for q in quants for off in offload]
    return out
