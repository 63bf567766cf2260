"""The caching allocator model (``step.allocator``), rule by rule, against torch's
``c10/cuda/CUDACachingAllocator.cpp`` (``DeviceCachingAllocator``; read at pytorch/pytorch
001074d2, the constants checked against torch 2.13's own ``include/c10/core/AllocatorConfig.h`` in
test_allocator.py).

Each rule is one scenario: a sequence of mallocs and frees on named streams, and after each step the
bytes reserved (``memory_reserved``: segments), allocated (``memory_allocated``: block sizes) and
reserved in the small pool, worked out from the quoted source lines. On a CPU the model must give
those numbers; on a machine with CUDA, ``test_torchs_allocator_gives_every_scenarios_numbers``
replays every scenario through torch's own allocator (a subprocess per ``PYTORCH_CUDA_ALLOC_CONF``,
one fresh stream per scenario stream, after ``empty_cache``) and reads the same three numbers from
``torch.cuda.memory_stats``: the expected numbers are then torch's, not ours.

Rules the model does not follow (each stated where it matters):

- ``release_available_cached_blocks`` / ``release_cached_blocks``: when cudaMalloc fails torch
  frees cached unsplit segments (oversize ones first with ``max_split_size_mb``) and retries, and
  ``unmap_block`` returns the free pages of expandable segments. The model has no device capacity
  and never releases: its reserved peak is the high-water mark of segments, an upper bound of what
  torch holds just before an OOM.
- ties between equal free blocks: torch orders them by address (``BlockComparatorSize``: stream,
  size, then ``ptr``); cudaMalloc's addresses are not known, the model takes the oldest segment.
- ``roundup_power2_divisions`` per size interval (``[256:4,>:1]``) and ``large_segment_size_mb`` /
  ``max_non_split_rounding_mb`` (torch 2.13's knobs for the 20 MiB ``kLargeBuffer``): the model takes
  one division count for all sizes and the 20 MiB defaults.
- ``garbage_collection_threshold`` (with ``set_per_process_memory_fraction`` only) and blocks used on
  another stream (``record_stream``: freed when their events complete, ``process_events``): not
  modelled; a freed block is cached at once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field

import pytest
import torch

from shardviz.step import allocator as al

KiB, MiB = 1 << 10, 1 << 20


@dataclass(frozen=True)
class Scenario:
    """``ops``: ("m", name, bytes, stream) mallocs a tensor of ``bytes`` uint8 on ``stream``, ("f", name)
    frees it; ``expected``: (reserved, allocated, small-pool reserved) bytes after each op."""

    ops: tuple
    expected: tuple
    conf: dict = field(default_factory=dict)  # expandable_segments, max_split_size_mb, roundup_power2_divisions


def m(name, size, stream="s0"):
    return ("m", name, int(size), stream)


def f(name):
    return ("f", name)


def model_trace(s: Scenario) -> list[tuple[int, int, int]]:
    a = al.CachingAllocator(expandable_segments=s.conf.get("expandable_segments", False),
                            max_split_size=s.conf.get("max_split_size_mb", 0) * MiB or None,
                            roundup_power2_divisions=s.conf.get("roundup_power2_divisions", 1))
    live, out = {}, []
    for op in s.ops:
        if op[0] == "m":
            live[op[1]] = a.malloc(op[2], op[3])
        else:
            a.free(live.pop(op[1]))
        out.append((a.reserved, a.allocated, sum(seg.size for seg in a.segments if seg.small)))
    return out


SCENARIOS = {
    # round_size: `if (size < kMinBlockSize) return kMinBlockSize; ... return kMinBlockSize * ((size +
    # kMinBlockSize - 1) / kMinBlockSize);` (kMinBlockSize = 512)
    "round_size": Scenario(
        (m("a", 1), m("b", 513), m("c", MiB + 1)),
        ((2 * MiB, 512, 2 * MiB), (2 * MiB, 1536, 2 * MiB), (22 * MiB, 1536 + MiB + 512, 2 * MiB))),
    # roundup_power2_next_division, in round_size: `if (divisions > 1 && size > (kMinBlockSize *
    # divisions)) return roundup_power2_next_division(size, divisions);` (the CUDA notes' example:
    # 1200 with 4 divisions rounds to 1280); a power of two stays (`llvm::isPowerOf2_64(size)`)
    "roundup_power2_divisions": Scenario(
        (m("a", 1200 * KiB), m("b", 1000), m("c", 3000), m("d", 1700 * KiB), m("e", 1024 * KiB)),
        ((20 * MiB, 1280 * KiB, 0), (22 * MiB, 1280 * KiB + 1024, 2 * MiB), (22 * MiB, 1280 * KiB + 4096, 2 * MiB),
         (22 * MiB, 3072 * KiB + 4096, 2 * MiB), (22 * MiB, 4096 * KiB + 4096, 2 * MiB)),
        {"roundup_power2_divisions": 4}),
    # get_pool: `if (size <= kSmallSize) return small_blocks; else return large_blocks;` and
    # get_allocation_size: `if (size <= kSmallSize) return kSmallBuffer; else if (size < kMinLargeAlloc)
    # return kLargeBuffer; else return kRoundLarge * ((size + kRoundLarge - 1) / kRoundLarge);`
    "pools_and_segment_sizes": Scenario(
        (m("a", MiB), m("b", MiB + 512), m("c", 10 * MiB - 512), m("d", 10 * MiB), m("e", 11 * MiB + 1)),
        ((2 * MiB, MiB, 2 * MiB), (22 * MiB, 2 * MiB + 512, 2 * MiB), (22 * MiB, 12 * MiB, 2 * MiB),
         (32 * MiB, 22 * MiB, 2 * MiB), (44 * MiB, 34 * MiB, 2 * MiB))),
    # "Small requests are packed into 2MB buffers" (kSmallBuffer): 2 x 700 KiB share one, the third opens
    # another
    "small_packing": Scenario(
        (m("a", 700 * KiB), m("b", 700 * KiB), m("c", 700 * KiB)),
        ((2 * MiB, 700 * KiB, 2 * MiB), (2 * MiB, 1400 * KiB, 2 * MiB), (4 * MiB, 2100 * KiB, 4 * MiB))),
    # "requests between 1MB and 10MB will allocate and split a 20MB block" (kLargeBuffer, kMinLargeAlloc)
    "large_buffer_shared": Scenario(
        (m("a", 5 * MiB), m("b", 5 * MiB), m("c", 8 * MiB), m("d", 2 * MiB), m("e", 2 * MiB)),
        ((20 * MiB, 5 * MiB, 0), (20 * MiB, 10 * MiB, 0), (20 * MiB, 18 * MiB, 0), (20 * MiB, 20 * MiB, 0),
         (40 * MiB, 22 * MiB, 0))),
    # should_split, large pool: `return (size < max_split_size()) && (remaining > kSmallSize);`: 1 MiB left
    # is not split off (the whole block is allocated), 1 MiB + 512 is
    "split_large": Scenario(
        (m("a", 19 * MiB), f("a"), m("b", 19 * MiB - 512), m("c", MiB + 512)),
        ((20 * MiB, 20 * MiB, 0), (20 * MiB, 0, 0), (20 * MiB, 19 * MiB - 512, 0), (20 * MiB, 20 * MiB, 0))),
    # should_split, small pool: `if (block->pool->is_small || expandable_segments()) return remaining >=
    # kMinBlockSize;`
    "split_small": Scenario(
        (m("a", MiB), m("b", MiB - 512), m("c", 512), m("d", 1)),
        ((2 * MiB, MiB, 2 * MiB), (2 * MiB, 2 * MiB - 512, 2 * MiB), (2 * MiB, 2 * MiB, 2 * MiB),
         (4 * MiB, 2 * MiB + 512, 4 * MiB))),
    # get_free_block: `auto it = pool.blocks.lower_bound(&p.search_key);` over a set ordered by
    # BlockComparatorSize (stream, size, ptr): the smallest cached block that fits. A first fit would
    # split the 40 MiB block for 14 MiB and cudaMalloc 40 MiB more at the end.
    "best_fit": Scenario(
        (m("a", 40 * MiB), m("b", 12 * MiB), m("c", 30 * MiB), m("d", 16 * MiB), f("a"), f("b"), f("c"), f("d"),
         m("x", 14 * MiB), m("y", 11 * MiB), m("z", 20 * MiB), m("w", 40 * MiB)),
        ((40 * MiB, 40 * MiB, 0), (52 * MiB, 52 * MiB, 0), (82 * MiB, 82 * MiB, 0), (98 * MiB, 98 * MiB, 0),
         (98 * MiB, 58 * MiB, 0), (98 * MiB, 46 * MiB, 0), (98 * MiB, 16 * MiB, 0), (98 * MiB, 0, 0),
         (98 * MiB, 14 * MiB, 0), (98 * MiB, 26 * MiB, 0), (98 * MiB, 46 * MiB, 0), (98 * MiB, 86 * MiB, 0))),
    # "Once freed, blocks can be re-allocated on the same stream, but not on any other stream.";
    # get_free_block: `if (it == pool.blocks.end() || (*it)->stream != p.stream()) return false;`
    "streams": Scenario(
        (m("a", 100 * MiB), f("a"), m("b", 100 * MiB, "s1"), m("c", 100 * MiB)),
        ((100 * MiB, 100 * MiB, 0), (100 * MiB, 0, 0), (200 * MiB, 100 * MiB, 0), (200 * MiB, 200 * MiB, 0))),
    # the two pools never serve each other: a cached 30 MiB block does not serve 1 KiB, nor a cached
    # 2 MiB small segment 2 MiB
    "pools_apart": Scenario(
        (m("a", 30 * MiB), f("a"), m("b", KiB), f("b"), m("c", 2 * MiB)),
        ((30 * MiB, 30 * MiB, 0), (30 * MiB, 0, 0), (32 * MiB, KiB, 2 * MiB), (32 * MiB, 0, 2 * MiB),
         (32 * MiB, 2 * MiB, 2 * MiB))),
    # free_block: `merge_candidates = {block->prev, block->next}; ... try_merge_blocks(block,
    # merge_candidate, pool)`: only free neighbours of the same segment merge
    "merge": Scenario(
        (m("big", 60 * MiB), f("big"), m("x", 20 * MiB), m("y", 20 * MiB), m("z", 20 * MiB), f("x"), f("z"),
         m("w", 40 * MiB), f("y"), m("v", 60 * MiB)),
        ((60 * MiB, 60 * MiB, 0), (60 * MiB, 0, 0), (60 * MiB, 20 * MiB, 0), (60 * MiB, 40 * MiB, 0),
         (60 * MiB, 60 * MiB, 0), (60 * MiB, 40 * MiB, 0), (60 * MiB, 20 * MiB, 0), (100 * MiB, 60 * MiB, 0),
         (100 * MiB, 40 * MiB, 0), (100 * MiB, 100 * MiB, 0))),
    # free never calls cudaFree: release_block is reached only from release_cached_blocks (empty_cache,
    # or malloc's retry before an OOM), release_available_cached_blocks and garbage_collect_cached_blocks
    "no_release_on_free": Scenario(
        (m("a", 100 * MiB), m("b", KiB), f("a"), f("b")),
        ((100 * MiB, 100 * MiB, 0), (102 * MiB, 100 * MiB + KiB, 2 * MiB), (102 * MiB, KiB, 2 * MiB),
         (102 * MiB, 0, 2 * MiB))),
    # max_split_size_mb, get_free_block: `if ((p.size() < max_split_size()) && ((*it)->size >=
    # max_split_size())) return false;` and `if ((p.size() >= max_split_size()) && ((*it)->size >=
    # p.size() + kLargeBuffer)) return false;` (torch 2.13: max_non_split_rounding_size, 20 MiB by
    # default); should_split: `size < max_split_size()`: an oversize request takes the whole block
    "max_split_size": Scenario(
        (m("a", 100 * MiB), f("a"), m("b", 20 * MiB), m("c", 90 * MiB), f("c"), m("d", 60 * MiB)),
        ((100 * MiB, 100 * MiB, 0), (100 * MiB, 0, 0), (120 * MiB, 20 * MiB, 0), (120 * MiB, 120 * MiB, 0),
         (120 * MiB, 20 * MiB, 0), (180 * MiB, 80 * MiB, 0)),
        {"max_split_size_mb": 50}),
    # Note [Expandable Segments]: "we use 2MiB pages for our small pool and 20MiB pages for our large
    # pool"; try_allocate_expandable_block maps pages after the free last block (find_expandable_block:
    # `if (allocatable(c->prev)) c = c->prev;`) and map_block merges them into it
    "expandable_segments": Scenario(
        (m("a", 30 * MiB), f("a"), m("b", 50 * MiB), m("c", KiB)),
        ((40 * MiB, 30 * MiB, 0), (40 * MiB, 0, 0), (60 * MiB, 50 * MiB, 0), (62 * MiB, 50 * MiB + KiB, 2 * MiB)),
        {"expandable_segments": True}),
    # get_free_block with expandable segments: `expandable_size = b->size + (b->next && !b->next->mapped ?
    # b->next->size : 0)`; `while (... expandable_size(*next) < expandable_size(*it)) it = next++;`: the
    # free 15 MiB at the segment's end ranks as 15 MiB + its unmapped address space, so 12 MiB is cut from
    # the interior 40 MiB block; 38 MiB then finds no block and maps two pages more
    "expandable_best_fit": Scenario(
        (m("a", 40 * MiB), m("b", 20 * MiB), m("c", 25 * MiB), f("a"), m("d", 12 * MiB), m("e", 38 * MiB)),
        ((40 * MiB, 40 * MiB, 0), (60 * MiB, 60 * MiB, 0), (100 * MiB, 85 * MiB, 0), (100 * MiB, 45 * MiB, 0),
         (100 * MiB, 57 * MiB, 0), (140 * MiB, 95 * MiB, 0)),
        {"expandable_segments": True}),
}


def check(name):
    s = SCENARIOS[name]
    assert len(s.expected) == len(s.ops), name
    got = model_trace(s)
    for i, (op, want, have) in enumerate(zip(s.ops, s.expected, got)):
        assert have == want, f"{name}, step {i} {op}: (reserved, allocated, small reserved) {have} != {want}"


def test_round_size_rounds_every_request_to_512_bytes():
    """round_size: a request under kMinBlockSize (512) takes 512 B, others the next multiple of 512;
    1 MiB + 1 B rounds to 1 MiB + 512 and so leaves the small pool."""
    check("round_size")


def test_roundup_power2_divisions_rounds_to_the_next_division():
    """roundup_power2_next_division (``roundup_power2_divisions:4``): 1200 KiB -> 1280 KiB, 1700 KiB ->
    1792 KiB, 1 MiB stays (a power of two) and so stays in the small pool; under 512 B x 4 (1000 B) the
    512 B rule, above it (3000 B) the division (3072 B)."""
    check("roundup_power2_divisions")


def test_the_pool_and_the_new_segment_follow_the_rounded_size():
    """get_pool and get_allocation_size: <= kSmallSize (1 MiB) the small pool and a kSmallBuffer (2 MiB)
    segment; above, under kMinLargeAlloc (10 MiB) a kLargeBuffer (20 MiB) segment split for later
    requests; from 10 MiB a segment of the size rounded to kRoundLarge (2 MiB): 10 MiB -> 10 MiB,
    11 MiB + 1 B -> 12 MiB."""
    check("pools_and_segment_sizes")


def test_small_requests_pack_into_2_mib_segments():
    """The file's header: "Small requests are packed into 2MB buffers" (kSmallBuffer)."""
    check("small_packing")


def test_requests_under_10_mib_share_a_20_mib_segment():
    """The file's header: "requests between 1MB and 10MB will allocate and split a 20MB block"."""
    check("large_buffer_shared")


def test_a_large_block_is_split_only_when_more_than_1_mib_is_left():
    """should_split, large pool: ``remaining > kSmallSize``. 19 MiB takes a 20 MiB segment whole
    (memory_allocated counts the block: 20 MiB); 19 MiB - 512 B splits it."""
    check("split_large")


def test_a_small_block_is_split_when_512_bytes_are_left():
    """should_split, small pool: ``remaining >= kMinBlockSize``."""
    check("split_small")


def test_a_request_takes_the_smallest_cached_block_that_fits():
    """get_free_block: ``pool.blocks.lower_bound(&p.search_key)``, best fit."""
    check("best_fit")


def test_a_cached_block_serves_only_its_own_stream():
    """get_free_block: ``(*it)->stream != p.stream()`` -> no block; BlockComparatorSize orders by stream
    first."""
    check("streams")


def test_the_small_and_large_pools_never_serve_each_other():
    """get_pool picks the pool before get_free_block searches it."""
    check("pools_apart")


def test_a_freed_block_merges_with_its_free_neighbours_only():
    """free_block / try_merge_blocks: x and z freed apart stay apart (40 MiB takes a new segment);
    freeing y between them makes one 60 MiB block again."""
    check("merge")


def test_freeing_never_returns_memory_to_cuda():
    """free_block caches the block; only release_block calls cudaFree (empty_cache, or before an OOM)."""
    check("no_release_on_free")


def test_max_split_size_keeps_oversize_blocks_whole():
    """``max_split_size_mb:50``: a 20 MiB request never takes the cached 100 MiB block; 90 MiB takes it
    (less than 90 + 20 MiB) unsplit; 60 MiB does not (100 >= 60 + 20)."""
    check("max_split_size")


def test_expandable_segments_map_pages_at_the_end_of_one_segment():
    """``expandable_segments:True``: 30 MiB maps two 20 MiB pages; freed, then 50 MiB grows that free
    last block by one page (cudaMalloc'd segments would hold 30 + 50); 1 KiB maps a 2 MiB small page."""
    check("expandable_segments")


def test_expandable_best_fit_ranks_the_last_block_by_what_it_can_grow_to():
    """get_free_block with expandable segments prefers a larger interior block to the free last block
    (``al.expandable_fit``): 12 MiB is cut from the freed 40 MiB, not from the 15 MiB left at the end,
    so 38 MiB then fits no block and maps 40 MiB more: 140 MiB reserved. Taking the smallest block, as
    without expandable segments, would cut 12 MiB from the last 15 and give 38 MiB the interior 40:
    100 MiB reserved, 40 MiB under torch."""
    check("expandable_best_fit")


def test_every_scenario_has_a_rule_test():
    """Each scenario is checked by a test above (and replayed on CUDA below)."""
    import inspect

    source = inspect.getsource(sys.modules[__name__])
    for name in SCENARIOS:
        assert source.count(f'check("{name}")') == 1, name


# ---------------------------------------------------------------------------
# torch's own allocator (CUDA only)
# ---------------------------------------------------------------------------
REPLAY = r"""
import json, sys
import torch

def now():
    s = torch.cuda.memory_stats()
    return [s.get("reserved_bytes.all.current", 0), s.get("allocated_bytes.all.current", 0),
            s.get("reserved_bytes.small_pool.current", 0)]

out = {}
for name, ops in json.loads(sys.stdin.read()).items():
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base, streams, live, trace = now(), {}, {}, []
    for op in ops:
        if op[0] == "m":
            stream = streams.setdefault(op[3], torch.cuda.Stream())
            with torch.cuda.stream(stream):
                live[op[1]] = torch.empty(op[2], dtype=torch.uint8, device="cuda")
        else:
            del live[op[1]]
        trace.append([x - y for x, y in zip(now(), base)])
    live.clear()
    out[name] = trace
print(json.dumps(out))
"""


def conf_string(conf: dict) -> str:
    return ",".join(f"{k}:{'True' if v is True else v}" for k, v in sorted(conf.items()))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: torch's own allocator")
def test_torchs_allocator_gives_every_scenarios_numbers():
    """Every scenario above through torch's caching allocator: the numbers each rule test expects are
    the ones ``torch.cuda.memory_stats`` reports (the expandable best fit included, which the model
    gets wrong)."""
    groups: dict[str, dict] = {}
    for name, s in SCENARIOS.items():
        groups.setdefault(conf_string(s.conf), {})[name] = s.ops
    for conf, scenarios in groups.items():
        env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
        if conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        run = subprocess.run([sys.executable, "-c", REPLAY], input=json.dumps(scenarios), env=env,
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        traces = json.loads(run.stdout.strip().splitlines()[-1])
        for name, trace in traces.items():
            want = [list(t) for t in SCENARIOS[name].expected]
            assert trace == want, f"{name} ({conf or 'defaults'}): torch {trace} != expected {want}"
