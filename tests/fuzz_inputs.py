"""Hypothesis strategies for bad (and good) input to every command: argument lists, YAML documents, CSV
files and trace files. Each strategy in COMMANDS draws (argv, files): the command line and the files to
create in the run's empty directory first. Shared by tests/test_fuzz.py and benchmarks/input_fuzz.py.
"""

from __future__ import annotations

import functools
import gzip
import json
import tempfile

import yaml
from hypothesis import strategies as st

Example = tuple[list[str], dict[str, bytes]]
OUTPUT_FLAGS = frozenset({"--json", "--trace", "--dump-config", "--dump-strategy", "--plot", "--out", "--db",
                          "--report", "-o"})

# values a user might type: valid small ones, boundary ones, absurd ones and wrong types
INTS = st.sampled_from(["1", "2", "4", "8", "0", "-1", "3", "7", "1000000000000", "9223372036854775808", "1.5",
                        "x", "", "nan", "1e9"])
SMALL_INTS = st.sampled_from(["1", "2", "4", "8"])
FLOATS = st.sampled_from(["25", "1.5", "0", "-1", "nan", "inf", "-inf", "1e-320", "1e400", "x", "", "1e9"])
WORDS = st.sampled_from(["", "x", "none", "auto", "☃", "a" * 300, "-", "--", "../x", "/", "1"])
OUTPUT_PATHS = st.sampled_from(["o.json", "", "-", "missing/o.json", ".", "/dev/null", "sub", "sub/o.json",
                                "/proc/version", "o2.json"])


def _choice(valid: list[str]) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(valid), WORDS)


SIMULATE_FLAGS: dict[str, st.SearchStrategy[str] | None] = {
    "--model": _choice(["gpt2", "gpt3-175b", "llama3-8b", "mixtral-8x7b", "resnet50", "custom", "bert-large",
                        "dlrm", "no-such"]),
    "--cluster": _choice(["pcie-titanxp", "dgx-a100", "dgx-h100", "dgx1-v100", "no-such"]),
    "--nodes": INTS, "--gpu": _choice(["h100-sxm", "v100", "titan-xp", "no-gpu"]), "--gpus-per-node": INTS,
    "--intra-node-gbps": FLOATS, "--nics-per-node": INTS, "--nic-gbps": FLOATS,
    "--topology": _choice(["Ring(4)_Switch(2)", "conv-4d", "Ring(100000)_Switch(100000)", "Ring(1000000000)",
                           "Swtch(4)", "Ring(0)", "FC(8)"]),
    "--bandwidth": st.sampled_from(["100,25", "1", "x", "", "nan,1", "-1,2"]),
    "--latency": st.sampled_from(["500,500", "1", "x", "", "inf"]),
    "--comm-model": _choice(["nccl", "analytical"]), "--scheduler": _choice(["baseline", "themis"]),
    "--compute": _choice(["roofline", "learned:", "learned:missing.pt", "learned:sub"]),
    "--learned-extrapolation": None,
    "--dp": INTS, "--tp": SMALL_INTS | INTS, "--pp": SMALL_INTS | INTS, "--cp": INTS, "--ep": INTS, "--vpp": INTS,
    "--sp": None, "--no-sp": None, "--zero": INTS, "--fsdp": None,
    "--recompute": _choice(["none", "selective", "full"]),
    "--schedule": _choice(["gpipe", "1f1b", "interleaved", "dynamic"]), "--max-ongoing": INTS,
    "--micro-batch": INTS, "--global-batch": INTS, "--no-overlap-grad-reduce": None,
    "--overlap-param-gather": None, "--tp-comm-overlap": None, "--no-p2p-scatter-gather": None,
    "--offload": _choice(["none", "cpu", "nvme", "remote"]),
    "--remote-memory": st.sampled_from(["missing.json", "", ".", "/dev/null"]), "--in-switch-collectives": None,
    "--offload-activations": None, "--lora-rank": INTS, "--lora-base": _choice(["bf16", "nf4", "int4"]),
    "--lora-targets": st.sampled_from(["q,v", "q,k,v,o,mlp,output", "", ",", "gate_proj", "q,,v"]),
    "--seq-len": INTS, "--layers": INTS, "--hidden": INTS, "--heads": INTS, "--kv-heads": INTS, "--ffn": INTS,
    "--vocab": INTS, "--attention": _choice(["flash", "unfused"]),
    "--dtype": _choice(["auto", "bf16", "fp16", "fp8", "fp32", "tf32", "int3"]), "--gamma": FLOATS,
    "--master-weights": None, "--no-master-weights": None,
    "--optimizer": _choice(["adam", "adam_8bit", "adafactor", "muon", "sgd"]),
    "--optimizer-in-backward": None, "--grad-bucket-copy": None, "--fp8-params": None,
    "--fp8-activations": None,
    "--exact": None, "--no-bandwidth-sharing": None, "--granularity": _choice(["auto", "layer", "op"]),
    "--fidelity": _choice(["event", "analytic"]), "--max-micro-batch": None,
}
COLLECTIVE_FLAGS: dict[str, st.SearchStrategy[str] | None] = {
    "--op": _choice(["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
                     "send_recv"]),
    "--bytes": st.sampled_from(["1GiB", "64MiB", "500MB", "1073741824", "1e400", "1.5", "0", "-1", "nan", "x",
                                "1e30", ""]),
    "--bandwidth": st.sampled_from(["100,25", "100", "1e-320", "x", "nan"]),
    "--latency": st.sampled_from(["500,500", "500", "-1", "inf"]),
    "--bandwidth-unit": _choice(["GB", "GiB"]), "--scheduler": _choice(["baseline", "themis"]),
    "--chunks": INTS, "--algorithms": st.sampled_from(["ring,direct", "ring", "x", "", "in_switch,in_switch"]),
    "--ranks": INTS, "--model": _choice(["nccl", "analytical"]), "--peer": INTS,
    "--semantics": _choice(["nccl", "astra"]), "--compare": _choice(["astra", "nccl"]),
    "--num-queues-per-dim": INTS, "--backend": _choice(["unaware", "aware"]),
}
GPT2_SMALL = ["--model", "gpt2", "--cluster", "pcie-titanxp", "--tp", "2", "--pp", "2", "--dp", "2",
              "--global-batch", "8"]


def flags(table: dict[str, st.SearchStrategy[str] | None], max_flags: int) -> st.SearchStrategy[list[str]]:
    """Up to `max_flags` distinct flags of `table`, each with a drawn value (None: a switch)."""
    @st.composite
    def build(draw: st.DrawFn) -> list[str]:
        names = draw(st.lists(st.sampled_from(sorted(table)), max_size=max_flags, unique=True))
        argv: list[str] = []
        for name in names:
            value = table[name]
            argv += [name] if value is None else [name, draw(value)]
        return argv

    return build()


def outputs(names: list[str]) -> st.SearchStrategy[list[str]]:
    """Up to two output flags with awkward paths (empty, '-', a directory, a missing directory, a device)."""
    return st.lists(st.tuples(st.sampled_from(names), OUTPUT_PATHS), max_size=2).map(
        lambda pairs: [x for pair in pairs for x in pair])


CELLS = st.sampled_from(["", "x", "nan", "inf", "-1", "0", "1", "8", "2", "64", "1e300", "1.5", "☃", "a100",
                         "h100", "all_reduce", "1024", '"1,2"'])
CSV_FORMATS = [  # (header, a valid row): each drawn row is the valid one with some cells replaced
    ("case_id,tier,subset,model_name,arch,n_layers,hidden,n_heads,seq_len,vocab,params_b,gpu,n_gpus,"
     "gpus_per_node,dp,tp,pp,micro_batch,global_batch,iter_time_s,flops_convention,peak_mem_gib,mem_kind",
     "r1,A,core,GPT-1.3B,GPT,24,2048,16,2048,51200,1.3,A100-SXM4,8,8,4,2,1,2,64,1.5,Megatron model FLOPs,20.5,"
     "allocated"),
    ("# GPUs,global batch,micro batch,hidden size,attention heads,# layers,sequence length,tensor parallelism,"
     "data parallelism,pipeline parallelism,iteration time (ms)", "8,16,2,1024,16,4,512,2,4,1,120.5"),
    ("source_id,collective,size_bytes,time_us,n_gpus,n_nodes,gpus_per_node,gpu,inter_fabric",
     "nccl-tests,all_reduce,1048576,100,8,1,8,A100,NVLink"),
    ("m,n,k,dtype,gpu,tflops", "4096,4096,4096,bf16,a100-80gb,250"),
    ("row_id,backend,topology,npus,bandwidth_gbps_per_dim,latency_ns_per_dim,op,comm_size_bytes,"
     "bytes_nccl_convention,chunks,queues_per_dim,algorithms_per_dim,endpoint_delay_ns,local_mem_bw_gbps,"
     "astra_time_us,astra_wall_s,astra_commit,group_id,notes",
     "A0003,unaware,Ring(8),8,50,500,all_reduce,1048576,1048576,1,1,ring,10,1600,43.025,0.01,518bd513ae11,g145,"),
    ("a,b,c", "1,2,3"),
]


@st.composite
def csv_files(draw: st.DrawFn) -> bytes:
    """A CSV in one of the formats validate/calibrate read: valid rows with some awkward cells (or a bad
    prefix), so that both the accepted and the refused paths are exercised."""
    header, valid = draw(st.sampled_from(CSV_FORMATS))
    rows = []
    for _ in range(draw(st.integers(0, 3))):
        cells = valid.split(",")
        for i in draw(st.lists(st.integers(0, len(cells) - 1), max_size=2)):
            cells[i] = draw(CELLS)
        cells += draw(st.lists(CELLS, max_size=1))  # sometimes a cell too many
        rows.append(",".join(cells))
    text = header + "\n" + "".join(r + "\n" for r in rows)
    if draw(st.integers(0, 3)) < 3:
        return text.encode()
    return draw(st.sampled_from([b"\xff\xfe", b"", b"\x00\x01", b"a,b\n\"unterminated"])) + text.encode()


YAML_KEYS = {
    "model": ["name", "seq_len", "layers", "hidden", "heads", "kv_heads", "attention", "hf_config", "bogus"],
    "cluster": ["name", "nodes", "gpu", "gpus_per_node", "nic_gbps", "topology", "bandwidth_gbps", "bogus"],
    "strategy": ["tp", "pp", "dp", "zero", "fsdp", "recompute", "schedule", "micro_batch", "global_batch", "tree",
                 "sequence_parallel", "bogus"],
    "simulation": ["dtype", "gamma", "exact", "granularity", "fidelity", "calibration", "comm_model",
                   "master_weights", "optimizer", "optimizer_in_backward", "grad_bucket_copy", "expandable_segments",
                   "bogus"],
}
YAML_SCALARS = st.one_of(st.sampled_from([True, False, None, 0, 1, 2, 8, -1, 10**12, 1.5, float("nan"),
                                          float("inf"), "gpt2", "pcie-titanxp", "dgx-a100", "", "x", "bf16", "full",
                                          "1f1b", "/dev/zero", "missing.yaml"]),
                         st.text(max_size=8))


@st.composite
def yaml_jobs(draw: st.DrawFn) -> bytes:
    """A job YAML with schema keys (and a bogus one) holding awkward values, sometimes with a broken tail."""
    doc: dict = {}
    for section, keys in YAML_KEYS.items():
        if draw(st.booleans()):
            doc[section] = {k: draw(YAML_SCALARS | st.lists(YAML_SCALARS, max_size=2))
                            for k in draw(st.lists(st.sampled_from(keys), max_size=3, unique=True))}
    if draw(st.integers(0, 5)) == 0:
        doc[draw(st.sampled_from(["model", "extra", "strategy"]))] = draw(YAML_SCALARS)
    text = yaml.safe_dump(doc, allow_unicode=True)
    tail = draw(st.sampled_from(["", "", "", "model: {name: gpt2}\n", "&a [*a]\n", "{", "\t- x\n"]))
    return (text + tail).encode()


@st.composite
def et_files(draw: st.DrawFn) -> dict[str, bytes]:
    """Per-rank Chakra ET files of random (sometimes gzipped) bytes, with or without a comm-group JSON."""
    n = draw(st.integers(1, 3))
    blobs = [draw(st.binary(max_size=64)) for _ in range(n)]
    if draw(st.booleans()):
        blobs = [gzip.compress(b) if draw(st.booleans()) else b"\x1f\x8b" + b for b in blobs]
    files = {f"p.{i}.et": b for i, b in enumerate(blobs)}
    if draw(st.booleans()):
        files["p.comm_group.json"] = draw(st.sampled_from([b'{"1": [0, 1]}', b"[1, 2]", b"{", b'{"1": [99]}',
                                                           b"\xff", b"[" * 10000, b'{"1": NaN}']))
    return files


@functools.lru_cache(maxsize=1)
def valid_et_files() -> dict[str, bytes]:
    """A real 8-rank workload written by `trainsim chakra export` (gpt2, tp2 x pp2 x dp2), to mutate."""
    from trainsim.api import simulate
    from trainsim.trace.chakra import write_chakra

    res = simulate(model="gpt2", cluster="pcie-titanxp", strategy={"tp": 2, "pp": 2, "dp": 2, "global_batch": 8},
                   granularity="layer", bandwidth_sharing=False)
    with tempfile.TemporaryDirectory() as d:
        return {p.name.replace("gpt2", "p"): p.read_bytes() for p in write_chakra(res.graph, d, "gpt2")}


def _damage(draw: st.DrawFn, data: bytes, kind: str) -> bytes:
    """The file cut short at a random byte ('truncate') or with one random byte flipped ('flip')."""
    if kind == "truncate":
        return data[:draw(st.integers(0, len(data) - 1))]
    i = draw(st.integers(0, len(data) - 1))
    return data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1:]


@st.composite
def mutated_et_files(draw: st.DrawFn) -> dict[str, bytes]:
    """A real workload with one mutation: none, a truncated or bit-flipped rank, a missing rank, gzip, or
    another comm-group JSON."""
    files = dict(valid_et_files())
    rank = f"p.{draw(st.integers(0, 7))}.et"
    kind = draw(st.sampled_from(["none", "truncate", "flip", "drop", "gzip", "groups"]))
    data = files[rank]
    if kind in ("truncate", "flip"):
        files[rank] = _damage(draw, data, kind)
    elif kind == "drop":
        del files[rank]
    elif kind == "gzip":
        files[rank] = gzip.compress(data)
    elif kind == "groups":
        files["p.comm_group.json"] = draw(st.sampled_from([b"{}", b'{"1": [0, 1, 2, 3, 4, 5, 6, 7]}', b'{"1": []}',
                                                           b'{"1": [0, 99]}', b'{"1": "x"}']))
    return files


def _no_files(argv: st.SearchStrategy[list[str]]) -> st.SearchStrategy[Example]:
    return argv.map(lambda a: (a, {}))


_EXPORT_FLAGS = {k: SIMULATE_FLAGS[k] for k in ("--model", "--cluster", "--nodes", "--dp", "--tp", "--pp", "--sp",
                                               "--zero", "--recompute", "--global-batch", "--layers", "--dtype",
                                               "--granularity")}

def _kineto_doc(rank: int, world: int, n_coll: int = 1) -> dict:
    """A small valid two-rank GPU trace (ProfilerStep, a kernel, an all-reduce, a device sync)."""
    def x(cat: str, name: str, ts: float, dur: float, pid: int = 1, tid: int = 1, **args: object) -> dict:
        return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts + 1e6, "dur": dur, "args": args}
    ev = [x("user_annotation", "ProfilerStep#1", 0, 1000),
          x("cuda_runtime", "cudaLaunchKernel", 10, 5, cbid=211, correlation=1),
          x("kernel", "ampere_sgemm", 20, 200 + 100 * rank, pid=0, tid=7, stream=7, correlation=1, device=0)]
    for k in range(n_coll):
        ev.append(x("cuda_runtime", "cudaLaunchKernel", 30 + k, 0.5, cbid=211, correlation=2 + k))
        ev.append(x("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 320 + 100 * k, 90, pid=0, tid=7, stream=7,
                    correlation=2 + k, device=0, **{"Collective name": "allreduce", "In msg nelems": 1000,
                                                    "Group size": 2, "dtype": "Float", "Process Group Name": "0",
                                                    "Process Group Ranks": "[0, 1]"}))
    ev.append(x("cuda_runtime", "cudaDeviceSynchronize", 40, 600, cbid=165, correlation=99))
    return {"traceEvents": ev, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world}}


@st.composite
def kineto_files(draw: st.DrawFn) -> dict[str, bytes]:
    """Two ranks' traces with one mutation: none, truncated, bit-flipped, gzipped (maybe cut), not JSON, a
    duplicated rank, a world-size mismatch, an extra collective without its peer, no events at all."""
    docs = [_kineto_doc(0, 2), _kineto_doc(1, 2)]
    kind = draw(st.sampled_from(["none", "truncate", "flip", "gzip", "gzip_cut", "text", "dup", "world", "peer",
                                 "empty", "cpu_only", "array"]))
    if kind == "dup":
        docs[1]["distributedInfo"]["rank"] = 0
    elif kind == "world":
        docs[1]["distributedInfo"]["world_size"] = 4
    elif kind == "peer":
        docs[1] = _kineto_doc(1, 2, n_coll=2)
    elif kind == "empty":
        docs[0]["traceEvents"] = []
    elif kind == "cpu_only":
        docs = [{"traceEvents": [d["traceEvents"][0]]} for d in docs[:1]]
    files = {f"rank{i}.json": json.dumps(d).encode() for i, d in enumerate(docs)}
    name = "rank0.json"
    data = files[name]
    if kind in ("truncate", "flip"):
        files[name] = _damage(draw, data, kind)
    elif kind in ("gzip", "gzip_cut"):
        z = gzip.compress(data)
        files.pop(name)
        files["rank0.json.gz"] = z if kind == "gzip" else z[:draw(st.integers(0, len(z) - 1))]
    elif kind == "text":
        files[name] = draw(st.sampled_from([b"not json", b"\xff\xfe", b"[1, 2]", b"{}", b'{"traceEvents": 3}']))
    elif kind == "array":
        files[name] = b'{"traceEvents": [1, "x", null, {"ph": "X", "ts": "a"}]}'
    return files


_REPLAY_FLAGS = [["--json", "o.json"], ["--json", "-"], ["--trace", "p.json"], ["--network-speedup", "2"],
                 ["--network-speedup", "0"], ["--gpu", "h100-sxm", "--source-gpu", "a100-80gb"], ["--gpu", "nosuch"],
                 ["--cluster", "dgx-a100"], ["--cluster", "nosuch"], ["--bucket-mb", "5"], ["--compress-bits", "3"],
                 ["--fuse"], ["--no-overlap"], ["--cores-per-node", "0"], ["--modelled-latency"]]
_SCALE_FLAGS = [["--cluster", "dgx-a100", "--nodes", "1,2"], ["--cluster", "dgx-a100", "--nodes", "x"],
                ["--nodes", "0"], ["--ranks", "1,2"], ["--json", "s.json"], ["--cores-per-node", "2"]]

SWEEP_BASE = {"model": {"name": "gpt2", "layers": 2}, "cluster": {"name": "pcie-titanxp", "nodes": 1},
              "strategy": {"global_batch": 8}, "simulation": {"granularity": "layer"}}
SWEEP_GRID = {  # job keys with values that mostly make valid (sometimes refused) jobs of SWEEP_BASE
    "strategy.tp": [1, 2, 4], "strategy.pp": [1, 2], "strategy.dp": [1, 2, None], "strategy.micro_batch": [1, 2],
    "strategy.recompute": ["none", "full"], "strategy.zero": [0, 1, 3], "cluster.gpu": ["h100-sxm", "v100"],
    "cluster.nic_gbps": [12.5, 25], "cluster.nodes": [1, 2], "model.seq_len": [64, 128],
    "model.name": ["gpt2", "nosuch"], "model.layers": [1, 2], "simulation.dtype": ["auto", "fp16", "fp8"],
    "cluster.bandwidth_gbps": [[25.0, 12.5]], "strategy.tpp": [1], "tp": [1], "bogus.x": [1], "": [1], "model": [1],
}
SWEEP_VALUES = st.sampled_from([1, 2, 4, 0, -1, 10**12, 1.5, float("nan"), float("inf"), True, None, "x", "",
                                "gpt2", "nosuch", "h100-sxm", "full", "bf16", [25.0, 12.5], [], {}])


SWEEP_FAULTS = ["none"] * 8 + ["base mutated", "base file", "base missing", "base scalar", "grid key", "grid value",
                               "random", "name", "tail", "flag"]
SWEEP_GOOD_FLAGS = [["--db", "r.db"], ["--db", "r.db"], ["--jobs", "1"], ["--jobs", "2"], ["-q"], ["--top", "1"]]
SWEEP_BAD_FLAGS = [["--db", "bad.db"], ["--db", ""], ["--db", "-"], ["--db", "sub"], ["--db", "missing/r.db"],
                   ["--db", "/dev/null"], ["--db", "sweep.yaml"], ["--jobs", "0"], ["--jobs", "x"], ["--top", "0"],
                   ["--ray", ""], ["--ray", "127.0.0.1:1"]]


@st.composite
def sweeps(draw: st.DrawFn) -> Example:
    """`trainsim sweep` of a YAML over a tiny base job with at most one deliberate fault (half have none, so
    that sweeps run and write their store): an awkward base (mutated, a malformed or missing job file, a
    scalar), grid key or value, `random:`, name, a broken YAML tail or a bad flag."""
    fault = draw(st.sampled_from(SWEEP_FAULTS))
    files: dict[str, bytes] = {"bad.db": b"not a database\n"}
    base: object = {s: dict(v) for s, v in SWEEP_BASE.items()}
    if fault == "base mutated":
        section = draw(st.sampled_from(sorted(YAML_KEYS)))
        base[section][draw(st.sampled_from(YAML_KEYS[section]))] = draw(YAML_SCALARS)  # type: ignore[index]
    elif fault == "base file":
        files["job.yaml"] = draw(st.sampled_from([yaml.safe_dump(SWEEP_BASE).encode(), b"{", b"[1, 2]", b""]))
        base = "job.yaml"
    elif fault == "base missing":
        base = "missing.yaml"
    elif fault == "base scalar":
        base = draw(SWEEP_VALUES)
    grid: dict = {}
    good_keys = sorted(k for k in SWEEP_GRID if "." in k and k not in ("strategy.tpp", "bogus.x"))
    for key in draw(st.lists(st.sampled_from(good_keys), max_size=3, unique=True)):
        grid[key] = draw(st.lists(st.sampled_from(SWEEP_GRID[key]), min_size=1, max_size=3, unique_by=repr))
    if fault == "grid key":
        grid[draw(st.sampled_from(sorted(set(SWEEP_GRID) - set(good_keys))))] = [1]
    elif fault == "grid value":
        grid[draw(st.sampled_from(good_keys))] = draw(st.lists(SWEEP_VALUES, max_size=3) | SWEEP_VALUES)
    doc: dict = {"base": base, "grid": grid}
    if fault == "random":
        doc["random"] = draw(st.sampled_from([{"samples": 0}, {"sample": 3}, {"samples": 10**9}, {"samples": "x"},
                                              3, {"samples": 2, "seed": -1}]))
    elif draw(st.integers(0, 3)) == 0:
        doc["random"] = {"samples": draw(st.integers(1, 4)), "seed": draw(st.integers(0, 3))}
    if fault == "name":
        doc[draw(st.sampled_from(["name", "nmae"]))] = draw(st.sampled_from(["", 3, None, "x" * 300]))
    elif draw(st.booleans()):
        doc["name"] = draw(st.sampled_from(["study", "☃"]))
    text = yaml.safe_dump(doc, allow_unicode=True)
    if fault == "tail":
        text += draw(st.sampled_from(["grid: {}\n", "&a [*a]\n", "{", "\t- x\n"]))
    files["sweep.yaml"] = text.encode()
    flags = draw(st.lists(st.sampled_from(SWEEP_GOOD_FLAGS), max_size=2, unique_by=lambda f: f[0]))
    if fault == "flag":
        flags.append(draw(st.sampled_from(SWEEP_BAD_FLAGS)))
    out = draw(st.sampled_from([[], [], ["--json", "o.json"], ["--json", "-"]]) | outputs(["--json"]))
    return ["sweep", "sweep.yaml", *(a for f in flags for a in f), *out], files


SEARCH_FLAGS: dict[str, st.SearchStrategy[str] | None] = {
    "--model": _choice(["gpt2", "gpt3-125m", "gpt2-medium", "resnet50", "mixtral-8x7b", "custom", "no-such"]),
    "--cluster": _choice(["pcie-titanxp", "dgx-a100", "dgx-h100", "no-such"]),
    "--nodes": st.sampled_from(["1", "2", "1,2", "0", "x", "1,,2", "-1", "1000000000000", ""]),
    "--gpu": _choice(["h100-sxm", "v100", "no-gpu"]), "--global-batch": INTS, "--seq-len": INTS,
    "--dtype": _choice(["bf16", "fp16", "fp8", "fp32"]), "--top": INTS, "--jobs": st.sampled_from(["1", "2", "0", "x"]),
    "--time-limit": st.sampled_from(["2", "0", "-1", "nan", "inf", "x", "", "1e-9", "0.5"]),
    "--tp-across-nodes": None, "--pareto-memory": None, "--exhaustive": None,
    "--space": st.sampled_from(["space.yaml", "missing.yaml", "", "."]),
    "--db": st.sampled_from(["r.db", "bad.db", "", "sub"]),
}
SPACE_DOCS = [b"micro_batch: [1, 2]\nvpp: [1]\n", b"tp: [0]\n", b"nosuch: [1]\n", b"[1, 2]\n", b"{", b"",
              b"zero: [4]\n", b"recompute: [sometimes]\n", b"schedule: []\n", b"tp: x\n", b"pp: [1, 2]\ncp: [1]\n",
              b"tp_across_nodes: 3\n", b"micro_batch: [1000000000000]\n"]


@st.composite
def searches(draw: st.DrawFn) -> Example:
    """`trainsim search` over small models and clusters with a few drawn flags and a drawn --space file; a
    3 s time limit comes first so that a drawn --time-limit (later on the line) replaces it."""
    argv = ["search", "-q", "--time-limit", "3", "--global-batch", "16", *draw(flags(SEARCH_FLAGS, 5)),
            *draw(outputs(["--json"]))]
    files = {"space.yaml": draw(st.sampled_from(SPACE_DOCS)), "bad.db": b"not a database\n"}
    return argv, files


ASTRA_NETWORKS = [  # an ASTRA-sim network config: valid for the 8-rank workloads, or broken one way
    b'{"topology": ["Ring"], "npus_count": [8], "bandwidth": [50.0], "latency": [500.0]}',
    b"topology: [ Switch ]\nnpus_count: [ 8 ]\nbandwidth: [ 400.0 ]\nlatency: [ 936.25 ]\n",
    b"topology: [ Ring, Switch ]\nnpus_count: [ 2, 4 ]\nbandwidth: [ 100, 50 ]\nlatency: [ 500, 500 ]\n",
    b'{"topology": ["Ring"], "npus_count": [4], "bandwidth": [50.0], "latency": [500.0]}',
    b'{"topology": ["Torus"], "npus_count": [8], "bandwidth": [50.0], "latency": [500.0]}',
    b'{"topology": ["Ring"], "npus_count": [8, 2], "bandwidth": [50.0], "latency": [500.0]}',
    b'{"topology": ["Ring"], "npus_count": [1], "bandwidth": [50.0], "latency": [500.0]}',
    b'{"topology": ["Ring"], "npus_count": [8], "bandwidth": ["x"], "latency": [500.0]}',
    b'{"topology": ["Ring"], "npus_count": [8], "bandwidth": [0], "latency": [-1]}',
    b'{"topology": "Ring", "npus_count": 8, "bandwidth": 50, "latency": 500}',
    b'{"topology": ["Ring"], "npus_count": [8], "bandwidth": [50.0], "latency": [500.0], "packet_size": 4096}',
    b'{"topology": ["Ring"], "npus_count": [100000000000], "bandwidth": [1e400], "latency": [500.0]}',
    b"[1, 2]", b"{", b"\xff\xfe", b"",
]
ASTRA_SYSTEMS = [
    b'{"scheduling-policy": "LIFO", "endpoint-delay": 10, "active-chunks-per-dimension": 1, '
    b'"preferred-dataset-splits": 4, "all-reduce-implementation": ["ring"], "collective-optimization": '
    b'"localBWAware", "local-mem-bw": 1600, "boost-mode": 0}',
    b'{"preferred-dataset-splits": 64, "all-reduce-implementation": ["halvingDoubling", "direct"]}',
    b'{"roofline-enabled": 1, "peak-perf": 2048, "local-mem-bw": 4096, "preferred-dataset-splits": 1}',
    b'{"scheduling-policy": "EXPLICIT"}', b'{"scheduling-policy": 1}', b'{"all-reduce-implementation": ["oneRing"]}',
    b'{"all-to-all-implementation": ["halvingDoubling"]}', b'{"inter-dimension-scheduling": "themis"}',
    b'{"preferred-dataset-splits": 0}', b'{"preferred-dataset-splits": 1000000000000}', b'{"bogus": 1}',
    b'{"all-reduce-implementation": "ring"}', b'{"roofline-enabled": true}', b"[]", b"{", b"",
]
ASTRA_REMOTE = [b'{"memory-type": "PER_NPU_MEMORY_EXPANSION", "remote-mem-latency": 0, "remote-mem-bw": 512}',
                b'{"memory-type": "NO_MEMORY_EXPANSION"}', b'{"memory-type": "PER_NODE_MEMORY_EXPANSION"}',
                b'{"memory-type": "CXL"}', b'{"memory-type": "MEMORY_POOL", "remote-mem-bw": 1.5}', b"{"]


@functools.lru_cache(maxsize=1)
def collective_et_files() -> dict[str, bytes]:
    """ASTRA-sim's microbenchmark workload: one 1 MiB all-reduce per rank on 8 ranks."""
    from trainsim.trace.chakra import collective_graph, write_chakra

    with tempfile.TemporaryDirectory() as d:
        return {p.name.replace("all_reduce", "p"): p.read_bytes()
                for p in write_chakra(collective_graph("all_reduce", 2**20, 8), d, "all_reduce")}


@st.composite
def astra_runs(draw: st.DrawFn) -> Example:
    """`trainsim astra run` on drawn ASTRA-sim configs (mostly valid) and a collective or mutated workload."""
    files = dict(collective_et_files()) if draw(st.booleans()) else draw(mutated_et_files())
    files.update({"n.yml": draw(st.sampled_from(ASTRA_NETWORKS)), "s.json": draw(st.sampled_from(ASTRA_SYSTEMS)),
                  "m.json": draw(st.sampled_from(ASTRA_REMOTE))})
    argv = ["astra", "run", "--network", draw(st.sampled_from(["n.yml", "n.yml", "missing.yml", ""])),
            "--system", draw(st.sampled_from(["s.json", "s.json", "n.yml"])),
            "--workload", draw(st.sampled_from(["p", "p", "missing", "."]))]
    argv += draw(flags({"--remote-memory": st.sampled_from(["m.json", "missing.json"]),
                        "--num-queues-per-dim": INTS, "--backend": _choice(["unaware", "aware"]),
                        "--semantics": _choice(["astra", "nccl"]), "--compare": _choice(["astra", "nccl"]),
                        "--comm-groups": st.sampled_from(["missing.json", "s.json"])}, 3))
    return argv + draw(outputs(["--json"])), files


@st.composite
def astra_collectives(draw: st.DrawFn) -> Example:
    """`trainsim collective --astra-network N --astra-system S` with drawn configs and flags."""
    files = {"n.yml": draw(st.sampled_from(ASTRA_NETWORKS)), "s.json": draw(st.sampled_from(ASTRA_SYSTEMS))}
    argv = ["collective", "--astra-network", "n.yml", *draw(st.sampled_from([["--astra-system", "s.json"], []])),
            *draw(flags(COLLECTIVE_FLAGS, 3)), *draw(outputs(["--json"]))]
    return argv, files


@functools.cache
def learned_model_bytes() -> bytes:
    """A learned compute model as `trainsim predictor train` writes it (untrained: the roofline's times)."""
    import io

    import numpy as np

    from trainsim.learn.models import fit
    from trainsim.learn.stage_graph import GRAPH_FEATURES, NODE_FEATURES, StageGraph

    graphs = [StageGraph(np.full((3, len(NODE_FEATURES)), float(i), np.float32), np.array([[0, 1], [1, 2]]),
                         np.full(len(GRAPH_FEATURES), float(i), np.float32), 0.1, 1.0, 4.0, 1.1, f"k{i}")
              for i in range(4)]
    buf = io.BytesIO()
    fit("features", graphs, epochs=0).save(buf)
    return buf.getvalue()


VTRAIN_ROWS = (b"# GPUs,global batch,micro batch,hidden size,attention heads,# layers,sequence length,tensor "
               b"parallelism,data parallelism,pipeline parallelism,iteration time (ms)\n"
               b"1,4,1,256,4,2,128,1,1,1,10.5\n2,8,2,256,4,2,128,2,1,1,9.5\n2,8,1,256,4,2,128,1,2,1,8.0\n"
               b"2,8,1,256,4,2,128,1,1,2,12.0\n")


@st.composite
def predictors(draw: st.DrawFn) -> Example:
    """`trainsim predictor train | eval` on small measured-run files (valid or drawn) with drawn flags."""
    files = {"runs.csv": draw(st.sampled_from([VTRAIN_ROWS, VTRAIN_ROWS]) | csv_files())}
    data = draw(st.sampled_from(["runs.csv", "runs.csv", "missing.csv", "sub", ""]))
    common = {"--epochs": st.sampled_from(["0", "1", "2", "-1", "x", "100001"]), "--seed": INTS,
              "--model": _choice(["dag-transformer", "gcn", "gat", "features", "mlp"]), "--jobs": INTS,
              "--composition": _choice(["formula", "simulation"]),
              "-q": None}
    if draw(st.booleans()):
        argv = ["predictor", "train", data, "--out", draw(st.sampled_from(["m.pt", "m.pt", "sub", "", "-",
                                                                           "missing/m.pt"]))]
        argv += draw(flags({**common, "--epochs": st.sampled_from(["0", "1", "2", "-1", "x"])}, 3))
        return argv + draw(outputs(["--json"])), files
    argv = ["predictor", "eval", "--data", data]
    argv += draw(flags({**common, "--train-fraction": st.sampled_from(["0.5", "0.3", "0", "1", "-1", "nan", "x"])},
                       3))
    return argv + draw(outputs(["--json"])), files


@st.composite
def learned_simulations(draw: st.DrawFn) -> Example:
    """`simulate` and `validate` with `--compute learned:FILE` on a valid, damaged or foreign model file."""
    good = learned_model_bytes()
    model = draw(st.sampled_from([good, good, good[: len(good) // 2], b"", b"not a model", json.dumps({}).encode(),
                                  gzip.compress(good)]))
    files = {"m.pt": model, "runs.csv": VTRAIN_ROWS}
    compute = draw(st.sampled_from(["learned:m.pt", "learned:m.pt", "learned:runs.csv", "learned:missing.pt",
                                    "learned:sub"]))
    if draw(st.booleans()):
        argv = ["simulate", "-q", *GPT2_SMALL, "--compute", compute]
        argv += draw(flags({"--pp": SMALL_INTS, "--micro-batch": SMALL_INTS, "--learned-extrapolation": None}, 2))
    else:
        argv = ["validate", "runs.csv", "--jobs", "1", "--compute", compute]
        argv += draw(st.sampled_from([[], ["--learned-extrapolation"]]))
    return argv + draw(outputs(["--json"])), files


SMALL_JOB = {"model": {"name": "gpt2"}, "cluster": {"name": "pcie-titanxp", "nodes": 1},
             "strategy": {"tp": 2, "pp": 2, "dp": 2, "global_batch": 8, "micro_batch": 2}}
REPORT_INPUTS: dict[str, dict] = {
    "sim.json": {"kind": "simulation", "model": "gpt2", "n_gpus": 8, "device": "titan-xp", "iteration_time_s": 0.5,
                 "mfu": 0.3, "samples_per_s": 16.0, "strategy": {"tp": 2, "pp": 2, "dp": 2},
                 "breakdown": {"compute": 0.4, "bubble": 0.1}, "breakdown_per_stage": [{"compute": 0.4}],
                 "memory_per_stage": [{"stage": 0, "static_bytes": 1e9, "activation_peak_bytes": 1e9,
                                       "peak_bytes": 2e9}], "peak_memory_bytes": [2e9],
                 "memory_capacity_bytes": 12e9, "critical_path_by_category": {"compute": 0.4}, "job": SMALL_JOB},
    "search.json": {"kind": "search", "best": None, "top": [], "pruned": {"divisibility": 10}, "space": 12,
                    "evaluated": 2, "simulated": [
                        {"strategy": {"tp": t, "pp": p, "dp": 1, "micro_batch": 1, "recompute": "none", "zero": 1},
                         "n_gpus": 2, "iteration_time_s": 1.0 + t, "tokens_per_s": 100.0 * p, "mfu": 0.2,
                         "memory_headroom_gib": 3.0, "fits": True} for t in (1, 2) for p in (1, 2)]},
    "sweep.json": {"kind": "sweep", "study": "s", "varied": ["tp", "nic_gbps"], "rows": [
        {"tp": t, "nic_gbps": n, "n_gpus": 8, "iteration_time_s": 1.0, "tokens_per_s": 10.0 * t + n, "mfu": 0.4,
         "peak_memory_gib": 10.0, "memory_headroom_gib": 5.0, "fits": t < 4} for t in (1, 2, 4) for n in (25, 50)]},
    "val.json": {"kind": "training_runs", "summary": {"n": 3}, "rows": [
        {"row": i, "case_id": f"c{i}", "metric": "tflops_per_gpu", "predicted": 100.0 + 7 * i, "measured": 100.0,
         "error_pct": 7.0 * i, "group": "g" + str(i % 2)} for i in range(3)]},
    "replay.json": {"kind": "replay", "paths": ["missing.json"], "steps": [
        {"step": 1, "measured_ms": 10.0, "replayed_ms": 10.5, "rank": 0}], "replay_error_pct": 5.0,
        "measured_step_ms": 10.0, "replayed_step_ms": 10.5, "breakdown": {"compute": 9.0}},
}


def _damaged(data: dict, key: str, value: object) -> bytes:
    return json.dumps({**data, key: value}).encode()


@st.composite
def reports(draw: st.DrawFn) -> Example:
    """`trainsim report` on valid, damaged and foreign inputs of every kind, with drawn flags; and
    `simulate --report`."""
    if draw(st.integers(0, 5)) == 0:
        argv = ["simulate", "-q", *GPT2_SMALL[:4], "--nodes", "1", "--tp", "2", "--pp", "2",
                "--report", draw(st.sampled_from(["r.html", "r.html", "", "-", "sub", "missing/r.html"]))]
        return argv, {}
    files = {name: json.dumps(data).encode() for name, data in REPORT_INPUTS.items()}
    name = draw(st.sampled_from(sorted(REPORT_INPUTS)))
    files["bad.json"] = draw(st.sampled_from([
        b"", b"{", b"[]", b"null", b'{"kind": "nosuch"}', b'{"x": 1}', b"\xff\xfe",
        _damaged(REPORT_INPUTS[name], draw(st.sampled_from(sorted(REPORT_INPUTS[name]))),
                 draw(st.sampled_from([None, -1, "x", [], {}, [1, "x"], {"a": "b"}, 1e308, True])))]))
    files["job.yaml"] = draw(st.sampled_from([yaml.safe_dump(SMALL_JOB).encode(), b"model: [", b"model: {name: x}"]))
    inputs = draw(st.lists(st.sampled_from([*REPORT_INPUTS, "bad.json", "bad.json", "job.yaml", "missing.json",
                                            "sub", ""]), min_size=1, max_size=3))
    argv = ["report", *inputs, "-q"]
    argv += draw(flags({"--format": _choice(["html", "png"]), "--axes": st.sampled_from(
        ["tp,pp", "tp,nic_gbps", "tp", "tp,tp", "x,y", ",", ""]), "--title": WORDS}, 2))
    return argv + ["-o", draw(st.sampled_from(["r.html", "r.html", "pngs", "", "-", "sub", "missing/r.html",
                                                "/proc/version"]))], files


COMMANDS: dict[str, st.SearchStrategy[Example]] = {
    "replay | scale | optimize (trace files)": st.tuples(
        kineto_files(), st.sampled_from(["replay", "scale", "optimize"]),
        st.sampled_from([["rank0.json", "rank1.json"], ["rank*.json*"], ["rank0.json"], ["missing.json"], ["."],
                         ["rank1.json", "rank1.json"], [""]]),
        st.lists(st.sampled_from(_REPLAY_FLAGS + _SCALE_FLAGS), max_size=2)).map(
        lambda x: ([x[1], *x[2], *(a for pair in x[3] for a in pair)], x[0])),
    # a job with no parallel degree is searched first: kept short here (the search has its own entry)
    "simulate (flags)": _no_files(st.tuples(flags(SIMULATE_FLAGS, 6), outputs(
        ["--json", "--trace", "--dump-config", "--dump-strategy"])).map(
        lambda x: ["simulate", "-q", "--search-time-limit", "5", *x[0], *x[1]])),
    "simulate (YAML job)": yaml_jobs().map(lambda doc: (["simulate", "job.yaml", "-q", "--search-time-limit", "5",
                                                         "--json", "o.json"], {"job.yaml": doc})),
    "collective": _no_files(st.tuples(
        st.sampled_from([["--topology", "Ring(4)_Switch(2)"], ["--cluster", "dgx-a100"], ["--topology", "conv-4d"],
                         ["--topology", "Ring(100000)_Switch(100000)"], ["--cluster", "nosuch"], []]),
        flags(COLLECTIVE_FLAGS, 5), outputs(["--json"])).map(lambda x: ["collective", *x[0], *x[1], *x[2]])),
    "validate": st.tuples(csv_files(), st.lists(st.sampled_from(
        [["--tier", "A"], ["--subset", "core"], ["--jobs", "0"], ["--jobs", "1"], ["--max-mape", "-1"],
         ["--max-mape", "nan"], ["--max-mape", "10"], ["--all"], ["-q"], ["--jobs"], ["--by", "source"],
         ["--by", "tp,gpu"], ["--by", "nosuch"], ["--by", ","], ["--by", "collective,nodes"],
         ["--semantics", "nccl"], ["--semantics", "astra"], ["--semantics", "x"]]), max_size=2),
        outputs(["--json", "--plot"])).map(
        lambda x: (["validate", "cases.csv", *(a for pair in x[1] for a in pair), *x[2]], {"cases.csv": x[0]})),
    "calibrate": st.tuples(csv_files(), st.sampled_from(["a100", "nosuch", "", "h100"]),
                           st.sampled_from(["1", "1", "2", "0", "-3", "x"]),
                           st.sampled_from([["--out", p] for p in ("cal.yaml", "c2.yaml", "", "sub", "missing/c.yaml")]
                                           + [[]]),
                           st.sampled_from([[], [], ["--cv", "source"], ["--cv", "tp"], ["--cv", "nosuch"],
                                            ["--cv", ""], ["--cv", "source", "--json", "cv.json"]])).map(
        lambda x: (["calibrate", "m.csv", *x[3], "--family", x[1], "--every", x[2], "--fit", "gamma", *x[4]],
                   {"m.csv": x[0]})),
    "chakra export": _no_files(st.tuples(
        flags(_EXPORT_FLAGS, 5), st.sampled_from(["chakra", "", "..", "o.json", "sub"]),
        st.sampled_from(["g", "../escape", "", ".", "a/b"]),
        st.sampled_from(["0-1", "0-3,8", "x", "", "5-2", "99999999999"])).map(
        lambda x: ["chakra", "export", *GPT2_SMALL, "--granularity", "layer", *x[0], "--out", x[1], "--prefix", x[2],
                   "--ranks", x[3]])),
    # the YAML job is read and checked, then made small (exporting 1,024 ranks is slow, not wrong)
    "chakra export (YAML job)": yaml_jobs().map(lambda doc: (
        ["chakra", "export", "job.yaml", "--model", "gpt2", "--cluster", "pcie-titanxp", "--nodes", "1", "--out",
         "et"], {"job.yaml": doc})),
    "chakra run (trace files)": st.tuples(et_files() | mutated_et_files(), st.lists(st.sampled_from(
        [["--durations", "recorded"], ["--durations", "x"], ["--cpu-ops", "skip"], ["--dtype", "int3"],
         ["--dtype", "fp16"], ["--nodes", "0"], ["--nodes", "1"], ["--cluster", "nosuch"], ["--cluster", "dgx-h100"],
         ["--json", "o.json"], ["--json", "-"], ["--comm-groups", "missing.json"], ["--topology", "Ring(8)"],
         ["--topology", "Ring(2)_Switch(4)", "--bandwidth", "100,50", "--latency", "500,500"], ["--bandwidth", "1"],
         ["--topology", "Torus(8)"], ["--semantics", "astra"], ["--semantics", "x"], ["--latency", "x"]]),
        max_size=3)).map(
        lambda x: (["chakra", "run", "p", *(a for pair in x[1] for a in pair)], x[0])),
    "sweep": sweeps(),
    "search": searches(),
    "astra run": astra_runs(),
    "collective (ASTRA-sim configs)": astra_collectives(),
    "predictor train | predictor eval": predictors(),
    "simulate | validate --compute learned:FILE": learned_simulations(),
    "report | simulate --report": reports(),
    "models, clusters, help, version": _no_files(st.sampled_from(
        [[], ["models"], ["clusters"], ["models", "x"], ["clusters", "--json"], ["nosuch"], ["chakra"], ["astra"],
         ["astra", "nosuch"], ["predictor"], ["predictor", "nosuch"],
         ["chakra", "nosuch"], ["--version"], ["--help"], ["simulate", "--help"],
         ["simulate", "--tensor-parallel", "2"], ["simulate", "a.yaml", "b.yaml"]])),
}


def asked_outputs(argv: list[str]) -> tuple[str, ...]:
    """The paths an exit-0 run was asked to write (values of the output flags)."""
    return tuple(a for i, a in enumerate(argv) if i and argv[i - 1] in OUTPUT_FLAGS)
