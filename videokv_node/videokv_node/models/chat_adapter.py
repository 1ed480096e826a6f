"""What adapters of chat-tuned transformers Video-LLMs share: the Qwen chat prompt, option letters,
token embedding and decoding, last-token logits, query hooks and the weight fingerprint.

LLaVA-OneVision and Qwen2.5-VL both put a Qwen2-family decoder behind their vision
towers and use the same chat format; they differ in the vision path, in positions
(1-D RoPE vs mRoPE) and in the markers around the video, which the subclasses give.
"""

from __future__ import annotations

import hashlib
import json
from abc import abstractmethod

import numpy as np
import torch
from transformers.cache_utils import Cache

from videokv_node.models.adapter import KVGeometry, VideoLLMAdapter
from videokv_node.models.attention import AttentionObserver, use_videokv_attention
from videokv_node.models.rope import rotate_keys
from videokv_node.vision_backend import TorchVisionBackend, VisionBackend

# Re-rotation by a delta is exact only if inv_freq does not depend on the sequence (no dynamic/YaRN).
SUPPORTED_ROPE_TYPES = ("default", "linear")
SYSTEM_PROMPT = "You are a helpful assistant that remembers what the robot's cameras have seen."
OPTION_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


class ChatVideoLLMAdapter(VideoLLMAdapter):
    """Base of the transformers adapters. Subclasses call ``_init_decoder`` first in ``__init__``,
    then set their vision path, and set the two video markers below."""

    video_open = ""  # text between the user turn's opening and the first frame
    video_close = "\n"  # text between the last frame and the question
    # Frames the exported vision graph takes per call: None = any number (a dynamic batch
    # dimension), an int = exactly that many (a graph whose layout depends on the batch).
    vision_batch: int | None = None

    def _init_decoder(self, model, tokenizer, name: str, image_mean, image_std, head_dim: int | None = None) -> None:
        """What both families share: the decoder under the ``videokv`` attention (its sub-config only),
        its rotary frequencies (exact-rotation rope types only), KV geometry, normalisation, end ids."""
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.device = next(model.parameters()).device
        text = model.config.text_config
        self._lm = model.model.language_model
        use_videokv_attention(model, text)
        rope_type = (getattr(text, "rope_parameters", None) or {}).get("rope_type", "default")
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"rope_type {rope_type!r} is not supported (exact re-rotation needs {SUPPORTED_ROPE_TYPES})")
        self._inv_freq = self._lm.rotary_emb.inv_freq.detach().clone()
        head_dim = head_dim or getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        self.geometry = KVGeometry(
            n_layers=text.num_hidden_layers,
            n_kv_heads=text.num_key_value_heads,
            head_dim=head_dim,
            n_q_heads=text.num_attention_heads,
            dtype=next(self._lm.parameters()).dtype,
        )
        self.max_positions = text.max_position_embeddings
        self._mean = torch.tensor(image_mean, device=self.device).view(1, 3, 1, 1)
        self._std = torch.tensor(image_std, device=self.device).view(1, 3, 1, 1)
        self._eos = {i for i in (tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")) if i is not None}
        self._fingerprint: str | None = None
        self._vision_backend: VisionBackend | None = None  # None: PyTorch, made on first use
        self.vision_max_batch = 8  # frames per backend call at most (vision.max_batch)

    # --- vision -----------------------------------------------------------
    # The vision path is split in two so that every backend runs the same thing:
    # ``preprocess`` (resize, colour order, normalisation) always runs in torch on the
    # model's device, because frames come in any size and antialiased resizing has no
    # exact equivalent in ONNX/TensorRT; ``vision_forward`` maps fixed-size normalised
    # pixels to the tokens the LLM takes, and is what ``vision/export.py`` exports.
    @abstractmethod
    def preprocess(self, frames: list[np.ndarray]) -> torch.Tensor:
        """RGB uint8 (H, W, 3) frames -> (F, 3, S, S) normalised pixels on the model's device."""

    @abstractmethod
    def vision_forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """(B, 3, S, S) normalised pixels -> (B, tokens_per_frame, hidden): tower, projector, pooling/merging."""

    @abstractmethod
    def vision_modules(self) -> list[torch.nn.Module]:
        """The sub-modules ``vision_forward`` uses (what an export must carry), nothing of the decoder."""

    @property
    def vision_input_shape(self) -> tuple[int, int, int]:
        """(3, S, S): one frame's input of ``vision_forward``."""
        return (3, self.image_size, self.image_size)

    @property
    def vision_dtype(self) -> torch.dtype:
        return next(self.vision_modules()[0].parameters()).dtype

    @property
    def vision_backend(self) -> VisionBackend:
        """What encodes frames; PyTorch on the model's device unless ``set_vision_backend`` chose another."""
        if self._vision_backend is None:
            self._vision_backend = TorchVisionBackend(self.vision_forward, self.vision_dtype, self.device)
        return self._vision_backend

    def set_vision_backend(self, backend: VisionBackend, max_batch: int | None = None) -> None:
        """Encode frames through ``backend`` from now on, at most ``max_batch`` frames per call."""
        self._vision_backend = backend
        if max_batch is not None:
            self.vision_max_batch = max_batch

    @torch.inference_mode()
    def encode_frames(self, frames: list[np.ndarray]) -> torch.Tensor:
        """Preprocess all frames at once, then run the backend on batches of at most ``vision_max_batch``
        frames (exactly ``backend.batch`` where it runs a graph exported with a fixed batch)."""
        pixels = self.preprocess(frames)  # (F, 3, S, S)
        backend = self.vision_backend
        step = backend.batch or self.vision_max_batch
        out = [backend.encode(pixels[i:i + step]) for i in range(0, len(frames), step)]  # (b, T, hidden) each
        feats = out[0] if len(out) == 1 else torch.cat(out)  # (F, T, hidden)
        return feats.to(device=self.device, dtype=self.geometry.dtype)

    # --- text -------------------------------------------------------------
    def text_ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def prefix_ids(self) -> list[int]:
        return self.text_ids(f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n{self.video_open}")

    def question_ids(self, question: str, options: list[str]) -> list[int]:
        text = f"{self.video_close}{question.strip()}"
        if options:
            lines = "\n".join(f"{OPTION_LETTERS[i]}. {opt.strip()}" for i, opt in enumerate(options))
            text += f"\n{lines}\nAnswer with the option's letter from the given choices directly."
        return self.text_ids(f"{text}<|im_end|>\n<|im_start|>assistant\n")

    def option_token_ids(self, n_options: int) -> list[int]:
        if n_options > len(OPTION_LETTERS):
            raise ValueError(f"at most {len(OPTION_LETTERS)} options")
        ids = []
        for letter in OPTION_LETTERS[:n_options]:
            tok = self.text_ids(letter)
            if len(tok) != 1:
                raise ValueError(f"option letter {letter!r} is not a single token for this tokenizer")
            ids.append(tok[0])
        return ids

    @torch.inference_mode()
    def embed_tokens(self, ids: list[int]) -> torch.Tensor:
        t = torch.tensor([ids], dtype=torch.long, device=self.device)
        return self.model.get_input_embeddings()(t)  # (1, n, hidden)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    @property
    def eos_token_ids(self) -> set[int]:
        return self._eos

    # --- decoder: 1-D RoPE (Qwen2, Llama); Qwen2.5-VL overrides both for mRoPE -------
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
        positions = positions if positions.dim() == 1 else positions[0]  # 1-D RoPE: rows are equal
        out = self._lm(
            inputs_embeds=embeds,
            position_ids=positions.to(self.device).view(1, -1).expand(embeds.shape[0], -1),  # every row alike
            past_key_values=cache,
            use_cache=True,
            videokv_observer=observer,
            videokv_mask=mask,
        )
        return self._last_logits(out, n_logits) if logits else None

    def rotate_keys(self, keys: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        return rotate_keys(keys, delta if delta.dim() == 1 else delta[0], self._inv_freq)

    def _last_logits(self, out, n: int = 1) -> torch.Tensor:
        """(vocab,) logits of the last token, or (n, vocab) of the last ``n`` when ``n`` > 1; float32
        (float64 for a float64 model, for parity tests). A batch of B > 1 rows (frames re-read at once,
        memory/questions/locate.py) keeps its leading dimension: (B, vocab) or (B, n, vocab)."""
        if n < 1:
            raise ValueError(f"n_logits must be >= 1, got {n}")
        hidden = out.last_hidden_state[:, -1] if n == 1 else out.last_hidden_state[:, -n:]
        logits = self.model.lm_head(hidden)
        logits = logits[0] if logits.shape[0] == 1 else logits
        return logits if logits.dtype == torch.float64 else logits.float()

    def query_modules(self) -> list[torch.nn.Module]:
        return [layer.self_attn.q_proj for layer in self._lm.layers]

    # --- identity ---------------------------------------------------------
    def _fingerprint_config(self) -> dict:
        """The config as it identifies the model; subclasses drop what saving or loading changes."""
        config = self.model.config.to_dict()
        config.pop("_name_or_path", None)  # where the files lie is not what the model is
        return config

    def fingerprint(self) -> str:
        if self._fingerprint is None:
            h = hashlib.sha256(json.dumps(self._fingerprint_config(), sort_keys=True, default=str).encode())
            for name, p in sorted(self.model.state_dict().items()):
                h.update(name.encode())
                h.update(p.detach().flatten()[:64].float().cpu().numpy().tobytes())
            self._fingerprint = h.hexdigest()[:16]
        return self._fingerprint
