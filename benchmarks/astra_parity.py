"""trainsim's collective model in ASTRA-sim semantics against ASTRA-sim 2.0 itself: predictions and speed.

Without --astra-bin (reference mode) it reads ASTRA-sim's stored predictions
(`../shared/validation/astra_reference.csv`, conventions in `astra_reference.md` next to it), predicts
every row with trainsim in ASTRA-sim's semantics (`trainsim.validate.astra_reference.parse_row(row).time_s()`)
and prints:
- the prediction error against `astra_time_us`: median / max |error| and how many rows agree to the ns;
- the wall time: trainsim's in-process prediction of one row (parse + predict, best of 3,
  time.perf_counter) against `astra_wall_s`, the wall-clock of one ASTRA-sim process. That is all the
  reference holds, so this ratio is "trainsim's model in process vs ASTRA-sim's whole process": the
  ASTRA side includes process start and ET loading and was measured on another machine (a 2-core VM)
  at 10 ms resolution; it is neither process-to-process nor model-to-model;
- the 5 rows ASTRA-sim took longest on, with both wall times and trainsim's NCCL-like prediction of the
  same collective and the gap between the two semantics (with its largest term);
- a closed-form case ASTRA-sim cannot finish: ring all-to-all on Ring(1024), 1 MiB, 1 chunk, 50 GiB/s
  per link, 500 ns, endpoint delay 10 ns (ASTRA-sim did not finish within 120 s).

With --astra-bin (live mode) it runs ASTRA-sim's analytical backend on every selected row: it writes the
network / system / remote memory JSON and a Chakra ET workload (one COMM_COLL_NODE per NPU, written with
trainsim.trace.chakra's mlc-chakra codec: `pip install 'trainsim[chakra]'`) into a temporary directory,
runs the binary (120 s limit), takes the slowest NPU's "sys[i] finished, N cycles" and prints trainsim
against it (difference in % and ns) with two speed ratios:
- process to process: ASTRA-sim's process against a `python -c` process that imports trainsim and
  predicts the row;
- model to model: ASTRA-sim's process (all there is to time from outside) against trainsim's in-process
  prediction (best of 3).
--astra-bin takes the directory holding AstraSim_Analytical_Congestion_Unaware and
AstraSim_Analytical_Congestion_Aware, or the unaware binary's path (congestion-aware rows need the
aware binary; they are skipped without it).

    python benchmarks/astra_parity.py [--reference CSV] [--rows A0003,A0150] [--limit N]
                                      [--astra-bin DIR_OR_BINARY] [--json OUT]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from trainsim.astra_inputs import ALGORITHM_NAMES, OPS, AstraSystem, network_of
from trainsim.cost.multidim import BLOCK_ALGORITHM
from trainsim.cost.semantics import NCCL
from trainsim.errors import ConfigError
from trainsim.hardware.cluster import Level
from trainsim.validate.astra_reference import AstraRow, parse_row

REPO = Path(__file__).resolve().parents[1]
DEFAULT_REFERENCE = REPO / ".." / "shared" / "validation" / "astra_reference.csv"
UNAWARE_BIN = "AstraSim_Analytical_Congestion_Unaware"
AWARE_BIN = "AstraSim_Analytical_Congestion_Aware"
ASTRA_TIMEOUT_S = 120.0
REPEATS = 3
SLOWEST = 5
PREFIX = "workload"
PIPED_WIDTH = 120  # columns when the output goes to a file or pipe (rich's default there is 80)
# the system-layer keys every reference row was run with (astra_reference.md, "Settings shared by every row")
SYSTEM_FIELDS = frozenset({
    "scheduling_policy", "endpoint_delay", "active_chunks_per_dimension", "preferred_dataset_splits",
    "all_reduce_implementation", "reduce_scatter_implementation", "all_gather_implementation",
    "all_to_all_implementation", "collective_optimization", "local_mem_bw", "boost_mode", "roofline_enabled",
    "peak_perf"})
REMOTE_MEMORY = {"memory-type": "NO_MEMORY_EXPANSION"}  # a pure collective touches no remote memory
_FINISHED = re.compile(r"sys\[(\d+)\] finished, (\d+) cycles")  # unanchored: spdlog may prefix the line
_ASTRA_NAME = {v: k for k, v in ALGORITHM_NAMES.items()}  # trainsim algorithm -> ASTRA-sim implementation
# trainsim's process-to-process side: a fresh interpreter that imports trainsim and predicts one row
_PREDICT = ("import json, sys\n"
            "from trainsim.validate.astra_reference import parse_row\n"
            "print(repr(parse_row(json.loads(sys.argv[1])).time_s()))\n")
# the closed-form case ASTRA-sim cannot finish (astra_reference.md, "Limits seen")
RING1024_A2A = {"row_id": "ring1024-a2a", "backend": "unaware", "topology": "Ring(1024)", "npus": "1024",
                "bandwidth_gbps_per_dim": "50", "latency_ns_per_dim": "500", "op": "all_to_all",
                "comm_size_bytes": "1048576", "bytes_nccl_convention": "1048576", "chunks": "1",
                "queues_per_dim": "1", "algorithms_per_dim": "ring", "endpoint_delay_ns": "10",
                "local_mem_bw_gbps": "1600"}


# --------------------------------------------------------------------------------------------------
# trainsim side
# --------------------------------------------------------------------------------------------------

def best_of(fn: Callable[[], float], repeats: int = REPEATS) -> tuple[float, float]:
    """fn()'s value and its best wall time in seconds over `repeats` calls."""
    best, value = math.inf, math.nan
    for _ in range(repeats):
        t0 = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - t0)
    return value, best


def predict_s(row: dict[str, str]) -> float:
    """What is timed as trainsim's prediction of one row: parse it, then price it in ASTRA-sim's semantics."""
    return parse_row(row).time_s()


def trainsim_process(row: dict[str, str]) -> tuple[float, float]:
    """trainsim's prediction from a fresh `python -c` process (import + predict) and that process's wall."""
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _PREDICT, json.dumps(row)], capture_output=True, text=True,
                          timeout=ASTRA_TIMEOUT_S, check=False)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"trainsim process exited {done.returncode}: {tail}")
    return float(done.stdout.strip()), wall


def ns(seconds: float) -> int:
    return round(seconds * 1e9)


@dataclass(frozen=True)
class Parity:
    """One row: trainsim's ASTRA-semantics prediction against an ASTRA-sim time, and the wall times."""

    row_id: str
    topology: str
    op: str
    bytes_nccl: float
    chunks: int
    backend: str
    astra_us: float  # ASTRA-sim's prediction (the reference's, or the live run's)
    trainsim_us: float
    trainsim_wall_s: float  # in process, parse + predict, best of 3
    astra_wall_s: float  # one ASTRA-sim process
    reference_us: float | None = None  # the reference's astra_time_us (live mode)
    trainsim_process_s: float | None = None  # a `python -c` process (live mode)

    @property
    def diff_ns(self) -> int:
        return round(self.trainsim_us * 1e3) - round(self.astra_us * 1e3)

    @property
    def diff_pct(self) -> float:
        """On whole ns, as ASTRA-sim reports them (so a row equal to the ns reads 0)."""
        astra_ns = round(self.astra_us * 1e3)
        return self.diff_ns / astra_ns * 100 if astra_ns else math.nan

    @property
    def exact(self) -> bool:
        return self.diff_ns == 0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "diff_ns": self.diff_ns, "diff_pct": self.diff_pct, "exact": self.exact}


def row_label(row: dict[str, str]) -> str:
    return row.get("row_id", "?")


def fmt_bytes(b: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= scale and b % scale == 0:
            return f"{b / scale:g} {unit}"
    return f"{b:g} B"


def fmt_s(s: float | None) -> str:
    if s is None or math.isnan(s):
        return "-"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} us"


def ratio(a: float | None, b: float | None) -> float:
    return a / b if a is not None and b else math.nan


def fmt_x(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:,.0f}x" if x >= 10 else f"{x:.2f}x"


def collective(p: Parity) -> str:
    aware = " aware" if p.backend == "aware" else ""
    return f"{p.topology} {p.op} {fmt_bytes(p.bytes_nccl)} x{p.chunks}{aware}"


def table(title: str, first: str, *columns: str) -> Table:
    """A table whose first column never wraps (numbers right-justified)."""
    t = Table(title=title)
    t.add_column(first, no_wrap=True)
    for col in columns:
        t.add_column(col, justify="left" if col == "collective" else "right")
    return t


# --------------------------------------------------------------------------------------------------
# reference mode
# --------------------------------------------------------------------------------------------------

def read_reference(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def select(rows: list[dict[str, str]], ids: str | None, limit: int | None) -> list[dict[str, str]]:
    if ids:
        wanted = [x.strip() for x in ids.split(",") if x.strip()]
        known = {r["row_id"] for r in rows}
        missing = [x for x in wanted if x not in known]
        if missing:
            raise ValueError(f"--rows: {', '.join(missing)} not in the reference (held-out rows are not stored)")
        rows = [r for r in rows if r["row_id"] in set(wanted)]
    return rows[:limit] if limit is not None else rows


def reference_parity(row: dict[str, str]) -> Parity:
    ar = parse_row(row)
    pred, wall = best_of(lambda: predict_s(row))
    return Parity(row["row_id"], row["topology"], row["op"], ar.size_bytes, ar.chunks, row["backend"],
                  float(row["astra_time_us"]), pred * 1e6, wall, float(row["astra_wall_s"]))


def error_stats(results: Sequence[Parity]) -> dict[str, Any]:
    errs = [abs(p.diff_pct) for p in results]
    worst = max(results, key=lambda p: abs(p.diff_pct))
    return {"n": len(results), "exact_to_ns": sum(p.exact for p in results),
            "median_abs_err_pct": statistics.median(errs), "max_abs_err_pct": max(errs),
            "max_abs_err_ns": max(abs(p.diff_ns) for p in results),
            "worst_row": None if worst.exact else worst.row_id}


def wall_stats(results: Sequence[Parity]) -> dict[str, Any]:
    ours = [p.trainsim_wall_s for p in results]
    theirs = [p.astra_wall_s for p in results]
    out: dict[str, Any] = {
        "trainsim_in_process_median_s": statistics.median(ours), "trainsim_in_process_total_s": sum(ours),
        "astra_process_median_s": statistics.median(theirs), "astra_process_total_s": sum(theirs),
        "ratio_model_median": statistics.median(ratio(p.astra_wall_s, p.trainsim_wall_s) for p in results),
        "ratio_model_total": ratio(sum(theirs), sum(ours))}
    procs = [p.trainsim_process_s for p in results if p.trainsim_process_s is not None]
    if procs and len(procs) == len(results):
        out.update({"trainsim_process_median_s": statistics.median(procs), "trainsim_process_total_s": sum(procs),
                    "ratio_process_median": statistics.median(ratio(p.astra_wall_s, p.trainsim_process_s)
                                                              for p in results),
                    "ratio_process_total": ratio(sum(theirs), sum(procs))})
    return out


def groups(results: Sequence[Parity]) -> list[tuple[str, list[Parity]]]:
    out = [("all", list(results))]
    for op in OPS:
        out.append((op, [p for p in results if p.op == op]))
    out.append(("congestion-aware", [p for p in results if p.backend == "aware"]))
    return [(name, rs) for name, rs in out if rs]


def print_errors(con: Console, results: Sequence[Parity], against: str) -> None:
    t = table(f"trainsim (ASTRA-sim semantics) vs {against}", "rows", "n", "equal to the ns", "median |err|",
              "max |err|", "max |err| ns", "worst row")
    for name, rs in groups(results):
        s = error_stats(rs)
        t.add_row(name, str(s["n"]), f"{s['exact_to_ns']}", f"{s['median_abs_err_pct']:.4f}%",
                  f"{s['max_abs_err_pct']:.4f}%", f"{s['max_abs_err_ns']:,}",
                  s["worst_row"] or "-")
    con.print(t)
    off = sorted((p for p in results if not p.exact), key=lambda p: -abs(p.diff_pct))
    for p in off[:5]:
        con.print(f"  not equal: {p.row_id} {p.topology} {p.op} {fmt_bytes(p.bytes_nccl)} x{p.chunks} "
                  f"{p.backend}: trainsim {p.trainsim_us:.3f} us, ASTRA-sim {p.astra_us:.3f} us "
                  f"({p.diff_ns:+,} ns, {p.diff_pct:+.4f}%)")


def print_walls(con: Console, results: Sequence[Parity], live: bool) -> None:
    w = wall_stats(results)
    t = table("wall time per row", "", "median", "total", "ASTRA-sim / trainsim: median of rows",
              "ratio of totals")
    astra_what = "ASTRA-sim process (here)" if live else "ASTRA-sim process (reference)"
    t.add_row(astra_what, fmt_s(w["astra_process_median_s"]), fmt_s(w["astra_process_total_s"]), "", "")
    t.add_row("trainsim in process", fmt_s(w["trainsim_in_process_median_s"]),
              fmt_s(w["trainsim_in_process_total_s"]), fmt_x(w["ratio_model_median"]), fmt_x(w["ratio_model_total"]))
    if "trainsim_process_median_s" in w:
        t.add_row("trainsim process (python -c)", fmt_s(w["trainsim_process_median_s"]),
                  fmt_s(w["trainsim_process_total_s"]), fmt_x(w["ratio_process_median"]),
                  fmt_x(w["ratio_process_total"]))
    con.print(t)
    con.print(f"  trainsim in process: parse + predict one row, best of {REPEATS} (time.perf_counter).")
    if live:
        con.print("  process to process: ASTRA-sim's process vs a `python -c` process that imports trainsim and "
                  "predicts the row. Model to model: ASTRA-sim's process (its simulation alone cannot be timed "
                  "from outside: process start and ET loading are in it) vs trainsim's in-process prediction.")
    else:
        con.print("  Model to model, as far as the reference allows: trainsim's in-process prediction vs ASTRA-sim's "
                  "whole process (astra_wall_s: process start and ET loading included, measured on another machine "
                  f"(2-core VM) at 10 ms resolution, {sum(p.astra_wall_s <= 0.01 for p in results)} rows at the "
                  "0.01 s floor). ASTRA-sim's simulation time alone is not recorded, so this favours trainsim by "
                  "ASTRA-sim's start-up; --astra-bin measures process to process too.")


def slowest(con: Console, rows: list[dict[str, str]], results: Sequence[Parity]) -> list[dict[str, Any]]:
    by_id = {r["row_id"]: r for r in rows}
    top = sorted(results, key=lambda p: -p.astra_wall_s)[:SLOWEST]
    walls = table(f"the {len(top)} rows ASTRA-sim took longest on: wall time", "row", "collective",
                  "ASTRA-sim process", "trainsim in process", "ratio")
    sems = table("the same rows: ASTRA-sim semantics vs trainsim's NCCL-like semantics (us)", "row",
                 "ASTRA-sim", "trainsim", "NCCL-like", "gap", "ASTRA/NCCL", "largest term of the gap")
    out = []
    for p in top:
        ar = parse_row(by_id[p.row_id])
        gap = ar.gap()
        nccl_us = ar.time_s(NCCL) * 1e6
        big = max(gap.terms, key=lambda g: abs(g.delta_s), default=None)
        term = f"{big.name} {big.delta_s * 1e6:+,.1f}" if big is not None else "-"
        walls.add_row(p.row_id, collective(p), fmt_s(p.astra_wall_s), fmt_s(p.trainsim_wall_s),
                      fmt_x(ratio(p.astra_wall_s, p.trainsim_wall_s)))
        sems.add_row(p.row_id, f"{p.astra_us:,.3f}", f"{p.trainsim_us:,.3f}", f"{nccl_us:,.3f}",
                     f"{gap.gap_s * 1e6:+,.3f}", fmt_x(ratio(gap.astra_s, gap.nccl_s)), term)
        out.append({**p.as_dict(), "nccl_like_us": nccl_us, "gap": gap.as_dict()})
    con.print(walls)
    con.print(sems)
    return out


def ring1024(con: Console) -> dict[str, Any]:
    ar = parse_row(RING1024_A2A)
    pred, wall = best_of(lambda: predict_s(RING1024_A2A))
    nccl = ar.time_s(NCCL)
    con.print(f"Ring(1024) ring all-to-all, 1 MiB, 1 chunk, 50 GiB/s per link, 500 ns, endpoint 10 ns "
              f"(ASTRA-sim did not finish within 120 s): trainsim {pred * 1e6:,.3f} us in ASTRA-sim semantics "
              f"(NCCL-like {nccl * 1e6:,.3f} us), predicted in {fmt_s(wall)} (parse + predict, best of {REPEATS})")
    return {"case": "Ring(1024) ring all_to_all 1 MiB x1, 50 GiB/s, 500 ns, endpoint 10 ns",
            "trainsim_us": pred * 1e6, "nccl_like_us": nccl * 1e6, "trainsim_wall_s": wall,
            "astra": f"did not finish within {ASTRA_TIMEOUT_S:g} s"}


# --------------------------------------------------------------------------------------------------
# live mode: ASTRA-sim's inputs, the run, its output
# --------------------------------------------------------------------------------------------------

def _number(x: float) -> int | float:
    """A config value as ASTRA-sim's files spell it: whole numbers as ints, the rest to 12 significant
    digits (the GiB/s <-> GB/s round trip leaves 500.00000000000006 ns)."""
    v = float(f"{x:.12g}")
    return int(v) if v.is_integer() else v


def network_json(ar: AstraRow) -> dict[str, Any]:
    levels = tuple(Level(f"dim{i + 1}", d.kind, d.size, d.bandwidth_gbps, d.latency_s) for i, d in enumerate(ar.dims))
    net = network_of(levels).model_dump()
    return {**net, "bandwidth": [_number(b) for b in net["bandwidth"]], "latency": [_number(x) for x in net["latency"]]}


def _default_algorithm(kind: str, op: str) -> str:
    algo = BLOCK_ALGORITHM[kind]
    if op == "all_to_all" and algo == "halving_doubling":
        algo = "direct"  # halvingDoubling has no all-to-all: ASTRA-sim's Switch default for it is direct
    return _ASTRA_NAME[algo]


def system_json(row: dict[str, str], ar: AstraRow) -> dict[str, Any]:
    """The row's system layer: its op's implementations as given, the other ops' per-dimension defaults."""
    impl = {op: [_ASTRA_NAME[d.algorithm] if op == ar.op else _default_algorithm(d.kind, op) for d in ar.dims]
            for op in OPS}
    sysconf = AstraSystem(
        scheduling_policy="LIFO", endpoint_delay=_number(float(row["endpoint_delay_ns"])),
        active_chunks_per_dimension=1, preferred_dataset_splits=ar.chunks,
        all_reduce_implementation=impl["all_reduce"], reduce_scatter_implementation=impl["reduce_scatter"],
        all_gather_implementation=impl["all_gather"], all_to_all_implementation=impl["all_to_all"],
        collective_optimization="localBWAware", local_mem_bw=_number(float(row["local_mem_bw_gbps"])),
        boost_mode=0, roofline_enabled=0, peak_perf=900).check(f"row {row_label(row)}", len(ar.dims))
    return sysconf.model_dump(by_alias=True, exclude_none=True, include=set(SYSTEM_FIELDS))


def write_workload(ar: AstraRow, out: Path, prefix: str = PREFIX) -> list[Path]:
    """One Chakra ET file per NPU, each one COMM_COLL_NODE over all NPUs (mlc-chakra's codec, as
    trainsim.trace.chakra.write_chakra encodes it). comm_size in ASTRA-sim's convention."""
    from trainsim.trace.chakra import SCHEMA, TO_CHAKRA, _pb, _protolib, astra_comm_size

    pb, lib = _pb(), _protolib()
    npus = math.prod(d.size for d in ar.dims)
    comm_size = round(astra_comm_size(ar.op, ar.size_bytes, npus))
    paths = []
    for rank in range(npus):
        meta = pb.GlobalMetadata(version="0.0.4")
        meta.attr.extend([pb.AttributeProto(name="schema", string_val=SCHEMA),
                          pb.AttributeProto(name="generator", string_val="trainsim benchmarks/astra_parity.py")])
        node = pb.Node(id=0, name=f"{ar.op} {comm_size} B", type=pb.COMM_COLL_NODE)
        node.attr.extend([pb.AttributeProto(name="is_cpu_op", bool_val=False),
                          pb.AttributeProto(name="comm_type", int64_val=pb.CollectiveCommType.Value(TO_CHAKRA[ar.op])),
                          pb.AttributeProto(name="comm_size", int64_val=comm_size)])
        path = out / f"{prefix}.{rank}.et"
        with path.open("wb") as fh:
            lib.encodeMessage(fh, meta)
            lib.encodeMessage(fh, node)
        paths.append(path)
    return paths


@dataclass(frozen=True)
class AstraInputs:
    """Where one row's ASTRA-sim inputs were written."""

    workload_prefix: Path
    system: Path
    network: Path
    remote_memory: Path
    npus: int
    queues: int
    backend: str

    def command(self, binary: Path) -> list[str]:
        cmd = [str(binary), f"--workload-configuration={self.workload_prefix}",
               f"--system-configuration={self.system}", f"--network-configuration={self.network}",
               f"--remote-memory-configuration={self.remote_memory}"]
        if self.queues != 1:
            cmd.append(f"--num-queues-per-dim={self.queues}")
        return cmd


def write_inputs(row: dict[str, str], out: Path) -> AstraInputs:
    """The row's network / system / remote memory JSON and ET workload under `out`; a ValueError when the
    written files would not say what the row says."""
    ar = parse_row(row)
    net = network_json(ar)
    want_bw = [_number(float(x)) for x in row["bandwidth_gbps_per_dim"].split(",")]
    want_lat = [_number(float(x)) for x in row["latency_ns_per_dim"].split(",")]
    if net["bandwidth"] != want_bw or net["latency"] != want_lat:
        raise ValueError(f"network config {net} does not match the row's {want_bw} GiB/s, {want_lat} ns")
    npus = math.prod(net["npus_count"])
    comm = round(ar.size_bytes / npus) if ar.op == "all_gather" else round(ar.size_bytes)
    if comm != int(row["comm_size_bytes"]):
        raise ValueError(f"comm_size {comm} does not match the row's {row['comm_size_bytes']}")
    files = {"network": out / "network.json", "system": out / "system.json", "remote_memory": out / "memory.json"}
    files["network"].write_text(json.dumps(net, indent=1))
    files["system"].write_text(json.dumps(system_json(row, ar), indent=1))
    files["remote_memory"].write_text(json.dumps(REMOTE_MEMORY, indent=1))
    write_workload(ar, out)
    return AstraInputs(out / PREFIX, files["system"], files["network"], files["remote_memory"], npus,
                       int(row["queues_per_dim"]), row["backend"].strip())


def parse_finish(output: str, npus: int) -> int:
    """The slowest NPU's finish time in ns (1 cycle = 1 ns); every NPU must report exactly once."""
    seen: dict[int, list[int]] = {}
    for m in _FINISHED.finditer(output):
        seen.setdefault(int(m.group(1)), []).append(int(m.group(2)))
    twice = [r for r, v in seen.items() if len(v) > 1]
    missing = [r for r in range(npus) if r not in seen]
    extra = [r for r in seen if not 0 <= r < npus]
    if twice or missing or extra:
        raise ValueError(f"expected one 'sys[i] finished' line per NPU (0..{npus - 1}): "
                         f"{len(missing)} missing, {len(twice)} repeated, {len(extra)} out of range")
    return max(v[0] for v in seen.values())


@dataclass(frozen=True)
class Binaries:
    unaware: Path
    aware: Path | None

    @classmethod
    def find(cls, where: str) -> Binaries:
        p = Path(where).expanduser()
        if p.is_dir():
            aware = p / AWARE_BIN
            return cls(p / UNAWARE_BIN, aware if aware.is_file() else None)
        sibling = p.with_name(p.name.replace("Unaware", "Aware")) if "Unaware" in p.name else None
        return cls(p, sibling if sibling is not None and sibling.is_file() else None)

    def for_backend(self, backend: str) -> Path | None:
        return self.aware if backend == "aware" else self.unaware


def run_astra(binary: Path, inputs: AstraInputs, cwd: Path) -> tuple[float, float]:
    """ASTRA-sim's time (us) and its process's wall (s); RuntimeError on a failed run."""
    t0 = time.perf_counter()
    try:
        done = subprocess.run(inputs.command(binary), capture_output=True, text=True, cwd=cwd,
                              timeout=ASTRA_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"did not finish within {ASTRA_TIMEOUT_S:g} s") from None
    wall = time.perf_counter() - t0
    output = done.stdout + "\n" + done.stderr
    if done.returncode != 0:
        tail = (output.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"exit {done.returncode}: {tail[:200]}")
    try:
        return parse_finish(output, inputs.npus) / 1e3, wall
    except ValueError as exc:
        raise RuntimeError(str(exc)) from None


def live_parity(row: dict[str, str], bins: Binaries) -> Parity:
    binary = bins.for_backend(row["backend"].strip())
    if binary is None:
        raise RuntimeError(f"a congestion-aware row needs {AWARE_BIN} next to the unaware binary")
    ar = parse_row(row)
    with tempfile.TemporaryDirectory(prefix="astra_parity_") as tmp:
        inputs = write_inputs(row, Path(tmp))
        astra_us, astra_wall = run_astra(binary, inputs, Path(tmp))
    pred, wall = best_of(lambda: predict_s(row))
    proc_pred, proc_wall = trainsim_process(row)
    if proc_pred != pred:
        raise RuntimeError(f"the trainsim process predicted {proc_pred!r} s, in process {pred!r} s")
    return Parity(row["row_id"], row["topology"], row["op"], ar.size_bytes, ar.chunks, row["backend"], astra_us,
                  pred * 1e6, wall, astra_wall, reference_us=float(row["astra_time_us"]), trainsim_process_s=proc_wall)


def print_live_rows(con: Console, results: Sequence[Parity]) -> None:
    pred = table("trainsim vs ASTRA-sim, row by row (us)", "row", "collective", "ASTRA-sim", "reference",
                 "trainsim", "diff ns", "diff %")
    walls = table("wall time, row by row (ratios: ASTRA-sim process / trainsim)", "row", "ASTRA-sim process",
                  "trainsim process", "process ratio", "trainsim in process", "model ratio")
    for p in results:
        pred.add_row(p.row_id, collective(p), f"{p.astra_us:,.3f}",
                     f"{p.reference_us:,.3f}" if p.reference_us is not None else "-", f"{p.trainsim_us:,.3f}",
                     f"{p.diff_ns:+,}", f"{p.diff_pct:+.4f}")
        walls.add_row(p.row_id, fmt_s(p.astra_wall_s), fmt_s(p.trainsim_process_s),
                      fmt_x(ratio(p.astra_wall_s, p.trainsim_process_s)), fmt_s(p.trainsim_wall_s),
                      fmt_x(ratio(p.astra_wall_s, p.trainsim_wall_s)))
    con.print(pred)
    con.print(walls)
    drift = [p for p in results if p.reference_us is not None and round(p.reference_us * 1e3) != round(p.astra_us * 1e3)]
    if drift:
        con.print(f"  {len(drift)} rows where this ASTRA-sim build differs from the reference's "
                  f"(commit 518bd513ae11), e.g. {drift[0].row_id}: {drift[0].astra_us:.3f} vs "
                  f"{drift[0].reference_us:.3f} us")


# --------------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------------

def chakra_missing() -> str | None:
    from trainsim.trace.chakra import _pb

    try:
        _pb()
    except ConfigError:
        return "--astra-bin writes Chakra ET workloads and needs mlc-chakra: pip install 'trainsim[chakra]'"
    return None


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    return x


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reference", type=Path, default=DEFAULT_REFERENCE, help="ASTRA-sim reference CSV")
    ap.add_argument("--astra-bin", metavar="DIR_OR_BINARY",
                    help=f"directory holding {UNAWARE_BIN} (and {AWARE_BIN}), or the unaware binary")
    ap.add_argument("--rows", help="comma list of row ids (default: every row)")
    ap.add_argument("--limit", type=int, help="the first N selected rows")
    ap.add_argument("--json", type=Path, metavar="OUT", help="write the numbers here")
    args = ap.parse_args(argv)
    con = Console() if sys.stdout.isatty() else Console(width=PIPED_WIDTH)
    try:
        rows = select(read_reference(args.reference), args.rows, args.limit)
    except (OSError, ValueError, KeyError) as exc:
        print(f"astra_parity: {exc}", file=sys.stderr)
        return 2
    if not rows:
        print("astra_parity: no rows selected", file=sys.stderr)
        return 2
    report: dict[str, Any] = {"reference": str(args.reference.resolve()), "repeats": REPEATS}
    failed: list[dict[str, str]] = []
    if args.astra_bin is None:
        report["mode"] = "reference"
        con.print(f"rows: {len(rows)} of {args.reference.resolve()}")
        t0 = time.perf_counter()
        results = [reference_parity(r) for r in rows]
        con.print(f"predicted and timed in {time.perf_counter() - t0:.2f} s")
        print_errors(con, results, "the reference's astra_time_us")
        print_walls(con, results, live=False)
        report["slowest_astra_rows"] = slowest(con, rows, results)
    else:
        report["mode"] = "live"
        missing = chakra_missing()
        if missing:
            print(missing)
            return 2
        bins = Binaries.find(args.astra_bin)
        if not bins.unaware.is_file():
            print(f"astra_parity: no ASTRA-sim binary at {bins.unaware}", file=sys.stderr)
            return 2
        report["binaries"] = {"unaware": str(bins.unaware), "aware": str(bins.aware) if bins.aware else None}
        con.print(f"rows: {len(rows)} of {args.reference.resolve()}; ASTRA-sim {bins.unaware}"
                  + (f" and {bins.aware.name}" if bins.aware else " (no congestion-aware binary)"))
        results = []
        for i, row in enumerate(rows, 1):
            try:
                results.append(live_parity(row, bins))
            except (RuntimeError, ValueError, OSError, subprocess.TimeoutExpired) as exc:
                failed.append({"row_id": row_label(row), "reason": str(exc)})
                con.print(f"  [{i}/{len(rows)}] {row_label(row)}: not compared: {exc}")
        report["failed"] = failed
        if results:
            print_live_rows(con, results)
            print_errors(con, results, "ASTRA-sim (this run)")
            print_walls(con, results, live=True)
    if results:
        report["errors"] = {name: error_stats(rs) for name, rs in groups(results)}
        report["wall"] = wall_stats(results)
        report["rows"] = [p.as_dict() for p in results]
    report["ring1024_all_to_all"] = ring1024(con)
    if args.json is not None:
        args.json.write_text(json.dumps(_jsonable(report), indent=1))
        con.print(f"wrote {args.json}")
    return 1 if failed and not results else 0


if __name__ == "__main__":
    sys.exit(main())
