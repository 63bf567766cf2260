"""The caching allocator model (``step.allocator``) against the rules of torch's
``c10/cuda/CUDACachingAllocator.cpp`` (the constants are read from torch's own header where the
wheel ships it), and the reserved peak of a step (``step.reserved``, ``a.memory.reserved_peak``).

torch exposes none of these rules on a CPU build; on a machine with CUDA the last test replays
the same requests through torch's own allocator and compares ``torch.cuda.memory_reserved``.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
import torch

import shardviz as sv
from shardviz import zoo
from shardviz.step import allocator as al
from shardviz.step.reserved import traced_step

MiB = 1 << 20
HEADER = Path(torch.__file__).parent / "include/c10/core/AllocatorConfig.h"


@pytest.mark.skipif(not HEADER.exists(), reason="this torch wheel ships no c10 headers")
def test_the_constants_are_torchs_own():
    text = HEADER.read_text()
    for name, value in (("kSmallBuffer", al.K_SMALL_BUFFER), ("kMinBlockSize", al.K_MIN_BLOCK_SIZE),
                        ("kSmallSize", al.K_SMALL_SIZE), ("kMinLargeAlloc", al.K_MIN_LARGE_ALLOC),
                        ("kRoundLarge", al.K_ROUND_LARGE)):
        assert int(re.search(rf"constexpr size_t {name} = (\d+);", text).group(1)) == value, name


@pytest.mark.parametrize("size, rounded", [(1, 512), (512, 512), (513, 1024), (MiB + 1, MiB + 512)])
def test_round_size_is_a_multiple_of_512(size, rounded):
    assert al.round_size(size) == rounded


def test_roundup_power2_divisions_as_torch_documents_it():
    """The CUDA notes' own example: 1200 with 4 divisions between 1024 and 2048 rounds to 1280."""
    assert al.round_size(1200 * MiB, 4) == 1280 * MiB
    assert al.round_size(1024 * MiB, 4) == 1024 * MiB  # a power of two stays
    assert al.round_size(1700 * MiB, 4) == 1792 * MiB and al.round_size(1800 * MiB, 4) == 2048 * MiB
    assert al.round_size(1000, 4) == 1024  # under 512 B x divisions: the 512 B rule


@pytest.mark.parametrize("rounded, segment", [(512, 2 * MiB), (MiB, 2 * MiB), (MiB + 512, 20 * MiB),
                                              (10 * MiB - 512, 20 * MiB), (10 * MiB, 10 * MiB),
                                              (11 * MiB + 512, 12 * MiB)])
def test_segment_sizes(rounded, segment):
    assert al.allocation_size(rounded) == segment


def test_small_requests_pack_into_2_mib_segments():
    a = al.CachingAllocator()
    blocks = [a.malloc(700 * 1024) for _ in range(3)]  # 2 fit in 2 MiB, the third opens a second segment
    assert a.reserved == 4 * MiB and a.allocated == 3 * 700 * 1024
    for b in blocks:
        a.free(b)
    assert a.allocated == 0 and a.reserved == 4 * MiB  # cached, not returned to CUDA


def test_requests_between_1_and_10_mib_share_a_20_mib_segment():
    a = al.CachingAllocator()
    a.malloc(5 * MiB), a.malloc(5 * MiB)
    assert a.reserved == 20 * MiB


def test_a_cached_block_serves_only_its_own_stream():
    a = al.CachingAllocator()
    a.free(a.malloc(100 * MiB, "ag"))
    a.malloc(100 * MiB, "ag")
    assert a.reserved == 100 * MiB
    a.malloc(100 * MiB, "default")
    assert a.reserved == 200 * MiB


def test_large_blocks_split_only_when_more_than_1_mib_is_left():
    a = al.CachingAllocator()
    a.free(a.malloc(100 * MiB))
    whole = a.malloc(100 * MiB - 512 * 1024)  # 512 KiB left: not split, the whole block is allocated
    assert a.allocated == 100 * MiB and a.requested == 100 * MiB - 512 * 1024
    a.free(whole)
    a.malloc(50 * MiB)  # split
    assert a.allocated == 50 * MiB and a.reserved == 100 * MiB


def test_freed_neighbours_merge():
    b = al.CachingAllocator()
    seg = b.malloc(80 * MiB)
    b.free(seg)
    x, y = b.malloc(40 * MiB), b.malloc(40 * MiB)  # both split from the cached 80 MiB block
    b.free(x), b.free(y)
    b.malloc(80 * MiB)  # served by the merged block
    assert b.reserved == 80 * MiB


def test_a_request_takes_the_smallest_cached_block_that_fits():
    """``get_free_block``: the smallest free block of the pool that is large enough, wherever it
    was cached (the cache is kept sorted: a first fit would take the 40 MiB block)."""
    a = al.CachingAllocator()
    blocks = [a.malloc(size * MiB) for size in (40, 12, 30, 16)]
    for block in blocks:
        a.free(block)
    reserved = a.reserved
    assert a.malloc(14 * MiB).segment is blocks[3].segment
    assert a.malloc(11 * MiB).segment is blocks[1].segment
    assert a.malloc(20 * MiB).segment is blocks[2].segment
    assert a.reserved == reserved
    a.malloc(41 * MiB)  # no cached block fits: a new segment
    assert a.reserved == reserved + 42 * MiB


def test_a_tie_between_equal_cached_blocks_goes_to_the_oldest_segment():
    """torch breaks a tie between equal free blocks by pointer; the model takes the segments in the
    order they were cudaMalloc'd. It took id(segment): where Python put the objects, so a reserved
    peak changed with the process's heap (qwen3-30B-A3B, one rank, grad_accum=3: 5.68 or 5.71 GB).
    Here the heap hands the later segments lower addresses."""
    junk = sorted((al.Segment("junk", False, 0, []) for _ in range(64)), key=id)
    while junk:
        junk.pop(0)  # freed lowest address first: the heap hands them back highest first
    a = al.CachingAllocator()
    blocks = [a.malloc(30 * MiB) for _ in range(8)]
    assert sorted(blocks, key=lambda b: id(b.segment)) != blocks  # the case this test is about
    for block in blocks:
        a.free(block)
    assert a.malloc(30 * MiB).segment is blocks[0].segment


def test_max_split_size_keeps_small_requests_off_oversize_blocks():
    a = al.CachingAllocator(max_split_size=50 * MiB)
    a.free(a.malloc(100 * MiB))
    a.malloc(20 * MiB)
    assert a.reserved == 120 * MiB  # not carved out of the 100 MiB block
    b = al.CachingAllocator()
    b.free(b.malloc(100 * MiB))
    b.malloc(20 * MiB)
    assert b.reserved == 100 * MiB


def test_expandable_segments_grow_a_free_last_block():
    """30 MiB, freed, then 50 MiB: cudaMalloc'd segments hold 30 + 50; an expandable segment maps
    40 MiB (two 20 MiB pages) and grows its free last block by one page."""
    plain, grown = al.CachingAllocator(), al.CachingAllocator(expandable_segments=True)
    for a in (plain, grown):
        a.free(a.malloc(30 * MiB))
        a.malloc(50 * MiB)
    assert plain.reserved == 80 * MiB and grown.reserved == 60 * MiB


@pytest.mark.parametrize("expandable", [False, True])
def test_the_blocks_of_a_segment_tile_it_and_free_neighbours_are_merged(expandable):
    """Blocks are linked to their neighbours (``Block.prev``/``next``): after any malloc / free,
    each segment's blocks cover it end to end, no two free blocks are adjacent, and the cache
    holds exactly the free blocks."""
    import random

    rng = random.Random(1)
    a, live, segments = al.CachingAllocator(expandable_segments=expandable), [], set()
    for _ in range(300):
        if live and rng.random() < 0.45:
            a.free(live.pop(rng.randrange(len(live))))
        else:
            live.append(a.malloc(rng.choice([rng.randrange(1, MiB), rng.randrange(MiB, 30 * MiB)]),
                                 rng.choice(["default", "ag"])))
            segments.add(live[-1].segment)
        cached = set()
        for seg in segments:
            blocks = seg.blocks()
            assert [b.offset for b in blocks] == [0] + [b.offset + b.size for b in blocks[:-1]]
            assert blocks[-1].offset + blocks[-1].size == seg.size
            assert all(b.allocated or c.allocated for b, c in zip(blocks, blocks[1:]))
            cached |= {id(b) for b in blocks if not b.allocated}
        assert cached == {id(entry[-1]) for cache in a.free_blocks.values() for entry in cache}
        assert a.allocated == sum(b.size for b in live) and a.reserved == sum(seg.size for seg in segments)


@pytest.mark.parametrize("forget", [False, True])
def test_a_forgotten_allocator_leaves_no_cycles_to_the_gc(forget):
    """``forget`` unlinks the blocks and segments (cycles: segment <-> block, block <-> neighbour):
    dropped, they are freed by reference counting, and the cyclic GC finds nothing of them."""
    import gc
    import random

    rng = random.Random(2)
    gc.collect()
    a, live = al.CachingAllocator(), []
    for _ in range(200):
        if live and rng.random() < 0.4:
            a.free(live.pop(rng.randrange(len(live))))
        else:
            live.append(a.malloc(rng.randrange(1, 30 * MiB)))
    if forget:
        a.forget()
    del a, live
    # count only the allocator's objects among what the collector finds (other tests' threads
    # may leave garbage of their own meanwhile)
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        found = sum(isinstance(o, (al.Block, al.Segment)) for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert (found == 0) == forget


@functools.lru_cache(maxsize=None)
def step(checkpoint, expandable=False, batch=8, seq=2048):
    m = zoo.tiny_llama_lora()
    plan = sv.Plan.auto(m, lora="sharded", checkpoint=checkpoint)
    return sv.analyze(m, plan, sv.Mesh(8, expandable_segments=expandable), sv.Training(batch_size=batch, seq_len=seq))


@pytest.mark.parametrize("checkpoint", [None, "blocks"])
def test_the_replay_holds_what_the_step_simulation_holds(checkpoint):
    """The replayed tensors peak where the simulated step does (the same hooks, the same sizes)."""
    c = step(checkpoint).costs
    resident = int(c.resident.total + c.optimizer.device.max() + c.optimizer.whole)
    alloc = traced_step(*c.replay_inputs, resident, int(c.optimizer.step_temporaries.max()), False)[1]
    peak = int(step(checkpoint).memory.peak.max())
    assert abs(alloc.peak_requested - peak) <= 0.03 * peak
    # everything the step allocated was freed but the sharded gradients (kept for optimizer.step())
    assert abs(alloc.requested - resident - c.resident.grads) <= 0.01 * c.resident.grads


@pytest.mark.parametrize("checkpoint", [None, "blocks"])
def test_reserved_is_above_allocated_and_expandable_segments_reserve_less(checkpoint):
    plain, grown = step(checkpoint).memory, step(checkpoint, True).memory
    assert (plain.reserved_peak >= plain.peak).all() and (grown.reserved_peak >= grown.peak).all()
    assert (grown.peak == plain.peak).all()
    assert grown.reserved_peak.max() < plain.reserved_peak.max()


def test_one_rank_has_no_all_gather_stream():
    """Without sharding there is no all-gather output: one stream fewer keeps a cache."""
    c = step(None).costs
    alloc = traced_step(*c.replay_inputs, 0, 0, False)[1]
    streams = {seg_stream for seg_stream, _ in alloc.free_blocks}
    assert {"default", "ag", "rs"} <= streams
    m = zoo.tiny_llama_lora()
    one = sv.analyze(m, sv.Plan.auto(m), sv.Mesh(1), sv.Training(batch_size=2, seq_len=64)).costs
    assert "ag" not in {s for s, _ in traced_step(*one.replay_inputs, 0, 0, False)[1].free_blocks}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: torch's own allocator")
def test_the_model_reserves_what_torchs_allocator_reserves():
    """The same requests through torch's caching allocator and through the model (one stream,
    sizes across both pools), after emptying torch's cache."""
    import random

    rng = random.Random(0)
    torch.cuda.empty_cache()
    base, base_allocated = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
    model, live, held = al.CachingAllocator(), [], []
    for _ in range(400):
        if live and rng.random() < 0.45:
            i = rng.randrange(len(live))
            model.free(live.pop(i))
            held.pop(i)
            continue
        size = rng.choice([rng.randrange(1, 1 << 20), rng.randrange(1 << 20, 10 << 20), rng.randrange(10 << 20, 200 << 20)])
        live.append(model.malloc(size))
        held.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
    assert torch.cuda.memory_reserved() - base == model.reserved
    assert torch.cuda.memory_allocated() - base_allocated == model.allocated


def test_the_replay_holds_no_block_activations_after_the_blocks_backward():
    """torchtitan's layout: a call per block, then the root call holding the embedding and the
    output. The embedding's gradients come after every block's backward, whose activations are
    freed by then: the replay must not allocate the blocks' backward level again there (it did:
    a segment as large as that level at the end of backward, 34 GiB on Llama-3.1-8B)."""
    from shardviz.step.reserved import TensorReplay
    from shardviz.step.simulation import StepSimulation

    m = zoo.tiny_llama_lora(lora=False)
    blocks = [f"model.layers.{name}" for name, _ in m.model.layers.named_children()]
    plan = sv.Plan.auto(m).with_units([sv.Unit(b) for b in blocks] + [""])
    c = sv.analyze(m, plan, sv.Mesh(8), sv.Training(batch_size=4, seq_len=256)).costs
    units, levels = c.replay_inputs[0], c.replay_inputs[4]
    block_roots = {r for u in units if u.modules != (0,) for r in u.modules}
    tree = levels.tree

    # the root's own modules that forward runs before the blocks (the embedding): backward after them
    before = [i for i in range(len(tree.modules)) if tree.modules[i].subtree_end <= min(block_roots)]
    bound = max(levels.during("backward", (i,))[0] for i in before)
    first_block = min(k for k, u in enumerate(units) if u.modules != (0,))
    late = []

    class Watched(StepSimulation):
        blocks_done = False

        def post_backward(self, k, reduce):
            super().post_backward(k, reduce)
            self.blocks_done |= k == first_block

        def observe(self, phase, k, **moment):
            super().observe(phase, k, **moment)
            if self.blocks_done:  # the activations the replay holds at this moment
                late.append(self.act_level)

    Watched(*c.replay_inputs, tensors=TensorReplay(al.CachingAllocator())).run()
    blocks_peak = max(levels.during("backward", (r,))[0] for r in block_roots)
    assert late and blocks_peak > bound  # the case this test is about
    assert max(late) <= bound


def test_the_replay_frees_a_calls_forward_transients_before_the_next_call_gathers():
    """The step simulation observes no moment at a post-forward that reshards, so the replay's
    activations stayed at the previous call's forward peak (its transients) while the next call's
    all-gather output and unsharded parameters were allocated: tensors torch never holds together.
    DeepSeek-V3 + LoRA on 256 ranks, 1 x 4096, blocks checkpointed: the replayed tensors peaked at
    91.0 GiB where the step peaks at 76.4 GiB (its reserved peak then read 121.5 for 136.1 GiB)."""
    from shardviz.step.reserved import TensorReplay
    from shardviz.step.simulation import StepSimulation

    c = step("blocks").costs
    units, levels = c.replay_inputs[0], c.replay_inputs[4]
    above = []

    class Watched(TensorReplay):
        def take(self, sim, key, size, stream="default"):
            if key[0] in ("ag", "param") and self.replayed_level is None and sim.act_level >= 0:
                phase = "forward" if sim.phase == "forward" else "backward"
                enter = int(levels.enter(phase, units[key[1]].modules)[0])
                if phase == "forward" and sim.act_level > enter:
                    above.append((key, sim.act_level - enter))
            super().take(sim, key, size, stream)

    class Phased(StepSimulation):
        def forward(self):
            self.phase = "forward"
            super().forward()
            self.phase = "backward"

    sim = Phased(*c.replay_inputs, tensors=Watched(al.CachingAllocator()))
    sim.phase = "forward"
    sim.run()
    assert not above, above[:3]
