"""torchvision ResNet-50 traced with torch.fx and simulated with strategies written with the primitives.

Needs torchvision, which does not import beside the CPU torch of the test extra: run it in a venv with
`pip install torch==2.14.1 torchvision==0.29.1` and `pip install --no-deps -e .` (plus the core
dependencies). Prints the traced parameter count against torchvision's, and data-parallel (against
the built-in resnet50), op-shard and pipeline iteration times on one DGX A100. Asserts nothing.
"""

from __future__ import annotations

import torch
import torchvision

from trainsim import DeviceMesh, StrategyTree, simulate, simulate_tree
from trainsim.workload.torch_fx import trace_module


def main() -> None:
    with torch.device("meta"):
        net = torchvision.models.resnet50(weights=None)
    torch_params = sum(p.numel() for p in net.parameters())

    def tree(mesh: DeviceMesh, micro_batch: int) -> StrategyTree:
        model = trace_module(net, (micro_batch * mesh.dp, 3, 224, 224))
        return StrategyTree.from_model(model, mesh, 2 * micro_batch * mesh.dp, micro_batch)

    S = tree(DeviceMesh(dp=8), 32)
    print(f"traced params {S.model.params:,} (torchvision {torch_params:,}); layers {len(S.model.layers)}")
    S.root.split("n", "dp")
    dp = simulate_tree(S, "dgx-a100").iteration_time_s
    zoo = simulate({"model": {"name": "resnet50"}, "cluster": {"name": "dgx-a100"},
                    "strategy": {"dp": 8, "micro_batch": 32, "global_batch": 512}}).iteration_time_s
    print(f"data parallel 8 x 32: {dp * 1e3:.2f} ms (built-in resnet50: {zoo * 1e3:.2f} ms)")
    S = tree(DeviceMesh(tp=2, dp=4), 32)
    S.root.split("n", "dp")
    S.head.fc.split("k", "tp")
    for block in S.layer4:
        block.conv2.split("k", "tp")
    r = simulate_tree(S, "dgx-a100", granularity="op")
    print(f"op-shard (fc and layer4 3x3 convs over tp=2, dp=4): {r.iteration_time_s * 1e3:.2f} ms, "
          f"exposed tp {r.breakdown['tp'] * 1e3:.2f} ms")
    S = tree(DeviceMesh(dp=4, pp=2), 32)
    S.root.split("n", "dp")
    S.layer3.map(1)
    S.layer4.map(1)
    S.head.map(1)
    r = simulate_tree(S, "dgx-a100")
    print(f"pipeline (layer3.. on stage 1, dp=4): {r.iteration_time_s * 1e3:.2f} ms, "
          f"peak memory per stage {[round(m.peak_bytes / 2**30, 2) for m in r.memory]} GiB")


if __name__ == "__main__":
    main()
