"""Memory terms beyond Korthikanti's per-layer formula: the pipeline hand-off checkpoint under full recompute,
the loss temporaries, framework-specific saved tensors. Every expected figure is computed by hand here."""

from __future__ import annotations

import pytest

from trainsim.compile.program import lower
from trainsim.strategy.precision import Precision
from trainsim.strategy.presets import ParallelSpec, build_strategy
from trainsim.workload.zoo import build_model

H, A, V, S, B = 256, 4, 1024, 128, 2


@pytest.mark.parametrize(("tp", "sp"), [(2, False), (2, True), (4, False)])
def test_full_recompute_frees_what_it_allocates_after_a_scattered_pipeline_hand_off(tp: int, sp: bool) -> None:
    """Megatron's scatter/gather hand-off sends 1/tp of the activation, but the receiving stage gathers it whole
    before its first layer runs, and that whole tensor is the layer's checkpoint: forward must allocate the
    b s h bf16 bytes its backward frees (a chunk that frees more never folds into periods, sim.periodic)."""
    mdl = build_model("custom", B, S, "flash", layers=4, hidden=H, heads=A, vocab=V)
    spec = ParallelSpec(tp=tp, pp=2, sequence_parallel=sp, recompute="full", micro_batch=B, global_batch=2 * B)
    prog = lower(build_strategy(mdl, spec), Precision())
    for ch in prog.chunks:
        alloc = sum(s.alloc_bytes for s in ch.fwd + ch.bwd)
        free = sum(s.free_bytes for s in ch.fwd + ch.bwd)
        assert alloc == pytest.approx(free, rel=1e-12) and alloc > 0
    last = prog.chunks[1]
    first_layer = last.layers[0]
    checkpoint = sum(s.alloc_bytes for s in last.fwd if s.layer == first_layer and s.phase == "fwd")
    assert checkpoint == 2.0 * B * S * H / (tp if sp else 1)  # the layer input, bf16, whole (or seq-split by SP)
