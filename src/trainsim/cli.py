"""Command line: `trainsim simulate | validate | calibrate | models | clusters`."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from .cli_astra import astra_app
from .cli_chakra import chakra_app
from .cli_predictor import predictor_app
from .cli_replay import optimize_cmd, replay_cmd, scale_cmd
from .cli_report import check_format, report_cmd, simulation_page
from .cli_search import auto_note, resolve_job, search_cmd
from .cli_sweep import sweep_cmd
from .config import DEFAULT_JOB_TEXT, LayeredJob, describe_flags, dump_yaml, parse_job
from .console import progress_bar, simulate_bar
from .errors import ConfigError
from .files import Outputs, OutputTarget, Payload, json_text, write_outputs
from .limits import MAX_COLLECTIVE_CHUNKS, MAX_GPUS

# rich_markup_mode=None: click's plain help, which keeps every option name whole at 80 columns (rich cuts them)
app = typer.Typer(add_completion=False, no_args_is_help=False, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="Predict distributed training performance before paying for the GPUs.")

Opt = typer.Option


def _version(value: bool) -> None:
    if value:
        from . import __version__

        print(f"trainsim {__version__}")
        raise typer.Exit()


@app.callback(invoke_without_command=True)
def _main(ctx: typer.Context, version: Annotated[bool, Opt("--version", callback=_version, is_eager=True,
                                                           help="print the version and exit")] = False) -> None:
    """Predict distributed training performance before paying for the GPUs."""
    if ctx.invoked_subcommand is None:  # bare `trainsim`: the commands, not an error
        print(ctx.get_help())


@app.command()
def simulate(
    config: Annotated[str | None, typer.Argument(help="YAML job file (model/cluster/strategy/simulation)")] = None,
    model: Annotated[str | None, Opt(help="model name (trainsim models) or 'custom'")] = None,
    hf_config: Annotated[str | None, Opt(help="import a local Hugging Face config.json (or its folder) instead of "
                                          "--model; --seq-len/--layers/... apply on top")] = None,
    cluster: Annotated[str | None, Opt(help="cluster preset (trainsim clusters)")] = None,
    nodes: Annotated[int | None, Opt(help="number of nodes (default: what the degrees need)")] = None,
    gpu: Annotated[str | None, Opt(help="replace the preset's GPU (e.g. h100-sxm)")] = None,
    gpus_per_node: Annotated[int | None, Opt(help="GPUs per node (switch-based presets)")] = None,
    intra_node_gbps: Annotated[float | None, Opt(help="NVLink GB/s per GPU per direction")] = None,
    nics_per_node: Annotated[int | None, Opt(help="network NICs per node")] = None,
    nic_gbps: Annotated[float | None, Opt(help="GB/s per NIC per direction (400 Gb/s = 50)")] = None,
    host_overhead_scale: Annotated[float | None, Opt(help="host (CPU) time per framework op against an x86 DGX "
                                                   "host's (a Grace host measured 2.75)")] = None,
    topology: Annotated[str | None, Opt(help="interconnect in ASTRA-sim notation, e.g. 'Switch(8)_Switch(16)', "
                                        "or a preset (trainsim collective --help); last dimension = network")] = None,
    bandwidth: Annotated[str | None, Opt(help="with --topology: GB/s per NPU per dimension, e.g. 300,25")] = None,
    latency: Annotated[str | None, Opt(help="with --topology: ns per hop per dimension, e.g. 1000,5000")] = None,
    comm_model: Annotated[str | None, Opt(help="nccl (NCCL's tuned choice) | analytical (ASTRA-sim multi-dim "
                                          "collectives)")] = None,
    scheduler: Annotated[str | None, Opt(help="collective scheduler for --comm-model analytical: baseline | "
                                         "themis")] = None,
    semantics: Annotated[str | None, Opt(help="collective semantics: nccl (default: what NCCL on the hardware "
                                         "does) | astra (ASTRA-sim 2.0's analytical backend, for parity)")] = None,
    astra_system: Annotated[str | None, Opt(help="with --semantics astra: ASTRA-sim system config JSON (chunks, "
                                            "algorithms, endpoint delay, local-mem-bw)")] = None,
    compute: Annotated[str | None, Opt(help="compute model: roofline (default) | learned:FILE (a stage-latency "
                                       "model from `trainsim predictor train`; trainsim[learn])")] = None,
    learned_extrapolation: Annotated[bool | None, Opt("--learned-extrapolation/--no-learned-extrapolation",
                                                      help="with --compute learned:FILE: also correct stages outside "
                                                           "the model's training ranges (default: roofline there)")
                                     ] = None,
    dp: Annotated[int | None, Opt(help="data-parallel degree (default: GPUs / (tp*pp*cp))")] = None,
    tp: Annotated[int | None, Opt(help="tensor-parallel degree (Megatron column/row)")] = None,
    pp: Annotated[int | None, Opt(help="pipeline-parallel degree")] = None,
    cp: Annotated[int | None, Opt(help="context-parallel degree")] = None,
    ep: Annotated[int | None, Opt(help="expert-parallel degree (MoE; divides dp)")] = None,
    vpp: Annotated[int | None, Opt(help="virtual stages per pipeline rank (interleaved 1F1B)")] = None,
    sp: Annotated[bool | None, Opt("--sp/--no-sp", help="sequence parallelism with TP")] = None,
    zero: Annotated[int | None, Opt(help="ZeRO stage 0-3")] = None,
    fsdp: Annotated[bool | None, Opt("--fsdp/--no-fsdp", help="FSDP full shard (= ZeRO-3)")] = None,
    recompute: Annotated[str | None, Opt(help="none | selective | full")] = None,
    schedule: Annotated[str | None, Opt(help="gpipe | 1f1b | interleaved | dynamic (Proteus HTAE: backward "
                                               "first, forward under --max-ongoing) | zb-h1 (zero bubble: "
                                               "weight gradients postponed into the bubble, 1F1B memory) | "
                                               "dualpipev (DeepSeek's DualPipeV: two chunks per rank in a V, "
                                               ">= 2 x pp micro-batches)")] = None,
    max_ongoing: Annotated[int | None, Opt("--max-ongoing", help="micro-batches a pipeline rank holds between "
                                           "forward and backward (1f1b: a lower cap; dynamic: the cap)")] = None,
    micro_batch: Annotated[int | None, Opt(help="micro-batch size per data-parallel rank")] = None,
    global_batch: Annotated[int | None, Opt(help="global batch (sequences/samples per iteration)")] = None,
    overlap_grad_reduce: Annotated[bool | None, Opt("--overlap-grad-reduce/--no-overlap-grad-reduce",
                                                    help="overlap DP gradient sync with backward")] = None,
    overlap_param_gather: Annotated[bool | None, Opt("--overlap-param-gather/--no-overlap-param-gather",
                                                     help="ZeRO/distributed-optimizer parameter all-gather "
                                                          "overlapped with the next forward")] = None,
    tp_comm_overlap: Annotated[bool | None, Opt("--tp-comm-overlap/--no-tp-comm-overlap",
                                                help="TP all-gather/reduce-scatter pipelined with the GEMMs "
                                                     "they feed (Megatron --tp-comm-overlap)")] = None,
    cp_comm: Annotated[str | None, Opt(help="context-parallel attention: p2p (ring, default) | all_gather")] = None,
    ep_dispatcher: Annotated[str | None, Opt(help="MoE token dispatch: alltoall (NCCL, default) | deepep "
                                                  "(two-hop: one copy per node over RDMA, NVLink forwarding) | "
                                                  "hybridep (the same at HybridEP's per-SM rate)")] = None,
    ep_dispatcher_sms: Annotated[int | None, Opt(help="with --ep-dispatcher hybridep: SMs its kernels run on "
                                                      "(Megatron --moe-hybridep-num-sms, default 16)")] = None,
    ep_overlap: Annotated[bool | None, Opt("--ep-overlap/--no-ep-overlap",
                                           help="EP all-to-alls hidden under another micro-batch's opposite pass "
                                                "(Megatron --overlap-moe-expert-parallel-comm, DualPipe)")] = None,
    ep_node_limit: Annotated[int | None, Opt(help="with a two-hop --ep-dispatcher: nodes a token reaches at most "
                                                  "(DeepSeek-V3's node-limited routing: 4)")] = None,
    cuda_graphs: Annotated[str | None, Opt(help="CUDA graphs: none (default) | full_iteration | captured modules, "
                                                "comma-separated: attn, mlp, moe_router, moe_preprocess, moe, "
                                                "mamba (Megatron --cuda-graph-scope)")] = None,
    dp_replicate: Annotated[int | None, Opt(help="HSDP: replicas of each FSDP/ZeRO sharding group "
                                                 "(shard over dp / dp_replicate ranks)")] = None,
    first_stage_layers: Annotated[int | None, Opt(help="uneven pipeline: layers on the first stage (Megatron "
                                                       "--decoder-first-pipeline-num-layers)")] = None,
    last_stage_layers: Annotated[int | None, Opt(help="uneven pipeline: layers on the last stage")] = None,
    p2p_scatter_gather: Annotated[bool | None, Opt("--p2p-scatter-gather/--no-p2p-scatter-gather",
                                                   help="Megatron's scatter/gather pipeline hand-off (default on): "
                                                        "1/tp per rank, all-gathered on arrival")] = None,
    offload: Annotated[str | None, Opt(help="none | cpu | nvme (ZeRO-Infinity) | remote (HierMem pool): where "
                                            "weights, gradients and optimizer states live")] = None,
    remote_memory: Annotated[str | None, Opt("--remote-memory", help="with --offload remote: ASTRA-sim's remote "
                                             "memory JSON as the pool (cluster.remote_memory pool astra)")] = None,
    offload_activations: Annotated[bool | None, Opt("--offload-activations/--no-offload-activations",
                                                    help="with --recompute full: each layer's checkpointed input "
                                                         "kept in CPU memory between its forward and backward "
                                                         "(torchtune activation offloading)")] = None,
    in_switch_collectives: Annotated[bool | None, Opt("--in-switch-collectives/--no-in-switch-collectives",
                                                      help="with --offload remote and --zero 3 / --fsdp: the "
                                                           "pool's switches gather parameters while loading and "
                                                           "reduce-scatter gradients while storing "
                                                           "(strategy.offload_in_switch)")] = None,
    seq_len: Annotated[int | None, Opt(help="sequence length (tokens)")] = None,
    layers: Annotated[int | None, Opt(help="override/define number of layers")] = None,
    hidden: Annotated[int | None, Opt(help="override/define hidden size")] = None,
    heads: Annotated[int | None, Opt(help="override/define attention heads")] = None,
    kv_heads: Annotated[int | None, Opt(help="override/define kv heads (GQA)")] = None,
    ffn: Annotated[int | None, Opt(help="override/define FFN hidden size")] = None,
    vocab: Annotated[int | None, Opt(help="override/define vocabulary size")] = None,
    attention: Annotated[str | None, Opt(help="flash (FlashAttention-2) | flash3 | cudnn | triton | unfused")] = None,
    kernels: Annotated[str | None, Opt(help="fused (Megatron/TE/torch.compile kernels) | eager (PyTorch eager: "
                                            "RMSNorm, SwiGLU, RoPE and the loss as element-wise chains)")] = None,
    mlp: Annotated[str | None, Opt(help="override the MLP: gelu | swiglu | relu2")] = None,
    position: Annotated[str | None, Opt(help="override the position encoding: learned | rope | alibi")] = None,
    norm: Annotated[str | None, Opt(help="override the norm: layernorm | rmsnorm")] = None,
    lora_rank: Annotated[int | None, Opt(help="LoRA fine-tuning: freeze every parameter and train rank-R "
                                              "adapters (model.lora_rank)")] = None,
    lora_targets: Annotated[str | None, Opt(help="with --lora-rank: the adapted matrices, a comma list of q, k, "
                                                 "v, o, mlp, output (default q,v)")] = None,
    lora_base: Annotated[str | None, Opt(help="with --lora-rank: bf16 (LoRA) | nf4 (QLoRA: the adapted "
                                              "matrices in 4-bit NormalFloat)")] = None,
    dtype: Annotated[str | None, Opt(help="auto (default: bf16 from Ampere on, fp16 on V100, fp32 on Pascal) | bf16 "
                                        "| fp16 | fp8 | fp4 | tf32 | fp32")] = None,
    master_weights: Annotated[bool | None, Opt("--master-weights/--no-master-weights",
                                               help="fp32 master weights and optimizer states (mixed precision, "
                                                    "the default) or none: weights, gradients and optimizer "
                                                    "states all in the training dtype (bf16-true)")] = None,
    optimizer: Annotated[str | None, Opt(help="adam (default: Adam/AdamW, two moments) | adam_8bit (block-wise "
                                              "8-bit moments) | adafactor (factored second moment) | muon")] = None,
    optimizer_in_backward: Annotated[bool | None, Opt("--optimizer-in-backward/--no-optimizer-in-backward",
                                                      help="step and free each gradient as backward makes it "
                                                           "(torchtune's optimizer_in_bwd; one micro-batch per "
                                                           "step, no pipeline)")] = None,
    grad_bucket_copy: Annotated[bool | None, Opt("--grad-bucket-copy/--no-grad-bucket-copy",
                                                 help="PyTorch DDP without gradient_as_bucket_view: a second "
                                                      "copy of the gradients in its buckets")] = None,
    fp8_params: Annotated[bool | None, Opt("--fp8-params/--no-fp8-params",
                                           help="with --dtype fp8: the blocks' linear weights kept and all-gathered "
                                                "in FP8 (Megatron --fp8-param-gather)")] = None,
    fp8_activations: Annotated[bool | None, Opt("--fp8-activations/--no-fp8-activations",
                                                help="with --dtype fp8: the blocks' linear inputs cached for the "
                                                     "backward in FP8 (DeepSeek-V3)")] = None,
    gamma: Annotated[float | None, Opt(help="compute slowdown while overlapped with grad comm (Proteus)")] = None,
    exact: Annotated[bool | None, Opt("--exact/--symmetric", help="simulate every rank (slow) or rank classes")] = None,
    bandwidth_sharing: Annotated[bool | None, Opt("--bandwidth-sharing/--no-bandwidth-sharing",
                                                  help="concurrent communication shares links (max-min fair)")] = None,
    granularity: Annotated[str | None, Opt(help="auto | layer | op (task granularity)")] = None,
    fidelity: Annotated[str | None, Opt(help="event (default: the discrete-event simulation, timeline and critical "
                                           "path) | analytic (closed form from the same costs: sub-ms, no "
                                           "timeline)")] = None,
    calibration: Annotated[str | None, Opt(help="calibration YAML from `trainsim calibrate`")] = None,
    json_out: Annotated[str | None, Opt("--json", help="write the result summary as JSON (- for stdout)")] = None,
    trace: Annotated[str | None, Opt(help="write a Chrome/Perfetto trace JSON")] = None,
    report: Annotated[str | None, Opt(help="write the HTML report: timeline with the critical path, where the "
                                           "time goes, memory against capacity (opens offline)")] = None,
    dump_config: Annotated[str | None, Opt(help="write the resolved job as YAML")] = None,
    strategy_tree: Annotated[str | None, Opt("--strategy-tree", help="simulate a saved strategy tree (YAML from "
                                              "--dump-strategy or StrategyTree.to_yaml) instead of the "
                                              "strategy flags")] = None,
    dump_strategy: Annotated[str | None, Opt("--dump-strategy", help="write the job's resolved strategy tree "
                                              "(every op's split, memory configs, pipeline chunks) as YAML, "
                                              "to edit and run with --strategy-tree")] = None,
    search_time_limit: Annotated[float | None, Opt("--search-time-limit", help="with no parallel degree given, "
                                                   "search the strategy for at most this many seconds "
                                                   "(default 60)")] = None,
    max_micro_batch: Annotated[bool, Opt("--max-micro-batch", help="also find the largest micro-batch that fits "
                                         "in memory with this strategy and global batch (a few simulations)")] = False,
    quiet: Annotated[bool, Opt("--quiet", "-q", help="no summary on stdout")] = False,
) -> None:
    """Predict one training iteration (no arguments: GPT-3 175B on 1024 A100-80GB, Megatron 3D parallel)."""
    outs = Outputs()  # every output path is checked before any work is done
    json_target, trace_target = outs.add(json_out, "--json"), outs.add(trace, "--trace")
    report_target = outs.add(report, "--report")
    if report_target is not None:
        if report_target.to_stdout:
            raise ConfigError("--report", "a report is a file, not standard output", "pass a file such as report.html")
        check_format("html")
    strategy_target, config_target = outs.add(dump_strategy, "--dump-strategy"), outs.add(dump_config, "--dump-config")
    flags: dict[str, Any] = {
        "model": {"name": model, "hf_config": str(hf_config) if hf_config is not None else None, "seq_len": seq_len, "layers": layers, "hidden": hidden, "heads": heads,
                  "kv_heads": kv_heads, "ffn": ffn, "vocab": vocab, "attention": attention, "kernels": kernels,
                  "mlp": mlp, "position": position, "norm": norm, "lora_rank": lora_rank,
                  "lora_targets": [x.strip() for x in lora_targets.split(",") if x.strip()]
                  if lora_targets is not None else None, "lora_base": lora_base},
        "cluster": {"name": cluster, "nodes": nodes, "gpu": gpu, "gpus_per_node": gpus_per_node,
                    "intra_node_gbps": intra_node_gbps, "nics_per_node": nics_per_node, "nic_gbps": nic_gbps,
                    "host_overhead_scale": host_overhead_scale,
                    "topology": topology, "bandwidth_gbps": _floats(bandwidth, "--bandwidth"),
                    "latency_ns": _floats(latency, "--latency"),
                    "remote_memory": {"pool": "astra", "config": str(remote_memory)}
                    if remote_memory is not None else None},
        "strategy": {"dp": dp, "tp": tp, "pp": pp, "cp": cp, "ep": ep, "vpp": vpp, "sequence_parallel": sp,
                     "zero": zero, "fsdp": fsdp, "recompute": recompute, "schedule": schedule,
                     "max_ongoing_micro_batch": max_ongoing,
                     "micro_batch": micro_batch, "global_batch": global_batch,
                     "overlap_grad_reduce": overlap_grad_reduce, "overlap_param_gather": overlap_param_gather,
                     "tp_comm_overlap": tp_comm_overlap, "cp_comm": cp_comm, "ep_dispatcher": ep_dispatcher,
                     "ep_node_limit": ep_node_limit, "ep_dispatcher_sms": ep_dispatcher_sms, "ep_overlap": ep_overlap,
                     "cuda_graphs": cuda_graphs,
                     "dp_replicate": dp_replicate, "first_stage_layers": first_stage_layers,
                     "last_stage_layers": last_stage_layers, "offload": offload,
                     "offload_in_switch": in_switch_collectives, "offload_activations": offload_activations,
                     "p2p_scatter_gather": p2p_scatter_gather,
                     "tree": str(strategy_tree) if strategy_tree is not None else None},
        "simulation": {"dtype": dtype, "master_weights": master_weights, "optimizer": optimizer,
                       "optimizer_in_backward": optimizer_in_backward, "grad_bucket_copy": grad_bucket_copy,
                       "fp8_params": fp8_params, "fp8_activations": fp8_activations,
                       "gamma": gamma, "exact": exact, "granularity": granularity,
                       "fidelity": fidelity, "calibration": calibration, "comm_model": comm_model,
                       "scheduler": scheduler, "bandwidth_sharing": bandwidth_sharing, "semantics": semantics,
                       "compute_model": compute, "learned_extrapolation": learned_extrapolation,
                       "astra_system": astra_system},
    }
    if model is not None and hf_config is not None:
        raise ConfigError("--hf-config", "and --model both name the model", "pass only one of them")
    job, searched, layered = resolve_job(config, flags, quiet or outs.to_stdout, search_time_limit)
    from .api import resolved_job, simulation_json
    from .api import simulate as run_simulation
    from .report.chrome_trace import chrome_trace_json
    from .report.summary import print_summary

    if trace_target is not None and job.simulation.fidelity == "analytic":
        raise ConfigError("--trace", "the analytic tier has no timeline to write",
                          "drop --trace, or simulate with --fidelity event")
    with simulate_bar() as bar:
        result = run_simulation(job, progress=bar, timeline=trace_target is not None or report_target is not None)
    oom_cache: dict[str, Any] = {}

    def oom_account() -> dict[str, Any]:
        """The OOM report (optimize.oom_fixes: candidate changes simulated), computed once for JSON and text."""
        if not oom_cache:
            from .optimize.oom_fixes import oom_report

            oom_cache.update(oom_report(job, result))
        return oom_cache

    fit = None
    if max_micro_batch:
        from .optimize.micro_batch import largest_fitting_micro_batch

        fit = largest_fitting_micro_batch(job, result)
    payloads: dict[OutputTarget | None, Payload] = {}
    if json_target is not None:
        data = simulation_json(job, result, searched)
        if fit is not None:
            data["max_micro_batch"] = fit.to_json()
        if result.oom:
            data["oom_report"] = oom_account()
        payloads[json_target] = json_text(data, "--json")
    if trace_target is not None:
        payloads[trace_target] = chrome_trace_json(result)
    if report_target is not None:
        payloads[report_target] = simulation_page(job, result, searched, config or "the default job")
    if strategy_target is not None:
        from .api import strategy_tree as job_tree

        payloads[strategy_target] = job_tree(job).to_yaml()
    if config_target is not None:
        resolved = resolved_job(job, result)
        payloads[config_target] = dump_yaml(resolved)
    if not quiet and not outs.to_stdout:
        # the summary names --remote-memory by its path, not by the cluster.remote_memory section it sets
        line = _job_line(config, layered, {**flags, "cluster": {**flags["cluster"], "remote_memory": remote_memory}})
        print_summary(result, job=f"{line}; {auto_note(searched)}" if searched else line)
        if fit is not None:
            print(fit.describe())
        if result.oom:
            for text in oom_account()["suggestion_lines"]:
                print(text)
    write_outputs(payloads)


@app.command()
def validate(
    cases: Annotated[str, typer.Argument(help="CSV of measured runs: training_runs.csv, vTrain ground_truth_*.csv, "
                                          "collectives.csv, alltoall.csv or astra_reference.csv format (see "
                                          "shared/validation/README.md)")],
    json_out: Annotated[str | None, Opt("--json", help="write summary, rows and skipped rows as JSON")] = None,
    plot: Annotated[str | None, Opt(help="write a predicted-vs-measured scatter (PNG; needs trainsim[plot])")] = None,
    max_mape: Annotated[float | None, Opt(help="exit 1 when the mean absolute % error exceeds this")] = None,
    tier: Annotated[str | None, Opt(help="only these tiers, e.g. A,B (training_runs format)")] = None,
    subset: Annotated[str | None, Opt(help="only these subsets, e.g. core (training_runs format)")] = None,
    calibration: Annotated[str | None, Opt(help="calibration YAML (default: the packaged one)")] = None,
    jobs: Annotated[int | None, Opt(help="worker processes (default: CPU count, at most 8)")] = None,
    all_rows: Annotated[bool, Opt("--all", help="print every row, not only the largest errors")] = False,
    by: Annotated[str | None, Opt("--by", help="error statistics per group of rows with equal values of "
                                  "these columns, e.g. source (training_runs: source_group), gpu, dp; "
                                  "vTrain: tp, pp, gpus; collectives: hardware, collective, nodes")] = None,
    quiet: Annotated[bool, Opt("-q", "--quiet", help="print only the summary line (and the --by "
                                                     "table)")] = False,
    semantics: Annotated[str | None, Opt(help="ASTRA-sim reference files: predict in ASTRA-sim's semantics (astra, "
                                         "the default there) or NCCL's (nccl: shows the gap, by term)")] = None,
    compute: Annotated[str | None, Opt(help="training runs: the compute model, roofline (default) | learned:FILE "
                                       "(`trainsim predictor train`; trainsim[learn])")] = None,
    learned_extrapolation: Annotated[bool, Opt("--learned-extrapolation", help="with --compute learned:FILE: also "
                                               "correct stages outside the model's training ranges")] = False,
) -> None:
    """Compare predictions with published measurements, row by row, and summarise the error."""

    from .validate import runner
    from .validate.report import plot_validation, print_groups, print_validation, require_matplotlib
    from .validate.runner import default_jobs, detect_kind, filter_rows, read_rows, run_rows

    outs = Outputs()
    json_target, plot_target = outs.add(json_out, "--json"), outs.add(plot, "--plot")
    if plot_target is not None:
        require_matplotlib()  # before simulating every row, not after

    if max_mape is not None and not 0 <= max_mape < math.inf:
        raise ConfigError("--max-mape", f"must be a finite percentage >= 0, got {max_mape}", "pass e.g. 7")
    _check_jobs(jobs)
    if calibration is not None:
        from .cost.calibration import load_calibration

        load_calibration(calibration)  # validate it up front: one clear error, not one per row
    if semantics not in (None, "astra", "nccl"):
        raise ConfigError("--semantics", f"'{semantics}' is unknown", "use astra or nccl")
    header, rows = read_rows(cases)
    kind = detect_kind(header)
    if learned_extrapolation and compute is None:
        raise ConfigError("--learned-extrapolation", "applies to a learned compute model only",
                          "add --compute learned:FILE, or drop it")
    if compute is not None:
        if kind not in ("training_runs", "vtrain"):
            raise ConfigError("--compute", f"applies to training runs, not {kind}", "drop --compute")
        from .api import check_compute_model

        try:
            check_compute_model(parse_job({"simulation": {"compute_model": compute}}).simulation)  # once, not
            # as every row's skip reason
        except ConfigError as exc:
            raise ConfigError("--compute", exc.problem, exc.fix) from None
    if semantics is not None and kind != "astra_reference":
        raise ConfigError("--semantics", f"applies to ASTRA-sim reference files, not {kind}",
                          "drop --semantics (set simulation.semantics in a job to simulate in ASTRA-sim's)")
    by_cols = runner.resolve_columns(kind, header, by, "--by") if by is not None else []
    split = (lambda x: {t.strip() for t in x.split(",") if t.strip()} if x else None)  # noqa: E731
    idx, rows = filter_rows(kind, rows, split(tier), split(subset))
    if not rows:
        raise ConfigError("CASES", f"no rows in {cases} (after filters)", "check --tier/--subset")
    cal = calibration
    with progress_bar(quiet=quiet) as bar:
        task = bar.add_task(f"simulating {len(rows)} {kind} rows", total=len(rows))
        report = run_rows(kind, rows, cal, jobs or default_jobs(), lambda k: bar.advance(task, k), idx,
                          semantics=semantics or "astra",
                          simulation={"compute_model": compute, "learned_extrapolation": learned_extrapolation}
                          if compute is not None else None)
    if by_cols:
        label = runner.file_label(kind, cases)
        keys = {i: runner.group_key(r, by_cols, label) for i, r in zip(idx, rows, strict=True)}
        report.by, report.by_group = by_cols, runner.stats_by_group(report.outcomes, lambda o: keys[o.row])
    elif defaults := runner.default_groupings(kind, header):  # moe_runs.csv: per model and per GPU, unasked
        label = runner.file_label(kind, cases)
        for col in defaults:
            keys = {i: runner.group_key(r, [col], label) for i, r in zip(idx, rows, strict=True)}
            report.default_groups[col] = runner.stats_by_group(report.outcomes, lambda o, k=keys: k[o.row])
    payloads: dict[OutputTarget | None, Payload] = {}
    if json_target is not None:
        payloads[json_target] = json_text(report.to_json(), "--json")
    if plot_target is not None:
        payloads[plot_target] = plot_validation(report)
    write_outputs(payloads)
    s = report.summary()
    if quiet and not outs.to_stdout:  # with the JSON on stdout, the report stays off it
        print(f"{kind}: n={s['n']} skipped={s['skipped']} mape={s['mape']:.2f}% median={s['median_ape']:.2f}% "
              f"max={s['max_ape']:.2f}% spearman={s['spearman']:.3f} kendall={s['kendall']:.3f}")
        if s.get("memory", {}).get("n"):
            m = s["memory"]
            print(f"memory: n={m['n']} mape={m['mape']:.2f}% median={m['median_ape']:.2f}% max={m['max_ape']:.2f}% "
                  f"oom_wrong={m['oom_wrong']}")
    elif not outs.to_stdout:
        print_validation(report, show_all=all_rows)
    if by_cols and not outs.to_stdout:
        print_groups(report)
    for col, stats in report.default_groups.items():
        if not outs.to_stdout:
            print_groups(dataclasses.replace(report, by=[col], by_group=stats))
    if max_mape is not None and not s["mape"] <= max_mape:
        print(f"MAPE {s['mape']:.2f}% is above --max-mape {max_mape:g}%", file=sys.stderr)
        raise typer.Exit(1)


@app.command()
def calibrate(
    measurements: Annotated[list[str], typer.Argument(help="CSV files: end-to-end runs (training_runs.csv or vTrain "
                                                       "format) and/or kernel measurements (gemm/attention/memory "
                                                       "CSVs as in trainsim/data/measurements)")],
    out: Annotated[str | None, Opt(help="where to write the fitted calibration YAML (optional with --cv: "
                                        "the fit on every row)")] = None,
    family: Annotated[str, Opt(help="device family the constants belong to (a100, h100, v100, ...)")] = "a100",
    fit_params: Annotated[str, Opt("--fit", help="comma-separated constants fitted to end-to-end runs")] =
        "gemm_peak_fraction,hbm_efficiency,host_overhead_s,collective_host_s",
    calibration: Annotated[str | None, Opt(help="starting calibration (default: the packaged one)")] = None,
    every: Annotated[int, Opt(help="use every N-th row of large files (faster fits)")] = 1,
    sweeps: Annotated[int, Opt(help="coordinate-descent sweeps")] = 2,
    jobs: Annotated[int | None, Opt(help="worker processes")] = None,
    cv: Annotated[str | None, Opt("--cv", help="leave-one-group-out cross-validation: per value of this "
                                  "column (source = training_runs' source_group; a file without the column "
                                  "is one group, e.g. vtrain_multi), fit on the other rows and predict the "
                                  "group's")] = None,
    json_out: Annotated[str | None, Opt("--json", help="write the fitted values (with --cv: the per-group "
                                        "held-out errors) as JSON")] = None,
) -> None:
    """Re-fit trainsim's constants to your own measurements and write a calibration file."""
    from .cost.calibration import device_family, dump_calibration, load_calibration
    from .hardware.devices import DEVICES
    from .validate import calibrate as fitting
    from .validate import runner
    from .validate.report import print_cross_validation

    for flag, value in (("--every", every), ("--sweeps", sweeps)):
        if value < 1:
            raise ConfigError(flag, f"must be >= 1, got {value}", "pass a positive integer")
    _check_jobs(jobs)
    if out is None and cv is None:
        raise ConfigError("--out", "missing", "pass --out FILE for the fitted calibration (optional only "
                          "with --cv)")
    outs = Outputs()
    out_target, json_target = outs.add(out, "--out"), outs.add(json_out, "--json")
    cal = load_calibration(calibration)
    families = sorted({device_family(d) for d in DEVICES.values()} | set(cal.compute))
    if family not in families:  # checked before a long fit, not after
        raise ConfigError("--family", f"'{family}' is not a device family", f"use one of {', '.join(families)}")
    names = [n.strip() for n in fit_params.split(",") if n.strip()]
    for name in names:
        if name not in fitting.BOUNDS:
            raise ConfigError("--fit", f"'{name}' cannot be fitted",
                              f"choose from {', '.join(fitting.BOUNDS)}")
    cv_names = runner.split_columns(cv, "--cv") if cv is not None else []
    if cv_names and not names:
        raise ConfigError("--fit", "nothing to fit", "name the constants to cross-validate, e.g. --fit gamma")
    datasets, kernel_files = [], []
    if not all(measurements):
        raise ConfigError("MEASUREMENTS", "empty path", "pass the CSV files to fit to")
    found: set[str] = set()  # --cv names that are a column (or the file) somewhere
    first_header: tuple[str, list[str]] | None = None
    labels: set[str] = set()
    for path in map(Path, measurements):
        header, rows = runner.read_rows(path)
        cols = set(header)
        if {"m", "n", "k", "tflops"} <= cols or {"seq_len", "head_dim", "tflops"} <= cols or {"op", "gbps"} <= cols:
            kernel_files.append(path)
            continue
        kind = runner.detect_kind(header)
        if kind in ("collectives", "alltoall"):
            raise ConfigError(str(path), "collective measurements are fitted per link type in the comm section",
                              "edit the comm: section, then check it with `trainsim validate` on the file")
        idx = list(range(len(rows)))[::every]
        name = path.name if path.name not in {d.name for d in datasets} else f"{path.name}#{len(datasets) + 1}"
        ds = fitting.Dataset(kind, rows[::every], idx, name)  # (a name twice: #n keeps rows apart)
        if cv_names:
            first_header = first_header or (kind, header)
            resolved = [runner.resolve_column(kind, header, n) for n in cv_names]
            found |= {n for n, c in zip(cv_names, resolved, strict=True) if c is not None}
            label = runner.file_label(kind, path)
            label = label if label not in labels else f"{label}#{len(datasets) + 1}"
            labels.add(label)
            cols = [c or runner.FILE_COLUMN for c in resolved]  # a file without the column is one group
            ds.groups = [runner.group_key(r, cols, label) for r in ds.rows]
        datasets.append(ds)
    if cv_names:
        if not datasets:
            raise ConfigError("--cv", "needs end-to-end runs to hold out",
                              "add a training_runs or vTrain CSV")
        missing = [n for n in cv_names if n not in found]
        if missing and first_header is not None:
            raise ConfigError("--cv", f"'{missing[0]}' is a column of none of the files",
                              f"use one of: {runner.column_choices(*first_header)}")
        groups = sorted({g for d in datasets for g in d.groups or []}, key=runner.natural_key)
        if len(groups) < 2:
            raise ConfigError("--cv", f"the rows form {len(groups)} group(s): {', '.join(groups) or 'none'}",
                              "choose a column with at least two values (or give several files)")
    con = Console(stderr=outs.to_stdout)  # with --out - or --json -, that output alone goes to stdout
    if kernel_files:
        cal, report = fitting.fit_kernels(cal, kernel_files)
        for fam, rep in report.items():
            con.print(f"kernel fit {fam}: {rep}")
    payloads: dict[OutputTarget | None, Payload] = {}
    n_jobs = jobs or runner.default_jobs()
    if cv_names:
        total = fitting.cv_evaluations(len(groups), len(names), sweeps)
        with progress_bar() as bar:
            task = bar.add_task("cross-validating", total=total)
            result = fitting.cross_validate(
                cal, family, names, datasets, sweeps=sweeps, jobs=n_jobs, on_eval=lambda: bar.advance(task),
                on_fold=lambda g: bar.update(task, description=f"fit without {g}"))
        cal, result.by = result.all_fit.calibration, cv_names
        print_cross_validation(result, con)
        if json_target is not None:
            payloads[json_target] = json_text(result.to_json(), "--json")
    else:
        fitted: dict[str, Any] = {"family": family, "fit": [], "values": {}, "loss_before": None,
                                  "loss_after": None}
        if datasets and names:
            res = fitting.fit(cal, family, names, datasets, sweeps=sweeps, jobs=n_jobs,
                              progress=lambda msg: con.print(msg))
            cal = res.calibration
            con.print(f"mean |log error| {res.loss_before:.4f} -> {res.loss_after:.4f}")
            fitted.update(fit=names, values={n: fitting.current_value(cal, family, n) for n in names},
                          loss_before=res.loss_before, loss_after=res.loss_after)
        if json_target is not None:
            payloads[json_target] = json_text(fitted, "--json")
    if out_target is not None:
        payloads[out_target] = dump_calibration(cal)
    write_outputs(payloads)
    if out is not None:
        con.print(f"wrote {out}; use it with --calibration {out}")


def _job_line(config: Path | None, layered: LayeredJob, flags: dict[str, Any]) -> str:
    """Where the job came from, for the summary: the default or the file, the flags on top, what they dropped."""
    line = f"the default job ({DEFAULT_JOB_TEXT})" if layered.from_default else str(config)
    given = describe_flags(flags)
    line += f" with {given}" if given else ""
    notes = ([f"{config} sets no model/cluster/strategy"] if layered.from_default and config is not None else []) \
        + layered.notes
    if notes:
        line += " (" + "; ".join(notes) + ")"
    if layered.from_default and not given:
        line += "; flags such as --model, --nodes, --tp change it"
    return line


def _check_jobs(jobs: int | None) -> None:
    if jobs is not None and jobs < 1:
        raise ConfigError("--jobs", f"must be >= 1, got {jobs}", "pass a worker count, or leave it out for the default")


def _floats(text: str | None, flag: str) -> list[float] | None:
    if text is None:
        return None
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(flag, f"'{text}' is not a comma list of numbers", f"write e.g. {flag} 1000,200,100,50") from None
    if not all(math.isfinite(v) for v in values):
        raise ConfigError(flag, f"'{text}' holds a value that is not a finite number", f"write e.g. {flag} 1000,200")
    return values


@app.command()
def collective(
    op: Annotated[str, Opt(help="all_reduce | all_gather | reduce_scatter | all_to_all | broadcast | reduce | "
                                "send_recv")] = "all_reduce",
    size: Annotated[str, Opt("--bytes", help="message size, nccl-tests convention: all-reduce/broadcast/reduce = "
                             "the buffer, all-gather = the gathered OUTPUT per rank, reduce-scatter = the INPUT per "
                             "rank, all-to-all = the send buffer per rank, send_recv = bytes sent; "
                             "1073741824, 1GiB, 64MiB, 500MB")] = "1GiB",
    topology: Annotated[str | None, Opt(help="ASTRA-sim notation, innermost first, e.g. "
                                        "'Ring(2)_FC(8)_Ring(8)_Switch(4)', or a preset (conv-4d, wafer-2d, "
                                        "tpuv4-3d-torus, dgx-a100, ...)")] = None,
    bandwidth: Annotated[str | None, Opt(help="GB/s per NPU per direction, one per dimension: 1000,200,100,50")] = None,
    latency: Annotated[str | None, Opt(help="ns per hop, one per dimension: 500,500,500,500")] = None,
    bandwidth_unit: Annotated[str, Opt(help="GB (1e9 B/s) or GiB (2^30 B/s, what ASTRA-sim's configs mean by "
                                            "GB/s)")] = "GB",
    scheduler: Annotated[str, Opt(help="baseline | themis (analytical model)")] = "baseline",
    chunks: Annotated[int | None, Opt(help="chunks the collective is split into for pipelining (analytical model; "
                                           "default 64)")] = None,
    algorithms: Annotated[str | None, Opt(help="per-dimension algorithm override: ring, direct, halving_doubling, "
                                          "double_binary_tree, in_switch (switch only), e.g. ring,direct,in_switch")
                          ] = None,
    cluster: Annotated[str | None, Opt(help="cluster preset instead of --topology (NCCL-like by default)")] = None,
    ranks: Annotated[int | None, Opt(help="with --cluster: how many GPUs take part (the first N)")] = None,
    comm_model: Annotated[str | None, Opt("--model", help="nccl (default with --cluster) or analytical (default "
                                         "with --topology)")] = None,
    peer: Annotated[int | None, Opt(help="send_recv: the receiving rank, 1..N-1 (the sender is rank 0; default 1)")]
        = None,
    json_out: Annotated[str | None, Opt("--json", help="write time_us, algbw_gbps, busbw_gbps, per_dim")] = None,
    semantics: Annotated[str | None, Opt(help="nccl (default: what NCCL on the hardware does) | astra (ASTRA-sim "
                                         "2.0's analytical backend; the default with --astra-network)")] = None,
    astra_network: Annotated[str | None, Opt(help="ASTRA-sim network config (YAML/JSON: topology, npus_count, "
                                             "bandwidth in ASTRA's GB/s = GiB/s per link, latency) instead of "
                                             "--topology")] = None,
    astra_system: Annotated[str | None, Opt(help="ASTRA-sim system config JSON: chunks (preferred-dataset-splits), "
                                            "per-op algorithms, endpoint delay, local-mem-bw")] = None,
    queues: Annotated[int, Opt("--num-queues-per-dim", help="ASTRA-sim semantics: chunks in flight per "
                               "dimension (ASTRA-sim's --num-queues-per-dim)")] = 1,
    backend: Annotated[str, Opt(help="ASTRA-sim semantics: unaware | aware (congestion-aware, 1-D)")] = "unaware",
    compare: Annotated[str | None, Opt(help="astra: print ASTRA-sim's and trainsim's NCCL-like prediction side by "
                                            "side, with the terms that separate them")] = None,
) -> None:
    """Time one collective on a topology or cluster (nccl-tests style): time, algbw, busbw, per dimension."""
    json_target = Outputs().add(json_out, "--json")
    from .cli_astra import check_semantics, print_gap, read_as, read_inputs

    if semantics is not None:
        check_semantics(semantics, "--semantics")
    if compare is not None and check_semantics(compare, "--compare") != "astra":
        raise ConfigError("--compare", f"'{compare}' is not a comparison", "use --compare astra")
    inputs = None
    if astra_network is not None:
        if topology is not None or cluster is not None:
            raise ConfigError("--astra-network", "replaces --topology and --cluster", "give only one of them")
        if astra_system is None:
            raise ConfigError("--astra-system", "is needed with --astra-network (chunks, algorithms, endpoint delay)",
                              "pass the ASTRA-sim system config JSON of the run")
        inputs = read_inputs(astra_network, astra_system, None, backend, queues, "--astra-network",
                             "--astra-system")
        semantics = semantics or "astra"
        if comm_model == "nccl":
            raise ConfigError("--model", "ASTRA-sim inputs run on the analytical model (NCCL's tuner model has no "
                              "ASTRA-sim topology)", "drop --model, or use --semantics nccl for the NCCL-like terms")
        comm_model = "analytical"
    elif astra_system is not None:
        raise ConfigError("--astra-system", "goes with --astra-network", "add --astra-network N.yml, or drop it")
    semantics = semantics or "nccl"
    if (semantics == "astra" or compare) and comm_model is None:
        comm_model = "analytical"  # ASTRA-sim's semantics are settings of the analytical model
    if (semantics == "astra" or compare) and comm_model == "nccl":
        raise ConfigError("--semantics", "ASTRA-sim's semantics are settings of the analytical model, not of NCCL's "
                          "tuner model", "drop --model nccl (the analytical model runs on the cluster's levels)")
    if (queues != 1 or backend != "unaware") and semantics != "astra":
        raise ConfigError("--num-queues-per-dim" if queues != 1 else "--backend", "applies in ASTRA-sim semantics",
                          "add --semantics astra, or drop it")
    from .cost.microbench import analytical_collective, nccl_collective, parse_bytes
    from .cost.multidim import COLLECTIVES, SCHEDULERS
    from .hardware.cluster import get_cluster
    from .hardware.topology import GIB_PER_S_IN_GBPS, resolve_topology

    if op not in COLLECTIVES:
        raise ConfigError("--op", f"'{op}' is not a collective", f"use one of {', '.join(COLLECTIVES)}")
    if scheduler not in SCHEDULERS:
        raise ConfigError("--scheduler", f"'{scheduler}' is unknown", f"use one of {', '.join(SCHEDULERS)}")
    if bandwidth_unit.lower() not in ("gb", "gib"):
        raise ConfigError("--bandwidth-unit", f"'{bandwidth_unit}' is unknown", "use GB or GiB")
    if inputs is None and (topology is None) == (cluster is None):
        raise ConfigError("--topology", "give exactly one of --topology, --cluster or --astra-network",
                          "e.g. --topology 'Ring(4)_Switch(8)' --bandwidth 200,50 --latency 500,500")
    if comm_model not in (None, "nccl", "analytical"):
        raise ConfigError("--model", f"'{comm_model}' is unknown", "use nccl or analytical")
    if op != "send_recv" and peer is not None:
        raise ConfigError("--peer", f"only applies to --op send_recv, not {op}", "drop --peer")
    peer = 1 if peer is None else peer
    model = comm_model or ("nccl" if cluster else "analytical")
    if model == "nccl":
        ignored = [flag for flag, value in (("--bandwidth", bandwidth), ("--latency", latency),
                                            ("--algorithms", algorithms), ("--chunks", chunks)) if value is not None]
        if scheduler != "baseline":
            ignored.append("--scheduler")
        if ignored:
            raise ConfigError(ignored[0], "only applies to the analytical model (--topology or --model analytical); "
                              "the NCCL-like model takes the cluster's links and NCCL's own algorithm and chunking",
                              f"drop {ignored[0]}, or add --model analytical")
    chunks = (inputs.system.preferred_dataset_splits if inputs is not None else 64) if chunks is None else chunks
    if chunks < 1:
        raise ConfigError("--chunks", f"{chunks} is not a chunk count", "use 1 or more")
    if chunks > MAX_COLLECTIVE_CHUNKS:
        raise ConfigError("--chunks", f"{chunks:,} chunks is above the limit of {MAX_COLLECTIVE_CHUNKS:,}",
                          "use fewer (ASTRA-sim pipelines a collective in tens of chunks; the default is 64)")
    if ranks is not None and ranks > MAX_GPUS:
        raise ConfigError("--ranks", f"{ranks:,} ranks is above the limit of {MAX_GPUS:,}", f"use at most {MAX_GPUS:,}")
    try:
        size_bytes = parse_bytes(size)
    except ValueError as exc:
        raise ConfigError("--bytes", str(exc).removeprefix(f"--bytes '{size}' "), "") from None
    bw = _floats(bandwidth, "--bandwidth")
    if bw is not None and bandwidth_unit.lower() == "gib":
        bw = [b * GIB_PER_S_IN_GBPS for b in bw]
    lat = _floats(latency, "--latency")
    if model == "nccl":
        if cluster is None or ranks is None:
            raise ConfigError("--model", "the NCCL-like model needs --cluster NAME --ranks N",
                              "or use --model analytical with --topology")
        if ranks < 2:
            raise ConfigError("--ranks", f"{ranks} rank(s) need no collective", "use 2 or more")
        try:
            base = get_cluster(cluster)
            nodes = max(1, math.ceil(ranks / base.gpus_per_node))
            cl = base.with_nodes(nodes) if base.has_network else base
        except (KeyError, ValueError) as exc:
            raise ConfigError("--cluster", str(exc).strip("'\""), "see `trainsim clusters`") from None
        if ranks > cl.world_size:
            raise ConfigError("--ranks", f"{ranks} ranks do not fit {cl.world_size} GPUs of {cluster}",
                              f"use at most {cl.world_size}")
        if op == "send_recv" and not 1 <= peer < ranks:
            raise ConfigError("--peer", f"rank {peer} is not a receiver among the {ranks} ranks (rank 0 sends)",
                              f"pick 1..{ranks - 1}")
        report = nccl_collective(op, size_bytes, cl, ranks, peer=peer)
        gap = None
    else:
        if inputs is not None:
            if bw is not None or lat is not None or ranks is not None:
                raise ConfigError("--bandwidth" if bw is not None else "--latency" if lat is not None else "--ranks",
                                  "comes from the ASTRA-sim network config", "drop it (edit the config instead)")
            levels = inputs.network.levels()
        else:
            try:
                levels = resolve_topology(topology or cluster or "", bw, lat, npus=ranks)
            except ValueError as exc:
                raise ConfigError("--topology", str(exc), "") from None
        algos: dict[int, str] = inputs.system.algorithms(op, levels) if inputs is not None else {}
        if algorithms:
            names = [a.strip() for a in algorithms.split(",")]
            if len(names) != len(levels):
                raise ConfigError("--algorithms", f"{len(names)} algorithm(s) for {len(levels)} dimension(s)",
                                  "give one per dimension, innermost first")
            algos = {**algos, **{i: a for i, a in enumerate(names) if a}}
        npus = math.prod(lv.size for lv in levels)
        if op == "send_recv" and not 1 <= peer < npus:
            raise ConfigError("--peer", f"rank {peer} is not a receiver among the {npus} NPUs (rank 0 sends)",
                              f"pick 1..{npus - 1}")
        from .cost.microbench import collective_gap
        from .cost.semantics import NCCL, astra

        sem = (inputs.semantics("astra") if inputs is not None else astra(backend=backend, queues_per_dim=queues)) \
            if semantics == "astra" else NCCL
        if op == "send_recv" and (semantics == "astra" or compare):
            raise ConfigError("--op", "send_recv has no ASTRA-sim collective semantics here", "use --semantics nccl")
        try:
            report = analytical_collective(op, size_bytes, levels, scheduler, chunks, algos, peer=peer, semantics=sem)
            gap = collective_gap(op, size_bytes, levels, scheduler, chunks, algos,
                                 sem if semantics == "astra" else astra()) if compare else None
        except ValueError as exc:
            raise ConfigError("--algorithms", str(exc), "") from None
    data = report.as_dict()
    if gap is not None:
        data["compare"] = gap.as_dict()
    if inputs is not None:
        data["read_as"] = read_as(inputs.network)
    if json_target is None or not json_target.to_stdout:
        _print_collective(report)
        if inputs is not None:
            print(data["read_as"])
        if gap is not None:
            print_gap(gap, report.result.op)
    write_outputs({json_target: json_text(data, "--json")})


def _print_collective(report: Any) -> None:
    r = report.result
    con = Console()
    con.print(f"[bold]{r.op}[/] of {r.size_bytes:,.0f} B on {report.topology} ({r.npus} NPUs), "
              f"{report.model} model, {report.scheduler} scheduling, algorithm {report.choice}")
    con.print(f"time {r.time_s * 1e6:,.2f} us   algbw {r.algbw_gbps:,.2f} GB/s   busbw {r.busbw_gbps:,.2f} GB/s")
    t = Table(title="Per dimension (bytes each NPU sends there; time the dimension is busy)")
    for col in ("dim", "block", "size", "algorithm", "MB sent", "busy us", "GB/s", "latency ns"):
        t.add_column(col, justify="right", no_wrap=col == "algorithm")  # whole algorithm names at 80 columns
    for d in r.per_dim:
        t.add_row(str(d.index + 1), d.kind, str(d.size), d.algorithm, f"{d.bytes_sent / 2**20:,.2f}",
                  f"{d.busy_s * 1e6:,.2f}", f"{d.bandwidth_gbps:g}", f"{d.latency_s * 1e9:g}")
    con.print(t)


@app.command()
def models() -> None:
    """List the built-in models."""
    from .workload.zoo import model_names

    t = Table(title="Built-in models")
    t.add_column("name")
    t.add_column("description")
    for name, desc in model_names().items():
        t.add_row(name, desc)
    Console().print(t)


@app.command()
def clusters() -> None:
    """List the built-in cluster presets and named topologies (ASTRA-sim notation)."""
    from .hardware.cluster import CLUSTERS
    from .hardware.topology import GIB_PER_S_IN_GBPS, TOPOLOGY_PRESETS, cluster_topology

    con = Console()
    narrow = con.width < 140  # tables of one-word cells below this: one entry per cluster instead
    title = "Built-in clusters (per-GPU bandwidth; --nodes N scales the network level)"
    t = Table(title=title)
    t.add_column("name", no_wrap=True)
    t.add_column("GPU")
    t.add_column("GPUs/node")
    t.add_column("topology (2 nodes)", no_wrap=True)
    for col in ("levels (bandwidth GB/s, latency us)", "NICs"):
        t.add_column(col)
    entries: list[tuple[str, list[str]]] = []
    for name, factory in CLUSTERS.items():
        c = factory(1)
        levels = ", ".join(f"{lv.name} x{lv.size} {lv.bandwidth_gbps:g} GB/s {lv.latency_s * 1e6:g} us"
                           for lv in c.levels)
        nic = f"{c.nics_per_node} x {c.nic_gbps:g} GB/s" if c.nic_gbps else "none"
        topo = cluster_topology(factory(2) if c.has_network else c)
        t.add_row(name, c.device.name, str(c.gpus_per_node), topo, levels, nic)
        entries.append((name, [f"{c.gpus_per_node}x {c.device.name} per node, NICs {nic}, {topo}"
                               + (" at 2 nodes" if c.has_network else " (one box)"),
                               f"levels: {levels}"]))
    _print_listing(con, title, t, entries, narrow)
    title = "Named topologies (--topology NAME; bandwidth GB/s per NPU per dimension)"
    p = Table(title=title)
    p.add_column("name", no_wrap=True)
    for col in ("topology", "GB/s (ASTRA-sim GiB/s)", "latency ns", "description"):
        p.add_column(col)
    entries = []
    for pre in TOPOLOGY_PRESETS.values():
        bw = ", ".join(f"{b:.4g} ({b / GIB_PER_S_IN_GBPS:.4g})" for b in pre.bandwidths_gbps)
        lat = ", ".join(f"{x:g}" for x in pre.latencies_ns)
        p.add_row(pre.name, pre.spec, bw, lat, pre.description)
        entries.append((pre.name, [pre.spec, f"GB/s (ASTRA-sim GiB/s): {bw}; latency ns: {lat}", pre.description]))
    _print_listing(con, title, p, entries, narrow)


def _print_listing(con: Console, title: str, table: Table, entries: list[tuple[str, list[str]]],
                   narrow: bool) -> None:
    """The table, or on a narrow console each entry as its name and indented lines (no one-word cells)."""
    if not narrow:
        con.print(table)
        return
    from rich.padding import Padding

    con.print(f"[bold]{title}[/]", highlight=False)
    for name, lines in entries:
        con.print(f"[bold]{name}[/]: {lines[0]}", markup=True, highlight=False)
        for line in lines[1:]:
            con.print(Padding(line, (0, 0, 0, 2), expand=False), markup=False, highlight=False)


app.add_typer(chakra_app, name="chakra")
app.add_typer(astra_app, name="astra")
app.add_typer(predictor_app, name="predictor")
app.command("replay")(replay_cmd)
app.command("report")(report_cmd)
app.command("scale")(scale_cmd)
app.command("optimize")(optimize_cmd)
app.command("search")(search_cmd)
app.command("sweep")(sweep_cmd)


def main(argv: list[str] | None = None) -> None:
    """Entry point: bad input is one line on stderr and exit code 2, never a traceback."""
    with _terminate_cleanly():
        _main(argv)


@contextlib.contextmanager
def _terminate_cleanly() -> Iterator[None]:
    """SIGTERM (a `timeout`, a job scheduler) ends the run like Ctrl-C: half-written outputs are removed."""
    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, stop) if main_thread else None
    try:
        yield
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def _main(argv: list[str] | None) -> None:
    from .sim.engine import SimulationError

    try:
        rc = app(args=argv, standalone_mode=False)
        if isinstance(rc, int) and rc:  # typer.Exit(code) comes back as a return value here
            sys.exit(rc)
    except ConfigError as exc:
        print(f"error: {exc.one_line()}", file=sys.stderr)
        sys.exit(2)
    except SimulationError as exc:
        print(f"error: strategy: {exc}", file=sys.stderr)
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except MemoryError:  # the work bounds should refuse such jobs first; this is the last line of defence
        print("error: out of memory: the job is too large for this machine; lower its size (layers, batch, "
              "GPUs) or drop --exact", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:  # e.g. `trainsim clusters | head -1`
        sys.stderr.close()
        sys.exit(0)
    except Exception as exc:  # click's (typer's vendored click's) exceptions, matched by shape not by import
        name = type(exc).__name__
        if name == "NoArgsIsHelpError":  # `trainsim chakra`: the group's help, not an error
            ctx = getattr(exc, "ctx", None)
            print(ctx.get_help() if ctx is not None else exc.format_message())  # type: ignore[attr-defined]
            sys.exit(0)
        if hasattr(exc, "format_message") and getattr(exc, "exit_code", 0) == 2:  # usage: bad flag, wrong type
            print(f"error: {' '.join(exc.format_message().split())}", file=sys.stderr)
            sys.exit(2)
        if name == "Abort":
            sys.exit(130)
        raise
