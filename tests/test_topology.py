"""ASTRA-sim topology notation (trainsim.hardware.topology)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainsim.hardware.cluster import get_cluster
from trainsim.hardware.topology import format_topology, parse_topology


def test_parses_the_paper_example() -> None:
    levels = parse_topology("Ring(2)_FC(8)_Ring(8)_Switch(4)", [1000, 200, 100, 50], [500, 500, 500, 500])
    assert [lv.kind for lv in levels] == ["ring", "fc", "ring", "switch"]
    assert [lv.size for lv in levels] == [2, 8, 8, 4]
    assert math.prod(lv.size for lv in levels) == 512
    assert levels[1].bandwidth_gbps == 200.0
    assert levels[3].latency_s == pytest.approx(500e-9)
    assert parse_topology("FullyConnected(4)", [1], [0])[0].kind == "fc"


@given(st.lists(st.tuples(st.sampled_from(["Ring", "FC", "Switch"]), st.integers(2, 64)), min_size=1, max_size=5))
def test_format_inverts_parse(dims: list[tuple[str, int]]) -> None:
    spec = "_".join(f"{k}({n})" for k, n in dims)
    levels = parse_topology(spec, [100.0] * len(dims), [500.0] * len(dims))
    assert format_topology(levels) == spec


def test_cluster_presets_have_a_notation() -> None:
    assert format_topology(get_cluster("dgx-a100", 4).levels) == "Switch(8)_Switch(4)"


@pytest.mark.parametrize(("spec", "bw", "lat", "needle"), [
    ("", [], [], "empty"),
    ("Ring(4)_Torus(2)", [1, 1], [0, 0], "dimension 2 'Torus(2)'"),
    ("Ring4", [1], [0], "dimension 1 'Ring4'"),
    ("Ring(1)", [1], [0], "at least 2"),
    ("Ring(4)_FC(2)", [1], [0, 0], "bandwidth has 1 value(s) for 2"),
    ("Ring(4)_FC(2)", [1, 1], [0], "latency has 1 value(s) for 2"),
    ("Ring(4)", [0], [0], "positive GB/s"),
    ("Ring(4)", [1], [-1], ">= 0 ns"),
])
def test_bad_topologies_name_the_part_and_the_fix(spec: str, bw: list[float], lat: list[float], needle: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_topology(spec, bw, lat)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)
