"""Kineto trace parse speed: every shared trace (../shared/traces), then a ~100 MB synthetic trace made by
replicating a real one's events with shifted timestamps (in a temporary directory).

    .venv/bin/python benchmarks/kineto_parse.py [--target-mb 100] [--json-lib orjson|json]

Prints, per file: MB (JSON text after gunzip, and on disk), events, parse seconds and MB/s of JSON text.
"""

from __future__ import annotations

import argparse
import builtins
import copy
import gzip
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from trainsim.files import MAX_TRACE_BYTES, gunzip_bounded, parse_json_bytes
from trainsim.trace.kineto import read_kineto

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
SEED = "HolisticTraceAnalysis/tests/data/negative_queue_length_values_check/rank0.json.gz"


def _time(path: Path) -> tuple[float, Any]:  # noqa: ANN401
    t0 = time.perf_counter()
    tr = read_kineto(path)
    return time.perf_counter() - t0, tr


def _row(label: str, seconds: float, tr: Any) -> None:  # noqa: ANN401
    mb, disk = tr.json_bytes / 1e6, tr.file_bytes / 1e6
    print(f"{label:<58} {mb:8.1f} {disk:8.2f} {tr.n_events:>10,} {seconds:8.3f} {mb / seconds:8.1f}")


def _synthetic(seed: Path, target_mb: float, out: Path) -> Path:
    """Replicate `seed`'s events (ts shifted by the trace span, ids offset) until the JSON passes target_mb."""
    raw = seed.read_bytes()
    raw = gunzip_bounded(raw, str(seed), max_bytes=MAX_TRACE_BYTES) if raw[:2] == b"\x1f\x8b" else raw
    doc = parse_json_bytes(raw, str(seed), str(seed))
    base = [e for e in doc["traceEvents"] if e.get("ph") != "M"]
    meta = [e for e in doc["traceEvents"] if e.get("ph") == "M"]
    ts = [e["ts"] for e in base if isinstance(e.get("ts"), int | float)]
    span = max(ts) - min(ts) + 1000.0
    copies = max(1, math.ceil(target_mb * 1e6 / (0.9 * len(raw))))  # re-dumped JSON is ~10% denser
    events = list(meta)
    for k in range(copies):
        for e in base:
            c = copy.copy(e)
            if isinstance(c.get("ts"), int | float):
                c["ts"] = c["ts"] + k * span
            if k and isinstance(c.get("args"), dict) and "correlation" in c["args"]:
                c["args"] = dict(c["args"], correlation=c["args"]["correlation"] + k * 10**9)
            if k and c.get("ph") in ("s", "f") and isinstance(c.get("id"), int):
                c["id"] = c["id"] + k * 10**9
            name = c.get("name")
            if k and isinstance(name, str) and name.startswith("ProfilerStep#"):
                c["name"] = f"ProfilerStep#{int(name[13:]) + k * 1000}"
            events.append(c)
    doc = dict(doc, traceEvents=events)
    path = out / "synthetic.json"
    path.write_text(json.dumps(doc))
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target-mb", type=float, default=100.0)
    ap.add_argument("--json-lib", choices=["orjson", "json"], default="orjson",
                    help="json: hide orjson to time the standard-library fallback")
    args = ap.parse_args()
    if args.json_lib == "json":
        real_import = builtins.__import__

        def no_orjson(name: str, *a: Any, **k: Any) -> Any:  # noqa: ANN401
            if name == "orjson":
                raise ImportError(name)
            return real_import(name, *a, **k)

        builtins.__import__ = no_orjson
    try:
        import orjson  # noqa: F401
        lib = "orjson"
    except ImportError:
        lib = "json (orjson not installed)"
    print(f"JSON parser: {lib}")
    print(f"{'file':<58} {'MB json':>8} {'MB disk':>8} {'events':>10} {'seconds':>8} {'MB/s':>8}")
    if not TRACES.is_dir():
        print(f"skipped: {TRACES} is absent")
        return 0
    total_mb = total_s = 0.0
    for p in sorted(TRACES.rglob("*.json.gz")):
        seconds, tr = _time(p)
        total_mb, total_s = total_mb + tr.json_bytes / 1e6, total_s + seconds
        _row(str(p.relative_to(TRACES))[-58:], seconds, tr)
    print(f"{'all shared traces':<58} {total_mb:8.1f} {'':>8} {'':>10} {total_s:8.3f} {total_mb / total_s:8.1f}")
    seed = TRACES / SEED
    if seed.is_file():
        with tempfile.TemporaryDirectory() as tmp:
            path = _synthetic(seed, args.target_mb, Path(tmp))
            seconds, tr = _time(path)
            _row(f"synthetic ({path.stat().st_size / 1e6:.0f} MB, from rank0.json.gz)", seconds, tr)
            gz = Path(tmp) / "synthetic.json.gz"
            gz.write_bytes(gzip.compress(path.read_bytes(), compresslevel=1))
            seconds, tr = _time(gz)
            _row("synthetic, gzipped", seconds, tr)
            print(f"synthetic trace: {len(tr.gpu):,} GPU ops, {len(tr.cpu):,} CPU ops, {len(tr.steps())} steps")
            from trainsim.replay import replay

            t0 = time.perf_counter()
            r = replay([path])
            total = time.perf_counter() - t0
            mb = path.stat().st_size / 1e6
            print(f"parse + build + replay of the {mb:.0f} MB trace: {total:.2f} s ({r.parse_s:.2f} parse, "
                  f"{r.build_s:.2f} build, {r.replay_s:.2f} replay; {total / mb * 1e3:.1f} ms/MB; "
                  f"{r.n_tasks:,} tasks; replay error {r.replay_error_pct:.3f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
