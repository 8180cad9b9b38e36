"""trainsim.nn: torch-style models (no torch) traced into the IR. A ResNet-50 and a VGG-19 written
the way torchvision writes them must give torchvision's parameter counts, the zoo's forward FLOPs
and the zoo's simulated data-parallel iteration; module nesting, op names, `input_from` / "@skip"
and dimension names follow record.grouping / record.ops; strategies written with the primitives
(DP, Megatron TP, pipeline) compile on traced models."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pipeline_helpers import assert_late_stages_pipelined, collectives, simulate_tree_steps

import trainsim
import trainsim.nn as nn
from trainsim.errors import ConfigError
from trainsim.strategy.mesh import DeviceMesh
from trainsim.strategy.tree import StrategyTree
from trainsim.workload.ir import Model, Module, OpKind
from trainsim.workload.record.naming import ViewNames, default_feature_name
from trainsim.workload.zoo import build_model

# torchvision's published parameter counts (torchvision.models docs)
RESNET50_PARAMS = 25_557_032
VGG19_PARAMS = 143_667_240
GPT2_PARAMS = 124_439_808  # GPT-2 small with tied embeddings (Radford et al. 2019; HF gpt2)

# --------------------------------------------------------------------------------------------------
# Models written with trainsim.nn, as torchvision / nanoGPT write them
# --------------------------------------------------------------------------------------------------


class Bottleneck(nn.Module):
    """torchvision Bottleneck v1.5: stride on the 3x3 conv, one ReLU module called three times."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out = out + identity
        return self.relu(out)


class ResNet50(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._make_layer(64, 3)
        self.layer2 = self._make_layer(128, 4, 2)
        self.layer3 = self._make_layer(256, 6, 2)
        self.layer4 = self._make_layer(512, 3, 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(2048, num_classes)

    def _make_layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        down = None
        if stride != 1 or self.inplanes != planes * 4:
            down = nn.Sequential(nn.Conv2d(self.inplanes, planes * 4, 1, stride=stride, bias=False),
                                 nn.BatchNorm2d(planes * 4))
        layers = [Bottleneck(self.inplanes, planes, stride, down)]
        self.inplanes = planes * 4
        layers += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.avgpool(x).flatten(1))


VGG19_CFG = (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M")


class VGG19(nn.Module):
    """torchvision vgg19 (cfg "E", no batch norm): a flat `features` Sequential and a classifier."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c = 3
        for v in VGG19_CFG:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(c, int(v), 3, padding=1), nn.ReLU(True)]
                c = int(v)
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(nn.Linear(512 * 7 * 7, 4096), nn.ReLU(True), nn.Dropout(),
                                        nn.Linear(4096, 4096), nn.ReLU(True), nn.Dropout(), nn.Linear(4096, num_classes))

    def forward(self, x):
        x = self.avgpool(self.features(x))
        return self.classifier(x.flatten(1))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, p: float = 0.1) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.CausalSelfAttention(dim, heads)
        self.drop1 = nn.Dropout(p)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim, out_dim="f")
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * dim, dim)
        self.drop2 = nn.Dropout(p)

    def forward(self, x):
        x = x + self.drop1(self.attn(self.ln1(x)))
        return x + self.drop2(self.fc2(self.act(self.fc1(self.ln2(x)))))


class GPT(nn.Module):
    """GPT-2: learned positions (a Parameter added to the token embeddings), tied LM head."""

    def __init__(self, vocab: int = 50257, seq: int = 1024, dim: int = 768, heads: int = 12, layers: int = 12) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Parameter(seq, dim)
        self.drop = nn.Dropout(0.1)
        self.blocks = nn.ModuleList([Block(dim, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False, out_dim="v")
        self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        x = self.drop(self.wte(idx) + self.wpe)
        for blk in self.blocks:
            x = blk(x)
        return self.lm_head(self.ln_f(x))


# --------------------------------------------------------------------------------------------------
# Compile and simulate (the pipeline of tests/test_strategy_primitives.py, plus the engine)
# --------------------------------------------------------------------------------------------------


def data_parallel(model: Model, dp: int = 8) -> StrategyTree:
    batch = model.batch_size_in_graph
    S = StrategyTree.from_model(model, DeviceMesh(dp=dp), batch, batch // dp)
    S.root.split(model.batch_dim, "dp")
    return S


@pytest.fixture(scope="module")
def resnet() -> Model:
    return nn.trace(ResNet50(), (256, 3, 224, 224))


@pytest.fixture(scope="module")
def vgg() -> Model:
    return nn.trace(VGG19(), (256, 3, 224, 224))


# --------------------------------------------------------------------------------------------------
# CNNs against torchvision and the zoo
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("module", "params"), [(ResNet50, RESNET50_PARAMS), (VGG19, VGG19_PARAMS)])
def test_module_parameters_count_like_torch(module: type[nn.Module], params: int) -> None:
    assert sum(p.numel() for p in module().parameters()) == params


@pytest.mark.parametrize(("fixture", "zoo", "params"), [("resnet", "resnet50", RESNET50_PARAMS),
                                                        ("vgg", "vgg19", VGG19_PARAMS)])
def test_traced_cnn_matches_torchvision_params_and_zoo_flops(fixture: str, zoo: str, params: int,
                                                              request: pytest.FixtureRequest) -> None:
    model: Model = request.getfixturevalue(fixture)
    ref = build_model(zoo, 256)
    assert model.params == params
    assert model.fwd_flops_per_sample() == ref.fwd_flops_per_sample()
    assert model.family == "cnn" and model.batch_dim == "n" and model.seq_len is None
    assert model.batch_size_in_graph == 256 and not model.assumptions


@pytest.mark.parametrize(("fixture", "zoo"), [("resnet", "resnet50"), ("vgg", "vgg19")])
def test_traced_cnn_simulates_like_the_zoo(fixture: str, zoo: str, request: pytest.FixtureRequest) -> None:
    """Same ops, bytes and saved tensors as the hand-written zoo model: data-parallel iteration on
    one DGX A100 node within 1%."""
    model: Model = request.getfixturevalue(fixture)
    mine, _, _ = simulate_tree_steps(data_parallel(model))
    ref, _, _ = simulate_tree_steps(data_parallel(build_model(zoo, 256)))
    assert mine > 0 and mine == pytest.approx(ref, rel=0.01)


def test_traced_cnn_end_to_end_through_simulate_tree(vgg: Model) -> None:
    """The public path (trainsim.simulate_tree): same iteration and activation memory as the zoo's VGG-19
    (saved tensors follow the zoo's conventions: conv inputs, ReLU masks, pool indices, dropout masks)."""
    mine = trainsim.simulate_tree(data_parallel(vgg))
    ref = trainsim.simulate_tree(data_parallel(build_model("vgg19", 256)))
    assert mine.model_params == VGG19_PARAMS
    assert mine.iteration_time_s == pytest.approx(ref.iteration_time_s, rel=0.01)
    assert mine.memory[0].activation_peak_bytes == pytest.approx(ref.memory[0].activation_peak_bytes, rel=1e-9)


def test_resnet_module_tree_mirrors_the_code(resnet: Model) -> None:
    assert [c.name for c in resnet.root.children] == ["stem", "layer1", "layer2", "layer3", "layer4", "head"]
    stages = {c.name: [b.name for b in c.children] for c in resnet.root.children if isinstance(c, Module)}
    assert {k: len(v) for k, v in stages.items()} == {"layer1": 3, "layer2": 4, "layer3": 6, "layer4": 3}
    assert stages["layer2"][0] == "layer2.0"
    stem, block, head = resnet.layers[0], resnet.layers[1], resnet.layers[-1]
    assert [op.name for op in stem.ops] == ["conv1", "bn1", "relu", "maxpool"] and stem.kind == "conv"
    assert [op.name for op in head.ops] == ["avgpool", "fc", "loss"] and head.kind == "head"  # flatten is a view
    assert [op.name for op in block.ops] == ["conv1", "bn1", "relu", "conv2", "bn2", "relu_1", "conv3", "bn3",
                                             "downsample.0", "downsample.1", "add", "relu_2"]
    S = StrategyTree.from_model(resnet, DeviceMesh(), 256, 256)
    assert S.layer1[0].name == "layer1.0" and S.layer1[0].conv2.op.dims["p"] == 56
    assert S.layer2[0].op("downsample.0").op.dims["k"] == 512 and S.layer4[2].conv3.op.dims["k"] == 2048


def test_inputs_from_inside_and_outside_the_layer(resnet: Model) -> None:
    """The downsample branch reads the block's input (outside the layer, not the previous op): "@skip";
    the residual add reads bn3 by name and the downsample's BN as the previous op."""
    ops = {op.name: op for op in resnet.layers[1].ops}
    assert ops["conv1"].input_from == ()  # the previous layer's output
    assert ops["downsample.0"].input_from == ("@skip",)
    assert ops["add"].input_from == ("bn3", None)
    plain = {op.name: op for op in resnet.layers[2].ops}  # layer1.1: identity shortcut
    assert plain["add"].input_from == (None, "@skip")


def test_conv_dims_follow_the_zoo(resnet: Model) -> None:
    conv2 = next(op for op in resnet.layers[4].ops if op.name == "conv2")  # layer2.0, stride 2
    assert conv2.kind == OpKind.CONV and conv2.inputs == (("n", "c", "hi", "wi"),) and conv2.output == ("n", "k", "p", "q")
    assert (conv2.dims["hi"], conv2.dims["p"], conv2.dims["r"]) == (56, 28, 3)
    pool = resnet.layers[0].ops[-1]
    assert [t.name for t in pool.saved] == ["input", "indices"] and pool.saved[1].bytes_per_elem == 8.0


def test_vgg_groups_flat_features_into_stages(vgg: Model) -> None:
    """A Sequential of leaf layers is cut after each strided pool: the zoo's features.block1..5."""
    assert [c.name for c in vgg.root.children] == ["features", "head"]
    assert [la.name for la in vgg.layers] == [f"features.block{i}" for i in range(1, 6)] + ["head"]
    assert [op.name for op in vgg.layers[0].ops] == ["0", "1", "2", "3", "4"]
    head = [op.name for op in vgg.layers[-1].ops]
    assert head == ["avgpool"] + [f"classifier.{i}" for i in range(7)] + ["loss"]
    S = StrategyTree.from_model(vgg, DeviceMesh(), 256, 256)
    assert S.features.block3.name == "features.block3"


def test_cnn_strategies_compile(resnet: Model) -> None:
    """Op-shard (a conv's output channels over tp) inserts collectives; a 2-stage pipeline sends."""
    S = StrategyTree.from_model(resnet, DeviceMesh(tp=2, dp=4), 256, 64)
    S.root.split("n", "dp")
    S.layer1[0].conv1.split("k", "tp")
    t, _, program = simulate_tree_steps(S)
    assert t > 0 and ("all_gather", "tp") in collectives(program)
    assert_late_stages_pipelined(resnet, 512, 64)


# --------------------------------------------------------------------------------------------------
# A GPT written with trainsim.nn
# --------------------------------------------------------------------------------------------------


def test_gpt_matches_the_zoo_gpt2() -> None:
    model = nn.trace(GPT(), (8, 1024))
    ref = build_model("gpt2", 8)
    assert model.params == ref.params == GPT2_PARAMS
    assert model.fwd_flops_per_sample() == ref.fwd_flops_per_sample()
    assert model.seq_len == 1024 and model.batch_dim == "b" and model.family == "gpt"
    assert model.hyper["heads"] == 12 and model.hyper["layers"] == 12
    stem, head = model.layers[0], model.layers[-1]
    assert stem.kind == "embedding" and head.kind == "head"
    assert (head.tied_to, head.tied_op) == ("stem", "lm_head")  # the tied weight counts once
    attn = next(op for op in model.layers[1].ops if op.kind == OpKind.ATTENTION)
    assert attn.name == "attn.attention" and attn.causal and attn.output == ("b", "s", "o")
    qkv = next(op for op in model.layers[1].ops if op.name == "attn.qkv")
    assert qkv.output == ("b", "s", "q") and qkv.weight == ("q", "h")


def _small_gpt() -> Model:
    return nn.trace(GPT(vocab=1024, seq=128, dim=256, heads=8, layers=4), (8, 128))


def test_megatron_strategies_on_a_traced_gpt() -> None:
    model = _small_gpt()
    S = StrategyTree.from_model(model, DeviceMesh(tp=2, dp=4), 8, 2)
    S.root.split("b", "dp").split(("q", "a", "g", "o", "kv", "f"), "tp").split("v", "tp")
    t, _, program = simulate_tree_steps(S)
    assert t > 0 and ("all_reduce", "tp") in collectives(program)  # row-parallel proj / fc2
    P = StrategyTree.from_model(model, DeviceMesh(pp=2, dp=4), 16, 2)
    P.root.split("b", "dp")
    for i, blk in enumerate(P.blocks):
        blk.map(0 if i < 2 else 1)
    P.head.map(1)
    t, graph, program = simulate_tree_steps(P)
    assert t > 0 and program.chunks[0].send_fwd_bytes > 0 and "pp" in set(graph.category)


# --------------------------------------------------------------------------------------------------
# Naming rules
# --------------------------------------------------------------------------------------------------


def test_default_feature_names() -> None:
    assert default_feature_name("blocks.0.attn.qkv") == "qkv"
    assert default_feature_name("classifier.0") == "classifier_0"
    assert default_feature_name("0") == "0" and default_feature_name("") == "k"


def test_linear_out_dim_can_be_split_by_name() -> None:
    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = nn.Linear(64, 256, out_dim="f")
            self.act = nn.ReLU()
            self.down = nn.Linear(256, 64)

        def forward(self, x):
            return x + self.down(self.act(self.up(x)))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList([MLP(), MLP()])

        def forward(self, x):
            for m in self.layers:
                x = m(x)
            return x

    model = nn.trace(Net(), (4, 64), loss=False)
    assert [la.name for la in model.layers] == ["layers.0", "layers.1"] and model.family == "mlp"
    up, act, down, add = model.layers[0].ops
    assert up.output == ("b", "f") and act.dims == {"b": 4, "f": 256} and down.weight == ("down", "f")
    assert add.input_from == ("@skip", None)
    S = StrategyTree.from_model(model, DeviceMesh(tp=2), 4, 4)
    S.root.split("f", "tp")
    _, _, program = simulate_tree_steps(S)
    assert ("all_reduce", "tp") in collectives(program)


def test_views_keep_names() -> None:
    v = ViewNames()
    assert v.reshape(("n", "k", "p", "q"), (2, 8, 1, 1), (2, 8)) == ("n", "k")
    assert v.reshape(("n", "k", "p", "q"), (2, 8, 7, 7), (2, 392)) == ("n", "k*p*q")
    heads = v.reshape(("b", "s", "h"), (2, 4, 64), (2, 4, 8, 8))
    assert heads == ("b", "s", "h_1", "h_2")
    assert v.reshape(heads, (2, 4, 8, 8), (2, 4, 64)) == ("b", "s", "h")  # merging back restores "h"
    assert v.reshape(("b", "s"), (2, 4), (2, 1, 4)) == ("b", "one", "s")


# --------------------------------------------------------------------------------------------------
# Errors and import hygiene
# --------------------------------------------------------------------------------------------------


def _one_line(exc: pytest.ExceptionInfo[ConfigError]) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_modules_run_only_under_trace() -> None:
    with pytest.raises(ConfigError) as exc:
        nn.Linear(4, 4)(None)
    assert "trainsim.nn.trace" in _one_line(exc)


def test_conv_needs_the_cnn_batch_name() -> None:
    with pytest.raises(ConfigError) as exc:
        nn.trace(nn.Sequential(nn.Conv2d(3, 8, 3)), (2, 3, 8, 8), batch_dim="b")
    assert "batch_dim='n'" in _one_line(exc)


def test_shape_mismatch_and_unregistered_module() -> None:
    with pytest.raises(ConfigError) as exc:
        nn.trace(nn.Sequential(nn.Linear(8, 4)), (2, 5))
    assert "8 input features" in _one_line(exc)

    class Hidden(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mods = [nn.Linear(4, 4)]  # a plain list registers nothing, as in torch

        def forward(self, x):
            return self.mods[0](x)

    with pytest.raises(ConfigError) as exc:
        nn.trace(Hidden(), (2, 4))
    assert "not a registered submodule" in _one_line(exc)


def test_importing_trainsim_imports_neither_torch_nor_the_nn_api() -> None:
    code = ("import sys, trainsim; assert 'trainsim.workload.nn' not in sys.modules; import trainsim.nn, "
            "trainsim.workload.torch_fx; assert trainsim.nn.Linear is trainsim.workload.nn.Linear; "
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_blocks_option_makes_attribute_blocks_layers() -> None:
    """Blocks held as plain attributes (not in a container) form one run unless `blocks=` names them."""

    class Residual(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(32, 32)

        def forward(self, x):
            return x + self.fc(x)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = nn.Linear(16, 32)
            self.one, self.two = Residual(), Residual()
            self.out = nn.Linear(32, 10)

        def forward(self, x):
            return self.out(self.two(self.one(self.inp(x))))

    assert [la.name for la in nn.trace(Net(), (4, 16)).layers] == ["body"]
    model = nn.trace(Net(), (4, 16), blocks=(Residual,))
    assert [la.name for la in model.layers] == ["stem", "one", "two", "head"]
    assert [op.name for op in model.layers[1].ops] == ["fc", "add"]
    assert [la.name for la in nn.trace(Net(), (4, 16), blocks=("t*",)).layers] == ["stem", "two", "head"]
