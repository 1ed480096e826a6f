"""What adapters of chat-tuned transformers Video-LLMs share: the Qwen chat prompt, option letters,
token embedding and decoding, last-token logits, query hooks and the weight fingerprint.

LLaVA-OneVision and Qwen2.5-VL both put a Qwen2-family decoder behind their vision
towers and use the same chat format; they differ in the vision path, in positions
(1-D RoPE vs mRoPE) and in the markers around the video, which the subclasses give.
"""

from __future__ import annotations

import hashlib
import json

import torch

from videokv_node.models.adapter import KVGeometry, VideoLLMAdapter
from videokv_node.models.attention import use_videokv_attention

# Re-rotation by a delta is exact only if inv_freq does not depend on the sequence (no dynamic/YaRN).
SUPPORTED_ROPE_TYPES = ("default", "linear")
SYSTEM_PROMPT = "You are a helpful assistant that remembers what the robot's cameras have seen."
OPTION_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


class ChatVideoLLMAdapter(VideoLLMAdapter):
    """Base of the transformers adapters. Subclasses call ``_init_decoder`` first in ``__init__``,
    then set their vision path, and set the two video markers below."""

    video_open = ""  # text between the user turn's opening and the first frame
    video_close = "\n"  # text between the last frame and the question

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

    # --- decoder ----------------------------------------------------------
    def _last_logits(self, out) -> torch.Tensor:
        """(vocab,) logits of the last token, float32 (float64 for a float64 model, for parity tests)."""
        logits = self.model.lm_head(out.last_hidden_state[:, -1])[0]
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
