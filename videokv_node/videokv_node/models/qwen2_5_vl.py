"""Qwen2.5-VL through the public transformers API, with its 3-D rotary positions (mRoPE).

Vision path (as ``Qwen2_5_VLModel.get_image_features``): each frame is one
image; Qwen2.5-VL's tower takes patches of 2 frames x 14 x 14 px, and a still
image is its own frame repeated over those 2 (``Qwen2VLImageProcessor.patchify``
does exactly that), then windowed/full attention blocks and a 2x2 patch merger.
A frame resized to ``frame_size`` px (a multiple of 28) gives a
(frame_size / 28)^2 grid of tokens: 196 at the default 392 px, LLaVA-OneVision's count.

Choice, per frame and not as a video: Qwen2.5-VL's video path merges frame
*pairs* into one temporal patch and spaces their temporal positions by seconds,
but a stream is encoded one frame at a time as it arrives and memory policies
evict single frames, so every frame stands alone, as a still image does.

Prompt: the Qwen chat format. The memory holds a frame's visual tokens only
(as in the LLaVA adapter), so the vision markers go around the whole stream,
the way Qwen's chat template wraps one video: the prefix ends with
``<|vision_start|>`` and the question begins with ``<|vision_end|>``.

Positions (mRoPE, ``get_rope_index``): text tokens have three equal rows; a
frame whose first token sits at ``start`` has row t = start, row h = start + r,
row w = start + c for its merged token (r, c), in row-major order, and the next
token after it starts at start + max(grid_h, grid_w) (``frame_span``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
from transformers.cache_utils import Cache

from videokv_node.models.attention import AttentionObserver
from videokv_node.models.chat_adapter import ChatVideoLLMAdapter
from videokv_node.models.rope import rotate_keys, rotate_keys_mrope
from videokv_node.models.tiny_tokenizer import QWEN_VL_SPECIAL_TOKENS, build_tiny_tokenizer

# Qwen2-VL's processor defaults (OpenAI CLIP statistics), used when a checkpoint does not say.
IMAGE_MEAN = (0.48145466, 0.4578275, 0.40821073)
IMAGE_STD = (0.26862954, 0.26130258, 0.27577711)
DEFAULT_FRAME_SIZE = 392  # px: 28 x 28 patches -> 14 x 14 = 196 tokens per frame
TINY_FRAME_SIZE = 112  # px: 8 x 8 patches -> 4 x 4 = 16 tokens per frame, like the LLaVA tiny


def qwen25_vl_config(tokenizer, text: dict, vision: dict, **extra) -> Qwen2_5_VLConfig:
    """The Qwen2.5-VL layout sized by ``text`` and ``vision``, with the vocabulary and the
    vision-marker/placeholder ids of ``tokenizer``."""
    ids = tokenizer.convert_tokens_to_ids
    return Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            bos_token_id=ids("<|endoftext|>"),
            eos_token_id=ids("<|im_end|>"),
            **text,
        ),
        vision_config=vision,
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
        **extra,
    )


def qwen25_tiny_config(tokenizer) -> Qwen2_5_VLConfig:
    """A Qwen2.5-VL small enough for CPU tests: 2 decoder layers, head_dim 16, mRoPE sections [2, 3, 3].

    The tower has 2 blocks: block 0 attends within windows of 2 x 2 merged tokens
    (window_size 56 px = 2 merged tokens of 28 px), block 1 over the whole frame,
    so both of Qwen2.5-VL's attention kinds run.
    """
    text = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 3, 3]),
    )
    vision = dict(
        depth=2,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        patch_size=14,
        spatial_merge_size=2,
        temporal_patch_size=2,
        window_size=56,
        fullatt_block_indexes=[1],
        out_hidden_size=text["hidden_size"],
    )
    return qwen25_vl_config(tokenizer, text, vision, tie_word_embeddings=False)


def tiny_qwen25_model(seed: int = 0) -> tuple[Qwen2_5_VLForConditionalGeneration, PreTrainedTokenizerFast]:
    """The seeded random tiny model and its tokenizer, without touching the global RNG."""
    tokenizer = build_tiny_tokenizer(QWEN_VL_SPECIAL_TOKENS)
    cfg = qwen25_tiny_config(tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2_5_VLForConditionalGeneration(cfg)
    return model, tokenizer


class Qwen25VLAdapter(ChatVideoLLMAdapter):
    """A loaded Qwen2.5-VL model plus its tokenizer, fixed-size frame preprocessing and mRoPE positions."""

    position_dims = 3
    # The tower concatenates all frames' patches into one sequence and separates frames and
    # attention windows by ``cu_seqlens``; without flash attention transformers splits that
    # sequence with ``torch.split(lengths.tolist())``, a Python list that an ONNX trace
    # freezes. So the exported graph holds exactly one frame and the ONNX/TensorRT backends
    # call it per frame (each frame is its own image, so this equals the batched result);
    # PyTorch still takes the whole batch in one call.
    vision_batch = 1
    video_open = "<|vision_start|>"  # Qwen's template wraps the video in vision markers
    video_close = "<|vision_end|>"

    def __init__(
        self,
        model: Qwen2_5_VLForConditionalGeneration,
        tokenizer,
        name: str,
        frame_size: int = DEFAULT_FRAME_SIZE,
        image_mean: tuple[float, float, float] = IMAGE_MEAN,
        image_std: tuple[float, float, float] = IMAGE_STD,
    ) -> None:
        text = model.config.text_config
        head_dim = text.hidden_size // text.num_attention_heads  # what Qwen2_5_VLAttention uses
        self._init_decoder(model, tokenizer, name, image_mean, image_std, head_dim=head_dim)
        cfg = model.config
        rotary = self._lm.rotary_emb
        self._mrope_section = list(rotary.mrope_section)
        if sum(self._mrope_section) != head_dim // 2:
            raise ValueError(f"mrope_section {self._mrope_section} must sum to head_dim / 2 = {head_dim // 2}")
        vision = cfg.vision_config
        self.patch_size = vision.patch_size
        self.merge_size = vision.spatial_merge_size
        self.temporal_patch_size = vision.temporal_patch_size
        unit = self.patch_size * self.merge_size
        if frame_size <= 0 or frame_size % unit:
            raise ValueError(f"frame_size {frame_size} must be a positive multiple of patch x merge = {unit} px")
        self.image_size = frame_size
        self.grid = frame_size // self.patch_size  # patches per side
        self._side = self.grid // self.merge_size  # merged tokens per side
        self.tokens_per_frame = self._side**2

    # --- construction -----------------------------------------------------
    @classmethod
    def tiny(cls, seed: int = 0, device: str | torch.device = "cpu") -> "Qwen25VLAdapter":
        """Random weights from ``seed``: identical on every machine, no files needed."""
        model, tokenizer = tiny_qwen25_model(seed)
        return cls(model.to(device), tokenizer, name="tiny-qwen2.5-vl", frame_size=TINY_FRAME_SIZE)

    @classmethod
    def from_pretrained(
        cls,
        directory: str | Path,
        device: str | torch.device,
        dtype: torch.dtype,
        frame_size: int = DEFAULT_FRAME_SIZE,
    ) -> "Qwen25VLAdapter":
        """Load a local checkpoint directory (e.g. Qwen2.5-VL-3B-Instruct); never downloads.

        Qwen2.5-VL has no native frame size (its processor picks one per image), so
        ``frame_size`` fixes it; image_mean/std come from the preprocessor config.
        """
        directory = Path(directory)
        model = Qwen2_5_VLForConditionalGeneration.from_pretrained(directory, dtype=dtype, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        mean, std = IMAGE_MEAN, IMAGE_STD
        for name in ("preprocessor_config.json", "video_preprocessor_config.json"):
            path = directory / name
            if path.is_file():
                pre = json.loads(path.read_text())
                mean = tuple(pre.get("image_mean", mean))
                std = tuple(pre.get("image_std", std))
                break
        return cls(model.to(device), tokenizer, name=str(directory), frame_size=frame_size, image_mean=mean, image_std=std)

    # --- positions --------------------------------------------------------
    @property
    def frame_span(self) -> int:
        """A frame advances the next position by max(grid_h, grid_w), as ``get_rope_index`` does."""
        return self._side

    def frame_positions(self, start: int) -> torch.Tensor:
        """(3, tokens_per_frame): t = start, h = start + r, w = start + c, tokens (r, c) in row-major order."""
        side = torch.arange(self._side)
        rows = side.repeat_interleave(self._side)  # (T,) r of each token
        cols = side.repeat(self._side)  # (T,) c of each token
        return torch.stack([torch.zeros_like(rows), rows, cols]) + start  # (3, T)

    def pack(self, pieces: list[torch.Tensor], start: int) -> tuple[list[torch.Tensor], int]:
        """Lay ``pieces`` ((3, t) stored positions each, time order) out from ``start``, without gaps between pieces.

        A piece with unequal rows (kept tokens of a frame) cannot be renumbered token by
        token: a 2-D grid has no 1-D order, and a per-token move would change the
        relative positions inside the frame. So it moves as a whole: every row of every
        token shifts by start - (its smallest position), and the next piece starts one
        past its largest shifted position. A text piece (equal rows) gets consecutive
        positions, one delta per token but the same on all rows, as with 1-D RoPE.
        Either way each token's move is one scalar on all three rows, which
        ``rotate_keys`` applies exactly.
        """
        out = []
        for piece in pieces:
            n = piece.shape[1]
            if n == 0:
                out.append(piece.clone())
            elif bool((piece == piece[:1]).all()):
                out.append(self.text_positions(start, n))
                start += n
            else:
                low = int(piece.min())
                out.append(piece + (start - low))
                start += int(piece.max()) - low + 1
        return out, start

    # --- vision -----------------------------------------------------------
    @torch.inference_mode()
    def preprocess(self, frames: list[np.ndarray]) -> torch.Tensor:
        """RGB uint8 (H, W, 3) frames -> (F, 3, S, S) normalised pixels on the model's device.

        Choice: a fixed square size without keeping the aspect ratio, bilinear with
        antialiasing in torch on the model's device (as the LLaVA adapter), where the
        Qwen processor resizes each image bicubically to its own multiple of 28 px:
        a fixed size gives every frame the same number of tokens, which memory blocks need.
        """
        out = []
        for rgb in frames:
            x = torch.from_numpy(np.ascontiguousarray(rgb)).to(self.device)  # (H, W, 3) uint8
            x = x.permute(2, 0, 1)[None].float() / 255.0  # (1, 3, H, W)
            size = (self.image_size, self.image_size)
            x = F.interpolate(x, size=size, mode="bilinear", antialias=True, align_corners=False)  # (1, 3, S, S)
            out.append(x)
        return (torch.cat(out) - self._mean) / self._std  # (F, 3, S, S) float32

    def patchify(self, pixels: torch.Tensor) -> torch.Tensor:
        """(F, C, S, S) pixels -> (F * g * g, C * temporal_patch * patch * patch), as ``Qwen2VLImageProcessor.patchify``.

        Patches are ordered block-major over merge x merge blocks (the order the tower's
        merger and rotary positions assume), and each still frame is repeated over the
        temporal patch.
        """
        f, c = pixels.shape[:2]
        g, m, p, tp = self.grid, self.merge_size, self.patch_size, self.temporal_patch_size
        x = pixels.reshape(f, c, g // m, m, p, g // m, m, p)
        x = x.permute(0, 2, 5, 3, 6, 1, 4, 7)  # (F, g/m, g/m, m, m, C, p, p)
        x = x.unsqueeze(6).expand(-1, -1, -1, -1, -1, -1, tp, -1, -1)  # (F, g/m, g/m, m, m, C, tp, p, p)
        return x.reshape(f * g * g, c * tp * p * p)

    def vision_forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """(B, 3, S, S) -> (B, T, hidden): patchify, then ``get_image_features`` with one image per frame."""
        patches = self.patchify(pixels).to(self.vision_dtype)  # (B * g * g, C * tp * p * p)
        grid_thw = torch.tensor([[1, self.grid, self.grid]] * pixels.shape[0], device=pixels.device)  # (B, 3)
        out = self.model.model.get_image_features(patches, grid_thw)
        return torch.stack(out.pooler_output)  # per-image (T, hidden) -> (B, T, hidden)

    def vision_modules(self) -> list[torch.nn.Module]:
        return [self.model.model.visual]

    # --- decoder ----------------------------------------------------------
    @torch.inference_mode()
    def forward(
        self,
        embeds: torch.Tensor,
        positions: torch.Tensor,
        cache: Cache,
        logits: bool = True,
        observer: AttentionObserver | None = None,
        n_logits: int = 1,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        n = embeds.shape[1]
        if positions.dim() == 1:
            positions = positions.expand(3, n)  # text-only: equal rows
        # (3, 1, n): Qwen2_5_VLTextModel reads 3 rows as (t, h, w) mRoPE positions; a 4th,
        # leading row would only feed mask building, which the videokv attention does not use.
        out = self._lm(
            inputs_embeds=embeds,
            position_ids=positions.to(self.device).reshape(3, 1, n).expand(3, embeds.shape[0], n),  # every row alike
            past_key_values=cache,
            use_cache=True,
            videokv_observer=observer,
            videokv_mask=mask,
        )
        return self._last_logits(out, n_logits) if logits else None

    def rotate_keys(self, keys: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        if delta.dim() == 1:
            return rotate_keys(keys, delta, self._inv_freq)  # one shift on all rows is a 1-D rotation
        return rotate_keys_mrope(keys, delta, self._inv_freq, self._mrope_section)

    def _fingerprint_config(self) -> dict:
        config = super()._fingerprint_config()
        for key in ("architectures", "transformers_version"):
            config.pop(key, None)  # what wrote the files is not what the model is
        for part in (config, config.get("text_config") or {}, config.get("vision_config") or {}):
            part.pop("dtype", None)  # None or not depending on how the config was made: use the real one
        # Another frame size gives other tokens per frame; another dtype other cached K/V.
        config["videokv"] = {"frame_size": self.image_size, "dtype": str(self.geometry.dtype)}
        return config
