"""Work bounds: the largest inputs trainsim accepts, so that every accepted job finishes in bounded
time and memory (about 4 GiB and a minute on one CPU core) and every other one is refused at once.

The per-field bounds are generous physical maxima (config.py puts them on the pydantic fields, so YAML,
CLI and Python API share them); the task bound is checked on a prediction of the execution graph's
size before anything is lowered (compile.graph.predict_tasks, api._check_work).
"""

from __future__ import annotations

MAX_GPUS = 1 << 20
"""GPUs (NPUs) in one job, topology or collective: 1,048,576, about 5x the largest clusters built so far
(~200k GPUs) and 64x ASTRA-sim's largest published cases (16,384 NPUs). A data-parallel group that size
simulates in about 15 s, 0.3 GB."""

MAX_GPUS_PER_NODE = 1 << 14
"""GPUs in one node (scale-up domain): 16,384, above TPU-pod-sized ICI domains (9,216 chips)."""

MAX_NICS_PER_NODE = 1 << 14
"""Network NICs per node: 16,384 (DGX nodes have 8 to 10)."""

MAX_LAYERS = 4096
"""Layers of one model: 4x the deepest published transformer (DeepNet, 1,000 layers). Building, resolving
and lowering a model costs about 2 ms per layer before any micro-batch: 4,096 layers take about 6 s."""

MAX_COLLECTIVE_CHUNKS = 1 << 16
"""Chunks a collective is split into for pipelining (analytical model; ASTRA-sim uses tens): 65,536."""

MAX_PREDICTED_TASKS = 2_000_000
"""Execution-graph tasks (summed over the simulated rank classes, a collective counted once per class
taking part): measured at 1.1 to 1.4 KB and 10 to 25 us per task (graph build plus simulation on one
core), so 2,000,000 tasks stay under 3 GiB and about 50 s."""

BYTES_PER_TASK = 1400
"""Peak resident memory per execution-graph task (measured; for the message of a refused job)."""

PROGRESS_MIN_TASKS = 200_000
"""The CLI shows a progress bar for jobs predicted to build at least this many tasks (a few seconds)."""

# model and batch sizes: far above any real model, low enough that no float conversion overflows
MAX_SEQ_LEN = 1 << 30
"""Tokens per sequence: 1,073,741,824 (published contexts reach 10M-100M)."""

MAX_HIDDEN = 1 << 20
"""Hidden size: 1,048,576 (the largest published are ~25k)."""

MAX_FFN = 1 << 22
"""FFN hidden size: 4,194,304."""

MAX_HEADS = 1 << 16
"""Attention heads (and key/value heads): 65,536 (the largest published have 128)."""

MAX_VOCAB = 1 << 30
"""Vocabulary rows: 1,073,741,824 (the largest published are ~256k)."""

MIN_BANDWIDTH_GBPS = 1e-3
"""Slowest link accepted: 1 MB/s per direction (below it times overflow into nonsense, e.g. 1e-320 GB/s)."""

MAX_BANDWIDTH_GBPS = 1e6
"""Fastest link accepted: 1 PB/s per direction (1,000x NVLink 5)."""

MAX_LATENCY_NS = 1e12
"""Longest per-hop latency accepted: 1,000 s."""

MAX_MESSAGE_BYTES = 1 << 50
"""Largest collective message: 1 PiB (`trainsim collective --bytes`)."""

MAX_BATCH = 1 << 40
"""Samples per micro-batch or global batch (the micro-batch count is bounded by MAX_PREDICTED_TASKS)."""
