"""`trainsim astra run`: ASTRA-sim 2.0's own inputs (network, system, remote memory, Chakra workload) run
through trainsim's engine, in ASTRA-sim's semantics (its number) or NCCL's (what the hardware will do),
and with `--compare` both, with the terms that make them differ."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from .errors import ConfigError
from .files import Outputs, json_text, write_outputs

if TYPE_CHECKING:
    from .astra_inputs import AstraNetwork, AstraRemoteMemoryConfig, AstraSystem
    from .compile.graph import ExecutionGraph
    from .cost.collective_gap import Gap
    from .cost.semantics import Semantics

astra_app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                        help="ASTRA-sim 2.0 inputs as they are: run a workload, in ASTRA-sim's semantics or NCCL's.")

Opt = typer.Option
SEMANTICS_CHOICES = ("astra", "nccl")


@dataclass(frozen=True)
class AstraInputs:
    """The three config files of an ASTRA-sim run, read and checked."""

    network: AstraNetwork
    system: AstraSystem
    remote: AstraRemoteMemoryConfig | None
    backend: str
    queues: int

    def semantics(self, name: str) -> Semantics:
        from .cost.semantics import NCCL

        return self.system.semantics(self.backend, self.queues) if name == "astra" else NCCL


def read_inputs(network: str, system: str, remote_memory: str | None = None, backend: str = "unaware",
                queues: int = 1, network_flag: str = "--network", system_flag: str = "--system") -> AstraInputs:
    """Load the network, system and remote memory configs; every problem is a one-line ConfigError."""
    from .astra_inputs import load_network, load_remote_memory, load_system
    from .limits import MAX_COLLECTIVE_CHUNKS

    if backend not in ("unaware", "aware"):
        raise ConfigError("--backend", f"'{backend}' is unknown", "use unaware or aware (congestion-aware)")
    if not 1 <= queues <= MAX_COLLECTIVE_CHUNKS:
        raise ConfigError("--num-queues-per-dim", f"{queues} queues", f"use 1..{MAX_COLLECTIVE_CHUNKS}")
    net = load_network(network, network_flag)
    if backend == "aware" and len(net.topology) > 1:
        raise ConfigError("--backend", f"the congestion-aware backend takes 1-D networks, not {net.notation}",
                          "use --backend unaware, as ASTRA-sim's congestion-aware binary refuses it too")
    sysc = load_system(system, system_flag, len(net.topology))
    remote = load_remote_memory(remote_memory) if remote_memory is not None else None
    return AstraInputs(net, sysc, remote, backend, queues)


def read_as(net: AstraNetwork) -> str:
    """How ASTRA-sim's units were read (conventions, not terms of the gap)."""
    parts = []
    for name, k, bw, lv in zip(net.topology, net.npus_count, net.bandwidth, net.levels(), strict=True):
        links = f" x {k - 1} peer links" if name == "FullyConnected" else ""
        parts.append(f"{name}({k}) {bw:g} GiB/s per link{links} = {lv.bandwidth_gbps:,.4g} GB/s per NPU")
    return ("ASTRA-sim's config read as: " + "; ".join(parts) + " (ASTRA-sim's GB is 2^30 B); an all-gather's "
            "comm_size is its input per rank (nccl-tests: the gathered output)")


def check_semantics(value: str, flag: str) -> str:
    if value not in SEMANTICS_CHOICES:
        raise ConfigError(flag, f"'{value}' is unknown", "use astra (ASTRA-sim's semantics) or nccl (NCCL-like)")
    return value


def _compute_fn(sysc: AstraSystem) -> Any:  # noqa: ANN401 - load_chakra's compute callback
    """ASTRA-sim's COMP node time: its roofline (num_ops / min(local-mem-bw x intensity, peak-perf), whole
    ns) when roofline-enabled, else the recorded runtime (0 runs 1 ns, as there)."""
    from .cost.semantics import whole

    peak = float(sysc.peak_perf) * 1e12
    bw = float(sysc.local_mem_bw) * 1e9

    def compute(num_ops: float | None, tensor_bytes: float, recorded_s: float | None) -> float:
        if sysc.roofline_enabled and num_ops is not None:
            perf = min(bw * num_ops / tensor_bytes, peak) if tensor_bytes > 0 else peak
            return whole(num_ops / perf * 1e9) * 1e-9 if perf > 0 else 0.0
        return recorded_s if recorded_s else 1e-9

    return compute


def _reprice(graph: ExecutionGraph, inputs: AstraInputs, sem: Semantics) -> list[float]:
    """Durations of every task with the collectives priced in `sem` (other tasks keep theirs)."""
    comm = inputs.system.comm(inputs.network.levels(), backend=inputs.backend, queues_per_dim=inputs.queues)
    comm = replace(comm, semantics=sem)
    out = list(graph.duration_s)
    cache: dict[tuple[str, float, tuple[int, ...]], float] = {}
    for t, kind in enumerate(graph.kind):
        if kind not in ("collective", "p2p"):
            continue
        key = (graph.comm_op[t], graph.comm_bytes[t], graph.comm_ranks[t])
        if key not in cache:
            cache[key] = comm.time(*key)
        out[t] = cache[key]
    return out


def _iteration_s(graph: ExecutionGraph, durations: list[float]) -> float:
    from .sim.engine import run as simulate_graph

    g = replace(graph, duration_s=durations, flow_demand=[None] * len(graph))
    trace = simulate_graph(g, gamma=0.0, p2p_host_sync=False, bandwidth_sharing=False, record_memory=False)
    return max(trace.end_s, default=0.0)


def workload_gap(graph: ExecutionGraph, inputs: AstraInputs) -> Gap:
    """The whole workload's iteration in ASTRA-sim's semantics and NCCL's, and the terms between them."""
    from .cost.collective_gap import explain

    return explain(lambda sem: _iteration_s(graph, _reprice(graph, inputs, sem)), inputs.semantics("astra"))


def print_gap(gap: Gap, what: str, con: Console | None = None) -> None:
    """Both predictions side by side and each term's part of the gap."""
    con = con or Console()
    con.print(f"{what}: ASTRA-sim semantics [bold]{gap.astra_s * 1e6:,.3f} us[/], trainsim NCCL-like "
              f"[bold]{gap.nccl_s * 1e6:,.3f} us[/] (ASTRA-sim {'slower' if gap.gap_s > 0 else 'faster'} by "
              f"{abs(gap.gap_s) * 1e6:,.3f} us, {abs(gap.gap_s) / gap.nccl_s * 100 if gap.nccl_s else math.inf:.1f}%)")
    if not gap.terms:
        con.print("no term separates them here")
        return
    t = Table(title="The terms between them (switched off in this order; + = ASTRA-sim slower for it)")
    for col in ("term", "us", "share of gap", "what"):
        t.add_column(col, justify="right" if col in ("us", "share of gap") else "left", overflow="fold",
                     no_wrap=col == "term")
    for term in gap.terms:
        share = gap.share(term)
        t.add_row(term.name, f"{term.delta_s * 1e6:+,.3f}", "-" if math.isnan(share) else f"{share * 100:+.1f}%",
                  term.description)
    con.print(t)


@astra_app.command("run")
def run(
    network: Annotated[str, Opt(help="ASTRA-sim network config (YAML or JSON: topology, npus_count, bandwidth, "
                                     "latency)")],
    system: Annotated[str, Opt(help="ASTRA-sim system config JSON")],
    workload: Annotated[str, Opt(help="Chakra workload prefix (DIR/NAME for DIR/NAME.<rank>.et)")],
    remote_memory: Annotated[str | None, Opt(help="ASTRA-sim remote memory config JSON")] = None,
    comm_groups: Annotated[str | None, Opt(help="ASTRA-sim comm group JSON (default <prefix>.comm_group.json)")]
        = None,
    queues: Annotated[int, Opt("--num-queues-per-dim", help="ASTRA-sim's --num-queues-per-dim")] = 1,
    backend: Annotated[str, Opt(help="unaware (congestion-unaware analytical) | aware (1-D)")] = "unaware",
    semantics: Annotated[str, Opt(help="astra (default: reproduce ASTRA-sim) | nccl (what NCCL on the hardware "
                                       "does)")] = "astra",
    compare: Annotated[str | None, Opt(help="astra: print ASTRA-sim's and the NCCL-like prediction side by side "
                                            "with the terms that separate them")] = None,
    json_out: Annotated[str | None, Opt("--json", help="write the prediction (and the comparison) as JSON")] = None,
) -> None:
    """Run an ASTRA-sim workload from ASTRA-sim's own config files with trainsim's engine."""
    json_target = Outputs().add(json_out, "--json")
    check_semantics(semantics, "--semantics")
    if compare is not None:
        check_semantics(compare, "--compare")
    inputs = read_inputs(network, system, remote_memory, backend, queues)
    from .hardware.topology import cluster_from_topology
    from .trace.chakra import et_files, load_chakra

    levels = inputs.network.levels()
    npus = inputs.network.npus
    files = et_files(workload)
    if len(files) != npus:
        raise ConfigError("--workload", f"{len(files)} .et file(s) for a network of {npus} NPUs "
                          f"({inputs.network.notation})", "give one <prefix>.<rank>.et per NPU, as ASTRA-sim needs")
    memory = inputs.remote.memory(npus) if inputs.remote is not None else None
    comm = inputs.system.comm(levels, backend=backend, queues_per_dim=queues)
    comm = replace(comm, semantics=inputs.semantics(semantics))
    graph = load_chakra(workload, cluster_from_topology(levels), comm=comm, memory=memory, memory_location="remote",
                        comm_groups=comm_groups, compute=_compute_fn(inputs.system))
    iteration = _iteration_s(graph, list(graph.duration_s))
    counts = {k: graph.kind.count(k) for k in ("compute", "collective", "p2p", "memory")}
    data: dict[str, Any] = {"iteration_time_s": iteration, "semantics": semantics, "npus": npus,
                            "topology": inputs.network.notation, "read_as": read_as(inputs.network),
                            "tasks": len(graph), **counts}
    gap = workload_gap(graph, inputs) if compare is not None else None
    if gap is not None:
        data["compare"] = gap.as_dict()
    if json_target is None or not json_target.to_stdout:
        print(f"{workload}: {npus} NPUs on {inputs.network.notation}, {len(graph)} tasks "
              f"({', '.join(f'{v} {k}' for k, v in counts.items() if v)}); iteration time {iteration * 1e6:,.3f} us "
              f"in {semantics} semantics" + ("" if compare else
                                             " (--compare astra: the other semantics and the terms between them)"))
        if gap is not None:
            print(read_as(inputs.network))
            print_gap(gap, "iteration")
    write_outputs({json_target: json_text(data, "--json")})


__all__ = ["AstraInputs", "astra_app", "print_gap", "read_as", "read_inputs", "workload_gap"]
