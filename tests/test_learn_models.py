"""trainsim.learn.models: PredTOP's DAG Transformer, GCN, GAT and the features-only MLP.

Synthetic stage graphs whose true correction is a known function of one node feature (stage_s =
base_stage_s * (1 + 0.3 * mean of feature 0), the feature's per-graph level drawn at random) check that
every model learns it from the graph and beats the analytical time by a wide margin on held-out graphs;
the rest pins the contract: r = 0 untrained, determinism, save/load, and the DAG masks.
"""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from trainsim.errors import ConfigError  # noqa: E402
from trainsim.learn import models as M  # noqa: E402
from trainsim.learn.stage_graph import StageGraph  # noqa: E402


def _synthetic(n_graphs: int, seed: int, n_features: int = 5) -> list[StageGraph]:
    """Random DAGs (a chain plus forward shortcuts, 8 to 24 nodes) labelled with a known correction."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n_graphs):
        n = int(rng.integers(8, 25))
        src, dst = list(range(n - 1)), list(range(1, n))
        for _ in range(n // 2):
            a, b = sorted(rng.choice(n, 2, replace=False).tolist())
            src.append(a)
            dst.append(b)
        x = rng.normal(size=(n, n_features)).astype(np.float32)
        x[:, 0] = rng.uniform(0, 2 * rng.uniform(), size=n)  # mean ~ U(0, 1) across graphs
        base_stage = float(np.exp(rng.uniform(-5, -1)))
        slots = float(rng.integers(4, 13))
        base_iter = 1.2 * slots * base_stage  # plus data-parallel / optimizer time outside the pipeline
        stage = base_stage * (1 + 0.3 * float(x[:, 0].mean()))
        g = np.asarray([math.log(n), math.log(base_stage), rng.normal()], dtype=np.float32)
        out.append(StageGraph(x=x, edges=np.asarray([src, dst], dtype=np.int64), g=g, base_stage_s=base_stage,
                              base_iter_s=base_iter, slots=slots,
                              label_s=base_iter + slots * (stage - base_stage), key=f"cfg{seed}-{i}"))
    return out


TRAIN = _synthetic(120, seed=1)
TEST = _synthetic(60, seed=2)


def _mre(pred: np.ndarray, graphs: list[StageGraph]) -> float:
    labels = np.asarray([g.label_s for g in graphs])
    return float(np.mean(np.abs(pred / labels - 1)))


@pytest.fixture(scope="module")
def fitted() -> dict[str, M.Fitted]:
    """One short fit per model, shared by the tests below (the file's main cost)."""
    return {kind: M.fit(kind, TRAIN, seed=0, epochs=40, lr=3e-3, patience=40) for kind in M.MODELS}


def test_reachability_and_masks_of_a_hand_written_dag() -> None:
    # 0 -> 1 -> 3, 0 -> 2 -> 3, 3 -> 4, and 5 alone
    edges = np.asarray([[0, 0, 1, 2, 3], [1, 2, 3, 3, 4]])
    reach = np.zeros((6, 6), dtype=bool)
    for u, vs in {0: (1, 2, 3, 4), 1: (3, 4), 2: (3, 4), 3: (4,)}.items():
        reach[u, list(vs)] = True
    assert np.array_equal(M.reachability(edges, 6), reach)
    mask = M.dag_attention_mask(edges, 6)
    assert np.array_equal(mask, reach | reach.T | np.eye(6, dtype=bool))
    assert not mask[1, 2] and not mask[2, 1]  # siblings: no path either way
    assert not mask[5, :5].any() and mask[5, 5]
    assert M.node_depth(edges, 6).tolist() == [0, 1, 1, 2, 3, 0]
    adj = M.adjacency(edges, 6)
    assert adj[1, 0] and adj[0, 1] and adj[4, 4] and not adj[0, 3]
    with pytest.raises(ValueError, match="topological"):
        M.reachability(np.asarray([[1], [0]]), 2)


@pytest.mark.parametrize("kind", M.MODELS)
def test_untrained_model_is_the_analytical_time(kind: str) -> None:
    f = M.fit(kind, TRAIN, epochs=0)
    assert np.array_equal(f.predict_iter_s(TEST), np.asarray([g.base_iter_s for g in TEST]))
    assert np.array_equal(f.predict_stage_s(TEST), np.asarray([g.base_stage_s for g in TEST]))


@pytest.mark.parametrize("kind", M.MODELS)
def test_fit_learns_a_known_correction(kind: str, fitted: dict[str, M.Fitted]) -> None:
    untrained = _mre(np.asarray([g.base_iter_s for g in TEST]), TEST)
    err = _mre(fitted[kind].predict_iter_s(TEST), TEST)
    assert untrained > 0.10
    assert err < 0.02, f"{kind}: held-out MRE {err:.4f}"
    assert err < untrained / 5
    # the correction varies with the graph: a constant one (the best single r) cannot get below ~5 %
    truth = np.asarray([g.label_s for g in TEST])
    base = np.asarray([(g.base_iter_s, g.slots * g.base_stage_s) for g in TEST])
    best_constant = min(_mre(base[:, 0] + base[:, 1] * np.expm1(r), TEST) for r in np.linspace(0, 0.3, 61))
    assert best_constant > 0.04 and err < best_constant / 2
    stage = fitted[kind].predict_stage_s(TEST)
    true_stage = np.asarray([g.base_stage_s for g in TEST]) + (truth - base[:, 0]) / [g.slots for g in TEST]
    assert np.mean(np.abs(stage / true_stage - 1)) < 0.03


def test_same_seed_same_predictions(fitted: dict[str, M.Fitted]) -> None:
    again = M.fit("gcn", TRAIN, seed=0, epochs=40, lr=3e-3, patience=40)
    assert np.array_equal(again.predict_r(TEST), fitted["gcn"].predict_r(TEST))
    other = M.fit("gcn", TRAIN, seed=1, epochs=3, lr=3e-3)
    assert not np.array_equal(other.predict_r(TEST), fitted["gcn"].predict_r(TEST))


def test_best_weights_restored_and_early_stopping(fitted: dict[str, M.Fitted]) -> None:
    f = fitted["dag-transformer"]
    train_idx, val_idx = M._split_by_key(TRAIN, 0.1, 0)
    assert len(val_idx) == 12 and not {TRAIN[i].key for i in train_idx} & {TRAIN[i].key for i in val_idx}
    val = [TRAIN[i] for i in val_idx]
    assert f.val_error == min(v for _, _, v in f.history)
    assert _mre(f.predict_iter_s(val), val) == pytest.approx(f.val_error, rel=1e-6)  # the best epoch's
    seen: list[tuple[int, float, float | None]] = []
    frozen = M.fit("features", TRAIN, epochs=50, lr=0.0, patience=3, progress=lambda *s: seen.append(s))
    assert seen == frozen.history and [s[0] for s in seen] == [0, 1, 2, 3]  # no progress: stops at 0 + 3
    assert frozen.best_epoch == 0


def test_save_load_round_trip(tmp_path: Path, fitted: dict[str, M.Fitted]) -> None:
    for kind, f in fitted.items():
        path = tmp_path / f"{kind}.pt"
        f.save(path)
        raw = torch.load(path, weights_only=True)  # a plain dict: no pickled classes
        assert raw["kind"] == kind and raw["format"] == M.FORMAT
        back = M.Fitted.load(path)
        assert np.array_equal(back.predict_iter_s(TEST), f.predict_iter_s(TEST))
        assert np.array_equal(back.x_std, f.x_std) and back.best_epoch == f.best_epoch


def test_bad_inputs() -> None:
    with pytest.raises(ConfigError, match="unknown model"):
        M.make_model("mlp", 3, 2)
    unlabelled = [dataclasses.replace(g, label_s=None) for g in TRAIN[:4]]
    with pytest.raises(ConfigError, match="no labelled"):
        M.fit("gcn", unlabelled)
    f = M.fit("features", TRAIN, epochs=0)
    wrong = _synthetic(2, seed=3, n_features=4)
    with pytest.raises(ValueError, match="node / 3 graph features"):
        f.predict_iter_s(wrong)


def test_without_torch_a_one_line_config_error() -> None:
    code = ("import sys; sys.modules['torch'] = None\n"
            "import trainsim\nfrom trainsim.learn import models\n"
            "try:\n    models.make_model('gcn', 3, 2)\nexcept Exception as e:\n    print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == ("ConfigError learn: the learned models need torch, which is not installed; "
                           "pip install 'trainsim[learn]'")


def test_import_trainsim_does_not_import_torch() -> None:
    code = "import sys, trainsim, trainsim.learn; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
