"""trainsim.nn: write a model PyTorch-style (no torch needed) and trace it into the workload IR.

    import trainsim.nn as nn

    class Block(nn.Module):
        def __init__(self, dim, heads):
            super().__init__()
            self.ln1, self.attn = nn.LayerNorm(dim), nn.CausalSelfAttention(dim, heads)
            ...
        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            ...

    model = nn.trace(GPT(...), (batch, seq_len))      # -> trainsim.workload.ir.Model

Modules register children in attribute order like torch; forward runs on symbolic tensors (shapes
only) and each leaf layer records one IR op with the zoo's conventions (record.ops). Layers, op
names and `input_from` follow record.grouping.
"""

from __future__ import annotations

from .layers import (
    GELU,
    AdaptiveAvgPool2d,
    BatchNorm2d,
    CausalSelfAttention,
    Conv2d,
    CrossEntropyLoss,
    Dropout,
    Embedding,
    FlashAttention,
    Flatten,
    Identity,
    LayerNorm,
    Linear,
    MaxPool2d,
    ReLU,
    SiLU,
)
from .module import Module, ModuleList, Parameter, Sequential
from .tensor import Tensor
from .trace import trace

__all__ = [
    "GELU", "AdaptiveAvgPool2d", "BatchNorm2d", "CausalSelfAttention", "Conv2d", "CrossEntropyLoss", "Dropout",
    "Embedding", "FlashAttention", "Flatten", "Identity", "LayerNorm", "Linear", "MaxPool2d", "Module", "ModuleList",
    "Parameter", "ReLU", "Sequential", "SiLU", "Tensor", "trace",
]
