"""LLaVA-OneVision through the public transformers API.

Vision path (as ``LlavaOnevisionModel.get_video_features``): SigLIP tower ->
selected layer -> MLP projector -> 2x2 bilinear pooling, 196 tokens per frame on
the real 384 px checkpoints (27x27 patches pooled to 14x14). The decoder (Qwen2)
is driven with explicit ``position_ids`` and a ``Cache`` object, under the
registered ``videokv`` attention (``models/attention.py``); queries are read
with forward hooks on ``q_proj``. Nothing here patches attention.

Choice: the video path of transformers appends one ``image_newline`` embedding
after *all* frames of a clip; a stream has no end, so frames are stored as
their 196 pooled tokens only, as ReKV does.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration

from videokv_node.models.chat_adapter import ChatVideoLLMAdapter
from videokv_node.models.tiny_tokenizer import build_tiny_tokenizer



def onevision_config(tokenizer, text: dict, vision: dict, **extra) -> LlavaOnevisionConfig:
    """The LLaVA-OneVision layout this adapter drives (Qwen2 decoder, SigLIP tower, last-layer
    features, no CLS), sized by ``text`` and ``vision``, with the vocabulary and the
    image/video token ids of ``tokenizer``."""
    return LlavaOnevisionConfig(
        text_config=dict(model_type="qwen2", vocab_size=len(tokenizer), **text),
        vision_config=dict(model_type="siglip_vision_model", **vision),
        vision_feature_layer=-1,
        vision_feature_select_strategy="full",
        video_token_id=tokenizer.convert_tokens_to_ids("<video>"),
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        **extra,
    )


def tiny_config(tokenizer) -> LlavaOnevisionConfig:
    """A seeded-random LLaVA-OneVision small enough for CPU tests: 16 tokens per frame, 2 layers."""
    text = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=10000.0,
        tie_word_embeddings=False,
    )
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=56, patch_size=8)
    return onevision_config(tokenizer, text, vision, tie_word_embeddings=False)


class LlavaOnevisionAdapter(ChatVideoLLMAdapter):
    """A loaded LLaVA-OneVision model plus its tokenizer and frame preprocessing."""

    def __init__(
        self,
        model: LlavaOnevisionForConditionalGeneration,
        tokenizer,
        name: str,
        image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5),
        image_std: tuple[float, float, float] = (0.5, 0.5, 0.5),
    ) -> None:
        self._init_decoder(model, tokenizer, name, image_mean, image_std)
        cfg = model.config
        vision = cfg.vision_config
        self.image_size = vision.image_size
        side = vision.image_size // vision.patch_size
        self.tokens_per_frame = math.ceil(side / 2) ** 2

    # --- construction -----------------------------------------------------
    @classmethod
    def tiny(cls, seed: int = 0, device: str | torch.device = "cpu") -> "LlavaOnevisionAdapter":
        """Random weights from ``seed``: identical on every machine, no files needed."""
        tokenizer = build_tiny_tokenizer()
        cfg = tiny_config(tokenizer)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = LlavaOnevisionForConditionalGeneration(cfg)
        return cls(model.to(device), tokenizer, name="tiny")

    @classmethod
    def from_pretrained(cls, directory: str | Path, device: str | torch.device, dtype: torch.dtype) -> "LlavaOnevisionAdapter":
        """Load a local checkpoint directory (e.g. llava-onevision-qwen2-0.5b-ov-hf); never downloads."""
        directory = Path(directory)
        model = LlavaOnevisionForConditionalGeneration.from_pretrained(directory, dtype=dtype, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        mean, std = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)
        for name in ("preprocessor_config.json", "video_preprocessor_config.json"):
            path = directory / name
            if path.is_file():
                pre = json.loads(path.read_text())
                mean = tuple(pre.get("image_mean", mean))
                std = tuple(pre.get("image_std", std))
                break
        return cls(model.to(device), tokenizer, name=str(directory), image_mean=mean, image_std=std)

    # --- vision -----------------------------------------------------------
    @torch.inference_mode()
    def preprocess(self, frames: list[np.ndarray]) -> torch.Tensor:
        """RGB uint8 (H, W, 3) frames -> (F, 3, S, S) normalised pixels on the model's device.

        Video frames are resized to the square tower size without keeping the
        aspect ratio, as the LLaVA-OneVision video processor does. Choice: bilinear
        with antialiasing in torch, on the model's device, where the transformers
        processor resamples bicubically on the CPU; the difference is sub-pixel.
        """
        out = []
        for rgb in frames:
            x = torch.from_numpy(np.ascontiguousarray(rgb)).to(self.device)  # (H, W, 3) uint8
            x = x.permute(2, 0, 1)[None].float() / 255.0  # (1, 3, H, W)
            x = F.interpolate(x, size=(self.image_size, self.image_size), mode="bilinear", antialias=True, align_corners=False)
            out.append(x)
        pixels = (torch.cat(out) - self._mean) / self._std  # (F, 3, S, S)
        return pixels.to(self.geometry.dtype)

    def vision_forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """As ``get_video_features`` on one clip of B frames, minus the clip-final ``image_newline``."""
        cfg = self.model.config
        out = self.model.model.get_video_features(
            pixel_values_videos=pixels.to(self.vision_dtype)[None],  # (1, B, 3, S, S)
            vision_feature_layer=cfg.vision_feature_layer,
            vision_feature_select_strategy=cfg.vision_feature_select_strategy,
        )
        feats = out.pooler_output[:, :-1]  # drop the clip-final image_newline: (1, B * T, hidden)
        return feats.reshape(pixels.shape[0], self.tokens_per_frame, feats.shape[-1])  # (B, T, hidden)

    def vision_modules(self) -> list[torch.nn.Module]:
        inner = self.model.model
        return [inner.vision_tower, inner.multi_modal_projector]

