"""The framework's side of a step (issue 23): the host issues every kernel launch it does not replay from a CUDA
graph. Transformer Engine's GroupedLinear launches one GEMM per local expert (model.expert_gemm per_expert), a
captured module (strategy.cuda_graphs) launches nothing from the host, and Megatron-Bridge rows map both."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from training_row import training_row

import trainsim
from trainsim.api import simulate_costed, strategy_tree
from trainsim.config import JobConfig
from trainsim.cost.calibration import load_calibration
from trainsim.cost.compute import RooflineCompute
from trainsim.errors import ConfigError
from trainsim.hardware.devices import get_device
from trainsim.strategy.tree import CUDA_GRAPH_MODULES, cuda_graph_scope
from trainsim.validate.training_runs import _settings, row_job
from trainsim.workload.zoo import build_model
from trainsim.workload.zoo.transformer import as_dispatched

MOE = {"experts": 16, "top_k": 2}


def _ops(**features: Any) -> dict[str, Any]:
    m = build_model("custom", 2, 512, "flash", {**MOE, **features}, layers=1, hidden=256, heads=4, ffn=512)
    return {op.name: op for lay in m.layers for op in lay.ops}


def _compute() -> tuple[RooflineCompute, Any]:
    dev = get_device("h100-sxm")
    return RooflineCompute(load_calibration().compute_for(dev)), dev


@pytest.mark.parametrize("local_experts", [1, 4, 16])
def test_a_per_expert_gemm_launches_once_per_local_expert_by_hand(local_experts: int) -> None:
    model, dev = _compute()
    per, grouped = _ops(expert_gemm="per_expert")["expert_fc1"], _ops()["expert_fc1"]
    local = {**per.dims, "e": local_experts}
    h = model.params.host_overhead_s
    for phase, launches in (("fwd", 1), ("bwd", 2), ("dgrad", 1), ("wgrad", 1)):
        assert model.kernels(per, phase, local) == launches * local_experts
        assert model.kernels(grouped, phase, local) == launches
        assert model.host_time(per, phase, local) == pytest.approx(launches * local_experts * h)
    # each launch also pays the GPU's per-kernel gap: the per-expert GEMMs take (e - 1) gaps longer
    gap = model.params.kernel_overhead_s
    t_per = model.op_time(per, local, "fwd", dev, "bf16")
    assert t_per - model.op_time(grouped, local, "fwd", dev, "bf16") == pytest.approx((local_experts - 1) * gap)


def test_the_router_launches_the_guides_kernel_counts_by_hand() -> None:
    """Megatron-Core's router: 31 forward kernels with --moe-router-fusion, 72 without (NVIDIA's DeepSeek-V3 GB200
    guide), its gating GEMM included; every kernel a host launch and a GPU gap."""
    model, dev = _compute()
    h, op_h, gap = model.params.host_overhead_s, model.params.torch_op_host_s, model.params.kernel_overhead_s
    assert op_h == pytest.approx(13.48e-6)  # TE issue #2053: torch.nn.Linear's forward on a DGX H100 host
    fused, unfused = _ops()["router"], _ops(moe_router_fusion=False)["router"]
    for op, fwd, bwd in ((fused, 31, 10), (unfused, 72, 23)):
        assert model.kernels(op, "fwd", op.dims) == model.kernels(op, "recompute", op.dims) == fwd
        assert model.kernels(op, "bwd", op.dims) == bwd
        # a split backward counts the bookkeeping kernels once, with the input-gradient GEMM
        assert model.kernels(op, "dgrad", op.dims) + model.kernels(op, "wgrad", op.dims) == bwd
        # the gating GEMM is a framework launch, the rest plain PyTorch calls
        assert model.host_time(op, "fwd", op.dims) == pytest.approx(h + (fwd - 1) * op_h)
        assert model.host_time(op, "bwd", op.dims) == pytest.approx(2 * h + (bwd - 2) * op_h)
    dt = model.op_time(unfused, unfused.dims, "fwd", dev, "bf16") - model.op_time(fused, fused.dims, "fwd", dev, "bf16")
    assert dt == pytest.approx(41 * gap)  # the same GEMM, 41 more kernel gaps


@pytest.mark.parametrize(("dispatcher", "ep", "router", "dispatch", "combine"), [
    ("alltoall", 8, (31, 10), (12, 2), (11, 3)),  # Megatron-Core's all-to-all dispatcher across EP ranks
    ("alltoall", 1, (31, 10), (6, 1), (6, 3)),  # the same without EP: no splits, no counts all-gather
    ("deepep", 8, (13, 10), (4, 1), (3, 2)),  # the flex dispatcher: router and preprocess together 17 (the guide)
    ("hybridep", 8, (13, 10), (4, 1), (3, 2)),  # its HybridEP backend: the same preprocess
])
def test_the_token_dispatcher_sets_the_bookkeeping_kernels(dispatcher: str, ep: int, router: tuple[int, int],
                                                          dispatch: tuple[int, int],
                                                          combine: tuple[int, int]) -> None:
    model, _ = _compute()
    ops = _ops()
    for name, want in (("router", router), ("dispatch", dispatch), ("combine", combine)):
        op = as_dispatched(ops[name], dispatcher, ep)
        assert (model.kernels(op, "fwd", op.dims), model.kernels(op, "bwd", op.dims)) == want
    if dispatcher in ("deepep", "hybridep"):
        assert router[0] + dispatch[0] == 17
    # no other op carries bookkeeping kernels, and none changes with the dispatcher
    assert all(op.side_kernels == (0, 0) and as_dispatched(op, dispatcher, ep) is op
               for name, op in ops.items() if name not in ("router", "dispatch", "combine"))


def test_the_dispatchers_kernels_reach_the_steps_and_a_graph_takes_their_host_time() -> None:
    model, _ = _compute()
    h, op_h = model.params.host_overhead_s, model.params.torch_op_host_s
    job = {**JOB, "model": {**JOB["model"], "expert_gemm": "grouped"}}
    for graphs, captured in (("none", set()), (["moe_router", "moe_preprocess"], {"router", "dispatch"})):
        for dispatcher, fwd in (("alltoall", {"router": 31, "dispatch": 12, "combine": 11}),
                                ("deepep", {"router": 13, "dispatch": 4, "combine": 3})):
            strategy = {**job["strategy"], "cuda_graphs": graphs, "ep_dispatcher": dispatcher}
            _, costed = simulate_costed(JobConfig.model_validate({**job, "strategy": strategy}))
            steps = {s.op.name: s for s in costed.program.chunks[0].fwd if s.op is not None and s.op.name in fwd}
            for name, kernels in fwd.items():  # one framework launch (the GEMM, the permute), the rest plain calls
                assert steps[name].host_s == pytest.approx(0.0 if name in captured else h + (kernels - 1) * op_h)


def test_a_slower_host_scales_every_host_time_and_no_gpu_time() -> None:
    """cluster.host_overhead_scale: the nodes' CPUs take that times the framework time per op (kernels and
    collectives alike); the GPU work is the same. The presets' hosts are the x86 ones the constants were measured on
    (1.0); a Grace host measured 37.08 / 13.48 in TransformerEngine issue #2053."""
    from trainsim.api import costed_program, job_tree
    from trainsim.config import parse_job
    from trainsim.hardware.cluster import GRACE_HOST_OVERHEAD_SCALE, get_cluster

    assert pytest.approx(2.7507, rel=1e-4) == GRACE_HOST_OVERHEAD_SCALE
    assert all(get_cluster(n).host_overhead_scale == 1.0 for n in ("gb200-nvl72", "gb300-nvl72", "dgx-b200"))
    base = {"model": {"name": "qwen3-30b-a3b", "layers": 2, "seq_len": 1024},
            "strategy": {"ep": 8, "dp": 8, "global_batch": 16}}
    programs = []
    for scale in (None, GRACE_HOST_OVERHEAD_SCALE):
        cluster = {"name": "gb200-nvl72", "gpus_per_node": 8, "host_overhead_scale": scale}
        job = parse_job({**base, "cluster": cluster})
        cl, _, tree = job_tree(job)
        assert cl.host_overhead_scale == (scale or 1.0)
        programs.append(costed_program(tree, cl, job.simulation).program)
    hosted = 0
    for a, b in zip(programs[1].chunks, programs[0].chunks, strict=True):
        for name in ("fwd", "bwd", "grad_sync"):
            for sa, sb in zip(getattr(a, name), getattr(b, name), strict=True):
                assert sa.duration_s == sb.duration_s
                assert sa.host_s == pytest.approx(sb.host_s * GRACE_HOST_OVERHEAD_SCALE)
                hosted += sb.host_s > 0
    assert hosted > 0
    with pytest.raises(ConfigError, match=r"^cluster\.host_overhead_scale:"):
        trainsim.simulate({**base, "cluster": {"name": "dgx-h100", "host_overhead_scale": 0}})


def test_router_fusion_needs_experts() -> None:
    with pytest.raises(ConfigError, match="model.moe_router_fusion"):
        trainsim.simulate({"model": {"name": "gpt3-125m", "moe_router_fusion": True}})


def test_only_the_routed_experts_launch_per_expert() -> None:
    """The routed experts' GEMMs, and the eager chain that adds their output bias (the custom model has biases),
    launch per local expert; nothing else does, and a grouped expert MLP has neither."""
    per, grouped = _ops(expert_gemm="per_expert", shared_expert_ffn=512), _ops(shared_expert_ffn=512)
    for name, op in per.items():
        assert op.launch_per == ("e" if name in ("expert_fc1", "expert_fc2", "expert_bias") else "")
        if name != "expert_bias":
            assert grouped[name].launch_per == ""
    assert "expert_bias" in per and "expert_bias" not in grouped


def test_ops_carry_the_module_a_cuda_graph_scope_captures() -> None:
    moe = _ops(shared_expert_ffn=512)
    assert {n for n, op in moe.items() if op.module == "attn"} >= {"ln1", "qkv", "attention", "proj", "attn_residual"}
    assert {n for n, op in moe.items() if op.module == "moe_router"} == {"ln2", "router", "shared_fc1", "shared_act",
                                                                       "shared_fc2"}
    assert {n for n, op in moe.items() if op.module == "moe_preprocess"} == {"dispatch"}
    assert {n for n, op in moe.items() if op.module == "moe"} == {"expert_fc1", "expert_act", "expert_fc2", "combine",
                                                                "shared_add", "mlp_residual"}
    dense = build_model("custom", 2, 512, "flash", {}, layers=1, hidden=256, heads=4, ffn=512)
    block = next(lay for lay in dense.layers if lay.kind == "transformer")
    assert {op.name for op in block.ops if op.module == "mlp"} == {"ln2", "fc1", "act", "fc2", "mlp_residual"}
    hybrid = build_model("nemotron-3-nano", 1, 1024, "flash", {"layer_pattern": "ME*"}, layers=3)
    modules = [{op.name: op.module for op in lay.ops} for lay in hybrid.layers if lay.kind == "transformer"]
    assert modules[0]["in_proj"] == modules[0]["ssd"] == modules[0]["ln1"] == "mamba"
    assert modules[1]["ln1"] == modules[1]["router"] == "moe_router" and modules[1]["expert_fc1"] == "moe"
    assert modules[2]["attention"] == modules[2]["ln1"] == "attn"
    assert all(op.module == "" for lay in hybrid.layers if lay.kind != "transformer" for op in lay.ops)


JOB: dict[str, Any] = {"model": {"name": "qwen3-30b-a3b", "layers": 2, "seq_len": 1024, "expert_gemm": "per_expert"},
                       "cluster": {"name": "dgx-h100"}, "strategy": {"ep": 8, "dp": 8, "global_batch": 16}}


def _costed(cuda_graphs: Any) -> Any:
    job = JobConfig.model_validate({**JOB, "strategy": {**JOB["strategy"], "cuda_graphs": cuda_graphs}})
    return simulate_costed(job)


def test_captured_modules_cost_the_host_nothing_and_the_rest_what_they_launch() -> None:
    _, none = _costed("none")
    _, scoped = _costed(["attn", "moe_router"])
    _, full = _costed("full_iteration")
    for a, b, c in zip(none.program.chunks, scoped.program.chunks, full.program.chunks, strict=True):
        for name in ("fwd", "bwd"):
            for s0, s1, s2 in zip(getattr(a, name), getattr(b, name), getattr(c, name), strict=True):
                assert s1.duration_s == s0.duration_s == s2.duration_s  # graphs change no kernel
                assert s2.host_s == 0.0  # the whole step replayed: collectives too
                captured = s0.kind == "compute" and s0.op is not None and s0.op.module in ("attn", "moe_router")
                assert s1.host_s == (0.0 if captured else s0.host_s)
    assert any(s.kind == "compute" and s.host_s > 0 for s in none.program.chunks[0].fwd)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(["attn", "mlp", "moe_router", "moe", "mamba"]), unique=True))
def test_capturing_more_never_slows_the_step(modules: list[str]) -> None:
    """Fewer host launches can only let the GPU start sooner: a scope's step is no slower than none, and no faster
    than the full-iteration graph."""
    base = {**JOB, "model": {**JOB["model"], "layers": 1}}
    times = [trainsim.simulate({**base, "strategy": {**base["strategy"], "cuda_graphs": g}}).iteration_time_s
             for g in ("none", modules or "none", "full_iteration")]
    assert times[0] >= times[1] - 1e-12 >= times[2] - 2e-12


def test_per_expert_launches_slow_a_host_bound_step() -> None:
    grouped = trainsim.simulate({**JOB, "model": {**JOB["model"], "expert_gemm": "grouped"}})
    per = trainsim.simulate(JOB)
    assert per.iteration_time_s > grouped.iteration_time_s
    assert per.model_flops == grouped.model_flops


@pytest.mark.parametrize(("value", "expect"), [
    ("none", ()), (None, ()), ("full_iteration", ("full_iteration",)), (["attn"], ("attn",)),
    ("attn, moe_router,moe_preprocess", ("attn", "moe_router", "moe_preprocess")), (["attn", "attn"], ("attn",)),
])
def test_the_scope_reads_as_a_tuple(value: Any, expect: tuple[str, ...]) -> None:
    assert cuda_graph_scope(value) == expect


@pytest.mark.parametrize(("value", "message"), [
    (["bogus"], "unknown module 'bogus'"), (["moe_preprocess"], "moe_preprocess is captured with moe_router"),
    (["full_iteration", "attn"], "give full_iteration alone"), (3, "must be a string"),
])
def test_bad_scopes_are_one_line_errors(value: Any, message: str) -> None:
    with pytest.raises(trainsim.ConfigError, match=rf"^strategy.cuda_graphs[.:].*{message}"):
        trainsim.simulate({**JOB, "strategy": {**JOB["strategy"], "cuda_graphs": value}})


def test_expert_gemm_needs_experts() -> None:
    with pytest.raises(trainsim.ConfigError, match=r"^model.expert_gemm: only applies to a mixture of experts"):
        trainsim.simulate({"model": {"name": "llama3-8b", "layers": 1, "expert_gemm": "per_expert"},
                           "cluster": {"name": "dgx-h100"}})


def test_the_scope_survives_a_saved_strategy() -> None:
    res = trainsim.simulate({**JOB, "strategy": {**JOB["strategy"], "cuda_graphs": ["attn", "mamba"]}})
    assert res.strategy["cuda_graphs"] == ["attn", "mamba"]
    tree = strategy_tree({**JOB, "strategy": {**JOB["strategy"], "cuda_graphs": ["attn"]}})
    again = type(tree).from_dict(tree.model, tree.to_dict())
    assert again.cuda_graphs == ("attn",)
    assert set(CUDA_GRAPH_MODULES) >= {"attn", "moe_router", "moe_preprocess", "mamba"}


@pytest.mark.parametrize(("cell", "expect"), [
    ("cuda_graph=full_iteration:", "full_iteration"),
    ("cuda_graph=transformer_engine:attn/moe_router/moe_preprocess", ["attn", "moe_router", "moe_preprocess"]),
    ("cuda_graph=none:attn/mamba/moe_router/moe_preprocess", "none"),
    ("cuda_graphs=False", "none"),
    ("cuda_graph=transformer_engine:", None),  # no scope stated: recorded, not priced
    ("cuda_graphs=True", None),
])
def test_megatron_bridge_graph_settings_map(cell: str, expect: Any) -> None:
    st_ = _settings(cell)
    assert st_.cuda_graphs == expect
    assert (expect is None) == bool(st_.notes)


MOE_ROW = {"model_name": "Qwen3-30B-A3B", "arch": "MoE (128 routed experts, top-8)", "n_layers": "2", "hidden": "2048",
           "n_heads": "32", "n_kv_heads": "4", "ffn_hidden": "6144", "seq_len": "1024", "vocab": "151936",
           "precision": "bf16", "gpu": "H100-SXM (DGX-H100)", "gpu_mem_gb": "80", "dp": "8", "ep": "8",
           "micro_batch": "1", "global_batch": "8", "head_dim": "128", "moe_ffn_hidden": "768", "n_experts": "128",
           "n_shared_experts": "", "top_k": "8", "first_k_dense": "0", "moe_layer_freq": "1", "attention": "GQA",
           "kv_lora_rank": "", "q_lora_rank": "", "capacity_factor": "dropless", "token_dispatcher": "alltoall",
           "framework": "Megatron-Bridge / Megatron-Core (NeMo container)", "source_group": "megatron_bridge_perf"}


@pytest.mark.parametrize(("settings_cell", "gemm", "graphs"), [
    ("cuda_graph=transformer_engine:attn/moe_router", "per_expert", ["attn", "moe_router"]),
    ("cuda_graph=full_iteration:; cutedsl_fused_grouped_mlp=on", "grouped", "full_iteration"),
    ("te_op_fuser=on", "grouped", None),
])
def test_a_megatron_moe_row_maps_its_expert_launches_and_graphs(settings_cell: str, gemm: str, graphs: Any) -> None:
    job = row_job(training_row(**MOE_ROW, other_settings=settings_cell))
    assert not isinstance(job, str), job
    assert job.job["model"]["expert_gemm"] == gemm
    assert job.job["strategy"].get("cuda_graphs") == graphs
    other = row_job(training_row(**{**MOE_ROW, "framework": "torchtitan", "source_group": "synthetic"}))
    assert not isinstance(other, str) and "expert_gemm" not in other.job["model"]  # trainsim's default


# --- the dropless dispatch's device-to-host read (Step.host_sync) ---------------------------------------------

def _synced_steps(model: dict[str, Any], **strategy: Any) -> tuple[list[Any], list[Any]]:
    job = JobConfig.model_validate({"model": {"name": "qwen3-30b-a3b", "layers": 2, "seq_len": 1024, **model},
                                    "cluster": {"name": "dgx-h100"},
                                    "strategy": {"dp": 8, "global_batch": 16, **strategy}})
    _, costed = simulate_costed(job)
    ch = costed.program.chunks[0]
    return [s for s in ch.fwd if s.host_sync], [s for s in ch.bwd if s.host_sync]


def test_a_dropless_moe_syncs_the_host_once_per_layer_after_its_dispatch() -> None:
    fwd, bwd = _synced_steps({}, ep=8)
    assert [s.label for s in fwd] == [f"layers.{i}.expert_fc1.in0:all_to_all" for i in range(2)] and not bwd
    fwd, _ = _synced_steps({})  # no expert parallelism: the grouped GEMM reads the sizes itself
    assert [(s.layer, s.op.name) for s in fwd] == [(f"layers.{i}", "expert_fc1") for i in range(2)]


@pytest.mark.parametrize(("model", "strategy"), [
    ({"moe_capacity_factor": 1.0, "moe_pad_to_capacity": True}, {"ep": 8}),  # fixed shapes: nothing to read
    ({}, {"ep": 8, "cuda_graphs": "full_iteration"}),  # Megatron's sync-free dispatch under a whole-step graph
])
def test_fixed_shapes_and_whole_step_graphs_do_not_sync(model: dict[str, Any], strategy: dict[str, Any]) -> None:
    assert _synced_steps(model, **strategy) == ([], [])


def _two_task_graph(sync: bool) -> Any:
    from trainsim.compile.graph import ExecutionGraph, RankClass
    from trainsim.compile.program import Stream

    g = ExecutionGraph()
    g.classes = [RankClass("c0", 0, 1, range(1))]
    g.add("attention", "compute", Stream.COMPUTE, "compute", 3.0, (0,), [], host_s=1.0)
    g.add("experts", "compute", Stream.COMPUTE, "compute", 1.0, (0,), [0], host_s=2.0, host_sync=sync)
    return g


@pytest.mark.parametrize("sync", [False, True])
def test_the_engine_issues_a_synced_task_after_its_dependencies_by_hand(sync: bool) -> None:
    """attention: issued at 0 (1 s of host), runs 0-3; experts: 2 s of host, 1 s of GPU. Unsynced, the host issues
    it at 1 and its host path ends it at 1 + 2 = 3, the GPU at 3 + 1: it ends at 4. Synced, the host waits for the
    attention (3), issues it then and the host path ends it at 3 + 2 = 5."""
    from trainsim.sim.engine import run

    trace = run(_two_task_graph(sync), gamma=0.0)
    assert trace.issue_s[1] == (3.0 if sync else 1.0)
    assert trace.end_s[1] == (5.0 if sync else 4.0)


def test_a_synced_step_is_never_fused_into_the_chain_before_it() -> None:
    from trainsim.compile.graph import coarsen
    from trainsim.compile.program import Step, Stream

    steps = [Step(f"s{i}", "compute", Stream.COMPUTE, "compute", duration_s=1.0, host_s=0.5, host_sync=i == 2)
             for i in range(4)]
    specs = coarsen(steps, "auto", False, frozenset({Stream.COMPUTE, Stream.FEATURE}))
    assert [(sp.label, sp.host_sync) for sp in specs] == [("s0 .. s1", False), ("s2 .. s3", True)]


def test_the_analytic_tier_holds_a_waiting_host_to_the_gpu_line_by_hand() -> None:
    """A phase of 3 s of GPU issued in 0 s (graphed), then one whose host waits: 1 s of GPU behind 2 s of host
    (its own line 3 s, its host held there). Together: GPU 4 s; the waiting host reaches 3 + 3 = 6 s, not 0 + 3."""
    from trainsim.sim.analytic import PhaseCost

    graphed = PhaseCost(busy_s=3.0, host_s=0.0, synced_s=3.0)
    eager = PhaseCost(busy_s=1.0, host_s=3.0, synced_s=3.0, host_waits=True)
    both = graphed.add(eager)
    assert (both.busy_s, both.synced_s, both.host_s, both.host_waits) == (4.0, 6.0, 6.0, True)
    free = graphed.add(PhaseCost(busy_s=1.0, host_s=3.0, synced_s=3.0))
    assert free.host_s == 3.0  # a host that does not wait runs ahead


def test_the_cli_takes_the_scope_and_refuses_a_bad_one(capsys: pytest.CaptureFixture[str]) -> None:
    from cli_helpers import one_line_error

    from trainsim.cli import main

    args = ["simulate", "--model", "qwen3-30b-a3b", "--layers", "2", "--seq-len", "1024", "--cluster", "dgx-h100",
            "--dp", "8", "--ep", "8", "--global-batch", "16"]
    main([*args, "--cuda-graphs", "attn,moe_router"])
    assert "cuda_graphs=attn,moe_router" in capsys.readouterr().out
    err = one_line_error([*args, "--cuda-graphs", "attn,router"], capsys)
    assert err.startswith("error: strategy.cuda_graphs: unknown module 'router'")


def test_a_search_holds_the_scope_for_every_candidate() -> None:
    from trainsim.optimize.space import held_knobs, with_held

    held = held_knobs({"cuda_graphs": "full_iteration", "ep_overlap": True, "tp": 2})
    assert held == {"cuda_graphs": "full_iteration", "ep_overlap": True}
    assert with_held({"tp": 2}, held, ep=1) == {"cuda_graphs": "full_iteration", "tp": 2}  # EP knobs: ep > 1 only
    assert with_held({"tp": 2}, held, ep=4) == {**held, "tp": 2}


@pytest.mark.parametrize(("dispatcher", "ep", "sorted_"), [
    ("alltoall", 8, True),  # 16 experts on 8 ranks: 2 local experts, the received chunks sorted by expert
    ("alltoall", 16, False),  # one local expert: nothing to sort
    ("alltoall", 1, False),  # no EP: the permute itself orders the tokens by expert
    ("deepep", 8, False),  # the flex dispatcher's buffers come back per expert
])
def test_the_all_to_all_dispatchers_chunk_sort_moves_the_dispatched_tokens_by_hand(dispatcher: str, ep: int,
                                                                                    sorted_: bool) -> None:
    """Megatron-Core's all-to-all dispatcher sorts what it received by local expert and restores the order before
    the combine: 2 passes over the dispatched elements forward and 2 backward, beside the permutes' 3."""
    model, dev = _compute()
    ops = _ops()
    hbm = dev.hbm_gbps * 1e9 * model.params.hbm_efficiency
    gap = model.params.kernel_overhead_s
    for name in ("dispatch", "combine"):
        op = as_dispatched(ops[name], dispatcher, ep)
        tokens, dispatched = op.dims["b"] * op.dims["s"], op.dims["e"] * op.dims["c"]
        elems = 3 * (tokens + dispatched) + (4 * dispatched if sorted_ else 0)
        total = sum(model.op_time(op, op.dims, phase, dev, "bf16") - model.kernels(op, phase, op.dims) * gap
                    for phase in ("fwd", "bwd"))
        assert total == pytest.approx(elems * op.dims["h"] * 2.0 / hbm)
