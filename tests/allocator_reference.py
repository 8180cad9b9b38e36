"""The reference replay: cost.allocator as first merged (one `_Block` object per block, every step replayed),
kept for tests/test_allocator_fast.py to compare the fast replay with, to the byte.

PyTorch's CUDA caching allocator, replayed: what a rank *reserves* (torch.cuda.max_memory_reserved) for
what it *allocates* (max_memory_allocated).

The rules are PyTorch's c10/cuda/CUDACachingAllocator.cpp (pytorch/pytorch, read at 001074d2):
- every request is rounded up to a multiple of kMinBlockSize = 512 B (`round_size`);
- requests of at most kSmallSize = 1 MiB come from the small pool, whose segments are kSmallBuffer = 2 MiB;
  larger ones from the large pool: a request under kMinLargeAlloc = 10 MiB takes a kLargeBuffer = 20 MiB
  segment, a larger one a segment of its own size rounded up to kRoundLarge = 2 MiB (`get_allocation_size`);
- a cached free block is reused best-fit (the smallest one that is large enough, same stream); it is split
  when the rest is at least 512 B (small pool) or more than 1 MiB (large pool), else handed out whole
  (`should_split`); a freed block merges with free neighbours of its segment; segments are never returned
  to CUDA during training (only on an OOM retry or torch.cuda.empty_cache), so the reserved peak is the sum of
  every segment made;
- with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, each pool has one segment that grows by pages
  (2 MiB small, 20 MiB large; Note [Expandable Segments]) at its end, and any remainder of at least 512 B is
  split off: the holes between segments that a freed block cannot cross are gone, so most fragmentation is.

The allocated counter counts each block's size as handed out (after rounding and any unsplit remainder),
which is also what this replay reports as `allocated`.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field

from trainsim.compile.program import ChunkProgram

MIN_BLOCK_BYTES = 512
"""kMinBlockSize: every request rounds up to a multiple of 512 B."""
SMALL_SIZE_BYTES = 1 << 20
"""kSmallSize: the largest request the small pool serves (1 MiB)."""
SMALL_BUFFER_BYTES = 2 << 20
"""kSmallBuffer: the small pool's segment (2 MiB)."""
MIN_LARGE_ALLOC_BYTES = 10 << 20
"""kMinLargeAlloc: requests between 1 and 10 MiB share kLargeBuffer segments."""
LARGE_BUFFER_BYTES = 20 << 20
"""kLargeBuffer: the segment a 1-10 MiB request takes (20 MiB), also the large pool's expandable page."""
ROUND_LARGE_BYTES = 2 << 20
"""kRoundLarge: a request of 10 MiB or more gets a segment of its size rounded up to 2 MiB."""


def round_size(size_bytes: int) -> int:
    """The block size a request of `size_bytes` asks the pool for (round_size, default configuration)."""
    if size_bytes < MIN_BLOCK_BYTES:
        return MIN_BLOCK_BYTES
    return -(-size_bytes // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES


def segment_size(size_bytes: int) -> int:
    """The segment cudaMalloc'd when no cached block fits a rounded request (get_allocation_size)."""
    if size_bytes <= SMALL_SIZE_BYTES:
        return SMALL_BUFFER_BYTES
    if size_bytes < MIN_LARGE_ALLOC_BYTES:
        return LARGE_BUFFER_BYTES
    return -(-size_bytes // ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES


@dataclass
class _Block:
    bid: int
    size: int
    small: bool  # its pool
    offset: int
    allocated: bool = False
    prev: _Block | None = field(default=None, repr=False)
    next: _Block | None = field(default=None, repr=False)


class CachingAllocator:
    """One device's caching allocator on one stream (a replay; not thread-safe, not shared).

    `alloc(size)` returns a handle for `free(handle)`; `allocated_bytes` / `reserved_bytes` are the counters
    now, `peak_allocated_bytes` / `peak_reserved_bytes` their high-water marks."""

    def __init__(self, expandable_segments: bool = False) -> None:
        self.expandable = expandable_segments
        self._free: dict[bool, list[tuple[int, int, int]]] = {True: [], False: []}  # small? -> (size, id, 0)
        self._blocks: dict[int, _Block] = {}
        self._tail: dict[bool, _Block | None] = {True: None, False: None}  # expandable: each pool's last block
        self._ids = itertools.count()
        self.allocated_bytes = 0
        self.reserved_bytes = 0
        self.peak_allocated_bytes = 0
        self.peak_reserved_bytes = 0

    def _insert_free(self, small: bool, bid: int) -> None:
        bisect.insort(self._free[small], (self._blocks[bid].size, bid, 0))

    def _remove_free(self, small: bool, bid: int) -> None:
        lst = self._free[small]
        i = bisect.bisect_left(lst, (self._blocks[bid].size, bid, 0))
        del lst[i]

    def _new_block(self, size: int, small: bool, offset: int) -> int:
        bid = next(self._ids)
        self._blocks[bid] = _Block(bid, size, small, offset)
        return bid

    def _grow(self, small: bool, size: int) -> int:
        """A free block of at least `size` bytes made by a new segment (or, expandable, by mapping pages at
        the end of the pool's one segment, merged with a free block already there); its id."""
        if not self.expandable:
            seg = segment_size(size)
            self.reserved_bytes += seg
            bid = self._new_block(seg, small, 0)
            self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)
            return bid
        page = SMALL_BUFFER_BYTES if small else LARGE_BUFFER_BYTES
        tail = self._tail[small]
        have = tail.size if tail is not None and not tail.allocated else 0
        grow = -(-(size - have) // page) * page
        self.reserved_bytes += grow
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)
        if have:
            assert tail is not None
            self._remove_free(small, tail.bid)
            tail.size += grow
            return tail.bid
        offset = tail.offset + tail.size if tail is not None else 0
        bid = self._new_block(grow, small, offset)
        blk = self._blocks[bid]
        blk.prev = tail
        if tail is not None:
            tail.next = blk
        self._tail[small] = blk
        return bid

    def alloc(self, size_bytes: float) -> int:
        """Hand out a block for a request of `size_bytes`; its handle."""
        size = round_size(int(-(-size_bytes // 1)))
        small = size <= SMALL_SIZE_BYTES
        lst = self._free[small]
        i = bisect.bisect_left(lst, (size, -1, 0))
        if i < len(lst):
            bid = lst[i][1]
            del lst[i]
        else:
            bid = self._grow(small, size)
        blk = self._blocks[bid]
        rest = blk.size - size
        if rest >= MIN_BLOCK_BYTES if (small or self.expandable) else rest > SMALL_SIZE_BYTES:
            rid = self._new_block(rest, small, blk.offset + size)
            rb = self._blocks[rid]
            rb.prev, rb.next = blk, blk.next
            if blk.next is not None:
                blk.next.prev = rb
            blk.next = rb
            blk.size = size
            if self._tail[small] is blk:
                self._tail[small] = rb
            self._insert_free(small, rid)
        blk.allocated = True
        self.allocated_bytes += blk.size
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, self.allocated_bytes)
        return bid

    def free(self, handle: int) -> None:
        """Return a block to the cache, merged with its free neighbours in the same segment."""
        blk = self._blocks[handle]
        small = blk.small
        self.allocated_bytes -= blk.size
        blk.allocated = False
        for nb in (blk.prev, blk.next):
            if nb is None or nb.allocated:
                continue
            nid = nb.bid
            self._remove_free(small, nid)
            if nb is blk.prev:
                nb.size += blk.size
                nb.next = blk.next
                if blk.next is not None:
                    blk.next.prev = nb
                if self._tail[small] is blk:
                    self._tail[small] = nb
                del self._blocks[handle]
                handle, blk = nid, nb
            else:
                blk.size += nb.size
                blk.next = nb.next
                if nb.next is not None:
                    nb.next.prev = blk
                if self._tail[small] is nb:
                    self._tail[small] = blk
                del self._blocks[nid]
        self._insert_free(small, handle)


@dataclass(frozen=True)
class ReservedEstimate:
    """One rank's allocator replay: allocated and reserved high-water marks (bytes)."""

    peak_allocated_bytes: float
    peak_reserved_bytes: float

    @property
    def overhead_bytes(self) -> float:
        """What the cache holds beyond the allocated peak: rounding, segment tails and freed holes."""
        return max(0.0, self.peak_reserved_bytes - self.peak_allocated_bytes)


def replay(events: list[tuple[str, float | int]], expandable_segments: bool = False) -> ReservedEstimate:
    """Replay ('alloc', bytes) / ('free', index of the alloc event being freed) events; the two peaks."""
    a = CachingAllocator(expandable_segments)
    handles: dict[int, int] = {}
    for i, (kind, value) in enumerate(events):
        if kind == "alloc":
            handles[i] = a.alloc(float(value))
        else:
            a.free(handles.pop(int(value)))
    return ReservedEstimate(float(a.peak_allocated_bytes), float(a.peak_reserved_bytes))


def _unit_order(kind: str, pp: int, m: int, rank: int, vpp: int, max_ongoing: int | None) -> list[tuple[str, int, int]]:
    """The rank's (F|B|W, micro-batch, chunk) order for the replay, over the fewest micro-batches that show the
    steady state: every micro-batch 1F1B holds at once plus two (interleaved: two rounds of pp), all of them
    for GPipe (it holds every one). The dynamic schedule is replayed as 1F1B (its order depends on timing)."""
    from trainsim.strategy.schedules import schedule_order

    if kind == "gpipe":
        return schedule_order("gpipe", pp, m, rank)
    if kind == "interleaved" and vpp > 1:
        m_eff = min(m, 2 * pp) if m % pp == 0 else m
        return schedule_order("interleaved", pp, m_eff, rank, vpp)
    m_eff = min(m, pp - rank + 2)
    if kind == "zb-h1":
        return schedule_order("zb-h1", pp, m_eff, rank)
    return schedule_order("1f1b", pp, m_eff, rank, max_ongoing=max_ongoing if kind == "1f1b" else None)


class _Live:
    """The blocks one (micro-batch, chunk) holds, freed by amount: the most recent block of the freed size
    when there is one (a gathered weight, a saved tensor freed by its own backward), else last in first out."""

    def __init__(self, alloc: CachingAllocator) -> None:
        self.alloc = alloc
        self.stack: list[tuple[int, int]] = []  # (handle, bytes) in allocation order

    def push(self, size_bytes: float) -> None:
        if size_bytes > 0:
            self.stack.append((self.alloc.alloc(size_bytes), int(size_bytes)))

    def release(self, size_bytes: float) -> None:
        debt = float(size_bytes)
        while debt > 0 and self.stack:
            idx = next((i for i in range(len(self.stack) - 1, -1, -1)
                        if abs(self.stack[i][1] - debt) <= 1e-3 * debt + 1), len(self.stack) - 1)
            handle, size = self.stack[idx]
            if size > 2 * debt:  # the rest of a block's bytes stay live until a later free covers them
                return
            del self.stack[idx]
            self.alloc.free(handle)
            debt -= size


def stage_replay(chunks: list[ChunkProgram], static_blocks_bytes: list[float], schedule_kind: str, pp: int,
                 n_micro_batch: int, vpp: int = 1, max_ongoing: int | None = None,
                 expandable_segments: bool = False) -> ReservedEstimate:
    """Replay one pipeline rank's iteration through the caching allocator: its long-lived tensors
    (`static_blocks_bytes`: parameters, gradients, optimizer states per layer, workspaces) first, then every
    forward and backward step's allocation and free of the chunks it runs, in its schedule's order.

    Each step's `alloc_bytes` is taken as one tensor and its `free_bytes` released from what the same
    micro-batch and chunk holds (`_Live`): the step granularity of compile.program, coarser than PyTorch's
    per-tensor requests, so the overhead it finds is a step-level estimate."""
    a = CachingAllocator(expandable_segments)
    for b in static_blocks_bytes:
        if b > 0:
            a.alloc(b)
    rank = chunks[0].pp_rank
    by_v = {c.vchunk: c for c in chunks}
    live: dict[tuple[int, int], _Live] = {}
    for kind, mb, v in _unit_order(schedule_kind, pp, n_micro_batch, rank, vpp, max_ongoing):
        ch = by_v.get(v, chunks[0])
        unit = live.setdefault((mb, v), _Live(a))
        if kind == "F":
            steps = ch.fwd
        elif kind == "W":
            steps = [s for s in ch.bwd if s.phase == "wgrad"]
        else:
            steps = [s for s in ch.bwd if s.phase != "wgrad"] if schedule_kind == "zb-h1" else ch.bwd
        for s in steps:
            unit.push(s.alloc_bytes)
            if s.free_bytes > 0:
                unit.release(s.free_bytes)
    return ReservedEstimate(float(a.peak_allocated_bytes), float(a.peak_reserved_bytes))
