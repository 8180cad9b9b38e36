"""CNN family builder: torchvision ResNet-50 (v1.5) and VGG-16/19 (no batch norm) for ImageNet.

Dimension names (a strategy splits these by name; CNN strategies only split the batch "n"):
  n batch, k output channels, c input channels, p/q output height/width, r/s kernel height/width,
  hi/wi input height/width (extra dims so an op's input bytes use the input's spatial size).
A conv's output channel is "k" while the next op calls its input channel "c", and a pool's input
spatial dims are "hi"/"wi" where the producer called them "p"/"q". Layouts are compared by dim name
across op boundaries, so this would matter only to a strategy that split channels or space.

Memory conventions (training; bytes_per_elem at the 2-byte activation convention, scaled to the dtype):
  each stored tensor is counted once, at the op whose backward formula holds it, as PyTorch's autograd
  keeps it (tools/autograd/derivatives.yaml; ReluBackward1 etc. are generated from it):
  - convolution saves `input` and `weight` (convolution_backward(grad, input, weight, ...)): the input
    counts here, the weight is a parameter;
  - training BatchNorm (cudnn_batch_norm / native_batch_norm) saves `input` and its per-channel
    save_mean / save_invstd (result1, result2, fp32);
  - in-place ReLU (relu_, torchvision's ReLU(inplace=True)) saves its result (threshold_backward(grad,
    result, 0)), and that result is the very storage the next conv or max pool saves as its input. It is
    counted there, so such a ReLU adds nothing; only a ReLU whose output no later op saves (the last one
    before the average pool, whose mean backward needs only the input's shape) counts its output;
  - the residual add (AddBackward0) saves nothing; the downsample conv saves the block input, the storage
    conv1 already saves, so it adds nothing; its BatchNorm saves the downsample conv's output;
  - max_pool2d_with_indices saves its input (the in-place ReLU's result) and the int64 argmax indices.
  ResNet-50 follows these: its saved bytes equal the distinct storages PyTorch's saved-tensor hooks see
  (tests/test_resnet_memory_rise.py) and its step peak the ResNet-50 batch-32 V100 profiler trace's
  (benchmarks/resnet_memory_rise.py, within 1%). In fp32 the lowering doubles every saved tensor's size,
  fixed-width ones too (int64 indices, fp32 statistics and logits): 49 MiB too many at batch 32, as
  SavedTensor has no way to say a tensor's width does not follow the activation dtype.
  VGG still keeps the older convention, shared with the traced front ends (workload.record: trainsim.nn,
  torch.fx, whose tests assert the same activation memory as the zoo): every ReLU and dropout keeps a
  1-byte mask. For the conv ReLUs that mask is extra to the storage the next conv or pool saves; the two
  are to change together.
Parameter counts match torchvision exactly (ResNet-50 25,557,032; VGG-16 138,357,544; VGG-19
143,667,240) and forward conv+linear FLOPs match torchvision's published GFLOPS (which are GMACs):
4.09 for ResNet-50, 15.47 for VGG-16, 19.63 for VGG-19 at 224x224.
"""

from __future__ import annotations

from ..ir import Layer, Model, Module, Op, OpKind, SavedTensor

BN_FLOPS_PER_ELEM = 5.0  # batch statistics, normalise, scale, shift
LOSS_FLOPS_PER_ELEM = 4.0  # softmax + cross-entropy per logit
IMAGENET_CLASSES = 1000
CNN_MODELS: tuple[str, ...] = ("resnet50", "vgg16", "vgg19")

_NKPQ = ("n", "k", "p", "q")


def _out(size: int, kernel: int, stride: int, pad: int) -> int:
    """Output spatial size of a convolution or pool (floor mode, as PyTorch)."""
    out = (size + 2 * pad - kernel) // stride + 1
    if out < 1:
        raise ValueError(f"input {size} too small for kernel {kernel}, stride {stride}")
    return out


def _conv(name: str, n: int, c: int, k: int, hw: int, kernel: int, stride: int = 1, pad: int = 0,
          bias: bool = False, saves_input: bool = True) -> tuple[Op, int]:
    """A square convolution over a square `hw` x `hw` input; returns the op and its output size.
    `saves_input` False: another op of the layer already saves the same input storage (counted once)."""
    p = _out(hw, kernel, stride, pad)
    dims = {"n": n, "k": k, "c": c, "p": p, "q": p, "r": kernel, "s": kernel, "hi": hw, "wi": hw}
    saved = (SavedTensor("input", ("n", "c", "hi", "wi")),) if saves_input else ()
    op = Op(name, OpKind.CONV, dims, (("n", "c", "hi", "wi"),), _NKPQ, weight=("k", "c", "r", "s"),
            extra_params=k if bias else 0, flop_dims=("n", "k", "c", "p", "q", "r", "s"),
            flops_per_point=2.0, saved=saved)
    return op, p


def _bn(name: str, n: int, k: int, p: int) -> Op:
    """Training-mode BatchNorm2d: 2 parameters (scale, shift) per channel; saves its input and the batch
    mean and inverse standard deviation per channel (fp32: 4 bytes at the 2-byte convention's scale)."""
    return Op(name, OpKind.NORM, {"n": n, "k": k, "p": p, "q": p}, (_NKPQ,), _NKPQ, extra_params=2 * k,
              flops_per_point=BN_FLOPS_PER_ELEM,
              saved=(SavedTensor("input", _NKPQ), SavedTensor("save_mean", ("k",), 4.0),
                     SavedTensor("save_invstd", ("k",), 4.0)))


def _relu(name: str, n: int, k: int, p: int, keeps_output: bool = False) -> Op:
    """In-place ReLU. Its saved result is the storage the next conv or pool saves as input (counted there);
    `keeps_output`: no later op saves it (the network's last ReLU), so it is counted here."""
    saved = (SavedTensor("result", _NKPQ),) if keeps_output else ()
    return Op(name, OpKind.ELEMENTWISE, {"n": n, "k": k, "p": p, "q": p}, (_NKPQ,), _NKPQ,
              flops_per_point=1.0, saved=saved)


def _relu_mask(name: str, n: int, k: int, p: int) -> Op:
    """VGG's ReLU: a 1-byte mask (VGG's convention, in the module docstring)."""
    return Op(name, OpKind.ELEMENTWISE, {"n": n, "k": k, "p": p, "q": p}, (_NKPQ,), _NKPQ,
              flops_per_point=1.0, saved=(SavedTensor("mask", _NKPQ, 1.0),))


def _maxpool(name: str, n: int, k: int, hw: int, kernel: int, stride: int, pad: int) -> tuple[Op, int]:
    p = _out(hw, kernel, stride, pad)
    dims = {"n": n, "k": k, "hi": hw, "wi": hw, "p": p, "q": p, "r": kernel, "s": kernel}
    op = Op(name, OpKind.POOL, dims, (("n", "k", "hi", "wi"),), _NKPQ,
            flop_dims=("n", "k", "p", "q", "r", "s"), flops_per_point=1.0, bwd_flops_factor=1.0,
            saved=(SavedTensor("input", ("n", "k", "hi", "wi")), SavedTensor("indices", _NKPQ, 8.0)))
    return op, p


def _avgpool(name: str, n: int, k: int, hw: int, out: int) -> Op:
    """Adaptive average pool to `out` x `out`; out=1 flattens to ("n", "k"). Backward needs only shapes."""
    dims = {"n": n, "k": k, "hi": hw, "wi": hw}
    output: tuple[str, ...] = ("n", "k")
    if out > 1:
        dims |= {"p": out, "q": out}
        output = _NKPQ
    return Op(name, OpKind.POOL, dims, (("n", "k", "hi", "wi"),), output,
              flop_dims=("n", "k", "hi", "wi"), flops_per_point=1.0, bwd_flops_factor=1.0)


def _linear(name: str, n: int, c: int, k: int) -> Op:
    """nn.Linear(c, k) with bias; input features "c", output features "k"."""
    return Op(name, OpKind.MATMUL, {"n": n, "c": c, "k": k}, (("n", "c"),), ("n", "k"), weight=("k", "c"),
              extra_params=k, flops_per_point=2.0, saved=(SavedTensor("input", ("n", "c")),))


def _fc_elementwise(name: str, n: int, k: int, flops: float) -> Op:
    """ReLU or dropout after a linear layer; both keep a 1-byte mask for backward (VGG's convention, below)."""
    return Op(name, OpKind.ELEMENTWISE, {"n": n, "k": k}, (("n", "k"),), ("n", "k"), flops_per_point=flops,
              saved=(SavedTensor("mask", ("n", "k"), 1.0),))


def _loss(n: int, classes: int) -> Op:
    """Softmax cross-entropy over the class logits (fp32 logits kept for backward)."""
    return Op("loss", OpKind.LOSS, {"n": n, "k": classes}, (("n", "k"),), ("n",), flop_dims=("n", "k"),
              flops_per_point=LOSS_FLOPS_PER_ELEM, saved=(SavedTensor("logits", ("n", "k"), 4.0),),
              bwd_flops_factor=1.0)


def _bottleneck(name: str, n: int, c: int, width: int, hw: int, stride: int,
                last: bool = False) -> tuple[Layer, int]:
    """torchvision Bottleneck (v1.5: stride on the 3x3 conv); downsample when the shape changes.
    `last`: the network's last block, whose final ReLU output no later op saves."""
    out_ch = 4 * width
    conv1, p1 = _conv("conv1", n, c, width, hw, 1)
    conv2, p2 = _conv("conv2", n, width, width, p1, 3, stride, 1)
    conv3, p3 = _conv("conv3", n, width, out_ch, p2, 1)
    ops = [conv1, _bn("bn1", n, width, p1), _relu("relu1", n, width, p1),
           conv2, _bn("bn2", n, width, p2), _relu("relu2", n, width, p2),
           conv3, _bn("bn3", n, out_ch, p3)]
    if stride != 1 or c != out_ch:
        # Reads the block input, not the previous op's output: a second branch of the same layer.
        # conv1 already saves the block input: the downsample conv holds the same storage
        down, pd = _conv("downsample.0", n, c, out_ch, hw, 1, stride, saves_input=False)
        ops += [down, _bn("downsample.1", n, out_ch, pd)]
    ops += [
        Op("add", OpKind.ELEMENTWISE, {"n": n, "k": out_ch, "p": p3, "q": p3}, (_NKPQ, _NKPQ), _NKPQ,
           flops_per_point=1.0),
        _relu("relu3", n, out_ch, p3, keeps_output=last),
    ]
    return Layer(name, "conv", ops), p3


def build_resnet50(batch: int, image: int = 224) -> Model:
    """torchvision resnet50 (v1.5) on `batch` images of `image` x `image` pixels, 1000 classes."""
    n = batch
    conv1, hw = _conv("conv1", n, 3, 64, image, 7, 2, 3)
    pool, hw2 = _maxpool("maxpool", n, 64, hw, 3, 2, 1)
    stem = Layer("stem", "conv", [conv1, _bn("bn1", n, 64, hw), _relu("relu", n, 64, hw), pool])
    hw = hw2
    children: list[Module | Layer] = [stem]
    c = 64
    stages = ((3, 64, 1), (4, 128, 2), (6, 256, 2), (3, 512, 2))
    for li, (blocks, width, stride) in enumerate(stages, 1):
        stage: list[Module | Layer] = []
        for bi in range(blocks):
            last = li == len(stages) and bi == blocks - 1
            block, hw = _bottleneck(f"layer{li}.{bi}", n, c, width, hw, stride if bi == 0 else 1, last)
            stage.append(block)
            c = 4 * width
        children.append(Module(f"layer{li}", stage))
    children.append(Layer("fc", "head", [_avgpool("avgpool", n, c, hw, 1), _linear("fc", n, c, IMAGENET_CLASSES),
                                         _loss(n, IMAGENET_CLASSES)]))
    return Model("resnet50", "cnn", Module("resnet50", children), batch_dim="n", seq_len=None,
                 description="ResNet-50 v1.5 (He et al. 2016; torchvision), 25.6M params, 4.09 GMACs at 224",
                 hyper={"depth": 50, "image": image, "classes": IMAGENET_CLASSES})


def _vgg_stages(depth: int) -> tuple[tuple[int, int], ...]:
    """(convs, channels) per stage: torchvision cfg "D" (VGG-16) and "E" (VGG-19)."""
    if depth == 16:
        return (2, 64), (2, 128), (3, 256), (3, 512), (3, 512)
    if depth == 19:
        return (2, 64), (2, 128), (4, 256), (4, 512), (4, 512)
    raise ValueError(f"VGG depth must be 16 or 19, got {depth}")


def build_vgg(depth: int, batch: int, image: int = 224) -> Model:
    """torchvision vgg16 / vgg19 (no batch norm) on `batch` images of `image` x `image`, 1000 classes.

    torchvision's flat `features` Sequential is grouped into one Layer per stage (the convs between
    two max pools, ending with the pool): features.block1..block5. The classifier Layer holds the
    adaptive 7x7 average pool (an identity at 224), the three linear layers and the loss.
    """
    stages = _vgg_stages(depth)
    n, hw, c = batch, image, 3
    blocks: list[Module | Layer] = []
    for si, (convs, k) in enumerate(stages, 1):
        ops: list[Op] = []
        for j in range(1, convs + 1):
            conv, hw = _conv(f"conv{j}", n, c, k, hw, 3, 1, 1, bias=True)
            ops += [conv, _relu_mask(f"relu{j}", n, k, hw)]
            c = k
        pool, hw = _maxpool("pool", n, k, hw, 2, 2, 0)
        ops.append(pool)
        blocks.append(Layer(f"features.block{si}", "conv", ops))
    flat = c * 7 * 7
    classifier = Layer("classifier", "head", [
        _avgpool("avgpool", n, c, hw, 7),
        _linear("fc1", n, flat, 4096), _fc_elementwise("relu1", n, 4096, 1.0),
        _fc_elementwise("dropout1", n, 4096, 1.0),
        _linear("fc2", n, 4096, 4096), _fc_elementwise("relu2", n, 4096, 1.0),
        _fc_elementwise("dropout2", n, 4096, 1.0),
        _linear("fc3", n, 4096, IMAGENET_CLASSES),
        _loss(n, IMAGENET_CLASSES),
    ])
    name = f"vgg{depth}"
    gmacs = {16: 15.47, 19: 19.63}[depth]
    return Model(name, "cnn", Module(name, [Module("features", blocks), classifier]), batch_dim="n",
                 seq_len=None, description=f"VGG-{depth} (Simonyan & Zisserman 2015; torchvision), "
                 f"{gmacs} GMACs at 224", hyper={"depth": depth, "image": image, "classes": IMAGENET_CLASSES})


def build_cnn(name: str, batch: int, image: int = 224) -> Model:
    """Build a CNN by name: one of CNN_MODELS."""
    if name == "resnet50":
        return build_resnet50(batch, image)
    if name in ("vgg16", "vgg19"):
        return build_vgg(int(name[3:]), batch, image)
    raise ValueError(f"unknown CNN {name!r}; known: {', '.join(CNN_MODELS)}")
