"""`simulate --max-micro-batch` (optimize.micro_batch): the largest micro-batch that fits, checked by simulation;
peaks are the reserved ones the verdict uses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trainsim.api import parse_job, simulate
from trainsim.cli import main
from trainsim.optimize.micro_batch import largest_fitting_micro_batch, micro_batch_candidates


def _job(micro_batch: int = 1, **strategy: Any) -> Any:  # noqa: ANN401
    return parse_job({"model": {"name": "gpt2", "seq_len": 1024}, "cluster": {"name": "pcie-titanxp", "nodes": 1},
                      "strategy": {"tp": 1, "pp": 2, "dp": 4, "global_batch": 256, "micro_batch": micro_batch,
                                   **strategy}})


def test_candidates_are_the_divisors_of_the_batch_per_replica() -> None:
    assert micro_batch_candidates(64, 2) == [1, 2, 4, 8, 16, 32]
    assert micro_batch_candidates(36, 1) == [1, 2, 3, 4, 6, 9, 12, 18, 36]
    assert micro_batch_candidates(7, 7) == [1]


def test_the_answer_fits_and_the_next_candidate_does_not() -> None:
    job = _job()
    fit = largest_fitting_micro_batch(job, simulate(job))
    assert fit.micro_batch is not None and fit.next_micro_batch is not None  # 12 GB: some fit, not all 64
    at = simulate(_job(fit.micro_batch))
    above = simulate(_job(fit.next_micro_batch))
    assert not at.oom and above.oom
    assert max(m.reserved_bytes for m in at.memory) == pytest.approx(fit.peak_bytes)
    assert max(m.reserved_bytes for m in above.memory) == pytest.approx(fit.next_peak_bytes)
    cands = micro_batch_candidates(256, 4)
    assert cands[cands.index(fit.micro_batch) + 1] == fit.next_micro_batch
    assert fit.simulations <= 2 * len(cands).bit_length()  # a binary search, not a sweep


def test_when_nothing_fits_the_smallest_is_named() -> None:
    job = parse_job({"model": {"name": "llama3-8b", "seq_len": 1024}, "cluster": {"name": "pcie-titanxp", "nodes": 1},
                     "strategy": {"tp": 1, "pp": 1, "dp": 8, "global_batch": 32, "micro_batch": 1}})
    result = simulate(job)
    assert result.oom
    fit = largest_fitting_micro_batch(job, result)
    assert fit.micro_batch is None and fit.next_micro_batch == 1
    assert fit.next_peak_bytes == pytest.approx(max(m.reserved_bytes for m in result.memory))
    assert fit.describe().startswith("no micro-batch fits: 1 needs")


def test_cli_json_and_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o.json"
    argv = ["simulate", "--model", "gpt2", "--seq-len", "1024", "--cluster", "pcie-titanxp", "--nodes", "1",
            "--pp", "2", "--dp", "4", "--global-batch", "256", "--max-micro-batch"]
    main([*argv, "--json", str(out)])
    data = json.loads(out.read_text())["max_micro_batch"]
    assert data["micro_batch"] is not None and data["peak_memory_gib"] <= data["capacity_gib"]
    assert data["next_peak_memory_gib"] > data["capacity_gib"]
    assert f"largest micro-batch that fits: {data['micro_batch']}" in capsys.readouterr().out


def test_a_strategy_tree_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tree = tmp_path / "tree.yaml"
    main(["simulate", "--model", "gpt2", "--cluster", "dgx-a100", "--nodes", "1", "--tp", "2", "--dp", "4",
          "--global-batch", "8", "-q", "--dump-strategy", str(tree)])
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--model", "gpt2", "--cluster", "dgx-a100", "--nodes", "1", "--strategy-tree", str(tree),
              "--max-micro-batch", "-q"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--max-micro-batch" in err[0]
