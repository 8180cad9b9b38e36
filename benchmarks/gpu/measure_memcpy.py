"""Measure host<->device and device<->device copy bandwidth on the local GPU (needs torch + CUDA).

Feeds the offload (ZeRO-Infinity CPU tier) and local-HBM memory models. Each size is copied
`reps` times after warm-up, timed with CUDA events; prints CSV rows:
direction,pinned,size_bytes,time_us,gbps  (gbps = size / time in 1e9 B/s; d2d counts bytes once).
Run: python benchmarks/gpu/measure_memcpy.py > src/trainsim/data/transfers/h100_memcpy.csv (kept out of
data/measurements/, whose CSVs feed the compute fit)
"""

from __future__ import annotations

import sys


def main() -> None:
    import torch

    dev = torch.device("cuda")
    name = torch.cuda.get_device_name(dev)
    print(f"# device: {name}; torch {torch.__version__}; CUDA events, median of reps after 3 warm-ups")
    print("direction,pinned,size_bytes,time_us,gbps")
    sizes = [2**k for k in range(12, 31, 2)]  # 4 KiB .. 1 GiB
    for size in sizes:
        reps = 20 if size <= 2**26 else 5
        gpu_a = torch.empty(size, dtype=torch.uint8, device=dev)
        gpu_b = torch.empty(size, dtype=torch.uint8, device=dev)
        for pinned in (True, False):
            host = torch.empty(size, dtype=torch.uint8, pin_memory=pinned)
            cases = [("h2d", lambda h=host, a=gpu_a: a.copy_(h, non_blocking=True)),
                     ("d2h", lambda h=host, a=gpu_a: h.copy_(a, non_blocking=True))]
            if pinned:
                cases.append(("d2d", lambda a=gpu_a, b=gpu_b: b.copy_(a)))
            for direction, fn in cases:
                times = []
                for i in range(reps + 3):
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    fn()
                    e.record()
                    e.synchronize()
                    if i >= 3:
                        times.append(s.elapsed_time(e) * 1e3)
                times.sort()
                t_us = times[len(times) // 2]
                print(f"{direction},{int(pinned) if direction != 'd2d' else 1},{size},{t_us:.2f},{size / t_us / 1e3:.2f}")
                sys.stdout.flush()
        del gpu_a, gpu_b


if __name__ == "__main__":
    main()
