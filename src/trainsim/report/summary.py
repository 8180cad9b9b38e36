"""Terminal summary of a simulation (rich tables): throughput, MFU/HFU, memory verdict, breakdown."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ..sim.result import BREAKDOWN_KEYS, SimulationResult

LABELS = {"compute": "compute", "recompute": "recompute (fwd again)", "optimizer": "optimizer step",
          "tp": "exposed comm: TP", "cp": "exposed comm: CP", "ep": "exposed comm: EP (all-to-all)",
          "dp": "exposed comm: DP (grads)", "pp": "exposed comm: PP (p2p)",
          "offload": "exposed memory: offload loads/stores", "bubble": "pipeline bubble",
          "idle": "idle (waiting)"}


def _gib(x: float) -> str:
    return f"{x / 2**30:.1f} GiB"


def _rate(x: float) -> str:
    for unit, f in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= f:
            return f"{x / f:.2f} {unit}"
    return f"{x:.2f} "


def _count(n: float) -> str:
    """175e9 -> '175.0B', 124e6 -> '124.4M'."""
    for unit, f in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= f:
            return f"{n / f:.1f}{unit}"
    return f"{n:.0f}"


def print_summary(r: SimulationResult, console: Console | None = None, job: str | None = None) -> None:
    """Print what was run (job, model, GPUs, strategy) and the prediction; `job` says where the job came from."""
    con = console or Console()
    s = r.strategy
    if job:
        con.print(f"job: {job}", markup=False, highlight=False)
    seq = f", sequence length {r.tokens_per_sample}" if r.tokens_per_sample else ""
    active = (f" ({_count(r.active_params)} active per token)"
              if r.active_params and r.active_params != r.model_params else "")
    con.print(f"model: [bold]{r.model}[/], {_count(r.model_params)} params{active}{seq}", highlight=False)
    con.print(f"GPUs: [bold]{r.n_gpus}x {r.device}[/] ({r.cluster})", highlight=False)
    ep = s["ep"]
    dp = f"dp={s['dp']} (ep={ep} x dp/ep={s['dp'] // ep})" if ep > 1 else f"dp={s['dp']}"
    con.print(f"strategy: {dp} tp={s['tp']} pp={s['pp']} cp={s['cp']} ep={ep} vpp={s['vpp']} "
              f"sp={'on' if s['sequence_parallel'] else 'off'} zero={s['zero']}"
              + (f" (HSDP: {s['dp_replicate']} replicas)" if s.get("dp_replicate", 1) > 1 else "")
              + f" recompute={s['recompute']} schedule={s['schedule']}"
              + (f" cuda_graphs={','.join(s['cuda_graphs'])}" if s.get("cuda_graphs") else ""), highlight=False)
    if ep > 1:
        con.print(f"  with EP, dp={s['dp']} counts the replicas of the dense layers; the experts are split over "
                  f"ep={ep} of them and replicated over dp/ep={s['dp'] // ep}", highlight=False)
    con.print(f"batch: micro-batch {s['micro_batch']}, global batch {s['global_batch']} "
              f"(grad accumulation {s['grad_accumulation']}), {s['dtype']}", highlight=False)
    if r.placement:
        axes = [f"dp/ep{p[2:]}" if ep > 1 and p.startswith("dp=") else p for p in r.placement]
        con.print("placement: " + "; ".join(axes), highlight=False)
    if r.model_assumptions:
        con.print("model assumptions: " + "; ".join(r.model_assumptions), markup=False)
    if r.learned is not None:
        lr = r.learned
        factor = lr["stages"][lr["slowest_chunk"]]["compute_factor"]
        con.print(f"compute model: learned ({lr['kind']}, {lr['model']}): compute x{factor:.3f} from the slowest stage "
                  f"(chunk {lr['slowest_chunk']}); roofline {lr['roofline_iteration_s']:.4f} s, PredTOP's pipeline "
                  f"formula {lr['formula_iteration_s']:.4f} s", markup=False, highlight=False)
    t = Table(title="Predicted iteration", show_header=False)
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row("iteration time", f"{r.iteration_time_s:.4f} s")
    if r.tokens_per_s:
        t.add_row("throughput", f"{_rate(r.tokens_per_s)}tokens/s  ({_rate(r.tokens_per_s / r.n_gpus)}tokens/s per GPU)")
    t.add_row("samples", f"{r.samples_per_s:.2f} samples/s  ({r.samples_per_s / r.n_gpus:.3f} per GPU)")
    t.add_row("model TFLOP/s per GPU", f"{r.tflops_per_gpu:.1f}  (peak {r.peak_tflops:.0f})")
    t.add_row("MFU (model FLOPs, no recompute)", f"{100 * r.mfu:.1f} %")
    t.add_row("HFU (hardware FLOPs, with recompute)", f"{100 * r.hfu:.1f} %")
    con.print(t)

    m = Table(title="Peak memory per pipeline stage")
    for col in ("stage", "weights, grads, optimizer", "activations (peak)", "peak allocated", "peak reserved",
                "capacity", "verdict (reserved)"):
        m.add_column(col, justify="right")
    rows = r.memory
    if len(rows) > 12:
        worst = max(rows, key=lambda x: x.peak_bytes).stage
        keep = {*range(4), *range(len(rows) - 4, len(rows)), worst}
        rows = [x for x in rows if x.stage in keep]
    prev = -1
    for sm in rows:
        if sm.stage > prev + 1:  # a marker row for the stages left out between two shown ones
            hidden = sm.stage - prev - 1
            m.add_row("...", f"{hidden} stage{'s' if hidden > 1 else ''} not shown", "", "", "", "", "")
        prev = sm.stage
        m.add_row(str(sm.stage), _gib(sm.static_bytes), _gib(sm.activation_peak_bytes), _gib(sm.peak_bytes),
                  _gib(sm.reserved_bytes), _gib(sm.capacity_bytes), "[green]fits[/]" if sm.fits else "[red]OOM[/]")
    con.print(m)
    if r.oom:
        con.print("[bold red]OOM: does not fit.[/] " + "; ".join(r.advice))
    else:
        con.print(f"[green]Fits in memory[/] (worst stage at {100 * max(m.reserved_bytes for m in r.memory) / r.memory[0].capacity_bytes:.0f}% "
                  "of usable capacity, reserved peak).")

    b = Table(title="Where the time goes (average GPU)")
    b.add_column("category")
    b.add_column("seconds", justify="right")
    b.add_column("share", justify="right")
    b.add_column("on critical path", justify="right")
    for k in BREAKDOWN_KEYS:
        v = r.breakdown.get(k, 0.0)
        cp = r.critical_path_by_category.get(k, 0.0)
        if v <= 0 and cp <= 0:
            continue
        b.add_row(LABELS[k], f"{v:.4f}", f"{100 * v / r.iteration_time_s:.1f} %", f"{cp:.4f}" if cp else "")
    con.print(b)
    if r.fidelity == "analytic":
        con.print(f"analytic tier (closed form, no timeline) in {r.simulation_wall_s:.3f} s of wall time")
    elif r.fold and r.fold.startswith("folded"):  # sim.periodic: fewer micro-batches simulated, the rest added
        con.print(f"predicted the iteration's {r.n_tasks} tasks in {r.simulation_wall_s:.3f} s of wall time")
        con.print(f"[dim]{r.fold}[/dim]")
    else:
        con.print(f"simulated {r.n_tasks} tasks in {r.simulation_wall_s:.3f} s of wall time")
        if r.fold:  # why the micro-batches were not folded
            con.print(f"[dim]{r.fold}[/dim]")
