"""Rows of ASTRA-sim reference files (`astra_reference.csv`): ASTRA-sim's own predicted collective times.

Each row is one collective on one network, as ASTRA-sim 2.0's analytical backends ran it
(`../shared/validation/astra_reference.md`): topology in ASTRA-sim's notation with per-link bandwidth
in GiB/s and latency per dimension, the op with ASTRA-sim's `comm_size` (an all-gather's is the input
per rank), chunks (preferred-dataset-splits), queues per dimension, per-dimension algorithms,
endpoint delay and local-mem-bw. Rows are predicted with trainsim's collective model in ASTRA-sim's
semantics (`cost.semantics.astra`), or with NCCL's to show how far the two are apart and why.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..astra_inputs import ALGORITHM_NAMES, BLOCKS
from ..cost.collective_gap import Gap, explain
from ..cost.multidim import Dimension, run_collective
from ..cost.semantics import Semantics, astra, links_per_npu
from ..hardware.topology import GIB_PER_S_IN_GBPS
from .cases import Outcome, skip

REQUIRED_COLUMNS = ("row_id", "backend", "topology", "bandwidth_gbps_per_dim", "latency_ns_per_dim", "op",
                    "comm_size_bytes", "chunks", "queues_per_dim", "algorithms_per_dim", "endpoint_delay_ns",
                    "local_mem_bw_gbps", "astra_time_us")
_DIM = re.compile(r"^(Ring|FC|FullyConnected|Switch)\((\d+)\)$")
_OPS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")


@dataclass(frozen=True)
class AstraRow:
    """One row as trainsim's collective model takes it."""

    op: str
    size_bytes: float  # nccl-tests convention (an all-gather's gathered output)
    dims: tuple[Dimension, ...]
    chunks: int
    semantics: Semantics

    def time_s(self, sem: Semantics | None = None) -> float:
        return run_collective(self.op, self.size_bytes, self.dims, chunks=self.chunks,
                              semantics=self.semantics if sem is None else sem).time_s

    def gap(self) -> Gap:
        return explain(self.time_s, self.semantics)


def _floats(text: str, what: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"{what} '{text}' is not a comma list of numbers") from None


def parse_row(row: dict[str, str]) -> AstraRow:
    """The row's collective; ValueError naming the column at fault."""
    parts = row["topology"].strip().split("_")
    matches = [_DIM.match(p) for p in parts]
    if not all(matches):
        raise ValueError(f"topology '{row['topology']}' is not Ring(k)/FC(k)/Switch(k) joined by _")
    bw = _floats(row["bandwidth_gbps_per_dim"], "bandwidth_gbps_per_dim")
    lat = _floats(row["latency_ns_per_dim"], "latency_ns_per_dim")
    algos = [a.strip() for a in row["algorithms_per_dim"].split(",")]
    if not len(bw) == len(lat) == len(algos) == len(parts):
        raise ValueError("topology, bandwidth_gbps_per_dim, latency_ns_per_dim and algorithms_per_dim need one "
                         "entry per dimension")
    dims = []
    for m, b, la, a in zip(matches, bw, lat, algos, strict=True):
        assert m is not None
        name = "FullyConnected" if m.group(1) == "FC" else m.group(1)
        kind, k = BLOCKS[name], int(m.group(2))
        if a not in ALGORITHM_NAMES:
            raise ValueError(f"algorithm '{a}' is not one of {', '.join(ALGORITHM_NAMES)}")
        if not (k > 1 and b > 0 and la >= 0):
            raise ValueError("every dimension needs k > 1 NPUs, bandwidth > 0 and latency >= 0")
        links = links_per_npu(kind, k)
        dims.append(Dimension(kind, k, b * GIB_PER_S_IN_GBPS * links, la * 1e-9, ALGORITHM_NAMES[a], links))
    op = row["op"].strip()
    if op not in _OPS:
        raise ValueError(f"op '{op}' is not one of {', '.join(_OPS)}")
    backend = row["backend"].strip()
    if backend not in ("unaware", "aware"):
        raise ValueError(f"backend '{backend}' is not unaware or aware")
    if backend == "aware" and len(dims) > 1:
        raise ValueError("the congestion-aware backend takes 1-D topologies only")
    npus = math.prod(d.size for d in dims)
    comm_size = float(row["comm_size_bytes"])
    chunks, queues = int(row["chunks"]), int(row["queues_per_dim"])
    if comm_size < 1 or chunks < 1 or queues < 1:
        raise ValueError("comm_size_bytes, chunks and queues_per_dim must be >= 1")
    sem = astra(float(row["endpoint_delay_ns"]), float(row["local_mem_bw_gbps"]), backend=backend,
                queues_per_dim=queues)
    size = comm_size * npus if op == "all_gather" else comm_size  # ASTRA's all-gather size is the input per rank
    return AstraRow(op, size, tuple(dims), chunks, sem)


def astra_outcomes(rows: list[dict[str, str]], semantics: str = "astra") -> list[Outcome]:
    """One outcome per row, predicted in ASTRA-sim's semantics (or NCCL's); the tags carry the terms
    of the gap when predicting with NCCL's."""
    out = []
    for i, row in enumerate(rows):
        rid = row.get("row_id", "").strip() or f"row{i}"
        case = f"{rid} {row.get('topology', '?')} {row.get('op', '?')} {row.get('comm_size_bytes', '?')}B " \
               f"x{row.get('chunks', '?')}"
        try:
            ar = parse_row(row)
            measured = float(row["astra_time_us"])
        except (KeyError, ValueError) as exc:
            out.append(skip(i, case, f"unreadable row: {exc}"))
            continue
        tags = {"backend": row["backend"], "algorithms": row["algorithms_per_dim"]}
        if semantics == "astra":
            predicted = ar.time_s() * 1e6
        else:
            gap = ar.gap()
            predicted = gap.nccl_s * 1e6
            tags.update({f"term:{t.name}": repr(t.delta_s * 1e6) for t in gap.terms})  # exact: the table sums them
        out.append(Outcome(row=i, case_id=case, metric="time_us", predicted=predicted, measured=measured,
                           group=row.get("group_id") or None, tags=tags))
    return out


def term_table(outcomes: list[Outcome]) -> list[tuple[str, str, int, float, float]]:
    """Per term of the gap (ASTRA-sim's time minus the NCCL-like one): the rows where it acts, its summed
    us, and its share of the file's summed gap in % (the shares add up to 100):
    (term, description, rows, total us, share %)."""
    from ..cost.semantics import TERMS

    total = sum((o.measured or 0.0) - (o.predicted or 0.0) for o in outcomes)
    out = []
    for name, what in TERMS:
        deltas = [float(o.tags[f"term:{name}"]) for o in outcomes if f"term:{name}" in o.tags]
        if deltas:
            out.append((name, what, len(deltas), sum(deltas), sum(deltas) / total * 100 if total else math.nan))
    return out


__all__ = ["AstraRow", "REQUIRED_COLUMNS", "astra_outcomes", "parse_row", "term_table"]
