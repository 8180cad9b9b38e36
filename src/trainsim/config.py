"""Job configuration validated at the boundary (pydantic); every CLI flag has a YAML key here."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import ConfigError
from .limits import (
    MAX_BANDWIDTH_GBPS,
    MAX_BATCH,
    MAX_FFN,
    MAX_GPUS,
    MAX_GPUS_PER_NODE,
    MAX_HEADS,
    MAX_HIDDEN,
    MAX_LATENCY_NS,
    MAX_LAYERS,
    MAX_NICS_PER_NODE,
    MAX_SEQ_LEN,
    MAX_VOCAB,
    MIN_BANDWIDTH_GBPS,
)


class _Strict(BaseModel):
    # strict: YAML's `tp: true` or `tp: "8"` is not an integer; no nan/inf in any float field
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class ModelSpec(_Strict):
    name: str = "gpt3-175b"
    hf_config: str | None = Field(None, min_length=1, description="local Hugging Face config.json (or its folder) to import "
                                  "instead of a built-in model; a relative path is taken from the working "
                                  "directory; the other model keys override it")
    seq_len: int | None = Field(None, ge=1, le=MAX_SEQ_LEN)
    layers: int | None = Field(None, ge=1, le=MAX_LAYERS)
    hidden: int | None = Field(None, ge=1, le=MAX_HIDDEN)
    heads: int | None = Field(None, ge=1, le=MAX_HEADS)
    kv_heads: int | None = Field(None, ge=1, le=MAX_HEADS)
    ffn: int | None = Field(None, ge=1, le=MAX_FFN)
    vocab: int | None = Field(None, ge=1, le=MAX_VOCAB)
    attention: Literal["flash", "flash3", "cudnn", "triton", "unfused"] = Field(
        "flash", description="attention kernel: flash (FlashAttention-2), flash3 (FlashAttention-3, Hopper), cudnn "
        "(cuDNN fused attention, as Transformer Engine runs it), triton (the Triton FlashAttention of 2022, e.g. "
        "llm-foundry attn_impl: triton) or unfused (softmax and two batched GEMMs)")
    # architecture features of a transformer; None keeps the model's own (gpt*: learned/gelu/layernorm with
    # biases, dropout and a tied head; llama*: rope/swiglu/rmsnorm, no biases or dropout, untied)
    position: Literal["learned", "rope", "alibi"] | None = Field(
        None, description="position encoding: learned (a table added to the embeddings), rope (rotary q/k) or "
        "alibi (a per-head linear bias on the attention scores, no parameters; BLOOM)")
    mlp: Literal["gelu", "swiglu", "relu2"] | None = Field(
        None, description="MLP: gelu (two matrices), swiglu (gated, three matrices) or relu2 (squared ReLU, "
        "two matrices; Nemotron)")
    norm: Literal["layernorm", "rmsnorm"] | None = Field(None, description="normalisation layers")
    bias: bool | None = Field(None, description="biases in the linear layers")
    tied_embeddings: bool | None = Field(None, description="the LM head shares the embedding's weight")
    dropout: bool | None = Field(None, description="dropout after attention and MLP (hidden and attention "
                                 "dropout > 0)")
    kernels: Literal["fused", "eager"] | None = Field(
        None, description="fused (Megatron, Transformer Engine or torch.compile kernels; the default) or eager "
        "(PyTorch eager mode: RMSNorm, SwiGLU, rotary embedding and the loss run as chains of element-wise "
        "kernels)")
    # how the training framework stores tensors for backward (activation memory; workload.zoo.transformer)
    loss: Literal["upcast", "upcast_twice", "chunked"] | None = Field(
        None, description="the cross-entropy's temporaries beside the fp32 softmax it keeps: upcast (one fp32 "
        "copy of the bf16 logits, worked in place: Megatron; the default) or upcast_twice (a second fp32 tensor: "
        "nanotron, Megatron's --cross-entropy-loss-fusion, eager F.cross_entropy(logits.float())); chunked: "
        "torchtune's chunked cross-entropy, which keeps the bf16 logits and upcasts one of 8 chunks at a time")
    sp_saves: Literal["shard", "gathered"] | None = Field(
        None, description="under sequence parallelism, the input a column-parallel linear keeps for its weight "
        "gradient: shard (re-gathered in backward: Megatron; the default) or gathered (the whole all-gathered "
        "input: nanotron with tp_linear_async_communication false)")
    glu: Literal["fused", "unfused"] | None = Field(
        None, description="SwiGLU as one kernel saving its input (fused) or as silu then multiply, which also "
        "keeps silu's output (unfused: PyTorch eager, nanotron's GLUActivation); default: unfused under "
        "kernels eager, else fused")
    head: Literal["lm", "classifier"] | None = Field(
        None, description="the output head: lm (final norm, LM head and loss over the vocabulary; the default) or "
        "classifier (BERT's sequence classification: pooler on the first token, 2-label linear classifier and "
        "loss; transformers' BertForSequenceClassification)")
    head_size: int | None = Field(None, ge=1, le=MAX_HIDDEN, description="each attention head's size where it is "
                                  "not model.hidden / model.heads (Hugging Face head_dim: Qwen3, Gemma); the q, k "
                                  "and v projections are heads (kv_heads) x head_size wide; None: hidden / heads")
    qk_norm: bool | None = Field(None, description="a norm over each query and key head before RoPE (Qwen3's "
                                 "q_norm/k_norm, Megatron's --qk-layernorm)")
    kv_lora_rank: int | None = Field(None, ge=1, le=MAX_HIDDEN, description="multi-latent attention (DeepSeek-V2/"
                                     "V3, Kimi K2): keys and values compressed to this rank; model.head_size is then "
                                     "a query/key head's size including model.qk_rope_dim")
    q_lora_rank: int | None = Field(None, ge=0, le=MAX_HIDDEN, description="multi-latent attention: queries "
                                    "compressed to this rank (0: a plain query projection)")
    qk_rope_dim: int | None = Field(None, ge=0, le=MAX_HIDDEN, description="multi-latent attention: the RoPE part "
                                    "of each query/key head (one rope key shared by the heads)")
    v_head_size: int | None = Field(None, ge=1, le=MAX_HIDDEN, description="multi-latent attention: a value "
                                    "head's size (None: model.head_size)")
    sliding_window: int | None = Field(None, ge=0, le=MAX_SEQ_LEN, description="sliding-window attention: each "
                                       "query attends to the last this many keys (fused kernels compute only those "
                                       "scores); 0: none")
    window_layers: Literal["all", "alternate"] | None = Field(None, description="the blocks model.sliding_window "
                                                              "applies to: all (Mistral) or alternate, every other one "
                                                              "from the first (gpt-oss)")
    attention_sinks: bool | None = Field(None, description="a learned logit per head in the attention softmax "
                                         "(gpt-oss): one parameter per head and layer")
    mtp_layers: int | None = Field(None, ge=0, le=MAX_LAYERS, description="multi-token prediction modules "
                                   "(DeepSeek-V3: 1; Megatron --mtp-num-layers): each one more block, a 2h -> h "
                                   "projection and the output head and loss again, on the last pipeline stage")
    layer_pattern: str | None = Field(None, min_length=1, max_length=MAX_LAYERS, description="a hybrid model's "
                                      "layers, one letter each (Nemotron-H): M a Mamba2 mixer, * attention, E a MoE "
                                      "MLP, - a dense MLP, each with its pre-norm and residual; model.layers letters")
    mamba_heads: int | None = Field(None, ge=1, le=MAX_HEADS, description="Mamba2 layers: heads")
    mamba_head_dim: int | None = Field(None, ge=1, le=MAX_HIDDEN, description="Mamba2 layers: channels per head "
                                       "(default 64)")
    mamba_state: int | None = Field(None, ge=1, le=MAX_HIDDEN, description="Mamba2 layers: the state per head "
                                    "(default 128)")
    mamba_groups: int | None = Field(None, ge=1, le=MAX_HEADS, description="Mamba2 layers: groups sharing B and C "
                                     "(default 8)")
    mamba_chunk: int | None = Field(None, ge=1, le=MAX_SEQ_LEN, description="Mamba2 layers: the chunk length of the "
                                    "SSD scan (default 256, mamba_ssm's; Nemotron-H's configs state 128)")
    experts: int | None = Field(None, ge=1, le=MAX_HEADS, description="mixture of experts: routed experts in "
                                "every layer's MLP (but model.first_dense_layers), each of model.expert_ffn features, "
                                "beside model.shared_expert_ffn; None keeps the model's own (0 for dense models)")
    top_k: int | None = Field(None, ge=1, le=MAX_HEADS, description="experts each token is routed to (with "
                              "model.experts, or a MoE model of the zoo)")
    expert_ffn: int | None = Field(None, ge=1, le=MAX_FFN, description="each routed expert's features (Megatron "
                                   "--moe-ffn-hidden-size); model.ffn stays the dense layers'; None: model.ffn")
    shared_expert_ffn: int | None = Field(None, ge=0, le=MAX_FFN, description="a shared expert every token runs "
                                          "beside the routed ones, of these features (all shared experts as one: "
                                          "Megatron --moe-shared-expert-intermediate-size; DeepSeek); 0: none")
    moe_latent: int | None = Field(None, ge=1, le=MAX_HIDDEN, description="LatentMoE (Nemotron 3 Super, Megatron "
                                   "--moe-latent-size): the routed experts' width; tokens are projected from hidden "
                                   "to it before dispatch and back after combine")
    moe_imbalance: float | None = Field(None, ge=1.0, le=1000.0, description="mixture of experts: the busiest "
                                        "expert's routed tokens over the mean (default 1: balanced routing, as "
                                        "the published benchmarks force it); every rank is priced as the busiest")
    moe_capacity_factor: float | None = Field(None, gt=0.0, le=1000.0, description="Megatron "
                                              "--moe-expert-capacity-factor: an expert takes at most this times the "
                                              "mean tokens, the rest dropped (default: dropless)")
    moe_pad_to_capacity: bool | None = Field(None, description="Megatron --moe-pad-expert-input-to-capacity: "
                                             "every expert computes its full capacity (needs moe_capacity_factor)")
    expert_gemm: Literal["grouped", "per_expert"] | None = Field(
        None, description="how the routed experts' GEMMs launch: grouped (default: one kernel for all local experts, "
        "CUTLASS grouped GEMM, torch._grouped_mm, Megatron's fused grouped MLP) or per_expert (Transformer Engine's "
        "GroupedLinear, Megatron-Core's TEGroupedMLP: one cuBLAS GEMM per local expert, each launch issued by the "
        "host)")
    expert_act: Literal["fused", "eager"] | None = Field(
        None, description="how the routed experts' activation and its weighting by the routing probabilities run: "
        "fused (default: one kernel, Megatron's weighted SwiGLU / quick-GeGLU fusion, the Transformer Engine op "
        "fuser) or eager (Megatron-Core TEGroupedMLP's path for activations it cannot fuse, squared ReLU among them: "
        "the activation, an FP32 product with the probabilities and a cast, each its own kernel)")
    rope_fusion: bool | None = Field(
        None, description="Megatron --apply-rope-fusion (default true): the rotary embedding as one fused kernel; "
        "false, Megatron-Core's unfused path (rotate-half, products with cos and sin, sum, cat: about four times the "
        "bytes and six kernels a phase), as Megatron-Bridge runs YaRN position embeddings (gpt-oss)")
    moe_router_fusion: bool | None = Field(
        None, description="Megatron --moe-router-fusion: the router's score function, top-k and aux-loss statistics "
        "in Transformer Engine's fused kernels (default true: 31 kernels a layer's forward, 72 unfused, per NVIDIA's "
        "DeepSeek-V3 GB200 guide); each kernel is a launch the host issues unless a CUDA graph captures the router")
    first_dense_layers: int | None = Field(None, ge=0, le=MAX_LAYERS, description="a MoE model's first layers "
                                           "keep a dense MLP of model.ffn features (DeepSeek-V3's "
                                           "first_k_dense_replace, Megatron --moe-layer-freq [0]*k+[1]*n)")
    # parameter-efficient fine-tuning (LoRA / QLoRA): every parameter frozen, low-rank adapters trained
    lora_rank: int | None = Field(None, ge=1, le=MAX_HIDDEN, description="LoRA fine-tuning: every parameter "
                                  "frozen (no gradients, optimizer states or gradient sync; no weight-gradient "
                                  "GEMMs) and rank-r adapters trained on model.lora_targets")
    lora_targets: list[Literal["q", "k", "v", "o", "mlp", "output"]] | None = Field(
        None, min_length=1, description="the matrices LoRA adapts (default q and v): the attention's q, k, v, "
        "o(utput) projections, the MLP's matrices, the LM head (output)")
    lora_base: Literal["bf16", "nf4"] | None = Field(
        None, description="how the adapted (frozen) matrices are stored: bf16 (the training dtype; LoRA) or nf4 "
        "(4-bit NormalFloat with double-quantised scales, 0.52 bytes a parameter; QLoRA)")

    @model_validator(mode="after")
    def _lora_keys(self) -> ModelSpec:
        if self.lora_rank is None and (self.lora_targets is not None or self.lora_base is not None):
            key = "lora_targets" if self.lora_targets is not None else "lora_base"
            raise ConfigError(f"model.{key}", "only applies to a LoRA fine-tune", "set model.lora_rank, or drop it")
        return self


_POOL_KEYS: dict[str, tuple[str, ...]] = {
    "hiermem": ("in_node_gbps", "remote_group_gbps", "out_switches", "remote_groups", "chunk_bytes", "latency_ns"),
    "zero_infinity": ("remote_group_gbps", "remote_groups", "pcie_gbps", "chunk_bytes", "latency_ns"),
    "astra": ("config",),
}
"""The keys each remote memory pool reads (RemoteMemorySpec); any other key set is refused."""


class RemoteMemorySpec(_Strict):
    """The disaggregated memory behind `strategy.offload: remote` (ASTRA-sim 2.0 section IV-D).

    hiermem: the hierarchical pool of Fig. 6 (GPUs -> in-node switch -> out-node switches -> remote memory
    groups), in-switch collectives possible; zero_infinity: ZeRO-Infinity's per-node offload devices reached
    over PCIe (Fig. 10); astra: ASTRA-sim's own remote memory JSON (latency + bytes / bandwidth). A key left
    out takes the pool's default (None here, so that a dumped job names only what was set); a key another
    pool reads is refused rather than ignored."""

    pool: Literal["hiermem", "zero_infinity", "astra"] = Field(
        "hiermem", description="hiermem (ASTRA-sim HierMem), zero_infinity (ZeRO-Infinity offload devices) or "
        "astra (ASTRA-sim's remote memory JSON, see config)")
    in_node_gbps: float | None = Field(None, ge=MIN_BANDWIDTH_GBPS, le=MAX_BANDWIDTH_GBPS, description="hiermem: "
                                       "in-node pooled fabric GB/s per GPU (default 256, TABLE V)")
    remote_group_gbps: float | None = Field(None, ge=MIN_BANDWIDTH_GBPS, le=MAX_BANDWIDTH_GBPS, description="GB/s "
                                            "of one remote memory group (hiermem) or offload device "
                                            "(zero_infinity); default 100 (TABLE V)")
    out_switches: int | None = Field(None, ge=1, le=MAX_GPUS, description="hiermem: out-node switches "
                                     "(default: one per node)")
    remote_groups: int | None = Field(None, ge=1, le=MAX_GPUS, description="remote memory groups (hiermem) or "
                                      "offload devices spread over the nodes (zero_infinity); default one per GPU")
    chunk_bytes: int | None = Field(None, ge=1, le=1 << 40, description="pipelined transfer unit in bytes "
                                    "(default 65536)")
    latency_ns: float | None = Field(None, ge=0, le=MAX_LATENCY_NS, description="access latency in ns "
                                     "(default 0)")
    pcie_gbps: float | None = Field(None, ge=MIN_BANDWIDTH_GBPS, le=MAX_BANDWIDTH_GBPS, description="zero_infinity: "
                                    "host<->GPU GB/s per GPU (default: the GPU generation's PCIe)")
    config: str | None = Field(None, min_length=1, description="astra: ASTRA-sim's remote memory JSON (memory-type, "
                               "remote-mem-latency, remote-mem-bw, ...); a relative path is taken from the working "
                               "directory")

    @model_validator(mode="after")
    def _pool_keys(self) -> RemoteMemorySpec:
        """Refuse keys the chosen pool does not read; the astra pool needs its file."""
        keys = _POOL_KEYS[self.pool]
        for key in (k for ks in _POOL_KEYS.values() for k in ks):
            if key not in keys and getattr(self, key) is not None:
                users = [p for p, ks in _POOL_KEYS.items() if key in ks]
                raise ConfigError(f"cluster.remote_memory.{key}", f"does not apply to pool {self.pool} (only to "
                                  f"{' and '.join(users)})", f"drop it, or set pool: {users[0]}")
        if self.pool == "astra" and self.config is None:
            raise ConfigError("cluster.remote_memory.config", "pool astra reads ASTRA-sim's remote memory JSON",
                              "give its path (simulate --remote-memory PATH)")
        return self


class ClusterSpec(_Strict):
    name: str = "dgx-a100"
    nodes: int | None = Field(None, ge=1, le=MAX_GPUS)
    gpu: str | None = Field(None, description="replace the preset's GPU (see `trainsim clusters`)")
    gpus_per_node: int | None = Field(None, ge=1, le=MAX_GPUS_PER_NODE)
    intra_node_gbps: float | None = Field(None, ge=MIN_BANDWIDTH_GBPS, le=MAX_BANDWIDTH_GBPS,
                                          description="NVLink/switch GB/s per GPU per direction")
    nics_per_node: int | None = Field(None, ge=1, le=MAX_NICS_PER_NODE)
    nic_gbps: float | None = Field(None, ge=MIN_BANDWIDTH_GBPS, le=MAX_BANDWIDTH_GBPS,
                                   description="GB/s per NIC per direction (200 Gb/s HDR = 25)")
    topology: str | None = Field(None, description="ASTRA-sim notation 'Ring(4)_FC(2)_Switch(8)' or a topology "
                                 "preset; replaces the preset's interconnect (the last dimension is the network)")
    bandwidth_gbps: list[Annotated[float, Field(ge=MIN_BANDWIDTH_GBPS, le=MAX_BANDWIDTH_GBPS)]] | None = Field(
        None, description="with topology: GB/s per NPU per dimension")
    latency_ns: list[Annotated[float, Field(ge=0, le=MAX_LATENCY_NS)]] | None = Field(
        None, description="with topology: ns per hop per dimension")
    remote_memory: RemoteMemorySpec | None = Field(
        None, description="the memory pool behind strategy.offload remote (default: ASTRA-sim's HierMem baseline, "
        "TABLE V)")
    host_overhead_scale: float | None = Field(
        None, ge=0.05, le=20.0, description="the nodes' CPUs: framework (host) time per op against the x86 DGX hosts "
        "the host overheads were measured on (default 1; a Grace host took 2.75x per op in TransformerEngine issue "
        "#2053's microbenchmark: hardware.cluster.GRACE_HOST_OVERHEAD_SCALE)")

    @model_validator(mode="after")
    def _topology_keys(self) -> ClusterSpec:
        """Keys that only mean something with (or without) a topology are refused, not ignored."""
        if self.topology is None:
            for key in ("bandwidth_gbps", "latency_ns"):
                if getattr(self, key) is not None:
                    raise ConfigError(f"cluster.{key}", "only applies with cluster.topology (--topology)",
                                      "add a topology or drop it")
        else:
            for key in ("nodes", "gpus_per_node", "intra_node_gbps", "nics_per_node", "nic_gbps"):
                if getattr(self, key) is not None:
                    raise ConfigError(f"cluster.{key}", "has no effect with cluster.topology (the topology fixes "
                                      "the size and the links)", "drop it, or size the topology instead")
        return self


class StrategySpec(_Strict):
    tree: str | None = Field(None, min_length=1, description="a saved strategy tree (YAML from --dump-strategy or "
                             "StrategyTree.to_yaml) that replaces the other strategy keys")
    dp: int | None = Field(None, ge=1, le=MAX_GPUS,
                           description="data-parallel degree; derived from the world size if omitted")
    tp: int = Field(1, ge=1, le=MAX_GPUS)
    pp: int = Field(1, ge=1, le=MAX_GPUS)
    cp: int = Field(1, ge=1, le=MAX_GPUS)
    ep: int = Field(1, ge=1, le=MAX_GPUS)
    vpp: int = Field(1, ge=1, le=MAX_LAYERS)
    sequence_parallel: bool = False
    zero: int = Field(0, ge=0, le=3)
    fsdp: bool = False
    first_stage_layers: int | None = Field(None, ge=1, le=MAX_LAYERS, description="uneven pipeline: transformer "
                                           "layers on the first stage (Megatron --decoder-first-pipeline-num-"
                                           "layers); the middle stages share the rest evenly")
    last_stage_layers: int | None = Field(None, ge=1, le=MAX_LAYERS, description="the same for the last stage "
                                          "(--decoder-last-pipeline-num-layers)")
    stage_layers: list[Annotated[int, Field(ge=0, le=MAX_LAYERS)]] | None = Field(
        None, min_length=2, max_length=MAX_LAYERS, description="uneven pipeline, every stage given: transformer "
        "layers per pipeline chunk (pp x vpp entries, in chunk order) summing to the model's layers, e.g. [14, 10] "
        "(nanotron's compute-cost split of Llama-1B over pp 2); 0 only on an end chunk, which keeps the "
        "embedding or the LM head")
    dp_replicate: int = Field(1, ge=1, le=MAX_GPUS, description="hybrid sharding (HSDP, FSDP2's 2-D mesh): "
                              "replicas of each sharding group; states are sharded over dp / dp_replicate ranks "
                              "and gradients all-reduced across the replicas")
    etp: int | None = Field(None, ge=1, le=MAX_GPUS, description="expert tensor parallelism (Megatron "
                            "--expert-tensor-parallel-size): None or tp, the experts' features split over tp like "
                            "the dense MLP; 1 with tp > 1, MoE parallel folding: whole experts spread over tp x ep "
                            "ranks (ep counts them all)")
    recompute: Literal["none", "selective", "full"] = "none"
    recompute_modules: list[Literal["core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "shared_experts",
                                    "moe"]] | None = Field(
        None, min_length=1, description="with recompute selective: the parts of a block re-run in the backward "
        "(Megatron-Core's --recompute-modules; default core_attn, the attention core): moe_act (the experts' "
        "activation), layernorm (the two norms), mla_up_proj (MLA's up projections and RoPE), mlp, "
        "shared_experts, moe")
    schedule: Literal["gpipe", "1f1b", "interleaved", "dynamic", "zb-h1", "dualpipev"] = Field(
        "1f1b", description="pipeline order; dynamic: Proteus' HTAE scheduler (backward first, forward under "
        "the cap) played out on the stage costs; zb-h1: zero-bubble ZB-H1 (Qi et al. 2024), each backward split "
        "into input and weight gradients, the latter postponed into the bubble, 1F1B's activation memory, vpp 1; "
        "dualpipev: DeepSeek-V3's DualPipeV, two chunks per rank in a V (rank 0 holds the first and the last), "
        "zero-bubble backwards, at least 2 x pp micro-batches, vpp 2 (set for it)")
    max_ongoing_micro_batch: int | None = Field(None, ge=1, le=MAX_BATCH, description="micro-batches a pipeline rank holds "
                                                "between forward and backward (1f1b: a lower cap; dynamic: the cap)")
    micro_batch: int = Field(1, ge=1, le=MAX_BATCH)
    global_batch: int | None = Field(None, ge=1, le=MAX_BATCH)
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = Field(False, description="ZeRO parameter all-gather hidden behind the next forward")
    tp_comm_overlap: bool = Field(False, description="TP collectives pipelined with their GEMMs (TE userbuffers)")
    cp_comm: Literal["p2p", "all_gather"] = Field(
        "p2p", description="context-parallel attention: p2p (ring attention, Megatron/Transformer Engine's default: "
        "K and V chunks pass round the cp ring under the attention of the previous chunk) or all_gather (K and V "
        "gathered before one attention kernel, as Llama 3 did)")
    ep_dispatcher: Literal["alltoall", "deepep", "hybridep"] = Field(
        "alltoall", description="how MoE tokens reach their experts: alltoall (NCCL's all-to-all: one copy per remote "
        "expert), deepep (DeepEP, Megatron's flex dispatcher: one copy per GPU reached, and per remote node over "
        "RDMA, forwarded over NVLink) or hybridep (HybridEP, the flex dispatcher's other backend: the same copies, "
        "its kernels moving at most ep_dispatcher_sms x 21 GB/s)")
    ep_dispatcher_sms: int | None = Field(None, ge=1, le=1024, description="SMs HybridEP's kernels run on "
                                          "(Megatron --moe-hybridep-num-sms; default 16)")
    ep_overlap: bool = Field(False, description="expert-parallel all-to-alls hidden under the compute of another "
                             "micro-batch's opposite pass (Megatron --overlap-moe-expert-parallel-comm, DualPipe)")
    ep_node_limit: int | None = Field(None, ge=1, le=MAX_GPUS, description="node-limited routing (DeepSeek-V3: 4): "
                                      "each token reaches at most this many nodes (with a two-hop ep_dispatcher)")
    p2p_scatter_gather: bool = Field(True, description="Megatron's scatter/gather pipeline hand-off: a tensor "
                                     "replicated over tp is sent 1/tp per rank and all-gathered on arrival")
    offload: Literal["none", "cpu", "nvme", "remote"] = Field(
        "none", description="keep parameters, gradients and optimizer states in CPU DRAM / NVMe (ZeRO-Infinity) or "
        "a disaggregated pool (ASTRA-sim HierMem): each layer's weights are loaded before its forward and "
        "backward and its gradients stored after, on the memory stream")
    offload_activations: bool = Field(
        False, description="each layer's checkpointed input (recompute full) moved to CPU memory after its forward "
        "and brought back before its backward, over PCIe on the memory stream, the next layer's prefetched "
        "(torchtune's enable_activation_offloading, Megatron's --cpu-offloading-activations)")
    cuda_graphs: str = Field(
        "none", description="CUDA graphs (Megatron-Core --cuda-graph-impl / --cuda-graph-scope): none, "
        "full_iteration (the whole step one graph; a dropless MoE then needs Megatron's sync-free dispatch, "
        "--moe-expert-rank-capacity-factor) or the modules captured, comma-separated or a list: attn, mlp, "
        "moe_router (a MoE sublayer up to its router), moe_preprocess (with moe_router), moe (drop-and-pad only), "
        "mamba. A captured op's kernel launches cost the host nothing; the rest run eagerly, each launch priced at "
        "the host overhead")

    @field_validator("cuda_graphs", mode="before")
    @classmethod
    def _graph_modules(cls, value: Any) -> Any:  # noqa: ANN401 - whatever the job file holds
        """A YAML list of modules as the comma-separated string the field (and the results store) keeps."""
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return ",".join(value)
        return value
    offload_in_switch: bool = Field(
        False, description="with offload remote on a hiermem pool and sharded parameters (zero 3 / fsdp): the "
        "pool's switches all-gather the parameters while loading and reduce-scatter the gradients while storing "
        "(ASTRA-sim 2.0 in-switch collectives); the GPUs run neither collective")

    @model_validator(mode="after")
    def _contradictions(self) -> StrategySpec:
        if self.fsdp and self.zero in (1, 2):
            raise ConfigError("strategy.zero", f"ZeRO-{self.zero} contradicts fsdp (FSDP full shard is ZeRO-3)",
                              "drop --zero, or use --zero 3 without --fsdp")
        if self.tp_comm_overlap and not (self.tp > 1 and self.sequence_parallel):
            raise ConfigError("strategy.tp_comm_overlap", "needs tp > 1 with sequence parallelism (as in Megatron: "
                              "only its all-gathers/reduce-scatters pipeline with the GEMMs)",
                              "add --sp (and --tp > 1), or drop --tp-comm-overlap")
        if self.stage_layers is not None and (self.first_stage_layers is not None
                                              or self.last_stage_layers is not None):
            raise ConfigError("strategy.stage_layers", "gives every stage's layers; first_stage_layers / "
                              "last_stage_layers would set them twice", "keep one of the two forms")
        if self.ep_overlap and self.ep == 1:
            raise ConfigError("strategy.ep_overlap", "only applies with expert parallelism (ep > 1)",
                              "add --ep, or drop --ep-overlap")
        # the one home of the dispatcher names and the one check of CUDA-graph names and combinations
        from .strategy.tree import TWO_HOP_DISPATCHERS, cuda_graph_scope

        if self.ep_node_limit is not None and self.ep_dispatcher not in TWO_HOP_DISPATCHERS:
            raise ConfigError("strategy.ep_node_limit", "applies to the two-hop dispatch only",
                              "add ep_dispatcher: deepep (or hybridep), or drop ep_node_limit")
        if self.ep_dispatcher_sms is not None and self.ep_dispatcher != "hybridep":
            raise ConfigError("strategy.ep_dispatcher_sms", "applies to HybridEP's kernels only",
                              "add ep_dispatcher: hybridep, or drop ep_dispatcher_sms")
        cuda_graph_scope(self.cuda_graphs)
        if self.cp_comm != "p2p" and self.cp == 1:
            raise ConfigError("strategy.cp_comm", "only applies with context parallelism (cp > 1)",
                              "add --cp, or drop --cp-comm")
        if self.overlap_param_gather and self.zero == 0 and not self.fsdp:
            raise ConfigError("strategy.overlap_param_gather", "needs sharded parameters (ZeRO >= 1 or FSDP): "
                              "without them there is no parameter all-gather to hide",
                              "add --zero 1 (distributed optimizer), or drop --overlap-param-gather")
        if self.recompute_modules is not None and self.recompute != "selective":
            raise ConfigError("strategy.recompute_modules", f"names what selective recompute re-runs, but recompute "
                              f"is {self.recompute}", "set recompute: selective, or drop recompute_modules")
        if self.offload_activations and self.recompute != "full":
            raise ConfigError("strategy.offload_activations", f"offloads each layer's checkpointed input, but recompute "
                              f"is {self.recompute}", "add --recompute full, or drop --offload-activations")
        if self.offload_activations and self.offload not in ("none", "cpu"):
            raise ConfigError("strategy.offload_activations", f"moves activations to CPU memory; the model states "
                              f"are offloaded to {self.offload}", "use --offload cpu or none with it")
        if self.offload_in_switch and self.offload != "remote":
            raise ConfigError("strategy.offload_in_switch", "in-switch collectives run in a remote memory pool's "
                              f"switches, but offload is {self.offload}",
                              "add --offload remote, or drop --in-switch-collectives")
        if self.offload_in_switch and self.zero != 3 and not self.fsdp:
            raise ConfigError("strategy.offload_in_switch", "needs sharded parameters (ZeRO-3 or FSDP): without "
                              "them there is no parameter all-gather or gradient reduce-scatter to do in the switches",
                              "add --zero 3 (or --fsdp), or drop --in-switch-collectives")
        return self


LEARNED_PREFIX = "learned:"


def learned_path(compute_model: str) -> str | None:
    """The model file of a `learned:FILE` compute model, None for the roofline (or an empty FILE)."""
    path = compute_model[len(LEARNED_PREFIX):].strip() if compute_model.startswith(LEARNED_PREFIX) else ""
    return path or None


def _check_learned(compute_model: str) -> None:
    """What a learned compute model needs that is cheap to check at the boundary: the learned:FILE form, the
    file, and torch (the model itself is read when a job is simulated: api.check_compute_model)."""
    import importlib.util

    field = "simulation.compute_model"
    path = learned_path(compute_model)
    if path is None:
        raise ConfigError(field, f"'{compute_model}' is unknown",
                          "use roofline or learned:FILE (a model from `trainsim predictor train`)")
    if not Path(path).is_file():
        raise ConfigError(field, f"{path} does not exist", "pass a model from `trainsim predictor train`")
    if importlib.util.find_spec("torch") is None:
        raise ConfigError(field, "the learned compute model needs torch, which is not installed",
                          "pip install 'trainsim[learn]'")


class SimulationSpec(_Strict):
    dtype: Literal["auto", "fp32", "tf32", "fp16", "bf16", "fp8", "fp4"] = Field(
        "auto", description="auto: what the GPU trains in (bf16 from Ampere on, fp16 on V100, fp32 on Pascal)")
    # how the training framework keeps its model states (static memory; master_weights also the gradient dtype)
    master_weights: bool = Field(True, description="an fp32 master copy of the weights with fp32 optimizer states "
                                 "and (bf16) fp32 gradients, as mixed precision keeps them; false: weights, "
                                 "gradients and optimizer states all in the training dtype (Lightning's "
                                 "bf16-true, torchtune's bf16)")
    optimizer: Literal["adam", "adam_8bit", "adafactor", "muon"] = Field(
        "adam", description="the optimizer's states: adam (Adam/AdamW, two moments), adam_8bit (two block-wise "
        "quantised 8-bit moments, bitsandbytes/torchao 8-bit AdamW), adafactor (no first moment; the second "
        "factored into row and column statistics per matrix, Hugging Face's Adafactor) or muon (one momentum "
        "per block matrix, AdamW for the embedding, the output layer and vectors; Megatron-Core's Muon)")
    optimizer_in_backward: bool = Field(False, description="each parameter's optimizer step runs as backward "
                                        "produces its gradient, which is then freed (torchtune's "
                                        "optimizer_in_bwd): no gradient buffer across the step; needs one "
                                        "micro-batch per step and no pipeline")
    grad_bucket_copy: bool = Field(False, description="PyTorch DDP without gradient_as_bucket_view: the "
                                   "reducer's buckets hold a second copy of the gradients for the whole step")
    fp8_params: bool = Field(False, description="the FP8 GEMMs' weights kept in FP8 (1 byte) instead of the "
                             "training dtype: Megatron's --fp8-param-gather (its parameter buffer and ZeRO "
                             "all-gather in FP8), torchao's float8 all-gather of FSDP shards. The transformer "
                             "blocks' linear weights only (embeddings, norms and the output layer stay); needs "
                             "dtype fp8")
    fp8_activations: bool = Field(False, description="the FP8 GEMMs' inputs cached for their backward in FP8 "
                                  "(1 byte and a 1x128 tile's scale) instead of BF16: DeepSeek-V3's low-precision "
                                  "activation storage. The transformer blocks' linear layers and experts only; "
                                  "needs dtype fp8")
    expandable_segments: bool = Field(False, description="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: "
                                      "the caching allocator grows one segment per pool instead of one per "
                                      "request, which removes most fragmentation from peak_reserved")
    gamma: float | None = Field(None, ge=0.0, le=5.0,
                                description="compute slowdown while overlapped with gradient comm (calibrated)")
    exact: bool = False
    granularity: Literal["op", "layer", "auto"] = "auto"
    calibration: str | None = Field(None, min_length=1, description="calibration YAML from `trainsim calibrate`")
    comm_model: Literal["nccl", "analytical"] = Field(
        "nccl", description="nccl: NCCL's tuned algorithm/protocol choice; analytical: ASTRA-sim's "
        "multi-dimensional topology-aware collectives")
    scheduler: Literal["baseline", "themis"] = Field("baseline", description="collective scheduler (analytical)")
    semantics: Literal["nccl", "astra"] = Field(
        "nccl", description="collective semantics: nccl (what NCCL on the hardware does) or astra (ASTRA-sim 2.0's "
        "analytical backend, for parity with its numbers; uses the analytical model)")
    astra_system: str | None = Field(None, min_length=1, description="with semantics astra: an ASTRA-sim system "
                                     "config JSON (chunks, algorithms, endpoint delay, local-mem-bw)")
    bandwidth_sharing: bool = Field(True, description="concurrent communication shares links (max-min fair "
                                    "flows, Proteus VI-C); false: fixed durations, every group alone")
    compute_model: str = Field("roofline", min_length=1, description="roofline (the analytical model) or "
                               "learned:FILE (a stage-latency model from `trainsim predictor train`, trainsim[learn])")
    learned_extrapolation: bool = Field(False, description="with a learned compute model: also correct stages "
                                        "outside the ranges it was trained on (default: those keep the roofline)")
    fidelity: Literal["event", "analytic"] = Field(
        "event", description="event: the discrete-event simulation of every task (timeline, critical path); "
        "analytic: the same per-layer costs in closed form (pipeline formula, exposed communication; "
        "sub-millisecond, no timeline), for ranking many strategies")

    @model_validator(mode="after")
    def _scheduler_needs_analytical(self) -> SimulationSpec:
        if self.compute_model != "roofline":
            _check_learned(self.compute_model)
        elif self.learned_extrapolation:
            raise ConfigError("simulation.learned_extrapolation", "applies to a learned compute model only",
                              "add --compute learned:FILE, or drop it")
        if self.astra_system is not None and self.semantics != "astra":
            raise ConfigError("simulation.astra_system", "is read in ASTRA-sim semantics only",
                              "add --semantics astra (simulation.semantics: astra), or drop it")
        if self.scheduler != "baseline" and self.comm_model != "analytical" and self.semantics != "astra":
            raise ConfigError("simulation.scheduler", f"{self.scheduler} schedules the analytical model's "
                              f"collectives; comm_model {self.comm_model} would ignore it",
                              "add --comm-model analytical, or drop --scheduler")
        return self


class JobConfig(_Strict):
    """One simulated job: what is trained, on what, how it is parallelised, how it is simulated."""

    model: ModelSpec = ModelSpec()
    cluster: ClusterSpec = ClusterSpec()
    strategy: StrategySpec = StrategySpec()
    simulation: SimulationSpec = SimulationSpec()

    @model_validator(mode="after")
    def _remote_memory(self) -> JobConfig:
        """A remote memory pool only with offload remote; in-switch collectives only in a hiermem pool. (With a
        strategy tree file the offload target is the tree's: checked when the tree is simulated, api.py.)"""
        rm, s = self.cluster.remote_memory, self.strategy
        if s.tree is not None:
            return self
        if rm is not None and s.offload != "remote":
            raise ConfigError("cluster.remote_memory", f"only applies with strategy.offload remote (offload is "
                              f"{s.offload})", "add --offload remote, or drop it (--remote-memory)")
        if s.offload_in_switch and rm is not None and rm.pool != "hiermem":
            raise ConfigError("strategy.offload_in_switch", f"the {rm.pool} pool has no in-switch collectives "
                              "(only ASTRA-sim's hierarchical pool gathers in its switches)",
                              "use cluster.remote_memory.pool hiermem, or drop --in-switch-collectives")
        return self

    @model_validator(mode="after")
    def _state_recipe(self) -> JobConfig:
        """The simulation's state keys against the strategy they need (with a strategy tree: the tree's)."""
        sim, s = self.simulation, self.strategy
        if sim.fp8_params and sim.dtype != "fp8":
            raise ConfigError("simulation.fp8_params", f"keeps the FP8 GEMMs' weights in FP8, but the job trains in "
                              f"{sim.dtype}", "set simulation.dtype: fp8, or drop fp8_params")
        if sim.fp8_activations and sim.dtype != "fp8":
            raise ConfigError("simulation.fp8_activations", f"caches the FP8 GEMMs' inputs in FP8, but the job trains "
                              f"in {sim.dtype}", "set simulation.dtype: fp8, or drop fp8_activations")
        if s.tree is not None:
            return self
        if sim.grad_bucket_copy:
            if s.fsdp or s.zero >= 2:
                raise ConfigError("simulation.grad_bucket_copy", "is PyTorch DDP's second gradient copy; ZeRO-2/3 "
                                  "and FSDP reduce-scatter into sharded gradients instead",
                                  "drop --grad-bucket-copy, or use --zero 0 or 1")
            if s.dp == 1:
                raise ConfigError("simulation.grad_bucket_copy", "needs data parallelism (dp > 1): with dp 1 "
                                  "there is no DDP reducer", "drop --grad-bucket-copy, or add --dp")
        if sim.optimizer_in_backward:
            if s.pp > 1:
                raise ConfigError("simulation.optimizer_in_backward", "steps each gradient as backward makes it; "
                                  "a pipeline accumulates gradients over its micro-batches",
                                  "drop --optimizer-in-backward, or use --pp 1")
            if s.global_batch is not None and s.dp is not None and s.global_batch != s.micro_batch * s.dp:
                raise ConfigError("simulation.optimizer_in_backward", f"steps each gradient as backward makes it, "
                                  f"so it cannot accumulate {s.global_batch // (s.micro_batch * s.dp) or 1} "
                                  "micro-batches", "set global_batch = micro_batch x dp, or drop it")
        return self


DEFAULT_JOB: dict[str, Any] = {
    "model": {"name": "gpt3-175b", "seq_len": 2048},
    "cluster": {"name": "dgx-a100", "nodes": 128},
    "strategy": {"tp": 8, "pp": 16, "dp": 8, "micro_batch": 1, "global_batch": 1536, "sequence_parallel": True,
                 "recompute": "selective", "zero": 1, "schedule": "1f1b"},
}
DEFAULT_JOB_TEXT = "GPT-3 175B on 1024 A100-80GB, Megatron TP8 x PP16 x DP8"
"""DEFAULT_JOB in words (the summary's job line and the README)."""


_KINDS = {"int_type": "an integer", "float_type": "a number", "bool_type": "true or false",
          "string_type": "a string", "list_type": "a list"}
"""pydantic error types of a wrong-typed value -> what the field takes (strict: no bool-as-int, no "8")."""


def _short(value: Any, limit: int = 60) -> str:
    """repr(value), cut to `limit` characters for a one-line message."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _field_of(err: dict[str, Any]) -> str:
    return ".".join(str(x) for x in err.get("loc", ())) or "config"


def parse_job(data: dict[str, Any]) -> JobConfig:
    """Validate a nested dict into a JobConfig, turning the first error into a ConfigError."""
    if not isinstance(data, dict):
        raise ConfigError("job", f"must be a mapping of model/cluster/strategy/simulation keys, not "
                          f"{type(data).__name__}", "pass a dict such as {'model': {'name': 'gpt2'}}")
    try:
        return JobConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, ConfigError):  # a cross-field validator: it names its own field
            raise cause from None
        field = _field_of(err)
        msg = err.get("msg", "invalid value")
        fix = "remove it (see `trainsim simulate --help` for the keys)" if err.get("type") == "extra_forbidden" else \
            f"got {_short(err.get('input'))}"
        kind = _KINDS.get(str(err.get("type")))
        if kind is not None:
            msg = f"must be {kind}, not {type(err.get('input')).__name__}"
        if err.get("type") in ("model_type", "dict_type"):
            msg = f"must be a mapping of {field} keys, not {type(err.get('input')).__name__}"
            fix = f"write {field}: followed by indented key: value lines (got {_short(err.get('input'))})"
        raise ConfigError(field, msg, fix) from None


def load_yaml(path: Path | str, field: str = "config") -> dict[str, Any]:
    """Safely load a YAML job file into a dict (files.load_yaml: bounded, UTF-8, no duplicate keys)."""
    from .files import load_yaml as read_yaml

    data = read_yaml(path, field, what="YAML job file", fix="pass an existing YAML job file")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(field, f"{path} must hold a mapping with model/cluster/strategy keys",
                          "see README (a job file has model:, cluster:, strategy:, simulation:)")
    return data


def merge(base: dict[str, Any], override: dict[str, Any], _path: str = "") -> dict[str, Any]:
    """Deep-merge `override` into `base` (values of None in override are ignored); a section of `base`
    that is not a mapping where `override` has one is a ConfigError naming it, not silently replaced."""
    out = dict(base)
    for k, v in override.items():
        if v is None:
            continue
        if isinstance(v, dict):
            old = out.get(k)
            if old is not None and not isinstance(old, dict):
                raise ConfigError(f"{_path}{k}", f"must be a mapping of {_path}{k} keys, not {type(old).__name__}",
                                  f"write {k}: followed by indented key: value lines (got {_short(old)})")
            out[k] = merge(old or {}, v, f"{_path}{k}.")
        else:
            out[k] = v
    return out


JOB_SECTIONS = ("model", "cluster", "strategy")
_RECIPE = {"strategy": ("tp", "pp", "dp", "cp", "ep", "vpp", "global_batch"), "cluster": ("nodes",)}
"""What the default job sized for GPT-3 175B: dropped with it when a flag names another model."""


class LayeredJob(NamedTuple):
    data: dict[str, Any]  # the job dict to parse_job
    from_default: bool  # the base was the default job (no file, or a file without model/cluster/strategy)
    notes: list[str]  # what the layering dropped from the base, in words


def apply_flags(base: dict[str, Any] | None, flags: dict[str, dict[str, Any]]) -> LayeredJob:
    """Layer CLI flags (None = not given) on a job file's dict, or on DEFAULT_JOB when there is no file or
    it has no model/cluster/strategy section (an empty file is the default job).

    Flags change what they name and drop only what would contradict them: another model (--model,
    --hf-config) replaces the default's model and its recipe (seq_len, global batch, degrees, nodes; a job
    file keeps its other model keys); --dp drops the base's nodes (the world follows dp); --nodes, --tp,
    --pp, --cp, --cluster, --gpus-per-node or --topology drop the base's dp where the GPU count stays known
    (dp is derived); --topology drops the nodes; --strategy-tree replaces the strategy section; sequence
    parallelism goes where tp ends at 1; --fsdp drops the base's ZeRO stage. Settings (recompute, zero, sp,
    schedule, ...) stay unless overridden.
    """
    from_default = base is None or not any(k in base for k in JOB_SECTIONS)
    data = merge(DEFAULT_JOB, base or {}) if from_default else base
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}  # copies: base stays untouched
    given = {sec: {k: v for k, v in (vals or {}).items() if v is not None} for sec, vals in flags.items()}
    gm, gc, gs = (given.get(sec, {}) for sec in JOB_SECTIONS)
    notes: list[str] = []

    def section(name: str) -> dict[str, Any]:
        sec = out.get(name)
        return sec if isinstance(sec, dict) else {}  # a malformed section is left for merge/parse_job to name

    def drop(sec: str, keys: tuple[str, ...] | list[str], why: str) -> None:
        gone = [k for k in keys if k in section(sec) and k not in given.get(sec, {})]
        for k in gone:
            del out[sec][k]
        if gone:
            notes.append(why)

    model = section("model")
    new_model = "hf_config" in gm or ("name" in gm and (gm["name"] != model.get("name") or "hf_config" in model))
    if from_default and new_model:
        dropped = [k for k in model if k not in gm and k != "name"]
        out["model"] = {}
        for sec, keys in _RECIPE.items():
            gone = [k for k in keys if k in section(sec) and k not in given.get(sec, {})]
            for k in gone:
                del out[sec][k]
            dropped += gone
        if dropped:
            notes.append(f"GPT-3's {', '.join(dropped)} dropped")
    elif "name" in gm or "hf_config" in gm:  # a model flag replaces the file's model, whichever way it names it
        for k in ("name", "hf_config"):
            if k in model and k not in gm:
                del out["model"][k]
    cluster, strategy = section("cluster"), section("strategy")
    if "tree" in gs:
        drop("strategy", [k for k in strategy if k != "tree"], "the tree replaces the other strategy keys")
        if from_default:
            drop("cluster", ("nodes",), "nodes from the tree's mesh")
    if "topology" in gc:
        drop("cluster", ("nodes", "gpus_per_node"), "the topology sets the GPU count")
    if "dp" in gs and "nodes" not in gc:
        drop("cluster", ("nodes",), "nodes from dp x tp x pp x cp")
    world_changed = any(k in gc for k in ("nodes", "gpus_per_node", "topology")) or \
        any(k in gs for k in ("tp", "pp", "cp")) or gc.get("name", cluster.get("name")) != cluster.get("name")
    if world_changed and "dp" not in gs and ("nodes" in section("cluster") or "topology" in section("cluster")
                                             or "topology" in gc or "nodes" in gc):
        drop("strategy", ("dp",), "dp from the GPU count")
    if gs.get("fsdp") and "zero" not in gs:
        drop("strategy", ("zero",), "zero stage replaced by --fsdp (full shard)")
    tp = gs.get("tp", section("strategy").get("tp", 1))
    file_strategy = (base or {}).get("strategy")
    file_sp = isinstance(file_strategy, dict) and "sequence_parallel" in file_strategy
    if tp == 1 and from_default and not file_sp and section("strategy").get("sequence_parallel") is True:
        drop("strategy", ("sequence_parallel",), "sp off as tp=1")  # the default's SP; one the user set is checked
    return LayeredJob(merge(out, flags), from_default, notes)


_FLAG_NAMES = {"sequence_parallel": "sp", "max_ongoing_micro_batch": "max-ongoing", "bandwidth_gbps": "bandwidth",
               "latency_ns": "latency", "tree": "strategy-tree", "hf_config": "hf-config",
               "offload_in_switch": "in-switch-collectives", "compute_model": "compute"}


def describe_flags(flags: dict[str, dict[str, Any]]) -> str:
    """The given flags (None = not given) as a command line would write them: '--model gpt2 --no-sp'."""
    parts = []
    for sec, vals in flags.items():
        for key, v in (vals or {}).items():
            if v is None:
                continue
            name = {"model": "model", "cluster": "cluster"}.get(sec, key) if key == "name" else key
            name = _FLAG_NAMES.get(name, name).replace("_", "-")
            if isinstance(v, bool):
                parts.append(f"--{name}" if v else ("--symmetric" if name == "exact" else f"--no-{name}"))
            elif isinstance(v, list):
                parts.append(f"--{name} {','.join(f'{x:g}' if isinstance(x, float) else str(x) for x in v)}")
            else:
                parts.append(f"--{name} {v}")
    return " ".join(parts)


def job_dict(job: JobConfig) -> dict[str, Any]:
    """The job as a job YAML writes it (set keys only; what --dump-config and simulate --json give)."""
    data = job.model_dump(mode="json", exclude_none=True)
    if job.model.hf_config is not None:  # the imported config is the model: no built-in name beside it
        data["model"].pop("name", None)
    return data


def dump_yaml(job: JobConfig) -> str:
    return yaml.safe_dump(job_dict(job), sort_keys=False)
