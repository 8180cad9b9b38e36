"""Fit the compute-model constants of a device family to published (or measured) kernel throughput.

The packaged measurements live in `trainsim/data/measurements/` as three CSV kinds (each row names its
source next to the number; users can drop more files with the same columns into a directory):

* GEMM (`device,dtype,m,n,k,batch,tflops,source,notes`): dense (batched) matmul throughput, C[m,n] = A[m,k]B[k,n]
  repeated `batch` times, so the measured time is 2*m*n*k*batch / tflops;
* attention (`device,dtype,impl,batch,heads,seq_len,head_dim,causal,direction,tflops,source,notes`): fused
  attention with the FlashAttention FLOP convention (forward 4*b*h*s^2*d, halved when causal; backward 2.5x);
* memory (`device,op,bytes,gbps,source,notes`): streaming kernels, measured time = bytes / gbps.

Every prediction goes through the model's own path: a GEMM becomes a MATMUL `Op` priced by
`RooflineCompute(params).contraction_time(...)` plus the kernel gap (an FP8 benchmark casts beforehand), an attention row an
ATTENTION `Op`, a memory row `RooflineCompute.memory_time`. The fit minimises the mean squared log error of
predicted vs measured time with a small bounded Nelder-Mead (grid start, logit-transformed box), numpy only:

* `hbm_efficiency` from memory rows (first: it also prices memory-bound GEMMs and attention),
* `gemm_peak_fraction`, `k_half` (and `small_mn_half` only if the compute model uses it) from GEMM rows of the
  training dtypes (fp16/bf16 by default; other dtypes are still predicted and reported as a per-dtype bias),
* from the reference fused-attention kernel (FlashAttention-2 rows when present, else the newest FlashAttention
  generation): the shape constants `attention_seq_half`, `attention_head_dim_half`, `attention_causal_max`,
  `attention_causal_tiles`, then `flash_fraction_fwd` / `flash_fraction_bwd`; every other fused kernel present
  (flash3, cudnn, triton) gets its speed relative to the reference, `attention_kernel_speed[kernel]`.

A parameter stays at its base value, and the report says why, when no row informs it (no rows, or no row whose
predicted time moves by 5% when the parameter changes 4x).
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..hardware.devices import Device, get_device
from ..workload.ir import Op, OpKind
from .calibration import Calibration, ComputeParams, device_family
from .compute import RooflineCompute

GEMM_COLUMNS = ("device", "dtype", "m", "n", "k", "batch", "tflops", "source", "notes")
ATTENTION_COLUMNS = ("device", "dtype", "impl", "batch", "heads", "seq_len", "head_dim", "causal", "direction",
                     "tflops", "source", "notes")
MEMORY_COLUMNS = ("device", "op", "bytes", "gbps", "source", "notes")

_NUMERIC = frozenset({"m", "n", "k", "batch", "tflops", "heads", "seq_len", "head_dim", "bytes", "gbps"})
_DTYPE_ALIASES = {"float32": "fp32", "float": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16",
                  "tensorfloat32": "tf32", "float8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8",
                  "float8_e4m3fn": "fp8", "float8_e5m2": "fp8"}
_ALIGN_ELEMS = {"fp32": 4, "tf32": 4, "fp16": 8, "bf16": 8, "fp8": 16, "fp4": 32}  # 16-byte rows for tensor cores

DEFAULT_GEMM_DTYPES = ("fp16", "bf16")
MIN_SENSITIVITY = 0.05  # |change of log time| when a parameter moves from x/2 to 2x
MIN_DTYPE_ROWS = 3  # rows of one non-training dtype needed to give it its own GEMM peak fraction
MIN_TIME_S = 20e-6  # shorter measurements mix in launch/dispatch overhead the fitted parameters do not describe
_BOUNDS = {"gemm_peak_fraction": (0.2, 1.0), "k_half": (0.0, 4096.0), "small_mn_half": (0.0, 8192.0),
           "flash_fraction_fwd": (0.05, 1.0), "flash_fraction_bwd": (0.05, 1.0), "hbm_efficiency": (0.3, 1.0),
           "attention_seq_half": (0.0, 4096.0), "attention_head_dim_half": (0.0, 256.0),
           "attention_causal_max": (0.3, 1.0), "attention_causal_tiles": (0.0, 16.0)}
ATTENTION_SHAPE = ("attention_seq_half", "attention_head_dim_half", "attention_causal_max", "attention_causal_tiles")
# measurement rows' `impl` -> the compute model's attention kernel (None: not a fused kernel)
_KERNELS = {"flash": "flash", "flash2": "flash", "fa2": "flash", "flashattention2": "flash", "flash3": "flash3",
            "fa3": "flash3", "flashattention3": "flash3", "cudnn": "cudnn", "triton": "triton"}


def attention_kernel(impl: str) -> str | None:
    """The compute model's kernel name for a measurement row's `impl` (flash2 -> flash; None if unfused)."""
    return _KERNELS.get(re.sub(r"[^a-z0-9]", "", impl.lower()))
_PROBE_WHEN_ZERO = {"k_half": 64.0, "small_mn_half": 128.0}


# ---------------------------------------------------------------------------------------------- loading

def packaged_measurement_dir() -> Path:
    """Directory of the packaged published-measurement CSVs."""
    return Path(str(resources.files("trainsim").joinpath("data/measurements")))


def _dtype(name: Any) -> str:
    key = str(name or "").strip().lower().removeprefix("torch.")
    return _DTYPE_ALIASES.get(key, key)


def _bool(value: str) -> bool:
    v = value.strip().lower()
    if v in ("true", "1", "yes", "y", "causal"):
        return True
    if v in ("false", "0", "no", "n", ""):
        return False
    raise ValueError(f"not a boolean: {value!r}")


def measurement_kind(columns: Iterable[str]) -> str:
    """'gemm', 'attention' or 'memory' from a CSV's header; ValueError for anything else."""
    cols = set(columns)
    if {"seq_len", "head_dim", "direction", "tflops"} <= cols:
        return "attention"
    if {"m", "n", "k", "tflops"} <= cols:
        return "gemm"
    if {"bytes", "gbps"} <= cols:
        return "memory"
    raise ValueError(f"unrecognised measurement columns {sorted(cols)}; expected the columns of "
                     f"{GEMM_COLUMNS}, {ATTENTION_COLUMNS} or {MEMORY_COLUMNS}")


def load_measurements(path: str | Path) -> list[dict[str, Any]]:
    """Rows of one measurement CSV (GEMM, attention or memory columns), typed.

    Numeric columns become floats (an empty cell becomes None: e.g. a best-case number whose shape the source
    does not state), `causal` a bool, `dtype` the trainsim spelling; each row also carries `kind` and `file`."""
    from ..files import read_text

    p = Path(path)
    content = read_text(p, str(p), what="measurement CSV", fix="pass an existing CSV file")
    try:
        reader = csv.DictReader(io.StringIO(content, newline=""))
        try:
            kind = measurement_kind(reader.fieldnames or ())
        except ValueError as exc:
            raise ConfigError(str(p), str(exc), "") from None
        rows: list[dict[str, Any]] = []
        for line, raw in enumerate(reader, start=2):
            if not any((v or "").strip() for v in raw.values() if isinstance(v, str)):
                continue
            row: dict[str, Any] = {}
            for key, value in raw.items():
                if key is None:
                    raise ConfigError(f"{p}:{line}", "more cells than columns", "fix the row")
                text = (value or "").strip()
                if key in _NUMERIC:
                    try:
                        row[key] = float(text) if text else None
                    except ValueError:
                        raise ConfigError(f"{p}:{line}", f"column {key!r} is not a number: {text!r}",
                                          "write a number or leave the cell empty") from None
                elif key == "causal":
                    try:
                        row[key] = _bool(text)
                    except ValueError as exc:
                        raise ConfigError(f"{p}:{line}", str(exc), "") from None
                elif key == "dtype":
                    row[key] = _dtype(text)
                else:
                    row[key] = text
            row["kind"] = kind
            row["file"] = p.name
            rows.append(row)
    except csv.Error as exc:
        raise ConfigError(str(p), f"not a readable CSV ({exc})", "pass a comma-separated file") from None
    return rows


def load_measurement_dir(directory: str | Path) -> dict[str, list[dict[str, Any]]]:
    """Every *.csv of a directory, split by kind: {'gemm': [...], 'attention': [...], 'memory': [...]}."""
    out: dict[str, list[dict[str, Any]]] = {"gemm": [], "attention": [], "memory": []}
    for path in sorted(Path(directory).glob("*.csv")):
        for row in load_measurements(path):
            out[row["kind"]].append(row)
    return out


# ------------------------------------------------------------------------------------- model predictions

def _int(x: Any) -> int:
    return int(round(float(x)))


def gemm_op(m: int, n: int, k: int, batch: int = 1) -> Op:
    """A MATMUL op for C[m,n] = A[m,k] @ W[k,n] (times `batch`, as grouped 'e' GEMMs like MoE experts).

    Built like the workload IR builds linear layers (2-byte elements); how many bytes a dtype really moves is
    the compute model's business (it scales fp32/tf32), exactly as for a transformer op."""
    if batch > 1:
        dims = {"e": batch, "m": m, "n": n, "k": k}
        return Op("gemm", OpKind.MATMUL, dims, (("e", "m", "k"),), ("e", "m", "n"), weight=("e", "n", "k"))
    return Op("gemm", OpKind.MATMUL, {"m": m, "n": n, "k": k}, (("m", "k"),), ("m", "n"), weight=("n", "k"))


def attention_op(batch: int, heads: int, seq_len: int, head_dim: int, causal: bool, kernel: str = "flash") -> Op:
    """A fused ATTENTION op over (b, a, s, t, d) with the FlashAttention FLOP convention
    (as workload/zoo/transformer.py builds it: 4 FLOPs per (b, a, s, t, d) point, backward 2x forward)."""
    dims = {"b": batch, "a": heads, "s": seq_len, "t": seq_len, "d": head_dim}
    qo = ("b", "s", "a", "d")
    kv = ("b", "t", "a", "d")
    return Op("attention", OpKind.ATTENTION, dims, (qo, kv, kv), qo, flop_dims=("b", "a", "s", "t", "d"),
              flops_per_point=4.0, causal=causal, bwd_flops_factor=2.0, kernel=kernel)


def _gemm_shape(row: Mapping[str, Any]) -> tuple[int, int, int, int] | None:
    if any(row.get(c) is None for c in ("m", "n", "k")):
        return None
    return _int(row["m"]), _int(row["n"]), _int(row["k"]), max(1, _int(row.get("batch") or 1))


def measured_gemm_time(row: Mapping[str, Any]) -> float:
    m, n, k, b = _gemm_shape(row) or (0, 0, 0, 0)
    return 2.0 * m * n * k * b / (float(row["tflops"]) * 1e12)


def _attention_flops(row: Mapping[str, Any]) -> float:
    fwd = 4.0 * row["batch"] * row["heads"] * row["seq_len"] ** 2 * row["head_dim"]
    fwd *= 0.5 if row.get("causal") else 1.0
    return fwd * {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}[_direction(row)]


def _direction(row: Mapping[str, Any]) -> str:
    d = str(row.get("direction", "")).strip().lower().replace("+", "_").replace(" ", "")
    return {"forward": "fwd", "backward": "bwd", "fwdbwd": "fwd_bwd", "fwd_bwd": "fwd_bwd"}.get(d, d)


def measured_attention_time(row: Mapping[str, Any]) -> float:
    return _attention_flops(row) / (float(row["tflops"]) * 1e12)


def measured_memory_time(row: Mapping[str, Any]) -> float:
    return float(row["bytes"]) / (float(row["gbps"]) * 1e9)


def predict_gemm(params: ComputeParams, row: Mapping[str, Any], device: Device) -> float:
    m, n, k, b = _gemm_shape(row) or (0, 0, 0, 0)
    op = gemm_op(m, n, k, b)
    model = RooflineCompute(params)  # the GEMM kernel alone: a benchmark's FP8 inputs are cast beforehand
    return model.contraction_time(op, op.dims, "fwd", device, row["dtype"]) + params.kernel_overhead_s


def predict_attention(params: ComputeParams, row: Mapping[str, Any], device: Device) -> float:
    op = attention_op(_int(row["batch"]), _int(row["heads"]), _int(row["seq_len"]), _int(row["head_dim"]),
                      bool(row.get("causal")), attention_kernel(str(row.get("impl", ""))) or "flash")
    model = RooflineCompute(params)
    direction = _direction(row)
    phases = ("fwd", "bwd") if direction == "fwd_bwd" else (direction,)
    return sum(model.op_time(op, op.dims, ph, device, row["dtype"]) for ph in phases)


def predict_memory(params: ComputeParams, row: Mapping[str, Any], device: Device) -> float:
    return RooflineCompute(params).memory_time(float(row["bytes"]), device)


def model_uses(field: str, base: ComputeParams, device: Device) -> bool:
    """Whether changing `field` changes any GEMM efficiency of the compute model (e.g. small_mn_half)."""
    probes = [(64, 4096, 4096, 1), (1, 8192, 8192, 1), (256, 1024, 64, 4), (8192, 8192, 8192, 1)]
    lo = base.model_copy(update={field: 0.0})
    hi = base.model_copy(update={field: 1024.0})
    return any(RooflineCompute(lo).gemm_efficiency(*p, device) != RooflineCompute(hi).gemm_efficiency(*p, device)
               for p in probes)


# ------------------------------------------------------------------------------------------- optimiser

def _nelder_mead(f: Callable[[np.ndarray], float], x0: np.ndarray, step: float = 0.5, max_iter: int = 600,
                 tol: float = 1e-12) -> np.ndarray:
    """Plain Nelder-Mead on an unconstrained space (the caller transforms the box)."""
    n = len(x0)
    simplex = [x0.astype(float)] + [x0 + step * np.eye(n)[i] for i in range(n)]
    values = [f(x) for x in simplex]
    for _ in range(max_iter):
        order = np.argsort(values)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        if abs(values[-1] - values[0]) <= tol and np.max(np.abs(np.array(simplex[1:]) - simplex[0])) < 1e-9:
            break
        centroid = np.mean(simplex[:-1], axis=0)
        xr = centroid + (centroid - simplex[-1])
        fr = f(xr)
        if fr < values[0]:
            xe = centroid + 2.0 * (centroid - simplex[-1])
            fe = f(xe)
            simplex[-1], values[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = xr, fr
        else:
            outside = fr < values[-1]
            xc = centroid + 0.5 * ((xr if outside else simplex[-1]) - centroid)
            fc = f(xc)
            if fc < (fr if outside else values[-1]):
                simplex[-1], values[-1] = xc, fc
            else:
                best = simplex[0]
                simplex = [best] + [best + 0.5 * (x - best) for x in simplex[1:]]
                values = [values[0]] + [f(x) for x in simplex[1:]]
    return simplex[int(np.argmin(values))]


def minimise_box(f: Callable[[Sequence[float]], float], x0: Sequence[float],
                 bounds: Sequence[tuple[float, float]], grid: int = 9) -> tuple[list[float], float]:
    """Minimise f over a box: coarse grid (plus x0) for a start, then Nelder-Mead in logit space."""
    lo = np.array([b[0] for b in bounds], dtype=float)
    hi = np.array([b[1] for b in bounds], dtype=float)
    eps = 1e-9

    def to_x(z: np.ndarray) -> np.ndarray:
        return lo + (hi - lo) / (1.0 + np.exp(-np.clip(z, -40.0, 40.0)))

    def to_z(x: np.ndarray) -> np.ndarray:
        u = np.clip((np.asarray(x, dtype=float) - lo) / (hi - lo), eps, 1.0 - eps)
        return np.log(u / (1.0 - u))

    start = np.clip(np.asarray(x0, dtype=float), lo, hi)
    best_x, best_f = start, f(list(start))
    axes = [np.linspace(0.02, 0.98, grid) for _ in bounds]
    for u in (np.array(p) for p in np.array(np.meshgrid(*axes, indexing="ij")).reshape(len(bounds), -1).T):
        x = lo + (hi - lo) * u
        fx = f(list(x))
        if fx < best_f:
            best_x, best_f = x, fx
    z = _nelder_mead(lambda zz: f(list(to_x(zz))), to_z(best_x))
    x = to_x(z)
    fx = f(list(x))
    return (list(x), fx) if fx <= best_f else (list(best_x), best_f)


# ---------------------------------------------------------------------------------------------- fitting

Predictor = Callable[[ComputeParams, Mapping[str, Any], Device], float]


def _msle(params: ComputeParams, rows: Sequence[Mapping[str, Any]], predict: Predictor) -> float:
    err = [math.log(predict(params, r, r["_device"]) / r["_measured"]) for r in rows]
    return float(np.mean(np.square(err))) if err else 0.0


def _mape(pred: Sequence[float], meas: Sequence[float]) -> float | None:
    if not meas:
        return None
    return float(np.mean([abs(p - m) / m for p, m in zip(pred, meas, strict=True)]))


def _sensitivity(base: ComputeParams, name: str, rows: Sequence[Mapping[str, Any]], predict: Predictor) -> int:
    """Rows whose predicted time changes by more than MIN_SENSITIVITY (in log) between name/2 and name*2."""
    value = float(getattr(base, name))
    lo_b, hi_b = _BOUNDS[name]
    if value > 0:
        lo_v, hi_v = max(lo_b, value / 2.0), min(hi_b, value * 2.0)
    else:
        lo_v, hi_v = 0.0, _PROBE_WHEN_ZERO.get(name, 1.0)
    p_lo, p_hi = base.model_copy(update={name: lo_v}), base.model_copy(update={name: hi_v})
    count = 0
    for r in rows:
        a, b = predict(p_lo, r, r["_device"]), predict(p_hi, r, r["_device"])
        if abs(math.log(a / b)) > MIN_SENSITIVITY:
            count += 1
    return count


def _fit_block(base: ComputeParams, names: Sequence[str], rows: Sequence[Mapping[str, Any]],
               predict: Predictor, status: dict[str, str]) -> ComputeParams:
    """Fit the identifiable subset of `names` on `rows`; record each parameter's status."""
    if not rows:
        for nm in names:
            status.setdefault(nm, "no data: kept at base value")
        return base
    informed = []  # in priority order (the order of `names`)
    for nm in names:
        hits = _sensitivity(base, nm, rows, predict)
        if hits >= 2:
            informed.append(nm)
        else:
            status[nm] = (f"insufficient data: {hits} of {len(rows)} rows move by >{MIN_SENSITIVITY:.0%} in log "
                          f"time when it changes 4x; kept at base value")
    # rows the model cannot tell apart (same shape in fp16 and bf16, say) count once
    distinct = len({round(math.log(predict(base, r, r["_device"])), 9) for r in rows})
    while informed and len(informed) >= distinct:  # keep more distinct data points than parameters
        dropped = informed.pop()
        status[dropped] = (f"insufficient data: {distinct} distinct data point(s) for {len(informed) + 1} "
                           f"parameters; kept at base value")
    fit_names = informed
    if not fit_names:
        return base

    def objective(x: Sequence[float]) -> float:
        return _msle(base.model_copy(update=dict(zip(fit_names, x, strict=True))), rows, predict)

    x0 = [float(getattr(base, nm)) for nm in fit_names]
    grid = {1: 41, 2: 15, 3: 9}.get(len(fit_names), 7)
    x, _ = minimise_box(objective, x0, [_BOUNDS[nm] for nm in fit_names], grid=grid)
    for nm in fit_names:
        status[nm] = f"fitted on {len(rows)} rows"
    return base.model_copy(update={nm: float(v) for nm, v in zip(fit_names, x, strict=True)})


def _resolve_device(row: Mapping[str, Any], default: Device) -> tuple[Device | None, str]:
    name = str(row.get("device") or "").strip()
    if not name:
        return default, ""
    try:
        return get_device(name), ""
    except KeyError:
        return None, f"unknown device {name!r}"


def _prepare(rows: Iterable[Mapping[str, Any]], default: Device, measure: Callable,
             check: Callable[[dict[str, Any]], str]) -> list[dict[str, Any]]:
    """Copy rows, attach device / measured time, and a `_skip` reason where a row cannot be used at all."""
    out = []
    for raw in rows:
        r = dict(raw)
        r["_device"], reason = _resolve_device(r, default)
        if not reason:
            reason = check(r)
        if not reason and r["_device"] is not None and "dtype" in r:
            try:
                r["_device"].peak_flops(r["dtype"])
            except KeyError:
                reason = f"device {r['_device'].name} has no {r['dtype']} peak"
        r["_skip"] = reason
        r["_measured"] = measure(r) if not reason else None
        out.append(r)
    return out


def _gemm_check(r: Mapping[str, Any]) -> str:
    if r.get("tflops") is None or r["tflops"] <= 0:
        return "no positive tflops"
    if _gemm_shape(r) is None:
        return "shape not stated (best-case number only)"
    return ""


def _attention_check(r: Mapping[str, Any]) -> str:
    if r.get("tflops") is None or r["tflops"] <= 0:
        return "no positive tflops"
    if any(r.get(c) is None for c in ("batch", "heads", "seq_len", "head_dim")):
        return "shape not stated"
    if _direction(r) not in ("fwd", "bwd", "fwd_bwd"):
        return f"unknown direction {r.get('direction')!r}"
    return ""


def _memory_check(r: Mapping[str, Any]) -> str:
    if not r.get("bytes") or not r.get("gbps"):
        return "bytes and gbps must be positive"
    return ""


def _misaligned(r: Mapping[str, Any]) -> str:
    shape = _gemm_shape(r)
    align = _ALIGN_ELEMS.get(r["dtype"], 8)
    if shape and any(v % align for v in shape[:3]):
        return f"misaligned (m, n, k not all multiples of {align}): alignment penalties are not in the model"
    return ""


def _flash_generation(impl: str) -> tuple[int, str] | None:
    if not impl.lower().startswith("flash"):
        return None
    digits = re.findall(r"\d+", impl)
    return (int(digits[-1]) if digits else 1, impl)


def _row_report(r: Mapping[str, Any], before: ComputeParams, after: ComputeParams, predict: Predictor,
                keys: Sequence[str]) -> dict[str, Any]:
    rep: dict[str, Any] = {k: r.get(k) for k in keys}
    rep["file"] = r.get("file")
    rep["used"] = bool(r.get("_used"))
    rep["reason"] = r.get("_reason") or r.get("_skip") or ""
    if r.get("_skip"):
        return rep
    rep["measured_s"] = r["_measured"]
    rep["predicted_before_s"] = predict(before, r, r["_device"])
    rep["predicted_after_s"] = predict(after, r, r["_device"])
    return rep


def _section(rows: Sequence[Mapping[str, Any]], before: ComputeParams, after: ComputeParams,
             predict: Predictor, keys: Sequence[str]) -> dict[str, Any]:
    reports = [_row_report(r, before, after, predict, keys) for r in rows]
    used = [x for x in reports if x["used"]]
    priced = [x for x in reports if "measured_s" in x]
    return {
        "n_rows": len(rows), "n_used": len(used), "n_skipped": len(rows) - len(priced),
        "mape_before": _mape([x["predicted_before_s"] for x in used], [x["measured_s"] for x in used]),
        "mape_after": _mape([x["predicted_after_s"] for x in used], [x["measured_s"] for x in used]),
        "mape_before_all_priced": _mape([x["predicted_before_s"] for x in priced], [x["measured_s"] for x in priced]),
        "mape_after_all_priced": _mape([x["predicted_after_s"] for x in priced], [x["measured_s"] for x in priced]),
        "rows": reports,
    }


def fit_compute_params(base: ComputeParams, gemm_rows: Iterable[Mapping[str, Any]],
                       attention_rows: Iterable[Mapping[str, Any]], memory_rows: Iterable[Mapping[str, Any]],
                       device: Device, *, gemm_dtypes: Collection[str] | None = DEFAULT_GEMM_DTYPES,
                       attention_impls: Collection[str] | None = None, exclude_misaligned: bool = True,
                       min_time_s: float = MIN_TIME_S) -> tuple[ComputeParams, dict[str, Any]]:
    """Fit one device family's ComputeParams to measurement rows; returns the params and a report.

    `device` prices rows that name no device (rows naming one use their own). `gemm_dtypes` chooses the GEMM
    rows the GEMM parameters are fitted on (None = all); `attention_impls` the attention implementations
    (None = the newest flash generation present). Rows whose measured time is below `min_time_s` are priced
    but not fitted: at a few microseconds launch and framework dispatch, which these parameters do not
    describe, dominate (host-timed loops of tiny GEMMs measure the CPU, not the GPU). The report holds, per section, every row's measured and
    predicted (before/after) time, the MAPE before/after over the rows used, and each parameter's status."""
    status: dict[str, str] = {}
    mem = _prepare(memory_rows, device, measured_memory_time, _memory_check)
    gemm = _prepare(gemm_rows, device, measured_gemm_time, _gemm_check)
    attn = _prepare(attention_rows, device, measured_attention_time, _attention_check)

    # memory -> hbm_efficiency
    def too_short(r: Mapping[str, Any]) -> str:
        if r["_measured"] < min_time_s:
            return (f"measured time {r['_measured'] * 1e6:.1f} us < {min_time_s * 1e6:.0f} us: dominated by "
                    f"launch/dispatch overhead")
        return ""

    for r in mem:
        r["_reason"] = r["_skip"] or too_short(r)
        r["_used"] = not r["_reason"]
    params = _fit_block(base, ["hbm_efficiency"], [r for r in mem if r["_used"]], predict_memory, status)

    # GEMM -> gemm_peak_fraction, k_half (+ small_mn_half when the model uses it)
    wanted = None if gemm_dtypes is None else {_dtype(d) for d in gemm_dtypes}
    for r in gemm:
        reason = r["_skip"]
        if not reason and wanted is not None and r["dtype"] not in wanted:
            reason = f"dtype {r['dtype']} not among the fitted dtypes {sorted(wanted)}"
        if not reason and exclude_misaligned:
            reason = _misaligned(r)
        if not reason:
            reason = too_short(r)
        r["_used"], r["_reason"] = not reason, reason
    gemm_names = ["gemm_peak_fraction", "k_half"]
    if model_uses("small_mn_half", base, device):
        gemm_names.append("small_mn_half")
    else:
        status["small_mn_half"] = "not used by RooflineCompute.gemm_efficiency: kept at base value"
    params = _fit_block(params, gemm_names, [r for r in gemm if r["_used"]], predict_gemm, status)

    # attention -> shape constants and flash fractions on the reference kernel, then the other kernels' speeds
    if attention_impls is not None:
        chosen = {str(i) for i in attention_impls}
    else:
        fused = [str(r.get("impl", "")) for r in attn if not r["_skip"] and attention_kernel(str(r.get("impl", "")))]
        fa2 = {i for i in fused if attention_kernel(i) == "flash"}
        gens = [g for g in (_flash_generation(i) for i in fused) if g]
        chosen = fa2 or ({max(gens)[1]} if gens else set())
    for r in attn:
        reason = r["_skip"]
        if not reason and str(r.get("impl", "")) not in chosen:
            reason = (f"impl {r.get('impl')!r} not fitted (fitting {sorted(chosen)})" if chosen
                      else "no flash implementation among the rows")
        if not reason:
            reason = too_short(r)
        r["_used"], r["_reason"] = not reason, reason
    used_attn = [r for r in attn if r["_used"]]
    names = []
    if any(_direction(r) in ("fwd", "fwd_bwd") for r in used_attn):
        names.append("flash_fraction_fwd")
    else:
        status["flash_fraction_fwd"] = "no data: kept at base value"
    if any(_direction(r) in ("bwd", "fwd_bwd") for r in used_attn):
        names.append("flash_fraction_bwd")
    else:
        status["flash_fraction_bwd"] = "no data: kept at base value"
    # level first (so the shape does not absorb it), then the shape, then the level again
    params = _fit_block(params, names, used_attn, predict_attention, status)
    params = _fit_block(params, list(ATTENTION_SHAPE), used_attn, predict_attention, status)
    params = _fit_block(params, names, used_attn, predict_attention, status)
    params, kernel_fit = _fit_kernel_speeds(params, attn, chosen, too_short)

    params, dtype_fit = _fit_dtype_fractions(params, gemm, wanted, exclude_misaligned, too_short)

    fitted_names = ["gemm_peak_fraction", "k_half", "small_mn_half", "flash_fraction_fwd", "flash_fraction_bwd",
                    *ATTENTION_SHAPE, "hbm_efficiency"]
    dtype_bias: dict[str, dict[str, float]] = {}
    for dt in sorted({r["dtype"] for r in gemm if not r["_skip"]}):
        ratios = [r["_measured"] / predict_gemm(params, r, r["_device"]) for r in gemm
                  if not r["_skip"] and r["dtype"] == dt]
        dtype_bias[dt] = {"n": len(ratios), "measured_over_predicted_geomean": float(np.exp(np.mean(np.log(ratios))))}
    warnings = []
    for section, rows_, keys in (("GEMM", gemm, ("m", "n", "k", "batch")),
                                 ("attention", attn, ("batch", "heads", "seq_len", "head_dim", "causal")),
                                 ("memory", mem, ("bytes",))):
        used_rows = [r for r in rows_ if r["_used"]]
        shapes = {tuple(r.get(k) for k in keys) for r in used_rows}
        if used_rows and len(shapes) <= 2:
            warnings.append(f"{section} fit rests on {len(used_rows)} row(s) of {len(shapes)} distinct shape(s)")
    report = {
        "device": device.name,
        "warnings": warnings,
        "params": {nm: {"base": float(getattr(base, nm)), "value": float(getattr(params, nm)),
                        "status": status.get(nm, "kept at base value")} for nm in fitted_names},
        "gemm": _section(gemm, base, params, predict_gemm, ("device", "dtype", "m", "n", "k", "batch", "tflops")),
        "attention": _section(attn, base, params, predict_attention,
                              ("device", "dtype", "impl", "batch", "heads", "seq_len", "head_dim", "causal",
                               "direction", "tflops")),
        "memory": _section(mem, base, params, predict_memory, ("device", "op", "bytes", "gbps")),
        "attention_impls": sorted(chosen),
        "gemm_dtypes": None if wanted is None else sorted(wanted),
        "gemm_dtype_bias_after": dtype_bias,
        "dtype_gemm_fraction": dtype_fit,
        "attention_kernel_speed": kernel_fit,
    }
    return params, report


def _fit_kernel_speeds(params: ComputeParams, attn: Sequence[dict[str, Any]], reference: Collection[str],
                       too_short: Callable[[Mapping[str, Any]], str]) -> tuple[ComputeParams, dict[str, Any]]:
    """Each fused kernel outside the reference gets one speed factor: the geometric mean of predicted (at the
    reference kernel's speed) over measured time of its rows, which is exact when every row is compute-bound."""
    speeds = dict(params.attention_kernel_speed)
    out: dict[str, Any] = {}
    ref = {attention_kernel(i) for i in reference}
    by_kernel: dict[str, list[dict[str, Any]]] = {}
    for r in attn:
        kernel = attention_kernel(str(r.get("impl", "")))
        if kernel and kernel not in ref and not r["_skip"] and not too_short(r):
            by_kernel.setdefault(kernel, []).append(r)
    for kernel, rows in sorted(by_kernel.items()):
        trial = params.model_copy(update={"attention_kernel_speed": {**speeds, kernel: 1.0}})
        logs = [math.log(predict_attention(trial, r, r["_device"]) / r["_measured"]) for r in rows]
        speeds[kernel] = round(float(np.exp(np.mean(logs))), 4)
        out[kernel] = {"n": len(rows), "status": f"fitted: {speeds[kernel]}"}
        for r in rows:
            r["_used"], r["_reason"] = True, f"fits attention_kernel_speed[{kernel}]"
    return params.model_copy(update={"attention_kernel_speed": speeds}), out


def _fit_dtype_fractions(params: ComputeParams, gemm: Sequence[dict[str, Any]], wanted: Collection[str] | None,
                         exclude_misaligned: bool, too_short: Callable[[Mapping[str, Any]], str]
                         ) -> tuple[ComputeParams, dict[str, Any]]:
    """A dtype outside the fitted ones (fp32 SIMT SGEMM, tf32) gets its own peak fraction when it has
    MIN_DTYPE_ROWS usable rows: the shape terms stay shared, only the share of that dtype's peak differs.
    Fixed point of f <- f x geomean(predicted / measured), which is exact for compute-bound rows."""
    out: dict[str, Any] = {}
    if wanted is None:  # every dtype went into the shared fit
        return params, out
    fractions = dict(params.dtype_gemm_fraction)
    for dt in sorted({r["dtype"] for r in gemm if not r["_skip"]} - set(wanted)):
        rows = [r for r in gemm if not r["_skip"] and r["dtype"] == dt
                and not (exclude_misaligned and _misaligned(r)) and not too_short(r)]
        if len(rows) < MIN_DTYPE_ROWS:
            out[dt] = {"n": len(rows), "status": f"kept: {len(rows)} usable row(s) < {MIN_DTYPE_ROWS}"}
            continue
        frac = fractions.get(dt, params.gemm_peak_fraction)
        for _ in range(8):
            trial = params.model_copy(update={"dtype_gemm_fraction": {**fractions, dt: frac}})
            ratio = float(np.exp(np.mean([math.log(predict_gemm(trial, r, r["_device"]) / r["_measured"])
                                          for r in rows])))
            frac = min(1.0, frac * ratio)
        fractions[dt] = round(frac, 4)
        out[dt] = {"n": len(rows), "status": f"fitted: {fractions[dt]}"}
        for r in rows:
            r["_used"], r["_reason"] = True, f"fits dtype_gemm_fraction[{dt}]"
    return params.model_copy(update={"dtype_gemm_fraction": fractions}), out


def _family_of(row: Mapping[str, Any]) -> str | None:
    try:
        return device_family(get_device(str(row.get("device") or "")))
    except KeyError:
        return None


def _counts(rows: Sequence[Mapping[str, Any]]) -> str:
    c = Counter(r.get("file", "?") for r in rows)
    return ", ".join(f"{f} x{n}" for f, n in sorted(c.items())) or "none"


def fit_all(cal: Calibration, measurement_dir: str | Path | None = None, **options: Any
            ) -> tuple[Calibration, dict[str, Any]]:
    """Fit every device family present in the CSVs of `measurement_dir` (default: the packaged ones).

    Each family starts from its existing calibration entry (else 'default'); the returned Calibration has a
    `compute[family]` entry per fitted family whose `source` names the files and row counts. `options` go to
    `fit_compute_params`. The report maps family -> that family's fit report, plus 'unknown_devices'."""
    directory = Path(measurement_dir) if measurement_dir is not None else packaged_measurement_dir()
    data = load_measurement_dir(directory)
    by_family: dict[str, dict[str, list[dict[str, Any]]]] = {}
    unknown: list[str] = []
    for kind, rows in data.items():
        for r in rows:
            fam = _family_of(r)
            if fam is None:
                unknown.append(f"{r.get('file')}: {r.get('device')!r}")
                continue
            by_family.setdefault(fam, {"gemm": [], "attention": [], "memory": []})[kind].append(r)
    compute = dict(cal.compute)
    report: dict[str, Any] = {"measurement_dir": str(directory), "families": {}, "unknown_devices": unknown}
    for fam in sorted(by_family):
        rows = by_family[fam]
        base = cal.compute.get(fam) or cal.compute["default"]
        names = Counter(r["device"] for kind_rows in rows.values() for r in kind_rows)
        device = get_device(names.most_common(1)[0][0])
        params, rep = fit_compute_params(base, rows["gemm"], rows["attention"], rows["memory"], device, **options)
        fitted = [nm for nm, p in rep["params"].items() if p["status"].startswith("fitted")]
        kept = [nm for nm in rep["params"] if nm not in fitted]
        origin = f"family '{fam}' entry" if fam in cal.compute else "'default' entry"
        source = (f"fit_compute.fit_all on {directory.name}/: GEMM {len(rows['gemm'])} rows "
                  f"({_counts(rows['gemm'])}; {rep['gemm']['n_used']} used), attention {len(rows['attention'])} "
                  f"rows ({_counts(rows['attention'])}; {rep['attention']['n_used']} used), memory "
                  f"{len(rows['memory'])} rows ({_counts(rows['memory'])}; {rep['memory']['n_used']} used); "
                  f"fitted {', '.join(fitted) or 'nothing'}; kept from the {origin}: {', '.join(kept)} "
                  f"[base source: {base.source or 'none'}]; each row's source is in the CSV")
        compute[fam] = params.model_copy(update={"source": source})
        report["families"][fam] = rep
    new_cal = Calibration.model_validate({**cal.model_dump(), "compute": {k: v.model_dump()
                                                                          for k, v in compute.items()}})
    return new_cal, report
