"""torch.fx front end: real torch.nn.Modules (built on the meta device: no weights, no GPU) traced
into the IR. Pure-torch replicas of torchvision's resnet50 / vgg19 (same module names) and a small
GPT must give PyTorch's parameter count and FlopCounterMode's forward FLOPs, keep the module nesting,
and compile under DP / op-shard / pipeline strategies written with the primitives."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from pipeline_helpers import assert_late_stages_pipelined, collectives, simulate_tree_steps  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from trainsim.errors import ConfigError  # noqa: E402
from trainsim.strategy.mesh import DeviceMesh  # noqa: E402
from trainsim.strategy.presets import ParallelSpec, build_strategy  # noqa: E402
from trainsim.strategy.tree import StrategyTree  # noqa: E402
from trainsim.workload.ir import Model, Module, OpKind  # noqa: E402
from trainsim.workload.record import ops  # noqa: E402
from trainsim.workload.torch_fx import trace_module  # noqa: E402
from trainsim.workload.zoo import build_model  # noqa: E402

# --------------------------------------------------------------------------------------------------
# Pure-torch replicas of torchvision's resnet50 and vgg19 (torchvision's C++ ops do not load beside
# the CPU torch wheel here); module names are torchvision's.
# --------------------------------------------------------------------------------------------------


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: Any) -> Any:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    def __init__(self, layers: tuple[int, ...] = (3, 4, 6, 3), num_classes: int = 1000) -> None:
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(64, layers[0])
        self.layer2 = self._make_layer(128, layers[1], stride=2)
        self.layer3 = self._make_layer(256, layers[2], stride=2)
        self.layer4 = self._make_layer(512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * Bottleneck.expansion, num_classes)

    def _make_layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * 4:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes * 4, kernel_size=1, stride=stride, bias=False),
                                       nn.BatchNorm2d(planes * 4))
        layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * 4
        layers += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: Any) -> Any:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


VGG19_CFG = (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M")


class VGG(nn.Module):
    def __init__(self, cfg: tuple[int | str, ...] = VGG19_CFG, num_classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c = 3
        for v in cfg:
            if v == "M":
                layers += [nn.MaxPool2d(kernel_size=2, stride=2)]
            else:
                layers += [nn.Conv2d(c, int(v), kernel_size=3, padding=1), nn.ReLU(inplace=True)]
                c = int(v)
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(nn.Linear(512 * 7 * 7, 4096), nn.ReLU(True), nn.Dropout(p=0.5),
                                        nn.Linear(4096, 4096), nn.ReLU(True), nn.Dropout(p=0.5),
                                        nn.Linear(4096, num_classes))

    def forward(self, x: Any) -> Any:
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


class CausalSelfAttention(nn.Module):
    """nanoGPT's attention: fused qkv Linear, heads by view/transpose, F.scaled_dot_product_attention."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.heads = heads

    def forward(self, x: Any) -> Any:
        B, T, C = x.size()
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * dim, dim)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: Any) -> Any:
        x = x + self.attn(self.ln1(x))
        return x + self.drop(self.fc2(self.act(self.fc1(self.ln2(x)))))


class GPT(nn.Module):
    def __init__(self, vocab: int = 1024, seq: int = 128, dim: int = 256, heads: int = 8, layers: int = 4) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(seq, dim)
        self.drop = nn.Dropout(0.1)
        self.blocks = nn.ModuleList([Block(dim, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied

    def forward(self, idx: Any, targets: Any = None) -> Any:
        _, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for blk in self.blocks:
            x = blk(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is not None:
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits


GPT_DIMS = {"qkv": "q", "fc1": "f", "lm_head": "v"}  # Megatron's names for the split features

# --------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------


def meta(factory: Any, *args: Any) -> nn.Module:
    with torch.device("meta"):
        return factory(*args)


def torch_flops(module: nn.Module, shape: tuple[int, ...], dtype: Any = None) -> int:
    """FlopCounterMode's forward count (2 FLOPs per multiply-add) on the meta device."""
    x = torch.empty(shape, device="meta", dtype=dtype or torch.float32)
    with FlopCounterMode(display=False) as counter:
        module(x)
    return counter.get_total_flops()


def forward_flops(model: Model) -> float:
    return model.fwd_flops_per_sample() * model.batch_size_in_graph


def one_line(exc: pytest.ExceptionInfo[ConfigError]) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


IMAGES = (8, 3, 224, 224)


@pytest.fixture(scope="module")
def resnet() -> tuple[nn.Module, Model]:
    m = meta(ResNet)
    return m, trace_module(m, IMAGES)


@pytest.fixture(scope="module")
def vgg() -> tuple[nn.Module, Model]:
    m = meta(VGG)
    return m, trace_module(m, IMAGES)


# --------------------------------------------------------------------------------------------------
# CNNs
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("fixture", "zoo"), [("resnet", "resnet50"), ("vgg", "vgg19")])
def test_traced_cnn_counts_like_pytorch(fixture: str, zoo: str, request: pytest.FixtureRequest) -> None:
    module, model = request.getfixturevalue(fixture)
    assert model.params == sum(p.numel() for p in module.parameters())
    assert forward_flops(model) == torch_flops(module, IMAGES)
    assert model.fwd_flops_per_sample() == build_model(zoo, 8).fwd_flops_per_sample()
    assert not model.assumptions


def test_resnet_nesting_is_kept(resnet: tuple[nn.Module, Model]) -> None:
    _, model = resnet
    assert [c.name for c in model.root.children] == ["stem", "layer1", "layer2", "layer3", "layer4", "head"]
    layer1 = next(c for c in model.root.children if isinstance(c, Module) and c.name == "layer1")
    assert [b.name for b in layer1.children] == ["layer1.0", "layer1.1", "layer1.2"]
    block = model.layers[1]
    assert [op.name for op in block.ops] == ["conv1", "bn1", "relu", "conv2", "bn2", "relu_1", "conv3", "bn3",
                                             "downsample.0", "downsample.1", "add", "relu_2"]
    ops_ = {op.name: op for op in block.ops}
    assert ops_["downsample.0"].input_from == ("@skip",) and ops_["add"].input_from == ("bn3", None)
    S = StrategyTree.from_model(model, DeviceMesh(), 8, 8)
    assert S.layer1[0].name == "layer1.0" and S.layer1[0].conv2.op.kind == OpKind.CONV


def test_vgg_features_are_grouped_by_stage(vgg: tuple[nn.Module, Model]) -> None:
    _, model = vgg
    assert [la.name for la in model.layers] == [f"features.block{i}" for i in range(1, 6)] + ["head"]
    assert model.layers[-1].ops[0].name == "avgpool" and model.layers[-1].ops[-1].kind == OpKind.LOSS


def test_cnn_strategies_compile_and_simulate(resnet: tuple[nn.Module, Model]) -> None:
    _, model = resnet
    D = StrategyTree.from_model(model, DeviceMesh(dp=8), 8, 1)
    D.root.split("n", "dp")
    assert simulate_tree_steps(D)[0] > 0
    T = StrategyTree.from_model(model, DeviceMesh(tp=2, dp=4), 8, 2)
    T.root.split("n", "dp")
    T.layer2[1].conv1.split("k", "tp")  # output channels over tp: the next conv gathers them
    t, _, program = simulate_tree_steps(T)
    assert t > 0 and any(cat == "tp" for _, cat in collectives(program))
    assert_late_stages_pipelined(model, 16, 2)


def _torchvision() -> Any:
    try:
        import torchvision
    except Exception:  # not installed, or its C++ ops fail to load beside this torch
        pytest.skip("torchvision is not importable")
    return torchvision


@pytest.mark.parametrize("name", ["resnet50", "vgg19"])
def test_torchvision_models_if_available(name: str) -> None:
    tv = _torchvision()
    module = meta(getattr(tv.models, name), None)
    model = trace_module(module, IMAGES)
    assert model.params == sum(p.numel() for p in module.parameters())
    assert forward_flops(model) == torch_flops(module, IMAGES)
    if name == "resnet50":
        assert model.layers[1].name == "layer1.0"


# --------------------------------------------------------------------------------------------------
# A small GPT (nanoGPT style, F.scaled_dot_product_attention)
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpt() -> tuple[nn.Module, Model]:
    m = meta(GPT)
    return m, trace_module(m, (8, 128), dim_names=GPT_DIMS)


def test_gpt_counts_like_pytorch(gpt: tuple[nn.Module, Model]) -> None:
    module, model = gpt
    assert model.params == sum(p.numel() for p in module.parameters())  # tied head counted once
    assert forward_flops(model) == torch_flops(module, (8, 128), torch.long)
    assert model.seq_len == 128 and model.family == "gpt" and model.hyper["heads"] == 8
    assert [la.name for la in model.layers] == ["stem", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "head"]
    head = model.layers[-1]
    assert (head.tied_to, head.tied_op) == ("stem", "lm_head")
    block = {op.name: op for op in model.layers[1].ops}
    assert block["attn.qkv"].output == ("b", "s", "q") and block["attn.proj"].inputs == (("b", "s", "o"),)
    assert block["attention"].kind == OpKind.ATTENTION and block["attention"].causal
    assert block["fc2"].inputs == (("b", "s", "f"),)


def test_gpt_loss_from_flattened_logits() -> None:
    """F.cross_entropy(logits.view(-1, V), targets.view(-1)) is costed over (b, s, v)."""
    model = trace_module(meta(GPT), {"idx": (8, 128), "targets": (8, 128)}, dim_names=GPT_DIMS)
    loss = model.layers[-1].ops[-1]
    assert loss.kind == OpKind.LOSS and loss.inputs == (("b", "s", "v"),)


def test_megatron_strategies_on_traced_gpt(gpt: tuple[nn.Module, Model]) -> None:
    _, model = gpt
    D = StrategyTree.from_model(model, DeviceMesh(dp=8), 8, 1)
    D.root.split("b", "dp")
    assert simulate_tree_steps(D)[0] > 0
    T = StrategyTree.from_model(model, DeviceMesh(tp=2, dp=4), 8, 2)
    T.root.split("b", "dp").split(("q", "a", "g", "o", "kv", "f"), "tp").split("v", "tp")
    t, _, program = simulate_tree_steps(T)
    assert t > 0 and ("all_reduce", "tp") in collectives(program)
    P = StrategyTree.from_model(model, DeviceMesh(pp=2, dp=4), 16, 2)
    P.root.split("b", "dp")
    for i, blk in enumerate(P.blocks):
        blk.map(0 if i < len(P.blocks) // 2 else 1)
    P.head.map(1)
    t, graph, program = simulate_tree_steps(P)
    assert t > 0 and program.chunks[0].send_fwd_bytes > 0 and "pp" in set(graph.category)
    # the Megatron preset fills the same names (TP + SP on the traced model)
    preset = build_strategy(model, ParallelSpec(dp=4, tp=2, sequence_parallel=True, micro_batch=2, global_batch=8))
    assert simulate_tree_steps(preset)[0] > 0


# --------------------------------------------------------------------------------------------------
# Extension and errors
# --------------------------------------------------------------------------------------------------


class Gate(nn.Module):
    """Data-dependent control flow: fx cannot trace into it."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x: Any) -> Any:
        return self.proj(x) if x.sum() > 0 else x


class GatedNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate = Gate()
        self.head = nn.Linear(16, 4)

    def forward(self, x: Any) -> Any:
        return self.head(self.gate(x))


def test_untraceable_module_needs_a_handler() -> None:
    with pytest.raises(ConfigError) as exc:
        trace_module(GatedNet(), (2, 16))
    assert "leaf module" in one_line(exc) and "handlers=" in one_line(exc)

    def gate(ctx: Any, module: Gate, x: Any) -> Any:
        return ops.linear(ctx.builder, x, 16, ctx.ref(module.proj.weight), ctx.ref(module.proj.bias))

    model = trace_module(GatedNet(), (2, 16), handlers={Gate: gate})
    assert model.params == sum(p.numel() for p in GatedNet().parameters())
    assert [op.name for op in model.layers[0].ops] == ["gate", "head", "loss"]


def test_unsupported_function_and_module_are_one_line_errors() -> None:
    class Scores(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q = nn.Linear(8, 8)

        def forward(self, x: Any) -> Any:
            return torch.matmul(self.q(x), x.transpose(-1, -2))

    with pytest.raises(ConfigError) as exc:
        trace_module(Scores(), (2, 4, 8))
    assert one_line(exc).startswith("torch_fx.matmul: unsupported call function 'matmul'")

    class Recurrent(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = nn.GRU(8, 8)

        def forward(self, x: Any) -> Any:
            return self.rnn(x)[0]

    with pytest.raises(ConfigError) as exc:
        trace_module(Recurrent(), (2, 4, 8))
    assert "unsupported module rnn (GRU)" in one_line(exc) and "register it as a leaf module" in one_line(exc)


def test_bad_example_shape_is_a_one_line_error() -> None:
    net = nn.Sequential(nn.Linear(16, 4))
    with pytest.raises(ConfigError) as exc:
        trace_module(net, (2, 15))
    assert one_line(exc).startswith("torch_fx.example_input_shape: PyTorch rejects the example input")
    with pytest.raises(ConfigError) as exc:
        trace_module(net, {"y": (2, 16)})
    assert "forward has no argument y" in one_line(exc)


def test_views_cat_and_slices_record_no_ops() -> None:
    """Views (unsqueeze/squeeze, chunk, slicing, permute) are free; cat is one memory-bound op."""

    class Mixer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(16, 32)
            self.b = nn.Linear(16, 32)
            self.out = nn.Linear(48, 8)

        def forward(self, x: Any) -> Any:
            left, right = self.a(x).chunk(2, dim=-1)
            y = torch.cat([left, right, self.b(x)[:, :, :16].unsqueeze(0).squeeze(0)], dim=-1)
            return self.out(y.permute(1, 0, 2)).permute(1, 0, 2)

    module = meta(Mixer)
    model = trace_module(module, (4, 6, 16))
    names = [op.name for op in model.layers[0].ops]
    assert names == ["a", "b", "cat", "out", "loss"]
    cat = model.layers[0].ops[2]
    assert cat.kind == OpKind.ELEMENTWISE and cat.fwd_flops() == 0 and cat.input_from == ("a", "a", None)
    assert forward_flops(model) == torch_flops(module, (4, 6, 16))
    assert model.params == sum(p.numel() for p in module.parameters())
