"""PyTorch caching-allocator replay (cost.allocator): rounding, segment sizes, reuse and fragmentation,
hand-computed from c10/cuda/CUDACachingAllocator.cpp's constants."""

from __future__ import annotations

from trainsim.cost.allocator import replay, round_size, segment_size

MIB = 2**20


def test_round_size_is_512_byte_blocks() -> None:
    assert round_size(1) == 512
    assert round_size(512) == 512
    assert round_size(513) == 1024
    assert round_size(3 * MIB + 1) == 3 * MIB + 512


def test_segment_sizes_small_mid_large() -> None:
    assert segment_size(1 * MIB) == 2 * MIB  # small pool: 2 MiB segments
    assert segment_size(1 * MIB + 512) == 20 * MIB  # 1-10 MiB: a 20 MiB segment
    assert segment_size(10 * MIB - 512) == 20 * MIB
    assert segment_size(10 * MIB) == 10 * MIB  # 10 MiB and up: rounded to 2 MiB
    assert segment_size(25 * MIB + 512) == 26 * MIB


def test_small_requests_pack_into_one_2mib_segment() -> None:
    est = replay([("alloc", 1000), ("alloc", 100_000)])  # 1024 + 100,352 B, both in one 2 MiB segment
    assert est.peak_allocated_bytes == 1024 + 100_352
    assert est.peak_reserved_bytes == 2 * MIB


def test_mid_requests_share_a_20mib_segment() -> None:
    est = replay([("alloc", 3 * MIB), ("alloc", 3 * MIB)])
    assert est.peak_allocated_bytes == 6 * MIB
    assert est.peak_reserved_bytes == 20 * MIB


def test_unsplit_remainder_counts_as_allocated() -> None:
    # 25 MiB + 1 B -> 25 MiB + 512 B in a 26 MiB segment; the 1 MiB - 512 B rest is not > 1 MiB: not split off
    est = replay([("alloc", 25 * MIB + 1)])
    assert est.peak_allocated_bytes == 26 * MIB
    assert est.peak_reserved_bytes == 26 * MIB


def test_freed_hole_too_small_for_a_larger_request_fragments() -> None:
    # two 12 MiB segments; the first freed leaves a 12 MiB hole a 14 MiB request cannot use: a third segment
    events = [("alloc", 12 * MIB), ("alloc", 12 * MIB), ("free", 0), ("alloc", 14 * MIB)]
    est = replay(events)
    assert est.peak_allocated_bytes == 26 * MIB
    assert est.peak_reserved_bytes == 38 * MIB
    assert est.overhead_bytes == 12 * MIB


def test_freed_block_is_reused_best_fit_and_split() -> None:
    # a freed 30 MiB segment serves two 12 MiB requests (12 + 18 free, then 12 + 6 free: each rest > 1 MiB is
    # split off): no new segment; the allocated high-water mark is the first 30 MiB block
    est = replay([("alloc", 30 * MIB), ("free", 0), ("alloc", 12 * MIB), ("alloc", 12 * MIB)])
    assert est.peak_reserved_bytes == 30 * MIB
    assert est.peak_allocated_bytes == 30 * MIB
    later = replay([("alloc", 30 * MIB), ("free", 0), ("alloc", 12 * MIB), ("alloc", 12 * MIB), ("alloc", 12 * MIB)])
    assert later.peak_reserved_bytes == 42 * MIB  # only 6 MiB left: the third needs its own 12 MiB segment


def test_expandable_segments_grow_in_20mib_pages() -> None:
    # one large-pool segment: 12 MiB maps one 20 MiB page, the second 12 MiB a second page; the freed first
    # block and the 16 MiB free tail then serve 14 MiB without a new mapping
    events = [("alloc", 12 * MIB), ("alloc", 12 * MIB), ("free", 0), ("alloc", 14 * MIB)]
    est = replay(events, expandable_segments=True)
    assert est.peak_reserved_bytes == 40 * MIB
    big = [("alloc", 100 * MIB), ("free", 0), ("alloc", 60 * MIB), ("alloc", 60 * MIB)]
    assert replay(big).peak_reserved_bytes == 160 * MIB  # 100 MiB segment split, then a new 60 MiB one
    assert replay(big, expandable_segments=True).peak_reserved_bytes == 120 * MIB  # the segment grows by 20
