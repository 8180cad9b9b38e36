"""Real PyTorch DDP training on the gloo backend (CPU), profiled with torch.profiler: the project's own
small multi-rank Kineto traces, plus the 2-process gloo all-reduce curve the job ran on.

    .venv/bin/python benchmarks/ddp_gloo/run.py --procs 1 2 --steps 5 --out benchmarks/ddp_gloo/traces

For each process count n it trains an MLP with DistributedDataParallel (one intra-op thread per process,
so on a 2-core machine each of 2 ranks has a core for compute; gloo's own threads share them) and writes
`OUT/<n>proc/rank<r>.pt.trace.json.gz`; then it times gloo all-reduces between 2 processes
(`OUT/gloo_allreduce.csv`, columns bytes,time_us) independently of training, and prints per-rank step
times (ProfilerStep windows) and single-rank replay errors (trainsim.replay.replay_trace).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

WAIT, WARMUP = 1, 2  # profiler schedule before the active (recorded) steps
SEED = 1234
ALLREDUCE_BYTES = [4096 << i for i in range(15)]  # 4 KiB .. 64 MiB, powers of two


@dataclass(frozen=True)
class Config:
    """Model, batch and DDP settings of one training run (the same on every rank)."""

    layers: int = 6  # Linear(width, width) layers, ReLU between them
    width: int = 1024
    batch: int = 96  # samples per process per step
    bucket_cap_mb: float = 4.0  # DDP gradient bucket size: one bucket (one all-reduce) per 1024x1024 layer
    lr: float = 0.01
    steps: int = 5  # active (recorded) profiler steps
    record_shapes: bool = True  # gives gloo:all_reduce its `Input Dims` (the bucket size); ~2x trace size


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for the rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _init(rank: int, world: int, port: int) -> None:
    """One intra-op thread, then join the gloo process group on 127.0.0.1:port."""
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)


def make_model(cfg: Config) -> nn.Sequential:
    """The MLP: `layers` Linear(width, width), ReLU between them; same weights on every rank (fixed seed)."""
    torch.manual_seed(SEED)
    mods: list[nn.Module] = []
    for i in range(cfg.layers):
        mods.append(nn.Linear(cfg.width, cfg.width))
        if i < cfg.layers - 1:
            mods.append(nn.ReLU())
    return nn.Sequential(*mods)


def _train_worker(rank: int, world: int, port: int, cfg: Config, out_dir: str) -> None:
    """One rank: DDP training under the profiler; writes `out_dir/rank<rank>.<...>.pt.trace.json.gz`."""
    _init(rank, world, port)
    try:
        model = nn.parallel.DistributedDataParallel(make_model(cfg), bucket_cap_mb=cfg.bucket_cap_mb)
        opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
        loss_fn = nn.MSELoss()
        gen = torch.Generator().manual_seed(SEED + rank)  # each rank its own shard of synthetic data
        total = WAIT + WARMUP + cfg.steps
        shape = (cfg.batch, cfg.width)
        batches = [tuple(torch.randn(shape, generator=gen) for _ in range(2)) for _ in range(total)]  # (x, y)
        dist.barrier()
        handler = tensorboard_trace_handler(out_dir, worker_name=f"rank{rank}", use_gzip=True)
        sched = schedule(wait=WAIT, warmup=WARMUP, active=cfg.steps)
        with profile(activities=[ProfilerActivity.CPU], schedule=sched,
                     on_trace_ready=handler, record_shapes=cfg.record_shapes, with_stack=False) as prof:
            for x, y in batches:
                opt.zero_grad(set_to_none=True)
                loss = loss_fn(model(x), y)
                loss.backward()
                opt.step()
                prof.step()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def train(n_procs: int, out_dir: str | Path, cfg: Config | None = None) -> list[Path]:
    """Train with `n_procs` gloo processes into `out_dir`; the paths `rank<r>.pt.trace.json.gz`, by rank."""
    cfg = cfg or Config()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("rank*.pt.trace.json.gz"):
        old.unlink()
    mp.spawn(_train_worker, args=(n_procs, free_port(), cfg, str(out)), nprocs=n_procs, join=True)
    paths = []
    for r in range(n_procs):
        (src,) = out.glob(f"rank{r}.*.pt.trace.json.gz")  # the handler adds a timestamp to the name
        dst = out / f"rank{r}.pt.trace.json.gz"
        src.rename(dst)
        paths.append(dst)
    return paths


def _allreduce_worker(rank: int, world: int, port: int, sizes: list[int], warmup: int, reps: int,
                      out_csv: str) -> None:
    """Time gloo all-reduces of float32 tensors; rank 0 writes each size's median (max over ranks), us.

    The sizes are visited round-robin (`warmup` untimed rounds, then `reps` timed ones) so a slow spell of
    the machine (a descheduled vCPU) costs every size one rep instead of one size all of its reps.
    """
    _init(rank, world, port)
    try:
        tensors = [torch.ones(nbytes // 4, dtype=torch.float32) for nbytes in sizes]
        times: list[list[float]] = [[] for _ in sizes]
        for i in range(warmup + reps):
            for t, ts in zip(tensors, times, strict=True):
                dist.barrier()
                t0 = time.perf_counter()
                dist.all_reduce(t)
                dt = time.perf_counter() - t0
                if i >= warmup:
                    ts.append(dt * 1e6)
        med = torch.tensor([statistics.median(ts) for ts in times], dtype=torch.float64)
        dist.all_reduce(med, op=dist.ReduceOp.MAX)  # the slower rank's median: the collective's time
        if rank == 0:
            with open(out_csv, "w") as f:
                f.write("bytes,time_us\n")
                f.writelines(f"{b},{us:.1f}\n" for b, us in zip(sizes, med.tolist(), strict=True))
    finally:
        dist.destroy_process_group()


def allreduce_bench(out_csv: str | Path, sizes: list[int] | None = None, warmup: int = 5, reps: int = 20,
                    n_procs: int = 2) -> list[tuple[int, float]]:
    """The gloo all-reduce curve between `n_procs` local processes, written to `out_csv`; (bytes, us) rows."""
    args = (n_procs, free_port(), sizes or ALLREDUCE_BYTES, warmup, reps, str(out_csv))
    mp.spawn(_allreduce_worker, args=args, nprocs=n_procs, join=True)
    lines = Path(out_csv).read_text().split()[1:]
    return [(int(b), float(us)) for b, us in (ln.split(",") for ln in lines)]


def report(paths: list[Path]) -> None:
    """Print per-rank step times (ProfilerStep windows) and the single-rank replay error of each trace."""
    from trainsim.replay import replay_trace
    from trainsim.trace.kineto.reader import read_kineto

    for p in paths:
        tr = read_kineto(p)
        steps = tr.steps()
        durs = [w.dur_us / 1e3 for w in steps]
        r = replay_trace(tr)
        step_ms = " ".join(f"#{w.step}={w.dur_us / 1e3:.1f}" for w in steps)
        errs = " ".join(f"{s.error_pct:.2f}" for s in r.steps)
        print(f"{p.parent.name}/{p.name}: {p.stat().st_size / 1024:.0f} KiB, {len(tr.collectives)} colls, "
              f"steps {step_ms} ms, median {statistics.median(durs):.1f} ms; "
              f"replay error {r.replay_error_pct:.2f}% ({errs})")


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, train for each process count, benchmark all-reduce, print the numbers."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 2], help="process counts to train with")
    ap.add_argument("--steps", type=int, default=5, help="active profiled steps")
    ap.add_argument("--out", type=Path, required=True, help="folder for <n>proc/ and gloo_allreduce.csv")
    d = Config()
    ap.add_argument("--layers", type=int, default=d.layers)
    ap.add_argument("--width", type=int, default=d.width)
    ap.add_argument("--batch", type=int, default=d.batch, help="samples per process per step")
    ap.add_argument("--bucket-cap-mb", type=float, default=d.bucket_cap_mb)
    ap.add_argument("--no-record-shapes", action="store_true",
                    help="smaller traces, but gloo:all_reduce loses its size (Input Dims)")
    ap.add_argument("--no-allreduce-bench", action="store_true", help="skip the gloo all-reduce benchmark")
    a = ap.parse_args(argv)
    cfg = Config(layers=a.layers, width=a.width, batch=a.batch, bucket_cap_mb=a.bucket_cap_mb, steps=a.steps,
                 record_shapes=not a.no_record_shapes)
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, config {asdict(cfg)}")
    a.out.mkdir(parents=True, exist_ok=True)
    meta = {"torch": torch.__version__, "procs": a.procs, "seed": SEED,
            "profiler_schedule": {"wait": WAIT, "warmup": WARMUP}, **asdict(cfg)}
    (a.out / "run_config.json").write_text(json.dumps(meta, indent=1) + "\n")
    paths: list[Path] = []
    for n in a.procs:
        paths += train(n, a.out / f"{n}proc", cfg)
    if not a.no_allreduce_bench:
        rows = allreduce_bench(a.out / "gloo_allreduce.csv")
        print("gloo all-reduce, 2 processes (bytes: median us, GB/s):")
        for b, us in rows:
            print(f"  {b:>10}: {us:10.1f} us  {b / us / 1e3:6.3f} GB/s")
    report(paths)
    if {1, 2} <= set(a.procs) and (a.out / "gloo_allreduce.csv").is_file():
        predict_two(a.out)
    return 0


def predict_two(out: Path) -> None:
    """Joint replay of the 2-process traces, and `scale` from the 1-process trace to 2 processes (the
    all-reduce curve measured separately, the machine's cores shared) against the 2-process measurement."""
    from trainsim.replay import replay
    from trainsim.whatif.edits import load_comm_table
    from trainsim.whatif.scale import scale

    two = replay([out / "2proc"])
    print(f"2-process joint replay: error {two.replay_error_pct:.3f}%, clock offsets {two.clock_offsets_us}")
    pred = scale([out / "1proc"], load_comm_table(str(out / "gloo_allreduce.csv")), "gloo", [2], 2,
                 cores_per_node=os.cpu_count() or 1)
    p = pred.points[0]
    err = (p.step_ms - two.measured_step_ms) / two.measured_step_ms * 100
    print(f"scale 1 -> 2 processes: predicted {p.step_ms:.2f} ms, measured {two.measured_step_ms:.2f} ms "
          f"(mean over steps of the slower rank), error {err:+.1f}%, alpha {p.alpha:.3f}")


if __name__ == "__main__":
    sys.exit(main())
