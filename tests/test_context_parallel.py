"""Context parallelism: K/V bytes of the gather, ring attention (p2p) overlap against the all-gather form,
and the option's plumbing."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

import trainsim
from trainsim.api import strategy_tree
from trainsim.compile.program import Step, lower
from trainsim.cost.annotate import _ring_attention
from trainsim.errors import ConfigError
from trainsim.hardware.devices import get_device
from trainsim.strategy.precision import Precision
from trainsim.workload.ir import Op, OpKind

H100 = get_device("h100-sxm")


def test_cp_gathers_only_k_and_v() -> None:
    """Llama-3-8B (32 heads, 8 KV heads, head dim 128), tp 2, cp 4, seq 8192: each of K and V gathered over cp
    is b x s x (8 x 128 / tp) x 2 bytes = 8192 x 512 x 2 (not the fused QKV output, 6x that)."""
    tree = strategy_tree({"model": {"name": "llama3-8b", "layers": 2, "seq_len": 8192},
                          "cluster": {"name": "dgx-h100", "nodes": 1},
                          "strategy": {"tp": 2, "cp": 4, "sequence_parallel": True, "global_batch": 1}})
    prog = lower(tree, Precision())
    gathers = [s for s in prog.chunks[0].fwd if s.kind == "collective" and s.axes == ("cp",)]
    assert len(gathers) == 4  # K and V, two layers
    assert all(s.size_bytes == 8192 * 512 * 2 for s in gathers)
    scatters = [s for s in prog.chunks[0].bwd if s.kind == "collective" and s.axes == ("cp",)]
    assert [s.collective for s in scatters] == ["reduce_scatter"] * 4
    assert all(s.size_bytes == 8192 * 512 * 2 for s in scatters)


@dataclass
class _FixedCompute:
    """A compute model whose attention kernel takes `per_key_s` per key (linear in t): isolates the overlap."""

    per_key_s: float

    def op_time(self, op, local, phase, device, dtype) -> float:  # noqa: ANN001
        return self.per_key_s * local["t"] * (2.0 if phase == "bwd" else 1.0)


def _attention_steps(phase: str, comm_s: float) -> list[Step]:
    op = Op("attention", OpKind.ATTENTION, {"b": 1, "a": 8, "s": 1024, "t": 4096, "d": 128},
            (("b", "s", "o"),), ("b", "s", "o"), causal=True)
    attn = Step("l.attention", "compute", 0, "compute", "l", op=op, local={"b": 1, "a": 8, "s": 1024, "t": 4096,
                                                                            "d": 128}, phase=phase)
    comm = [Step(f"l.attention.in{i}", "collective", 1, "cp", "l", collective="all_gather", axes=("cp",),
                 duration_s=comm_s) for i in (1, 2)]
    return [*comm, attn] if phase != "bwd" else [attn, *comm]


@pytest.mark.parametrize("phase", ["fwd", "recompute", "bwd"])
@pytest.mark.parametrize("comm_s", [1e-4, 3e-3])
def test_ring_attention_exposes_only_the_transfer_beyond_each_kernel(phase: str, comm_s: float) -> None:
    cp, per_key = 4, 1e-6
    steps = _attention_steps(phase, comm_s)
    _ring_attention(steps, cp, _FixedCompute(per_key), H100, "bf16")
    attn = next(s for s in steps if s.kind == "compute")
    comm = [s for s in steps if s.kind == "collective"]
    factor = 2.0 if phase == "bwd" else 1.0
    kernel = per_key * (4096 // cp) * factor  # one of cp kernels over t / cp keys
    assert attn.duration_s == pytest.approx(cp * kernel)
    per_step = 2 * comm_s * factor / (cp - 1)  # both collectives' bytes, K/V again with their gradients in bwd
    assert comm[0].duration_s == pytest.approx((cp - 1) * max(0.0, per_step - kernel))
    assert comm[1].duration_s == 0.0


def _exposed_cp(cp_comm: str, nic_gbps: float) -> float:
    res = trainsim.simulate(model={"name": "llama3-8b", "layers": 4, "seq_len": 32768},
                            cluster={"name": "dgx-h100", "nodes": 4, "nic_gbps": nic_gbps},
                            strategy={"tp": 8, "cp": 4, "sequence_parallel": True, "global_batch": 1,
                                      "cp_comm": cp_comm})
    return res.breakdown.get("exposed comm: CP", 0.0) + res.breakdown.get("cp", 0.0)


def test_ring_hides_what_the_gather_exposes_and_a_slow_network_shows_through() -> None:
    assert _exposed_cp("p2p", 50.0) <= _exposed_cp("all_gather", 50.0)
    assert _exposed_cp("all_gather", 50.0) > 0.0
    assert _exposed_cp("p2p", 0.5) > _exposed_cp("p2p", 50.0)


def test_cp_comm_needs_cp() -> None:
    with pytest.raises(ConfigError, match="cp_comm"):
        trainsim.simulate(model="gpt2", cluster="dgx-a100", nodes=1, strategy={"dp": 8, "cp_comm": "all_gather"})
