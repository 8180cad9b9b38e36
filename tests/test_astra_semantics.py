"""ASTRA-sim collective semantics (trainsim.cost.semantics / multidim / astra_tree / collective_gap and
validate.astra_reference): known answers worked by hand from ../shared/validation/astra_reference.md
(ASTRA-sim 2.0's own numbers) and properties that must hold whatever the topology.

Units: ASTRA-sim's "GB/s" is GiB/s and bandwidth is per link; a Dimension takes the NPU's bandwidth in
1e9 B/s (= B/ns), so a link of `bw` ASTRA GB/s moves bw * 2^30 / 1e9 bytes per ns and an FC(k) dimension
has k-1 such links. Every hand formula below is written in whole ns, as ASTRA-sim computes it:
d(m, h) = floor(h * L + m / B) per message, + E (endpoint delay) per message and per phase, + 3 * floor(m /
local-mem-bw) per reducing step.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainsim.cli import main
from trainsim.cost.astra_tree import tree_roles
from trainsim.cost.collective_gap import explain
from trainsim.cost.multidim import Dimension, run_collective
from trainsim.cost.semantics import NCCL, TERMS, Semantics, astra, without
from trainsim.validate.astra_reference import astra_outcomes, parse_row

VALIDATION = Path(__file__).resolve().parents[2] / "shared" / "validation"
REFERENCE = VALIDATION / "astra_reference.csv"
GIB_B_PER_NS = 2**30 / 1e9  # one ASTRA "GB/s" (GiB/s) in bytes per ns
MIB = 2**20
PROPS = settings(max_examples=40, deadline=None)


# -- building blocks ------------------------------------------------------------------------------------

def ring(k: int, bw: float, lat_ns: float, algorithm: str = "ring") -> Dimension:
    return Dimension("ring", k, bw * GIB_B_PER_NS, lat_ns * 1e-9, algorithm, 1)


def fc(k: int, bw: float, lat_ns: float, algorithm: str = "direct") -> Dimension:
    """FC(k): k-1 peer links of `bw` each, so the NPU's bandwidth is bw x (k-1)."""
    return Dimension("fc", k, bw * GIB_B_PER_NS * (k - 1), lat_ns * 1e-9, algorithm, k - 1)


def switch(k: int, bw: float, lat_ns: float, algorithm: str = "halving_doubling") -> Dimension:
    return Dimension("switch", k, bw * GIB_B_PER_NS, lat_ns * 1e-9, algorithm, 1)


def make(kind: str, k: int, bw: float, lat_ns: float, algorithm: str) -> Dimension:
    return {"ring": ring, "fc": fc, "switch": switch}[kind](k, bw, lat_ns, algorithm)


def ns(op: str, size: float, dims: list[Dimension], chunks: int = 1, sem: Semantics = NCCL,
       scheduler: str = "baseline") -> float:
    return run_collective(op, size, dims, scheduler, chunks, sem).time_s * 1e9


def d_ns(msg: float, bw: float, lat_ns: float, hops: int = 1) -> int:
    """ASTRA-sim's network delay of one message: floor(hops x L + bytes / B), B in bytes per ns computed as
    ASTRA-sim does (bw x 2^30 / 1e9, in that order: 250 GiB/s moves 4 MiB in exactly 15625 ns)."""
    return math.floor(hops * lat_ns + msg / (bw * 2**30 / 1e9))


def red_ns(msg: float, lmb: float | None) -> int:
    """ASTRA-sim's local reduction charge: one write and two reads at local-mem-bw (1e9 B/s)."""
    return 0 if lmb is None else 3 * math.floor(msg / lmb)


def same_ns(got: float, want: float) -> bool:
    """Equal to the nanosecond (the model computes in float seconds: allow its last bits, not 1 ns)."""
    return abs(got - want) <= 1e-3


def ring8_ar_ns(size: int, chunks: int = 1, e: float = 10.0) -> int:
    """Ring(8) all_reduce at 50 GiB/s per link, 500 ns, local-mem-bw 1600: C chunks hold the ring in
    turn, each for E + 2(k-1) steps of (d(D/k) + E) + (k-1) reductions of D/k."""
    k, msg = 8, size // chunks // 8
    one = e + 2 * (k - 1) * (d_ns(msg, 50, 500) + e) + (k - 1) * red_ns(msg, 1600)
    return int(chunks * one)


# -- 1, 2, 5: Ring(8) all-reduce, the reference's worked example ---------------------------------------

def test_ring8_all_reduce_worked_example() -> None:
    """A0003: 14 steps of floor(500 + 131072 / B) + 10, 7 x 3 x floor(131072 / 1600), + 10 = 43025 ns."""
    b = 50 * GIB_B_PER_NS
    hand = 14 * (math.floor(500 + 131072 / b) + 10) + 7 * 3 * math.floor(131072 / 1600) + 10
    assert hand == 14 * 2951 + 7 * 243 + 10 == 43025
    assert same_ns(ns("all_reduce", MIB, [ring(8, 50, 500)], 1, astra(10, 1600)), 43025)
    assert astra() == astra(10, 1600)  # ASTRA-sim's shipped defaults: E = 10 ns, local-mem-bw 1600


@pytest.mark.parametrize(("chunks", "us"), [(1, 43.025), (4, 64.440), (16, 150.128), (64, 492.992)])
def test_ring8_chunk_series(chunks: int, us: float) -> None:
    """A0003-A0006: one queue, so C chunks take C times the one-chunk time of size / C."""
    assert ring8_ar_ns(MIB, chunks) == round(us * 1000)
    got = ns("all_reduce", MIB, [ring(8, 50, 500)], chunks, astra())
    assert same_ns(got, us * 1000)
    assert same_ns(got, chunks * ns("all_reduce", MIB / chunks, [ring(8, 50, 500)], 1, astra()))


@pytest.mark.parametrize(("e", "us"), [(10.0, 64.44), (100.0, 69.84), (1000.0, 123.84)])
def test_endpoint_delay_series(e: float, us: float) -> None:
    """A0004, A0016, A0017: Ring(8) all_reduce 1 MiB in 4 chunks; E per step and per phase."""
    assert ring8_ar_ns(MIB, 4, e) == round(us * 1000)
    assert same_ns(ns("all_reduce", MIB, [ring(8, 50, 500)], 4, astra(e)), us * 1000)


dims_1d = st.builds(
    make,
    kind=st.sampled_from(["ring", "fc", "switch"]),
    k=st.sampled_from([2, 4, 8, 16]),
    bw=st.sampled_from([12.5, 50.0, 100.0, 400.0]),
    lat_ns=st.sampled_from([0.0, 100.0, 500.0, 1000.0]),
    algorithm=st.sampled_from(["ring", "direct", "halving_doubling"]),
)
astra_ops = st.sampled_from(["all_reduce", "reduce_scatter", "all_gather", "all_to_all"])


@PROPS
@given(dim=dims_1d, op=astra_ops, chunks=st.sampled_from([2, 3, 4, 8, 16]), per=st.integers(6, 18),
       e=st.sampled_from([10.0, 100.0]), lmb=st.sampled_from([1600.0, None]))
def test_one_queue_chunks_take_c_times_one_chunk(dim: Dimension, op: str, chunks: int, per: int, e: float,
                                                  lmb: float | None) -> None:
    """On 1-D with one queue a chunk holds the dimension for its whole phase, so C chunks of size / C
    take C times one chunk of size / C (sizes whole bytes, at least npus bytes per chunk)."""
    if op == "all_to_all" and dim.algorithm == "halving_doubling":
        return  # ASTRA-sim exits on a halving-doubling all-to-all
    sem = astra(e, lmb)
    size = dim.size * chunks * 2**per
    assert ns(op, size, [dim], chunks, sem) == pytest.approx(chunks * ns(op, size // chunks, [dim], 1, sem),
                                                             rel=1e-12)


# -- 3: all-gather of c per rank = reduce-scatter of c x npus with free reduction ----------------------

@pytest.mark.parametrize("lmb", [None, 1e9])
def test_all_gather_equals_reduce_scatter_ring16(lmb: float | None) -> None:
    """A0053: Ring(16) at 100 GiB/s, 200 ns: RS 16 MiB = AG of 1 MiB per rank = 149.635 us.
    Both are E + 15 steps of (d(1 MiB) + E)."""
    hand = 10 + 15 * (d_ns(MIB, 100, 200) + 10)
    assert hand == 149635
    dims = [ring(16, 100, 200)]
    sem = astra(10, lmb)
    assert same_ns(ns("reduce_scatter", 16 * MIB, dims, 1, sem), hand)
    assert same_ns(ns("all_gather", 16 * MIB, dims, 1, sem), hand)  # nccl-tests size: 1 MiB x 16 ranks


def test_all_gather_equals_reduce_scatter_ring4_ring4() -> None:
    """A0165: Ring(4)_Ring(4), RS 256 MiB = AG of 16 MiB per rank = 1125.380 us on the same network."""
    rows = {r["row_id"]: r for r in _reference_rows()}
    if "A0165" not in rows:
        pytest.skip(f"{REFERENCE} (row A0165) is absent")
    ar = parse_row(rows["A0165"])
    assert ar.op == "reduce_scatter" and ar.size_bytes == 256 * MIB
    sem = replace(ar.semantics, local_mem_bw_gbps=None)
    assert same_ns(ns("reduce_scatter", 256 * MIB, list(ar.dims), 1, sem), 1125380)
    assert same_ns(ns("all_gather", 256 * MIB, list(ar.dims), 1, sem), 1125380)


@PROPS
@given(ks=st.lists(st.sampled_from([2, 4, 8, 16, 32]), min_size=1, max_size=2),
       bws=st.lists(st.sampled_from([25.0, 50.0, 100.0, 200.0]), min_size=2, max_size=2),
       lat=st.sampled_from([0.0, 200.0, 700.0]), c_log2=st.integers(4, 24),
       e=st.sampled_from([10.0, 100.0]), lmb=st.sampled_from([None, 1e9]))
def test_all_gather_equals_reduce_scatter_property(ks: list[int], bws: list[float], lat: float, c_log2: int,
                                                   e: float, lmb: float | None) -> None:
    """Free reduction: AG of c per rank (nccl-tests size c x npus) = RS of c x npus, to the ns, on any
    stack of rings: dimension i carries messages of c x npus / k_0 / ... / k_i either way."""
    dims = [ring(k, bw, lat) for k, bw in zip(ks, bws, strict=False)]
    npus = math.prod(ks)
    c = 2**c_log2
    sem = astra(e, lmb)
    rs = ns("reduce_scatter", c * npus, dims, 1, sem)
    assert same_ns(ns("all_gather", c * npus, dims, 1, sem), rs)
    if len(ks) == 1:
        k = ks[0]
        assert same_ns(rs, e + (k - 1) * (d_ns(c, bws[0], lat) + e))


# -- 4: FC direct all-reduce ---------------------------------------------------------------------------

def test_fc8_direct_all_reduce() -> None:
    """A0065: FC(8) direct all_reduce 1 MiB at 200 GiB/s per link, 100 ns: E + d + E + R + d + E."""
    d = d_ns(MIB / 8, 200, 100)
    r = red_ns(MIB / 8, 1600)
    assert (d, r) == (710, 243)
    hand = 10 + d + 10 + r + d + 10
    assert hand == 1693
    assert same_ns(ns("all_reduce", MIB, [fc(8, 200, 100)], 1, astra()), hand)


# -- 6: ring all-to-all one way round ------------------------------------------------------------------

def test_ring1024_all_to_all_closed_form() -> None:
    """Ring(1024) all_to_all 1 MiB (ASTRA-sim needs > 120 s for it): k(k-1)/2 neighbour steps of D/k."""
    k, size, lat, bw, e = 1024, MIB, 500.0, 50.0, 10.0
    hand = k * (k - 1) // 2 * (d_ns(size / k, bw, lat) + e) + e
    assert hand == 523776 * 529 + 10
    assert same_ns(ns("all_to_all", size, [ring(k, bw, lat)], 1, astra(e)), hand)


@PROPS
@given(k=st.integers(2, 64), per=st.integers(0, 16), bw=st.sampled_from([25.0, 100.0]),
       lat=st.sampled_from([0.0, 500.0]), e=st.sampled_from([10.0, 1000.0]))
def test_ring_all_to_all_one_way_property(k: int, per: int, bw: float, lat: float, e: float) -> None:
    d = k * 2**per  # at least npus bytes: no chunk raise
    hand = k * (k - 1) // 2 * (d_ns(d // k, bw, lat) + e) + e
    assert same_ns(ns("all_to_all", d, [ring(k, bw, lat)], 1, astra(e)), hand)


# -- 7: the congestion-aware backend -------------------------------------------------------------------

def test_switch64_direct_all_to_all_aware() -> None:
    """A0150: Switch(64) direct all_to_all 16 MiB at 100 GiB/s, 1000 ns: the 63 messages of m = D/64 leave
    the uplink one after another (floor(m/B) apart) and each is stored and forwarded over 2 links."""
    m, bw, lat, e = 16 * MIB // 64, 100.0, 1000.0, 10.0
    wire, one_link = d_ns(m, bw, 0), d_ns(m, bw, lat)
    assert (wire, one_link) == (2441, 3441)
    hand = e + 62 * wire + 2 * one_link + e
    assert hand == 158244
    dims = [switch(64, bw, lat, "direct")]
    assert same_ns(ns("all_to_all", 16 * MIB, dims, 1, astra(backend="aware")), hand)
    # A0148: the unaware backend gives every concurrent send the whole port: E + d(m, 2 hops) + E
    assert same_ns(ns("all_to_all", 16 * MIB, dims, 1, astra()), e + d_ns(m, bw, lat, 2) + e)
    assert d_ns(m, bw, lat, 2) + 2 * e == 4461


@PROPS
@given(kind=st.sampled_from(["ring", "fc"]), k=st.integers(2, 16), op=astra_ops, per=st.integers(4, 20),
       chunks=st.sampled_from([1, 2, 4]), bw=st.sampled_from([25.0, 100.0]),
       lat=st.sampled_from([0.0, 10.0, 500.0]), e=st.sampled_from([10.0, 100.0]))
def test_aware_equals_unaware_without_contention(kind: str, k: int, op: str, per: int, chunks: int, bw: float,
                                                 lat: float, e: float) -> None:
    """Ring with ring and FC with direct: one message per link, so the congestion-aware backend agrees
    with the unaware one exactly (astra_reference.md)."""
    dim = make(kind, k, bw, lat, "ring" if kind == "ring" else "direct")
    size = k * chunks * 2**per
    aware = ns(op, size, [dim], chunks, astra(e, backend="aware"))
    assert same_ns(aware, ns(op, size, [dim], chunks, astra(e)))


def test_aware_equals_unaware_on_ring_with_fractional_latency() -> None:
    """Ring(8) all_reduce 1 MiB at 50 GiB/s, 0.7 ns: one hop per message, so both backends price a step at
    floor(0.7 + 2441.40625) + E = 2452 ns; 14 steps + 7 x 243 + 10 = 36039 ns."""
    dims = [ring(8, 50, 0.7)]
    hand = 14 * (d_ns(MIB / 8, 50, 0.7) + 10) + 7 * red_ns(MIB / 8, 1600) + 10
    assert hand == 36039
    assert same_ns(ns("all_reduce", MIB, dims, 1, astra()), hand)
    assert same_ns(ns("all_reduce", MIB, dims, 1, astra(backend="aware")), hand)  # gives 36025


# -- 8: double binary tree -----------------------------------------------------------------------------

def test_tree_roles_k8() -> None:
    """Even chunks: root 7 -> 3 -> {1, 5} -> leaves {0, 2, 4, 6}; odd: root 0 -> 4 -> {2, 6} -> {1, 3, 5, 7}."""
    parent, children = tree_roles(8, True)
    assert parent[7] == -1 and children[7] == [3]
    assert parent[3] == 7 and sorted(children[3]) == [1, 5]
    assert sorted(children[1]) == [0, 2] and sorted(children[5]) == [4, 6]
    assert [p for p in range(8) if not children[p]] == [0, 2, 4, 6]
    parent, children = tree_roles(8, False)
    assert parent[0] == -1 and children[0] == [4]
    assert parent[4] == 0 and sorted(children[4]) == [2, 6]
    assert sorted(children[2]) == [1, 3] and sorted(children[6]) == [5, 7]
    assert [p for p in range(8) if not children[p]] == [1, 3, 5, 7]


@pytest.mark.parametrize("k", [0, 1, 3, 6, 12])
def test_tree_roles_refuses_non_power_of_two(k: int) -> None:
    with pytest.raises(ValueError, match="power-of-two"):
        tree_roles(k, True)


@given(m=st.integers(1, 9), root_last=st.booleans())
@settings(max_examples=30, deadline=None)
def test_tree_roles_shape(m: int, root_last: bool) -> None:
    """A sentinel root with one child over a complete in-order tree of k-1 positions: k/2 leaves (even
    positions under the last-position root, odd under position 0), every node m levels or fewer deep,
    parent and children consistent."""
    k = 2**m
    parent, children = tree_roles(k, root_last)
    root = k - 1 if root_last else 0
    assert [p for p in range(k) if parent[p] == -1] == [root]
    assert len(children[root]) == 1
    for p in range(k):
        assert len(children[p]) <= 2
        assert all(parent[c] == p for c in children[p])
        depth, q = 0, p
        while parent[q] != -1:
            q, depth = parent[q], depth + 1
            assert depth <= m
        if not children[p] and p != root:
            assert depth == m
    leaves = [p for p in range(k) if not children[p]]
    assert leaves == list(range(0 if root_last else 1, k, 2))


def test_switch8_double_binary_tree_one_chunk() -> None:
    """Switch(8) DBT all_reduce 1 MiB, 1 chunk, 400 GiB/s, 750 ns: every message carries the whole chunk,
    the slowest NPU (a leaf) finishes at E + (2m-1)(d+E+R) + d + E = 33541 ns."""
    m, e = 3, 10
    d = d_ns(MIB, 400, 750, hops=2)
    r = red_ns(MIB, 1600)
    assert (d, r) == (3941, 1965)
    hand = e + (2 * m - 1) * (d + e + r) + d + e
    assert hand == 33541
    assert same_ns(ns("all_reduce", MIB, [switch(8, 400, 750, "double_binary_tree")], 1, astra()), hand)


@PROPS
@given(kind=st.sampled_from(["switch", "fc"]), m=st.integers(1, 5), per=st.integers(5, 24),
       bw=st.sampled_from([50.0, 400.0]), lat=st.sampled_from([0.0, 750.0]), e=st.sampled_from([10.0, 100.0]),
       lmb=st.sampled_from([1600.0, None]))
def test_double_binary_tree_one_chunk_property(kind: str, m: int, per: int, bw: float, lat: float, e: float,
                                               lmb: float | None) -> None:
    """The one-chunk closed form on any power-of-two Switch (2 hops) or FC (1 hop)."""
    k, size = 2**m, 2**per * 2**m
    d = d_ns(size, bw, lat, hops=2 if kind == "switch" else 1)
    r = red_ns(size, lmb)
    hand = e + (2 * m - 1) * (d + e + r) + d + e
    assert same_ns(ns("all_reduce", size, [make(kind, k, bw, lat, "double_binary_tree")], 1, astra(e, lmb)), hand)


# -- 9: every row of the reference file ----------------------------------------------------------------

def _reference_rows() -> list[dict[str, str]]:
    if not REFERENCE.is_file():
        pytest.skip(f"{REFERENCE} is absent (CI keeps ../shared beside the clone)")
    with REFERENCE.open(newline="") as f:
        return list(csv.DictReader(f))


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def ring_row_hand_ns(row: dict[str, str]) -> int:
    """astra_reference.md 'Sanity check': one chunk, one queue, every dimension a Ring running ring. Per
    phase: E + steps x (floor(L + msg / B) + E) + reducing steps x 3 floor(msg / local-mem-bw), with the
    hierarchical sizes (RS shrinks D to D/k, AG grows it to k D, all-reduce: RS up, AR on top, AG down)."""
    ks = [int(p[len("Ring("):-1]) for p in row["topology"].split("_")]
    bws, lats = _floats(row["bandwidth_gbps_per_dim"]), _floats(row["latency_ns_per_dim"])
    e, lmb = float(row["endpoint_delay_ns"]), float(row["local_mem_bw_gbps"])
    data, op = int(row["comm_size_bytes"]), row["op"]

    def step(i: int, msg: int) -> float:
        return d_ns(msg, bws[i], lats[i]) + e

    def rs(i: int, d: int) -> float:
        k = ks[i]
        return e + (k - 1) * (step(i, d // k) + red_ns(d // k, lmb))

    def ag(i: int, d: int) -> float:
        return e + (ks[i] - 1) * step(i, d)

    dims = range(len(ks))
    total = 0.0
    if op == "reduce_scatter":
        for i in dims:
            total += rs(i, data)
            data //= ks[i]
    elif op == "all_gather":  # comm_size is the input per rank; outermost first
        for i in reversed(dims):
            total += ag(i, data)
            data *= ks[i]
    elif op == "all_to_all":
        total = sum(e + ks[i] * (ks[i] - 1) // 2 * step(i, data // ks[i]) for i in dims)
    else:
        *up, top = dims
        for i in up:
            total += rs(i, data)
            data //= ks[i]
        k = ks[top]
        total += e + 2 * (k - 1) * step(top, data // k) + (k - 1) * red_ns(data // k, lmb)
        for i in reversed(up):
            total += ag(i, data)
            data *= ks[i]
    return int(total)


def _pure_ring(row: dict[str, str]) -> bool:
    return (row["chunks"] == "1" and row["queues_per_dim"] == "1" and row["backend"] == "unaware"
            and all(p.startswith("Ring(") for p in row["topology"].split("_"))
            and all(a.strip() == "ring" for a in row["algorithms_per_dim"].split(",")))


def test_every_reference_row_in_astra_semantics() -> None:
    rows = _reference_rows()
    assert len(rows) == 211
    bad = []
    for row in rows:
        got_us = parse_row(row).time_s() * 1e6
        if not abs(got_us - float(row["astra_time_us"])) <= 0.0005 + 1e-9:
            bad.append(f"{row['row_id']} {row['topology']} {row['op']}: {got_us:.4f} vs {row['astra_time_us']}")
    assert not bad, "\n".join(bad)


def test_pure_ring_rows_match_the_hand_formula() -> None:
    rows = [r for r in _reference_rows() if _pure_ring(r)]
    assert len(rows) >= 20  # 36 over all 305 rows, 29 of them in this file
    assert {r["op"] for r in rows} == {"all_reduce", "reduce_scatter", "all_gather", "all_to_all"}
    assert any("_" in r["topology"] for r in rows)  # hierarchical sizes are exercised
    for row in rows:
        hand = ring_row_hand_ns(row)
        assert hand == round(float(row["astra_time_us"]) * 1000), row["row_id"]
        assert same_ns(parse_row(row).time_s() * 1e9, hand), row["row_id"]


def test_ring_formula_row_with_and_without_reduction() -> None:
    """A0008 vs A0019: Ring(8) all_reduce 256 MiB, 1 chunk, with local-mem-bw 1600 and free."""
    rows = {r["row_id"]: r for r in _reference_rows()}
    for rid, us in (("A0008", 9197.5), ("A0019", 8757.2)):
        if rid in rows:
            assert float(rows[rid]["astra_time_us"]) == pytest.approx(us, abs=0.051)  # the .md's one decimal
            assert ring_row_hand_ns(rows[rid]) == round(float(rows[rid]["astra_time_us"]) * 1000)


# -- 10: properties over random topologies --------------------------------------------------------------

@st.composite
def networks(draw: st.DrawFn) -> tuple[str, list[Dimension]]:
    """(op, dims): 1-3 Ring / FC / Switch dimensions of 2-8 NPUs (powers of two for halving-doubling) and
    an op; a double binary tree only as an all-reduce's outermost dimension on a power-of-two size."""
    op = draw(st.sampled_from(["all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast",
                               "reduce"]))
    n = draw(st.integers(1, 3))
    dims = []
    for i in range(n):
        kind = draw(st.sampled_from(["ring", "fc", "switch"]))
        algos = ["ring", "direct", "halving_doubling"]
        if op == "all_reduce" and i == n - 1:
            algos.append("double_binary_tree")
        algo = draw(st.sampled_from(algos))
        pow2 = algo in ("halving_doubling", "double_binary_tree")
        k = draw(st.sampled_from([2, 4, 8]) if pow2 else st.integers(2, 8))
        bw = draw(st.sampled_from([12.5, 50.0, 100.0, 400.0]))
        lat = draw(st.sampled_from([0.0, 10.0, 500.0, 1000.0]))
        dims.append(make(kind, k, bw, lat, algo))
    return op, dims


@st.composite
def astra_semantics(draw: st.DrawFn, one_dim: bool) -> Semantics:
    return astra(draw(st.sampled_from([10.0, 100.0, 1000.0])), draw(st.sampled_from([1600.0, None, 1e9])),
                 backend=draw(st.sampled_from(["unaware", "aware"] if one_dim else ["unaware"])),
                 queues_per_dim=draw(st.sampled_from([1, 2, 4])),
                 active_chunks_per_dim=draw(st.sampled_from([1, 2])),
                 scheduling=draw(st.sampled_from(["LIFO", "FIFO"])), local_bw_aware=draw(st.booleans()))


sizes = st.one_of(st.integers(1, 2**26), st.integers(8, 28).map(lambda j: 2**j))


@PROPS
@given(net=networks(), data=st.data(), size=sizes, chunks=st.integers(1, 8),
       scheduler=st.sampled_from(["baseline", "themis"]))
def test_every_term_off_is_nccl(net: tuple[str, list[Dimension]], data: st.DataObject, size: int, chunks: int,
                                scheduler: str) -> None:
    """Switching every ASTRA term off, in any order, lands on NCCL's semantics and NCCL's time; a semantics
    with NCCL's settings under another name prices the same."""
    op, dims = net
    sem = data.draw(astra_semantics(len(dims) == 1))
    order = data.draw(st.permutations([name for name, _ in TERMS]))
    for name in order:
        sem = without(sem, name)
    assert sem == NCCL and sem.is_nccl
    nccl = ns(op, size, dims, chunks, NCCL, scheduler)
    assert ns(op, size, dims, chunks, sem, scheduler) == pytest.approx(nccl, rel=1e-9)
    assert ns(op, size, dims, chunks, replace(NCCL, name="custom"), scheduler) == pytest.approx(nccl, rel=1e-9)


def test_each_term_changes_astra_semantics() -> None:
    """Every term of TERMS switches something that astra() (with queues, aware, baseline) turns on."""
    sem = astra(backend="aware", queues_per_dim=4, active_chunks_per_dim=2, local_bw_aware=False)
    for name, what in TERMS:
        assert what
        assert without(sem, name) != sem, name
    assert len({name for name, _ in TERMS}) == len(TERMS)
    with pytest.raises(KeyError):
        without(sem, "no_such_term")


@PROPS
@given(net=networks(), data=st.data(), size=sizes, chunks=st.integers(1, 8),
       scheduler=st.sampled_from(["baseline", "themis"]))
def test_gap_terms_add_up(net: tuple[str, list[Dimension]], data: st.DataObject, size: int, chunks: int,
                          scheduler: str) -> None:
    """explain(): the term deltas add up to ASTRA's time minus NCCL's, each priced independently."""
    op, dims = net
    sem = data.draw(astra_semantics(len(dims) == 1))

    def time_of(s: Semantics) -> float:
        return run_collective(op, size, dims, scheduler, chunks, s).time_s

    gap = explain(time_of, sem)
    astra_s, nccl_s = time_of(sem), time_of(NCCL)
    assert gap.astra_s == pytest.approx(astra_s, rel=1e-12)
    assert gap.nccl_s == pytest.approx(nccl_s, rel=1e-12)
    assert sum(t.delta_s for t in gap.terms) == pytest.approx(astra_s - nccl_s, rel=1e-9, abs=1e-18)
    names = [name for name, _ in TERMS]
    assert [t.name for t in gap.terms] == sorted((t.name for t in gap.terms), key=names.index)
    assert all(t.delta_s != 0.0 for t in gap.terms)


def test_gap_terms_ring8_known_answer() -> None:
    """Ring(8) all_reduce 1 MiB, 1 chunk: NCCL's time is the textbook 14 (L + D/8/B) = 41179.6875 ns
    (astra_reference.md: 41.180 us); the gap is 15 endpoint delays, 7 reductions of 243 ns, and the
    14 x 0.40625 ns that whole-ns truncation saves."""
    dims = [ring(8, 50, 500)]

    def time_of(s: Semantics) -> float:
        return run_collective("all_reduce", MIB, dims, "baseline", 1, s).time_s

    gap = explain(time_of, astra())
    assert gap.nccl_s * 1e9 == pytest.approx(14 * (500 + MIB / 8 / (50 * GIB_B_PER_NS)), rel=1e-12)
    assert gap.nccl_s * 1e9 == pytest.approx(41179.6875, rel=1e-12)
    deltas = {t.name: t.delta_s * 1e9 for t in gap.terms}
    assert deltas == pytest.approx({"endpoint_delay": 150.0, "reduction": 1701.0, "truncation": -14 * 0.40625},
                                   abs=1e-6)


@PROPS
@given(net=networks(), size=sizes, chunks=st.integers(1, 8), scheduler=st.sampled_from(["baseline", "themis"]))
def test_nccl_is_the_default_semantics(net: tuple[str, list[Dimension]], size: int, chunks: int,
                                       scheduler: str) -> None:
    op, dims = net
    assert run_collective(op, size, dims, scheduler, chunks).time_s == \
        run_collective(op, size, dims, scheduler, chunks, semantics=NCCL).time_s


@PROPS
@given(net=networks(), size=sizes, chunks=st.integers(1, 8), lmb=st.sampled_from([1600.0, None]),
       es=st.lists(st.sampled_from([10.0, 20.0, 100.0, 1000.0]), min_size=2, max_size=2, unique=True))
def test_astra_time_grows_with_endpoint_delay(net: tuple[str, list[Dimension]], size: int, chunks: int,
                                              lmb: float | None, es: list[float]) -> None:
    op, dims = net
    lo, hi = sorted(es)
    assert ns(op, size, dims, chunks, astra(lo, lmb)) < ns(op, size, dims, chunks, astra(hi, lmb))


@PROPS
@given(dim=dims_1d, op=astra_ops, size=sizes, chunks=st.sampled_from([1, 2, 3, 4, 8, 16]),
       e=st.sampled_from([10.0, 100.0]), lmb=st.sampled_from([1600.0, None]))
def test_astra_time_grows_with_chunks_on_1d(dim: Dimension, op: str, size: int, chunks: int, e: float,
                                            lmb: float | None) -> None:
    """On 1-D with one queue the chunks take the dimension in turn, each paying every step's latency and
    endpoint delay: twice the chunks is slower (the whole-ns truncation saves under 1 ns a step, E >= 10).
    Sizes that split evenly: ASTRA-sim gives a remainder a whole chunk of its own (size // splits per chunk)."""
    quantum = 2 * chunks * dim.size * (dim.size if op == "all_gather" else 1)
    size = max(quantum, size - size % quantum)
    sem = astra(e, lmb)
    assert ns(op, size, [dim], 2 * chunks, sem) > ns(op, size, [dim], chunks, sem)


# -- 11: `trainsim validate` on the reference file -------------------------------------------------------

def _validate(tmp_path: Path, *extra: str) -> dict:
    out = tmp_path / "out.json"
    main(["validate", str(REFERENCE), "--json", str(out), "-q", "--jobs", "1", *extra])
    return json.loads(out.read_text())


def test_cli_validate_astra_semantics(tmp_path: Path) -> None:
    _reference_rows()
    data = _validate(tmp_path)
    assert data["summary"]["n"] == 211 and data["summary"]["skipped"] == 0
    assert data["summary"]["max_ape"] < 1e-3


def _nccl_gap_terms(tmp_path: Path) -> tuple[dict, list[dict]]:
    _reference_rows()
    data = _validate(tmp_path, "--semantics", "nccl")
    return data, data["gap_terms"]


def test_cli_validate_nccl_semantics_gap_terms(tmp_path: Path) -> None:
    """--semantics nccl predicts NCCL's time and names the terms of the gap; their shares are of the file's
    summed gap (ASTRA's time minus NCCL's), so they add up to 100."""
    data, terms = _nccl_gap_terms(tmp_path)
    assert data["summary"]["n"] == 211
    names = [name for name, _ in TERMS]
    assert terms and all(t["term"] in names for t in terms)
    gap_us = sum(r["measured"] - r["predicted"] for r in data["rows"])
    assert sum(t["total_us"] for t in terms) == pytest.approx(gap_us, rel=1e-6)
    assert sum(t["mean_share_pct"] for t in terms) == pytest.approx(100.0, abs=1e-4)
    # the NCCL-like prediction of each row is the independent NCCL-semantics run of that row
    rows = _reference_rows()
    for r, row in itertools.islice(zip(data["rows"], rows, strict=True), 0, None, 20):
        assert r["predicted"] == pytest.approx(parse_row(row).time_s(NCCL) * 1e6, rel=1e-12)


def test_cli_validate_nccl_gap_shares_sum_to_100_exactly(tmp_path: Path) -> None:
    _, terms = _nccl_gap_terms(tmp_path)
    assert sum(t["mean_share_pct"] for t in terms) == pytest.approx(100.0, abs=1e-6)


def test_astra_outcomes_term_tags_add_up_to_each_rows_gap() -> None:
    """Per row, the term tags add up to ASTRA's (model) time minus NCCL's, to their printed precision (six
    significant digits each: terms that cancel, e.g. A0114's queues -67.284 and latency +68.0833, leave
    only that much of the sum)."""
    rows = _reference_rows()
    for o, row in zip(astra_outcomes(rows, "nccl"), rows, strict=True):
        gap = parse_row(row).gap()
        tags = [float(v) for key, v in (o.tags or {}).items() if key.startswith("term:")]
        assert len(tags) == len(gap.terms)
        assert o.predicted == pytest.approx(gap.nccl_s * 1e6, rel=1e-12)
        assert abs(sum(tags) - gap.gap_s * 1e6) <= 5e-6 * sum(map(abs, tags)) + 1e-9, row["row_id"]


def test_cli_semantics_refused_on_other_files(capsys: pytest.CaptureFixture[str]) -> None:
    other = VALIDATION / "collectives.csv"
    if not other.is_file():
        pytest.skip(f"{other} is absent")
    with pytest.raises(SystemExit) as exc:
        main(["validate", str(other), "--semantics", "nccl", "-q"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error:") and "--semantics" in err


def test_a_remainder_gets_a_whole_chunk_of_its_own() -> None:
    """ASTRA-sim's chunk is comm_size // splits and every chunk carries a whole one: 1 MiB in 3 splits is
    4 chunks of 349525 B (3 x 349525 = 1 MiB - 1 B), each priced as Ring(8)'s one-chunk all-reduce."""
    piece = MIB // 3
    msg = piece // 8
    one = 14 * (d_ns(msg, 50, 500) + 10) + 7 * red_ns(msg, 1600) + 10
    assert ns("all_reduce", MIB, [ring(8, 50, 500)], 3, astra()) == 4 * one
