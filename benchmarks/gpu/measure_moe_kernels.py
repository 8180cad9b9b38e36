"""Measure, on one Hopper GPU, the kernels and the layers trainsim prices for the MoE models of issue 23.

Writes CSVs to OUT_DIR (every row says how it was measured in the file's header comment):
  gemm.csv            dense GEMMs at the MoE models' shapes, BF16 and FP8 (per-tensor scaled), in the
                      columns of trainsim/data/measurements/gemm_published.csv (without its '#' header lines,
                      `trainsim calibrate` reads it; the packaged fit does not)
  grouped_gemm.csv    the experts' grouped GEMMs (forward, dgrad, wgrad of fc1 and fc2) at 64..4096 tokens per
                      expert: torch._grouped_mm (CUTLASS grouped kernel), torch.bmm (cuBLAS strided batched),
                      a loop of torch.mm (one cuBLAS kernel per expert), FP8 torch._scaled_grouped_mm
  attention.csv       scaled_dot_product_attention per backend at the models' head shapes, in the columns of
                      attention_published.csv
  moe_layer.csv       one transformer layer (attention + routed experts as one expert-parallel rank sees them)
                      forward + backward in eager PyTorch: wall time, GPU kernel time and kernel count
  moe_layer_kernels.csv  that layer's GPU time by kernel class (moe_layer_traces.tar.gz: its Kineto traces)
  launch.csv          eager PyTorch's host time per launched kernel on this machine
  mamba_ssd.csv       Mamba2's SSD scan (mamba_ssm's Triton kernels; section `mamba`, needs MAMBA_SSM_PATH)
Timing: CUDA events (triton.testing.do_bench, median, L2 flushed between calls) for kernels; the layer's wall
time is the median of host-clock iterations with a synchronise after each; its kernel time is torch.profiler's
sum of kernel durations. Inputs are random normal (never zeros).
Run: python benchmarks/gpu/measure_moe_kernels.py OUT_DIR [--smoke]   (--smoke: tiny shapes, any device)
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from pathlib import Path

# (name, hidden, q heads, kv heads, head dim, routed experts, top-k, expert ffn, gated, local experts, seq)
# local experts = experts / EP of the recipes measured in moe_runs.csv (EP 8, or 32 / 64 for the big ones)
MODELS = [
    ("qwen3-30b-a3b", 2048, 32, 4, 128, 128, 8, 768, True, 16, 4096),
    ("gpt-oss-120b", 2880, 64, 8, 64, 128, 4, 2880, True, 16, 4096),
    ("qwen3-235b-a22b", 4096, 64, 4, 128, 128, 8, 1536, True, 4, 4096),
    ("deepseek-v3", 7168, 128, 128, 128, 256, 8, 2048, True, 4, 4096),
    ("nemotron-3-nano", 2688, 32, 2, 128, 128, 6, 1856, False, 16, 8192),
]
TOKENS_PER_EXPERT = [64, 128, 256, 512, 1024, 2048, 4096]
SMOKE_MODELS = [("tiny", 64, 4, 2, 16, 8, 2, 32, True, 4, 64), ("tiny-relu2", 64, 4, 2, 16, 8, 2, 32, False, 4, 64)]


def models(smoke: bool) -> list[tuple]:
    """The measured models, or tiny stand-ins for a smoke run."""
    return SMOKE_MODELS if smoke else MODELS


class Bench:
    """Times a callable on the device: CUDA events via triton's do_bench where there is a GPU, else host clock."""

    def __init__(self, torch, device: str, smoke: bool) -> None:
        self.torch, self.device, self.smoke = torch, device, smoke
        self.cuda = device == "cuda"

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def time_us(self, fn) -> float:
        if self.cuda:
            from triton.testing import do_bench
            return float(do_bench(fn, warmup=5, rep=15, return_mode="median")) * 1e3
        fn()
        t0 = time.perf_counter()
        for _ in range(3):
            fn()
        return (time.perf_counter() - t0) / 3 * 1e6


def _writer(out: Path, name: str, header: str, columns: list[str]):
    f = (out / name).open("w", newline="")
    for line in header.strip().splitlines():
        f.write(f"# {line}\n")
    w = csv.writer(f)
    w.writerow(columns)
    return f, w


def ceilings(torch, bench: Bench, out: Path, info: dict) -> None:
    n = (1 << 18) if bench.smoke else (1 << 30)
    a = torch.empty(n, dtype=torch.uint8, device=bench.device).random_()
    b = torch.empty_like(a)
    t = bench.time_us(lambda: b.copy_(a))
    info["copy_gbps_read_plus_write"] = 2 * n / t / 1e3
    s = 256 if bench.smoke else 8192
    x = torch.randn(s, s, device=bench.device, dtype=torch.bfloat16)
    y = torch.randn(s, s, device=bench.device, dtype=torch.bfloat16)
    t = bench.time_us(lambda: x @ y)
    info["bf16_8192_tflops"] = 2 * s**3 / t / 1e6


def dense_gemms(torch, bench: Bench, out: Path, device_name: str, info: dict) -> None:
    f, w = _writer(out, "gemm.csv", f"""
dense GEMMs on {device_name}, {info['versions']}; torch.mm (BF16) and torch._scaled_mm (FP8 e4m3, per-tensor
scales, BF16 out); A row-major (m x k), B column-major (k x n) as a weight's forward; random normal inputs;
CUDA events via triton.testing.do_bench (median, L2 flushed between calls); tflops = 2mnk / time""",
                   ["device", "dtype", "m", "n", "k", "batch", "tflops", "source", "notes"])
    shapes = set()
    for name, h, qh, kvh, hd, e, _k, ffn, gated, _local, _seq in models(bench.smoke):
        qkv = (qh + 2 * kvh) * hd
        for m in ([64, 256] if bench.smoke else [1024, 4096, 8192, 16384]):
            for n, kk in [(qkv, h), (h, qh * hd), (e, h), (2 * ffn if gated else ffn, h), (h, ffn)]:
                shapes.add((m, n, kk, name))
            if not bench.smoke:
                shapes.add((h, 2 * ffn if gated else ffn, m, name + " wgrad"))  # a weight gradient: K = tokens
    if not bench.smoke:
        for s in (1024, 2048, 4096, 8192):
            shapes.add((s, s, s, "square"))
    dev = bench.device
    fp8 = getattr(torch, "float8_e4m3fn", None)
    for m, n, k, why in sorted(shapes):
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        b = torch.randn(n, k, device=dev, dtype=torch.bfloat16).t()
        t = bench.time_us(lambda a=a, b=b: torch.mm(a, b))
        w.writerow([device_name, "bf16", m, n, k, 1, f"{2 * m * n * k / t / 1e6:.2f}", "trainsim GPU run", why])
        if fp8 is not None and bench.cuda and k % 16 == 0 and n % 16 == 0:
            a8, b8 = a.to(fp8), b.t().contiguous().to(fp8).t()
            one = torch.ones((), device=dev, dtype=torch.float32)
            try:
                t = bench.time_us(lambda a8=a8, b8=b8, one=one: torch._scaled_mm(
                    a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
                w.writerow([device_name, "fp8", m, n, k, 1, f"{2 * m * n * k / t / 1e6:.2f}", "trainsim GPU run",
                            why + "; torch._scaled_mm per-tensor"])
            except Exception as exc:  # noqa: BLE001 - record what the build lacks, go on
                print(f"fp8 mm {m}x{n}x{k}: {exc!s:.120}", file=sys.stderr)
    f.close()


def grouped_gemms(torch, bench: Bench, out: Path, device_name: str, info: dict) -> None:
    f, w = _writer(out, "grouped_gemm.csv", f"""
the experts' GEMMs of one expert-parallel rank on {device_name}, {info['versions']}: `groups` experts with
`m_per_group` tokens each (balanced routing); pass fwd: X (G*m x K) W_g (K x N); dgrad: dY W_g^T; wgrad: dW_g =
X_g^T dY_g (K = tokens); impl grouped_mm = torch._grouped_mm (2d x 3d with offsets, wgrad 2d x 2d with offsets),
bmm = torch.bmm over (G, m, K), loop = one torch.mm per expert, fp8_grouped = torch._scaled_grouped_mm
(row-wise scales); time = CUDA events via triton.testing.do_bench (median); tflops = 2 G m n k / time""",
                   ["model", "gemm", "pass", "impl", "groups", "m_per_group", "m", "n", "k", "time_us", "tflops"])
    dev = bench.device
    fp8 = getattr(torch, "float8_e4m3fn", None)
    tokens = [64, 128] if bench.smoke else TOKENS_PER_EXPERT
    for name, h, _qh, _kvh, _hd, _e, _k, ffn, gated, local, _seq in models(bench.smoke):
        f1 = 2 * ffn if gated else ffn
        for tpe in tokens:
            offs = torch.arange(1, local + 1, device=dev, dtype=torch.int32) * tpe
            for gemm, kin, nout in (("fc1", h, f1), ("fc2", ffn, h)):
                for phase in ("fwd", "dgrad", "wgrad"):
                    if phase == "fwd":
                        m, n, k = tpe, nout, kin
                    elif phase == "dgrad":
                        m, n, k = tpe, kin, nout
                    else:
                        m, n, k = kin, nout, tpe  # per expert: (kin x tokens) @ (tokens x nout)
                    flops = 2.0 * local * m * n * k
                    cases = {}
                    if phase == "wgrad":
                        xa = torch.randn(kin, local * tpe, device=dev, dtype=torch.bfloat16)  # X^T, tokens contiguous
                        gb = torch.randn(nout, local * tpe, device=dev, dtype=torch.bfloat16).t()
                        cases["grouped_mm"] = lambda xa=xa, gb=gb, o=offs: torch._grouped_mm(xa, gb, offs=o)
                        a3 = torch.randn(local, kin, tpe, device=dev, dtype=torch.bfloat16)
                        b3 = torch.randn(local, tpe, nout, device=dev, dtype=torch.bfloat16)
                    else:
                        xa = torch.randn(local * tpe, k, device=dev, dtype=torch.bfloat16)
                        wb = torch.randn(local, n, k, device=dev, dtype=torch.bfloat16).transpose(-2, -1)
                        cases["grouped_mm"] = lambda xa=xa, wb=wb, o=offs: torch._grouped_mm(xa, wb, offs=o)
                        a3 = xa.view(local, tpe, k)
                        b3 = wb
                        if fp8 is not None and bench.cuda and phase == "fwd":
                            xa8 = xa.to(fp8)
                            wb8 = wb.transpose(-2, -1).contiguous().to(fp8).transpose(-2, -1)
                            sa = torch.ones(local * tpe, device=dev, dtype=torch.float32)
                            sb = torch.ones(local, n, device=dev, dtype=torch.float32)
                            cases["fp8_grouped"] = lambda xa8=xa8, wb8=wb8, sa=sa, sb=sb, o=offs: (
                                torch._scaled_grouped_mm(xa8, wb8, sa, sb, offs=o, out_dtype=torch.bfloat16))
                    cases["bmm"] = lambda a3=a3, b3=b3: torch.bmm(a3, b3)
                    cases["loop"] = lambda a3=a3, b3=b3, n=local: [torch.mm(a3[g], b3[g]) for g in range(n)]
                    for impl, fn in cases.items():
                        try:
                            t = bench.time_us(fn)
                        except Exception as exc:  # noqa: BLE001 - record what the build lacks, go on
                            print(f"{impl} {name} {gemm} {phase} {tpe}: {exc!s:.160}", file=sys.stderr)
                            continue
                        w.writerow([name, gemm, phase, impl, local, tpe, m, n, k, f"{t:.2f}",
                                    f"{flops / t / 1e6:.2f}"])
    f.close()


def attention(torch, bench: Bench, out: Path, device_name: str, info: dict) -> None:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    f, w = _writer(out, "attention.csv", f"""
torch.nn.functional.scaled_dot_product_attention per backend on {device_name}, {info['versions']}; K and V
repeated to the query heads outside the timing (GQA); random normal BF16; fwd = forward alone, bwd = forward +
backward minus forward; CUDA events via triton.testing.do_bench (median); FLOPs counted as 4 B H S^2 D forward
(halved when causal; D = the query/key head dim), backward 2.5x forward (FlashAttention's convention)""",
                   ["device", "dtype", "impl", "batch", "heads", "seq_len", "head_dim", "causal", "direction",
                    "tflops", "source", "notes"])
    dev = bench.device
    backends = {"flash2_sdpa": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    shapes = [(name, qh, hd, hd, seq) for name, _h, qh, _kv, hd, *_r, seq in models(bench.smoke)]
    if not bench.smoke:
        shapes += [("deepseek-v3 mla (tp 1)", 128, 192, 128, 4096), ("head dim 128 (8k)", 32, 128, 128, 8192),
                   ("head dim 64 (2k)", 32, 64, 64, 2048)]
    for why, heads, dqk, dv, seq in shapes:
        b = 1
        q = torch.randn(b, heads, seq, dqk, device=dev, dtype=torch.bfloat16, requires_grad=True)
        kk = torch.randn(b, heads, seq, dqk, device=dev, dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(b, heads, seq, dv, device=dev, dtype=torch.bfloat16, requires_grad=True)
        g = torch.randn(b, heads, seq, dv, device=dev, dtype=torch.bfloat16)
        flops = 4.0 * b * heads * seq * seq * dqk / 2  # causal
        for impl, backend in backends.items():
            if not bench.cuda and impl != "efficient":
                continue
            try:
                with sdpa_kernel([backend]):
                    fwd = lambda q=q, kk=kk, v=v: F.scaled_dot_product_attention(q, kk, v, is_causal=True)  # noqa: E731
                    both = lambda fwd=fwd, g=g: fwd().backward(g)  # noqa: E731
                    t_f = bench.time_us(fwd)
                    t_b = bench.time_us(both) - t_f
            except Exception as exc:  # noqa: BLE001 - record what the build lacks, go on
                print(f"attention {impl} {why}: {exc!s:.160}", file=sys.stderr)
                continue
            note = why + (f"; value head dim {dv}" if dv != dqk else "")
            for direction, t, fl in (("fwd", t_f, flops), ("bwd", t_b, 2.5 * flops)):
                w.writerow([device_name, "bf16", impl, b, heads, seq, dqk, "true", direction,
                            f"{fl / t / 1e6:.2f}", "trainsim GPU run", note])
    f.close()


def launch_cost(torch, bench: Bench, out: Path, info: dict) -> None:
    f, w = _writer(out, "launch.csv", f"""
eager PyTorch host time per kernel launch ({info['versions']}): N launches of a small op queued without a
synchronise (the GPU keeps up), host clock; median of 5 runs""", ["op", "launches", "host_us_per_launch"])
    x = torch.randn(1024, device=bench.device)
    a = torch.randn(64, 64, device=bench.device)
    for op, fn in (("add_", lambda: x.add_(1.0)), ("mm 64", lambda: torch.mm(a, a)),
                   ("index_select", lambda: x.index_select(0, torch.arange(16, device=bench.device)))):
        runs = []
        for _ in range(5):
            bench.sync()
            t0 = time.perf_counter()
            for _ in range(2000):
                fn()
            runs.append((time.perf_counter() - t0) / 2000 * 1e6)
            bench.sync()
        w.writerow([op, 2000, f"{statistics.median(runs):.2f}"])
    f.close()


def moe_layer(torch, bench: Bench, out: Path, device_name: str, info: dict) -> None:
    """One layer as an expert-parallel rank runs it (attention on its micro-batch, its local experts on the
    tokens routed to them), forward and backward, eager."""
    import torch.nn.functional as F
    f, w = _writer(out, "moe_layer.csv", f"""
one transformer layer of each model as one expert-parallel rank runs it on {device_name}, {info['versions']}:
RMSNorm, QKV projection (+ QK RMSNorm), causal SDPA (default backend; gpt-oss's window and sinks not modelled),
output projection, residual; RMSNorm, router GEMM over all experts, softmax, top-k, the routed tokens gathered
twice (Megatron's permute and its sort by local expert), the local experts' grouped GEMMs (torch._grouped_mm)
with SwiGLU (squared ReLU for Nemotron), gathered back, weighted by the router's probabilities, summed per token
(index_add); balanced routing: seq*top_k rows over `local` experts, as an EP = experts/local rank receives them;
no communication. Forward + backward of one micro-batch of `seq` tokens; wall_ms = median of 10 host-clock
iterations (synchronised), gpu_ms = sum of kernel durations per iteration (torch.profiler), kernels = launches
per iteration""", ["model", "seq", "hidden", "local_experts", "tokens_per_expert", "wall_ms", "gpu_ms",
                  "kernels", "fwd_wall_ms"])
    fk, wk = _writer(out, "moe_layer_kernels.csv", "GPU time per iteration by kernel class (see moe_layer.csv)",
                     ["model", "kernel_class", "count", "gpu_ms"])
    dev = bench.device
    traces = []
    for name, h, qh, kvh, hd, e, k, ffn, gated, local, seq in models(bench.smoke):
        if name == "deepseek-v3":
            continue  # MLA: its attention is measured in attention.csv
        dt = torch.bfloat16
        p = lambda *s, dt=dt: torch.nn.Parameter(torch.randn(*s, device=dev, dtype=dt) * 0.02)  # noqa: E731
        wqkv, wo = p((qh + 2 * kvh) * hd, h), p(h, qh * hd)
        wr = p(e, h)
        f1 = 2 * ffn if gated else ffn
        w1, w2 = p(local, f1, h), p(local, h, ffn)
        n1, n2, qn, kn = (torch.nn.Parameter(torch.ones(d, device=dev, dtype=dt)) for d in (h, h, hd, hd))
        rows = seq * k
        tpe = rows // local
        offs = torch.arange(1, local + 1, device=dev, dtype=torch.int32) * tpe
        gen = torch.Generator(device="cpu").manual_seed(0)
        perm = torch.randperm(rows, generator=gen).to(dev)  # which (token, choice) lands at each local row
        sort2 = torch.randperm(rows, generator=gen).to(dev)  # Megatron's sort of received chunks by expert
        unsort2 = torch.argsort(sort2)
        x = torch.randn(1, seq, h, device=dev, dtype=dt, requires_grad=True)
        grad = torch.randn(1, seq, h, device=dev, dtype=dt)

        def step(x=x, wqkv=wqkv, wo=wo, wr=wr, w1=w1, w2=w2, n1=n1, n2=n2, qn=qn, kn=kn, perm=perm, sort2=sort2,
                 unsort2=unsort2, offs=offs, qh=qh, kvh=kvh, hd=hd, k=k, seq=seq, h=h, ffn=ffn, gated=gated):
            y = F.rms_norm(x, (h,), n1)
            qkv = (y @ wqkv.t()).view(1, seq, qh + 2 * kvh, hd)
            q, kk, v = qkv.split([qh, kvh, kvh], dim=2)
            q, kk = F.rms_norm(q, (hd,), qn), F.rms_norm(kk, (hd,), kn)
            q, kk, v = (t.transpose(1, 2) for t in (q, kk, v))
            kk, v = kk.repeat_interleave(qh // kvh, 1), v.repeat_interleave(qh // kvh, 1)
            a = F.scaled_dot_product_attention(q, kk, v, is_causal=True).transpose(1, 2).reshape(1, seq, qh * hd)
            x1 = x + a @ wo.t()
            y = F.rms_norm(x1, (h,), n2).view(seq, h)
            probs, _top = torch.topk(torch.softmax((y @ wr.t()).float(), dim=-1), k, dim=-1)
            src = perm // k
            routed = y.index_select(0, src).index_select(0, sort2)
            hmid = torch._grouped_mm(routed, w1.transpose(-2, -1), offs=offs)
            if gated:
                g1, u1 = hmid.chunk(2, dim=-1)
                act = F.silu(g1) * u1
            else:
                act = torch.square(F.relu(hmid))
            o = torch._grouped_mm(act, w2.transpose(-2, -1), offs=offs).index_select(0, unsort2)
            o = o * probs.reshape(-1).index_select(0, perm).to(o.dtype).unsqueeze(-1)
            moe = torch.zeros(seq, h, device=o.device, dtype=o.dtype).index_add(0, src, o)
            return x1 + moe.view(1, seq, h)

        try:
            for _ in range(3):
                step().backward(grad)
            bench.sync()
        except Exception as exc:  # noqa: BLE001 - record what the build lacks, go on
            print(f"layer {name}: {exc!s:.200}", file=sys.stderr)
            continue
        walls, fwds = [], []
        for _ in range(2 if bench.smoke else 10):
            bench.sync()
            t0 = time.perf_counter()
            yout = step()
            bench.sync()
            t1 = time.perf_counter()
            yout.backward(grad)
            bench.sync()
            walls.append((time.perf_counter() - t0) * 1e3)
            fwds.append((t1 - t0) * 1e3)
        from torch.profiler import ProfilerActivity, profile
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if bench.cuda else [])
        iters = 3
        with profile(activities=acts) as prof:
            for _ in range(iters):
                step().backward(grad)
            bench.sync()
        trace = out / f"trace_{name}.json"
        prof.export_chrome_trace(str(trace))
        traces.append(trace)
        events = json.loads(trace.read_text()).get("traceEvents", [])
        kern = [ev for ev in events if ev.get("cat") == "kernel"]
        classes: dict[str, list[float]] = {}
        for ev in kern:
            classes.setdefault(_kernel_class(ev.get("name", "").lower()), []).append(float(ev.get("dur", 0.0)))
        gpu_ms = sum(sum(v) for v in classes.values()) / iters / 1e3
        w.writerow([name, seq, h, local, tpe, f"{statistics.median(walls):.3f}", f"{gpu_ms:.3f}",
                    len(kern) // iters, f"{statistics.median(fwds):.3f}"])
        for cls, durs in sorted(classes.items()):
            wk.writerow([name, cls, len(durs) // iters, f"{sum(durs) / iters / 1e3:.3f}"])
        print(f"layer {name}: wall {statistics.median(walls):.2f} ms, gpu {gpu_ms:.2f} ms, "
              f"{len(kern) // iters} kernels", flush=True)
    f.close()
    fk.close()
    if traces:
        import tarfile
        with tarfile.open(out / "moe_layer_traces.tar.gz", "w:gz") as tar:
            for t in traces:
                tar.add(t, arcname=t.name)
        for t in traces:
            t.unlink()


MAMBA_SHAPES = [("nemotron-3-nano", 64, 64, 128, 8, 128, 8192, 1), ("nemotron-3-super", 128, 64, 128, 8, 128, 8192, 1),
                ("nano, 32 heads", 32, 64, 128, 8, 128, 8192, 1), ("nano, 256 heads", 256, 64, 128, 8, 128, 8192, 1),
                ("nano, 1 group", 64, 64, 128, 1, 128, 8192, 1), ("nano, batch 2", 64, 64, 128, 8, 128, 8192, 2),
                ("nano, 4k", 64, 64, 128, 8, 128, 4096, 1), ("nano, 16k", 64, 64, 128, 8, 128, 16384, 1),
                ("super, 4k", 128, 64, 128, 8, 128, 4096, 1), ("nano, 2k", 64, 64, 128, 8, 128, 2048, 1)]
"""(model, heads, head dim, state, groups, chunk, sequence, batch) of the Mamba2 mixers measured."""


def _kernel_class(name: str) -> str:
    """The class moe_layer_kernels.csv files a kernel under, by its (lower-case) name."""
    if any(s in name for s in ("flash", "fmha", "attention", "sdpa", "cudnn")):
        return "attention"
    if any(s in name for s in ("gemm", "cutlass", "xmma", "sm90", "matmul", "cublas")):
        return "gemm"
    if any(s in name for s in ("index", "scatter", "gather")):
        return "gather/scatter"
    if any(s in name for s in ("reduce", "sort", "topk", "radix", "scan")):
        return "reduce/sort/topk"
    return "norm" if "norm" in name else "elementwise/other"


def _kernel_times(torch, bench: Bench, fn) -> dict[str, list[float]]:
    """GPU microseconds and launches per kernel name over one call of fn (torch.profiler; empty without a GPU)."""
    if not bench.cuda:
        return {}
    from torch.profiler import ProfilerActivity, profile
    times: dict[str, list[float]] = {}
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            bench.sync()
        for ev in prof.events():
            if ev.device_type.name == "CUDA":
                entry = times.setdefault(ev.name, [0.0, 0])
                entry[0] += ev.device_time
                entry[1] += 1
    except Exception as exc:  # noqa: BLE001 - the timing stands without the breakdown
        print(f"profiler: {exc!s:.200}", file=sys.stderr, flush=True)
    return times


def mamba(torch, bench: Bench, out: Path, device_name: str, info: dict) -> None:
    """Mamba2's chunked SSD scan (mamba_ssm's Triton kernels, mamba_chunk_scan_combined) forward and backward.
    mamba_ssm is not a trainsim dependency: its `ops/triton` and `utils` modules travel beside the script
    (MAMBA_SSM_PATH, a folder holding the mamba_ssm package without its CUDA extensions)."""
    import os
    sys.path.insert(0, os.environ.get("MAMBA_SSM_PATH", ".gpu_deps"))
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    f, w = _writer(out, "mamba_ssd.csv", f"""
Mamba2 SSD scan on {device_name}, {info['versions']}: mamba_ssm 2.3.2's mamba_chunk_scan_combined (Triton,
autotuned on the first call, which is not timed) on x (batch, seq, heads, head_dim) BF16, dt (batch, seq, heads) BF16
with an FP32 dt_bias and softplus, A and D FP32 per head, B and C (batch, seq, groups, state) BF16, no z (the gated
norm runs outside, as in Mamba2 with rmsnorm); *_kernel_us = the sum of the GPU kernels' durations of one
call (torch.profiler): forward alone, and backward = forward + backward minus forward; *_event_us = CUDA events
around the call (triton.testing.do_bench, median), which include the GPU's idle time while the host launches the
kernels (Triton's launcher and the autograd function's PyTorch ops): the call is host-bound where they exceed the
kernel sums; kernels = launches in forward + backward""",
                   ["model", "batch", "seq", "heads", "head_dim", "state", "groups", "chunk", "fwd_kernel_us",
                    "bwd_kernel_us", "fwd_event_us", "bwd_event_us", "kernels"])
    dev = bench.device
    for name, heads, hd, state, groups, chunk, seq, batch in MAMBA_SHAPES:
        if bench.smoke:
            seq = 256
        x = torch.randn(batch, seq, heads, hd, device=dev, dtype=torch.bfloat16, requires_grad=True)
        dt = torch.randn(batch, seq, heads, device=dev, dtype=torch.bfloat16, requires_grad=True)
        a = (-torch.rand(heads, device=dev) - 0.5).requires_grad_()
        b = torch.randn(batch, seq, groups, state, device=dev, dtype=torch.bfloat16, requires_grad=True)
        c = torch.randn(batch, seq, groups, state, device=dev, dtype=torch.bfloat16, requires_grad=True)
        d = torch.randn(heads, device=dev, requires_grad=True)
        dt_bias = torch.randn(heads, device=dev, requires_grad=True)
        g = torch.randn(batch, seq, heads, hd, device=dev, dtype=torch.bfloat16)

        def fwd(x=x, dt=dt, a=a, b=b, c=c, d=d, dt_bias=dt_bias, chunk=chunk):
            return mamba_chunk_scan_combined(x, dt, a, b, c, chunk, D=d, dt_bias=dt_bias, dt_softplus=True)

        try:
            t0 = time.perf_counter()
            fwd().backward(g)
            bench.sync()
            print(f"mamba {name}: first call (autotune) {time.perf_counter() - t0:.1f} s", flush=True)
            t_f = bench.time_us(fwd)
            t_b = bench.time_us(lambda g=g: fwd().backward(g)) - t_f
            k_f = _kernel_times(torch, bench, fwd)
            kernels = _kernel_times(torch, bench, lambda g=g: fwd().backward(g))
        except Exception as exc:  # noqa: BLE001 - record what the build lacks, go on
            print(f"mamba {name}: {exc!s:.300}", file=sys.stderr, flush=True)
            continue
        kf_us, kall_us = sum(v[0] for v in k_f.values()), sum(v[0] for v in kernels.values())
        w.writerow([name, batch, seq, heads, hd, state, groups, chunk, f"{kf_us:.1f}", f"{kall_us - kf_us:.1f}",
                    f"{t_f:.1f}", f"{t_b:.1f}", int(sum(v[1] for v in kernels.values()))])
        f.flush()
        top = ", ".join(f"{k[:28]} {v[0]:.0f}" for k, v in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:4])
        print(f"mamba {name}: kernels fwd {kf_us:.0f} us, bwd {kall_us - kf_us:.0f} us; events fwd {t_f:.0f} us, "
              f"bwd {t_b:.0f} us; top: {top}", flush=True)
    f.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on whatever device there is")
    ap.add_argument("--only", default="", help="comma-separated sections (default: all)")
    args = ap.parse_args()
    import torch
    args.out.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    bench = Bench(torch, device, args.smoke)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    tag = {"NVIDIA H200": "h200", "NVIDIA H100 80GB HBM3": "h100-sxm"}.get(name, name)
    info = {"device": name, "versions": f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
            f"cuDNN {torch.backends.cudnn.version() if device == 'cuda' else '-'}"}
    sections = {"ceilings": lambda: ceilings(torch, bench, args.out, info),
                "launch": lambda: launch_cost(torch, bench, args.out, info),
                "gemm": lambda: dense_gemms(torch, bench, args.out, tag, info),
                "attention": lambda: attention(torch, bench, args.out, tag, info),
                "layer": lambda: moe_layer(torch, bench, args.out, tag, info),
                "grouped": lambda: grouped_gemms(torch, bench, args.out, tag, info),
                "mamba": lambda: mamba(torch, bench, args.out, tag, info)}
    only = [s for s in args.only.split(",") if s] or list(sections)
    for sec in only:
        t0 = time.perf_counter()
        sections[sec]()
        info[f"{sec}_s"] = round(time.perf_counter() - t0, 1)
        print(f"{sec}: {info[f'{sec}_s']} s", flush=True)
    (args.out / "info.json").write_text(json.dumps(info, indent=1))
    print(json.dumps(info, indent=1))


if __name__ == "__main__":
    main()
