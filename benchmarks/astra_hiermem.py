"""ASTRA-sim 2.0 case study V-B: ZeRO-Infinity vs hierarchical memory pool (HierMem), TABLE V.

The paper trains a 1T-parameter MoE on 256 NPUs (2048 TFLOPS, 4096 GB/s HBM) with its parameters
in a remote memory, and reports: ZeRO-Infinity 0.1% faster than HierMem(baseline) (same resources,
HierMem pays for its extra switch stages), HierMem(opt) 4.6x faster than the baseline, found by
sweeping the in-node pooled fabric BW (256..2048 by 256 GB/s) and the remote group BW (100..500 by
100 GB/s) for the best time with the least resources.

The graph is built directly (compile.graph.ExecutionGraph.add, one symmetric rank class standing for
all 256 GPUs) and run by the engine (sim.engine.run); memory nodes run on the MEMORY stream and are
priced by trainsim.hardware.memory_systems.

Workload assumptions (the paper gives only "1T-parameter MoE [DeepSpeed-MoE]"):
- 32 layers, hidden 4096, attention 4h^2 parameters per layer (dense), one MoE FFN per layer with 256
  experts of 2 x h x 4h (top-1 routing, balanced): 32 x (4h^2 + 256 x 8h^2) = 1.10e12 parameters.
- expert parallel 256: each GPU owns one expert per layer; dense (attention) weights are ZeRO-3
  sharded over all 256 GPUs; bf16 weights and gradients (2 B); 2048 tokens per GPU per iteration
  (global batch 256 x 2048-token sequences) in one micro-batch.
- every layer's weights are streamed from the remote memory before its forward and again before its
  backward (two-layer buffer: a load may start when the layer two uses back has finished); gradients are
  stored back after the layer's backward. Optimizer updates happen at the memory side (off the GPUs'
  timeline) in both systems and are not timed.
- HierMem: expert weights load plainly, dense weights are gathered in the switches while loading and
  their gradients reduce-scattered while storing (in-switch collectives); both share the pool's links.
  ZeRO-Infinity: each GPU loads its shard from its own offload device (256 devices of 100 GB/s, PCIe
  not the bottleneck), then all-gathers the dense weights (reduce-scatter for gradients) over the GPU
  network. Token all-to-alls (2 per layer forward, 2 backward) run over the GPU network.
- GPU network: Switch(16)_Switch(16) (ASTRA-sim analytical collectives); HierMem's GPU traffic uses its
  pooled fabric (in-node BW in both dimensions); ZeRO-Infinity's is taken equal to the baseline's
  256 GB/s (TABLE V lists none). A node's uplinks to the out-node switches carry what its GPUs' in-node
  links carry (non-blocking); chunk size 64 KiB; before every compute the layer's weights are read
  from HBM (local memory model, no latency).
- Runtime breakdown (paper Fig. 11): compute; exposed local memory (HBM reads, serial on the compute
  stream); a gap in the compute stream is charged to the task that released the next compute
  (remote memory, communication or idle).
Part 2 runs the same three systems through `trainsim.api.simulate` (what `trainsim simulate` runs): job
dicts with `strategy.offload: remote`, the pool in `cluster.remote_memory` and in-switch collectives as
`strategy.offload_in_switch`. The job schema has no MoE expert count yet, so the model is a dense zoo model
(GPT-3 175B, 96 layers, h=12288) trained with ZeRO-3 over all 256 GPUs, one 2048-token sequence per GPU;
the compiler streams each layer's shard from the pool before its forward and backward and stores its
gradient shard after the backward. Cluster: Switch(16)_Switch(16) with the system's in-node bandwidth in both
dimensions and 500 ns per hop (as part 1), B200 GPUs (2250 bf16 TFLOPS, 8 TB/s HBM: the zoo's nearest to
TABLE V's 2048 TFLOPS / 4096 GB/s), ASTRA-sim's analytical collectives. ZeRO-Infinity: pool zero_infinity,
256 devices of 100 GB/s, PCIe taken at 100 GB/s (not the bottleneck, as in part 1), GPU all-gathers and
reduce-scatters; HierMem: pool hiermem, 16 out-node switches, 256 groups, in-switch collectives.
Run: python benchmarks/astra_hiermem.py
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from trainsim.api import simulate as simulate_job
from trainsim.compile.graph import ExecutionGraph, RankClass
from trainsim.compile.program import Stream
from trainsim.cost.multidim import AnalyticalComm
from trainsim.hardware.memory_systems import HierarchicalPool, LocalHBM, MemoryAccess, ZeroInfinityOffload
from trainsim.hardware.topology import parse_topology
from trainsim.sim.engine import SimTrace, run
from trainsim.sim.result import SimulationResult

N_NODES, GPUS_PER_NODE = 16, 16
N_GPUS = N_NODES * GPUS_PER_NODE
PEAK_TFLOPS = 2048.0
HBM_GBPS = 4096.0
CHUNK_BYTES = 64 * 1024
NEAR_BEST = 0.02  # "best performance with the least resources": cheapest config within 2% of the best time
PAPER = {"zero_vs_base": "ZeRO-Infinity 0.1% faster than HierMem(baseline)",
         "opt_speedup": 4.6, "opt": (512, 500)}


@dataclass(frozen=True)
class MoE:
    layers: int = 32
    hidden: int = 4096
    experts: int = 256
    tokens_per_gpu: int = 2048
    seq_len: int = 2048
    bytes_per_param: float = 2.0

    @property
    def dense_params(self) -> float:
        return 4.0 * self.hidden**2

    @property
    def expert_params(self) -> float:
        return 8.0 * self.hidden**2

    @property
    def params(self) -> float:
        return self.layers * (self.dense_params + self.experts * self.expert_params)

    def fwd_flops(self) -> tuple[float, float]:
        """(attention, expert FFN) forward FLOPs per GPU per layer."""
        t, h = self.tokens_per_gpu, self.hidden
        attn = 2 * self.dense_params * t + 4 * self.seq_len * h * t  # projections + scores and context
        return attn, 2 * self.expert_params * t  # top-1, balanced: each GPU's expert sees its share


@dataclass(frozen=True)
class System:
    name: str
    memory: HierarchicalPool | ZeroInfinityOffload
    net_gbps: float  # per GPU, both dimensions of Switch(16)_Switch(16)


def hiermem(in_node_gbps: float, group_gbps: float, name: str = "HierMem") -> System:
    pool = HierarchicalPool.from_group_bandwidth(
        n_nodes=N_NODES, gpus_per_node=GPUS_PER_NODE, n_out_switches=16, n_remote_groups=256,
        in_node_gbps=in_node_gbps, remote_group_gbps=group_gbps, chunk_bytes=CHUNK_BYTES)
    return System(name, pool, in_node_gbps)


def zero_infinity() -> System:
    off = ZeroInfinityOffload(n_nodes=N_NODES, gpus_per_node=GPUS_PER_NODE, n_remote_groups=256,
                              remote_group_gbps=100.0, pcie_gbps=100.0, tier="cpu", chunk_bytes=CHUNK_BYTES)
    return System("ZeRO-Infinity", off, 256.0)


CATS = ("compute", "local_memory", "remote_memory", "comm", "idle")


def paper_table(title: str, ours: str, rows: list[tuple[str, str, str]]) -> Table:
    """The paper's findings beside trainsim's: (finding, paper, trainsim) per row."""
    t = Table(title=title)
    for col in ("finding", "paper", ours):
        t.add_column(col)
    for row in rows:
        t.add_row(*row)
    return t


def build(system: System, moe: MoE) -> ExecutionGraph:
    """One training iteration of one GPU (symmetric: one rank class of multiplicity 256)."""
    g = ExecutionGraph()
    g.classes.append(RankClass("all", 0, N_GPUS, range(N_GPUS)))
    comm = AnalyticalComm(parse_topology("Switch(16)_Switch(16)", [system.net_gbps] * 2, [500.0, 500.0]))
    everyone = tuple(range(N_GPUS))
    hbm = LocalHBM(HBM_GBPS)
    peak = PEAK_TFLOPS * 1e12
    w_exp = moe.expert_params * moe.bytes_per_param
    w_dense = moe.dense_params * moe.bytes_per_param
    shard = w_dense / N_GPUS
    in_switch = isinstance(system.memory, HierarchicalPool)
    attn_f, exp_f = moe.fwd_flops()
    a2a_s = comm.time("all_to_all", moe.tokens_per_gpu * moe.hidden * moe.bytes_per_param, everyone)
    gather_s = 0.0 if in_switch else comm.time("all_gather", w_dense, everyone)
    scatter_s = 0.0 if in_switch else comm.time("reduce_scatter", w_dense, everyone)
    local_s = hbm.time_s(MemoryAccess("load", w_exp + w_dense))

    def remote(kind: str, *sizes: float) -> float:
        accesses = [MemoryAccess(kind, w, "remote", in_switch and w == shard) for w in sizes]
        return system.memory.timing_together(accesses).total_s

    # HierMem moves a layer's expert weights and its dense shards (gathered in the switches) together;
    # ZeRO-Infinity loads the small dense shard first, so its all-gather overlaps the expert load
    load_s, store_s = remote("load", w_exp, shard), remote("store", w_exp, shard)
    shard_load_s, exp_load_s = remote("load", shard), remote("load", w_exp)
    uses = [("F", i) for i in range(moe.layers)] + [("B", i) for i in reversed(range(moe.layers))]
    ends: list[int] = []  # last compute task of each use
    loads: dict[int, list[int]] = {}

    def add_load(k: int) -> None:
        ph, i = uses[k]
        deps = [ends[k - 2]] if k >= 2 else []
        if in_switch:
            loads[k] = [g.add(f"{ph} L{i} load weights (in-switch gather)", "memory", Stream.MEMORY,
                              "remote_memory", load_s, (0,), deps)]
            return
        t = g.add(f"{ph} L{i} load dense shard", "memory", Stream.MEMORY, "remote_memory", shard_load_s, (0,), deps)
        ag = g.add(f"{ph} L{i} all-gather dense", "collective", Stream.GRAD, "comm", gather_s, (0,), [t])
        ex = g.add(f"{ph} L{i} load expert", "memory", Stream.MEMORY, "remote_memory", exp_load_s, (0,), [t])
        loads[k] = [ag, ex]

    add_load(0)
    add_load(1)
    prev = -1
    for k, (ph, i) in enumerate(uses):
        scale = 1.0 if ph == "F" else 2.0
        chain = [("read weights (HBM)", "local_memory", local_s, Stream.COMPUTE),
                 ("attention" if ph == "F" else "combine grads", "compute" if ph == "F" else "comm",
                  scale * attn_f / peak if ph == "F" else a2a_s, Stream.COMPUTE if ph == "F" else Stream.FEATURE),
                 ("dispatch all-to-all" if ph == "F" else "expert bwd", "comm" if ph == "F" else "compute",
                  a2a_s if ph == "F" else scale * exp_f / peak, Stream.FEATURE if ph == "F" else Stream.COMPUTE),
                 ("expert fwd" if ph == "F" else "dispatch grads", "compute" if ph == "F" else "comm",
                  exp_f / peak if ph == "F" else a2a_s, Stream.COMPUTE if ph == "F" else Stream.FEATURE),
                 ("combine all-to-all" if ph == "F" else "attention bwd", "comm" if ph == "F" else "compute",
                  a2a_s if ph == "F" else scale * attn_f / peak, Stream.FEATURE if ph == "F" else Stream.COMPUTE)]
        for j, (label, cat, dur, stream) in enumerate(chain):
            deps = [prev] if prev >= 0 else []
            if j == 0:
                deps.extend(loads[k])
            kind = "compute" if stream == Stream.COMPUTE else "collective"
            prev = g.add(f"{ph} L{i} {label}", kind, stream, cat, dur, (0,), deps)
        ends.append(prev)
        if k + 2 < len(uses):
            add_load(k + 2)
        if ph == "B":
            t = prev
            if not in_switch:
                t = g.add(f"B L{i} reduce-scatter dense grads", "collective", Stream.GRAD, "comm", scatter_s, (0,),
                          [t])
            g.add(f"B L{i} store grads", "memory", Stream.MEMORY, "remote_memory", store_s, (0,), [t])
    return g


def breakdown(g: ExecutionGraph, tr: SimTrace) -> dict[str, float]:
    """Paper Fig. 11 split of the iteration: compute-stream time by category, every gap in it charged to
    the category of the task that released the compute after it (the tail: to the last task)."""
    out = dict.fromkeys(CATS, 0.0)
    comp = sorted(g.queues[(0, Stream.COMPUTE)], key=lambda t: tr.start_s[t])
    now = 0.0
    for t in comp:
        gap = tr.start_s[t] - now
        if gap > 1e-15:
            p = tr.critical_pred[t]
            out[g.category[p] if p >= 0 and g.stream[p] != Stream.COMPUTE else "idle"] += gap
        out[g.category[t]] += tr.end_s[t] - tr.start_s[t]
        now = tr.end_s[t]
    end = max(tr.end_s)
    if end > now:
        last = max(range(len(g)), key=lambda t: tr.end_s[t])
        out[g.category[last]] += end - now
    return out


def simulate(system: System, moe: MoE) -> tuple[float, dict[str, float]]:
    g = build(system, moe)
    tr = run(g, gamma=0.0, record_memory=False)
    return max(tr.end_s), breakdown(g, tr)


def main() -> None:
    con = Console(width=150)
    moe = MoE()
    con.print(f"1T MoE: {moe.params / 1e12:.2f}e12 parameters, {moe.layers} layers x {moe.experts} experts, "
              f"h={moe.hidden}, {moe.tokens_per_gpu} tokens/GPU, {N_GPUS} GPUs ({N_NODES} nodes x {GPUS_PER_NODE})")
    t0 = time.perf_counter()
    grid = {(b, r): simulate(hiermem(b, r), moe)[0] for b in range(256, 2049, 256) for r in range(100, 501, 100)}
    best = min(grid.values())
    near = [k for k, v in grid.items() if v <= best * (1 + NEAR_BEST)]
    opt = min(near, key=lambda k: (k[0] / 256 + k[1] / 100, k))  # least provisioned BW near the best
    sweep_s = time.perf_counter() - t0
    systems = [zero_infinity(), hiermem(256, 100, "HierMem (baseline)"), hiermem(*opt, f"HierMem (opt {opt[0]}/{opt[1]})")]
    rows = [(s, *simulate(s, moe)) for s in systems]
    t = Table(title="ASTRA-sim 2.0 Fig. 11 / TABLE V: runtime breakdown per iteration (ms)")
    for col in ("system", "in-node GB/s", "group GB/s", "iteration", *CATS, "vs baseline"):
        t.add_column(col, justify="right")
    base = rows[1][1]
    for s, it, parts in rows:
        mem = s.memory
        in_node = f"{mem.in_node_gbps:g}" if isinstance(mem, HierarchicalPool) else "-"
        group = f"{mem.mem_side_out_gbps * mem.n_out_switches:g}" if isinstance(mem, HierarchicalPool) \
            else f"{mem.remote_group_gbps:g}"
        t.add_row(s.name, in_node, group, f"{it * 1e3:.2f}", *(f"{parts[c] * 1e3:.2f}" for c in CATS),
                  f"{base / it:.2f}x")
    con.print(t)
    z, b, o = rows[0][1], rows[1][1], rows[2][1]
    con.print(paper_table("paper vs trainsim", "trainsim", [
        ("ZeRO-Infinity vs HierMem(baseline)", PAPER["zero_vs_base"], f"ZeRO-Infinity {100 * (b / z - 1):.2f}% faster"),
        ("HierMem(opt) speedup over baseline", f"{PAPER['opt_speedup']}x", f"{b / o:.2f}x"),
        ("HierMem(opt) in-node / group GB/s", f"{PAPER['opt'][0]} / {PAPER['opt'][1]}", f"{opt[0]} / {opt[1]}")]))
    s = Table(title="sweep: iteration ms (rows: in-node pooled fabric GB/s, columns: remote group GB/s)")
    s.add_column("in-node")
    for r in range(100, 501, 100):
        s.add_column(str(r), justify="right")
    for bw in range(256, 2049, 256):
        s.add_row(str(bw), *(f"{grid[(bw, r)] * 1e3:.1f}" + ("*" if (bw, r) == opt else "") for r in range(100, 501, 100)))
    con.print(s)
    con.print(f"* best with least resources: fewest provisioned GB/s (in units of 256 and 100) within "
              f"{100 * NEAR_BEST:g}% of the best {best * 1e3:.2f} ms; "
              f"{len(grid)} simulations in {sweep_s:.2f} s")


# -- part 2: the case study as trainsim jobs -----------------------------------------------------------

JOB_MODEL = {"name": "gpt3-175b", "seq_len": 2048}
JOB_BREAKDOWN = ("compute", "offload", "dp", "optimizer", "idle")  # SimulationResult.breakdown keys shown
"""offload: exposed remote memory (memory-stream loads / stores); dp: exposed GPU all-gathers / reduce-scatters."""


@dataclass(frozen=True)
class JobSystem:
    name: str
    pool: dict[str, object]  # cluster.remote_memory
    in_switch: bool  # strategy.offload_in_switch
    net_gbps: float  # per GPU, both dimensions of Switch(16)_Switch(16)


def job_systems(in_node_gbps: float = 512.0, group_gbps: float = 500.0) -> list[JobSystem]:
    """TABLE V's three systems as job settings (+ the baseline pool with GPU collectives, for reference)."""
    def hier(b: float, r: float) -> dict[str, object]:
        return {"pool": "hiermem", "in_node_gbps": b, "remote_group_gbps": r, "out_switches": 16,
                "remote_groups": N_GPUS}

    zinf = {"pool": "zero_infinity", "remote_groups": N_GPUS, "remote_group_gbps": 100.0, "pcie_gbps": 100.0}
    return [JobSystem("ZeRO-Infinity", zinf, False, 256.0),
            JobSystem("HierMem (baseline)", hier(256.0, 100.0), True, 256.0),
            JobSystem(f"HierMem (opt {in_node_gbps:g}/{group_gbps:g})", hier(in_node_gbps, group_gbps), True,
                      in_node_gbps),
            JobSystem("HierMem (baseline, GPU collectives)", hier(256.0, 100.0), False, 256.0)]


def job_of(system: JobSystem) -> dict[str, object]:
    """The job dict `trainsim simulate` would read from YAML for one system."""
    return {"model": dict(JOB_MODEL),
            "cluster": {"topology": f"Switch({GPUS_PER_NODE})_Switch({N_NODES})", "gpu": "b200",
                        "bandwidth_gbps": [system.net_gbps] * 2, "latency_ns": [500.0, 500.0],
                        "remote_memory": dict(system.pool)},
            "strategy": {"dp": N_GPUS, "zero": 3, "micro_batch": 1, "global_batch": N_GPUS, "offload": "remote",
                         "offload_in_switch": system.in_switch},
            "simulation": {"comm_model": "analytical"}}


def layer_transfer_s(result: SimulationResult, suffix: str) -> float:
    """Duration of the first task of layer 1 whose name ends with `suffix` (0 when there is none)."""
    g = result.graph
    assert g is not None
    return next((g.duration_s[t] for t in range(len(g)) if g.name[t].endswith(f"layers.1.{suffix}")), 0.0)


def part2(con: Console) -> None:
    """Run the systems through trainsim.api.simulate and set the trends beside the paper's."""
    t0 = time.perf_counter()
    grid = {(b, r): simulate_job(job_of(JobSystem("sweep", {
        "pool": "hiermem", "in_node_gbps": float(b), "remote_group_gbps": float(r), "out_switches": 16,
        "remote_groups": N_GPUS}, True, float(b)))).iteration_time_s
        for b in range(256, 2049, 256) for r in range(100, 501, 100)}
    sweep_s = time.perf_counter() - t0
    best = min(grid.values())
    near = [k for k, v in grid.items() if v <= best * (1 + NEAR_BEST)]
    found = min(near, key=lambda k: (k[0] / 256 + k[1] / 100, k))
    systems = job_systems()
    results = [(s, simulate_job(job_of(s))) for s in systems]
    t = Table(title="part 2 through trainsim.api.simulate: GPT-3 175B (dense), ZeRO-3 over 256 B200, offload remote "
                    "(s per iteration; breakdown: exposed time)")
    for col in ("system", "in-switch", "iteration", *JOB_BREAKDOWN, "peak GiB", "vs baseline"):
        t.add_column(col, justify="right")
    base = results[1][1].iteration_time_s
    for s, r in results:
        t.add_row(s.name, "yes" if s.in_switch else "no", f"{r.iteration_time_s:.3f}",
                  *(f"{r.breakdown.get(c, 0.0):.3f}" for c in JOB_BREAKDOWN),
                  f"{max(r.peak_memory_bytes) / 2**30:.1f}", f"{base / r.iteration_time_s:.2f}x")
    con.print(t)
    z, o = results[0][1].iteration_time_s, results[2][1].iteration_time_s
    gap = 100 * (z / base - 1)
    con.print(paper_table("paper (1T MoE) vs trainsim simulate (dense GPT-3 175B)", "trainsim simulate", [
        ("ZeRO-Infinity vs HierMem(baseline)", PAPER["zero_vs_base"],
         f"ZeRO-Infinity {abs(gap):.1f}% {'slower' if gap > 0 else 'faster'}"),
        ("HierMem(opt 512/500) speedup over baseline", f"{PAPER['opt_speedup']}x", f"{base / o:.2f}x"),
        ("best with least resources (in-node / group GB/s)", f"{PAPER['opt'][0]} / {PAPER['opt'][1]}",
         f"{found[0]} / {found[1]} ({base / grid[found]:.2f}x)")]))
    zr, br = results[0][1], results[1][1]
    con.print("one layer, per GPU: parameters in-switch load {:.2f} ms vs shard load + GPU all-gather {:.2f} + {:.2f} ms;"
              " gradients in-switch store {:.2f} ms vs GPU reduce-scatter {:.2f} ms + shard store {:.2f} ms".format(
                  1e3 * layer_transfer_s(br, "params:load"), 1e3 * layer_transfer_s(zr, "params:load"),
                  1e3 * layer_transfer_s(zr, "params:all_gather"), 1e3 * layer_transfer_s(br, "grads:store"),
                  1e3 * layer_transfer_s(zr, "grads:reduce_scatter"), 1e3 * layer_transfer_s(zr, "grads:store")))
    con.print("why: per transfer the pool's extra switch stages make HierMem a few % slower (the paper's reason); per "
              "iteration the schedules differ: on the GPU path each backward prefetch all-gather waits on the grad "
              "stream behind the previous layer's reduce-scatter, which waits for that layer's backward, while the "
              "pool's memory stream issues the next load before the store. HierMem(opt): a dense model's in-switch "
              "load is bound by the in-node hop (the gathered layer to every GPU), so the group bandwidth hardly "
              "matters; the paper's 4.6x comes from MoE expert weights loaded plainly at the group bandwidth (part 1).")
    con.print(f"sweep: {len(grid)} jobs in {sweep_s:.1f} s; iteration s by in-node GB/s (rows) x group GB/s "
              "(columns 100..500):")
    for b in range(256, 2049, 256):
        con.print(f"  {b:5d}: " + " ".join(f"{grid[(b, r)]:.3f}" for r in range(100, 501, 100)))


if __name__ == "__main__":
    main()
    part2(Console(width=150))
