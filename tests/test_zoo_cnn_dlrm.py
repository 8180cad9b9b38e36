"""CNN (ResNet-50, VGG-16/19) and DLRM builders: torchvision / MLPerf parameter counts, FLOPs, structure."""

from __future__ import annotations

import pytest

from trainsim.workload.ir import Layer, Model, Module, OpKind
from trainsim.workload.zoo.cnn import build_cnn, build_resnet50, build_vgg
from trainsim.workload.zoo.dlrm import build_dlrm

# MLPerf Criteo-1TB table sizes (--max-ind-range=40000000), restated here so the test is independent.
MLPERF_ROWS = [39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546, 403346, 10,
               2208, 11938, 155, 4, 976, 14, 39979771, 25641295, 39664984, 585935, 12972, 108, 36]


def _all_models() -> list[Model]:
    return [build_resnet50(4), build_vgg(16, 4), build_vgg(19, 4), build_dlrm(4),
            build_resnet50(2, image=160), build_vgg(16, 2, image=64)]


@pytest.mark.parametrize(("model", "params"), [
    (build_resnet50(1), 25_557_032),
    (build_vgg(16, 1), 138_357_544),
    (build_vgg(19, 1), 143_667_240),
])
def test_cnn_params_match_torchvision(model: Model, params: int) -> None:
    assert model.params == params


@pytest.mark.parametrize(("model", "gmacs"), [
    (build_resnet50(8), 4.09),
    (build_vgg(16, 8), 15.47),
    (build_vgg(19, 8), 19.63),
])
def test_cnn_fwd_flops_match_published_gmacs(model: Model, gmacs: float) -> None:
    flops = model.fwd_flops_per_sample()
    assert flops == pytest.approx(2 * gmacs * 1e9, rel=0.02)
    # only CONV and MATMUL contribute to a CNN's model FLOPs
    contraction = {op.kind for layer in model.layers for op in layer.ops if op.kind in
                   (OpKind.CONV, OpKind.MATMUL, OpKind.BMM, OpKind.ATTENTION)}
    assert contraction <= {OpKind.CONV, OpKind.MATMUL}


def test_cnn_flops_scale_with_image_and_params_do_not() -> None:
    small, big = build_resnet50(2, image=224), build_resnet50(2, image=448)
    assert small.params == big.params
    # every feature map doubles in each direction; only the tiny fc (2 MFLOPs) stays put
    assert big.fwd_flops_per_sample() == pytest.approx(4 * small.fwd_flops_per_sample(), rel=0.01)
    assert build_vgg(16, 2, image=64).params == 138_357_544  # adaptive 7x7 avgpool keeps fc1's input


def test_cnn_batch_dim_and_metadata() -> None:
    for m in (build_resnet50(3), build_vgg(16, 3), build_vgg(19, 3)):
        assert m.family == "cnn" and m.batch_dim == "n" and m.seq_len is None
        assert not m.is_language_model
        assert m.batch_size_in_graph == 3
    assert build_cnn("vgg19", 1).params == 143_667_240
    with pytest.raises(ValueError):
        build_vgg(11, 1)
    with pytest.raises(ValueError):
        build_cnn("alexnet", 1)


def test_resnet50_module_tree() -> None:
    m = build_resnet50(2)
    top = [c.name for c in m.root.children]
    assert top == ["stem", "layer1", "layer2", "layer3", "layer4", "fc"]
    blocks = {c.name: [b.name for b in c.children] for c in m.root.children if isinstance(c, Module)}
    assert {k: len(v) for k, v in blocks.items()} == {"layer1": 3, "layer2": 4, "layer3": 6, "layer4": 3}
    assert blocks["layer2"][0] == "layer2.0"
    assert len(m.layers) == 1 + 16 + 1
    convs = [op for layer in m.layers for op in layer.ops if op.kind == OpKind.CONV]
    assert len(convs) == 1 + 16 * 3 + 4  # stem + 3 per bottleneck + 4 downsample convs
    assert all(op.extra_params == 0 for op in convs)  # ResNet convs have no bias
    first = next(iter(m.root.layers()))
    assert first.ops[0].dims["p"] == 112 and first.ops[-1].dims["p"] == 56
    last_block = m.layers[-2]
    assert last_block.name == "layer4.2" and last_block.kind == "conv"
    assert last_block.ops[0].dims["hi"] == 7
    head_kinds = [op.kind for op in m.layers[-1].ops]
    assert head_kinds == [OpKind.POOL, OpKind.MATMUL, OpKind.LOSS]
    bns = [op for layer in m.layers for op in layer.ops if op.kind == OpKind.NORM]
    assert all(op.extra_params == 2 * op.dims["k"] for op in bns)


@pytest.mark.parametrize(("depth", "convs"), [(16, [2, 2, 3, 3, 3]), (19, [2, 2, 4, 4, 4])])
def test_vgg_module_tree(depth: int, convs: list[int]) -> None:
    m = build_vgg(depth, 2)
    assert m.name == f"vgg{depth}"
    assert [c.name for c in m.root.children] == ["features", "classifier"]
    features = m.root.children[0]
    assert isinstance(features, Module)
    assert [b.name for b in features.children] == [f"features.block{i}" for i in range(1, 6)]
    for block, count in zip(features.children, convs, strict=True):
        assert isinstance(block, Layer)
        assert sum(op.kind == OpKind.CONV for op in block.ops) == count
        assert block.ops[-1].kind == OpKind.POOL
    classifier = m.root.children[1]
    assert isinstance(classifier, Layer)
    fcs = [op for op in classifier.ops if op.kind == OpKind.MATMUL]
    assert [(op.dims["c"], op.dims["k"]) for op in fcs] == [(25088, 4096), (4096, 4096), (4096, 1000)]
    assert classifier.ops[-1].kind == OpKind.LOSS


def _dlrm_params_independent(rows: list[int], dim: int = 128) -> int:
    def mlp(sizes: list[int]) -> int:
        return sum(a * b + b for a, b in zip(sizes, sizes[1:], strict=False))

    features = len(rows) + 1
    inter = dim + features * (features - 1) // 2
    assert inter == 479
    return sum(rows) * dim + mlp([13, 512, 256, 128]) + mlp([inter, 1024, 1024, 512, 256, 1])


def test_dlrm_params() -> None:
    m = build_dlrm(16)
    assert m.params == _dlrm_params_independent(MLPERF_ROWS)
    emb = next(layer for layer in m.layers if layer.name == "embeddings")
    assert [op.dims["r"] for op in emb.ops] == MLPERF_ROWS
    assert emb.params == sum(MLPERF_ROWS) * 128


def test_dlrm_rows_capped() -> None:
    m = build_dlrm(2, rows=[50_000_000, 10], max_rows=40_000_000)
    emb = next(layer for layer in m.layers if layer.name == "embeddings")
    assert [op.dims["r"] for op in emb.ops] == [40_000_000, 10]


def test_dlrm_structure_and_flops() -> None:
    n = 8
    m = build_dlrm(n)
    assert m.family == "dlrm" and m.batch_dim == "n" and m.seq_len is None
    assert m.batch_size_in_graph == n
    assert [c.name for c in m.root.children] == ["bottom_mlp", "embeddings", "interaction", "top_mlp"]
    emb = m.layers[1]
    assert emb.kind == "embedding" and len(emb.ops) == 26
    assert all(op.kind == OpKind.EMBEDDING and op.fwd_flops() == 0 and op.weight == ("r", "h")
               for op in emb.ops)
    dot = next(op for op in m.layers[2].ops if op.kind == OpKind.BMM)
    assert (dot.dims["f"], dot.dims["g"], dot.dims["h"]) == (27, 27, 128)
    top = m.layers[3]
    assert next(op for op in top.ops if op.kind == OpKind.MATMUL).dims["c"] == 479
    assert top.ops[-1].kind == OpKind.LOSS
    mlp_macs = (13 * 512 + 512 * 256 + 256 * 128 + 479 * 1024 + 1024 * 1024 + 1024 * 512 + 512 * 256 + 256)
    assert m.fwd_flops_per_sample() == pytest.approx(2 * mlp_macs + 2 * 27 * 27 * 128)
    with pytest.raises(ValueError):
        build_dlrm(2, bottom_mlp=(512, 256, 64))


@pytest.mark.parametrize("model", _all_models(), ids=lambda m: m.name)
def test_every_op_names_only_its_dims(model: Model) -> None:
    for layer in model.layers:
        names = [op.name for op in layer.ops]
        assert len(names) == len(set(names)), layer.name
        for op in layer.ops:
            dims = set(op.dims)
            tensors = [*op.inputs, op.output, *(s.dims for s in op.saved)]
            if op.weight is not None:
                tensors.append(op.weight)
            if op.flop_dims is not None:
                tensors.append(op.flop_dims)
            for t in tensors:
                assert set(t) <= dims, f"{layer.name}.{op.name}: {t} not in {sorted(dims)}"
            assert model.batch_dim in op.dims and op.dims[model.batch_dim] == model.batch_size_in_graph
            assert all(size >= 1 for size in op.dims.values())
            assert op.fwd_flops() >= 0


@pytest.mark.parametrize("model", _all_models(), ids=lambda m: m.name)
def test_layer_names_unique(model: Model) -> None:
    names = [layer.name for layer in model.layers]
    assert len(names) == len(set(names))
