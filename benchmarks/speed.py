"""Simulator speed benchmark: wall time and peak RSS of one simulation per case (fresh process each).

Targets (one core of the 2-core dev machine): GPT-3 175B on 1024 GPUs <= 1 s; Llama-3 405B on
16384 H100 <= 3 s; ResNet-50 DP on 256 GPUs <= 0.5 s; the same GPT-3 job from 64 to 16384 GPUs
grows < 1.5x (symmetry: cost follows stages and ops, not GPU count). Prints numbers; asserts nothing.
Usage: python benchmarks/speed.py
"""

from __future__ import annotations

import json
import subprocess
import sys

CASES = {
    "gpt3-175b 1024x A100 (default job)": "None",
    "llama3.1-405b 16384x H100 tp8 pp16 dp128 seq8192 gb2048": (
        "dict(model={'name': 'llama3.1-405b', 'seq_len': 8192}, cluster={'name': 'dgx-h100', 'nodes': 2048},"
        " strategy={'tp': 8, 'pp': 16, 'dp': 128, 'global_batch': 2048, 'sequence_parallel': True,"
        " 'recompute': 'selective', 'zero': 1})"),
    "resnet50 256x A100 data parallel": (
        "dict(model={'name': 'resnet50'}, cluster={'name': 'dgx-a100', 'nodes': 32},"
        " strategy={'micro_batch': 256, 'global_batch': 65536})"),
}
for gpus in (64, 1024, 16384):
    dp = gpus // 64
    CASES[f"gpt3-175b {gpus}x A100 tp8 pp8 dp{dp}, 16 micro-batches/pipeline"] = (
        f"dict(model={{'name': 'gpt3-175b'}}, cluster={{'name': 'dgx-a100', 'nodes': {gpus // 8}}},"
        f" strategy={{'tp': 8, 'pp': 8, 'dp': {dp}, 'global_batch': {16 * dp}, 'sequence_parallel': True,"
        f" 'recompute': 'selective', 'zero': 1}})")

PROBE = """
import json, resource, time
from trainsim.api import simulate, default_job
job = {job}
job = job if job is not None else default_job()
simulate(job)  # warm caches of the interpreter (imports, first-call costs)
t = time.perf_counter(); r = simulate(job); wall = time.perf_counter() - t
print(json.dumps({{"wall_s": wall, "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "tasks": r.n_tasks, "iteration_s": r.iteration_time_s, "mfu": r.mfu}}))
"""


def main() -> None:
    print(f"{'case':<66}{'wall s':>8}{'RSS MiB':>9}{'tasks':>8}{'iter s':>9}{'MFU':>7}")
    walls = {}
    for name, job in CASES.items():
        out = subprocess.run([sys.executable, "-c", PROBE.format(job=job)], capture_output=True, text=True, check=True)
        d = json.loads(out.stdout.strip().splitlines()[-1])
        walls[name] = d["wall_s"]
        print(f"{name:<66}{d['wall_s']:>8.3f}{d['rss_mib']:>9.0f}{d['tasks']:>8}{d['iteration_s']:>9.3f}"
              f"{100 * d['mfu']:>6.1f}%")
    scale = [v for k, v in walls.items() if "micro-batches/pipeline" in k]
    print(f"growth 64 -> 16384 GPUs: {scale[-1] / scale[0]:.2f}x")


if __name__ == "__main__":
    main()
