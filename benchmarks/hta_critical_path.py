"""Cross-check of trainsim's replay critical path against Holistic Trace Analysis (HTA 0.5.0).

    .venv/bin/python benchmarks/hta_critical_path.py [--json]

For HTA's own critical-path test traces (../shared/traces/HolisticTraceAnalysis/tests/data) and one
ProfilerStep of the NCCL DDP trace, both tools give the critical path of one annotation window:

* HTA: `TraceAnalysis.critical_path_analysis(rank=0, annotation, instance_id)` with the annotation and
  instance HTA's tests use (and CRITICAL_PATH_ADD_ZERO_WEIGHT_LAUNCH_EDGE=1, as its tests set). The path is
  the longest path of HTA's event graph; its length is the summed edge weight (CPU op / runtime spans,
  kernels, launch and kernel-kernel delays; dependency, sync and blocking-call edges weigh 0).
* trainsim: `replay_trace`, then the dPRO walk of `critical_pred` back from the task of the window that
  ends last in the replay, while the tasks stay in the window (CPU segments that lie in it; GPU ops whose
  launch call starts in it, HTA's own clipping rule). Its length is the replayed span of that chain.

Agreement: length difference in % (also "like-for-like": trainsim's length less the time HTA weighs 0),
share of the path by category side by side, and the Jaccard overlap, by measured kernel time, of the GPU
ops on the two paths (matched by correlation id). Each trainsim path edge is also checked for causality
in the measured times (its predecessor ended no later than it started, within 1 us).

HTA runs in-process when importable, else this file re-invokes itself under $HTA_PYTHON (default
/work/htavenv/bin/python, a venv with HolisticTraceAnalysis and pandas<3: HTA 0.5.0 fails under pandas 3)
with `--hta-json`, which prints one JSON line; that half imports neither trainsim nor rich.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainsim.trace.kineto import KinetoTrace

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
DATA = TRACES / "HolisticTraceAnalysis" / "tests" / "data"
HTA_PYTHON_DEFAULT = "/work/htavenv/bin/python"
MARK = "HTA_JSON "
TOL_US = 1.0  # window edges and causality, us (HTA rounds ns-resolution timestamps to us)

# path categories, in display order; the last group is time HTA's graph gives no weight (see module doc)
CATS = ("cpu op", "launch call", "runtime call", "launch delay", "gpu kernel", "gpu memcpy/set", "gpu comm",
        "gpu gap", "blocking call", "cpu annot-only", "cpu idle")
HTA_ZERO = ("blocking call", "cpu annot-only", "cpu idle")
# HTA's CPGraph.BLOCKING_SYNC_CALLS: their spans weigh 0 (the wait is carried by the GPU -> CPU sync edge)
BLOCKING = frozenset({"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventQuery", "cudaEventSynchronize",
                      "cudaMemcpy", "cudaMemcpyAsync"})


@dataclass(frozen=True)
class Case:
    """One trace and the annotation window both tools analyse (instance None: the whole trace)."""

    label: str
    path: str  # relative to DATA
    annotation: str  # "" = whole trace (as HTA's multi-stream test)
    instance: int | None


CASES = (
    Case("alexnet fwd#1", "critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
         "[param|pytorch.model.alex_net|0|0|0|measure|forward]", 1),
    Case("cuda_event_sync", "critical_path/cuda_event_sync/event_sync_trace.json.gz", "ProfilerStep", 0),
    Case("multi_stream all", "critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz", "", None),
    Case("nccl ddp step#5", "nccl_parser_config/nccl_data.json.gz", "ProfilerStep", 1),
)


def _launch_name(name: str) -> bool:
    return "LaunchKernel" in name or "GraphLaunch" in name or "LaunchCooperative" in name


def _gpu_cat(name: str, cat: str) -> str:
    if "memcpy" in cat or "memset" in cat or name.startswith(("Memcpy", "Memset")):
        return "gpu memcpy/set"
    return "gpu comm" if name.startswith(("nccl", "rccl", "ncclDevKernel", "ncclKernel")) else "gpu kernel"


# ---- HTA half (runs under the HTA venv; no trainsim, no rich) ---------------------------------------


def _hta_case(case: Case) -> dict[str, Any]:
    """HTA's critical path of one window: length, span, time by category, kernels on it."""
    from hta.analyzers.critical_path_analysis import CPEdgeType
    from hta.trace_analysis import TraceAnalysis

    src = DATA / case.path
    with tempfile.TemporaryDirectory() as tmp:  # one file per trace dir, never writing into shared/
        (Path(tmp) / src.name).symlink_to(src)
        ta = TraceAnalysis(trace_dir=tmp)
        res = ta.critical_path_analysis(rank=0, annotation=case.annotation, instance_id=case.instance)
    if res is None:
        return {"error": f"HTA found no annotation {case.annotation!r}"}
    g, ok = res
    if not ok:
        return {"error": "HTA's critical path algorithm failed"}
    df = g.trace_df
    sym = ta.t.symbol_table.get_sym_table()
    full = ta.t.get_trace(0)
    if case.annotation:  # the window, as CriticalPathAnalysis computes it
        ids = [v for k, v in ta.t.symbol_table.get_sym_id_map().items() if case.annotation in k]
        ann = full[full.name.isin(ids)]
        i0, i1 = case.instance or 0, (case.instance or 0) + 1
        w0, w1 = float(ann.ts.iloc[i0:i1].min()), float((ann.ts + ann.dur).iloc[i0:i1].max())
    else:
        w0, w1 = float(full.ts.min()), float((full.ts + full.dur).max())  # HTA's own `end` column is absolute
    by_cat = dict.fromkeys(CATS, 0.0)
    kernels: dict[str, dict[str, Any]] = {}
    items: list[tuple[float, str, str]] = []  # (us, name, category) per weighted edge
    for u, v in zip(g.critical_path_nodes, g.critical_path_nodes[1:], strict=False):
        e, w = g.edges[u, v]["object"], float(g.edges[u, v]["weight"])
        if e.type == CPEdgeType.KERNEL_LAUNCH_DELAY:
            by_cat["launch delay"] += w
            items.append((w, "(launch delay)", "launch delay"))
        elif e.type == CPEdgeType.KERNEL_KERNEL_DELAY:
            by_cat["gpu gap"] += w
            items.append((w, "(kernel-kernel gap)", "gpu gap"))
        elif e.type == CPEdgeType.OPERATOR_KERNEL:
            ev = g.get_event_attribution_for_edge(e)
            row = df.loc[ev]
            name, cat = sym[int(row["name"])], sym[int(row["cat"])]
            if int(row["stream"]) >= 0:
                k = _gpu_cat(name, cat)
                kernels[str(int(row["correlation"]))] = {"name": name, "stream": int(row["stream"]),
                                                         "dur_us": float(row["dur"]), "cat": k}
            elif cat in ("cuda_runtime", "cuda_driver"):
                k = "launch call" if _launch_name(name) else ("blocking call" if name in BLOCKING else "runtime call")
            else:
                k = "cpu op" if cat == "cpu_op" else "cpu annot-only"
            by_cat[k] += w
            items.append((w, name, k))
    nodes = [g.node_list[n] for n in g.critical_path_nodes]
    first, last = nodes[0], nodes[-1]
    summary = g.get_critical_path_breakdown()
    bound = (summary.groupby("bound_by").duration.sum() / summary.duration.sum() * 100).to_dict()
    return {"window_abs_us": [w0 + ta.t.min_ts, w1 + ta.t.min_ts],
            "length_us": sum(by_cat.values()), "span_us": float(last.ts - first.ts),
            "start_abs_us": float(first.ts + ta.t.min_ts), "end_abs_us": float(last.ts + ta.t.min_ts),
            "first": sym[int(df.loc[first.ev_idx]["name"])], "last": sym[int(df.loc[last.ev_idx]["name"])],
            "n_nodes": len(nodes), "by_cat_us": by_cat, "kernels": kernels, "top": sorted(items, reverse=True)[:3],
            "bound_by_pct": {k or "(dependency)": float(x) for k, x in bound.items()}}


def hta_results(cases: list[Case]) -> dict[str, dict[str, Any]]:
    """Run HTA on each case whose trace is present (its prints and logs go to stderr)."""
    os.environ.setdefault("CRITICAL_PATH_ADD_ZERO_WEIGHT_LAUNCH_EDGE", "1")  # as HTA's tests
    import logging

    logging.getLogger("hta").setLevel(logging.ERROR)
    out: dict[str, dict[str, Any]] = {}
    with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for c in cases:
            if not (DATA / c.path).is_file():
                continue
            try:
                out[c.label] = _hta_case(c)
            except Exception as ex:  # noqa: BLE001 - report, go on with the other traces
                out[c.label] = {"error": f"{type(ex).__name__}: {ex}"}
    return out


def hta_via_subprocess(cases: list[Case]) -> tuple[dict[str, dict[str, Any]], str]:
    """HTA in-process if importable, else under $HTA_PYTHON; (results, how it ran or why it did not)."""
    try:
        import hta  # noqa: F401
        import pandas
    except ImportError:
        why = "HTA not importable here"
    else:
        if int(pandas.__version__.split(".")[0]) < 3:
            return hta_results(cases), "in-process"
        why = f"HTA 0.5.0 fails under pandas {pandas.__version__} here"
    py = os.environ.get("HTA_PYTHON", HTA_PYTHON_DEFAULT)
    if not Path(py).exists():
        return {}, f"{why} and no interpreter at {py} (set HTA_PYTHON)"
    p = subprocess.run([py, str(Path(__file__).resolve()), "--hta-json", *[c.label for c in cases]],
                       capture_output=True, text=True, check=False)
    for line in p.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):]), f"{py} ({why})"
    return {}, f"{py} gave no result (rc {p.returncode}): {p.stderr.strip()[-800:]}"


# ---- trainsim half ------------------------------------------------------------------------------------


def _own_window(trace: KinetoTrace, case: Case) -> tuple[float, float]:
    """The case's window in trace-relative us, found in trainsim's own tables (HTA's rule: the n-th range
    whose name contains the annotation, in time order; "" = first event to last end)."""
    import numpy as np

    cpu = trace.cpu
    if not case.annotation:
        ends = [float(np.max(t.ts_us + t.dur_us)) for t in (cpu, trace.runtime, trace.gpu) if len(t)]
        starts = [float(np.min(t.ts_us)) for t in (cpu, trace.runtime, trace.gpu) if len(t)]
        return min(starts), max(ends)
    hits = sorted((float(cpu.ts_us[i]), float(cpu.ts_us[i] + cpu.dur_us[i]))
                  for i, n in enumerate(trace.names(cpu.name_id)) if case.annotation in n)
    return hits[case.instance or 0]


def _covered(intervals: list[tuple[float, float]]) -> Callable[[float, float], float]:
    """C(a, b): length of [a, b] covered by the union of the intervals."""
    import numpy as np

    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    if not merged:
        return lambda a, b: 0.0
    st = np.asarray([m[0] for m in merged])
    en = np.asarray([m[1] for m in merged])
    cum = np.concatenate([[0.0], np.cumsum(en - st)])

    def upto(x: float) -> float:
        j = int(np.searchsorted(st, x, side="right")) - 1
        return 0.0 if j < 0 else float(cum[j] + min(x, en[j]) - st[j])

    return lambda a, b: upto(b) - upto(a)


def trainsim_case(case: Case) -> dict[str, Any]:
    """trainsim's replay critical path of the case's window, by category, with kernels and causality."""
    from trainsim.replay import replay_trace
    from trainsim.trace.kineto import read_kineto
    from trainsim.trace.kineto.model import CpuKind

    tr = read_kineto(DATA / case.path)
    r = replay_trace(tr)
    g, sim = r.graph, r.trace
    assert g is not None and sim is not None
    assert r.graphs is not None
    rk = r.graphs.ranks[0]  # the rank's thread and boundary tables, task offset and clock shift
    rg, base, off_s = rk.rg, rk.task0, rk.delay_s
    gpu0 = base + rg.gpu_task0  # merged id of GPU op row 0
    w0, w1 = _own_window(tr, case)
    gpu, rt = tr.gpu, tr.runtime
    g_end = (gpu.ts_us + gpu.dur_us).tolist()
    n = len(g)
    meas_end = [0.0] * n  # measured end of every task, us from origin (replay time off_s)
    in_win = [False] * n
    thread_of: dict[int, int] = {}  # CPU segment task -> trace thread
    for th, b in rg.boundary_us.items():
        t0 = base + rg.first_segment[th]
        for k in range(len(b) - 1):
            meas_end[t0 + k] = float(b[k + 1])
            in_win[t0 + k] = w0 - TOL_US <= b[k] and b[k + 1] <= w1 + TOL_US
            thread_of[t0 + k] = th
    for i in range(len(gpu)):
        t = gpu0 + i
        meas_end[t] = g_end[i]
        ri = int(gpu.runtime[i])
        ts = float(rt.ts_us[ri]) if ri >= 0 else float(gpu.ts_us[i])
        in_win[t] = w0 - TOL_US <= ts <= w1 + TOL_US
    cand = [t for t in range(n) if in_win[t]]
    if not cand:
        return {"error": "no task in the window"}
    t = max(cand, key=lambda x: sim.end_s[x])
    path: list[int] = []
    while t >= 0 and in_win[t]:
        path.append(t)
        t = sim.critical_pred[t]
    path.reverse()
    # CPU time covered by a cpu_op range (HTA weighs only cpu_op and runtime spans), per thread
    cpu = tr.cpu
    cov = {th: _covered([(float(a), float(a + d)) for a, d, k, h in
                         zip(cpu.ts_us, cpu.dur_us, cpu.kind, cpu.thread, strict=True)
                         if h == th and k == CpuKind.CPU_OP]) for th in rg.boundary_us}
    by_cat = dict.fromkeys(CATS, 0.0)
    kernels: dict[str, dict[str, Any]] = {}
    items: list[tuple[float, str, str]] = []  # (us, name, category) per task
    waits: list[tuple[float, float, str]] = []  # (op-free us, another thread's cpu_op us meanwhile, thread)
    for t in path:
        d = (sim.end_s[t] - sim.start_s[t]) * 1e6
        c = g.category[t]
        if t >= gpu0:
            i = t - gpu0
            key = str(int(gpu.correlation[i])) if int(gpu.correlation[i]) >= 0 else f"s{int(gpu.stream[i])}@{i}"
            k = {"collective": "gpu comm", "memcpy": "gpu memcpy/set", "memset": "gpu memcpy/set"}.get(c, "gpu kernel")
            kernels[key] = {"name": g.name[t], "stream": int(gpu.stream[i]), "dur_us": float(gpu.dur_us[i]), "cat": k}
            by_cat[k] += d
        elif c == "host":
            a = meas_end[t] - g.duration_s[t] * 1e6
            op = min(cov[thread_of[t]](a, meas_end[t]), d)
            by_cat["cpu op"] += op
            by_cat["cpu annot-only"] += d - op
            if d - op > 1000.0:  # a long op-free stretch: is another thread working meanwhile?
                busy = max((f(a, meas_end[t]) for o, f in cov.items() if o != thread_of[t]), default=0.0)
                waits.append((d - op, min(busy, d - op), g.stream_name(g.stream[t])))
        elif c == "host_idle":
            by_cat["cpu idle"] += d
        elif c == "launch":
            by_cat["launch call"] += d
        elif c == "sync" or g.name[t] in BLOCKING:
            by_cat["blocking call"] += d
        else:
            by_cat["runtime call"] += d
        items.append((d, g.name[t], c))
    # causality in the measured times, and how far the replay moved the path off the measurement
    bad: list[str] = []
    kinds = {"stream order": 0, "CPU -> GPU launch": 0, "GPU -> CPU sync": 0, "GPU -> GPU wait": 0, "CPU chain": 0}
    for p, q in zip(path, path[1:], strict=False):
        start_q = meas_end[q] - g.duration_s[q] * 1e6
        if meas_end[p] > start_q + TOL_US:
            bad.append(f"{g.name[p]} ({g.stream_name(g.stream[p])}, ends {meas_end[p]:.1f} us) -> {g.name[q]} "
                       f"({g.stream_name(g.stream[q])}, starts {start_q:.1f} us)")
        p_gpu, q_gpu = p >= gpu0, q >= gpu0
        if g.stream[p] == g.stream[q]:
            kinds["CPU chain" if not q_gpu else "stream order"] += 1
        else:
            kinds[{(False, True): "CPU -> GPU launch", (True, False): "GPU -> CPU sync",
                   (True, True): "GPU -> GPU wait"}.get((p_gpu, q_gpu), "CPU chain")] += 1
    drift = max(abs((sim.end_s[t] - off_s) * 1e6 - meas_end[t]) for t in path)
    return {"window_abs_us": [w0 + tr.origin_us, w1 + tr.origin_us],
            "length_us": (sim.end_s[path[-1]] - sim.start_s[path[0]]) * 1e6,
            "start_abs_us": (sim.start_s[path[0]] - off_s) * 1e6 + tr.origin_us,
            "end_abs_us": (sim.end_s[path[-1]] - off_s) * 1e6 + tr.origin_us,
            "first": g.name[path[0]], "last": g.name[path[-1]], "n_tasks": len(path),
            "by_cat_us": by_cat, "kernels": kernels, "top": sorted(items, reverse=True)[:3], "non_causal": bad,
            "cross_thread": sorted(waits, reverse=True), "edge_kinds": kinds,
            "max_drift_us": drift, "replay_error_pct": r.replay_error_pct}


# ---- comparison and report -------------------------------------------------------------------------


def compare(h: dict[str, Any], s: dict[str, Any]) -> dict[str, Any]:
    """Length difference, like-for-like length and kernel-time Jaccard of the two paths."""
    kh, ks = h["kernels"], s["kernels"]
    dur = {**{k: v["dur_us"] for k, v in kh.items()}, **{k: v["dur_us"] for k, v in ks.items()}}
    inter = sum(dur[k] for k in kh.keys() & ks.keys())
    union = sum(dur[k] for k in kh.keys() | ks.keys())
    like = s["length_us"] - sum(s["by_cat_us"][c] for c in HTA_ZERO)
    return {"diff_pct": (s["length_us"] - h["length_us"]) / h["length_us"] * 100,
            "like_diff_pct": (like - h["length_us"]) / h["length_us"] * 100, "like_us": like,
            "jaccard": inter / union if union > 0 else None, "common": len(kh.keys() & ks.keys()),
            "window_shift_us": max(abs(a - b) for a, b in zip(h["window_abs_us"], s["window_abs_us"], strict=True)),
            "only_hta": sorted(kh.keys() - ks.keys(), key=lambda k: -kh[k]["dur_us"]),
            "only_trainsim": sorted(ks.keys() - kh.keys(), key=lambda k: -ks[k]["dur_us"])}


def report(rows: list[tuple[Case, dict[str, Any], dict[str, Any]]], how: str) -> None:
    """Rich tables: one summary row per case, then the category shares side by side."""
    from rich.console import Console
    from rich.table import Table

    con = Console(width=max(Console().width, 160))

    def say(text: str) -> None:
        con.print(text, markup=False, highlight=False)

    say(f"HTA: {how}")
    summ = Table(title="critical path: HTA 0.5.0 vs trainsim replay (ms; diff % vs HTA length)")
    for col in ("case", "window", "HTA len", "HTA span", "trainsim len", "diff %", "like-for-like %",
                "kernels HTA/ts/both", "Jaccard (time)", "non-causal", "drift us"):
        summ.add_column(col, justify="left" if col == "case" else "right")
    for case, h, s in rows:
        if "error" in s:
            summ.add_row(case.label, *["-"] * 10)
            continue
        if "error" in h:  # trainsim's numbers alone
            w = (s["window_abs_us"][1] - s["window_abs_us"][0]) / 1e3
            summ.add_row(case.label, f"{w:.3f}", "-", "-", f"{s['length_us'] / 1e3:.3f}", "-", "-",
                         f"-/{len(s['kernels'])}/-", "-", str(len(s["non_causal"])), f"{s['max_drift_us']:.2f}")
            continue
        c = compare(h, s)
        w = (s["window_abs_us"][1] - s["window_abs_us"][0]) / 1e3
        summ.add_row(case.label, f"{w:.3f}", f"{h['length_us'] / 1e3:.3f}", f"{h['span_us'] / 1e3:.3f}",
                     f"{s['length_us'] / 1e3:.3f}", f"{c['diff_pct']:+.1f}", f"{c['like_diff_pct']:+.1f}",
                     f"{len(h['kernels'])}/{len(s['kernels'])}/{c['common']}", "n/a" if c["jaccard"] is None else f"{c['jaccard']:.3f}",
                     str(len(s["non_causal"])), f"{s['max_drift_us']:.2f}")
    con.print(summ)
    for case, h, s in rows:
        for tag, r in (("HTA", h), ("trainsim", s)):
            if "error" in r:
                say(f"  {case.label}: {tag}: {r['error']}")
    for case, h, s in rows:
        if "error" in h or "error" in s:
            continue
        c = compare(h, s)
        t = Table(title=f"{case.label}: path by category (HTA window {c['window_shift_us']:.1f} us from trainsim's)")
        for col in ("category", "HTA ms", "HTA %", "trainsim ms", "trainsim %"):
            t.add_column(col, justify="left" if col == "category" else "right")
        for k in CATS:
            a, b = h["by_cat_us"][k], s["by_cat_us"][k]
            if a or b:
                t.add_row(k + (" *" if k in HTA_ZERO else ""), f"{a / 1e3:.3f}",
                          f"{a / h['length_us'] * 100:.1f}", f"{b / 1e3:.3f}", f"{b / s['length_us'] * 100:.1f}")
        con.print(t)
        bound = ", ".join(f"{k} {v:.1f}%" for k, v in h["bound_by_pct"].items() if v)
        say(f"  HTA summary(): {bound}")
        say(f"  HTA path {h['first'][:50]!r} -> {h['last'][:50]!r} ({h['n_nodes']} nodes); trainsim "
                  f"{s['first'][:50]!r} -> {s['last'][:50]!r} ({s['n_tasks']} tasks); path ends differ by "
                  f"{(s['end_abs_us'] - h['end_abs_us']) / 1e3:+.3f} ms, starts by "
                  f"{(s['start_abs_us'] - h['start_abs_us']) / 1e3:+.3f} ms")
        for tag, src in (("HTA", h), ("trainsim", s)):
            say(f"  longest on {tag}'s path: " + "; ".join(f"{n[:40]!r} [{k}] {d / 1e3:.3f} ms" for d, n, k in src["top"]))
        say(f"  trainsim path edges: {', '.join(f'{k} {v}' for k, v in s['edge_kinds'].items() if v)}")
        if s["cross_thread"]:
            free, busy = sum(w[0] for w in s["cross_thread"]), sum(w[1] for w in s["cross_thread"])
            say(f"  {free / 1e3:.3f} ms of op-free CPU time on trainsim's path (stretches > 1 ms, largest "
                f"{s['cross_thread'][0][0] / 1e3:.3f} ms on {s['cross_thread'][0][2]}); another thread runs cpu_ops "
                f"{busy / 1e3:.3f} ms of it: a cross-thread wait kept as fixed host time (no dependency)")
        for tag, keys, src in (("only on HTA's", c["only_hta"], h), ("only on trainsim's", c["only_trainsim"], s)):
            if keys:
                top = "; ".join(f"{src['kernels'][k]['name'][:48]} {src['kernels'][k]['dur_us']:.0f} us" for k in keys[:3])
                say(f"  {len(keys)} GPU ops {tag} path, longest: {top}")
        for b in s["non_causal"][:5]:
            say(f"  NON-CAUSAL trainsim edge: {b}")
    con.print("* HTA weighs these 0 (blocking calls; CPU time outside any cpu_op / runtime span). "
              "like-for-like % = trainsim length less them, vs HTA length.")


def main(argv: list[str] | None = None) -> int:
    """Run both halves and print the tables (`--json`: also the raw results); 1 if no trace is present."""
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "--hta-json":
        res = hta_results([c for c in CASES if c.label in args[1:]] if args[1:] else list(CASES))
        print(MARK + json.dumps(res))
        return 0
    cases: list[Case] = []
    for c in CASES:
        if (DATA / c.path).is_file():
            cases.append(c)
        else:
            print(f"skip {c.label}: {DATA / c.path} is absent")
    if not cases:
        return 1
    hta, how = hta_via_subprocess(cases)
    rows = []
    for c in cases:
        try:
            s = trainsim_case(c)
        except Exception as ex:  # noqa: BLE001 - report, go on with the other traces
            s = {"error": f"trainsim: {type(ex).__name__}: {ex}"}
        rows.append((c, hta.get(c.label, {"error": f"no HTA result ({how})"}), s))
    report(rows, how)
    if "--json" in args:
        print(json.dumps({c.label: {"hta": h, "trainsim": s} for c, h, s in rows}, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
