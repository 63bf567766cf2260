"""What the CUDA caching allocator reserves for one step: torch's block rules, re-implemented, replayed
over the allocations and frees of the step the cost model simulates (``step.simulation``).

``a.memory.peak`` counts the bytes tensors hold (what ``torch.cuda.max_memory_allocated`` shows and
what FSDPMemTracker measures). A CUDA OOM is raised when the allocator cannot *reserve* more
(``torch.cuda.max_memory_reserved``): its cached segments hold more than the tensors in them.
The rules, torch 2.13 (``c10/core/AllocatorConfig.h`` for the constants; the functions named are in
``c10/cuda/CUDACachingAllocator.cpp``, ``DeviceCachingAllocator``; docs/cost-model.md, "Reserved
memory", cites the lines):

- ``round_size``: every request is rounded up to a multiple of ``kMinBlockSize`` = 512 B (with
  ``roundup_power2_divisions``, above 512 B x divisions, to the next of ``divisions`` steps between
  two powers of two: ``roundup_power2_next_division``);
- ``get_pool``: a rounded size <= ``kSmallSize`` = 1 MiB comes from the small pool, else the large;
- ``get_allocation_size``: a new segment (cudaMalloc) is ``kSmallBuffer`` = 2 MiB for the small
  pool, ``kLargeBuffer`` = 20 MiB for a request under ``kMinLargeAlloc`` = 10 MiB, else the request
  rounded up to ``kRoundLarge`` = 2 MiB;
- ``get_free_block``: the smallest free cached block of the same pool *and the same stream* that is
  large enough (best fit, then the lowest address); a block cached on one stream is never given to
  another; with expandable segments a block is ranked by the size it can grow to (a free last block:
  its size plus the unmapped address space after it), so a larger interior block that fits goes first
  (``expandable_fit``); with ``max_split_size_mb``, a request under it never takes a block at or over
  it, and a request over it takes a block at most ``kLargeBuffer`` larger;
- ``should_split``: the rest of the block is split off when it is >= 512 B (small pool, or
  expandable segments), or > 1 MiB (large pool; never for a request >= ``max_split_size``);
- ``free_block`` / ``try_merge_blocks``: a freed block merges with free neighbours of its segment;
  segments are returned to CUDA only by ``empty_cache`` or before raising an OOM
  (``release_cached_blocks``), so the reserved peak of a step is the high-water mark of segments;
- ``expandable_segments:True`` (Note [Expandable Segments]): one segment per stream and pool that
  grows by mapping pages (2 MiB in the small pool, 20 MiB in the large) at its end, where a free
  last block is extended rather than a new one mapped.

FSDP2 runs its collectives on their own streams (torch ``_fsdp_collectives.py``): the all-gather
output is allocated on the all-gather copy-in stream (``foreach_all_gather``), the reduce-scatter
output on the reduce-scatter stream (``foreach_reduce``), everything else on the default stream. So
the cache of each stream keeps its own high-water mark: what the alternating all-gathers and frees
leave in the copy-in stream's cache is not reusable by the activations on the default stream.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass
from typing import NamedTuple

K_MIN_BLOCK_SIZE = 512  # kMinBlockSize: all sizes are rounded to at least 512 bytes
K_SMALL_SIZE = 1 << 20  # kSmallSize: largest "small" allocation is 1 MiB
K_SMALL_BUFFER = 2 << 20  # kSmallBuffer: "small" allocations are packed in 2 MiB blocks
K_LARGE_BUFFER = 20 << 20  # kLargeBuffer: "large" allocations may be packed in 20 MiB blocks
K_MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc: allocations between 1 and 10 MiB may use kLargeBuffer
K_ROUND_LARGE = 2 << 20  # kRoundLarge: round up large allocations to 2 MiB
NO_MAX_SPLIT = 1 << 64  # max_split_size's default: std::numeric_limits<size_t>::max()
# What an expandable segment has not mapped after its last block: find_expandable_block reserves address
# space for "1 1/8 the total memory on the GPU" (``prop.totalGlobalMem + prop.totalGlobalMem / 8``), more
# than any block; the model knows no device size, so more than any block is all it takes
UNMAPPED = 1 << 64

# cuBLAS workspaces (aten/src/ATen/cuda/CublasHandlePool.cpp, parseChosenWorkspaceSize): allocated
# through the caching allocator (getNewWorkspace), one per (handle, stream); cuBLASLt shares it
# (TORCH_CUBLASLT_UNIFIED_WORKSPACE, on by default). Default size ":4096:8" = 32 MiB on sm90 and
# later, ":4096:2:16:8" = 8.125 MiB before. Handles are per thread: forward runs on the main
# thread, backward on autograd's device thread, both on the default stream: two workspaces.
CUBLAS_WORKSPACE_SM90 = 4096 * 8 * 1024
CUBLAS_WORKSPACE_OLDER = 4096 * 1024 * 2 + 16 * 1024 * 8
CUBLAS_WORKSPACES = 2
SM90_AND_LATER = ("H100", "H100-PCIe", "H200", "B200")


def cublas_workspace_bytes(device) -> int:
    """What the step's cuBLAS workspaces take on ``device`` (a ``devices.Device`` or None: none counted)."""
    if device is None:
        return 0
    size = CUBLAS_WORKSPACE_SM90 if device.name in SM90_AND_LATER else CUBLAS_WORKSPACE_OLDER
    return CUBLAS_WORKSPACES * size


def roundup_power2_next_division(size: int, divisions: int) -> int:
    """``roundup_power2_next_division``: ``size`` up to the next of ``divisions`` equal steps between
    the powers of two around it (a power of two stays)."""
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)  # power2_floor >> log2(divisions)
    if step == 0:
        return floor << 1
    below = size & ~(step - 1)
    return size if below == size else below + step


def round_size(size: int, divisions: int = 1) -> int:
    """``round_size``: the block size a request of ``size`` bytes takes."""
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    if divisions > 1 and size > K_MIN_BLOCK_SIZE * divisions:
        return roundup_power2_next_division(size, divisions)
    return K_MIN_BLOCK_SIZE * ((size + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE)


def is_small(rounded: int) -> bool:
    """``get_pool``: the small pool takes rounded sizes up to 1 MiB."""
    return rounded <= K_SMALL_SIZE


def allocation_size(rounded: int) -> int:
    """``get_allocation_size``: the segment cudaMalloc'd for a request that no cached block serves."""
    if rounded <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if rounded < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * ((rounded + K_ROUND_LARGE - 1) // K_ROUND_LARGE)


def split_remainder(rounded: int, small: bool, expandable: bool = False, max_split_size: int = NO_MAX_SPLIT) -> int:
    """``should_split``: the smallest rest of a block serving ``rounded`` bytes that is split off
    (``remaining >= kMinBlockSize`` in the small pool or with expandable segments; else
    ``remaining > kSmallSize``, and never for a request at or over ``max_split_size``)."""
    if small or expandable:
        return K_MIN_BLOCK_SIZE
    return K_SMALL_SIZE + 1 if rounded < max_split_size else NO_MAX_SPLIT


def expandable_fit(cache: list, i: int) -> int:
    """``get_free_block`` with expandable segments, from ``cache[i]``, the smallest cached block that fits:
    each block ranks by ``expandable_size``, its size plus the unmapped address space after it (only a
    segment's last block has any), and the search moves on to the next larger block while that one
    ranks lower. torch::

        auto expandable_size = [](Block* b) {
          return b->size + (b->next && !b->next->mapped ? b->next->size : 0);
        };
        auto next = it;
        next++;
        while ((*it)->expandable_segment_ && next != pool.blocks.end() &&
               (*next)->stream == p.stream() &&
               expandable_size(*next) < expandable_size(*it)) {
          it = next++;
        }

    (``cache`` holds one stream's blocks, all in expandable segments: the stream test always holds)."""
    def expandable_size(block: Block) -> int:
        return block.size + (UNMAPPED if block.next is None else 0)

    while i + 1 < len(cache) and expandable_size(cache[i + 1][3]) < expandable_size(cache[i][3]):
        i += 1
    return i


def largest_fit(rounded: int, max_split_size: int = NO_MAX_SPLIT) -> int:
    """``get_free_block``'s limit with ``max_split_size_mb``: the largest cached block a request of
    ``rounded`` bytes may take (under the limit: none at or over it; over it: none
    ``kLargeBuffer`` or more larger than the request)."""
    return (max_split_size if rounded < max_split_size else rounded + K_LARGE_BUFFER) - 1


class Request(NamedTuple):
    """What the rules make of one request size on one stream, the same at every malloc of it."""

    rounded: int  # round_size
    small: bool  # get_pool
    split_remainder: int  # should_split: the smallest rest split off
    largest_fit: int  # get_free_block: the largest cached block it may take
    cache: list  # its stream and pool's cached free blocks
    segment_size: int  # get_allocation_size: the segment cudaMalloc'd when no cached block serves it
    size: int  # the request, as an int (a caller's numpy integer is an equal key: int() once per size)


@dataclass(eq=False, slots=True)
class Block:
    """A block of a segment (``Block``): ``offset`` within it, allocated or cached free; ``prev``
    and ``next``: its neighbours in the segment, None at its ends (torch's ``Block::prev``/``next``:
    splitting and merging touch only them)."""

    segment: Segment
    offset: int
    size: int
    allocated: bool = False
    requested: int = 0
    prev: Block | None = None
    next: Block | None = None


@dataclass(eq=False, slots=True)
class Segment:
    """One cudaMalloc (or one expandable segment): ``last``, its last block (where an expandable
    segment grows), the others linked by ``Block.prev``; ``cache``: its stream and pool's cached
    free blocks (``CachingAllocator.free_blocks``)."""

    stream: str
    small: bool
    size: int
    cache: list
    last: Block | None = None
    expandable: bool = False
    # where a tie between equal cached blocks goes: torch compares their pointers; segments stand
    # in the order they were cudaMalloc'd (their index in ``CachingAllocator.segments``), never
    # where Python put them
    address: int = 0

    def blocks(self) -> list[Block]:
        """Its blocks in address order."""
        out, block = [], self.last
        while block is not None:
            out.append(block)
            block = block.prev
        return out[::-1]


class CachingAllocator:
    """``DeviceCachingAllocator``'s malloc / free on one device, without ``empty_cache`` and without
    the OOM retry. ``requested``, ``allocated`` (block sizes: ``memory_allocated``) and ``reserved``
    (segments: ``memory_reserved``) in bytes, each with its peak."""

    def __init__(self, expandable_segments: bool = False, max_split_size: int | None = None,
                 roundup_power2_divisions: int = 1):
        self.expandable = expandable_segments
        self.max_split = NO_MAX_SPLIT if max_split_size is None else int(max_split_size)
        self.divisions = roundup_power2_divisions
        # per (stream, small pool): the cached free blocks, sorted by get_free_block's order (size,
        # then address) as (size, segment.address, offset, block); a block is never resized while
        # cached, so its key holds
        self.free_blocks: dict[tuple[str, bool], list[tuple[int, int, int, Block]]] = {}  # (stream, small) -> cache
        self.expandable_segments: dict[tuple[str, bool], Segment] = {}
        self.requested = self.allocated = self.reserved = 0
        self.segments: list[Segment] = []  # in the order they were cudaMalloc'd (or first mapped)
        self.requests: dict[tuple[int, str], Request] = {}  # (size, stream) -> what the rules make of it
        self.peak_requested = self.peak_allocated = self.peak_reserved = 0

    def malloc(self, size: int, stream: str = "default") -> Block:
        # the rules that depend only on the size and stream, once per distinct request (~700
        # mallocs a plan, a few dozen sizes)
        request = self.requests.get((size, stream))
        if request is None:
            request = self.requests[(size, stream)] = self._request(size, stream)
        rounded, _, min_rest, largest, cache, _, size = request
        # get_free_block: the smallest cached block of this stream and pool that fits (the lowest
        # segment, then address, on a tie; with expandable segments, ranked by what it can grow to),
        # unless max_split_size_mb rules it out
        i = bisect_left(cache, (rounded,))
        if self.expandable and i < len(cache):
            i = expandable_fit(cache, i)
        if i < len(cache) and cache[i][0] <= largest:
            block = cache.pop(i)[3]
        else:
            block = self._new_block(request, stream)
        if block.size - rounded >= min_rest:  # alloc_found_block: should_split, then the rest cached apart
            seg, after = block.segment, block.next  # inline, not a method: ~600 splits a plan
            rest = Block(seg, block.offset + rounded, block.size - rounded, False, 0, block, after)
            if after is None:
                seg.last = rest
            else:
                after.prev = rest
            block.next, block.size = rest, rounded
            insort(cache, (rest.size, seg.address, rest.offset, rest))
        block.allocated, block.requested = True, size
        self.requested += size
        self.allocated += block.size
        if self.requested > self.peak_requested:  # max(), without the call
            self.peak_requested = self.requested
        if self.allocated > self.peak_allocated:
            self.peak_allocated = self.allocated
        return block

    def _request(self, size: int, stream: str) -> Request:
        size = int(size)
        rounded = round_size(size, self.divisions)
        small = is_small(rounded)
        return Request(rounded, small, split_remainder(rounded, small, self.expandable, self.max_split),
                       largest_fit(rounded, self.max_split), self._pool(stream, small), allocation_size(rounded), size)

    def free(self, block: Block) -> None:
        """``free_block``: the block goes back to its stream's cache, merged with free neighbours."""
        self.requested -= block.requested
        self.allocated -= block.size
        block.allocated, block.requested = False, 0
        seg = block.segment
        cache = seg.cache
        # try_merge_blocks(block, next), then (block, prev): the free neighbour leaves the cache
        # and ``block`` takes it in (inline, not a method: ~400 merges a plan)
        other = block.next
        if other is not None and not other.allocated:
            del cache[bisect_left(cache, (other.size, seg.address, other.offset))]
            block.size += other.size
            block.next = other = other.next
            if other is None:
                seg.last = block
            else:
                other.prev = block
        other = block.prev
        if other is not None and not other.allocated:
            del cache[bisect_left(cache, (other.size, seg.address, other.offset))]
            block.size += other.size
            block.offset = other.offset
            block.prev = other = other.prev
            if other is not None:
                other.next = block
        insort(cache, (block.size, seg.address, block.offset, block))  # sorted as malloc's get_free_block reads it

    def _uncache(self, block: Block) -> None:
        seg = block.segment
        del seg.cache[bisect_left(seg.cache, (block.size, seg.address, block.offset))]

    def _new_segment(self, stream: str, small: bool, size: int, cache: list, expandable: bool = False) -> Segment:
        seg = Segment(stream, small, size, cache, None, expandable, len(self.segments))
        self.segments.append(seg)
        return seg

    def forget(self) -> None:
        """Drops every segment and block, unlinked from each other: reference counting frees them
        as soon as the allocator goes, rather than leaving ~1,000 objects in cycles (segment <->
        block, block <-> neighbour) to the cyclic GC's next collections."""
        for seg in self.segments:
            block, seg.last = seg.last, None
            while block is not None:
                prev = block.prev
                block.prev = block.next = None
                block = prev
            seg.cache.clear()  # its pool's: the cached blocks' keys
        self.segments.clear()
        self.expandable_segments.clear()

    def _pool(self, stream: str, small: bool) -> list:
        """The cached free blocks of ``stream``'s small or large pool."""
        return self.free_blocks.setdefault((stream, small), [])

    def _new_block(self, request: Request, stream: str) -> Block:
        """``alloc_block``: a new segment (``get_allocation_size``), or the expandable segment grown."""
        if self.expandable:
            return self._grow(request.rounded, stream, request.small)
        size = request.segment_size
        seg = self._new_segment(stream, request.small, size, request.cache)
        block = seg.last = Block(seg, 0, size)
        self._reserve(size)
        return block

    def _grow(self, rounded: int, stream: str, small: bool) -> Block:
        """Expandable segments: map pages at the end of the stream's segment for this pool,
        extending its last block when that one is free."""
        page = K_SMALL_BUFFER if small else K_LARGE_BUFFER
        seg = self.expandable_segments.get((stream, small))
        if seg is None:
            seg = self._new_segment(stream, small, 0, self._pool(stream, small), expandable=True)
            self.expandable_segments[(stream, small)] = seg
        last = seg.last if seg.last is not None and not seg.last.allocated else None
        need = rounded - (last.size if last is not None else 0)
        grow = page * ((need + page - 1) // page)
        self._reserve(grow)
        if last is not None:
            self._uncache(last)
            last.size += grow
        else:
            last = Block(seg, seg.size, grow, prev=seg.last)
            if seg.last is not None:
                seg.last.next = last
            seg.last = last
        seg.size += grow
        return last

    def _reserve(self, size: int) -> None:
        self.reserved += size
        if self.reserved > self.peak_reserved:
            self.peak_reserved = self.reserved
