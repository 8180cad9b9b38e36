"""PyTorch's CUDA caching allocator, replayed: what a rank *reserves* (torch.cuda.max_memory_reserved) for
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

The replay is exact and cheap (`replay_stages`): units are compiled once per chunk and phase, ranks that run
the same chunks share the replay of their common order prefix, and a rank stops once what is left provably
moves neither peak. tests/allocator_reference.py keeps the plain replay this was checked against, to the byte.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from operator import attrgetter

from ..compile.program import ChunkProgram
from ..strategy.schedules import ZERO_BUBBLE_KINDS

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


_KEY_SHIFT = 32
"""A free block's key in its pool's sorted list: size << 32 | id, so best fit is one bisect on ints and ties
go to the oldest block, as PyTorch's (size, address) order does in this replay's id order."""
_ID_MASK = (1 << _KEY_SHIFT) - 1


class CachingAllocator:
    """One device's caching allocator on one stream (a replay; not thread-safe, not shared).

    `alloc(size)` returns a handle for `free(handle)`; `allocated_bytes` / `reserved_bytes` are the counters
    now, `peak_allocated_bytes` / `peak_reserved_bytes` their high-water marks. Blocks live in flat lists
    indexed by id (ids are never reused, in creation order); `copy()` forks the state and `run(ops, handles)`
    replays a compiled unit (see `_Program`)."""

    def __init__(self, expandable_segments: bool = False) -> None:
        self.expandable = expandable_segments
        self._size: list[int] = []
        self._offset: list[int] = []
        self._prev: list[int] = []  # -1: none
        self._next: list[int] = []
        self._used: list[bool] = []
        self._small: list[bool] = []
        self._free: tuple[list[int], list[int]] = ([], [])  # [small] -> sorted keys (size << 32 | id)
        self._tail = [-1, -1]  # expandable: [small] -> the pool's last block
        self.allocated_bytes = 0
        self.reserved_bytes = 0
        self.peak_allocated_bytes = 0
        self.peak_reserved_bytes = 0

    def copy(self) -> CachingAllocator:
        """An independent allocator in the same state."""
        c = CachingAllocator.__new__(CachingAllocator)
        c.expandable = self.expandable
        c._size, c._offset, c._prev, c._next = self._size[:], self._offset[:], self._prev[:], self._next[:]
        c._used, c._small = self._used[:], self._small[:]
        c._free = (self._free[0][:], self._free[1][:])
        c._tail = self._tail[:]
        c.allocated_bytes, c.reserved_bytes = self.allocated_bytes, self.reserved_bytes
        c.peak_allocated_bytes, c.peak_reserved_bytes = self.peak_allocated_bytes, self.peak_reserved_bytes
        return c

    def largest_free(self, small: bool) -> int:
        """The largest cached free block of a pool (bytes; 0 when none)."""
        lst = self._free[small]
        return lst[-1] >> _KEY_SHIFT if lst else 0

    def _new_block(self, size: int, small: bool, offset: int, prev: int, nxt: int) -> int:
        bid = len(self._size)
        assert bid <= _ID_MASK
        self._size.append(size)
        self._offset.append(offset)
        self._prev.append(prev)
        self._next.append(nxt)
        self._used.append(False)
        self._small.append(small)
        return bid

    def _expand(self, small: bool, size: int) -> int:
        """Expandable segments: a free block of at least `size` bytes made by mapping pages at the end of the
        pool's one segment, merged with a free block already there; its id. (Without them `run` makes a new
        segment of `segment_size`.)"""
        page = SMALL_BUFFER_BYTES if small else LARGE_BUFFER_BYTES
        tail = self._tail[small]
        have = self._size[tail] if tail >= 0 and not self._used[tail] else 0
        grow = -(-(size - have) // page) * page
        self.reserved_bytes += grow
        if self.reserved_bytes > self.peak_reserved_bytes:
            self.peak_reserved_bytes = self.reserved_bytes
        if have:
            lst = self._free[small]
            del lst[bisect.bisect_left(lst, have << _KEY_SHIFT | tail)]
            self._size[tail] += grow
            return tail
        offset = self._offset[tail] + self._size[tail] if tail >= 0 else 0
        bid = self._new_block(grow, small, offset, tail, -1)
        if tail >= 0:
            self._next[tail] = bid
        self._tail[small] = bid
        return bid

    def alloc(self, size_bytes: float) -> int:
        """Hand out a block for a request of `size_bytes`; its handle (a one-op `run`)."""
        handles: list[int] = []
        self.run((round_size(int(-(-size_bytes // 1))),), handles)
        return handles[0]

    def free(self, handle: int) -> None:
        """Return a block to the cache, merged with its free neighbours in the same segment (a one-op `run`)."""
        self.run((~0,), [handle])

    def run(self, ops: tuple[int, ...] | list[int], handles: list[int]) -> None:
        """Replay a compiled unit: op >= 0 allocates that many (rounded) bytes and appends the handle to
        `handles`; op < 0 frees handles[~op] (best-fit and splitting, merging with free neighbours; the replay's
        hot loop, also what `alloc` and `free` run)."""
        sizes, offset, prev, nxt, used, smalls = self._size, self._offset, self._prev, self._next, self._used, self._small
        free_lists, tails, expandable, expand = self._free, self._tail, self.expandable, self._expand
        bisect_left, insort, append = bisect.bisect_left, bisect.insort, handles.append
        allocated, peak = self.allocated_bytes, self.peak_allocated_bytes
        reserved, peak_reserved = self.reserved_bytes, self.peak_reserved_bytes  # new segments (not expandable)
        for op in ops:
            if op >= 0:
                small = op <= SMALL_SIZE_BYTES
                lst = free_lists[small]
                i = bisect_left(lst, op << _KEY_SHIFT)
                if i < len(lst):
                    bid = lst.pop(i) & _ID_MASK
                elif expandable:
                    bid = expand(small, op)
                else:  # a new segment (made here: warm-up forwards make thousands): segment_size, inline;
                    # the block and the rest split off it made at once (the split below, for a fresh segment)
                    seg = SMALL_BUFFER_BYTES if small else LARGE_BUFFER_BYTES if op < MIN_LARGE_ALLOC_BYTES \
                        else -(-op // ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES
                    reserved += seg
                    if reserved > peak_reserved:
                        peak_reserved = reserved
                    bid = len(sizes)
                    rest = seg - op
                    if rest >= MIN_BLOCK_BYTES if small else rest > SMALL_SIZE_BYTES:
                        sizes += (op, rest)
                        offset += (0, op)
                        prev += (-1, bid)
                        nxt += (bid + 1, -1)
                        used += (True, False)
                        smalls += (small, small)
                        insort(lst, rest << _KEY_SHIFT | (bid + 1))
                        have = op
                    else:
                        sizes.append(seg)
                        offset.append(0)
                        prev.append(-1)
                        nxt.append(-1)
                        used.append(True)
                        smalls.append(small)
                        have = seg
                    allocated += have
                    if allocated > peak:
                        peak = allocated
                    append(bid)
                    continue
                have = sizes[bid]
                rest = have - op
                if rest >= MIN_BLOCK_BYTES if (small or expandable) else rest > SMALL_SIZE_BYTES:
                    n = nxt[bid]
                    rid = len(sizes)
                    sizes.append(rest)
                    offset.append(offset[bid] + op)
                    prev.append(bid)
                    nxt.append(n)
                    used.append(False)
                    smalls.append(small)
                    if n >= 0:
                        prev[n] = rid
                    nxt[bid] = rid
                    sizes[bid] = have = op
                    if tails[small] == bid:
                        tails[small] = rid
                    insort(lst, rest << _KEY_SHIFT | rid)
                used[bid] = True
                allocated += have
                if allocated > peak:
                    peak = allocated
                append(bid)
                continue
            h = handles[~op]
            small = smalls[h]
            lst = free_lists[small]
            allocated -= sizes[h]
            used[h] = False
            p = prev[h]
            if p >= 0 and not used[p]:
                del lst[bisect_left(lst, sizes[p] << _KEY_SHIFT | p)]
                sizes[p] += sizes[h]
                n = nxt[p] = nxt[h]
                if n >= 0:
                    prev[n] = p
                if tails[small] == h:
                    tails[small] = p
                h = p
            n = nxt[h]
            if n >= 0 and not used[n]:
                del lst[bisect_left(lst, sizes[n] << _KEY_SHIFT | n)]
                sizes[h] += sizes[n]
                nn = nxt[h] = nxt[n]
                if nn >= 0:
                    prev[nn] = h
                if tails[small] == n:
                    tails[small] = h
            insort(lst, sizes[h] << _KEY_SHIFT | h)
        self.allocated_bytes, self.peak_allocated_bytes = allocated, peak
        if not expandable:  # (expandable segments grow in _expand, which keeps the reserved counters itself)
            self.reserved_bytes, self.peak_reserved_bytes = reserved, peak_reserved


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
    steady state: every micro-batch 1F1B holds at once plus two (interleaved: two rounds of pp; DualPipeV: its
    2 pp plus two), all of them for GPipe (it holds every one). The dynamic schedule is replayed as 1F1B (its
    order depends on timing)."""
    from ..strategy.schedules import schedule_order

    if kind == "gpipe":
        return schedule_order("gpipe", pp, m, rank)
    if kind == "interleaved" and vpp > 1:
        m_eff = min(m, 2 * pp) if m % pp == 0 else m
        return schedule_order("interleaved", pp, m_eff, rank, vpp)
    m_eff = min(m, pp - rank + 2)
    if kind == "zb-h1":
        return schedule_order("zb-h1", pp, m_eff, rank)
    if kind == "dualpipev":  # the warm-up, two steady rounds (each frees what it allocates) and the cool-down
        return schedule_order("dualpipev", pp, min(m, 2 * pp + 2), rank)
    return schedule_order("1f1b", pp, m_eff, rank, max_ongoing=max_ongoing if kind == "1f1b" else None)


_STEP = attrgetter("alloc_bytes", "free_bytes", "phase")
"""What of a compile.program Step the replay reads."""


@dataclass(frozen=True, eq=False)
class _Program:
    """One phase (F, B or W) of one (micro-batch, chunk) unit, compiled to allocator ops: `ops[i] >= 0`
    allocates that many rounded bytes into the unit's next slot, `~ops[i]` frees a slot (the handle list the
    unit fills as it allocates). `contained`: every slot it allocates it also frees; then, whatever the
    allocator's state, it needs no new segment when a pool's largest free block holds `need[small]` (its
    requests there, each with the unsplit remainder it may be handed: their largest live total when the unit
    frees them last in first out, else their sum), and it raises the allocated counter by at most `rise` above
    where it starts (see `_Replay.finish`).

    Compared and hashed by identity (eq=False): `_Replay.descend` groups ranks by their next (unit, program)
    at every position, and hashing the ops would cost more than the grouping saves (a pp 64 job: thousands
    of hashes). Programs are cached per (chunk signature, phases), so ranks that run the same unit of the
    same chunk still share one object; two equal programs of different chunks only stop being shared."""

    ops: tuple[int, ...]
    contained: bool
    need: tuple[int, int]  # [small] -> bytes
    rise: int


def _compile(steps: list[tuple[float, float, str]], stack: list[tuple[int, int]], slot_bytes: list[int],
             expandable: bool) -> _Program:
    """The ops of `steps` run by a unit that holds `stack` ((slot, bytes) in allocation order; updated) with
    slots of `slot_bytes` rounded bytes (extended): the replay's first `_Live` rule, played once per chunk
    and phase instead of once per unit. A step's `alloc_bytes` is one tensor; its `free_bytes` are released
    from what the unit holds: the most recent block of the freed size when there is one (a gathered weight,
    a saved tensor freed by its own backward), else last in first out; a block more than twice the rest of
    the debt stays live (its bytes are freed by a later step)."""
    ops: list[int] = []
    mine: set[int] = set()
    total = [0, 0]  # [small] -> the sum of the pool's requests (with their remainders)
    pool_level, pool_peak = [0, 0], [0, 0]  # [small] -> own bytes live in the pool now / at most
    pool_stack: tuple[list[int], list[int]] = ([], [])  # [small] -> own live slots, allocation order
    lifo = [True, True]  # [small] -> the pool's own slots are freed last in first out
    bound: dict[int, int] = {}  # slot allocated here -> the bytes it may be handed
    level = rise = 0
    for alloc_bytes, free_bytes, _ in steps:
        if alloc_bytes > 0:
            size = round_size(int(-(-alloc_bytes // 1)))
            slot = len(slot_bytes)
            slot_bytes.append(size)
            small = size <= SMALL_SIZE_BYTES
            bound[slot] = size + (0 if small or expandable else SMALL_SIZE_BYTES)
            total[small] += bound[slot]
            pool_level[small] += bound[slot]
            pool_peak[small] = max(pool_peak[small], pool_level[small])
            pool_stack[small].append(slot)
            level += bound[slot]
            rise = max(rise, level)
            mine.add(slot)
            ops.append(size)
            stack.append((slot, int(alloc_bytes)))
        debt = float(free_bytes)
        while debt > 0 and stack:
            idx = len(stack) - 1  # the most recent block of the freed size, else the last
            close = 1e-3 * debt + 1
            while idx >= 0 and abs(stack[idx][1] - debt) > close:
                idx -= 1
            if idx < 0:
                idx = len(stack) - 1
            slot, size = stack[idx]
            if size > 2 * debt:
                break
            del stack[idx]
            ops.append(~slot)
            if slot in mine:
                mine.discard(slot)
                level -= bound[slot]
                small = slot_bytes[slot] <= SMALL_SIZE_BYTES
                own = pool_stack[small]
                lifo[small] = lifo[small] and own[-1] == slot
                own.remove(slot)
                pool_level[small] -= bound[slot]
            else:
                level -= slot_bytes[slot]  # handed at least its rounded request
            debt -= size
    need = [pool_peak[k] if lifo[k] else total[k] for k in (0, 1)]
    return _Program(tuple(ops), not mine, (need[0], need[1]), rise)


def _unit_steps(chunks: tuple[ChunkProgram, ChunkProgram], kind: str, schedule_kind: str
                ) -> list[tuple[float, float, str]]:
    """The steps a unit of `kind` (F, B, W) runs, of `chunks` (whose forward, whose backward): B without the
    weight gradients under the zero-bubble schedules (zb-h1, dualpipev)."""
    if kind == "F":
        return list(map(_STEP, chunks[0].fwd))
    bwd = list(map(_STEP, chunks[1].bwd))
    if kind == "W":
        return [s for s in bwd if s[2] == "wgrad"]
    return [s for s in bwd if s[2] != "wgrad"] if schedule_kind in ZERO_BUBBLE_KINDS else bwd


class _Replay:
    """The compiled units of one `replay_stages` call: chunks with the same allocation steps share their
    programs, so stages that run the same chunks replay the same events while their orders agree."""

    def __init__(self, schedule_kind: str, expandable: bool,
                 copies: dict[tuple[int, str], ChunkProgram] | None = None) -> None:
        self.schedule_kind = schedule_kind
        self.expandable = expandable
        self.copies = copies or {}  # (chunk number, fwd | bwd) -> the chunk whose steps it repeats
        self._phase_ids: dict[tuple[int, str], int] = {}  # (chunk number, fwd | bwd) -> id of its steps' values
        self._phase_values: dict[tuple[tuple[float, float, str], ...], int] = {}
        self._sigs: dict[tuple[int, int], int] = {}
        self._chunks: list[tuple[ChunkProgram, ChunkProgram]] = []  # per signature: whose forward, backward
        self._of_chunk: dict[int, int] = {}  # id(chunk) -> signature (the chunks outlive the call)
        # (chunk signature, phases so far) -> (program of the last, unit stack after, slot bytes after)
        self._units: dict[tuple[int, tuple[str, ...]], tuple[_Program | None, list[tuple[int, int]], list[int]]] = {}

    def signature(self, chunk: ChunkProgram) -> int:
        """A small id shared by chunks whose steps allocate and free alike."""
        if id(chunk) in self._of_chunk:
            return self._of_chunk[id(chunk)]
        sid = self._sigs.setdefault((self._phase_id(chunk, "fwd"), self._phase_id(chunk, "bwd")), len(self._sigs))
        if sid == len(self._chunks):  # read from the originals (a recorded copy's lists may be deferred)
            self._chunks.append((self.copies.get((chunk.chunk, "fwd"), chunk),
                                 self.copies.get((chunk.chunk, "bwd"), chunk)))
        self._of_chunk[id(chunk)] = sid
        return sid

    def _phase_id(self, chunk: ChunkProgram, phase: str) -> int:
        """An id of the (alloc, free, phase) values of a chunk's forward or backward steps: its original's for a
        recorded copy (`copies`), else found by value."""
        key = (chunk.chunk, phase)
        got = self._phase_ids.get(key)
        if got is None:
            original = self.copies.get(key)
            if original is not None and original is not chunk:
                got = self._phase_id(original, phase)
            else:
                values = tuple(map(_STEP, chunk.fwd if phase == "fwd" else chunk.bwd))
                got = self._phase_values.setdefault(values, len(self._phase_values))
            self._phase_ids[key] = got
        return got

    def program(self, sid: int, phases: tuple[str, ...]) -> _Program:
        """The program of a unit of chunk `sid` whose phases so far, this one last, are `phases`."""
        got = self._units.get((sid, phases))
        if got is None:
            prev = self._units.get((sid, phases[:-1])) if len(phases) > 1 else None
            if len(phases) > 1 and prev is None:
                self.program(sid, phases[:-1])
                prev = self._units[(sid, phases[:-1])]
            stack, slots = (prev[1][:], prev[2][:]) if prev is not None else ([], [])
            prog = _compile(_unit_steps(self._chunks[sid], phases[-1], self.schedule_kind), stack, slots,
                            self.expandable)
            got = self._units[(sid, phases)] = (prog, stack, slots)
        assert got[0] is not None
        return got[0]

    def plan(self, chunks: list[ChunkProgram], order: list[tuple[str, int, int]]
             ) -> list[tuple[tuple[int, int], _Program]]:
        """A rank's order as (unit, program) pairs."""
        by_v = {c.vchunk: self.signature(c) for c in chunks}
        default = self.signature(chunks[0])
        phases: dict[tuple[int, int], tuple[str, ...]] = {}
        cached, program = self._units.get, self.program  # the hot path: a cached program (see `program`)
        out = []
        for kind, mb, v in order:
            unit = (mb, v)
            ph = phases[unit] = phases.get(unit, ()) + (kind,)
            key = (by_v.get(v, default), ph)
            got = cached(key)
            out.append((unit, got[0] if got is not None and got[0] is not None else program(*key)))
        return out

    def descend(self, a: CachingAllocator, units: dict[tuple[int, int], list[int]], stages: list[int],
                plans: list[list[tuple[tuple[int, int], _Program]]], pos: int, out: list[ReservedEstimate | None]
                ) -> None:
        """Replay `stages` (same static blocks; `plans` agree up to `pos`, replayed into `a`/`units`) along
        their common order, forking the allocator where their orders part."""
        while len(stages) > 1:
            groups: dict[object, list[int]] = {}
            for s in stages:
                groups.setdefault(plans[s][pos] if pos < len(plans[s]) else None, []).append(s)
            for s in groups.pop(None, []):
                out[s] = ReservedEstimate(float(a.peak_allocated_bytes), float(a.peak_reserved_bytes))
            if not groups:
                return
            if len(groups) == 1:
                ((unit, prog), stages), = groups.items()  # type: ignore[misc]
                a.run(prog.ops, units.setdefault(unit, []))
                pos += 1
                continue
            *forks, stages = groups.values()
            for sts in forks:
                self.descend(a.copy(), {u: h[:] for u, h in units.items()}, sts, plans, pos, out)
        if stages:
            out[stages[0]] = self.finish(a, units, plans[stages[0]], pos)

    @staticmethod
    def finish(a: CachingAllocator, units: dict[tuple[int, int], list[int]],
               plan: list[tuple[tuple[int, int], _Program]], pos: int) -> ReservedEstimate:
        """Replay `plan[pos:]` and read the peaks, stopping early (exactly) once only contained units are left
        and they provably move neither peak: each starts with at most the allocated bytes of the one before
        (a contained unit frees all it allocates), so `allocated + rise` bounds the counter; and a free block
        of `need` bytes in each pool serves all its requests: they are carved from the block's front, so its
        free end shrinks by at most what is handed out (frees only merge into it), and when the unit ends the
        block is whole again (what it took is all freed and merged back). When the unit frees its own blocks
        of a pool last in first out, those carved from the block stay a contiguous prefix whose free end grows
        back as each is freed, so the largest total live at once suffices; out of order, a hole at the front
        can be too small for the next request, so the sum is needed."""
        start = len(plan)
        while start > pos and plan[start - 1][1].contained:
            start -= 1
        rise, need_small, need_large = [0] * (len(plan) + 1), [0] * (len(plan) + 1), [0] * (len(plan) + 1)
        for i in range(len(plan) - 1, start - 1, -1):
            prog = plan[i][1]
            rise[i] = max(rise[i + 1], prog.rise)
            need_small[i] = max(need_small[i + 1], prog.need[1])
            need_large[i] = max(need_large[i + 1], prog.need[0])
        for i in range(pos, len(plan)):
            if (i >= start and a.allocated_bytes + rise[i] <= a.peak_allocated_bytes
                    and need_small[i] <= a.largest_free(True) and need_large[i] <= a.largest_free(False)):
                break
            unit, prog = plan[i]
            a.run(prog.ops, units.setdefault(unit, []))
        return ReservedEstimate(float(a.peak_allocated_bytes), float(a.peak_reserved_bytes))


def replay_stages(stages: list[tuple[list[ChunkProgram], list[float]]], schedule_kind: str, pp: int,
                  n_micro_batch: int, vpp: int = 1, max_ongoing: int | None = None,
                  expandable_segments: bool = False, copies: dict[tuple[int, str], ChunkProgram] | None = None
                  ) -> list[ReservedEstimate]:
    """`stage_replay` of each (chunks, static blocks) pipeline rank, in one pass: the same answers, byte for
    byte, for a fraction of the work. `copies`: (chunk number, "fwd" | "bwd") -> a chunk whose steps of that
    phase it repeats step for step (lowering's record, compile.program.ChunkCopies), so they are not compared.

    - Each chunk's forward and backward are compiled once to allocator ops (`_compile`: the `_Live` rule
      that picks which block a step frees does not depend on the allocator, so it is played once per chunk
      and phase, not per micro-batch), and chunks with the same steps share them.
    - Ranks with the same static blocks and chunk programs (the middle stages of a transformer) replay the
      same events as long as their orders agree (1F1B: the warm-up forwards of the shallower rank), so
      they are replayed once and the allocator is copied where the orders part.
    - A rank stops once what is left is backwards that free all they allocate and provably move neither
      peak (`_Replay.finish`: 1F1B's cool-down), exact by the bound there.
    """
    r = _Replay(schedule_kind, expandable_segments, copies)
    plans = [r.plan(chunks, _unit_order(schedule_kind, pp, n_micro_batch, chunks[0].pp_rank, vpp, max_ongoing))
             for chunks, _ in stages]
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, (_, static) in enumerate(stages):
        groups.setdefault(tuple(round_size(int(-(-b // 1))) for b in static if b > 0), []).append(i)
    out: list[ReservedEstimate | None] = [None] * len(stages)
    for static_ops, members in groups.items():
        a = CachingAllocator(expandable_segments)
        a.run(static_ops, [])
        r.descend(a, {}, members, plans, 0, out)
    assert all(e is not None for e in out)
    return [e for e in out if e is not None]


def stage_replay(chunks: list[ChunkProgram], static_blocks_bytes: list[float], schedule_kind: str, pp: int,
                 n_micro_batch: int, vpp: int = 1, max_ongoing: int | None = None,
                 expandable_segments: bool = False) -> ReservedEstimate:
    """Replay one pipeline rank's iteration through the caching allocator: its long-lived tensors
    (`static_blocks_bytes`: parameters, gradients, optimizer states per layer, workspaces) first, then every
    forward and backward step's allocation and free of the chunks it runs, in its schedule's order.

    Each step's `alloc_bytes` is taken as one tensor and its `free_bytes` released from what the same
    micro-batch and chunk holds (`_compile`): the step granularity of compile.program, coarser than PyTorch's
    per-tensor requests, so the overhead it finds is a step-level estimate. Several ranks at once:
    `replay_stages`."""
    return replay_stages([(chunks, static_blocks_bytes)], schedule_kind, pp, n_micro_batch, vpp, max_ongoing,
                         expandable_segments)[0]
