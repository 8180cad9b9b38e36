"""The bad inputs of issue 13 by name, shared by tests/test_named_inputs.py and benchmarks/input_fuzz.py.

Each case: the argument list, files to create first, the exit code promised, and what the error line
must name. Paths are relative to the run's own empty directory.
"""

from __future__ import annotations

from dataclasses import dataclass, field

NON_UTF8 = b"\xff\xfe model: \xe9\n"
VTRAIN_HEADER = ("# GPUs,global batch,micro batch,hidden size,attention heads,# layers,sequence length,"
                 "tensor parallelism,data parallelism,pipeline parallelism,iteration time (ms)\n")


@dataclass(frozen=True)
class Case:
    name: str
    argv: list[str]
    files: dict[str, bytes] = field(default_factory=dict)
    rc: int = 2
    names: tuple[str, ...] = ()  # substrings the error line must contain
    outputs: tuple[str, ...] = ()  # files an exit-0 run may create

    @property
    def command(self) -> str:
        return " ".join(self.argv[:2]) if self.argv[:1] == ["chakra"] else (self.argv[0] if self.argv else "")


CASES: list[Case] = [
    # ---- tracebacks that must be one line
    Case("non-UTF-8 job YAML", ["simulate", "job.yaml", "-q"], {"job.yaml": NON_UTF8}, names=("config", "UTF-8")),
    Case("non-UTF-8 strategy tree", ["simulate", "--model", "gpt2", "--cluster", "pcie-titanxp", "--strategy-tree",
                                     "tree.yaml", "-q"], {"tree.yaml": NON_UTF8}, names=("strategy.tree", "UTF-8")),
    Case("non-UTF-8 calibration", ["simulate", "--model", "gpt2", "--cluster", "pcie-titanxp", "--calibration",
                                   "cal.yaml", "-q"], {"cal.yaml": NON_UTF8}, names=("calibration", "UTF-8")),
    Case("non-UTF-8 chakra export config", ["chakra", "export", "job.yaml", "--out", "et"], {"job.yaml": NON_UTF8},
         names=("config", "UTF-8")),
    Case("non-UTF-8 comm-groups JSON", ["chakra", "run", "p", "--comm-groups", "g.json"],
         {"p.0.et": b"", "g.json": NON_UTF8}),  # (the empty ET is refused first; load_json's own test covers UTF-8)
    Case("non-UTF-8 HF config", ["simulate", "--hf-config", "config.json", "-q"], {"config.json": NON_UTF8},
         names=("hf_config", "UTF-8")),
    Case("non-UTF-8 validate CSV", ["validate", "cases.csv"], {"cases.csv": NON_UTF8}, names=("UTF-8",)),
    Case("deeply nested YAML", ["simulate", "deep.yaml", "-q"], {"deep.yaml": b"[" * 100_000},
         names=("config", "nested")),
    Case("--json empty path", ["simulate", "--model", "gpt2", "--cluster", "pcie-titanxp", "--json", "", "-q"],
         names=("--json", "empty")),
    Case("validate: empty numeric cell", ["validate", "cases.csv", "--json", "v.json", "-q"],
         {"cases.csv": (VTRAIN_HEADER + "8,16,2,1024,16,4,512,2,4,1,\n8,16,2,1024,16,4,512,2,4,1,120.5\n").encode()},
         rc=0, outputs=("v.json",)),
    Case("collective: 10^10 NPUs", ["collective", "--topology", "Ring(100000)_Switch(100000)", "--bandwidth", "1,1",
                                    "--latency", "1,1"], names=("--topology",)),
    Case("collective: 10^11 ranks", ["collective", "--cluster", "dgx-a100", "--ranks", "100000000000"],
         names=("--ranks",)),
    Case("empty job path", ["simulate", "", "-q"], names=("config", "empty")),
    Case("empty --hf-config", ["simulate", "--hf-config", "", "-q"], names=("hf_config",)),
    Case("empty --calibration", ["simulate", "--calibration", "", "-q"], names=("calibration",)),
    Case("empty --strategy-tree", ["simulate", "--strategy-tree", "", "-q"], names=("strategy.tree",)),
    Case("empty validate CSV path", ["validate", ""], names=("CASES", "empty")),
    Case("empty calibrate CSV path", ["calibrate", "", "--out", "c.yaml"], names=("empty",)),
    Case("empty chakra run prefix", ["chakra", "run", ""], names=("PREFIX", "empty")),
    Case("empty chakra export --out", ["chakra", "export", "--model", "gpt2", "--cluster", "pcie-titanxp",
                                       "--out", ""], names=("--out", "empty")),
    # ---- hangs and memory exhaustion: refused at once with the limit named
    Case("--global-batch 10^11", ["simulate", "--global-batch", "100000000000", "-q"], names=("global",)),
    Case("--layers 200000 --hidden 65536", ["simulate", "--model", "custom", "--layers", "200000", "--hidden",
                                            "65536", "--heads", "64", "-q"], names=("layers",)),
    Case("collective Ring(10^9)", ["collective", "--topology", "Ring(1000000000)", "--bandwidth", "1", "--latency",
                                   "1"], names=("--topology",)),
    Case("collective --chunks 10^8", ["collective", "--topology", "Ring(8)", "--bandwidth", "1", "--latency", "1",
                                      "--chunks", "100000000"], names=("--chunks",)),
    Case("simulate /dev/zero", ["simulate", "/dev/zero", "-q"], names=("config", "limit")),
    Case("--exact past its limit", ["simulate", "--exact", "-q"], names=("exact",)),
    # ---- outputs
    Case("output dir missing, checked before simulating", ["simulate", "--model", "gpt2", "--cluster",
                                                           "pcie-titanxp", "--json", "o.json", "--trace",
                                                           "nonexistent/t.json", "-q"], names=("--trace",)),
    Case("output is a directory", ["simulate", "--model", "gpt2", "--cluster", "pcie-titanxp", "--json", ".", "-q"],
         names=("--json", "directory")),
    Case("two outputs, one path", ["simulate", "--model", "gpt2", "--cluster", "pcie-titanxp", "--json", "o.json",
                                   "--trace", "o.json", "-q"], names=("--trace", "--json")),
    Case("--trace /dev/full", ["simulate", "--model", "gpt2", "--cluster", "pcie-titanxp", "--trace", "/dev/full",
                               "-q"], names=("--trace", "space")),
    Case("chakra export --prefix escape", ["chakra", "export", "--model", "gpt2", "--cluster", "pcie-titanxp", "--tp",
                                           "2", "--pp", "2", "--out", "et", "--prefix", "../../escape"],
         names=("--prefix",)),
    # ---- accepted silently before
    Case("YAML model: 42", ["simulate", "job.yaml", "-q"], {"job.yaml": b"model: 42\n"}, names=("model",)),
    Case("YAML recursive alias", ["simulate", "job.yaml", "-q"], {"job.yaml": b"model: &a [*a]\n"},
         names=("config", "alias")),
    Case("YAML tp: true", ["simulate", "job.yaml", "-q"], {"job.yaml": b"strategy: {tp: true}\n"},
         names=("strategy.tp",)),
    Case("YAML duplicate keys", ["simulate", "job.yaml", "-q"], {"job.yaml": b"strategy: {tp: 2, tp: 4}\n"},
         names=("config", "twice")),
    Case("--kv-heads 5 with 64 heads", ["simulate", "--model", "llama2-70b", "--kv-heads", "5", "-q"],
         names=("kv_heads",)),
    Case("--heads 7 with hidden 4096", ["simulate", "--model", "custom", "--layers", "2", "--hidden", "4096",
                                        "--heads", "7", "-q"], names=("heads",)),
    Case("--intra-node-gbps 1e-320", ["simulate", "--intra-node-gbps", "1e-320", "-q"], names=("intra_node_gbps",)),
    Case("collective --bytes 1e400", ["collective", "--cluster", "dgx-a100", "--ranks", "8", "--bytes", "1e400"],
         names=("--bytes",)),
    Case("collective --bytes 1.5", ["collective", "--cluster", "dgx-a100", "--ranks", "8", "--bytes", "1.5"],
         names=("--bytes",)),
    Case("collective --peer 0", ["collective", "--cluster", "dgx-a100", "--ranks", "8", "--op", "send_recv",
                                 "--peer", "0"], names=("--peer",)),
    Case("--bandwidth without --topology", ["simulate", "--bandwidth", "100,10", "-q"], names=("bandwidth",)),
    Case("--nodes with a topology preset", ["simulate", "--topology", "conv-4d", "--nodes", "3", "-q"],
         names=("nodes",)),
    Case("--seq-len for a CNN", ["simulate", "--model", "resnet50", "--seq-len", "100", "--cluster", "dgx-a100",
                                 "--nodes", "1", "-q"], names=("seq_len",)),
    Case("--fsdp --zero 1", ["simulate", "--fsdp", "--zero", "1", "-q"], names=("zero", "fsdp")),
    Case("--dtype bf16 on a Titan Xp", ["simulate", "--model", "gpt2", "--cluster", "pcie-titanxp", "--dtype",
                                        "bf16", "-q"], names=("dtype", "bf16")),
    Case("chakra run --dtype int3", ["chakra", "run", "p", "--dtype", "int3"], names=("--dtype",)),
    Case("calibrate --family nosuch", ["calibrate", "m.csv", "--out", "c.yaml", "--family", "nosuch"],
         {"m.csv": b"m,n,k,dtype,gpu,tflops\n1024,1024,1024,bf16,a100,200\n"}, names=("--family",)),
    Case("validate --jobs 0", ["validate", "cases.csv", "--jobs", "0"], {"cases.csv": VTRAIN_HEADER.encode()},
         names=("--jobs",)),
    Case("validate --by nosuch", ["validate", "cases.csv", "--by", "tp,nosuch"],
         {"cases.csv": (VTRAIN_HEADER + "8,16,2,1024,16,4,512,2,4,1,120.5\n").encode()}, names=("--by", "nosuch")),
    Case("calibrate --cv nosuch", ["calibrate", "m.csv", "--cv", "nosuch"],
         {"m.csv": (VTRAIN_HEADER + "8,16,2,1024,16,4,512,2,4,1,120.5\n").encode()}, names=("--cv", "nosuch")),
    Case("calibrate without --out or --cv", ["calibrate", "m.csv"],
         {"m.csv": (VTRAIN_HEADER + "8,16,2,1024,16,4,512,2,4,1,120.5\n").encode()}, names=("--out",)),
]
