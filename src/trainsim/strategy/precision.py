"""Numeric precision of a training job: compute dtype and bytes kept per parameter."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Precision:
    """Mixed-precision Adam as in ZeRO (Rajbhandari et al. 2020, section 3.1): 2 + 2 + 12 bytes/param.

    param_bytes: working (fp16/bf16) weights; grad_bytes: gradients as reduced; optimizer_bytes:
    fp32 master weights + Adam momentum + variance (K = 12 in the ZeRO paper). `named("bf16")`
    keeps gradients in fp32 (2 + 4 + 12) as Megatron does; the bare constructor is the ZeRO case.
    """

    compute_dtype: str = "bf16"
    param_bytes: float = 2.0
    grad_bytes: float = 2.0
    optimizer_bytes: float = 12.0
    activation_bytes: float = 2.0

    @classmethod
    def named(cls, dtype: str) -> Precision:
        if dtype == "fp32":
            return cls("fp32", 4.0, 4.0, 8.0, 4.0)
        if dtype == "tf32":
            return cls("tf32", 4.0, 4.0, 8.0, 4.0)
        if dtype == "bf16":
            # bf16 needs fp32 gradient accumulation and reduction: Megatron forces
            # accumulate_allreduce_grads_in_fp32 for bf16 (docs/distrib_optimizer: 2 + 4 + 12 B/param)
            return cls("bf16", 2.0, 4.0, 12.0, 2.0)
        return cls(dtype)
