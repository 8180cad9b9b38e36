"""BERT's sequence-classification head (model.head: classifier): its parameters and saved bytes by hand, and
validate mapping BertForSequenceClassification rows to it."""

from __future__ import annotations

import math

from training_row import training_row

import trainsim
from trainsim.validate import training_runs as tr
from trainsim.workload.zoo import build_model


def _head_ops(head: str) -> dict[str, object]:
    model = build_model("bert-large", 4, 512, "unfused", {"head": head})
    return {op.name: op for la in model.layers if la.kind == "head" for op in la.ops}


def test_classifier_head_parameters_by_hand() -> None:
    lm = build_model("bert-large", 4, 512, "unfused")
    cls = build_model("bert-large", 4, 512, "unfused", {"head": "classifier"})
    h = 1024
    # + pooler h*h + h, + classifier (h + 1) * 2 labels; - the LM head's final LayerNorm (2h; its vocab matrix is
    # tied to the embedding, so it adds no parameters)
    assert cls.params - lm.params == h * h + h + (h + 1) * 2 - 2 * h


def test_classifier_head_saves_a_few_rows_not_logits() -> None:
    ops = _head_ops("classifier")
    assert "lm_head" not in ops and "final_norm" not in ops
    saved = sum(math.prod(op.dims[d] for d in t.dims) * t.bytes_per_elem  # type: ignore[attr-defined]
                for op in ops.values() for t in op.saved)  # type: ignore[attr-defined]
    b, h = 4, 1024
    # pooler input rows (2 B), tanh output (2 B), dropout mask (1 B), classifier input (2 B) per b x h element,
    # and the fp32 logits over b x 2 labels
    assert saved == b * h * (2 + 2 + 1 + 2) + b * 2 * 4


def test_classifier_head_simulates_below_the_mlm_head() -> None:
    def peak(head: str) -> float:
        r = trainsim.simulate({"model": {"name": "bert-large", "head": head, "attention": "unfused"},
                               "cluster": {"name": "dgx-a100", "nodes": 1, "gpus_per_node": 1},
                               "strategy": {"micro_batch": 4}})
        return r.memory[0].components_bytes["activations"]

    # the MLM head keeps b x s x vocab logits (4 x 512 x 30522): the classifier keeps none of them
    assert peak("classifier") < peak("lm") - 4 * 512 * 30522 * 4


def test_validate_maps_sequence_classification_rows() -> None:
    row = training_row(model_name="bert-large-uncased (AutoModelForSequenceClassification)",
                       arch="BERT encoder (post-LN, GeLU 4h, MHA) + classification head", n_layers="24",
                       hidden="1024", n_heads="16", n_kv_heads="16", ffn_hidden="4096", seq_len="512",
                       vocab="30522", n_gpus="1", dp="1", micro_batch="4", global_batch="4")
    rj = tr.row_job(row)
    assert not isinstance(rj, str), rj
    assert rj.job["model"]["head"] == "classifier" and "classification" in rj.assumptions["head"]
